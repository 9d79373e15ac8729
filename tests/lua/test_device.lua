-- Devices, the parts that run without a GPU: net:to("cpu") and the rebinding it relies on
-- (net:bind_buffers: new flat buffers, values kept, every layer reading the new ones), batches
-- on the network's device, clear errors for a CUDA device that this machine cannot use
-- (net:to, rl.train's device key, rl.forward's), the CE loss's masked counts against a
-- reference written here, and a Lua layer's device. The same on a GPU: tests/gpu/
-- test_layers_parity.lua (make test-gpu).
local H = dofile("tests/lua/harness.lua")
local lfs = require("lfs")

local NET = {
  h = {class = "linear", n_out = 6, activation = "tanh"},
  norm = {class = "layer_norm", from = "h"},
  win = {class = "window", from = "norm", window = 3},
  output = {class = "softmax", from = "win", loss = "ce", target = "classes"},
}
local EXT = {data = {dim = 3}, classes = {dim = 4, sparse = true}}
local T, B = 5, 3
local LENS = {5, 2, 4}

local function batch()
  rl.manual_seed(11)
  local x = rl.randn(T, B, 3)
  local y = {}
  for t = 1, T do
    y[t] = {}
    for b = 1, B do y[t][b] = (t * 3 + b * 5) % 4 end
  end
  return {data = x, classes = rl.tensor(y, "int32"), lengths = rl.tensor(LENS, "int32")}
end

local function build()
  rl.manual_seed(5)
  return rl.network(NET, EXT, {input_grads = true})
end

local function run(net, bt)
  net:zero_grads()
  local loss, err = net:forward(bt)
  net:backward()
  return loss, err
end

local function max_abs_diff(a, b)
  return (a:double() - b:double()):abs():max()
end

-- the -log softmax at the target and the argmax errors over valid frames, from the output
local function reference_ce(p, y)
  local loss, errs = 0, 0
  for b = 1, B do
    for t = 1, LENS[b] do
      local row, c = p[t][b], y[t][b]
      loss = loss - math.log(row[c + 1])
      local best = 1
      for k = 2, #row do if row[k] > row[best] then best = k end end
      if best - 1 ~= c then errs = errs + 1 end
    end
  end
  return loss, errs
end

