-- n-gram language models (kernels/ngram.c) and their fusion into CTC prefix beam search
-- (kernels/cpu/ctc_beam.c): the ARPA reader against probabilities computed by hand with back-off,
-- malformed files as errors naming the file and line, the fused search against the Lua reference
-- (tests/lua/ctc_beam_ref.lua) for char and word LMs, weight 0 equal to no LM, and bad options.
local H = dofile("tests/lua/harness.lua")
local test, check, expect_error = H.test, H.check, H.expect_error
local ref = dofile("tests/lua/ctc_beam_ref.lua")

local CHAR, WORD = "tests/data/lm_char.arpa", "tests/data/lm_word.arpa"
local LN10 = math.log(10)

test("reader: counts, vocabulary, special words", function()
  local lm = rl._ngram_load(CHAR)
  check(lm:order() == 3, "order")
  local c = lm:counts()
  check(c[1] == 6 and c[2] == 5 and c[3] == 2, "counts")
  check(lm:vocab_size() == 6 and lm:has_unk(), "vocabulary")
  check(lm:word(lm:id("b")) == "b" and lm:id("zz") == nil, "ids")
end)

test("reader: probabilities with back-off, computed by hand", function()
  local lm = rl._ngram_load(CHAR)
  local cases = {
    {{"<s>"}, "a", -0.2},               -- listed 2-gram
    {{"<s>", "a"}, "b", -0.1},          -- listed 3-gram
    {{"a", "b"}, "a", -0.05},
    {{"<s>", "a"}, "c", -0.1 - 0.3 - 0.9}, -- B(<s> a) B(a) P(c)
    {{"b", "a"}, "b", -0.4},            -- (b a) unlisted: no back-off weight, then P(a b)
    {{"a", "b"}, "</s>", -0.25 - 0.2 - 0.7},
    {{"<s>"}, "zzz", -0.5 - 1.2},       -- unknown: <unk>
    {{"c", "c", "c", "<s>", "a"}, "b", -0.1}, -- only the last order - 1 words count
    {{}, "c", -0.9},
  }
  for _, cse in ipairs(cases) do
    local got = lm:logp(cse[1], cse[2])
    H.near(got, cse[3] * LN10, 1e-12, table.concat(cse[1], " ") .. " -> " .. cse[2])
  end
  H.near(lm:sentence({"a", "b", "a"}), (-0.2 - 0.1 - 0.05 - 0.5) * LN10, 1e-12, "sentence")
end)

