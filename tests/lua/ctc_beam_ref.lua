-- The Lua prefix beam search that rl.ctc_decode ran before it moved to C
-- (kernels/cpu/ctc_beam.c): the reference the tests (tests/lua/test_ctc.lua) and the benchmark
-- (bench/ctc_decode.lua) compare the C search with. Same algorithm, same order of every sum and
-- the same tie-break, so both give the same labels.
--   local ref = dofile("tests/lua/ctc_beam_ref.lua")
--   ref.decode(logits, lengths, blank, beam) -> {{labels...}, ...}
local M = {}

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

function M.decode(logits, lengths, blank, beam)
  local lp = log_softmax_table(logits)
  local lens = lengths:totable()
  local out = {}
  for b = 1, #lens do out[b] = beam_search(lp, b, lens[b], logits:size(3), blank, beam) end
  return out
end

return M
