-- CTC loss + gradient: rl.ctc_loss against PyTorch's CPU log_softmax + ctc_loss (reduction
-- "sum") + backward, float32, on (T, B, V, S) = (400, 16, 80, 100) and (1000, 32, 40, 200),
-- full-length sequences, the same inputs on both sides (logits 3 sin(0.1 t + 0.7 b + 1.3 v),
-- labels (7 s + 3 b) mod (V - 1), blank V - 1) so the losses are compared too. Both use the
-- same number of threads (rnnlua's default, rl.get_num_threads()). PyTorch comes from
-- bench/torch_env.sh (a SKIP column where it cannot be set up); each of its measurements is
-- one run of bench/torch_ctc.py, which warms up and then times its calls itself (the Python
-- start-up and the import are not timed). Rounds alternate rnnlua, PyTorch, rnnlua, ...;
-- each side's figure is the median over RL_BENCH_ROUNDS (default 5) rounds of about
-- RL_BENCH_SECONDS (default 0.5) s each.
-- RL_BENCH_DEVICE=cuda (the device kit): both sides on the GPU, rnnlua's inputs on cuda:0 and
-- each timed call ended by rl.synchronize, PyTorch's with torch.cuda.synchronize();
-- RL_BENCH_PYTHON names a python that imports torch instead of bench/torch_env.sh's (empty:
-- none, the PyTorch column is skipped).
local B = dofile("bench/bench.lua")
local seconds, rounds, median = B.seconds, B.rounds, B.median
local build = os.getenv("RL_BUILD_DIR") or "build"
local device = os.getenv("RL_BENCH_DEVICE") or "cpu"
local threads = rl.get_num_threads()

local py = os.getenv("RL_BENCH_PYTHON")
if py == "" then
  py = nil
elseif not py then
  local p = io.popen("bash bench/torch_env.sh " .. build .. " 2>/dev/null")
  local out = p and p:read("a") or ""
  if p then p:close() end
  local last = out:match("([^\n]+)\n?$")
  if last and last:match("python") then py = last end
end

local function inputs(T, B, V, S)
  local x = rl.arange(T):view(T, 1, 1):double():mul(0.1)
    + rl.arange(B):view(1, B, 1):double():mul(0.7)
    + rl.arange(V):view(1, 1, V):double():mul(1.3)
  x = x:sin():mul(3):float():contiguous()
  local tg = {}
  for b = 0, B - 1 do
    tg[b + 1] = {}
    for s = 0, S - 1 do tg[b + 1][s + 1] = (7 * s + 3 * b) % (V - 1) end
  end
  return x:to(device), rl.tensor(tg, "int32"), rl.full({B}, T, "int32"), rl.full({B}, S, "int32")
end

local function ctc(x, tg, il, tl, V)
  local loss = rl.ctc_loss(x, tg, il, tl, {blank = V - 1})
  if device ~= "cpu" then rl.synchronize(device) end
  return loss
end

local function torch_round(T, B, V, S, reps)
  local cmd = string.format("%s bench/torch_ctc.py %d %d %d %d %d %d %s 2>&1", py, T, B, V, S,
    reps, threads, device)
  local p = io.popen(cmd)
  local out = p:read("a")
  p:close()
  local dt, loss = out:match("([%d.e-]+) ([%d.e+-]+)\n?$")
  if not dt then error("bench/torch_ctc.py failed: " .. cmd .. "\n" .. out) end
  return tonumber(dt), tonumber(loss)
end

print(string.format("### CTC loss + gradient (rl.ctc_loss vs PyTorch, %s)", device))
print()
print(string.format("float32, %d thread(s) on both sides, median of %d interleaved rounds of " ..
  "~%.1f s; PyTorch: log_softmax + ctc_loss(reduction = \"sum\") + backward%s.", threads, rounds,
  seconds, py and "" or " (SKIP: bench/torch_env.sh could not set PyTorch up)"))
print()
print("| T, B, V, S | rnnlua ms | PyTorch ms | speed-up | loss rnnlua | loss PyTorch |")
print("|---|---:|---:|---:|---:|---:|")
for _, c in ipairs({{400, 16, 80, 100}, {1000, 32, 40, 200}}) do
  local T, B, V, S = c[1], c[2], c[3], c[4]
  local x, tg, il, tl = inputs(T, B, V, S)
  local loss = ctc(x, tg, il, tl, V)
  local t0 = rl.clock()
  ctc(x, tg, il, tl, V)
  local one = rl.clock() - t0
  local reps = math.max(1, math.floor(seconds / math.max(one, 1e-6) + 0.5))
  local treps
  local ours, theirs, tloss = {}, {}, nil
  for r = 1, rounds do
    t0 = rl.clock()
    for _ = 1, reps do ctc(x, tg, il, tl, V) end
    ours[r] = (rl.clock() - t0) / reps
    if py then
      if not treps then
        local d = torch_round(T, B, V, S, 1)
        treps = math.max(1, math.floor(seconds / math.max(d, 1e-6) + 0.5))
      end
      theirs[r], tloss = torch_round(T, B, V, S, treps)
    end
  end
  local mo = median(ours)
  local mt = py and median(theirs)
  print(string.format("| %d, %d, %d, %d | %.1f | %s | %s | %.6g | %s |", T, B, V, S, mo * 1e3,
    mt and string.format("%.1f", mt * 1e3) or "-", mt and string.format("%.2fx", mt / mo) or "-",
    loss:double():sum(), tloss and string.format("%.6g", tloss) or "-"))
end
print()
