-- CTC prefix beam search with a character n-gram LM (beam 8): rl.ctc_decode{lm = ...} (C,
-- kernels/cpu/ctc_beam.c) against flashlight-text's LexiconFreeDecoder with KenLM, the decoder
-- torchaudio's ctc_decoder wraps, built with torchaudio's defaults (bench/flashlight_ctc.py;
-- torchaudio itself does not import next to bench/torch_env.sh's torch, see
-- bench/flashlight_env.sh), on the same log-probabilities with the same ARPA file, beam and LM
-- weight; and against rl.ctc_decode's beam search without an LM.
--
-- Data (deterministic): the King James Bible lines of recipes/htr_lines_data.lua (Debian's
-- bible-kjv; SKIP without it). LM: rl.ngram_estimate's character 5-gram of 20000 lines after the
-- first 1300; test: the first N_TEST lines (never in the LM's text) as synthetic CTC outputs:
-- each character takes 2 frames (a blank frame before it with probability 1/2, always between
-- equal neighbours), read as another character with probability 0.15; scores N(0, 1) per
-- class, +5 on the read character (on the blank in a blank frame), log-softmaxed.
-- Both decoders run on 1 thread; each figure is the median of RL_BENCH_ROUNDS (default 5)
-- interleaved rounds, one round decoding all N_TEST lines (the Python side times only its
-- decode calls). CER: edit distance / reference characters against the true texts.
local B = dofile("bench/bench.lua")
local rounds, median = B.rounds, B.median
local N_TEST, BEAM, WEIGHT = 200, 8, 0.8

print("### CTC prefix beam search with a character 5-gram LM (beam 8)")
print()
local function skip(why)
  print("SKIP: " .. why)
  print()
  os.exit(0)
end

local D = dofile("recipes/htr_lines_data.lua")
local okl, lines = pcall(D.lines, 1)
if not okl then skip("no corpus (" .. tostring(lines):sub(1, 120) .. ")") end

local dir = os.tmpname()
os.remove(dir)
assert(require("lfs").mkdir(dir))
local function cleanup()
  for _, f in ipairs({"tokens.txt", "lengths.txt", "logp.f32", "lm.arpa", "err.txt"}) do
    os.remove(dir .. "/" .. f)
  end
  os.remove(dir)
end

-- tokens: the characters (space as <sp>), the blank last
local tokens, index = {}, {}
for i = 1, #D.CHARS do
  local c = D.CHARS:sub(i, i)
  tokens[i], index[c] = c == " " and "<sp>" or c, i - 1
end
tokens[#tokens + 1] = "<blank>"
local V, blank = #tokens, #tokens - 1

local sents = {}
for i = 1301, 21300 do
  local t = {}
  for c in lines[i]:gmatch(".") do t[#t + 1] = c == " " and "<sp>" or c end
  sents[#sents + 1] = t
end
local t0 = rl.clock()
local vocab = table.move(tokens, 1, V - 1, 1, {})
rl.ngram_estimate{sentences = sents, order = 5, output = dir .. "/lm.arpa", vocab = vocab}
local est = rl.clock() - t0

-- the synthetic outputs
local g = require("rnnlua.datasets").new_rng(7, 0xC7C)
local refs, frames, lens, T = {}, {}, {}, 0
for i = 1, N_TEST do
  local ref, fr, prev = {}, {}, nil
  for c in lines[i]:gmatch(".") do
    local k = index[c]
    ref[#ref + 1] = k
    if k == prev or g:uniform() < 0.5 then fr[#fr + 1] = {blank, 5} end
    local read = g:uniform() < 0.15 and g:int(0, V - 2) or k
    fr[#fr + 1], fr[#fr + 2] = {read, 5}, {read, 5}
    prev = k
  end
  refs[i], frames[i], lens[i] = ref, fr, #fr
  T = math.max(T, #fr)
end
rl.manual_seed(7)
local x = rl.randn(T, N_TEST, V)
local xt = x:totable()
for b = 1, N_TEST do
  for t, f in ipairs(frames[b]) do xt[t][b][f[1] + 1] = xt[t][b][f[1] + 1] + f[2] end
end
x = rl.tensor(xt)
local m = x:max(3):view(T, N_TEST, 1)
local z = x - m
local logp = (z - z:exp():sum(3):log():view(T, N_TEST, 1)):float():contiguous()
local lengths = rl.tensor(lens, "int32")

-- the Python side's files
local f = assert(io.open(dir .. "/tokens.txt", "w"))
f:write(table.concat(tokens, "\n"), "\n")
f:close()
f = assert(io.open(dir .. "/lengths.txt", "w"))
f:write(table.concat(lens, "\n"), "\n")
f:close()
f = assert(io.open(dir .. "/logp.f32", "wb"))
local lt = logp:totable()
for b = 1, N_TEST do
  local vals = {}
  for t = 1, lens[b] do
    for v = 1, V do vals[#vals + 1] = lt[t][b][v] end
  end
  f:write(string.pack(string.rep("<f", #vals), table.unpack(vals)))
end
f:close()

local function cer(hyps)
  local e, n = 0, 0
  for b = 1, N_TEST do
    e = e + rl.edit_distance(hyps[b], refs[b])
    n = n + #refs[b]
  end
  return e / n
end

local pyf = io.popen("bash bench/flashlight_env.sh " .. (os.getenv("RL_BUILD_DIR") or "build")
  .. " 2>/dev/null | tail -n 1")
local py = pyf:read("l")
pyf:close()
if py == nil or py == "" then py = nil end

local lm = {file = dir .. "/lm.arpa", weight = WEIGHT, labels = tokens}
local threads = rl.get_num_threads()
rl.set_num_threads(1)
local with, without = {blank = blank, beam = BEAM, lm = lm}, {blank = blank, beam = BEAM}
local hyp_lm, hyp_plain = rl.ctc_decode(logp, lengths, with), rl.ctc_decode(logp, lengths, without)
local hyp_best = rl.ctc_decode(logp, lengths, {blank = blank})
local tl, tp, tf, hyp_fl = {}, {}, {}, nil
for _ = 1, rounds do
  local c0 = rl.clock()
  rl.ctc_decode(logp, lengths, with)
  tl[#tl + 1] = rl.clock() - c0
  c0 = rl.clock()
  rl.ctc_decode(logp, lengths, without)
  tp[#tp + 1] = rl.clock() - c0
  if py then
    -- KenLM reports its progress on stderr: kept apart, shown only on a failure
    local p = io.popen(string.format("%s bench/flashlight_ctc.py %s %d %g 1 2>%s/err.txt", py,
      dir, BEAM, WEIGHT, dir))
    local out = p:read("a")
    p:close()
    local secs, rest = out:match("^([%d.e-]+)\n(.*)$")
    if not secs then
      local ef = io.open(dir .. "/err.txt")
      local err = ef and ef:read("a") or ""
      if ef then ef:close() end
      cleanup()
      error("bench/flashlight_ctc.py failed:\n" .. out .. err)
    end
    tf[#tf + 1] = tonumber(secs)
    hyp_fl = {}
    for l in rest:gmatch("([^\n]*)\n") do
      local h = {}
      for v in l:gmatch("%d+") do h[#h + 1] = tonumber(v) end
      hyp_fl[#hyp_fl + 1] = h
    end
  end
end
rl.set_num_threads(threads)
cleanup()

local ml, mp = median(tl), median(tp)
print(string.format("%d synthetic lines (%d frames at most, %d classes), 1 thread, medians of %d "
  .. "interleaved rounds decoding all lines; LM weight %.1f, no insertion bonus (flashlight's "
  .. "lexicon-free decoder has none); the LM estimated in %.1f s.", N_TEST, T, V, rounds, WEIGHT,
  est))
print()
print("| decoder | ms per line | CER | speed-up of rl.ctc_decode + LM |")
print("|---|---:|---:|---:|")
print(string.format("| rl.ctc_decode, beam 8, LM | %.3f | %.2f%% | 1x |", ml * 1e3 / N_TEST,
  100 * cer(hyp_lm)))
if py and hyp_fl and #hyp_fl == N_TEST then
  local mf = median(tf)
  print(string.format("| flashlight-text LexiconFreeDecoder + KenLM, beam 8 | %.3f | %.2f%% | "
    .. "%.1fx |", mf * 1e3 / N_TEST, 100 * cer(hyp_fl), mf / ml))
else
  print("| flashlight-text (SKIP: bench/flashlight_env.sh could not set it up) | | | |")
end
print(string.format("| rl.ctc_decode, beam 8, no LM | %.3f | %.2f%% | %.2fx |",
  mp * 1e3 / N_TEST, 100 * cer(hyp_plain), mp / ml))
print(string.format("| best path | | %.2f%% | |", 100 * cer(hyp_best)))
print()
