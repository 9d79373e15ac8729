-- Run by tests/sh/test_dist.sh under `mpirun -np 2`: rl.dist's collectives and data-parallel
-- rl.train (sync against one process on the union of the batches, average against sync, the
-- ranks' agreement, 12AX with 2 ranks, resuming). Every rank checks; rank 0 prints the
-- world's closing line. arg[1]: a scratch directory. With arg[2] = "resume" (1 process, no
-- launcher): the 12AX run of an earlier 2-rank run goes on for one more epoch.
package.path = "tests/lua/?.lua;" .. package.path
local H = require("harness")
local distmod = require("rnnlua.dist")
local dir = assert(arg[1], "usage: checks.lua SCRATCH_DIR")
local rank, size = rl.dist.rank(), rl.dist.size()
-- this script's arguments are its own (the scratch directory, "resume"), not rl.train overrides
local function train(cfg) return rl.train(cfg, {}) end

-- 12AX with 2 ranks, and the same run stopped after epoch 2 and resumed.
local function ax(model, epochs, load)
  return train({
    network = {fw = {class = "lstm", n_out = 32}, bw = {class = "lstm", n_out = 32, direction = -1},
               output = {class = "softmax", from = {"fw", "bw"}, loss = "ce", target = "classes"}},
    train = {class = "12ax", num_seqs = 1000, seed = 1, seq_ordering = "laplace:20"},
    dev = {class = "12ax", num_seqs = 200, seed = 2},
    num_epochs = epochs, batch_size = 1250, max_seqs = 13, load = load,
    optimizer = {class = "adam", gradient_clip_global_norm = 5}, learning_rate = 0.01,
    learning_rate_control = "newbob", model = model, log_verbosity = 0, seed = 1,
  })
end
if arg[2] == "resume" then
  -- one process goes on from the checkpoints of the 2-rank run below
  H.test("a 2-rank run resumed by 1 process", function()
    local r = ax(dir .. "/ax/net", 5, "last")
    H.check(r.epoch == 5 and size == 1, "epoch " .. r.epoch .. " of a world of " .. size)
    H.check(r.dev_error < 0.01, string.format("dev FER %.2f%%", 100 * r.dev_error))
  end)
  H.done()
end

H.test("world of 2", function()
  H.check(size == 2 and (rank == 0 or rank == 1), "rank " .. rank .. " of " .. size)
  H.check(rl.dist.active() and rl.dist.built(), "active and built")
  if os.getenv("RL_TEST_RANK_PER_HOST") then -- tests/sh/test_dist_hosts.sh
    H.check(rl.dist.local_rank() == 0, "one rank a host: local rank 0")
  else
    H.check(rl.dist.local_rank() == rank, "one machine: local rank = rank")
  end
end)

