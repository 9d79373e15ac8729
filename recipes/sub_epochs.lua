-- Training on a time budget for recipes whose goal is "within N minutes" (htr_lines,
-- speech_digits): one rl.train call per sub-epoch, each resuming from the last one's checkpoint
-- (bit-exact on the CPU), so that training stops on the clock between sub-epochs.
--
--   local r, history, train_time = dofile("recipes/sub_epochs.lua").run(name, config, arg, opt)
--     opt.minutes: stop when another sub-epoch as long as the last would overrun it
--     opt.epochs:  the last sub-epoch at most
--     opt.score:   a checkpoint NAME.NNN.h5 to load and only score ("" for none)
--     opt.from:    a checkpoint to go on training from ("" for none)
--   r is the last rl.train result (r.net, r.checkpoint), history its epoch rows, train_time the
--   seconds spent in rl.train. `arg` passes ++key value overrides on (not ++num_epochs/++load).
local M = {}

function M.run(name, config, arg, opt)
  local argv = {}
  for i, a in ipairs(arg) do
    if a == "++num_epochs" or a == "++load" then
      error(string.format("%s: use epochs=N instead of %s", name, a), 0)
    end
    argv[i] = a
  end
  local function epoch_of(path, what)
    return tonumber(path:match("%.(%d+)%.h5$")) or
      error(string.format("%s: %s= wants a checkpoint NAME.NNN.h5, got %s", name, what, path), 0)
  end
  local r, history, train_time, first, last = nil, {}, 0, 1, opt.epochs
  -- the sub-epochs are this loop's: a run starts afresh (or at from=) and replaces an earlier
  -- run's checkpoints of the same model prefix, where rl.train alone would continue from them
  if config.overwrite == nil then config.overwrite = true end
  if opt.score ~= "" then -- score a checkpoint: "training" up to its own epoch loads it
    config.load, config.num_epochs = opt.score, epoch_of(opt.score, "score")
    r = rl.train(config, argv)
    last = 0
  elseif opt.from ~= "" then -- go on training from a checkpoint
    first = epoch_of(opt.from, "from") + 1
  end
  for epoch = first, last do
    config.num_epochs = epoch
    config.load = r and r.checkpoint or (opt.from ~= "" and opt.from or nil)
    local t = rl.clock()
    r = rl.train(config, argv)
    local spent = rl.clock() - t
    train_time = train_time + spent
    history[#history + 1] = r.history[#r.history]
    if train_time + spent > 60 * opt.minutes then break end
  end
  if not r then
    error(string.format("%s: nothing to train: epochs=%d is not after %s", name, opt.epochs,
      opt.from), 0)
  end
  return r, history, train_time
end

return M
