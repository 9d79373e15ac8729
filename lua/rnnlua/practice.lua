-- The training practice of rl.train beside the loop itself (rnnlua.engine uses it): the
-- exponential moving average of the parameters, keep_best_n and early stopping, and their
-- state in the checkpoint's /engine group.
--
-- EMA (config.ema = decay): after every applied update ema = decay * ema + (1 - decay) * params
-- over the flat parameter buffer (float32 on the network's device; a skipped update leaves it
-- as it is), starting from the parameters training starts with. Every checkpoint holds it in
-- /engine/ema (so a resume continues it bit for bit), and beside MODEL.NNN.h5 rl.train writes
-- MODEL.NNN.ema.h5: a checkpoint of the same network whose parameters are the average (no
-- optimizer state), which rl.forward, `rnnlua serve`, info, compare and average load like any
-- other. ema_dev_score = true scores the dev set with the averaged parameters (they are copied
-- in and the trained ones back, exactly). A pretrain step that grows the network starts the
-- average anew from the grown network.
--
-- Keep-best and early stopping rank the saved epochs by one dev score, config.best_by
-- ("dev_score", the default; "dev_error"; "dev_ler" for ctc), lower being better:
--   keep_best_n = n: after each save, the checkpoints of this model prefix (and their .ema.h5)
--     other than the n best saved epochs and the newest (which a resume continues from) are
--     deleted; ties keep the older epoch. Only epochs this run (or the run it resumed, with the
--     same prefix) saved are candidates: files of other runs are never touched.
--   early_stopping = {patience = n}: an epoch whose score is not below the best so far is a bad
--     epoch; after n bad epochs in a row training stops (logged) with that epoch's checkpoint
--     saved. A resume of a stopped run trains nothing unless the patience is raised.
-- State (/engine in the checkpoint, a state table of rnnlua.checkpoint): model (the prefix),
-- accum_grad, best_by, ema (tensor), ema_decay, ema_updates, es_best, es_best_epoch, es_bad,
-- grad_scale and grad_scale_good (fp16 loss scaling, rnnlua.grad_scaler) and "saved.<epoch>" =
-- the score of each kept saved epoch.
local M = {}
local rl = require("rnnlua") -- the module table (init.lua registers it before loading its parts)

---------------------------------------------------------------------------- EMA

local EMA = {}
EMA.__index = EMA

-- An average of net's parameters starting from their values.
function M.ema(net, decay)
  local p = net:params()
  return setmetatable({decay = decay, values = p:clone(), scratch = p:clone(), updates = 0}, EMA)
end

function EMA:update(net)
  rl.mul(net:params(), 1 - self.decay, self.scratch)
  self.values:mul_(self.decay):add_(self.scratch)
  self.updates = self.updates + 1
end

-- fn() run with the averaged values in net's parameters; the trained ones are back afterwards,
-- also when fn raises.
function EMA:with_average(net, fn)
  local p = net:params()
  self.scratch:copy_(p)
  p:copy_(self.values)
  local ok, a, b, c = pcall(fn)
  p:copy_(self.scratch)
  if not ok then error(a, 0) end
  return a, b, c
end

---------------------------------------------------------------------------- state

-- The /engine state of a checkpoint.
function M.state(ctx)
  local cfg = ctx.cfg
  local st = {model = cfg.model or "", accum_grad = cfg.accum_grad, best_by = ctx.best_by}
  if ctx.ema then
    st.ema, st.ema_decay, st.ema_updates = ctx.ema.values, ctx.ema.decay, ctx.ema.updates
  end
  if ctx.es_best then st.es_best, st.es_best_epoch = ctx.es_best, ctx.es_best_epoch end
  st.es_bad = ctx.es_bad or 0
  if ctx.scaler then
    for k, v in pairs(ctx.scaler:state()) do st[k] = v end
  end
  for e, v in pairs(ctx.saved_scores) do st["saved." .. e] = v end
  return st
end

