-- Dynamic loss scaling (rnnlua.grad_scaler; rl.train's grad_scaler, on by default in fp16): the
-- state machine with injected overflows (PyTorch GradScaler's defaults: 2^16, x0.5 on Inf/NaN,
-- x2 after 2000 clean steps), unscaling, net.grad_scale in the backward of every loss kind, and
-- rl.train with real overflows in float32 (a scale of 2^127 makes the first gradients Inf): the
-- skipped updates are logged and change nothing, the scale is in the checkpoint and a resume
-- continues it, and a scale that never overflows trains as no scaling does.
local H = dofile("tests/lua/harness.lua")
local gs = require("rnnlua.grad_scaler")

H.test("defaults are PyTorch GradScaler's", function()
  local o = gs.options("g", true)
  H.check(o.init_scale == 65536 and o.growth_factor == 2 and o.backoff_factor == 0.5
    and o.growth_interval == 2000)
end)

H.test("overflow halves and restarts the count; growth_interval clean steps double", function()
  local s = gs.new(gs.options("g", true))
  for _ = 1, 1999 do H.check(s:update(false) == nil) end
  H.check(s.scale == 65536 and s.good == 1999)
  H.check(s:update(true) == "backoff" and s.scale == 32768 and s.good == 0)
  for _ = 1, 1999 do s:update(false) end
  H.check(s.scale == 32768)
  H.check(s:update(false) == "grow" and s.scale == 65536 and s.good == 0)
  -- a pattern with a short interval
  local t = gs.new(gs.options("g", {init_scale = 8, growth_interval = 3}))
  local seq = {false, true, true, false, false, false, false, true}
  local want = {8, 4, 2, 2, 2, 4, 4, 2}
  for i, inf in ipairs(seq) do
    t:update(inf)
    H.check(t.scale == want[i], string.format("step %d: scale %g, want %g", i, t.scale, want[i]))
  end
end)

H.test("the scale grows no further than 2^127 and an endless overflow is an error", function()
  local s = gs.new(gs.options("g", {init_scale = 2 ^ 127, growth_interval = 1}))
  H.check(s:update(false) == nil and s.scale == 2 ^ 127)
  local t = gs.new(gs.options("g", {init_scale = 2 ^ -23}))
  t:update(true)
  H.check(t.scale == 2 ^ -24)
  local ok, err = pcall(t.update, t, true)
  H.check(not ok and tostring(err):find("overflowed at every loss scale", 1, true), tostring(err))
end)

H.test("unscale: Inf or NaN is found and left alone, finite gradients are divided", function()
  local s = gs.new(gs.options("g", {init_scale = 4}))
  local g = rl.tensor({1, 2, math.huge})
  H.check(s:unscale(g) == true and g[3] == math.huge and g[1] == 1)
  local n = rl.tensor({1, 0 / 0, 3})
  H.check(s:unscale(n) == true)
  local f = rl.tensor({4, -8, 2})
  H.check(s:unscale(f) == false and f[1] == 1 and f[2] == -2 and f[3] == 0.5)
end)

H.test("state round trip and bad states name the key", function()
  local s = gs.new(gs.options("g", true))
  s:update(true)
  s:update(false)
  local t = gs.new(gs.options("g", true))
  H.check(t:load_state(s:state()) and t.scale == 32768 and t.good == 1)
  H.check(t:load_state({}) == false)
  local ok, err = pcall(t.load_state, t, {grad_scale = 0 / 0, grad_scale_good = 0})
  H.check(not ok and tostring(err):find("/engine grad_scale", 1, true), tostring(err))
  ok, err = pcall(t.load_state, t, {grad_scale = 2, grad_scale_good = 1.5})
  H.check(not ok and tostring(err):find("grad_scale_good", 1, true), tostring(err))
end)

for _, c in ipairs{
  {{init_scale = 0}, "config.grad_scaler.init_scale must be in"},
  {{growth_factor = 1}, "growth_factor must be > 1"},
  {{backoff_factor = 1}, "backoff_factor must be in (0, 1)"},
  {{growth_interval = 2.5}, "growth_interval must be an integer >= 1"},
  {{grow = 2}, "unknown option 'grow'"},
  {"yes", "must be true, false or a table"},
} do
  H.expect_error("grad_scaler " .. c[2], function() gs.options("config.grad_scaler", c[1]) end,
    c[2])
end

---------------------------------------------------------------------------- the backward

local ext = {data = {dim = 4}, classes = {dim = 3, sparse = true}, target = {dim = 2}}
local NETS = {
  ce = {fw = {class = "lstm", n_out = 5, from = "data"},
        l = {class = "linear", n_out = 4, activation = "tanh", from = "fw"},
        output = {class = "softmax", from = "l", loss = "ce", target = "classes"}},
  ce_scaled = {fw = {class = "gru", n_out = 5, from = "data"},
        output = {class = "softmax", from = "fw", loss = "ce", target = "classes",
                  loss_scale = 0.3}},
  mse = {fw = {class = "lstm", n_out = 5, from = "data"},
         output = {class = "linear", n_out = 2, from = "fw", loss = "mse", target = "target"},
         aux = {class = "softmax", from = "fw", loss = "ce", target = "classes"}},
}
rl.manual_seed(5)
local batch = {data = rl.randn(6, 3, 4), classes = (rl.rand(6, 3) * 3):floor():int(),
  target = rl.randn(6, 3, 2), lengths = rl.tensor({6, 4, 2}, "int32")}

local function grads(desc, scale)
  rl.manual_seed(3)
  local net = rl.network(desc, ext, {input_grads = true})
  net:zero_grads()
  net.grad_scale = scale
  local loss = net:forward(batch)
  net:backward()
  return loss, net:grads():clone(), net:input_grad("data"):clone()
end

for name, desc in pairs(NETS) do
  H.test("net.grad_scale multiplies every gradient (" .. name .. ")", function()
    local l1, g1, x1 = grads(desc, 1)
    local l2, g2, x2 = grads(desc, 1024)
    H.check(l1 == l2, "the loss is unscaled")
    local d = (g2 / 1024 - g1):abs():max() / g1:abs():max()
    H.check(d <= 1e-6, string.format("parameter gradients: relative %.3g", d))
    d = (x2 / 1024 - x1):abs():max() / x1:abs():max()
    H.check(d <= 1e-6, string.format("input gradients: relative %.3g", d))
  end)
end

for _, bad in ipairs{0, -1, 0 / 0, math.huge, "2"} do
  H.expect_error("net.grad_scale = " .. tostring(bad) .. " is refused by net:backward", function()
    local net = rl.network(NETS.ce, ext)
    net:forward(batch)
    net.grad_scale = bad
    net:backward()
  end, "net:backward: net.grad_scale must be a finite number > 0, got " .. tostring(bad))
end

---------------------------------------------------------------------------- rl.train

local root = H.tmpdir()
local NET = {
  fw = {class = "lstm", n_out = 6},
  output = {class = "softmax", from = "fw", loss = "ce", target = "classes"},
}
local function config(extra)
  local c = {
    network = NET,
    train = {class = "12ax", num_seqs = 12, seed = 1, min_len = 5, max_len = 12},
    num_epochs = 2, batch_size = 100000, max_seqs = 4, optimizer = {class = "adam"},
    learning_rate = 0.02, log_verbosity = 0, seed = 3,
  }
  for k, v in pairs(extra or {}) do c[k] = v end
  return c
end

H.test("a scale that never overflows trains as no scaling does", function()
  local a = rl.train(config())
  local b = rl.train(config{grad_scaler = {init_scale = 2 ^ 10}})
  local d = (a.net:params() - b.net:params()):abs():max() / a.net:params():abs():max()
  H.check(d <= 1e-5, string.format("parameters differ by relative %.3g", d))
end)

H.test("overflows skip updates (logged, parameters untouched), the scale is resumed", function()
  local log = root .. "/train.log"
  local model = root .. "/m"
  -- 2^127 times a gradient above 2 is Inf in float32: the first updates overflow
  local r = rl.train(config{grad_scaler = {init_scale = 2 ^ 127, growth_interval = 4},
    model = model, log_file = log, log_verbosity = 2, num_epochs = 1})
  local text = H.read_file(log)
  local _, skips = text:gsub("update skipped %(gradients not finite at loss scale", "")
  H.check(skips >= 1, "no skipped update logged:\n" .. text)
  H.check(r.history[1].skipped == skips,
    string.format("%d skips counted, %d logged", r.history[1].skipped, skips))
  local ck = rl.load_checkpoint(model .. ".001.h5")
  local st = ck.engine_state
  H.check(st.grad_scale < 2 ^ 127 and math.type(st.grad_scale_good) == "integer",
    "checkpoint scale " .. tostring(st.grad_scale))
  -- the optimizer saw only the clean updates
  H.check(ck.optimizer_state.num_steps == 3 - skips,
    string.format("optimizer steps %s with %d of 3 updates skipped",
      tostring(ck.optimizer_state.num_steps), skips))
  local log2 = root .. "/resume.log"
  local r2 = rl.train(config{grad_scaler = {init_scale = 2 ^ 127, growth_interval = 4},
    model = model, load = "last", num_epochs = 2, log_file = log2, log_verbosity = 2})
  -- from the checkpoint's scale, not init_scale again: fewer overflows, the first at that scale
  local text2 = H.read_file(log2)
  local _, skips2 = text2:gsub("update skipped %(gradients not finite", "")
  H.check(skips2 < skips, string.format("%d overflows after the resume, %d before", skips2, skips))
  local first = text2:match("at loss scale (%S+);")
  H.check(first == nil or first == string.format("%g", st.grad_scale),
    string.format("the resumed run overflowed at scale %s, the checkpoint holds %g",
      tostring(first), st.grad_scale))
  H.check(rl.load_checkpoint(model .. ".002.h5").engine_state.grad_scale <= st.grad_scale)
end)

H.expect_error("fp16 on the CPU names the option", function()
  rl.train(config{precision = "fp16"})
end, 'config.precision: precision "fp16" needs a CUDA device')
H.expect_error("grad_scaler with distributed training is refused", function()
  rl.train(config{grad_scaler = true, distributed = {mode = "sync"}})
end, "grad_scaler does not work with distributed training")
H.expect_error("a bad grad_scaler option names it", function()
  rl.train(config{grad_scaler = {growth_interval = 0}})
end, "config.grad_scaler.growth_interval must be an integer >= 1")

H.rm_rf(root)
H.done()
