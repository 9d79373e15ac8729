-- rl.scorer and rl.ctc_score: edit-distance error rates (label, word and sequence), several
-- references (the closest counts, ties to the longer), empty hypotheses and references, string
-- labels, words from label strings, bad inputs; rl.ctc_score against decoding by hand with
-- rl.ctc_decode and rl.edit_distance, with the blank last and in the middle.
local H = dofile("tests/lua/harness.lua")
local test, check, expect_error, near = H.test, H.check, H.expect_error, H.near

test("label errors: substitution, insertion, deletion, equal", function()
  local s = rl.scorer()
  check(s:add({1, 2, 3}, {1, 3}) == 1, "one insertion")
  check(s:add({1, 3}, {1, 2, 3}) == 1, "one deletion")
  check(s:add({4, 2, 3}, {1, 2, 3}) == 1, "one substitution")
  check(s:add({7, 7}, {7, 7}) == 0, "equal")
  local r = s:result()
  check(r.errors == 3 and r.ref_labels == 2 + 3 + 3 + 2,
    "errors " .. r.errors .. " ref " .. r.ref_labels)
  near(r.label_error_rate, 3 / 10, 1e-15, "rate over all references, not a mean of rates")
  check(r.seqs == 4 and r.wrong_seqs == 3, "3 of 4 sequences wrong")
  near(r.seq_error_rate, 0.75, 1e-15, "sequence error rate")
  check(r.word_error_rate == nil, "no words without words = true")
end)

test("empty hypothesis and empty reference", function()
  local s = rl.scorer()
  check(s:add({}, {5, 6, 7}) == 3, "empty hypothesis: every reference label deleted")
  check(s:add({}, {}) == 0, "both empty")
  local r = s:result()
  check(r.errors == 3 and r.ref_labels == 3 and r.seqs == 2 and r.wrong_seqs == 1, "counts")
  local e = rl.scorer()
  check(e:add({1, 2}, {}) == 2, "empty reference: every hypothesis label inserted")
  check(e:result().label_error_rate == math.huge, "errors over no reference label: huge")
  check(rl.scorer():result().label_error_rate == 0, "nothing added: 0")
  check(rl.scorer():result().seq_error_rate == 0, "no sequences: 0")
end)

test("several references: the closest counts, a tie goes to the longer", function()
  local s = rl.scorer()
  check(s:add({1, 2, 3}, {{9, 9}, {1, 2, 4}, {1, 2, 3, 4}}) == 1, "closest distance 1")
  local r = s:result()
  check(r.ref_labels == 4, "the tie {1,2,4} / {1,2,3,4} goes to the longer: " .. r.ref_labels)
  s:add({5}, {{5}, {6, 6}})
  r = s:result()
  check(r.errors == 1 and r.ref_labels == 5 and r.wrong_seqs == 1, "exact match counts 0")
end)

test("string labels (phonemes) and int32 tensors", function()
  local s = rl.scorer()
  check(s:add({"HH", "AH", "L", "OW"}, {{"HH", "EH", "L", "OW"}, {"HH", "AH", "L", "OW"}}) == 0,
    "second pronunciation matches")
  check(s:add({"K", "AE", "T"}, {{"K", "AA", "T"}}) == 1, "one phoneme wrong")
  near(s:result().label_error_rate, 1 / 7, 1e-15, "PER")
  near(s:result().seq_error_rate, 0.5, 1e-15, "G2P's WER: words with an error")
  local t = rl.scorer()
  check(t:add(rl.tensor({1, 2, 3}, "int32"), rl.tensor({1, 3}, "int32")) == 1, "tensors")
  check(t:add(rl.tensor({1, 2}, "int32"), {rl.tensor({2}, "int32"), {1, 2}}) == 0,
    "a list of references mixing tensors and tables")
end)

test("words from label strings (speech WER)", function()
  local vocab = {" ", "a", "b", "c"} -- label 0 is the space
  local s = rl.scorer{labels = vocab, words = true}
  -- "ab c" against "ab cc": one character and one word wrong
  s:add({1, 2, 0, 3}, {1, 2, 0, 3, 3})
  -- " ab " against "ab": two characters, no word wrong
  s:add({0, 1, 2, 0}, {1, 2})
  -- nothing against "a b": three characters, two words deleted
  s:add({}, {1, 0, 2})
  local r = s:result()
  check(r.errors == 1 + 2 + 3 and r.ref_labels == 5 + 2 + 3, "characters")
  check(r.word_errors == 1 + 0 + 2 and r.ref_words == 2 + 1 + 2, "words " .. r.word_errors
    .. " of " .. r.ref_words)
  near(r.word_error_rate, 3 / 5, 1e-15, "WER")
end)

expect_error("bad option", function() rl.scorer{word = true} end,
  "rl.scorer: unknown option 'word' (labels, words)")
expect_error("words without labels", function() rl.scorer{words = true} end,
  "rl.scorer: words = true needs labels")
expect_error("hypothesis not a table", function() rl.scorer():add(3, {1}) end,
  "rl.scorer: hyp must be a table or a 1-D int32 tensor of labels, got number")
