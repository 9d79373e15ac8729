-- The softmax layer with loss = "ctc" in networks: gradient checks (float64), build errors,
-- infeasible sequences skipped, label errors, and a short rl.train run on label sequences that
-- learns, reports its label error rate (epoch line, learning curve) and lets newbob follow it;
-- the forward task then decodes the dev set (best path and beam search) to the dataset layout.
local H = dofile("tests/lua/harness.lua")
local test, check, expect_error = H.test, H.check, H.expect_error

-- one prefix per run (os.tmpname makes it unique), so runs side by side never share a file
local prefix = os.tmpname()
local function tmp(name) return string.format("%s_ctctrain_%s", prefix, name) end

test("gradient check: the ctc softmax layer (blank last, blank first)", function()
  for _, bi in ipairs({false, 0, 2}) do
    local r = rl.gradcheck{layer = {class = "softmax", n_out = 5, loss = "ctc",
      blank_index = bi or nil}, in_dim = 4, T = 6, B = 3}
    check(r.passed and r.n_checked > 50, "max rel error " .. r.max_rel_error)
  end
end)

test("gradient check: BLSTM network with a ctc output and loss_scale", function()
  local r = rl.gradcheck{network = {
    fw = {class = "lstm", n_out = 4}, bw = {class = "lstm", n_out = 4, direction = -1},
    output = {class = "softmax", from = {"fw", "bw"}, loss = "ctc", target = "classes",
      loss_scale = 0.7}},
    extern_data = {data = {dim = 3}, classes = {dim = 3, sparse = true}},
    T = 7, B = 3, max_params_per_tensor = 20}
  check(r.passed, "max rel error " .. r.max_rel_error)
end)

local ext = {data = {dim = 3}, classes = {dim = 4, sparse = true}}

test("n_out is the number of labels plus the blank", function()
  local net = rl.network({output = {class = "softmax", loss = "ctc", target = "classes"}}, ext)
  check(net:layer("output").n_out == 5, "n_out 5")
end)
expect_error("n_out that leaves no room for the blank", function()
  rl.network({output = {class = "softmax", n_out = 4, loss = "ctc", target = "classes"}}, ext)
end, "layer 'output' (class softmax): loss 'ctc': target 'classes' has 4 labels, so the layer's n_out must be 5")
expect_error("ctc on a dense target", function()
  rl.network({output = {class = "softmax", loss = "ctc", target = "feat"}},
    {data = {dim = 3}, feat = {dim = 4}})
end, "loss 'ctc' needs a sparse target")
expect_error("ctc on another class", function()
  rl.network({output = {class = "linear", n_out = 5, loss = "ctc", target = "classes"}}, ext)
end, "loss 'ctc' needs a softmax layer")
expect_error("blank_index out of range", function()
  rl.network({output = {class = "softmax", loss = "ctc", target = "classes", blank_index = 5}}, ext)
end, "layer 'output' (class softmax): blank_index = 5 is outside 0..4")
expect_error("blank_index without ctc", function()
  rl.network({output = {class = "softmax", loss = "ce", target = "classes", blank_index = 1}},
    {data = {dim = 3}, classes = {dim = 5, sparse = true}})
end, "blank_index")

local function net_ctc(bi)
  rl.manual_seed(4)
  return rl.network({fw = {class = "lstm", n_out = 6},
    output = {class = "softmax", from = "fw", loss = "ctc", target = "classes",
      blank_index = bi}}, ext)
end

expect_error("a batch without lengths_<key>", function()
  net_ctc():forward{data = rl.randn(5, 2, 3), lengths = rl.tensor({5, 4}, "int32"),
    classes = rl.zeros({5, 2}, "int32")}
end, "layer 'output' (class softmax): loss 'ctc' needs batch.lengths_classes")
expect_error("a label outside the target's labels names the layer and the sequence", function()
  net_ctc():forward{data = rl.randn(5, 2, 3), lengths = rl.tensor({5, 4}, "int32"),
    classes = rl.tensor({{0, 1}, {2, 4}}, "int32"), lengths_classes = rl.tensor({2, 2}, "int32")}
end, "layer 'output' (class softmax): sequence 2: label 4 at position 2 is outside 0..3")
expect_error("a target longer than its input names the layer and the sequence", function()
  net_ctc():forward{data = rl.randn(3, 2, 3), lengths = rl.tensor({3, 2}, "int32"),
    classes = rl.tensor({{0, 1}, {2, 2}, {1, 3}}, "int32"),
    lengths_classes = rl.tensor({2, 3}, "int32")}
end, "layer 'output' (class softmax): sequence 2: its target of 3 labels is longer than its input of 2 frames")

test("an infeasible sequence is skipped: finite loss, no gradient from it", function()
  local x = rl.randn(4, 3, 3)
  local y = rl.tensor({{1, 2, 0}, {1, 2, 0}, {1, 2, 0}}, "int32") -- (S = 3, B = 3)
  local full = {data = x, lengths = rl.tensor({4, 4, 4}, "int32"), classes = y,
    lengths_classes = rl.tensor({2, 3, 1}, "int32")}
  -- sequence 2 is {2, 2, 2} in 4 frames: repeats need 5 frames
  y[1][2], y[2][2], y[3][2] = 2, 2, 2
  local net = net_ctc()
  net:zero_grads()
  local l = net:forward(full)
  net:backward()
  check(net.n_skipped == 1 and l == l and l < math.huge, "skipped, finite loss " .. l)
  local g_full = net:grads():clone()
  check(g_full:ne(g_full):sum() == 0, "no NaN in the gradients")
  -- the same batch without sequence 2
  local keep = rl.tensor({1, 3}, "int32")
  local part = {data = x:index_select(2, keep), lengths = rl.tensor({4, 4}, "int32"),
    classes = y:index_select(2, keep), lengths_classes = rl.tensor({2, 1}, "int32")}
  net:zero_grads()
  local l2 = net:forward(part)
  net:backward()
  H.near(l, l2, 1e-4, "loss without the skipped sequence")
  check((net:grads() - g_full):abs():max() < 1e-5, "same gradients")
end)

