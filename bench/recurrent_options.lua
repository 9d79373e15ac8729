-- What each option of the recurrent layers costs over the plain layer's training step (issue
-- goal: at most 15%), measured in one process so that the machine's drift falls on every
-- variant alike: the networks of one configuration (the plain LSTM and one network per option,
-- the same sizes and data) are built once, and each round times one training step (zero the
-- gradients, forward, backward) of each in turn. A variant's cost is the median over rounds of
-- its step time divided by the plain step of the same round; a shared machine whose speed moves
-- by tens of percent between runs of one process (seen here) moves far less within a round.
-- Beside it, the ratio of the fastest steps (noise only ever adds time).
-- Configurations as bench/lstm_step.lua: ptb_large (2 x LSTM 650, T 50, B 20, 10000 classes)
-- and chime (3 x BLSTM 512, T 250, B 16, 1501 classes); a gru pair on the ptb_large shapes
-- (plain and layer_norm) as well.
-- Usage: rnnlua bench/recurrent_options.lua [CONFIG ...]   (default: ptb_large chime)
-- RL_BENCH_ROUNDS rounds (default 5; at least 3 for the median to mean anything); the thread
-- count is rnnlua's default (OPENBLAS_NUM_THREADS=1 in the environment runs one thread).
local B = dofile("bench/bench.lua")

local CONFIGS = {
  -- layers, bidirectional, input, hidden, classes, T, B
  ptb_large = {2, false, 650, 650, 10000, 50, 20},
  chime = {3, true, 45, 512, 1501, 250, 16},
}
local VARIANTS = {
  {"lstm", "plain", {}},
  {"lstm", "layer_norm", {layer_norm = true}},
  {"lstm", "zoneout (cell 0.15, hidden 0.05)", {zoneout = {cell = 0.15, hidden = 0.05}}},
  {"lstm", "rec_dropout 0.25", {rec_dropout = 0.25}},
  {"lstm", "weight_dropout 0.25", {weight_dropout = 0.25}},
  {"gru", "plain", {}},
  {"gru", "layer_norm", {layer_norm = true}},
}

local function build(cfg, cls, opts)
  local layers, bidir, inp, hid, classes = table.unpack(cfg)
  rl.manual_seed(1)
  return rl.network(B.stack_desc(cls, layers, bidir, hid, classes, opts),
    {data = {dim = inp}, classes = {dim = classes, sparse = true}})
end

local function batch_of(cfg)
  local _, _, inp, _, classes, T, Bn = table.unpack(cfg)
  rl.manual_seed(2)
  local y = rl.zeros(T, Bn):int()
  for t = 1, T do
    for b = 1, Bn do y[t][b] = ((t - 1) * Bn + b - 1) * 2654435761 % classes end
  end
  return {data = rl.randn(T, Bn, inp), classes = y, lengths = rl.zeros(Bn):int():fill_(T)}
end

local function step(net, batch)
  net:params() -- as after an optimizer update (rl.network keeps no state across steps then)
  net:zero_grads()
  net:forward(batch)
  net:backward()
end

local names = #arg > 0 and arg or {"ptb_large", "chime"}
local rounds = math.max(B.rounds, 3)
print("### Recurrent options: a training step against the plain layer's, interleaved")
print()
print("| config | cell | option | median step | median of the ratios to plain | ratio of the fastest steps |")
print("|---|---|---|---:|---:|---:|")
local load0 = io.open("/proc/loadavg"):read("l"):match("^(%S+ %S+ %S+)")
for _, name in ipairs(names) do
  local cfg = CONFIGS[name] or error("recurrent_options.lua: unknown config '" .. name ..
                                     "' (ptb_large, chime)")
  local batch = batch_of(cfg)
  local nets, times = {}, {}
  for i, v in ipairs(VARIANTS) do
    nets[i] = build(cfg, v[1], v[3])
    step(nets[i], batch) -- warm-up: packs, buffers
    times[i] = {}
  end
  for _ = 1, rounds do
    for i = 1, #VARIANTS do
      local t0 = rl.clock()
      step(nets[i], batch)
      times[i][#times[i] + 1] = rl.clock() - t0
    end
  end
  local plain_of = {}
  for i, v in ipairs(VARIANTS) do
    if v[2] == "plain" then plain_of[v[1]] = i end
  end
  for i, v in ipairs(VARIANTS) do
    local p = times[plain_of[v[1]]]
    local ratios = {}
    for r = 1, rounds do ratios[r] = times[i][r] / p[r] end
    print(string.format("| %s | %s | %s | %.0f ms | %.3f | %.3f |", name, v[1], v[2],
                        B.median(times[i]) * 1e3, B.median(ratios),
                        math.min(table.unpack(times[i])) / math.min(table.unpack(p))))
  end
  nets = nil
  collectgarbage()
end
print()
local nt = rl.get_num_threads()
print(string.format("`bench/recurrent_options.lua`: %d rounds, %d thread%s, float32; load average %s " ..
                    "at the start, %s at the end. A ratio of 1.15 is the goal's bound.", rounds,
                    nt, nt == 1 and "" or "s", load0,
                    io.open("/proc/loadavg"):read("l"):match("^(%S+ %S+ %S+)")))
