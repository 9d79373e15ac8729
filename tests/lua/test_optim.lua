-- rl.optimizer on a small network: training reduces the loss, a state round trip in the middle
-- of a run resumes bit-identically, max-norm and outlier skips through the Lua face, and bad
-- configurations raise errors that name the key.
local H = dofile("tests/lua/harness.lua")

local T, B, F, C = 5, 3, 4, 3

local function make_net(dtype, seed)
  rl.manual_seed(seed or 7)
  return rl.network({
    hidden = {class = "linear", activation = "tanh", n_out = 6, from = "data"},
    output = {class = "softmax", n_out = C, loss = "ce", target = "classes", from = "hidden"},
  }, {data = {dim = F}, classes = {dim = C, sparse = true}}, {dtype = dtype or "float32"})
end

-- A fixed batch whose class depends on the sign of the first input.
local function make_batch(dtype)
  rl.manual_seed(99)
  local x = rl.randn(T, B, F, dtype or "float32")
  local y = {}
  for t = 1, T do
    y[t] = {}
    for b = 1, B do
      local v = x[t][b][1]
      y[t][b] = v > 0.5 and 2 or (v < -0.5 and 0 or 1)
    end
  end
  return {data = x, classes = rl.tensor(y, "int32"), lengths = rl.tensor({T, T, 4}, "int32")}
end

local function loss_and_grad(net, batch)
  net:zero_grads()
  local loss = net:forward(batch, {train = false})
  net:backward()
  return loss
end

local function equal_tensors(a, b)
  if a:numel() ~= b:numel() then return false end
  local ta, tb = a:totable(), b:totable()
  for i = 1, #ta do
    if ta[i] ~= tb[i] then return false end
  end
  return true
end

for _, class in ipairs({"sgd", "momentum", "nesterov", "adagrad", "adadelta", "adam", "adamw"}) do
  H.test(class .. ": 20 steps reduce the loss", function()
    local net, batch = make_net(), make_batch()
    local opt = rl.optimizer({class = class}, net:params(), net:grads())
    local lr = ({sgd = 0.2, momentum = 0.05, nesterov = 0.05, adagrad = 0.1, adadelta = 20,
      adam = 0.02, adamw = 0.02})[class]
    local first = loss_and_grad(net, batch)
    for _ = 1, 20 do
      H.check(opt:step(lr) == true, "a step was skipped")
      loss_and_grad(net, batch)
    end
    local last = loss_and_grad(net, batch)
    H.check(last < 0.8 * first, string.format("loss %g -> %g", first, last))
    H.check(opt.num_steps == 20 and opt.skipped == 0, "counters")
    H.check(opt.last_grad_norm > 0, "last_grad_norm")
  end)
end

-- Runs `n` steps of opt on net (lr changing per step), with noise and clipping on.
local CFG = {class = "adam", gradient_noise = 0.01, gradient_clip = 0.5, l2 = 1e-3,
  gradient_clip_global_norm = 2.0}
local function run(net, opt, batch, from, to)
  for s = from, to do
    loss_and_grad(net, batch)
    opt:step(0.01 / s)
  end
end

