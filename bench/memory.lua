-- The tensor collector's cost (lua/l_tensor.c, docs/tensors.md "Memory"): a loop that makes tensors of
-- varying shapes and drops them, as a training loop's Lua code does, keeping the last five
-- steps' alive. Each step fills an (r, 256) float32 input, r = 2000..5999 (2 to 6 MB), and
-- multiplies it by a (256, 256) matrix (as much again): about 8 MB made a step, about 40 MB
-- alive. Prints a Markdown section: CPU time (user and system), minor page faults and the peak
-- resident set of the whole process.
-- Usage: rnnlua bench/memory.lua [STEPS]   (default 1000; bench/README.md's figures: 3000)
local steps = tonumber(arg and arg[1] or "") or 1000

local function read(path)
  local f = assert(io.open(path))
  local s = f:read("a")
  f:close()
  return s
end

-- user and system seconds, minor faults (/proc/self/stat fields 14, 15, 10; the kernel counts
-- CPU time there in USER_HZ = 100 ticks a second on every Linux)
local function usage()
  local fields = {}
  for w in read("/proc/self/stat"):match("%)%s+(.*)$"):gmatch("%S+") do
    fields[#fields + 1] = w
  end
  return tonumber(fields[12]) / 100, tonumber(fields[13]) / 100, tonumber(fields[8])
end

local w = rl.randn(256, 256)
local recent, made = {}, 0
local u0, s0, f0 = usage()
local t0 = rl.clock()
for step = 1, steps do
  local rows = 2000 + (step * 37) % 4000
  local x = rl.empty(rows, 256):fill_(0.01)
  recent[step % 5 + 1] = {x, rl.matmul(x, w)}
  made = made + 2 * rows * 256 * 4
end
local wall = rl.clock() - t0
local u1, s1, f1 = usage()
local hwm = tonumber(read("/proc/self/status"):match("VmHWM:%s*(%d+) kB"))

print("### Memory: a loop of dropped tensors")
print()
print("| steps | made | wall | user CPU | system CPU | minor page faults | peak resident set |")
print("|---|---|---|---|---|---|---|")
print(string.format("| %d | %.1f GB | %.1f s | %.1f s | %.1f s | %d | %.0f MB |", steps, made / 1e9,
  wall, u1 - u0, s1 - s0, f1 - f0, hwm / 1024))
print()
print("`bench/memory.lua`: ~8 MB of tensors of varying shapes made and dropped a step, the last " ..
  "five steps' alive; CPU time and faults of the loop, peak resident set of the process.")
