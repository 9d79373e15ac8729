-- Fashion-MNIST (28x28 grey images of 10 kinds of clothing) classified by an MDLSTM network on
-- the CPU. Goal: >= 89% test accuracy within 30 minutes of training on 2 cores.
--
-- Data: Debian's dataset-fashion-mnist package (installed when missing), converted once to
-- out/fashion_mnist/{train,test}.h5 in rnnlua's image layout (/seqSizes beside RETURNN's
-- layout; see recipes/fashion_mnist_data.lua and lua/rnnlua/datasets.lua).
--
-- Network: images (28, 28, B, 1) -> conv2d 3x3, 32, relu -> max pool 2x2 (14x14) -> MDLSTM, 4
-- directions of 16 units each (concatenated: 64) -> max pool 2x2 (7x7) -> conv2d 3x3, 64, relu
-- -> global max pooling (one frame per image) -> softmax over the 10 classes.
--
-- Training: 60000 images in random order, batches of 32, Adam with a fixed decaying learning
-- rate (no decision looks at the test set); the test set is scored after every epoch (its
-- "dev error" is the test error rate: one frame per image). Options from the command line,
-- e.g. ./rnnlua recipes/fashion_mnist_mdlstm.lua ++num_epochs 2 ++train.partition_epoch 10
--
-- Measured (2 shared cores, other jobs running): test accuracy 86.3, 88.0, 88.3, 90.25% after
-- epochs 1-4, 14.2 min of training in all (110 s per epoch on a quiet machine, 230-265 s with
-- other jobs on the cores). The row BLSTM baseline reached 88.9% after 6 epochs (6.0 min).
local t0 = rl.clock()
local _, argv = require("rnnlua.cli").parse({
  usage = "rnnlua recipes/fashion_mnist_mdlstm.lua [++key value ...]",
  about = "Fashion-MNIST classified by an MDLSTM network.", train = true}, arg)
local out = "out/fashion_mnist"
local data = dofile("recipes/fashion_mnist_data.lua")(out)

local r = rl.train({
  network = {
    conv1 = {class = "conv2d", n_out = 32, filter_size = {3, 3}, activation = "relu"},
    pool1 = {class = "pool2d", mode = "max", pool_size = {2, 2}, from = "conv1"},
    mdlstm = {class = "mdlstm", n_out = 16, from = "pool1"},
    pool2 = {class = "pool2d", mode = "max", pool_size = {2, 2}, from = "mdlstm"},
    conv2 = {class = "conv2d", n_out = 64, filter_size = {3, 3}, activation = "relu",
             from = "pool2"},
    pooled = {class = "global_pool", mode = "max", from = "conv2"},
    output = {class = "softmax", loss = "ce", target = "classes", from = "pooled"},
  },
  extern_data = {data = {dim = 1, spatial = 2}, classes = {dim = 10, sparse = true}},
  train = {class = "hdf", files = {data.train}, seq_ordering = "random", seed = 1},
  dev = {class = "hdf", files = {data.test}},
  num_epochs = 6,
  batch_size = 28 * 28 * 32,
  max_seqs = 32,
  optimizer = {class = "adam"},
  learning_rate = 2e-3,
  learning_rate_control = function(epoch) return 2e-3 * 0.8 ^ (epoch - 1) end,
  model = out .. "/mdlstm/net",
  log_file = out .. "/mdlstm/train.log",
  log_verbosity = 2,
  num_threads = 2,
  seed = 1,
}, argv)

local train_time = 0
for _, h in ipairs(r.history) do train_time = train_time + h.time end
print()
print(string.format("fashion-mnist MDLSTM: test accuracy %.2f%% after %d epochs; training %.1f "
  .. "min (%.1f s per epoch), %.1f min in all", 100 * (1 - r.dev_error), r.epoch,
  train_time / 60, train_time / math.max(#r.history, 1), (rl.clock() - t0) / 60))
