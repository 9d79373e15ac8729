-- The attention step kernels (kernels/attention.h through rl.attention_forward/backward),
-- checked directly: the forward against a plain-Lua float64 reference of the formulas, the
-- backward against central differences of the forward (float64, ragged encoder lengths with
-- an empty sequence), float32 against float64 at every CPU level this machine has, and bad
-- arguments as errors naming the caller and the argument.
local H = dofile("tests/lua/harness.lua")

local Te, B, E, A = 5, 4, 6, 7
local LENS = {5, 3, 0, 1}

-- The inputs of one step; for dot the query is (B, E), for additive (B, A) plus pre and v.
local function inputs(kind, dtype)
  rl.manual_seed(7)
  local x = {e = rl.randn(Te, B, E, "float64"), len = rl.tensor(LENS, "int32")}
  if kind == "dot" then
    x.q = rl.randn(B, E, "float64")
  else
    x.q = rl.randn(B, A, "float64")
    x.pre = rl.randn(Te, B, A, "float64")
    x.v = rl.randn(A, 1, "float64")
  end
  -- NaN in padded encoder frames: the kernel must never read them
  for b, n in ipairs(LENS) do
    for j = n + 1, Te do
      x.e[j][b]:fill_(0 / 0)
      if x.pre then x.pre[j][b]:fill_(0 / 0) end
    end
  end
  if dtype ~= "float64" then
    for k, t in pairs(x) do if k ~= "len" then x[k] = t:to(dtype) end end
  end
  return x
end

local function forward(kind, x)
  local dt = x.e:dtype()
  local alpha, ctx = rl.zeros({B, Te}, dt), rl.zeros({B, E}, dt)
  rl.attention_forward(kind, x.e, x.len, x.q, x.pre, x.v, alpha, ctx)
  return alpha, ctx
end

-- The formulas of kernels/attention_step.h in plain Lua numbers.
local function reference(kind, x)
  local e, q = x.e:totable(), x.q:totable()
  local pre, v = x.pre and x.pre:totable(), x.v and x.v:totable()
  local alpha, ctx = {}, {}
  for b = 1, B do
    local L, s, m = LENS[b], {}, -math.huge
    for j = 1, L do
      local sc = 0
      if kind == "dot" then
        for k = 1, E do sc = sc + e[j][b][k] * q[b][k] end
      else
        for a = 1, A do sc = sc + v[a][1] * math.tanh(pre[j][b][a] + q[b][a]) end
      end
      s[j], m = sc, math.max(m, sc)
    end
    local sum = 0
    for j = 1, L do s[j] = math.exp(s[j] - m); sum = sum + s[j] end
    alpha[b], ctx[b] = {}, {}
    for j = 1, Te do alpha[b][j] = j <= L and s[j] / sum or 0 end
    for k = 1, E do
      local c = 0
      for j = 1, L do c = c + alpha[b][j] * e[j][b][k] end
      ctx[b][k] = c
    end
  end
  return alpha, ctx
end

local function maxdiff2(t, ref)
  local d = 0
  for i, row in ipairs(t:totable()) do
    for j, v in ipairs(row) do d = math.max(d, math.abs(v - ref[i][j])) end
  end
  return d
end

