-- LM fusion in the attention beam search (Rec:search, rl.search{lm = ...}): an n-gram LM
-- (char and word level) and a neural char LM whose carried state follows each hypothesis. Each
-- final hypothesis' score must be its model log-probability plus weight times the LM's
-- log-probability of its labels (computed here independently: the n-gram's sentence score, the
-- neural LM run afresh over the whole text) plus bonus per label; weight 0 must give the search
-- without an LM; bad options are errors naming the option.
local H = dofile("tests/lua/harness.lua")
local test, check, expect_error = H.test, H.check, H.expect_error

local tmp = H.tmpdir()
local function path(name) return tmp .. "/" .. name end

-- an encoder-decoder with additive attention; classes: 5 labels, 0 = end of sequence
rl.manual_seed(11)
local net = rl.network(H.seq2seq(5, 4))
net:layer("dec").params["output_prob.W"]:mul_(3)
local LABELS = {"</e>", "a", "b", "|", "c"} -- class 0 ends; 3 is a word boundary for a word LM

local LENS = {5, 2, 7, 4}
local x = rl.zeros(7, #LENS, 3)
rl.manual_seed(3)
x:copy_(rl.randn(7, #LENS, 3))
local batch = {data = x, lengths = rl.tensor(LENS, "int32")}

local function write(name, text)
  local f = assert(io.open(path(name), "w"))
  f:write(text)
  f:close()
  return path(name)
end
local CHAR = write("char.arpa", "\\data\\\nngram 1=7\nngram 2=4\n\n\\1-grams:\n-1 <s> -0.3\n"
  .. "-0.9 </s>\n-0.4 a -0.2\n-0.6 b -0.1\n-0.8 | -0.2\n-1.1 c\n-2 <unk>\n\n\\2-grams:\n"
  .. "-0.1 <s> a\n-0.2 a b\n-0.3 b </s>\n-0.5 | c\n\n\\end\\\n")
local WORD = write("word.arpa", "\\data\\\nngram 1=6\nngram 2=3\n\n\\1-grams:\n-99 <s> -0.3\n"
  .. "-0.9 </s>\n-0.5 ab -0.2\n-0.7 c -0.1\n-0.9 ba\n-1.4 <unk>\n\n\\2-grams:\n-0.2 <s> ab\n"
  .. "-0.3 ab c\n-0.4 c </s>\n\n\\end\\\n")

local function run(lm) return net:search(batch, {lm = lm}) end

local function finished(h) return #h.labels + 1 == h.steps end

test("weight 0 gives the search without an LM (labels and scores)", function()
  local plain = run(nil)
  for _, lm in ipairs({{file = CHAR, weight = 0, labels = LABELS},
      {file = WORD, weight = 0, labels = LABELS, word_boundary = "|"}}) do
    local got = run(lm)
    for b, r in ipairs(plain) do
      check(#got[b].hyps == #r.hyps, "hypotheses")
      for k, h in ipairs(r.hyps) do
        local g = got[b].hyps[k]
        check(table.concat(g.labels, ",") == table.concat(h.labels, ",") and g.score == h.score
          and g.logp == h.logp, string.format("sequence %d hypothesis %d", b, k))
      end
    end
  end
end)

-- the char n-gram's log-probability of labels (+ </s> when finished)
local function char_lm(h)
  local ngram = rl._ngram_load(CHAR)
  local words, s = {}, 0
  local hist = {"<s>"}
  for _, c in ipairs(h.labels) do
    s = s + ngram:logp(hist, LABELS[c + 1])
    hist[#hist + 1] = LABELS[c + 1]
  end
  if finished(h) then s = s + ngram:logp(hist, "</s>") end
  return s, #h.labels, words
end

test("char n-gram: every hypothesis' score is logp + weight LM + bonus per label", function()
  local w, bonus, n = 1.3, 0.4, 0
  local res = run({file = CHAR, weight = w, bonus = bonus, labels = LABELS})
  local plain = run(nil)
  local differ = false
  for b, r in ipairs(res) do
    for _, h in ipairs(r.hyps) do
      local lmv, count = char_lm(h)
      H.near(h.score, h.logp + w * lmv + bonus * count, 1e-9, "fused score")
      n = n + 1
    end
    differ = differ or table.concat(r.labels, ",") ~= table.concat(plain[b].labels, ",")
  end
  check(n >= 8, "hypotheses checked: " .. n)
  check(differ, "the LM changed no sequence's best labels")
end)

test("word n-gram: words joined between boundaries, scored at the boundary and the end", function()
  local w, bonus = 0.8, 0.25
  local ngram = rl._ngram_load(WORD)
  local res = run({file = WORD, weight = w, bonus = bonus, labels = LABELS, word_boundary = "|"})
  for _, r in ipairs(res) do
    for _, h in ipairs(r.hyps) do
      local hist, word, s, words = {"<s>"}, "", 0, 0
      local function flush()
        if word ~= "" then
          s = s + (w * ngram:logp(hist, word) + bonus)
          hist[#hist + 1], word, words = word, "", words + 1
        end
      end
      for _, c in ipairs(h.labels) do
        if c == 3 then flush() else word = word .. LABELS[c + 1] end
      end
      if finished(h) then
        flush()
        s = s + w * ngram:logp(hist, "</s>")
      end
      H.near(h.score, h.logp + s, 1e-9, "fused score of " .. table.concat(h.labels, ","))
    end
  end
end)

test("rl.search takes lm = {...} (labels from its labels)", function()
  rl.save_checkpoint(path("model.h5"), {net = net})
  local seqs = {}
  for i, T in ipairs(LENS) do
    seqs[i] = {tag = "u" .. i, data = x:narrow(1, 1, T):select(2, i):contiguous(),
      classes = rl.tensor({1}, "int32")}
  end
  rl.dataset_write(path("data.h5"), seqs, {extern_data = {data = {dim = 3},
    classes = {dim = 5, sparse = true}}})
  local r = rl.search{model = path("model.h5"), data = {class = "hdf", files = {path("data.h5")}},
    output_file = path("out.h5"), labels = LABELS, lm = {file = CHAR, weight = 1.3, bonus = 0.4},
    log_verbosity = 0}
  local direct = run({file = CHAR, weight = 1.3, bonus = 0.4, labels = LABELS})
  for i = 1, #LENS do
    check(table.concat(r.results[i].labels, ",") == table.concat(direct[i].labels, ","),
      "sequence " .. i)
  end
end)

-- a neural char LM (untrained, random parameters): the carried state per hypothesis must give
-- what the LM gives on the whole text run afresh
local VOCAB = {"\n", "a", "b", "c", "|"}
local LMNET = {
  emb = {class = "embedding", n_out = 5, from = "data"},
  l1 = {class = "lstm", n_out = 8, from = "emb"},
  output = {class = "softmax", from = "l1", loss = "ce", target = "classes"},
}
local LMEXT = {data = {dim = 5, sparse = true, labels = VOCAB},
  classes = {dim = 5, sparse = true, labels = VOCAB}}
rl.manual_seed(5)
local lmnet = rl.network(LMNET, LMEXT, {dtype = "float64"})
rl.save_checkpoint(path("charlm.h5"), {net = lmnet})
local index = {}
for k, c in ipairs(VOCAB) do index[c] = k - 1 end

test("neural char LM: carried state per hypothesis equals the LM over the whole text", function()
  local w, bonus, n = 0.9, 0.3, 0
  local res = run({model = path("charlm.h5"), weight = w, bonus = bonus, labels = LABELS})
  local ref = rl.network({emb = LMNET.emb, l1 = LMNET.l1,
    output = {class = "softmax", from = "l1", is_output_layer = true, n_out = 5}}, LMEXT,
    {dtype = "float64"})
  rl.checkpoint.load_params(rl.load_checkpoint(path("charlm.h5")), ref)
  for _, r in ipairs(res) do
    for _, h in ipairs(r.hyps) do
      local ids = {index["\n"]}
      for _, c in ipairs(h.labels) do ids[#ids + 1] = index[LABELS[c + 1]] end
      ref:forward({data = rl.tensor(ids, "int32"):view(#ids, 1),
        lengths = rl.tensor({#ids}, "int32")}, {train = false})
      local y = ref:layer("output").output
      local s = 0
      for t, c in ipairs(h.labels) do
        s = s + (w * math.log(y[t][1][index[LABELS[c + 1]] + 1]) + bonus)
      end
      if finished(h) then s = s + w * math.log(y[#ids][1][index["\n"] + 1]) end
      H.near(h.score, h.logp + s, 1e-9, "fused score of " .. table.concat(h.labels, ","))
      n = n + 1
    end
  end
  check(n >= 8, "hypotheses checked: " .. n)
end)

expect_error("neural LM whose vocabulary lacks a label", function()
  run({model = path("charlm.h5"), weight = 1, labels = {"</e>", "a", "b", "z", "c"}})
end, "lm: model " .. path("charlm.h5") .. ": its vocabulary (5 characters) does not cover the labels: 3 ('z')")
expect_error("lm weight not a number", function()
  run({file = CHAR, weight = "1", labels = LABELS})
end, "lm: weight must be a finite number, got 1")
expect_error("lm: both file and model", function()
  run({file = CHAR, model = path("charlm.h5"), weight = 1, labels = LABELS})
end, "lm: give file (an ARPA n-gram model) or model (a neural LM), not both")
expect_error("lm: n-gram vocabulary does not cover the labels", function()
  run({file = CHAR, weight = 1, labels = {"</e>", "a", "b", "x", "c"}})
end, "does not cover the labels: label 3 ('x') is not in it")
test("neural char LM in CTC prefix beam search equals the Lua reference search", function()
  -- the reference scores each extension by running the LM afresh over "\n" .. the prefix
  local ref = dofile("tests/lua/ctc_beam_ref.lua")
  local net = rl.network({emb = LMNET.emb, l1 = LMNET.l1,
    output = {class = "softmax", from = "l1", is_output_layer = true, n_out = 5}}, LMEXT,
    {dtype = "float64"})
  rl.checkpoint.load_params(rl.load_checkpoint(path("charlm.h5")), net)
  local function score(hist, w)
    local ids = {index["\n"]}
    for _, c in ipairs(hist) do ids[#ids + 1] = index[c] end
    net:forward({data = rl.tensor(ids, "int32"):view(#ids, 1),
      lengths = rl.tensor({#ids}, "int32")}, {train = false})
    local p = net:layer("output").output[#ids][1][index[w == "</s>" and "\n" or w] + 1]
    local h = table.move(hist, 1, #hist, 1, {})
    h[#h + 1] = w
    return math.log(math.max(p, 1e-30)), h
  end
  local labels = {"a", "b", "c", "|", "-"} -- blank 4
  local n, changed = 0, 0
  for seed = 1, 4 do
    rl.manual_seed(seed)
    local T = 5 + seed
    local xl = rl.randn(T, 2, 5) * 2
    local lens = rl.tensor({T, T - 2}, "int32")
    for _, wb in ipairs({{0.7, 0.3}, {2.0, 0}}) do
      for _, beam in ipairs({2, 5}) do
        local got = rl.ctc_decode(xl, lens, {blank = 4, beam = beam, lm = {model = path("charlm.h5"),
          weight = wb[1], bonus = wb[2], labels = labels}})
        local want = ref.decode(xl, lens, 4, beam, {score = score, start = {}, weight = wb[1],
          bonus = wb[2], labels = labels})
        local plain = rl.ctc_decode(xl, lens, {blank = 4, beam = beam})
        for s = 1, 2 do
          if table.concat(got[s], ",") ~= table.concat(plain[s], ",") then changed = changed + 1 end
          check(table.concat(got[s], ",") == table.concat(want[s], ","), string.format(
            "seed %d weight %g beam %d sequence %d: C %s, Lua %s", seed, wb[1], beam, s,
            table.concat(got[s], ","), table.concat(want[s], ",")))
          n = n + 1
        end
      end
    end
  end
  check(n == 32)
  check(changed >= 4, "the LM changed the labels of only " .. changed .. " of 32 sequences")
end)
expect_error("neural LM: a word boundary is refused", function()
  rl.ctc_decode(rl.zeros(2, 1, 5), rl.tensor({2}, "int32"), {blank = 4, beam = 2,
    lm = {model = path("charlm.h5"), weight = 1, labels = {"a", "b", "c", "|", "-"}, word_boundary = "|"}})
end, "rl.ctc_decode: lm: word_boundary applies to a word n-gram model (file =)")

H.rm_rf(tmp)
H.done()
