-- The rec layer (recurrent sub-networks): equivalences with the plain layers, a hand-written
-- reference, float64 gradient checks through lstm + attention + embedding units over ragged
-- encoder and decoder lengths, and every misdescription an error naming the rec layer and the
-- unit layer.
local H = dofile("tests/lua/harness.lua")

local function maxdiff(a, b) return (a - b):abs():max() end

-- A network of one `cls` layer (a) and one of a rec layer whose unit is that layer (b), with the
-- same parameters, after a forward and backward of the same batch (float64); the losses agree.
local function rec_of_one(cls)
  local ext = {data = {dim = 3}, target = {dim = 4}}
  rl.manual_seed(1)
  local a = rl.network({output = {class = cls, n_out = 4, from = "data", loss = "mse",
    target = "target"}}, ext, {dtype = "float64", input_grads = true})
  local b = rl.network({
    dec = {class = "rec", from = "data", unit = {output = {class = cls, n_out = 4}}},
    output = {class = "copy", from = "dec", loss = "mse", target = "target"},
  }, ext, {dtype = "float64", input_grads = true})
  H.check(a:num_params() == b:num_params(), "parameter counts differ")
  b:params():copy_(a:params())
  local x, y = rl.randn(6, 3, 3, "float64"), rl.randn(6, 3, 4, "float64")
  local len = rl.tensor({6, 2, 4}, "int32")
  local la = a:forward{data = x, target = y, lengths = len}
  local lb = b:forward{data = x, target = y, lengths = len}
  H.near(la, lb, 1e-12, "loss")
  a:zero_grads(); a:backward(); b:zero_grads(); b:backward()
  H.check(maxdiff(a:input_grad("data"), b:input_grad("data")) < 1e-12, "input gradients differ")
  return a, b, len
end

H.test("a unit of one lstm over data:source is the lstm layer (outputs and gradients)", function()
  local a, b, len = rec_of_one("lstm")
  local oa, ob = a:layer("output").output, b:layer("dec").output
  for bb, n in ipairs(len:totable()) do
    H.check(maxdiff(oa:narrow(1, 1, n):select(2, bb), ob:narrow(1, 1, n):select(2, bb)) < 1e-12,
      "outputs differ")
  end
  H.check(maxdiff(a:grads(), b:grads()) < 1e-12, "parameter gradients differ")
  -- W's and U's gradients are one product over all frames in both (rec.defer_weight_grads): the
  -- same bits; b's sums the steps one by one in the unit, over all frames at once in the layer
  local nw = (3 + 4) * 16
  H.check(maxdiff(a:grads():narrow(1, 1, nw), b:grads():narrow(1, 1, nw)) == 0,
    "W's and U's gradients differ")
end)

H.test("a unit of one gru over data:source is the gru layer (outputs and gradients)", function()
  local a, b = rec_of_one("gru")
  -- the weight gradients one product over all frames in both, the biases summed step by step in
  -- both: the same bits
  H.check(maxdiff(a:grads(), b:grads()) == 0, "parameter gradients differ")
end)

local tanh_unit = {
  h = {class = "linear", activation = "tanh", n_out = 4, from = {"data:source", "prev:h"}},
  output = {class = "copy", from = "h"},
}

H.test("a unit tanh(W x_t + U prev:h + b) matches a hand-written loop", function()
  rl.manual_seed(2)
  local net = rl.network({dec = {class = "rec", from = "data", unit = tanh_unit,
    is_output_layer = true}}, {data = {dim = 3}}, {dtype = "float64"})
  local x, len = rl.randn(5, 2, 3, "float64"), rl.tensor({5, 3}, "int32")
  net:forward{data = x, lengths = len}
  local out = net:layer("dec").output
  local W, bias = net:layer("dec").params["h.W"], net:layer("dec").params["h.b"]
  local Wx, U = W:narrow(1, 1, 3), W:narrow(1, 4, 4)
  for b = 1, 2 do
    local h = rl.zeros({1, 4}, "float64")
    for t = 1, len[b] do
      h = (rl.matmul(x[t]:narrow(1, b, 1), Wx) + rl.matmul(h, U) + bias:view(1, 4)):tanh()
      H.check(maxdiff(h:view(4), out[t][b]) < 1e-12, string.format("step %d, sequence %d", t, b))
    end
  end
end)

local gradcheck = H.gradcheck

gradcheck("gradient check: tanh unit with prev:, ragged lengths", {network = {
  dec = {class = "rec", from = "data", unit = tanh_unit},
  output = {class = "softmax", from = "dec", loss = "ce", target = "classes"},
}, extern_data = {data = {dim = 3}, classes = {dim = 3, sparse = true}}, T = 5, B = 3,
  lengths = {5, 2, 4}})

