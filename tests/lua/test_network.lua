-- The network builder: build errors, order, flat buffers, losses and masking, Lua layers.
local H = dofile("tests/lua/harness.lua")

-- Runs the test only when the C classes it needs are registered (else prints a note).
local function needs(classes, name, fn)
  if H.have_classes(classes, name) then H.test(name, fn) end
end

local function needs_error(classes, name, fn, pattern)
  if H.have_classes(classes, name) then H.expect_error(name, fn, pattern) end
end

local dense2 = {data = {dim = 2}}

---------------------------------------------------------------------------- build errors

H.expect_error("unknown class names the layer", function()
  rl.network({output = {class = "lstmm", n_out = 2}}, dense2)
end, "layer 'output': unknown class 'lstmm'")
H.expect_error("unknown class lists the known ones", function()
  rl.network({output = {class = "lstmm", n_out = 2}}, dense2)
end, "copy")
H.expect_error("missing class", function() rl.network({output = {from = "data"}}, dense2) end,
  "layer 'output': missing class")
H.expect_error("unknown from", function()
  rl.network({h = {class = "copy", from = "dta"}, output = {class = "copy", from = "h"}}, dense2)
end, "layer 'h' (class copy): unknown from 'dta'")
H.expect_error("a cycle is named", function()
  rl.network({
    a = {class = "copy", from = "b"}, b = {class = "copy", from = "a"},
    output = {class = "copy", from = "a"},
  }, dense2)
end, "a -> b -> a")
H.expect_error("a self-cycle", function()
  rl.network({output = {class = "copy", from = {"data", "output"}}}, dense2)
end, "layer 'output' (class copy): cycle in from: output -> output")
H.expect_error("unknown option names the key", function()
  rl.network({output = {class = "copy", n_outt = 3}}, dense2)
end, "layer 'output' (class copy): unknown option 'n_outt'")
H.expect_error("unknown option of a Lua layer", function()
  rl.network({output = {class = "layer_norm", epsilonn = 1}}, dense2)
end, "layer 'output' (class layer_norm): unknown option 'epsilonn'")
H.expect_error("a loss with no target", function()
  rl.network({output = {class = "copy", loss = "mse"}}, dense2)
end, "layer 'output' (class copy): loss 'mse' needs a target")
H.expect_error("a target not in extern_data", function()
  rl.network({output = {class = "copy", loss = "mse", target = "labels"}}, dense2)
end, "layer 'output' (class copy): target 'labels' is not in extern_data")
H.expect_error("an unknown loss", function()
  rl.network({output = {class = "copy", loss = "hinge", target = "y"}},
    {data = {dim = 2}, y = {dim = 2}})
end, "layer 'output' (class copy): unknown loss 'hinge'")
H.expect_error("ce on a non-softmax layer", function()
  rl.network({output = {class = "copy", loss = "ce", target = "c"}},
    {data = {dim = 2}, c = {dim = 2, sparse = true}})
end, "layer 'output' (class copy): loss 'ce' needs a softmax layer")
H.expect_error("mse against a target of another dim", function()
  rl.network({output = {class = "copy", loss = "mse", target = "y"}},
    {data = {dim = 2}, y = {dim = 3}})
end, "layer 'output' (class copy): target 'y' has dim 3")
H.expect_error("a sparse input cannot feed a layer", function()
  rl.network({output = {class = "copy", from = "c"}}, {data = {dim = 2}, c = {dim = 2, sparse = true}})
end, "layer 'output' (class copy): input 'c' is sparse")
H.expect_error("nothing to build", function()
  rl.network({h = {class = "copy"}}, dense2)
end, "nothing to build")
H.expect_error("a layer named like an input", function()
  rl.network({data = {class = "copy"}, output = {class = "copy"}}, dense2)
end, "layer 'data': the name is taken")
needs_error({"linear"}, "missing n_out", function()
  rl.network({output = {class = "linear"}}, dense2)
end, "layer 'output' (class linear): missing option n_out")
H.test("the C layer's own message names the layer once, not again at the Lua boundary", function()
  local ok, e = pcall(rl.network, {output = {class = "linear"}}, dense2)
  H.check(not ok)
  local _, n = tostring(e):gsub("layer 'output'", "")
  H.check(n == 1, tostring(e))
end)
needs_error({"linear"}, "an option of the wrong type", function()
  rl.network({output = {class = "linear", n_out = "3"}}, dense2)
end, "layer 'output' (class linear): option n_out must be a number")
needs_error({"combine"}, "a dimension mismatch", function()
  rl.network({output = {class = "combine", kind = "add", from = {"data", "x"}}},
    {data = {dim = 2}, x = {dim = 3}})
end, "layer 'output'")
needs_error({"lstm"}, "unknown lstm option", function()
  rl.network({output = {class = "lstm", n_outt = 3, n_out = 2}}, dense2)
end, "layer 'output' (class lstm): unknown option 'n_outt'")

