-- CTC decoding (rl.ctc_decode); the loss itself is rl.ctc_loss (lua/l_ctc.c, kernels/ctc.h) and
-- label sequences are compared with rl.edit_distance (C).
--
--   rl.ctc_decode(logits, lengths [, {blank = V - 1, beam = 1}]) -> {{labels...}, ...}
--     logits (T, B, V) float32/float64 on any device: unnormalised scores or log-probabilities
--     (the log-softmax is taken first, so either works; probabilities do not); lengths (B)
--     int32. One Lua table per sequence of 0-based class indices, blanks removed: the logits'
--     own class numbers (a caller whose blank is not the last class maps them to its labels).
--     beam = 1: best path (the argmax of each frame, repeats merged, blanks dropped).
--     beam > 1: prefix beam search (Hannun et al. 2014) in log space, in C (kernels/cpu/ctc_beam.c,
--     sequences spread over rl.set_num_threads threads): at each frame every
--     kept prefix is extended by every class, the probabilities of prefixes ending in a blank
--     and in a label kept apart (so "a a" needs a blank between and "aa" merges), and the
--     `beam` most probable prefixes are kept (ties broken by the prefix, so the result is
--     deterministic). It returns the most probable labelling among those it kept, which
--     often beats the best path (the most probable labelling sums over many paths).
--     lm = {file =, weight =, bonus =, labels =, word_boundary =}: shallow fusion of an n-gram
--     LM (lua/rnnlua/lm.lua): prefixes rank by log p_ctc + weight log p_lm + bonus per LM
--     token, and the end of the sentence is scored before the best is chosen; it always runs
--     the prefix beam search (beam 1 included). lm = {model = a char LM checkpoint, ...}: a
--     neural LM, run once per frame over the beam's new prefixes (on one thread).
local M = {}
local rl
local util = require("rnnlua.util")
local lmod = require("rnnlua.lm")

local function fail(fmt, ...)
  error("rl.ctc_decode: " .. string.format(fmt, ...), 0)
end

-- log-softmax over the last dim as a contiguous (T, B, V) float64 CPU tensor
local function log_softmax(x)
  x = x:double()
  if x:device() ~= "cpu" then x = x:cpu() end
  local m = x:max(3):view(x:size(1), x:size(2), 1)
  local z = x - m
  local ls = z:exp():sum(3):log():view(x:size(1), x:size(2), 1)
  return (z - ls):contiguous()
end

function M.ctc_decode(logits, lengths, opts)
  if not rl.is_tensor(logits) or logits:dim() ~= 3 or logits:dtype() == "int32" then
    fail("logits must be a (T, B, V) float tensor, got %s",
      rl.is_tensor(logits) and (logits:dtype() .. " " .. tostring(logits:size())) or type(logits))
  end
  local T, B, V = logits:size(1), logits:size(2), logits:size(3)
  if not rl.is_tensor(lengths) or lengths:dim() ~= 1 or lengths:dtype() ~= "int32"
      or lengths:size(1) ~= B then
    fail("lengths must be a (%d) int32 tensor, got %s", B,
      rl.is_tensor(lengths) and (lengths:dtype() .. " " .. tostring(lengths:size())) or type(lengths))
  end
  opts = opts or {}
  for k in pairs(opts) do
    if k ~= "blank" and k ~= "beam" and k ~= "lm" then
      fail("unknown option '%s' (blank, beam, lm)", tostring(k))
    end
  end
  local blank, beam = opts.blank or V - 1, opts.beam or 1
  if math.type(blank) ~= "integer" or blank < 0 or blank >= V then
    fail("blank = %s is outside 0..%d (V - 1)", tostring(blank), V - 1)
  end
  if math.type(beam) ~= "integer" or beam < 1 then
    fail("beam must be a positive integer, got %s", tostring(beam))
  end
  local lens = lengths:totable()
  for b = 1, B do
    if lens[b] < 0 or lens[b] > T then
      fail("sequence %d: length %d is outside 0..%d (T)", b, lens[b], T)
    end
  end
  local lm = opts.lm ~= nil and lmod.resolve(opts.lm, V, blank, "rl.ctc_decode") or nil
  if lm and lm.neural then
    lm = {step = lmod.neural_step(lm, V, blank), token = lm.neural.class, weight = lm.weight,
      bonus = lm.bonus}
  end
  local out = {}
  if beam == 1 and not lm then
    local am = logits:argmax(3):totable() -- (T, B), 1-based
    -- a frame whose log-probabilities hold a NaN (a NaN or +inf logit) has no best class: the
    -- same refusal as the beam search's (a sum of log-probabilities is NaN exactly then)
    local sums = log_softmax(logits):sum(3):totable()
    for b = 1, B do
      local labels, prev = {}, nil
      for t = 1, lens[b] do
        if sums[t][b] ~= sums[t][b] then
          fail("sequence %d, frame %d: a NaN or +inf logit (its log-probabilities are NaN)", b, t)
        end
        local c = am[t][b] - 1
        if c ~= prev and c ~= blank then labels[#labels + 1] = c end
        prev = c
      end
      out[b] = labels
    end
    return out
  end
  -- the C search's errors carry the position of this call inside the library: dropped
  local ok, res = pcall(rl._ctc_beam_search, log_softmax(logits),
    (lengths:device() == "cpu" and lengths or lengths:cpu()):contiguous(), blank, beam, lm)
  if not ok then error(util.strip_internal(res), 0) end
  return res
end

function M.install(module)
  rl = module
  rl.ctc_decode = M.ctc_decode
  return M
end

return M
