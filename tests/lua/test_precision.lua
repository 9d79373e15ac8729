-- precision = "bf16": the products of linear, softmax, lstm and gru layers with bf16 operands and
-- float32 sums (kernels/cpu/gemm_bf16.h), everything else float32.
--
-- Tolerances, from bf16's unit roundoff u = 2^-8: rounding both operands of a product moves it
-- by at most 2u of the sum of magnitudes of its terms; a layer's output (the tanh/sigmoid of
-- such sums, which do not amplify errors) then moves by a few u of its largest entry, and an
-- LSTM's 20 steps feed the error of each step into the next through gates below 1. Outputs are
-- checked at 4u (2^-6) of their largest value, the loss at u, gradients norm-wise at 8u (2^-5).
-- That bf16 really ran is checked too: its error must be far above float32's (16x, and above
-- 2^-14).
local H = dofile("tests/lua/harness.lua")
local U = 2 ^ -8

local have = {}
for _, c in ipairs(rl.layers.classes()) do have[c] = true end

local ext = {data = {dim = 9}, classes = {dim = 5, sparse = true}}
local T, B = 20, 6
rl.manual_seed(11)
local x = rl.randn(T, B, 9)
local y = (rl.rand(T, B) * 5):floor():int()
local len = rl.tensor({20, 17, 20, 5, 11, 20}, "int32")

-- as text too, for a run in another process
local DEEP_SRC = [[{
  l1 = {class = "linear", n_out = 24, activation = "tanh", from = "data"},
  fw = {class = "lstm", n_out = 32, from = "l1"},
  bw = {class = "lstm", n_out = 32, from = "l1", direction = -1},
  g = {class = "gru", n_out = 16, from = {"fw", "bw"}},
  output = {class = "softmax", from = "g", loss = "ce", target = "classes"},
}]]
local DEEP = load("return " .. DEEP_SRC)()

-- loss, gradients (float64) and the network after one forward and backward
local function run(desc, precision, dtype)
  rl.manual_seed(7)
  local net = rl.network(desc, ext, {precision = precision, dtype = dtype})
  local xx = dtype == "float64" and x:double() or x
  net:zero_grads()
  local loss = net:forward{data = xx, classes = y, lengths = len}
  net:backward()
  return loss, net:grads():double(), net
end

local function max_rel(a, b)
  return (a:double() - b:double()):abs():max() / b:double():abs():max()
end

---------------------------------------------------------------------------- bad input

H.expect_error("an unknown precision names the option", function()
  rl.network(DEEP, ext, {precision = "fp8"})
end, 'precision must be "fp32", "bf16", "int8" or "fp16", got "fp8"')
H.expect_error("fp16 on the CPU is an error naming it", function()
  rl.network(DEEP, ext, {precision = "fp16"})
end, 'precision "fp16" needs a CUDA')
H.expect_error("fp16 on a CPU network says how to get it on a CUDA device", function()
  rl.network(DEEP, ext):set_precision("fp16")
end, 'net:set_precision: precision "fp16" needs a CUDA device (its products run on tensor '
  .. 'cores; the network is on cpu): move the network first (net:to("cuda"), then '
  .. 'net:set_precision("fp16")), or use "bf16" on the CPU')
H.expect_error("fp16 needs float32 master weights too", function()
  rl.network(DEEP, ext, {dtype = "float64"}):set_precision("fp16")
end, 'precision "fp16" needs dtype float32')
H.expect_error("bf16 needs float32 master weights", function()
  rl.network(DEEP, ext, {precision = "bf16", dtype = "float64"})
end, 'precision "bf16" needs dtype float32')
H.expect_error("net:set_precision checks its argument", function()
  rl.network(DEEP, ext):set_precision(16)
end, "net:set_precision: precision must be")
H.expect_error("rl.train checks precision before it starts", function()
  rl.train{network = DEEP, train = {class = "12ax", num_seqs = 4, seed = 1}, precision = "fp8",
           log_verbosity = 0}
end, "config.precision: precision must be")
H.expect_error("rl.forward checks precision", function()
  rl.forward{model = "none.h5", data = {class = "12ax", num_seqs = 4, seed = 1},
             output_file = "none_out.h5", precision = "fp16"}
end, 'rl.forward: precision "fp16" needs a CUDA device (its products run on tensor cores; the '
  .. 'network is on cpu): set device = "cuda", or use "bf16" on the CPU')

