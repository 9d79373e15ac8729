-- lstm and gru with layer_norm = true (docs/layers.md `lstm`, `gru`): float64 gradient checks
-- with gains and biases moved away from their initial values (both directions, ragged, several
-- inputs, with n_proj, zoneout and rec_dropout, inside a rec unit), the forwards against
-- references written from the equations, the float32 paths against float64 and bits across
-- thread counts, and bad input naming the layer and the option.
local H = dofile("tests/lua/harness.lua")

local function passed(r)
  H.check(r.passed, string.format("max relative error %.3g", r.max_rel_error))
end

-- gains of 1 and biases of 0 would hide a gain applied to the wrong part
local LN = {g_x = true, g_h = true, g_c = true, b_c = true} -- the lstm's; the gru has g_x, g_h
local function shake(net)
  for _, p in ipairs(net:param_list()) do
    if LN[p.name] then p.value:copy_(rl.randn(p.value:size(1), "float64") * 0.4 + 0.8) end
  end
end

for _, dir in ipairs{1, -1} do
  H.test("gradcheck lstm layer_norm, direction " .. dir, function()
    local r = rl.gradcheck{layer = {class = "lstm", n_out = 4, layer_norm = true, direction = dir,
      forget_bias = 1}, in_dim = {3, 2}, T = 5, B = 3, lengths = {5, 2, 4}, init = shake}
    passed(r)
    for _, k in ipairs{"g_x", "g_h", "g_c", "b_c"} do
      H.check(r.per_param["layer." .. k], k .. " not checked")
    end
  end)
  H.test("gradcheck lstm layer_norm with n_proj and rec_dropout, direction " .. dir, function()
    passed(rl.gradcheck{layer = {class = "lstm", n_out = 5, n_proj = 3, layer_norm = true,
      direction = dir, rec_dropout = 0.3}, in_dim = 3, T = 5, B = 3, lengths = {4, 5, 1},
      train = true, init = shake})
  end)
end

for _, dir in ipairs{1, -1} do
  H.test("gradcheck gru layer_norm, direction " .. dir, function()
    local r = rl.gradcheck{layer = {class = "gru", n_out = 4, layer_norm = true, direction = dir},
      in_dim = {3, 2}, T = 5, B = 3, lengths = {5, 2, 4}, init = shake}
    passed(r)
    H.check(r.per_param["layer.g_x"] and r.per_param["layer.g_h"], "gains not checked")
  end)
  H.test("gradcheck gru layer_norm with zoneout and rec_dropout, direction " .. dir, function()
    passed(rl.gradcheck{layer = {class = "gru", n_out = 4, layer_norm = true, direction = dir,
      zoneout = 0.3, rec_dropout = 0.3}, in_dim = 3, T = 5, B = 3, lengths = {5, 2, 4},
      train = true, init = shake})
  end)
end

H.test("gradcheck: layer_norm lstm and gru inside a rec unit, ragged", function()
  passed(rl.gradcheck{
    network = {
      dec = {class = "rec", from = "data", unit = {
        s = {class = "lstm", n_out = 4, layer_norm = true, from = {"data:source", "prev:output"}},
        g = {class = "gru", n_out = 3, layer_norm = true, from = {"s", "prev:g"}},
        output = {class = "linear", activation = "tanh", n_out = 2, from = "g"},
      }},
      output = {class = "copy", from = "dec", loss = "mse", target = "target"},
    },
    extern_data = {data = {dim = 3}, target = {dim = 2}},
    T = 5, B = 3, lengths = {5, 2, 4}, init = shake,
  })
end)

local function sig(x) return 1 / (1 + math.exp(-x)) end
local function norm(v, lo, n) -- the (biased) layer normalisation of v[lo + 1 .. lo + n]
  local mu, var = 0, 0
  for j = 1, n do mu = mu + v[lo + j] end
  mu = mu / n
  for j = 1, n do var = var + (v[lo + j] - mu) ^ 2 end
  local rs, out = 1 / math.sqrt(var / n + 1e-5), {}
  for j = 1, n do out[j] = (v[lo + j] - mu) * rs end
  return out
end