for _, dtype in ipairs({"float32", "float64"}) do
  H.test("state round trip in the middle resumes bit-identically (" .. dtype .. ")", function()
    local batch = make_batch(dtype)
    -- uninterrupted: 8 steps
    local net1 = make_net(dtype)
    local opt1 = rl.optimizer(CFG, net1:params(), net1:grads())
    rl.manual_seed(5)
    run(net1, opt1, batch, 1, 8)
    -- interrupted after 3: params, optimizer state and RNG state saved, everything rebuilt
    local net2 = make_net(dtype)
    local opt2 = rl.optimizer(CFG, net2:params(), net2:grads())
    rl.manual_seed(5)
    run(net2, opt2, batch, 1, 3)
    local saved_params, saved_opt, saved_rng = net2:params():clone(), opt2:state(),
      rl.get_rng_state()
    H.check(saved_opt.num_steps == 3 and saved_opt.exp_avg and saved_opt.exp_avg_sq, "state keys")
    run(net2, opt2, batch, 4, 5) -- the state table is a copy: further steps do not touch it
    local net3 = make_net(dtype, 123)
    net3:params():copy_(saved_params)
    local opt3 = rl.optimizer(CFG, net3:params(), net3:grads())
    opt3:load_state(saved_opt)
    rl.set_rng_state(saved_rng)
    H.check(opt3.num_steps == 3, "num_steps restored")
    run(net3, opt3, batch, 4, 8)
    H.check(equal_tensors(net1:params(), net3:params()), "resumed params differ")
    local s1, s3 = opt1:state(), opt3:state()
    H.check(equal_tensors(s1.exp_avg_sq, s3.exp_avg_sq), "resumed state differs")
    H.check(s1.avg_norm == s3.avg_norm and s1.num_steps == s3.num_steps, "counters differ")
    -- and the noise matters: without restoring the RNG the result differs
    local net4 = make_net(dtype, 123)
    net4:params():copy_(saved_params)
    local opt4 = rl.optimizer(CFG, net4:params(), net4:grads())
    opt4:load_state(saved_opt)
    run(net4, opt4, batch, 4, 8)
    H.check(not equal_tensors(net1:params(), net4:params()), "noise had no effect")
  end)
end

H.test("max_norm keeps every column of the 2-D weights within the bound", function()
  local net, batch = make_net(), make_batch()
  local opt = rl.optimizer({class = "sgd", max_norm = 0.3, param_list = net:param_list()},
    net:params(), net:grads())
  loss_and_grad(net, batch)
  opt:step(0.5)
  local n2 = 0
  for _, p in ipairs(net:param_list()) do
    if p.value:dim() == 2 then
      n2 = n2 + 1
      local w = p.value
      for j = 1, w:size(2) do
        local s = 0
        for i = 1, w:size(1) do s = s + w[i][j] ^ 2 end
        H.check(math.sqrt(s) <= 0.3 * (1 + 1e-6), string.format("%s.%s column %d norm %g",
          p.layer, p.name, j, math.sqrt(s)))
      end
    end
  end
  H.check(n2 == 2, "two 2-D weights")
end)

H.test("a NaN gradient is skipped and reported", function()
  local net, batch = make_net(), make_batch()
  local opt = rl.optimizer({class = "momentum"}, net:params(), net:grads())
  loss_and_grad(net, batch)
  local before = net:params():clone()
  net:grads()[2] = 0 / 0
  local ok, why = opt:step(0.1)
  H.check(ok == false and why:find("not finite", 1, true), "reason: " .. tostring(why))
  H.check(opt.skipped == 1 and opt.num_steps == 0, "counters")
  H.check(equal_tensors(before, net:params()), "params changed")
  H.check(opt:state().momentum_buffer:norm() == 0, "state changed")
end)

H.test("a huge gradient after warm-up is skipped", function()
  local net, batch = make_net(), make_batch()
  local opt = rl.optimizer({class = "sgd", outlier_factor = 5, outlier_warmup = 3},
    net:params(), net:grads())
  for _ = 1, 3 do
    loss_and_grad(net, batch)
    H.check(opt:step(0.01), "warm-up step skipped")
  end
  loss_and_grad(net, batch)
  net:grads():mul_(1e6)
  local before = net:params():clone()
  local ok, why = opt:step(0.01)
  H.check(not ok and why:find("> 5 x average", 1, true), "reason: " .. tostring(why))
  H.check(equal_tensors(before, net:params()), "params changed")
end)

local function new_opt(cfg)
  local net = make_net()
  return rl.optimizer(cfg, net:params(), net:grads())
end
H.expect_error("unknown key is named", function() new_opt({class = "adam", beta3 = 1}) end,
  "unknown option 'beta3'")
H.expect_error("unknown class is named", function() new_opt({class = "adamax"}) end,
  "unknown class 'adamax'")
H.expect_error("weight_decay outside adamw", function() new_opt({class = "adam",
  weight_decay = 0.1}) end, "weight_decay")
H.expect_error("a value out of range is named", function() new_opt({class = "momentum",
  momentum = 1.5}) end, "momentum = 1.5")