---------------------------------------------------------------------------- accuracy

-- each class alone (with a softmax on top): its output against float64
for _, cls in ipairs({"linear", "lstm", "gru"}) do
  if not have[cls] then
    print(string.format("SKIP %s in bf16: class not registered", cls))
    goto continue
  end
  H.test(cls .. " in bf16: output within 4u of float64, far from float32's error", function()
    local desc = {
      x = {class = cls, n_out = 40, from = "data"},
      output = {class = "softmax", from = "x", loss = "ce", target = "classes"},
    }
    local _, _, n64 = run(desc, "fp32", "float64")
    local _, _, n32 = run(desc, "fp32")
    local _, _, nb = run(desc, "bf16")
    local ref = n64:layer("x").output
    local e32, eb = max_rel(n32:layer("x").output, ref), max_rel(nb:layer("x").output, ref)
    print(string.format("  %s: output error float32 %.3g, bf16 %.3g (tolerance %.3g)", cls, e32,
      eb, 4 * U))
    H.check(eb <= 4 * U, "bf16 output error " .. eb)
    H.check(eb > 16 * e32 and eb > 2 ^ -14, "bf16 did not run: error " .. eb)
    local so = max_rel(nb:layer("output").output, n64:layer("output").output)
    H.check(so <= 4 * U, "softmax output error " .. so)
  end)
  ::continue::
end

H.test("a deep network's loss and gradients in bf16 against float64", function()
  local l64, g64 = run(DEEP, "fp32", "float64")
  local l32, g32 = run(DEEP, "fp32")
  local lb, gb = run(DEEP, "bf16")
  local el, eg = math.abs(lb - l64) / math.abs(l64), (gb - g64):norm() / g64:norm()
  local eg32 = (g32 - g64):norm() / g64:norm()
  print(string.format("  loss error %.3g, gradient error %.3g (float32: %.3g)", el, eg, eg32))
  H.check(el <= U, "loss error " .. el)
  H.check(eg <= 8 * U, "gradient error " .. eg)
  H.check(eg > 16 * eg32, "bf16 did not run in the gradients")
end)

H.test("float32 results are unchanged bit for bit by bf16 runs and set_precision", function()
  local l1, g1 = run(DEEP, "fp32")
  run(DEEP, "bf16")
  local _, _, net = run(DEEP, "bf16")
  net:set_precision("fp32")
  net:zero_grads()
  local l2 = net:forward{data = x, classes = y, lengths = len}
  net:backward()
  H.check(l1 == l2, "loss " .. l1 .. " vs " .. l2)
  H.check((g1 - net:grads():double()):abs():max() == 0, "gradients differ")
end)

-- The precision is the network's: its bf16 context is active on its thread only while it runs
-- (kernels/cpu/gemm_bf16.h), so networks of both precisions can take turns in one process.
local function flat(t)
  local out = {}
  for i, v in ipairs(t:double():view(-1):totable()) do out[i] = string.format("%a", v) end
  return table.concat(out, " ")
end

-- the float32 DEEP network's loss and gradients in a process that never ran bf16
local function fp32_elsewhere()
  local script = string.format([[
    local ext = {data = {dim = 9}, classes = {dim = 5, sparse = true}}
    rl.manual_seed(11)
    local x = rl.randn(%d, %d, 9)
    local y = (rl.rand(%d, %d) * 5):floor():int()
    local len = rl.tensor({20, 17, 20, 5, 11, 20}, "int32")
    rl.manual_seed(7)
    local net = rl.network(%s, ext)
    net:zero_grads()
    local loss = net:forward{data = x, classes = y, lengths = len}
    net:backward()
    local out = {}
    for i, v in ipairs(net:grads():double():view(-1):totable()) do
      out[i] = string.format("%%a", v)
    end
    io.write(string.format("%%a\n", loss), table.concat(out, " "), "\n")
  ]], T, B, T, B, DEEP_SRC)
  local p = io.popen(string.format("%s -e %q", arg[-1], script))
  local loss, grads = p:read("l"), p:read("l")
  p:close()
  return loss, grads
