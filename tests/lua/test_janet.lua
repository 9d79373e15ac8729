-- The janet cell (layers/janet.c), the recurrent driver's cell written as one file: its forward
-- against a reference written from the paper's equations, float64 gradient checks (both
-- directions, ragged, with the driver's options, as a layer and inside a rec unit), float32
-- against float64, its state through the layer's state calls, and bad input.
local H = dofile("tests/lua/harness.lua")

local function passed(r)
  H.check(r.passed, string.format("max relative error %.3g", r.max_rel_error))
end

for _, dir in ipairs{1, -1} do
  for _, opts in ipairs{{}, {beta = 0.5}, {zoneout = 0.3}, {rec_dropout = 0.3},
    {weight_dropout = 0.3}} do
    local name = next(opts) or "plain"
    H.test(string.format("gradcheck janet %s, direction %d, ragged", name, dir), function()
      local d = {class = "janet", n_out = 4, direction = dir}
      for k, v in pairs(opts) do d[k] = v end
      passed(rl.gradcheck{layer = d, in_dim = 3, train = true})
    end)
  end
end

H.test("gradcheck janet with two inputs, evaluation", function()
  passed(rl.gradcheck{network = {
    a = {class = "linear", n_out = 2, from = "data"},
    j = {class = "janet", n_out = 3, from = {"data", "a"}, zoneout = 0.2},
    output = {class = "copy", from = "j", loss = "mse", target = "target"},
  }, extern_data = {data = {dim = 3}, target = {dim = 3}}, train = false})
end)

-- Inside a rec unit (with an lstm and a gru, zoneout on, ragged): test_rec_options.lua.
H.test("gradcheck: janet alone inside a rec unit, carrying its own output, ragged", function()
  passed(rl.gradcheck{
    network = {
      dec = {class = "rec", from = "data", unit = {
        output = {class = "janet", n_out = 2, beta = 0.5, from = {"data:source", "prev:output"}},
      }},
      output = {class = "copy", from = "dec", loss = "mse", target = "target"},
    },
    extern_data = {data = {dim = 3}, target = {dim = 2}},
    T = 4, B = 2, lengths = {4, 3}, train = false,
  })
end)

local function sig(x) return 1 / (1 + math.exp(-x)) end

-- h = sigmoid(s) h_prev + (1 - sigmoid(s - beta)) tanh(a), both directions, padded frames 0.
H.test("janet forward against the paper's equations (both directions, ragged)", function()
  local F, Hd, T, B, beta = 2, 3, 4, 2, 0.7
  for _, dir in ipairs{1, -1} do
    rl.manual_seed(3)
    local net = rl.network({output = {class = "janet", n_out = Hd, from = "data", beta = beta,
      direction = dir, is_output_layer = true}}, {data = {dim = F}}, {dtype = "float64"})
    local p = net:layer("output").params
    p.b:copy(rl.randn(2 * Hd, "float64"))
    local W, U, b = p.W:totable(), p.U:totable(), p.b:totable()
    local x = rl.randn(T, B, F, "float64")
    local lens = {4, 3}
    net:forward({data = x, lengths = rl.tensor(lens, "int32")}, {train = false})
    local out, xs = net:layer("output").output:totable(), x:totable()
    local err = 0
    for bb = 1, B do
      local h = {0, 0, 0}
      for k = 1, lens[bb] do
        local t = dir > 0 and k or lens[bb] + 1 - k
        local nh = {}
        for j = 1, Hd do
          local z = {}
          for g = 0, 1 do
            local col = g * Hd + j
            local s = b[col]
            for i = 1, F do s = s + xs[t][bb][i] * W[i][col] end
            for i = 1, Hd do s = s + h[i] * U[i][col] end
            z[g] = s
          end
          nh[j] = sig(z[0]) * h[j] + (1 - sig(z[0] - beta)) * math.tanh(z[1])
        end
        h = nh
        for j = 1, Hd do err = math.max(err, math.abs(out[t][bb][j] - h[j])) end
      end
      for t = lens[bb] + 1, T do
        for j = 1, Hd do err = math.max(err, math.abs(out[t][bb][j])) end
      end
    end
    H.check(err < 1e-12, string.format("direction %d: max difference %.3g", dir, err))
  end
end)

