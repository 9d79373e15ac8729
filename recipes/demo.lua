-- A tour of rnnlua's tensors, run by `make demo`. Each step prints what it does; open the
-- REPL (`./rnnlua`) to try the same lines interactively.
require("rnnlua.cli").parse({usage = "rnnlua recipes/demo.lua",
  about = "A tour of rnnlua's tensors (make demo); it takes no options."}, arg)
local function step(title) print("\n== " .. title) end

step("tensors from Lua tables, float32 on the CPU")
local a = rl.tensor{{1, 2}, {3, 4}}
print(a)

step("matrix product, sum and a plain Lua table back")
local c = rl.matmul(a, a)
print(c:size(), c:sum())
print(c:totable()[2][1], c:totable()[2][2])

step("seeded random numbers: the same seed gives the same numbers on every run")
rl.manual_seed(1)
local r = rl.randn(3, 4)
print(r)

step("views share storage: narrow, select, transpose (positions are 1-based)")
local m = rl.arange(12):view(3, 4)
m:narrow(2, 2, 2):fill(0)
print(m)
print("row 2:", m[2]:totable()[1], "..", m:select(1, 2):sum(), "  transposed:", m:t():size())

step("broadcasting and in-place ops (a name ending in _ changes the tensor itself)")
local col = rl.tensor{{1}, {2}, {3}}
local row = rl.tensor{10, 20, 30, 40}
print(col + row)
row:mul_(0.5):add_(1)
print(row)

step("reductions with positions")
local scores = rl.tensor{{0.1, 0.7, 0.2}, {0.5, 0.3, 0.2}}
local best, where = scores:max(2)
print("best", best:totable()[1], best:totable()[2], "at", where:totable()[1], where:totable()[2])

step("tensors to and from HDF5 (readable with h5dump or h5py)")
local path = os.tmpname() .. ".h5"
rl.save(path, {weights = r, ["layer1/bias"] = rl.zeros(4)})
local back = rl.load(path)
print(path, "->", back.weights:size(), back["layer1/bias"]:size(),
  "equal:", (back.weights - r):abs():max() == 0)
os.remove(path)

step("errors are Lua errors you can catch; they name the op and the shapes")
print(pcall(rl.matmul, rl.zeros(2, 3), rl.zeros(4, 5)))

step("devices")
print("built with CUDA:", rl.cuda_built(), " CUDA devices:", rl.device_count())
print(pcall(function() return rl.zeros(2, {device = "cuda"}) end))

print("\nNext: run ./rnnlua for the REPL (tab completes rl.<TAB>, t:<TAB>), or see README.md and docs/.")
