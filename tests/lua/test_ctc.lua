-- rl.ctc_loss: against brute-force enumeration of every alignment on tiny cases (repeated
-- labels, an empty target, an infeasible target), a float64 finite-difference gradient check,
-- ragged batches whose padding holds NaN and garbage labels, long inputs in float32, threads,
-- zero_infinity, and every bad input as an error naming the function and the sequence.
local H = dofile("tests/lua/harness.lua")
local test, check, expect_error = H.test, H.check, H.expect_error

local function rand_table(T, B, V, seed)
  local g = rl.datasets.new_rng(seed)
  local x = {}
  for t = 1, T do
    x[t] = {}
    for b = 1, B do
      x[t][b] = {}
      for v = 1, V do x[t][b][v] = 2 * g:normal() end
    end
  end
  return x
end

-- targets {{labels...}, ...} -> (B, S) int32 padded with `pad`, and lengths
local function target_tensor(tg, pad)
  local S = 1
  for _, l in ipairs(tg) do S = math.max(S, #l) end
  local rows, lens = {}, {}
  for b, l in ipairs(tg) do
    rows[b] = {}
    for s = 1, S do rows[b][s] = l[s] or pad or 0 end
    lens[b] = #l
  end
  return rl.tensor(rows, "int32"), rl.tensor(lens, "int32")
end

local function collapse(path, blank)
  local out, prev = {}, nil
  for _, k in ipairs(path) do
    if k ~= prev and k ~= blank then out[#out + 1] = k end
    prev = k
  end
  return out
end

-- -log P and the posteriors gamma[t][k] of sequence b by enumerating all V^T paths.
local function brute(x, b, T, V, target, blank)
  local sm = {}
  for t = 1, T do
    local m, s = -math.huge, 0
    for v = 1, V do m = math.max(m, x[t][b][v]) end
    for v = 1, V do s = s + math.exp(x[t][b][v] - m) end
    sm[t] = {}
    for v = 1, V do sm[t][v] = math.exp(x[t][b][v] - m) / s end
  end
  local P, gam = 0, {}
  for t = 1, T do gam[t] = {} for v = 1, V do gam[t][v] = 0 end end
  local path = {}
  local function rec(t, p)
    if t > T then
      local c = collapse(path, blank)
      if #c ~= #target then return end
      for i = 1, #c do if c[i] ~= target[i] then return end end
      P = P + p
      for u = 1, T do gam[u][path[u] + 1] = gam[u][path[u] + 1] + p end
      return
    end
    for k = 0, V - 1 do
      path[t] = k
      rec(t + 1, p * sm[t][k + 1])
    end
  end
  rec(1, 1)
  for t = 1, T do for v = 1, V do gam[t][v] = P > 0 and gam[t][v] / P or 0 end end
  return -math.log(P), sm, gam, P
end

local function check_brute(dtype, blank, tol)
  local T, V = 6, 4
  local lab = blank == 3 and {0, 1, 2} or {1, 2, 3}
  local a, bb, c = lab[1], lab[2], lab[3]
  local tg = {{a, bb}, {bb, bb}, {}, {c, c, c}, {a, bb, c, a}, {c}}
  local lens = {6, 5, 4, 4, 6, 1} -- {c, c, c} in 4 frames needs 5: infeasible
  local x = rand_table(T, #tg, V, 7 + blank)
  local logits = rl.tensor(x, dtype)
  local targets, tl = target_tensor(tg)
  local loss, grad = rl.ctc_loss(logits, targets, rl.tensor(lens, "int32"), tl, {blank = blank})
  check(loss:dtype() == dtype and grad:dtype() == dtype, "dtypes")
  local lt, gt = loss:totable(), grad:totable()
  for b = 1, #tg do
    local nll, sm, gam, P = brute(x, b, lens[b], V, tg[b], blank)
    if P == 0 then
      check(lt[b] == math.huge, "infeasible target: loss inf, got " .. lt[b])
      for t = 1, T do for v = 1, V do check(gt[t][b][v] == 0, "infeasible: zero gradient") end end
    else
      H.near(lt[b], nll, tol * math.max(1, math.abs(nll)), string.format("loss of sequence %d", b))
      for t = 1, T do
        for v = 1, V do
          local want = t <= lens[b] and sm[t][v] - gam[t][v] or 0
          H.near(gt[t][b][v], want, tol, string.format("grad seq %d t %d v %d", b, t, v))
          if t > lens[b] then check(gt[t][b][v] == 0, "padded frames get exactly 0") end
        end
      end
    end
  end
end

test("brute force, float64, blank last", function() check_brute("float64", 3, 1e-10) end)
test("brute force, float64, blank 0", function() check_brute("float64", 0, 1e-10) end)
test("brute force, float32", function() check_brute("float32", 3, 2e-5) end)

test("default blank is V - 1, zero_infinity", function()
  local x = rl.tensor(rand_table(3, 2, 3, 1), "float64")
  local targets, tl = target_tensor({{0, 0, 0}, {1}})
  local il = rl.tensor({3, 3}, "int32")
  local l1 = rl.ctc_loss(x, targets, il, tl)
  local l2 = rl.ctc_loss(x, targets, il, tl, {blank = 2})
  check(l1[1] == math.huge and l1[2] == l2[2], "default blank")
  local l3, g3 = rl.ctc_loss(x, targets, il, tl, {zero_infinity = true})
  check(l3[1] == 0 and l3[2] == l1[2], "zero_infinity: 0 for the infeasible one")
  check(g3:select(2, 1):abs():max() == 0, "its gradient is 0")
end)

test("float64 gradient check (central differences)", function()
  local T, B, V = 7, 3, 5
  local x = rl.tensor(rand_table(T, B, V, 11), "float64")
  local targets, tl = target_tensor({{0, 1, 1}, {3}, {2, 0, 2, 1}})
  local il = rl.tensor({7, 4, 6}, "int32")
  local _, grad = rl.ctc_loss(x, targets, il, tl, {blank = 4})
  local gt, worst = grad:totable(), 0
  local flat = x:view(T * B * V)
  local eps = 1e-6
  for i = 1, T * B * V do
    local v0 = flat[i]
    flat[i] = v0 + eps
    local lp = rl.ctc_loss(x, targets, il, tl, {blank = 4}):sum()
    flat[i] = v0 - eps
    local lm = rl.ctc_loss(x, targets, il, tl, {blank = 4}):sum()
    flat[i] = v0
    local t, r = (i - 1) // (B * V) + 1, (i - 1) % (B * V)
    local b, v = r // V + 1, r % V + 1
    local num = (lp - lm) / (2 * eps)
    worst = math.max(worst, math.abs(num - gt[t][b][v]))
  end
  check(worst < 1e-7, "max abs error " .. worst)
end)

test("ragged batch: NaN in padded frames and garbage after each target do not leak", function()
  local T, B, V = 9, 4, 6
  local x = rand_table(T, B, V, 5)
  local lens = {9, 3, 6, 1}
  local clean = rl.tensor(x, "float32")
  for b = 1, B do for t = lens[b] + 1, T do for v = 1, V do x[t][b][v] = 0 / 0 end end end
  local dirty = rl.tensor(x, "float32")
  local tg = {{0, 1, 2, 3}, {4, 4}, {1}, {}}
  local t1, tl = target_tensor(tg, 0)
  local t2 = target_tensor(tg, 99)
  local il = rl.tensor(lens, "int32")
  local l1, g1 = rl.ctc_loss(clean, t1, il, tl, {blank = 5})
  local l2, g2 = rl.ctc_loss(dirty, t2, il, tl, {blank = 5})
  check(rl.eq(l1, l2):min() == 1, "same losses")
  check(rl.eq(g1, g2):min() == 1, "same gradients")
  check(g2:ne(g2):sum() == 0, "no NaN in the gradient")
  for b = 1, B do
    if lens[b] < T then
      check(g2:select(2, b):narrow(1, lens[b] + 1, T - lens[b]):abs():max() == 0, "zero padding")
    end
  end
end)

test("a NaN in a valid frame gives a NaN loss (not a silent number)", function()
  for _, dtype in ipairs({"float32", "float64"}) do
    local x = rand_table(6, 3, 4, 9)
    x[4][1][2], x[2][2][1], x[6][3][4] = 0 / 0, 0 / 0, 0 / 0
    local targets, tl = target_tensor({{0, 1}, {}, {2, 2}})
    local loss = rl.ctc_loss(rl.tensor(x, dtype), targets, rl.tensor({6, 6, 6}, "int32"), tl)
    for b = 1, 3 do check(loss[b] ~= loss[b], dtype .. " sequence " .. b .. ": " .. loss[b]) end
  end
end)

test("the targets may be a transposed (S, B) batch target", function()
  local x = rl.tensor(rand_table(5, 3, 4, 2))
  local targets, tl = target_tensor({{0, 1}, {2}, {1, 1}})
  local il = rl.tensor({5, 5, 4}, "int32")
  local l1, g1 = rl.ctc_loss(x, targets, il, tl)
  local sb = targets:t():contiguous()  -- (S, B), as rl.batches gives it
  local l2, g2 = rl.ctc_loss(x, sb:t(), il, tl)
  check(rl.eq(l1, l2):min() == 1 and rl.eq(g1, g2):min() == 1, "same results")
end)

test("long inputs: float32 stays finite and close to float64 (T = 3000)", function()
  local T, V = 3000, 5
  local x = rand_table(T, 1, V, 3)
  local lab = {}
  for s = 1, 400 do lab[s] = s % 4 end
  local targets, tl = target_tensor({lab})
  local il = rl.tensor({T}, "int32")
  local l32, g32 = rl.ctc_loss(rl.tensor(x, "float32"), targets, il, tl, {blank = 4})
  local l64, g64 = rl.ctc_loss(rl.tensor(x, "float64"), targets, il, tl, {blank = 4})
  check(l32[1] < math.huge and l32[1] == l32[1], "finite")
  H.near(l32[1], l64[1], 1e-5 * l64[1], "loss")
  check((g32:double() - g64):abs():max() < 2e-3, "gradients close")
  -- every frame's gradient sums to 0 (softmax and posteriors both sum to 1)
  check(g64:sum(3):abs():max() < 1e-9, "rows sum to 0")
end)

test("threads give the same numbers as one thread", function()
  local T, B, V = 200, 9, 8
  local x = rl.tensor(rand_table(T, B, V, 4))
  local tg, lens = {}, {}
  for b = 1, B do
    tg[b] = {}
    for s = 1, 10 + 7 * b do tg[b][s] = (s * b) % 7 end
    lens[b] = T - 11 * b
  end
  local targets, tl = target_tensor(tg)
  local il = rl.tensor(lens, "int32")
  local n = rl.get_num_threads()
  rl.set_num_threads(1)
  local l1, g1 = rl.ctc_loss(x, targets, il, tl)
  rl.set_num_threads(2)
  local l2, g2 = rl.ctc_loss(x, targets, il, tl)
  rl.set_num_threads(n)
  check(rl.eq(l1, l2):min() == 1 and rl.eq(g1, g2):min() == 1, "identical")
end)

-- bad input
local x0 = rl.randn(4, 2, 3)
local il0 = rl.tensor({4, 3}, "int32")
local function bad(name, targets, pattern, il, tl, opts, x)
  expect_error(name, function()
    local t, l = target_tensor(targets)
    rl.ctc_loss(x or x0, t, il or il0, tl or l, opts)
  end, pattern)
end
bad("label >= V", {{0, 1}, {3}}, "rl.ctc_loss: sequence 2: label 3 at position 1 is outside 0..2")
bad("label < 0", {{0, -1}, {1}}, "rl.ctc_loss: sequence 1: label -1 at position 2")
bad("the blank inside a target", {{0, 2}, {1}}, "sequence 1: label at position 2 is the blank (2)")
bad("blank 0 inside a target", {{0, 1}, {1}}, "sequence 1: label at position 1 is the blank (0)",
  nil, nil, {blank = 0})
bad("a target longer than its input", {{0}, {0, 1, 0, 1}},
  "rl.ctc_loss: sequence 2: its target of 4 labels is longer than its input of 3 frames")
bad("input_lengths of the wrong dtype", {{0}, {1}}, "rl.ctc_loss: input_lengths must be a (2) int32",
  rl.tensor({4, 3}))
bad("input_lengths of the wrong shape", {{0}, {1}},
  "rl.ctc_loss: input_lengths must be a (2) int32", rl.tensor({4, 3, 1}, "int32"))
bad("input_lengths beyond T", {{0}, {1}}, "rl.ctc_loss: sequence 1: input_lengths = 5 is outside 0..4",
  rl.tensor({5, 3}, "int32"))
bad("target_lengths of the wrong dtype", {{0}, {1}}, "rl.ctc_loss: target_lengths must be a (2) int32",
  nil, rl.tensor({1, 1}))
bad("target_lengths beyond S", {{0}, {1}}, "rl.ctc_loss: sequence 2: target_lengths = 2 is outside 0..1",
  nil, rl.tensor({1, 2}, "int32"))
bad("blank out of range", {{0}, {1}}, "rl.ctc_loss: blank = 3 is outside 0..2", nil, nil, {blank = 3})
bad("unknown option", {{0}, {1}}, "rl.ctc_loss: unknown option 'blnk'", nil, nil, {blnk = 1})
bad("int32 logits", {{0}, {1}}, "rl.ctc_loss: logits must be a contiguous (T, B, V) float32",
  nil, nil, nil, rl.zeros({4, 2, 3}, "int32"))
expect_error("targets of the wrong dtype", function()
  rl.ctc_loss(x0, rl.zeros(2, 1), il0, rl.tensor({1, 1}, "int32"))
end, "rl.ctc_loss: targets must be a (2, S) int32 tensor")
expect_error("targets of the wrong batch size", function()
  rl.ctc_loss(x0, rl.zeros({3, 1}, "int32"), il0, rl.tensor({1, 1}, "int32"))
end, "rl.ctc_loss: targets must be a (2, S) int32 tensor")

---------------------------------------------------------------------------- decoding

local function logp_tensor(rows) -- rows[t] = probabilities of frame t (B = 1)
  local x = {}
  for t, r in ipairs(rows) do
    x[t] = {{}}
    for v, p in ipairs(r) do x[t][1][v] = math.log(p) end
  end
  return rl.tensor(x, "float64")
end

test("best path on hand-made posteriors", function()
  -- classes a = 0, b = 1, blank = 2: frames a a - b b - b -> a b b
  local rows = {}
  for t, c in ipairs({0, 0, 2, 1, 1, 2, 1}) do
    rows[t] = {0.1, 0.1, 0.1}
    rows[t][c + 1] = 0.8
  end
  local x = logp_tensor(rows)
  local hyp = rl.ctc_decode(x, rl.tensor({7}, "int32"))
  check(table.concat(hyp[1], ",") == "0,1,1", "a b b: " .. table.concat(hyp[1], ","))
  hyp = rl.ctc_decode(x, rl.tensor({3}, "int32"))
  check(table.concat(hyp[1], ",") == "0", "only the first 3 frames")
  hyp = rl.ctc_decode(x, rl.tensor({7}, "int32"), {blank = 0})
  check(table.concat(hyp[1], ",") == "2,1,2,1", "blank 0: " .. table.concat(hyp[1], ","))
end)

test("prefix beam search finds a more probable labelling than the best path", function()
  -- each frame: a 0.4, blank 0.6. Best path: blank blank = "" (0.36);
  -- "a" sums aa, a-, -a = 0.64
  local x = logp_tensor({{0.4, 0.6}, {0.4, 0.6}})
  local len = rl.tensor({2}, "int32")
  local best = rl.ctc_decode(x, len)[1]
  local beam = rl.ctc_decode(x, len, {beam = 3})[1]
  check(#best == 0 and #beam == 1 and beam[1] == 0, "beam finds 'a'")
  local function prob(labels)
    local t, l = target_tensor({labels})
    return math.exp(-rl.ctc_loss(x, t, len, l, {blank = 1})[1])
  end
  H.near(prob(best), 0.36, 1e-12, "P(best path)")
  H.near(prob(beam), 0.64, 1e-12, "P(beam)")
end)

test("prefix beam search with a wide beam is exact (brute force, repeats)", function()
  local T, V, blank = 5, 3, 2
  local x = rand_table(T, 1, V, 21)
  local lt = rl.tensor(x, "float64")
  -- the most probable labelling by enumerating every path
  local best, bestp = nil, -1
  local byl = {}
  local sm = select(2, brute(x, 1, T, V, {}, blank))
  local path = {}
  local function rec(t, p)
    if t > T then
      local k = table.concat(collapse(path, blank), ",")
      byl[k] = (byl[k] or 0) + p
      return
    end
    for c = 0, V - 1 do path[t] = c; rec(t + 1, p * sm[t][c + 1]) end
  end
  rec(1, 1)
  for k, p in pairs(byl) do if p > bestp then best, bestp = k, p end end
  local hyp = rl.ctc_decode(lt, rl.tensor({T}, "int32"), {beam = 64})[1]
  check(table.concat(hyp, ",") == best, "beam " .. table.concat(hyp, ",") .. " vs " .. best)
end)

expect_error("ctc_decode: blank out of range", function()
  rl.ctc_decode(rl.zeros(2, 1, 3), rl.tensor({2}, "int32"), {blank = 3})
end, "rl.ctc_decode: blank = 3 is outside 0..2")
expect_error("ctc_decode: lengths of the wrong dtype", function()
  rl.ctc_decode(rl.zeros(2, 1, 3), rl.tensor({2}))
end, "rl.ctc_decode: lengths must be a (1) int32 tensor")
expect_error("ctc_decode: a length beyond T", function()
  rl.ctc_decode(rl.zeros(2, 2, 3), rl.tensor({2, 3}, "int32"), {beam = 2})
end, "rl.ctc_decode: sequence 2: length 3 is outside 0..2")
-- beam x classes beyond int32: the message said "beam N with V classes, blank B", not what
-- was wrong, after a position inside the library
for _, beam in ipairs{1 << 40, 1 << 62} do
  expect_error("ctc_decode: beam " .. beam, function()
    rl.ctc_decode(rl.zeros(2, 1, 3), rl.tensor({2}, "int32"), {beam = beam})
  end, "rl.ctc_decode: beam " .. beam .. " is too large: beam x classes (3) must stay below 2^31")
  test("ctc_decode: beam " .. beam .. " names no library position", function()
    local ok, err = pcall(rl.ctc_decode, rl.zeros(2, 1, 3), rl.tensor({2}, "int32"), {beam = beam})
    check(not ok and not tostring(err):find("lua/rnnlua/", 1, true), tostring(err))
  end)
end
expect_error("ctc_decode: bad beam", function()
  rl.ctc_decode(rl.zeros(2, 1, 3), rl.tensor({2}, "int32"), {beam = 0})
end, "rl.ctc_decode: beam must be a positive integer")

-- The C prefix beam search against the Lua one it replaced (tests/lua/ctc_beam_ref.lua): the
-- same labels on random batches, with ragged lengths, NaN in padded frames, logits rounded to
-- one decimal (ties, broken by the prefix) and 1 or 2 threads.
test("prefix beam search in C equals the Lua reference (random batches)", function()
  local ref = dofile("tests/lua/ctc_beam_ref.lua")
  local g = rl.datasets.new_rng(123)
  local threads = rl.get_num_threads()
  local cases, differ = 0, {}
  for k = 1, 150 do
    local T, B, V = 1 + g:int(0, 11), 1 + g:int(0, 3), 2 + g:int(0, 4)
    local x = rand_table(T, B, V, 1000 + k)
    if k % 3 == 0 then
      for t = 1, T do for b = 1, B do for v = 1, V do
        x[t][b][v] = math.floor(x[t][b][v] * 2 + 0.5) / 4
      end end end
    end
    local lens = {}
    for b = 1, B do lens[b] = g:int(0, T) end
    lens[1] = T
    for t = 1, T do for b = 1, B do
      if t > lens[b] then for v = 1, V do x[t][b][v] = 0 / 0 end end
    end end
    local lt = rl.tensor(x, k % 2 == 0 and "float64" or "float32")
    local len = rl.tensor(lens, "int32")
    local blank, beam = g:int(0, V - 1), 2 + g:int(0, 6)
    local want = ref.decode(lt, len, blank, beam)
    for _, n in ipairs({1, 2}) do
      rl.set_num_threads(n)
      local got = rl.ctc_decode(lt, len, {blank = blank, beam = beam})
      for b = 1, B do
        if table.concat(got[b], ",") ~= table.concat(want[b], ",") then
          differ[#differ + 1] = string.format("case %d seq %d threads %d: %s vs %s", k, b, n,
            table.concat(got[b], ","), table.concat(want[b], ","))
        end
      end
      cases = cases + B
    end
  end
  rl.set_num_threads(threads)
  check(#differ == 0, #differ .. " of " .. cases .. " differ: " .. table.concat(differ, "; ", 1,
    math.min(#differ, 5)))
end)

expect_error("ctc_decode: a NaN logit in a valid frame names the sequence and frame", function()
  local v = rand_table(3, 2, 4, 5)
  v[2][2][3] = 0 / 0
  rl.ctc_decode(rl.tensor(v), rl.tensor({3, 3}, "int32"), {beam = 4})
end, "rl.ctc_decode: sequence 2, frame 2: a NaN or +inf logit")

test("edit_distance", function()
  check(rl.edit_distance({1, 2, 3}, {1, 3}) == 1, "deletion")
  check(rl.edit_distance({}, {4, 5}) == 2, "from empty")
  check(rl.edit_distance({1, 2, 3, 4}, {2, 3, 4, 5}) == 2, "shift")
  check(rl.edit_distance({7, 7}, {7, 7}) == 0, "equal")
  check(rl.edit_distance(rl.tensor({1, 2}, "int32"), {2, 1}) == 2, "tensor and table")
end)
expect_error("edit_distance: not integers", function() rl.edit_distance({"a"}, {}) end,
  "rl.edit_distance: argument 1: entry 1 is not an integer")

-- A -inf logit on a frame the only alignment needs makes the target impossible: an infinite
-- loss (0 and a zero gradient with zero_infinity), never NaN, in both dtypes; a -inf logit on
-- a class no alignment uses changes nothing.
for _, dtype in ipairs({"float32", "float64"}) do
  test("-inf logit: impossible, not NaN (" .. dtype .. ")", function()
    local x = rl.tensor(rand_table(3, 2, 3, 11), dtype)
    -- target {1, 1} in 3 frames has one alignment: 1 blank 1; frame 2 cannot be the blank
    x[2][1][1] = -math.huge
    x[2][2][3] = -math.huge -- class 2 is used by no alignment of sequence 2's target {1}
    local targets, tl = target_tensor({{1, 1}, {1}})
    local il = rl.tensor({3, 3}, "int32")
    local l, g = rl.ctc_loss(x, targets, il, tl, {blank = 0})
    check(l[1] == math.huge, "loss of the impossible sequence: " .. tostring(l[1]))
    check(l[2] == l[2] and l[2] < math.huge, "the other sequence: " .. tostring(l[2]))
    local gs = g:select(2, 2):totable()
    for t = 1, 3 do for v = 1, 3 do check(gs[t][v] == gs[t][v], "gradient NaN") end end
    local lz, gz = rl.ctc_loss(x, targets, il, tl, {blank = 0, zero_infinity = true})
    check(lz[1] == 0, "zero_infinity loss: " .. tostring(lz[1]))
    local g1 = gz:select(2, 1):totable()
    for t = 1, 3 do for v = 1, 3 do check(g1[t][v] == 0, "zero_infinity gradient not 0") end end
  end)
end

test("blank = -1 is refused by rl.ctc_loss as by rl.ctc_decode", function()
  local targets, tl = target_tensor({{1}})
  local ok, err = pcall(rl.ctc_loss, rl.zeros(3, 1, 3), targets, rl.tensor({3}, "int32"), tl,
    {blank = -1})
  check(not ok and tostring(err):find("blank = -1 is outside 0..2", 1, true), tostring(err))
end)

test("ctc_decode beam = 1 refuses NaN frames as the beam search does", function()
  local x = rl.zeros(3, 2, 3)
  x[2][2][2] = 0 / 0
  for _, beam in ipairs({1, 2}) do
    local ok, err = pcall(rl.ctc_decode, x, rl.tensor({3, 3}, "int32"), {blank = 0, beam = beam})
    check(not ok and tostring(err):find("sequence 2, frame 2: a NaN or +inf logit", 1, true),
      "beam " .. beam .. ": " .. tostring(err))
  end
  -- a NaN on a padded frame is not looked at
  local r = rl.ctc_decode(x, rl.tensor({3, 1}, "int32"), {blank = 0, beam = 1})
  check(#r == 2, "padded NaN")
end)

H.done()