H.test("allreduce sums every dtype, the same on every rank", function()
  local f = rl.tensor({{rank + 1, 0.5}, {-rank, 3}})
  H.check(rl.dist.allreduce(f) == f, "returns its tensor")
  H.check(f[1][1] == 3 and f[1][2] == 1 and f[2][1] == -1 and f[2][2] == 6, "float32 sums")
  local d = rl.tensor({1e-17 * (rank + 1), 1}, "float64")
  rl.dist.allreduce(d)
  H.check(d[1] == 3e-17 and d[2] == 2, "float64 sums")
  local i = rl.tensor({rank, 7}, "int32")
  rl.dist.allreduce(i)
  H.check(i[1] == 1 and i[2] == 14, "int32 sums")
  -- a sum beyond int32 is an error on every rank (MPI's int32 sum wraps), the tensor kept
  local o = rl.tensor({1, 2147483647 - rank}, "int32")
  local ok, err = pcall(rl.dist.allreduce, o)
  H.check(not ok and tostring(err):find("element 2 sums to 4294967293 over the ranks, beyond "
    .. "int32", 1, true), "int32 overflow: " .. tostring(err))
  H.check(o[1] == 1 and o[2] == 2147483647 - rank, "kept after the overflow")
  local m = rl.tensor({-1073741824, 1073741823 + rank}, "int32") -- sums at the very ends
  rl.dist.allreduce(m)
  H.check(m[1] == -2147483648 and m[2] == 2147483647, "int32 sums at the limits")
  -- a view of a larger buffer (what the engine's buckets are)
  local big = rl.zeros(10):fill_(rank + 1)
  rl.dist.allreduce(big:narrow(1, 3, 4))
  H.check(big[2] == rank + 1 and big[3] == 3 and big[6] == 3 and big[7] == rank + 1, "narrow view")
end)

H.test("broadcast from either root; barrier", function()
  local t = rl.tensor({rank * 10 + 1, rank * 10 + 2})
  rl.dist.broadcast(t, 1)
  H.check(t[1] == 11 and t[2] == 12, "root 1's values")
  local u = rl.tensor({rank})
  rl.dist.broadcast(u)
  H.check(u[1] == 0, "root defaults to 0")
  rl.dist.barrier()
end)

H.expect_error("allreduce of a non-contiguous tensor", function()
  rl.dist.allreduce(rl.zeros(3, 4):t())
end, "must be contiguous")
H.expect_error("broadcast from a rank that does not exist", function()
  rl.dist.broadcast(rl.zeros(2), 2)
end, "root 2 is not a rank of 0..1")
H.expect_error("allreduce of a closed tensor", function()
  local t = rl.zeros(3)
  do local c <close> = t end
  rl.dist.allreduce(t)
end, "the tensor was freed")
H.test("allreduce and broadcast of an empty tensor", function()
  H.check(rl.dist.allreduce(rl.zeros(0)):numel() == 0, "allreduce")
  H.check(rl.dist.broadcast(rl.zeros(0), 1):numel() == 0, "broadcast")
end)
H.expect_error("broadcast from a root beyond int", function()
  rl.dist.broadcast(rl.zeros(2), 1 << 40)
end, "root 1099511627776 is not a rank of 0..1")
H.expect_error("an infinite timeout", function() rl.dist.set_timeout(math.huge) end,
  "the timeout must be a finite number of seconds > 0")
H.expect_error("an infinite distributed.timeout", function()
  train{network = {output = {class = "softmax", loss = "ce", target = "classes"}},
           train = {class = "12ax", num_seqs = 4}, distributed = {timeout = math.huge}}
end, "config.distributed.timeout must be a finite number of seconds > 0, got inf")
H.expect_error("bad distributed mode", function()
  train{network = {output = {class = "softmax", loss = "ce", target = "classes"}},
           train = {class = "12ax", num_seqs = 4}, distributed = {mode = "ring"}}
end, "config.distributed.mode must be")
H.expect_error("scale_lr that is not a boolean", function()
  train{network = {output = {class = "softmax", loss = "ce", target = "classes"}},
           train = {class = "12ax", num_seqs = 4}, distributed = {mode = "average", scale_lr = 2}}
end, "scale_lr must be true or false")
H.expect_error("an unknown key in distributed", function()
  train{network = {output = {class = "softmax", loss = "ce", target = "classes"}},
           train = {class = "12ax", num_seqs = 4}, distributed = {evry = 2}}
end, "unknown key 'evry'")
H.expect_error("gradient noise in sync mode", function()
  train{network = {output = {class = "softmax", loss = "ce", target = "classes"}},
           train = {class = "12ax", num_seqs = 4}, optimizer = {class = "sgd", gradient_noise = 0.1}}
end, "gradient_noise does not work")

-- Ranks that pass different tensors or call different collectives: every rank fails alike,
-- naming each rank's call, before any data moves; the world stays usable.
H.expect_error("allreduce of different sizes", function()
  rl.dist.allreduce(rl.zeros(rank == 0 and 4 or 6))
end, "rank 0: allreduce of 4 float32 elements; rank 1: allreduce of 6 float32 elements")
H.expect_error("allreduce of different dtypes", function()
  rl.dist.allreduce(rl.zeros(4, rank == 0 and "float32" or "float64"))
end, "rank 1: allreduce of 4 float64 elements")
H.test("broadcast into a larger buffer: an error, nothing copied", function()
  local t = rl.zeros(rank == 0 and 4 or 1000):fill_(rank + 1)
  local ok, err = pcall(rl.dist.broadcast, t, 0)
  H.check(not ok and tostring(err):find("rank 1: broadcast of 1000 float32 elements from root 0",
    1, true), tostring(err))
  H.check(t:sum() == (rank == 0 and 4 or 2000), "the buffer changed: " .. t:sum())
end)
H.expect_error("broadcast from different roots", function()
  rl.dist.broadcast(rl.zeros(2), rank)
end, "rank 1: broadcast of 2 float32 elements from root 1")
H.expect_error("a barrier against an allreduce", function()
  if rank == 0 then rl.dist.barrier() else rl.dist.allreduce(rl.zeros(3)) end
end, "rank 0: barrier; rank 1: allreduce of 3 float32 elements")
H.test("the world is usable after a mismatch", function()
  local t = rl.tensor({rank + 1})
  rl.dist.allreduce(t)
  H.check(t[1] == 3 and not rl.dist.broken(), "sum " .. t[1])
end)

-- rl.train on ranks that run different recipes: one check before the first collective names
-- what differs and each rank's value.
local function tiny(over)
  local c = {network = {fw = {class = "lstm", n_out = 4},
                        output = {class = "softmax", from = {"fw"}, loss = "ce",
                                  target = "classes"}},
             train = {class = "12ax", num_seqs = 20, seed = 1, max_len = 20}, num_epochs = 1,
             batch_size = 200, max_seqs = 4, log_verbosity = 0}
  for k, v in pairs(rank == 1 and over or {}) do c[k] = v end
  return c
end
H.expect_error("ranks with different networks", function()
  train(tiny({network = {fw = {class = "lstm", n_out = 5},
    output = {class = "softmax", from = {"fw"}, loss = "ce", target = "classes"}}}))
end, "the ranks disagree (every rank must run the same recipe on the same data): the network's "
  .. "number of parameters: rank 0: 234, rank 1: 312")
H.expect_error("ranks with the same number of parameters in other layers", function()
  train(tiny({network = {fw = {class = "lstm", n_out = 4, direction = -1},
    output = {class = "softmax", from = {"fw"}, loss = "ce", target = "classes"}}}))
end, "config.network (its layers and options): rank 1 differs from rank 0")
H.expect_error("a dev set on one rank only", function()
  train(tiny({dev = {class = "12ax", num_seqs = 4, seed = 2}}))
end, "a dev set (config.dev): rank 0: 0, rank 1: 1")
H.expect_error("ranks with different dtypes", function()
  train(tiny({dtype = "float64"}))
end, "config.dtype: rank 1 differs from rank 0 (rank " .. rank .. "'s: float"
  .. (rank == 0 and "32" or "64"))
H.expect_error("ranks with datasets of different sizes", function()
  train(tiny({train = {class = "12ax", num_seqs = 30, seed = 1, max_len = 20}}))
end, "the train dataset's number of sequences (epoch 1): rank 0: 20, rank 1: 30")
H.expect_error("ranks with datasets of the same size but other content", function()
  train(tiny({train = {class = "12ax", num_seqs = 20, seed = 2, max_len = 20}}))
end, "the train dataset's content (a fingerprint of 16 of its sequences: tags, keys, shapes and "
  .. "values): rank 1 differs from rank 0")
H.expect_error("ranks with different seeds, epochs, learning rates and modes", function()
  train(tiny({seed = 7, num_epochs = 3, learning_rate = 0.5, distributed = {mode = "average"}}))
end, "config.seed: rank 0: 1, rank 1: 7; config.num_epochs: rank 0: 1, rank 1: 3; the learning "
  .. "rate of the first step: rank 0: 0.001, rank 1: 0.5")
H.test("the world is usable after ranks disagreed in rl.train", function()
  local r = train(tiny())
  H.check(r.epoch == 1 and not rl.dist.broken(), "trained")
end)

-- The largest absolute difference between two tensors.
local function maxdiff(a, b) return (a - b):abs():max() end

-- Rank 1's copy of t on every rank.
local function from_rank1(t)
  local c = t:clone()
  rl.dist.broadcast(c, 1)
  return c
end

local NET = {
  fw = {class = "lstm", n_out = 8},
  bw = {class = "lstm", n_out = 8, direction = -1},
  output = {class = "softmax", from = {"fw", "bw"}, loss = "ce", target = "classes"},
}
local function config(over)
  local c = {network = NET, train = {class = "12ax", num_seqs = 37, seed = 3, max_len = 30,
             seq_ordering = "laplace:4"}, num_epochs = 2, batch_size = 200, max_seqs = 2,
             optimizer = {class = "sgd"}, learning_rate = 0.003, log_verbosity = 0, seed = 5}
  for k, v in pairs(over or {}) do c[k] = v end
  return c
end

local sync = train(config())
H.test("sync: bit-identical parameters on every rank", function()
  H.check(maxdiff(sync.net:params(), from_rank1(sync.net:params())) == 0, "ranks differ")
end)

H.test("sync with pretraining: the grown network is the same on every rank", function()
  -- each rank's generator runs its own stream during an epoch, so the new layers of epoch 2
  -- agree only because the engine broadcasts the grown network's parameters
  local deep = {
    fw1 = {class = "lstm", n_out = 4}, bw1 = {class = "lstm", n_out = 4, direction = -1},
    fw2 = {class = "lstm", n_out = 4, from = {"fw1", "bw1"}},
    bw2 = {class = "lstm", n_out = 4, direction = -1, from = {"fw1", "bw1"}},
    output = {class = "softmax", from = {"fw2", "bw2"}, loss = "ce", target = "classes"},
  }
  local r = train(config({network = deep, pretrain = "default"}))
  H.check(#r.net.order == 5, "the full network in epoch 2")
  H.check(maxdiff(r.net:params(), from_rank1(r.net:params())) == 0, "ranks differ")
end)

H.test("sync: shares deal every sequence once, round robin from the seed", function()
  local ds = rl.dataset({class = "12ax", num_seqs = 37, seed = 3})
  local seen, n = {}, 0
  for r = 0, 1 do
    local sh = distmod.shard(ds, r, 2, 5)
    sh:init_epoch(2)
    for i = 1, sh:num_seqs() do
      local tag = sh:get_seq(i).tag
      H.check(not seen[tag], "sequence " .. tostring(tag) .. " twice")
      seen[tag], n = true, n + 1
    end
  end
  H.check(n == 37, "all 37 sequences, got " .. n)
end)

-- The reference of sync mode: one process, the two ranks' batches of `accum` lock steps
-- accumulated, one sgd update; returns the network and the number of updates.
local function union_reference(cfg, accum)
  rl.manual_seed(cfg.seed)
  local ds = rl.dataset(cfg.train)
  local net = rl.network(cfg.network, ds:extern_data())
  local opt = rl.optimizer({class = "sgd"}, net:params(), net:grads())
  local shards = {distmod.shard(ds, 0, 2, cfg.seed), distmod.shard(ds, 1, 2, cfg.seed)}
  local updates = 0
  for epoch = 1, cfg.num_epochs do
    local its = {}
    for r = 1, 2 do
      shards[r]:init_epoch(epoch)
      its[r] = rl.batches(shards[r], {batch_size = cfg.batch_size, max_seqs = cfg.max_seqs})
    end
    local done = false
    while not done do
      net:zero_grads()
      local any = false
      for _ = 1, accum do
        local step_any = false
        for r = 1, 2 do
          local b = its[r]()
          if b then
            step_any = true
            net:forward(b)
            net:backward()
          end
        end
        any = any or step_any
        if not step_any then
          done = true
          break
        end
      end
      if any then
        opt:step(cfg.learning_rate)
        updates = updates + 1
      end
    end
  end
  return net, updates
end

H.test("sync with 2 ranks = 1 process on the union of each step's batches", function()
  local net, steps = union_reference(config(), 1)
  H.check(steps == sync.step, string.format("%d reference steps, %d distributed", steps, sync.step))
  local d, scale = maxdiff(net:params(), sync.net:params()), net:params():abs():max()
  H.check(d <= 1e-5 * scale, string.format("max difference %.3g (scale %.3g)", d, scale))
end)

H.test("sync with accum_grad = 2: one gradient allreduce per update, = 1 process on the "
    .. "union of 2 lock steps", function()
  local cfg = config({accum_grad = 2})
  local n = rl.network(cfg.network, rl.dataset(cfg.train):extern_data()):num_params()
  local real, reduces = rl.dist.allreduce, 0
  rl.dist.allreduce = function(t, ...)
    if t:numel() == n then reduces = reduces + 1 end
    return real(t, ...)
  end
  local ok, acc = pcall(train, cfg)
  rl.dist.allreduce = real
  H.check(ok, tostring(acc))
  local net, updates = union_reference(cfg, 2)
  H.check(updates == acc.step, string.format("%d reference updates, %d distributed", updates,
    acc.step))
  H.check(reduces == acc.step, string.format("%d gradient allreduces for %d updates", reduces,
    acc.step))
  H.check(acc.step < sync.step, "fewer updates than without accumulation")
  local d, scale = maxdiff(net:params(), acc.net:params()), net:params():abs():max()
  H.check(d <= 1e-5 * scale, string.format("max difference %.3g (scale %.3g)", d, scale))
end)

H.test("average with K = 1 and plain SGD = sync", function()
  local avg = train(config({distributed = {mode = "average", every = 1}}))
  local d, scale = maxdiff(avg.net:params(), sync.net:params()), sync.net:params():abs():max()
  H.check(d <= 1e-5 * scale, string.format("max difference %.3g (scale %.3g)", d, scale))
  H.check(maxdiff(avg.net:params(), from_rank1(avg.net:params())) == 0, "ranks differ")
end)

H.test("average with K = 3: ranks differ between averagings and agree after", function()
  local sums = {}
  local function make_opt(params, grads)
    local inner = rl.optimizer({class = "momentum", momentum = 0.9}, params, grads)
    return {step = function(_, lr)
              sums[#sums + 1] = params:sum()
              return inner:step(lr)
            end,
            state = function() return inner:state() end,
            load_state = function(_, st) return inner:load_state(st) end}
  end
  -- 36 sequences of at most 30 frames, 2 to a batch: 9 steps on each rank
  local r = train(config({num_epochs = 1, optimizer = make_opt, train = {class = "12ax",
    num_seqs = 36, seed = 3, max_len = 30}, distributed = {mode = "average", every = 3}}))
  local mine = rl.tensor(sums, "float64")
  local other = from_rank1(mine)
  local p1, m = from_rank1(r.net:params()), r.optimizer:state().momentum_buffer
  local m1 = from_rank1(m)
  H.check(#sums == 9, "9 steps, got " .. #sums)
  for s = 1, rank == 0 and #sums or 0 do -- (on rank 1 `other` is its own)
    local same = mine[s] == other[s]
    -- before step s the parameters were averaged when s - 1 is a multiple of 3
    H.check(same == ((s - 1) % 3 == 0), string.format("step %d: ranks %s", s,
      same and "agree before an averaging" or "differ right after an averaging"))
  end
  H.check(maxdiff(r.net:params(), p1) == 0, "ranks differ at the end")
  H.check(maxdiff(m, m1) == 0, "optimizer states differ at the end")
end)

local full = ax(dir .. "/ax/net", 4)
H.test("12AX with 2 ranks: dev frame error < 1%", function()
  H.check(full.dev_error < 0.01, string.format("dev FER %.2f%%", 100 * full.dev_error))
end)
H.test("only rank 0 writes checkpoints and the learning curve", function()
  local f = io.open(dir .. "/ax/net.004.h5")
  H.check(f ~= nil, "net.004.h5 exists")
  if f then f:close() end
  local n = 0
  for _ in io.lines(dir .. "/ax/net.curve.jsonl") do n = n + 1 end
  H.check(n == 4, n .. " curve lines")
end)
H.expect_error("ranks that resume from different checkpoints", function()
  ax(dir .. "/ax/net", 5, dir .. (rank == 0 and "/ax/net.004.h5" or "/ax/net.003.h5"))
end, "the epoch training starts with (load): rank 0: 5, rank 1: 4; the step training starts "
  .. "after (load): rank 0: ")
H.test("resumed 2-rank run = uninterrupted", function()
  ax(dir .. "/ax2/net", 2)
  local resumed = ax(dir .. "/ax2/net", 4, "last")
  H.check(maxdiff(resumed.net:params(), full.net:params()) == 0, "parameters differ")
  H.check(resumed.dev_error == full.dev_error, "dev error differs")
end)

local t = rl.tensor({H.passed, H.failed}, "float64")
rl.dist.allreduce(t)
if rank == 0 then
  print(string.format("%d passed, %d failed", math.tointeger(t[1]), math.tointeger(t[2])))
end
-- (an error rather than os.exit, which would leave without MPI_Finalize)
if t[2] ~= 0 then error(string.format("%d checks failed", math.tointeger(t[2])), 0) end
