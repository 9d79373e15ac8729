-- Augmentation on the fly: the `augment` option of the built-in datasets (hdf, audio and the
-- generated tasks). The transforms are C (core/augment.c, rl.augment); this file checks which
-- of them fit a dataset's data, reads the noise recordings, and applies them in get_seq.
--
--   rl.dataset{class = "hdf", files = {...}, augment = {
--     seed = s,        -- default: the dataset's seed
--     from_epoch = 1,  -- the first (sub-)epoch augmented: earlier ones get the data as it is
--     spec = {p = 1, time_masks = 2, time_width = 20, time_ratio = 1, freq_masks = 2,
--             freq_width = 8, time_warp = 5, freq_warp = 0.1, value = 0},  -- features, images
--     affine = {p = 1, shear = 0.3, scale = 0.1, rotate = 1},     -- images
--     elastic = {p = 1, alpha = 1, sigma = 4},                    -- images
--     stroke = {p = 1, radius = 1},                               -- images
--     fill = 0,                                                   -- images' background
--     speed = {p = 1, min = 0.9, max = 1.1},                      -- class "audio"
--     tempo = {p = 1, min = 0.9, max = 1.1},                      -- class "audio"
--     noise = {p = 1, files = "noise.txt" | {"a.wav", ...}, snr = {5, 20}},  -- class "audio"
--   }}
-- A group given is on with p = 1 unless p says otherwise; options left out are 0 (no masks,
-- no warp, no shear, ...), except time_ratio 1, sigma 4 and snr 10 dB. The meaning of each
-- option is written at the top of core/augment.h.
--
-- Every draw is keyed by (seed, epoch, the sequence's number in the dataset), so the same seed
-- gives the same bits, another epoch other draws, and a resume at epoch e the batches the
-- uninterrupted run had; the order, partition_epoch and the thread count do not matter. The
-- data on disk and in the dataset's cache stay as they are: each get_seq returns new tensors.
-- Speed, tempo and noise need the waveform: an audio dataset reads the utterance's file again for the
-- sequences they apply to (others come from the feature cache), then computes the features and
-- applies normalize = "global" as for the cache. Noise files: a list file (one path a line,
-- relative to the list's folder) or a table of paths, read once at the dataset's rate; a
-- missing, corrupt or silent one is an error naming it.
local M = {}

local rl

local fail = require("rnnlua.util").fail

local function strip(msg)
  return (tostring(msg):gsub("^[^:\n]*:%d+: ", ""))
end

local IMAGE_ONLY = {"affine", "elastic", "stroke"}
local WAVE_ONLY = {"speed", "tempo", "noise"}

local Aug = {}
Aug.__index = Aug

local function noise_paths(files, who)
  if type(files) == "table" then
    if #files == 0 then fail("%s.noise.files: the list of noise files is empty", who) end
    for i, p in ipairs(files) do
      if type(p) ~= "string" then
        fail("%s.noise.files: entry %d must be a path, got %s", who, i, type(p))
      end
    end
    return files
  end
  if type(files) ~= "string" then
    fail("%s.noise.files must be a list file or a table of paths, got %s", who, type(files))
  end
  local f, err = io.open(files, "r")
  if not f then fail("%s.noise.files: cannot read %s", who, err) end
  local base = files:match("^(.*)/[^/]*$") or "."
  local paths, n = {}, 0
  for line in f:lines() do
    n = n + 1
    line = line:gsub("\r$", ""):gsub("^%s+", ""):gsub("%s+$", "")
    if line ~= "" then
      paths[#paths + 1] = line:sub(1, 1) == "/" and line or base .. "/" .. line
    end
  end
  f:close()
  if #paths == 0 then fail("%s.noise.files: %s names no file", who, files) end
  return paths
end

-- The augmenter of dataset ds (its _ext set), or nil without `augment`.
function M.new(ds, opts, where)
  if opts == nil then return nil end
  local who = where .. ": augment"
  if type(opts) ~= "table" then
    fail("%s must be a table of transforms (spec, affine, ...), got %s", who, type(opts))
  end
  local cfg = rl.augment.config(opts, who)
  local seed = opts.seed or ds.seed or 1
  if math.type(seed) ~= "integer" then
    fail("%s.seed must be an integer, got %s", who, tostring(seed))
  end
  local from = opts.from_epoch or 1
  if math.type(from) ~= "integer" or from < 1 then
    fail("%s.from_epoch must be an integer >= 1, got %s", who, tostring(from))
  end
  local data = ds._ext.data
  if data.sparse then
    fail("%s: the data is sparse (class indices): augmentation needs dense features or images",
      who)
  end
  local image = data.spatial == 2
  if not image then
    for _, g in ipairs(IMAGE_ONLY) do
      if opts[g] ~= nil then
        fail("%s.%s applies to images (spatial = 2); %s holds feature sequences", who, g, ds.name)
      end
    end
  end
  for _, g in ipairs(WAVE_ONLY) do
    if opts[g] ~= nil and not ds._wave_features then
      fail("%s.%s applies to audio (class = \"audio\"); %s has no waveforms", who, g, ds.name)
    end
  end
  local uses = cfg:uses()
  local self = setmetatable({cfg = cfg, seed = seed, from = from, image = image, uses = uses,
    wave = uses.speed or uses.tempo or uses.noise, noises = {}}, Aug)
  if opts.noise ~= nil then
    if opts.noise.files == nil then fail("%s.noise needs files = list file or {paths}", who) end
    for _, p in ipairs(noise_paths(opts.noise.files, who)) do
      local ok, w = pcall(rl.audio.load, p, {rate = ds._rate})
      if not ok then fail("%s.noise.files: %s", who, strip(w)) end
      if w:abs():max() == 0 then fail("%s.noise.files: %s is silent", who, p) end
      self.noises[#self.noises + 1] = w
    end
  end
  return self
end

-- The sequence k (the dataset's own number) of the current epoch, augmented: new tensors,
-- the other keys shared with `seq`.
function Aug:apply(ds, k, seq)
  local e = ds.epoch or 1
  if e < self.from then return seq end
  local x = seq.data
  if self.wave and self.cfg:wave_fires(self.seed, e, k) then
    x = ds:_wave_features(k, function(w)
      return self.cfg:wave(w, self.seed, e, k, self.noises, ds._rate)
    end)
  end
  if self.image then
    x = self.cfg:image(x, self.seed, e, k)
  elseif self.uses.spec then
    x = self.cfg:features(x, self.seed, e, k)
  end
  local out = {}
  for key, v in pairs(seq) do out[key] = v end
  out.data = x
  return out
end

function M.install(r)
  rl = r
end

return M
