-- Dynamic loss scaling for fp16 training (config.grad_scaler; on by default with precision =
-- "fp16", allowed with any), the state machine of PyTorch's GradScaler with its defaults:
--   * the backward runs with every loss gradient multiplied by `scale` (net.grad_scale), so
--     that small gradients survive fp16's range (its smallest normal is 2^-14);
--   * before the update the summed gradients are divided by `scale` (unscale), so gradient
--     clipping, the optimizer's norm test and the update see the true gradient;
--   * when the scaled gradients hold Inf or NaN (an fp16 product overflowed) the update is
--     skipped (nothing reaches the parameters or the optimizer state), `scale` is multiplied by
--     backoff_factor and the clean-step count restarts;
--   * after growth_interval clean updates in a row `scale` is multiplied by growth_factor (not
--     past 2^127, so that a scaled float32 gradient of magnitude 1 stays finite).
-- A scale falling below 2^-24 means the gradients overflow whatever the scale (the forward
-- itself overflows fp16): training stops with an error saying so rather than updating with
-- zeros. The state (scale, clean steps) is in each checkpoint's /engine group
-- (rnnlua.practice), so a resume continues it.
local M = {}

M.DEFAULTS = {init_scale = 2 ^ 16, growth_factor = 2, backoff_factor = 0.5,
  growth_interval = 2000}
local MAX_SCALE, MIN_SCALE = 2 ^ 127, 2 ^ -24

local function finite(x) return x == x and x ~= math.huge and x ~= -math.huge end

-- The options of config.grad_scaler (true: the defaults; a table overrides some), checked;
-- errors name who and the option.
function M.options(who, v)
  local o = {}
  for k, d in pairs(M.DEFAULTS) do o[k] = d end
  if v == true then return o end
  if type(v) ~= "table" then
    error(string.format("%s must be true, false or a table {init_scale, growth_factor, "
      .. "backoff_factor, growth_interval}, got %s", who, type(v)), 0)
  end
  for k, x in pairs(v) do
    if M.DEFAULTS[k] == nil then
      error(string.format("%s: unknown option '%s' (init_scale, growth_factor, backoff_factor, "
        .. "growth_interval)", who, tostring(k)), 0)
    end
    if type(x) ~= "number" or not finite(x) then
      error(string.format("%s.%s must be a finite number, got %s", who, k, tostring(x)), 0)
    end
    o[k] = x
  end
  if not (o.init_scale >= MIN_SCALE and o.init_scale <= MAX_SCALE) then
    error(string.format("%s.init_scale must be in [2^-24, 2^127], got %g", who, o.init_scale), 0)
  end
  if not (o.growth_factor > 1) then
    error(string.format("%s.growth_factor must be > 1, got %g", who, o.growth_factor), 0)
  end
  if not (o.backoff_factor > 0 and o.backoff_factor < 1) then
    error(string.format("%s.backoff_factor must be in (0, 1), got %g", who, o.backoff_factor), 0)
  end
  if math.type(o.growth_interval) ~= "integer" or o.growth_interval < 1 then
    error(string.format("%s.growth_interval must be an integer >= 1, got %s", who,
      tostring(o.growth_interval)), 0)
  end
  return o
end

local Scaler = {}
Scaler.__index = Scaler

function M.new(opts)
  return setmetatable({opts = opts, scale = opts.init_scale, good = 0}, Scaler)
end

-- After an update attempt: found_inf says whether its gradients held Inf or NaN. Returns what
-- happened: "backoff" (scale shrunk), "grow" (scale grown) or nil; an error when the scale
-- falls below 2^-24.
function Scaler:update(found_inf)
  local o = self.opts
  if found_inf then
    self.scale, self.good = self.scale * o.backoff_factor, 0
    if self.scale < MIN_SCALE then
      error(string.format("fp16 loss scaling: the gradients overflowed at every loss scale down "
        .. "to %g (the forward itself overflows fp16?); train in \"bf16\" or \"fp32\"",
        self.scale / o.backoff_factor), 0)
    end
    return "backoff"
  end
  self.good = self.good + 1
  if self.good >= o.growth_interval then
    self.good = 0
    if self.scale * o.growth_factor <= MAX_SCALE then
      self.scale = self.scale * o.growth_factor
      return "grow"
    end
  end
  return nil
end

-- The scaled gradients grads (a float tensor on any device): true when they hold Inf or NaN
-- (left as they are: the update is skipped); else false, with grads divided by the scale.
-- The sum of finite float32 values can only overflow past the float32 range if the gradients
-- are themselves near it, which is an overflow to skip too.
function Scaler:unscale(grads)
  if not finite(grads:sum()) then return true end
  grads:mul_(1 / self.scale)
  return false
end

-- The checkpoint's /engine keys of this state, and their restoring (errors name the key).
function Scaler:state() return {grad_scale = self.scale, grad_scale_good = self.good} end

function Scaler:load_state(st)
  local s, g = st.grad_scale, st.grad_scale_good
  if s == nil then return false end
  if type(s) ~= "number" or not (s >= MIN_SCALE and s <= MAX_SCALE) then
    error(string.format("/engine grad_scale = %s is not a loss scale in [2^-24, 2^127]",
      tostring(s)), 0)
  end
  if math.type(g) ~= "integer" or g < 0 then
    error(string.format("/engine grad_scale_good = %s is not an integer >= 0", tostring(g)), 0)
  end
  self.scale, self.good = s, g
  return true
end

return M
