-- Language models for decoding: the `lm = {...}` option of rl.ctc_decode, rl.search,
-- rl.forward{decode = "ctc"} and `rnnlua serve`'s POST /v1/decode (docs/ctc.md).
--
--   lm = {file = "lm.arpa", weight = 0.5, bonus = 1.0, labels = {...}, word_boundary = "|"}
--
-- file: an ARPA n-gram model (kernels/ngram.h, read in C, loaded once per path and cached);
-- weight: the LM weight (a finite number); bonus: added per LM token (default 0); labels: the
-- LM token of each class, a list of V strings in class order (the blank's entry unused;
-- default: the class numbers "0", "1", ...); word_boundary: a label (its string in labels, or
-- its 0-based class) that ends words. Without word_boundary the LM is character-level: each
-- emitted label is one LM token, and every label must be in the LM's vocabulary. With it the
-- LM is word-level (lexicon-free, like torchaudio's ctc_decoder with a word-boundary token): the
-- labels between two boundaries, their strings joined, form a word, scored when the boundary
-- is emitted and at the end of the sequence; a word outside the vocabulary is <unk>.
local M = {}
local rl
local util = require("rnnlua.util")

local KEYS = {file = true, model = true, weight = true, bonus = true, labels = true,
  word_boundary = true, layer = true}

-- path -> the loaded n-gram model: an LM is read once whatever the number of calls
local cache = {}

-- The n-gram model of an ARPA file, loaded on first use. Errors name the file and the line.
function M.ngram(path, who)
  local m = cache[path]
  if m then return m end
  local ok, res = pcall(rl._ngram_load, path)
  if not ok then error(string.format("%s: lm: %s", who, util.strip_internal(res)), 0) end
  cache[path] = res
  return res
end

local function finite(x)
  return type(x) == "number" and x == x and x ~= math.huge and x ~= -math.huge
end

-- The checked option table lm (of `who`) for V classes with `blank` (the class that is no LM
-- token: CTC's blank, an attention search's end label): {ngram =, file =, weight =, bonus =,
-- labels = {V strings}, boundary = 0-based class or nil, token = {V 0-based word ids}
-- (char-level), text = labels}; lm.model (a neural LM checkpoint) gives
-- {neural = {net =, layer =, key =, class = {V LM classes}, eos_class =}, ...} instead.
function M.resolve(lm, V, blank, who)
  local function fail(fmt, ...)
    error(string.format("%s: lm: " .. fmt, who, ...), 0)
  end
  if type(lm) ~= "table" then
    fail("must be a table {file =, weight =, bonus =}, got %s", type(lm))
  end
  for k in pairs(lm) do
    if not KEYS[k] then
      fail("unknown key '%s' (known: %s)", tostring(k), table.concat(util.sorted_keys(KEYS), ", "))
    end
  end
  if lm.model ~= nil then
    if lm.file ~= nil then
      fail("give file (an ARPA n-gram model) or model (a neural LM), not both")
    end
    if type(lm.model) ~= "string" then
      fail("model must be a checkpoint path, got %s", type(lm.model))
    end
    if lm.word_boundary ~= nil then
      fail("word_boundary applies to a word n-gram model (file =)")
    end
  elseif type(lm.file) ~= "string" then
    fail("file (an ARPA n-gram model) must be a path, got %s", type(lm.file))
  end
  if lm.layer ~= nil and (lm.model == nil or type(lm.layer) ~= "string") then
    fail("layer (the softmax of a neural LM) applies with model = and is a layer name")
  end
  if not finite(lm.weight) then
    fail("weight must be a finite number, got %s", tostring(lm.weight))
  end
  if lm.bonus ~= nil and not finite(lm.bonus) then
    fail("bonus must be a finite number, got %s", tostring(lm.bonus))
  end
  local labels = lm.labels
  if labels == nil then
    labels = {}
    for c = 0, V - 1 do labels[c + 1] = tostring(c) end
  else
    local okl = type(labels) == "table" and #labels == V
    for c = 1, okl and V or 0 do okl = okl and type(labels[c]) == "string" end
    if not okl then fail("labels must be a list of %d strings (the LM token of each class)", V) end
  end
  local boundary
  local wb = lm.word_boundary
  if wb ~= nil then
    if math.type(wb) == "integer" then
      boundary = wb
    elseif type(wb) == "string" then
      for c = 1, V do
        if labels[c] == wb and c - 1 ~= blank then boundary = c - 1 break end
      end
      if not boundary then fail("word_boundary '%s' is none of the labels", wb) end
    end
    if not boundary or boundary < 0 or boundary >= V or boundary == blank then
      fail("word_boundary must be a label (its string or its class in 0..%d, not the blank), "
        .. "got %s", V - 1, tostring(wb))
    end
  end
  if lm.model then
    local r = {model = lm.model, weight = lm.weight, bonus = lm.bonus or 0, labels = labels}
    r.neural = M.neural(lm.model, lm.layer, labels, blank, who)
    return r
  end
  local ngram = M.ngram(lm.file, who)
  local r = {ngram = ngram, file = lm.file, weight = lm.weight, bonus = lm.bonus or 0,
    labels = labels, boundary = boundary, text = labels}
  if not boundary then
    local token, missing = {}, {}
    for c = 0, V - 1 do
      if c == blank then
        token[c + 1] = 0
      else
        local id = ngram:id(labels[c + 1])
        if not id then missing[#missing + 1] = string.format("%d ('%s')", c, labels[c + 1]) end
        token[c + 1] = id or 0
      end
    end
    if #missing > 0 then
      fail("%s: the vocabulary (%d words) does not cover the labels: label%s %s %s not in it "
        .. "(labels = {...} names each class's LM token; word_boundary = makes it a word LM)",
        lm.file, ngram:vocab_size(), #missing > 1 and "s" or "",
        table.concat(missing, ", ", 1, math.min(#missing, 8)) .. (#missing > 8 and ", ..." or ""),
        #missing > 1 and "are" or "is")
    end
    r.token = token
  end
  return r
end

-- path .. "\0" .. layer -> {model = (rnnlua.forward's load_model), vocab, index, key}
local neural_cache = {}

-- A character LM checkpoint (recipes/char_lm.lua's: one sparse input whose extern_data has the
-- labels, a causal network, a softmax over the next character) for V output classes named by
-- labels: {net, layer, key, class = {V LM classes, the `skip` class's unused}, eos_class = the
-- class of "\n" (a line's end and start), vocab}.
function M.neural(path, layer, labels, skip, who)
  local sample = require("rnnlua.sample")
  local ck_key = path .. "\0" .. tostring(layer)
  local e = neural_cache[ck_key]
  if not e then
    local ok, res = pcall(function()
      local ck = rl.load_checkpoint(path)
      local fm = require("rnnlua.forward").load_model(path, layer or sample.default_layer(
        ck.description), "cpu", who .. ": lm")
      local vocab, index, key = sample.lm_vocab(fm, "lm model " .. path, who .. ": lm")
      return {model = fm, vocab = vocab, index = index, key = key}
    end)
    if not ok then error(util.strip_internal(res), 0) end
    e = res
    neural_cache[ck_key] = e
  end
  if e.index["\n"] == nil then
    error(string.format("%s: lm: model %s: its vocabulary has no \"\\n\" (the line boundary a "
      .. "sentence starts after and ends with)", who, path), 0)
  end
  local class, missing = {}, {}
  for c = 0, #labels - 1 do
    local k = e.index[labels[c + 1]]
    if c ~= skip and k == nil then
      missing[#missing + 1] = string.format("%d ('%s')", c, labels[c + 1])
    end
    class[c + 1] = k or 0
  end
  if #missing > 0 then
    error(string.format("%s: lm: model %s: its vocabulary (%d characters) does not cover the "
      .. "labels: %s (labels = {...} names each class's character)", who, path, #e.vocab,
      table.concat(missing, ", ", 1, math.min(#missing, 8)) .. (#missing > 8 and ", ..." or "")), 0)
  end
  return {net = e.model.net, layer = e.model.layer, key = e.key, class = class,
    eos_class = e.index["\n"]}
end

-- The step function of a neural LM (M.resolve's r.neural) for a search over V classes, `blank`
-- the one that is no character (CTC's blank, an attention search's end label); the CTC prefix
-- search calls it as rl_ctc_lm.step (kernels/ctc.h), M.scorer each step: step(from, token) runs the
-- LM one character for every history at once (from[i]: a state id this function gave out, or
-- -1 for the start of a sentence, fed "\n"; token[i]: the LM class to feed) and returns the new
-- histories' state ids and an (n, V + 1) float64 tensor of log p of each class and of "\n" (the
-- end of the sentence) after them. Every state it makes is kept (a bank of each carried layer's
-- rows), since the search may extend any prefix it ever kept; the bank lives as long as the
-- function, one rl.ctc_decode call.
function M.neural_step(r, V, blank)
  local nl = r.neural
  local net = nl.net
  local cols = {}
  for c = 0, V - 1 do cols[c + 1] = (c == blank and nl.eos_class or nl.class[c + 1]) + 1 end
  cols[V + 1] = nl.eos_class + 1
  local colidx = rl.tensor(cols, "int32")
  local bank, count = {}, 0
  return function(from, token)
    local n = #from
    local inputs, sf, idx, any = {}, {}, {}, false
    for i = 1, n do
      if from[i] < 0 then
        inputs[i], sf[i], idx[i] = nl.eos_class, 0, 1
      else
        inputs[i], sf[i], idx[i], any = token[i], i, from[i] + 1, true
      end
    end
    if any then
      local ix, states = rl.tensor(idx, "int32"), {}
      for k, b in ipairs(bank) do
        states[k] = {}
        for j, t in ipairs(b) do states[k][j] = t:index_select(1, ix) end
      end
      net:set_carried_state(states, n)
    end
    net:forward({[nl.key] = rl.tensor(inputs, "int32"):view(1, n),
      lengths = rl.full({n}, 1, "int32"), state_from = sf}, {train = false})
    local y = net:layer(nl.layer).output:select(1, 1)
    local lp = y:double():clamp(1e-30, 1):log():index_select(2, colidx):contiguous()
    for k, st in ipairs(net:carried_state()) do
      local b = bank[k]
      if not b or b[1]:size(1) < count + n then
        local cap = math.max(64, 2 * (count + n))
        local nb = {}
        for j, t in ipairs(st) do
          nb[j] = rl.zeros({cap, t:size(2)}, t:dtype())
          if b and count > 0 then nb[j]:narrow(1, 1, count):copy_(b[j]:narrow(1, 1, count)) end
        end
        bank[k], b = nb, nb
      end
      for j, t in ipairs(st) do b[j]:narrow(1, count + 1, n):copy_(t) end
    end
    local ids = {}
    for i = 1, n do ids[i] = count + i - 1 end
    count = count + n
    return ids, lp
  end
end

-- A scorer for a label-synchronous search (the attention beam search, lua/rnnlua/rec.lua) of V
-- labels with end label eos, from a resolved lm (M.resolve). Per hypothesis it keeps the LM's
-- state (a neural LM's: a state id of M.neural_step); ext(states) gives, per hypothesis, what
-- each label adds to its score (weight log p + bonus; the end label: the pending word of a word
-- LM, then weight log p(</s>), no bonus); advance(states, origin, lab, done) gives the states of
-- the next step's hypotheses (origin: the 1-based hypothesis each extends; lab: 0-based labels;
-- done: finished hypotheses, whose state no longer matters). A neural LM runs once per step over
-- all hypotheses at once, each row continuing from the carried state of the hypothesis it
-- extends.
function M.scorer(r, V, eos)
  local S = {}
  local w, bonus = r.weight, r.bonus
  if r.neural then
    local nl, step = r.neural, M.neural_step(r, V, eos)
    local function state(ids, lp) return {ids = ids, logp = lp:totable()} end
    function S.init(n)
      local from, token = {}, {}
      for i = 1, n do from[i], token[i] = -1, 0 end
      return state(step(from, token))
    end
    function S.ext(st)
      local out = {}
      for i, row in ipairs(st.logp) do
        local e = {}
        for v = 0, V - 1 do e[v + 1] = v == eos and w * row[V + 1] or w * row[v + 1] + bonus end
        out[i] = e
      end
      return out
    end
    function S.advance(st, origin, lab, done)
      local from, token = {}, {}
      for i = 1, #origin do
        from[i] = st.ids[origin[i]]
        token[i] = (done[i] or lab[i] == eos) and nl.eos_class or nl.class[lab[i] + 1]
      end
      return state(step(from, token))
    end
    return S
  end
  local ngram, labels, boundary = r.ngram, r.labels, r.boundary
  local start = ngram:order() > 1 and {"<s>"} or {}
  local keep = ngram:order() - 1 -- the words a history needs
  local function push(hist, word)
    local from = math.max(1, #hist + 2 - keep)
    local h = table.move(hist, from, #hist, 1, {})
    if keep > 0 then h[#h + 1] = word end
    return h
  end
  function S.init(n)
    local st = {}
    for i = 1, n do st[i] = {hist = start, word = ""} end
    return st
  end
  function S.ext(st)
    local out = {}
    for i, s in ipairs(st) do
      local e = {}
      if boundary then
        local we = s.word ~= "" and w * ngram:logp(s.hist, s.word) + bonus or 0
        local h = s.word ~= "" and push(s.hist, s.word) or s.hist
        for v = 0, V - 1 do e[v + 1] = 0 end
        e[boundary + 1] = we
        e[eos + 1] = we + w * ngram:logp(h, "</s>")
      else
        for v = 0, V - 1 do
          e[v + 1] = v == eos and w * ngram:logp(s.hist, "</s>")
            or w * ngram:logp(s.hist, labels[v + 1]) + bonus
        end
      end
      out[i] = e
    end
    return out
  end
  function S.advance(st, origin, lab, done)
    local nxt = {}
    for i = 1, #origin do
      local s, c = st[origin[i]], lab[i]
      if done[i] or c == eos then
        nxt[i] = s
      elseif not boundary then
        nxt[i] = {hist = push(s.hist, labels[c + 1]), word = ""}
      elseif c == boundary then
        nxt[i] = {hist = s.word ~= "" and push(s.hist, s.word) or s.hist, word = ""}
      else
        nxt[i] = {hist = s.hist, word = s.word .. labels[c + 1]}
      end
    end
    return nxt
  end
  return S
end

-- rl.ngram_estimate{sentences = {{tok, ...}, ...}, order = 3, output = "lm.arpa", vocab = {...}}:
-- writes the
-- back-off ARPA file of an interpolated Witten-Bell n-gram model of the sentences (tokens:
-- strings without blanks; each sentence is <s> tok ... </s>), for a small character or word LM
-- without outside tools. Per order n and history h seen c(h) times followed by T(h) distinct
-- tokens:
--   p(w | h) = (c(h w) + T(h) p(w | h')) / (c(h) + T(h))      (h' = h without its first token)
-- ending in the uniform distribution over the vocabulary (the tokens, </s>, <unk> and the
-- optional vocab list: tokens the decoder may emit that the sentences lack); written
-- as the listed n-grams' p and each history's back-off weight
--   B(h) = T(h) / (c(h) + T(h)) = (1 - sum_{w seen after h} p(w | h)) / (1 - sum ... p(w | h')),
-- so the file's back-off model gives exactly the interpolated probabilities (<s> is listed with
-- log10 p = -99: it is never predicted). Lines are written in sorted order: the same sentences
-- give the same file. Returns {counts = {n1, n2, ...}, vocab = size}.
function M.estimate(opts)
  local who = "rl.ngram_estimate"
  local function fail(fmt, ...) error(who .. ": " .. string.format(fmt, ...), 0) end
  if type(opts) ~= "table" then fail("expects a table {sentences =, order =, output =}") end
  util.check_options(who, opts, {sentences = true, order = true, output = true, vocab = true})
  local order, sents = opts.order or 3, opts.sentences
  if math.type(order) ~= "integer" or order < 1 or order > 16 then
    fail("order must be an integer in 1..16, got %s", tostring(order))
  end
  if type(sents) ~= "table" or #sents == 0 then
    fail("sentences must be a non-empty list of token lists")
  end
  if type(opts.output) ~= "string" then fail("output must be a path") end
  -- counts[n][key]: n-grams (key: tokens joined by " "), followers[n][history] = {c =, t =}
  local counts, hist = {}, {}
  for n = 1, order do counts[n], hist[n] = {}, {} end
  for si, sent in ipairs(sents) do
    if type(sent) ~= "table" then fail("sentence %d is not a list of tokens", si) end
    local toks = {"<s>"}
    for k, tk in ipairs(sent) do
      if type(tk) ~= "string" or tk == "" or tk:find("%s") or tk == "<s>" or tk == "</s>" then
        fail("sentence %d, token %d: %s is not a token (a string without blanks, not <s> or </s>)",
          si, k, type(tk) == "string" and string.format("%q", tk) or type(tk))
      end
      toks[k + 1] = tk
    end
    toks[#toks + 1] = "</s>"
    for i = 2, #toks do
      local key = toks[i]
      for n = 1, math.min(order, i) do
        if n > 1 then key = toks[i - n + 1] .. " " .. key end
        local c = counts[n]
        local old = c[key]
        c[key] = (old or 0) + 1
        -- the history (all but the last token) of this n-gram
        local h = n == 1 and "" or key:sub(1, #key - #toks[i] - 1)
        local e = hist[n][h]
        if not e then
          e = {c = 0, t = 0}
          hist[n][h] = e
        end
        e.c = e.c + 1
        if not old then e.t = e.t + 1 end
      end
    end
  end
  local function sorted(t)
    local k = {}
    for key in pairs(t) do k[#k + 1] = key end
    table.sort(k)
    return k
  end
  -- p[n][key]: the interpolated probability of each listed n-gram
  local p = {}
  counts[1]["<unk>"] = counts[1]["<unk>"] or 0
  if opts.vocab ~= nil and type(opts.vocab) ~= "table" then
    fail("vocab must be a list of tokens")
  end
  for k, tk in ipairs(opts.vocab or {}) do
    if type(tk) ~= "string" or tk == "" or tk:find("%s") or tk == "<s>" then
      fail("vocab[%d]: %s is not a token", k,
        type(tk) == "string" and string.format("%q", tk) or type(tk))
    end
    counts[1][tk] = counts[1][tk] or 0
  end
  local keys1 = sorted(counts[1])
  local vsize = #keys1
  local u = hist[1][""]
  p[1] = {}
  for _, w in ipairs(keys1) do
    p[1][w] = (counts[1][w] + u.t / vsize) / (u.c + u.t)
  end
  local keys = {keys1}
  for n = 2, order do
    p[n] = {}
    keys[n] = sorted(counts[n])
    for _, key in ipairs(keys[n]) do
      local w = key:match("(%S+)$")
      local h = key:sub(1, #key - #w - 1)
      local lower = key:match("^%S+ (.+)$")
      local e = hist[n][h]
      p[n][key] = (counts[n][key] + e.t * p[n - 1][lower]) / (e.c + e.t)
    end
  end
  -- the back-off weight of history h: what the unseen tokens after h keep, T(h) / (c(h) + T(h))
  local bow = {}
  for n = 2, order do
    bow[n - 1] = {}
    for h, e in pairs(hist[n]) do bow[n - 1][h] = e.t / (e.c + e.t) end
  end
  local f, err = io.open(opts.output, "w")
  if not f then fail("cannot write %s: %s", opts.output, tostring(err)) end
  f:write("\\data\\\n")
  local nums = {#keys1 + 1}
  for n = 2, order do nums[n] = #keys[n] end
  for n = 1, order do f:write(string.format("ngram %d=%d\n", n, nums[n])) end
  local function line(lp, key, b)
    if b then return string.format("%.7f\t%s\t%.7f\n", lp, key, math.log(b, 10)) end
    return string.format("%.7f\t%s\n", lp, key)
  end
  for n = 1, order do
    f:write(string.format("\n\\%d-grams:\n", n))
    if n == 1 then f:write(line(-99, "<s>", order > 1 and bow[1]["<s>"] or nil)) end
    for _, key in ipairs(keys[n]) do
      f:write(line(math.log(p[n][key], 10), key, n < order and bow[n][key] or nil))
    end
  end
  f:write("\n\\end\\\n")
  local ok, werr = f:close()
  if not ok then fail("cannot write %s: %s", opts.output, tostring(werr)) end
  return {counts = nums, vocab = vsize + 1}
end

function M.install(module)
  rl = module
  rl.ngram_estimate = M.estimate
  return M
end

return M
