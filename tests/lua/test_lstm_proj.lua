-- lstm with n_proj = P (LSTMP, docs/layers.md `lstm`): float64 gradient checks (both directions,
-- ragged, peepholes, rec_dropout, several inputs, inside a rec unit), outputs and final states
-- equal to PyTorch's nn.LSTM(proj_size = P) and to a plain nn.LSTM with their weights converted
-- (the numbers of tests/lua/lstm_proj_torch_ref.py), the float32 packed and threaded paths
-- against float64 and across thread counts, checkpoints (round trip; a projection shape that
-- disagrees with the description), and bad input naming the layer and the option.
local H = dofile("tests/lua/harness.lua")

local function passed(r)
  H.check(r.passed, string.format("max relative error %.3g", r.max_rel_error))
end

for _, dir in ipairs{1, -1} do
  for _, peep in ipairs{false, true} do
    H.test(string.format("gradcheck lstm n_proj, direction %d, peepholes %s", dir, peep), function()
      local r = rl.gradcheck{layer = {class = "lstm", n_out = 5, n_proj = 3, direction = dir,
        peepholes = peep, forget_bias = 0.5}, in_dim = {4, 2}, T = 5, B = 3, lengths = {5, 2, 4}}
      passed(r)
      H.check(r.per_param["layer.R"] and r.per_param["layer.R"].checked == 15, "R not checked")
    end)
  end
  H.test("gradcheck lstm n_proj with rec_dropout, direction " .. dir, function()
    passed(rl.gradcheck{layer = {class = "lstm", n_out = 4, n_proj = 2, direction = dir,
      rec_dropout = 0.4}, in_dim = 3, train = true, lengths = {5, 1, 3}})
  end)
end

H.test("gradcheck: bidirectional LSTMP pair under a softmax, ragged", function()
  passed(rl.gradcheck{
    network = {
      fw = {class = "lstm", n_out = 4, n_proj = 2, from = "data"},
      bw = {class = "lstm", n_out = 4, n_proj = 3, from = "data", direction = -1},
      output = {class = "softmax", from = {"fw", "bw"}, loss = "ce", target = "classes"},
    },
    extern_data = {data = {dim = 3}, classes = {dim = 4, sparse = true}},
    T = 6, B = 3, lengths = {6, 2, 4},
  })
end)

H.test("gradcheck: LSTMP inside a rec unit, reading its own previous output, ragged", function()
  passed(rl.gradcheck{
    network = {
      dec = {class = "rec", from = "data", unit = {
        s = {class = "lstm", n_out = 4, n_proj = 2, peepholes = true,
          from = {"data:source", "prev:s"}},
        output = {class = "linear", activation = "tanh", n_out = 2, from = {"s", "prev:output"}},
      }},
      output = {class = "copy", from = "dec", loss = "mse", target = "target"},
    },
    extern_data = {data = {dim = 3}, target = {dim = 2}},
    T = 5, B = 3, lengths = {5, 2, 4},
  })
end)

-- A rec unit runs the layer one step at a time: the same numbers as the layer over the sequence.
H.test("a rec unit of one LSTMP equals the LSTMP layer", function()
  local ext = {data = {dim = 3}}
  rl.manual_seed(4)
  local a = rl.network({output = {class = "lstm", n_out = 5, n_proj = 2, from = "data",
    is_output_layer = true}}, ext, {dtype = "float64"})
  local b = rl.network({output = {class = "rec", from = "data", is_output_layer = true,
    unit = {output = {class = "lstm", n_out = 5, n_proj = 2, from = "data:source"}}}}, ext,
    {dtype = "float64"})
  b:params():copy_(a:params())
  local batch = {data = rl.randn(6, 3, 3, "float64"), lengths = rl.tensor({6, 3, 5}, "int32")}
  a:forward(batch)
  b:forward(batch)
  local oa, ob, err = a:layer("output").output:totable(), b:layer("output").output:totable(), 0
  for bb, n in ipairs(batch.lengths:totable()) do -- the valid frames (a unit leaves padding as is)
    for t = 1, n do
      for j = 1, 2 do err = math.max(err, math.abs(oa[t][bb][j] - ob[t][bb][j])) end
    end
  end
  H.near(err, 0, 1e-12, "outputs")
end)

