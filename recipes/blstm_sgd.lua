-- Trains a small BLSTM with plain SGD written here (net:forward, net:backward and in-place
-- tensor ops on the flat parameter buffer) on a generated task, until the frame error rate on
-- held-out sequences falls below 1%.
--
-- Task: the input is a random bit per frame (one-hot, dim 2); the target of frame t is the
-- parity of the number of ones in frames 1..t (class 0: even, 1: odd). Sequences have ragged
-- lengths; padded frames carry no loss. Everything is seeded: two runs print the same lines.
--
--   rnnlua recipes/blstm_sgd.lua [++seed S]
local seed = require("rnnlua.cli").parse({
  usage = "rnnlua recipes/blstm_sgd.lua [++seed S]",
  about = "A small BLSTM learns running parity with plain SGD written in Lua.",
  options = {{"seed", "integer", 1, "random seed (data and initial weights)"}}}, arg).seed
rl.manual_seed(seed)

local T_MAX, B, N_TRAIN, N_DEV = 16, 32, 1024, 256
local LR, CLIP, MAX_EPOCHS = 0.5 / B, 5.0, 100

-- A batch of B sequences of random length 4..T_MAX: data (T, B, 2), classes (T, B), lengths.
local function make_batch()
  local len = ((rl.rand(B) * (T_MAX - 3)):floor() + 4):int():totable()
  local bits = (rl.rand(T_MAX, B) + 0.5):floor():totable()
  local x, y = {}, {}
  for t = 1, T_MAX do x[t], y[t] = {}, {} end
  for b = 1, B do
    local parity = 0
    for t = 1, T_MAX do
      local bit = t <= len[b] and bits[t][b] or 0
      parity = (parity + bit) % 2
      x[t][b] = {1 - bit, bit}
      y[t][b] = t <= len[b] and parity or 0
    end
  end
  return {data = rl.tensor(x), classes = rl.tensor(y, "int32"), lengths = rl.tensor(len, "int32")}
end

local train, dev = {}, {}
for i = 1, N_TRAIN // B do train[i] = make_batch() end
for i = 1, N_DEV // B do dev[i] = make_batch() end

local net = rl.network({
  fw1 = {class = "lstm", n_out = 16, from = "data"},
  bw1 = {class = "lstm", n_out = 16, from = "data", direction = -1},
  fw2 = {class = "lstm", n_out = 16, from = {"fw1", "bw1"}},
  bw2 = {class = "lstm", n_out = 16, from = {"fw1", "bw1"}, direction = -1},
  output = {class = "softmax", from = {"fw2", "bw2"}, loss = "ce", target = "classes"},
}, {data = {dim = 2}, classes = {dim = 2, sparse = true}})
print(net)

local params, grads = net:params(), net:grads()
local t0 = os.clock()
for epoch = 1, MAX_EPOCHS do
  local loss, errors, frames = 0, 0, 0
  for _, batch in ipairs(train) do
    net:zero_grads()
    local l, e = net:forward(batch)
    net:backward()
    -- losses are summed over frames: clip the gradient norm, then a plain SGD step
    local norm = grads:norm()
    local scale = norm > CLIP and CLIP / norm or 1
    params:add_(grads:mul_(-LR * scale))
    loss, errors, frames = loss + l, errors + e, frames + net.n_frames
  end
  local dloss, derrors, dframes = 0, 0, 0
  for _, batch in ipairs(dev) do
    local l, e = net:forward(batch, {train = false})
    dloss, derrors, dframes = dloss + l, derrors + e, dframes + net.n_frames
  end
  print(string.format(
    "epoch %2d  train loss %.4f  FER %6.2f%%   dev loss %.4f  FER %6.2f%%  (%.1f s cpu)", epoch, loss / frames, 100 * errors / frames, dloss / dframes, 100 * derrors / dframes,
    os.clock() - t0))
  if derrors / dframes < 0.01 then
    print(string.format("dev frame error rate below 1%% after %d epochs", epoch))
    return
  end
end
error(string.format("the dev frame error rate stayed above 1%% after %d epochs", MAX_EPOCHS))
