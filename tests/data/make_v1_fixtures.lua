-- Makes the fixtures of files written by rnnlua before checkpoint version 2 (variable-length
-- string attributes and /seqTags): tests/data/checkpoint_v1.h5 and tests/data/dataset_v1.h5,
-- read back by tests/lua/test_checkpoint.lua and test_datasets.lua. Run once with an rnnlua of
-- that time (the main branch before the change): `rnnlua tests/data/make_v1_fixtures.lua`.
-- It prints the figures the tests compare with.
rl.manual_seed(5)
local desc = {
  fw = {class = "lstm", n_out = 3, from = "data"},
  output = {class = "softmax", from = "fw", loss = "ce", target = "classes"},
}
local ext = {data = {dim = 2}, classes = {dim = 3, sparse = true}}
local net = rl.network(desc, ext)
local opt = rl.optimizer({class = "adam"}, net:params(), net:grads())
local lrc = rl.lr_control({learning_rate = 0.01, learning_rate_control = "newbob"})
local x = rl.randn(4, 2, 2)
local y = rl.tensor({{0, 1}, {2, 0}, {1, 1}, {0, 2}}, "int32")
local len = rl.tensor({4, 3}, "int32")
for _ = 1, 2 do
  net:zero_grads()
  net:forward{data = x, classes = y, lengths = len}
  net:backward()
  opt:step(lrc:lr(1, 1))
end
lrc:epoch_done(1, {dev_score = 0.5, dev_error = 0.1, train_score = 0.6})
rl.save_checkpoint("tests/data/checkpoint_v1.h5",
  {net = net, optimizer = opt, lr_control = lrc, epoch = 3, step = 5})
print(string.format("params %d sum %.17g", net:num_params(), net:params():double():sum()))
local seqs = {}
for i = 1, 3 do
  seqs[i] = {tag = "seq-" .. i .. "-ü", data = rl.randn(i + 1, 2),
             classes = rl.tensor({0, 1, 2, 1}, "int32"):narrow(1, 1, i + 1)}
end
rl.dataset_write("tests/data/dataset_v1.h5", seqs,
  {extern_data = {data = {dim = 2}, classes = {dim = 3, sparse = true}}})
local s = 0
for i = 1, 3 do s = s + seqs[i].data:double():sum() end
print(string.format("dataset data sum %.17g", s))
