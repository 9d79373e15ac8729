-- Spoken digit strings for recipes/speech_digits.lua (in the manner of TIDIGITS), synthesized
-- with espeak-ng and Festival (training, dev, test) and Flite (the held-out synthesizer) and made
-- noisy and reverberant with sox. Returns a table with
--   prepare(out_dir, opts) -> info {train =, dev =, test =, synth = (list files), vocab = (label
--                                   file), noise = (noise list), train_voices =, test_voices =}
--   text(digits, rng)      -> the words of a digit string ("0" is "zero" or "oh", drawn)
--   ACCENTS, HELD_OUT (test variants), FESTIVAL, FLITE (voices), VOCAB (the characters), SMOKE
--   (the smoke mode's opts)
--
-- Utterances: 1..7 digits (the count uniform), each digit uniform; a 0 is spoken "zero" or "oh"
-- (even odds). Transcripts are the words in lower case, one space between them.
--
-- Voices: a training or dev utterance is spoken by Festival (FESTIVAL_SHARE of them: one of
-- FESTIVAL's voices, duration stretched 0.8..1.25, pitch moved by sox by -300..300 cents) or else
-- by espeak-ng: one of its English accents (ACCENTS) times its voice variants (the files of
-- espeak-ng-data/voices/!v: m1..m8, f1..f5, klatt, whisper, ... about 100), speed 130..210 words
-- per minute, pitch 25..75 (of 0..99), a pause of 0..60 ms between words (espeak-ng -s -p -g).
-- The variants in HELD_OUT are never used for training or dev: the test set speaks only through
-- them (with every accent), so "test WER" is measured on unseen voices of a seen synthesizer.
-- The "synth" set is spoken only by Flite (FLITE's voices, duration stretched 0.8..1.25, mean
-- pitch 80..200 Hz), a synthesizer no training utterance comes from: "held-out synthesizer WER".
-- Flite's kal and kal16 are left out of it: they are Festival's kal_diphone diphones, which the
-- training set hears; its slt speaks with the voice of Festival's cmu_us_slt_arctic_hts (the
-- same speaker, another synthesis method).
-- sox then resamples to 16 kHz 16-bit, normalises the peak to -3 dBFS, adds reverberation to
-- half of the utterances (reverberance 20..80%, room scale 20..100%, pre-delay 0..30 ms) and
-- noise to 80% (white, pink or brown, at a signal-to-noise ratio of 5..30 dB against a typical
-- utterance's RMS of 0.11 after the normalisation). Everything follows from the seed: each
-- utterance has its own draws.
--
-- Files (out_dir, made once; out_dir/DONE records the configuration and is written last):
--   wav/<split>-<n>.wav, and train.tsv, dev.tsv, test.tsv, synth.tsv: lines
--   "wav/<split>-<n>.wav<TAB>words" (paths relative to the list file, as {class = "audio"} reads
--   them), train.voices, ...: lines "wav/<split>-<n>.wav<TAB>voice" (espeak-ng's accent+variant,
--   festival+VOICE or flite+VOICE), vocab.txt: the characters, one a line, "<space>" for the
--   space; noise/white.wav, pink.wav, brown.wav (10 s of sox's noise each) and noise.txt listing
--   them, for the training set's augmentation on the fly (augment.noise).
-- opts: n_train (default 8000), n_dev (300), n_test (1000), n_synth (1000), seed (1), jobs
-- (parallel synthesis processes, 2), quiet. espeak-ng, Festival and its voices, Flite and sox
-- come from Debian (scripts/deps.sh); when missing they are installed with apt-get (as root or
-- through sudo -n), or the error names them.
local M = {}

M.ACCENTS = {"en", "en-us", "en-gb-scotland", "en-gb-x-gbclan", "en-gb-x-rp", "en-gb-x-gbcwmd",
  "en-029", "en-us-nyc"}
-- test-only variants: male, female, klatt and named voices (no whisper: its few cues are a
-- training curiosity, not a fair test)
M.HELD_OUT = {"m3", "f2", "klatt3", "iven3", "steph2", "Andy", "belinda", "edward2", "michel",
  "quincy"}
M.WORDS = {[0] = "zero", "one", "two", "three", "four", "five", "six", "seven", "eight", "nine"}
M.VOCAB = {" ", "e", "f", "g", "h", "i", "n", "o", "r", "s", "t", "u", "v", "w", "x", "z"}
M.SMOKE = {n_train = 24, n_dev = 6, n_test = 6, n_synth = 6}
M.FESTIVAL = {"kal_diphone", "ked_diphone", "cmu_us_slt_arctic_hts"}
M.FESTIVAL_SHARE = 0.3
M.FLITE = {"awb", "rms", "slt"}

local VARIANT_DIRS = {"/usr/lib/x86_64-linux-gnu/espeak-ng-data/voices/!v",
  "/usr/lib/aarch64-linux-gnu/espeak-ng-data/voices/!v", "/usr/share/espeak-ng-data/voices/!v"}
local NOISE_RMS = {whitenoise = 0.229, pinknoise = 0.146, brownnoise = 0.418} -- of sox's synth
local SPEECH_RMS = 0.11

local function fail(fmt, ...) error("speech_digits: " .. string.format(fmt, ...), 0) end

local function shell_quote(s) return "'" .. s:gsub("'", "'\\''") .. "'" end

local FESTIVAL_VOICES = "/usr/share/festival/voices/"
-- {how to tell it is there, the Debian package}
local PACKAGES = {{"espeak-ng", "espeak-ng"}, {"sox", "sox"}, {"text2wave", "festival"},
  {"flite", "flite"}, {FESTIVAL_VOICES .. "english/kal_diphone", "festvox-kallpc16k"},
  {FESTIVAL_VOICES .. "english/ked_diphone", "festvox-kdlpc16k"},
  {FESTIVAL_VOICES .. "us/cmu_us_slt_arctic_hts", "festvox-us-slt-hts"}}

local function ensure_packages()
  local need = {}
  for _, p in ipairs(PACKAGES) do
    local there = p[1]:sub(1, 1) == "/" and require("lfs").attributes(p[1], "mode")
      or (p[1]:sub(1, 1) ~= "/" and os.execute("command -v " .. p[1] .. " >/dev/null 2>&1"))
    if not there then need[#need + 1] = p[2] end
  end
  if #need == 0 then return end
  local list = table.concat(need, " ")
  print("speech_digits: installing the missing Debian packages " .. list .. " with apt-get")
  local sudo = io.popen("id -u"):read("*l") == "0" and "" or "sudo -n "
  local install = sudo .. "apt-get install -y --no-install-recommends " .. list
    .. " >/dev/null 2>&1"
  if not (os.execute(install) or os.execute(sudo .. "apt-get update >/dev/null 2>&1 && " ..
      install)) then
    fail("could not install the Debian packages %s (needs root or password-less sudo and a " ..
      "reachable mirror); install them by hand: apt-get install %s", list, list)
  end
end

-- espeak-ng's voice variants (names without spaces), sorted; the held-out ones apart.
local function variants()
  local lfs = require("lfs")
  for _, d in ipairs(VARIANT_DIRS) do
    if lfs.attributes(d, "mode") == "directory" then
      local all = {}
      for e in lfs.dir(d) do
        if e:match("^[%w_-]+$") then all[#all + 1] = e end
      end
      table.sort(all)
      local held = {}
      for _, v in ipairs(M.HELD_OUT) do held[v] = true end
      local train, test = {}, {}
      for _, v in ipairs(all) do
        if held[v] then test[#test + 1] = v else train[#train + 1] = v end
      end
      if #test ~= #M.HELD_OUT then
        fail("%s lacks some of the held-out variants %s", d, table.concat(M.HELD_OUT, ", "))
      end
      return train, test
    end
  end
  fail("espeak-ng's voice variants not found (looked in %s)", table.concat(VARIANT_DIRS, ", "))
end

function M.text(digits, rng)
  local w = {}
  for i = 1, #digits do
    local d = tonumber(digits:sub(i, i))
    w[i] = (d == 0 and rng:uniform() < 0.5) and "oh" or M.WORDS[d]
  end
  return table.concat(w, " ")
end

-- A string as a Scheme string literal.
local function scheme_string(s)
  return '"' .. s:gsub('[\\"]', "\\%0") .. '"'
end

-- The utterance's synthesis from its draws: {kind =, voice =, cmd = (a shell line that writes
-- RAW, nil for Festival), scheme = (Festival's lines that write RAW), pitch = sox's pitch
-- shift or nil}.
local function synthesis(rng, split, voices, text, raw)
  if split == "synth" then
    local v = M.FLITE[rng:int(1, #M.FLITE)]
    return {voice = "flite+" .. v, cmd = string.format(
      "flite -voice %s --setf duration_stretch=%.3f --setf int_f0_target_mean=%d -t %s -o %s",
      v, 0.8 + 0.45 * rng:uniform(), rng:int(80, 200), shell_quote(text), raw)}
  end
  if split ~= "test" and rng:uniform() < M.FESTIVAL_SHARE then
    local v = M.FESTIVAL[rng:int(1, #M.FESTIVAL)]
    return {voice = "festival+" .. v, festival = v, pitch = rng:int(-300, 300),
      scheme = string.format("(Parameter.set 'Duration_Stretch %.3f)\n" ..
        "(utt.save.wave (utt.synth (Utterance Text %s)) %s 'riff)", 0.8 + 0.45 * rng:uniform(),
        scheme_string(text), scheme_string(raw))}
  end
  local accent = M.ACCENTS[rng:int(1, #M.ACCENTS)]
  local variant = voices[rng:int(1, #voices)]
  return {voice = string.format("%s+%s", accent, variant), cmd = string.format(
    "espeak-ng -v %s+%s -s %d -p %d -g %d -w %s %s", accent, variant, rng:int(130, 210),
    rng:int(25, 75), rng:int(0, 6), raw, shell_quote(text))}
end

-- The shell line that makes `wav` from the utterance's draws, and the synthesis (above).
local function job(rng, split, voices, text, wav)
  local tmp = wav:gsub("%.wav$", "")
  local syn = synthesis(rng, split, voices, text, tmp .. ".raw.wav")
  local cmd = {syn.cmd}
  local fx = (syn.pitch and string.format("pitch %d ", syn.pitch) or "") .. "gain -n -3"
  if rng:uniform() < 0.5 then
    fx = fx .. string.format(" reverb %d 50 %d 100 %d", rng:int(20, 80), rng:int(20, 100),
      rng:int(0, 30))
  end
  local noisy = rng:uniform() < 0.8
  local kinds = {"whitenoise", "pinknoise", "brownnoise"}
  local kind = kinds[rng:int(1, 3)]
  local snr = 5 + 25 * rng:uniform()
  if noisy then
    local vol = SPEECH_RMS / (NOISE_RMS[kind] * 10 ^ (snr / 20))
    -- sox -R seeds its noise with a fixed number: each utterance takes the noise from its own
    -- offset into that stream (padding the input, then cutting the padding off)
    local skip = string.format("%.4f", 5 * rng:uniform())
    cmd[#cmd + 1] = string.format("sox -R %s.raw.wav -r 16000 -b 16 %s.clean.wav %s", tmp, tmp, fx)
    cmd[#cmd + 1] = string.format("sox -R %s.clean.wav -p pad %s synth %s vol %.5f trim %s | " ..
      "sox -R -m -v 1 %s.clean.wav -v 1 - -b 16 %s", tmp, skip, kind, vol, skip, tmp, wav)
    cmd[#cmd + 1] = string.format("rm -f %s.raw.wav %s.clean.wav", tmp, tmp)
  else
    cmd[#cmd + 1] = string.format("sox -R %s.raw.wav -r 16000 -b 16 %s %s", tmp, wav, fx)
    cmd[#cmd + 1] = string.format("rm -f %s.raw.wav", tmp)
  end
  return table.concat(cmd, " && "), syn
end

-- Each split's own random stream (keys of new_rng).
local SPLIT_STREAM = {train = 5, dev = 3, test = 4, synth = 6}
local NOISES = {white = "whitenoise", pink = "pinknoise", brown = "brownnoise"}

function M.prepare(out_dir, opts)
  opts = opts or {}
  local n_train, n_dev, n_test = opts.n_train or 8000, opts.n_dev or 300, opts.n_test or 1000
  local n_synth = opts.n_synth or 1000
  local seed, jobs = opts.seed or 1, opts.jobs or 2
  local say = opts.quiet and function() end or print
  local info = {train = out_dir .. "/train.tsv", dev = out_dir .. "/dev.tsv",
    test = out_dir .. "/test.tsv", synth = out_dir .. "/synth.tsv", vocab = out_dir .. "/vocab.txt",
    noise = out_dir .. "/noise.txt"}
  local config = string.format("n_train=%d n_dev=%d n_test=%d n_synth=%d seed=%d held_out=%s " ..
    "festival=%s flite=%s v3", n_train, n_dev, n_test, n_synth, seed,
    table.concat(M.HELD_OUT, ","), table.concat(M.FESTIVAL, ","), table.concat(M.FLITE, ","))
  local util = require("rnnlua.util")
  if util.made_with(out_dir, config) then return info end
  local t0 = rl.clock()
  assert(util.mkdir_p((out_dir .. "/wav")))
  assert(util.mkdir_p((out_dir .. "/noise")))
  os.remove(out_dir .. "/DONE")
  ensure_packages()
  local train_voices, test_voices = variants()
  info.train_voices, info.test_voices = train_voices, test_voices
  local new_rng = require("rnnlua.datasets").new_rng
  -- per job: shell lines, and Festival's Scheme lines grouped by voice (a voice loads once)
  local scripts, scheme = {}, {}
  for j = 1, jobs do scripts[j], scheme[j] = {}, {} end
  local n_jobs = 0
  for _, s in ipairs({{"train", n_train, train_voices}, {"dev", n_dev, train_voices},
      {"test", n_test, test_voices}, {"synth", n_synth, nil}}) do
    local split, n, voices = s[1], s[2], s[3]
    local list, who = {}, {}
    for i = 1, n do
      local rng = new_rng(seed, SPLIT_STREAM[split], i)
      local digits = {}
      for d = 1, rng:int(1, 7) do digits[d] = tostring(rng:int(0, 9)) end
      local text = M.text(table.concat(digits), rng)
      local rel = string.format("wav/%s-%05d.wav", split, i)
      local line, syn = job(rng, split, voices, text, out_dir .. "/" .. rel)
      n_jobs = n_jobs + 1
      local j = n_jobs % jobs + 1
      table.insert(scripts[j], line)
      if syn.festival then
        scheme[j][syn.festival] = scheme[j][syn.festival] or {}
        table.insert(scheme[j][syn.festival], syn.scheme)
      end
      list[i] = rel .. "\t" .. text
      who[i] = rel .. "\t" .. syn.voice
    end
    for ext, lines in pairs({tsv = list, voices = who}) do
      local f = assert(io.open(out_dir .. "/" .. split .. "." .. ext, "w"))
      if #lines > 0 then f:write(table.concat(lines, "\n"), "\n") end
      f:close()
    end
  end
  -- the noise recordings for augment.noise: 10 s of each of sox's noises, from its own seed
  local nl = {}
  for _, name in ipairs({"white", "pink", "brown"}) do
    local rel = "noise/" .. name .. ".wav"
    table.insert(scripts[1], 1, string.format("sox -R -n -r 16000 -b 16 %s synth 10 %s vol 0.3",
      shell_quote(out_dir .. "/" .. rel), NOISES[name]))
    nl[#nl + 1] = rel
  end
  local nf = assert(io.open(info.noise, "w"))
  nf:write(table.concat(nl, "\n"), "\n")
  nf:close()
  local f = assert(io.open(info.vocab, "w"))
  for _, c in ipairs(M.VOCAB) do f:write(c == " " and "<space>" or c, "\n") end
  f:close()
  say(string.format("speech_digits: synthesizing %d utterances with espeak-ng, Festival, Flite " ..
    "and sox (%d jobs)", n_jobs, jobs))
  local runs = {}
  for j = 1, jobs do
    local path = string.format("%s/synth-%d.sh", out_dir, j)
    local sh = assert(io.open(path, "w"))
    sh:write("set -e\n")
    local voices_here = require("rnnlua.util").sorted_keys(scheme[j])
    if #voices_here > 0 then
      -- Festival first: one process speaks every Festival utterance of this job
      local scm = assert(io.open(path .. ".scm", "w"))
      for _, v in ipairs(voices_here) do
        scm:write("(voice_", v, ")\n", table.concat(scheme[j][v], "\n"), "\n")
      end
      scm:close()
      sh:write(string.format("festival -b %s >/dev/null\n", shell_quote(path .. ".scm")))
    end
    sh:write(table.concat(scripts[j], "\n"), "\n")
    sh:close()
    local err = shell_quote(path .. ".err")
    runs[j] = string.format("(sh %s 2>%s || echo \"exit status $?\" >>%s)", shell_quote(path),
      err, err)
  end
  -- the jobs in parallel; a failing one leaves its message in its .err file
  os.execute(table.concat(runs, " & ") .. " & wait")
  for j = 1, jobs do
    local path = string.format("%s/synth-%d.sh", out_dir, j)
    local ef = io.open(path .. ".err", "r")
    local err = ef and ef:read("a") or ""
    if ef then ef:close() end
    -- sox warns about clipping after the noise is added: harmless, not an error
    local real = err:gsub("[^\n]*WARN[^\n]*\n?", "")
    if real:find("%S") then fail("synthesis failed (%s): %s", path, real:sub(1, 500)) end
    os.remove(path)
    os.remove(path .. ".err")
    os.remove(path .. ".scm")
  end
  util.mark_made(out_dir, config)
  say(string.format("speech_digits: data ready in %s (%.1f s)", out_dir, rl.clock() - t0))
  return info
end

return M
