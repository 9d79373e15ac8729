-- Character n-gram LM fusion for the CTC recipes (htr_lines, speech_digits): the LM made from
-- training text, the network's outputs on a dataset computed once, each decoding of them
-- scored, and the LM's weight and insertion bonus chosen on the dev set.
--
--   local F = dofile("recipes/lm_fusion.lua")
--   F.char_lm(path, texts, labels, order) -> path
--     writes the ARPA file of an interpolated Witten-Bell character n-gram (rl.ngram_estimate)
--     of texts (a list of strings, each a sentence; every character a token, the space the
--     token <sp>) over the network's labels (its classes' characters, the blank left out: the
--     vocabulary the decoder may emit, seen in the texts or not), unless path already exists:
--     name it after what makes the text differ
--   F.outputs(net, ds, batching) -> outs
--     the CTC softmax layer "output"'s log-probabilities of every sequence of dataset ds (its
--     first epoch, inference mode), with their lengths and reference labels, kept to be decoded
--     many times; batching = {batch_size =, max_seqs =}; the blank is the last class
--   F.score(outs, decode, scorer) -> rl.scorer's result
--     outs (lists may be joined) decoded with rl.ctc_decode options decode, scored by
--     rl.scorer(scorer)
--   F.tune(dev_outs, path, labels, scorer, rate, name) -> decode, note
--     prefix beam search (beam 8) with the LM at path: the weight and bonus of a small grid with
--     the lowest dev result[rate] (ties: the first), and a line saying what was chosen (the
--     rate called name: "CER", "WER")
local M = {}

M.WEIGHTS, M.BONUSES, M.BEAM = {0.3, 0.5, 0.8, 1.2}, {0, 0.5, 1.5, 3}, 8

-- A label's LM token: the space has a name, so that ARPA's white-space separated lines hold it.
local function token(c)
  return c == " " and "<sp>" or c
end

function M.char_lm(path, texts, labels, order)
  local f = io.open(path, "r")
  if f then
    f:close()
    return path
  end
  local sents, vocab = {}, {}
  for i, text in ipairs(texts) do
    local t = {}
    for c in text:gmatch(".") do t[#t + 1] = token(c) end
    sents[i] = t
  end
  for i, c in ipairs(labels) do vocab[i] = token(c) end
  local t0 = rl.clock()
  local r = rl.ngram_estimate{sentences = sents, order = order, output = path .. ".tmp",
    vocab = vocab}
  assert(os.rename(path .. ".tmp", path))
  print(string.format("character %d-gram LM of %d lines (%s n-grams) -> %s (%.1f s)", order,
    #sents, table.concat(r.counts, "/"), path, rl.clock() - t0))
  return path
end

function M.outputs(net, ds, batching)
  ds:init_epoch(1)
  local all = {}
  for batch in rl.batches(ds, batching) do
    net:forward(batch, {train = false})
    local out = net:layer("output")
    local refs, lens = batch.classes:totable(), batch.lengths_classes:totable()
    local r = {}
    for b = 1, #lens do
      r[b] = {}
      for i = 1, lens[b] do r[b][i] = refs[i][b] end
    end
    all[#all + 1] = {logp = out.output:double():log(), lengths = out.geometry:clone(), refs = r}
  end
  return all
end

function M.score(outs, decode, scorer)
  local s = rl.scorer(scorer)
  for _, o in ipairs(outs) do
    for b, h in ipairs(rl.ctc_decode(o.logp, o.lengths, decode)) do s:add(h, o.refs[b]) end
  end
  return s:result()
end

function M.tune(dev_outs, path, labels, scorer, rate, name)
  local lm_labels = {}
  for i, c in ipairs(labels) do lm_labels[i] = token(c) end
  lm_labels[#labels + 1] = "<blank>"
  local best
  for _, w in ipairs(M.WEIGHTS) do
    for _, bonus in ipairs(M.BONUSES) do
      local o = {blank = #labels, beam = M.BEAM, lm = {file = path, weight = w, bonus = bonus,
        labels = lm_labels}}
      local e = M.score(dev_outs, o, scorer)[rate]
      if not best or e < best.e then best = {e = e, decode = o} end
    end
  end
  local plain = M.score(dev_outs, {blank = #labels}, scorer)[rate]
  return best.decode, string.format("LM weight %.1f, bonus %.1f (dev %s %.2f%% with LM, %.2f%% "
    .. "best path)", best.decode.lm.weight, best.decode.lm.bonus, name,
    100 * best.e, 100 * plain)
end

return M
