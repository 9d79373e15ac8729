-- The optimizer's update pass splits its elements over the threads (kernels/cpu/optim.c):
-- every method, with and without gradient noise, in float32 and float64, must leave
-- bit-identical parameters and states on 1, 2 and 3 threads. The buffer (40009 elements, not a
-- multiple of the 16-element split unit) is above the split threshold (32768). Three steps
-- with changing gradients: a part that is skipped leaves its elements unchanged, a part run
-- twice moves them twice; both differ from the 1-thread run.
local H = dofile("tests/lua/harness.lua")

local N = 40009

local function flat(t) return t:contiguous():view(t:numel()):totable() end

local function run(cfg, dtype, threads)
  rl.set_num_threads(threads)
  rl.manual_seed(3)
  local params, grads = rl.randn(N, dtype), rl.zeros({N}, dtype)
  local opt = rl.optimizer(cfg, params, grads)
  rl.manual_seed(4)
  for s = 1, 3 do
    grads:copy_(rl.randn(N, dtype))
    local ok, why = opt:step(0.01 * s)
    H.check(ok, "step " .. s .. " skipped: " .. tostring(why))
  end
  local out = {params = flat(params)}
  for k, v in pairs(opt:state()) do
    if type(v) == "userdata" then out[k] = flat(v) end
  end
  return out
end

local CLASSES = {"sgd", "momentum", "nesterov", "adagrad", "adadelta", "adam", "adamw"}
local saved = rl.get_num_threads()
for _, dtype in ipairs({"float32", "float64"}) do
  for _, class in ipairs(CLASSES) do
    for _, noise in ipairs({0, 0.01}) do
      local cfg = {class = class, gradient_noise = noise > 0 and noise or nil, outlier_factor = 0}
      local name = string.format("%s %s%s: bit-identical on 1, 2 and 3 threads", class, dtype,
        noise > 0 and " with noise" or "")
      H.test(name, function()
        H.same_on_threads(function(threads) return run(cfg, dtype, threads) end)
      end)
    end
  end
end
rl.set_num_threads(saved)

H.done()