for _, kind in ipairs({"dot", "additive"}) do
  H.test(kind .. ": forward equals the reference (ragged lengths, an empty sequence)", function()
    local x = inputs(kind, "float64")
    local alpha, ctx = forward(kind, x)
    local ra, rc = reference(kind, x)
    H.check(maxdiff2(alpha, ra) < 1e-12, "alpha differs from the reference")
    H.check(maxdiff2(ctx, rc) < 1e-12, "ctx differs from the reference")
    H.check(alpha[3]:abs():sum() == 0 and ctx[3]:abs():sum() == 0,
      "a sequence of length 0 must get weights 0 and a zero context")
  end)

  H.test(kind .. ": backward equals central differences (float64)", function()
    local x = inputs(kind, "float64")
    rl.manual_seed(3)
    local w = rl.randn(B, E, "float64") -- loss = sum(ctx * w), so dctx = w
    local function loss()
      local _, ctx = forward(kind, x)
      return (ctx * w):sum()
    end
    local alpha = forward(kind, x)
    local ds, de = rl.zeros({B, Te}, "float64"), rl.zeros({Te, B, E}, "float64")
    local dq = rl.zeros(x.q:size(1), x.q:size(2), "float64")
    local dpre = kind == "additive" and rl.zeros({Te, B, A}, "float64") or nil
    local dv = kind == "additive" and rl.zeros({B, A}, "float64") or nil
    -- de, dpre and dv accumulate: start them at 1 and take it off after
    de:fill_(1)
    if dpre then dpre:fill_(1); dv:fill_(1) end
    rl.attention_backward(kind, x.e, x.len, x.q, x.pre, x.v, alpha, w, ds, de, dq, dpre, dv)
    de:add_(-1)
    if dpre then dpre:add_(-1); dv:add_(-1) end
    local grads = {e = de, q = dq, pre = dpre, v = dv and dv:sum(1):view(A, 1)}
    local h, worst = 1e-6, 0
    for name, g in pairs(grads) do
      local t = x[name]
      local flat, gf = t:view(t:numel()), g:contiguous():view(g:numel())
      for i = 1, t:numel() do
        local old, cell = flat[i], flat:narrow(1, i, 1)
        if old == old then -- padded frames hold NaN and have no gradient
          cell:fill_(old + h)
          local lp = loss()
          cell:fill_(old - h)
          local lm = loss()
          cell:fill_(old)
          local num, ana = (lp - lm) / (2 * h), gf[i]
          worst = math.max(worst, math.abs(num - ana) / math.max(1, math.abs(num)))
        else
          H.check(gf[i] == 0, name .. ": a padded frame got a gradient")
        end
      end
    end
    H.check(worst < 1e-7, string.format("largest relative gradient error %.3g", worst))
  end)

  H.test(kind .. ": float32 follows float64 at every CPU level", function()
    local _, best = rl.cpu_level()
    local levels = {"generic"}
    if best == "avx2" or best == "avx512" then levels[#levels + 1] = "avx2" end
    if best == "avx512" then levels[#levels + 1] = "avx512" end
    local x64, x32 = inputs(kind, "float64"), inputs(kind, "float32")
    local a64, c64 = forward(kind, x64)
    local w = rl.randn(B, E, "float64")
    local function grads(x, alpha)
      local dt = x.e:dtype()
      local o = {ds = rl.zeros({B, Te}, dt), de = rl.zeros({Te, B, E}, dt),
        dq = rl.zeros(x.q:size(1), x.q:size(2), dt)}
      if kind == "additive" then o.dpre, o.dv = rl.zeros({Te, B, A}, dt), rl.zeros({B, A}, dt) end
      rl.attention_backward(kind, x.e, x.len, x.q, x.pre, x.v, alpha, w:to(dt), o.ds, o.de, o.dq,
        o.dpre, o.dv)
      return o
    end
    local g64 = grads(x64, a64)
    local was = rl.cpu_level()
    for _, lv in ipairs(levels) do
      rl.cpu_level(lv)
      local a32, c32 = forward(kind, x32)
      H.check((a32:double() - a64):abs():max() < 1e-5, lv .. ": alpha")
      H.check((c32:double() - c64):abs():max() < 1e-5, lv .. ": ctx")
      local g32 = grads(x32, a32)
      for k, g in pairs(g64) do
        local d = (g32[k]:double() - g):abs()
        -- padded frames: exactly 0 in both
        H.check(d:max() < 1e-4 * math.max(1, g:abs():max()), lv .. ": " .. k)
      end
    end
    rl.cpu_level(was)
  end)
end

local x = inputs("additive", "float64")
local alpha, ctx = rl.zeros({B, Te}, "float64"), rl.zeros({B, E}, "float64")
H.expect_error("an unknown kind", function()
  rl.attention_forward("cosine", x.e, x.len, x.q, x.pre, x.v, alpha, ctx)
end, "invalid option 'cosine'")
H.expect_error("additive without v", function()
  rl.attention_forward("additive", x.e, x.len, x.q, x.pre, nil, alpha, ctx, "unit layer 'att'")
end, "unit layer 'att': additive attention needs v")
H.expect_error("a query of the wrong width", function()
  rl.attention_forward("dot", x.e, x.len, x.q, nil, nil, alpha, ctx)
end, "rl.attention_forward: the query must be a contiguous (4, 6) float64 tensor")
H.expect_error("a float32 context with a float64 encoder", function()
  rl.attention_forward("additive", x.e, x.len, x.q, x.pre, x.v, alpha, ctx:float())
end, "the context must be")
H.expect_error("pre of the wrong shape", function()
  rl.attention_forward("additive", x.e, x.len, x.q, x.pre:narrow(1, 1, 2), x.v, alpha, ctx)
end, "pre (e W_e) must be")
H.expect_error("a length beyond the encoder", function()
  rl.attention_forward("additive", x.e, rl.tensor({5, 6, 0, 1}, "int32"), x.q, x.pre, x.v,
    alpha, ctx)
end, "sequence 2: encoder length 6 is outside 0..5")
H.expect_error("a negative length", function()
  rl.attention_forward("additive", x.e, rl.tensor({5, 3, -1, 1}, "int32"), x.q, x.pre, x.v,
    alpha, ctx)
end, "sequence 3: encoder length -1")
H.expect_error("float lengths", function()
  rl.attention_forward("additive", x.e, rl.tensor(LENS, "float64"), x.q, x.pre, x.v, alpha, ctx)
end, "the lengths must be a contiguous (4) int32 tensor")
H.expect_error("a non-contiguous encoder", function()
  rl.attention_forward("dot", x.e:transpose(1, 2), x.len, rl.zeros({Te, E}, "float64"), nil, nil,
    rl.zeros({Te, B}, "float64"), rl.zeros({Te, E}, "float64"))
end, "the encoder must be a contiguous (Te, B, E)")
H.expect_error("backward without dpre", function()
  rl.attention_backward("additive", x.e, x.len, x.q, x.pre, x.v, alpha, ctx,
    rl.zeros({B, Te}, "float64"), rl.zeros({Te, B, E}, "float64"), rl.zeros({B, A}, "float64"),
    nil, rl.zeros({B, A}, "float64"))
end, "dpre must be")
H.expect_error("a table instead of a tensor", function()
  rl.attention_forward("dot", {}, x.len, x.q, nil, nil, alpha, ctx)
end, "tensor expected")

H.done()
