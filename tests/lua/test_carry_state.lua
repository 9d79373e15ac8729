-- Carried state (truncated BPTT over consecutive chunks): rl.batches{carry_state = true} deals
-- each sequence's chunks to one slot, and net:forward starts every lstm/gru layer of a chunk from
-- the final state of the chunk before; so a long sequence cut into chunks gives, in float64, the
-- outputs and the loss of the whole sequence. Networks that cannot carry (a backward or
-- bidirectional recurrence, a window) and bad state_from/options are catchable errors.
local H = dofile("tests/lua/harness.lua")

local V = 6 -- classes of the sparse input and of the target

-- A dataset object of sparse sequences (data and classes: (T) int32) of the given lengths.
local function make_ds(lengths, seed)
  local seqs = {}
  local r = seed
  local function draw() r = (r * 1103515245 + 12345) % 2147483648; return r % V end
  for i, T in ipairs(lengths) do
    local x, y = {}, {}
    for t = 1, T do x[t], y[t] = draw(), draw() end
    seqs[i] = {tag = "seq-" .. i, data = rl.tensor(x, "int32"), classes = rl.tensor(y, "int32")}
  end
  return {
    name = "carry-test",
    num_seqs = function() return #seqs end,
    init_epoch = function() end,
    get_seq = function(_, i) return seqs[i] end,
    keys = function() return {"classes", "data"} end,
    extern_data = function()
      return {data = {dim = V, sparse = true}, classes = {dim = V, sparse = true}}
    end,
    seqs = seqs,
  }
end

local EXT = {data = {dim = V, sparse = true}, classes = {dim = V, sparse = true}}

local function net_of(rnn, extra)
  local desc = {
    emb = {class = "embedding", n_out = 4, from = "data"},
    r1 = {class = rnn, n_out = 5, from = "emb"},
    r2 = {class = rnn, n_out = 3, from = "r1"},
    output = {class = "softmax", from = "r2", loss = "ce", target = "classes"},
  }
  for k, v in pairs(extra or {}) do desc[k] = v end
  rl.manual_seed(3)
  return rl.network(desc, EXT, {dtype = "float64"})
end

-- The whole sequences in one batch: output (T, B, V) and loss.
local function whole(net, ds)
  local batch = rl.batches(ds, {})()
  local loss = net:forward(batch, {train = false})
  return net:layer("output").output:clone(), loss, batch
end

