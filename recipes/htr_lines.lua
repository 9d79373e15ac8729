-- Handwritten text lines: King James Bible lines rendered in Debian's handwriting fonts, read by
-- a conv/MDLSTM/BLSTM network trained with CTC on the CPU (after RETURNN's IAM setups).
-- Goal: test CER <= 5% within 30 minutes of training on 2 cores.
--
--   ./rnnlua recipes/htr_lines.lua [++minutes 30] [++num_epochs N] [++out out/htr_lines] [++key v]
--   ./rnnlua recipes/htr_lines.lua ++smoke [++out DIR]  a handful of lines, a tiny network, seconds
--   ./rnnlua recipes/htr_lines.lua ++score out/htr_lines/model/net.008.h5  only scores a checkpoint
--   ./rnnlua recipes/htr_lines.lua ++load out/htr_lines/model/net.004.h5 ++minutes 20  trains on
--   ./rnnlua recipes/htr_lines.lua ++augment 0   trains without the augmentation on the fly
--   ./rnnlua recipes/htr_lines.lua --help   every option
--
-- Data (recipes/htr_lines_data.lua, converted once to out/htr_lines/data; 6 minutes on the
-- loaded machine): 16000 training, 300 dev and 1000 test lines of 4..32 characters, each drawn
-- in one of 8 training fonts with its own slant, stretch, stroke, baseline jitter and noise,
-- height 32..48; the 1000 test texts are drawn again in the held-out font (Rufscript).
--
-- Network: image (H, W, B, 1) -> conv2d 3x3, 16, relu -> max pool 2x2 -> conv2d 3x3, 32, relu
-- -> max pool 2x1 (height only: a narrow font gives ~5 pixels a character, so the width is
-- halved only once and every character keeps 2 or more frames) -> MDLSTM, 4 directions of 16
-- (64) -> collapse (sum over the height) -> 2 BLSTM layers of 2 x 128 -> softmax with CTC over
-- the 62 characters and the blank.
--
-- Training: Adam, batches of up to 16 lines, the training lines in 4 sub-epochs a pass
-- (partition_epoch), lines of similar width batched together (laplace ordering), each line
-- augmented on the fly (slant, size, rotation, elastic, stroke width, masks: AUGMENT in
-- recipes/htr_lines_data.lua; dev, test and the held-out font are not augmented); the dev label
-- error rate is the engine's, after each sub-epoch. Training stops at the first sub-epoch end
-- after which another would overrun ++minutes (or after ++num_epochs); then the last model is
-- scored on the test lines and on the held-out font with best-path decoding:
--   test CER X%               (edit distance / reference characters over the 1000 test lines)
--   held-out font CER Y%      (the same texts in the held-out font)
--
-- Measured (2 cores, quiet; docs/recipes.md): 15 sub-epochs in the 21-minute budget
-- (++minutes 21): test CER 4.11%, held-out font CER 20.88%.
local t_start = rl.clock()
local D = dofile("recipes/htr_lines_data.lua")

local SE = dofile("recipes/sub_epochs.lua")
local options = {
  {"out", "string", "out/htr_lines", "directory of the data, the model and its log"},
  {"smoke", "boolean", false, "a handful of lines, a tiny network, one sub-epoch: seconds"},
  {"augment", "integer", 1, "1: augmentation on the fly in training, 0: none"},
}
table.move(SE.OPTIONS, 1, #SE.OPTIONS, #options + 1, options)
local opt, argv = require("rnnlua.cli").parse({
  usage = "rnnlua recipes/htr_lines.lua [++key value ...]",
  about = "Handwritten text lines read by conv/MDLSTM/BLSTM with CTC (recipes/htr_lines.lua).",
  options = options, train = true}, arg)
if opt.smoke and opt.load == "" then opt.num_epochs = 1 end

local info = D.prepare(opt.out .. "/data", opt.smoke and D.SMOKE or
  {n_train = 16000, n_dev = 300, n_test = 1000})
local n_labels = #info.labels

local network
if opt.smoke then
  network = {
    conv1 = {class = "conv2d", n_out = 4, filter_size = {3, 3}, activation = "relu"},
    pool1 = {class = "pool2d", mode = "max", pool_size = {2, 2}, from = "conv1"},
    pool2 = {class = "pool2d", mode = "max", pool_size = {2, 1}, from = "pool1"},
    mdlstm = {class = "mdlstm", n_out = 2, from = "pool2"},
    collapse = {class = "collapse", mode = "sum", from = "mdlstm"},
    fw = {class = "lstm", n_out = 8, from = "collapse"},
    bw = {class = "lstm", n_out = 8, direction = -1, from = "collapse"},
    output = {class = "softmax", loss = "ctc", target = "classes", from = {"fw", "bw"}},
  }
else
  network = {
    conv1 = {class = "conv2d", n_out = 16, filter_size = {3, 3}, activation = "relu"},
    pool1 = {class = "pool2d", mode = "max", pool_size = {2, 2}, from = "conv1"},
    conv2 = {class = "conv2d", n_out = 32, filter_size = {3, 3}, activation = "relu",
             from = "pool1"},
    pool2 = {class = "pool2d", mode = "max", pool_size = {2, 1}, from = "conv2"},
    mdlstm = {class = "mdlstm", n_out = 16, from = "pool2"},
    collapse = {class = "collapse", mode = "sum", from = "mdlstm"},
    fw1 = {class = "lstm", n_out = 128, from = "collapse"},
    bw1 = {class = "lstm", n_out = 128, direction = -1, from = "collapse"},
    fw2 = {class = "lstm", n_out = 128, from = {"fw1", "bw1"}},
    bw2 = {class = "lstm", n_out = 128, direction = -1, from = {"fw1", "bw1"}},
    output = {class = "softmax", loss = "ctc", target = "classes", from = {"fw2", "bw2"}},
  }
end

local model_dir = opt.out .. (opt.smoke and "/smoke" or "/model")
local config = {
  network = network,
  extern_data = {data = {dim = 1, spatial = 2}, classes = {dim = n_labels, sparse = true}},
  train = {class = "hdf", files = info.train, seq_ordering = "laplace:.64",
           partition_epoch = opt.smoke and 1 or 4, seed = 1,
           augment = opt.augment ~= 0 and D.AUGMENT or nil},
  dev = {class = "hdf", files = {info.dev}},
  batch_size = 48 * 1000 * 16, -- pixels of the padded batch (max height x max width x lines)
  max_seqs = 16,
  optimizer = {class = "adam"},
  learning_rate = 1e-3,
  -- constant, then decaying over the sub-epochs that a 30-minute run reaches last
  learning_rate_control = function(epoch) return 1e-3 * 0.8 ^ math.max(0, epoch - 8) end,
  model = model_dir .. "/net",
  log_file = model_dir .. "/train.log",
  log_verbosity = 2,
  num_threads = 2,
  seed = 1,
}

-- One rl.train call per sub-epoch, each resuming from the last one's checkpoint (bit-exact on
-- the CPU), so that training can stop on the clock between sub-epochs.
local r, history, train_time = SE.run("htr_lines", config, argv, opt)

-- Character error rate of a file with best-path decoding.
local function cer(net, file)
  return rl.ctc_score(net, rl.dataset{class = "hdf", files = {file}},
    {batch_size = config.batch_size, max_seqs = config.max_seqs}).label_error_rate
end

local test_cer, font_cer = cer(r.net, info.test), cer(r.net, info.font)
print()
if opt.score ~= "" then
  print(string.format("htr_lines: scored %s (%d parameters)", opt.score, r.net:num_params()))
else
  print(string.format("htr_lines: %d sub-epochs, %d parameters, training %.1f min, %.1f min in "
    .. "all; last dev label error rate %.2f%%", #history, r.net:num_params(), train_time / 60,
    (rl.clock() - t_start) / 60, 100 * history[#history].dev_error))
end
print(string.format("test CER %.2f%%", 100 * test_cer))
print(string.format("held-out font CER %.2f%% (%s)", 100 * font_cer, info.held_out_font))
