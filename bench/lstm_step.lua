-- One rnnlua process of bench/lstm_compare.sh: a training step (zero the gradients, forward,
-- backward; no optimizer update) of an LSTM network built with rl.network, as a user writes
-- it, float32 on the CPU, or on DEVICE ("cuda": the device kit's comparison with PyTorch on the
-- GPU, a step then ends with rl.synchronize), with PRECISION "fp32" (default), "bf16" or, for
-- the forward-only configurations, "int8" (rl.network's precision). RL_BENCH_THREADS sets
-- rl.set_num_threads (default: rnnlua's, every CPU). Usage: rnnlua bench/lstm_step.lua CONFIG [SECONDS] [DEVICE]
-- [PRECISION] [OPTIONS]; OPTIONS: lstm options for every layer, "KEY=VALUE,..." with numbers or
-- true/false (e.g. "n_proj=256" or "layer_norm=true"), to measure an option against the plain
-- layer.
-- Each training step counts as an update of the weights (no optimizer runs; bf16 packs them
-- again); a forward-only configuration times net:forward(batch, {train = false}).
-- Prints "RESULT config ms_per_step peak_rss_kib rss_before_model_kib steps cpu_ms_per_step":
-- the median of the timed steps (after one warm-up step), the process's peak resident set
-- (VmHWM) after them, its resident set before the network was built, the number of steps, and
-- the process CPU time per step (all threads, their spin-waits included; on a machine shared
-- with other work, CPU time at 1 thread ranks code changes more reliably than wall time).
-- layers, bidirectional, input, hidden, classes, T, B, forward only (as bench/torch_lstm.py);
-- the tiny batches: training steps of batch 1 and 3 (tiny1, tiny3: 3 x LSTM 257 over 311
-- frames of 257 features), and the forward (train = false) of one utterance at batch 1
-- (utt768: 3 x LSTM 768, T 400; utt512: 2 x BLSTM 512, T 500; 80 features, 1000 classes)
local CONFIGS = {
  seqmnist = {1, false, 28, 128, 10, 28, 64},
  ptb_small = {1, false, 200, 200, 10000, 20, 20},
  odd = {2, true, 61, 300, 43, 137, 7},
  ptb_large = {2, false, 650, 650, 10000, 50, 20},
  chime = {3, true, 45, 512, 1501, 250, 16},
  tiny1 = {3, false, 257, 257, 257, 311, 1},
  tiny3 = {3, false, 257, 257, 257, 311, 3},
  utt768 = {3, false, 80, 768, 1000, 400, 1, true},
  utt512 = {2, true, 80, 512, 1000, 500, 1, true},
}

local function status_kib(field)
  local f = assert(io.open("/proc/self/status"))
  local s = f:read("a")
  f:close()
  return tonumber(s:match(field .. ":%s*(%d+) kB"))
end

local name, seconds, device = arg[1], tonumber(arg[2] or "3"), arg[3] or "cpu"
local precision = arg[4] or "fp32"
local extra = {}
for k, v in (arg[5] or ""):gmatch("([%w_]+)=([^,]+)") do
  if v == "true" or v == "false" then
    extra[k] = v == "true"
  else
    extra[k] = tonumber(v) or error("lstm_step.lua: option " .. k .. " = " .. v .. " is not a number")
  end
end
local c = CONFIGS[name]
if not c then error("lstm_step.lua: unknown config '" .. tostring(name) .. "'") end
local layers, bidir, inp, hid, classes, T, B, fwd_only = table.unpack(c)
local rss0 = status_kib("VmRSS")
if os.getenv("RL_BENCH_THREADS") then
  rl.set_num_threads(math.tointeger(tonumber(os.getenv("RL_BENCH_THREADS")))
    or error("lstm_step.lua: RL_BENCH_THREADS must be an integer"))
end

local desc = dofile("bench/bench.lua").stack_desc("lstm", layers, bidir, hid, classes, extra)
rl.manual_seed(1)
local net = rl.network(desc, {data = {dim = inp}, classes = {dim = classes, sparse = true}},
  {precision = precision})
local x = rl.randn(T, B, inp)
local y = rl.zeros(T, B):int()
for t = 1, T do
  for b = 1, B do y[t][b] = ((t - 1) * B + b - 1) * 2654435761 % classes end
end
local batch = {data = x, classes = y, lengths = rl.zeros(B):int():fill_(T)}
if device ~= "cpu" then
  net:to(device)
  batch.data = x:to(net.device)
end

local function step()
  if fwd_only then
    -- inference: the weights stay as they are (bf16 keeps its copies of them)
    net:forward(batch, {train = false})
    if device ~= "cpu" then rl.synchronize(net.device) end
    return
  end
  -- as after an optimizer update: the weights' storage changes version, so that bf16 makes
  -- its copies of the weights again (kernels/cpu/gemm_bf16.h) as it does in training
  net:params()
  net:zero_grads()
  net:forward(batch)
  net:backward()
  if device ~= "cpu" then rl.synchronize(net.device) end
end

step()
local times, t_end, cpu0 = {}, rl.clock() + seconds, os.clock()
repeat
  local t0 = rl.clock()
  step()
  times[#times + 1] = rl.clock() - t0
until #times >= 2 and rl.clock() >= t_end
table.sort(times)
local n = #times
local med = n % 2 == 1 and times[(n + 1) // 2] or (times[n // 2] + times[n // 2 + 1]) / 2
local cpu_ms = (os.clock() - cpu0) * 1e3 / n
print(string.format("RESULT %s %.3f %d %d %d %.3f", name, med * 1e3, status_kib("VmHWM"), rss0, n,
                    cpu_ms))
