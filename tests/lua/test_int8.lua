-- precision = "int8" (inference): the products of linear, softmax, lstm and gru layers with int8
-- weights (one scale per output unit) and activations quantized per row at each product, int32
-- sums (kernels/cpu/gemm_int8.h), everything else float32.
--
-- Tolerances. Quantizing moves each operand by at most half a step, 1/254 of its row's (column's)
-- largest magnitude, so a product moves by at most 1/254 of amax_a sum|b| + amax_b sum|a|; through
-- tanh/sigmoid (which do not amplify errors) and an LSTM's gates (below 1) a layer's output then
-- moves by a few such steps of its largest entry. Checked: the layer's output within 8/254
-- (about 2^-5) of its largest value against float32, and the softmax output (probabilities)
-- within 2^-5 absolute. That int8 really ran: the difference is above 2^-12 (float32 runs
-- agree to 1e-6). The trained 12AX model's served answers: probabilities within 2^-5, the same
-- class at nearly every frame.
local H = dofile("tests/lua/harness.lua")
local STEP = 8 / 254

local have = {}
for _, c in ipairs(rl.layers.classes()) do have[c] = true end

local ext = {data = {dim = 9}, classes = {dim = 5, sparse = true}}
local T, B = 20, 6
rl.manual_seed(11)
local x = rl.randn(T, B, 9)
local y = (rl.rand(T, B) * 5):floor():int()
local len = rl.tensor({20, 17, 20, 5, 11, 20}, "int32")

local function run(desc, precision)
  rl.manual_seed(7)
  local net = rl.network(desc, ext, {precision = precision})
  -- twice: the second forward takes the kept packs of every weight
  for _ = 1, 2 do net:forward{data = x, classes = y, lengths = len} end
  return net
end

local function max_rel(a, b)
  return (a:double() - b:double()):abs():max() / b:double():abs():max()
end

---------------------------------------------------------------------------- bad input

local DEEP = {
  l1 = {class = "linear", n_out = 24, activation = "tanh", from = "data"},
  fw = {class = "lstm", n_out = 32, from = "l1"},
  bw = {class = "lstm", n_out = 32, from = "l1", direction = -1},
  g = {class = "gru", n_out = 16, from = {"fw", "bw"}},
  output = {class = "softmax", from = "g", loss = "ce", target = "classes"},
}

H.expect_error("rl.train refuses int8 naming the option", function()
  rl.train{network = DEEP, train = {class = "12ax", num_seqs = 4, seed = 1}, precision = "int8",
           log_verbosity = 0}
end, 'config.precision: precision "int8" is for inference only')
H.expect_error("net:backward refuses int8", function()
  local net = rl.network(DEEP, ext, {precision = "int8"})
  net:forward{data = x, classes = y, lengths = len}
  net:backward()
end, 'net:backward: precision "int8" is for inference only')
H.expect_error("int8 needs float32 weights", function()
  rl.network(DEEP, ext, {precision = "int8", dtype = "float64"})
end, 'precision "int8" needs dtype float32')
H.expect_error("unknown precisions stay errors", function()
  rl.network(DEEP, ext, {precision = "int4"})
end, 'precision must be "fp32", "bf16", "int8" or "fp16", got "int4"')

---------------------------------------------------------------------------- accuracy

for _, cls in ipairs({"linear", "lstm", "gru"}) do
  if not have[cls] then
    print(string.format("SKIP %s in int8: class not registered", cls))
    goto continue
  end
  H.test(cls .. " in int8: output within 8 half-steps of float32's", function()
    local desc = {
      h = {class = cls, n_out = 64, from = "data"},
      output = {class = "softmax", from = "h", loss = "ce", target = "classes"},
    }
    local n32, n8 = run(desc, "fp32"), run(desc, "int8")
    local e = max_rel(n8:layer("h").output, n32:layer("h").output)
    local so = (n8:layer("output").output:double() - n32:layer("output").output:double()):abs()
      :max()
    print(string.format("  %s: output difference %.3g of its largest value, softmax %.3g "
      .. "(tolerance %.3g)", cls, e, so, STEP))
    H.check(e <= STEP, "int8 output difference " .. e)
    H.check(so <= STEP, "softmax output difference " .. so)
    H.check(e > 2 ^ -12, "int8 did not run: difference " .. e)
  end)
  ::continue::
end

H.test("a deep network in int8: loss near float32's, float32 unchanged afterwards", function()
  local n32 = rl.network(DEEP, ext)
  local l32 = n32:forward{data = x, classes = y, lengths = len}
  n32:set_precision("int8")
  local l8 = n32:forward{data = x, classes = y, lengths = len}
  local l8b = n32:forward{data = x, classes = y, lengths = len}
  n32:set_precision("bf16") -- a context of the other kind
  local lb = n32:forward{data = x, classes = y, lengths = len}
  n32:set_precision("fp32")
  local again = n32:forward{data = x, classes = y, lengths = len}
  print(string.format("  loss float32 %.6f, int8 %.6f (kept packs %.6f), bf16 %.6f", l32, l8,
    l8b, lb))
  H.check(math.abs(l8 - l32) <= STEP * math.abs(l32), "int8 loss " .. l8)
  H.check(l8 == l8b, "the kept packs give the per-call quantization's result")
  H.check(l8 ~= l32 and l8 ~= lb, "int8 did not run")
  H.check(again == l32, "float32 after int8 and bf16 runs")
end)

