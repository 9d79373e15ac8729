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

local KEYS = {file = true, weight = true, bonus = true, labels = true, word_boundary = true}

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

-- The checked option table lm (of `who`) for V classes with `blank` (nil: no blank, as in an
-- attention search): {ngram =, file =, weight =, bonus =, labels = {V strings},
-- boundary = 0-based class or nil, token = {V 0-based word ids} (char-level), text = labels}.
function M.resolve(lm, V, blank, who)
  local function fail(fmt, ...)
    error(string.format("%s: lm: " .. fmt, who, ...), 0)
  end
  if type(lm) ~= "table" then fail("must be a table {file =, weight =, bonus =}, got %s", type(lm)) end
  for k in pairs(lm) do
    if not KEYS[k] then
      fail("unknown key '%s' (known: %s)", tostring(k), table.concat(util.sorted_keys(KEYS), ", "))
    end
  end
  if type(lm.file) ~= "string" then fail("file (an ARPA n-gram model) must be a path, got %s", type(lm.file)) end
  if not finite(lm.weight) then fail("weight must be a finite number, got %s", tostring(lm.weight)) end
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

function M.install(module)
  rl = module
  return M
end

return M
