-- The embedding layer: class indices to rows of W, padded frames never read, out-of-range
-- indices an error naming the layer, float64 gradient checks.
local H = dofile("tests/lua/harness.lua")

local function emb_net(dtype)
  rl.manual_seed(3)
  return rl.network({
    emb = {class = "embedding", n_out = 4, from = "data"},
    output = {class = "softmax", from = "emb", loss = "ce", target = "classes"},
  }, {data = {dim = 7, sparse = true}, classes = {dim = 3, sparse = true}}, {dtype = dtype})
end

H.test("forward gives W's rows on valid frames, 0 on padding (never read)", function()
  local net = emb_net("float64")
  -- frame 3 of sequence 2 is padding and holds an index far outside the vocabulary
  local x = rl.tensor({{1, 6}, {0, 2}, {5, 99}}, "int32")
  local y = rl.tensor({{0, 1}, {2, 0}, {1, 0}}, "int32")
  net:forward{data = x, classes = y, lengths = rl.tensor({3, 2}, "int32")}
  local W = net:layer("emb").params.W
  local out = net:layer("emb").output
  for t = 1, 3 do
    for b = 1, 2 do
      local v = x[t][b]
      for j = 1, 4 do
        local want = (b == 2 and t == 3) and 0 or W[v + 1][j]
        H.near(out[t][b][j], want, 0, string.format("out[%d][%d][%d]", t, b, j))
      end
    end
  end
end)

H.test("backward adds grad_out into the rows read, twice for a repeated index", function()
  local net = emb_net("float64")
  local x = rl.tensor({{2, 2}, {4, 2}}, "int32")
  local y = rl.tensor({{0, 1}, {2, 0}}, "int32")
  net:forward{data = x, classes = y, lengths = rl.tensor({2, 1}, "int32")}
  net:zero_grads()
  net:backward()
  local dW = net:layer("emb").grads.W
  H.check(dW[1]:abs():sum() == 0 and dW[6]:abs():sum() == 0, "rows not read got gradient")
  H.check(dW[3]:abs():sum() > 0 and dW[5]:abs():sum() > 0, "rows read got no gradient")
end)

H.expect_error("an index outside the vocabulary on a valid frame", function()
  local net = emb_net("float32")
  net:forward{data = rl.tensor({{1, 7}}, "int32"), classes = rl.tensor({{0, 0}}, "int32"),
    lengths = rl.tensor({1, 1}, "int32")}
end, "layer 'emb' (class embedding): class index 7 at frame 1 of sequence 2 is outside 0..6")

H.expect_error("a negative index", function()
  local net = emb_net("float32")
  net:forward{data = rl.tensor({{-1, 0}}, "int32"), classes = rl.tensor({{0, 0}}, "int32"),
    lengths = rl.tensor({1, 1}, "int32")}
end, "class index -1")

H.expect_error("a dense input", function()
  rl.network({emb = {class = "embedding", n_out = 4, from = "data", is_output_layer = true}},
    {data = {dim = 7}}):forward{data = rl.zeros(2, 1, 7), lengths = rl.tensor({2}, "int32")}
end, "layer 'emb' (class embedding): the input must be (T, B) int32 class indices")

H.test("linear and softmax take class indices: the same as one-hot vectors", function()
  local x = rl.tensor({{1, 6}, {0, 2}, {5, 3}}, "int32")
  local len = rl.tensor({3, 2}, "int32")
  local onehot = rl.zeros({3, 2, 7}, "float64")
  for t = 1, 3 do for b = 1, 2 do onehot[t][b][x[t][b] + 1] = 1 end end
  local y = rl.tensor({{0, 1}, {2, 0}, {1, 0}}, "int32")
  local function net(sparse)
    rl.manual_seed(7)
    return rl.network({
      lin = {class = "linear", from = {"data", "data2"}, n_out = 4, activation = "tanh"},
      output = {class = "softmax", from = {"lin", "data"}, loss = "ce", target = "classes"},
    }, {data = {dim = 7, sparse = sparse}, data2 = {dim = 2}, classes = {dim = 3, sparse = true}},
      {dtype = "float64"})
  end
  local a, b = net(true), net(false)
  local x2 = rl.randn(3, 2, 2, "float64")
  local la = a:forward{data = x, data2 = x2, classes = y, lengths = len}
  local lb = b:forward{data = onehot, data2 = x2, classes = y, lengths = len}
  H.near(la, lb, 1e-12, "loss")
  a:zero_grads(); a:backward(); b:zero_grads(); b:backward()
  H.check((a:grads() - b:grads()):abs():max() < 1e-12, "gradients differ")
end)

H.expect_error("an index outside the vocabulary into linear", function()
  rl.network({output = {class = "linear", n_out = 2, from = "data"}},
    {data = {dim = 7, sparse = true}}):forward{data = rl.tensor({{3}, {9}}, "int32"),
    lengths = rl.tensor({2}, "int32")}
end, "layer 'output' (class linear): class index 9 at frame 2 of sequence 1 is outside 0..6")

H.test("float64 gradient check: sparse inputs into linear and softmax", function()
  local r = rl.gradcheck{network = {
    lin = {class = "linear", n_out = 3, from = "data", activation = "tanh"},
    output = {class = "softmax", from = {"lin", "data"}, loss = "ce", target = "classes"},
  }, extern_data = {data = {dim = 5, sparse = true}, classes = {dim = 3, sparse = true}},
    T = 5, B = 3, lengths = {5, 2, 4}}
  H.check(r.passed, string.format("max relative error %.3g", r.max_rel_error))
end)

H.expect_error("a sparse input into a class that cannot take one", function()
  rl.network({output = {class = "lstm", n_out = 4, from = "data"}}, {data = {dim = 7, sparse = true}})
end, "layer 'output' (class lstm): input 'data' is sparse")

H.expect_error("embedding without n_out", function()
  rl.network({output = {class = "embedding", from = "data"}}, {data = {dim = 7, sparse = true}})
end, "n_out")

H.test("float64 gradient check, ragged lengths", function()
  local r = rl.gradcheck{network = {
    emb = {class = "embedding", n_out = 4, from = "data"},
    lstm = {class = "lstm", n_out = 3, from = "emb"},
    output = {class = "softmax", from = {"lstm", "emb"}, loss = "ce", target = "classes"},
  }, extern_data = {data = {dim = 6, sparse = true}, classes = {dim = 3, sparse = true}},
    T = 5, B = 3, lengths = {5, 2, 4}}
  H.check(r.n_checked > 0 and r.per_param["emb.W"].checked > 0, "emb.W not checked")
  H.check(r.passed, string.format("max relative error %.3g", r.max_rel_error))
end)

H.done()
