-- Targets of their own length (label sequences for CTC): the RETURNN layout's per-key
-- /seqLengths columns, batching (each key padded to its own length with lengths_<key>),
-- net:forward, the engine and the forward task with such data, and the errors for what cannot
-- work with them (chunking, frame-level losses).
local H = dofile("tests/lua/harness.lua")
local test, check, expect_error = H.test, H.check, H.expect_error

-- one prefix per run (os.tmpname makes it unique), so runs side by side never share a file
local prefix = os.tmpname()
local function tmp(name) return string.format("%s_labelseq_%s", prefix, name) end

-- n sequences: data (T, 3) float, classes a label sequence of length S (labels 0..3),
-- T and S varying independently (S = 0 once).
local function write_file(path, n)
  local w = rl.hdf_writer(path, {data_dim = 3, targets = {classes = {dim = 4, sparse = true}}})
  local seqs = {}
  for i = 1, n do
    local T, S = 3 + (i * 5) % 7, (i * 3) % 5
    local d, c = {}, {}
    for t = 1, T do d[t] = {t, i, -t} end
    for s = 1, S do c[s] = (i + s) % 4 end
    local data = rl.tensor(d)
    local classes = S > 0 and rl.tensor(c, "int32") or rl.zeros({0}, "int32")
    w:add("seq-" .. i, data, {classes = classes})
    seqs[i] = {T = T, S = S, c = c}
  end
  w:close()
  return seqs
end

local path = tmp("labels.h5")
local seqs = write_file(path, 9)

test("the layout keeps one length column per target key", function()
  local f = rl.h5file(path)
  local sl = f:read("seqLengths"):totable()
  f:close()
  for i, s in ipairs(seqs) do
    check(sl[i][1] == s.T and sl[i][2] == s.S, "row " .. i)
  end
end)

test("batches: (S_max, B) int32 targets with lengths_classes, counting data frames", function()
  local ds = rl.dataset{class = "hdf", files = path}
  local seen = 0
  for b in rl.batches(ds, {batch_size = 24, max_seqs = 3}) do
    local B = b.lengths:size(1)
    check(B <= 3, "max_seqs")
    check(b.data:size(1) * B <= 24 or B == 1, "batch_size counts data frames")
    local lc = b.lengths_classes
    check(rl.is_tensor(lc) and lc:dtype() == "int32" and lc:dim() == 1 and lc:size(1) == B,
      "lengths_classes (B) int32")
    check(b.classes:dtype() == "int32" and b.classes:dim() == 2 and b.classes:size(2) == B,
      "classes (S_max, B)")
    local smax = 1
    for k = 1, B do
      local s = seqs[b.seqs[k]]
      check(b.lengths[k] == s.T and lc[k] == s.S, "lengths of sequence " .. b.seqs[k])
      smax = math.max(smax, s.S)
      for j = 1, s.S do check(b.classes[j][k] == s.c[j], "label") end
      for j = s.S + 1, b.classes:size(1) do check(b.classes[j][k] == 0, "padding is 0") end
      seen = seen + 1
    end
    check(b.classes:size(1) == smax, "S_max")
  end
  check(seen == #seqs, "every sequence once")
end)

test("frame-aligned keys also carry lengths_<key>, equal to lengths", function()
  local ds = rl.dataset{class = "12ax", num_seqs = 5, seed = 3}
  local b = rl.batches(ds, {})()
  check(rl.eq(b.lengths_classes, b.lengths):min() == 1, "same lengths")
end)

expect_error("chunking a dataset whose target has its own length names the key", function()
  local ds = rl.dataset{class = "hdf", files = path}
  for _ in rl.batches(ds, {chunking = "4:2"}) do end
end, "key 'classes'")

local ext = {data = {dim = 3}, classes = {dim = 4, sparse = true}}

expect_error("a ce loss given label sequences names the layer and the key", function()
  local net = rl.network({output = {class = "softmax", from = "data", loss = "ce",
    target = "classes"}}, ext)
  local ds = rl.dataset{class = "hdf", files = path}
  net:forward(rl.batches(ds, {max_seqs = 4})())
end, "layer 'output' (class softmax): loss 'ce' scores frames, but target 'classes'")

expect_error("the engine stops on a ce loss with label sequences", function()
  rl.train{network = {output = {class = "softmax", from = "data", loss = "ce",
    target = "classes"}}, extern_data = ext,
    train = {class = "hdf", files = path}, num_epochs = 1, log_verbosity = 0}
end, "target 'classes' is not frame-aligned")

expect_error("bad lengths_<key> in a hand-made batch", function()
  local net = rl.network({output = {class = "softmax", from = "data", loss = "ce",
    target = "classes"}}, ext)
  net:forward{data = rl.zeros(4, 2, 3), lengths = rl.tensor({4, 3}, "int32"),
    classes = rl.zeros({2, 2}, "int32"), lengths_classes = rl.tensor({1, 3}, "int32")}
end, "batch.lengths_classes must lie within 0..2")

expect_error("lengths_<key> of the wrong dtype", function()
  local net = rl.network({output = {class = "softmax", from = "data", loss = "ce",
    target = "classes"}}, ext)
  net:forward{data = rl.zeros(4, 2, 3), lengths = rl.tensor({4, 3}, "int32"),
    classes = rl.zeros({2, 2}, "int32"), lengths_classes = rl.tensor({1, 2})}
end, "batch.lengths_classes must be a (2) int32 tensor")

test("a ce loss with lengths_<key> equal to the lengths trains as before", function()
  local net = rl.network({output = {class = "softmax", from = "data", loss = "ce",
    target = "classes"}}, ext)
  local x = rl.randn(4, 2, 3)
  local len, y = rl.tensor({4, 3}, "int32"), rl.tensor({{0, 1}, {1, 2}, {2, 3}, {3, 0}}, "int32")
  local l1 = net:forward{data = x, lengths = len, classes = y}
  local l2 = net:forward{data = x, lengths = len, classes = y, lengths_classes = len:clone()}
  H.near(l1, l2, 1e-6, "same loss")
end)

test("the forward task reads a dataset with label sequences (inputs only)", function()
  local net = rl.network({output = {class = "softmax", from = "data", loss = "ce",
    target = "classes"}}, ext)
  local model = tmp("model.h5")
  rl.save_checkpoint(model, {net = net})
  local out = tmp("fwd.h5")
  local r = rl.forward{model = model, data = {class = "hdf", files = path}, output_file = out,
    log_verbosity = 0}
  check(r.num_seqs == #seqs, "all sequences")
  local ds = rl.dataset{class = "hdf", files = out}
  for i = 1, ds:num_seqs() do check(ds:get_seq(i).data:size(1) == seqs[i].T, "frames") end
  os.remove(model)
  os.remove(out)
end)

os.remove(path)
os.remove(prefix)
H.done()
