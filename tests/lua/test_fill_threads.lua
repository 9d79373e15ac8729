-- A contiguous fill of 2^16 elements or more splits its elements over the threads
-- (kernels/cpu/cpu.c, cpu_fill): on 1, 2 and 3 threads, in float32, float64 and int32, every
-- element of a tensor that held other values (odd length, not a multiple of the 16-element
-- split unit) ends up the fill value, so a skipped part shows; the elements of a strided view
-- (not split) are filled and its gaps left alone.
local H = dofile("tests/lua/harness.lua")

local N = 200003
local saved = rl.get_num_threads()
for _, dtype in ipairs({"float32", "float64", "int32"}) do
  H.test(dtype .. ": fill on 1, 2 and 3 threads sets every element", function()
    for threads = 1, 3 do
      rl.set_num_threads(threads)
      rl.manual_seed(threads)
      local t = (rl.rand(N) * 100 + 1):floor():to(dtype)
      H.check(t:min() >= 1, "the start values")
      t:fill_(-3)
      H.check(t:min() == -3 and t:max() == -3,
        string.format("%d threads: min %g, max %g", threads, t:min(), t:max()))
      t:zero_()
      H.check(t:min() == 0 and t:max() == 0, threads .. " threads: zero_")
      -- a strided view: every other element
      local m = rl.full({N, 2}, 5, dtype)
      m:select(2, 1):fill_(1)
      H.check(m:select(2, 1):min() == 1 and m:select(2, 1):max() == 1, "view filled")
      H.check(m:select(2, 2):min() == 5 and m:select(2, 2):max() == 5, "gaps untouched")
    end
  end)
end
rl.set_num_threads(saved)

H.done()