-- an encoder-decoder: BLSTM-less encoder, decoder with embedding of the previous label, lstm,
-- attention over the encoder, softmax with the CE loss and a choice (teacher forcing)
local function seq2seq(kind, extra)
  local unit = {
    emb = {class = "embedding", from = "prev:output", n_out = 3},
    s = {class = "lstm", from = {"emb", "prev:att"}, n_out = 4},
    att = {class = "attention", base = "base:enc", from = "s", kind = kind},
    readout = {class = "linear", from = {"s", "att"}, n_out = 5, activation = "tanh"},
    output_prob = {class = "softmax", from = "readout", loss = "ce", target = "classes"},
    output = {class = "choice", from = "output_prob", target = "classes", beam_size = 3,
      initial_output = 0},
  }
  for k, v in pairs(extra or {}) do unit[k] = v end
  return {
    enc = {class = "lstm", n_out = 4, from = "data"},
    dec = {class = "rec", from = {}, unit = unit},
  }, {data = {dim = 3}, classes = {dim = 6, sparse = true}}
end

-- decoder lengths differ from the encoder's: classes (S = 4, B = 3) with lengths {4, 2, 3}
local function label_batch()
  return {classes = rl.tensor({{1, 2, 3}, {4, 5, 1}, {2, -1, 5}, {3, -1, -1}}, "int32"),
    lengths_classes = rl.tensor({4, 2, 3}, "int32")}
end

for _, kind in ipairs({"dot", "additive"}) do
  local net, ext = seq2seq(kind)
  gradcheck("gradient check: lstm + " .. kind .. " attention + embedding unit, ragged encoder "
    .. "(5, 2, 4) and decoder (4, 2, 3) lengths", {network = net, extern_data = ext, T = 5, B = 3,
    lengths = {5, 2, 4}, batch = label_batch(), max_inputs = 30})
end

do
  local net, ext = seq2seq("dot", {s = {class = "gru", from = {"emb", "prev:att"}, n_out = 4}})
  gradcheck("gradient check: gru + dot attention + embedding unit, ragged lengths",
    {network = net, extern_data = ext, T = 5, B = 3, lengths = {5, 2, 4}, batch = label_batch(),
      max_inputs = 30})
end

H.test("teacher forcing: the decoder's loss does not depend on labels beyond each length",
  function()
    rl.manual_seed(4)
    local d, ext = seq2seq("dot")
    local net = rl.network(d, ext)
    local x, len = rl.randn(5, 3, 3), rl.tensor({5, 2, 4}, "int32")
    local b1 = label_batch()
    b1.data, b1.lengths = x, len
    local l1 = net:forward(b1)
    local b2 = label_batch()
    b2.classes[3][2], b2.classes[4][3] = 4, 0
    b2.data, b2.lengths = x, len
    local l2, _ = net:forward(b2)
    H.near(l1, l2, 0, "loss")
    H.check(net.n_frames == 9, "frames: " .. tostring(net.n_frames))
    local w = net:layer("dec").object:attention_weights("att")
    H.check(w:size(1) == 4 and w:size(2) == 3 and w:size(3) == 5, "attention weights' shape")
    H.near(w[1][2]:narrow(1, 3, 3):abs():sum(), 0, 0, "weight on padded encoder frames")
    H.near(w[2][1]:sum(), 1, 1e-6, "weights sum to 1")
  end)

-- bad descriptions: each an error naming the rec layer and the unit layer
local function bad(name, unit, pattern, net_extra)
  H.expect_error(name, function()
    local d = {enc = {class = "lstm", n_out = 4, from = "data"},
      dec = {class = "rec", from = {}, unit = unit}}
    for k, v in pairs(net_extra or {}) do d[k] = v end
    rl.network(d, {data = {dim = 3}, classes = {dim = 6, sparse = true}})
  end, pattern)
end
local ok_out = {class = "choice", from = "p", target = "classes"}
local ok_p = {class = "softmax", from = "s", loss = "ce", target = "classes"}
bad("unknown class in a unit", {s = {class = "lsmt", n_out = 4, from = "prev:s"}, p = ok_p,
  output = ok_out}, "layer 'dec' (class rec), unit layer 's': layer 'dec/s': unknown class 'lsmt'")
bad("prev: of a layer not in the unit", {s = {class = "lstm", n_out = 4, from = "prev:x"},
  p = ok_p, output = ok_out}, "layer 'dec' (class rec), unit layer 's': 'prev:x' names no layer")
bad("unknown same-step from", {s = {class = "lstm", n_out = 4, from = "x"},
  p = ok_p, output = ok_out}, "layer 'dec' (class rec), unit layer 's': unknown from 'x'")
bad("a unit without output", {s = {class = "lstm", n_out = 4, from = "prev:s"}, p = ok_p},
  "layer 'dec' (class rec): the unit has no 'output' layer")
bad("a choice without target", {s = {class = "lstm", n_out = 4, from = "prev:s"}, p = ok_p,
  output = {class = "choice", from = "p"}}, "layer 'dec' (class rec), unit layer 'output' (choice): needs target")
bad("a choice with beam_size 0", {s = {class = "lstm", n_out = 4, from = "prev:s"}, p = ok_p,
  output = {class = "choice", from = "p", target = "classes", beam_size = 0}},
  "layer 'dec' (class rec), unit layer 'output' (choice): beam_size must be a positive integer")
