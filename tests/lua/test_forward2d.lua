-- The forward task on an image network writes each layer's output in its own geometry: image
-- layers as images of their sizes, layers after a collapse as sequences of the widths.
local H = dofile("tests/lua/harness.lua")

local dir = os.tmpname()
os.remove(dir)
require("lfs").mkdir(dir)

H.test("forward task on 2-D and collapsed layers", function()
  local w = rl.hdf_writer(dir .. "/img.h5", {data_dim = 1, spatial = 2,
                                             targets = {classes = {dim = 3, sparse = true}}})
  rl.manual_seed(3)
  local sizes = {}
  for i = 1, 5 do
    local h, wd = 3 + i % 3, 4 + i % 2
    sizes[i] = {h, wd}
    w:add("img" .. i, rl.rand(h, wd, 1), {classes = rl.tensor({i % 3}, "int32")})
  end
  w:close()
  rl.train{network = {
      conv = {class = "conv2d", n_out = 4, filter_size = {3, 3}, from = "data"},
      col = {class = "collapse", mode = "max", from = "conv"},
      pool = {class = "global_pool", mode = "mean", from = "conv"},
      output = {class = "softmax", from = "pool", loss = "ce", target = "classes"},
      side = {class = "softmax", from = "col", n_out = 3, is_output_layer = true},
    },
    train = {class = "hdf", files = {dir .. "/img.h5"}}, num_epochs = 1, model = dir .. "/m",
    optimizer = {class = "adam"}, learning_rate = 1e-3, log_verbosity = 0}
  for _, layer in ipairs{"conv", "col"} do
    local out = dir .. "/" .. layer .. ".h5"
    rl.forward{model = dir .. "/m.001.h5", data = {class = "hdf", files = {dir .. "/img.h5"}},
               layer = layer, output_file = out, log_verbosity = 0}
    local ds = rl.dataset{class = "hdf", files = {out}}
    ds:init_epoch(1)
    H.check(ds:num_seqs() == 5, layer .. ": one entry per image")
    for i = 1, 5 do
      local s = ds:get_seq(i)
      local h, wd = sizes[i][1], sizes[i][2]
      if layer == "conv" then
        H.check(s.data:size(1) == h and s.data:size(2) == wd and s.data:size(3) == 4,
          string.format("conv image %d: %s, expected (%d, %d, 4)", i, tostring(s.data:size()), h, wd))
      else
        H.check(s.data:size(1) == wd and s.data:size(2) == 4,
          string.format("col sequence %d: %s, expected (%d, 4)", i, tostring(s.data:size()), wd))
      end
    end
  end
end)

for f in require("lfs").dir(dir) do
  if f ~= "." and f ~= ".." then os.remove(dir .. "/" .. f) end
end
require("lfs").rmdir(dir)
H.done()
