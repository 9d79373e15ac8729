-- rl.sample: text from a character LM (a network or a checkpoint, the vocabulary stored in its
-- extern_data): the same seed gives the same text, temperature -> 0 is the argmax of the whole
-- text run through the network afresh at every step (so the carried state is exact), and bad
-- options or a model that is not a character LM are catchable errors naming what is wrong.
local H = dofile("tests/lua/harness.lua")

local TEXT = "the cat sat on the mat. the dog sat on the log. a cat and a dog.\n"
local vocab, index = {}, {}
for c in TEXT:gmatch(".") do
  if not index[c] then vocab[#vocab + 1], index[c] = c, true end
end
table.sort(vocab)
for k, c in ipairs(vocab) do index[c] = k - 1 end
local V = #vocab

local function ids_of(s)
  local t = {}
  for j = 1, #s do t[j] = index[s:sub(j, j)] end
  return t
end

-- sequences: the text repeated and rotated, input = chars 1..n-1, target = chars 2..n
local seqs = {}
for r = 1, 6 do
  local s = (TEXT:sub(r * 7) .. TEXT .. TEXT):sub(1, 120)
  local ids = ids_of(s)
  seqs[r] = {tag = "s" .. r, data = rl.tensor(table.move(ids, 1, #ids - 1, 1, {}), "int32"),
             classes = rl.tensor(table.move(ids, 2, #ids, 1, {}), "int32")}
end
local ds = {
  name = "sample-test", num_seqs = function() return #seqs end, init_epoch = function() end,
  get_seq = function(_, i) return seqs[i] end, keys = function() return {"classes", "data"} end,
  extern_data = function()
    return {data = {dim = V, sparse = true}, classes = {dim = V, sparse = true}}
  end,
}
local EXT = {data = {dim = V, sparse = true, labels = vocab},
             classes = {dim = V, sparse = true, labels = vocab}}
local NET = {
  emb = {class = "embedding", n_out = 6, from = "data"},
  l1 = {class = "lstm", n_out = 16, from = "emb"},
  l2 = {class = "gru", n_out = 12, from = "l1"},
  output = {class = "softmax", from = "l2", loss = "ce", target = "classes"},
}
local dir = os.tmpname()
os.remove(dir)
local r = rl.train{network = NET, extern_data = EXT, train = ds, num_epochs = 15,
  chunking = "30", carry_state = true, max_seqs = 3, learning_rate = 0.02, dtype = "float64",
  model = dir .. "/lm", save_interval = 15, log_verbosity = 0}
local ckpt = r.checkpoint

H.test("the same seed gives the same text; the text has `length` characters", function()
  local a = rl.sample{model = r.net, prime = "the ", length = 60, temperature = 0.8, seed = 5}
  local b = rl.sample{model = r.net, prime = "the ", length = 60, temperature = 0.8, seed = 5}
  local c = rl.sample{model = r.net, prime = "the ", length = 60, temperature = 1.5, seed = 6}
  H.check(type(a) == "string" and #a == 60, "60 characters, got " .. tostring(a and #a))
  H.check(a == b, "same seed: " .. a .. " | " .. b)
  H.check(a ~= c, "another seed and temperature give another text")
  local _, full = rl.sample{model = r.net, prime = "the ", length = 60, temperature = 0.8,
    seed = 5}
  H.check(full == "the " .. a, "the second result is prime .. text")
end)

H.test("a checkpoint and the network in memory give the same text", function()
  local a = rl.sample{model = r.net, prime = "a dog", length = 40, temperature = 0.7, seed = 2}
  local b = rl.sample{model = ckpt, prime = "a dog", length = 40, temperature = 0.7, seed = 2}
  H.check(a == b, a .. " | " .. b)
end)

H.test("temperature -> 0 is the argmax of the whole text through the network", function()
  local prime, n = "the c", 40
  local got = rl.sample{model = ckpt, prime = prime, length = n, temperature = 1e-6, seed = 1}
  -- the reference: every step runs the whole text so far from the zero state, no carrying
  local ck = rl.load_checkpoint(ckpt)
  local net = rl.network({emb = NET.emb, l1 = NET.l1, l2 = NET.l2,
    output = {class = "softmax", from = "l2", is_output_layer = true, n_out = V}}, EXT,
    {dtype = "float64"})
  rl.checkpoint.load_params(ck, net)
  local text = prime
  for _ = 1, n do
    local ids = ids_of(text)
    net:forward({data = rl.tensor(ids, "int32"):view(#ids, 1),
                 lengths = rl.tensor({#ids}, "int32")}, {train = false})
    local y = net:layer("output").output
    local p = y:select(1, #ids):select(1, 1):totable()
    local best = 1
    for k = 2, #p do if p[k] > p[best] then best = k end end
    text = text .. vocab[best]
  end
  H.check(prime .. got == text, "sampled: " .. prime .. got .. " | argmax: " .. text)
  H.check(got:find("the") ~= nil, "the trained model says 'the': " .. got)
end)

H.test("length 0 gives the empty string; the default prime is a newline", function()
  H.check(rl.sample{model = r.net, prime = "a", length = 0, seed = 1} == "", "empty")
  local _, full = rl.sample{model = r.net, length = 5, seed = 1}
  H.check(full:sub(1, 1) == "\n" and #full == 6, "starts from \\n")
end)

H.expect_error("a model with NaN parameters", function()
  local net = rl.network({emb = NET.emb, l1 = NET.l1, l2 = NET.l2,
    output = {class = "softmax", from = "l2", is_output_layer = true, n_out = V}}, EXT)
  net:params():fill_(0 / 0)
  rl.sample{model = net, prime = "a", length = 3, seed = 1}
end, "rl.sample: the model gave NaN as the probability of class 0 for character 1")

H.expect_error("a prime character not in the vocabulary", function()
  rl.sample{model = r.net, prime = "the Zebra", length = 5}
end, "prime character \"Z\" (character 5 of the prime) is not in the vocabulary")
H.expect_error("an empty prime", function()
  rl.sample{model = r.net, prime = "", length = 5}
end, "prime must be a non-empty string")
H.expect_error("length < 0", function()
  rl.sample{model = r.net, prime = "a", length = -1}
end, "length must be an integer >= 0, got -1")
H.expect_error("an absurd length is refused at once", function()
  rl.sample{model = r.net, prime = "a", length = 1 << 50}
end, "length 1125899906842624 is more than 1000000 characters")
H.expect_error("a length that is not an integer", function()
  rl.sample{model = r.net, prime = "a", length = 2.5}
end, "length must be an integer >= 0, got 2.5")
for _, t in ipairs{0, -0.5, 0 / 0, math.huge} do
  H.expect_error("temperature " .. tostring(t), function()
    rl.sample{model = r.net, prime = "a", length = 5, temperature = t}
  end, "temperature must be a number > 0")
end
H.expect_error("an unknown option", function()
  rl.sample{model = r.net, prime = "a", lenght = 5}
end, "unknown option 'lenght'")
H.expect_error("a model that is neither a path nor a network", function()
  rl.sample{model = 3, prime = "a"}
end, "model must be a checkpoint path or a network, got number")
H.expect_error("a missing checkpoint", function()
  rl.sample{model = dir .. "/nothing.h5", prime = "a"}
end, "nothing.h5")

H.expect_error("a classifier over dense frames is not a character LM", function()
  rl.manual_seed(1)
  local net = rl.network({l = {class = "lstm", n_out = 4},
    output = {class = "softmax", from = "l", loss = "ce", target = "classes"}},
    {data = {dim = 9}, classes = {dim = 2, sparse = true}})
  rl.sample{model = net, prime = "a"}
end, "is not a character language model: layer 'output' needs the inputs 'data' (dense)")

H.expect_error("an LM without a vocabulary", function()
  rl.manual_seed(1)
  local net = rl.network(NET, {data = {dim = V, sparse = true}, classes = {dim = V, sparse = true}})
  rl.sample{model = net, prime = "a"}
end, "has no vocabulary (extern_data.data.labels")

H.expect_error("labels that are not single characters", function()
  rl.manual_seed(1)
  local words = {}
  for k = 1, V do words[k] = "w" .. k end
  local net = rl.network(NET, {data = {dim = V, sparse = true, labels = words},
    classes = {dim = V, sparse = true}})
  rl.sample{model = net, prime = "a"}
end, "label 0 of input 'data' is \"w1\", not one character")

H.expect_error("an output of another size than the vocabulary", function()
  rl.manual_seed(1)
  local ext = {data = {dim = V, sparse = true, labels = vocab}, y = {dim = 3, sparse = true}}
  local net = rl.network({emb = NET.emb, l1 = NET.l1, output = {class = "softmax", from = "l1",
    loss = "ce", target = "y"}}, ext)
  rl.sample{model = net, prime = "a"}
end, "layer 'output' gives 3 classes, the input vocabulary has " .. V)

H.expect_error("a bidirectional LM cannot be sampled", function()
  rl.manual_seed(1)
  local net = rl.network({emb = NET.emb, l1 = NET.l1,
    bw = {class = "lstm", n_out = 4, from = "emb", direction = -1},
    output = {class = "softmax", from = {"l1", "bw"}, loss = "ce", target = "classes"}}, EXT)
  rl.sample{model = net, prime = "a"}
end, "layer 'bw' (class lstm) runs backwards in time (direction = -1)")

os.remove(ckpt)
os.remove(dir .. "/lm.curve.jsonl")
os.remove(dir)
H.done()
