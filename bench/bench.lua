-- What the Lua benchmarks share, as bench/bench.h does for the C ones: the measurement settings
-- from the environment and the median they report. Loaded from the repository root (where
-- bench/run.sh runs them) with dofile("bench/bench.lua"); not a benchmark itself.
local B = {}

-- Seconds of one measurement (RL_BENCH_SECONDS) and the number of interleaved rounds whose
-- median is reported (RL_BENCH_ROUNDS).
B.seconds = tonumber(os.getenv("RL_BENCH_SECONDS") or "") or 0.5
B.rounds = tonumber(os.getenv("RL_BENCH_ROUNDS") or "") or 5

-- The median of a list of numbers (the mean of the middle two for an even count); t is left as
-- it is.
function B.median(t)
  local s = table.move(t, 1, #t, 1, {})
  table.sort(s)
  local n = #s
  return n % 2 == 1 and s[(n + 1) // 2] or (s[n // 2] + s[n // 2 + 1]) / 2
end

return B
