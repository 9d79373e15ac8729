-- The options of the recurrent driver (layers/recurrent.h) that one cell's table turns on
-- (n_proj, layer_norm) combined with the ones every cell takes (weight_dropout, rec_dropout):
-- float64 gradient checks in training (rl.gradcheck resets the generator, so the masks repeat),
-- both directions, ragged batches; U's gradient goes through the weight_dropout mask also where
-- the recurrent part is normalised apart (layer_norm). Options a cell does not take are errors
-- naming the layer and the option.
local H = dofile("tests/lua/harness.lua")

local function passed(r)
  H.check(r.passed, string.format("max relative error %.3g", r.max_rel_error))
end

-- gains and b_c off their initial 1 and 0, so that their gradients are checked where they matter
local function shake(net)
  for _, p in ipairs(net:param_list()) do
    if p.name:match("^g_") or p.name == "b_c" then
      p.value:copy_(rl.randn(p.value:size(1), "float64") * 0.4 + 0.8)
    end
  end
end

for _, dir in ipairs{1, -1} do
  H.test("gradcheck lstm n_proj with weight_dropout, direction " .. dir, function()
    passed(rl.gradcheck{layer = {class = "lstm", n_out = 5, n_proj = 3, direction = dir,
      weight_dropout = 0.4}, in_dim = 3, train = true, B = 3})
  end)
  H.test("gradcheck lstm layer_norm with weight_dropout, direction " .. dir, function()
    passed(rl.gradcheck{layer = {class = "lstm", n_out = 4, direction = dir, layer_norm = true,
      weight_dropout = 0.4}, in_dim = 3, train = true, init = shake})
  end)
  H.test("gradcheck gru layer_norm with weight_dropout, direction " .. dir, function()
    passed(rl.gradcheck{layer = {class = "gru", n_out = 4, direction = dir, layer_norm = true,
      weight_dropout = 0.4}, in_dim = 3, train = true, init = shake})
  end)
end

H.test("gradcheck lstm n_proj, layer_norm, weight_dropout and rec_dropout together", function()
  passed(rl.gradcheck{layer = {class = "lstm", n_out = 5, n_proj = 2, layer_norm = true,
    weight_dropout = 0.3, rec_dropout = 0.3}, in_dim = 3, train = true, init = shake})
end)

for _, c in ipairs{
  {{class = "gru", n_proj = 2}, "(class gru): unknown option 'n_proj'"},
  {{class = "janet", n_proj = 2}, "(class janet): unknown option 'n_proj'"},
  {{class = "janet", layer_norm = true}, "(class janet): unknown option 'layer_norm'"},
} do
  H.expect_error("an option the cell does not take: " .. c[2], function()
    local d = {n_out = 4, from = "data", is_output_layer = true}
    for k, v in pairs(c[1]) do d[k] = v end
    local ok, err = pcall(rl.network, {enc = d}, {data = {dim = 3}})
    assert(not ok)
    error(tostring(err), 0)
  end, c[2])
end


-- A bidirectional pair runs its two layers on two threads at once (network.lua, forward_pair);
-- layers that draw masks must still draw in layer order, or the masks would depend on which
-- thread reached the generator first. Here the second layer is much smaller, so on two threads
-- at once it would draw first: 20 training forwards on 2 threads must give the outputs of one
-- on 1 thread, bit for bit.
H.test("masks of a bidirectional pair: the same bits on 1 and 2 threads, every time", function()
  local T, B, F = 40, 8, 64
  local desc = {
    fw = {class = "lstm", n_out = 256, zoneout = {cell = 0.3, hidden = 0.2}, rec_dropout = 0.2},
    bw = {class = "lstm", n_out = 3, zoneout = {hidden = 0.4}, weight_dropout = 0.3,
      direction = -1},
    output = {class = "softmax", from = {"fw", "bw"}, loss = "ce", target = "classes"},
  }
  local ext = {data = {dim = F}, classes = {dim = 5, sparse = true}}
  rl.manual_seed(101)
  local y, lens = {}, {}
  for t = 1, T do
    y[t] = {}
    for b = 1, B do y[t][b] = (t * 7 + b * 3) % 5 end
  end
  for b = 1, B do lens[b] = T - 3 * (b - 1) end
  local bt = {lengths = rl.tensor(lens, "int32"), data = rl.randn(T, B, F),
    classes = rl.tensor(y, "int32")}
  local threads = rl.get_num_threads()
  local function outputs(n)
    rl.set_num_threads(n)
    rl.manual_seed(7)
    local net = rl.network(desc, ext)
    rl.manual_seed(9)
    net:forward(bt)
    return net:layer("fw").output:clone(), net:layer("bw").output:clone()
  end
  local ok, err = pcall(function()
    local f1, b1 = outputs(1)
    for i = 1, 20 do
      local f2, b2 = outputs(2)
      H.check((f2 - f1):abs():max() == 0 and (b2 - b1):abs():max() == 0,
        "run " .. i .. " on 2 threads differs from the run on 1")
    end
  end)
  rl.set_num_threads(threads)
  if not ok then error(err, 0) end
end)

H.done()
