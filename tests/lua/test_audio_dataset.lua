-- The audio dataset ({class = "audio"}, lua/rnnlua/audio_dataset.lua) on WAV files written
-- here: features equal rl.audio.features of rl.audio.load, labels from characters, a vocabulary
-- file and words; the HDF cache (read back without touching the audio, rebuilt when the feature
-- options, the list, the vocabulary or a file change; one file per configuration in a folder);
-- global mean/variance normalisation with the training set's statistics; batches sorted by
-- length, CTC training through rl.train and the forward task; the statistics in the checkpoint
-- (rl.forward and serve normalise raw features of new audio with them); and every bad input as
-- an error
-- naming the list file and line, or a logged skip with skip_bad.
local H = dofile("tests/lua/harness.lua")
local test, check, expect_error = H.test, H.check, H.expect_error
local lfs = require("lfs")

local dir = H.tmpdir()
lfs.mkdir(dir .. "/wav")
local rm_rf = H.rm_rf

local function write(path, s)
  local f = assert(io.open(path, "wb"))
  f:write(s)
  f:close()
end

-- 16-bit mono PCM WAV; `promise` = data bytes the header claims (default: what is written)
local function write_wav(path, n, rate, seed, promise)
  local parts = {}
  local ph = 0
  for i = 1, n do
    ph = ph + 2 * math.pi * (200 + 100 * seed + 800 * i / n) / rate
    local v = 0.4 * math.sin(ph) + 0.2 * math.sin(3.1 * ph + seed)
    parts[i] = string.pack("<i2", math.floor(v * 32767 + 0.5))
  end
  local body = table.concat(parts)
  local size = promise or #body
  write(path, "RIFF" .. string.pack("<I4", 36 + size) .. "WAVEfmt " ..
    string.pack("<I4I2I2I4I4I2I2", 16, 1, 1, rate, rate * 2, 2, 16) .. "data" ..
    string.pack("<I4", size) .. body)
end

local TEXTS = {"one two", "oh", "nine eight seven", "zero five", "six six"}
local LENS = {5200, 2400, 8000, 4000, 6400}
for i = 1, #TEXTS do write_wav(string.format("%s/wav/u%d.wav", dir, i), LENS[i], 16000, i) end
local function write_list(path, lines) write(path, table.concat(lines, "\n") .. "\n") end
local good = {}
for i = 1, #TEXTS do good[i] = string.format("wav/u%d.wav\t%s", i, TEXTS[i]) end
local list = dir .. "/train.tsv"
write_list(list, good)
local FEAT = {n_mels = 20}

-- counts rl.audio.load calls, to see whether a dataset read the audio or the cache
local loads = 0
local real_load = rl.audio.load
rl.audio.load = function(...)
  loads = loads + 1
  return real_load(...)
end

local function audio(extra)
  local cfg = {class = "audio", list = list, vocab = "chars", features = FEAT, quiet = true}
  for k, v in pairs(extra or {}) do cfg[k] = v end
  return rl.dataset(cfg)
end

local function max_abs(a, b)
  return (a - b):abs():max()
end