bad("a base: that depends on the rec layer", {
  s = {class = "lstm", n_out = 4, from = "prev:s"},
  att = {class = "attention", base = "base:post", from = "s"}, p = {class = "softmax",
  from = {"s", "att"}, loss = "ce", target = "classes"}, output = ok_out},
  "layer 'dec' (class rec), unit layer 'att': base:post depends on layer 'dec' itself",
  {post = {class = "lstm", n_out = 4, from = "dec2"}, dec2 = {class = "copy", from = "dec"}})
bad("a base: that names no layer", {
  s = {class = "lstm", n_out = 4, from = "prev:s"},
  att = {class = "attention", base = "base:nope", from = "s"}, p = ok_p, output = ok_out},
  "layer 'dec' (class rec), unit layer 'att': base:nope names no layer")
bad("a cycle within a step", {s = {class = "lstm", n_out = 4, from = "p"}, p = ok_p,
  output = ok_out}, "cycle within a step: output -> p -> s -> p")
bad("labels into a dense layer", {s = {class = "lstm", n_out = 4, from = "prev:output"},
  p = ok_p, output = ok_out}, "layer 'dec' (class rec), unit layer 's' (class lstm): 'prev:output' gives labels")
bad("an unknown option of a unit layer", {s = {class = "lstm", n_out = 4, from = "prev:s",
  n_outt = 3}, p = ok_p, output = ok_out}, "unit layer 's': layer 'dec/s' (class lstm): unknown option 'n_outt'")

H.expect_error("a label out of range", function()
  local d, ext = seq2seq("dot")
  local net = rl.network(d, ext)
  local b = label_batch()
  b.classes[2][1] = 6
  b.data, b.lengths = rl.randn(5, 3, 3), rl.tensor({5, 2, 4}, "int32")
  net:forward(b)
end, "layer 'dec' (class rec), unit layer 'output': label 6 at step 2 of sequence 1 is outside 0..5")

-- search: beam 1 is greedy decoding, computed here by teacher-forced forwards of the prefix
local function trained_like_net(seed)
  rl.manual_seed(seed)
  local d, ext = seq2seq("additive")
  d.dec.max_seq_len = "T + 2"
  return rl.network(d, ext)
end

