-- Fashion-MNIST for the recipes fashion_mnist_mdlstm.lua and fashion_mnist_blstm.lua: returns a
-- function prepare(out_dir) -> paths {train =, test =, train_rows =, test_rows =}.
--
-- The idx files come from Debian's package dataset-fashion-mnist (/usr/share/datasets/
-- fashion-mnist/*-idx?-ubyte.gz); when they are missing, prepare installs the package with
-- apt-get (as root or through sudo -n) and stops with a clear message if that fails. They are
-- converted once to the HDF5 dataset layout (out_dir/*.h5, kept for later runs):
--   train.h5, test.h5            images: data (28, 28, 1) pixel/255 per image, with /seqSizes
--                                (see lua/rnnlua/datasets.lua), classes: one frame per image
--   train_rows.h5, test_rows.h5  the same images as sequences of 28 rows of 28 features, the
--                                class repeated on every row (the row-by-row BLSTM baseline)
-- Tags are "train-N" / "test-N" (N = 0-based position in the idx file).
local SRC = "/usr/share/datasets/fashion-mnist"
local FILES = {
  train = {"train-images-idx3-ubyte.gz", "train-labels-idx1-ubyte.gz"},
  test = {"t10k-images-idx3-ubyte.gz", "t10k-labels-idx1-ubyte.gz"},
}
local LABELS = {"T-shirt/top", "Trouser", "Pullover", "Dress", "Coat", "Sandal", "Shirt",
                "Sneaker", "Bag", "Ankle boot"}

local function exists(path)
  local f = io.open(path, "rb")
  if f then f:close() end
  return f ~= nil
end

local function ensure_package()
  if exists(SRC .. "/" .. FILES.test[1]) then return end
  print("fashion-mnist: " .. SRC .. " is missing; installing dataset-fashion-mnist with apt-get")
  local sudo = io.popen("id -u"):read("*l") == "0" and "" or "sudo -n "
  local ok = os.execute(sudo .. "apt-get install -y dataset-fashion-mnist >/dev/null 2>&1")
    or os.execute(sudo .. "apt-get update >/dev/null 2>&1 && " .. sudo
      .. "apt-get install -y dataset-fashion-mnist >/dev/null 2>&1")
  if not ok or not exists(SRC .. "/" .. FILES.test[1]) then
    error("fashion-mnist: could not install the Debian package dataset-fashion-mnist (needs "
      .. "root or password-less sudo and a reachable mirror); install it by hand: "
      .. "apt-get install dataset-fashion-mnist", 0)
  end
end

local function read_gz(path)
  local p = io.popen("gzip -dc '" .. path .. "'", "r")
  local s = p:read("a")
  p:close()
  if not s or #s < 8 then error("fashion-mnist: cannot read " .. path, 0) end
  return s
end

local function be32(s, pos)
  local a, b, c, d = s:byte(pos, pos + 3)
  return ((a * 256 + b) * 256 + c) * 256 + d
end

local function convert(split, out_dir)
  local img = read_gz(SRC .. "/" .. FILES[split][1])
  local lab = read_gz(SRC .. "/" .. FILES[split][2])
  if be32(img, 1) ~= 2051 or be32(lab, 1) ~= 2049 then
    error("fashion-mnist: " .. split .. ": not idx image/label files", 0)
  end
  local n, rows, cols = be32(img, 5), be32(img, 9), be32(img, 13)
  if be32(lab, 5) ~= n then error("fashion-mnist: " .. split .. ": image/label counts differ", 0) end
  local wi = rl.hdf_writer(out_dir .. "/" .. split .. ".h5", {data_dim = 1, spatial = 2,
    targets = {classes = {dim = 10, sparse = true}}, target_labels = {classes = LABELS}})
  local wr = rl.hdf_writer(out_dir .. "/" .. split .. "_rows.h5", {data_dim = cols,
    targets = {classes = {dim = 10, sparse = true}}, target_labels = {classes = LABELS}})
  local px = rows * cols
  local one = rl.zeros({1}, "int32")
  local rowcls = rl.zeros({rows}, "int32")
  for i = 0, n - 1 do
    local base = 17 + i * px
    local v = {img:byte(base, base + px - 1)}
    local x = rl.tensor(v):mul_(1 / 255)
    local c = lab:byte(9 + i)
    one:fill_(c)
    rowcls:fill_(c)
    local tag = string.format("%s-%d", split, i)
    wi:add(tag, x:view(rows, cols, 1), {classes = one})
    wr:add(tag, x:view(rows, cols), {classes = rowcls})
  end
  wi:close()
  wr:close()
  return n
end

return function(out_dir)
  local lfs = require("lfs")
  local cur = ""
  for part in out_dir:gmatch("[^/]+") do
    cur = cur .. part
    lfs.mkdir(cur)
    cur = cur .. "/"
  end
  local paths = {}
  for _, split in ipairs({"train", "test"}) do
    paths[split] = out_dir .. "/" .. split .. ".h5"
    paths[split .. "_rows"] = out_dir .. "/" .. split .. "_rows.h5"
    if not (exists(paths[split]) and exists(paths[split .. "_rows"])) then
      ensure_package()
      local t0 = rl.clock()
      local n = convert(split, out_dir)
      print(string.format("fashion-mnist: converted %d %s images to %s (%.1f s)", n, split,
        paths[split], rl.clock() - t0))
    end
  end
  return paths
end
