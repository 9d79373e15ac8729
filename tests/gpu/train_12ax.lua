-- The device kit's training check (build-device/kit/run.sh): the same 12AX recipe (a small
-- bidirectional LSTM, Adam, newbob) trained by rl.train once on the CPU and once with
-- device = "cuda"; the device run must reach the CPU run's dev frame error (at most 1% more,
-- absolute), and its last checkpoint must load into a network on the CPU and give there the dev
-- error the device run reported for it. Without a GPU the device side is the CPU itself (so the
-- script and the comparisons still run). Prints one line per figure and the closing
-- "N passed, N failed" line. Usage: rnnlua tests/gpu/train_12ax.lua [NUM_EPOCHS]
local H = dofile("tests/lua/harness.lua")
local GPU = rl.device_count() > 0
local KIND = GPU and "cuda" or "cpu"
print(GPU and "device side: cuda:0" or
  "no CUDA device: the harness runs with the CPU as the device side (nothing of the GPU is tested)")
local epochs = tonumber(arg[1] or "") or 4
local DEV_DATA = {class = "12ax", num_seqs = 200, seed = 2}
local BATCH = {batch_size = 2500, max_seqs = 25}

local dir = H.tmpdir()
local function config(device, name)
  return {
    network = {
      fw = {class = "lstm", n_out = 32},
      bw = {class = "lstm", n_out = 32, direction = -1},
      output = {class = "softmax", from = {"fw", "bw"}, loss = "ce", target = "classes"},
    },
    train = {class = "12ax", num_seqs = 1000, seed = 1, seq_ordering = "laplace:20"},
    dev = DEV_DATA, num_epochs = epochs, batch_size = BATCH.batch_size,
    max_seqs = BATCH.max_seqs, optimizer = {class = "adam", gradient_clip_global_norm = 5},
    learning_rate = 0.01, learning_rate_control = "newbob", newbob_learning_rate_decay = 0.7,
    model = dir .. "/" .. name .. "/net", log_verbosity = 0, seed = 1, device = device,
  }
end

local function timed(device, name)
  local t0 = rl.clock()
  local r = rl.train(config(device, name), {})
  print(string.format("%s: dev frame error %.3f%% after %d epochs, %.1f s", name,
    100 * r.dev_error, r.epoch, rl.clock() - t0))
  return r
end

local cpu = timed("cpu", "cpu")
local dev = timed(KIND, "device")

H.test("the device run reaches the CPU run's dev frame error", function()
  H.check(dev.dev_error <= cpu.dev_error + 0.01, string.format("device %.4f vs cpu %.4f",
    dev.dev_error, cpu.dev_error))
end)

H.test("the device run's checkpoint loads on the CPU and gives its dev error there", function()
  local ck = rl.load_checkpoint(dev.checkpoint)
  local net = rl.network(ck.description, ck.extern_data)
  rl.checkpoint.load_params(ck, net)
  H.check(net.device == "cpu")
  local errors, frames = 0, 0
  for bt in rl.batches(rl.dataset(DEV_DATA), BATCH) do
    local _, e = net:forward(bt, {train = false})
    errors, frames = errors + e, frames + bt.n_frames
  end
  local err = errors / frames
  print(string.format("device checkpoint %s on the CPU: dev frame error %.3f%%",
    dev.checkpoint:match("[^/]*$"), 100 * err))
  H.check(math.abs(err - dev.dev_error) <= 0.002,
    string.format("on the CPU %.4f, reported by the device run %.4f", err, dev.dev_error))
end)

H.rm_rf(dir)
H.done()
