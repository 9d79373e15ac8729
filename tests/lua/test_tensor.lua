-- The Lua tensor API: creation, views, copies, arithmetic, reductions, products, joins,
-- indexing, printing; each checked against values computed by hand or by plain Lua loops.
local H = dofile("tests/lua/harness.lua")
local test, check, near = H.test, H.check, H.near

local function same(a, b, tol, path)
  path = path or "value"
  if type(a) == "table" then
    check(type(b) == "table", path .. ": expected a table", 2)
    check(#a == #b, string.format("%s: %d elements, expected %d", path, #a, #b), 2)
    for i = 1, #a do same(a[i], b[i], tol, path .. "[" .. i .. "]") end
  else
    check(math.abs(a - b) <= (tol or 1e-6),
      string.format("%s: got %s, expected %s", path, tostring(a), tostring(b)), 2)
  end
end

test("creation from tables", function()
  local a = rl.tensor{{1, 2}, {3, 4}}
  check(a:dim() == 2 and a:size(1) == 2 and a:size(2) == 2)
  check(a:dtype() == "float32" and a:device() == "cpu")
  same(a:totable(), {{1, 2}, {3, 4}})
  local y = rl.tensor({{0, 1}, {1, 0}}, "int32")
  check(y:dtype() == "int32")
  check(math.type(y[1][2]) == "integer")
  local d = rl.tensor({1.5, 2.5}, {dtype = "float64"})
  check(d:dtype() == "float64")
  same(d:totable(), {1.5, 2.5})
  local s = rl.tensor(3.5)
  check(s:dim() == 0 and s:numel() == 1 and s:item() == 3.5)
  local e = rl.tensor{}
  check(e:numel() == 0)
end)

test("zeros ones full empty arange", function()
  local z = rl.zeros(2, 3)
  check(tostring(z:size()) == "(2, 3)")
  check(z:sum() == 0)
  check(rl.ones({4, 5}):sum() == 20)
  check(rl.ones(2, 2, "int32"):dtype() == "int32")
  same(rl.full({2, 2}, 7):totable(), {{7, 7}, {7, 7}})
  check(rl.empty(3, 4):numel() == 12)
  same(rl.arange(5):totable(), {0, 1, 2, 3, 4})
  same(rl.arange(2, 8, 2):totable(), {2, 4, 6})
  same(rl.arange(1, 0, -0.25):totable(), {1, 0.75, 0.5, 0.25})
  check(rl.arange(0):numel() == 0)
end)

test("Size objects", function()
  local s = rl.zeros(2, 3, 4):size()
  check(#s == 3 and s[1] == 2 and s[3] == 4)
  check(s == rl.zeros(2, 3, 4):size())
  check(tostring(s) == "(2, 3, 4)")
  check(rl.zeros(s):numel() == 24)
end)

test("random numbers are seeded and reproducible", function()
  rl.manual_seed(42)
  local a = rl.randn(100)
  local r1 = rl.rand(10)
  rl.manual_seed(42)
  local b = rl.randn(100)
  local r2 = rl.rand(10)
  same(a:totable(), b:totable(), 0)
  same(r1:totable(), r2:totable(), 0)
  rl.manual_seed(43)
  check(rl.randn(100):sum() ~= a:sum())
  local u = rl.rand(10000)
  check(u:min() >= 0 and u:max() < 1)
  near(u:mean(), 0.5, 0.02, "uniform mean")
  local n = rl.randn(20000)
  near(n:mean(), 0, 0.03, "normal mean")
  near((n * n):mean(), 1, 0.05, "normal variance")
  local st = rl.get_rng_state()
  local c = rl.rand(5)
  rl.set_rng_state(st)
  same(rl.rand(5):totable(), c:totable(), 0)
  local w = rl.zeros(1000):uniform_(-2, 3)
  check(w:min() >= -2 and w:max() < 3)
end)

test("views share storage", function()
  local a = rl.arange(12):view(3, 4)
  local n = a:narrow(2, 2, 2)
  same(n:totable(), {{1, 2}, {5, 6}, {9, 10}})
  n:fill(-1)
  check(a[1][2] == -1 and a[3][3] == -1 and a[1][1] == 0)
  local s = a:select(1, 2)
  same(s:totable(), {4, -1, -1, 7})
  local t = a:t()
  check(t:size(1) == 4 and t:size(2) == 3 and not t:is_contiguous())
  check(t[2][3] == a[3][2])
  local p = rl.arange(24):view(2, 3, 4):permute(3, 1, 2)
  check(tostring(p:size()) == "(4, 2, 3)")
  check(p[2][2][3] == rl.arange(24):view(2, 3, 4)[2][3][2])
  local u = rl.zeros(3):unsqueeze(1)
  check(tostring(u:size()) == "(1, 3)")
  check(tostring(u:unsqueeze(3):size()) == "(1, 3, 1)")
  check(tostring(rl.zeros(1, 3, 1):squeeze():size()) == "(3)")
  check(tostring(rl.zeros(1, 3, 1):squeeze(1):size()) == "(3, 1)")
  check(tostring(rl.zeros(2, 3):view(-1):size()) == "(6)")
  check(tostring(rl.zeros(2, 3):view(3, -1):size()) == "(3, 2)")
  local e = rl.tensor{1, 2, 3}:view(1, 3):expand(2, 3)
  same(e:totable(), {{1, 2, 3}, {1, 2, 3}})
  check(a:select(-1, 1)[3] == 8)
  check(a:transpose(1, 2):size(1) == 4)
end)

test("contiguous clone copy reshape", function()
  local a = rl.arange(6):view(2, 3)
  local t = a:t()
  local c = t:contiguous()
  check(c:is_contiguous())
  same(c:totable(), {{0, 3}, {1, 4}, {2, 5}})
  local r = t:reshape(6)
  same(r:totable(), {0, 3, 1, 4, 2, 5})
  local k = a:clone()
  k:fill(9)
  check(a:sum() == 15)
  local dst = rl.zeros(2, 3)
  dst:copy(a)
  same(dst:totable(), a:totable())
  dst:copy(rl.tensor{1, 2, 3})
  same(dst:totable(), {{1, 2, 3}, {1, 2, 3}})
  local i = rl.tensor{1.7, -1.7}:int()
  same(i:totable(), {1, -1})
  check(i:float():dtype() == "float32" and i:double():dtype() == "float64")
  check(a:to("float64"):dtype() == "float64")
  check(a:to{dtype = "int32"}:dtype() == "int32")
  check(a:cpu() == a)
end)

test("elementwise arithmetic with broadcasting", function()
  local a = rl.tensor{{1}, {2}, {3}}
  local b = rl.tensor{10, 20}
  same((a + b):totable(), {{11, 21}, {12, 22}, {13, 23}})
  same((a * b):totable(), {{10, 20}, {20, 40}, {30, 60}})
  same((b - a):totable(), {{9, 19}, {8, 18}, {7, 17}})
  same((b / 4):totable(), {2.5, 5})
  same((2 - b):totable(), {-8, -18})
  same((10 / b):totable(), {1, 0.5})
  same((b ^ 2):totable(), {100, 400})
  same((-b):totable(), {-10, -20})
  same(a:add(1):totable(), {{2}, {3}, {4}})
  same(rl.add(a, a):totable(), {{2}, {4}, {6}})
  local out = rl.zeros(3, 2)
  rl.mul(a, b, out)
  same(out:totable(), {{10, 20}, {20, 40}, {30, 60}})
  same(rl.tensor{1, 5, 3}:maximum(rl.tensor{4, 2, 6}):totable(), {4, 5, 6})
  same(rl.tensor{1, 5, 3}:max(rl.tensor{4, 2, 6}):totable(), {4, 5, 6})
  same(rl.tensor{1, 5, 3}:minimum(2):totable(), {1, 2, 2})
  local i = rl.tensor({7, -7}, "int32")
  same((i / 2):totable(), {3, -3})
  same((i + i):totable(), {14, -14})
end)

test("in-place methods return self and change it", function()
  local a = rl.tensor{1, 2, 3}
  local r = a:add_(1)
  check(r == a)
  same(a:totable(), {2, 3, 4})
  a:mul_(2):sub_(1)
  same(a:totable(), {3, 5, 7})
  a:exp_():log_()
  same(a:totable(), {3, 5, 7}, 1e-5)
  local b = rl.zeros(2, 3)
  b:narrow(2, 2, 1):fill_(5)
  same(b:totable(), {{0, 5, 0}, {0, 5, 0}})
  b:zero_()
  check(b:sum() == 0)
end)

test("unary math", function()
  local x = rl.tensor({-2, -0.5, 0, 0.5, 2}, "float64")
  local xs = x:totable()
  local refs = {
    neg = function(v) return -v end, abs = math.abs,
    exp = math.exp, tanh = function(v) return (math.exp(v) - math.exp(-v)) / (math.exp(v) + math.exp(-v)) end,
    sigmoid = function(v) return 1 / (1 + math.exp(-v)) end,
    relu = function(v) return v > 0 and v or 0 end,
    square = function(v) return v * v end, sin = math.sin, cos = math.cos,
    floor = math.floor, ceil = math.ceil,
    softplus = function(v) return math.log(1 + math.exp(v)) end,
    elu = function(v) return v > 0 and v or math.exp(v) - 1 end,
    sign = function(v) return v > 0 and 1 or (v < 0 and -1 or 0) end,
  }
  for name, f in pairs(refs) do
    local got = x[name](x):totable()
    local got2 = rl[name](x):totable()
    for i = 1, #xs do
      near(got[i], f(xs[i]), 1e-12, name)
      near(got2[i], f(xs[i]), 1e-12, "rl." .. name)
    end
  end
  local p = rl.tensor({0.25, 4}, "float64")
  same(p:sqrt():totable(), {0.5, 2})
  same(p:log():totable(), {math.log(0.25), math.log(4)}, 1e-12)
  same(p:reciprocal():totable(), {4, 0.25})
  same(p:rsqrt():totable(), {2, 0.5})
  same(x:clamp(-1, 1):totable(), {-1, -0.5, 0, 0.5, 1})
  same(x:clamp(0):totable(), {0, 0, 0, 0.5, 2})
  same(x:pow(2):totable(), {4, 0.25, 0, 0.25, 4})
end)

test("comparisons and masked_fill", function()
  local a = rl.tensor{1, 2, 3, 4}
  same(a:gt(2):totable(), {0, 0, 1, 1})
  same(a:le(2):totable(), {1, 1, 0, 0})
  same(a:eq(rl.tensor{1, 0, 3, 0}):totable(), {1, 0, 1, 0})
  same(a:ne(3):totable(), {1, 1, 0, 1})
  same(a:lt(3):totable(), {1, 1, 0, 0})
  same(a:ge(3):totable(), {0, 0, 1, 1})
  local m = a:masked_fill(a:gt(2), -1)
  same(m:totable(), {1, 2, -1, -1})
  same(a:totable(), {1, 2, 3, 4})
  a:masked_fill_(a:eq(1), 0)
  same(a:totable(), {0, 2, 3, 4})
  local b = rl.zeros(2, 3)
  b:masked_fill_(rl.tensor{1, 0, 1}, 5)
  same(b:totable(), {{5, 0, 5}, {5, 0, 5}})
  -- a mask broadcast along the last axis (one value a row, conv2d's padded positions), in
  -- every dtype and on a transposed (strided) tensor
  local rows = rl.tensor{{1}, {0}, {2}}
  for _, conv in ipairs{"float", "double", "int"} do
    local c = rl.tensor{{1, 2, 3, 4}, {5, 6, 7, 8}, {9, 10, 11, 12}}
    c = c[conv](c)
    same(c:masked_fill(rows, -3):totable(), {{-3, -3, -3, -3}, {5, 6, 7, 8}, {-3, -3, -3, -3}})
    local t = c:t():contiguous():t() -- the same values, column-major
    t:masked_fill_(rows, 2.5)
    local v = conv == "int" and 2 or 2.5
    same(t:totable(), {{v, v, v, v}, {5, 6, 7, 8}, {v, v, v, v}})
  end
end)

test("reductions", function()
  local a = rl.tensor{{1, 5, 3}, {4, 2, 6}}
  check(a:sum() == 21)
  near(a:mean(), 3.5)
  check(a:prod() == 720)
  near(a:norm(), math.sqrt(1 + 25 + 9 + 16 + 4 + 36), 1e-5)
  local v, i = a:max()
  check(v == 6 and i == 6)
  v, i = a:min()
  check(v == 1 and i == 1)
  check(a:argmax() == 6)
  same(a:sum(1):totable(), {5, 7, 9})
  same(a:sum(2):totable(), {9, 12})
  same(a:sum(2, true):totable(), {{9}, {12}})
  same(a:mean(1):totable(), {2.5, 3.5, 4.5})
  local vals, idx = a:max(2)
  same(vals:totable(), {5, 6})
  same(idx:totable(), {2, 3})
  check(idx:dtype() == "int32")
  same(a:argmax(1):totable(), {2, 1, 2})
  same(a:argmin(2):totable(), {1, 2})
  local mv, mi = a:min(1, true)
  same(mv:totable(), {{1, 2, 3}})
  same(mi:totable(), {{1, 2, 1}})
  same(a:t():sum(1):totable(), {9, 12})
  check(rl.tensor({1, 2, 3}, "int32"):sum() == 6)
  check(math.type(rl.tensor({1, 2, 3}, "int32"):sum()) == "integer")
  check(rl.ones(1000000):sum() == 1000000)
end)

test("matmul and gemm", function()
  local a = rl.tensor{{1, 2}, {3, 4}}
  local c = rl.matmul(a, a)
  same(c:totable(), {{7, 10}, {15, 22}})
  same(a:matmul(rl.tensor{1, 1}):totable(), {3, 7})
  check(rl.matmul(rl.tensor{1, 2, 3}, rl.tensor{4, 5, 6}):item() == 32)
  same(rl.matmul(a:t(), a):totable(), {{10, 14}, {14, 20}})
  local b = rl.tensor{{{1, 0}, {0, 1}}, {{2, 0}, {0, 2}}}
  same(rl.matmul(b, a):totable(), {{{1, 2}, {3, 4}}, {{2, 4}, {6, 8}}})
  local g = rl.gemm(a, a, {trans_a = true})
  same(g:totable(), {{10, 14}, {14, 20}})
  local out = rl.ones(2, 2)
  rl.gemm(a, a, {trans_b = true, alpha = 2, beta = 1, out = out})
  same(out:totable(), {{11, 23}, {23, 51}})
  local o2 = rl.zeros(2, 2)
  local r = rl.matmul(a, a, o2)
  check(r == o2)
  same(o2:totable(), {{7, 10}, {15, 22}})
  -- against a plain Lua triple loop on random sizes
  rl.manual_seed(7)
  local x, y = rl.randn(5, 7, "float64"), rl.randn(7, 3, "float64")
  local xt, yt, z = x:totable(), y:totable(), rl.matmul(x, y):totable()
  for i = 1, 5 do
    for j = 1, 3 do
      local s = 0
      for k = 1, 7 do s = s + xt[i][k] * yt[k][j] end
      near(z[i][j], s, 1e-12, "matmul")
    end
  end
end)

test("cat and index_select", function()
  local a, b = rl.tensor{{1, 2}}, rl.tensor{{3, 4}, {5, 6}}
  same(rl.cat({a, b}):totable(), {{1, 2}, {3, 4}, {5, 6}})
  same(rl.cat({b, b}, 2):totable(), {{3, 4, 3, 4}, {5, 6, 5, 6}})
  local t = rl.arange(12):view(3, 4)
  same(t:index_select(1, rl.tensor({3, 1}, "int32")):totable(), {{8, 9, 10, 11}, {0, 1, 2, 3}})
  same(t:index_select(2, {4, 4, 1}):totable(), {{3, 3, 0}, {7, 7, 4}, {11, 11, 8}})
end)

test("indexing and assignment", function()
  local a = rl.arange(6):view(2, 3)
  check(a[2][3] == 5)
  check(#a == 2)
  a[1] = 9
  same(a:totable(), {{9, 9, 9}, {3, 4, 5}})
  a[2] = rl.tensor{7, 8, 9}
  same(a[2]:totable(), {7, 8, 9})
  a[2][1] = -1
  check(a[2][1] == -1)
  local v = rl.zeros(4)
  v[4] = 3
  check(v:sum() == 3)
end)

test("printing shows values, shape, dtype and device", function()
  local s = tostring(rl.tensor{{1, 2}, {3, 4}})
  check(s:find("float32 (2, 2) on cpu", 1, true), s)
  check(s:find("1", 1, true) and s:find("4", 1, true))
  local big = tostring(rl.arange(10000):view(100, 100))
  check(big:find("...", 1, true), "large tensors are summarised")
  check(#big < 2000, "summary stays short")
  check(big:find("9999", 1, true), "last element shown")
  local three = tostring(rl.zeros(2, 2, 2))
  check(three:find("(1,.,.) =", 1, true), three)
  check(tostring(rl.tensor(2.5)):find("2.5", 1, true))
  check(tostring(rl.tensor{0.5, 1e-7}):find("e", 1, true))
  check(tostring(rl.tensor({1, 2}, "int32")):find("int32", 1, true))
end)

test("close and garbage collection", function()
  do
    local t <close> = rl.zeros(1000, 1000)
    check(t:numel() == 1000000)
  end
  for _ = 1, 200 do local _ = rl.zeros(1000, 100) end
  collectgarbage()
  check(rl.is_tensor(rl.zeros(1)) and not rl.is_tensor({}))
end)

test("devices", function()
  check(type(rl.cuda_built()) == "boolean")
  check(rl.device_count() >= 0)
  check(rl.cuda_available() == (rl.device_count() > 0))
  rl.synchronize()
  check(rl.get_num_threads() >= 1)
end)

H.done()
