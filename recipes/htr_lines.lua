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
-- Data (recipes/htr_lines_data.lua, converted once to out/htr_lines/data; 1.8 minutes on a
-- quiet 2-core machine): 16000 training, 300 dev and 1000 test lines of 4..32 characters, each
-- drawn in one of 15 training fonts with its own slant, stretch, stroke, baseline jitter and
-- noise, height 32..48; the 1000 test texts are drawn again in the held-out font (Rufscript).
--
-- Network: image (H, W, B, 1) -> conv2d 3x3, 16, relu -> max pool 2x2 -> conv2d 3x3, 32, relu
-- -> max pool 2x1 (height only: a narrow font gives ~5 pixels a character, so the width is
-- halved only once and every character keeps 2 or more frames) -> MDLSTM, 4 directions of 16
-- (64) -> collapse (sum over the height) -> 2 BLSTM layers of 2 x 128 -> softmax with CTC over
-- the 62 characters and the blank.
--
-- Training: Adam at ++lr (1e-3: 3e-3 leaves CTC's early all-blank output sooner but then
-- learns far worse, updates skipped for exploding gradients; docs/recipes.md), newbob on the dev
-- label error (see learning_rate_control below), batches of up
-- to 16 lines, the training lines in 4 sub-epochs a pass (partition_epoch), lines of similar
-- width batched together (laplace ordering), each line augmented on the fly from sub-epoch
-- ++aug_from on (slant, size, rotation, elastic, stroke width, masks: AUGMENT in
-- recipes/htr_lines_data.lua; dev, test and the held-out font are not augmented); the dev
-- label error rate is the engine's, after each sub-epoch. Training stops at the first sub-epoch
-- end after which another would overrun ++minutes (or after ++num_epochs); then the last model
-- is scored on the test lines and on the held-out font with best-path decoding, and with prefix
-- beam search (beam 8) fused with a character n-gram LM:
--   test CER X% (with LM Y%)            (edit distance / reference characters, 1000 test lines)
--   held-out font CER X% (with LM Y%)   (the same texts in the held-out font)
--
-- The LM (++lm order, default 7; ++lm 0: none; recipes/lm_fusion.lua, shared with
-- speech_digits): an interpolated Witten-Bell character n-gram (rl.ngram_estimate, ARPA, written
-- once to out/htr_lines/data/lm<order>-<first>-<last>.arpa) of the corpus
-- lines after the first n_test + n_dev of recipes/htr_lines_data.lua's seeded order: the test
-- texts (which are also the held-out font's texts) and the dev texts are those first lines, so
-- the LM never saw a test, held-out-font or dev line; it did see the training lines and the
-- rest of the Bible's lines that are not rendered. Spaces are the token <sp>. Its weight and
-- insertion bonus are chosen on the dev lines (a grid of weights x bonuses, lowest dev CER).
--
-- Measured (docs/recipes.md): 30 minutes on the 2 cores of a quiet Zen 4 EPYC, ++precision bf16:
-- 27 sub-epochs, test CER 4.59% (with LM 2.02%), held-out font CER 14.55% (with LM 7.45%).
local t_start = rl.clock()
local D = dofile("recipes/htr_lines_data.lua")

local SE = dofile("recipes/sub_epochs.lua")
local options = {
  {"out", "string", "out/htr_lines", "directory of the data, the model and its log"},
  {"smoke", "boolean", false, "a handful of lines, a tiny network, one sub-epoch: seconds"},
  {"augment", "integer", 1, "1: augmentation on the fly in training, 0: none"},
  {"lm", "integer", 7, "order of the character n-gram LM fused in beam search (0: no LM)"},
  {"aug_from", "integer", 6, "the first sub-epoch that is augmented (augment.from_epoch)"},
  {"lr", "number", 1e-3, "Adam's learning rate (newbob on the dev label error)"},
  {"freq_warp", "number", 0, "vertical warp of the lines' proportions (augment spec.freq_warp, "
    .. "0..0.2)"},
}
table.move(SE.OPTIONS, 1, #SE.OPTIONS, #options + 1, options)
local opt, argv = require("rnnlua.cli").parse({
  usage = "rnnlua recipes/htr_lines.lua [++key value ...]",
  about = "Handwritten text lines read by conv/MDLSTM/BLSTM with CTC (recipes/htr_lines.lua).",
  options = options, train = true}, arg)
if opt.smoke and opt.load == "" then opt.num_epochs = 1 end
if math.type(opt.aug_from) ~= "integer" or opt.aug_from < 1 then
  error(string.format("htr_lines: aug_from= wants a sub-epoch >= 1, got %s",
    tostring(opt.aug_from)), 0)
end
-- the augmentation's own check of the warp, before any data is made
rl.augment.config({spec = {freq_warp = opt.freq_warp}}, "htr_lines: freq_warp= augment")
if not (opt.lr > 0) then
  error(string.format("htr_lines: lr= wants a learning rate > 0, got %s", tostring(opt.lr)), 0)
end
if opt.lm < 0 then
  error(string.format("htr_lines: lm= wants an order >= 1 (0: no LM), got %d", opt.lm), 0)
end

local sizes = opt.smoke and D.SMOKE or {n_train = 16000, n_dev = 300, n_test = 1000}
local info = D.prepare(opt.out .. "/data", sizes)
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

-- the smoke run's one sub-epoch is augmented, so that it exercises the augmentation
local augment = {from_epoch = opt.smoke and 1 or opt.aug_from}
for k, v in pairs(D.AUGMENT) do augment[k] = v end
if opt.freq_warp > 0 then
  augment.spec = {freq_warp = opt.freq_warp}
  for k, v in pairs(D.AUGMENT.spec) do augment.spec[k] = v end
end

local model_dir = opt.out .. (opt.smoke and "/smoke" or "/model")
local config = {
  network = network,
  extern_data = {data = {dim = 1, spatial = 2}, classes = {dim = n_labels, sparse = true}},
  train = {class = "hdf", files = info.train, seq_ordering = "laplace:.64",
           partition_epoch = opt.smoke and 1 or 4, seed = 1,
           augment = opt.augment ~= 0 and augment or nil},
  dev = {class = "hdf", files = {info.dev}},
  batch_size = 48 * 1000 * 16, -- pixels of the padded batch (max height x max width x lines)
  max_seqs = 16,
  optimizer = {class = "adam"},
  learning_rate = opt.lr,
  -- newbob on the dev label error (x0.7 when its relative fall over the last 4 sub-epochs is
  -- under 1%, decided every 2nd): 30 minutes on one core, beside a run of the fixed decay it
  -- replaces (x0.8 a sub-epoch after the 8th), gave test CER 2.95% (1.04% with LM) and
  -- held-out font 16.42% (10.38%) against 4.87% (1.91%) and 21.01% (12.41%)
  learning_rate_control = "newbob_multi_epoch",
  learning_rate_control_error_measure = "dev_ler",
  newbob_multi_num_epochs = 4,
  newbob_multi_update_interval = 2,
  newbob_learning_rate_decay = 0.7,
  min_learning_rate = 1e-5,
  model = model_dir .. "/net",
  log_file = model_dir .. "/train.log",
  log_verbosity = 2,
  num_threads = 2,
  seed = 1,
}

-- One rl.train call per sub-epoch, each resuming from the last one's checkpoint (bit-exact on
-- the CPU), so that training can stop on the clock between sub-epochs.
local r, history, train_time = SE.run("htr_lines", config, argv, opt)

-- The character LM's ARPA file (made once per order and corpus size), or nil for lm=0.
local F = dofile("recipes/lm_fusion.lua")
local function char_lm()
  if opt.lm == 0 then return nil end
  local lines = D.lines(sizes.seed or 1)
  local first = sizes.n_test + sizes.n_dev + 1 -- the test/font and dev texts come first
  local last = opt.smoke and math.min(#lines, first + 2999) or #lines
  return F.char_lm(string.format("%s/data/lm%d-%d-%d.arpa", opt.out, opt.lm, first, last),
    table.move(lines, first, last, 1, {}), info.labels, opt.lm)
end

local function outputs(file)
  return F.outputs(r.net, rl.dataset{class = "hdf", files = {file}},
    {batch_size = config.batch_size, max_seqs = config.max_seqs})
end
local function cer(outs, decode)
  return F.score(outs, decode).label_error_rate
end

local lm_file = char_lm()
local best_path = {blank = n_labels}
local test_out, font_out = outputs(info.test), outputs(info.font)
local test_cer, font_cer = cer(test_out, best_path), cer(font_out, best_path)
local lm_opts, dev_note
if lm_file then
  lm_opts, dev_note = F.tune(outputs(info.dev), lm_file, info.labels, nil, "label_error_rate",
    "CER")
end
local function with_lm(outs)
  return lm_opts and string.format(" (with LM %.2f%%)", 100 * cer(outs, lm_opts)) or ""
end
print()
if opt.score ~= "" then
  print(string.format("htr_lines: scored %s (%d parameters)", opt.score, r.net:num_params()))
else
  print(string.format("htr_lines: %d sub-epochs, %d parameters, training %.1f min, %.1f min in "
    .. "all; last dev label error rate %.2f%%", #history, r.net:num_params(), train_time / 60,
    (rl.clock() - t_start) / 60, 100 * history[#history].dev_error))
end
if dev_note then print("htr_lines: " .. dev_note) end
print(string.format("test CER %.2f%%%s", 100 * test_cer, with_lm(test_out)))
print(string.format("held-out font CER %.2f%%%s (%s)", 100 * font_cer, with_lm(font_out),
  info.held_out_font))
