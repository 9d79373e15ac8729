-- The attention step kernels split their sequences over the threads (kernels/cpu/attention.c):
-- forward and backward must give bit-identical results on 1, 2 and 3 threads, in float32 and
-- float64, for dot and additive scores, with ragged lengths and an empty sequence. The shapes
-- are above the kernel's split threshold (B Te (E + A) >= 8192). Outputs start as NaN
-- (forward) or random values that accumulate (de, dpre, dv), so a part that is skipped leaves
-- NaN or stale numbers and a part run twice adds its share twice: both differ from 1 thread.
local H = dofile("tests/lua/harness.lua")

local Te, B, E, A = 12, 7, 100, 64
local LENS = {12, 5, 0, 1, 12, 9, 3}

local function inputs(kind, dtype)
  rl.manual_seed(11)
  local x = {e = rl.randn(Te, B, E, dtype), len = rl.tensor(LENS, "int32")}
  if kind == "dot" then
    x.q = rl.randn(B, E, dtype) * 0.1
  else
    x.q = rl.randn(B, A, dtype)
    x.pre = rl.randn(Te, B, A, dtype)
    x.v = rl.randn(A, 1, dtype)
  end
  x.dctx = rl.randn(B, E, dtype)
  return x
end

local function flat(t) return t:contiguous():view(t:numel()):totable() end

-- every output of one forward and one backward call on `threads` threads, flattened
local function run(kind, dtype, threads)
  local x = inputs(kind, dtype)
  rl.set_num_threads(threads)
  local nan = 0 / 0
  local alpha, ctx = rl.full({B, Te}, nan, dtype), rl.full({B, E}, nan, dtype)
  rl.attention_forward(kind, x.e, x.len, x.q, x.pre, x.v, alpha, ctx)
  rl.manual_seed(5)
  local ds = rl.full({B, Te}, nan, dtype)
  local dq = rl.full({x.q:size(1), x.q:size(2)}, nan, dtype)
  local de = rl.randn(Te, B, E, dtype)
  local dpre = kind == "additive" and rl.randn(Te, B, A, dtype) or nil
  local dv = kind == "additive" and rl.randn(B, A, dtype) or nil
  rl.attention_backward(kind, x.e, x.len, x.q, x.pre, x.v, alpha, x.dctx, ds, de, dq, dpre, dv)
  local out = {alpha = flat(alpha), ctx = flat(ctx), de = flat(de), dq = flat(dq)}
  if dpre then out.dpre, out.dv = flat(dpre), flat(dv) end
  -- ds is scratch only for valid frames: compare those
  local d = ds:totable()
  out.ds = {}
  for b = 1, B do
    for j = 1, LENS[b] do out.ds[#out.ds + 1] = d[b][j] end
  end
  return out
end

local saved = rl.get_num_threads()
for _, dtype in ipairs({"float32", "float64"}) do
  for _, kind in ipairs({"dot", "additive"}) do
    H.test(kind .. " " .. dtype .. ": bit-identical on 1, 2 and 3 threads", function()
      H.same_on_threads(function(threads) return run(kind, dtype, threads) end)
    end)
  end
end
rl.set_num_threads(saved)

H.done()