expect_error("reference missing", function() rl.scorer():add({1}) end,
  "rl.scorer: add(hyp, ref): ref is missing")
expect_error("a float label", function() rl.scorer():add({1, 2.5}, {1}) end,
  "rl.scorer: hyp: entry 2 is float 2.5 (labels are integers or strings)")
expect_error("a float tensor", function() rl.scorer():add(rl.tensor({1, 2}), {1}) end,
  "rl.scorer: hyp must be a 1-D int32 tensor or a table, got float32")
expect_error("a bad entry of the second reference", function()
  rl.scorer():add({1}, {{1}, {true}})
end, "rl.scorer: reference 2: entry 1 is boolean true")
expect_error("a label without a string", function()
  rl.scorer{labels = {"a", "b"}, words = true}:add({0, 5}, {0})
end, "rl.scorer: hyp: label 5 (entry 2) has no string in labels (2 of them)")

-- a tiny CTC network and a dataset of label sequences on disk
local prefix = os.tmpname()
local path = prefix .. "_score.h5"
local ext = {data = {dim = 3}, classes = {dim = 4, sparse = true}}
local function dataset()
  local g = rl.datasets.new_rng(7)
  local seqs = {}
  for i = 1, 9 do
    local T, S = 4 + i % 5, i % 4
    local x, y = {}, {}
    for t = 1, T do x[t] = {g:normal(), g:normal(), g:normal()} end
    for s = 1, S do y[s] = (i + s) % 4 end
    seqs[i] = {tag = "s" .. i, data = rl.tensor(x),
      classes = S > 0 and rl.tensor(y, "int32") or rl.zeros(0, "int32")}
  end
  rl.dataset_write(path, seqs, {extern_data = ext})
  return rl.dataset{class = "hdf", files = {path}}
end

-- the reference computation: every sequence forward alone, decoded and scored by hand
local function by_hand(net, ds, blank)
  ds:init_epoch(1)
  local errs, n = 0, 0
  for i = 1, ds:num_seqs() do
    local s = ds:get_seq(i)
    local T = s.data:size(1)
    local S = s.classes:size(1)
    local batch = {data = s.data:view(T, 1, 3), lengths = rl.tensor({T}, "int32"),
      classes = S > 0 and s.classes:view(S, 1) or rl.zeros({0, 1}, "int32"),
      lengths_classes = rl.tensor({S}, "int32")}
    net:forward(batch, {train = false})
    local out = net:layer("output")
    local h = rl.ctc_decode(out.output:double():log(), out.geometry, {blank = blank})[1]
    for k, c in ipairs(h) do h[k] = c < blank and c or c - 1 end
    errs = errs + rl.edit_distance(h, s.classes)
    n = n + s.classes:size(1)
  end
  return errs, n
end

for _, bi in ipairs({false, 1}) do
  test("rl.ctc_score against decoding by hand, blank " .. (bi and "at 1" or "last"), function()
    rl.manual_seed(3)
    local net = rl.network({fw = {class = "lstm", n_out = 5},
      output = {class = "softmax", from = "fw", loss = "ctc", target = "classes",
        blank_index = bi or nil}}, ext)
    local ds = dataset()
    local r = rl.ctc_score(net, ds, {batch_size = 20, max_seqs = 3})
    local errs, n = by_hand(net, ds, bi or 4)
    check(r.seqs == 9, "9 sequences, got " .. r.seqs)
    check(r.errors == errs and r.ref_labels == n, string.format("errors %d/%d, by hand %d/%d",
      r.errors, r.ref_labels, errs, n))
    check(errs > 0, "an untrained network makes errors")
    local b4 = rl.ctc_score(net, ds, {batch_size = 20, max_seqs = 3, beam = 4})
    check(b4.seqs == 9 and b4.ref_labels == n, "beam search scores the same references")
  end)
end

expect_error("ctc_score: not a ctc layer", function()
  local net = rl.network({output = {class = "softmax", loss = "ce", target = "classes"}},
    {data = {dim = 3}, classes = {dim = 4, sparse = true}})
  rl.ctc_score(net, dataset())
end, "rl.ctc_score: layer 'output' is not a softmax layer with loss = \"ctc\"")
expect_error("ctc_score: no layer", function()
  local net = rl.network({output = {class = "softmax", loss = "ctc", target = "classes"}}, ext)
  rl.ctc_score(net, dataset(), {layer = "nope"})
end, "rl.ctc_score: layer 'nope' is not a softmax layer")
expect_error("ctc_score: not a dataset", function()
  local net = rl.network({output = {class = "softmax", loss = "ctc", target = "classes"}}, ext)
  rl.ctc_score(net, {})
end, "rl.ctc_score: the second argument must be a dataset")
expect_error("ctc_score: bad option", function()
  rl.ctc_score({description = {}}, {}, {beams = 2})
end, "rl.ctc_score: unknown option 'beams'")

os.remove(path)
os.remove(prefix)
H.done()
