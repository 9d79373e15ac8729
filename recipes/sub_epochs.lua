-- Training on a time budget for recipes whose goal is "within N minutes" (htr_lines,
-- speech_digits): one rl.train call per sub-epoch, each resuming from the last one's checkpoint
-- (bit-exact on the CPU), so that training stops on the clock between sub-epochs.
--
--   local r, history, train_time = dofile("recipes/sub_epochs.lua").run(name, config, argv, opt)
--     opt.minutes:    stop when another sub-epoch as long as the last would overrun it
--     opt.num_epochs: the last sub-epoch at most
--     opt.score:      a checkpoint NAME.NNN.h5 to load and only score ("" for none)
--     opt.load:       a checkpoint to go on training from ("" for none)
--   r is the last rl.train result (r.net, r.checkpoint), history its epoch rows, train_time the
--   seconds spent in rl.train. argv: the ++key value overrides for rl.train (the `rest` of
--   rnnlua.cli's parse: num_epochs and load are the recipe's own options, this loop's).
--   M.OPTIONS: the options opt holds, for the recipe's rnnlua.cli spec.
local M = {}

M.OPTIONS = {
  {"minutes", "number", 30, "stop at the end of the sub-epoch after which another would overrun"},
  {"num_epochs", "integer", 1000, "the last sub-epoch at most"},
  {"load", "string", "", "a checkpoint NAME.NNN.h5 to go on training from"},
  {"score", "string", "", "only score this checkpoint NAME.NNN.h5"},
}

function M.run(name, config, argv, opt)
  local function epoch_of(path, what)
    return tonumber(path:match("%.(%d+)%.h5$")) or
      error(string.format("++%s: wants a checkpoint NAME.NNN.h5, got %s", what, path), 0)
  end
  local r, history, train_time, first, last = nil, {}, 0, 1, opt.num_epochs
  -- the sub-epochs are this loop's: a run starts afresh (or at ++load) and replaces an earlier
  -- run's checkpoints of the same model prefix, where rl.train alone would continue from them
  if config.overwrite == nil then config.overwrite = true end
  if opt.score ~= "" then -- score a checkpoint: "training" up to its own epoch loads it
    config.load, config.num_epochs = opt.score, epoch_of(opt.score, "score")
    r = rl.train(config, argv)
    last = 0
  elseif opt.load ~= "" then -- go on training from a checkpoint
    first = epoch_of(opt.load, "load") + 1
  end
  for epoch = first, last do
    config.num_epochs = epoch
    config.load = r and r.checkpoint or (opt.load ~= "" and opt.load or nil)
    local t = rl.clock()
    r = rl.train(config, argv)
    local spent = rl.clock() - t
    train_time = train_time + spent
    history[#history + 1] = r.history[#r.history]
    if train_time + spent > 60 * opt.minutes then break end
  end
  if not r then
    error(string.format("%s: nothing to train: ++num_epochs %d is not after %s", name,
      opt.num_epochs, opt.load), 0)
  end
  return r, history, train_time
end

return M
