-- The audio dataset: sound files and their transcripts in, feature sequences and label
-- sequences out, with the features cached in the RETURNN HDF layout.
--
-- rl.dataset{class = "audio",
--   list = "corpus.tsv" | {{path, transcript}, ...},  -- lines "path<TAB>transcript"; paths in a
--                         -- list file are relative to the list file's folder (absolute ones kept)
--   vocab = "vocab.txt" | {labels...} | "chars",
--   features = {...},     -- rl.audio.features options (rate = 16000 also the rate files are
--                         -- read at); snip_edges, n_mels, normalize (per utterance), ...
--   resample = true,      -- false: a file of another rate is an error (or a skip)
--   cache = "DIR" | "FILE.h5",  -- where the features go (default: kept in memory only)
--   normalize = false | "global",  -- global mean/variance normalisation of every column
--   norm_stats = "FILE.h5" | dataset | {mean =, std =},  -- whose statistics (default: own)
--   skip_bad = false,     -- true: a bad line or file is skipped and logged, not an error
--   quiet = false,        -- no lines about building the cache or skipping
--   augment = {...},      -- on-the-fly speed, noise and SpecAugment: lua/rnnlua/augment.lua
--   seq_ordering =, partition_epoch =, seed =, cache_size =}   -- as for every dataset
--
-- Sequences: data (T, F) float32 features; classes (S) int32, the transcript's labels (0-based
-- positions in the vocabulary), a sequence of its own length for CTC; tag = the path as the list
-- gives it. extern_data: data = {dim = F}, classes = {dim = #vocab, sparse = true}.
--
-- Transcripts: leading and trailing white space is dropped and inner runs of it become one
-- space. The vocabulary decides how they are cut: when every label is one character (UTF-8;
-- "<space>" in a file stands for " "), a transcript is its characters; otherwise (words,
-- phonemes) its white-space separated tokens. A vocabulary file has one label per line (no
-- duplicates). "chars" takes the sorted set of the characters of this list's transcripts:
-- handy for one list, but separate train and dev lists need the same file or table, or their
-- labels would be numbered differently.
--
-- Features are computed the first time the dataset is made (rl.dataset, so rl.train's first
-- epoch) for every utterance, and written with rl.hdf_writer into the cache: DIR/audio-<hash>.h5
-- for a folder, or the file given; later datasets with the same list and configuration (and so
-- later epochs and runs) read the HDF file. The cache holds, besides the RETURNN layout (data,
-- target "classes" with its label names, tags), the root attribute audio_fingerprint: a hash of
-- the feature options, resample, the vocabulary and of every list entry (path, transcript, the
-- file's size and modification time). A cache whose fingerprint differs is rebuilt (the folder
-- form keeps one file per configuration). It also holds /audio_norm/mean and /audio_norm/std
-- (F) float32: the per-column mean and standard deviation sqrt(var + 1e-10) over all its frames.
--
-- normalize = "global" makes every frame (x - mean) / std with the statistics of norm_stats:
-- a cache file of another audio dataset (the training set's, for dev and test), an audio
-- dataset object, or a table {mean = (F), std = (F)}; without it, this dataset's own. The
-- statistics are computed on the raw (not globally normalised) features; ds:norm_stats() gives
-- the ones applied. rl.train writes them into its checkpoints (data_norm, rnnlua.checkpoint), and
-- rl.forward and serve apply them to raw features (rnnlua.forward), so a trained model needs no
-- training cache to be used on new audio.
--
-- Bad input: a list line without a tab or with an empty path, an unreadable, empty, truncated
-- or zero-length file, a file of another rate with resample = false, audio shorter than one
-- frame, a transcript with a character or word outside the vocabulary: an error naming the list
-- file and line (and the audio file), or, with skip_bad = true, a line "skipped LIST:LINE: why"
-- on stderr; ds.skipped lists them (when the cache was built by this dataset) and
-- ds.n_skipped counts them.
local M = {}

local rl, D

local fail = require("rnnlua.util").fail

local KEYS = {class = true, list = true, vocab = true, features = true, resample = true,
  cache = true, normalize = true, norm_stats = true, skip_bad = true, quiet = true,
  seq_ordering = true, partition_epoch = true, seed = true, cache_size = true, augment = true}

local VERSION = "rnnlua-audio-cache 1"

-- FNV-1a over a string, 64 bits on Lua's wrapping integers, as 16 hex digits.
local function hash64(s)
  local h = -3750763034362895579 -- 0xcbf29ce484222325
  for i = 1, #s do
    h = (h ~ s:byte(i)) * 1099511628211
  end
  return string.format("%016x", h)
end

local function dirname(path)
  return path:match("^(.*)/[^/]*$") or "."
end

local mkdir_p = require("rnnlua.util").mkdir_p

local function utf8_chars(s, where)
  if not utf8.len(s) then fail("%s: not valid UTF-8", where) end
  local out = {}
  for _, c in utf8.codes(s) do out[#out + 1] = utf8.char(c) end
  return out
end

local function clean_text(s)
  return (s:gsub("%s+", " "):gsub("^ ", ""):gsub(" $", ""))
end

-- The list's entries {path =, text =, line =} and where they come from (for messages).
local function read_list(cfg, where)
  local list = cfg.list
  local entries = {}
  if type(list) == "string" then
    local f, err = io.open(list, "r")
    if not f then fail("%s: cannot read list: %s", where, err) end
    local base = dirname(list)
    local n = 0
    for line in f:lines() do
      n = n + 1
      line = line:gsub("\r$", "")
      if line:find("%S") then
        local path, text = line:match("^([^\t]*)\t(.*)$")
        local e = {line = n, at = string.format("%s:%d", list, n)}
        if not path then
          e.bad = "no tab between path and transcript"
        elseif not path:find("%S") then
          e.bad = "empty path"
        else
          e.tag = path
          e.path = path:sub(1, 1) == "/" and path or base .. "/" .. path
          e.text = text
        end
        entries[#entries + 1] = e
      end
    end
    f:close()
    if n == 0 then fail("%s: list %s is empty", where, list) end
  elseif type(list) == "table" then
    for i, item in ipairs(list) do
      local e = {line = i, at = string.format("list entry %d", i)}
      local path, text
      if type(item) == "table" then path, text = item[1] or item.path, item[2] or item.text end
      if type(path) ~= "string" or not path:find("%S") then
        e.bad = "no path (an entry is {path, transcript})"
      elseif type(text) ~= "string" then
        e.bad = "no transcript (an entry is {path, transcript})"
      else
        e.tag, e.path, e.text = path, path, text
      end
      entries[i] = e
    end
    if #list == 0 then fail("%s: the list table is empty", where) end
  else
    fail("%s: list must be a file name or a table of {path, transcript}, got %s", where,
      type(list))
  end
  return entries
end

-- {labels = {...}, index = {label -> 0-based}, chars = bool}
local function read_vocab(cfg, entries, where)
  local v, labels = cfg.vocab, {}
  if v == "chars" then
    local seen = {}
    for _, e in ipairs(entries) do
      if e.text then
        for _, c in ipairs(utf8_chars(clean_text(e.text), e.at)) do seen[c] = true end
      end
    end
    for c in pairs(seen) do labels[#labels + 1] = c end
    table.sort(labels)
  elseif type(v) == "string" then
    local f, err = io.open(v, "r")
    if not f then fail("%s: cannot read vocab: %s", where, err) end
    local n = 0
    for line in f:lines() do
      n = n + 1
      line = line:gsub("\r$", "")
      if line == "" then fail("%s: vocab %s:%d: empty label", where, v, n) end
      labels[#labels + 1] = line == "<space>" and " " or line
    end
    f:close()
  elseif type(v) == "table" then
    for i, l in ipairs(v) do
      if type(l) ~= "string" or l == "" then
        fail("%s: vocab entry %d must be a non-empty string", where, i)
      end
      labels[i] = l
    end
  else
    fail("%s: vocab must be a file name, a table of labels or \"chars\", got %s", where,
      tostring(v))
  end
  if #labels == 0 then fail("%s: the vocabulary is empty", where) end
  local index, chars = {}, true
  for i, l in ipairs(labels) do
    if index[l] then fail("%s: vocab: label '%s' appears twice", where, l) end
    index[l] = i - 1
    if utf8.len(l) ~= 1 then chars = false end
  end
  return {labels = labels, index = index, chars = chars}
end

-- The labels of a transcript, or nil and why not.
local function labels_of(vocab, text, at)
  text = clean_text(text)
  local units = {}
  if vocab.chars then
    if not utf8.len(text) then return nil, "the transcript is not valid UTF-8" end
    units = utf8_chars(text, at)
  else
    for w in text:gmatch("%S+") do units[#units + 1] = w end
  end
  local ids = {}
  for i, u in ipairs(units) do
    local k = vocab.index[u]
    if not k then
      return nil, string.format("the transcript has %s '%s' (%s %d of \"%s\") that is not in " ..
        "the vocabulary", vocab.chars and "character" or "token", u,
        vocab.chars and "character" or "token", i, text)
    end
    ids[i] = k
  end
  return ids
end

local function canonical(t)
  local ks = {}
  for k in pairs(t) do ks[#ks + 1] = tostring(k) end
  table.sort(ks)
  local parts = {}
  for _, k in ipairs(ks) do parts[#parts + 1] = k .. "=" .. tostring(t[k]) end
  return table.concat(parts, ";")
end

local function fingerprint(entries, vocab, feat, resample, skip_bad)
  local lfs = require("lfs")
  local parts = {VERSION, "features " .. canonical(feat), "resample " .. tostring(resample),
    "skip_bad " .. tostring(skip_bad), "vocab " .. table.concat(vocab.labels, "\31")}
  for _, e in ipairs(entries) do
    local a = e.path and lfs.attributes(e.path)
    parts[#parts + 1] = string.format("%s\t%s\t%s\t%s\t%s", tostring(e.path), tostring(e.text),
      a and a.size or "-", a and a.modification or "-", tostring(e.bad))
  end
  return hash64(table.concat(parts, "\n"))
end

local function read_stats(path, where)
  local ok, res = pcall(function()
    local f = rl.h5file(path, "r")
    local s = {mean = f:read("audio_norm/mean"), std = f:read("audio_norm/std")}
    f:close()
    return s
  end)
  if not ok then
    fail("%s: norm_stats %s: %s", where, path, tostring(res):gsub("^[^:]*:%d+: ", ""))
  end
  return res
end

-- Computes every utterance's features; returns the sequences, the skips and the statistics.
local function compute(self, entries, vocab, feat, resample, skip_bad, where)
  local seqs, skipped = {}, {}
  local s1, s2, frames
  local rate = feat.rate or 16000
  local function bad(e, why)
    if not skip_bad then fail("%s: %s: %s", where, e.at, why) end
    skipped[#skipped + 1] = {at = e.at, path = e.path, reason = why}
    if not self.quiet then io.stderr:write(string.format("%s: skipped %s: %s\n", where, e.at, why)) end
  end
  for _, e in ipairs(entries) do
    if e.bad then
      bad(e, e.bad)
    else
      local ids, why = labels_of(vocab, e.text, e.at)
      local x
      if ids then
        local ok, res = pcall(function()
          local wave = rl.audio.load(e.path, {rate = rate, resample = resample})
          return rl.audio.features(wave, feat)
        end)
        if ok then x = res else why = tostring(res):gsub("^[^:]*:%d+: ", "") end
      end
      if x then
        seqs[#seqs + 1] = {tag = e.tag, data = x, classes = rl.tensor(ids, "int32")}
        local xd = x:double()
        if not s1 then
          s1, s2, frames = xd:sum(1), xd:square():sum(1), 0
        else
          s1:add_(xd:sum(1))
          s2:add_(xd:square():sum(1))
        end
        frames = frames + x:size(1)
      else
        bad(e, why)
      end
    end
  end
  if #seqs == 0 then fail("%s: no usable utterance (%d skipped)", where, #skipped) end
  local mean = s1 / frames
  local var = (s2 / frames - mean:square()):clamp(0, math.huge)
  return seqs, skipped, {mean = mean:float(), std = (var + 1e-10):sqrt():float()}
end

local Audio = setmetatable({}, {__index = function(_, k) return D.Base[k] end})
Audio.__index = Audio

function M.new(cfg)
  for k in pairs(cfg) do
    if not KEYS[k] then
      fail("rl.dataset: unknown option '%s' for class 'audio' (list, vocab, features, " ..
        "resample, cache, normalize, norm_stats, skip_bad, quiet, seq_ordering, " ..
        "partition_epoch, seed, cache_size, augment)", tostring(k))
    end
  end
  local self = setmetatable({}, Audio)
  self.name = "audio(" .. (type(cfg.list) == "string" and cfg.list or "table") .. ")"
  local where = "rl.dataset " .. self.name
  D.base_init(self, cfg, where)
  self.quiet = cfg.quiet and true or false
  local feat = {}
  if cfg.features ~= nil and type(cfg.features) ~= "table" then
    fail("%s: features must be a table of rl.audio.features options", where)
  end
  for k, v in pairs(cfg.features or {}) do feat[k] = v end
  feat.rate = feat.rate or 16000
  local resample = cfg.resample
  if resample == nil then resample = true end
  if type(resample) ~= "boolean" then fail("%s: resample must be a boolean", where) end
  local skip_bad = cfg.skip_bad and true or false
  if cfg.normalize ~= nil and cfg.normalize ~= false and cfg.normalize ~= "global" then
    fail("%s: normalize must be false or \"global\" (per-utterance normalisation is " ..
      "features.normalize = true), got %s", where, tostring(cfg.normalize))
  end
  -- the options are checked before any file is read
  local ok, err = pcall(rl.audio.features, rl.zeros(math.floor(feat.rate) + 1), feat)
  if not ok then fail("%s: features: %s", where, tostring(err):gsub("^[^:]*:%d+: ", "")) end

  local entries = read_list(cfg, where)
  for _, e in ipairs(entries) do
    if e.bad and not skip_bad then fail("%s: %s: %s", where, e.at, e.bad) end
  end
  local vocab = read_vocab(cfg, entries, where)
  self.vocab = vocab.labels
  local fp = fingerprint(entries, vocab, feat, resample, skip_bad)
  local path = cfg.cache
  if path ~= nil then
    if type(path) ~= "string" or path == "" then
      fail("%s: cache must be a folder or a .h5 file name", where)
    end
    if not path:match("%.h5$") then
      mkdir_p(path)
      path = string.format("%s/audio-%s.h5", path, fp)
    else
      mkdir_p(dirname(path))
    end
  end
  self.cache = path

  local stats
  local have
  if path then
    local okr, f = pcall(rl.h5file, path, "r")
    if okr then
      local okf, fpv = pcall(f.attr_string, f, "/", "audio_fingerprint")
      f:close()
      have = okf and fpv == fp
      if not have and not self.quiet then
        print(string.format("%s: cache %s is of another list or configuration: rebuilding", where,
          path))
      end
    end
  end
  if have then
    self._hdf = D.hdf_new{class = "hdf", files = {path}}
    local f = rl.h5file(path, "r")
    self.n_skipped = f:attr_number("/", "audio_skipped")
    f:close()
    stats = read_stats(path, where)
  else
    local t0 = rl.clock()
    if not self.quiet then
      print(string.format("%s: computing the features of %d utterances%s", where, #entries,
        path and (" into " .. path) or ""))
    end
    local seqs, skipped
    seqs, skipped, stats = compute(self, entries, vocab, feat, resample, skip_bad, where)
    self.skipped, self.n_skipped = skipped, #skipped
    if path then
      local w = rl.hdf_writer(path, {data_dim = seqs[1].data:size(2),
        targets = {classes = {dim = #vocab.labels, sparse = true}},
        target_labels = {classes = vocab.labels},
        extra = {attrs = {audio_fingerprint = fp, audio_skipped = #skipped},
                 datasets = {["audio_norm/mean"] = stats.mean, ["audio_norm/std"] = stats.std}}})
      for _, s in ipairs(seqs) do w:add(s.tag, s.data, {classes = s.classes}) end
      local okw, errw = pcall(w.close, w)
      if not okw then
        fail("%s: writing the cache: %s", where, tostring(errw):gsub("^[^:]*:%d+: ", ""))
      end
      self._hdf = D.hdf_new{class = "hdf", files = {path}}
    else
      self._seqs = seqs
    end
    if not self.quiet then
      print(string.format("%s: %d utterances, %d skipped, %.1f s", where, #seqs, #skipped,
        rl.clock() - t0))
    end
  end
  self._n = self._hdf and self._hdf._n or #self._seqs
  local dim = self._hdf and self._hdf._ext.data.dim or self._seqs[1].data:size(2)
  self._keys = {"data", "classes"}
  self._ext = {data = {dim = dim}, classes = {dim = #vocab.labels, sparse = true}}
  self._own_stats = stats

  if cfg.normalize == "global" then
    local ns = cfg.norm_stats
    if ns == nil then
      ns = stats
    elseif type(ns) == "string" then
      ns = read_stats(ns, where)
    elseif type(ns) == "table" and type(ns.norm_stats) == "function" then
      ns = ns:norm_stats("raw")
    elseif not (type(ns) == "table" and rl.is_tensor(ns.mean) and rl.is_tensor(ns.std)) then
      fail("%s: norm_stats must be a cache file, an audio dataset or {mean =, std =}", where)
    end
    if ns.mean:numel() ~= dim or ns.std:numel() ~= dim then
      fail("%s: norm_stats have %d columns, the features %d", where, ns.mean:numel(), dim)
    end
    -- (statistics from a file or a table: checked as a checkpoint's data_norm is)
    local okv, v = pcall(require("rnnlua.checkpoint").norm_values, ns.mean, ns.std, "norm_stats")
    if not okv then fail("%s: %s", where, tostring(v)) end
    self._norm = {mean = v.mean:view(1, dim), inv = v.std:reciprocal():view(1, dim)}
    self._norm_stats = ns
  elseif cfg.norm_stats ~= nil then
    fail("%s: norm_stats is given but normalize is not \"global\"", where)
  end
  -- what augment's speed and noise need to read an utterance again
  self._rate, self._feat, self._resample = feat.rate, feat, resample
  self._path_of = {}
  for _, e in ipairs(entries) do
    if e.tag then self._path_of[e.tag] = e.path end
  end
  D.augment_init(self, cfg, where)
  return self
end

-- The statistics applied by normalize = "global" (nil without it), or with "raw" this
-- dataset's own statistics of its raw features.
function Audio:norm_stats(which)
  if which == "raw" then return self._own_stats end
  return self._norm_stats
end

function Audio:files() -- the cache, when the features are read from one
  return self._hdf and self._hdf:files() or {}
end

function Audio:_len(k)
  if self._hdf then return self._hdf:_len(k) end
  return self._seqs[k].data:size(1)
end

function Audio:_load(k)
  local s
  if self._hdf then
    s = self._hdf:_load(k)
  else
    local m = self._seqs[k]
    s = {tag = m.tag, data = m.data, classes = m.classes}
  end
  if self._norm then
    s = {tag = s.tag, data = (s.data - self._norm.mean):mul_(self._norm.inv), classes = s.classes}
  end
  return s
end

-- The features of utterance k computed from its waveform passed through wave_fn (augment's
-- speed and noise), normalised as _load normalises the cached ones.
function Audio:_wave_features(k, wave_fn)
  local tag = self._hdf and self._hdf:tag(k) or self._seqs[k].tag
  local path = self._path_of[tag]
  local wave = rl.audio.load(path, {rate = self._rate, resample = self._resample})
  local x = rl.audio.features(wave_fn(wave), self._feat)
  if self._norm then x = (x - self._norm.mean):mul_(self._norm.inv) end
  return x
end

function Audio:close()
  if self._hdf then self._hdf:close() end
end

function M.install(r, datasets)
  rl, D = r, datasets
end

return M