---------------------------------------------------------------------------- order

H.test("topological order, only what the outputs need", function()
  local net = rl.network({
    output = {class = "copy", from = {"c", "b"}},
    c = {class = "copy", from = "a"},
    b = {class = "copy", from = {"a", "data"}},
    a = {class = "copy"},
    unused = {class = "copy"},
  }, dense2)
  H.check(table.concat(net.order, ",") == "a,c,b,output", table.concat(net.order, ","))
  local pos = {}
  for i, n in ipairs(net.order) do pos[n] = i end
  for _, n in ipairs(net.order) do
    local from = net.description[n].from or "data"
    if type(from) == "string" then from = {from} end
    for _, f in ipairs(from) do H.check(f == "data" or pos[f] < pos[n], n .. " before " .. f) end
  end
  H.check(pos.unused == nil, "unused layer was built")
  H.check(net:layer("output").n_out == 6, "n_out " .. net:layer("output").n_out)
end)

H.test("loss layers and is_output_layer are the roots", function()
  local net = rl.network({
    x = {class = "copy", is_output_layer = true},
    l = {class = "copy", from = "x", loss = "mse", target = "y"},
    output = {class = "copy"}, -- not built: there is a loss elsewhere
  }, {data = {dim = 2}, y = {dim = 2}})
  H.check(table.concat(net.order, ",") == "x,l", table.concat(net.order, ","))
end)

---------------------------------------------------------------------------- flat buffers

