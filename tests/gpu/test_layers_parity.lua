-- CUDA-vs-CPU parity of networks: for every built-in layer class (lstm, gru and mdlstm included;
-- their kernels are also tested on their own by test_lstm_parity.c, test_gru_parity.c and
-- test_mdlstm_parity.c), a tiny network on ragged lengths is built twice from one seed, once left on the CPU and once moved
-- to cuda:0, and run on the same CPU batch (float32): every layer's output, the loss, the
-- error count, the flat parameter gradient and the input gradient must agree to a relative
-- 1e-5 (the largest difference over the largest magnitude of the CPU's tensor). Dropout draws
-- from the shared counter-based generator, so its masks agree too. The 2-D layers (conv2d,
-- pool2d, collapse, global_pool) are checked the same way on ragged image batches, and the
-- ctc softmax on label sequences of their own length.
-- Then whole rl.train runs (2 epochs, SGD, dropout, dev scoring, a checkpoint) on "cpu" and
-- "cuda" must end with close parameters (relative 1e-4), and the checkpoint written from the
-- GPU must load and run on both devices.
-- Without a CUDA device (or build) the "device" side is the CPU itself: every case runs and must
-- pass, so a broken test shows there too; the line printed says which side ran.
-- Run by `make test-gpu` through the rnnlua binary.
local H = dofile("tests/lua/harness.lua")

local lfs = require("lfs")
local GPU = rl.device_count() > 0
local DEV = GPU and "cuda:0" or "cpu" -- the side compared with the CPU
local KIND = GPU and "cuda" or "cpu"   -- what rl.train and net:to are given for it
if GPU then
  print("device side: cuda:0")
else
  print("no CUDA device: the harness runs with the CPU as the device side (nothing of the GPU " ..
        "is tested)")
end
local TOL = 1e-5
local T, B, F, C = 6, 3, 4, 5
local LENS = {6, 2, 4}

local function rel_diff(got, want)
  local g, w = got:cpu():double(), want:cpu():double()
  if g:numel() == 0 then return 0 end
  local diff = (g - w):abs():max()
  local scale = w:abs():max()
  return diff / math.max(scale, 1e-6)
end

local function close(got, want, what, tol)
  tol = tol or TOL
  H.check(got:size() == want:size(), string.format("%s: shape %s vs %s", what,
    tostring(got:size()), tostring(want:size())), 2)
  local r = rel_diff(got, want)
  if not (r <= tol) then
    error(string.format("%s: relative difference %.3g > %g", what, r, tol), 2)
  end
end

local function close_num(got, want, what, tol)
  tol = tol or TOL
  local r = math.abs(got - want) / math.max(math.abs(want), 1e-6)
  if not (r <= tol) then
    error(string.format("%s: %.9g vs %.9g (relative %.3g > %g)", what, got, want, r, tol), 2)
  end
end

local function seq_batch(ext)
  rl.manual_seed(101)
  local bt = {lengths = rl.tensor(LENS, "int32")}
  for key, e in pairs(ext) do
    if e.sparse then
      local y = {}
      for t = 1, T do
        y[t] = {}
        for b = 1, B do y[t][b] = (t * 7 + b * 3) % e.dim end
      end
      bt[key] = rl.tensor(y, "int32")
    else
      bt[key] = rl.randn(T, B, e.dim)
    end
  end
  return bt
end

-- The network built from `seed` on `device`, after one forward (train) and backward on bt.
local function run(desc, ext, bt, device, train)
  rl.manual_seed(7)
  local net = rl.network(desc, ext, {input_grads = true})
  if device ~= "cpu" then net:to(device) end
  rl.manual_seed(9) -- the draws of dropout
  net:zero_grads()
  local loss, err = net:forward(bt, {train = train ~= false})
  net:backward()
  return net, loss, err
end

local function parity(name, desc, ext, train, batch)
  H.test(name, function()
    local bt = batch and batch() or seq_batch(ext)
    local cpu, lc, ec = run(desc, ext, bt, "cpu", train)
    local gpu, lg, eg = run(desc, ext, bt, DEV, train)
    H.check(gpu.device == DEV and gpu:params():device() == DEV, "moved")
    for _, lname in ipairs(cpu.order) do
      local oc, og = cpu:layer(lname).output, gpu:layer(lname).output
      H.check(og:device() == DEV, lname .. " output is on " .. og:device())
      close(og, oc, "output of " .. lname)
    end
    close_num(lg, lc, "loss")
    H.check(eg == ec, string.format("errors %s vs %s", tostring(eg), tostring(ec)))
    H.check(gpu.n_frames == cpu.n_frames)
    close(gpu:grads(), cpu:grads(), "parameter gradients")
    for _, p in ipairs(cpu:param_list()) do
      local q
      for _, v in ipairs(gpu:param_list()) do
        if v.layer == p.layer and v.name == p.name then q = v end
      end
      close(q.grad, p.grad, string.format("gradient of %s/%s", p.layer, p.name))
      close(q.value, p.value, string.format("value of %s/%s", p.layer, p.name), 0)
    end
    for key in pairs(cpu.input_keys) do
      local want = cpu:input_grad(key) -- none for class indices
      if want then
        close(gpu:input_grad(key), want, "input gradient of " .. key)
      else
        H.check(gpu:input_grad(key) == nil, "no input gradient of " .. key .. " on the device")
      end
    end
  end)
end

local EXT = {data = {dim = F}, classes = {dim = C, sparse = true}}
local function ce_on(from, extra)
  local d = extra or {}
  d.output = {class = "softmax", from = from, loss = "ce", target = "classes"}
  return d
end

for _, act in ipairs({"identity", "tanh", "sigmoid", "relu", "elu", "softplus", "exp",
                      "square"}) do
  parity("linear " .. act, ce_on("h", {h = {class = "linear", n_out = 7, activation = act}}), EXT)
end
parity("linear without bias, two inputs", ce_on("h", {
  a = {class = "linear", n_out = 3, activation = "tanh"},
  h = {class = "linear", from = {"a", "data"}, n_out = 6, with_bias = false},
}), EXT)
parity("activation over two inputs", ce_on("act", {
  a = {class = "linear", n_out = 3},
  act = {class = "activation", from = {"a", "data"}, activation = "sigmoid"},
}), EXT)
parity("dropout (training: the same masks)", ce_on("drop", {
  h = {class = "linear", n_out = 8, activation = "relu"},
  drop = {class = "dropout", from = "h", dropout = 0.3},
}), EXT)
parity("dropout (evaluation)", ce_on("drop", {
  h = {class = "linear", n_out = 8, activation = "relu"},
  drop = {class = "dropout", from = "h", dropout = 0.3},
}), EXT, false)
for _, kind in ipairs({"add", "concat", "mul"}) do
  parity("combine " .. kind, ce_on("c", {
    a = {class = "linear", n_out = 4, activation = "tanh"},
    b = {class = "linear", n_out = 4, activation = "sigmoid"},
    c = {class = "combine", kind = kind, from = {"a", "b"}},
  }), EXT)
end
parity("copy of two inputs", ce_on("cp", {
  a = {class = "linear", n_out = 3, activation = "tanh"},
  cp = {class = "copy", from = {"a", "data"}},
}), EXT)
parity("window 3", ce_on("w", {
  a = {class = "linear", n_out = 3, activation = "tanh"},
  w = {class = "window", from = "a", window = 3},
}), EXT)
parity("window left 2, two inputs", ce_on("w", {
  a = {class = "linear", n_out = 2},
  w = {class = "window", from = {"a", "data"}, left = 2},
}), EXT)
parity("layer_norm (a Lua layer)", ce_on("n", {
  a = {class = "linear", n_out = 6},
  n = {class = "layer_norm", from = "a"},
}), EXT)
parity("softmax ce with loss_scale, feeding another loss", {
  a = {class = "linear", n_out = 4, activation = "tanh"},
  s = {class = "softmax", from = "a", n_out = C, loss = "ce", target = "classes", loss_scale = 0.5},
  output = {class = "softmax", from = {"s", "a"}, loss = "ce", target = "classes"},
}, EXT)
local EXT_MSE = {data = {dim = F}, target = {dim = 3}}
parity("linear with mse", {
  output = {class = "linear", n_out = 3, activation = "tanh", loss = "mse", target = "target"},
}, EXT_MSE)
parity("softmax with mse", {
  a = {class = "linear", n_out = 5, activation = "relu"},
  output = {class = "softmax", from = "a", n_out = 3, loss = "mse", target = "target"},
}, EXT_MSE)
local EXT_CTC = {data = {dim = F}, classes = {dim = C - 1, sparse = true}}
local function ctc_batch()
  rl.manual_seed(101)
  return {data = rl.randn(T, B, F), lengths = rl.tensor(LENS, "int32"),
          classes = rl.tensor({{0, 3, 1}, {2, 0, 1}, {2, 0, 0}}, "int32"), -- (S, B), repeats
          lengths_classes = rl.tensor({3, 1, 2}, "int32")}
end
parity("softmax with ctc (labels of their own length)", {
  a = {class = "linear", n_out = 6, activation = "tanh"},
  output = {class = "softmax", from = "a", loss = "ctc", target = "classes"},
}, EXT_CTC, true, ctc_batch)
parity("softmax with ctc, blank first, loss_scale", {
  a = {class = "linear", n_out = 6, activation = "tanh"},
  output = {class = "softmax", from = "a", loss = "ctc", target = "classes", blank_index = 0,
            loss_scale = 0.5},
}, EXT_CTC, true, ctc_batch)

-- The recurrent layers: a stacked and a bidirectional lstm (their layers on different streams
-- hand outputs and gradients on through events on a GPU), a gru pair, a janet pair, and an mdlstm
-- on images.
parity("lstm stacked, 2 levels", ce_on("l2", {
  l1 = {class = "lstm", n_out = 5},
  l2 = {class = "lstm", from = "l1", n_out = 4},
}), EXT)
parity("blstm: lstm both directions, peepholes on one, output reading both", ce_on({"fw", "bw"}, {
  fw = {class = "lstm", n_out = 4, peepholes = true},
  bw = {class = "lstm", n_out = 3, direction = -1},
}), EXT)
parity("gru both directions over two inputs", ce_on({"fw", "bw"}, {
  a = {class = "linear", n_out = 3, activation = "tanh"},
  fw = {class = "gru", n_out = 4, from = {"a", "data"}},
  bw = {class = "gru", n_out = 3, from = {"a", "data"}, direction = -1},
}), EXT)
-- n_proj (LSTMP): the projection inside the CUDA launchers, both directions, with peepholes on
-- one, stacked on a projected layer (its P-wide output the next layer's input)
parity("lstmp: n_proj both directions, peepholes on one, stacked", ce_on({"fw", "bw"}, {
  l1 = {class = "lstm", n_out = 6, n_proj = 3},
  fw = {class = "lstm", n_out = 5, n_proj = 2, from = "l1", peepholes = true},
  bw = {class = "lstm", n_out = 4, n_proj = 3, from = "l1", direction = -1},
}), EXT)
-- layer_norm: the row formulas of kernels/lstm_ln_row.h and kernels/gru_ln_row.h inside the
-- launchers (one thread per row), with the projection on one lstm
parity("lstm layer_norm both directions, n_proj on one", ce_on({"fw", "bw"}, {
  fw = {class = "lstm", n_out = 5, layer_norm = true, forget_bias = 1},
  bw = {class = "lstm", n_out = 4, n_proj = 3, layer_norm = true, direction = -1},
}), EXT)
parity("gru layer_norm both directions over two inputs", ce_on({"fw", "bw"}, {
  a = {class = "linear", n_out = 3, activation = "tanh"},
  fw = {class = "gru", n_out = 4, from = {"a", "data"}, layer_norm = true},
  bw = {class = "gru", n_out = 3, from = "data", direction = -1, layer_norm = true},
}), EXT)
parity("janet both directions, stacked, beta on one", ce_on({"fw", "bw"}, {
  fw = {class = "janet", n_out = 4},
  bw = {class = "janet", n_out = 3, from = "fw", direction = -1, beta = 0.5},
}), EXT)
-- The driver's options inside the launchers (layers/recurrent.h): zoneout in each cell's fused
-- step kernels, rec_dropout's masked operand and state gradient around the per-step products,
-- weight_dropout's masked U and dU. The masks come from the shared counter-based generator, so
-- both sides draw the same; in evaluation zoneout mixes with its expectation.
for _, train in ipairs({true, false}) do
  local mode = train and "training" or "evaluation"
  parity("lstm zoneout cell and hidden both directions, peepholes on one (" .. mode .. ")",
    ce_on({"fw", "bw"}, {
      fw = {class = "lstm", n_out = 5, zoneout = {cell = 0.3, hidden = 0.2}, peepholes = true},
      bw = {class = "lstm", n_out = 4, zoneout = {hidden = 0.4}, direction = -1},
    }), EXT, train)
  parity("gru zoneout and rec_dropout both directions, layer_norm on one (" .. mode .. ")",
    ce_on({"fw", "bw"}, {
      fw = {class = "gru", n_out = 4, zoneout = 0.3, rec_dropout = 0.25},
      bw = {class = "gru", n_out = 3, zoneout = 0.2, layer_norm = true, direction = -1},
    }), EXT, train)
  parity("janet zoneout, rec_dropout and weight_dropout both directions (" .. mode .. ")",
    ce_on({"fw", "bw"}, {
      fw = {class = "janet", n_out = 4, zoneout = 0.3, rec_dropout = 0.2, weight_dropout = 0.3},
      bw = {class = "janet", n_out = 3, zoneout = 0.2, direction = -1, weight_dropout = 0.4},
    }), EXT, train)
end
parity("lstm rec_dropout and weight_dropout: plain, n_proj, layer_norm, stacked", ce_on({"l2", "ln"}, {
  l1 = {class = "lstm", n_out = 5, rec_dropout = 0.3, weight_dropout = 0.25},
  l2 = {class = "lstm", n_out = 6, n_proj = 3, from = "l1", rec_dropout = 0.2, direction = -1},
  ln = {class = "lstm", n_out = 4, from = "l1", layer_norm = true, rec_dropout = 0.25,
        weight_dropout = 0.3},
}), EXT)
parity("gru weight_dropout and rec_dropout with layer_norm", ce_on("g", {
  g = {class = "gru", n_out = 4, layer_norm = true, rec_dropout = 0.3, weight_dropout = 0.25},
}), EXT)

-- embedding: the gather forward and the grouped, deterministic scatter-add backward on the
-- device (a class repeats within and across sequences; padded frames are never read)
local EXT_SPARSE = {data = {dim = 7, sparse = true}, classes = {dim = C, sparse = true}}
parity("embedding feeding an lstm and the output", ce_on({"e", "l"}, {
  e = {class = "embedding", n_out = 6},
  l = {class = "lstm", from = "e", n_out = 4},
}), EXT_SPARSE)

H.test("images: an any-rank layer on (H, W, B, F) runs folded on the device", function()
  local ext = {data = {dim = 3, spatial = 2}}
  local desc = {h = {class = "linear", n_out = 4, activation = "tanh", is_output_layer = true}}
  rl.manual_seed(3)
  local x = rl.randn(4, 5, 2, 3)
  local bt = {data = x, sizes = rl.tensor({{4, 5}, {2, 3}}, "int32")}
  local outs = {}
  for _, dev in ipairs({"cpu", DEV}) do
    rl.manual_seed(7)
    local net = rl.network(desc, ext)
    net:to(dev)
    net:forward(bt, {train = false})
    outs[dev] = net:layer("h").output
  end
  close(outs[DEV], outs.cpu, "folded linear on images")
end)

-- The 2-D layers on ragged images (4 x 6, 3 x 4, 5 x 2 in a (5, 6, 3, 2) batch), each feeding a
-- softmax through collapse or global_pool; t_out and lens: the time axis and lengths after it.
local IMG = {data = {dim = 2, spatial = 2}, classes = {dim = C, sparse = true}}
local function img_batch(t_out, lens)
  return function()
    rl.manual_seed(103)
    local bt = {data = rl.randn(5, 6, 3, 2), sizes = rl.tensor({{4, 6}, {3, 4}, {5, 2}}, "int32"),
                lengths = rl.tensor(lens, "int32")}
    local y = {}
    for t = 1, t_out do
      y[t] = {}
      for b = 1, 3 do y[t][b] = (t * 7 + b * 3) % C end
    end
    bt.classes = rl.tensor(y, "int32")
    return bt
  end
end
local WIDTHS = img_batch(6, {6, 4, 2})
parity("conv2d same 3x3 tanh, collapse sum", ce_on("col", {
  c = {class = "conv2d", n_out = 3, filter_size = {3, 3}, activation = "tanh"},
  col = {class = "collapse", from = "c", mode = "sum"},
}), IMG, true, WIDTHS)
parity("conv2d valid 3x2 strides (2, 1) relu without bias, collapse max", ce_on("col", {
  c = {class = "conv2d", n_out = 4, filter_size = {3, 2}, strides = {2, 1}, padding = "valid",
       activation = "relu", with_bias = false},
  col = {class = "collapse", from = "c", mode = "max"},
}), IMG, true, img_batch(5, {5, 3, 1}))
parity("conv2d same 2x3 strides 2 softplus, global_pool mean", ce_on("g", {
  c = {class = "conv2d", n_out = 3, filter_size = {2, 3}, strides = {2, 2}, activation = "softplus"},
  g = {class = "global_pool", from = "c", mode = "mean"},
}), IMG, true, img_batch(1, {1, 1, 1}))
parity("pool2d max 2x2 after conv2d, collapse last", ce_on("col", {
  c = {class = "conv2d", n_out = 3, filter_size = {3, 3}, activation = "square"},
  p = {class = "pool2d", from = "c", pool_size = {2, 2}},
  col = {class = "collapse", from = "p", mode = "last"},
}), IMG, true, img_batch(3, {3, 2, 1}))
parity("pool2d avg 3x3 strides 1 same (overlapping) after conv2d, collapse sum", ce_on("col", {
  c = {class = "conv2d", n_out = 3, filter_size = {1, 1}, activation = "sigmoid"},
  p = {class = "pool2d", from = "c", mode = "avg", pool_size = {3, 3}, strides = {1, 1},
       padding = "same"},
  col = {class = "collapse", from = "p", mode = "sum"},
}), IMG, true, WIDTHS)
parity("pool2d max 3x3 strides 2 same (overlapping) after conv2d, global_pool max", ce_on("g", {
  c = {class = "conv2d", n_out = 4, filter_size = {3, 3}, activation = "elu"},
  p = {class = "pool2d", from = "c", pool_size = {3, 3}, strides = {2, 2}, padding = "same"},
  g = {class = "global_pool", from = "p", mode = "max"},
}), IMG, true, img_batch(1, {1, 1, 1}))
parity("mdlstm all four directions, collapse sum", ce_on("col", {
  md = {class = "mdlstm", n_out = 3},
  col = {class = "collapse", from = "md", mode = "sum"},
}), IMG, true, WIDTHS)
parity("collapse max on the data", ce_on("col", {
  col = {class = "collapse", mode = "max"},
}), IMG, true, WIDTHS)
parity("global_pool mean and max on the data", ce_on("cat", {
  gm = {class = "global_pool", mode = "mean"},
  gx = {class = "global_pool", mode = "max"},
  cat = {class = "copy", from = {"gm", "gx"}},
}), IMG, true, img_batch(1, {1, 1, 1}))

-- Half precision on the device side (precision "bf16" and "fp16": kernels/cuda/context.h's half
-- context, cublasGemmEx with half operands and float32 sums) against a float64 network of the
-- same seed on the CPU. Tolerances from the format's unit roundoff u (bf16 2^-8, fp16 2^-11; half
-- the machine epsilon, rounding to nearest even), as tests/lua/test_precision.lua derives them:
-- rounding both operands moves a product by at most 2u of its sum of magnitudes, a layer's output
-- (tanh/sigmoid of such sums) by a few u of its largest entry: outputs at 4u, the loss at 2u,
-- parameter and input gradients (the products of both passes compounded) at 8u, each relative to
-- the largest magnitude of the float64 tensor. The half rounding must show: the last output's
-- error above u/64 (float32 alone stays near 2^-24). Without a CUDA device the bf16 cases run the
-- CPU's bf16 products as the device side; the CPU has no fp16 products, so there the fp16 cases
-- only check that the CPU refuses fp16 naming the option (printed as not run).
local HALF_U = {bf16 = 2 ^ -8, fp16 = 2 ^ -11}

local function half_run(desc, ext, bt, prec)
  rl.manual_seed(7)
  local net
  if prec == "float64" then
    net = rl.network(desc, ext, {input_grads = true, dtype = "float64"})
    local b = {}
    for k, v in pairs(bt) do
      b[k] = (k ~= "lengths" and v:dtype() == "float32") and v:double() or v
    end
    bt = b
  else
    net = rl.network(desc, ext, {input_grads = true})
    if DEV ~= "cpu" then net:to(DEV) end
    net:set_precision(prec)
  end
  rl.manual_seed(9)
  net:zero_grads()
  local loss = net:forward(bt, {train = true})
  net:backward()
  return net, loss
end

local function half_parity(name, desc, ext, prec)
  H.test(name .. " in " .. prec .. " vs float64", function()
    if prec == "fp16" and DEV == "cpu" then
      local ok, err = pcall(function() rl.network(desc, ext):set_precision("fp16") end)
      H.check(not ok and tostring(err):find('precision "fp16" needs a CUDA device', 1, true),
        tostring(err))
      print(string.format("  %s fp16: not run (no CUDA device; the CPU refuses fp16)", name))
      return
    end
    local u = HALF_U[prec]
    local bt = seq_batch(ext)
    local ref, lr = half_run(desc, ext, bt, "float64")
    local net, lh = half_run(desc, ext, bt, prec)
    local last
    for _, lname in ipairs(ref.order) do
      local o = net:layer(lname).output
      H.check(o:device() == DEV, lname .. " output is on " .. o:device())
      close(o, ref:layer(lname).output, prec .. " output of " .. lname, 4 * u)
      last = rel_diff(o, ref:layer(lname).output)
    end
    H.check(last > u / 64, string.format("%s: the output's error %.3g shows no %s rounding",
      name, last, prec))
    close_num(lh, lr, prec .. " loss", 2 * u)
    close(net:grads(), ref:grads(), prec .. " parameter gradients", 8 * u)
    for key in pairs(ref.input_keys) do
      local want = ref:input_grad(key)
      if want then close(net:input_grad(key), want, prec .. " input gradient of " .. key, 8 * u) end
    end
    print(string.format("  %s %s: last output error %.3g (tolerance %.3g)", name, prec, last,
      4 * u))
    if GPU then
      -- the weights were rounded once for this version, for the forward and the backward
      H.check(rl._cuda_half_conversions(net.half_ctx) == 1, "weights rounded "
        .. rl._cuda_half_conversions(net.half_ctx) .. " times for one version")
      net:params():add_(0) -- a write from Lua: a new version, rounded again at the next pass
      net:forward(bt, {train = false})
      H.check(rl._cuda_half_conversions(net.half_ctx) == 2, "not rounded again after a write")
    end
  end)
end

local HALF_EXT = {data = {dim = F}, classes = {dim = C, sparse = true}, target = {dim = 2}}
local HALF_NETS = {
  {"linear, lstm both directions, gru, softmax ce", {
    l1 = {class = "linear", n_out = 8, activation = "tanh", from = "data"},
    fw = {class = "lstm", n_out = 6, from = "l1"},
    bw = {class = "lstm", n_out = 6, from = "l1", direction = -1},
    g = {class = "gru", n_out = 5, from = {"fw", "bw"}},
    output = {class = "softmax", from = "g", loss = "ce", target = "classes"},
  }},
  {"lstm n_proj with rec_dropout, linear mse", {
    fw = {class = "lstm", n_out = 7, n_proj = 4, rec_dropout = 0.2, from = "data"},
    output = {class = "linear", n_out = 2, from = "fw", loss = "mse", target = "target"},
  }},
}
for _, c in ipairs(HALF_NETS) do
  for _, prec in ipairs({"bf16", "fp16"}) do half_parity(c[1], c[2], HALF_EXT, prec) end
end

H.test("rl.train in fp16 on the device: loss scaling on, finite scores", function()
  if DEV == "cpu" then
    print("  rl.train fp16: not run (no CUDA device)")
    return
  end
  local r = rl.train({
    network = {
      fw = {class = "lstm", n_out = 16},
      output = {class = "softmax", from = "fw", loss = "ce", target = "classes"},
    },
    train = {class = "12ax", num_seqs = 24, seed = 1, min_len = 5, max_len = 20},
    num_epochs = 2, batch_size = 120, max_seqs = 8, optimizer = {class = "adam"},
    learning_rate = 1e-2, log_verbosity = 0, seed = 3, device = KIND, precision = "fp16",
  }, {})
  H.check(r.train_score == r.train_score and r.train_score < math.huge, "train score")
  H.check(r.net.precision == "fp16" and r.net.device == DEV)
end)

H.test("net:to round trip cpu -> device -> cpu keeps every value", function()
  rl.manual_seed(7)
  local net = rl.network(ce_on("h", {h = {class = "linear", n_out = 7}}), EXT)
  local before = net:params():clone()
  net:to(KIND)
  H.check(net.device == DEV and net:params():device() == DEV)
  net:to("cpu")
  H.check(net.device == "cpu")
  close(net:params(), before, "values after the round trip", 0)
end)

-- Whole training runs: the same recipe on both devices.
local root = os.tmpname()
os.remove(root)
assert(lfs.mkdir(root))

local function train_cfg(device, model)
  return {
    network = {
      h = {class = "linear", n_out = 16, activation = "tanh"},
      w = {class = "window", from = "h", window = 3},
      drop = {class = "dropout", from = "w", dropout = 0.1},
      output = {class = "softmax", from = "drop", loss = "ce", target = "classes"},
    },
    train = {class = "12ax", num_seqs = 24, seed = 1, min_len = 5, max_len = 20,
             seq_ordering = "random"},
    dev = {class = "12ax", num_seqs = 8, seed = 2, min_len = 5, max_len = 20},
    num_epochs = 2, batch_size = 120, max_seqs = 8, optimizer = {class = "sgd"},
    learning_rate = 1e-3, log_verbosity = 0, seed = 3, device = device, model = model,
  }
end

H.test("rl.train 2 epochs on the device vs cpu: close parameters, scores and checkpoints", function()
  local rc = rl.train(train_cfg("cpu", root .. "/cpu"), {})
  local rg = rl.train(train_cfg(KIND, root .. "/gpu"), {})
  H.check(rg.net.device == DEV, "the trained net is on " .. rg.net.device)
  close(rg.net:params(), rc.net:params(), "parameters after 2 epochs", 1e-4)
  close_num(rg.train_score, rc.train_score, "train score", 1e-4)
  close_num(rg.dev_score, rc.dev_score, "dev score", 1e-4)
  local ck = rl.load_checkpoint(root .. "/gpu.002.h5")
  H.check(ck.params:device() == "cpu")
  close(ck.params, rg.net:params(), "checkpoint written from the GPU", 0)
  -- resume on the GPU from the GPU's checkpoint of epoch 1: the same end as uninterrupted
  local cfg = train_cfg(KIND, root .. "/gpu")
  cfg.load = root .. "/gpu.001.h5"
  local rr = rl.train(cfg, {})
  close(rr.net:params(), rg.net:params(), "resumed on the GPU", 1e-6)
  -- forward task on both devices from the GPU's checkpoint
  local outs = {}
  for i, dev in ipairs({"cpu", KIND}) do
    local path = string.format("%s/fwd_%d.h5", root, i)
    rl.forward{model = root .. "/gpu.002.h5", data = {class = "12ax", num_seqs = 4, seed = 5},
               output_file = path, device = dev, log_verbosity = 0}
    outs[i] = rl.dataset{class = "hdf", files = {path}}
    outs[i]:init_epoch(1)
  end
  H.check(outs[1]:num_seqs() == 4 and outs[2]:num_seqs() == 4)
  for i = 1, 4 do
    close(outs[2]:get_seq(i).data, outs[1]:get_seq(i).data, "forward output " .. i)
  end
end)

for e in lfs.dir(root) do
  if e ~= "." and e ~= ".." then os.remove(root .. "/" .. e) end
end
lfs.rmdir(root)

H.done()
