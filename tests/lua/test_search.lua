-- rl.search: beam search through a rec layer's choice over a whole dataset, written in the
-- dataset layout in the dataset's order (beam 1 against greedy decoding by teacher-forced
-- forwards, batched and sorted against one sequence at a time, n-best, length normalisation,
-- attention weights against a teacher-forced forward of the found labels), and every bad
-- input an error naming what.
local H = dofile("tests/lua/harness.lua")

local tmp = H.tmpdir()
local function path(name) return tmp .. "/" .. name end

-- an encoder-decoder with additive attention; classes: 6 labels, 0 = end of sequence
local function description() return H.seq2seq(6, 3) end

rl.manual_seed(11)
local desc, ext = description()
local net = rl.network(desc, ext)
-- sharpen the output layer so that some hypotheses end early and others run to the limit
local W = net:layer("dec").params["output_prob.W"]
W:mul_(4)
rl.save_checkpoint(path("model.h5"), {net = net})

-- a dataset in an order that is not sorted by length, with targets (search ignores them)
local LENS = {5, 2, 7, 1, 4, 3, 6, 2}
local seqs = {}
for i, T in ipairs(LENS) do
  seqs[i] = {tag = "utt-" .. i, data = rl.randn(T, 3), classes = rl.tensor({1, 2}, "int32")}
end
rl.dataset_write(path("data.h5"), seqs, {extern_data = ext})
local DATA = {class = "hdf", files = {path("data.h5")}}

local function read(file)
  local ds = rl.dataset{class = "hdf", files = {file}, allow_empty = true}
  ds:init_epoch(1)
  local out = {}
  for i = 1, ds:num_seqs() do out[i] = ds:get_seq(i) end
  return out, ds
end

local function labels_of(t)
  return t:numel() > 0 and t:totable() or {}
end

local function same(a, b) return table.concat(a, ",") == table.concat(b, ",") end

