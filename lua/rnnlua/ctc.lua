-- CTC decoding (rl.ctc_decode); the loss itself is rl.ctc_loss (lua/l_ctc.c, kernels/ctc.h) and
-- label sequences are compared with rl.edit_distance (C).
--
--   rl.ctc_decode(logits, lengths [, {blank = V - 1, beam = 1}]) -> {{labels...}, ...}
--     logits (T, B, V) float32/float64 on any device: unnormalised scores or log-probabilities
--     (the log-softmax is taken first, so either works; probabilities do not); lengths (B)
--     int32. One Lua table per sequence of 0-based class indices, blanks removed: the logits'
--     own class numbers (a caller whose blank is not the last class maps them to its labels).
--     beam = 1: best path (the argmax of each frame, repeats merged, blanks dropped).
--     beam > 1: prefix beam search (Hannun et al. 2014) in log space: at each frame every
--     kept prefix is extended by every class, the probabilities of prefixes ending in a blank
--     and in a label kept apart (so "a a" needs a blank between and "aa" merges), and the
--     `beam` most probable prefixes are kept (ties broken by the prefix, so the result is
--     deterministic). It returns the most probable labelling among those it kept, which
--     often beats the best path (the most probable labelling sums over many paths).
local M = {}
local rl

local function fail(fmt, ...)
  error("rl.ctc_decode: " .. string.format(fmt, ...), 0)
end

local NEG = -math.huge

local function lse(a, b)
  if a == NEG then return b end
  if b == NEG then return a end
  if a > b then return a + math.log(1 + math.exp(b - a)) end
  return b + math.log(1 + math.exp(a - b))
end

-- log-softmax over the last dim, as a (T, B, V) float64 CPU table
local function log_softmax_table(x)
  x = x:double()
  if x:device() ~= "cpu" then x = x:cpu() end
  local m = x:max(3):view(x:size(1), x:size(2), 1)
  local z = x - m
  local ls = z:exp():sum(3):log():view(x:size(1), x:size(2), 1)
  return (z - ls):totable()
end

local function beam_search(lp, b, T, V, blank, beam)
  -- a prefix: {labels = {...}, key = "l1,l2,", pb = log P(ends in blank), pnb = (in a label)}
  local beams = {{labels = {}, key = "", pb = 0, pnb = NEG}}
  for t = 1, T do
    local row = lp[t][b]
    local nxt, order = {}, {}
    local function get(key, labels)
      local e = nxt[key]
      if not e then
        e = {labels = labels, key = key, pb = NEG, pnb = NEG}
        nxt[key] = e
        order[#order + 1] = e
      end
      return e
    end
    for _, p in ipairs(beams) do
      local total = lse(p.pb, p.pnb)
      local last = p.labels[#p.labels]
      for c = 0, V - 1 do
        local lpc = row[c + 1]
        if c == blank then
          local e = get(p.key, p.labels)
          e.pb = lse(e.pb, total + lpc)
        else
          local key = p.key .. c .. ","
          local e = nxt[key]
          if not e then
            local labels = table.move(p.labels, 1, #p.labels, 1, {})
            labels[#labels + 1] = c
            e = get(key, labels)
          end
          if c == last then
            -- a repeat extends the prefix only after a blank; without one it merges
            e.pnb = lse(e.pnb, p.pb + lpc)
            local same = get(p.key, p.labels)
            same.pnb = lse(same.pnb, p.pnb + lpc)
          else
            e.pnb = lse(e.pnb, total + lpc)
          end
        end
      end
    end
    for _, e in ipairs(order) do e.score = lse(e.pb, e.pnb) end
    table.sort(order, function(x, y)
      if x.score ~= y.score then return x.score > y.score end
      return x.key < y.key
    end)
    beams = {}
    for i = 1, math.min(beam, #order) do beams[i] = order[i] end
  end
  return beams[1].labels
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
    if k ~= "blank" and k ~= "beam" then fail("unknown option '%s' (blank, beam)", tostring(k)) end
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
  local out = {}
  if beam == 1 then
    local am = logits:argmax(3):totable() -- (T, B), 1-based
    for b = 1, B do
      local labels, prev = {}, nil
      for t = 1, lens[b] do
        local c = am[t][b] - 1
        if c ~= prev and c ~= blank then labels[#labels + 1] = c end
        prev = c
      end
      out[b] = labels
    end
    return out
  end
  local lp = log_softmax_table(logits)
  for b = 1, B do out[b] = beam_search(lp, b, lens[b], V, blank, beam) end
  return out
end

function M.install(module)
  rl = module
  rl.ctc_decode = M.ctc_decode
  return M
end

return M
