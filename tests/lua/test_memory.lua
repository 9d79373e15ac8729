-- Garbage tensors are collected in proportion to the bytes they hold, not to their small Lua
-- handles: a training loop that makes and drops tensors keeps its resident memory near what it
-- holds alive (before, with the generational collector, it grew by gigabytes: every aged
-- garbage tensor waited for a major collection that the small Lua heap never triggered).
local H = dofile("tests/lua/harness.lua")

local function rss_mib()
  local f = io.open("/proc/self/status")
  if not f then return nil end
  local s = f:read("a")
  f:close()
  return tonumber(s:match("VmRSS:%s*(%d+)")) / 1024
end

H.test("rl.storage_bytes counts storages, not views", function()
  collectgarbage()
  local base = rl.storage_bytes()
  local t = rl.zeros(1000, 250) -- 1e6 bytes in float32
  H.check(rl.storage_bytes() - base == 1000000, "a new tensor adds its bytes")
  local v = t:narrow(1, 1, 10):t()
  H.check(rl.storage_bytes() - base == 1000000, "views add nothing")
  t, v = nil, nil
  collectgarbage()
  H.check(rl.storage_bytes() == base, "collected tensors give their bytes back")
end)

H.test("dropped tensors of varying shapes stay collected in a long loop", function()
  collectgarbage()
  local rss0, bytes0 = rss_mib(), rl.storage_bytes()
  local recent, peak = {}, 0
  local w = rl.randn(128, 128)
  -- 500 steps of about 2.5 MB each: 1.25 GB made in all, about 10 MB alive at any time (the
  -- collector allows 256 MiB of garbage). The last few steps' tensors stay referenced, so they
  -- age past minor collections.
  for step = 1, 500 do
    local rows = 1000 + (step * 37) % 1500
    local x = rl.empty(rows, 128)
    local h = rl.matmul(x:fill_(0.01), w)
    recent[step % 3 + 1] = {x, h}
    peak = math.max(peak, rl.storage_bytes() - bytes0)
  end
  recent = nil
  H.check(peak < 400 * 2 ^ 20, string.format("live storage bytes peaked at %.0f MiB", peak / 2 ^ 20))
  local rss1 = rss_mib()
  if rss0 and rss1 then
    H.check(rss1 - rss0 < 450, string.format("resident memory grew by %.0f MiB", rss1 - rss0))
  end
end)

-- Minor page faults of this process so far (/proc/self/stat, field 10).
local function minor_faults()
  local f = io.open("/proc/self/stat")
  if not f then return nil end
  local s = f:read("a")
  f:close()
  local fields = {}
  for w in s:match("%)%s+(.*)$"):gmatch("%S+") do fields[#fields + 1] = w end
  return tonumber(fields[8])
end

-- The collector tunes glibc's malloc; AddressSanitizer's allocator (or another C library's)
-- maps and reuses memory in its own way.
local function glibc_malloc()
  local f = io.open("/proc/self/maps")
  if not f then return false end
  local s = f:read("a")
  f:close()
  return s:find("libc.so.6", 1, true) ~= nil and not s:find("libasan", 1, true)
end

H.test("storages freed by a collection are reused, not faulted in again", function()
  if not minor_faults() or not glibc_malloc() then
    print("SKIP page-fault check (no /proc/self/stat, or not glibc's malloc)")
    return
  end
  local w = rl.randn(128, 128)
  local recent, made = {}, 0
  local function run(steps)
    for step = 1, steps do
      local rows = 1000 + (step * 37) % 1500
      local x = rl.empty(rows, 128)
      recent[step % 3 + 1] = {x, rl.matmul(x:fill_(0.01), w)}
      made = made + 2 * rows * 128 * 4
    end
  end
  run(300) -- the heap grows to its working size (one collection cycle and more)
  local f0 = minor_faults()
  made = 0
  run(600) -- 1.5 GB of storages, several collections
  local faults, pages = minor_faults() - f0, made / 4096
  -- glibc's defaults (heap top handed back at each collection) fault in a tenth of the pages,
  -- a trim after every collection all of them
  H.check(faults < 0.03 * pages, string.format("%d page faults for %.0f pages of storages made",
    faults, pages))
  recent = nil
end)

H.test("layers' storages count too", function()
  collectgarbage()
  local bytes0 = rl.storage_bytes()
  local peak, recent = 0, {}
  for i = 1, 200 do -- 800 MB made
    recent[i % 3 + 1] = rl._layer_new("linear", "l", {n_out = 1000}, {1000}) -- 4 MB of weights
    peak = math.max(peak, rl.storage_bytes() - bytes0)
  end
  H.check(peak < 400 * 2 ^ 20, string.format("live storage bytes peaked at %.0f MiB", peak / 2 ^ 20))
end)

H.done()
