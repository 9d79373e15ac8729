-- CTC prefix beam search: rl.ctc_decode{beam = n} (C, kernels/cpu/ctc_beam.c, sequences over
-- threads) against the Lua search it replaced (tests/lua/ctc_beam_ref.lua), on the same float32
-- logits (T, B, V) = 2 N(0, 1) (seeded), full-length sequences, blank V - 1. The C search runs
-- with 1 thread and with rl.get_num_threads() threads; the log-softmax is inside both timings.
-- Rounds alternate C 1 thread, C N threads, Lua; each figure is the median over RL_BENCH_ROUNDS
-- (default 5) rounds of at least RL_BENCH_SECONDS (default 0.5) s each (the Lua search takes
-- one call per round where a call is longer). The labels of both are compared.
local B = dofile("bench/bench.lua")
local seconds, rounds, median = B.seconds, B.rounds, B.median
local threads = rl.get_num_threads()
local ref = dofile("tests/lua/ctc_beam_ref.lua")

-- seconds per call of fn, calling it until `seconds` have passed
local function per_call(fn)
  local n, t0 = 0, rl.clock()
  repeat
    fn()
    n = n + 1
  until rl.clock() - t0 >= seconds
  return (rl.clock() - t0) / n
end

local configs = {{100, 8, 30, 8}, {200, 4, 40, 16}, {400, 4, 80, 4}}
print("## CTC prefix beam search: C against the Lua search it replaced")
print()
print(string.format("%d threads for the threaded column; medians of %d rounds.", threads, rounds))
print()
print("| (T, B, V) | beam | Lua ms | C 1 thread ms | C " .. threads .. " threads ms | speed-up 1 thread"
  .. " | speed-up " .. threads .. " threads | same labels |")
print("|---|---:|---:|---:|---:|---:|---:|---|")
for _, c in ipairs(configs) do
  local T, B, V, beam = c[1], c[2], c[3], c[4]
  rl.manual_seed(7)
  local x = rl.randn(T, B, V) * 2
  local lens = rl.full({B}, T, "int32")
  local opts = {blank = V - 1, beam = beam}
  local same = true
  do
    local a, b = rl.ctc_decode(x, lens, opts), ref.decode(x, lens, V - 1, beam)
    for s = 1, B do same = same and table.concat(a[s], ",") == table.concat(b[s], ",") end
  end
  local t1, tn, tl = {}, {}, {}
  for _ = 1, rounds do
    rl.set_num_threads(1)
    t1[#t1 + 1] = per_call(function() rl.ctc_decode(x, lens, opts) end)
    rl.set_num_threads(threads)
    tn[#tn + 1] = per_call(function() rl.ctc_decode(x, lens, opts) end)
    tl[#tl + 1] = per_call(function() ref.decode(x, lens, V - 1, beam) end)
  end
  local m1, mn, ml = median(t1), median(tn), median(tl)
  print(string.format("| (%d, %d, %d) | %d | %.1f | %.2f | %.2f | %.0fx | %.0fx | %s |", T, B, V,
    beam, ml * 1e3, m1 * 1e3, mn * 1e3, ml / m1, ml / mn, same and "yes" or "NO"))
end
print()