-- Restores the state of checkpoint `ck` into ctx (a checkpoint without one, written before it
-- existed or by another loop, starts them afresh). Errors name what is wrong; the caller adds
-- the file.
function M.restore(ctx, ck, log)
  local cfg, st = ctx.cfg, ck.engine_state
  if st == nil then
    if ctx.ema then
      log:write(1, "%s holds no parameter average: ema starts from its parameters", ck.path)
    end
    return
  end
  local function num(k, int)
    local v = st[k]
    if v == nil then return nil end
    if type(v) ~= "number" or v ~= v or (int and math.type(v) ~= "integer") then
      error(string.format("/engine %s = %s is not a%s number", k, tostring(v),
        int and "n integer" or ""), 0)
    end
    return v
  end
  if ctx.ema then
    if rl.is_tensor(st.ema) then
      local want = ctx.net:num_params()
      if st.ema:numel() ~= want then
        error(string.format("/engine/ema holds %d values, the network has %d parameters",
          st.ema:numel(), want), 0)
      end
      local nan, inf = rl.dataset_scan(st.ema:contiguous())
      if nan or inf then
        error(string.format("/engine/ema holds %s at value %d", nan and "NaN" or "Inf",
          nan or inf), 0)
      end
      ctx.ema.values:copy_(st.ema)
      ctx.ema.updates = num("ema_updates", true) or 0
      local d = num("ema_decay")
      if d and d ~= ctx.ema.decay then
        log:write(1, "%s averaged with ema = %.17g; going on with ema = %.17g", ck.path, d,
          ctx.ema.decay)
      end
    else
      log:write(1, "%s holds no parameter average: ema starts from its parameters", ck.path)
    end
  end
  if not ctx.ema and rl.is_tensor(st.ema) then
    log:write(1, "%s holds a parameter average: without config.ema it is not continued", ck.path)
  end
  if ctx.scaler and not ctx.scaler:load_state(st) then
    log:write(1, "%s holds no loss scale: fp16 loss scaling starts at %g", ck.path,
      ctx.scaler.scale)
  end
  local k = num("accum_grad", true)
  if k and k ~= cfg.accum_grad then
    log:write(1, "%s was trained with accum_grad = %d; going on with %d", ck.path, k,
      cfg.accum_grad)
  end
  -- the ranking only holds for one score key and this prefix's own files
  local same = st.best_by == ctx.best_by and st.model == (cfg.model or "")
  if not same then
    if st.best_by ~= nil and (ctx.keep_best or ctx.patience) then
      log:write(1, "%s ranked epochs by %s for model %s: keep-best and early stopping start "
        .. "afresh (%s, model %s)", ck.path, tostring(st.best_by), tostring(st.model),
        ctx.best_by, tostring(cfg.model))
    end
    return
  end
  ctx.es_best, ctx.es_best_epoch = num("es_best"), num("es_best_epoch", true)
  ctx.es_bad = num("es_bad", true) or 0
  for key, v in pairs(st) do
    local e = math.tointeger(tonumber(type(key) == "string" and key:match("^saved%.(%d+)$")))
    if e then
      if type(v) ~= "number" or v ~= v then
        error(string.format("/engine %s = %s is not a score", key, tostring(v)), 0)
      end
      if e <= ck.epoch then ctx.saved_scores[e] = v end
    end
  end
end

---------------------------------------------------------------------------- keep-best, early stop

-- The dev score that ranks epochs, from an epoch's record; an error when it has none.
function M.score_of(ctx, rec)
  local v = rec[ctx.best_by]
  if type(v) ~= "number" then
    local have = {}
    for _, k in ipairs({"dev_score", "dev_error", "dev_ler"}) do
      if rec[k] ~= nil then have[#have + 1] = k end
    end
    error(string.format("rl.train: best_by = \"%s\" is not among the dev scores of epoch %d "
      .. "(%s)", ctx.best_by, rec.epoch, table.concat(have, ", ")), 0)
  end
  return v
end

-- Early stopping's bookkeeping after an epoch's dev score; true when training stops.
function M.early_stop(ctx, epoch, score)
  if not ctx.es_best or score < ctx.es_best then
    ctx.es_best, ctx.es_best_epoch, ctx.es_bad = score, epoch, 0
  else
    ctx.es_bad = (ctx.es_bad or 0) + 1
  end
  return ctx.patience ~= nil and ctx.es_bad >= ctx.patience
end

-- The checkpoint path of an epoch and its average's.
function M.paths(model, epoch)
  local path = model .. string.format(".%03d.h5", epoch)
  return path, (path:gsub("%.h5$", ".ema.h5"))
end

-- Keep-best after epoch `newest` (to be saved) scored `score`: the saved epochs beyond the
-- keep_best_n best, never the newest, are dropped from the ranking and returned, for
-- M.delete once the newest checkpoint is written (a failed save deletes nothing).
function M.prune(ctx, newest, score)
  ctx.saved_scores[newest] = score
  local epochs = {}
  for e in pairs(ctx.saved_scores) do epochs[#epochs + 1] = e end
  table.sort(epochs, function(a, b)
    local sa, sb = ctx.saved_scores[a], ctx.saved_scores[b]
    if sa ~= sb then return sa < sb end
    return a < b
  end)
  local gone = {}
  for i = ctx.keep_best + 1, #epochs do
    local e = epochs[i]
    if e ~= newest then
      ctx.saved_scores[e] = nil
      gone[#gone + 1] = e
    end
  end
  table.sort(gone)
  return gone
end

-- Deletes the checkpoints (and averages) of `epochs`; a file that cannot be deleted is logged.
function M.delete(ctx, epochs, log)
  for _, e in ipairs(epochs) do
    for _, path in ipairs({M.paths(ctx.cfg.model, e)}) do
      local ok, err = os.remove(path)
      -- a file already gone (removed by hand) is what keep-best wants; others are reported
      if not ok and require("lfs").attributes(path, "mode") ~= nil then
        log:write(1, "keep_best_n: cannot delete %s: %s", path, tostring(err))
      end
    end
  end
end

return M