-- z = LN(x W) g_x + LN(h U) g_h + b per gate block, c = f c_prev + i g, h = o tanh(LN(c) g_c + b_c)
H.test("lstm layer_norm: the forward against a reference from the equations", function()
  local F, Hd, T, B = 3, 4, 5, 2
  for _, dir in ipairs{1, -1} do
    rl.manual_seed(3)
    local net = rl.network({output = {class = "lstm", n_out = Hd, from = "data", direction = dir,
      layer_norm = true, is_output_layer = true}}, {data = {dim = F}}, {dtype = "float64"})
    shake(net)
    local p = net:layer("output").params
    p.b:copy_(rl.randn(4 * Hd, "float64") * 0.3)
    local W, U, b = p.W:totable(), p.U:totable(), p.b:totable()
    local gx, gh, gc, bc = p.g_x:totable(), p.g_h:totable(), p.g_c:totable(), p.b_c:totable()
    local x, len = rl.randn(T, B, F, "float64"), {5, 3}
    net:forward{data = x, lengths = rl.tensor(len, "int32")}
    local out, xs, err = net:layer("output").output:totable(), x:totable(), 0
    for bb = 1, B do
      local h, c = {0, 0, 0, 0}, {0, 0, 0, 0}
      local first, last, step = 1, len[bb], 1
      if dir < 0 then first, last, step = len[bb], 1, -1 end
      for t = first, last, step do
        local zx, zh = {}, {}
        for col = 1, 4 * Hd do
          local sx, sh = 0, 0
          for i = 1, F do sx = sx + xs[t][bb][i] * W[i][col] end
          for i = 1, Hd do sh = sh + h[i] * U[i][col] end
          zx[col], zh[col] = sx, sh
        end
        local a = {}
        for k = 0, 3 do
          local nx, nh = norm(zx, k * Hd, Hd), norm(zh, k * Hd, Hd)
          for j = 1, Hd do
            local col = k * Hd + j
            a[col] = gx[col] * nx[j] + gh[col] * nh[j] + b[col]
          end
        end
        local nc, o = {}, {}
        for j = 1, Hd do
          nc[j] = sig(a[Hd + j]) * c[j] + sig(a[j]) * math.tanh(a[2 * Hd + j])
          o[j] = sig(a[3 * Hd + j])
        end
        local cn = norm(nc, 0, Hd)
        for j = 1, Hd do h[j] = o[j] * math.tanh(gc[j] * cn[j] + bc[j]) end
        c = nc
        for j = 1, Hd do err = math.max(err, math.abs(out[t][bb][j] - h[j])) end
      end
    end
    H.check(err < 1e-12, string.format("direction %d: max difference %.3g", dir, err))
  end
end)

-- ar = LN(x W_r) g_xr + LN(h U_r) g_hr + b_r + b_hr (z alike), n = tanh(LN(x W_n) g_xn + b_n +
-- r (LN(h U_n) g_hn + b_hn)), h' = (1 - z) n + z h
H.test("gru layer_norm: the forward against a reference from the equations", function()
  local F, Hd, T, B = 3, 4, 5, 2
  for _, dir in ipairs{1, -1} do
    rl.manual_seed(5)
    local net = rl.network({output = {class = "gru", n_out = Hd, from = "data", direction = dir,
      layer_norm = true, is_output_layer = true}}, {data = {dim = F}}, {dtype = "float64"})
    shake(net)
    local p = net:layer("output").params
    p.b:copy_(rl.randn(3 * Hd, "float64") * 0.3)
    p.b_h:copy_(rl.randn(3 * Hd, "float64") * 0.3)
    local W, U, b, bh = p.W:totable(), p.U:totable(), p.b:totable(), p.b_h:totable()
    local gx, gh = p.g_x:totable(), p.g_h:totable()
    local x, len = rl.randn(T, B, F, "float64"), {5, 3}
    net:forward{data = x, lengths = rl.tensor(len, "int32")}
    local out, xs, err = net:layer("output").output:totable(), x:totable(), 0
    for bb = 1, B do
      local h = {0, 0, 0, 0}
      local first, last, step = 1, len[bb], 1
      if dir < 0 then first, last, step = len[bb], 1, -1 end
      for t = first, last, step do
        local zx, zh = {}, {}
        for col = 1, 3 * Hd do
          local sx, sh = 0, 0
          for i = 1, F do sx = sx + xs[t][bb][i] * W[i][col] end
          for i = 1, Hd do sh = sh + h[i] * U[i][col] end
          zx[col], zh[col] = sx, sh
        end
        local nx, nh = {}, {}
        for k = 0, 2 do
          local a, c = norm(zx, k * Hd, Hd), norm(zh, k * Hd, Hd)
          for j = 1, Hd do
            nx[k * Hd + j] = gx[k * Hd + j] * a[j] + b[k * Hd + j]
            nh[k * Hd + j] = gh[k * Hd + j] * c[j] + bh[k * Hd + j]
          end
        end
        local nhs = {}
        for j = 1, Hd do
          local r = sig(nx[j] + nh[j])
          local z = sig(nx[Hd + j] + nh[Hd + j])
          local n = math.tanh(nx[2 * Hd + j] + r * nh[2 * Hd + j])
          nhs[j] = (1 - z) * n + z * h[j]
        end
        h = nhs
        for j = 1, Hd do err = math.max(err, math.abs(out[t][bb][j] - h[j])) end
      end
    end
    H.check(err < 1e-12, string.format("direction %d: max difference %.3g", dir, err))
  end
end)

