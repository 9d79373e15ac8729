-- NCCL parity under `mpirun -np 2` (tests/gpu/test_dist_nccl.sh): rl.dist's allreduce and
-- broadcast of tensors on cuda:<local rank> (NCCL, kernels/cuda/nccl.cu) must give exactly what
-- the same collectives give on CPU tensors (MPI), and a sync rl.train with device = "cuda" must
-- end with parameters close (relative 1e-4) to the same run on the CPU and bit-identical on
-- both ranks. The CPU references always run; the device part needs a CUDA build with NCCL and
-- a GPU per rank (two ranks cannot share one GPU in NCCL), otherwise it prints a SKIP line.
local H = dofile("tests/lua/harness.lua")
local rank, size = rl.dist.rank(), rl.dist.size()

local function rank1(t)
  local c = t:clone()
  rl.dist.broadcast(c, 1)
  return c
end

-- CPU references (MPI)
rl.manual_seed(10 + rank)
local x = rl.randn(1000, 3)
local sum_cpu = rl.dist.allreduce(x:clone())
local bc_cpu = rl.dist.broadcast(x:clone(), 1)
H.test("CPU references", function()
  H.check(size == 2, "needs mpirun -np 2, got a world of " .. size)
  H.check((bc_cpu - rank1(x)):abs():max() == 0, "broadcast from rank 1")
end)

local cfg = {
  network = {fw = {class = "lstm", n_out = 8},
             output = {class = "softmax", from = {"fw"}, loss = "ce", target = "classes"}},
  train = {class = "12ax", num_seqs = 40, seed = 3, max_len = 30}, num_epochs = 2,
  batch_size = 200, max_seqs = 4, optimizer = {class = "sgd"}, learning_rate = 0.003,
  log_verbosity = 0, seed = 5,
}
local on_cpu = rl.train(cfg)

-- every rank must agree whether the device part runs, or the collectives would not pair
local can = rl.tensor({(rl.device_count() > rl.dist.local_rank()) and 1 or 0})
rl.dist.allreduce(can)
if can[1] < size then
  if rank == 0 then
    print("SKIP: the NCCL part needs a CUDA build with NCCL and one GPU per rank (this rank sees "
      .. rl.device_count() .. ")")
  end
else
  local dev = "cuda:" .. rl.dist.local_rank()
  H.test("allreduce on the device = on the CPU", function()
    local g = rl.dist.allreduce(x:to(dev))
    H.check((g:cpu() - sum_cpu):abs():max() == 0, "sums differ")
  end)
  H.test("broadcast on the device = on the CPU", function()
    local g = rl.dist.broadcast(x:to(dev), 1)
    H.check((g:cpu() - bc_cpu):abs():max() == 0, "broadcasts differ")
  end)
  local c = {}
  for k, v in pairs(cfg) do c[k] = v end
  c.device = "cuda"
  local on_gpu = rl.train(c)
  local p, p1 = on_gpu.net:params():cpu(), nil
  p1 = rank1(p)
  H.test("sync rl.train on the GPUs = on the CPU, identical on both ranks", function()
    local want = on_cpu.net:params()
    local d = (p - want):abs():max() / want:abs():max()
    H.check(d <= 1e-4, string.format("relative difference %.3g", d))
    H.check((p - p1):abs():max() == 0, "the ranks' parameters differ")
  end)
end

local t = rl.tensor({H.passed, H.failed}, "float64")
rl.dist.allreduce(t)
if rank == 0 then
  print(string.format("%d passed, %d failed", math.tointeger(t[1]), math.tointeger(t[2])))
end
if t[2] ~= 0 then error(string.format("%d checks failed", math.tointeger(t[2])), 0) end
