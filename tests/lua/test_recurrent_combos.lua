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

H.done()
