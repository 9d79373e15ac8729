-- Gradient checks (float64 central differences) of every layer class, alone and in networks,
-- with ragged lengths; and a check that a wrong backward is caught.
local H = dofile("tests/lua/harness.lua")

-- H.gradcheck(name, o) when the classes are registered (else a SKIP note).
local function gc(name, classes, o)
  if H.have_classes(classes, name) then H.gradcheck(name, o) end
end

local ragged = {T = 5, B = 3, lengths = {5, 2, 4}}
local function with(o, extra)
  local c = {}
  for k, v in pairs(ragged) do c[k] = v end
  for k, v in pairs(o) do c[k] = v end
  for k, v in pairs(extra or {}) do c[k] = v end
  return c
end

-- single layers
gc("copy", {"copy"}, with{layer = {class = "copy"}, in_dim = {2, 3}})
gc("layer_norm", {"layer_norm"}, with{layer = {class = "layer_norm"}, in_dim = 4})
gc("layer_norm epsilon", {"layer_norm"},
  with{layer = {class = "layer_norm", epsilon = 0.1}, in_dim = 3})
gc("linear identity", {"linear"}, with{layer = {class = "linear", n_out = 3}, in_dim = {2, 4}})
for _, act in ipairs({"tanh", "sigmoid", "softplus"}) do
  gc("linear " .. act, {"linear"},
    with{layer = {class = "linear", n_out = 3, activation = act}, in_dim = 4})
end
gc("linear no bias", {"linear"},
  with{layer = {class = "linear", n_out = 2, with_bias = false}, in_dim = 3})
gc("activation tanh", {"activation"},
  with{layer = {class = "activation", activation = "tanh"}, in_dim = {2, 3}})
gc("softmax ce", {"softmax"}, with{layer = {class = "softmax", n_out = 4, loss = "ce"}, in_dim = 3})
gc("softmax ce two inputs", {"softmax"},
  with{layer = {class = "softmax", n_out = 3, loss = "ce"}, in_dim = {2, 3}})
gc("softmax mse", {"softmax"}, with{layer = {class = "softmax", n_out = 3}, in_dim = 3})
gc("softmax ce loss_scale", {"softmax"},
  with{layer = {class = "softmax", n_out = 3, loss = "ce", loss_scale = 0.25}, in_dim = 3})
gc("lstm", {"lstm"}, with{layer = {class = "lstm", n_out = 3}, in_dim = 4})
gc("lstm direction -1", {"lstm"},
  with{layer = {class = "lstm", n_out = 3, direction = -1}, in_dim = 4})
gc("lstm two inputs, peepholes", {"lstm"},
  with{layer = {class = "lstm", n_out = 2, peepholes = true, forget_bias = 1}, in_dim = {2, 3}})
gc("lstm direction -1, peepholes", {"lstm"},
  with{layer = {class = "lstm", n_out = 3, direction = -1, peepholes = true}, in_dim = 2})
gc("window 3", {"window"}, with{layer = {class = "window", window = 3}, in_dim = 2})
gc("window left 2", {"window"}, with{layer = {class = "window", left = 2}, in_dim = {1, 2}})
gc("combine add", {"combine"}, with{layer = {class = "combine", kind = "add"}, in_dim = {3, 3}})
gc("combine concat", {"combine"},
  with{layer = {class = "combine", kind = "concat"}, in_dim = {2, 3}})
gc("combine mul", {"combine"}, with{layer = {class = "combine", kind = "mul"}, in_dim = {2, 2}})
gc("dropout eval", {"dropout"}, with{layer = {class = "dropout", dropout = 0.5}, in_dim = 3})
gc("dropout train (masks replayed)", {"dropout"},
  with({layer = {class = "dropout", dropout = 0.5}, in_dim = 3}, {train = true}))

-- networks
local blstm = {
  fw1 = {class = "lstm", n_out = 3, from = "data"},
  bw1 = {class = "lstm", n_out = 3, from = "data", direction = -1},
  fw2 = {class = "lstm", n_out = 3, from = {"fw1", "bw1"}},
  bw2 = {class = "lstm", n_out = 3, from = {"fw1", "bw1"}, direction = -1},
  output = {class = "softmax", from = {"fw2", "bw2"}, loss = "ce", target = "classes"},
}
gc("2-layer BLSTM network, softmax ce, ragged", {"lstm", "softmax"}, {
  network = blstm, extern_data = {data = {dim = 4}, classes = {dim = 3, sparse = true}},
  T = 6, B = 4, lengths = {6, 3, 1, 5},
})
gc("DESIGN.md example network", {"lstm", "softmax"}, {
  network = {
    fw = {class = "lstm", n_out = 4, from = "data"},
    bw = {class = "lstm", n_out = 4, from = "data", direction = -1},
    output = {class = "softmax", from = {"fw", "bw"}, loss = "ce", target = "classes"},
  },
  extern_data = {data = {dim = 5}, classes = {dim = 2, sparse = true}},
  T = 4, B = 3, lengths = {2, 4, 3}, max_params_per_tensor = 40,
})
-- a diamond (a layer read by two layers, and the input read three times): gradients summed
gc("diamond with layer_norm and copy", {"linear", "combine"}, with{
  network = {
    a = {class = "linear", n_out = 3, activation = "tanh"},
    n = {class = "layer_norm", from = "a"},
    c = {class = "copy", from = {"a", "data"}},
    s = {class = "combine", kind = "concat", from = {"n", "c", "data"}},
    output = {class = "linear", n_out = 2, from = "s", loss = "mse", target = "y"},
  },
  extern_data = {data = {dim = 2}, y = {dim = 2}},
})
-- two losses, one on a layer that also feeds another layer
gc("two losses, a loss layer feeding another", {"linear", "softmax"}, with{
  network = {
    h = {class = "linear", n_out = 3, activation = "tanh", loss = "mse", target = "y",
         loss_scale = 0.5},
    p = {class = "softmax", from = "h", loss = "ce", target = "classes", loss_scale = 2},
    output = {class = "linear", n_out = 3, from = "p", loss = "mse", target = "y"},
  },
  extern_data = {data = {dim = 2}, y = {dim = 3}, classes = {dim = 3, sparse = true}},
})
gc("lstm over window over dropout(eval)", {"lstm", "window", "dropout", "softmax"}, with{
  network = {
    d = {class = "dropout", dropout = 0.2},
    w = {class = "window", window = 3, from = "d"},
    l = {class = "lstm", n_out = 2, from = "w", direction = -1},
    output = {class = "softmax", n_out = 3, from = {"l", "d"}, loss = "ce", target = "classes"},
  },
  extern_data = {data = {dim = 2}, classes = {dim = 3, sparse = true}},
})

