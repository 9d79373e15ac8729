-- Augmentation on the fly (core/augment.c, lua/rnnlua/augment.lua): each transform on a small
-- case checked by hand (masks only inside the sequence and within their widths, identity at
-- probability 0 and for the identity affine map, a disk dilation and erosion, a time warp that
-- moves its centre, speed changing the length by the factor and keeping the band, tempo
-- changing the duration by the factor and keeping the pitch, the SNR of the added noise), the
-- draws keyed by (seed, epoch, sequence) (same bits for the same key, other masks in another
-- epoch, a resumed rl.train equal to the uninterrupted one), the datasets' augment option on
-- features, images and audio, and every bad option or noise file as an error naming it.
local H = dofile("tests/lua/harness.lua")
local test, check, expect_error = H.test, H.check, H.expect_error

local lfs = require("lfs")
local dir = H.tmpdir()

local function same_bits(a, b)
  if a:dim() ~= b:dim() then return false end
  for d = 1, a:dim() do
    if a:size(d) ~= b:size(d) then return false end
  end
  return a:numel() == 0 or (a - b):abs():max() == 0
end

local function write(path, s)
  local f = assert(io.open(path, "wb"))
  f:write(s)
  f:close()
end

-- 16-bit mono PCM WAV of the samples produced by fn(i) in [-1, 1]
local function write_wav(path, n, rate, fn)
  local parts = {}
  for i = 1, n do parts[i] = string.pack("<i2", math.floor(fn(i) * 32767 + 0.5)) end
  local body = table.concat(parts)
  write(path, "RIFF" .. string.pack("<I4", 36 + #body) .. "WAVEfmt " ..
    string.pack("<I4I2I2I4I4I2I2", 16, 1, 1, rate, rate * 2, 2, 16) .. "data" ..
    string.pack("<I4", #body) .. body)
end

-- The rows (time frames) and columns of a (T, F) tensor that are entirely `v`.
local function full_rows_cols(x, v)
  local t = x:totable()
  local rows, cols = {}, {}
  for i = 1, #t do
    local all = true
    for j = 1, #t[i] do all = all and t[i][j] == v end
    if all then rows[#rows + 1] = i end
  end
  for j = 1, #t[1] do
    local all = true
    for i = 1, #t do all = all and t[i][j] == v end
    if all then cols[#cols + 1] = j end
  end
  return rows, cols, t
end

---------------------------------------------------------------------------- SpecAugment

test("masks: only whole frames and columns, within the widths, never outside the sequence",
  function()
    local cfg = rl.augment.config{spec = {time_masks = 2, time_width = 4, freq_masks = 1,
      freq_width = 3}}
    local x = rl.ones(30, 8)
    local masked_some = 0
    for index = 1, 40 do
      local y = cfg:features(x, 5, 1, index)
      check(y:size(1) == 30 and y:size(2) == 8, "the shape is kept")
      local rows, cols, t = full_rows_cols(y, 0)
      local in_row, in_col = {}, {}
      for _, r in ipairs(rows) do in_row[r] = true end
      for _, c in ipairs(cols) do in_col[c] = true end
      -- every 0 lies in a masked frame or column; everything else is untouched
      for i = 1, 30 do
        for j = 1, 8 do
          local v = t[i][j]
          check(v == 1 or (v == 0 and (in_row[i] or in_col[j])), "stray value at " .. i .. "," .. j)
        end
      end
      check(#rows <= 8, "two time masks of at most 4 frames: " .. #rows)
      check(#cols <= 3, "one frequency mask of at most 3 columns: " .. #cols)
      if #rows + #cols > 0 then masked_some = masked_some + 1 end
    end
    check(masked_some > 30, "masks were drawn: " .. masked_some .. " of 40")
  end)

test("time_ratio bounds a time mask by a share of the sequence; value is the mask's value",
  function()
    local cfg = rl.augment.config{spec = {time_masks = 1, time_width = 50, time_ratio = 0.25,
      value = -3}}
    local widest = 0
    for index = 1, 60 do
      local rows = full_rows_cols(cfg:features(rl.ones(12, 4), 1, 1, index), -3)
      widest = math.max(widest, #rows)
    end
    check(widest == 3, "at most 0.25 * 12 = 3 frames, and 3 reached: " .. widest)
  end)

test("masks through rl.batches: padded frames stay padding, lengths unchanged", function()
  local seqs = {}
  for i = 1, 6 do
    seqs[i] = {tag = "s" .. i, data = rl.ones(3 + 2 * i, 5),
      classes = rl.zeros({3 + 2 * i}, "int32")}
  end
  local path = dir .. "/feat.h5"
  rl.dataset_write(path, seqs, {extern_data = {data = {dim = 5}, classes = {dim = 2, sparse = true}}})
  local ds = rl.dataset{class = "hdf", files = {path},
    augment = {spec = {time_masks = 3, time_width = 6, freq_masks = 2, freq_width = 2}}}
  for b in rl.batches(ds, {batch_size = 1000}) do
    local x, lens = b.data:totable(), b.lengths:totable()
    for j, len in ipairs(lens) do
      check(len == 3 + 2 * b.seqs[j], "length kept")
      for t = len + 1, #x do
        for f = 1, 5 do check(x[t][j][f] == 0, "padding stays 0") end
      end
    end
  end
end)

test("time warp: the centre frame moves to centre + distance, the ends stay", function()
  local ramp = {}
  for t = 1, 11 do ramp[t] = {t - 1, 10 * (t - 1)} end
  local x = rl.tensor(ramp)
  check(same_bits(rl.augment.warp(x, 5, 0), x), "distance 0 is the identity")
  local y = rl.augment.warp(x, 4, 2):totable()
  -- output frame 6 (0-based) reads input frame 4; frames 0 and 10 stay
  H.near(y[7][1], 4, 1e-6, "frame 6 = input 4")
  H.near(y[1][1], 0, 0, "first frame")
  H.near(y[11][1], 10, 1e-6, "last frame")
  H.near(y[4][1], 3 * 4 / 6, 1e-6, "frame 3 reads 3 * 4 / 6 (left side stretched)")
  H.near(y[4][2], 10 * 3 * 4 / 6, 1e-5, "every column alike")
  for t = 2, 11 do check(y[t][1] >= y[t - 1][1], "monotone") end
end)

test("frequency warp: along the frequency axis only, its ends kept, the other draws unchanged",
  function()
    -- frames constant along the frequency axis, which a warp along it leaves as they are: the
    -- time warp and the masks are the same with and without the frequency warp
    local flat, ramp = {}, {}
    for t = 1, 40 do
      flat[t], ramp[t] = {}, {}
      for f = 1, 12 do flat[t][f], ramp[t][f] = t, f - 1 end
    end
    local spec = {time_masks = 2, time_width = 4, freq_masks = 1, freq_width = 3, time_warp = 2}
    local a = rl.augment.config{spec = spec}:features(rl.tensor(flat), 1, 2, 3)
    spec.freq_warp = 0.2
    local b = rl.augment.config{spec = spec}:features(rl.tensor(flat), 1, 2, 3)
    check(same_bits(a, b), "time warp and masks unchanged")
    -- a ramp along frequency: every frame warped alike, monotone, its first and last bins kept;
    -- below the boundary (0.8 x 11 = 8.8) bin g reads the input at g / alpha, alpha in [0.9, 1.1]
    local cfg, moved = rl.augment.config{spec = {freq_warp = 0.1}}, false
    for i = 1, 20 do
      local y = cfg:features(rl.tensor(ramp), 1, 1, i):totable()
      for t = 1, 40 do
        check(y[t][1] == 0 and y[t][12] == 11, "ends kept")
        for f = 2, 12 do check(y[t][f] >= y[t][f - 1], "monotone") end
        for f = 1, 12 do check(y[t][f] == y[1][f], "every frame alike") end
      end
      local alpha = 1 / y[1][2] -- bin 1 reads the input at 1 / alpha
      check(alpha >= 0.9 - 1e-6 and alpha <= 1.1 + 1e-6, "factor in range: " .. alpha)
      for f = 2, 8 do H.near(y[1][f], (f - 1) / alpha, 1e-5, "bin g reads g / alpha") end
      for f = 2, 11 do moved = moved or y[1][f] ~= f - 1 end
    end
    check(moved, "some sequence's bins moved")
  end)

test("probability 0 is the identity for features and images", function()
  local off = rl.augment.config{spec = {p = 0, time_masks = 3, time_width = 5, time_warp = 2},
    affine = {p = 0, shear = 0.5}, elastic = {p = 0, alpha = 2}, stroke = {p = 0, radius = 1}}
  local x = rl.randn(20, 6)
  check(same_bits(off:features(x, 1, 1, 1), x), "features")
  local img = rl.rand(9, 14, 2)
  check(same_bits(off:image(img, 1, 1, 1), img), "image")
end)

test("same (seed, epoch, index) gives the same bits; another epoch, index or seed other draws",
  function()
    local cfg = rl.augment.config{spec = {time_masks = 2, time_width = 8, freq_masks = 2,
      freq_width = 4, time_warp = 3}}
    local x = rl.randn(60, 16)
    local a = cfg:features(x, 7, 3, 11)
    check(same_bits(a, cfg:features(x, 7, 3, 11)), "same key, same bits")
    check(same_bits(a, rl.augment.config{spec = {time_masks = 2, time_width = 8,
      freq_masks = 2, freq_width = 4, time_warp = 3}}:features(x, 7, 3, 11)), "a new config too")
    check(not same_bits(a, cfg:features(x, 7, 4, 11)), "another epoch")
    check(not same_bits(a, cfg:features(x, 7, 3, 12)), "another sequence")
    check(not same_bits(a, cfg:features(x, 8, 3, 11)), "another seed")
  end)

---------------------------------------------------------------------------- images

test("affine: identity parameters return the image; a shear widens to ceil(W + |s| H)", function()
  local img = rl.rand(7, 12, 3)
  check(same_bits(rl.augment.affine(img), img), "identity")
  check(same_bits(rl.augment.affine(img, {scale = 1, shear = 0, rotate = 0}), img), "explicit")
  local sh = rl.augment.affine(img, {shear = 0.5})
  check(sh:size(1) == 7 and sh:size(2) == 16, "shear 0.5 over 7 rows: 12 + 3.5 -> 16 wide, got " ..
    tostring(sh:size()))
  local big = rl.augment.affine(img, {scale = 2})
  check(big:size(1) == 14 and big:size(2) == 24, "scale 2 doubles both sides")
end)

test("affine: a quarter turn moves each pixel where it should", function()
  -- 2 x 3 image, values 1..6; rotating by 90 degrees gives 3 x 2
  local img = rl.tensor({{{1}, {2}, {3}}, {{4}, {5}, {6}}})
  local r = rl.augment.affine(img, {rotate = 90})
  check(r:size(1) == 3 and r:size(2) == 2, "3 x 2, got " .. tostring(r:size()))
  -- y down, x right: a positive angle turns x towards y, so the top row becomes the right column
  local t = r:totable()
  local want = {{4, 1}, {5, 2}, {6, 3}}
  for y = 1, 3 do
    for x = 1, 2 do H.near(t[y][x][1], want[y][x], 1e-5, string.format("pixel %d,%d", y, x)) end
  end
end)

test("stroke: dilation by a disk of radius 1 is a cross, erosion keeps the block's centre",
  function()
    local dot = rl.zeros(5, 5, 1)
    dot[3][3][1] = 1
    local d = rl.augment.stroke(dot, 1):view(5, 5):totable()
    local n = 0
    for y = 1, 5 do
      for x = 1, 5 do
        local want = (math.abs(y - 3) + math.abs(x - 3) <= 1) and 1 or 0
        check(d[y][x] == want, string.format("dilated %d,%d", y, x))
        n = n + d[y][x]
      end
    end
    check(n == 5, "five pixels")
    local block = rl.zeros(5, 5, 1)
    block:narrow(1, 2, 3):narrow(2, 2, 3):fill_(1)
    local e = rl.augment.stroke(block, -1):view(5, 5)
    check(e:sum() == 1 and e[3][3] == 1, "eroded to the centre")
    check(same_bits(rl.augment.stroke(block, 0), block), "radius 0 is the identity")
  end)

test("images: elastic keeps the size and moves pixels; all three on an image dataset", function()
  local img = rl.zeros(20, 40, 1)
  img:narrow(2, 10, 3):fill_(1)
  local el = rl.augment.config{elastic = {alpha = 2, sigma = 3}}
  local y = el:image(img, 1, 1, 1)
  check(y:size(1) == 20 and y:size(2) == 40, "size kept")
  check(not same_bits(y, img), "pixels moved")
  check(y:max() <= 1 + 1e-6 and y:min() >= -1e-6, "bilinear stays within the range")
  -- an image dataset with every image transform: shapes in the batch follow the images
  local seqs = {}
  for i = 1, 4 do
    local im = rl.zeros(10 + i, 30, 1)
    im:narrow(1, 3, 4):fill_(1)
    seqs[i] = {tag = "im" .. i, data = im, classes = rl.tensor({i % 3}, "int32")}
  end
  local path = dir .. "/img.h5"
  rl.dataset_write(path, seqs, {extern_data = {data = {dim = 1, spatial = 2},
    classes = {dim = 3, sparse = true}}})
  local aug = {affine = {shear = 0.4, scale = 0.1, rotate = 2}, elastic = {alpha = 1},
    stroke = {radius = 1}, spec = {time_masks = 1, time_width = 5, freq_masks = 1,
    freq_width = 2}, seed = 4}
  local ds = rl.dataset{class = "hdf", files = {path}, augment = aug}
  ds:init_epoch(1)
  local s = ds:get_seq(2)
  check(s.data:dim() == 3 and s.data:size(3) == 1, "an image")
  check(s.data:size(2) > 30, "sheared and rotated: wider, got " .. tostring(s.data:size()))
  check(same_bits(s.classes, seqs[2].classes), "targets as they are")
  local raw = rl.dataset{class = "hdf", files = {path}}
  raw:init_epoch(1)
  check(same_bits(raw:get_seq(2).data, seqs[2].data), "the file and an unaugmented read unchanged")
  local b = rl.batches(ds, {batch_size = 1e6})()
  check(b.sizes and b.sizes:size(1) == 4, "batch of 4 images with their sizes")
  local sz = b.sizes:totable()
  for j = 1, 4 do
    local g = ds:get_seq(j).data
    check(sz[j][1] == g:size(1) and sz[j][2] == g:size(2), "sizes of the augmented images")
  end
end)

---------------------------------------------------------------------------- datasets and resume

test("a dataset's draws: epoch and sequence number, not order or a fresh object", function()
  local aug = {spec = {time_masks = 2, time_width = 3, freq_masks = 1, freq_width = 2}}
  local function ds(order)
    return rl.dataset{class = "regression", num_seqs = 10, seed = 3, seq_ordering = order,
      augment = aug}
  end
  local a, b = ds("default"), ds("random")
  a:init_epoch(2)
  b:init_epoch(2)
  local by_tag = {}
  for i = 1, 10 do by_tag[a:get_seq(i).tag] = a:get_seq(i).data end
  for i = 1, 10 do
    local s = b:get_seq(i)
    check(same_bits(s.data, by_tag[s.tag]), "sequence " .. s.tag .. " alike in any order")
  end
  local differ = 0
  a:init_epoch(3)
  for i = 1, 10 do
    if not same_bits(a:get_seq(i).data, by_tag[a:get_seq(i).tag]) then differ = differ + 1 end
  end
  check(differ >= 8, "epoch 3 draws other masks: " .. differ .. " of 10 differ")
end)

test("from_epoch: the epochs before it get the data as it is, it and later ones augmented",
  function()
    local function ds(aug)
      return rl.dataset{class = "regression", num_seqs = 6, seed = 3, augment = aug}
    end
    local spec = {time_masks = 2, time_width = 3, freq_masks = 1, freq_width = 2}
    local plain, late, early = ds(), ds{from_epoch = 3, spec = spec}, ds{spec = spec}
    for epoch = 1, 4 do
      plain:init_epoch(epoch)
      late:init_epoch(epoch)
      early:init_epoch(epoch)
      local same, as_early = 0, 0
      for i = 1, 6 do
        if same_bits(late:get_seq(i).data, plain:get_seq(i).data) then same = same + 1 end
        if same_bits(late:get_seq(i).data, early:get_seq(i).data) then as_early = as_early + 1 end
      end
      if epoch < 3 then
        check(same == 6, string.format("epoch %d: %d of 6 as they are", epoch, same))
      else
        check(as_early == 6 and same <= 1, string.format("epoch %d: %d of 6 drawn as without " ..
          "from_epoch, %d of 6 unchanged", epoch, as_early, same))
      end
    end
  end)

test("rl.train: a resume from epoch 1 gives the bits of an uninterrupted 2-epoch run", function()
  local function config(extra)
    local c = {
      network = {fw = {class = "lstm", n_out = 6},
        output = {class = "softmax", from = "fw", loss = "ce", target = "classes"}},
      train = {class = "12ax", num_seqs = 16, seed = 1, min_len = 5, max_len = 15,
        seq_ordering = "random",
        augment = {spec = {time_masks = 2, time_width = 3, freq_masks = 1, freq_width = 2,
          time_warp = 1}}},
      num_epochs = 2, batch_size = 100, max_seqs = 8, optimizer = {class = "adam"},
      learning_rate = 0.02, log_verbosity = 0, seed = 3,
    }
    for k, v in pairs(extra or {}) do c[k] = v end
    return c
  end
  local full = rl.train(config{model = dir .. "/full/net"})
  rl.train(config{model = dir .. "/half/net", num_epochs = 1})
  local resumed = rl.train(config{model = dir .. "/half/net", load = dir .. "/half/net.001.h5"})
  check(same_bits(full.net:params(), resumed.net:params()), "resumed parameters")
  local plain = rl.train(config{model = dir .. "/plain/net",
    train = {class = "12ax", num_seqs = 16, seed = 1, min_len = 5, max_len = 15,
      seq_ordering = "random"}})
  check(not same_bits(full.net:params(), plain.net:params()), "augmentation changed training")
end)

---------------------------------------------------------------------------- audio

local RATE = 16000
local function sine(i) return 0.5 * math.sin(2 * math.pi * 440 * i / RATE) end

test("speed perturbation changes the length by the factor", function()
  local x = rl.zeros(16000)
  for i = 1, 16000, 97 do x[i] = sine(i) end
  for _, f in ipairs({0.8, 0.9, 1.1, 1.25}) do
    local y = rl.augment.speed(x, f)
    local want = 16000 / f
    check(math.abs(y:size(1) - want) <= 2, string.format("factor %g: %d samples, want %.1f", f,
      y:size(1), want))
  end
end)

-- the frequency of a (nearly) pure tone from its zero crossings over the middle 80%
local function tone_hz(y, rate)
  local t = y:totable()
  local lo, hi = math.floor(#t * 0.1), math.floor(#t * 0.9)
  local c = 0
  for i = lo + 1, hi do
    if (t[i - 1] < 0) ~= (t[i] < 0) then c = c + 1 end
  end
  return c / 2 / ((hi - lo) / rate)
end

local function rms(y) return math.sqrt(y:double():square():mean()) end

test("speed keeps the band: factor 1 is a copy, a 6 kHz tone passes at 0.95 and 1.05", function()
  local x = rl.zeros(16000)
  for i = 1, 16000 do x[i] = 0.5 * math.sin(2 * math.pi * 6000 * i / RATE) end
  check(same_bits(rl.augment.speed(x, 1), x), "factor 1: the input")
  for _, f in ipairs({0.95, 1.05}) do
    local y = rl.augment.speed(x, f)
    local r = rms(y:narrow(1, 2001, y:size(1) - 4000)) / rms(x)
    check(r > 0.97 and r < 1.03, string.format("factor %g: RMS ratio %.3f", f, r))
  end
end)

test("tempo changes the duration by the factor and keeps the pitch", function()
  local x = rl.zeros(2 * RATE)
  for i = 1, 2 * RATE do x[i] = 0.5 * math.sin(2 * math.pi * 200 * i / RATE) end
  H.near(tone_hz(x, RATE), 200, 1, "the input's tone")
  for _, f in ipairs({0.5, 0.8, 0.9, 1.1, 1.25, 2}) do
    local y = rl.augment.tempo(x, f, RATE)
    local want = math.floor(2 * RATE / f + 0.5)
    check(y:size(1) == want, string.format("factor %g: %d samples, want %d", f, y:size(1), want))
    local hz = tone_hz(y, RATE)
    check(math.abs(hz - 200) < 4, string.format("factor %g: tempo's tone at %.1f Hz", f, hz))
    local r = rms(y) / rms(x)
    check(r > 0.97 and r < 1.03, string.format("factor %g: RMS ratio %.3f", f, r))
    -- speed, by contrast, moves the tone with the factor (what the measure tells apart)
    local s = tone_hz(rl.augment.speed(x, f), RATE)
    check(math.abs(s - 200 * f) < 4 * f, string.format("factor %g: speed's tone %.1f Hz", f, s))
  end
  check(same_bits(rl.augment.tempo(x, 1, RATE), x), "factor 1: the input")
  -- a voice-like signal: two harmonics of 120 Hz under a slow envelope keep their period
  local v = rl.zeros(RATE)
  for i = 1, RATE do
    local a = 0.3 + 0.2 * math.sin(2 * math.pi * 3 * i / RATE)
    v[i] = a * (math.sin(2 * math.pi * 120 * i / RATE) + 0.5 * math.sin(2 * math.pi * 240 * i / RATE))
  end
  for _, f in ipairs({0.85, 1.15}) do
    local hz = tone_hz(rl.augment.tempo(v, f, RATE), RATE)
    check(math.abs(hz - tone_hz(v, RATE)) < 0.03 * 120,
      string.format("factor %g: %.1f Hz, the input %.1f Hz", f, hz, tone_hz(v, RATE)))
  end
end)

test("tempo draws: keyed by (seed, epoch, sequence), the factor within [min, max]", function()
  local x = rl.zeros(RATE)
  for i = 1, RATE do x[i] = sine(i) end
  local cfg = rl.augment.config{tempo = {min = 0.8, max = 1.25}}
  local lens = {}
  for index = 1, 12 do
    local y = cfg:wave(x, 5, 1, index, nil, RATE)
    check(y:size(1) >= RATE / 1.25 - 1 and y:size(1) <= RATE / 0.8 + 1,
      string.format("sequence %d: %d samples", index, y:size(1)))
    check(same_bits(y, cfg:wave(x, 5, 1, index, nil, RATE)), "the same key, the same bits")
    lens[y:size(1)] = true
  end
  local distinct = 0
  for _ in pairs(lens) do distinct = distinct + 1 end
  check(distinct >= 10, string.format("12 sequences, %d lengths", distinct))
  local other = 0
  for index = 1, 12 do
    if not same_bits(cfg:wave(x, 5, 2, index, nil, RATE), cfg:wave(x, 5, 1, index, nil, RATE)) then
      other = other + 1
    end
  end
  check(other == 12, string.format("another epoch: %d of 12 differ", other))
  -- tempo's draws take their own counter range: speed and noise draw as without it
  local z = {rl.randn(3000)}
  local sn = rl.augment.config{speed = {min = 0.9, max = 1.1}, noise = {snr = {5, 20}}}
  local snt = rl.augment.config{speed = {min = 0.9, max = 1.1}, noise = {snr = {5, 20}},
    tempo = {p = 0, min = 0.8, max = 1.25}}
  check(same_bits(sn:wave(x, 5, 1, 3, z), snt:wave(x, 5, 1, 3, z, RATE)), "tempo p = 0")
  check(cfg:wave_fires(5, 1, 3), "tempo p = 1 fires")
  check(not rl.augment.config{tempo = {p = 0}}:wave_fires(5, 1, 3), "tempo p = 0 does not")
end)

test("noise is added at the SNR asked for", function()
  local x = rl.zeros(8000)
  for i = 1, 8000 do x[i] = sine(i) end
  rl.manual_seed(2)
  local z = rl.randn(3000)
  for _, snr in ipairs({0, 7.5, 20}) do
    local y, g = rl.augment.add_noise(x, z, 1234, snr)
    local n = (y - x):double()
    local got = 10 * math.log(x:double():square():sum() / n:square():sum(), 10)
    H.near(got, snr, 1e-3, "measured SNR")
    check(g > 0, "a gain")
  end
end)

test("the drawn noise: the SNR of the range, a file of the list, speed p = 0 keeps the length",
  function()
    local x = rl.zeros(4000)
    for i = 1, 4000 do x[i] = sine(i) end
    rl.manual_seed(3)
    local noises = {rl.randn(1500), rl.rand(2500) - 0.5}
    for _, snr in ipairs({{7, 7}, {0, 20}}) do
      local cfg = rl.augment.config{speed = {p = 0}, noise = {snr = snr}}
      for index = 1, 20 do
        local y = cfg:wave(x, 9, 1, index, noises)
        check(y:size(1) == 4000, "length kept")
        local d = (y - x):double()
        local got = 10 * math.log(x:double():square():sum() / d:square():sum(), 10)
        check(got > snr[1] - 1e-3 and got < snr[2] + 1e-3,
          string.format("SNR %.4f outside [%g, %g]", got, snr[1], snr[2]))
      end
    end
  end)

-- An audio dataset over three WAV files, and a noise list.
lfs.mkdir(dir .. "/wav")
for i = 1, 3 do
  write_wav(string.format("%s/wav/u%d.wav", dir, i), 8000 + 2000 * i, RATE,
    function(k) return 0.3 * math.sin(2 * math.pi * (150 + 100 * i) * k / RATE) end)
end
write(dir .. "/list.tsv", "wav/u1.wav\tab\nwav/u2.wav\tba\nwav/u3.wav\taab\n")
local lcg = 12345
write_wav(dir .. "/wav/noise.wav", 5000, RATE, function()
  lcg = (lcg * 1103515245 + 12345) % 2147483648
  return lcg / 2147483648 - 0.5
end)
write(dir .. "/noise.txt", "wav/noise.wav\n")

local function audio(augment)
  return rl.dataset{class = "audio", list = dir .. "/list.tsv", vocab = "chars",
    features = {n_mels = 10}, quiet = true, augment = augment}
end

test("audio: speed changes the frame count, noise changes values, cached features untouched",
  function()
    local plain = audio()
    local fast = audio{speed = {min = 1.25, max = 1.25}}
    local noisy = audio{noise = {files = dir .. "/noise.txt", snr = {5, 5}}}
    plain:init_epoch(1)
    fast:init_epoch(1)
    noisy:init_epoch(1)
    for i = 1, 3 do
      local p, f, n = plain:get_seq(i), fast:get_seq(i), noisy:get_seq(i)
      local T = p.data:size(1)
      check(math.abs(f.data:size(1) - T / 1.25) <= 2, string.format("frames %d -> %d", T,
        f.data:size(1)))
      check(n.data:size(1) == T and not same_bits(n.data, p.data), "noise changes the values")
      check(same_bits(f.classes, p.classes), "labels kept")
    end
    check(same_bits(noisy:get_seq(2).data, noisy:get_seq(2).data), "same epoch, same bits")
    local again = audio{noise = {files = {dir .. "/wav/noise.wav"}, snr = {5, 5}}}
    again:init_epoch(1)
    check(same_bits(again:get_seq(3).data, noisy:get_seq(3).data), "a new dataset, same bits")
    noisy:init_epoch(2)
    local e2 = noisy:get_seq(3).data
    noisy:init_epoch(1)
    check(not same_bits(e2, noisy:get_seq(3).data), "another epoch, other noise")
    local slow = audio{tempo = {min = 0.8, max = 0.8}}
    slow:init_epoch(1)
    for i = 1, 3 do
      local T, s = plain:get_seq(i).data:size(1), slow:get_seq(i)
      check(math.abs(s.data:size(1) - T / 0.8) <= 2, string.format("tempo: frames %d -> %d", T,
        s.data:size(1)))
      check(same_bits(s.classes, plain:get_seq(i).classes), "tempo: labels kept")
    end
    local off = audio{speed = {p = 0}, noise = {p = 0, files = dir .. "/noise.txt"}}
    off:init_epoch(1)
    check(same_bits(off:get_seq(1).data, plain:get_seq(1).data), "p = 0: the cached features")
  end)

---------------------------------------------------------------------------- bad input

local feat_ds = {class = "regression", num_seqs = 3}
local function with(aug)
  local c = {}
  for k, v in pairs(feat_ds) do c[k] = v end
  c.augment = aug
  return function() rl.dataset(c) end
end

expect_error("probability above 1", with{spec = {p = 1.5}}, "augment.spec.p")
expect_error("probability below 0", with{spec = {p = -0.1}}, "augment.spec.p")
expect_error("negative width", with{spec = {time_width = -2}}, "augment.spec.time_width")
expect_error("negative count", with{spec = {freq_masks = -1}}, "augment.spec.freq_masks")
expect_error("fractional count", with{spec = {time_masks = 1.5}}, "augment.spec.time_masks")
expect_error("frequency warp beyond 0.2", with{spec = {freq_warp = 0.3}},
  "augment.spec.freq_warp must be in [0, 0.2], got 0.3")
expect_error("negative frequency warp", with{spec = {freq_warp = -0.1}},
  "augment.spec.freq_warp must be in [0, 0.2], got -0.1")
expect_error("unknown group", with{specaugment = {}}, "unknown option 'specaugment'")
expect_error("unknown option in a group", with{spec = {width = 3}}, "unknown option 'width'")
expect_error("not a table", with(3), "augment must be a table")
expect_error("from_epoch 0", with{from_epoch = 0, spec = {}},
  "augment.from_epoch must be an integer >= 1, got 0")
expect_error("from_epoch a fraction", with{from_epoch = 1.5, spec = {}}, "augment.from_epoch")
expect_error("image transform on features", with{affine = {shear = 0.2}},
  "augment.affine applies to images")
expect_error("speed on a dataset without audio", with{speed = {min = 0.9, max = 1.1}},
  "augment.speed applies to audio")
expect_error("speed factors reversed", function() audio{speed = {min = 1.2, max = 0.9}} end,
  "augment.speed")
expect_error("tempo on a dataset without audio", with{tempo = {min = 0.9, max = 1.1}},
  "augment.tempo applies to audio")
expect_error("tempo factors reversed", function() audio{tempo = {min = 1.2, max = 0.9}} end,
  "augment.tempo: the factors must satisfy")
expect_error("tempo factor 0", function() audio{tempo = {min = 0, max = 1.1}} end,
  "augment.tempo: the factors must satisfy 0.5 <= min <= max <= 2, got min 0")
expect_error("tempo factor negative", function() audio{tempo = {min = -1, max = -0.5}} end,
  "augment.tempo")
expect_error("tempo probability above 1", function() audio{tempo = {p = 1.5}} end,
  "augment.tempo.p: a probability must be in [0, 1], got 1.5")
expect_error("tempo probability below 0", function() audio{tempo = {p = -0.2}} end,
  "augment.tempo.p")
expect_error("tempo unknown option", function() audio{tempo = {factor = 1.1}} end,
  "augment.tempo: unknown option 'factor' (p, min, max)")
expect_error("tempo without the rate", function()
  rl.augment.config{tempo = {}}:wave(rl.ones(100), 1, 1, 1)
end, "tempo needs the waveform's rate")
expect_error("rl.augment.tempo factor 0", function() rl.augment.tempo(rl.ones(100), 0, RATE) end,
  "rl.augment.tempo: factor must be in [0.5, 2]")
expect_error("rl.augment.tempo rate 0", function() rl.augment.tempo(rl.ones(100), 1.1, 0) end,
  "rl.augment.tempo: rate must be > 0")
rl.dataset_write(dir .. "/sparse.h5", {{tag = "a", data = rl.tensor({1, 0, 2}, "int32")}},
  {extern_data = {data = {dim = 3, sparse = true}}})
expect_error("sparse data", function()
  rl.dataset{class = "hdf", files = {dir .. "/sparse.h5"}, augment = {spec = {}}}
end, "sparse")
expect_error("missing noise file", function()
  audio{noise = {files = {dir .. "/wav/none.wav"}}}
end, "none.wav")
write(dir .. "/wav/corrupt.wav", "RIFF\0\0\0\0WAVEjunk")
expect_error("corrupt noise file", function()
  audio{noise = {files = {dir .. "/wav/corrupt.wav"}}}
end, "corrupt.wav")
write_wav(dir .. "/wav/silent.wav", 800, RATE, function() return 0 end)
expect_error("silent noise file", function() audio{noise = {files = {dir .. "/wav/silent.wav"}}} end,
  "silent.wav is silent")
write(dir .. "/empty.txt", "\n")
expect_error("empty noise list", function() audio{noise = {files = dir .. "/empty.txt"}} end,
  "names no file")
expect_error("noise without files", function() audio{noise = {snr = 5}} end, "noise needs files")
expect_error("bad snr", function() audio{noise = {files = dir .. "/noise.txt", snr = {20, 5}}} end,
  "augment.noise.snr")

H.rm_rf(dir)
H.done()
