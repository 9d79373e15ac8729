-- rl.lr_control: learning-rate control per epoch (RETURNN's LearningRateControl) plus a linear
-- warmup per step.
--
--   local lrc = rl.lr_control(cfg)
--   cfg = {learning_rate = 1.0 (RETURNN's default), learning_rate_control = "constant" (default)
--          | "newbob" | "newbob_rel" | "newbob_relative" | "newbob_abs" | "newbob_multi_epoch"
--          | function(epoch, step, scores) -> lr,
--          newbob_relative_error_threshold = -0.01, newbob_error_threshold = -0.01 (abs),
--          newbob_learning_rate_decay = 0.5, newbob_relative_error_div_by_old = false,
--          newbob_multi_num_epochs = 5, newbob_multi_update_interval = newbob_multi_num_epochs,
--          learning_rate_control_error_measure = key of the scores (default below),
--          min_learning_rate = 0, learning_rate_warmup_steps = 0}
--   lrc:lr(epoch, step) -> lr     the epoch's lr times min(1, step / warmup_steps); step is the
--                                 1-based global update count (the first update is step 1)
--   lrc:epoch_done(epoch, scores) records {dev_score =, dev_error =, train_score =, ...} and
--                                 decides the lr of epoch + 1
--   lrc:state() / lrc:load_state(t)  a flat table of numbers and strings
--   lrc:log_line() -> the last decision, in words
--   lrc.max_step                  the last step the schedule defines (one_cycle: total_steps),
--                                 nil for the others
--
-- Newbob follows RETURNN (returnn/learning_rate_control.py). The lr of epoch e + 1 is decided
-- from the scores of the two last finished epochs, old (e - 1) and new (e), under one key:
--   newbob / newbob_rel:  r = (new - old) / |new| (|old| with newbob_relative_error_div_by_old);
--                         r > newbob_relative_error_threshold -> lr = lr * decay
--                         (with -0.01: decay unless the score improved by more than 1%)
--   newbob_abs:           new - old > newbob_error_threshold -> lr = lr * decay
--   newbob_multi_epoch:   r averaged over the last newbob_multi_num_epochs pairs of epochs,
--                         decided only for epochs e + 1 with (e + 1) % interval == 1 when the
--                         interval (newbob_multi_update_interval) is > 1
--   after a decay lr = max(lr, min_learning_rate). No decision after the first epoch. The key:
--   learning_rate_control_error_measure if set, else "dev_score", else the first "dev_*" key
--   in sorted order, else "train_score" (RETURNN's order). RETURNN's lr growth, its
--   min_num_epochs_per_new_lr and relative_error_relative_lr are not supported (rl.lr_control
--   rejects them as unknown keys).
-- A function control gets (epoch, step, scores) with scores[e] = the scores table of each
-- finished epoch e; its result is used as it is (warmup still applies).
--
-- Schedules that are functions of the epoch or the step alone (options named as PyTorch's
-- torch.optim.lr_scheduler and ESPnet's schedulers name them; learning_rate is their base):
--   cosine     per epoch, PyTorch's CosineAnnealingLR: lr(e) = eta_min + (learning_rate -
--              eta_min) (1 + cos(pi (e - 1) / T_max)) / 2 for e - 1 <= T_max, eta_min after it
--              (PyTorch's closed form would rise again). T_max = 10 here; rl.train sets it to
--              num_epochs unless given; eta_min = 0. learning_rate_warmup_steps applies on top.
--   noam       per step, ESPnet's NoamLR (Vaswani et al. 2017): lr(s) = learning_rate *
--              model_size^-0.5 * min(s^-0.5, s * warmup_steps^-1.5) (model_size = 256,
--              warmup_steps = 25000: ESPnet's defaults). Its warmup is its own.
--   one_cycle  per step, PyTorch's OneCycleLR with max_lr = learning_rate: total_steps (needed),
--              pct_start = 0.3, anneal_strategy = "cos" | "linear", div_factor = 25,
--              final_div_factor = 1e4, three_phase = false; step s of rl.train is PyTorch's
--              step s - 1 (its first lr is max_lr / div_factor); a step beyond total_steps is an
--              error, as in PyTorch. Momentum is not cycled (the optimizers' betas are fixed).
--   An option of a schedule given with another control is an error naming it, as is
--   min_learning_rate (newbob's floor) with these (cosine's floor is eta_min). Their state
--   holds the options, and loading a state of other options is an error naming the option:
--   a resume continues the same schedule, bit for bit (the lr depends only on epoch, step and
--   the options, and the checkpoint restores the step).
local M = {}

local rl -- the module table, set by install

local DEFAULTS = {
  learning_rate = 1.0,
  learning_rate_control = "constant",
  newbob_relative_error_threshold = -0.01,
  newbob_error_threshold = -0.01,
  newbob_learning_rate_decay = 0.5,
  newbob_relative_error_div_by_old = false,
  newbob_multi_num_epochs = 5,
  newbob_multi_update_interval = false, -- = newbob_multi_num_epochs
  learning_rate_control_error_measure = false,
  min_learning_rate = 0.0,
  learning_rate_warmup_steps = 0,
}

-- The options of each schedule and their defaults (false: none, T_max has rl.train's).
local SCHEDULE_OPTIONS = {
  cosine = {T_max = 10, eta_min = 0.0},
  noam = {model_size = 256, warmup_steps = 25000},
  one_cycle = {total_steps = false, pct_start = 0.3, anneal_strategy = "cos", div_factor = 25.0,
               final_div_factor = 1e4, three_phase = false},
}
for _, opts in pairs(SCHEDULE_OPTIONS) do
  for k in pairs(opts) do DEFAULTS[k] = false end
end

local CONTROLS = {
  constant = "constant", newbob = "newbob_rel", newbob_rel = "newbob_rel",
  newbob_relative = "newbob_rel", newbob_abs = "newbob_abs",
  newbob_multi_epoch = "newbob_multi_epoch", cosine = "cosine", noam = "noam",
  one_cycle = "one_cycle",
}

local LRC = {}
LRC.__index = LRC

local util = require("rnnlua.util")
local sorted_keys = util.sorted_keys

local function fmt(x) return string.format("%.6g", x) end

local check_schedule -- defined below check_number

-- cfg[key] must be a number, >= lo when lo is given, then also finite (an infinite rate
-- fails only at the first update, an infinite warmup silently trains with lr 0), and an
-- integer when `int` (a fractional epoch count never meets the epoch it is compared with).
-- The thresholds (no lo) may be infinite: +inf never decays, -inf always does.
local function check_number(cfg, key, lo, int, level)
  local v = cfg[key]
  if type(v) ~= "number" or v ~= v or (lo and (v < lo or v == math.huge))
      or (int and v ~= math.floor(v)) then
    error(string.format("rl.lr_control: %s must be a finite %s%s, got %s", key,
      int and "integer" or "number", lo and (" >= " .. lo) or "", tostring(v)), level or 3)
  end
end

-- The options of a schedule, checked (errors name the option, level 4: the caller of new).
check_schedule = function(self, c)
  local ctl = self.control
  if ctl == "cosine" then
    check_number(c, "T_max", 1, true, 4)
    check_number(c, "eta_min", 0, false, 4)
    if c.eta_min > c.learning_rate then
      error(string.format("rl.lr_control: eta_min = %s is above learning_rate = %s", fmt(c.eta_min),
        fmt(c.learning_rate)), 4)
    end
  elseif ctl == "noam" then
    check_number(c, "model_size", 1, true, 4)
    check_number(c, "warmup_steps", 1, true, 4)
  elseif ctl == "one_cycle" then
    if c.total_steps == false then
      error("rl.lr_control: learning_rate_control = \"one_cycle\" needs total_steps (the "
        .. "number of updates of the whole run)", 4)
    end
    check_number(c, "total_steps", 1, true, 4)
    check_number(c, "pct_start", 0, false, 4)
    check_number(c, "div_factor", 0, false, 4)
    check_number(c, "final_div_factor", 0, false, 4)
    if not (c.pct_start > 0 and c.pct_start < 1) then
      error("rl.lr_control: pct_start must be in (0, 1), got " .. tostring(c.pct_start), 4)
    end
    if not (c.div_factor > 0) or not (c.final_div_factor > 0) then
      error("rl.lr_control: div_factor and final_div_factor must be > 0", 4)
    end
    if c.anneal_strategy ~= "cos" and c.anneal_strategy ~= "linear" then
      error(string.format("rl.lr_control: anneal_strategy must be \"cos\" or \"linear\", got %s",
        tostring(c.anneal_strategy)), 4)
    end
    if type(c.three_phase) ~= "boolean" then
      error("rl.lr_control: three_phase must be true or false, got " .. tostring(c.three_phase), 4)
    end
  end
  if (ctl == "noam" or ctl == "one_cycle") and c.learning_rate_warmup_steps ~= 0 then
    error(string.format("rl.lr_control: learning_rate_warmup_steps does not combine with %s (it "
      .. "has its own warmup)", ctl), 4)
  end
end

function M.new(cfg)
  cfg = cfg or {}
  if type(cfg) ~= "table" then error("rl.lr_control: cfg must be a table", 2) end
  for _, k in ipairs(sorted_keys(cfg)) do
    if DEFAULTS[k] == nil then
      error(string.format("rl.lr_control: unknown option '%s' (known: %s)", k,
        table.concat(sorted_keys(DEFAULTS), ", ")), 2)
    end
  end
  local c = {}
  for k, v in pairs(DEFAULTS) do c[k] = v end
  for k, v in pairs(cfg) do c[k] = v end
  local self = setmetatable({cfg = c}, LRC)
  if type(c.learning_rate_control) == "function" then
    self.fn, self.control = c.learning_rate_control, "function"
  else
    self.control = CONTROLS[c.learning_rate_control]
    if not self.control then
      error(string.format("rl.lr_control: unknown learning_rate_control '%s' (constant, newbob, "
        .. "newbob_rel, newbob_abs, newbob_multi_epoch, cosine, noam, one_cycle, or a function)",
        tostring(c.learning_rate_control)), 2)
    end
  end
  self.schedule = SCHEDULE_OPTIONS[self.control]
  for _, k in ipairs(sorted_keys(cfg)) do
    local owner
    for name, opts in pairs(SCHEDULE_OPTIONS) do
      if opts[k] ~= nil then owner = name end
    end
    if owner and owner ~= self.control and cfg[k] ~= false then
      error(string.format("rl.lr_control: %s is an option of learning_rate_control = \"%s\", not "
        .. "of %s", k, owner, self.control), 2)
    end
  end
  if self.schedule then
    if cfg.min_learning_rate ~= nil and cfg.min_learning_rate ~= false then
      error(string.format("rl.lr_control: min_learning_rate is newbob's floor; %s does not use "
        .. "it%s", self.control, self.control == "cosine" and " (its floor is eta_min)" or ""), 2)
    end
    for k, d in pairs(self.schedule) do
      if c[k] == false then c[k] = d end
    end
  end
  check_schedule(self, c)
  if self.control == "one_cycle" then self.max_step = c.total_steps end
  check_number(c, "learning_rate", 0)
  check_number(c, "min_learning_rate", 0)
  check_number(c, "newbob_relative_error_threshold")
  check_number(c, "newbob_error_threshold")
  check_number(c, "newbob_learning_rate_decay", 0)
  check_number(c, "newbob_multi_num_epochs", 1, true)
  check_number(c, "learning_rate_warmup_steps", 0)
  if not c.newbob_multi_update_interval then
    c.newbob_multi_update_interval = c.newbob_multi_num_epochs
  end
  check_number(c, "newbob_multi_update_interval", 1, true)
  self.lrs = {}       -- epoch -> lr decided for it
  self.scores = {}    -- finished epoch -> {key = number}
  self.last_epoch = 0 -- the last finished epoch
  self.decision = string.format("lr %s (%s)", fmt(c.learning_rate), self.control)
  return self
end

-- The lr of `epoch` before warmup: decided, or the most recent one before it.
function LRC:epoch_lr(epoch)
  if self.control == "cosine" then return self:schedule_lr(epoch, 1) end
  if self.lrs[epoch] then return self.lrs[epoch] end
  local best, lr = 0, self.cfg.learning_rate
  for e, v in pairs(self.lrs) do
    if e < epoch and e > best then best, lr = e, v end
  end
  return lr
end

-- PyTorch's OneCycleLR at its 0-based step n.
local function one_cycle(c, n)
  local max_lr = c.learning_rate
  local initial = max_lr / c.div_factor
  local min_lr = initial / c.final_div_factor
  local total = c.total_steps
  local phases
  if c.three_phase then
    phases = {{c.pct_start * total - 1, initial, max_lr},
              {2 * c.pct_start * total - 2, max_lr, initial},
              {total - 1, initial, min_lr}}
  else
    phases = {{c.pct_start * total - 1, initial, max_lr}, {total - 1, max_lr, min_lr}}
  end
  local start = 0
  for i, ph in ipairs(phases) do
    local stop = ph[1]
    if n <= stop or i == #phases then
      local pct = (n - start) / (stop - start)
      if c.anneal_strategy == "cos" then
        return ph[3] + (ph[2] - ph[3]) / 2 * (math.cos(math.pi * pct) + 1)
      end
      return (ph[3] - ph[2]) * pct + ph[2]
    end
    start = stop
  end
end

-- The lr of a schedule (cosine, noam, one_cycle) before warmup.
function LRC:schedule_lr(epoch, step)
  local c = self.cfg
  if self.control == "cosine" then
    local e = math.min(epoch - 1, c.T_max)
    return c.eta_min + (c.learning_rate - c.eta_min) * (1 + math.cos(math.pi * e / c.T_max)) / 2
  elseif self.control == "noam" then
    local s = math.max(step, 1)
    return c.learning_rate * c.model_size ^ -0.5 * math.min(s ^ -0.5, s * c.warmup_steps ^ -1.5)
  end
  if step > c.total_steps then
    error(string.format("lrc:lr: step %d is beyond total_steps = %d of learning_rate_control = "
      .. "\"one_cycle\" (PyTorch's OneCycleLR refuses it too: raise total_steps)", step,
      c.total_steps), 3)
  end
  return one_cycle(c, math.max(step, 1) - 1)
end

function LRC:lr(epoch, step)
  if math.type(epoch) ~= "integer" or epoch < 1 then
    error("lrc:lr: epoch must be an integer >= 1, got " .. tostring(epoch), 2)
  end
  step = step or 1
  local lr
  if self.schedule then
    lr = self:schedule_lr(epoch, step)
  elseif self.fn then
    lr = self.fn(epoch, step, self.scores)
    if type(lr) ~= "number" or lr ~= lr or lr < 0 or lr == math.huge then
      error(string.format("lrc:lr: the learning_rate_control function returned %s for epoch %d "
        .. "step %d (expects a finite number >= 0)", tostring(lr), epoch, step), 2)
    end
  else
    lr = self:epoch_lr(epoch)
  end
  local w = self.cfg.learning_rate_warmup_steps
  if w > 0 and step < w then lr = lr * math.max(step, 0) / w end
  return lr
end

-- RETURNN's choice of the score key for an epoch's scores.
function LRC:score_key(scores)
  local k = self.cfg.learning_rate_control_error_measure
  if k then return scores[k] ~= nil and k or nil end
  if scores.dev_score ~= nil then return "dev_score" end
  for _, key in ipairs(sorted_keys(scores)) do
    if type(key) == "string" and key:sub(1, 4) == "dev_" then return key end
  end
  if scores.train_score ~= nil then return "train_score" end
  return nil
end

-- The last finished epoch before `epoch` that has scores.
function LRC:prev_epoch(epoch)
  local best
  for e in pairs(self.scores) do
    if e < epoch and (not best or e > best) then best = e end
  end
  return best
end

-- Relative error between two epochs under one key, or nil (missing or different keys).
function LRC:relative(old_e, new_e)
  local old_s, new_s = self.scores[old_e], self.scores[new_e]
  local ko, kn = self:score_key(old_s), self:score_key(new_s)
  if not ko or ko ~= kn then return nil end
  local old, new = old_s[ko], new_s[kn]
  local denom = self.cfg.newbob_relative_error_div_by_old and math.abs(old) or math.abs(new)
  return (new - old) / denom, kn, old, new
end

function LRC:decay(lr)
  return math.max(lr * self.cfg.newbob_learning_rate_decay, self.cfg.min_learning_rate)
end

-- Decides the lr of epoch + 1 after `epoch` finished; returns it and the decision in words.
function LRC:decide(epoch)
  local c, lr = self.cfg, self:epoch_lr(epoch)
  local nxt = epoch + 1
  if self.schedule then
    return lr, string.format("epoch %d done (%s: the lr follows the schedule)", epoch, self.control)
  end
  if self.control == "constant" or self.control == "function" then
    return lr, string.format("epoch %d done, lr %s (%s)", epoch, fmt(lr), self.control)
  end
  local old_e = self:prev_epoch(epoch)
  if not old_e or not self.scores[epoch] then
    return lr, string.format("epoch %d done, keeping lr %s (no earlier score to compare)", epoch,
      fmt(lr))
  end
  local metric, threshold, key, old, new, what
  if self.control == "newbob_multi_epoch" then
    local iv = c.newbob_multi_update_interval
    if iv > 1 and nxt % iv ~= 1 then
      return lr, string.format("epoch %d done, keeping lr %s (next update at an epoch = 1 mod %d)",
        epoch, fmt(lr), iv)
    end
    local eps = {}
    for e in pairs(self.scores) do if e <= epoch then eps[#eps + 1] = e end end
    table.sort(eps)
    local first = math.max(1, #eps - c.newbob_multi_num_epochs)
    local sum, n = 0, 0
    for i = first, #eps - 1 do
      local r, k = self:relative(eps[i], eps[i + 1])
      if not r then
        return lr, string.format("epoch %d done, keeping lr %s (scores under different keys)",
          epoch, fmt(lr))
      end
      sum, n, key = sum + r, n + 1, k
    end
    metric, threshold = sum / n, c.newbob_relative_error_threshold
    what = string.format("mean relative change of %s over %d epochs %s", key, n, fmt(metric))
  else
    local r, k, o, nw = self:relative(old_e, epoch)
    if not r then
      return lr, string.format("epoch %d done, keeping lr %s (scores under different keys)",
        epoch, fmt(lr))
    end
    key, old, new = k, o, nw
    if self.control == "newbob_abs" then
      metric, threshold = new - old, c.newbob_error_threshold
      what = string.format("%s %s -> %s, change %s", key, fmt(old), fmt(new), fmt(metric))
    else
      metric, threshold = r, c.newbob_relative_error_threshold
      what = string.format("%s %s -> %s, relative change %s", key, fmt(old), fmt(new), fmt(metric))
    end
  end
  if metric > threshold then
    local nlr = self:decay(lr)
    return nlr, string.format("epoch %d: %s > threshold %s: lr %s -> %s for epoch %d", epoch, what,
      fmt(threshold), fmt(lr), fmt(nlr), nxt)
  end
  return lr, string.format("epoch %d: %s <= threshold %s: keeping lr %s for epoch %d", epoch,
    what, fmt(threshold), fmt(lr), nxt)
end

function LRC:epoch_done(epoch, scores)
  if math.type(epoch) ~= "integer" or epoch < 1 then
    error("lrc:epoch_done: epoch must be an integer >= 1, got " .. tostring(epoch), 2)
  end
  if type(scores) ~= "table" then error("lrc:epoch_done: scores must be a table", 2) end
  local s = {}
  for k, v in pairs(scores) do
    if type(k) == "string" and type(v) == "number" then s[k] = v end
  end
  if not self.lrs[epoch] then self.lrs[epoch] = self:epoch_lr(epoch) end
  self.scores[epoch] = s
  self.last_epoch = math.max(self.last_epoch, epoch)
  local lr, decision = self:decide(epoch)
  self.lrs[epoch + 1] = lr
  self.decision = decision
  return lr
end

function LRC:log_line()
  return "learning-rate control: " .. self.decision
end

-- Flat: control, last_epoch, decision, "lr.<e>" = lr, "score.<e>.<key>" = value.
function LRC:state()
  local st = {control = self.control, last_epoch = self.last_epoch, decision = self.decision}
  for e, lr in pairs(self.lrs) do st["lr." .. e] = lr end
  for e, s in pairs(self.scores) do
    for k, v in pairs(s) do st["score." .. e .. "." .. k] = v end
  end
  if self.schedule then
    st["opt.learning_rate"] = self.cfg.learning_rate
    for k in pairs(self.schedule) do st["opt." .. k] = self.cfg[k] end
  end
  return st
end

function LRC:load_state(st)
  if type(st) ~= "table" then error("lrc:load_state: expects the table of lrc:state()", 2) end
  if st.control ~= self.control then
    error(string.format("lrc:load_state: the state is of control '%s', this one is '%s'",
      tostring(st.control), self.control), 2)
  end
  -- a schedule goes on only with the options it ran with (anything else would not continue it)
  if self.schedule then
    local keys = sorted_keys(self.schedule)
    table.insert(keys, 1, "learning_rate")
    for _, k in ipairs(keys) do
      local saved, mine = st["opt." .. k], self.cfg[k]
      if saved ~= mine then
        error(string.format("lrc:load_state: the saved %s schedule has %s = %s, this config %s "
          .. "(the schedule would not continue: set it as saved, or train afresh)", self.control,
          k, tostring(saved), tostring(mine)), 2)
      end
    end
  end
  -- the state comes from a checkpoint file: an lr that is not a finite number >= 0 would train
  -- on with NaN or a string, an epoch beyond 2^63 is no table key
  local lrs, scores = {}, {}
  for k, v in pairs(st) do
    local e = type(k) == "string" and k:match("^lr%.(%d+)$")
    local se, key = nil, nil
    if type(k) == "string" then se, key = k:match("^score%.(%d+)%.(.+)$") end
    local ei = math.tointeger(tonumber(e or se))
    if (e or se) and (not ei or ei < 1) then
      error(string.format("lrc:load_state: key %s: the epoch must be an integer in 1..2^63",
        k), 2)
    end
    if e then
      if type(v) ~= "number" or not (v >= 0 and v < math.huge) then
        error(string.format("lrc:load_state: %s = %s is not a learning rate (a finite number "
          .. ">= 0)", k, tostring(v)), 2)
      end
      lrs[ei] = v
    end
    if se then
      if type(v) ~= "number" then
        error(string.format("lrc:load_state: %s = %s is not a score (a number)", k,
          tostring(v)), 2)
      end
      scores[ei] = scores[ei] or {}
      scores[ei][key] = v
    end
  end
  local last = math.tointeger(st.last_epoch)
  if not last or last < 0 then error("lrc:load_state: last_epoch must be an integer >= 0", 2) end
  self.lrs, self.scores, self.last_epoch = lrs, scores, last
  self.decision = type(st.decision) == "string" and st.decision or self.decision
end

function LRC:__tostring()
  return "lr_control " .. self.control .. ": " .. self.decision
end

function M.install(module)
  rl = module
  rl.lr_control = M.new
  rl.lr_control_options = sorted_keys(DEFAULTS)
end

return M