H.test("a new network is on the cpu; to('cpu') keeps the very same buffers", function()
  local net = build()
  H.check(net.device == "cpu")
  local p = net:params()
  H.check(net:to("cpu") == net, "to returns the network")
  p[1] = 42 -- (a share of the network's buffer)
  H.check(net:params()[1] == 42, "no copy for the device it is on")
  H.check(tostring(net):find("float32, cpu", 1, true), tostring(net))
end)

H.test("new flat buffers: values kept, every layer reads and writes the new ones", function()
  local bt = batch()
  local net = build()
  local l1, e1 = run(net, bt)
  local g1, out1 = net:grads():clone(), net:layer("output").output:clone()
  local dx1 = net:input_grad("data"):clone()
  local old = net:params()
  net:bind_buffers(old:clone(), net:grads():clone())
  old[1] = old[1] + 1
  H.check(net:params()[1] ~= old[1], "the network reads the new buffer")
  local l2, e2 = run(net, bt)
  H.check(l2 == l1 and e2 == e1, string.format("loss %g vs %g", l2, l1))
  H.check(max_abs_diff(net:grads(), g1) == 0, "gradients land in the new buffer")
  H.check(max_abs_diff(net:layer("output").output, out1) == 0)
  H.check(max_abs_diff(net:input_grad("data"), dx1) == 0)
  -- the old buffer is no longer read: changing it changes nothing, changing the new one does
  old:fill_(0)
  H.check(run(net, bt) == l1, "the old buffer is not read")
  local v = net:param_list()[1].value
  net:params():mul_(0)
  local l3 = run(net, bt)
  H.near(l3, 11 * math.log(4), 1e-4, "all-zero weights give uniform outputs")
  -- param_list views follow the new buffer
  net:params():fill_(0.25)
  H.check(v:min() == 0.25 and v:max() == 0.25, "param_list views are of the new buffer")
end)

H.test("ce loss and errors on ragged lengths match a reference; padding is ignored", function()
  local bt = batch()
  local net = build()
  local loss, err = run(net, bt)
  local p = net:layer("output").output:totable()
  local rl_, re = reference_ce(p, bt.classes:totable())
  H.near(loss, rl_, 1e-4 * math.abs(rl_), "loss")
  H.check(err == re, string.format("errors %d, reference %d", err, re))
  H.check(net.n_frames == 11)
  -- an out-of-range class on a padded frame is ignored, on a valid frame named
  local y = bt.classes:clone()
  y[T][2] = 9 -- frame 5 of sequence 2 (length 2): padding
  local l2 = net:forward{data = bt.data, classes = y, lengths = bt.lengths}
  H.near(l2, loss, 1e-5 * math.abs(loss), "padding target")
  y[2][3] = -1 -- frame 2 of sequence 3: valid
  local ok, msg = pcall(net.forward, net, {data = bt.data, classes = y, lengths = bt.lengths})
  H.check(not ok and tostring(msg):find("target -1 at frame 2 of sequence 3", 1, true),
    tostring(msg))
end)

H.test("the ce gradient is zero on padded frames", function()
  local bt = batch()
  local net = build()
  run(net, bt)
  local dx = net:input_grad("data")
  H.check(dx:select(2, 2):narrow(1, 3, 3):abs():max() == 0, "sequence 2 beyond its length")
  H.check(dx:select(2, 3):narrow(1, 5, 1):abs():max() == 0, "sequence 3 beyond its length")
  H.check(dx:select(2, 1):abs():max() > 0)
end)

H.test("Lua layers know their device", function()
  local net = build()
  local inst = net:layer("norm").object.inst
  H.check(inst.device == "cpu", tostring(inst.device))
  local m = inst:frame_mask(rl.tensor({2, 1}, "int32"), 3)
  H.check(m:device() == "cpu")
  H.check(m:sum() == 3)
end)

local has_gpu = rl.device_count() > 0

-- The layers (embedding, linear, ctc, rec) read class indices on the host, so net:forward must
-- leave them there on any device (the ce loss copies its target to the logits' device itself).
-- Without a GPU the network's device is set to cuda:0 by hand: only the placement of the batch
-- is tested, and any copy towards cuda:0 would fail.
H.test("class indices stay on the CPU for a network on a device (inputs and targets)", function()
  rl.manual_seed(3)
  -- with a GPU a dense input beside them too (it must go to the device)
  local net = rl.network({
    emb = {class = "embedding", n_out = 4, from = "data"},
    h = {class = "linear", n_out = 5, activation = "tanh", from = has_gpu and {"emb", "feat"} or "emb"},
    output = {class = "softmax", from = "h", loss = "ce", target = "classes"},
  }, {data = {dim = 7, sparse = true}, feat = {dim = 2}, classes = {dim = 3, sparse = true}})
  local bt = {data = rl.tensor({{1, 2}, {6, 0}, {3, 5}}, "int32"),
              classes = rl.tensor({{0, 1}, {2, 0}, {1, 1}}, "int32"),
              lengths = rl.tensor({3, 2}, "int32"), feat = has_gpu and rl.randn(3, 2, 2) or nil}
  local want = net:forward(bt)
  if has_gpu then net:to("cuda") else net.device = "cuda:0" end
  local moved = net:on_device(bt)
  H.check(moved.data:device() == "cpu" and moved.classes:device() == "cpu")
  H.check(net:device_of("data") == "cpu" and net:device_of("classes") == "cpu",
    "class indices read on the CPU")
  H.check(net:device_of("feat") == net.device, "a dense input on the network's device")
  if has_gpu then
    H.check(moved.feat:device() == net.device)
    local got = net:forward(bt)
    H.check(math.abs(got - want) <= 1e-5 * math.abs(want), string.format("%g vs %g", got, want))
    -- given on the device, class indices come back to the CPU
    local on_dev = {data = bt.data:to("cuda"), feat = bt.feat, classes = bt.classes:to("cuda"),
                    lengths = bt.lengths}
    moved = net:on_device(on_dev)
    H.check(moved.data:device() == "cpu" and moved.classes:device() == "cpu")
    H.check(math.abs(net:forward(on_dev) - want) <= 1e-5 * math.abs(want))
  else
    H.check(moved == bt, "nothing to copy: the batch itself")
  end
end)

if not has_gpu then
  H.expect_error("net:to('cuda') without a GPU names the device", function()
    build():to("cuda")
  end, "cuda:0 requested")
  H.expect_error("net:to('cuda:1') without a GPU names the ordinal", function()
    build():to("cuda:1")
  end, "cuda:1 requested")
  H.test("a failed net:to leaves the network working on the cpu", function()
    local net = build()
    local bt = batch()
    local l1 = run(net, bt)
    H.check(not pcall(net.to, net, "cuda"))
    H.check(net.device == "cpu" and run(net, bt) == l1)
  end)
  H.expect_error("rl.train device = 'cuda' without a GPU", function()
    rl.train({network = {output = {class = "softmax", loss = "ce", target = "classes"}},
              train = {class = "12ax", num_seqs = 4, seed = 1}, device = "cuda",
              log_verbosity = 0}, {})
  end, "rl.train: config.device = \"cuda\": cuda:0 requested")
end
H.expect_error("net:to with a bad name", function() build():to("gpu") end,
  "device must be \"cpu\", \"cuda\" or \"cuda:N\", got gpu")
H.expect_error("rl.train with a bad device name", function()
  rl.train({network = {output = {class = "softmax", loss = "ce", target = "classes"}},
            train = {class = "12ax", num_seqs = 4, seed = 1}, device = "cuda:one",
            log_verbosity = 0}, {})
end, "config.device must be \"cpu\", \"cuda\" or \"cuda:N\", got cuda:one")
H.expect_error("rl.forward with a bad device name", function()
  rl.forward{model = "nothing.h5", data = {class = "12ax", num_seqs = 2}, output_file = "x.h5",
             device = 0}
end, "rl.forward: device must be")

H.test("rl.train and rl.forward with device = 'cpu' as before", function()
  local dir = os.tmpname()
  os.remove(dir)
  assert(lfs.mkdir(dir))
  local cfg = {
    network = {h = {class = "linear", n_out = 8, activation = "relu"},
               output = {class = "softmax", from = "h", loss = "ce", target = "classes"}},
    train = {class = "12ax", num_seqs = 12, seed = 1, min_len = 5, max_len = 12},
    num_epochs = 2, batch_size = 60, max_seqs = 4, optimizer = {class = "sgd"},
    learning_rate = 1e-3, log_verbosity = 0, model = dir .. "/net",
  }
  local r1 = rl.train(cfg, {})
  cfg.device, cfg.model = "cpu", dir .. "/net2"
  local r2 = rl.train(cfg, {})
  H.check(max_abs_diff(r1.net:params(), r2.net:params()) == 0, "the device key changes nothing")
  local ck = rl.load_checkpoint(dir .. "/net.002.h5")
  H.check(max_abs_diff(ck.params, r1.net:params()) == 0)
  local f = rl.forward{model = dir .. "/net.002.h5", data = {class = "12ax", num_seqs = 3, seed = 4},
                       output_file = dir .. "/fwd.h5", device = "cpu", log_verbosity = 0}
  H.check(f.num_seqs == 3)
  for e in lfs.dir(dir) do
    if e ~= "." and e ~= ".." then os.remove(dir .. "/" .. e) end
  end
  lfs.rmdir(dir)
end)

H.done()