end

H.test("a bf16 and a float32 network interleaved: each gives what it gives alone", function()
  local la, ga = run(DEEP, "bf16")
  local lf, gf = run(DEEP, "fp32")
  local el, eg = fp32_elsewhere()
  H.check(el == string.format("%a", lf) and eg == flat(gf),
    "float32 here differs from a process that never ran bf16")
  rl.manual_seed(7)
  local a = rl.network(DEEP, ext, {precision = "bf16"})
  rl.manual_seed(7)
  local f = rl.network(DEEP, ext)
  local b = rl.network(DEEP, ext, {precision = "bf16"}) -- a second bf16 network, other weights
  for round = 1, 2 do
    a:zero_grads(); f:zero_grads(); b:zero_grads()
    local l1 = a:forward{data = x, classes = y, lengths = len}
    local l2 = f:forward{data = x, classes = y, lengths = len}
    b:forward{data = x, classes = y, lengths = len}
    f:backward()
    b:backward()
    a:backward()
    H.check(l1 == la and flat(a:grads()) == flat(ga), "bf16 network, round " .. round)
    H.check(l2 == lf and flat(f:grads()) == flat(gf), "float32 network, round " .. round)
  end
end)

H.test("bf16 gives the same bits on 1, 2 and 3 threads (the pair's helper runs in bf16)",
  function()
  local threads0 = rl.get_num_threads()
  local ok, err = pcall(H.same_on_threads, function(n)
    rl.set_num_threads(n)
    local loss, g = run(DEEP, "bf16")
    return {loss = {loss}, grads = g:view(-1):totable()}
  end)
  rl.set_num_threads(threads0)
  H.check(ok, tostring(err))
end)

-- One forward and backward of desc in bf16 gives the same loss and gradients on 1, 2 and 3
-- threads.
local function same_bits_on_threads(desc, extern, batch)
  local threads0 = rl.get_num_threads()
  local ok, err = pcall(H.same_on_threads, function(n)
    rl.set_num_threads(n)
    rl.manual_seed(7)
    local net = rl.network(desc, extern, {precision = "bf16"})
    net:zero_grads()
    local loss = net:forward(batch)
    net:backward()
    return {loss = {loss}, grads = net:grads():double():view(-1):totable()}
  end)
  rl.set_num_threads(threads0)
  H.check(ok, tostring(err))
end

-- With 16 rows, 2 threads cut the batch into two parts of 8 that each run every step of a
-- recurrent pass on their own thread (layers/recurrent.c), where 1 thread runs them whole: the
-- bf16 products sum a row alike either way, so the bits are the same.
H.test("bf16 recurrences cut into row parts give the bits of the whole batch", function()
  same_bits_on_threads({
    l = {class = "lstm", n_out = 32, from = "data"},
    g = {class = "gru", n_out = 16, from = "l"},
    output = {class = "softmax", from = "g", loss = "ce", target = "classes"},
  }, ext, {data = rl.randn(9, 16, 9), classes = (rl.rand(9, 16) * 5):floor():int(),
           lengths = rl.tensor({9, 9, 3, 9, 7, 9, 1, 9, 9, 8, 9, 2, 9, 9, 5, 9}, "int32")})
end)

