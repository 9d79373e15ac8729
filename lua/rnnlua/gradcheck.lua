-- rl.gradcheck: compares a network's backward with central differences, in float64.
--
--   rl.gradcheck{network = {...}, extern_data = {...}}          a whole network, or
--   rl.gradcheck{layer = {class = "lstm", n_out = 3}, in_dim = 4} one layer (in_dim may be a
--       list, one input each: data, data2, ...), with a loss on it: the layer's own loss when
--       the description has one, else mse against random targets (a ctc loss gets random
--       label sequences of about half their input's length, with lengths_<key>)
--   options: T = 5, B = 3, lengths = {T, T-1, ...} (ragged), eps = 1e-6, seed = 1,
--       max_params_per_tensor (check a random subset of at most this many elements of each
--       parameter tensor; all by default), max_inputs = 60 (elements of each dense input;
--       0 skips the inputs), batch = {key = tensor, ...} (entries that replace the random
--       ones, e.g. a label sequence classes (S, B) with lengths_classes), train = false (with true, dropout masks repeat: the generator
--       is reset before every forward), floor = 1e-5, tol = 1e-3, assert = false,
--       init = function(net) called on the built network before the check (e.g. to move
--       parameters such as gains of 1 away from their initial values)
--
-- The network is built in float64 (rl.manual_seed(seed) and math.randomseed(seed) are called,
-- so the check is reproducible and leaves both generators reseeded), fed random inputs and targets, and every
-- checked element x gets numeric = (loss(x + eps) - loss(x - eps)) / (2 eps) against the
-- analytic gradient from net:backward. The relative error of an element is
--   |analytic - numeric| / max(|analytic| + |numeric|, floor)
-- where floor keeps gradients that are (nearly) zero on both sides from turning rounding noise
-- (about 1e-16 * |loss| / eps) into large relative errors. With correct gradients float64
-- gives errors of 1e-8 .. 1e-4; a wrong gradient gives 1e-2 and more. Returns a report:
--   {max_rel_error, max_abs_error, n_checked, passed, tol, worst = {tensor, index,
--    analytic, numeric, rel_error}, per_param = {{name = "layer.W", checked, max_rel_error,
--    max_abs_error}, ..., ["layer.W"] = same entry}, inputs = {same for each input}, net}
-- With assert = true a report over tol raises an error describing the worst element.
-- A NaN or infinite gradient or difference is an error of +inf (it fails the check: math.max
-- drops a NaN, so such a layer would pass with max_rel_error 0), and the options are checked
-- (eps = 0 or NaN would make every element NaN and the check pass; a misspelt key would be
-- ignored).
local M = {}

local rl -- the module table, set by install

local fail = require("rnnlua.util").fail

local copy = require("rnnlua.util").copy

-- A network around one layer: its inputs from data, data2, ..., and a loss on it.
local function wrap_layer(o)
  if type(o.layer) ~= "table" then fail("rl.gradcheck: layer must be a layer description") end
  local in_dims = o.in_dim or 3
  if type(in_dims) ~= "table" then in_dims = {in_dims} end
  local extern, froms = {}, {}
  for i, dim in ipairs(in_dims) do
    local key = i == 1 and "data" or ("data" .. i)
    extern[key], froms[i] = {dim = dim}, key
  end
  local d = copy(o.layer)
  d.from = #froms == 1 and froms[1] or froms
  local probe = copy(d)
  probe.loss, probe.target, probe.loss_scale, probe.is_output_layer = nil, nil, nil, true
  probe.blank_index, probe.label_smoothing = nil, nil
  local n_out = rl.network({layer = probe}, extern, {dtype = "float64"}):layer("layer").n_out
  if d.loss == "ce" then
    d.target = d.target or "classes"
    extern[d.target] = {dim = n_out, sparse = true}
  elseif d.loss == "ctc" then
    d.target = d.target or "classes"
    extern[d.target] = {dim = n_out - 1, sparse = true}
  else
    d.loss, d.target = d.loss or "mse", d.target or "target"
    extern[d.target] = {dim = n_out}
  end
  return {layer = d}, extern
end

-- Indices 1..n, or a random subset of at most k of them (sorted).
local function pick(n, k)
  local idx = {}
  if k == nil or n <= k then
    for i = 1, n do idx[i] = i end
    return idx
  end
  local chosen = {}
  while #idx < k do
    local i = math.random(n)
    if not chosen[i] then
      chosen[i] = true
      idx[#idx + 1] = i
    end
  end
  table.sort(idx)
  return idx
end

local KEYS = {
  network = true, extern_data = true, layer = true, in_dim = true, T = true, B = true,
  lengths = true, eps = true, seed = true, max_params_per_tensor = true, max_inputs = true,
  batch = true, train = true, floor = true, tol = true, assert = true, init = true,
}

-- o[key] when given must be a number satisfying ok (described by what).
local function check_opt(o, key, ok, what)
  local v = o[key]
  if v ~= nil and (type(v) ~= "number" or not ok(v)) then
    fail("rl.gradcheck: %s must be %s, got %s", key, what, tostring(v))
  end
end

local function positive_finite(v) return v > 0 and v < math.huge end
local function positive_int(v) return math.type(v) == "integer" and v >= 1 end

function M.gradcheck(o)
  if type(o) ~= "table" then error("rl.gradcheck: expects an options table", 2) end
  require("rnnlua.util").check_options("rl.gradcheck", o, KEYS)
  check_opt(o, "eps", positive_finite, "a finite number > 0")
  check_opt(o, "floor", positive_finite, "a finite number > 0")
  check_opt(o, "tol", function(v) return v >= 0 and v < math.huge end, "a finite number >= 0")
  check_opt(o, "T", positive_int, "an integer >= 1")
  check_opt(o, "B", positive_int, "an integer >= 1")
  check_opt(o, "max_params_per_tensor", positive_int, "an integer >= 1")
  check_opt(o, "max_inputs", function(v) return math.type(v) == "integer" and v >= 0 end,
    "an integer >= 0")
  local desc, extern = o.network, o.extern_data
  if o.layer then desc, extern = wrap_layer(o) end
  if type(desc) ~= "table" or type(extern) ~= "table" then
    fail("rl.gradcheck: give network and extern_data, or layer and in_dim")
  end
  local T, B = o.T or 5, o.B or 3
  local eps, floor, tol = o.eps or 1e-6, o.floor or 1e-5, o.tol or 1e-3
  local seed = o.seed or 1
  rl.manual_seed(seed)
  math.randomseed(seed)
  local net = rl.network(desc, extern, {dtype = "float64", input_grads = true})
  if o.init ~= nil then
    if type(o.init) ~= "function" then fail("rl.gradcheck: init must be a function, got %s", type(o.init)) end
    o.init(net)
  end

  local lengths = o.lengths
  if lengths == nil then
    lengths = {}
    for b = 1, B do lengths[b] = math.max(1, T - b + 1) end
  end
  if #lengths ~= B then fail("rl.gradcheck: %d lengths given for B = %d", #lengths, B) end
  local batch = {lengths = rl.tensor(lengths, "int32")}
  local dense = {}
  local keys = {}
  for k in pairs(net.used_extern) do keys[#keys + 1] = k end
  table.sort(keys)
  local ctc_keys = {}
  for _, node in ipairs(net.loss_nodes) do
    if node.ctc then ctc_keys[node.target] = true end
  end
  for _, key in ipairs(keys) do
    local e = net.ext[key]
    if ctc_keys[key] then
      -- label sequences of about half their input's length (always feasible)
      local S = math.max(1, T // 2)
      batch[key] = (rl.rand(S, B, "float64") * e.dim):floor():clamp(0, e.dim - 1):int()
      local tl = {}
      for b = 1, B do tl[b] = math.min(S, math.max(0, lengths[b] // 2)) end
      batch["lengths_" .. key] = rl.tensor(tl, "int32")
    elseif e.sparse then
      batch[key] = (rl.rand(T, B, "float64") * e.dim):floor():clamp(0, e.dim - 1):int()
    else
      batch[key] = rl.randn(T, B, e.dim, "float64")
      if net.input_keys[key] then dense[#dense + 1] = key end
    end
  end

  -- given entries (targets of their own length, say) replace the random ones
  for k, v in pairs(o.batch or {}) do batch[k] = v end
  local train = o.train == true
  local state = rl.get_rng_state()
  local function loss()
    rl.set_rng_state(state)
    return (net:forward(batch, {train = train}))
  end

  net:zero_grads()
  loss()
  net:backward()
  local report = {
    max_rel_error = 0, max_abs_error = 0, n_checked = 0, tol = tol, per_param = {}, inputs = {},
    net = net,
  }
  -- checks elements base + i of flat (i in indices) against analytic[base + i]
  local function check(list, name, flat, analytic, indices, base)
    local entry = {name = name, checked = #indices, max_rel_error = 0, max_abs_error = 0}
    for _, i in ipairs(indices) do
      local j = base + i
      local v = flat[j]
      flat[j] = v + eps
      local lp = loss()
      flat[j] = v - eps
      local lm = loss()
      flat[j] = v
      local num, ana = (lp - lm) / (2 * eps), analytic[j]
      local abs = math.abs(ana - num)
      local rel = abs / math.max(math.abs(ana) + math.abs(num), floor)
      if not (abs < math.huge) or not (rel < math.huge) then abs, rel = math.huge, math.huge end
      entry.max_abs_error = math.max(entry.max_abs_error, abs)
      entry.max_rel_error = math.max(entry.max_rel_error, rel)
      report.max_abs_error = math.max(report.max_abs_error, abs)
      if report.worst == nil or rel > report.worst.rel_error then
        report.worst = {tensor = name, index = i, analytic = ana, numeric = num, rel_error = rel}
      end
    end
    report.max_rel_error = math.max(report.max_rel_error, entry.max_rel_error)
    report.n_checked = report.n_checked + #indices
    list[#list + 1] = entry
    list[name] = entry
  end

  local grads = net:grads():clone()
  local params = net:params()
  local off = 0
  for _, p in ipairs(net:param_list()) do
    local n = p.value:numel()
    check(report.per_param, p.layer .. "." .. p.name, params, grads,
      pick(n, o.max_params_per_tensor), off)
    off = off + n
  end
  local max_inputs = o.max_inputs or 60
  if max_inputs > 0 then
    for _, key in ipairs(dense) do
      local x = batch[key]
      local g = net:input_grad(key):clone():view(x:numel())
      check(report.inputs, key, x:view(x:numel()), g, pick(x:numel(), max_inputs), 0)
    end
  end
  report.passed = report.max_rel_error <= tol
  if o.assert and not report.passed then
    local w = report.worst
    fail("rl.gradcheck: max relative error %.3g > tol %g at %s[%d]: analytic %.9g, numeric %.9g",
      w.rel_error, tol, w.tensor, w.index, w.analytic, w.numeric)
  end
  return report
end

function M.install(module)
  rl = module
  rl.gradcheck = M.gradcheck
  return M
end

return M