test("reader: a whole row after a history equals the word-by-word scores exactly", function()
  local lm = rl._ngram_load(CHAR)
  for _, h in ipairs({{}, {"<s>"}, {"<s>", "a"}, {"a", "b"}, {"b", "a"}, {"c", "c"}, {"<unk>", "b"}}) do
    local row = lm:row(h)
    check(#row == lm:vocab_size(), "a row over the vocabulary")
    for id = 0, lm:vocab_size() - 1 do
      local w = lm:word(id)
      check(row[id + 1] == lm:logp(h, w), string.format("%s -> %s: row %.17g, score %.17g",
        table.concat(h, " "), w, row[id + 1], lm:logp(h, w)))
    end
  end
end)

test("reader: a model without <unk> floors unknown words at log10 -100", function()
  local dir = H.tmpdir()
  local f = io.open(dir .. "/m.arpa", "w")
  f:write("\\data\\\nngram 1=3\n\n\\1-grams:\n-1 <s>\n-0.5 </s>\n-0.2 x\n\n\\end\\\n")
  f:close()
  local lm = rl._ngram_load(dir .. "/m.arpa")
  H.rm_rf(dir)
  check(not lm:has_unk(), "no unk")
  H.near(lm:logp({"<s>"}, "y"), -100 * LN10, 1e-9, "floor")
  H.near(lm:logp({"<s>"}, "x"), -0.2 * LN10, 1e-12, "a 1-gram model")
end)

-- malformed files: each an error naming the file and the line
local base = "\\data\\\nngram 1=3\nngram 2=1\n\n\\1-grams:\n-1 <s> -0.1\n-0.5 </s>\n-0.2 x -0.3\n\n"
  .. "\\2-grams:\n-0.1 <s> x\n\n\\end\\\n"
local bad = {
  {"no data section", "just text\n", ":1: no \\data\\ line"},
  {"empty", "", ":1: no \\data\\ line"},
  {"bad count line", base:gsub("ngram 2=1", "ngram 2 one"), ":3: expected 'ngram N=COUNT'"},
  {"orders out of sequence", base:gsub("ngram 2=1", "ngram 3=1"), ":3: 'ngram 3=' where 'ngram 2='"},
  {"negative count", base:gsub("ngram 2=1", "ngram 2=-4"), ":3: ngram 2=-4: a count"},
  {"huge count", base:gsub("ngram 2=1", "ngram 2=1000000000000000"), ":3: ngram 2=1000000000000000 announces more"},
  {"count above the lines", base:gsub("ngram 2=1", "ngram 2=2"), ":13: '\\end\\' after 1 2-grams; the header announced 2"},
  {"count below the lines", base:gsub("ngram 1=3", "ngram 1=2"), ":8: more 1-grams than the header's ngram 1=2"},
  {"more lines than counted at the end", base:gsub("%-0.1 <s> x\n", "-0.1 <s> x\n-0.2 x </s>\n"), ":12: more 2-grams than the header's ngram 2=1"},
  {"missing section", base:gsub("\\2%-grams:\n%-0.1 <s> x\n\n", ""), ":10: expected '\\2-grams:', got '\\end\\'"},
  {"truncated", base:sub(1, #base - 18), ":10: the file ends inside the 2-grams: 0 of the 1 announced"},
  {"no end", base:gsub("\\end\\\n", ""), ":12: the file ends without '\\end\\'"},
  {"non-numeric probability", base:gsub("%-0.5 </s>", "abc </s>"), ":7: the log10 probability 'abc' is not a finite number"},
  {"nan probability", base:gsub("%-0.5 </s>", "nan </s>"), ":7: the log10 probability 'nan'"},
  {"inf back-off", base:gsub("%-1 <s> %-0.1", "-1 <s> inf"), ":6: the log10 back-off 'inf'"},
  {"positive probability", base:gsub("%-0.5 </s>", "0.5 </s>"), ":7: the log10 probability 0.5 is above 0"},
  {"too many fields", base:gsub("%-0.1 <s> x\n", "-0.1 <s> x -0.2\n"), ":11: a 2-gram line holds"},
  {"too few fields", base:gsub("%-0.5 </s>", "-0.5"), ":7: a 1-gram line holds"},
  {"unknown word in a 2-gram", base:gsub("%-0.1 <s> x", "-0.1 <s> y"), ":11: the word 'y' of this 2-gram is not among the 1-grams"},
  {"3-gram without its context", base:gsub("ngram 2=1", "ngram 2=1\nngram 3=1"):gsub("\\end", "\\3-grams:\n-0.2 x <s> </s>\n\n\\end"), ":15: the context 'x <s>' of this 3-gram is not listed among the 2-grams"},
  {"duplicate 1-gram", base:gsub("%-0.2 x %-0.3", "-0.2 </s> -0.3"), ":8: the word '</s>' is listed twice"},
  {"NUL byte", base:gsub("%-0.5 </s>", "-0.5 </\0s>"), ":7: a NUL byte"},
  {"no </s>", base:gsub("%-0.5 </s>", "-0.5 y"), ": the 1-grams lack </s>"},
  {"order above the maximum", "\\data\\\n" .. (function()
    local t = {}
    for n = 1, 17 do t[n] = "ngram " .. n .. "=1" end
    return table.concat(t, "\n")
  end)() .. "\n", ":18: order 17 is above the 16"},
}
local dir = H.tmpdir()
for i, b in ipairs(bad) do
  local path = string.format("%s/bad%d.arpa", dir, i)
  local f = assert(io.open(path, "wb"))
  f:write(b[2])
  f:close()
  expect_error("malformed ARPA: " .. b[1], function() rl._ngram_load(path) end, path .. b[3])
end
expect_error("missing ARPA file", function() rl._ngram_load(dir .. "/none.arpa") end,
  dir .. "/none.arpa: cannot open")
test("the base of the malformed files reads", function()
  local path = dir .. "/good.arpa"
  local f = assert(io.open(path, "wb"))
  f:write(base)
  f:close()
  check(rl._ngram_load(path):order() == 2, "order 2")
end)

-- fused decoding against the Lua reference
local function logits(T, B, V, seed)
  rl.manual_seed(seed)
  return rl.randn(T, B, V) * 2
end

local function same(a, b)
  for s = 1, math.max(#a, #b) do
    if table.concat(a[s] or {"missing"}, ",") ~= table.concat(b[s] or {"missing"}, ",") then
      return false, s
    end
  end
  return true
end

test("char LM fusion equals the Lua reference (random batches, weights, bonuses, beams)", function()
  local model = ref.read_arpa(CHAR)
  local labels = {"a", "b", "c", "-"} -- blank 3
  local n = 0
  for seed = 1, 8 do
    local T, B = 6 + seed % 4, 3
    local x = logits(T, B, 4, seed)
    local lens = rl.tensor({T, T - 2, 1 + seed % 3}, "int32")
    for _, wb in ipairs({{0.5, 0}, {1.5, 1.0}, {0.8, -0.5}}) do
      for _, beam in ipairs({1, 2, 5}) do
        local got = rl.ctc_decode(x, lens, {blank = 3, beam = beam,
          lm = {file = CHAR, weight = wb[1], bonus = wb[2], labels = labels}})
        local want = ref.decode(x, lens, 3, beam, {model = model, weight = wb[1], bonus = wb[2],
          labels = labels})
        local ok, s = same(got, want)
        check(ok, string.format("seed %d weight %g bonus %g beam %d: sequence %d: C %s, Lua %s",
          seed, wb[1], wb[2], beam, s or 0, table.concat(got[s or 1], ","),
          table.concat(want[s or 1], ",")))
        n = n + 1
      end
    end
  end
  check(n == 72)
end)

test("word LM fusion (lexicon-free, boundary label) equals the Lua reference", function()
  local model = ref.read_arpa(WORD)
  local labels = {"a", "b", "|", "_"} -- blank 3, boundary 2
  for seed = 11, 18 do
    local T, B = 8 + seed % 3, 3
    local x = logits(T, B, 4, seed)
    local lens = rl.tensor({T, T - 3, 2}, "int32")
    for _, wb in ipairs({{0.7, 0.2}, {2.0, 1.0}}) do
      for _, beam in ipairs({2, 6}) do
        local got = rl.ctc_decode(x, lens, {blank = 3, beam = beam, lm = {file = WORD,
          weight = wb[1], bonus = wb[2], labels = labels, word_boundary = "|"}})
        local want = ref.decode(x, lens, 3, beam, {model = model, weight = wb[1], bonus = wb[2],
          labels = labels, boundary = 2})
        local ok, s = same(got, want)
        check(ok, string.format("seed %d weight %g beam %d: sequence %d: C %s, Lua %s", seed,
          wb[1], beam, s or 0, table.concat(got[s or 1], ","), table.concat(want[s or 1], ",")))
      end
    end
  end
end)

test("weight 0 and bonus 0 give exactly the search without an LM", function()
  for seed = 21, 26 do
    local x = logits(12, 4, 4, seed)
    local lens = rl.tensor({12, 9, 5, 12}, "int32")
    for _, beam in ipairs({2, 4, 8}) do
      local plain = rl.ctc_decode(x, lens, {blank = 3, beam = beam})
      local c = rl.ctc_decode(x, lens, {blank = 3, beam = beam,
        lm = {file = CHAR, weight = 0, labels = {"a", "b", "c", "-"}}})
      local w = rl.ctc_decode(x, lens, {blank = 3, beam = beam,
        lm = {file = WORD, weight = 0, labels = {"a", "b", "|", "_"}, word_boundary = 2}})
      check(same(plain, c) and same(plain, w), "seed " .. seed .. " beam " .. beam)
    end
  end
end)

test("the LM decides between acoustically equal labellings", function()
  -- frames: a, then c slightly above b: the char LM prefers a b (p(b | <s> a) = -0.1 against
  -- p(c | <s> a) = -1.3 in log10)
  local p = {{0.9, 0.03, 0.03, 0.04}, {0.04, 0.44, 0.46, 0.06}}
  local x = rl.zeros(2, 1, 4)
  for t = 1, 2 do for v = 1, 4 do x[t][1][v] = math.log(p[t][v]) end end
  local lens = rl.tensor({2}, "int32")
  local opts = {blank = 3, beam = 4, lm = {file = CHAR, weight = 1, bonus = 1,
    labels = {"a", "b", "c", "-"}}}
  local r = rl.ctc_decode(x, lens, {blank = 3, beam = 4})[1]
  check(table.concat(r, ",") == "0,2", "without the LM: " .. table.concat(r, ","))
  r = rl.ctc_decode(x, lens, opts)[1]
  check(table.concat(r, ",") == "0,1", "with the LM: " .. table.concat(r, ","))
  -- with the classes named the other way round the LM agrees with the frames
  opts.lm.labels = {"a", "c", "b", "-"}
  r = rl.ctc_decode(x, lens, opts)[1]
  check(table.concat(r, ",") == "0,2", "labels swapped: " .. table.concat(r, ","))
end)

test("threads give the same labels as one thread", function()
  local x = logits(30, 7, 4, 5)
  local lens = rl.full({7}, 30, "int32")
  local opts = {blank = 3, beam = 6, lm = {file = CHAR, weight = 0.9, bonus = 0.3,
    labels = {"a", "b", "c", "-"}}}
  local n = rl.get_num_threads()
  rl.set_num_threads(1)
  local one = rl.ctc_decode(x, lens, opts)
  rl.set_num_threads(3)
  local three = rl.ctc_decode(x, lens, opts)
  rl.set_num_threads(n)
  check(same(one, three))
end)

test("an LM file is loaded once", function()
  local lmod = require("rnnlua.lm")
  check(lmod.ngram(CHAR, "t") == lmod.ngram(CHAR, "t"), "cached")
end)

test("rl.forward's lm: labels and word_boundary in the targets' numbering get the blank's place", function()
  local forward = require("rnnlua.forward")
  local c = forward.ctc_lm({file = WORD, weight = 1, labels = {"a", "b", "|"}, word_boundary = 2},
    0, 4, nil, "t")
  check(table.concat(c.labels, " ") == "<blank> a b |" and c.word_boundary == 3, "blank first")
  c = forward.ctc_lm({file = CHAR, weight = 1}, 3, 4, {"a", "b", "c"}, "t")
  check(table.concat(c.labels, " ") == "a b c <blank>", "the checkpoint's target labels")
end)
expect_error("rl.forward's lm: labels of the wrong length", function()
  require("rnnlua.forward").ctc_lm({file = CHAR, weight = 1, labels = {"a"}}, 3, 4, nil, "rl.forward")
end, "rl.forward: lm: labels must be a list of 3 strings (the target's labels")

test("rl.ngram_estimate: Witten-Bell, read back, sums to 1 after every history", function()
  local d = H.tmpdir()
  local sents = {}
  for w in ("the cat sat on the mat|a cat and a dog|the dog sat|on a mat the cat"):gmatch("[^|]+") do
    local t = {}
    for c in w:gmatch(".") do t[#t + 1] = c == " " and "<sp>" or c end
    sents[#sents + 1] = t
  end
  local info = rl.ngram_estimate{sentences = sents, order = 3, output = d .. "/wb.arpa",
    vocab = {"Q", "a"}}
  local lm = rl._ngram_load(d .. "/wb.arpa")
  check(lm:order() == 3 and info.counts[1] == lm:counts()[1], "counts")
  local vocab = {}
  for id = 0, lm:vocab_size() - 1 do
    if lm:word(id) ~= "<s>" then vocab[#vocab + 1] = lm:word(id) end
  end
  for _, h in ipairs({{"<s>"}, {"<s>", "t"}, {"t", "h"}, {"a", "<sp>"}, {"z", "q"}, {"<sp>", "d"}}) do
    local sum = 0
    for _, w in ipairs(vocab) do sum = sum + math.exp(lm:logp(h, w)) end
    H.near(sum, 1, 1e-5, "sum after " .. table.concat(h, " "))
  end
  -- by hand: after "<s>", 't' follows 2 of 4 sentences with 2 distinct followers (t, a, o: 3)
  -- p(t | <s>) = (2 + 3 p1(t)) / (4 + 3); p1(t) = (c(t) + T / V) / (N + T)
  local N, T, ct = 0, 0, 0
  local seen = {}
  for _, s in ipairs(sents) do
    for _, c in ipairs(s) do
      N = N + 1
      if c == "t" then ct = ct + 1 end
      if not seen[c] then seen[c], T = true, T + 1 end
    end
    N = N + 1
  end
  T = T + 1 -- </s>
  local V = T + 2 -- and <unk>, Q (never seen)
  local p1 = (ct + T / V) / (N + T)
  H.near(lm:logp({"<s>"}, "t"), math.log((2 + 3 * p1) / 7), 1e-6, "p(t | <s>)")
  local f = io.open(d .. "/wb.arpa")
  local a = f:read("a")
  f:close()
  check(lm:id("Q") ~= nil, "vocab adds unseen tokens")
  rl.ngram_estimate{sentences = sents, order = 3, output = d .. "/wb2.arpa", vocab = {"Q", "a"}}
  f = io.open(d .. "/wb2.arpa")
  check(f:read("a") == a, "the same sentences give the same file")
  f:close()
  H.rm_rf(d)
end)
expect_error("rl.ngram_estimate: a token with a blank", function()
  rl.ngram_estimate{sentences = {{"a b"}}, order = 2, output = "/nonexistent/x"}
end, "rl.ngram_estimate: sentence 1, token 1: \"a b\" is not a token")
expect_error("rl.ngram_estimate: order 0", function()
  rl.ngram_estimate{sentences = {{"a"}}, order = 0, output = "x"}
end, "rl.ngram_estimate: order must be an integer in 1..16")

test("rl.ctc_score and rl.forward take lm (the target's labels from extern_data)", function()
  local d = H.tmpdir()
  rl.manual_seed(9)
  local ext = {data = {dim = 5}, classes = {dim = 3, sparse = true, labels = {"a", "b", "c"}}}
  local net = rl.network({fw = {class = "lstm", n_out = 8},
    output = {class = "softmax", from = "fw", loss = "ctc", target = "classes"}}, ext)
  local seqs = {}
  for i = 1, 5 do
    seqs[i] = {tag = "s" .. i, data = rl.randn(6 + i, 5) * 3, classes = rl.tensor({0, 1, 0}, "int32")}
  end
  rl.dataset_write(d .. "/dev.h5", seqs, {extern_data = ext})
  local lm = {file = CHAR, weight = 2, bonus = 0.5}
  local ds = rl.dataset{class = "hdf", files = {d .. "/dev.h5"}}
  local r = rl.ctc_score(net, ds, {beam = 4, lm = lm})
  -- the same decode by hand: the blank is class 3, the labels a b c
  local s = rl.scorer()
  ds:init_epoch(1)
  local changed = false
  for batch in rl.batches(ds, {batch_size = 1000, max_seqs = 8}) do
    net:forward(batch, {train = false})
    local out = net:layer("output")
    local lp = out.output:double():log()
    local hyp = rl.ctc_decode(lp, out.geometry, {blank = 3, beam = 4, lm = {file = CHAR,
      weight = 2, bonus = 0.5, labels = {"a", "b", "c", "<blank>"}}})
    local plain = rl.ctc_decode(lp, out.geometry, {blank = 3, beam = 4})
    local refs, lens = batch.classes:totable(), batch.lengths_classes:totable()
    for b, h in ipairs(hyp) do
      local ref = {}
      for i = 1, lens[b] do ref[i] = refs[i][b] end
      s:add(h, ref)
      changed = changed or table.concat(h, ",") ~= table.concat(plain[b], ",")
    end
  end
  check(changed, "the LM changed no labels")
  check(r.errors == s:result().errors, string.format("ctc_score %d errors, by hand %d", r.errors,
    s:result().errors))
  rl.save_checkpoint(d .. "/ctc.h5", {net = net, epoch = 1})
  rl.forward{model = d .. "/ctc.h5", data = {class = "hdf", files = {d .. "/dev.h5"}},
    output_file = d .. "/dec.h5", decode = "ctc", beam = 4, lm = lm, log_verbosity = 0}
  local f = rl.h5file(d .. "/dec.h5", "r")
  local n = f:read("inputs"):size(1)
  f:close()
  check(n > 0, "rl.forward wrote labels")
  local ok, err = pcall(rl.forward, {model = d .. "/ctc.h5", data = {class = "hdf",
    files = {d .. "/dev.h5"}}, output_file = d .. "/x.h5", lm = lm, log_verbosity = 0})
  check(not ok and tostring(err):find("rl.forward: lm applies to decode = \"ctc\" only", 1, true),
    "lm without decode: " .. tostring(err))
  H.rm_rf(d)
end)

-- bad options: errors naming the option or the file
local x0, l0 = rl.zeros(3, 1, 4), rl.tensor({3}, "int32")
local function dec(lm) return rl.ctc_decode(x0, l0, {blank = 3, beam = 2, lm = lm}) end
expect_error("lm: weight not a number", function()
  dec({file = CHAR, weight = "high", labels = {"a", "b", "c", "-"}})
end, "rl.ctc_decode: lm: weight must be a finite number, got high")
expect_error("lm: weight NaN", function()
  dec({file = CHAR, weight = 0 / 0, labels = {"a", "b", "c", "-"}})
end, "rl.ctc_decode: lm: weight must be a finite number")
expect_error("lm: bonus inf", function()
  dec({file = CHAR, weight = 1, bonus = math.huge, labels = {"a", "b", "c", "-"}})
end, "rl.ctc_decode: lm: bonus must be a finite number")
expect_error("lm: unknown key", function() dec({file = CHAR, weight = 1, wieght = 2}) end,
  "rl.ctc_decode: lm: unknown key 'wieght'")
expect_error("lm: no file", function() dec({weight = 1}) end, "rl.ctc_decode: lm: file")
expect_error("lm: vocabulary does not cover the labels", function()
  dec({file = CHAR, weight = 1, labels = {"a", "b", "d", "-"}})
end, "rl.ctc_decode: lm: " .. CHAR .. ": the vocabulary (6 words) does not cover the labels: label 2 ('d') is not in it")
expect_error("lm: default labels are class numbers", function() dec({file = CHAR, weight = 1}) end,
  "labels 0 ('0'), 1 ('1'), 2 ('2') are not in it")
expect_error("lm: labels of the wrong length", function()
  dec({file = CHAR, weight = 1, labels = {"a", "b"}})
end, "rl.ctc_decode: lm: labels must be a list of 4 strings")
expect_error("lm: word_boundary not a label", function()
  dec({file = WORD, weight = 1, labels = {"a", "b", "|", "_"}, word_boundary = "#"})
end, "rl.ctc_decode: lm: word_boundary '#' is none of the labels")
expect_error("lm: word_boundary the blank", function()
  dec({file = WORD, weight = 1, labels = {"a", "b", "|", "_"}, word_boundary = 3})
end, "rl.ctc_decode: lm: word_boundary must be a label")
expect_error("lm: a malformed file through rl.ctc_decode names file and line", function()
  dec({file = dir .. "/bad13.arpa", weight = 1})
end, "rl.ctc_decode: lm: " .. dir .. "/bad13.arpa:7: the log10 probability 'abc'")
expect_error("lm: not a table", function() dec("lm.arpa") end, "rl.ctc_decode: lm: must be a table")
H.rm_rf(dir)

H.done()
