-- Fashion-MNIST, the row-by-row baseline for recipes/fashion_mnist_mdlstm.lua: each image is a
-- sequence of its 28 rows (28 features each), read by a bidirectional LSTM (2 x 64 units, two
-- layers); every row is trained with the image's class, and an image is classified by the sum
-- over its rows of the log posteriors. Same data (out/fashion_mnist/{train,test}_rows.h5, see
-- recipes/fashion_mnist_data.lua), batch size, optimizer and schedule as the MDLSTM recipe.
-- The engine's "dev error" is the test error per ROW; the image accuracy is computed here.
-- Pretraining as in RETURNN's BLSTM setups (pretrain = "default"): epoch 1 trains the first
-- BLSTM layer under the softmax, epoch 2 adds the second (its parameters copied over);
-- `++pretrain false` trains both layers from the start.
--
--   ./rnnlua recipes/fashion_mnist_blstm.lua [++layers N] [++key value ...]   (N BLSTM layers,
--                                                                              default 2)
local t0 = rl.clock()
local opt, argv = require("rnnlua.cli").parse({
  usage = "rnnlua recipes/fashion_mnist_blstm.lua [++key value ...]",
  about = "Fashion-MNIST read row by row by a BLSTM (the MDLSTM recipe's baseline).",
  options = {{"layers", "integer", 2, "BLSTM layers"}}, train = true}, arg)
local out = "out/fashion_mnist"
local data = dofile("recipes/fashion_mnist_data.lua")(out)

local depth = opt.layers
if depth < 1 then error("++layers: needs N >= 1", 0) end
local network, prev = {}, "data"
for i = 1, depth do
  network["fw" .. i] = {class = "lstm", n_out = 64, from = prev}
  network["bw" .. i] = {class = "lstm", n_out = 64, direction = -1, from = prev}
  prev = {"fw" .. i, "bw" .. i}
end
network.output = {class = "softmax", loss = "ce", target = "classes", from = prev}

local r = rl.train({
  network = network,
  train = {class = "hdf", files = {data.train_rows}, seq_ordering = "random", seed = 1},
  dev = {class = "hdf", files = {data.test_rows}},
  num_epochs = 12,
  batch_size = 28 * 32,
  max_seqs = 32,
  optimizer = {class = "adam"},
  learning_rate = 2e-3,
  learning_rate_control = function(epoch) return 2e-3 * 0.8 ^ (epoch - 1) end,
  model = out .. "/blstm/net",
  log_file = out .. "/blstm/train.log",
  log_verbosity = 2,
  num_threads = 2,
  seed = 1,
  pretrain = "default",
}, argv)

-- image accuracy on the test set: argmax of the summed log posteriors of the rows
local net, ds = r.net, rl.dataset{class = "hdf", files = {data.test_rows}}
ds:init_epoch(1)
local right, total = 0, 0
for batch in rl.batches(ds, {batch_size = 28 * 256, max_seqs = 256}) do
  net:forward(batch, {train = false})
  local post = net:layer("output").output -- (28, B, 10), all rows valid
  local guess = post:log():sum(1):argmax(2) -- (B), 1-based
  local cls = batch.classes:select(1, 1)     -- (B), 0-based
  for b = 1, cls:size(1) do
    if guess[b] - 1 == cls[b] then right = right + 1 end
    total = total + 1
  end
end

local train_time = 0
for _, h in ipairs(r.history) do train_time = train_time + h.time end
print()
print(string.format("fashion-mnist row BLSTM: test accuracy %.2f%% (%d images; row accuracy "
  .. "%.2f%%) after %d epochs; training %.1f min (%.1f s per epoch), %.1f min in all",
  100 * right / total, total, 100 * (1 - r.dev_error), r.epoch, train_time / 60,
  train_time / math.max(#r.history, 1), (rl.clock() - t0) / 60))