H.test("one flat buffer; layer weights are views of it", function()
  rl.manual_seed(5)
  local net = rl.network({
    n1 = {class = "layer_norm"},
    output = {class = "layer_norm", from = "n1", loss = "mse", target = "y"},
  }, {data = {dim = 3}, y = {dim = 3}}, {dtype = "float64"})
  H.check(net:num_params() == 12, "num_params " .. net:num_params())
  H.check(net:params():numel() == 12 and net:grads():numel() == 12, "flat sizes")
  local pl = net:param_list()
  H.check(#pl == 4 and pl[1].layer == "n1" and pl[1].name == "g" and pl[4].name == "b", "param_list")
  -- init: g ones, b zeros, in topological then param order
  local flat = net:params():totable()
  for i, v in ipairs({1, 1, 1, 0, 0, 0, 1, 1, 1, 0, 0, 0}) do H.near(flat[i], v, 0, "init " .. i) end
  -- writing the flat buffer changes the layer's views, and what forward computes
  net:params():narrow(1, 10, 3):fill_(7)
  H.near(net:layer("output").params.b[2], 7, 0, "view of b")
  H.near(pl[4].value[3], 7, 0, "param_list view")
  local x = rl.randn(2, 1, 3, "float64")
  net:forward{data = x, y = rl.zeros(2, 1, 3, "float64"), lengths = rl.tensor({2}, "int32")}
  local out = net:layer("output").output
  local s = out:sum() -- normalised rows sum to 0, so out = g * xhat + 7 sums to 7 per element
  H.near(s, 2 * 3 * 7, 1e-9, "output sum")
end)

needs({"linear"}, "C layer weights are views: zeroing W and setting b changes the output",
  function()
    local net = rl.network({output = {class = "linear", n_out = 2, loss = "mse", target = "y"}},
      {data = {dim = 3}, y = {dim = 2}})
    local v = net:layer("output")
    v.params.W:zero_()
    v.params.b:fill_(0.5)
    net:forward{data = rl.randn(4, 2, 3), y = rl.zeros(4, 2, 2), lengths = rl.tensor({4, 4}, "int32")}
    local o = net:layer("output").output
    H.near(o:min(), 0.5, 1e-7, "min")
    H.near(o:max(), 0.5, 1e-7, "max")
    -- and the C layer's param grads land in the flat gradient buffer
    net:backward()
    H.check(net:grads():abs():sum() > 0, "grads stayed zero")
    H.near(v.grads.b:sum() + v.grads.W:abs():sum(), net:grads():narrow(1, 7, 2):sum()
      + net:grads():narrow(1, 1, 6):abs():sum(), 1e-4, "views of the flat gradient buffer")
  end)

H.test("zero_grads, and backward accumulates", function()
  local net = rl.network({output = {class = "layer_norm", loss = "mse", target = "y"}},
    {data = {dim = 3}, y = {dim = 3}}, {dtype = "float64"})
  local batch = {data = rl.randn(3, 2, 3, "float64"), y = rl.randn(3, 2, 3, "float64"),
                 lengths = rl.tensor({3, 2}, "int32")}
  net:forward(batch)
  net:backward()
  local g1 = net:grads():clone()
  H.check(g1:abs():sum() > 0, "no gradient")
  net:forward(batch)
  net:backward()
  H.near((net:grads() - g1 * 2):abs():max(), 0, 1e-12, "second backward adds")
  net:zero_grads()
  H.near(net:grads():abs():sum(), 0, 0, "zero_grads")
end)

---------------------------------------------------------------------------- reproducibility

needs({"lstm", "softmax"}, "manual_seed gives reproducible weights", function()
  local desc = {
    fw = {class = "lstm", n_out = 4, from = "data"},
    bw = {class = "lstm", n_out = 4, from = "data", direction = -1},
    output = {class = "softmax", from = {"fw", "bw"}, loss = "ce", target = "classes"},
  }
  local ext = {data = {dim = 3}, classes = {dim = 2, sparse = true}}
  rl.manual_seed(42)
  local a = rl.network(desc, ext):params():clone()
  rl.manual_seed(42)
  local b = rl.network(desc, ext):params():clone()
  local c = rl.network(desc, ext, {seed = 42}):params():clone()
  rl.manual_seed(43)
  local d = rl.network(desc, ext):params()
  H.near((a - b):abs():max(), 0, 0, "same seed")
  H.near((a - c):abs():max(), 0, 0, "opts.seed")
  H.check((a - d):abs():max() > 0, "another seed gives other weights")
  H.check(a:abs():sum() > 0, "weights were initialised")
end)

---------------------------------------------------------------------------- losses

H.test("mse is summed over valid frames only (ragged lengths)", function()
  local net = rl.network({output = {class = "copy", loss = "mse", target = "y"}},
    {data = {dim = 2}, y = {dim = 2}}, {dtype = "float64"})
  local x, y = rl.randn(4, 3, 2, "float64"), rl.randn(4, 3, 2, "float64")
  local len = {4, 1, 3}
  local want = 0
  for b = 1, 3 do
    for t = 1, len[b] do
      for f = 1, 2 do want = want + (x[t][b][f] - y[t][b][f]) ^ 2 end
    end
  end
  local lengths = rl.tensor(len, "int32")
  local loss, err = net:forward{data = x, y = y, lengths = lengths}
  H.near(loss, want, 1e-9, "loss")
  H.near(err, 0, 0, "errors")
  H.near(net.n_frames, 8, 0, "n_frames")
  -- padded frames do not matter
  x[2][2]:fill_(100)
  x[4][3]:fill_(-100)
  H.near((net:forward{data = x, y = y, lengths = lengths}), want, 1e-9, "padding changed the loss")
end)

needs({"softmax"}, "ce: loss and frame errors against a reference, padding ignored", function()
  rl.manual_seed(3)
  local net = rl.network({output = {class = "softmax", n_out = 3, loss = "ce", target = "c"}},
    {data = {dim = 2}, c = {dim = 3, sparse = true}}, {dtype = "float64"})
  local x = rl.randn(3, 2, 2, "float64")
  local c = rl.tensor({{0, 2}, {1, 1}, {2, 0}}, "int32")
  local lengths = rl.tensor({3, 2}, "int32")
  local loss, nerr = net:forward{data = x, c = c, lengths = lengths}
  -- reference from the weights: p = softmax(x W + b)
  local v = net:layer("output")
  local W, b = v.params.W, v.params.b
  local want, werr = 0, 0
  for _, tb in ipairs({{1, 1}, {2, 1}, {3, 1}, {1, 2}, {2, 2}}) do
    local t, bb = tb[1], tb[2]
    local z, zmax, best = {}, -math.huge, 0
    for k = 1, 3 do
      z[k] = b[k] + x[t][bb][1] * W[1][k] + x[t][bb][2] * W[2][k]
      if z[k] > zmax then zmax, best = z[k], k end
    end
    local s = 0
    for k = 1, 3 do s = s + math.exp(z[k] - zmax) end
    local target = c[t][bb] + 1
    want = want - (z[target] - zmax - math.log(s))
    if best ~= target then werr = werr + 1 end
  end
  H.near(loss, want, 1e-9, "ce loss")
  H.near(nerr, werr, 0, "frame errors")
  H.near(net.n_frames, 5, 0, "n_frames")
  -- an out-of-range class on a padded frame is ignored
  c[3][2] = 7
  H.near((net:forward{data = x, c = c, lengths = lengths}), want, 1e-9, "padded target")
end)

-- The ce checks name the layer with its class, in float32 (the fused CPU path) and float64
-- (rl_loss_ce), like every other layer error.
for _, dt in ipairs({"float32", "float64"}) do
  local function ce_net()
    return rl.network({output = {class = "softmax", n_out = 3, loss = "ce", target = "c"}},
      {data = {dim = 2}, c = {dim = 3, sparse = true}}, {dtype = dt})
  end
  local lengths = rl.tensor({3, 2}, "int32")
  needs_error({"softmax"}, "ce: a target outside 0..C-1 names the layer and class (" .. dt .. ")",
    function()
      local c = rl.tensor({{0, 2}, {1, 7}, {2, 0}}, "int32")
      ce_net():forward{data = rl.randn(3, 2, 2, dt), c = c, lengths = lengths}
    end, "layer 'output' (class softmax): target 7 at frame 2 of sequence 2 (1-based) is outside 0..2")
end

H.test("loss_scale scales the loss", function()
  local ext = {data = {dim = 2}, y = {dim = 2}}
  local batch = {data = rl.randn(2, 2, 2), y = rl.randn(2, 2, 2), lengths = rl.tensor({2, 1}, "int32")}
  local l1 = rl.network({output = {class = "copy", loss = "mse", target = "y"}}, ext):forward(batch)
  local l2 = rl.network({output = {class = "copy", loss = "mse", target = "y", loss_scale = 0.5}},
    ext):forward(batch)
  H.near(l2, l1 * 0.5, 1e-5, "scaled")
end)

---------------------------------------------------------------------------- batches

local function copy_net() return rl.network({output = {class = "copy", loss = "mse", target = "y"}},
  {data = {dim = 2}, y = {dim = 2}}) end
local function batch(over)
  local b = {data = rl.randn(3, 2, 2), y = rl.randn(3, 2, 2), lengths = rl.tensor({3, 2}, "int32")}
  for k, v in pairs(over) do b[k] = v end
  return b
end
H.expect_error("batch lacks a key", function()
  copy_net():forward{data = rl.randn(3, 2, 2), lengths = rl.tensor({3, 2}, "int32")}
end, "the batch lacks 'y'")
H.expect_error("batch lacks lengths", function() copy_net():forward{data = rl.randn(3, 2, 2)} end,
  "batch.lengths must be a (B) int32 tensor")
H.expect_error("lengths not int32", function()
  copy_net():forward(batch{lengths = rl.tensor({3, 2})})
end, "batch.lengths must be a (B) int32 tensor")
H.expect_error("lengths out of range", function()
  copy_net():forward(batch{lengths = rl.tensor({4, 2}, "int32")})
end, "within 1..3")
H.expect_error("data dim mismatch", function()
  copy_net():forward(batch{data = rl.randn(3, 2, 5)})
end, "batch.data must be a (T, 2, 2) float32 tensor")
H.expect_error("data dtype mismatch", function()
  copy_net():forward(batch{data = rl.randn(3, 2, 2, "float64")})
end, "float32")
H.expect_error("T mismatch", function() copy_net():forward(batch{y = rl.randn(4, 2, 2)}) end,
  "T = ")
H.expect_error("backward needs a forward", function() copy_net():backward() end,
  "needs a net:forward")
H.expect_error("backward without a loss", function()
  local net = rl.network({output = {class = "copy"}}, dense2)
  net:forward{data = rl.randn(2, 1, 2), lengths = rl.tensor({2}, "int32")}
  net:backward()
end, "has no loss")
H.expect_error("net:layer of an unknown name", function() copy_net():layer("nope") end,
  "no layer 'nope'")

---------------------------------------------------------------------------- Lua layers

-- out = x * a + c, with a (F) ones and c a scalar offset option
local Scale = {}
function Scale:init(opts, in_dims)
  self.offset = opts.offset or 0
  return in_dims[1]
end
function Scale:params() return {{name = "a", shape = {self.in_dims[1]}, init = "ones"}} end
function Scale:forward(inputs) return inputs[1] * self.params.a + self.offset end
function Scale:backward(grad_out, inputs)
  self.grads.a:add_((grad_out * inputs[1]):sum(1):sum(1))
  return {grad_out * self.params.a}
end
rl.layers.register("test_scale", Scale)

H.test("a Lua layer in a network like a C one", function()
  local net = rl.network({
    s = {class = "test_scale", offset = 1},
    n = {class = "layer_norm", from = "s"},
    output = {class = "copy", from = {"n", "s"}, loss = "mse", target = "y"},
  }, {data = {dim = 2}, y = {dim = 4}}, {dtype = "float64"})
  H.check(net:num_params() == 6, "num_params")
  local x = rl.randn(2, 2, 2, "float64")
  net:forward{data = x, y = rl.zeros(2, 2, 4, "float64"), lengths = rl.tensor({2, 2}, "int32")}
  local s = net:layer("s").output
  H.near((s - (x + 1)):abs():max(), 0, 1e-12, "test_scale forward")
  net:layer("s").params.a:fill_(2)
  net:forward{data = x, y = rl.zeros(2, 2, 4, "float64"), lengths = rl.tensor({2, 2}, "int32")}
  H.near((net:layer("s").output - (x * 2 + 1)):abs():max(), 0, 1e-12, "weights are views")
  net:backward()
  H.check(net:layer("s").grads.a:abs():sum() > 0, "gradient reached the Lua layer")
  H.check(rl.layers.classes()[1] ~= nil, "classes")
  local found = false
  for _, c in ipairs(rl.layers.classes()) do found = found or c == "test_scale" end
  H.check(found, "test_scale listed")
end)

H.expect_error("registering a C class name", function() rl.layers.register("copy", Scale) end,
  "built-in C class")
H.expect_error("registering twice", function() rl.layers.register("test_scale", Scale) end,
  "already registered")
H.test("replace = true replaces", function()
  rl.layers.register("test_scale", Scale, {replace = true})
end)
H.expect_error("a class without forward", function()
  rl.layers.register("test_incomplete", {init = function() return 1 end})
end, "lacks a function forward")

rl.layers.register("test_boom", {
  init = function(self, opts, in_dims) return in_dims[1] end,
  forward = function(self, inputs) error("kaboom in forward") end,
  backward = function(self, grad_out) return {grad_out} end,
})
H.expect_error("an error inside a Lua layer names the layer and the class", function()
  local net = rl.network({bad = {class = "test_boom"}, output = {class = "copy", from = "bad"}},
    dense2)
  net:forward{data = rl.randn(2, 1, 2), lengths = rl.tensor({2}, "int32")}
end, "layer 'bad' (class test_boom): forward: ")
H.expect_error("... and keeps the original message", function()
  local net = rl.network({output = {class = "test_boom"}}, dense2)
  net:forward{data = rl.randn(2, 1, 2), lengths = rl.tensor({2}, "int32")}
end, "kaboom in forward")
H.expect_error("an error in init names the layer", function()
  rl.network({output = {class = "layer_norm", n_out = 5}}, dense2)
end, "layer 'output' (class layer_norm): init: n_out = 5 differs")
rl.layers.register("test_badshape", {
  init = function(self, opts, in_dims) return 3 end,
  forward = function(self, inputs) return inputs[1] end,
  backward = function(self, grad_out) return {grad_out} end,
})
H.expect_error("a Lua forward of the wrong shape", function()
  local net = rl.network({output = {class = "test_badshape"}}, dense2)
  net:forward{data = rl.randn(2, 1, 2), lengths = rl.tensor({2}, "int32")}
end, "layer 'output' (class test_badshape): forward must return")

---------------------------------------------------------------------------- the C binding

H.test("layer objects: params, fields, tostring", function()
  local l = rl.layers.create("copy", "c", {class = "copy"}, {2, 3}, "float32")
  H.check(l.n_out == 5 and l.n_in == 2 and l.class == "copy" and l.name == "c", "fields")
  H.check(#l:params() == 0 and l.is_loss == false, "params")
  H.check(tostring(l):find("copy", 1, true), "tostring")
  local out = l:forward({rl.ones(2, 1, 2), rl.zeros(2, 1, 3)}, rl.tensor({2}, "int32"), true)
  H.check(out:size(3) == 5 and out:sum() == 4, "forward")
  local g1, g2 = rl.zeros(2, 1, 2), rl.zeros(2, 1, 3)
  l:backward(rl.ones(2, 1, 5), {g1, false})
  H.check(g1:sum() == 4, "backward")
end)
H.expect_error("backward with a wrongly shaped grad buffer", function()
  local l = rl.layers.create("copy", "c", {class = "copy"}, {2}, "float32")
  l:forward({rl.ones(2, 1, 2)}, rl.tensor({2}, "int32"), true)
  l:backward(rl.ones(2, 1, 2), {rl.zeros(2, 1, 3)})
end, "layer 'c' (class copy): grad_in[1] must be")
needs({"lstm"}, "lstm initial and final state", function()
  rl.manual_seed(1)
  local net = rl.network({output = {class = "lstm", n_out = 2, loss = "mse", target = "y"}},
    {data = {dim = 3}, y = {dim = 2}})
  local l = net:layer("output").object
  local x, len = rl.randn(4, 2, 3), rl.tensor({4, 2}, "int32")
  net:forward{data = x, y = rl.zeros(4, 2, 2), lengths = len}
  local h = l:final_state()
  local o = net:layer("output").output
  H.near((h:select(1, 1) - o[4][1]):abs():max(), 0, 1e-6, "final state of sequence 1")
  H.near((h:select(1, 2) - o[2][2]):abs():max(), 0, 1e-6, "final state of sequence 2 (length 2)")
end)

needs({"lstm", "softmax"}, "the DESIGN.md example network runs", function()
  rl.manual_seed(1)
  local net = rl.network({
    fw = {class = "lstm", n_out = 32, from = "data"},
    bw = {class = "lstm", n_out = 32, from = "data", direction = -1},
    output = {class = "softmax", from = {"fw", "bw"}, loss = "ce", target = "classes"},
  }, {data = {dim = 9}, classes = {dim = 2, sparse = true}})
  local x = rl.randn(7, 3, 9)
  local y = (rl.rand(7, 3) * 2):floor():int()
  local len = rl.tensor({7, 5, 2}, "int32")
  local loss, nerr = net:forward{data = x, classes = y, lengths = len}
  H.check(loss > 0 and nerr >= 0 and nerr <= 14, "loss " .. loss .. " errors " .. nerr)
  H.check(net.n_frames == 14, "n_frames")
  net:backward()
  H.check(net:grads():abs():sum() > 0, "gradients")
  local loss2 = net:forward({data = x, classes = y, lengths = len}, {train = false})
  H.near(loss2, loss, 1e-4, "eval forward")
end)

H.test("lstm forget_bias is the initial f block of b", function()
  local net = rl.network({
    l = {class = "lstm", n_out = 3, from = "data", forget_bias = 1.5},
    output = {class = "softmax", from = "l", loss = "ce", target = "classes"},
  }, {data = {dim = 2}, classes = {dim = 2, sparse = true}})
  local b = net:layer("l").params.b
  H.check(b:narrow(1, 4, 3):eq(1.5):sum() == 3, "f block holds forget_bias")
  H.check(b:narrow(1, 1, 3):abs():sum() == 0 and b:narrow(1, 7, 6):abs():sum() == 0,
    "the other blocks start at 0")
end)

-- A Lua layer that calls its own network's forward, backward, search or to while the network
-- runs it: an error naming the layer (net:forward recursed until the stack overflowed, a
-- forward inside backward silently overwrote the outputs the backward was using); the
-- network works normally after it.
do
  local net, batch, call
  rl.layers.register("test_reenter", {
    init = function(self, opts, in_dims) return in_dims[1] end,
    params = function(self) return {} end,
    forward = function(self, inputs)
      if call and call[1] == "forward" then call[2]() end
      return inputs[1] * 1
    end,
    backward = function(self, grad_out)
      if call and call[1] == "backward" then call[2]() end
      return {grad_out * 1}
    end,
  })
  local ds = rl.dataset({class = "12ax", num_seqs = 4, seed = 1})
  net = rl.network({fw = {class = "lstm", n_out = 4}, re = {class = "test_reenter", from = "fw"},
    output = {class = "softmax", from = "re", loss = "ce", target = "classes"}}, ds:extern_data())
  batch = rl.batches(ds, {batch_size = 100})()
  local function expect(phase, name, fn, what)
    call = {phase, fn}
    H.expect_error("re-entrant " .. name .. " from a layer's " .. phase, function()
      net:forward(batch)
      net:backward()
    end, string.format("layer 're' (class test_reenter): %s: %s: re-entrant call while "
      .. "net:%s runs layer 're' (class test_reenter)", phase, name, phase))
    call = nil
  end
  expect("forward", "net:forward", function() net:forward(batch) end)
  expect("forward", "net:backward", function() net:backward() end)
  expect("forward", "net:search", function() net:search(batch) end)
  expect("forward", "net:to", function() net:to("cpu") end)
  expect("backward", "net:forward", function() net:forward(batch) end)
  H.test("the network works after a re-entrant call", function()
    local l = net:forward(batch)
    net:backward()
    H.check(l == l and l > 0 and net:grads():abs():sum() > 0, "loss " .. l)
    local other = rl.network({fw = {class = "lstm", n_out = 4},
      output = {class = "softmax", from = "fw", loss = "ce", target = "classes"}},
      ds:extern_data())
    -- another network may run inside a layer
    call = {"forward", function() other:forward(batch) end}
    net:forward(batch)
    call = nil
  end)
end

-- The tensors a network hands out are shares of its buffers (as Torch7's and PyTorch's
-- parameters() give views): closing one releases only that reference. Closing the network's
-- own params made net:to, rl.optimizer and rl.save_checkpoint fail ('the tensor was freed').
H.test("closing the tensors a network hands out leaves the network whole", function()
  local ds = rl.dataset({class = "12ax", num_seqs = 4, seed = 1})
  local net = rl.network({fw = {class = "lstm", n_out = 4},
    output = {class = "softmax", from = "fw", loss = "ce", target = "classes"}},
    ds:extern_data(), {input_grads = true})
  local b = rl.batches(ds, {batch_size = 100})()
  local l0 = net:forward(b)
  net:backward()
  local before = net:params():clone()
  do
    local p <close> = net:params()
    local g <close> = net:grads()
    local first = net:param_list()[1]
    local v <close> = first.value
    local gv <close> = first.grad
    local view = net:layer("fw")
    local lp <close> = view.params[first.name]
    local lo <close> = view.output
    local dx <close> = net:input_grad("data")
    p[1] = p[1] + 0 -- a share writes the network's buffer
  end
  collectgarbage()
  H.check((net:params() - before):abs():max() == 0, "the parameters changed")
  net:zero_grads()
  local l1 = net:forward(b)
  net:backward()
  H.check(l1 == l0 and net:grads():abs():sum() > 0, string.format("loss %g vs %g", l1, l0))
  local opt = rl.optimizer({class = "sgd"}, net:params(), net:grads())
  opt:step(0.1)
  H.check((net:params() - before):abs():max() > 0, "the step reached the network")
  local dir = H.tmpdir()
  rl.save_checkpoint(dir .. "/net.h5", {net = net})
  H.check(net:to("cpu") == net and rl.load_checkpoint(dir .. "/net.h5").epoch ~= nil,
    "save and load")
  H.rm_rf(dir)
  -- a share sees the network's values and writes them
  local p = net:params()
  p[2] = 7
  H.check(net:param_list()[1].value:view(-1)[2] == 7, "a share is the network's buffer")
end)

-- params = flat: a second network on the first one's parameters (the C API's sessions), shared
-- and not initialised; a forward (plain, carried state, bf16) writes no parameter.
needs({"lstm", "gru", "linear", "softmax"}, "params: shared parameters, forward writes none",
  function()
  local desc = {l1 = {class = "lstm", n_out = 5}, g = {class = "gru", n_out = 4, from = "l1"},
    h = {class = "linear", n_out = 3, activation = "tanh", from = "g"},
    output = {class = "softmax", n_out = 3, from = "h"}}
  local a = rl.network(desc, {data = {dim = 2}})
  local flat = a:params()
  local before = flat:clone()
  local b = rl.network(desc, {data = {dim = 2}}, {params = flat})
  local x, len = rl.randn(6, 2, 2), rl.tensor({6, 4}, "int32")
  a:forward({data = x, lengths = len}, {train = false})
  b:forward({data = x, lengths = len}, {train = false})
  H.check((a:layer("output").output - b:layer("output").output):abs():max() == 0,
    "the same outputs")
  b:forward({data = x, lengths = len, state_from = {0, 0}}, {train = false})
  b:forward({data = x, lengths = len, state_from = {1, 2}}, {train = false})
  b:set_precision("bf16")
  b:forward({data = x, lengths = len}, {train = false})
  H.check((flat - before):abs():max() == 0, "a forward wrote a parameter")
  flat[1] = 3
  H.check(b:param_list()[1].value:view(-1)[1] == 3, "the buffer is shared")
  -- its gradients start at zero and backward computes them as the first network's
  H.check(b:grads():abs():max() == 0, "the gradients start at zero")
  local loss = {output = {class = "softmax", n_out = 3, from = "h", loss = "ce",
    target = "classes"}}
  for k, v in pairs(desc) do if k ~= "output" then loss[k] = v end end
  local ext = {data = {dim = 2}, classes = {dim = 3, sparse = true}}
  local c = rl.network(loss, ext)
  local d = rl.network(loss, ext, {params = c:params()})
  local batch = {data = x, lengths = len, classes = rl.tensor({{0, 1}, {2, 0}, {1, 1}, {0, 2},
    {1, 0}, {2, 2}}, "int32")}
  c:forward(batch)
  c:backward()
  d:forward(batch)
  d:backward()
  H.check((c:grads() - d:grads()):abs():max() == 0 and c:grads():abs():max() > 0,
    "the same gradients")
end)
needs_error({"linear"}, "params of the wrong size", function()
  rl.network({output = {class = "linear", n_out = 2}}, dense2, {params = rl.zeros(5)})
end, "params must be a contiguous 1-D float32 CPU tensor of the network's 6 parameters")
needs_error({"linear"}, "params of the wrong dtype", function()
  rl.network({output = {class = "linear", n_out = 2}}, dense2, {params = rl.zeros(6, "float64")})
end, "got float64")

H.done()