-- PyTorch: W = weight_ih_l0^T, U = weight_hh_l0^T, b = bias_ih_l0 + bias_hh_l0,
-- R = weight_hr_l0^T, as a user converting a model writes it: the LSTMP of the reference and its
-- plain LSTM (ref.plain: its own weights and h0, no projection).
local ref = dofile("tests/lua/lstm_proj_torch_ref.lua")
for _, case in ipairs{{"proj_size LSTM", ref, ref.P}, {"plain LSTM", ref.plain, nil}} do
  local what, m, P = table.unpack(case)
  for _, dt in ipairs{"float64", "float32"} do
    for _, dir in ipairs{1, -1} do
      H.test(string.format("outputs and final states equal PyTorch's %s (%s, direction %d)", what,
        dt, dir), function()
        local net = rl.network({output = {class = "lstm", n_out = ref.H, n_proj = P,
          direction = dir, from = "data", is_output_layer = true}}, {data = {dim = ref.F}},
          {dtype = dt})
        local p = net:layer("output").params
        local function t(v) return rl.tensor(v, "float64") end
        p.W:copy_(t(m.weight_ih_l0):t())
        p.U:copy_(t(m.weight_hh_l0):t())
        p.b:copy_(t(m.bias_ih_l0) + t(m.bias_hh_l0))
        if P then p.R:copy_(t(m.weight_hr_l0):t()) end
        local l = net:layer("output").object
        l:set_initial_state(t(m.h0):to(dt), t(ref.c0):to(dt))
        net:forward{data = t(ref.x):to(dt), lengths = rl.tensor(ref.lengths, "int32")}
        local want = dir > 0 and m.fw or m.bw
        local tol = dt == "float64" and 1e-12 or 2e-6
        local h, c = l:final_state()
        H.near((net:layer("output").output:double() - t(want.out)):abs():max(), 0, tol, "output")
        H.near((h:double() - t(want.hT)):abs():max(), 0, tol, "final h")
        H.near((c:double() - t(want.cT)):abs():max(), 0, tol, "final c")
        l:set_initial_state(nil)
      end)
    end
  end
end

-- float32 runs the packed products (AVX2/AVX-512) and, with B >= 16 and 2 threads, row parts:
-- the same numbers as float64 within float32's rounding, and the same bits on 1 and 2 threads.
H.test("LSTMP float32 (packed, threaded) against float64; bits across thread counts", function()
  local threads = rl.get_num_threads()
  local T, B, F = 6, 21, 5
  rl.manual_seed(12)
  local x, len = rl.randn(T, B, F), rl.full({B}, T, "int32")
  for b = 1, B, 3 do len[b] = 1 + b % T end
  local gout = rl.randn(T, B, 7)
  for _, dir in ipairs{1, -1} do
    local res = {}
    for _, run in ipairs{{"float64", 1}, {"float32", 1}, {"float32", 2}} do
      rl.set_num_threads(run[2])
      rl.manual_seed(13)
      local net = rl.network({output = {class = "lstm", n_out = 24, n_proj = 7, from = "data",
        direction = dir, loss = "mse", target = "target"}}, {data = {dim = F}, target = {dim = 7}},
        {input_grads = true, dtype = run[1]})
      local batch = {data = x:to(run[1]), target = gout:to(run[1]), lengths = len}
      net:forward(batch)
      net:zero_grads()
      net:backward()
      res[#res + 1] = {net:layer("output").output:double(), net:grads():double(),
        net:input_grad("data"):double()}
    end
    for k, what in ipairs{"outputs", "parameter gradients", "input gradients"} do
      local scale = res[1][k]:abs():max()
      H.check(scale > 0, what .. " are all zero")
      H.near((res[1][k] - res[2][k]):abs():max() / scale, 0, 1e-4,
        string.format("direction %d: float32 %s against float64", dir, what))
      H.check((res[2][k] - res[3][k]):abs():max() == 0,
        string.format("direction %d: %s differ between 1 and 2 threads", dir, what))
    end
  end
  rl.set_num_threads(threads)
end)

