-- Data-parallel rl.train over the ranks of rl.dist (MPI): `mpirun -np N ./rnnlua recipe.lua`
-- runs the recipe on N processes, and rl.train trains one model with all of them. The engine
-- (rnnlua.engine) calls the hooks below; with one process it has no dist context at all.
--
-- config.distributed = {mode = "sync" (default) | "average", every = K (average: steps between
--   averagings, default 1), bucket_mb = 32 (sync: the gradient is summed in pieces of this
--   size), scale_lr = true (average), timeout = 300 (seconds any collective may wait)}
--
-- Data: each epoch the train set's order is fixed by its seed and the epoch, as in one process;
-- the sequences of that order are dealt round robin to the ranks (position p goes to rank
-- (p - 1 + seed + epoch) mod N), so every sequence is used once per epoch in the world and
-- every rank's share has the same length profile. Each rank batches its share with
-- rl.batches. Steps run in lock step: step s uses batch s of every rank, and a rank whose share
-- is used up takes part with an empty contribution until every rank is done.
--
-- sync: every rank computes the gradient of its batch; the flat gradient buffers are summed
--   over the ranks (MPI_Allreduce, bucket by bucket) and every rank takes the same optimizer
--   step. The network's loss is a sum over frames, so the summed gradient is the gradient of one
--   batch made of all N batches (the union): N ranks train as one process would on the union
--   of their batches, with the same learning rate. The ranks' parameters stay bit-identical.
--   Buckets are not overlapped with the backward pass: Open MPI moves a non-blocking collective
--   only while the rank is inside an MPI call (it has no progress thread), so a bucket started
--   under the remaining layers' GEMMs would wait for them anyway, and on a machine with one
--   core per rank the copying competes with the backward for the same core.
-- average (RETURNN's scheme): every rank steps on its own batches with its own optimizer, and
--   the parameters are averaged (mean over the ranks) every K steps and at the end of each
--   epoch. With scale_lr each rank steps with N x the learning rate, so that one averaging moves
--   the parameters as far as a sync step on the union (with K = 1 and plain SGD the two modes
--   are the same computation); scale_lr = false keeps the rate as it is (RETURNN's behaviour).
--   Optimizer states (momentum, Adam's moments) stay each rank's own between averagings and are
--   averaged with the parameters at the end of each epoch, so the checkpoint holds one state for
--   the world; their counters are rank 0's.
--
-- Scores: the train and dev sums (loss, errors, frames) are summed over the ranks; the dev set
--   is dealt like the train set (each rank scores its share). The learning-rate control sees
--   the world's scores on every rank; rank 0's decision is broadcast and every rank checks that
--   it agrees. Only rank 0 writes checkpoints, the learning curve and the log; every rank reads
--   the checkpoint it resumes from (load = "last": the newest one rank 0 sees), so resuming
--   needs the model directory on a file system all ranks see; any number of ranks may resume a
--   run. Random numbers: rank 0 draws from the global generator as one process would (its state
--   is checkpointed); every other rank reseeds it at each epoch's start from (seed, epoch,
--   rank), so dropout masks differ between ranks and a resumed run repeats an uninterrupted one.
--   gradient_noise is refused in sync mode (the ranks would draw different noise and drift).
--
-- Failures: an error on one rank ends the job (the host prints it with the rank and calls
-- MPI_Abort); a rank that dies or hangs makes the others' next collective fail after `timeout`
-- seconds with a message naming it. Checkpoints are written to a temporary file and renamed,
-- so none is ever left half written.
local M = {}
local rl = require("rnnlua") -- the module table (init.lua registers it before loading its parts)

local function fail(fmt, ...)
  error("rl.train: " .. string.format(fmt, ...), 0)
end

local KEYS = {mode = true, every = true, bucket_mb = true, scale_lr = true, timeout = true}

---------------------------------------------------------------------------- sharded datasets

local Shard = {}
Shard.__index = Shard

-- How many sequences, spread evenly over the set, make a dataset's fingerprint.
local FINGERPRINT_SEQS = 16

-- A text that differs between two datasets of n sequences that differ in the tags, keys, dtypes,
-- shapes or values of the sampled sequences (their order in this epoch included). Values
-- enter as two sums in float64, plain and weighted by position, so changed or moved values
-- show; a difference outside the sample is not seen (a full pass over a large set at every
-- start would cost as much as an epoch).
local function fingerprint(ds, n)
  local parts = {}
  local count = math.min(n, FINGERPRINT_SEQS)
  for j = 1, count do
    local i = count == 1 and 1 or 1 + (j - 1) * (n - 1) // (count - 1)
    local seq = ds:get_seq(i)
    local keys = {}
    for k in pairs(seq) do keys[#keys + 1] = k end
    table.sort(keys, function(a, b) return tostring(a) < tostring(b) end)
    parts[#parts + 1] = string.format("%d %s", i, tostring(seq.tag))
    for _, k in ipairs(keys) do
      local v = seq[k]
      if rl.is_tensor(v) then
        local sum, weighted = 0, 0
        if v:numel() > 0 then
          local x = v:contiguous():double():view(v:numel())
          sum = x:sum()
          weighted = (x * rl.arange(1, v:numel() + 1, {dtype = "float64"})):sum()
        end
        parts[#parts + 1] = string.format("%s %s %s %.17g %.17g", tostring(k), v:dtype(),
          tostring(v:size()), sum, weighted)
      end
    end
  end
  return table.concat(parts, "|")
end

-- The share of `ds` of rank `rank` in a world of `size`: a dataset object of its own.
function M.shard(ds, rank, size, seed)
  return setmetatable({ds = ds, rank = rank, size = size, seed = seed or 1, pos = {},
                       name = string.format("%s (rank %d of %d)", tostring(ds.name or "dataset"),
                                            rank, size)}, Shard)
end

function Shard:init_epoch(epoch)
  self.ds:init_epoch(epoch)
  local n, shift = self.ds:num_seqs(), (self.seed + (epoch or 1)) % self.size
  -- a share is only a share of the same set: a rank with a set of another size would deal
  -- sequences twice or never
  if self.dist then
    local items = {{string.format("the %s dataset's number of sequences (epoch %s)",
      self.which, tostring(epoch or 1)), n}}
    -- the same number of sequences is not the same set (each rank reads its own files): at
    -- the first epoch, a fingerprint of the content
    if not self.fingerprinted then
      self.fingerprinted = true
      items[2] = {string.format("the %s dataset's content (a fingerprint of %d of its sequences: "
        .. "tags, keys, shapes and values)", self.which, math.min(n, FINGERPRINT_SEQS)),
        fingerprint(self.ds, n), hash = true}
    end
    self.dist:check_same(items)
  end
  self.pos = {}
  for p = 1, n do
    if (p - 1 + shift) % self.size == self.rank then self.pos[#self.pos + 1] = p end
  end
end

function Shard:num_seqs() return #self.pos end
function Shard:keys() return self.ds:keys() end
function Shard:extern_data() return self.ds:extern_data() end

function Shard:get_seq(i)
  local p = self.pos[i]
  if p == nil then fail("%s: sequence %s out of range 1..%d", self.name, tostring(i), #self.pos) end
  return self.ds:get_seq(p)
end

function Shard:seq_len(i)
  return self.ds:seq_len(self.pos[i])
end

-- Only where the dataset can tell lengths without loading (the engine's ETA uses it).
function Shard:total_frames()
  if not self.ds.seq_len then return nil end
  local s = 0
  for i = 1, #self.pos do s = s + self.ds:seq_len(self.pos[i]) end
  return s
end

---------------------------------------------------------------------------- the context

local Dist = {}
Dist.__index = Dist

-- The dist context for rl.train, or nil in a world of one process. Checks config.distributed
-- and adapts cfg (the device of this rank).
function M.setup(cfg)
  local d = cfg.distributed
  if d ~= nil then
    if type(d) ~= "table" then
      fail("config.distributed must be a table {mode = \"sync\"|\"average\", ...}, got %s", type(d))
    end
    for k in pairs(d) do
      if not KEYS[k] then
        fail("config.distributed: unknown key '%s' (mode, every, bucket_mb, scale_lr, timeout)",
          tostring(k))
      end
    end
    if not rl.dist.built() then
      fail("config.distributed needs a build with MPI (this rnnlua was built with MPI=0)")
    end
  end
  d = d or {}
  local mode = d.mode or "sync"
  if mode ~= "sync" and mode ~= "average" then
    fail("config.distributed.mode must be \"sync\" or \"average\", got %s", tostring(mode))
  end
  local every = d.every or 1
  if math.type(every) ~= "integer" or every < 1 then
    fail("config.distributed.every must be a positive integer, got %s", tostring(every))
  end
  local bucket_mb = d.bucket_mb or 32
  if type(bucket_mb) ~= "number" or not (bucket_mb > 0) then
    fail("config.distributed.bucket_mb must be a number > 0, got %s", tostring(bucket_mb))
  end
  if d.scale_lr ~= nil and type(d.scale_lr) ~= "boolean" then
    fail("config.distributed.scale_lr must be true or false, got %s", tostring(d.scale_lr))
  end
  local timeout = d.timeout or 300
  if type(timeout) ~= "number" or not (timeout > 0) or timeout == math.huge then
    fail("config.distributed.timeout must be a finite number of seconds > 0, got %s",
      tostring(timeout))
  end
  local size = rl.dist.size()
  if size == 1 then return nil end
  rl.dist.set_timeout(timeout)
  if mode == "sync" and type(cfg.optimizer) == "table" and cfg.optimizer.gradient_noise then
    fail("optimizer.gradient_noise does not work with distributed mode \"sync\" (every rank "
      .. "would draw its own noise and the parameters would drift apart); use mode \"average\"")
  end
  if cfg.device == "cuda" then cfg.device = "cuda:" .. rl.dist.local_rank() end
  return setmetatable({rank = rl.dist.rank(), size = size, mode = mode, every = every,
                       bucket = math.max(1, math.floor(bucket_mb * 2 ^ 20 / 4)),
                       scale_lr = d.scale_lr ~= false, seed = cfg.seed, comm_time = 0,
                       flag = rl.zeros(1, "float64"), sums = rl.zeros(8, "float64")}, Dist)
end

-- Rank 0 writes files and the log.
function Dist:writer() return self.rank == 0 end

function Dist:describe()
  return string.format("distributed: %d ranks, mode %s%s", self.size, self.mode,
    self.mode == "average" and string.format(" every %d steps%s", self.every,
      self.scale_lr and string.format(" (lr x %d per rank)", self.size) or "") or "")
end

-- The element-wise sum over the ranks of up to 8 numbers (float64).
function Dist:sum(...)
  local n = select("#", ...)
  local s = self.sums
  s:zero_()
  for i = 1, n do s[i] = select(i, ...) end
  self:timed(rl.dist.allreduce, s)
  local out = {}
  for i = 1, n do out[i] = s[i] end
  return table.unpack(out, 1, n)
end

function Dist:timed(fn, ...)
  local t0 = rl.clock()
  fn(...)
  self.comm_time = self.comm_time + rl.clock() - t0
end

-- The value of rank 0 (a number), checked against this rank's own: a mismatch is an error.
function Dist:agree(what, v)
  local f = self.flag
  f[1] = v
  rl.dist.broadcast(f, 0)
  if f[1] ~= v then
    fail("rank %d: %s is %.10g here but %.10g on rank 0", self.rank, what, v, f[1])
  end
end

-- rl.train returns on every rank once rank 0 has written its files.
function Dist:finish() rl.dist.barrier() end

-- An error on this rank: the others may be inside a collective this rank will never join.
function Dist:abandon()
  if not self.failed_alike then rl.dist.set_broken() end
end

-- Every rank starts from rank 0's parameters.
function Dist:sync_params(net)
  rl.dist.broadcast(net:params(), 0)
end

local function world_shard(self, ds, which)
  local sh = M.shard(ds, self.rank, self.size, self.seed)
  sh.dist, sh.which = self, which
  return sh
end
function Dist:train_set(ds) return world_shard(self, ds, "train") end
function Dist:dev_set(ds) return world_shard(self, ds, "dev") end

-- A number for a string (FNV-1a, 52 bits: exact in a float64, so a sum over ranks of it and
-- zeros is exact).
local function hash(str)
  local h = 0xcbf29ce484222325
  for i = 1, #str do h = (h ~ str:byte(i)) * 0x100000001b3 end
  return h & ((1 << 52) - 1)
end

-- Every rank must run the same recipe: items = {{what, value, hash = true}, ...} (value a
-- number, boolean or string; a string or hash = true item is compared by its hash) must be the
-- same on every rank. One allreduce of a ranks x items matrix, so every rank sees every rank's
-- values and fails alike, naming each rank that differs from rank 0 and its value.
function Dist:check_same(items)
  local n, k = self.size, #items
  local m = rl.zeros(n * k, "float64")
  for i, it in ipairs(items) do
    local v = it[2]
    if type(v) == "boolean" then v = v and 1 or 0
    elseif type(v) == "string" then v = hash(v)
    elseif type(v) ~= "number" then v = -1 end
    m[self.rank * k + i] = v
  end
  self:timed(rl.dist.allreduce, m)
  local bad = {}
  for i, it in ipairs(items) do
    local differ = {}
    for r = 1, n - 1 do
      local v = m[r * k + i]
      if v ~= m[i] and (v == v or m[i] == m[i]) and #differ < 4 then -- (NaN = NaN here)
        differ[#differ + 1] = (it.hash or type(it[2]) == "string")
          and string.format("rank %d differs", r)
          or string.format("rank %d: %.10g", r, v)
      end
    end
    if #differ > 0 then
      -- a string's value is only known here: each rank adds its own
      bad[#bad + 1] = (it.hash or type(it[2]) == "string")
        and string.format("%s: %s from rank 0%s", it[1], table.concat(differ, ", "),
          type(it[2]) == "string" and #it[2] <= 80
            and string.format(" (rank %d's: %s)", self.rank, it[2]) or "")
        or string.format("%s: rank 0: %.10g, %s", it[1], m[i], table.concat(differ, ", "))
    end
  end
  if #bad > 0 then
    -- every rank fails here alike, after the same collective: the world stays paired
    self.failed_alike = true
    fail("the ranks disagree (every rank must run the same recipe on the same data): %s",
      table.concat(bad, "; "))
  end
end

-- A network description as text, the same for equal tables: keys sorted, a function (a custom
-- layer's code) only by its type.
local function canonical(v, seen)
  local t = type(v)
  if t == "string" then return string.format("%q", v) end
  if t == "number" then
    return math.type(v) == "integer" and tostring(v) or string.format("%.17g", v)
  end
  if t ~= "table" then return t == "boolean" and tostring(v) or t end
  if seen[v] then return "<cycle>" end
  seen[v] = true
  local keys = require("rnnlua.util").sorted_keys(v)
  local parts = {}
  for _, k in ipairs(keys) do
    parts[#parts + 1] = canonical(k, seen) .. "=" .. canonical(v[k], seen)
  end
  seen[v] = nil
  return "{" .. table.concat(parts, ",") .. "}"
end

-- What must be the same on every rank before the first collective of rl.train: the network,
-- the settings that decide the sequence of collectives and the training, where training starts.
function Dist:check_world(cfg, net, start, step, lr)
  self:check_same({
    {"the network's number of parameters", net:num_params()},
    {"config.network (its layers and options)", canonical(cfg.network, {}), hash = true},
    {"config.dtype", tostring(cfg.dtype)},
    {"a dev set (config.dev)", cfg.dev ~= nil},
    {"config.pretrain", canonical(cfg.pretrain, {}), hash = true},
    {"config.distributed (mode, every, bucket_mb, scale_lr)", string.format("%s %d %d %s",
      self.mode, self.every, self.bucket, tostring(self.scale_lr))},
    {"config.seed", cfg.seed},
    {"config.num_epochs", cfg.num_epochs},
    {"config.batch_size", cfg.batch_size},
    {"config.max_seqs", cfg.max_seqs},
    {"config.accum_grad", cfg.accum_grad},
    {"config.ema", cfg.ema or 0},
    {"config.label_smoothing", cfg.label_smoothing or 0},
    {"the epoch training starts with (load)", start},
    {"the step training starts after (load)", step},
    {"the learning rate of the first step", lr},
  })
end

function Dist:epoch_begins(epoch)
  self.comm_time = 0
  if self.rank > 0 then
    rl.manual_seed(((self.seed * 1000003 + epoch) * 1009 + self.rank) % (1 << 53))
  end
end

-- rl.batches over the rank's share, in lock step: yields a batch, false (this rank is done
-- but others are not: an empty step) or nil (every rank is done).
function Dist:batches(ds, bopts)
  local next_batch = rl.batches(ds, bopts)
  local done = false
  return function()
    local b = nil
    if not done then
      b = next_batch()
      done = b == nil
    end
    local others = self:sum(b and 1 or 0)
    if others == 0 then return nil end
    return b or false
  end
end

-- The optimizer step of lock step `step` (has: this rank had a batch); opt:step's results.
function Dist:step(opt, lr, net, step, has)
  if self.mode == "sync" then
    local g = net:grads()
    local n = g:numel()
    local t0 = rl.clock()
    for off = 1, n, self.bucket do
      rl.dist.allreduce(g:narrow(1, off, math.min(self.bucket, n - off + 1)))
    end
    self.comm_time = self.comm_time + rl.clock() - t0
    return opt:step(lr)
  end
  local applied, reason = true, nil
  if has then
    applied, reason = opt:step(self.scale_lr and lr * self.size or lr)
  end
  if step % self.every == 0 then self:average_params(net) end
  return applied, reason
end

function Dist:average_params(net)
  local p = net:params()
  self:timed(rl.dist.allreduce, p)
  p:mul_(1 / self.size)
end

-- The end of an epoch: (average mode) the parameters and optimizer state averaged; returns the
-- world's sums of the epoch's counts (loss, errors, frames, ...: up to 8 numbers).
function Dist:epoch_ends(net, opt, ...)
  if self.mode == "average" then
    self:average_params(net)
    if opt.state and opt.load_state then
      local st = opt:state()
      local names, counters = {}, {}
      for k, v in pairs(st) do
        if rl.is_tensor(v) then names[#names + 1] = k
        elseif type(v) == "number" then counters[#counters + 1] = k end
      end
      table.sort(names)
      table.sort(counters)
      for _, k in ipairs(names) do
        self:timed(rl.dist.allreduce, st[k])
        st[k]:mul_(1 / self.size)
      end
      if #counters > 0 then
        local c = rl.zeros(#counters, "float64")
        for i, k in ipairs(counters) do c[i] = st[k] end
        rl.dist.broadcast(c, 0)
        for i, k in ipairs(counters) do
          st[k] = math.type(st[k]) == "integer" and math.tointeger(c[i]) or c[i]
        end
      end
      opt:load_state(st)
    end
  end
  return self:sum(...)
end

return M
