-- Spoken digit strings (in the manner of TIDIGITS) synthesized with espeak-ng and Festival over
-- many voices, made noisy and reverberant with sox, recognized by a BLSTM trained with CTC on
-- characters. Goals: test WER <= 5% on held-out voices within 30 minutes of training on 2 cores;
-- the Flite synthesizer, which no training utterance comes from, scored apart.
--
--   ./rnnlua recipes/speech_digits.lua [++minutes 30] [++num_epochs N] [++out DIR] [++key v]
--   ./rnnlua recipes/speech_digits.lua ++smoke [++out DIR]  a few utterances, a tiny network
--   ./rnnlua recipes/speech_digits.lua ++score out/speech_digits/model/net.008.h5  only scores
--   ./rnnlua recipes/speech_digits.lua ++load out/speech_digits/model/net.004.h5 ++minutes 10
--   ./rnnlua recipes/speech_digits.lua ++augment 0   trains without the augmentation on the fly
--   ./rnnlua recipes/speech_digits.lua --help   every option
--
-- Data (recipes/speech_digits_data.lua, made once in out/speech_digits/data): 12000 training and
-- 300 dev utterances of 1..7 digits, 70% in 90 espeak-ng voice variants x 8 English accents and
-- 30% in 3 Festival voices, with their own speed, pitch, word gaps, reverberation and noise; 1000
-- test utterances in 10 held-out espeak-ng variants, and 1000 "synth" utterances spoken only by
-- Flite (3 voices). Lists "wav/...wav<TAB>three oh five" read by the audio dataset
-- ({class = "audio"}), which computes 40 log-mel features (25 ms windows every 20 ms, Kaldi's
-- snip_edges = false) once into HDF5 caches (out/speech_digits/cache), each utterance normalised
-- by its own mean and variance (++norm utterance; ++norm global: the training set's): that takes
-- out a voice's or channel's average spectrum, which the held-out synthesizer's differs in
-- (its WER 14.33% with the global statistics against 10.44%, docs/recipes.md).
--
-- Augmentation on the fly (the training set's augment option, drawn anew each sub-epoch; see
-- AUGMENT below), from the sub-epoch after the first 2000 training utterances on (a CTC model
-- first has to leave its all-blank output, which augmented data delays): tempo perturbation
-- 0.9..1.1 (the pitch kept) of 50% of the utterances and added white, pink or brown noise at
-- 10..30 dB SNR to 30% (these read the utterance's WAV file again), then SpecAugment: 2 time
-- masks of up to 4 frames and 2 frequency masks of up to 6 mels. The data already varies in
-- speaking rate, pitch and noise (recipes/speech_digits_data.lua), so the augmentation is mild:
-- speed 0.9..1.1 on 60% and noise at 5..25 dB on 40% from the first sub-epoch trained worse in
-- short runs (docs/recipes.md).
--
-- Network: 40 log-mels -> 2 BLSTM layers of 2 x 128 -> softmax with CTC over the 16 characters
-- of the digit words (space, e f g h i n o r s t u v w x z) and the blank (572k parameters).
--
-- Training: Adam 2e-3, newbob on the dev label error (x0.7 when its relative fall, averaged over
-- the last 4 sub-epochs, is under 1%; decided every 2nd sub-epoch; floor 1e-5), so that the rate
-- follows the model however many sub-epochs the budget holds on the machine (++schedule decay:
-- x0.8 per 3000 utterances after the first 12000, which on a fast machine is down to 1e-5 after
-- a quarter of the budget), global gradient norm clipped at 5, up to 32 utterances a batch of
-- similar length (laplace ordering), the training set in 4 sub-epochs a pass. One rl.train call
-- per sub-epoch, each resuming from the last checkpoint, so training stops on the clock between
-- sub-epochs. Then the last model is scored with best-path decoding, and with prefix beam search
-- (beam 8) fused with a character n-gram LM:
--   test WER X% (with LM X'%)       (word edit distance / reference words, 1000 utterances of
--                                    held-out espeak-ng voices)
--   held-out synthesizer WER Y% (with LM Y'%)  (the same over the 1000 Flite utterances; then
--                                    each Flite voice's)
--   test CER Z%                     (character edit distance / reference characters, best path)
--
-- The LM (++lm order, default 6; ++lm 0: none; recipes/lm_fusion.lua, shared with htr_lines):
-- an interpolated Witten-Bell character n-gram of the training transcripts, written once to
-- DATA/lm<order>-<n_train>.arpa. The digits of a string are drawn independently, so it knows
-- nothing of which digit comes next: what it knows is how the digit words are spelt, and most
-- errors of a character CTC model on an unfamiliar voice are misspellings (264 of the 427 word
-- errors of a 30-minute model on the Flite set: "seve", "zer", "eigh"). Its weight and
-- insertion bonus are chosen on the dev set (the lowest dev WER of a grid).
--
-- Measured (docs/recipes.md): 30 minutes on the 2 cores of a quiet Zen 4 EPYC: 136 sub-epochs,
-- test WER 1.09% (with LM 0.66%), held-out synthesizer WER 10.61% (with LM 5.94%), test CER
-- 0.51%, dev label error 1.26%.
local t_start = rl.clock()
local D = dofile("recipes/speech_digits_data.lua")

local SE = dofile("recipes/sub_epochs.lua")
local options = {
  {"out", "string", "out/speech_digits", "directory of the data, features, model and log"},
  {"smoke", "boolean", false, "a few utterances, a tiny network, one sub-epoch: seconds"},
  {"augment", "integer", 1, "1: augmentation on the fly in training, 0: none"},
  {"n_train", "integer", 12000, "training utterances synthesized"},
  {"units", "integer", 128, "LSTM units of each direction and layer"},
  {"norm", "string", "utterance", "feature normalisation: utterance (each utterance's own mean "
    .. "and variance) or global (the training set's)"},
  {"perturb", "string", "tempo", "waveform perturbation: tempo (the pitch kept) or speed (pitch "
    .. "and formants move with it)"},
  {"freq_width", "integer", 6, "SpecAugment: the widest of the 2 frequency masks, in mels"},
  {"freq_warp", "number", 0, "SpecAugment: frequency warp (VTLP) by a factor in [1 - a, 1 + a]"},
  {"lm", "integer", 6, "order of the character n-gram LM fused in beam search (0: no LM)"},
  {"schedule", "string", "newbob", "learning rate: newbob (x0.7 when the dev label error stops "
    .. "falling) or decay (x0.8 per 3000 utterances after 12000)"},
}
table.move(SE.OPTIONS, 1, #SE.OPTIONS, #options + 1, options)
local opt, argv = require("rnnlua.cli").parse({
  usage = "rnnlua recipes/speech_digits.lua [++key value ...]",
  about = "Spoken digit strings recognized by a BLSTM with CTC (recipes/speech_digits.lua).",
  options = options, train = true}, arg)
if opt.smoke and opt.load == "" then opt.num_epochs = 1 end
if opt.units < 1 then
  error("speech_digits: ++units: wants a positive count, got " .. opt.units, 0)
end
if opt.norm ~= "global" and opt.norm ~= "utterance" then
  error("speech_digits: ++norm: wants global or utterance, got " .. opt.norm, 0)
end
if opt.perturb ~= "tempo" and opt.perturb ~= "speed" then
  error("speech_digits: ++perturb: wants tempo or speed, got " .. opt.perturb, 0)
end
if opt.lm < 0 then
  error("speech_digits: ++lm: wants an order >= 1 (0: no LM), got " .. opt.lm, 0)
end
if opt.freq_width < 0 or opt.freq_width > 40 then
  error("speech_digits: ++freq_width: wants 0..40 mels, got " .. opt.freq_width, 0)
end
-- the augmentation's own check of the warp, before any data is made
rl.augment.config({spec = {freq_warp = opt.freq_warp}}, "speech_digits: ++freq_warp: augment")
if opt.schedule ~= "decay" and opt.schedule ~= "newbob" then
  error("speech_digits: ++schedule: wants decay or newbob, got " .. opt.schedule, 0)
end

local data_dir = opt.out .. (opt.smoke and "/smoke_data" or "/data")
local info = D.prepare(data_dir, opt.smoke and D.SMOKE or {n_train = opt.n_train})
local FEATURES = {n_mels = 40, window_ms = 25, hop_ms = 20, snip_edges = false,
  normalize = opt.norm == "utterance"}
local cache = opt.out .. (opt.smoke and "/smoke_cache" or "/cache")
local function audio(split, extra)
  local cfg = {class = "audio", list = info[split], vocab = info.vocab, features = FEATURES,
    cache = cache .. "/" .. split .. ".h5"}
  if opt.norm == "global" then
    cfg.normalize = "global"
    cfg.norm_stats = split ~= "train" and cache .. "/train.h5" or nil
  end
  for k, v in pairs(extra or {}) do cfg[k] = v end
  return rl.dataset(cfg)
end
local partition = opt.smoke and 1 or 4
local sub_epoch_size = (opt.smoke and D.SMOKE.n_train or opt.n_train) // partition
local AUGMENT = {
  -- (the smoke mode's one sub-epoch is augmented, so that it runs every transform)
  from_epoch = opt.smoke and 1 or 1 + math.ceil(2000 / sub_epoch_size),
  [opt.perturb] = {p = 0.5, min = 0.9, max = 1.1},
  noise = {p = 0.3, files = info.noise, snr = {10, 30}},
  spec = {time_masks = 2, time_width = 4, freq_masks = 2, freq_width = opt.freq_width,
    freq_warp = opt.freq_warp},
}
local train = audio("train", {seq_ordering = "laplace:.64", partition_epoch = partition,
  augment = opt.augment ~= 0 and AUGMENT or nil})
local dev = audio("dev")

local H = opt.smoke and 8 or opt.units
local network = {
  fw1 = {class = "lstm", n_out = H}, bw1 = {class = "lstm", n_out = H, direction = -1},
  fw2 = {class = "lstm", n_out = H, from = {"fw1", "bw1"}},
  bw2 = {class = "lstm", n_out = H, direction = -1, from = {"fw1", "bw1"}},
  output = {class = "softmax", loss = "ctc", target = "classes", from = {"fw2", "bw2"}},
}
if opt.smoke then
  network.fw2, network.bw2 = nil, nil
  network.output.from = {"fw1", "bw1"}
end

local model_dir = opt.out .. (opt.smoke and "/smoke" or "/model")
local config = {
  network = network,
  extern_data = train:extern_data(),
  train = train,
  dev = dev,
  batch_size = 32 * 200, -- frames of the padded batch (longest utterance x utterances)
  max_seqs = 32,
  optimizer = {class = "adam", gradient_clip_global_norm = 5},
  learning_rate = 2e-3,
  model = model_dir .. "/net",
  log_file = model_dir .. "/train.log",
  log_verbosity = 2,
  num_threads = 2,
  seed = 1,
}

if opt.schedule == "decay" then
  -- x0.8 per 3000 training utterances after the first 12000: the decay follows the updates
  -- made, not the sub-epochs, whose size is n_train / 4
  config.learning_rate_control = function(epoch)
    local seen = epoch * sub_epoch_size
    return 2e-3 * 0.8 ^ math.max(0, (seen - 12000) / 3000)
  end
else
  -- newbob on the dev label error, its relative change averaged over the last 4 sub-epochs
  -- (one pass over the data) and decided every 2nd: the rate falls when the error stops
  -- falling, however many sub-epochs the time budget holds on this machine
  config.learning_rate_control = "newbob_multi_epoch"
  config.learning_rate_control_error_measure = "dev_ler"
  config.newbob_multi_num_epochs = 4
  config.newbob_multi_update_interval = 2
  config.newbob_learning_rate_decay = 0.7
  config.min_learning_rate = 1e-5
end

local r, history, train_time = SE.run("speech_digits", config, argv, opt)

-- Scoring: best-path decoding, and prefix beam search fused with a character n-gram LM of the
-- training transcripts (its weight and bonus chosen on dev).
local F = dofile("recipes/lm_fusion.lua")
local labels = train.vocab
local words = {labels = labels, words = true}
local function outputs(ds)
  return F.outputs(r.net, ds, {batch_size = config.batch_size, max_seqs = config.max_seqs})
end
local best_path = {blank = #labels}
local lm_decode, dev_note
if opt.lm > 0 then
  local texts = {}
  for line in io.lines(info.train) do texts[#texts + 1] = line:match("\t(.*)$") end
  local path = string.format("%s/lm%d-%d.arpa", data_dir, opt.lm, #texts)
  lm_decode, dev_note = F.tune(outputs(dev), F.char_lm(path, texts, labels, opt.lm), labels,
    words, "word_error_rate", "WER")
end
-- "X%", or "X% (with LM Y%)"
local function wer(outs)
  local function rate(decode) return 100 * F.score(outs, decode, words).word_error_rate end
  local s = string.format("%.2f%%", rate(best_path))
  return lm_decode and s .. string.format(" (with LM %.2f%%)", rate(lm_decode)) or s
end

local test_out = outputs(audio("test"))
local cer = F.score(test_out, best_path, {labels = labels}).label_error_rate
-- the held-out synthesizer's utterances by Flite voice (synth.voices: "wav/...<TAB>flite+v")
local voice_of = {}
for line in io.lines(data_dir .. "/synth.voices") do
  local path, voice = line:match("^(.-)\t(.*)$")
  voice_of[path] = voice
end
local by_voice = {}
for line in io.lines(info.synth) do
  local path, text = line:match("^(.-)\t(.*)$")
  local voice = voice_of[path]
  by_voice[voice] = by_voice[voice] or {}
  table.insert(by_voice[voice], {data_dir .. "/" .. path, text})
end
local synth_out, voice_wers = {}, {}
for _, v in ipairs(D.FLITE) do
  local list = by_voice["flite+" .. v]
  if list then
    local outs = outputs(audio("synth", {list = list, cache = cache .. "/synth-" .. v .. ".h5"}))
    table.move(outs, 1, #outs, #synth_out + 1, synth_out)
    voice_wers[#voice_wers + 1] = v .. " " .. wer(outs)
  else
    voice_wers[#voice_wers + 1] = v .. " -"
  end
end
print()
if opt.score ~= "" then
  print(string.format("speech_digits: scored %s (%d parameters)", opt.score, r.net:num_params()))
else
  print(string.format("speech_digits: %d sub-epochs, %d parameters, training %.1f min, %.1f min " ..
    "in all; last dev label error rate %.2f%%", #history, r.net:num_params(), train_time / 60,
    (rl.clock() - t_start) / 60, 100 * history[#history].dev_error))
end
if dev_note then print("speech_digits: " .. dev_note) end
print("test WER " .. wer(test_out))
print(string.format("held-out synthesizer WER %s (Flite: %s)", wer(synth_out),
  table.concat(voice_wers, ", ")))
print(string.format("test CER %.2f%% (held-out voices: %s)", 100 * cer,
  table.concat(D.HELD_OUT, ", ")))
