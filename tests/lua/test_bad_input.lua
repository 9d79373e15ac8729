-- Bad input to the library, one case a line: each must raise a catchable error whose message
-- names what was wrong (the pattern after the function), never crash, hang or give a silently
-- wrong number. The command line and the REPL are in tests/sh/test_bad_input.sh; tampered
-- checkpoints in tests/lua/test_checkpoint.lua.
local H = dofile("tests/lua/harness.lua")
local lfs = require("lfs")
local dir = os.tmpname()
os.remove(dir)
assert(lfs.mkdir(dir))

local function cases(list)
  for _, c in ipairs(list) do H.expect_error(c[1], c[2], c[3]) end
end

---------------------------------------------------------------- use after free
local FREED = "the tensor was freed"

-- A tensor closed by <close>, one closed with its coroutine, one resurrected by a finaliser.
local function closed()
  local keep
  do
    local t <close> = rl.ones(2, 3)
    keep = t
  end
  return keep
end

local function closed_by_coroutine()
  local keep
  local co = coroutine.create(function()
    local t <close> = rl.ones(4)
    keep = t
    coroutine.yield()
  end)
  coroutine.resume(co)
  coroutine.close(co)
  return keep
end

local function resurrected()
  local back
  do
    local t = rl.ones(3)
    setmetatable({t = t}, {__gc = function(h) back = h.t end})
  end
  collectgarbage()
  collectgarbage()
  assert(back, "the finaliser did not run")
  return back
end

for _, how in ipairs{{"closed", closed}, {"closed coroutine", closed_by_coroutine},
                     {"resurrected", resurrected}} do
  local name, make = how[1], how[2]
  cases{
    {name .. ": item", function() make():item() end, FREED},
    {name .. ": totable", function() make():totable() end, FREED},
    {name .. ": tostring", function() tostring(make()) end, FREED},
    {name .. ": t[1]", function() return make()[1] end, FREED},
    {name .. ": t[1] = 0", function() make()[1] = 0 end, FREED},
    {name .. ": #t", function() return #make() end, FREED},
    {name .. ": t + 1", function() return make() + 1 end, FREED},
    {name .. ": size", function() make():size() end, FREED},
    {name .. ": narrow", function() make():narrow(1, 1, 1) end, FREED},
    {name .. ": copy_ into it", function() make():copy_(rl.ones(2, 3)) end, FREED},
    {name .. ": copy_ from it", function() rl.ones(2, 3):copy_(make()) end, FREED},
    {name .. ": matmul", function() rl.matmul(make(), rl.ones(3, 1)) end, FREED},
    {name .. ": cat", function() rl.cat({make(), make()}) end, FREED},
    {name .. ": rl.save", function() rl.save(dir .. "/freed.h5", {x = make()}) end, FREED},
  }
end
H.test("a freed tensor is still a tensor for is_tensor", function()
  H.check(rl.is_tensor(closed()))
end)

for entry in lfs.dir(dir) do
  if entry ~= "." and entry ~= ".." then os.remove(dir .. "/" .. entry) end
end
lfs.rmdir(dir)
H.done()