test("features and character labels, paths relative to the list", function()
  local ds = audio{cache = dir .. "/c1.h5"}
  check(ds:num_seqs() == 5, "5 utterances")
  local e = ds:extern_data()
  check(e.data.dim == 20 and not e.data.sparse, "data dim 20")
  -- the characters of the transcripts, sorted: " ", e, f, g, h, i, n, o, r, s, t, v, w, x, z
  local chars = table.concat(ds.vocab)
  check(chars == " efghinorstvwxz", "vocab " .. chars)
  check(e.classes.dim == #ds.vocab and e.classes.sparse, "classes sparse, dim = vocab")
  ds:init_epoch(1)
  for i = 1, 5 do
    local s = ds:get_seq(i)
    check(s.tag == string.format("wav/u%d.wav", i), "tag " .. tostring(s.tag))
    local wave = real_load(string.format("%s/wav/u%d.wav", dir, i))
    local ref = rl.audio.features(wave, {rate = 16000, n_mels = 20})
    check(s.data:size(1) == ref:size(1) and max_abs(s.data, ref) == 0, "features of " .. s.tag)
    local text = {}
    for j, c in ipairs(s.classes:totable()) do text[j] = ds.vocab[c + 1] end
    check(table.concat(text) == TEXTS[i], "labels of " .. s.tag .. ": " .. table.concat(text))
  end
end)

test("cache: read back from HDF5 without the audio; rebuilt on every change", function()
  local path = dir .. "/c2.h5"
  loads = 0
  local a = audio{cache = path}
  check(loads == 5, "built: 5 files read, got " .. loads)
  local f = rl.h5file(path, "r")
  check(#f:attr_string("/", "audio_fingerprint") == 16, "fingerprint stored")
  check(f:read("audio_norm/mean"):numel() == 20 and f:read("audio_norm/std"):numel() == 20,
    "statistics stored")
  f:close()
  local plain = rl.dataset{class = "hdf", files = {path}}
  check(plain:num_seqs() == 5 and plain:extern_data().classes.dim == #a.vocab,
    "the cache is an ordinary RETURNN-layout file")
  loads = 0
  local b = audio{cache = path}
  check(loads == 0, "second time: no file read, got " .. loads)
  a:init_epoch(1)
  b:init_epoch(1)
  for i = 1, 5 do check(max_abs(a:get_seq(i).data, b:get_seq(i).data) == 0, "same features") end
  loads = 0
  local c = audio{cache = path, features = {n_mels = 24}}
  check(loads == 5 and c:extern_data().data.dim == 24, "feature options changed: rebuilt")
  loads = 0
  audio{cache = path, features = {n_mels = 24}}
  check(loads == 0, "and then reused")
  write_list(list, {good[1], good[2], good[3], good[4], "wav/u5.wav\tsix seven"})
  loads = 0
  local d = audio{cache = path, features = {n_mels = 24}}
  check(loads == 5, "transcript changed: rebuilt")
  d:init_epoch(1)
  check(d:get_seq(5).classes:size(1) == #"six seven", "new transcript")
  write_list(list, good)
  audio{cache = path, features = {n_mels = 24}}
  loads = 0
  write_wav(dir .. "/wav/u3.wav", 8800, 16000, 3)
  lfs.touch(dir .. "/wav/u3.wav", os.time() + 5)
  local g = audio{cache = path, features = {n_mels = 24}}
  check(loads == 5, "audio file changed: rebuilt")
  g:init_epoch(1)
  check(g:get_seq(3).data:size(1) == rl.audio.features(real_load(dir .. "/wav/u3.wav"),
    {n_mels = 24}):size(1), "the new file's frames")
  write_wav(dir .. "/wav/u3.wav", 8000, 16000, 3)
  lfs.touch(dir .. "/wav/u3.wav", os.time() + 10)
end)

test("cache folder: one file per configuration", function()
  local cdir = dir .. "/cdir/sub"
  audio{cache = cdir}
  audio{cache = cdir, features = {n_mels = 30}}
  loads = 0
  audio{cache = cdir}
  check(loads == 0, "first configuration still cached")
  local n = 0
  for e in lfs.dir(cdir) do if e:match("^audio%-%x+%.h5$") then n = n + 1 end end
  check(n == 2, "two cache files, got " .. n)
end)

test("no cache: features kept in memory", function()
  local ds = audio()
  check(ds.cache == nil and ds:num_seqs() == 5, "5 utterances")
  ds:init_epoch(1)
  check(ds:get_seq(2).data:size(2) == 20, "features")
end)

test("global mean/variance normalisation with the training set's statistics", function()
  local tr = audio{cache = dir .. "/n_train.h5", normalize = "global"}
  local raw = audio{cache = dir .. "/n_train.h5"}
  tr:init_epoch(1)
  raw:init_epoch(1)
  local all, rows = {}, {}
  for i = 1, 5 do
    all[i] = tr:get_seq(i).data
    rows[i] = raw:get_seq(i).data
  end
  local x = rl.cat(all, 1):double()
  local m, sd = x:mean(1), (x - x:mean(1)):square():mean(1):sqrt()
  check(m:abs():max() < 1e-4, "normalised mean 0, got " .. m:abs():max())
  check((sd - 1):abs():max() < 1e-3, "normalised std 1, got " .. (sd - 1):abs():max())
  local r = rl.cat(rows, 1):double()
  local st = raw:norm_stats("raw")
  check((st.mean:double() - r:mean(1)):abs():max() < 1e-3, "stored mean")
  -- dev: another list, normalised with the training statistics (file, object or table)
  local dlist = dir .. "/dev.tsv"
  write_list(dlist, {good[3], good[1]})
  for _, ns in ipairs({dir .. "/n_train.h5", raw, st}) do
    local dev = rl.dataset{class = "audio", list = dlist, vocab = "chars", features = FEAT,
      cache = dir .. "/n_dev.h5", normalize = "global", norm_stats = ns, quiet = true}
    dev:init_epoch(1)
    local got = dev:get_seq(1).data
    local want = (rows[3] - st.mean:view(1, 20)) / st.std:view(1, 20)
    check(max_abs(got, want) < 1e-5, "dev normalised with the training statistics")
    check(dev:norm_stats().mean == st.mean or max_abs(dev:norm_stats().mean, st.mean) == 0,
      "norm_stats() gives the applied statistics")
  end
  expect_error("norm_stats without normalize", function()
    audio{norm_stats = st}
  end, "normalize is not \"global\"")
  expect_error("norm_stats of another width", function()
    audio{normalize = "global", features = {n_mels = 24}, norm_stats = st}
  end, "norm_stats have 20 columns, the features 24")
  -- statistics that would make every feature NaN, Inf or 0 (a crafted or broken stats file)
  for _, bad in ipairs{{st.mean, st.std:clone():fill(0 / 0), "std must be positive"},
                       {st.mean:clone():fill(1 / 0), st.std, "mean must be finite everywhere"},
                       {st.mean, st.std:clone():fill(1e-45), "std must be positive"}} do
    expect_error("norm_stats: " .. bad[3], function()
      audio{normalize = "global", norm_stats = {mean = bad[1], std = bad[2]}}
    end, "norm_stats: " .. bad[3])
  end
  expect_error("norm_stats file that is no cache", function()
    audio{normalize = "global", norm_stats = dir .. "/train.tsv"}
  end, "norm_stats " .. dir .. "/train.tsv")
end)

test("batches sorted by length with CTC targets of their own length", function()
  local ds = audio{cache = dir .. "/c1.h5", seq_ordering = "sorted"}
  ds:init_epoch(1)
  local prev, n = 0, 0
  for b in rl.batches(ds, {batch_size = 200, max_seqs = 2}) do
    for i = 1, b.lengths:size(1) do
      check(b.lengths[i] >= prev, "ascending lengths")
      prev = b.lengths[i]
      local s = ds:get_seq(b.seqs[i])
      check(b.lengths_classes[i] == s.classes:size(1), "label lengths")
      n = n + 1
    end
    check(b.classes:size(2) == b.lengths:size(1), "classes (S, B)")
  end
  check(n == 5, "every utterance once")
end)

test("word vocabulary file, rl.train with CTC and the forward task", function()
  write(dir .. "/words.txt", "zero\noh\none\ntwo\nthree\nfour\nfive\nsix\nseven\neight\nnine\n")
  local ds = audio{vocab = dir .. "/words.txt", cache = dir .. "/w.h5"}
  check(ds:extern_data().classes.dim == 11, "11 words")
  ds:init_epoch(1)
  check(table.concat(ds:get_seq(3).classes:totable(), ",") == "10,9,8", "nine eight seven")
  local cfg = {class = "audio", list = list, vocab = dir .. "/words.txt", features = FEAT,
    cache = dir .. "/w.h5", normalize = "global", quiet = true}
  local r = rl.train{
    network = {fw = {class = "lstm", n_out = 4}, bw = {class = "lstm", n_out = 4, direction = -1},
      output = {class = "softmax", loss = "ctc", target = "classes", from = {"fw", "bw"}}},
    train = cfg, dev = cfg, num_epochs = 2, batch_size = 1000, max_seqs = 3,
    optimizer = {class = "adam"}, learning_rate = 1e-2, model = dir .. "/m/net", log_verbosity = 0,
  }
  check(r.history[2].dev_score == r.history[2].dev_score, "a dev score")
  local fwd = rl.forward{model = dir .. "/m/net.002.h5", data = cfg, layer = "output",
    output_file = dir .. "/fwd.h5", log_verbosity = 0}
  check(fwd.num_seqs == 5 and fwd.dim == 12, "forward: 5 sequences of 12 posteriors")
  local out = rl.dataset{class = "hdf", files = {dir .. "/fwd.h5"}}
  out:init_epoch(1)
  ds:init_epoch(1)
  check(out:get_seq(2).tag == ds:get_seq(2).tag, "tags kept")
  check(out:get_seq(2).data:size(1) == ds:get_seq(2).data:size(1), "frames kept")
end)

test("global normalisation statistics go with the model (checkpoint, forward, serve)", function()
  local cfg = {class = "audio", list = list, vocab = "chars", features = FEAT,
    cache = dir .. "/dn.h5", normalize = "global", quiet = true}
  local r = rl.train{
    network = {fw = {class = "lstm", n_out = 4},
      output = {class = "softmax", loss = "ctc", target = "classes", from = "fw"}},
    train = cfg, num_epochs = 1, batch_size = 1000, max_seqs = 3,
    optimizer = {class = "adam"}, learning_rate = 1e-2, model = dir .. "/dn/net", log_verbosity = 0,
  }
  local path = r.checkpoint
  local ck = rl.load_checkpoint(path)
  local st = rl.dataset(cfg):norm_stats()
  check(ck.data_norm and max_abs(ck.data_norm.mean, st.mean) == 0
    and max_abs(ck.data_norm.std, st.std) == 0, "the training set's statistics in the checkpoint")
  local p = io.popen(string.format("%s info %s 2>&1", arg[-1], path))
  local txt = p:read("a")
  p:close()
  check(txt:find("input normalisation: (x - mean) / std of input data over 20 columns", 1, true),
    "rnnlua info names the statistics: " .. txt)
  -- new audio (two utterances of another list, no cache): the model's statistics, not the list's
  local new_list = dir .. "/new.tsv"
  write_list(new_list, {good[3], good[1]})
  local raw = {class = "audio", list = new_list, vocab = "chars", features = FEAT, quiet = true}
  local want = {class = "audio", list = new_list, vocab = "chars", features = FEAT, quiet = true,
    normalize = "global", norm_stats = dir .. "/dn.h5"} -- the old way: the training cache
  local own = {class = "audio", list = new_list, vocab = "chars", features = FEAT, quiet = true,
    normalize = "global"} -- the new list's own statistics: what the model must not get
  local function fwd(data, file)
    rl.forward{model = path, data = data, output_file = dir .. "/" .. file, log_verbosity = 0}
    local o = rl.dataset{class = "hdf", files = {dir .. "/" .. file}}
    o:init_epoch(1)
    return o
  end
  local a, b, c = fwd(raw, "dn_raw.h5"), fwd(want, "dn_want.h5"), fwd(own, "dn_own.h5")
  for k = 1, 2 do
    check(max_abs(a:get_seq(k).data, b:get_seq(k).data) < 1e-6, "raw features + the model's "
      .. "statistics = the training cache's normalisation, sequence " .. k)
    check(max_abs(c:get_seq(k).data, b:get_seq(k).data) < 1e-6, "normalize = \"global\" in "
      .. "the config gives way to the model's statistics, sequence " .. k)
  end
  -- without the statistics the model sees other inputs: the check above can fail
  local plain = rl.load_checkpoint(path)
  plain.data_norm = nil
  local net = rl.network(plain.description, plain.extern_data)
  rl.checkpoint.load_params(plain, net)
  rl.save_checkpoint(dir .. "/dn_old.h5", {net = net})
  check(rl.load_checkpoint(dir .. "/dn_old.h5").data_norm == nil, "no data_norm: nil")
  rl.forward{model = dir .. "/dn_old.h5", data = raw, output_file = dir .. "/dn_old_out.h5",
    log_verbosity = 0}
  local d = rl.dataset{class = "hdf", files = {dir .. "/dn_old_out.h5"}}
  d:init_epoch(1)
  check(max_abs(d:get_seq(1).data, b:get_seq(1).data) > 1e-3, "raw features differ without it")
  -- an audio dataset object that normalises itself would be normalised twice
  expect_error("forward: a dataset object with its own normalisation", function()
    rl.forward{model = path, data = rl.dataset(own), output_file = dir .. "/x.h5",
      log_verbosity = 0}
  end, "the dataset normalises its features (normalize = \"global\") and the model's checkpoint")
  -- serve: raw features in, the forward task's numbers out; GET /v1/model shows the statistics
  local m = require("rnnlua.serve").load(path, "output")
  local info = m:info()
  check(type(info.data_norm) == "table" and #info.data_norm.mean == 20
    and math.abs(info.data_norm.std[5] - st.std[5]) < 1e-6, "/v1/model data_norm")
  local x = rl.dataset(raw)
  x:init_epoch(1)
  local s1 = x:get_seq(1).data
  local T = s1:size(1)
  local out = m:forward(s1:view(T, 1, 20), rl.tensor({T}, "int32"))
  check(max_abs(out:view(T, out:size(3)), b:get_seq(1).data) < 1e-6,
    "serve normalises raw features")
  check(require("rnnlua.serve").load(dir .. "/dn_old.h5", "output"):info().data_norm == false,
    "/v1/model data_norm false without")
  expect_error("save: statistics of another width", function()
    rl.save_checkpoint(dir .. "/bad.h5", {net = net,
      data_norm = {mean = rl.zeros(3), std = rl.ones(3)}})
  end, "data_norm: mean must be a (20) float tensor (the input's dim), got float32 (3)")
  expect_error("save: a zero std", function()
    rl.save_checkpoint(dir .. "/bad.h5", {net = net, data_norm = {mean = rl.zeros(20),
      std = rl.zeros(20)}})
  end, "data_norm: std must be positive everywhere")
end)

-- Bad input: each an error naming the list file and line, or a skip with skip_bad.
local function bad_list(line)
  local path = dir .. "/bad.tsv"
  write_list(path, {"wav/u1.wav\tone", line, "wav/u2.wav\toh"})
  return path
end
write(dir .. "/wav/empty.wav", "")
write_wav(dir .. "/wav/zero.wav", 0, 16000, 1)
write_wav(dir .. "/wav/trunc.wav", 4000, 16000, 1, 16000)
write_wav(dir .. "/wav/rate8k.wav", 4000, 8000, 1)
write_wav(dir .. "/wav/short.wav", 100, 16000, 1)
write(dir .. "/wav/text.wav", "this is not audio\n")
local BAD = {
  {"no tab", "wav/u1.wav one", "no tab between path and transcript"},
  {"empty path", "\tone", "empty path"},
  {"missing file", "wav/none.wav\tone", "wav/none.wav"},
  {"not audio", "wav/text.wav\tone", "wav/text.wav"},
  {"empty file", "wav/empty.wav\tone", "wav/empty.wav"},
  {"zero-length audio", "wav/zero.wav\tone", "wav/zero.wav"},
  {"truncated audio", "wav/trunc.wav\tone", "truncated"},
  {"shorter than a frame", "wav/short.wav\tone", "fewer than one window"},
  {"character outside the vocabulary", "wav/u1.wav\tone 2", "'2'"},
}
for _, c in ipairs(BAD) do
  expect_error("bad list line: " .. c[1], function()
    rl.dataset{class = "audio", list = bad_list(c[2]), vocab = {" ", "e", "h", "n", "o"},
      features = FEAT, quiet = true}
  end, dir .. "/bad.tsv:2: ")
  expect_error("bad list line names the cause: " .. c[1], function()
    rl.dataset{class = "audio", list = bad_list(c[2]), vocab = {" ", "e", "h", "n", "o"},
      features = FEAT, quiet = true}
  end, c[3])
  test("skip_bad skips and logs: " .. c[1], function()
    local ds = rl.dataset{class = "audio", list = bad_list(c[2]), vocab = {" ", "e", "h", "n", "o"},
      features = FEAT, quiet = true, skip_bad = true, cache = dir .. "/skip.h5"}
    check(ds:num_seqs() == 2 and ds.n_skipped == 1, "2 kept, 1 skipped")
    check(ds.skipped[1].at == dir .. "/bad.tsv:2" and ds.skipped[1].reason:find(c[3], 1, true),
      "the skip names line and cause: " .. tostring(ds.skipped[1].reason))
    local again = rl.dataset{class = "audio", list = bad_list(c[2]),
      vocab = {" ", "e", "h", "n", "o"}, features = FEAT, quiet = true, skip_bad = true,
      cache = dir .. "/skip.h5"}
    check(again.n_skipped == 1 and again:num_seqs() == 2, "the cache remembers the skip count")
  end)
end
test("skip_bad logs each skip on stderr", function()
  local path = bad_list("wav/none.wav\tone")
  local tmp = os.tmpname()
  local ok = os.execute(string.format("%s -e 'rl.dataset{class = \"audio\", list = %q, " ..
    "vocab = \"chars\", skip_bad = true}' >/dev/null 2>%s", arg[-1], path, tmp))
  local f = io.open(tmp)
  local err = f:read("a")
  f:close()
  os.remove(tmp)
  check(ok, "runs")
  check(err:find("skipped " .. path .. ":2: ", 1, true), "stderr: " .. err)
end)
expect_error("a file of another rate without resampling", function()
  rl.dataset{class = "audio", list = bad_list("wav/rate8k.wav\tone"), vocab = "chars",
    features = FEAT, resample = false, quiet = true}
end, dir .. "/bad.tsv:2: rl.audio.load: '" .. dir .. "/wav/rate8k.wav' has rate 8000 Hz")
test("a file of another rate is resampled by default", function()
  local ds = rl.dataset{class = "audio", list = bad_list("wav/rate8k.wav\tone"), vocab = "chars",
    features = FEAT, quiet = true}
  ds:init_epoch(1)
  check(ds:num_seqs() == 3 and ds:get_seq(2).data:size(1) == 48, "0.5 s at 16 kHz: 48 frames")
end)
expect_error("every line bad", function()
  rl.dataset{class = "audio", list = bad_list("wav/none.wav\tone"), vocab = {"x"},
    skip_bad = true, quiet = true}
end, "no usable utterance (3 skipped)")
expect_error("list file missing", function()
  rl.dataset{class = "audio", list = dir .. "/nothere.tsv", vocab = "chars"}
end, "cannot read list: " .. dir .. "/nothere.tsv")
expect_error("vocab file missing", function()
  rl.dataset{class = "audio", list = list, vocab = dir .. "/nothere.txt"}
end, "cannot read vocab: " .. dir .. "/nothere.txt")
expect_error("vocab with a label twice", function()
  rl.dataset{class = "audio", list = list, vocab = {"a", "b", "a"}}
end, "label 'a' appears twice")
expect_error("list table entry without a transcript", function()
  rl.dataset{class = "audio", list = {{dir .. "/wav/u1.wav"}}, vocab = "chars"}
end, "list entry 1: no transcript")
expect_error("unknown option", function()
  audio{lsit = "x"}
end, "unknown option 'lsit' for class 'audio'")
expect_error("bad feature option, before any file is read", function()
  audio{features = {n_mels = 0}}
end, "n_mels")
expect_error("bad normalize", function()
  audio{normalize = "utterance"}
end, "normalize must be false or \"global\"")

rl.audio.load = real_load
rm_rf(dir)
H.done()
