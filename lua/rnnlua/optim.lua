-- rl.optimizer: the Lua face of the fused optimizers of kernels/optim.h (equations in
-- kernels/optim_rules.h, PyTorch's torch.optim formulas).
--
--   local opt = rl.optimizer(cfg, params, grads)  -- params, grads: net:params(), net:grads()
--   cfg = {class = "sgd"|"momentum"|"nesterov"|"adagrad"|"adadelta"|"adam"|"adamw" (default sgd),
--          momentum = 0.9, beta1 = 0.9, beta2 = 0.999, epsilon = (adagrad 1e-10, adadelta 1e-6,
--          adam(w) 1e-8), rho = 0.9, weight_decay = (adamw only, decoupled; 1e-2),
--          l2 = (l2 * w added to the gradient), gradient_clip = (elementwise, to [-c, c]),
--          gradient_clip_global_norm = (scale g by min(1, c / (||g|| + 1e-6))),
--          gradient_noise = (std of Gaussian noise added to g, drawn from the global generator
--          of rl.manual_seed, so rl.get_rng_state covers it), max_norm = (after each applied
--          step, every column of every 2-D weight, i.e. the weights into one output unit of
--          RETURNN's (n_in, n_out) layout, is rescaled to norm <= max_norm; needs
--          param_list = net:param_list()), outlier_factor = 10 (0: skip only NaN/Inf norms),
--          outlier_warmup = 5 (accepted steps before the ratio test)}
--   opt:step(lr) -> true, or false, reason   -- a skipped step changes nothing but the counters
--   opt:state() -> {class, num_steps, skipped, norm_count, avg_norm, last_grad_norm,
--                   <state buffer name> = tensor clone, ...}   (PyTorch's buffer names)
--   opt:load_state(state)                    -- checks class and shapes, then restores
--   opt.num_steps, opt.skipped, opt.last_grad_norm, opt.class
local M = {}

local rl -- the module table, set by install

local KEYS = {
  class = true, momentum = true, beta1 = true, beta2 = true, epsilon = true, rho = true,
  weight_decay = true, l2 = true, gradient_clip = true, gradient_clip_global_norm = true,
  gradient_noise = true, max_norm = true, outlier_factor = true, outlier_warmup = true,
  param_list = true,
}

local COUNTERS = {"num_steps", "skipped", "norm_count", "avg_norm", "last_grad_norm"}

-- state buffers that are sums or averages of squares, never negative
local SECOND_MOMENTS = {sum = true, exp_avg_sq = true, square_avg = true, acc_delta = true}

local Optimizer = {}
Optimizer.__index = Optimizer

local util = require("rnnlua.util")
local sorted_keys = util.sorted_keys

local function describe(t)
  return string.format("%s %s", t:dtype(), tostring(t:size()))
end

local function same_shape(a, b)
  if a:dim() ~= b:dim() then return false end
  for d = 1, a:dim() do
    if a:size(d) ~= b:size(d) then return false end
  end
  return true
end

-- The 2-D weights max_norm constrains.
local function constrained(cfg)
  if cfg.max_norm == nil or cfg.max_norm == false then return nil end
  if type(cfg.max_norm) ~= "number" or not (cfg.max_norm > 0) then
    error("rl.optimizer: max_norm must be a number > 0", 3)
  end
  if type(cfg.param_list) ~= "table" then
    error("rl.optimizer: max_norm needs param_list = net:param_list()", 3)
  end
  local ws = {}
  for i, p in ipairs(cfg.param_list) do
    if type(p) ~= "table" or not rl.is_tensor(p.value) then
      error(string.format("rl.optimizer: param_list[%d] has no tensor 'value'", i), 3)
    end
    if p.value:dim() == 2 then ws[#ws + 1] = p.value end
  end
  return ws
end

function M.new(cfg, params, grads)
  cfg = cfg or {}
  if type(cfg) ~= "table" then error("rl.optimizer: cfg must be a table", 2) end
  for _, k in ipairs(sorted_keys(cfg)) do
    if not KEYS[k] then
      error(string.format("rl.optimizer: unknown option '%s' (known: %s)", k,
        table.concat(sorted_keys(KEYS), ", ")), 2)
    end
  end
  if not rl.is_tensor(params) or not rl.is_tensor(grads) then
    error("rl.optimizer: params and grads must be tensors (net:params(), net:grads())", 2)
  end
  if params:numel() ~= grads:numel() or params:dtype() ~= grads:dtype() then
    error(string.format("rl.optimizer: grads %s do not match params %s", describe(grads),
      describe(params)), 2)
  end
  local c = {}
  for k, v in pairs(cfg) do
    if k ~= "param_list" and k ~= "max_norm" then c[k] = v end
  end
  local self = setmetatable({
    handle = rl._optimizer_new(c, params),
    params = params, grads = grads,
    max_norm = cfg.max_norm or nil, weights = constrained(cfg),
  }, Optimizer)
  self.class = self.handle:info().class
  self:sync()
  return self
end

function Optimizer:sync()
  local info = self.handle:info()
  self.num_steps, self.skipped, self.last_grad_norm = info.num_steps, info.skipped,
    info.last_grad_norm
end

function Optimizer:step(lr)
  if type(lr) ~= "number" then error("opt:step: lr must be a number, got " .. type(lr), 2) end
  -- the params or grads tensor given to rl.optimizer (a share of the network's buffer) closed
  -- by <close> raised "argument 3: the tensor was freed" from inside the library
  for _, which in ipairs{"params", "grads"} do
    local t = self[which]
    if not pcall(function() return t:dim() end) then
      error(string.format("opt:step: the %s tensor this optimizer was made with was freed "
        .. "(closed by <close> or a closed coroutine)", which), 2)
    end
  end
  local applied, reason = self.handle:step(self.params, self.grads, lr)
  if applied and self.weights then
    for _, w in ipairs(self.weights) do rl._optim_max_norm(w, self.max_norm) end
  end
  self:sync()
  if applied then return true end
  return false, reason
end

function Optimizer:state()
  local st = self.handle:info()
  for name, t in pairs(self.handle:state_tensors()) do st[name] = t:clone() end
  return st
end

function Optimizer:load_state(st)
  if type(st) ~= "table" then error("opt:load_state: expects the table of opt:state()", 2) end
  if st.class ~= self.class then
    error(string.format("opt:load_state: the state is of class '%s', this optimizer is '%s'",
      tostring(st.class), self.class), 2)
  end
  for _, k in ipairs(COUNTERS) do
    if type(st[k]) ~= "number" then error("opt:load_state: missing number '" .. k .. "'", 2) end
  end
  -- the state may come from a crafted checkpoint: a tiny or NaN average norm skipped every
  -- later step as an outlier (or none), a negative second moment made the parameters NaN
  if not (st.avg_norm >= 0 and st.avg_norm < math.huge) then
    error("opt:load_state: avg_norm must be a finite number >= 0, got " .. tostring(st.avg_norm),
      2)
  end
  local live = self.handle:state_tensors()
  for _, name in ipairs(sorted_keys(live)) do
    local src = st[name]
    if not rl.is_tensor(src) then error("opt:load_state: missing tensor '" .. name .. "'", 2) end
    if not same_shape(src, live[name]) then
      error(string.format("opt:load_state: '%s' is %s, the optimizer has %s", name,
        describe(src), describe(live[name])), 2)
    end
    -- a state from a file: NaN or Inf in it would make every parameter NaN at the next step
    -- (checked in the optimizer's dtype, where a float64 value may overflow float32)
    local host = src:cpu()
    if host:dtype() ~= live[name]:dtype() then
      host = live[name]:dtype() == "float64" and host:double() or host:float()
    end
    local nan, inf = rl.dataset_scan(host:contiguous())
    if host:dtype() ~= "int32" and (nan or inf) then
      error(string.format("opt:load_state: '%s' holds %s at value %d", name,
        nan and "NaN" or "Inf", nan or inf), 2)
    end
    if SECOND_MOMENTS[name] and src:numel() > 0 and src:min() < 0 then
      error(string.format("opt:load_state: '%s' (a sum of squares) holds a negative value %g",
        name, src:min()), 2)
    end
  end
  for name, t in pairs(live) do t:copy_(st[name]) end
  self.handle:set_info(st)
  self:sync()
end

function Optimizer:__tostring()
  return string.format("optimizer %s (%d steps, %d skipped, last gradient norm %.4g)", self.class,
    self.num_steps, self.skipped, self.last_grad_norm)
end

function M.install(module)
  rl = module
  rl.optimizer = M.new
  rl.optimizer_options = sorted_keys(KEYS)
end

return M