-- subsets of big tensors
H.test("max_params_per_tensor checks a subset", function()
  local r = rl.gradcheck{layer = {class = "layer_norm"}, in_dim = 6, max_params_per_tensor = 2,
    max_inputs = 5}
  H.check(r.per_param["layer.g"].checked == 2, "g: " .. r.per_param["layer.g"].checked)
  H.check(r.inputs.data.checked == 5, "inputs checked: " .. r.inputs.data.checked)
  H.check(r.n_checked == 9, "n_checked " .. r.n_checked)
  H.check(r.passed, "passed")
end)

-- a gradcheck must be able to fail: a Lua layer whose backward is off by a factor
rl.layers.register("test_wrong_grad", {
  init = function(self, opts, in_dims) return in_dims[1] end,
  params = function(self) return {{name = "a", shape = {self.in_dims[1]}, init = "ones"}} end,
  forward = function(self, inputs) return inputs[1] * self.params.a end,
  backward = function(self, grad_out, inputs)
    self.grads.a:add_((grad_out * inputs[1]):sum(1):sum(1))
    return {grad_out * self.params.a * 1.5}
  end,
})
H.test("a wrong input gradient fails the check", function()
  local r = rl.gradcheck{layer = {class = "test_wrong_grad"}, in_dim = 3}
  H.check(not r.passed, "passed although the input gradient is wrong")
  H.check(r.worst.tensor == "data", "worst is " .. tostring(r.worst.tensor))
  H.check(r.per_param["layer.a"].max_rel_error < 1e-6, "param a should be right")
  H.check(r.max_rel_error > 0.1, "rel error " .. r.max_rel_error)
end)
H.expect_error("assert = true raises on a wrong gradient", function()
  rl.gradcheck{layer = {class = "test_wrong_grad"}, in_dim = 3, assert = true}
end, "max relative error")

-- NaN must fail the check: math.max drops a NaN, so a layer whose backward gives NaN would pass
-- with max_rel_error 0
rl.layers.register("test_nan_grad", {
  init = function(self, opts, in_dims) return in_dims[1] end,
  params = function(self) return {{name = "a", shape = {self.in_dims[1]}, init = "ones"}} end,
  forward = function(self, inputs) return inputs[1] * self.params.a end,
  backward = function(self, grad_out, inputs)
    self.grads.a:add_(rl.full({self.in_dims[1]}, 0 / 0, self.dtype))
    return {grad_out * self.params.a}
  end,
})
H.test("a NaN parameter gradient fails the check", function()
  local r = rl.gradcheck{layer = {class = "test_nan_grad"}, in_dim = 3}
  H.check(not r.passed, "passed although the gradient is NaN")
  H.check(r.worst.tensor == "layer.a", "worst is " .. tostring(r.worst.tensor))
  H.check(r.max_rel_error == math.huge, "rel error " .. r.max_rel_error)
end)
H.expect_error("assert = true raises on a NaN gradient", function()
  rl.gradcheck{layer = {class = "test_nan_grad"}, in_dim = 3, assert = true}
end, "max relative error inf")

-- options that made every difference NaN (and the check pass), or that were ignored
for _, c in ipairs{
  {{eps = 0}, "eps must be a finite number > 0, got 0"},
  {{eps = 0 / 0}, "eps must be a finite number > 0"},
  {{eps = 1 / 0}, "eps must be a finite number > 0, got inf"},
  {{eps = -1e-6}, "eps must be a finite number > 0, got -1e-06"},
  {{floor = 0 / 0}, "floor must be a finite number > 0"},
  {{tol = 0 / 0}, "tol must be a finite number >= 0"},
  {{T = 0}, "T must be an integer >= 1, got 0"},
  {{B = 2.5}, "B must be an integer >= 1, got 2.5"},
  {{max_inputs = -1}, "max_inputs must be an integer >= 0, got -1"},
  {{tolerance = 1}, "unknown option 'tolerance'"},
} do
  local k, v = next(c[1])
  H.expect_error("gradcheck option " .. k .. " = " .. tostring(v), function()
    local o = {layer = {class = "linear", n_out = 2}, in_dim = 2}
    o[k] = v
    rl.gradcheck(o)
  end, "rl.gradcheck: " .. c[2])
end

H.done()
