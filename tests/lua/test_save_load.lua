-- rl.save / rl.load: round trips of every dtype, 0-dim tensors, strided views and nested
-- group names against literal tables; the error cases (catchable, naming the file and key);
-- a failed save leaves the previous file as it was.
local H = dofile("tests/lua/harness.lua")

local base = os.tmpname()
local P = base .. ".h5"
local made = {base, P}
local function tmp(suffix)
  local p = base .. suffix
  made[#made + 1] = p
  return p
end

local function same(a, b, path)
  path = path or "value"
  if type(a) == "table" then
    H.check(type(b) == "table", path .. ": expected a table", 2)
    H.check(#a == #b, string.format("%s: %d entries, expected %d", path, #b, #a), 2)
    for i = 1, #a do same(a[i], b[i], path .. "[" .. i .. "]") end
  else
    H.check(a == b, string.format("%s: got %s, expected %s", path, tostring(b), tostring(a)), 2)
  end
end

local function keys(t)
  local ks = {}
  for k in pairs(t) do ks[#ks + 1] = k end
  table.sort(ks)
  return table.concat(ks, ",")
end

local function exists(path)
  local f = io.open(path, "rb")
  if f then f:close() end
  return f ~= nil
end

H.test("round trip of every dtype and nested names", function()
  local w = {{0.5, -1.25, 3}, {4, 5.5, -6}}
  local ids = {0, -7, 2147483647, -2147483647}
  local third = {1 / 3, 2 / 3}  -- not representable in float32: float64 must stay exact
  rl.save(P, {
    ["params/lstm1/W"] = rl.tensor(w),
    ["params/lstm1/b"] = rl.tensor({1, 2, 3}, "float64"),
    labels = rl.tensor(ids, "int32"),
    third = rl.tensor(third, "float64"),
  })
  local t = rl.load(P)
  H.check(keys(t) == "labels,params/lstm1/W,params/lstm1/b,third", "keys: " .. keys(t))
  same(w, t["params/lstm1/W"]:totable(), "W")
  H.check(t["params/lstm1/W"]:type() == "float32", "W dtype")
  same({1, 2, 3}, t["params/lstm1/b"]:totable(), "b")
  H.check(t["params/lstm1/b"]:type() == "float64", "b dtype")
  same(ids, t.labels:totable(), "labels")
  H.check(t.labels:type() == "int32", "labels dtype")
  same(third, t.third:totable(), "third")
  local s = t["params/lstm1/W"]:size()
  H.check(s[1] == 2 and s[2] == 3, "W size")
end)

H.test("0-dim tensors, empty tensors and a single dataset", function()
  rl.save(P, {s = rl.tensor(2.5), z = rl.zeros(0, 3), ["g/x"] = rl.tensor({9, 8}, "int32")})
  local t = rl.load(P)
  H.check(t.s:dim() == 0, "scalar dim " .. t.s:dim())
  H.near(t.s:item(), 2.5, 0, "scalar")
  H.check(t.z:dim() == 2 and t.z:size()[1] == 0 and t.z:size()[2] == 3, "empty shape")
  same({9, 8}, rl.load(P, "g/x"):totable(), "one dataset")
  same({9, 8}, rl.load(P, "/g/x"):totable(), "one dataset, absolute")
end)

H.test("strided views are saved as their contents", function()
  local a = rl.tensor{{1, 2, 3}, {4, 5, 6}}
  rl.save(P, {tr = a:t(), col = a:select(2, 2), mid = a:narrow(2, 2, 2)})
  local t = rl.load(P)
  same({{1, 4}, {2, 5}, {3, 6}}, t.tr:totable(), "transpose")
  same({2, 5}, t.col:totable(), "select")
  same({{2, 3}, {5, 6}}, t.mid:totable(), "narrow")
end)

H.test("a CUDA tensor is saved through the CPU", function()
  local ok, g = pcall(function() return rl.tensor{{1, 2}, {3, 4}}:cuda() end)
  if not ok then return end  -- no CUDA device here
  rl.save(P, {g = g})
  same({{1, 2}, {3, 4}}, rl.load(P).g:totable(), "from cuda")
end)

H.test("save: an empty table (of nils) is refused and the file kept", function()
  rl.save(P, {x = rl.tensor{1, 2}})
  local unset
  local ok, err = pcall(rl.save, P, {x = unset})
  H.check(not ok and tostring(err):find("rl.save: " .. P .. ": nothing to save", 1, true),
    tostring(err))
  same({1, 2}, rl.load(P).x:totable(), "the file is kept")
end)

local missing = tmp(".missing.h5")
H.expect_error("load: missing file", function() rl.load(missing) end, "rl.load: " .. missing)
H.expect_error("load: missing file says so", function() rl.load(missing) end, "No such file")

local garbage = tmp(".garbage.h5")
H.write_file(garbage, string.rep("not hdf5 at all\n", 200))
H.expect_error("load: not an HDF5 file", function() rl.load(garbage) end,
               "rl.load: " .. garbage .. ": not an HDF5 file")

H.test("load: truncated file", function()
  local big = {}
  for i = 1, 2000 do big[i] = i end
  rl.save(P, {a = rl.tensor(big), b = rl.tensor(big, "float64")})
  local bytes = H.read_file(P)
  local cut = tmp(".cut.h5")
  H.write_file(cut, bytes:sub(1, #bytes // 2))
  local ok, err = pcall(rl.load, cut)
  H.check(not ok, "loading a truncated file succeeded")
  H.check(tostring(err):find("rl.load: " .. cut, 1, true), "message: " .. tostring(err))
end)

H.expect_error("load: missing dataset", function() rl.load(P, "no/such") end, "no/such")
H.expect_error("save: value that is not a tensor", function()
  rl.save(tmp(".bad.h5"), {good = rl.zeros(2), bad = 42})
end, "'bad' is not a tensor")
H.expect_error("save: key that is not a string", function()
  rl.save(tmp(".bad.h5"), {rl.zeros(2)})
end, "names must be strings")
H.expect_error("save: table expected", function() rl.save(tmp(".bad.h5"), 3) end, "table expected")
H.expect_error("save: directory missing", function()
  rl.save(base .. ".nodir/x.h5", {a = rl.zeros(1)})
end, "rl.save: " .. base .. ".nodir/x.h5")

H.test("a failed save leaves the existing file unchanged", function()
  rl.save(P, {v = rl.tensor{1, 2, 3}})
  local before = H.read_file(P)
  -- "x" is written first (names are sorted), then "x/y" needs x to be a group
  local ok, err = pcall(rl.save, P, {x = rl.zeros(2), ["x/y"] = rl.zeros(2)})
  H.check(not ok, "the conflicting save succeeded")
  H.check(tostring(err):find("x/y", 1, true), "message names the dataset: " .. tostring(err))
  H.check(H.read_file(P) == before, "the old file changed")
  same({1, 2, 3}, rl.load(P).v:totable(), "old contents")
  -- no temporary file is left next to it
  local ls = io.popen("ls -a '" .. P .. "'.tmp.* 2>/dev/null")
  local left = ls:read("a")
  ls:close()
  H.check(left == "", "temporary files left: " .. left)
  -- and a good save replaces it
  rl.save(P, {v = rl.tensor{4}})
  same({4}, rl.load(P).v:totable(), "new contents")
end)

for _, p in ipairs(made) do
  if exists(p) then os.remove(p) end
end
H.done()