-- The float32 passes are compiled once per CPU level (kernels/cpu/janet.c): each level this
-- machine has runs them, sizes over a vector's width with a remainder (H = 37).
local was_level, best_level = rl.cpu_level()
local levels = {"generic"}
if best_level == "avx2" or best_level == "avx512" then levels[#levels + 1] = "avx2" end
if best_level == "avx512" then levels[#levels + 1] = "avx512" end
if best_level == "neon" then levels[#levels + 1] = "neon" end
for _, lv in ipairs(levels) do
  H.test("janet in float32 is float64's at CPU level " .. lv ..
    " (both directions, ragged, weight_dropout, zoneout)", function()
    local desc = {
      a = {class = "janet", n_out = 37, from = "data", weight_dropout = 0.25, zoneout = 0.1},
      b = {class = "janet", n_out = 8, from = "a", direction = -1},
      output = {class = "linear", n_out = 3, from = {"a", "b"}, loss = "mse", target = "y"},
    }
    rl.cpu_level(lv)
    rl.manual_seed(11)
    local ok, err = pcall(H.float32_is_float64, desc, {data = {dim = 5}, y = {dim = 3}},
      {data = rl.randn(7, 4, 5, "float64"), y = rl.randn(7, 4, 3, "float64"),
       lengths = rl.tensor({7, 3, 5, 6}, "int32")})
    rl.cpu_level(was_level)
    if not ok then error(err, 0) end
  end)
end

-- The state is the driver's: one step with explicit state in and out is the whole sequence's
-- step, and the layer names its state "h".
H.test("janet state: names, and two halves with the carried state give the whole", function()
  rl.manual_seed(5)
  local net = rl.network({output = {class = "janet", n_out = 3, from = "data",
    is_output_layer = true}}, {data = {dim = 2}}, {dtype = "float64"})
  local l = net:layer("output").object
  local names, dims = l:state_names()
  H.check(#names == 1 and names[1] == "h" and dims[1] == 3, "state names")
  local x = rl.randn(6, 2, 2, "float64")
  local len6 = rl.tensor({6, 6}, "int32")
  net:forward({data = x, lengths = len6}, {train = false})
  local whole = net:layer("output").output:clone()
  local len3 = rl.tensor({3, 3}, "int32")
  net:forward({data = x:narrow(1, 1, 3):contiguous(), lengths = len3}, {train = false})
  local h = l:final_state():clone()
  l:set_initial_state(h)
  net:forward({data = x:narrow(1, 4, 3):contiguous(), lengths = len3}, {train = false})
  local d = (net:layer("output").output - whole:narrow(1, 4, 3)):abs():max()
  H.check(d < 1e-14, string.format("second half differs by %.3g", d))
end)

local function build(d)
  d.from, d.is_output_layer = "data", true
  return rl.network({l = d}, {data = {dim = 3}})
end
for _, bad in ipairs{
  {{class = "janet", n_out = 2, beta = "x"},
    "layer 'l' (class janet): option beta must be a number"},
  {{class = "janet", n_out = 2, impl = "cudnn"}, "layer 'l' (class janet): unknown option 'impl'"},
  {{class = "janet", n_out = 2, zoneout = {cell = 0.1}}, "option zoneout has no field 'cell'"},
  {{class = "janet", n_out = 2, weight_dropout = 1},
    "layer 'l' (class janet): option weight_dropout = 1"},
  {{class = "janet", n_out = 0}, "n_out"},
  {{class = "janet", n_out = 2, direction = 2}, "direction = 2, expected 1 or -1"},
} do
  H.expect_error("bad option: " .. bad[2], function() build(bad[1]) end, bad[2])
end

H.done()
