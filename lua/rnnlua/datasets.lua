-- Datasets and batching: RETURNN-layout HDF5 files (read lazily, cached), generated tasks
-- (12AX, copy, regression), per-epoch sequence ordering, partition_epoch, batches with
-- chunking, and the HDF5 writer used by rl.dataset_write and the forward task.
--
-- A dataset is any object with
--   ds:num_seqs()          sequences of the current (sub-)epoch
--   ds:init_epoch(epoch)   fixes that epoch's order from (seed, epoch) alone
--   ds:get_seq(i)          i = 1..num_seqs() in the epoch's order -> {tag =, data =, <keys> =}
--                          CPU tensors: dense (T, F) float32 or sparse (T) int32 (0-based
--                          classes). They may be shared with the dataset's cache: read only.
--   ds:keys(), ds:extern_data(), ds:total_frames() (input frames of the current epoch)
-- The built-in datasets also have ds:seq_len(i), ds:cached_bytes() and ds.name.
--
-- Images (2-D data). RETURNN's HDF layout has no images; rnnlua extends it with one dataset:
--   /seqSizes [num_seqs, 2] int32: (height, width) of each sequence's image.
-- The image's pixels are its rows of /inputs in row-major order (pixel (y, x) at row y*w + x
-- of the sequence, 0-based), so /seqLengths column 0 is h*w and files without /seqSizes are
-- read as plain sequences (a RETURNN tool sees an image as a sequence of h*w pixels). Such a dataset's
-- get_seq gives data (h, w, F), its extern_data says data = {dim = F, spatial = 2}, and
-- rl.batches gives data (H, W, B, F) zero-padded with sizes (B, 2) int32 = (h, w) per image
-- and lengths (B) = h*w. Targets stay sequences: one frame per image for classification
-- (classes (1, B)), or one per column, and so on.
--
-- rl.dataset(cfg):
--   {class = "hdf", files = {...} | "file.h5", cache_size = bytes (default 256 MiB), ...,
--    allow_empty = true (read sequences of length 0, such as empty decoded label sequences;
--    without it they are an error, since they cannot be trained on or forwarded)}
--   {class = "12ax" | "copy" | "regression", num_seqs =, seed =, min_len =, max_len =, ...}
--   {class = "audio", list =, vocab =, features =, cache =, ...}: lua/rnnlua/audio_dataset.lua
--   common: seq_ordering = "default" | "random" | "sorted" | "sorted_reverse" | "laplace:N" |
--           "laplace:.N", partition_epoch = N (default 1), seed = s (default 1),
--           augment = {...} (on-the-fly augmentation in get_seq: lua/rnnlua/augment.lua)
--   an object with get_seq is returned as it is.
--
-- Ordering (RETURNN's): "random" is a permutation drawn from (seed, pass); "sorted" is by input
-- length ascending, "sorted_reverse" descending (ties keep file order); "laplace:N" draws the
-- random order, cuts it into N bins of (nearly) equal count and sorts the bins alternately by
-- ascending and descending length (long and short batches mix, each batch has little padding);
-- "laplace:.N" is the same with bins of about N sequences (at least 2 bins).
-- partition_epoch = N: epoch e is part ((e - 1) mod N) + 1 of pass (e - 1) // N + 1, one of N
-- contiguous, nearly equal slices of that pass's order; a pass covers each sequence once.
--
-- Cache: an LRU over whole sequences of at most cache_size bytes (the tensors' data bytes); a
-- sequence larger than cache_size is not cached. A miss reads the rows of that sequence
-- only (rl.h5file read_rows on offsets computed once from /seqLengths).
--
-- Generated tasks. Each sequence i is drawn from its own splitmix64 stream seeded by (seed, i),
-- so its content depends on nothing else (no global RNG, not the epoch).
--   12ax: inputs one-hot over "123ABCXYZ" (dim 9), targets "classes" sparse dim 2: 0 = L, 1 = R.
--     Rule: the target is R at an X whose previous symbol is A while the most recent digit
--     (1, 2 or 3) is 1, and at a Y whose previous symbol is B while the most recent digit is 2;
--     L everywhere else (before any digit too). Inputs are drawn as RETURNN's Task12AXDataset
--     draws them (a digit or not, then mostly "AX"/"BY" pairs mixed with random symbols), so R
--     occurs often enough to learn. Lengths uniform in [min_len, max_len] (default 10..100).
--   copy: n_symbols = K (default 8); L uniform in [min_len, max_len] (default 1..10) symbols,
--     input length 2L+1: frames 1..L the symbols, frame L+1 the delimiter, then L blank frames;
--     inputs one-hot dim K+2 (0 = blank, 1..K symbols, K+1 = delimiter), "classes" sparse dim
--     K+1: 0 (blank) on frames 1..L+1, then the L symbols again.
--   regression: inputs (T, input_dim) standard normal, dense target "targets" (T, output_dim)
--     = tanh(x W + b), W (input_dim, output_dim) and b fixed by the seed (W ~ N(0, 1/input_dim),
--     b ~ N(0, 0.1^2)). Defaults input_dim 4, output_dim 2, lengths 5..30.
--
-- rl.batches(ds, {batch_size =, max_seqs =, chunking = "size:step"}) -> iterator of batches
--   {data = (T, B, F) float32 | (T, B) int32, <keys> = ..., lengths = (B) int32, tags = {...},
--    seqs = {epoch positions}, starts = {0-based first frame of each chunk}, n_frames =}
--   A sequence (or chunk) joins the batch while max_T * B <= batch_size and B <= max_seqs; a
--   batch always takes at least one, so a sequence longer than batch_size is a batch alone.
--   Chunking (RETURNN's): chunks start at frames 0, step, 2 step, ... while start < T, each
--   min(size, T - start) frames long; all keys are cut alike and must have T frames (a key of
--   its own length, such as a CTC label sequence, is an error naming it).
--   Targets of their own length: every key K other than data is padded to its own maximum
--   S_max (time-major (S_max, B) int32 for sparse keys, (S_max, B, F) for dense ones, zeros
--   after each sequence's end; consumers mask by length, never by the pad value) and comes
--   with `lengths_K` (B) int32, its own length per sequence (equal to `lengths` for
--   frame-aligned keys). batch_size and max_seqs count data frames only.
--   carry_state = true (truncated BPTT with carried state; needs chunking = "size", chunks
--   without overlap): B = min(max_seqs, batch_size // size) streams; each stream keeps its
--   slot and works through one sequence chunk after chunk, and when it is done takes the
--   next sequence of the epoch there; once the epoch has no more, the remaining streams close
--   up. Each batch has state_from = {s_1, ..., s_B}: 0 where a sequence starts, else the slot
--   of the batch before that slot b continues, which net:forward reads (the network's
--   "carried state").
--   Every batch has new tensors, zero-padded; T is at least 1. Images: a batch takes images
--   while max_H * max_W * B <= batch_size; chunking does not apply to them.
--
-- rl.hdf_writer(path, {data_dim =, sparse = false, targets = {key = {dim =, sparse =}},
--   labels = {input label names} (-> /labels), target_labels = {key = {names}},
--   spatial = 2 (images: data given as (h, w, F), written with /seqSizes),
--   extra = {datasets = {name = tensor}, attrs = {name = value}} (more objects and root
--   attributes, e.g. the audio dataset's fingerprint)}):
--   w:add(tag, data [, {key = tensor}]) copies the tensors; w:close() writes the RETURNN layout
--   to a temporary file and renames it over path. The sequences are held in memory until close.
-- rl.dataset_write(path, ds_or_seqs [, {epoch = 1, extern_data =}]) writes a dataset's
--   (sub-)epoch `epoch` in its order, or a list of {tag =, data =, <keys> =} tables.
-- rl.check_dataset_dims(ds, extern_data [, keys]) raises when a key is missing in the dataset
--   or its dim/sparseness disagrees with extern_data (keys: which to check, default all).
local M = {}

local rl

local fail = require("rnnlua.util").fail

local util = require("rnnlua.util")
local sorted_keys = util.sorted_keys

---------------------------------------------------------------------------- random numbers

-- splitmix64 on Lua's wrapping 64-bit integers: small, fast, and independent of math.random.
local function mix64(z)
  z = (z ~ (z >> 30)) * -4658895280553007687 -- 0xBF58476D1CE4E5B9
  z = (z ~ (z >> 27)) * -7723592293110705685 -- 0x94D049BB133111EB
  return z ~ (z >> 31)
end
local GOLDEN = -7046029254386353131 -- 0x9E3779B97F4A7C15

local Rng = {}
Rng.__index = Rng

-- A stream determined by the integers given (seed, then purpose/index/pass...).
local function new_rng(...)
  local s = 0x5EED
  for _, v in ipairs({...}) do s = mix64(s + GOLDEN + math.tointeger(v)) end
  return setmetatable({s = s}, Rng)
end

function Rng:next()
  self.s = self.s + GOLDEN
  return mix64(self.s)
end

function Rng:uniform() -- [0, 1)
  return (self:next() >> 11) * (1.0 / 9007199254740992.0)
end

function Rng:int(a, b) -- uniform in [a, b]
  return a + math.floor(self:uniform() * (b - a + 1))
end

function Rng:normal()
  local u1 = 1.0 - self:uniform()
  local u2 = self:uniform()
  return math.sqrt(-2.0 * math.log(u1)) * math.cos(2.0 * math.pi * u2)
end

function Rng:permutation(n)
  local p = {}
  for i = 1, n do p[i] = i end
  for i = n, 2, -1 do
    local j = self:int(1, i)
    p[i], p[j] = p[j], p[i]
  end
  return p
end

M.new_rng = new_rng

---------------------------------------------------------------------------- ordering

local function parse_ordering(s, where)
  if s == nil or s == "default" then return {kind = "default"} end
  if type(s) ~= "string" then fail("%s: seq_ordering must be a string, got %s", where, type(s)) end
  if s == "random" or s == "sorted" or s == "sorted_reverse" then return {kind = s} end
  local arg = s:match("^laplace:(.+)$")
  if arg then
    local per_bin = arg:match("^%.(%d+)$")
    local bins = arg:match("^(%d+)$")
    if per_bin and tonumber(per_bin) > 0 then
      return {kind = "laplace", per_bin = tonumber(per_bin)}
    end
    if bins and tonumber(bins) > 0 then return {kind = "laplace", bins = tonumber(bins)} end
  end
  fail("%s: unknown seq_ordering '%s' (default, random, sorted, sorted_reverse, laplace:N, " ..
    "laplace:.N)", where, s)
end

-- The order of one pass: a list of sequence numbers 1..n.
local function pass_order(ord, n, len_of, seed, pass)
  if ord.kind == "default" then
    local p = {}
    for i = 1, n do p[i] = i end
    return p
  end
  local by_len = function(a, b)
    local la, lb = len_of(a), len_of(b)
    if la ~= lb then return la < lb end
    return a < b
  end
  local by_len_desc = function(a, b)
    local la, lb = len_of(a), len_of(b)
    if la ~= lb then return la > lb end
    return a < b
  end
  if ord.kind == "sorted" or ord.kind == "sorted_reverse" then
    local p = {}
    for i = 1, n do p[i] = i end
    table.sort(p, ord.kind == "sorted" and by_len or by_len_desc)
    return p
  end
  local perm = new_rng(seed, 1, pass):permutation(n)
  if ord.kind == "random" then return perm end
  local bins = ord.bins or math.max(n // ord.per_bin, 2)
  local out = {}
  for b = 0, bins - 1 do
    local lo, hi = b * n // bins + 1, (b + 1) * n // bins
    local part = table.move(perm, lo, hi, 1, {})
    table.sort(part, b % 2 == 0 and by_len or by_len_desc)
    table.move(part, 1, #part, #out + 1, out)
  end
  return out
end

---------------------------------------------------------------------------- the base class

-- What every built-in dataset shares: epochs, ordering, partitioning and the LRU cache.
-- A subclass sets self._n, self._keys, self._ext, self.name and provides _len(k) (input
-- frames of sequence k, without loading it) and _load(k) -> seq.
local Base = {}
Base.__index = Base

local DEFAULT_CACHE = 256 * 1024 * 1024

local function base_init(self, cfg, where)
  self._ord = parse_ordering(cfg.seq_ordering, where)
  local pe = cfg.partition_epoch or 1
  if math.type(pe) ~= "integer" or pe < 1 then
    fail("%s: partition_epoch must be a positive integer, got %s", where, tostring(pe))
  end
  self.partition_epoch = pe
  local seed = cfg.seed or 1
  if math.type(seed) ~= "integer" then
    fail("%s: seed must be an integer, got %s", where, tostring(seed))
  end
  self.seed = seed
  local cs = cfg.cache_size or DEFAULT_CACHE
  if type(cs) ~= "number" or cs < 0 then
    fail("%s: cache_size must be a number of bytes >= 0", where)
  end
  self.cache_size = cs
  self._cache = {} -- k -> node {k, seq, bytes, prev, next}
  self._head = {} -- sentinel of the LRU list: head.next = most recent
  self._head.next, self._head.prev = self._head, self._head
  self._cached = 0
end

function Base:keys()
  return table.move(self._keys, 1, #self._keys, 1, {})
end

function Base:extern_data()
  local e = {}
  for k, v in pairs(self._ext) do e[k] = {dim = v.dim, sparse = v.sparse, spatial = v.spatial} end
  return e
end

function Base:init_epoch(epoch)
  epoch = epoch or 1
  if math.type(epoch) ~= "integer" or epoch < 1 then
    fail("%s: init_epoch: epoch must be a positive integer, got %s", self.name, tostring(epoch))
  end
  local P = self.partition_epoch
  local pass, part = (epoch - 1) // P + 1, (epoch - 1) % P
  if self._pass ~= pass then
    self._pass_order = pass_order(self._ord, self._n, function(k) return self:_len(k) end,
      self.seed, pass)
    self._pass = pass
  end
  local n = self._n
  local lo, hi = part * n // P + 1, (part + 1) * n // P
  self._order = table.move(self._pass_order, lo, hi, 1, {})
  self.epoch = epoch
end

local function ensure_epoch(self)
  if not self._order then self:init_epoch(1) end
end

function Base:num_seqs()
  ensure_epoch(self)
  return #self._order
end

-- The dataset's own number (1..total, file order) of the epoch's i-th sequence.
function Base:seq_index(i)
  ensure_epoch(self)
  local k = self._order[i]
  if not k then
    fail("%s: sequence %s out of range 1..%d", self.name, tostring(i), #self._order)
  end
  return k
end

function Base:seq_len(i)
  return self:_len(self:seq_index(i))
end

function Base:total_frames()
  ensure_epoch(self)
  local s = 0
  for _, k in ipairs(self._order) do s = s + self:_len(k) end
  return s
end

function Base:cached_bytes()
  return self._cached
end

local function seq_bytes(seq)
  local b = 0
  for k, v in pairs(seq) do
    if k ~= "tag" and rl.is_tensor(v) then b = b + v:numel() * 4 end
  end
  return b
end

local function lru_unlink(node)
  node.prev.next, node.next.prev = node.next, node.prev
end

local function lru_push_front(head, node)
  node.next, node.prev = head.next, head
  head.next.prev = node
  head.next = node
end

-- The sequence as the subclass loads it, through the LRU cache.
function Base:_cached_seq(k)
  local node = self._cache[k]
  if node then
    lru_unlink(node)
    lru_push_front(self._head, node)
    return node.seq
  end
  local seq = self:_load(k)
  local bytes = seq_bytes(seq)
  if bytes <= self.cache_size then
    while self._cached + bytes > self.cache_size do
      local old = self._head.prev
      lru_unlink(old)
      self._cache[old.k] = nil
      self._cached = self._cached - old.bytes
    end
    node = {k = k, seq = seq, bytes = bytes}
    lru_push_front(self._head, node)
    self._cache[k] = node
    self._cached = self._cached + bytes
  end
  return seq
end

function Base:get_seq(i)
  local k = self:seq_index(i)
  local seq = self:_cached_seq(k)
  if self._augment then return self._augment:apply(self, k, seq) end
  return seq
end

-- cfg.augment (lua/rnnlua/augment.lua) once the subclass knows its streams (self._ext).
function M.augment_init(self, cfg, where)
  self._augment = require("rnnlua.augment").new(self, cfg.augment, where)
end

---------------------------------------------------------------------------- HDF5 (RETURNN layout)

local Hdf = setmetatable({}, {__index = Base})
Hdf.__index = Hdf

local function h5call(file, fn, ...)
  local ok, res, res2 = pcall(fn, ...)
  if not ok then
    fail("rl.dataset: %s", util.file_error(res, file))
  end
  return res, res2
end

local function attr_or_nil(f, obj, name, kind)
  local ok, v = pcall(f[kind], f, obj, name)
  if ok then return v end
  return nil
end

-- The number of classes of a sparse stream as the file says it (v: inputPattSize or
-- /targets/size): an integer in 1..2^31 (classes are int32), or an error naming `what`.
local function class_count(path, v, what)
  local n = math.tointeger(v)
  if not n or n < 1 or n > 2 ^ 31 then
    fail("rl.dataset: %s: %s must be the number of classes of sparse data (an integer in "
      .. "1..2^31), got %s", path, what, tostring(v))
  end
  return n
end

-- Reads one file's index; returns a table describing it (the file stays open for reads).
local function hdf_open_file(path)
  if type(path) ~= "string" then
    fail("rl.dataset: files must be paths (strings), got %s", type(path))
  end
  -- stat, not open: the open of a FIFO waits for a writer (rl.h5file refuses what is not a
  -- regular file)
  if not require("lfs").attributes(path, "mode") then
    fail("rl.dataset: %s: no such file or not readable", path)
  end
  local f = h5call(path, rl.h5file, path, "r")
  local info = {path = path, f = f}
  for _, need in ipairs({"inputs", "seqLengths"}) do
    if not h5call(path, f.exists, f, need) then
      fail("rl.dataset: %s: not a RETURNN HDF dataset: it has no /%s", path, need)
    end
  end
  local idt, ishape = h5call(path, f.info, f, "inputs")
  if #ishape == 1 then
    if idt ~= "int32" then
      fail("rl.dataset: %s: 1-dim /inputs must hold integer classes, got %s", path, idt)
    end
    info.sparse = true
    info.dim = attr_or_nil(f, "/", "inputPattSize", "attr_number")
    if not info.dim then
      fail("rl.dataset: %s: sparse /inputs needs the root attribute inputPattSize", path)
    end
    info.dim = class_count(path, info.dim, "attribute inputPattSize")
  elseif #ishape == 2 then
    info.sparse = false
    info.dim = ishape[2]
    local ips = attr_or_nil(f, "/", "inputPattSize", "attr_number")
    if ips and ips ~= info.dim then
      fail("rl.dataset: %s: attribute inputPattSize = %s but /inputs has %d columns", path,
        tostring(ips), info.dim)
    end
  else
    fail("rl.dataset: %s: /inputs must be 1-dim (sparse) or 2-dim (dense), got %d dims",
      path, #ishape)
  end
  info.in_dtype = idt
  info.in_rows = ishape[1]

  -- target streams, in sorted key order (the order of /seqLengths' columns)
  info.keys, info.targets = {}, {}
  if h5call(path, f.exists, f, "targets/data") then
    local names = h5call(path, f.list, f, "targets/data")
    table.sort(names)
    for _, key in ipairs(names) do
      if key:find("/", 1, true) then
        fail("rl.dataset: %s: nested group in /targets/data: %s", path, key)
      end
      if key == "data" then fail("rl.dataset: %s: a target may not be called 'data'", path) end
      local dt, shape = h5call(path, f.info, f, "targets/data/" .. key)
      local t = {key = key, dtype = dt, rows = shape[1]}
      local size = attr_or_nil(f, "targets/size", key, "attr_tensor")
      local sdim, sndim
      if size and size:numel() >= 2 then
        local st = size:totable()
        sdim, sndim = st[1], st[2]
      elseif size and size:numel() == 1 then
        sdim = size:dim() == 0 and size:item() or size[1]
      end
      if #shape == 1 then
        t.sparse = true
        if dt ~= "int32" then
          fail("rl.dataset: %s: sparse target '%s' must hold integers, got %s", path, key, dt)
        end
        if not sdim then
          fail("rl.dataset: %s: sparse target '%s' has no attribute /targets/size %s",
            path, key, key)
        end
        t.dim = class_count(path, sdim, "/targets/size " .. key)
      elseif #shape == 2 then
        t.sparse = false
        t.dim = shape[2]
        if sdim and math.tointeger(sdim) ~= t.dim then
          fail("rl.dataset: %s: /targets/size %s says dim %s but the data has %d columns", path,
            key, tostring(sdim), t.dim)
        end
      else
        fail("rl.dataset: %s: target '%s' must be 1- or 2-dim, got %d dims", path, key, #shape)
      end
      if sndim and t.sparse ~= (math.tointeger(sndim) == 1) then
        fail("rl.dataset: %s: /targets/size %s says ndim %s but the data is %d-dim", path, key,
          tostring(sndim), #shape)
      end
      info.keys[#info.keys + 1] = key
      info.targets[key] = t
    end
  end

  -- /seqLengths: one row per sequence, column 1 + j for the j-th target key
  local sl = h5call(path, f.read, f, "seqLengths")
  if sl:dtype() ~= "int32" then
    fail("rl.dataset: %s: /seqLengths must hold integers, got %s", path, sl:dtype())
  end
  local ncol = #info.keys + 1
  local rows = {}
  if sl:dim() == 1 then
    for i, v in ipairs(sl:totable()) do
      local r = {}
      for c = 1, ncol do r[c] = v end
      rows[i] = r
    end
  elseif sl:dim() == 2 then
    if sl:size(1) > 0 and sl:size(2) < ncol then
      fail("rl.dataset: %s: /seqLengths has %d columns, needs 1 + %d (inputs, then %s)", path,
        sl:size(2), #info.keys, table.concat(info.keys, ", "))
    end
    if sl:size(1) > 0 then rows = sl:totable() end
  else
    fail("rl.dataset: %s: /seqLengths must be 1- or 2-dim, got %d dims", path, sl:dim())
  end
  local n = #rows
  info.n = n
  local nattr = attr_or_nil(f, "/", "numSeqs", "attr_number")
  if nattr and nattr ~= n then
    fail("rl.dataset: %s: attribute numSeqs = %s but /seqLengths has %d rows",
      path, tostring(nattr), n)
  end
  -- offsets (1-based first row) per sequence for the inputs and each target
  info.in_off, info.in_len = {}, {}
  for _, key in ipairs(info.keys) do info.targets[key].off, info.targets[key].len = {}, {} end
  local acc = {0}
  for j = 1, #info.keys do acc[j + 1] = 0 end
  for i = 1, n do
    local r = rows[i]
    for c = 1, ncol do
      if r[c] < 0 then fail("rl.dataset: %s: /seqLengths row %d has a negative length", path, i) end
    end
    info.in_off[i], info.in_len[i] = acc[1] + 1, r[1]
    acc[1] = acc[1] + r[1]
    for j, key in ipairs(info.keys) do
      local t = info.targets[key]
      t.off[i], t.len[i] = acc[j + 1] + 1, r[j + 1]
      acc[j + 1] = acc[j + 1] + r[j + 1]
    end
  end
  if acc[1] ~= info.in_rows then
    fail("rl.dataset: %s: /seqLengths adds up to %d input frames but /inputs has %d rows", path,
      acc[1], info.in_rows)
  end
  for j, key in ipairs(info.keys) do
    if acc[j + 1] ~= info.targets[key].rows then
      fail("rl.dataset: %s: /seqLengths adds up to %d frames of '%s' but /targets/data/%s has " ..
        "%d rows",
        path, acc[j + 1], key, key, info.targets[key].rows)
    end
  end
  if h5call(path, f.exists, f, "seqSizes") then
    local ss = h5call(path, f.read, f, "seqSizes")
    if ss:dtype() ~= "int32" or (n > 0 and (ss:dim() ~= 2 or ss:size(1) ~= n or ss:size(2) ~= 2)) then
      fail("rl.dataset: %s: /seqSizes must be [%d, 2] int32 (height, width per sequence), got %s %s",
        path, n, ss:dtype(), tostring(ss:size()))
    end
    if info.sparse then fail("rl.dataset: %s: images (/seqSizes) need dense /inputs", path) end
    info.sizes = n > 0 and ss:totable() or {}
    for i = 1, n do
      local h, w = info.sizes[i][1], info.sizes[i][2]
      if h < 1 or w < 1 or h * w ~= info.in_len[i] then
        fail("rl.dataset: %s: sequence %d: /seqSizes says %d x %d but /seqLengths says %d pixels",
          path, i, h, w, info.in_len[i])
      end
    end
  end
  if h5call(path, f.exists, f, "seqTags") then
    info.tags = h5call(path, f.read_strings, f, "seqTags")
    if #info.tags ~= n then
      fail("rl.dataset: %s: /seqTags has %d tags for %d sequences", path, #info.tags, n)
    end
  end
  return info
end

local HDF_KEYS = {class = true, files = true, cache_size = true, seq_ordering = true,
  partition_epoch = true, seed = true, allow_empty = true, augment = true}

local function hdf_new(cfg)
  for k in pairs(cfg) do
    if not HDF_KEYS[k] then fail("rl.dataset: unknown option '%s' for class 'hdf'", tostring(k)) end
  end
  local files = cfg.files
  if type(files) == "string" then files = {files} end
  if type(files) ~= "table" or #files == 0 then
    fail("rl.dataset: class 'hdf' needs files = {paths...}")
  end
  local self = setmetatable({allow_empty = cfg.allow_empty == true}, Hdf)
  self.name = "hdf(" .. table.concat(files, ", ") .. ")"
  base_init(self, cfg, "rl.dataset " .. self.name)
  self._files = {}
  self._fidx, self._local = {}, {}
  local first
  for _, path in ipairs(files) do
    local info = hdf_open_file(path)
    if not first then
      first = info
    else
      local same = info.dim == first.dim and info.sparse == first.sparse
        and #info.keys == #first.keys and (info.sizes == nil) == (first.sizes == nil)
      for _, key in ipairs(first.keys) do
        local a, b = first.targets[key], info.targets[key]
        same = same and b ~= nil and a.dim == b.dim and a.sparse == b.sparse
      end
      if not same then
        fail("rl.dataset: %s and %s hold different streams or dims (all files of a dataset " ..
          "must agree)",
          first.path, info.path)
      end
    end
    self._files[#self._files + 1] = info
    for i = 1, info.n do
      self._fidx[#self._fidx + 1] = #self._files
      self._local[#self._local + 1] = i
    end
  end
  self._n = #self._fidx
  if self._n == 0 then
    fail("rl.dataset: %s: the dataset is empty (0 sequences)", table.concat(files, ", "))
  end
  self._keys = {"data"}
  self._ext = {data = {dim = first.dim, sparse = first.sparse, spatial = first.sizes and 2 or nil}}
  for _, key in ipairs(first.keys) do
    self._keys[#self._keys + 1] = key
    self._ext[key] = {dim = first.targets[key].dim, sparse = first.targets[key].sparse}
  end
  M.augment_init(self, cfg, "rl.dataset " .. self.name)
  return self
end

-- The paths of the files read (rl.forward and rl.search refuse to write their output there).
function Hdf:files()
  local t = {}
  for i, info in ipairs(self._files) do t[i] = info.path end
  return t
end

function Hdf:_len(k)
  return self._files[self._fidx[k]].in_len[self._local[k]]
end

function Hdf:tag(k)
  local info, i = self._files[self._fidx[k]], self._local[k]
  return info.tags and info.tags[i] or string.format("seq-%d", k)
end

-- Checks a tensor just read: NaN/Inf in dense data, classes within [0, dim) in sparse data.
local function check_values(path, tag, key, t, sparse, dim)
  if t:numel() == 0 then return end
  if sparse then
    local lo, hi = rl.dataset_scan(t)
    if lo < 0 or hi >= dim then
      fail("rl.dataset: %s: sequence '%s': '%s' holds class %d, outside 0..%d", path, tag, key,
        lo < 0 and lo or hi, dim - 1)
    end
  else
    local nan, inf = rl.dataset_scan(t)
    local bad, what = nan or inf, nan and "NaN" or "Inf"
    if bad then
      local frame = (bad - 1) // (t:dim() == 2 and t:size(2) or 1) + 1
      fail("rl.dataset: %s: sequence '%s': %s in '%s' at frame %d", path, tag, what, key, frame)
    end
  end
end

local function read_stream(info, name, off, len, sparse, ncol)
  local t
  if len == 0 then
    t = sparse and rl.zeros({0}, "int32") or rl.zeros(0, ncol)
  else
    t = h5call(info.path, info.f.read_rows, info.f, name, off, len)
  end
  if sparse then
    if t:dtype() ~= "int32" then t = t:int() end
  elseif t:dtype() ~= "float32" then
    t = t:float()
  end
  return t
end

function Hdf:_load(k)
  local info, i = self._files[self._fidx[k]], self._local[k]
  local tag = self:tag(k)
  if info.in_len[i] < 1 and not self.allow_empty then
    fail("rl.dataset: %s: sequence '%s' (number %d in the file) has length 0 (/seqLengths): "
      .. "an empty sequence cannot be trained on or forwarded", info.path, tag, i)
  end
  local seq = {tag = tag}
  seq.data = read_stream(info, "inputs", info.in_off[i], info.in_len[i], info.sparse, info.dim)
  check_values(info.path, tag, "data", seq.data, info.sparse, info.dim)
  if info.sizes then seq.data = seq.data:view(info.sizes[i][1], info.sizes[i][2], info.dim) end
  for _, key in ipairs(info.keys) do
    local t = info.targets[key]
    seq[key] = read_stream(info, "targets/data/" .. key, t.off[i], t.len[i], t.sparse, t.dim)
    check_values(info.path, tag, key, seq[key], t.sparse, t.dim)
  end
  return seq
end

function Hdf:close()
  for _, info in ipairs(self._files) do info.f:close() end
end

---------------------------------------------------------------------------- generated tasks

local Gen = setmetatable({}, {__index = Base})
Gen.__index = Gen

function Gen:_len(k)
  local l = self._lens[k]
  if not l then
    l = self._draw_len(new_rng(self.seed, 2, k))
    self._lens[k] = l
  end
  return l
end

function Gen:_load(k)
  local r = new_rng(self.seed, 2, k)
  local len = self._draw_len(r)
  local seq = self._make(r, len, k)
  seq.tag = string.format("%s-%d", self.task, k)
  return seq
end

local function one_hot_rows(ids, dim)
  local rows = {}
  for t, c in ipairs(ids) do
    local row = {}
    for j = 1, dim do row[j] = 0 end
    row[c + 1] = 1
    rows[t] = row
  end
  return rl.tensor(rows)
end

local SYM12AX = "123ABCXYZ"
M.SYMBOLS_12AX = SYM12AX

-- The 12AX targets (0 = L, 1 = R) of a symbol string; see the file header for the rule.
function M.targets_12ax(s)
  local out, digit, prev = {}, nil, nil
  for t = 1, #s do
    local c = s:sub(t, t)
    local r = 0
    if c == "1" or c == "2" or c == "3" then
      digit = c
    elseif c == "X" and prev == "A" and digit == "1" then
      r = 1
    elseif c == "Y" and prev == "B" and digit == "2" then
      r = 1
    end
    out[t] = r
    prev = c
  end
  return out
end

local function make_12ax(r, len)
  local parts = {}
  local n = 0
  local function add(s)
    parts[#parts + 1] = s
    n = n + #s
  end
  local start = r:int(0, 2)
  if start > 0 then add(tostring(start)) end
  while n < len do
    if r:uniform() < 0.5 then add(tostring(r:int(1, 2))) end
    if r:uniform() < 0.9 then add(r:int(0, 1) == 0 and "AX" or "BY") end
    while r:uniform() < 0.5 do
      local j = r:int(1, 9)
      add(SYM12AX:sub(j, j))
    end
  end
  local s = table.concat(parts):sub(1, len)
  local ids = {}
  for t = 1, len do ids[t] = SYM12AX:find(s:sub(t, t), 1, true) - 1 end
  return {data = one_hot_rows(ids, 9), classes = rl.tensor(M.targets_12ax(s), "int32")}
end

local GEN_COMMON = {class = true, num_seqs = true, seed = true, min_len = true, max_len = true,
  seq_ordering = true, partition_epoch = true, cache_size = true, augment = true}

local GEN_TASKS = {
  ["12ax"] = {
    opts = {},
    min_len = 10, max_len = 100,
    setup = function(self)
      self._keys = {"data", "classes"}
      self._ext = {data = {dim = 9}, classes = {dim = 2, sparse = true}}
      self._make = make_12ax
    end,
  },
  copy = {
    opts = {n_symbols = true},
    min_len = 1, max_len = 10,
    setup = function(self, cfg)
      local K = cfg.n_symbols or 8
      if math.type(K) ~= "integer" or K < 1 then
        fail("rl.dataset: copy: n_symbols must be a positive integer")
      end
      self._keys = {"data", "classes"}
      self._ext = {data = {dim = K + 2}, classes = {dim = K + 1, sparse = true}}
      -- _draw_len gives the input length 2L+1; the symbols follow from the same stream.
      local lo, hi = self._min_len, self._max_len
      self._draw_len = function(r) return 2 * r:int(lo, hi) + 1 end
      self._make = function(r, T)
        local L = (T - 1) // 2
        local ids, cls = {}, {}
        for t = 1, L do
          local s = r:int(1, K)
          ids[t], cls[t] = s, 0
          ids[L + 1 + t], cls[L + 1 + t] = 0, s
        end
        ids[L + 1], cls[L + 1] = K + 1, 0
        return {data = one_hot_rows(ids, K + 2), classes = rl.tensor(cls, "int32")}
      end
    end,
  },
  regression = {
    opts = {input_dim = true, output_dim = true},
    min_len = 5, max_len = 30,
    setup = function(self, cfg)
      local din, dout = cfg.input_dim or 4, cfg.output_dim or 2
      for name, v in pairs({input_dim = din, output_dim = dout}) do
        if math.type(v) ~= "integer" or v < 1 then
          fail("rl.dataset: regression: %s must be a positive integer", name)
        end
      end
      self._keys = {"data", "targets"}
      self._ext = {data = {dim = din}, targets = {dim = dout}}
      local wr = new_rng(self.seed, 3)
      local W, b = {}, {}
      for i = 1, din do
        W[i] = {}
        for j = 1, dout do W[i][j] = wr:normal() / math.sqrt(din) end
      end
      for j = 1, dout do b[j] = 0.1 * wr:normal() end
      self.weights, self.bias = W, b
      self._make = function(r, T)
        local xs, ys = {}, {}
        for t = 1, T do
          local x, y = {}, {}
          for i = 1, din do x[i] = r:normal() end
          for j = 1, dout do
            local a = b[j]
            for i = 1, din do a = a + x[i] * W[i][j] end
            y[j] = math.tanh(a)
          end
          xs[t], ys[t] = x, y
        end
        return {data = rl.tensor(xs), targets = rl.tensor(ys)}
      end
    end,
  },
}

local function gen_new(cfg)
  local task = GEN_TASKS[cfg.class]
  for k in pairs(cfg) do
    if not GEN_COMMON[k] and not task.opts[k] then
      fail("rl.dataset: unknown option '%s' for class '%s'", tostring(k), cfg.class)
    end
  end
  local n = cfg.num_seqs
  if math.type(n) ~= "integer" or n < 0 then
    fail("rl.dataset: class '%s' needs num_seqs, a non-negative integer, got %s",
      cfg.class, tostring(n))
  end
  if n == 0 then fail("rl.dataset: %s: the dataset is empty (num_seqs = 0)", cfg.class) end
  local self = setmetatable({}, Gen)
  self.task = cfg.class
  self.name = string.format("%s(num_seqs=%d, seed=%s)", cfg.class, n, tostring(cfg.seed or 1))
  base_init(self, cfg, "rl.dataset " .. self.name)
  local lo, hi = cfg.min_len or task.min_len, cfg.max_len or task.max_len
  if math.type(lo) ~= "integer" or math.type(hi) ~= "integer" or lo < 1 or hi < lo then
    fail("rl.dataset: %s: need integers 1 <= min_len <= max_len, got %s..%s", cfg.class,
      tostring(lo), tostring(hi))
  end
  self._min_len, self._max_len = lo, hi
  self._draw_len = function(r) return r:int(lo, hi) end
  self._n = n
  self._lens = {}
  task.setup(self, cfg)
  M.augment_init(self, cfg, "rl.dataset " .. self.name)
  return self
end

---------------------------------------------------------------------------- rl.dataset

local function is_dataset(obj)
  local ok, gs = pcall(function() return obj.get_seq end)
  return ok and type(gs) == "function"
end

function M.dataset(cfg)
  if is_dataset(cfg) then return cfg end
  if type(cfg) ~= "table" then
    fail("rl.dataset: expected a config table or a dataset object, got %s", type(cfg))
  end
  if cfg.class == "hdf" then return hdf_new(cfg) end
  if GEN_TASKS[cfg.class] then return gen_new(cfg) end
  if cfg.class == "audio" then return require("rnnlua.audio_dataset").new(cfg) end
  fail("rl.dataset: unknown class '%s' (hdf, audio, 12ax, copy, regression, or an object with " ..
    "get_seq)",
    tostring(cfg.class))
end

local function ds_name(ds)
  return type(ds.name) == "string" and ds.name or tostring(ds)
end

-- ds must be a dataset object (rl.dataset's result or an object with the interface); a
-- config table or anything else raised "attempt to call a nil value (method 'keys')"
local function need_dataset(who, ds)
  if not is_dataset(ds) then
    fail("%s: expects a dataset object (rl.dataset{...} or an object with get_seq), got %s", who,
      type(ds) == "table" and "a table without get_seq (a config? pass it to rl.dataset)"
      or type(ds))
  end
end

function M.check_dataset_dims(ds, extern_data, keys)
  need_dataset("check_dataset_dims", ds)
  if type(extern_data) ~= "table" then
    fail("check_dataset_dims: extern_data must be a table, got %s", type(extern_data))
  end
  local have = ds:extern_data()
  if type(have) ~= "table" then
    fail("check_dataset_dims: dataset %s: extern_data() returned a %s, expected a table "
      .. "{key = {dim =, sparse =}}", ds_name(ds), type(have))
  end
  keys = keys or sorted_keys(extern_data)
  for _, key in ipairs(keys) do
    local e, d = extern_data[key], have[key]
    if not e then fail("check_dataset_dims: '%s' is not in the network's extern_data", key) end
    if not d then
      fail("check_dataset_dims: dataset %s has no '%s' (it has %s) but the network needs it",
        ds_name(ds), key, table.concat(sorted_keys(have), ", "))
    end
    if d.dim ~= e.dim then
      fail("check_dataset_dims: '%s': dataset %s has dim %s, the network expects dim %s", key,
        ds_name(ds), tostring(d.dim), tostring(e.dim))
    end
    if (d.sparse and true or false) ~= (e.sparse and true or false) then
      fail("check_dataset_dims: '%s': dataset %s is %s, the network expects it %s", key,
        ds_name(ds), d.sparse and "sparse" or "dense", e.sparse and "sparse" or "dense")
    end
    if (d.spatial == 2) ~= (e.spatial == 2) then
      fail("check_dataset_dims: '%s': dataset %s holds %s, the network expects %s", key,
        ds_name(ds), d.spatial == 2 and "images" or "sequences",
        e.spatial == 2 and "images (spatial = 2)" or "sequences")
    end
  end
end

---------------------------------------------------------------------------- batches

local function parse_chunking(c)
  if c == nil or c == false or c == "" or c == 0 then return nil end
  local size, step
  if type(c) == "string" then
    size, step = c:match("^(%d+):(%d+)$")
    if not size then size = c:match("^(%d+)$"); step = size end
  elseif type(c) == "number" then
    size, step = c, c
  end
  size, step = tonumber(size), tonumber(step)
  if not size or size < 1 or step < 1 then
    fail("rl.batches: chunking must be \"size:step\" with positive integers, got %s", tostring(c))
  end
  return math.tointeger(size), math.tointeger(step)
end

local function seq_keys(seq, keys)
  local ks = {}
  for _, k in ipairs(keys) do
    if seq[k] ~= nil then ks[#ks + 1] = k end
  end
  return ks
end

local function stack(items, key, T)
  local first = items[1].seq[key]
  local B = #items
  local out
  if first:dim() == 1 then
    out = rl.zeros({T, B}, first:dtype())
  else
    out = rl.zeros({T, B, first:size(2)}, first:dtype())
  end
  for b, it in ipairs(items) do
    local l = it.len_of[key]
    if l > 0 then
      out:select(2, b):narrow(1, 1, l):copy(it.seq[key]:narrow(1, it.start + 1, l))
    end
  end
  return out
end

-- (H, W, B, F) zero-padded images and their (B, 2) sizes.
local function stack_images(items, H, W)
  local first = items[1].seq.data
  local out = rl.zeros({H, W, #items, first:size(3)}, first:dtype())
  local sizes = {}
  for b, it in ipairs(items) do
    local h, w = it.hw[1], it.hw[2]
    out:select(3, b):narrow(1, 1, h):narrow(2, 1, w):copy(it.seq.data)
    sizes[b] = {h, w}
  end
  return out, rl.tensor(sizes, "int32")
end

local function check_chunkable(seq, ks, T)
  for _, k in ipairs(ks) do
    if seq[k]:size(1) ~= T then
      fail("rl.batches: chunking: sequence '%s': key '%s' has %d frames but data has %d " ..
        "(chunking needs every key at data's frame rate; '%s' has its own length: " ..
        "train without chunking)", tostring(seq.tag), k, seq[k]:size(1), T, k)
    end
  end
end

-- One batch of items (whole sequences or chunks: {seq, pos, start, len, len_of, keys [, hw]}).
local function assemble(items, maxH, maxW)
  local batch = {tags = {}, seqs = {}, starts = {}, n_frames = 0}
  local lens = {}
  for b, it in ipairs(items) do
    lens[b] = it.len
    batch.tags[b] = it.seq.tag
    batch.seqs[b] = it.pos
    batch.starts[b] = it.start
    batch.n_frames = batch.n_frames + it.len
  end
  batch.lengths = rl.tensor(lens, "int32")
  for _, k in ipairs(items[1].keys) do
    local T, klens = 1, {}
    for b, it in ipairs(items) do
      if not it.len_of[k] then
        fail("rl.batches: sequence '%s' lacks '%s' which others in the dataset have",
          tostring(it.seq.tag), k)
      end
      klens[b] = it.len_of[k]
      T = math.max(T, klens[b])
    end
    if k == "data" and items[1].hw then
      batch.data, batch.sizes = stack_images(items, maxH, maxW)
    else
      batch[k] = stack(items, k, T)
      if k ~= "data" then batch["lengths_" .. k] = rl.tensor(klens, "int32") end
    end
  end
  return batch
end

-- rl.batches with carry_state: B = min(max_seqs, batch_size // size) streams, each working
-- through one sequence chunk by chunk; a finished stream takes the next sequence of the epoch
-- in its slot, and once none is left the remaining streams close up (state_from names their
-- slots in the batch before).
local function stream_batches(ds, keys, n, bs, ms, csize, cstep)
  if not csize then
    fail("rl.batches: carry_state needs chunking = \"size\" (the length of the chunks)")
  end
  if cstep ~= csize then
    fail("rl.batches: carry_state needs chunks that follow each other without overlap "
      .. "(chunking = \"%d\" or \"%d:%d\"), got chunking = \"%d:%d\"", csize, csize, csize,
      csize, cstep)
  end
  local nstreams = math.max(1, math.min(ms, bs // csize))
  local i = 0        -- last sequence taken from the dataset
  local streams = {} -- {seq, pos, T, next = 0-based next frame, keys} in slot order
  local function next_stream()
    while i < n do
      i = i + 1
      local seq = ds:get_seq(i)
      if type(seq) ~= "table" or not rl.is_tensor(seq.data) then
        fail("rl.batches: dataset %s: get_seq(%d) gave no data tensor", ds_name(ds), i)
      end
      if seq.data:dim() == 3 and not seq.data:dtype():find("int") then
        fail("rl.batches: dataset %s holds images: carry_state does not apply to them",
          ds_name(ds))
      end
      local T = seq.data:size(1)
      local ks = seq_keys(seq, keys)
      check_chunkable(seq, ks, T)
      if T > 0 then return {seq = seq, pos = i, T = T, next = 0, keys = ks} end
    end
    return nil
  end
  return function()
    local items, from, kept = {}, {}, {}
    for slot, st in ipairs(streams) do
      if st.next < st.T then
        kept[#kept + 1] = st
        from[#kept] = slot
      else
        local fresh = next_stream()
        if fresh then
          kept[#kept + 1] = fresh
          from[#kept] = 0
        end
      end
    end
    while #kept < nstreams do
      local fresh = next_stream()
      if not fresh then break end
      kept[#kept + 1] = fresh
      from[#kept] = 0
    end
    streams = kept
    if #streams == 0 then return nil end
    for b, st in ipairs(streams) do
      local l = math.min(csize, st.T - st.next)
      local len_of = {}
      for _, k in ipairs(st.keys) do len_of[k] = l end
      items[b] = {seq = st.seq, pos = st.pos, start = st.next, len = l, len_of = len_of,
        keys = st.keys}
      st.next = st.next + l
    end
    local batch = assemble(items)
    batch.state_from = from
    return batch
  end
end

function M.batches(ds, opts)
  need_dataset("rl.batches", ds)
  opts = opts or {}
  if type(opts) ~= "table" then fail("rl.batches: opts must be a table, got %s", type(opts)) end
  for k in pairs(opts) do
    if k ~= "batch_size" and k ~= "max_seqs" and k ~= "chunking" and k ~= "carry_state" then
      fail("rl.batches: unknown option '%s' (batch_size, max_seqs, chunking, carry_state)",
        tostring(k))
    end
  end
  local bs = opts.batch_size or math.huge
  local ms = opts.max_seqs or math.huge
  if type(bs) ~= "number" or bs < 1 then
    fail("rl.batches: batch_size must be a positive number of frames")
  end
  if type(ms) ~= "number" or ms < 1 then fail("rl.batches: max_seqs must be a positive integer") end
  local csize, cstep = parse_chunking(opts.chunking)
  local keys = ds:keys()
  local n = ds:num_seqs()
  -- a dataset object written in Lua may return anything: say which method gave what
  if type(keys) ~= "table" then
    fail("rl.batches: dataset %s: keys() returned a %s, expected a list of names", ds_name(ds),
      type(keys))
  end
  if math.type(n) ~= "integer" or n < 0 then
    fail("rl.batches: dataset %s: num_seqs() returned %s (a %s), expected an integer >= 0",
      ds_name(ds), tostring(n), type(n))
  end
  if opts.carry_state ~= nil and type(opts.carry_state) ~= "boolean" then
    fail("rl.batches: carry_state must be true or false, got %s", type(opts.carry_state))
  end
  if opts.carry_state then return stream_batches(ds, keys, n, bs, ms, csize, cstep) end
  local i = 0          -- last sequence taken from the dataset
  local queue = {}     -- items (whole sequences or chunks) not yet batched
  local qpos = 1

  local function refill()
    while qpos > #queue and i < n do
      i = i + 1
      queue, qpos = {}, 1
      local seq = ds:get_seq(i)
      if type(seq) ~= "table" or not rl.is_tensor(seq.data) then
        fail("rl.batches: dataset %s: get_seq(%d) gave no data tensor", ds_name(ds), i)
      end
      local image = seq.data:dim() == 3 and not seq.data:dtype():find("int")
      local T = image and seq.data:size(1) * seq.data:size(2) or seq.data:size(1)
      local ks = seq_keys(seq, keys)
      if image then
        if csize then
          fail("rl.batches: dataset %s holds images: chunking does not apply to them", ds_name(ds))
        end
        local len_of = {data = T}
        for _, k in ipairs(ks) do
          if k ~= "data" then len_of[k] = seq[k]:size(1) end
        end
        queue[1] = {seq = seq, pos = i, start = 0, len = T, len_of = len_of, keys = ks,
          hw = {seq.data:size(1), seq.data:size(2)}}
      elseif csize then
        check_chunkable(seq, ks, T)
        local start = 0
        while start < T do
          local l = math.min(csize, T - start)
          local len_of = {}
          for _, k in ipairs(ks) do len_of[k] = l end
          queue[#queue + 1] = {seq = seq, pos = i, start = start, len = l, len_of = len_of,
            keys = ks}
          start = start + cstep
        end
      else
        local len_of = {}
        for _, k in ipairs(ks) do len_of[k] = seq[k]:size(1) end
        queue[1] = {seq = seq, pos = i, start = 0, len = T, len_of = len_of, keys = ks}
      end
    end
    return qpos <= #queue
  end

  return function()
    local items, maxT, maxH, maxW = {}, 0, 0, 0
    while refill() do
      local it = queue[qpos]
      local m = math.max(maxT, it.len)
      if it.hw then m = math.max(maxH, it.hw[1]) * math.max(maxW, it.hw[2]) end
      if #items > 0 and (m * (#items + 1) > bs or #items + 1 > ms) then break end
      if #items > 0 and (it.hw == nil) ~= (items[1].hw == nil) then
        fail("rl.batches: dataset %s mixes images and sequences ('%s')", ds_name(ds),
          tostring(it.seq.tag))
      end
      items[#items + 1] = it
      maxT = m
      if it.hw then maxH, maxW = math.max(maxH, it.hw[1]), math.max(maxW, it.hw[2]) end
      qpos = qpos + 1
    end
    if #items == 0 then return nil end
    return assemble(items, maxH, maxW)
  end
end

---------------------------------------------------------------------------- writing

local Writer = {}
Writer.__index = Writer

local function check_stream(where, key, t, dim, sparse)
  if not rl.is_tensor(t) then fail("%s: '%s' must be a tensor, got %s", where, key, type(t)) end
  if sparse then
    if t:dim() ~= 1 then
      fail("%s: sparse '%s' must be (T), got %s", where, key, tostring(t:size()))
    end
  elseif t:dim() ~= 2 or t:size(2) ~= dim then
    fail("%s: dense '%s' must be (T, %d), got %s", where, key, dim, tostring(t:size()))
  end
end

function M.hdf_writer(path, opts)
  if type(path) ~= "string" then fail("rl.hdf_writer: path must be a string") end
  opts = opts or {}
  local dd = opts.data_dim
  if math.type(dd) ~= "integer" or dd < 1 then
    fail("rl.hdf_writer: %s: data_dim must be a positive integer, got %s", path, tostring(dd))
  end
  if opts.spatial ~= nil and opts.spatial ~= 2 and opts.spatial ~= 1 then
    fail("rl.hdf_writer: %s: spatial must be 2 (images) or 1, got %s", path, tostring(opts.spatial))
  end
  if opts.spatial == 2 and opts.sparse then
    fail("rl.hdf_writer: %s: images (spatial = 2) must be dense", path)
  end
  local w = setmetatable({path = path, data_dim = dd, sparse = opts.sparse and true or false,
    spatial = opts.spatial == 2, sizes = {},
    targets = {}, target_keys = {}, labels = opts.labels, target_labels = opts.target_labels or {},
    tags = {}, data = {}, tdata = {}, extra = opts.extra or {}}, Writer)
  for _, key in ipairs(sorted_keys(opts.targets or {})) do
    local t = opts.targets[key]
    if key == "data" then fail("rl.hdf_writer: %s: a target may not be called 'data'", path) end
    if math.type(t.dim) ~= "integer" or t.dim < 1 then
      fail("rl.hdf_writer: %s: target '%s' needs dim, a positive integer", path, key)
    end
    w.targets[key] = {dim = t.dim, sparse = t.sparse and true or false}
    w.target_keys[#w.target_keys + 1] = key
    w.tdata[key] = {}
  end
  return w
end

local function own_copy(t, sparse)
  t = t:device() == "cpu" and t or t:cpu()
  local c = t:clone()
  if sparse then
    if c:dtype() ~= "int32" then c = c:int() end
  elseif c:dtype() ~= "float32" then
    c = c:float()
  end
  return c
end

function Writer:add(tag, data, targets)
  local where = "hdf_writer:add: " .. self.path
  if self.closed then fail("%s: the writer is closed", where) end
  if type(tag) ~= "string" then fail("%s: tag must be a string, got %s", where, type(tag)) end
  -- (refused here, where the sequence is named, rather than when close writes the tags)
  if tag:find("\0", 1, true) then
    fail("%s: tag %q holds a NUL byte, where it would end in the file", where, tag:gsub("%z.*", ""))
  end
  if self.spatial then
    if not rl.is_tensor(data) or data:dim() ~= 3 or data:size(3) ~= self.data_dim
        or data:size(1) < 1 or data:size(2) < 1 then
      fail("%s: images: data must be (h, w, %d), got %s", where, self.data_dim,
        rl.is_tensor(data) and tostring(data:size()) or type(data))
    end
    self.sizes[#self.tags + 1] = {data:size(1), data:size(2)}
    data = data:contiguous():view(data:size(1) * data:size(2), self.data_dim)
  else
    check_stream(where, "data", data, self.data_dim, self.sparse)
  end
  targets = targets or {}
  for k in pairs(targets) do
    if not self.targets[k] then fail("%s: '%s' is not a declared target", where, tostring(k)) end
  end
  local n = #self.tags + 1
  self.data[n] = own_copy(data, self.sparse)
  for _, key in ipairs(self.target_keys) do
    local spec, t = self.targets[key], targets[key]
    if t == nil then fail("%s: sequence '%s' lacks target '%s'", where, tag, key) end
    check_stream(where, key, t, spec.dim, spec.sparse)
    self.tdata[key][n] = own_copy(t, spec.sparse)
  end
  self.tags[n] = tag
end

local function concat_rows(list, sparse, dim)
  local total = 0
  for _, t in ipairs(list) do total = total + t:size(1) end
  local out = sparse and rl.zeros({total}, "int32") or rl.zeros(total, dim)
  local pos = 1
  for _, t in ipairs(list) do
    local l = t:size(1)
    if l > 0 then out:narrow(1, pos, l):copy(t) end
    pos = pos + l
  end
  return out, total
end

function Writer:close()
  if self.closed then fail("hdf_writer:close: %s: already closed", self.path) end
  self.closed = true
  local f
  local ok, err = pcall(function()
    f = rl.h5file(self.path, "w")
    local n = #self.tags
    local inputs, total = concat_rows(self.data, self.sparse, self.data_dim)
    f:write("inputs", inputs)
    -- without targets RETURNN's HDFDataset still counts a dummy target "classes" in
    -- /seqLengths: a second column, 0
    local sl = {}
    for i = 1, n do
      local row = {self.data[i]:size(1)}
      for _, key in ipairs(self.target_keys) do row[#row + 1] = self.tdata[key][i]:size(1) end
      if #self.target_keys == 0 then row[2] = 0 end
      sl[i] = row
    end
    local ncol = math.max(2, 1 + #self.target_keys)
    f:write("seqLengths", n > 0 and rl.tensor(sl, "int32") or rl.zeros({0, ncol}, "int32"))
    f:write_strings("seqTags", self.tags)
    if self.spatial then
      f:write("seqSizes", n > 0 and rl.tensor(self.sizes, "int32") or rl.zeros({0, 2}, "int32"))
    end
    for _, key in ipairs(self.target_keys) do
      local spec = self.targets[key]
      f:write("targets/data/" .. key, (concat_rows(self.tdata[key], spec.sparse, spec.dim)))
      f:set_attr("targets/size", key, rl.tensor({spec.dim, spec.sparse and 1 or 2}, "int32"))
      -- RETURNN's HDFDataset reads /targets/labels whenever /targets exists; its writers name
      -- the labels <key>-class-<i> when none are given
      local labels = self.target_labels[key]
      if not labels then
        labels = {}
        for c = 0, spec.dim - 1 do labels[c + 1] = key .. "-class-" .. c end
      end
      f:write_strings("targets/labels/" .. key, labels)
    end
    if self.labels then f:write_strings("labels", self.labels) end
    for _, name in ipairs(sorted_keys(self.extra.datasets or {})) do
      f:write(name, self.extra.datasets[name])
    end
    for _, name in ipairs(sorted_keys(self.extra.attrs or {})) do
      f:set_attr("/", name, self.extra.attrs[name])
    end
    f:set_attr("/", "numSeqs", n)
    f:set_attr("/", "numTimesteps", total)
    f:set_attr("/", "inputPattSize", self.data_dim)
    f:set_attr("/", "numDims", 1)
    -- numLabels: RETURNN's writers store the class count of "classes" (or of sparse inputs)
    local nl = self.targets.classes and self.targets.classes.dim
      or (self.sparse and self.data_dim or 1)
    f:set_attr("/", "numLabels", nl)
    f:commit()
  end)
  if not ok then
    -- nothing was written (a file at path is as it was): the sequences stay, so a close after
    -- the cause is gone (a full disk) writes them
    if f then f:close() end
    self.closed = false
    fail("hdf_writer:close: %s (the sequences are kept: close again to retry)",
      util.file_error(err, self.path))
  end
  self.data, self.tdata = nil, nil
  return self.path
end

function M.dataset_write(path, src, opts)
  opts = opts or {}
  local seqs, ext
  if is_dataset(src) then
    src:init_epoch(opts.epoch or 1)
    ext = opts.extern_data or src:extern_data()
    seqs = {}
    for i = 1, src:num_seqs() do seqs[i] = src:get_seq(i) end
  elseif type(src) == "table" then
    seqs = src
    if #seqs == 0 then fail("rl.dataset_write: %s: no sequences to write", path) end
    ext = opts.extern_data
    if not ext then -- infer: dense dims from the shapes, sparse dims from the largest class
      ext = {}
      for k, v in pairs(seqs[1]) do
        if k ~= "tag" and rl.is_tensor(v) then
          if v:dtype() == "int32" then
            local hi = 0
            for _, s in ipairs(seqs) do
              if s[k]:numel() > 0 then local m = s[k]:max()
              hi = math.max(hi, math.tointeger(m)) end
            end
            ext[k] = {dim = hi + 1, sparse = true}
          elseif v:dim() == 3 then
            ext[k] = {dim = v:size(3), spatial = 2}
          else
            ext[k] = {dim = v:size(2)}
          end
        end
      end
    end
  else
    fail("rl.dataset_write: expected a dataset or a list of sequences, got %s", type(src))
  end
  if not ext.data then fail("rl.dataset_write: %s: the sequences have no 'data'", path) end
  local targets = {}
  for k, v in pairs(ext) do
    if k ~= "data" then targets[k] = v end
  end
  local w = M.hdf_writer(path, {data_dim = ext.data.dim, sparse = ext.data.sparse,
    spatial = ext.data.spatial, targets = targets,
    target_labels = opts.target_labels, labels = opts.labels})
  for i, s in ipairs(seqs) do
    local t = {}
    for k in pairs(targets) do t[k] = s[k] end
    w:add(s.tag or string.format("seq-%d", i), s.data, t)
  end
  return w:close()
end

---------------------------------------------------------------------------- install

function M.install(r)
  rl = r
  rl.dataset = M.dataset
  rl.batches = M.batches
  rl.hdf_writer = M.hdf_writer
  rl.dataset_write = M.dataset_write
  rl.check_dataset_dims = M.check_dataset_dims
  rl.datasets = M
  -- for the audio dataset (lua/rnnlua/audio_dataset.lua), a subclass of Base reading Hdf
  M.Base, M.base_init, M.hdf_new = Base, base_init, hdf_new
  require("rnnlua.audio_dataset").install(r, M)
  require("rnnlua.augment").install(r)
end

return M
