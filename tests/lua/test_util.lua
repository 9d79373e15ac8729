-- rnnlua.util, the table helpers the library's modules share: sorted_keys (mixed key types,
-- nil), copy, deep_copy and list_of.
local H = dofile("tests/lua/harness.lua")
local util = require("rnnlua.util")

H.test("sorted_keys orders by tostring and keeps the keys", function()
  local k = util.sorted_keys({b = 1, a = 2, [10] = 3, [2] = 4})
  H.check(table.concat(k, ",") == "10,2,a,b", "order: " .. table.concat(k, ","))
  H.check(math.type(k[1]) == "integer" and k[3] == "a", "keys are kept, not stringified")
  H.check(#util.sorted_keys(nil) == 0 and #util.sorted_keys({}) == 0, "nil and {} have none")
end)

H.test("copy is shallow, deep_copy is not", function()
  local t = {x = {1, 2}, y = "s"}
  local c, d = util.copy(t), util.deep_copy(t)
  H.check(c ~= t and c.x == t.x and c.y == "s", "copy shares nested tables")
  H.check(d ~= t and d.x ~= t.x and d.x[2] == 2 and d.y == "s", "deep_copy copies them")
  H.check(util.deep_copy(5) == 5, "deep_copy of a non-table is itself")
end)

H.test("list_of", function()
  H.check(#util.list_of(nil) == 0, "nil -> {}")
  H.check(util.list_of(nil, {"data"})[1] == "data", "nil -> the default")
  H.check(util.list_of("a")[1] == "a", "a name -> {name}")
  local l = {"a", "b"}
  H.check(util.list_of(l) == l and util.list_of(3) == 3, "anything else as it is")
end)

H.done()
