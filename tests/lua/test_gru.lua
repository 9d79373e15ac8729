-- The gru layer from Lua: rl.gradcheck's table form for both directions (the pinned
-- interface), in a bidirectional network with ragged lengths, the state methods, and bad options
-- that must raise catchable errors naming the layer.
local H = dofile("tests/lua/harness.lua")

for _, dir in ipairs{1, -1} do
  H.test("rl.gradcheck gru direction " .. dir, function()
    local r = rl.gradcheck{layer = {class = "gru", n_out = 3, direction = dir}, in_dim = 4}
    H.check(type(r) == "table" and type(r.passed) == "boolean", "a report with .passed")
    H.check(type(r.max_rel_error) == "number" and r.n_checked > 0, "a report with .max_rel_error")
    H.check(r.passed and r.max_rel_error < 1e-4,
      string.format("max relative error %.3g", r.max_rel_error))
  end)
end

H.test("gradcheck: bidirectional gru network, two inputs, ragged", function()
  local r = rl.gradcheck{
    network = {
      fw = {class = "gru", n_out = 3, from = {"data", "data2"}},
      bw = {class = "gru", n_out = 2, from = "data", direction = -1},
      output = {class = "softmax", from = {"fw", "bw"}, loss = "ce", target = "classes"},
    },
    extern_data = {data = {dim = 3}, data2 = {dim = 2}, classes = {dim = 4, sparse = true}},
    T = 6, B = 3, lengths = {6, 2, 4},
  }
  H.check(r.passed, string.format("max relative error %.3g", r.max_rel_error))
end)

H.test("gru state methods: final state, initial state and its gradient", function()
  rl.manual_seed(1)
  local net = rl.network({output = {class = "gru", n_out = 2, direction = -1, loss = "mse",
    target = "y"}}, {data = {dim = 3}, y = {dim = 2}})
  local l = net:layer("output").object
  local x, len = rl.randn(4, 2, 3), rl.tensor({4, 2}, "int32")
  net:forward{data = x, y = rl.zeros(4, 2, 2), lengths = len}
  local h = l:final_state():clone() -- a view of the layer's buffer, valid until the next forward
  local o = net:layer("output").output
  -- a backward GRU ends at frame 1 of every sequence
  H.near((h:select(1, 1) - o[1][1]):abs():max(), 0, 1e-6, "final state of sequence 1")
  H.near((h:select(1, 2) - o[1][2]):abs():max(), 0, 1e-6, "final state of sequence 2")
  local h0 = rl.randn(2, 2)
  l:set_initial_state(h0)
  net:forward{data = x, y = rl.zeros(4, 2, 2), lengths = len}
  H.check((l:final_state() - h):abs():max() > 1e-4, "the initial state changes the result")
  net:zero_grads()
  net:backward()
  H.check(l:initial_state_grad():size(1) == 2, "initial state gradient")
  l:set_initial_state(nil)
end)

H.expect_error("gru without n_out", function()
  rl.network({g = {class = "gru", is_output_layer = true}}, {data = {dim = 3}})
end, "n_out")
for _, bad in ipairs{{n_out = 0, what = "n_out"}, {n_out = -2, what = "n_out"},
                     {n_out = 3.5, what = "n_out"}, {n_out = 3, direction = 2, what = "direction"},
                     {n_out = 1e9, what = "parameters"}} do
  H.expect_error("gru with bad option " .. bad.what, function()
    rl.network({g = {class = "gru", n_out = bad.n_out, direction = bad.direction,
      is_output_layer = true}}, {data = {dim = 3}})
  end, bad.what)
end
H.expect_error("gru: an unknown option is named", function()
  rl.network({g = {class = "gru", n_out = 3, peepholes = true, is_output_layer = true}},
    {data = {dim = 3}})
end, "peepholes")
H.expect_error("gru: set_initial_state takes no cell", function()
  local net = rl.network({g = {class = "gru", n_out = 2, is_output_layer = true}},
    {data = {dim = 3}})
  net:layer("g").object:set_initial_state(rl.zeros(1, 2), rl.zeros(1, 2))
end, "layer 'g' (class gru)")

