-- Error rates of label sequences against references by edit distance (rl.edit_distance, C): the
-- one scorer behind the recipes' CER, WER and PER.
--
--   local s = rl.scorer{labels = vocab, words = true}
--     labels: the label strings, label c is labels[c + 1] (needed for words)
--     words:  also the word error rate: a sequence's label strings joined and split at white
--             space (speech: characters with a space among them)
--   s:add(hyp, ref) -> the edit distance it added
--     hyp: a table or a 1-D int32 tensor of labels: integers (class numbers) or strings
--          (e.g. phonemes), compared with ==
--     ref: the same, or a list of such references (several pronunciations of a word): the
--          closest one counts, a tie going to the longer
--   s:result() -> {errors =, ref_labels =, label_error_rate =, seqs =, wrong_seqs =,
--                  seq_error_rate =, and with words: word_errors =, ref_words =,
--                  word_error_rate =}
--     A rate is errors / reference length, over all sequences added (not a mean of per-sequence
--     rates); over an empty reference it is 0 without errors and math.huge with some. A wrong
--     sequence is one with any label error (G2P's word error rate: its sequences are words).
--
--   rl.ctc_score(net, dataset, {batch_size =, max_seqs =, layer = "output", beam = 1,
--                               labels =, words =}) -> s:result()
--     every sequence of the dataset (its first epoch) through net in inference mode, the CTC
--     softmax `layer` decoded with rl.ctc_decode (beam 1: best path) and scored against the
--     layer's target in the batch; the blank is the layer's blank_index (default its last
--     class) and is taken out of the class numbers, as in rl.forward's decode = "ctc".
local forward = require("rnnlua.forward")

local M = {}
local rl

local function fail(who, fmt, ...)
  error(who .. ": " .. string.format(fmt, ...), 0)
end

local Scorer = {}
Scorer.__index = Scorer

-- seq (a table or a 1-D int32 tensor) as a list of integers for rl.edit_distance: integers as
-- they are, strings numbered by the scorer (negative numbers, apart from any class number)
function Scorer:ids(seq, what)
  if rl.is_tensor(seq) then
    if seq:dim() ~= 1 or seq:dtype() ~= "int32" then
      fail("rl.scorer", "%s must be a 1-D int32 tensor or a table, got %s %s", what,
        seq:dtype(), tostring(seq:size()))
    end
    return seq:totable()
  end
  if type(seq) ~= "table" then
    fail("rl.scorer", "%s must be a table or a 1-D int32 tensor of labels, got %s", what, type(seq))
  end
  local out = {}
  for i, v in ipairs(seq) do
    if math.type(v) == "integer" then
      out[i] = v
    elseif type(v) == "string" then
      local id = self.token_ids[v]
      if not id then
        self.n_tokens = self.n_tokens + 1
        id = -self.n_tokens
        self.token_ids[v] = id
      end
      out[i] = id
    else
      fail("rl.scorer", "%s: entry %d is %s %s (labels are integers or strings)", what, i,
        math.type(v) or type(v), tostring(v))
    end
  end
  return out
end

-- the words of a sequence of label numbers, each word a number
function Scorer:words_of(seq, what)
  local chars = {}
  for i, c in ipairs(seq) do
    local s = math.type(c) == "integer" and self.labels[c + 1]
    if type(s) ~= "string" then
      fail("rl.scorer", "%s: label %s (entry %d) has no string in labels (%d of them)", what,
        tostring(c), i, #self.labels)
    end
    chars[i] = s
  end
  local out = {}
  for w in table.concat(chars):gmatch("%S+") do
    local id = self.word_ids[w]
    if not id then
      self.n_words = self.n_words + 1
      id = self.n_words
      self.word_ids[w] = id
    end
    out[#out + 1] = id
  end
  return out
end

function Scorer:add(hyp, ref)
  local h = self:ids(hyp, "hyp")
  if ref == nil then fail("rl.scorer", "add(hyp, ref): ref is missing") end
  local refs = ref
  if not (type(ref) == "table" and (type(ref[1]) == "table" or rl.is_tensor(ref[1]))) then
    refs = {ref}
  end
  local best, bref
  for k, r in ipairs(refs) do
    local ids = self:ids(r, #refs > 1 and ("reference " .. k) or "ref")
    local d = rl.edit_distance(h, ids)
    if not best or d < best or (d == best and #ids > #bref) then best, bref = d, ids end
  end
  self.errors, self.ref_labels = self.errors + best, self.ref_labels + #bref
  self.seqs = self.seqs + 1
  if best > 0 then self.wrong_seqs = self.wrong_seqs + 1 end
  if self.words then
    local rw = self:words_of(bref, "ref")
    self.word_errors = self.word_errors + rl.edit_distance(self:words_of(h, "hyp"), rw)
    self.ref_words = self.ref_words + #rw
  end
  return best
end

local function rate(errors, n)
  if n > 0 then return errors / n end
  return errors == 0 and 0 or math.huge
end

function Scorer:result()
  local r = {errors = self.errors, ref_labels = self.ref_labels,
             label_error_rate = rate(self.errors, self.ref_labels), seqs = self.seqs,
             wrong_seqs = self.wrong_seqs, seq_error_rate = rate(self.wrong_seqs, self.seqs)}
  if self.words then
    r.word_errors, r.ref_words = self.word_errors, self.ref_words
    r.word_error_rate = rate(self.word_errors, self.ref_words)
  end
  return r
end

local function check_keys(who, opts, allowed)
  if opts == nil then return {} end
  if type(opts) ~= "table" then fail(who, "options must be a table, got %s", type(opts)) end
  for k in pairs(opts) do
    if not allowed[k] then
      local names = {}
      for n in pairs(allowed) do names[#names + 1] = n end
      table.sort(names)
      fail(who, "unknown option '%s' (%s)", tostring(k), table.concat(names, ", "))
    end
  end
  return opts
end

function M.scorer(opts)
  opts = check_keys("rl.scorer", opts, {labels = true, words = true})
  if opts.labels ~= nil and type(opts.labels) ~= "table" then
    fail("rl.scorer", "labels must be a list of strings, got %s", type(opts.labels))
  end
  if opts.words and not opts.labels then
    fail("rl.scorer", "words = true needs labels (the string of each label)")
  end
  return setmetatable({labels = opts.labels or {}, words = opts.words == true, token_ids = {},
    n_tokens = 0, word_ids = {}, n_words = 0, errors = 0, ref_labels = 0, seqs = 0,
    wrong_seqs = 0, word_errors = 0, ref_words = 0}, Scorer)
end

function M.ctc_score(net, ds, opts)
  local who = "rl.ctc_score"
  opts = check_keys(who, opts, {batch_size = true, max_seqs = true, layer = true, beam = true,
                                labels = true, words = true, lm = true})
  if type(net) ~= "table" or type(net.description) ~= "table" then
    fail(who, "the first argument must be a network (rl.network or rl.train's r.net)")
  end
  local layer = opts.layer or "output"
  local d = net.description[layer]
  if type(d) ~= "table" or d.class ~= "softmax" or d.loss ~= "ctc" then
    fail(who, "layer '%s' is not a softmax layer with loss = \"ctc\"", tostring(layer))
  end
  if type(ds) ~= "table" or type(ds.init_epoch) ~= "function" then
    fail(who, "the second argument must be a dataset (rl.dataset)")
  end
  local blank = d.blank_index or net:layer(layer).n_out - 1
  local V = net:layer(layer).n_out
  local t = d.target and net.extern_data and net.extern_data[d.target]
  local lm = forward.ctc_lm(opts.lm, blank, V, opts.labels or (t and t.labels), who)
  local s = M.scorer{labels = opts.labels, words = opts.words}
  ds:init_epoch(1)
  for batch in rl.batches(ds, {batch_size = opts.batch_size, max_seqs = opts.max_seqs}) do
    net:forward(batch, {train = false})
    local out = net:layer(layer)
    local hyp = forward.ctc_labels({blank = blank}, out.output, out.geometry, opts.beam or 1, lm)
    local refs, lens = batch[d.target], batch["lengths_" .. d.target]
    if not refs or not lens then
      fail(who, "the dataset's batches have no target '%s' (the layer's) with its lengths",
        tostring(d.target))
    end
    refs, lens = refs:totable(), lens:totable()
    for b, h in ipairs(hyp) do
      local ref = {}
      for i = 1, lens[b] do ref[i] = refs[i][b] end
      s:add(h, ref)
    end
  end
  return s:result()
end

function M.install(r)
  rl = r
  r.scorer, r.ctc_score = M.scorer, M.ctc_score
end

return M