local function greedy(net, x, len, eos, limit)
  local B = len:size(1)
  local res = {}
  for b = 1, B do
    local xb, lb = x:narrow(2, b, 1):contiguous(), rl.tensor({len[b]}, "int32")
    local prefix, score = {}, 0
    for t = 1, limit(len[b]) do
      local y = rl.zeros({t, 1}, "int32")
      for i, v in ipairs(prefix) do y[i][1] = v end
      net:forward{data = xb, lengths = lb, classes = y, lengths_classes = rl.tensor({t}, "int32")}
      local p = net:layer("dec").object.by_name.output_prob.out[t][1]
      local best, pos = p:max()
      score = score + math.log(best)
      prefix[#prefix + 1] = pos - 1
      if pos - 1 == eos then break end
    end
    if prefix[#prefix] == eos then prefix[#prefix] = nil end
    res[b] = {labels = prefix, score = score}
  end
  return res
end

H.test("search: beam 1 equals greedy decoding, a larger beam's best is never worse", function()
  local net = trained_like_net(5)
  local x, len = rl.randn(5, 3, 3), rl.tensor({5, 2, 4}, "int32")
  local g = greedy(net, x, len, 1, function(T) return T + 2 end)
  local r1 = net:search({data = x, lengths = len}, {beam_size = 1, eos = 1})
  local r8 = net:search({data = x, lengths = len}, {beam_size = 8, eos = 1})
  for b = 1, 3 do
    H.check(table.concat(r1[b].labels, ",") == table.concat(g[b].labels, ","),
      string.format("sequence %d: beam 1 gave %s, greedy %s", b, table.concat(r1[b].labels, ","),
        table.concat(g[b].labels, ",")))
    H.near(r1[b].score, g[b].score, 1e-4, "greedy score")
    H.check(r8[b].score >= r1[b].score - 1e-6, "beam 8 worse than greedy")
    H.check(#r8[b].hyps == 8 and r8[b].hyps[1].score >= r8[b].hyps[8].score, "hyps sorted")
    H.check(#r8[b].labels <= len[b] + 2, "longer than max_seq_len")
  end
end)

H.expect_error("search: max_seq_len <= 0", function()
  local net = trained_like_net(5)
  net:search({data = rl.randn(3, 1, 3), lengths = rl.tensor({3}, "int32")},
    {max_seq_len = "T - 5"})
end, "layer 'dec' (class rec), unit layer 'output': max_seq_len must be >= 1, got -2")

-- search options: rl.search's names (beam) given to net:search searched silently with the
-- defaults; a beam of 2^62 for 4 sequences wrapped B * K to 0 hypotheses
local function search_with(opts, B)
  return function()
    local net = trained_like_net(5)
    B = B or 1
    local lens = {}
    for b = 1, B do lens[b] = 3 end
    net:search({data = rl.randn(3, B, 3), lengths = rl.tensor(lens, "int32")}, opts)
  end
end
H.expect_error("search: opts not a table", search_with(5), "net:search: opts must be a table, got number")
H.expect_error("search: an unknown option", search_with({beam = 4}),
  "net:search: unknown option 'beam' (known: beam_size, eos, layer, length_norm, lm, max_seq_len)")
H.expect_error("search: a beam that wraps B * K", search_with({beam_size = 1 << 62}, 4),
  "layer 'dec' (class rec), unit layer 'output': beam_size 4611686018427387904 for 4 sequences gives "
  .. "more than 2147483647 hypotheses")
H.expect_error("search: a beam beyond int32 rows", search_with({beam_size = 1 << 31}),
  "gives more than 2147483647 hypotheses")
H.test("search: an empty batch gives no results", function()
  local net = trained_like_net(5)
  local r = net:search({data = rl.randn(3, 0, 3), lengths = rl.zeros(0, "int32")}, {beam_size = 2})
  H.check(#r == 0, "results for no sequences")
end)
-- refused when built: a forward scaled the loss and only the backward said "not supported"
for _, v in ipairs{2, "2", 0 / 0} do
  bad("loss_scale " .. tostring(v) .. " (" .. type(v) .. ") inside a unit", {s = {class = "lstm", n_out = 4,
    from = "prev:s"}, p = {class = "softmax", from = "s", loss = "ce", target = "classes",
    loss_scale = v}, output = ok_out},
    "layer 'dec' (class rec), unit layer 'p': loss_scale inside a unit is not supported, got ")
end
bad("two choice layers in a unit", {s = {class = "lstm", n_out = 4, from = "prev:s"}, p = ok_p,
  output = ok_out, output2 = ok_out},
  "(choice): the unit already has choice layer 'output")
bad("beam_size on a layer that is not a choice", {s = {class = "lstm", n_out = 4,
  from = "prev:s", beam_size = 4}, p = ok_p, output = ok_out},
  "layer 'dec' (class rec), unit layer 's' (class lstm): beam_size is an option of a choice layer")

H.expect_error("a choice without a target in the batch, outside search", function()
  local net = trained_like_net(5)
  net:forward{data = rl.randn(3, 1, 3), lengths = rl.tensor({3}, "int32"),
    classes = rl.zeros({3, 1}, "int32")}
  local d, ext = seq2seq("dot")
  d.dec.unit.output_prob.loss, d.dec.unit.output_prob.target = nil, nil
  d.dec.unit.output_prob.n_out = 6
  d.dec.is_output_layer = true
  rl.network(d, ext):forward{data = rl.randn(3, 1, 3), lengths = rl.tensor({3}, "int32")}
end, "layer 'dec' (class rec), unit layer 'output': a choice without a target in the batch needs search")

-- A unit with dropout on its recurrent input (the masks repeat in backward through time).
local function dropout_unit_case()
  return {network = {
      dec = {class = "rec", from = "data", unit = {
        d = {class = "dropout", dropout = 0.3, from = "prev:h"},
        h = {class = "linear", activation = "tanh", n_out = 4, from = {"data:source", "d"}},
        output = {class = "copy", from = "h"},
      }},
      output = {class = "softmax", from = "dec", loss = "ce", target = "classes"},
    }, extern_data = {data = {dim = 3}, classes = {dim = 3, sparse = true}}, T = 5, B = 3,
    lengths = {5, 2, 4}, train = true}
end

gradcheck("gradient check: dropout inside a unit (the masks repeat in backward through time)",
  dropout_unit_case())

-- Beyond rec.max_step_objects steps backward re-runs each step's forward on one layer object:
-- the same gradients, checked on the networks above with that path forced.
do
  local rec = require("rnnlua.rec")
  local keep = rec.max_step_objects
  rec.max_step_objects = 2
  local net, ext = seq2seq("additive")
  gradcheck("gradient check (re-run path): lstm + additive attention unit", {network = net,
    extern_data = ext, T = 5, B = 3, lengths = {5, 2, 4}, batch = label_batch(), max_inputs = 30})
  gradcheck("gradient check (re-run path): dropout inside a unit", dropout_unit_case())
  H.test("per-step objects and the re-run path give the same gradients", function()
    local grads = {}
    for i, max in ipairs({64, 0}) do
      rec.max_step_objects = max
      rl.manual_seed(5)
      local d, e = seq2seq("additive")
      local n = rl.network(d, e, {dtype = "float64"})
      local b = label_batch()
      rl.manual_seed(6)
      b.data, b.lengths = rl.randn(5, 3, 3, "float64"), rl.tensor({5, 2, 4}, "int32")
      n:forward(b)
      n:zero_grads()
      n:backward()
      grads[i] = n:grads():clone()
    end
    H.check(grads[1]:abs():max() > 0, "no gradient")
    H.check(maxdiff(grads[1], grads[2]) < 1e-12, "the two paths' gradients differ")
  end)
  rec.max_step_objects = keep
end

-- float32 lstm and gru step objects pack their weights once per pass (layers/recurrent.h,
-- "Packed operands"): over training steps that change the parameters, on both step paths and at
-- every CPU level, the float32 network follows a float64 copy given the same parameters. Weights
-- packed in an earlier pass would give the old parameters' outputs and gradients.
local function cpu_levels()
  local _, best = rl.cpu_level()
  local levels = {"generic"}
  if best == "avx2" or best == "avx512" then levels[#levels + 1] = "avx2" end
  if best == "avx512" then levels[#levels + 1] = "avx512" end
  return levels
end

-- The seq2seq network with decoder cell `cell` (n_out 20) and a batch of S decoder steps.
local function cell_net(cell, S)
  local d, e = seq2seq("additive", {s = {class = cell, from = {"emb", "prev:att"}, n_out = 20}})
  local b = label_batch()
  if S then
    local len = {S, S - 2, S - 1}
    local y = rl.zeros({S, 3}, "int32")
    for t = 1, S do
      for i = 1, 3 do y[t][i] = t <= len[i] and (t * 7 + i) % 5 + 1 or -1 end
    end
    b.classes, b.lengths_classes = y, rl.tensor(len, "int32")
  end
  rl.manual_seed(8)
  b.data, b.lengths = rl.randn(5, 3, 3, "float64"), rl.tensor({5, 2, 4}, "int32")
  return d, e, b
end

-- Runs fn(level, max_step_objects) at every CPU level on both step paths, then restores both.
local function each_level_and_path(fn)
  local rec = require("rnnlua.rec")
  local keep, was = rec.max_step_objects, rl.cpu_level()
  local ok, err = pcall(function()
    for _, lv in ipairs(cpu_levels()) do
      rl.cpu_level(lv)
      for _, max in ipairs({64, 0}) do
        rec.max_step_objects = max
        fn(lv, max)
      end
    end
  end)
  rl.cpu_level(was)
  rec.max_step_objects = keep
  if not ok then error(err, 0) end
end

local function f32_batch(b)
  return {classes = b.classes, lengths_classes = b.lengths_classes, data = b.data:float(),
    lengths = b.lengths}
end

for _, cell in ipairs({"lstm", "gru", "janet"}) do
  H.test("float32 per-step " .. cell .. ": packed weights follow the parameters from pass to pass",
    function()
    each_level_and_path(function(lv, max)
      local d, e, b = cell_net(cell)
      rl.manual_seed(7)
      local n64 = rl.network(d, e, {dtype = "float64"})
      local n32 = rl.network(d, e)
      local b32 = f32_batch(b)
      for it = 1, 3 do
        n32:params():copy_(n64:params())
        local where = string.format("%s, max_step_objects %d, pass %d", lv, max, it)
        H.near(n32:forward(b32), n64:forward(b), 1e-4, where .. ": loss")
        n64:zero_grads(); n64:backward(); n32:zero_grads(); n32:backward()
        local g = n64:grads()
        H.check(maxdiff(n32:grads():double(), g) < 1e-4 * math.max(1, g:abs():max()),
          where .. ": gradients")
        n64:params():add_(g * -0.5) -- a large step, so that stale packs would show
      end
    end)
  end)

  -- Sharing the packs changes where the weights are packed, not what is computed: with
  -- rec.share_packs = false every step object packs its own (once per step), with the same
  -- kernels, so outputs and gradients are the same to the bit, at every level, over passes.
  H.test("float32 per-step " .. cell .. ": shared packs give the same bits as packing per step",
    function()
    local rec = require("rnnlua.rec")
    each_level_and_path(function(lv, max)
      local runs = {}
      for i, share in ipairs({true, false}) do
        rec.share_packs = share
        local ok, err = pcall(function()
          local d, e, b = cell_net(cell)
          rl.manual_seed(7)
          local net = rl.network(d, e)
          local b32 = f32_batch(b)
          local run = {}
          for _ = 1, 3 do
            run[#run + 1] = rl.tensor({net:forward(b32)})
            run[#run + 1] = net:layer("dec").object.by_name.s.out:clone()
            net:zero_grads(); net:backward()
            run[#run + 1] = net:grads():clone()
            net:params():add_(net:grads() * -0.5)
          end
          runs[i] = run
        end)
        rec.share_packs = true
        if not ok then error(err, 0) end
      end
      for k, t in ipairs(runs[1]) do
        local diff = maxdiff(t, runs[2][k])
        H.check(diff == 0, string.format("%s, max_step_objects %d: result %d differs (max %g)",
          lv, max, k, diff))
      end
    end)
  end)

  -- A training step packs each operand once per pass, whatever the number of steps: U and W in
  -- forward, U^T and W^T in backward (plus U and W again where backward re-runs the forwards);
  -- none at the generic level, which runs BLAS.
  H.test("float32 per-step " .. cell .. ": packing once per pass, not once per step", function()
    each_level_and_path(function(lv, max)
      local d, e = cell_net(cell)
      rl.manual_seed(7)
      local net = rl.network(d, e)
      local obj = net:layer("dec").object.by_name.s.obj
      for _, S in ipairs({4, 9}) do
        local _, _, b = cell_net(cell, S)
        local b32 = f32_batch(b)
        local n0 = obj:_pack_count()
        net:forward(b32); net:zero_grads(); net:backward()
        local want = lv == "generic" and 0 or (max > 0 and 4 or 6)
        H.check(obj:_pack_count() - n0 == want, string.format("%s, max_step_objects %d, %d "
          .. "steps: %d operands packed, expected %d", lv, max, S, obj:_pack_count() - n0,
          want))
        -- the other steps' objects count the same packs: they share them
        for t, c in pairs(net:layer("dec").object.by_name.s.clones or {}) do
          H.check(c:_pack_count() == obj:_pack_count(), string.format("%s: the object of "
            .. "step %d packed %d operands, the unit's %d", lv, t, c:_pack_count(),
            obj:_pack_count()))
        end
      end
    end)
  end)
end

-- At the first step an lstm or gru reads its prev: sources as zeros (initial output 0): the rec
-- layer says so (layer:_set_zero_inputs) and their products are skipped. The same numbers to the
-- bit as with the zeros multiplied, and a nonzero input under the mask is indeed never read.
for _, cls in ipairs({"lstm", "gru"}) do
  H.test(cls .. ": inputs given as zeros skip their products, the same numbers", function()
    local layers = require("rnnlua.layers")
    local was = rl.cpu_level()
    for _, lv in ipairs(cpu_levels()) do
      rl.cpu_level(lv)
      for _, dt in ipairs({"float32", "float64"}) do
        local l = layers.create(cls, "z", {n_out = 20}, {5, 7}, dt)
        local vals, grads = rl.zeros({l.num_params}, dt), rl.zeros({l.num_params}, dt)
        l:bind(vals, grads, 0)
        rl.manual_seed(3)
        l:init_params()
        local T, B, F = 3, 4, {5, 7}
        local len = rl.tensor({3, 1, 2, 3}, "int32")
        local gout = rl.randn(T, B, 20, dt)
        -- input `which` zero (or `other`, nonzero) under `mask`, the other input random
        local function run(which, x, mask)
          local ins = {rl.randn(T, B, F[1], dt), rl.randn(T, B, F[2], dt)}
          ins[which] = x
          l:_set_zero_inputs(mask)
          local out = l:forward(ins, len, true):clone()
          grads:zero_()
          local gin = {rl.zeros({T, B, F[1]}, dt), rl.zeros({T, B, F[2]}, dt)}
          l:backward(gout, gin)
          return {out, grads:clone(), gin[1], gin[2]}
        end
        for which = 1, 2 do
          local zero, other = rl.zeros({T, B, F[which]}, dt), rl.randn(T, B, F[which], dt)
          rl.manual_seed(4)
          local plain = run(which, zero, 0)
          rl.manual_seed(4)
          local masked = run(which, zero, 1 << (which - 1))
          rl.manual_seed(4)
          local unread = run(which, other, 1 << (which - 1))
          H.check(plain[2]:abs():max() > 0, "no gradient")
          for k, what in ipairs({"output", "parameter gradients", "gradient of input 1",
              "gradient of input 2"}) do
            H.check(maxdiff(plain[k], masked[k]) == 0, string.format("%s %s, input %d: %s "
              .. "differ with the zero input skipped", lv, dt, which, what))
            H.check(maxdiff(plain[k], unread[k]) == 0, string.format("%s %s, input %d: %s read "
              .. "the input under the mask", lv, dt, which, what))
          end
        end
        H.expect_error(cls .. ": a mask naming an input the layer lacks", function()
          l:_set_zero_inputs(4)
        end, "layer 'z' has 2 inputs, the mask 0x4 names others")
      end
    end
    rl.cpu_level(was)
  end)
end

gradcheck("gradient check: gru + additive attention + embedding unit, ragged encoder and "
  .. "decoder lengths", {network = (seq2seq("additive", {s = {class = "gru",
  from = {"emb", "prev:att"}, n_out = 4}})), extern_data = select(2, seq2seq("additive")), T = 5,
  B = 3, lengths = {5, 2, 4}, batch = label_batch(), max_inputs = 30})

-- Every caller learns a layer's recurrent state from the layer (state_names), not its class.
H.test("recurrent state through the layer: names, dims, errors naming the layer", function()
  local layers = require("rnnlua.layers")
  local l = layers.create("lstm", "l", {n_out = 4}, {3}, "float32")
  local g = layers.create("gru", "g", {n_out = 2}, {3}, "float32")
  local c = layers.create("linear", "c", {n_out = 4}, {3}, "float32")
  local names, dims = l:state_names()
  H.check(#names == 2 and names[1] == "h" and names[2] == "c" and dims[1] == 4 and dims[2] == 4,
    "lstm states")
  names, dims = g:state_names()
  H.check(#names == 1 and names[1] == "h" and dims[1] == 2, "gru states")
  H.check(#c:state_names() == 0 and not layers.has_state(c) and layers.has_state(g),
    "a linear layer has none")
  H.expect_error("a state too many", function()
    g:set_initial_state(rl.zeros(1, 2), rl.zeros(1, 2))
  end, "layer 'g' (class gru): set_initial_state: the layer has 1 state (h), got 2")
  H.expect_error("no state of a linear layer", function() c:final_state() end,
    "layer 'c' (class linear): final_state: the layer has no recurrent state")
  H.expect_error("a state of the wrong width", function()
    l:set_final_state_grad(nil, rl.zeros(3, 5))
  end, "layer 'l' (class lstm): gradient of final c must be a float (B, 4) tensor")
  H.expect_error("no final state before a forward", function() g:final_state() end,
    "layer 'g' has no forward to read")
end)

do
  local layers = require("rnnlua.layers")
  local a = layers.create("lstm", "a", {n_out = 4}, {3}, "float32")
  local b = layers.create("lstm", "b", {n_out = 5}, {3}, "float32")
  local c = layers.create("linear", "c", {n_out = 4}, {3}, "float32")
  local g = layers.create("gru", "g", {n_out = 4}, {3}, "float32")
  H.expect_error("step objects of different shapes share no packed weights", function()
    b:_share_packs(a)
  end, "layer 'b' and layer 'a' differ")
  H.expect_error("an lstm and a gru share no packed weights", function() g:_share_packs(a) end,
    "layer 'g' and layer 'a' differ in their class")
  H.expect_error("only lstm and gru layers share packed weights", function() c:_share_packs(a) end,
    "layer 'c' (class linear) is not a recurrent layer")
  H.expect_error("a negative pass", function() g:_set_pack_pass(-1) end, "must be >= 0")
  H.expect_error("no pack count of a linear layer", function() c:_pack_count() end,
    "layer 'c' (class linear) is not a recurrent layer")
end

-- The weight gradients of a unit's lstm or gru are one product per weight matrix over all steps
-- after the backward steps (rec.defer_weight_grads; Rec:weight_grads), not one per step: the
-- same gradients as the per-step products up to the order of the sums, over ragged decoder
-- lengths, on both step paths, with a prev: source read as zeros at step 1 (prev:att, whose
-- rows of step 1 are left out) and one with a nonzero initial output (prev:p, whose step 1 gets
-- its own product). A step's rows left out of the product or counted twice change the gradients
-- by that step's share, far above the tolerance.
local function deferred_net(cell)
  local d, e = seq2seq("additive", {
    p = {class = "linear", from = "s", n_out = 3, activation = "tanh", initial_output = 0.3},
    s = {class = cell, from = {"emb", "prev:att", "prev:p"}, n_out = 6},
  })
  local b = label_batch()
  rl.manual_seed(8)
  b.data, b.lengths = rl.randn(5, 3, 3, "float64"), rl.tensor({5, 2, 4}, "int32")
  return d, e, b
end

for _, cell in ipairs({"lstm", "gru"}) do
  H.test(cell .. ": weight gradients over all steps equal the per-step products", function()
    local rec = require("rnnlua.rec")
    local keep = rec.max_step_objects
    local ok, err = pcall(function()
      for _, max in ipairs({64, 0}) do
        rec.max_step_objects = max
        local grads = {}
        for i, defer in ipairs({true, false}) do
          rec.defer_weight_grads = defer
          local d, e, b = deferred_net(cell)
          rl.manual_seed(7)
          local net = rl.network(d, e, {dtype = "float64"})
          for _ = 1, 2 do -- a second pass reuses the buffers
            net:forward(b)
            net:zero_grads()
            net:backward()
          end
          grads[i] = net:grads():clone()
          local s = net:layer("dec").object.by_name.s
          H.check((s.dz ~= nil) == defer, "the gates buffer over all steps: " .. tostring(s.dz))
          -- the padded steps' gate gradients (decoder lengths 4, 2, 3) are exactly 0: nothing
          -- reads those steps, so their rows add nothing to the products over all steps
          for _, tb in ipairs(defer and {{3, 2}, {4, 2}, {4, 3}} or {}) do
            H.check(s.dz[tb[1]][tb[2]]:abs():max() == 0, string.format("dZ of padded step %d "
              .. "of sequence %d is not 0", tb[1], tb[2]))
          end
        end
        local g = grads[2]
        H.check(g:abs():max() > 0, "no gradient")
        local diff = maxdiff(grads[1], g)
        H.check(diff < 1e-13 * g:abs():max(), string.format("max_step_objects %d: gradients "
          .. "differ by %g (largest %g)", max, diff, g:abs():max()))
      end
    end)
    rec.max_step_objects, rec.defer_weight_grads = keep, true
    if not ok then error(err, 0) end
  end)
end

-- The products over all steps split over the threads by columns (core/blas.c), never along
-- their S*B rows: a float32 training step gives the same bits on 1, 2 and 3 threads. Sizes above
-- the split thresholds (the prev:att product 64 x 256 x 96 is ~3 MFLOP).
for _, cell in ipairs({"lstm", "gru"}) do
  H.test(cell .. ": a unit's weight gradients over all steps are bit-identical on 1, 2 and 3 "
    .. "threads", function()
    local S, B = 6, 16
    local lens, y = {}, rl.zeros({S, B}, "int32")
    for i = 1, B do
      lens[i] = 1 + (i * 5) % S
      for t = 1, lens[i] do y[t][i] = (t * 7 + i) % 9 + 1 end
    end
    local function run(threads)
      rl.set_num_threads(threads)
      rl.manual_seed(3)
      local net = rl.network({
        enc = {class = "lstm", n_out = 32, from = "data"},
        dec = {class = "rec", from = {}, unit = {
          emb = {class = "embedding", from = "prev:output", n_out = 16},
          s = {class = cell, from = {"emb", "prev:att"}, n_out = 64},
          att = {class = "attention", base = "base:enc", from = "s", kind = "additive",
            n_att = 32},
          readout = {class = "linear", from = {"s", "att"}, n_out = 32, activation = "tanh"},
          output_prob = {class = "softmax", from = "readout", loss = "ce", target = "classes"},
          output = {class = "choice", from = "output_prob", target = "classes"},
        }},
      }, {data = {dim = 5}, classes = {dim = 10, sparse = true}})
      rl.manual_seed(4)
      local batch = {data = rl.randn(7, B, 5), lengths = rl.full({B}, 7, "int32"), classes = y,
        lengths_classes = rl.tensor(lens, "int32")}
      net:forward(batch)
      net:zero_grads()
      net:backward()
      return {grads = net:grads():totable()}
    end
    local saved = rl.get_num_threads()
    local ok, err = pcall(H.same_on_threads, run)
    rl.set_num_threads(saved)
    if not ok then error(err, 0) end
  end)
end

do
  local layers = require("rnnlua.layers")
  local l = layers.create("lstm", "w", {n_out = 4}, {3, 2}, "float64")
  local vals, grads = rl.zeros({l.num_params}, "float64"), rl.zeros({l.num_params}, "float64")
  l:bind(vals, grads, 0)
  local dz = rl.zeros({5, 2, 16}, "float64")
  H.expect_error("weight gradients of an input the layer lacks", function()
    l:_weight_grads(3, rl.zeros({5, 2, 2}, "float64"), dz)
  end, "layer 'w' (class lstm): rl_recurrent_weight_grads: the layer has 2 inputs, k = 2 names none")
  H.expect_error("weight gradients: x of another width", function()
    l:_weight_grads(1, rl.zeros({5, 2, 2}, "float64"), dz)
  end, "expected a contiguous float CPU tensor of rows of 3")
  H.expect_error("weight gradients: x and dz of other rows", function()
    l:_weight_grads(0, rl.zeros({4, 2, 4}, "float64"), dz)
  end, "layer 'w' (class lstm): rl_recurrent_weight_grads: x has 8 rows of float64, dz 10 rows of float64")
  H.expect_error("weight gradients: dz not gate-wide", function()
    l:_weight_grads(2, rl.zeros({5, 2, 2}, "float64"), rl.zeros({5, 2, 12}, "float64"))
  end, "layer 'w' (class lstm): rl_recurrent_weight_grads: dz is")
  H.expect_error("weight gradients of a linear layer", function()
    layers.create("linear", "c", {n_out = 4}, {3}, "float64"):_weight_grads(0, dz, dz)
  end, "layer 'c' (class linear) is not a recurrent layer")
  -- a gates buffer of the wrong shape: an error at the forward, naming the layer
  l:_set_gates(rl.zeros({1, 3, 16}, "float64"))
  H.expect_error("a gates buffer of another batch", function()
    l:forward({rl.zeros({1, 2, 3}, "float64"), rl.zeros({1, 2, 2}, "float64")}, rl.ones({2}, "int32"),
      true)
  end, "layer 'w' (class lstm): the gates buffer given with rl_recurrent_set_gates is")
  -- dropped again: the layer's own buffer and weight gradients
  l:_set_gates(nil)
  l:forward({rl.ones({1, 2, 3}, "float64"), rl.ones({1, 2, 2}, "float64")}, rl.ones({2}, "int32"), true)
  l:backward(rl.ones({1, 2, 4}, "float64"), {false, false})
  H.check(grads:abs():max() > 0, "no weight gradients after the gates buffer was dropped")
end

gradcheck("gradient check: a Lua layer (layer_norm) inside a unit", {network = {
  dec = {class = "rec", from = "data", unit = {
    h = {class = "linear", activation = "tanh", n_out = 4, from = {"data:source", "prev:h"}},
    output = {class = "layer_norm", from = "h"},
  }},
  output = {class = "softmax", from = "dec", loss = "ce", target = "classes"},
}, extern_data = {data = {dim = 3}, classes = {dim = 3, sparse = true}}, T = 4, B = 2,
  lengths = {4, 3}})

-- unit given as a string (RETURNN's unit = "lstm"): the error is about the unit, also when the
-- rec layer carries a loss
for _, loss in ipairs({false, true}) do
  H.expect_error("unit given as a string" .. (loss and ", with a loss" or ""), function()
    rl.network({output = {class = "rec", unit = "lstm", from = "data", loss = loss and "ce" or nil,
      target = loss and "classes" or nil, is_output_layer = not loss or nil}},
      {data = {dim = 3}, classes = {dim = 2, sparse = true}})
  end, "layer 'output' (class rec): unit must be a table of layers, got the string 'lstm' (RETURNN's")
end

H.done()