H.test("layer_norm float32 against float64; bits across thread counts", function()
  local threads = rl.get_num_threads()
  local T, B, F = 6, 21, 5
  rl.manual_seed(12)
  local x, len = rl.randn(T, B, F), rl.full({B}, T, "int32")
  for b = 1, B, 3 do len[b] = 1 + b % T end
  local gout = rl.randn(T, B, 24)
  for _, case in ipairs{{"lstm", 1}, {"lstm", -1}, {"gru", 1}, {"gru", -1}} do
    local class, dir = case[1], case[2]
    local res = {}
    for _, run in ipairs{{"float64", 1}, {"float32", 1}, {"float32", 2}} do
      rl.set_num_threads(run[2])
      rl.manual_seed(13)
      local net = rl.network({output = {class = class, n_out = 24, layer_norm = true, from = "data",
        direction = dir, loss = "mse", target = "target"}}, {data = {dim = F}, target = {dim = 24}},
        {input_grads = true, dtype = run[1]})
      net:forward{data = x:to(run[1]), target = gout:to(run[1]), lengths = len}
      net:zero_grads()
      net:backward()
      res[#res + 1] = {net:layer("output").output:double(), net:grads():double(),
        net:input_grad("data"):double()}
    end
    for k, what in ipairs{"outputs", "parameter gradients", "input gradients"} do
      local scale = res[1][k]:abs():max()
      H.check(scale > 0, what .. " are all zero")
      H.near((res[1][k] - res[2][k]):abs():max() / scale, 0, 1e-4,
        string.format("%s direction %d: float32 %s against float64", class, dir, what))
      H.check((res[2][k] - res[3][k]):abs():max() == 0,
        string.format("%s direction %d: %s differ between 1 and 2 threads", class, dir, what))
    end
  end
  rl.set_num_threads(threads)
end)

for _, c in ipairs{
  {{impl = "cudnn"}, "option layer_norm and impl = \"cudnn\" do not go together"},
  {{peepholes = true}, "option layer_norm and peepholes do not go together"},
  {{zoneout = 0.1}, "option layer_norm and zoneout do not go together"},
  {{layer_norm = "yes"}, "layer_norm"},
  {{class = "gru", impl = "cudnn"}, "(class gru): option layer_norm and impl = \"cudnn\""},
  {{class = "gru", layer_norm = 1}, "layer_norm"},
} do
  H.expect_error("bad layer_norm: " .. c[2], function()
    local d = {class = "lstm", n_out = 6, from = "data", layer_norm = true,
      is_output_layer = true}
    for k, v in pairs(c[1]) do d[k] = v end
    local ok, err = pcall(rl.network, {enc = d}, {data = {dim = 3}})
    assert(not ok)
    err = tostring(err)
    if not err:find("layer 'enc'", 1, true) then error("does not name the layer: " .. err, 0) end
    error(err, 0)
  end, c[2])
end

H.done()
