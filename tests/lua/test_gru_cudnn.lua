-- The gru's impl option from Lua: impl = "cudnn" takes cuDNN on CUDA tensors and runs the layer's
-- own kernels where cuDNN cannot serve, here on the CPU, where a bidirectional network on ragged
-- lengths must give exactly the numbers of impl = "own" (outputs, loss, every gradient, the
-- input gradient) with the same parameters, so a checkpoint trained either way runs either way.
-- A bad impl is a catchable error naming the layer. (The cuDNN path itself on a GPU:
-- tests/gpu/test_gru_parity.c.)
local H = dofile("tests/lua/harness.lua")

local EXT = {data = {dim = 3}, classes = {dim = 4, sparse = true}}
local function desc(impl)
  return {
    fw = {class = "gru", n_out = 3, impl = impl},
    bw = {class = "gru", n_out = 2, direction = -1, impl = impl},
    output = {class = "softmax", from = {"fw", "bw"}, loss = "ce", target = "classes"},
  }
end

local function run(impl, bt)
  rl.manual_seed(5)
  local net = rl.network(desc(impl), EXT, {input_grads = true})
  local loss = net:forward(bt)
  net:zero_grads()
  net:backward()
  return net, loss
end

H.test("gru impl = cudnn on the CPU: the own kernels, the same numbers", function()
  rl.manual_seed(9)
  local bt = {data = rl.randn(5, 3, 3), classes = rl.tensor({{0, 1, 2}, {3, 0, 1}, {2, 3, 0},
    {1, 2, 3}, {0, 1, 2}}, "int32"), lengths = rl.tensor({5, 2, 4}, "int32")}
  local own, lo = run("own", bt)
  local dnn, ld = run("cudnn", bt)
  H.check(lo == ld, string.format("loss %.9g vs %.9g", lo, ld))
  for _, name in ipairs{"fw", "bw", "output"} do
    H.check((own:layer(name).output - dnn:layer(name).output):abs():max() == 0, name .. " output")
  end
  H.check((own:params() - dnn:params()):abs():max() == 0, "the same parameters")
  H.check((own:grads() - dnn:grads()):abs():max() == 0, "parameter gradients")
  H.check((own:input_grad("data") - dnn:input_grad("data")):abs():max() == 0, "input gradient")
end)

H.expect_error("gru with impl = \"fast\"", function()
  rl.network({g = {class = "gru", n_out = 3, impl = "fast", is_output_layer = true}},
    {data = {dim = 3}})
end, "layer 'g' (class gru): impl = \"fast\"")

H.done()