H.test("a layer without an int8 path runs float32 and says so once", function()
  local script = [[
    rl.layers.register("t_scale", {
      init = function(self, opts, in_dims) return in_dims[1] end,
      params = function(self) return {{name = "a", shape = {self.in_dims[1]}, init = "ones"}} end,
      forward = function(self, inputs) return inputs[1] * self.params.a end,
      backward = function(self, g, inputs) return {g * self.params.a} end,
    })
    local net = rl.network({s = {class = "t_scale"},
      output = {class = "softmax", from = "s", loss = "ce", target = "classes"}},
      {data = {dim = 3}, classes = {dim = 2, sparse = true}}, {precision = "int8"})
    for _ = 1, 3 do
      net:forward{data = rl.randn(4, 2, 3), classes = rl.zeros(4, 2):int(),
                  lengths = rl.tensor({4, 3}, "int32")}
    end
    print("done")
  ]]
  local p = io.popen(string.format("%s -e %q 2>&1", arg[-1], script))
  local out = p:read("a")
  p:close()
  local _, n = out:gsub("layer 's' %(class t_scale%) has no int8 path: its products run in "
    .. "float32 %(precision \"int8\"%)", "")
  H.check(n == 1, "expected the note once, got:\n" .. out)
  H.check(out:find("done"), "the run did not finish:\n" .. out)
end)

---------------------------------------------------------------------------- a trained model

local dir = H.tmpdir()
local trained

H.test("12AX trains in float32", function()
  trained = rl.train{
    network = {
      fw = {class = "lstm", n_out = 32},
      bw = {class = "lstm", n_out = 32, direction = -1},
      output = {class = "softmax", from = {"fw", "bw"}, loss = "ce", target = "classes"},
    },
    train = {class = "12ax", num_seqs = 1000, seed = 1, seq_ordering = "laplace:20"},
    dev = {class = "12ax", num_seqs = 100, seed = 2}, num_epochs = 10, batch_size = 2500,
    max_seqs = 25, optimizer = {class = "adam", gradient_clip_global_norm = 5},
    learning_rate = 0.01, log_verbosity = 0, seed = 1, model = dir .. "/net",
  }
  H.check(trained.checkpoint, "no checkpoint")
end)

-- rnnlua serve's model (rl.forward's computation) in int8 against float32
H.test("served answers in int8 against float32", function()
  H.check(trained and trained.checkpoint, "the 12AX run left no checkpoint")
  local serve = require("rnnlua.serve")
  local m32 = serve.load(trained.checkpoint, "output", nil, nil, "fp32")
  local m8 = serve.load(trained.checkpoint, "output", nil, nil, "int8")
  local ds = rl.dataset{class = "12ax", num_seqs = 20, seed = 5}
  ds:init_epoch(1)
  local worst, differ, frames = 0, 0, 0
  for i = 1, ds:num_seqs() do
    local xi = ds:get_seq(i).data
    local xs = rl.zeros(xi:size(1), 1, xi:size(2))
    xs:select(2, 1):copy_(xi)
    local geom = rl.tensor({xi:size(1)}, "int32")
    local o32, o8 = m32:forward(xs, geom), m8:forward(xs, geom)
    worst = math.max(worst, ((o32 - o8):abs():max()))
    local t32, t8 = o32:totable(), o8:totable()
    for t = 1, xi:size(1) do
      local p32, p8 = t32[t][1], t8[t][1]
      if (p32[1] > p32[2]) ~= (p8[1] > p8[2]) then differ = differ + 1 end
      frames = frames + 1
    end
  end
  print(string.format("  served int8 vs float32: largest probability difference %.3g, argmax "
    .. "differs at %d of %d frames", worst, differ, frames))
  H.check(worst <= STEP, "probability difference " .. worst)
  H.check(worst > 0, "int8 did not run")
  H.check(differ <= frames // 100, "argmax differs at " .. differ .. " frames")
end)

H.test("rl.forward{precision = \"int8\"} writes int8 outputs near float32's", function()
  H.check(trained and trained.checkpoint, "the 12AX run left no checkpoint")
  local outs = {}
  for _, p in ipairs({"fp32", "int8"}) do
    local out = dir .. "/fwd_" .. p .. ".h5"
    rl.forward{model = trained.checkpoint, data = {class = "12ax", num_seqs = 5, seed = 9},
               layer = "output", output_file = out, log_verbosity = 0, precision = p}
    local ds = rl.dataset{class = "hdf", files = {out}}
    ds:init_epoch(1)
    outs[p] = ds
  end
  local worst = 0
  for i = 1, outs.fp32:num_seqs() do
    local a, b = outs.fp32:get_seq(i).data, outs.int8:get_seq(i).data
    worst = math.max(worst, ((a:double() - b:double()):abs():max()))
  end
  print(string.format("  rl.forward int8 vs float32: largest difference %.3g", worst))
  H.check(worst > 0 and worst <= STEP, "difference " .. worst)
end)

H.rm_rf(dir)
H.done()
