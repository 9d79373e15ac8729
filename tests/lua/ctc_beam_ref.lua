-- The Lua prefix beam search that rl.ctc_decode ran before it moved to C
-- (kernels/cpu/ctc_beam.c): the reference the tests (tests/lua/test_ctc.lua) and the benchmark
-- (bench/ctc_decode.lua) compare the C search with. Same algorithm, same order of every sum and
-- the same tie-break, so both give the same labels.
--   local ref = dofile("tests/lua/ctc_beam_ref.lua")
--   ref.decode(logits, lengths, blank, beam [, lm]) -> {{labels...}, ...}
-- lm: shallow fusion of an n-gram LM read by ref.read_arpa (a plain Lua reader, independent of
-- the C one): {model = ref.read_arpa(path), weight =, bonus =, labels = {V strings},
-- boundary = 0-based word-boundary label or nil (char-level)}, or of any LM given as
-- {score = function(hist, w) -> ln p(w | hist), hist .. w; start = the first history, ...}
-- (w = "</s>": the end of the sentence), the same ranking as the C search
-- (kernels/cpu/ctc_beam.c): log p_ctc + the prefix's LM part, the end of the sentence added
-- after the last frame.
local M = {}

-- An ARPA file as {order =, prob = {["w1 w2"] = ln p}, bow = {...}, vocab = {[w] = true}};
-- assumes a well-formed file.
function M.read_arpa(path)
  local m = {order = 0, prob = {}, bow = {}, vocab = {}}
  local n
  for line in io.lines(path) do
    line = line:gsub("%s+$", "")
    local hdr = line:match("^\\(%d+)%-grams:$")
    if hdr then
      n = tonumber(hdr)
      m.order = math.max(m.order, n)
    elseif line == "\\end\\" then
      n = nil
    elseif n and line ~= "" then
      local f = {}
      for w in line:gmatch("%S+") do f[#f + 1] = w end
      local words = table.concat(f, " ", 2, n + 1)
      m.prob[words] = tonumber(f[1]) * math.log(10)
      if f[n + 2] then m.bow[words] = tonumber(f[n + 2]) * math.log(10) end
      if n == 1 then m.vocab[f[2]] = true end
    end
  end
  return m
end

-- ln p(w | hist) by back-off, and the history after w; an unknown w is <unk> or -100 log10
function M.lm_score(m, hist, w)
  if not m.vocab[w] then
    if not m.vocab["<unk>"] then return -100 * math.log(10), {} end
    w = "<unk>"
  end
  local k = math.min(#hist, m.order - 1)
  local h = table.move(hist, #hist - k + 1, #hist, 1, {})
  local acc, r = 0, nil
  for start = 1, k do
    local ctx = table.concat(h, " ", start, k)
    local p = m.prob[ctx .. " " .. w]
    if p then
      r = acc + p
      break
    end
    if m.bow[ctx] then acc = acc + m.bow[ctx] end
  end
  if not r then r = acc + m.prob[w] end
  h[#h + 1] = w
  local keep = math.min(#h, m.order - 1)
  return r, table.move(h, #h - keep + 1, #h, 1, {})
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

local function score(lm, hist, w)
  if lm.score then return lm.score(hist, w) end
  return M.lm_score(lm.model, hist, w)
end

-- The LM fields of prefix e + label c made from prefix p (lm: the LM part; hist: the history;
-- word: the pending word of a word LM)
local function lm_extend(lm, p, c)
  if not lm.boundary then
    local s, hist = score(lm, p.hist, lm.labels[c + 1])
    return p.lm + (lm.weight * s + lm.bonus), hist, nil
  end
  if c ~= lm.boundary then return p.lm + 0, p.hist, p.word .. lm.labels[c + 1] end
  if p.word == "" then return p.lm + 0, p.hist, "" end
  local s, hist = score(lm, p.hist, p.word)
  return p.lm + (lm.weight * s + lm.bonus), hist, ""
end

-- what the end of the sentence adds to prefix p
local function lm_end(lm, p)
  local e, hist = 0, p.hist
  if lm.boundary and p.word ~= "" then
    local s
    s, hist = score(lm, p.hist, p.word)
    e = lm.weight * s + lm.bonus
  end
  return e + lm.weight * score(lm, hist, "</s>")
end

local function beam_search(lp, b, T, V, blank, beam, lm)
  -- a prefix: {labels = {...}, key = "l1,l2,", pb = log P(ends in blank), pnb = (in a label),
  -- lm, hist, word: its LM part, LM history and pending word}
  local beams = {{labels = {}, key = "", pb = 0, pnb = NEG, lm = 0,
    hist = lm and (lm.start or lm.model.order > 1 and {"<s>"}) or {}, word = ""}}
  for t = 1, T do
    local row = lp[t][b]
    local nxt, order = {}, {}
    local function get(key, labels, from, c)
      local e = nxt[key]
      if not e then
        e = {labels = labels, key = key, pb = NEG, pnb = NEG, lm = from.lm, hist = from.hist,
          word = from.word}
        if lm and c then e.lm, e.hist, e.word = lm_extend(lm, from, c) end
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
          local e = get(p.key, p.labels, p)
          e.pb = lse(e.pb, total + lpc)
        else
          local key = p.key .. c .. ","
          local e = nxt[key]
          if not e then
            local labels = table.move(p.labels, 1, #p.labels, 1, {})
            labels[#labels + 1] = c
            e = get(key, labels, p, c)
          end
          if c == last then
            -- a repeat extends the prefix only after a blank; without one it merges
            e.pnb = lse(e.pnb, p.pb + lpc)
            local same = get(p.key, p.labels, p)
            same.pnb = lse(same.pnb, p.pnb + lpc)
          else
            e.pnb = lse(e.pnb, total + lpc)
          end
        end
      end
    end
    for _, e in ipairs(order) do
      e.score = lse(e.pb, e.pnb)
      if lm then e.score = e.score + e.lm end
    end
    table.sort(order, function(x, y)
      if x.score ~= y.score then return x.score > y.score end
      return x.key < y.key
    end)
    beams = {}
    for i = 1, math.min(beam, #order) do beams[i] = order[i] end
  end
  local best = beams[1]
  if lm then
    for i, p in ipairs(beams) do
      p.final = lse(p.pb, p.pnb) + p.lm + lm_end(lm, p)
      if i > 1 and (p.final > best.final or (p.final == best.final and p.key < best.key)) then
        best = p
      end
    end
  end
  return best.labels
end

function M.decode(logits, lengths, blank, beam, lm)
  local lp = log_softmax_table(logits)
  local lens = lengths:totable()
  local out = {}
  for b = 1, #lens do out[b] = beam_search(lp, b, lens[b], logits:size(3), blank, beam, lm) end
  return out
end

return M
