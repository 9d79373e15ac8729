-- A training step (forward, backward, Adam) of the G2P model of recipes/g2p_cmudict.lua at
-- H = 128 without dropout (the recipe's defaults are H = 256 with dropout; the benchmark keeps
-- the smaller model so its figures stay comparable), batch 64, against the same
-- model in PyTorch (bench/torch_g2p.py: nn.LSTM encoder, a Python loop over decoder steps with
-- LSTMCell and additive attention), measured in one run with
-- interleaved rounds and reported as medians. PyTorch comes from bench/torch_env.sh (a SKIP
-- line where it cannot be set up). Shape: T = 8 letters, S = 8 phoneme steps (teacher
-- forcing), E = 32, H = 128, 30 letters, 41 phonemes; float32, with 1 and with 2 threads on
-- both sides (on a busy machine a 2-thread run suffers from threads waiting for each other).
-- RL_BENCH_SECONDS (per measurement, default 0.5) and RL_BENCH_ROUNDS (default 5). Reports
-- wall-clock and process CPU time per step.
-- RL_G2P_CELL=gru: the decoder's cell is a gru instead of the lstm, on both sides (PyTorch's
-- GRUCell). RL_G2P_STEPS=N: rnnlua alone runs N steps (after 2 warm-up steps)
-- on RL_G2P_THREADS threads (default 1) and prints its ms/step, for profiling (perf record) and
-- for comparing builds.
local T, S, B, E, H, VI, VO = 8, 8, 64, 32, 128, 30, 41
local seconds = tonumber(os.getenv("RL_BENCH_SECONDS") or "0.5")
local rounds = tonumber(os.getenv("RL_BENCH_ROUNDS") or "5")
local cell = os.getenv("RL_G2P_CELL") or "lstm"
if cell ~= "lstm" and cell ~= "gru" then
  error(string.format("bench/g2p.lua: RL_G2P_CELL = '%s', expected lstm or gru", cell), 0)
end
local only_steps = tonumber(os.getenv("RL_G2P_STEPS") or "")
rl.manual_seed(1)

local net = rl.network({
  emb_in = {class = "embedding", from = "data", n_out = E},
  fw = {class = "lstm", from = "emb_in", n_out = H},
  bw = {class = "lstm", from = "emb_in", n_out = H, direction = -1},
  enc = {class = "copy", from = {"fw", "bw"}},
  dec = {class = "rec", from = {}, unit = {
    emb = {class = "embedding", from = "prev:output", n_out = E},
    s = {class = cell, from = {"emb", "prev:att"}, n_out = H},
    att = {class = "attention", base = "base:enc", from = "s", kind = "additive", n_att = H},
    readout = {class = "linear", from = {"s", "att"}, n_out = H, activation = "tanh"},
    output_prob = {class = "softmax", from = "readout", loss = "ce", target = "classes"},
    output = {class = "choice", from = "output_prob", target = "classes"},
  }},
}, {data = {dim = VI, sparse = true}, classes = {dim = VO, sparse = true}})
local opt = rl.optimizer({class = "adam"}, net:params(), net:grads())
local batch = {
  data = (rl.rand(T, B) * VI):floor():clamp(0, VI - 1):int(), lengths = rl.full({B}, T, "int32"),
  classes = (rl.rand(S, B) * (VO - 1) + 1):floor():clamp(1, VO - 1):int(),
  lengths_classes = rl.full({B}, S, "int32"),
}
local function step()
  net:forward(batch)
  net:zero_grads()
  net:backward()
  opt:step(1e-3)
end

-- wall-clock and process CPU (os.clock) milliseconds per step
local function measure()
  for _ = 1, 2 do step() end
  local n, t0, c0 = 0, rl.clock(), os.clock()
  while rl.clock() - t0 < seconds do
    step()
    n = n + 1
  end
  return 1000 * (rl.clock() - t0) / n, 1000 * (os.clock() - c0) / n
end

if only_steps then
  rl.set_num_threads(tonumber(os.getenv("RL_G2P_THREADS") or "1"))
  for _ = 1, 2 do step() end
  local t0, c0 = rl.clock(), os.clock()
  for _ = 1, only_steps do step() end
  print(string.format("rnnlua %s decoder: %.3f ms/step, %.3f CPU ms/step (%d steps)", cell,
    1000 * (rl.clock() - t0) / only_steps, 1000 * (os.clock() - c0) / only_steps, only_steps))
  return
end

local p = io.popen("bash bench/torch_env.sh build 2>/dev/null")
local py = p and p:read("a"):match("([^\n]+)\n?$")
if p then p:close() end
local function torch_measure(threads)
  if not py then return nil end
  local f = io.popen(string.format("%s bench/torch_g2p.py %d %d %d %d %d %d %d %g %d %s 2>&1", py,
    T, S, B, E, H, VI, VO, seconds, threads, cell))
  local s = f:read("a")
  f:close()
  return tonumber(s:match("^ms/step ([%d.]+)")), tonumber(s:match("cpu_ms/step ([%d.]+)"))
end

local THREADS = {1, 2}
local ours, theirs, ours_cpu, theirs_cpu = {{}, {}}, {{}, {}}, {{}, {}}, {{}, {}}
for _ = 1, rounds do
  for k, n in ipairs(THREADS) do
    rl.set_num_threads(n)
    local w, c = measure()
    table.insert(ours[k], w)
    table.insert(ours_cpu[k], c)
    local t, tc = torch_measure(n)
    if t then table.insert(theirs[k], t) end
    if tc then table.insert(theirs_cpu[k], tc) end
  end
end
local function median(xs)
  if #xs == 0 then return nil end
  table.sort(xs)
  return xs[(#xs + 1) // 2]
end
print(string.format("### G2P training step (attention encoder-decoder, %s decoder, batch %d, T = "
  .. "%d, S = %d, H = %d, float32)\n", cell, B, T, S, H))
print("| threads | rnnlua ms/step | PyTorch 2.15.0 ms/step | rnnlua speed / PyTorch | rnnlua CPU "
  .. "ms/step | PyTorch CPU ms/step | CPU ratio |")
print("|---:|---:|---:|---:|---:|---:|---:|")
local function fmt(x, f) return x and string.format(f, x) or "-" end
for k, n in ipairs(THREADS) do
  local mo, mt = median(ours[k]), median(theirs[k])
  local co, ct = median(ours_cpu[k]), median(theirs_cpu[k])
  print(string.format("| %d | %.1f | %s | %s | %.1f | %s | %s |", n, mo, fmt(mt, "%.1f"),
    fmt(mt and mt / mo, "%.2fx"), co, fmt(ct, "%.1f"), fmt(ct and ct / co, "%.2fx")))
end
print(string.format("\nMedians of %d interleaved rounds; words/s = 64000 / (ms/step). CPU: the "
  .. "process's CPU time per step (all its threads; on a loaded machine the fairer 1-thread "
  .. "measure, as it leaves out time spent waiting for a core).%s", rounds,
  py and "" or " SKIP PyTorch: bench/torch_env.sh could not provide torch."))