-- A cross-entropy softmax in bf16 writes its logits' gradient rounded, once, for both of its
-- products (layers/softmax.c); with 3000 classes those products are shared between threads
-- by columns and by rows, and the bias gradient's sums by blocks of rows.
H.test("a wide bf16 softmax gives the same bits on 1, 2 and 3 threads", function()
  same_bits_on_threads({
    l = {class = "linear", n_out = 40, activation = "tanh", from = "data"},
    output = {class = "softmax", n_out = 3000, from = "l", loss = "ce", target = "classes"},
  }, {data = {dim = 9}, classes = {dim = 3000, sparse = true}},
  {data = rl.randn(12, 10, 9), classes = (rl.rand(12, 10) * 3000):floor():int(),
   lengths = rl.tensor({12, 12, 3, 12, 7, 12, 1, 12, 12, 8}, "int32")})
end)

H.test("the bf16 copies of the weights follow every change of the parameters", function()
  local _, _, a = run(DEEP, "bf16")
  a:params():mul_(0.75) -- as an update does, between two forwards
  local la = a:forward{data = x, classes = y, lengths = len}
  local _, _, b = run(DEEP, "bf16")
  b:params():copy_(a:params())
  local lb = b:forward{data = x, classes = y, lengths = len}
  H.check(la == lb, string.format("after a change %.17g, fresh %.17g", la, lb))
end)