local dir = H.tmpdir()
local desc = {
  output = {class = "lstm", n_out = 6, n_proj = 2, from = "data", loss = "mse", target = "y"},
}
local ext = {data = {dim = 3}, y = {dim = 2}}
local batch = {data = rl.randn(4, 2, 3), y = rl.randn(4, 2, 2), lengths = rl.tensor({4, 3}, "int32")}

H.test("checkpoint round trip of an LSTMP: the same outputs, bit for bit", function()
  rl.manual_seed(21)
  local net = rl.network(desc, ext)
  local path = dir .. "/proj.h5"
  rl.save_checkpoint(path, {net = net})
  local ck = rl.load_checkpoint(path)
  H.check(ck.description.output.n_proj == 2, "n_proj is in the description")
  H.check(table.concat(ck.param_tensors["output/R"]:size(), ",") == "6,2", "R (H, P) saved")
  rl.manual_seed(22)
  local net2 = rl.network(ck.description, ck.extern_data)
  rl.checkpoint.load_params(ck, net2)
  net:forward(batch)
  net2:forward(batch)
  H.check((net:layer("output").output - net2:layer("output").output):abs():max() == 0,
    "outputs differ after load")
end)

-- the saved R is (6, 2), the description says n_proj = 3: rl.forward builds the network from
-- the description and names the parameter and both shapes
H.expect_error("a checkpoint whose projection disagrees with its description", function()
  rl.manual_seed(23)
  local desc = {output = {class = "lstm", n_out = 6, n_proj = 2, from = "data",
    is_output_layer = true}}
  local ext = {data = {dim = 3}}
  local net = rl.network(desc, ext)
  local params = {}
  for _, p in ipairs(net:param_list()) do
    params[#params + 1] = {name = p.layer .. "/" .. p.name, value = p.value}
  end
  local forged = rl.checkpoint.deserialize(rl.checkpoint.serialize(desc, "d"), "d")
  forged.output.n_proj = 3
  local path = dir .. "/forged.h5"
  rl.checkpoint.save_model(path, {description = forged, extern_data = ext, dtype = "float32",
    params = params})
  local ck = rl.load_checkpoint(path)
  local other = rl.network(ck.description, ck.extern_data)
  rl.checkpoint.load_params(ck, other)
end, "parameter output/U has shape (2, 24), the network's is (3, 24)")

for _, c in ipairs{
  {{n_proj = 0}, "option n_proj = 0, expected an integer in 1..5 (below n_out = 6)"},
  {{n_proj = -2}, "option n_proj = -2"},
  {{n_proj = 6}, "option n_proj = 6, expected an integer in 1..5"},
  {{n_proj = 9}, "option n_proj = 9"},
  {{n_proj = 2.5}, "option n_proj = 2.5"},
  {{n_proj = 2, impl = "cudnn"}, "option n_proj and impl = \"cudnn\" do not go together"},
  {{n_proj = 2, zoneout = 0.1}, "options n_proj and zoneout do not go together"},
  {{n_proj = "two"}, "n_proj"},
} do
  H.expect_error("bad n_proj: " .. c[2], function()
    local d = {class = "lstm", n_out = 6, from = "data", is_output_layer = true}
    for k, v in pairs(c[1]) do d[k] = v end
    local ok, err = pcall(rl.network, {enc = d}, {data = {dim = 3}})
    assert(not ok)
    err = tostring(err)
    if not err:find("layer 'enc'", 1, true) then error("does not name the layer: " .. err, 0) end
    error(err, 0)
  end, c[2])
end

H.rm_rf(dir)
H.done()
