-- Images through the network and the datasets: rank rules and their errors, sizes and lengths
-- flowing through conv2d/pool2d/collapse/global_pool and folded any-rank layers, gradients of
-- the whole network against finite differences (float64) with zero gradient on padding, the
-- image HDF layout (/seqSizes) written and read back, image batches, and a tiny rl.train run.
-- Tiny synthetic images only.
local H = dofile("tests/lua/harness.lua")

local dir = os.tmpname()
os.remove(dir)
require("lfs").mkdir(dir)
local function tmp(name) return dir .. "/" .. name end

local img = {data = {dim = 2, spatial = 2}, classes = {dim = 3, sparse = true}}

-- (H, W, B, F) images with zeros outside each image's size
local function images(Hh, W, sizes, F, dtype)
  local x = rl.randn(Hh, W, #sizes, F):to(dtype or "float32")
  local mask = rl.zeros(Hh, W, #sizes, 1, dtype or "float32")
  for b, s in ipairs(sizes) do mask:select(3, b):narrow(1, 1, s[1]):narrow(2, 1, s[2]):fill_(1) end
  return x:mul(mask), rl.tensor(sizes, "int32")
end

---------------------------------------------------------------------------- rank rules

H.expect_error("lstm on images", function()
  rl.network({output = {class = "lstm", n_out = 3, from = "data"}}, img)
end, "layer 'output' (class lstm) takes sequences (T, B, F) but 'data' gives images")

H.expect_error("conv2d on sequences", function()
  rl.network({output = {class = "conv2d", n_out = 3, filter_size = 3}}, {data = {dim = 2}})
end, "layer 'output' (class conv2d) takes images (H, W, B, F) but 'data' gives sequences")

H.expect_error("loss on images", function()
  rl.network({c = {class = "conv2d", n_out = 3, filter_size = 3},
    output = {class = "linear", n_out = 3, from = "c", loss = "mse", target = "t"}},
    {data = {dim = 2, spatial = 2}, t = {dim = 3}})
end, "a loss layer must give sequences")

H.expect_error("mixed ranks", function()
  rl.network({output = {class = "copy", from = {"data", "seq"}, is_output_layer = true}},
    {data = {dim = 2, spatial = 2}, seq = {dim = 2}})
end, "its inputs mix images")

H.expect_error("bad spatial", function()
  rl.network({output = {class = "copy"}}, {data = {dim = 2, spatial = 3}})
end, "spatial must be 2")

H.expect_error("missing sizes", function()
  local net = rl.network({g = {class = "global_pool"},
    output = {class = "softmax", from = "g", loss = "ce", target = "classes"}}, img)
  net:forward{data = rl.zeros(3, 3, 2, 2), classes = rl.zeros({1, 2}, "int32")}
end, "batch.sizes must be a (B, 2) int32 tensor")

H.expect_error("sizes too large", function()
  local net = rl.network({g = {class = "global_pool"},
    output = {class = "softmax", from = "g", loss = "ce", target = "classes"}}, img)
  net:forward{data = rl.zeros(3, 3, 2, 2), sizes = rl.tensor({{3, 3}, {4, 1}}, "int32"),
    classes = rl.zeros({1, 2}, "int32")}
end, "batch.sizes must lie within 1..3 x 1..3")

H.expect_error("pair option of three", function()
  rl.network({c = {class = "conv2d", n_out = 2, filter_size = {3, 3, 3}},
    output = {class = "global_pool", from = "c"}}, img)
end, "filter_size")

---------------------------------------------------------------------------- geometry

H.test("collapse gives the widths as lengths; folded layers keep sizes", function()
  rl.manual_seed(3)
  local net = rl.network({
    conv = {class = "conv2d", n_out = 4, filter_size = {3, 2}, strides = {1, 2}},
    act = {class = "activation", activation = "tanh", from = "conv"},
    col = {class = "collapse", mode = "sum", from = "act"},
    output = {class = "softmax", from = "col", loss = "ce", target = "classes"},
  }, img)
  local x, sizes = images(4, 7, {{4, 7}, {2, 3}, {3, 5}}, 2)
  local y = rl.zeros({4, 3}, "int32")
  net:forward{data = x, sizes = sizes, classes = y}
  -- conv widths ceil(w / 2): 4, 2, 3 -> 9 frames scored
  H.near(net.n_frames, 9, 0, "frames scored")
  local conv, act = net:layer("conv").output, net:layer("act").output
  H.check(act:size() == conv:size(), "activation keeps the image shape")
  H.near((act - conv:tanh()):abs():max(), 0, 1e-6, "activation on images")
  local col = net:layer("col").output
  H.check(col:size(1) == 4 and col:size(2) == 3, "collapse (W', B, F)")
  -- image 2: 2 rows valid, column 1 = sum of act rows 1..2
  local want = act:select(3, 2):narrow(1, 1, 2):sum(1):select(1, 1)
  H.near((col:select(1, 1):select(1, 2) - want):abs():max(), 0, 1e-5, "collapse sum")
  H.near(col:select(1, 3):select(1, 2):abs():max(), 0, 0, "collapse padding")
end)

H.test("network gradients on images match finite differences (float64)", function()
  rl.manual_seed(5)
  local net = rl.network({
    conv = {class = "conv2d", n_out = 3, filter_size = 3, strides = 2, activation = "tanh"},
    lin = {class = "linear", n_out = 3, activation = "sigmoid", from = "conv"},
    pool = {class = "pool2d", mode = "avg", pool_size = 2, padding = "same", from = "lin"},
    gp = {class = "global_pool", mode = "mean", from = "pool"},
    output = {class = "softmax", from = "gp", loss = "ce", target = "classes"},
  }, img, {dtype = "float64", input_grads = true})
  local x, sizes = images(5, 4, {{5, 4}, {2, 3}}, 2, "float64")
  local batch = {data = x, sizes = sizes, classes = rl.tensor({{2, 0}}, "int32")}
  net:zero_grads()
  net:forward(batch)
  net:backward()
  local gx, gp = net:input_grad("data"):clone(), net:grads():clone()
  local eps = 1e-6
  local function numeric(t, i)
    local v = t[i]
    t[i] = v + eps
    local lp = net:forward(batch)
    t[i] = v - eps
    local lm = net:forward(batch)
    t[i] = v
    return (lp - lm) / (2 * eps)
  end
  local flat = x:view(x:numel())
  local gxf = gx:view(gx:numel())
  local worst = 0
  for i = 1, x:numel() do
    local n = numeric(flat, i)
    worst = math.max(worst, math.abs(n - gxf[i]) / math.max(math.abs(n), math.abs(gxf[i]), 1e-2))
  end
  H.check(worst < 1e-6, "input gradient: max rel error " .. worst)
  local p = net:params()
  worst = 0
  for i = 1, p:numel() do
    local n = numeric(p, i)
    worst = math.max(worst, math.abs(n - gp[i]) / math.max(math.abs(n), math.abs(gp[i]), 1e-2))
  end
  H.check(worst < 1e-6, "parameter gradient: max rel error " .. worst)
  -- image 2 is 2 x 3: its padding gets no gradient
  local pad = gx:select(3, 2):narrow(1, 3, 3)
  H.near(pad:abs():max(), 0, 0, "gradient on padded rows")
end)

---------------------------------------------------------------------------- datasets

local function write_images(path, n, seed)
  local w = rl.hdf_writer(path, {data_dim = 2, spatial = 2,
    targets = {classes = {dim = 3, sparse = true}}})
  local g = rl.datasets.new_rng(seed)
  local kept = {}
  for i = 1, n do
    local h, wd = g:int(2, 5), g:int(1, 4)
    local c = g:int(0, 2)
    local x = rl.zeros(h, wd, 2)
    -- the class decides which half of the image is bright
    x:select(3, 1):fill_(0.1)
    if c == 1 then x:select(3, 2):fill_(1) elseif c == 2 then x:select(3, 1):fill_(1) end
    x:add_(rl.randn(h, wd, 2):mul(0.05))
    kept[i] = {h = h, w = wd, x = x, c = c}
    w:add("img-" .. i, x, {classes = rl.tensor({c}, "int32")})
  end
  w:close()
  return kept
end

H.test("image HDF layout: /seqSizes, get_seq, batches", function()
  local kept = write_images(tmp("img.h5"), 7, 1)
  local f = rl.h5file(tmp("img.h5"), "r")
  local ss, sl = f:read("seqSizes"), f:read("seqLengths")
  f:close()
  H.check(ss:size(1) == 7 and ss:size(2) == 2, "seqSizes shape")
  for i = 1, 7 do
    H.near(ss[i][1], kept[i].h, 0, "height")
    H.near(sl[i][1], kept[i].h * kept[i].w, 0, "seqLengths = h*w")
  end
  local ds = rl.dataset{class = "hdf", files = tmp("img.h5")}
  H.check(ds:extern_data().data.spatial == 2, "extern_data spatial")
  local s3 = ds:get_seq(3)
  H.check(s3.data:size(1) == kept[3].h and s3.data:size(2) == kept[3].w, "get_seq (h, w, F)")
  H.near((s3.data - kept[3].x):abs():max(), 0, 1e-6, "pixels")
  local n, total = 0, 0
  for b in rl.batches(ds, {batch_size = 60, max_seqs = 3}) do
    local B = b.sizes:size(1)
    H.check(b.data:dim() == 4 and b.data:size(3) == B and b.data:size(4) == 2, "batch data")
    H.check(b.data:size(1) * b.data:size(2) * B <= 60 or B == 1, "batch_size respected")
    H.check(b.classes:size(1) == 1 and b.classes:size(2) == B, "one class frame per image")
    for j = 1, B do
      local k = kept[b.seqs[j]]
      H.near(b.sizes[j][1], k.h, 0, "sizes h")
      H.near(b.sizes[j][2], k.w, 0, "sizes w")
      H.near(b.lengths[j], k.h * k.w, 0, "lengths = pixels")
      local pic = b.data:select(3, j)
      H.near((pic:narrow(1, 1, k.h):narrow(2, 1, k.w) - k.x):abs():max(), 0, 1e-6, "image")
      H.near(pic:abs():sum() - k.x:abs():sum(), 0, 1e-3, "zero padding")
      H.near(b.classes[1][j], k.c, 0, "class")
    end
    n, total = n + 1, total + B
  end
  H.check(total == 7 and n >= 3, "all images batched")
  local roundtrip = tmp("img2.h5")
  rl.dataset_write(roundtrip, ds)
  local back = rl.dataset{class = "hdf", files = roundtrip}
  H.near((back:get_seq(5).data - kept[5].x):abs():max(), 0, 1e-6, "dataset_write keeps images")
end)

H.expect_error("chunking images", function()
  write_images(tmp("img3.h5"), 2, 2)
  local ds = rl.dataset{class = "hdf", files = tmp("img3.h5")}
  rl.batches(ds, {chunking = "2:1"})()
end, "chunking does not apply")

H.expect_error("images vs sequences", function()
  write_images(tmp("img4.h5"), 2, 3)
  local ds = rl.dataset{class = "hdf", files = tmp("img4.h5")}
  rl.check_dataset_dims(ds, {data = {dim = 2}, classes = {dim = 3, sparse = true}})
end, "holds images, the network expects sequences")

H.test("rl.train on tiny images", function()
  write_images(tmp("train.h5"), 60, 4)
  write_images(tmp("dev.h5"), 20, 5)
  local r = rl.train({
    network = {
      conv = {class = "conv2d", n_out = 4, filter_size = 2, activation = "relu"},
      gp = {class = "global_pool", mode = "max", from = "conv"},
      output = {class = "softmax", from = "gp", loss = "ce", target = "classes"},
    },
    train = {class = "hdf", files = tmp("train.h5"), seq_ordering = "random"},
    dev = {class = "hdf", files = tmp("dev.h5")},
    num_epochs = 6, batch_size = 200, max_seqs = 8, learning_rate = 0.05,
    log_verbosity = 0,
  }, {})
  H.check(r.dev_error <= 0.1, "dev error " .. tostring(r.dev_error))
end)

H.done()
