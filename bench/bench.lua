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

-- The description of the recurrent benchmarks' networks (bench/lstm_step.lua,
-- bench/recurrent_options.lua): `layers` layers of class `cls` with n_out `hid` (both directions
-- when bidir), each with the options in opts, then a softmax of `classes` with CE loss on the
-- sparse target "classes"; the input is "data".
function B.stack_desc(cls, layers, bidir, hid, classes, opts)
  local desc, prev = {}, {"data"}
  for li = 1, layers do
    local cur = {}
    for _, d in ipairs(bidir and {1, -1} or {1}) do
      local n = string.format("l%d_%s", li, d > 0 and "fw" or "bw")
      desc[n] = {class = cls, n_out = hid, from = prev, direction = d}
      for k, v in pairs(opts or {}) do desc[n][k] = v end
      cur[#cur + 1] = n
    end
    prev = cur
  end
  desc.output = {class = "softmax", n_out = classes, from = prev, loss = "ce", target = "classes"}
  return desc
end

return B