H.expect_error("a non-number is named", function() new_opt({class = "sgd", l2 = "x"}) end,
  "l2 must be a number")
H.expect_error("max_norm needs param_list", function() new_opt({max_norm = 1}) end,
  "param_list")
H.expect_error("grads must match params", function()
  local net = make_net()
  rl.optimizer({}, net:params(), rl.zeros(3))
end, "do not match")
H.expect_error("load_state checks the class", function()
  local a, b = new_opt({class = "adam"}), new_opt({class = "adagrad"})
  b:load_state(a:state())
end, "class 'adam'")
H.expect_error("load_state checks shapes", function()
  local a = new_opt({class = "adagrad"})
  local st = a:state()
  st.sum = rl.zeros(5)
  a:load_state(st)
end, "'sum' is float32")
-- a state read from a crafted checkpoint: NaN in Adam's moments made every parameter NaN at
-- the next step (and the epoch's checkpoint with them, when it was the last step)
for _, v in ipairs{0 / 0, 1 / 0} do
  H.expect_error("load_state refuses a state holding " .. tostring(v), function()
    local a = new_opt({class = "adam"})
    local st = a:state()
    local name = st.m and "m" or next(a.handle:state_tensors())
    st[name] = st[name]:clone()
    st[name]:view(-1)[1] = v
    a:load_state(st)
  end, v ~= v and "holds NaN at value 1" or "holds Inf at value 1")
end
H.expect_error("load_state refuses a float64 state beyond float32's range", function()
  local a = new_opt({class = "adam"})
  local st = a:state()
  local name = st.m and "m" or next(a.handle:state_tensors())
  st[name] = st[name]:double()
  st[name]:view(-1)[1] = 1e300
  a:load_state(st)
end, "holds Inf at value 1")
-- a crafted state: checked before anything changes (negative second moments, bad avg_norm)
for _, c in ipairs{
  {"adam", "exp_avg_sq", -1, "'exp_avg_sq' (a sum of squares) holds a negative value -1"},
  {"adam", "exp_avg", 0 / 0, "'exp_avg' holds NaN at value 1"},
  {"adagrad", "sum", 1 / 0, "'sum' holds Inf at value 1"},
  {"adadelta", "acc_delta", -2, "'acc_delta' (a sum of squares) holds a negative value -2"},
  {"momentum", "momentum_buffer", -1 / 0, "'momentum_buffer' holds Inf at value 1"},
} do
  H.expect_error("load_state: " .. c[1] .. " " .. c[2] .. " = " .. tostring(c[3]), function()
    local a = new_opt({class = c[1]})
    local st = a:state()
    st[c[2]][1] = c[3]
    a:load_state(st)
  end, "opt:load_state: " .. c[4])
end
for _, v in ipairs{0 / 0, -1, 1 / 0} do
  H.expect_error("load_state: avg_norm = " .. tostring(v), function()
    local a = new_opt({class = "sgd"})
    local st = a:state()
    st.avg_norm = v
    a:load_state(st)
  end, "opt:load_state: avg_norm must be a finite number >= 0")
end
H.test("load_state: a rejected state changes nothing", function()
  local a = new_opt({class = "adam"})
  local st = a:state()
  st.exp_avg_sq[1] = -1
  st.num_steps = 7
  pcall(a.load_state, a, st)
  H.check(a.num_steps == 0 and a:state().exp_avg_sq:abs():sum() == 0, "state changed")
end)
for _, which in ipairs{"params", "grads"} do
  H.expect_error("step after its " .. which .. " were closed", function()
    local net = make_net()
    local p, g = net:params(), net:grads()
    local opt = rl.optimizer({class = "adam"}, p, g)
    -- (another net:params() is a share of its own: closing it would not touch the optimizer's)
    do local t <close> = which == "params" and p or g end
    opt:step(0.1)
  end, "opt:step: the " .. which .. " tensor this optimizer was made with was freed")
end
H.expect_error("step needs a number", function() new_opt({}):step("x") end, "lr must be a number")

H.done()