test("label errors: edit distance of the best path, blank anywhere", function()
  for _, bi in ipairs({4, 0, 2}) do
    local net = rl.network({output = {class = "softmax", from = "data", loss = "ctc",
      target = "classes", n_out = 5, blank_index = bi, with_bias = false}},
      {data = {dim = 5}, classes = {dim = 4, sparse = true}})
    -- W = identity: the output class is the input's one-hot position
    local W = net:layer("output").params.W
    W:zero()
    for i = 1, 5 do W[i][i] = 1 end
    local function cls(label) return label < bi and label or label + 1 end
    -- frames spell labels 0 0 blank 1 3 3 (-> 0 1 3); the target is 0 2 3: one substitution
    local path = {cls(0), cls(0), bi, cls(1), cls(3), cls(3)}
    local x = rl.zeros(6, 1, 5)
    for t, c in ipairs(path) do x[t][1][c + 1] = 10 end
    net:forward{data = x, lengths = rl.tensor({6}, "int32"),
      classes = rl.tensor({{0}, {2}, {3}}, "int32"), lengths_classes = rl.tensor({3}, "int32")}
    check(net.n_errors == 1 and net.n_labels == 3 and net.n_error_units == 3,
      string.format("blank %d: %s errors of %s", bi, net.n_errors, net.n_labels))
  end
end)

-- Label sequences hidden in frames: each label 0..3 shown for 2 or 3 frames (one-hot, dim 5),
-- a separator frame (one-hot 4) after some labels.
local function write_task(path, n, seed)
  local g = rl.datasets.new_rng(seed)
  local w = rl.hdf_writer(path, {data_dim = 5, targets = {classes = {dim = 4, sparse = true}}})
  for i = 1, n do
    local labels, frames = {}, {}
    for s = 1, g:int(2, 5) do
      local l = g:int(0, 3)
      labels[s] = l
      for _ = 1, g:int(2, 3) do frames[#frames + 1] = l end
      if g:uniform() < 0.5 or labels[s + 1] == l then frames[#frames + 1] = 4 end
    end
    local x = rl.zeros(#frames, 5)
    for t, c in ipairs(frames) do x[t][c + 1] = 1 end
    w:add("seq" .. i, x, {classes = rl.tensor(labels, "int32")})
  end
  w:close()
end

test("rl.train with ctc: learns, LER in the epoch line and the curve, newbob on dev_ler",
  function()
    local train, dev = tmp("train.h5"), tmp("dev.h5")
    write_task(train, 80, 1)
    write_task(dev, 16, 2)
    local model = tmp("m")
    local log = tmp("train.log")
    local r = rl.train{
      network = {fw = {class = "lstm", n_out = 16}, bw = {class = "lstm", n_out = 16,
        direction = -1}, output = {class = "softmax", from = {"fw", "bw"}, loss = "ctc",
        target = "classes"}},
      train = {class = "hdf", files = train, seq_ordering = "random"},
      dev = {class = "hdf", files = dev},
      num_epochs = 6, batch_size = 200, max_seqs = 10, learning_rate = 0.02,
      learning_rate_control = "newbob", learning_rate_control_error_measure = "dev_ler",
      model = model, log_verbosity = 1, log_file = log, seed = 2}
    check(r.dev_error < 0.2, "dev LER " .. r.dev_error)
    check(r.history[1].dev_ler > r.dev_error, "the LER fell")
    local text = io.open(log):read("a")
    check(text:find("dev score [%d.]+ LER [%d.]+%%"), "LER in the epoch line")
    local curve = io.open(model .. ".curve.jsonl"):read("l")
    check(curve:find('"dev_ler": [%d.]') and curve:find('"train_ler": [%d.]')
      and curve:find('"ctc_skipped": 0'), "curve keys: " .. curve)
    check(r.lr_control:score_key(r.history[1]) == "dev_ler", "newbob follows dev_ler")
    -- the forward task decodes the dev set; its label error rate is the engine's
    local out = tmp("hyp.h5")
    for _, beam in ipairs({1, 4}) do
      local f = rl.forward{model = model .. ".006.h5", data = {class = "hdf", files = dev},
        output_file = out, decode = "ctc", beam = beam, log_verbosity = 0}
      check(f.num_seqs == 16, "16 sequences")
      local hyp = rl.dataset{class = "hdf", files = out}
      local ref = rl.dataset{class = "hdf", files = dev}
      check(hyp:extern_data().data.sparse and hyp:extern_data().data.dim == 4, "sparse, 4 labels")
      local errs, n = 0, 0
      for i = 1, ref:num_seqs() do
        local h, rf = hyp:get_seq(i), ref:get_seq(i)
        check(h.tag == rf.tag, "tags in order")
        errs = errs + rl.edit_distance(h.data, rf.classes)
        n = n + rf.classes:size(1)
      end
      if beam == 1 then H.near(errs / n, r.dev_error, 1e-12, "LER of the decoded file") end
      check(errs / n <= 0.2, "beam " .. beam .. " LER " .. errs / n)
    end
    os.remove(out)
    for _, f in ipairs({train, dev, log, model .. ".curve.jsonl"}) do os.remove(f) end
    for e = 1, 6 do os.remove(model .. string.format(".%03d.h5", e)) end
  end)

os.remove(prefix)
H.done()
