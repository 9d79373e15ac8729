-- rl.audio: load (tests/data/audio_ref.wav, 16-bit PCM) and features against reference values
-- of torchaudio.compliance.kaldi.fbank / .mfcc stored by tests/data/audio_ref.py (log-mel,
-- 4 configurations: windows, band edges, magnitude, MFCC + deltas + normalisation), dither,
-- non-contiguous input, and every bad option as an error naming the option. Bad files are
-- tested in tests/c/test_audio.c.
local H = dofile("tests/lua/harness.lua")
local test, check, expect_error = H.test, H.check, H.expect_error
local R = dofile("tests/data/audio_ref.lua")
local wav = "tests/data/audio_ref.wav"

-- max |got - ref| over a (T, F) tensor against a table of rows
local function max_diff(got, ref)
  local g = got:totable()
  check(#g == #ref, string.format("frames: got %d, expected %d", #g, #ref))
  local m = 0
  for t = 1, #ref do
    check(#g[t] == #ref[t], string.format("columns: got %d, expected %d", #g[t], #ref[t]))
    for j = 1, #ref[t] do m = math.max(m, math.abs(g[t][j] - ref[t][j])) end
  end
  return m
end

local wave, rate
test("load wav", function()
  wave, rate = rl.audio.load(wav)
  check(rate == 16000, "rate " .. tostring(rate))
  check(wave:dim() == 1 and wave:size(1) == 9600 and wave:dtype() == "float32", tostring(wave))
  local lo, hi = 0, 0
  for _, v in ipairs(wave:totable()) do lo, hi = math.min(lo, v), math.max(hi, v) end
  check(lo >= -1 and hi < 1 and hi > 0.4, string.format("range [%g, %g]", lo, hi))
  local same, r2 = rl.audio.load(wav, {rate = 16000, resample = false})
  check(r2 == 16000 and same:size(1) == 9600, "same rate, no resampling")
end)

-- Tolerances: log-mel energies here span about [-16, 3]; float32 FFTs of different libraries
-- (FFTW vs PocketFFT) and float vs double sums agree to ~1e-4 absolute in the log domain.
local TOL = 2e-3
test("fbank 80 mels, povey (Kaldi defaults)", function()
  local d = max_diff(rl.audio.features(wave, {rate = rate, n_mels = 80}), R.fbank80_povey)
  check(d < TOL, "max diff " .. d)
  if os.getenv("RL_AUDIO_VERBOSE") then print("max diff", d) end
end)
test("fbank 40 mels, hamming, 20/12.5 ms, no pre-emphasis, band 100 Hz .. nyquist - 400", function()
  local f = rl.audio.features(wave, {rate = rate, n_mels = 40, window = "hamming", window_ms = 20,
                                     hop_ms = 12.5, preemph = 0, low_freq = 100, high_freq = -400})
  local d = max_diff(f, R.fbank40_hamming)
  check(d < TOL, "max diff " .. d)
  if os.getenv("RL_AUDIO_VERBOSE") then print("max diff", d) end
end)
test("fbank 24 mels, hann, magnitude, DC kept", function()
  local f = rl.audio.features(wave, {rate = rate, n_mels = 24, window = "hann", use_power = false,
                                     remove_dc = false})
  local d = max_diff(f, R.fbank24_hann_magnitude)
  check(d < TOL, "max diff " .. d)
  if os.getenv("RL_AUDIO_VERBOSE") then print("max diff", d) end
end)
test("mfcc 13 of 23 mels, lifter 22, deltas 2, normalized", function()
  local f = rl.audio.features(wave, {rate = rate, n_mels = 23, n_ceps = 13, deltas = 2,
                                     normalize = true})
  check(f:size(2) == 39, "39 columns")
  -- normalized columns are unit-variance, so this is a relative tolerance
  local d = max_diff(f, R.mfcc13_deltas_cmvn)
  check(d < 5e-3, "max diff " .. d)
end)

test("snip_edges = false: frames centred on the hops, edges reflected", function()
  local f = rl.audio.features(wave, {rate = rate, n_mels = 80, snip_edges = false})
  check(f:size(1) == 60, "(9600 + 80) // 160 = 60 frames, got " .. f:size(1))
  local d = max_diff(f, R.fbank80_povey_nosnip)
  check(d < TOL, "80 mels, povey: max diff " .. d)
  f = rl.audio.features(wave, {rate = rate, n_mels = 40, window = "hamming", window_ms = 20,
                               hop_ms = 12.5, snip_edges = false})
  d = max_diff(f, R.fbank40_hamming_nosnip)
  check(d < TOL, "40 mels, hamming, 20/12.5 ms: max diff " .. d)
  -- 500 samples: 3 frames, the first reaching 120 samples before the start, the last 100 after
  -- the end
  f = rl.audio.features(wave:narrow(1, 1, 500), {rate = rate, n_mels = 80, snip_edges = false})
  d = max_diff(f, R.fbank80_short_nosnip)
  check(d < TOL, "500 samples: max diff " .. d)
  if os.getenv("RL_AUDIO_VERBOSE") then print("max diff", d) end
  -- frames that stay inside the waveform equal the snip_edges frames that start at the same
  -- sample: without snipping, frame t >= 1 starts at sample 160 t - 120
  local a = rl.audio.features(wave, {n_mels = 40, snip_edges = false})
  local b = rl.audio.features(wave:narrow(1, 41, 9600 - 40), {n_mels = 40})
  check((a:narrow(1, 2, 20) - b:narrow(1, 1, 20)):abs():max() == 0, "interior frames")
end)
expect_error("snip_edges = false: too short for one frame", function()
  rl.audio.features(rl.zeros(50), {snip_edges = false})
end, "too few for one frame with snip_edges = false")

test("a strided wave gives the same features", function()
  local two = rl.zeros(9600, 2)
  two:select(2, 1):copy(wave)
  local a = rl.audio.features(two:select(2, 1), {n_mels = 40}):totable()
  local b = rl.audio.features(wave, {n_mels = 40}):totable()
  for t = 1, #a do for j = 1, #a[t] do check(a[t][j] == b[t][j], "frame " .. t) end end
end)

test("dither: seeded, small, reproducible", function()
  local a = rl.audio.features(wave, {n_mels = 40, dither = 1e-4, seed = 3}):totable()
  local b = rl.audio.features(wave, {n_mels = 40, dither = 1e-4, seed = 3}):totable()
  local c = rl.audio.features(wave, {n_mels = 40}):totable()
  local same, diff = true, 0
  for t = 1, #a do
    for j = 1, #a[t] do
      same = same and a[t][j] == b[t][j]
      diff = math.max(diff, math.abs(a[t][j] - c[t][j]))
    end
  end
  check(same, "same seed, same features")
  check(diff > 0 and diff < 0.5, "dither changed features by " .. diff)
end)

local w = nil
test("setup", function() w = rl.audio.load(wav) end)
local function bad(name, cfg, pattern)
  expect_error("bad option " .. name, function() rl.audio.features(w, cfg) end, pattern)
end
bad("n_mels 0", {n_mels = 0}, "n_mels")
bad("n_mels fraction", {n_mels = 2.5}, "'n_mels' must be an integer")
bad("n_mels too many", {n_mels = 400}, "n_mels = 400 is too many")
bad("window name", {window = "blackman"}, "'window' must be")
bad("window_ms", {window_ms = -1}, "window_ms")
bad("hop_ms", {hop_ms = 0}, "hop_ms")
bad("hop_ms string", {hop_ms = "10"}, "'hop_ms' must be a number")
bad("low_freq", {low_freq = 9000}, "low_freq")
bad("high_freq", {high_freq = 9000}, "high_freq")
bad("band empty", {low_freq = 4000, high_freq = 3000}, "high_freq")
bad("preemph", {preemph = 1.5}, "preemph")
bad("dither", {dither = -1}, "dither")
bad("floor", {floor = 0}, "floor")
bad("n_ceps > n_mels", {n_mels = 10, n_ceps = 13}, "n_ceps")
bad("lifter without mfcc", {lifter = 22}, "lifter")
bad("deltas", {deltas = 3}, "deltas")
bad("rate", {rate = 0}, "rate")
bad("unknown option", {nmels = 40}, "unknown option 'nmels'")
bad("remove_dc not boolean", {remove_dc = 1}, "'remove_dc' must be a boolean")
expect_error("wave shorter than a window", function()
  rl.audio.features(rl.zeros(100), {})
end, "fewer than one window")
expect_error("wave with a NaN", function()
  local x = rl.zeros(1000)
  x:narrow(1, 500, 1):fill(0 / 0)
  rl.audio.features(x, {})
end, "sample 499 of the waveform is not finite")
expect_error("wave 2-D", function() rl.audio.features(rl.zeros(10, 10), {}) end,
  "1-D float32 CPU tensor")
expect_error("wave float64", function()
  rl.audio.features(rl.zeros(1000):to("float64"), {})
end, "1-D float32 CPU tensor")
expect_error("load: missing file", function() rl.audio.load("no/such/file.wav") end,
  "no/such/file.wav")
expect_error("load: wrong rate without resampling", function()
  rl.audio.load(wav, {rate = 8000, resample = false})
end, "resample = false")
expect_error("load: bad rate", function() rl.audio.load(wav, {rate = -5}) end, "'rate'")
expect_error("load: unknown option", function() rl.audio.load(wav, {rat = 5}) end,
  "unknown option 'rat'")

test("load with resampling to 8 kHz", function()
  local x, r = rl.audio.load(wav, {rate = 8000})
  check(r == 8000 and math.abs(x:size(1) - 4800) <= 1, "4800 samples at 8 kHz, got " .. x:size(1))
  local f = rl.audio.features(x, {rate = 8000, n_mels = 23})
  check(f:size(1) == 58, "58 frames")
end)

-- Found by fuzz/fuzz_wav.c: a float WAV may hold any finite sample; near FLT_MAX resampling
-- gave Inf samples, and the features of such a waveform were the floor's or FLT_MAX's log
-- (the power spectrum overflowed) instead of an error.
test("float samples near FLT_MAX: resampling and features are errors", function()
  local path = os.tmpname() .. ".wav"
  local n, data = 800, {}
  for i = 1, n do data[i] = string.pack("<f", i <= n // 2 and 3.3e38 or -3.3e38) end
  local body = table.concat(data)
  local f = assert(io.open(path, "wb"))
  f:write("RIFF", string.pack("<I4", 36 + #body), "WAVEfmt ",
    string.pack("<I4I2I2I4I4I2I2", 16, 3, 1, 22050, 22050 * 4, 4, 32), "data",
    string.pack("<I4", #body), body)
  f:close()
  local w = rl.audio.load(path)
  check(w:size(1) == n, "the file loads as it is")
  expect_error("resampled", function() rl.audio.load(path, {rate = 16000}) end,
    "resampling 22050 Hz to 16000 Hz overflows float32")
  expect_error("features", function() rl.audio.features(w, {rate = 22050}) end,
    "frame 0 overflows float32")
  os.remove(path)
end)

H.done()