-- greedy decoding by teacher-forced forwards of the growing prefix (one sequence)
local function greedy(x, eos)
  local T = x:size(1)
  local lb = rl.tensor({T}, "int32")
  local prefix, score = {}, 0
  for t = 1, T + 2 do
    local y = rl.zeros({t, 1}, "int32")
    for i, v in ipairs(prefix) do y[i][1] = v end
    net:forward({data = x:view(T, 1, 3), lengths = lb, classes = y,
      lengths_classes = rl.tensor({t}, "int32")}, {train = false})
    local best, pos = net:layer("dec").object.by_name.output_prob.out[t][1]:max()
    score = score + math.log(best)
    prefix[#prefix + 1] = pos - 1
    if pos - 1 == eos then break end
  end
  if prefix[#prefix] == eos then prefix[#prefix] = nil end
  return prefix, score
end

H.test("beam 1 through the dataset task is greedy decoding, in the dataset's order", function()
  local r = rl.search{model = path("model.h5"), data = DATA, output_file = path("b1.h5"), beam = 1,
    log_verbosity = 0}
  H.check(r.num_seqs == #LENS, "num_seqs")
  local out = read(path("b1.h5"))
  H.check(#out == #LENS, "the file has " .. #out .. " sequences")
  local ended, limited = 0, 0
  for i, s in ipairs(seqs) do
    local g, gs = greedy(s.data, 0)
    H.check(out[i].tag == s.tag, string.format("sequence %d has tag %s, expected %s", i,
      out[i].tag, s.tag))
    local got = labels_of(out[i].data)
    H.check(same(got, g), string.format("%s: search gave %s, greedy %s", s.tag,
      table.concat(got, ","), table.concat(g, ",")))
    H.near(out[i].scores[1][1], gs, 1e-4, s.tag .. " score")
    H.check(same(r.results[i].labels, g), "returned results in the dataset's order")
    if #g < LENS[i] + 2 then ended = ended + 1 else limited = limited + 1 end
  end
  -- the test means little unless both kinds of ending occur
  H.check(ended > 0 and limited > 0, string.format("%d ended with eos, %d at max_seq_len", ended,
    limited))
end)

H.test("beam 3, batched and sorted by length, equals net:search one sequence at a time", function()
  local r = rl.search{model = path("model.h5"), data = DATA, output_file = path("b3.h5"),
    nbest = true, batch_size = 20, log_verbosity = 0}
  local out = read(path("b3.h5"))
  for i, s in ipairs(seqs) do
    local T = s.data:size(1)
    local one = net:search({data = s.data:view(T, 1, 3), lengths = rl.tensor({T}, "int32")},
      {beam_size = 3})[1]
    H.check(same(labels_of(out[i].data), one.labels), s.tag .. ": labels differ")
    H.near(out[i].scores[1][1], one.score, 1e-4, s.tag .. " score")
    -- n-best: the whole beam, best first, lengths adding up
    local lens, scores = out[i].nbest_lengths, out[i].nbest_scores
    H.check(lens:size(1) == 3 and scores:size(1) == 3, "nbest of 3")
    local all, pos = labels_of(out[i].nbest), 1
    for k = 1, 3 do
      local n = math.tointeger(lens[k][1])
      H.check(same({table.unpack(all, pos, pos + n - 1)}, one.hyps[k].labels),
        string.format("%s: hypothesis %d", s.tag, k))
      H.near(scores[k][1], one.hyps[k].score, 1e-4, "n-best score")
      if k > 1 then H.check(scores[k][1] <= scores[k - 1][1], "n-best sorted") end
      pos = pos + n
    end
    H.check(pos - 1 == #all, "nbest labels add up")
    H.check(same(r.results[i].labels, one.labels), "returned results")
  end
end)

H.test("length_norm: scores are log-probabilities per step and rank the beam", function()
  local r = rl.search{model = path("model.h5"), data = DATA, output_file = path("ln.h5"), nbest = 3,
    length_norm = true, log_verbosity = 0}
  local out = read(path("ln.h5"))
  for i, res in ipairs(r.results) do
    for k, h in ipairs(res.hyps) do
      local steps = math.min(#h.labels + 1, LENS[i] + 2)
      H.near(h.score, h.logp / steps, 1e-9, "normalised score")
      if k > 1 then H.check(h.score <= res.hyps[k - 1].score, "ranked by normalised score") end
    end
    H.near(out[i].scores[1][1], res.score, 1e-5, "written score")
  end
end)

H.test("attention weights: the searched matrices equal a teacher-forced forward's", function()
  rl.search{model = path("model.h5"), data = DATA, output_file = path("att.h5"), beam = 3,
    attention = "att", log_verbosity = 0}
  local out = read(path("att.h5"))
  local rec = net:layer("dec").object
  for i, s in ipairs(seqs) do
    local T = s.data:size(1)
    local shape = out[i].attention_shape
    local S, Te = math.tointeger(shape[1][1]), math.tointeger(shape[1][2])
    local labels = labels_of(out[i].data)
    H.check(Te == T, string.format("%s: T_enc %d, expected %d", s.tag, Te, T))
    H.check(S == math.min(#labels + 1, T + 2), string.format("%s: S_out %d for %d labels", s.tag,
      S, #labels))
    local a = out[i].attention:view(S, Te)
    -- the labels as targets (plus the end label when the hypothesis ended with it)
    local y = rl.zeros({S, 1}, "int32")
    for t, v in ipairs(labels) do if t <= S then y[t][1] = v end end
    net:forward({data = s.data:view(T, 1, 3), lengths = rl.tensor({T}, "int32"), classes = y,
      lengths_classes = rl.tensor({S}, "int32")}, {train = false})
    local ref = rec:attention_weights("att"):select(2, 1):narrow(2, 1, T)
    H.check((a - ref):abs():max() < 1e-5, string.format("%s: weights differ by %g", s.tag,
      (a - ref):abs():max()))
    H.check((a:sum(2) - 1):abs():max() < 1e-5, "each step's weights sum to 1")
  end
end)

H.test("attention weights of the n-best: each hypothesis' own matrix", function()
  local r = rl.search{model = path("model.h5"), data = DATA, output_file = path("attn.h5"),
    beam = 3, nbest = 3, attention = "att", log_verbosity = 0}
  local out = read(path("attn.h5"))
  local rec = net:layer("dec").object
  local differ = 0
  for i, s in ipairs(seqs) do
    local T = s.data:size(1)
    for k = 1, 3 do
      local key = k == 1 and "attention" or ("attention_" .. k)
      local h = r.results[i].hyps[k]
      local shape = out[i][key .. "_shape"]
      local S = math.tointeger(shape[1][1])
      H.check(h ~= nil and S == h.steps and shape[1][2] == T,
        string.format("%s %s: shape %d x %d", s.tag, key, S, shape[1][2]))
      local y = rl.zeros({S, 1}, "int32")
      for t, v in ipairs(h.labels) do if t <= S then y[t][1] = v end end
      net:forward({data = s.data:view(T, 1, 3), lengths = rl.tensor({T}, "int32"), classes = y,
        lengths_classes = rl.tensor({S}, "int32")}, {train = false})
      local ref = rec:attention_weights("att"):select(2, 1):narrow(2, 1, T)
      local d = (out[i][key]:view(S, T) - ref):abs():max()
      H.check(d < 1e-5, string.format("%s %s: weights differ by %g", s.tag, key, d))
      if k > 1 and (S ~= out[i].attention_shape[1][1]
          or (out[i][key]:view(S, T) - out[i].attention:view(S, T)):abs():max() > 0) then
        differ = differ + 1
      end
    end
  end
  H.check(differ > 0, "every hypothesis had the best one's weights")
end)

H.test("rl.forward{search = true} and a network object give the same file", function()
  rl.forward{search = true, model = path("model.h5"), data = DATA, output_file = path("f.h5"),
    beam = 2, log_verbosity = 0}
  rl.search{model = net, data = DATA, output = path("n.h5"), beam = 2, log_verbosity = 0}
  local a, b = read(path("f.h5")), read(path("n.h5"))
  for i = 1, #LENS do
    H.check(same(labels_of(a[i].data), labels_of(b[i].data)), "labels differ")
    H.near(a[i].scores[1][1], b[i].scores[1][1], 1e-6, "scores differ")
  end
end)

H.test("rl.forward with attention: teacher forced through the data's targets", function()
  rl.forward{model = path("model.h5"), data = DATA, layer = "dec", attention = "att",
    output_file = path("tf.h5"), log_verbosity = 0}
  local out = read(path("tf.h5"))
  local rec = net:layer("dec").object
  for i, s in ipairs(seqs) do
    local T = s.data:size(1)
    H.check(same(labels_of(out[i].data), {1, 2}), s.tag .. ": the choice gives the targets")
    H.check(out[i].attention_shape[1][1] == 2 and out[i].attention_shape[1][2] == T, "shape")
    net:forward({data = s.data:view(T, 1, 3), lengths = rl.tensor({T}, "int32"),
      classes = rl.tensor({{1}, {2}}, "int32"), lengths_classes = rl.tensor({2}, "int32")},
      {train = false})
    local ref = rec:attention_weights("att"):select(2, 1):narrow(2, 1, T)
    H.check((out[i].attention:view(2, T) - ref):abs():max() < 1e-5, s.tag .. ": weights differ")
  end
end)

H.expect_error("rl.forward with attention on a layer that is not a rec layer", function()
  rl.forward{model = path("model.h5"), data = DATA, layer = "enc", attention = "att",
    output_file = path("bad.h5"), log_verbosity = 0}
end, "rl.forward: attention = 'att' needs a rec layer, layer 'enc' is class lstm")

H.expect_error("rl.forward with attention: the data lacks the targets", function()
  rl.dataset_write(path("notarget.h5"), {{tag = "a", data = rl.randn(3, 3)}},
    {extern_data = {data = {dim = 3}}})
  rl.forward{model = path("model.h5"), data = {class = "hdf", files = {path("notarget.h5")}},
    layer = "dec", attention = "att", output_file = path("bad.h5"), log_verbosity = 0}
end, "has no 'classes'")

H.test("a short file: one sequence of one frame", function()
  rl.dataset_write(path("one.h5"), {{tag = "only", data = rl.randn(1, 3)}},
    {extern_data = {data = {dim = 3}}})
  local r = rl.search{model = path("model.h5"), data = {class = "hdf", files = {path("one.h5")}},
    output_file = path("one_out.h5"), attention = "att", log_verbosity = 0}
  local out = read(path("one_out.h5"))
  H.check(#out == 1 and out[1].tag == "only" and r.num_seqs == 1, "one sequence")
  H.check(#labels_of(out[1].data) <= 3, "at most max_seq_len = T + 2 labels")
  H.check(out[1].attention_shape[1][2] == 1, "T_enc 1")
end)

-- a careless output_file replaced the dataset being searched or the model
H.test("the output may not be the data or the model", function()
  local data_before = io.open(path("data.h5"), "rb"):read("a")
  for _, c in ipairs{{path("data.h5"), "is a file of the dataset"},
                     {path("model.h5"), "is the model's checkpoint"}} do
    local ok, err = pcall(rl.search, {model = path("model.h5"), data = DATA, output_file = c[1],
      log_verbosity = 0})
    H.check(not ok and tostring(err):find("rl.search: output_file " .. c[1] .. " " .. c[2], 1,
      true), tostring(err))
  end
  H.check(io.open(path("data.h5"), "rb"):read("a") == data_before, "the data changed")
  H.check(rl.load_checkpoint(path("model.h5")).description.dec ~= nil, "the model changed")
end)

local function bad(name, cfg, pattern)
  H.expect_error(name, function()
    local c = {model = path("model.h5"), data = DATA, output_file = path("bad.h5"),
      log_verbosity = 0}
    for k, v in pairs(cfg) do c[k] = v end
    rl.search(c)
  end, pattern)
end

bad("an unknown layer", {layer = "decoder"}, "rl.search: no layer 'decoder' in the network of")
bad("a layer that is not a rec layer with a choice", {layer = "enc"},
  "layer 'enc' of " .. path("model.h5") .. " (class lstm) is not a rec layer with a choice")
bad("beam 0", {beam = 0}, "rl.search: beam must be a positive integer, got 0")
bad("beam 1.5", {beam = 1.5}, "rl.search: beam must be a positive integer, got 1.5")
bad("max_seq_len 0", {max_seq_len = 0}, "rl.search: max_seq_len must be >= 1, got 0")
bad("max_seq_len <= 0 for some input", {max_seq_len = "T - 3"},
  "rl.search: layer 'dec' (class rec), unit layer 'output': max_seq_len must be >= 1, got -2 for "
  .. "input length 1")
bad("an unknown attention layer", {attention = "s"},
  "rl.search: layer 'dec' (class rec): attention = 's' is not an attention layer of the unit "
  .. "(attention layers: att)")
bad("nbest beyond the beam", {beam = 2, nbest = 3},
  "rl.search: nbest = 3 is more than the beam (2)")
bad("an unknown key", {beam_size = 2}, "rl.search: unknown key 'beam_size'")
bad("eos outside the labels", {eos = 6}, "unit layer 'output': eos must be a label in 0..5, got 6")
bad("labels of the wrong count", {labels = {"a", "b"}},
  "rl.search: labels must be a list of 6 strings (the names of the choice's labels)")
bad("a missing model file", {model = path("nothing.h5")}, "nothing.h5")
bad("output and output_file", {output = path("x.h5")}, "give output_file or output, not both")
bad("a dataset without the input", {data = {class = "copy", num_seqs = 2}},
  "the dataset does not fit the network of")

-- max_seq_len as an expression of T is parsed, never run as Lua: it is stored in checkpoints
H.test("max_seq_len expressions", function()
  local expr = require("rnnlua.rec").length_expr
  for _, c in ipairs{{"T + 5", 12}, {"2 * T + 3", 17}, {"math.max(T, 10)", 10},
      {"floor(T / 2) + 1", 4}, {"-T + 20", 13}, {"(T + 1) * (T - 1)", 48}, {"T // 3", 2},
      {"T % 4", 3}, {"min(T, 3, 2)", 2}, {"ceil(1.5 * T)", 11}, {"2 ^ 2 * T", 28},
      {"abs(-T)", 7}, {"1e1 + T", 17}} do
    H.check(expr(c[1], "w")(7) == c[2], c[1])
  end
end)
for _, c in ipairs{
  {"code", "(function() while true do end end)()", "unknown name 'function' at character 2"},
  {"a library call", "os.exit(3)", "unknown name 'os' at character 1"},
  {"a math constant", "math.huge", "unknown name 'math.huge'"},
  {"a string", "#'x'", "unexpected '#' at character 1"},
  {"a dangling operator", "T +", "got the end"},
  {"two operands", "T T", "expected the end at character 3, got 'T'"},
  {"a function of two arguments", "floor(T, 2)", "floor takes one argument, got 2"},
  {"nesting too deep", string.rep("(", 40) .. "T" .. string.rep(")", 40), "nested more than 32"},
  {"too long", string.rep("T + ", 70) .. "T", "at most 256 characters"},
} do
  H.expect_error("max_seq_len with " .. c[1] .. " is refused by the network", function()
    local d, e = description()
    d.dec.max_seq_len = c[2]
    rl.network(d, e)
  end, "layer 'dec' (class rec): max_seq_len")
  H.expect_error("max_seq_len with " .. c[1] .. " says what", function()
    local d, e = description()
    d.dec.max_seq_len = c[2]
    rl.network(d, e)
  end, c[3])
end
for _, c in ipairs{{"NaN", 0 / 0}, {"inf", math.huge}, {"0.5", 0.5}, {"a table", {}}} do
  H.expect_error("max_seq_len " .. c[1] .. " in a description", function()
    local d, e = description()
    d.dec.max_seq_len = c[2]
    rl.network(d, e)
  end, "layer 'dec' (class rec): max_seq_len must be")
end
bad("max_seq_len that overflows", {max_seq_len = "1e400 * T"},
  "unit layer 'output': max_seq_len gave inf for input length 1")
bad("max_seq_len beyond any buffer", {max_seq_len = "2 ^ 70"}, "steps for input length 1, beyond any buffer")
bad("max_seq_len beyond memory", {max_seq_len = "1e12"},
  "unit layer 'output': buffers for max_seq_len = 1000000000000 steps of")

-- a crafted checkpoint: the stored max_seq_len replaced by code (same length, so the file stays
-- valid HDF5) is an error when the model is built, not an endless loop
H.test("a checkpoint whose max_seq_len is code", function()
  local d, e = description()
  local pad = "T + 2" .. string.rep(" ", 40)
  d.dec.max_seq_len = pad
  rl.save_checkpoint(path("padded.h5"), {net = rl.network(d, e)})
  local f = assert(io.open(path("padded.h5"), "rb"))
  local bytes = f:read("a")
  f:close()
  local a, b = bytes:find(pad, 1, true)
  H.check(a ~= nil, "max_seq_len found in the file")
  local code = "(function() while true do end end)()"
  bytes = bytes:sub(1, a - 1) .. code .. string.rep(" ", #pad - #code) .. bytes:sub(b + 1)
  f = assert(io.open(path("crafted.h5"), "wb"))
  f:write(bytes)
  f:close()
  -- an instruction budget far above what the search needs, so that running the code fails
  -- this test instead of hanging it
  debug.sethook(function() error("the search ran 1e9 Lua instructions: the code ran", 0) end, "",
    1e9)
  local ok, err = pcall(rl.search, {model = path("crafted.h5"), data = DATA,
    output_file = path("bad.h5"), log_verbosity = 0})
  debug.sethook()
  H.check(not ok and tostring(err):find("layer 'dec' (class rec): max_seq_len '(function()", 1, true),
    tostring(err))
end)

H.expect_error("a model without a choice layer", function()
  local n2 = rl.network({h = {class = "lstm", n_out = 4},
    output = {class = "softmax", from = "h", loss = "ce", target = "classes"}},
    {data = {dim = 3}, classes = {dim = 2, sparse = true}})
  rl.save_checkpoint(path("nochoice.h5"), {net = n2})
  rl.search{model = path("nochoice.h5"), data = DATA, output_file = path("bad.h5")}
end, "has no rec layer with a choice layer in its unit (layers: h, output)")

H.expect_error("device with a network object", function()
  rl.search{model = net, data = DATA, output_file = path("bad.h5"), device = "cpu"}
end, "rl.search: device applies to a checkpoint; move the network with net:to")

H.expect_error("a model that is neither a path nor a network", function()
  rl.search{model = 42, data = DATA, output_file = path("bad.h5")}
end, "rl.search: model must be a checkpoint path or a network (rl.network), got number")

H.expect_error("a rec layer without max_seq_len", function()
  local d, e = description()
  d.dec.max_seq_len = nil
  rl.search{model = rl.network(d, e), data = DATA, output_file = path("bad.h5")}
end, "layer 'dec' (class rec) of the given network has no max_seq_len")

H.expect_error("an empty dataset", function()
  local w = rl.hdf_writer(path("empty.h5"), {data_dim = 3})
  w:close()
  rl.search{model = path("model.h5"), data = {class = "hdf", files = {path("empty.h5")}},
    output_file = path("bad.h5")}
end, "empty.h5: the dataset is empty")

H.rm_rf(tmp)
H.done()
