-- The demo (`make demo`): a bidirectional LSTM learns the 12AX task, then the forward task
-- writes its outputs on the dev set. Under 10 seconds on 2 cores (below 1% dev frame error
-- from epoch 3 or 4 on).
--
-- 12AX: inputs are symbols of "123ABCXYZ"; the target is R at an X right after an A when the
-- last digit seen was 1, and at a Y right after a B when it was 2, L elsewhere. The net has to
-- remember the last digit over many frames: a plain feed-forward net cannot.
--
-- Everything can be changed from the command line, e.g.
--   ./rnnlua recipes/12ax_blstm.lua ++num_epochs 5 ++model /tmp/x/net ++train.num_seqs 500
-- and a run that was stopped continues with ++load last (--help lists every key).
local t0 = rl.clock()
local out = "out/12ax"

local config = {
  network = {
    fw = {class = "lstm", n_out = 32},
    bw = {class = "lstm", n_out = 32, direction = -1},
    output = {class = "softmax", from = {"fw", "bw"}, loss = "ce", target = "classes"},
  },
  train = {class = "12ax", num_seqs = 1000, seed = 1, seq_ordering = "laplace:20"},
  dev = {class = "12ax", num_seqs = 200, seed = 2},
  num_epochs = 8,
  batch_size = 2500,
  max_seqs = 25,
  optimizer = {class = "adam", gradient_clip_global_norm = 5},
  learning_rate = 0.01,
  learning_rate_control = "newbob",
  newbob_learning_rate_decay = 0.7,
  model = out .. "/net",
  log_file = out .. "/train.log",
  log_verbosity = 2,
  seed = 1,
}

local r = rl.train(config)
local cfg = r.config

-- The dev set as an HDF5 file in RETURNN's layout, and the forward task on it.
local dir = cfg.model:match("^(.*)/[^/]*$") or "."
local dev_file = dir .. "/dev.h5"
local fwd_file = dir .. "/dev_output.h5"
rl.dataset_write(dev_file, rl.dataset(cfg.dev))
rl.forward{model = r.checkpoint, data = {class = "hdf", files = {dev_file}}, layer = "output",
           output_file = fwd_file}

print()
print(string.format("final dev frame error rate: %.2f%% (dev score %.4f) after %d epochs, %.1f s",
  100 * r.dev_error, r.dev_score, r.epoch, rl.clock() - t0))
print("checkpoints:     " .. cfg.model .. ".NNN.h5 (last: " .. r.checkpoint .. ")")
print("learning curve:  " .. r.learning_curve_file)
print("log:             " .. tostring(cfg.log_file))
print("dev set (HDF5):  " .. dev_file)
print("forward output:  " .. fwd_file .. "  (layer 'output', one entry per dev sequence)")
print("again from the shell: ./rnnlua forward ++model " .. r.checkpoint .. " ++data "
  .. dev_file .. " ++layer output ++output fwd.h5")