-- The max difference between the chunked outputs (carried state) and the whole ones, the loss
-- summed over chunks, and the batches' state_from lists.
local function chunked(net, ds, size, streams, ref)
  local maxdiff, loss, froms, covered = 0, 0, {}, 0
  for batch in rl.batches(ds, {chunking = tostring(size), carry_state = true,
                               max_seqs = streams}) do
    froms[#froms + 1] = batch.state_from
    loss = loss + net:forward(batch, {train = false})
    local out = net:layer("output").output
    for b = 1, batch.lengths:size(1) do
      local l, s, pos = batch.lengths[b], batch.starts[b], batch.seqs[b]
      local got = out:select(2, b):narrow(1, 1, l)
      local want = ref:select(2, pos):narrow(1, s + 1, l)
      maxdiff = math.max(maxdiff, ((got - want):abs():max()))
      covered = covered + l
    end
  end
  return maxdiff, loss, froms, covered
end

for _, rnn in ipairs{"lstm", "gru"} do
  H.test(rnn .. ": chunks with carried state give the whole sequences' outputs", function()
    local lengths = {23, 17, 30, 5, 12}
    local ds = make_ds(lengths, 7)
    local net = net_of(rnn)
    local ref, ref_loss = whole(net, ds)
    -- 2 streams over 5 sequences: slots take new sequences (state reset) and close up at the end
    local d, loss, froms, covered = chunked(net, ds, 7, 2, ref)
    H.check(d < 1e-12, string.format("max output difference %.3g", d))
    H.near(loss, ref_loss, 1e-9 * math.abs(ref_loss), "summed chunk loss")
    H.check(covered == 87, "every frame once, got " .. covered)
    H.check(table.concat(froms[1], ",") == "0,0", "first batch starts both streams")
    H.check(table.concat(froms[2], ",") == "1,2", "slots keep their streams")
    -- without carrying, the chunks after the first differ from the whole sequence
    local nd = 0
    for batch in rl.batches(ds, {chunking = "7", max_seqs = 1}) do
      net:forward(batch, {train = false})
      local l, s, pos = batch.lengths[1], batch.starts[1], batch.seqs[1]
      local got = net:layer("output").output:select(2, 1):narrow(1, 1, l)
      nd = math.max(nd, ((got - ref:select(2, pos):narrow(1, s + 1, l)):abs():max()))
    end
    H.check(nd > 1e-6, "chunks without carried state differ (" .. nd .. ")")
    -- a forward without state_from starts from zeros again
    local ref2 = whole(net, ds)
    H.check((ref2 - ref):abs():max() == 0, "a batch without state_from is not affected")
  end)
end

-- an LSTMP carries h of P units and c of H (n_out) units; layer norm carries the same state
for _, opt in ipairs{{n_proj = 2}, {n_proj = 3, layer_norm = true}, {layer_norm = true}} do
  local name = (opt.n_proj and ("n_proj " .. opt.n_proj) or "")
    .. (opt.layer_norm and " layer_norm" or "")
  H.test("lstm " .. name .. ": chunks with carried state give the whole outputs", function()
    local ds = make_ds({23, 17, 30, 5, 12}, 7)
    local r1 = {class = "lstm", n_out = 5, from = "emb"}
    local r2 = {class = "lstm", n_out = 4, from = "r1"}
    for k, v in pairs(opt) do r1[k], r2[k] = v, v end
    local net = net_of("lstm", {r1 = r1, r2 = r2})
    local ref, ref_loss = whole(net, ds)
    for _, c in ipairs{{7, 2}, {1, 3}, {4, 1}} do
      local d, loss = chunked(net, ds, c[1], c[2], ref)
      H.check(d < 1e-12, string.format("size %d, %d streams: max output difference %.3g",
        c[1], c[2], d))
      H.near(loss, ref_loss, 1e-9 * math.abs(ref_loss), "summed chunk loss")
    end
  end)
end

H.test("chunk sizes 1 and longer than every sequence, one stream and many", function()
  local ds = make_ds({9, 4, 13}, 11)
  local net = net_of("lstm")
  local ref = whole(net, ds)
  for _, c in ipairs{{1, 3}, {50, 2}, {4, 1}, {3, 8}} do
    local d = chunked(net, ds, c[1], c[2], ref)
    H.check(d < 1e-12, string.format("size %d, %d streams: %.3g", c[1], c[2], d))
  end
end)

H.test("batches: state_from after a stream's sequence ends and the epoch runs out", function()
  -- lengths in chunks of 2: 2, 1, 3 chunks; 2 streams
  local ds = make_ds({4, 2, 6}, 5)
  local got = {}
  for batch in rl.batches(ds, {chunking = "2", carry_state = true, max_seqs = 2}) do
    got[#got + 1] = table.concat(batch.state_from, ",") .. ":" .. table.concat(batch.seqs, ",")
  end
  -- seq 2 (slot 2) ends after one chunk: seq 3 takes slot 2; seq 1 ends after two, nothing is
  -- left, so seq 3 closes up into slot 1 and continues slot 2 of the batch before
  H.check(table.concat(got, " ") == "0,0:1,2 1,0:1,3 2:3 1:3", table.concat(got, " "))
end)

H.test("batch_size limits the streams to batch_size // size", function()
  local ds = make_ds({5, 5, 5, 5}, 1)
  local b = rl.batches(ds, {chunking = "5", carry_state = true, batch_size = 10, max_seqs = 40})()
  H.check(b.lengths:size(1) == 2, "2 streams, got " .. b.lengths:size(1))
end)

H.test("training with carried state: gradients flow within chunks only, loss falls", function()
  local ds = make_ds({40, 33, 27}, 9)
  local r = rl.train{
    network = {
      emb = {class = "embedding", n_out = 8, from = "data"},
      l1 = {class = "lstm", n_out = 16, from = "emb"},
      output = {class = "softmax", from = "l1", loss = "ce", target = "classes"},
    },
    train = ds, dev = ds, num_epochs = 6, chunking = "8", carry_state = true, max_seqs = 2,
    learning_rate = 0.01, log_verbosity = 0,
  }
  H.check(r.history[6].train_score < r.history[1].train_score, "train score falls")
  H.check(r.dev_score == r.dev_score and r.dev_score > 0, "dev scored")
end)

local ds = make_ds({6, 5}, 3)
local function carry_batch() return rl.batches(ds, {chunking = "3", carry_state = true})() end

H.expect_error("a bidirectional network cannot carry its state", function()
  local net = net_of("lstm", {
    bw = {class = "lstm", n_out = 3, from = "emb", direction = -1},
    output = {class = "softmax", from = {"r2", "bw"}, loss = "ce", target = "classes"}})
  net:forward(carry_batch())
end, "layer 'bw' (class lstm) runs backwards in time (direction = -1)")

H.expect_error("a backward gru cannot carry its state", function()
  local net = net_of("gru", {r2 = {class = "gru", n_out = 3, from = "r1", direction = -1}})
  net:forward(carry_batch())
end, "layer 'r2' (class gru) runs backwards in time (direction = -1)")

H.expect_error("rl.train{carry_state} rejects a bidirectional network before training", function()
  rl.train{network = {
      emb = {class = "embedding", n_out = 4, from = "data"},
      bw = {class = "lstm", n_out = 3, from = "emb", direction = -1},
      output = {class = "softmax", from = "bw", loss = "ce", target = "classes"}},
    train = ds, chunking = "3", carry_state = true, log_verbosity = 0}
end, "carry_state = true: layer 'bw' (class lstm) runs backwards in time (direction = -1)")

H.expect_error("a window layer cannot carry", function()
  local net = net_of("lstm", {r2 = {class = "window", window = 3, from = "r1"}})
  net:forward(carry_batch())
end, "layer 'r2' (class window) is not a forward lstm/gru or a frame-wise layer")

H.expect_error("rl.train: carry_state needs chunking", function()
  rl.train{network = {output = {class = "softmax", from = "data", loss = "ce",
    target = "classes"}}, train = ds, carry_state = true, log_verbosity = 0}
end, "carry_state = true needs chunking")

H.expect_error("rl.batches: carry_state needs chunking", function()
  rl.batches(ds, {carry_state = true})
end, "carry_state needs chunking")

H.expect_error("rl.batches: carry_state with overlapping chunks", function()
  rl.batches(ds, {carry_state = true, chunking = "4:2"})
end, "without overlap")

H.expect_error("rl.batches: carry_state must be a boolean", function()
  rl.batches(ds, {carry_state = 1, chunking = "4"})
end, "carry_state must be true or false")

H.expect_error("state_from: the first batch must start from zeros", function()
  local net = net_of("lstm")
  local b = carry_batch()
  b.state_from = {1, 0}
  net:forward(b)
end, "batch.state_from[1] = 1")

H.expect_error("state_from: a slot the previous batch did not have", function()
  local net = net_of("lstm")
  net:forward(carry_batch())
  local b = carry_batch()
  b.state_from = {0, 3}
  net:forward(b)
end, "batch.state_from[2] = 3: expected 0 (a sequence starts) or a slot 1..2")

H.expect_error("state_from: one entry per sequence", function()
  local net = net_of("gru")
  local b = carry_batch()
  b.state_from = {0}
  net:forward(b)
end, "batch.state_from must be a list of 2 integers")

H.done()