H.test("the bf16 copies are made once per update and layout, once for inference", function()
  rl.manual_seed(7)
  local net = rl.network(DEEP, ext, {precision = "bf16"})
  local view = net:param_list()[1].value -- held from before the passes below
  local opt = rl.optimizer({class = "adam"}, net:params(), net:grads())
  local function packs() return rl._bf16_packs(net.bf16_ctx) end
  local function step()
    net:zero_grads()
    net:forward{data = x, classes = y, lengths = len}
    net:backward()
    opt:step(1e-3)
  end
  step()
  local p1 = packs()
  step()
  local per_step = packs() - p1
  step()
  -- one pack of each weight operand in each of its two layouts (forward, backward): at most 11
  -- per layout (the linear's; each LSTM's input and recurrent one; the GRU's two input blocks
  -- and two recurrent products; the softmax's), whatever the T = 20 steps of the recurrences
  H.check(per_step >= 10 and per_step <= 2 * 11, "packs per training step: " .. per_step)
  H.check(packs() - p1 == 2 * per_step, "packs per step vary: " .. per_step .. ", "
    .. (packs() - p1 - per_step))
  local function eval() return net:forward({data = x, classes = y, lengths = len}, {train = false}) end
  local l1 = eval()
  eval()
  local p2 = packs()
  for _ = 1, 3 do H.check(eval() == l1, "the same weights give the same loss") end
  H.check(packs() == p2, "inference repacked unchanged weights: " .. (packs() - p2))
  -- every way of changing them from Lua repacks: a held view, an optimizer step
  view:mul_(0.5)
  local l2 = eval()
  H.check(packs() > p2 and l2 ~= l1, "a write through a held view was not seen")
  rl.manual_seed(7)
  local fresh = rl.network(DEEP, ext, {precision = "bf16"})
  fresh:params():copy_(net:params())
  H.check(fresh:forward({data = x, classes = y, lengths = len}, {train = false}) == l2,
    "the repacked weights differ from a fresh network's")
  local p3 = packs()
  step()
  H.check(packs() > p3 and eval() ~= l2, "an optimizer step was not seen")
end)

H.test("a layer without a bf16 path runs in float32 and says so once", function()
  local script = [[
    rl.layers.register("t_scale", {
      init = function(self, opts, in_dims) return in_dims[1] end,
      params = function(self) return {{name = "a", shape = {self.in_dims[1]}, init = "ones"}} end,
      forward = function(self, inputs) return inputs[1] * self.params.a end,
      backward = function(self, g, inputs)
        self.grads.a:add_((g * inputs[1]):sum(1):sum(1)); return {g * self.params.a} end,
    })
    local net = rl.network({s = {class = "t_scale"},
      output = {class = "softmax", from = "s", loss = "ce", target = "classes"}},
      {data = {dim = 3}, classes = {dim = 2, sparse = true}}, {precision = "bf16"})
    for _ = 1, 3 do
      net:forward{data = rl.randn(4, 2, 3), classes = rl.zeros(4, 2):int(),
                  lengths = rl.tensor({4, 3}, "int32")}
      net:backward()
    end
    print("done")
  ]]
  local p = io.popen(string.format("%s -e %q 2>&1", arg[-1], script))
  local out = p:read("a")
  p:close()
  local _, n = out:gsub("layer 's' %(class t_scale%) has no bf16 path", "")
  H.check(n == 1, "expected the note once, got:\n" .. out)
  H.check(out:find("done"), "the run did not finish:\n" .. out)
end)

---------------------------------------------------------------------------- training

local dir = H.tmpdir()
local trained -- the 12AX run's result

H.test("12AX trains to 0% dev frame error in bf16", function()
  local t0 = rl.clock()
  local r = rl.train{
    network = {
      fw = {class = "lstm", n_out = 32},
      bw = {class = "lstm", n_out = 32, direction = -1},
      output = {class = "softmax", from = {"fw", "bw"}, loss = "ce", target = "classes"},
    },
    train = {class = "12ax", num_seqs = 1000, seed = 1, seq_ordering = "laplace:20"},
    dev = {class = "12ax", num_seqs = 100, seed = 2}, num_epochs = 10, batch_size = 2500,
    max_seqs = 25, optimizer = {class = "adam", gradient_clip_global_norm = 5},
    learning_rate = 0.01, log_verbosity = 0, seed = 1, precision = "bf16",
    model = dir .. "/net",
  }
  trained = r
  print(string.format("  12AX bf16: dev frame error %.3f%% after %d epochs, %.1f s",
    100 * r.dev_error, r.epoch, rl.clock() - t0))
  H.check(r.dev_error == 0, "dev frame error " .. r.dev_error)
end)

-- The served answers (rnnlua serve's model, rl.forward's computation) of the bf16-trained
-- float32 checkpoint in bf16 against float32: the served layer's output within 4u of its largest
-- value, the same class at nearly every frame.
H.test("served answers in bf16 against float32", function()
  H.check(trained and trained.checkpoint, "the 12AX run left no checkpoint")
  local serve = require("rnnlua.serve")
  local m32 = serve.load(trained.checkpoint, "output", nil, nil, "fp32")
  local mb = serve.load(trained.checkpoint, "output", nil, nil, "bf16")
  local ds = rl.dataset{class = "12ax", num_seqs = 20, seed = 5}
  ds:init_epoch(1)
  local worst, scale, differ, frames = 0, 0, 0, 0
  for i = 1, ds:num_seqs() do
    local xi = ds:get_seq(i).data
    local x = rl.zeros(xi:size(1), 1, xi:size(2))
    x:select(2, 1):copy_(xi)
    local geom = rl.tensor({xi:size(1)}, "int32")
    local o32, ob = m32:forward(x, geom), mb:forward(x, geom)
    worst = math.max(worst, ((o32 - ob):abs():max()))
    scale = math.max(scale, (o32:abs():max()))
    local t32, tb = o32:totable(), ob:totable()
    for t = 1, xi:size(1) do
      local p32, pb = t32[t][1], tb[t][1]
      if (p32[1] > p32[2]) ~= (pb[1] > pb[2]) then differ = differ + 1 end
      frames = frames + 1
    end
  end
  print(string.format("  served bf16 vs float32: largest difference %.3g of largest |output| "
    .. "%.3g, argmax differs at %d of %d frames", worst, scale, differ, frames))
  H.check(worst <= 4 * U * scale, "output difference " .. worst)
  H.check(differ <= frames // 100, "argmax differs at " .. differ .. " frames")
end)

H.expect_error("serve refuses an unknown precision naming --precision", function()
  require("rnnlua.serve").load("none.h5", "output", nil, nil, "int4")
end, '--precision: precision must be "fp32", "bf16", "int8" or "fp16", got "int4"')

H.rm_rf(dir)
H.done()
