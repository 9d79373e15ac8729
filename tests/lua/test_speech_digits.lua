-- recipes/speech_digits.lua's data (recipes/speech_digits_data.lua) at the smoke size: the lists
-- read by the audio dataset, transcripts of digit words, 16 kHz audio, the held-out voices
-- speaking only the test set, Festival in the training set and Flite only in the held-out
-- synthesizer's set, the noise list for the augmentation, a deterministic synthesis done once;
-- and the recipe's smoke mode (a tiny network, one augmented epoch) printing its WERs and CER.
local H = dofile("tests/lua/harness.lua")
local D = dofile("recipes/speech_digits_data.lua")
local test, check = H.test, H.check
local lfs = require("lfs")

local dir = H.tmpdir()
local rm_rf = H.rm_rf
local function lines(path)
  local out = {}
  for l in io.lines(path) do out[#out + 1] = l end
  return out
end

local data = dir .. "/data"
local info = D.prepare(data, {n_train = D.SMOKE.n_train, n_dev = D.SMOKE.n_dev,
  n_test = D.SMOKE.n_test, n_synth = D.SMOKE.n_synth, quiet = true})

test("lists of digit words, 16 kHz audio", function()
  local words = {}
  for _, w in pairs(D.WORDS) do words[w] = true end
  words.oh = true
  for split, n in pairs({train = D.SMOKE.n_train, dev = D.SMOKE.n_dev, test = D.SMOKE.n_test,
      synth = D.SMOKE.n_synth}) do
    local ls = lines(info[split])
    check(#ls == n, split .. ": " .. #ls .. " lines")
    for _, l in ipairs(ls) do
      local path, text = l:match("^([^\t]+)\t(.+)$")
      check(path, "path<TAB>transcript: " .. l)
      local k = 0
      for w in text:gmatch("%S+") do
        check(words[w], "a digit word: " .. w)
        k = k + 1
      end
      check(k >= 1 and k <= 7, "1..7 digits: " .. text)
      local wave, rate = rl.audio.load(data .. "/" .. path)
      check(rate == 16000 and wave:size(1) > 1600, path .. ": 16 kHz, > 0.1 s")
    end
  end
  local v = lines(info.vocab)
  check(#v == #D.VOCAB and v[1] == "<space>", "vocab file")
end)

test("held-out voices speak only the test set, Flite only the held-out synthesizer's", function()
  local held, flite, festival = {}, {}, {}
  for _, h in ipairs(D.HELD_OUT) do held[h] = true end
  for _, v in ipairs(D.FLITE) do flite["flite+" .. v] = true end
  for _, v in ipairs(D.FESTIVAL) do festival["festival+" .. v] = true end
  local n_festival = 0
  for _, split in ipairs({"train", "dev", "test", "synth"}) do
    for _, l in ipairs(lines(data .. "/" .. split .. ".voices")) do
      local voice = l:match("\t(.+)$")
      check(voice, "voice of " .. l)
      if split == "synth" then
        check(flite[voice], "synth: a Flite voice, got " .. voice)
      else
        check(not voice:find("^flite"), split .. " has a Flite utterance: " .. l)
        if festival[voice] then
          check(split ~= "test", "test: no Festival voice")
          n_festival = n_festival + 1
        else
          local variant = voice:match("%+([^+]+)$")
          check(variant, "espeak-ng accent+variant: " .. voice)
          check((split == "test") == (held[variant] == true), split .. " voice " .. variant)
        end
      end
    end
  end
  check(n_festival >= 3, "Festival speaks some training and dev utterances: " .. n_festival)
end)

test("the noise list for the augmentation: three 10 s recordings at 16 kHz", function()
  local ls = lines(info.noise)
  check(#ls == 3, "three noises")
  for _, rel in ipairs(ls) do
    local w, rate = rl.audio.load(data .. "/" .. rel)
    check(rate == 16000 and w:size(1) == 160000 and w:abs():max() > 0.01, rel)
  end
end)

test("deterministic, and made once", function()
  local before = lfs.attributes(data .. "/wav/train-00001.wav", "modification")
  D.prepare(data, {n_train = D.SMOKE.n_train, n_dev = D.SMOKE.n_dev, n_test = D.SMOKE.n_test,
    n_synth = D.SMOKE.n_synth, quiet = true})
  check(lfs.attributes(data .. "/wav/train-00001.wav", "modification") == before, "not redone")
  local other = dir .. "/again"
  D.prepare(other, {n_train = 3, n_dev = 1, n_test = 1, n_synth = 2, quiet = true})
  local a, b = lines(info.train), lines(other .. "/train.tsv")
  for i = 1, 3 do check(a[i] == b[i], "same transcripts from the same seed") end
  -- (with seed 1, train-00001 is Festival's, train-00002 espeak-ng's, synth-00002 Flite's)
  for _, name in ipairs({"train-00001", "train-00002", "synth-00002"}) do
    local w1 = rl.audio.load(data .. "/wav/" .. name .. ".wav")
    local w2 = rl.audio.load(other .. "/wav/" .. name .. ".wav")
    check(w1:size(1) == w2:size(1) and (w1 - w2):abs():max() == 0, "same audio from the same " ..
      "seed: " .. name)
  end
  for _, split in ipairs({"train", "synth"}) do
    local va, vb = lines(data .. "/" .. split .. ".voices"), lines(other .. "/" .. split .. ".voices")
    for i = 1, #vb do check(va[i] == vb[i], "same voices from the same seed: " .. split) end
  end
end)

test("the recipe's smoke mode trains with augmentation and prints its WERs and CER", function()
  local p = io.popen(string.format("%s recipes/speech_digits.lua ++smoke ++out %s 2>&1", arg[-1],
    dir))
  local out = p:read("a")
  local ok = p:close()
  check(ok, "recipe failed:\n" .. out)
  local wer = "%d+%.%d+%% %(with LM %d+%.%d+%%%)"
  check(out:match("\ntest WER " .. wer .. "\n"), "prints test WER:\n" .. out)
  -- (a voice the 6 smoke utterances lack is "-")
  check(out:match("\nheld%-out synthesizer WER " .. wer .. " %(Flite: awb [^\n]+, rms [^\n]+, "
    .. "slt [^\n]+%)\n"), "prints the held-out synthesizer's WER:\n" .. out)
  check(out:find("character 6-gram LM of ", 1, true), "makes the LM:\n" .. out)
  check(out:match("\nspeech_digits: LM weight %d%.%d, bonus %d%.%d %(dev WER "), "its tuning:\n"
    .. out)
  check(out:match("test CER %d+%.%d+%%"), "prints test CER:\n" .. out)
  check(lfs.attributes(dir .. "/smoke_cache/train.h5"), "feature cache written")
end)

test("a bad option of the recipe's own is an error naming it, before any data is made", function()
  for _, case in ipairs({{"++schedule cosine", "++schedule: wants decay or newbob, got cosine"},
      {"++units 0", "++units: wants a positive count, got 0"},
      {"++lm -1", "++lm: wants an order >= 1 (0: no LM), got -1"},
      {"++norm cmvn", "++norm: wants global or utterance, got cmvn"},
      {"++perturb pitch", "++perturb: wants tempo or speed, got pitch"},
      {"++freq_width 41", "++freq_width: wants 0..40 mels, got 41"},
      {"++freq_warp 0.3", "++freq_warp: augment.spec.freq_warp must be in [0, 0.2], got 0.3"}}) do
    local p = io.popen(string.format("%s recipes/speech_digits.lua %s ++out %s/bad 2>&1", arg[-1],
      case[1], dir))
    local out = p:read("a")
    check(not p:close(), case[1] .. ": the recipe ran:\n" .. out)
    check(out:find(case[2], 1, true), case[1] .. ": " .. out)
    check(not lfs.attributes(dir .. "/bad/data"), case[1] .. ": data made")
  end
end)

rm_rf(dir)
H.done()