-- A rec unit of one gru over data:source equals the gru layer to the bit: tests/lua/test_rec.lua
-- (rec_of_one, beside the lstm's).

H.test("gradcheck: a rec unit with a gru reading prev: of another unit layer", function()
  local r = rl.gradcheck{
    network = {
      dec = {class = "rec", from = "data", unit = {
        s = {class = "gru", n_out = 3, from = {"data:source", "prev:output"}},
        output = {class = "linear", activation = "tanh", n_out = 2, from = "s"},
      }},
      output = {class = "copy", from = "dec", loss = "mse", target = "target"},
    },
    extern_data = {data = {dim = 3}, target = {dim = 2}},
    T = 5, B = 3, lengths = {5, 2, 4},
  }
  H.check(r.passed, string.format("max relative error %.3g", r.max_rel_error))
end)

H.expect_error("a gru with direction = -1 inside a rec unit", function()
  rl.network({dec = {class = "rec", from = "data", is_output_layer = true,
    unit = {output = {class = "gru", n_out = 2, direction = -1}}}}, {data = {dim = 3}})
end, "unit layer 'output'")

-- The two directions of a bidirectional gru pair run concurrently in a network (as lstm pairs
-- do, tests/lua/test_concurrent.lua): the same numbers as one after the other.
H.test("bidirectional gru pairs: concurrent run equals the sequential one", function()
  local function build(concurrent)
    rl.manual_seed(7)
    return rl.network({
      f1 = {class = "gru", n_out = 19, from = "data"},
      b1 = {class = "gru", n_out = 19, from = "data", direction = -1},
      f2 = {class = "gru", n_out = 11, from = {"f1", "b1"}},
      b2 = {class = "gru", n_out = 11, from = {"f1", "b1"}, direction = -1},
      output = {class = "softmax", from = {"f2", "b2"}, loss = "ce", target = "classes"},
    }, {data = {dim = 5}, classes = {dim = 4, sparse = true}},
      {concurrent = concurrent, input_grads = true})
  end
  rl.manual_seed(11)
  local T, B = 7, 6
  local y = rl.zeros(T, B):int()
  for t = 1, T do for b = 1, B do y[t][b] = (t + 2 * b) % 4 end end
  local batch = {data = rl.randn(T, B, 5), classes = y,
    lengths = rl.tensor({7, 3, 7, 1, 6, 7}, "int32")}
  local saved = rl.get_num_threads()
  rl.set_num_threads(2) -- pairs run concurrently only with more than one thread
  local threads = rl.get_num_threads()
  local a, b = build(true), build(false)
  H.check(a.nodes[1].pair_next or a.nodes[2].pair_next, "no gru pair was formed")
  for _ = 1, 2 do
    local la = a:forward(batch)
    a:backward()
    local lb = b:forward(batch)
    b:backward()
    H.near(la, lb, 1e-5 * math.abs(lb), "loss")
    local d = (a:grads() - b:grads()):abs():max()
    H.check(d <= 1e-6 * (1 + b:grads():abs():max()), "gradients differ by " .. d)
    H.check((a:input_grad("data") - b:input_grad("data")):abs():max() <= 1e-6, "input gradients")
    H.check(rl.get_num_threads() == threads, "BLAS threads not restored")
  end
  rl.set_num_threads(saved)
end)

-- float32 with the packed kernel: the batch's rows run in parts on the BLAS threads (H small
-- enough, B >= 16) with the bias sums after the steps, so 1 and 2 threads give the same bits,
-- both directions, ragged lengths.
H.test("float32 gru: the same bits on 1 and 2 threads (rows in parts)", function()
  local threads = rl.get_num_threads()
  local T, B = 5, 21
  rl.manual_seed(12)
  local x, len = rl.randn(T, B, 6), rl.full({B}, T, "int32")
  for b = 1, B, 3 do len[b] = 1 + b % T end
  local gout = rl.randn(T, B, 40)
  for _, dir in ipairs({1, -1}) do
    local res = {}
    for n = 1, 2 do
      rl.set_num_threads(n)
      rl.manual_seed(13)
      local net = rl.network({output = {class = "gru", n_out = 40, from = "data", direction = dir,
        loss = "mse", target = "target"}}, {data = {dim = 6}, target = {dim = 40}},
        {input_grads = true})
      net:forward{data = x, target = gout, lengths = len}
      net:zero_grads()
      net:backward()
      res[n] = {net:layer("output").output:clone(), net:grads():clone(),
        net:input_grad("data"):clone()}
    end
    for k, what in ipairs({"outputs", "parameter gradients", "input gradients"}) do
      H.check((res[1][k] - res[2][k]):abs():max() == 0,
        string.format("direction %d: %s differ between 1 and 2 threads", dir, what))
    end
    H.check(res[1][2]:abs():max() > 0, "no gradient")
  end
  rl.set_num_threads(threads)
end)

H.done()
