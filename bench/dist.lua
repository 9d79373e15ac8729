-- Data-parallel training throughput (rnnlua.dist): 1 process with 2 BLAS threads against 2
-- processes (mpirun -np 2) with 1 thread each, on the LSTM topologies ptb_small (1x200 LSTM,
-- input 200 (the embedding), vocab 10k, T=20, B=20) and chime (3x BLSTM 512, in 45, out 1501,
-- T=250, B=16). A step is what rl.train does: zero the gradients, forward, backward, (2
-- processes: sum the gradients over the ranks, mode sync, the engine's own Dist:step) and a
-- plain SGD step; every process works on its own batch of B sequences, so 2 processes move
-- twice the frames per step. Prints a Markdown table: frames/s of each, their ratio, the
-- allreduce time per step and its share of the step, the parameter bytes summed per step.
-- Rounds alternate between the two variants (median of RL_BENCH_ROUNDS, default 3);
-- RL_BENCH_STEPS overrides the timed steps per measurement, RL_BENCH_TOPOS="chime" picks
-- topologies. SKIP without MPI or mpirun.
--   ./rnnlua bench/dist.lua                          the comparison (run by `make bench`)
--   mpirun -np N ./rnnlua bench/dist.lua worker TOPO STEPS THREADS   one measurement
local TOPOS = {
  ptb_small = {layers = 1, dirs = 1, input = 200, hidden = 200, classes = 10000, T = 20, B = 20,
               steps = 12},
  chime = {layers = 3, dirs = 2, input = 45, hidden = 512, classes = 1501, T = 250, B = 16,
           steps = 2},
}
local ORDER = {}
for name in (os.getenv("RL_BENCH_TOPOS") or "ptb_small chime"):gmatch("[%w_]+") do
  ORDER[#ORDER + 1] = name
end

local function network(t)
  local net, prev = {}, "data"
  for l = 1, t.layers do
    local from = {}
    for d = 1, t.dirs do
      local name = string.format("l%d_%s", l, d == 1 and "fw" or "bw")
      net[name] = {class = "lstm", n_out = t.hidden, from = prev, direction = d == 1 and 1 or -1}
      from[#from + 1] = name
    end
    prev = from
  end
  net.output = {class = "softmax", n_out = t.classes, from = prev, loss = "ce", target = "classes"}
  return net
end

-- One measurement on every rank; rank 0 prints "RESULT frames_per_s allreduce_s step_s params".
local function worker(name, steps, threads)
  local t = assert(TOPOS[name], "unknown topology " .. tostring(name))
  rl.set_num_threads(threads)
  rl.manual_seed(1 + rl.dist.rank())
  local net = rl.network(network(t), {data = {dim = t.input}, classes = {dim = t.classes,
                                                                        sparse = true}})
  local opt = rl.optimizer({class = "sgd"}, net:params(), net:grads())
  local dist = require("rnnlua.dist").setup({seed = 1, device = "cpu"})
  local batch = {data = rl.randn(t.T, t.B, t.input),
                 classes = rl.randint and rl.randint(0, t.classes, {t.T, t.B}, "int32")
                   or rl.zeros({t.T, t.B}, "int32"),
                 lengths = rl.tensor((function()
                   local l = {}
                   for b = 1, t.B do l[b] = t.T end
                   return l
                 end)(), "int32")}
  local function step(i)
    net:zero_grads()
    net:forward(batch)
    net:backward()
    if dist then dist:step(opt, 1e-6, net, i, true) else opt:step(1e-6) end
  end
  step(0) -- buffers sized, caches warm
  if dist then rl.dist.barrier(); dist.comm_time = 0 end
  local t0 = rl.clock()
  for i = 1, steps do step(i) end
  local dt = rl.clock() - t0
  local comm = dist and dist.comm_time or 0
  if dist then comm, dt = dist:sum(comm, dt) ; comm, dt = comm / dist.size, dt / dist.size end
  if rl.dist.rank() == 0 then
    print(string.format("RESULT %.6g %.6g %.6g %d", rl.dist.size() * t.T * t.B * steps / dt,
      comm / steps, dt / steps, net:num_params()))
  end
end

if arg[1] == "worker" then
  worker(arg[2], tonumber(arg[3]), tonumber(arg[4]))
  return
end

print("### Data-parallel training: 1 process x 2 threads vs 2 processes x 1 thread")
print()
if not rl.dist.built() then
  print("SKIP bench/dist.lua: this rnnlua was built without MPI (MPI=0)")
  return
end
if not os.execute("command -v mpirun >/dev/null 2>&1") then
  print("SKIP bench/dist.lua: no mpirun (openmpi-bin; scripts/deps.sh)")
  return
end

local bin = arg[-1] or "./rnnlua"
local script = arg[0]
local rounds = tonumber(os.getenv("RL_BENCH_ROUNDS")) or 3

local function run(cmd)
  local p = assert(io.popen(cmd .. " 2>&1"))
  local out = p:read("a")
  p:close()
  local f, c, s, n = out:match("RESULT (%S+) (%S+) (%S+) (%d+)")
  if not f then error("bench/dist.lua: no result from: " .. cmd .. "\n" .. out, 0) end
  return {fps = tonumber(f), comm = tonumber(c), step = tonumber(s), params = tonumber(n)}
end

local function median(xs, key)
  local v = {}
  for i, x in ipairs(xs) do v[i] = x[key] end
  table.sort(v)
  return v[(#v + 1) // 2]
end

print("| topology | params | 1 proc x 2 thr frames/s | 2 proc x 1 thr frames/s | ratio |"
  .. " step (2 proc) | allreduce/step | share |")
print("|---|---:|---:|---:|---:|---:|---:|---:|")
local mpirun = "OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 mpirun --allow-run-as-root"
  .. " -np 2 --oversubscribe --bind-to none "
local measured = {}
for _, name in ipairs(ORDER) do
  local steps = tonumber(os.getenv("RL_BENCH_STEPS")) or TOPOS[name].steps
  local one, two = {}, {}
  for _ = 1, rounds do
    one[#one + 1] = run(string.format("%s %s worker %s %d 2", bin, script, name, steps))
    two[#two + 1] = run(string.format("%s %s %s worker %s %d 1", mpirun, bin, script, name, steps))
  end
  local f1, f2 = median(one, "fps"), median(two, "fps")
  local comm, step = median(two, "comm"), median(two, "step")
  print(string.format("| %s | %.2fM (%.0f MB) | %.0f | %.0f | %.2f | %.0f ms | %.1f ms | %.1f%% |",
    name, one[1].params / 1e6, one[1].params * 4 / 1e6, f1, f2, f2 / f1, step * 1e3, comm * 1e3,
    100 * comm / step))
  measured[#measured + 1] = {name = name, bytes = one[1].params * 4, compute = step - comm}
end
print()
print("ratio = 2 processes' frames/s / 1 process's; allreduce/step: the time of the gradient sum")
print("(rnnlua.dist, buckets of 32 MB) per step of 2 processes, share: of the whole step.")
print()
-- A ring allreduce (what MPI and NCCL use for large buffers) sends and receives 2 (N-1)/N of
-- the buffer per worker, in 2 (N-1) rounds: t = 2 (N-1)/N * S / bandwidth + 2 (N-1) * latency.
local LAT = 20e-6
print("Modelled gradient sum per step (ring allreduce: 2(N-1)/N x S bytes per worker at the")
print(string.format("link rate, plus 2(N-1) x %.0f us latency) against the compute per step", LAT * 1e6))
print("measured above (2-process step minus its allreduce, one batch per worker); share =")
print("allreduce / (compute + allreduce) when nothing overlaps:")
print()
print("| topology | S | compute/step | N | 10 Gbit/s | share | 100 Gbit/s | share |")
print("|---|---:|---:|---:|---:|---:|---:|---:|")
for _, m in ipairs(measured) do
  for _, n in ipairs({8, 64}) do
    local cells = {}
    for _, gbit in ipairs({10, 100}) do
      local t = 2 * (n - 1) / n * m.bytes / (gbit * 1e9 / 8) + 2 * (n - 1) * LAT
      cells[#cells + 1] = string.format("%.1f ms | %.0f%%", t * 1e3, 100 * t / (m.compute + t))
    end
    print(string.format("| %s | %.0f MB | %.0f ms | %d | %s | %s |", m.name, m.bytes / 1e6,
      m.compute * 1e3, n, cells[1], cells[2]))
  end
end
