-- The REPL's help (lua/rnnlua/help.lua): every public rl function (and rl.dist's) has a
-- signature, every entry names a function that exists, and docs/repl.md's reference is the
-- table's markdown, so the two cannot drift.
local H = dofile("tests/lua/harness.lua")
local help = require("rnnlua.help")
local repl = require("rnnlua.repl")

H.test("every public rl function has an entry", function()
  local missing = {}
  local function scan(t, prefix)
    for k, v in pairs(t) do
      if type(k) == "string" and k:sub(1, 1) ~= "_" and type(v) == "function"
          and not help.by_name[prefix .. k] then
        missing[#missing + 1] = prefix .. k
      end
    end
  end
  scan(rl, "rl.")
  scan(rl.dist, "rl.dist.")
  table.sort(missing)
  H.check(#missing == 0, "no signature in lua/rnnlua/help.lua for: " .. table.concat(missing, ", "))
end)

H.test("every entry names an existing function", function()
  for name, e in pairs(help.by_name) do
    local v = _G
    for part in name:gmatch("[^.]+") do v = v[part] end
    H.check(type(v) == "function", name .. " is no function")
    H.check(e[2]:find(name, 1, true) == 1, name .. ": the signature starts otherwise: " .. e[2])
  end
end)

H.test("docs/repl.md holds the generated reference", function()
  local fh = assert(io.open("docs/repl.md"))
  local doc = fh:read("a")
  fh:close()
  local gen = help.markdown()
  H.check(doc:find(gen, 1, true), "docs/repl.md differs from lua/rnnlua/help.lua: regenerate its "
    .. "reference with rnnlua -e 'io.write(require(\"rnnlua.help\").markdown())'")
end)

H.test("help by value, by name and misspelt", function()
  H.check(repl.help_text(rl.zeros):find("^rl%.zeros%(d1, d2"), repl.help_text(rl.zeros))
  H.check(repl.help_text("dist.rank"):find("^rl%.dist%.rank%(%)"), repl.help_text("dist.rank"))
  H.check(repl.help_text("rl.ctc_decod"):find("did you mean rl.ctc_decode?", 1, true),
    repl.help_text("rl.ctc_decod"))
  H.check(repl.help_text(print):find("not an rl function"), repl.help_text(print))
  H.check(repl.help_text():find("Tensors: tensor, zeros"), repl.help_text())
end)

H.test("globalize keeps lines and leaves strings, comments and blocks alone", function()
  local cases = {
    {"local x = 1", "x = 1"},
    {"local a, b = f()", "a, b = f()"},
    {"local x", "x = nil"},
    {"local function f() local y = 2 return y end", "function f() local y = 2 return y end"},
    {"do local z = 1 end local w = 2", "do local z = 1 end w = 2"},
    {"if c then local z = 1 end", "if c then local z = 1 end"},
    {"while c do local z = 1 end", "while c do local z = 1 end"},
    {"repeat local z = 1 until z", "repeat local z = 1 until z"},
    {"local s = 'local q'", "s = 'local q'"},
    {"local t <const> = 3", "local t <const> = 3"},
    {"local x = [[\nlocal y]] -- local z\nlocal e = 1e+5", "x = [[\nlocal y]] -- local z\ne = 1e+5"},
    {"local f = function() local g = 1 end", "f = function() local g = 1 end"},
  }
  for _, c in ipairs(cases) do
    local got = repl.globalize(c[1])
    H.check(got == c[2], string.format("%q -> %q, expected %q", c[1], got, c[2]))
  end
end)

H.test("pretty", function()
  H.check(repl.pretty({1, 2, a = {b = 3}}) == "{1, 2, a = {b = 3}}", repl.pretty({1, 2, a = {b = 3}}))
  H.check(repl.pretty({["a b"] = 1, [2.5] = true}) == '{[2.5] = true, ["a b"] = 1}',
    repl.pretty({["a b"] = 1, [2.5] = true}))
  local long = string.rep("x", 100)
  H.check(repl.pretty({long}):find('"xxx...+" %(100 bytes%)'), repl.pretty({long}))
  local deep = {}
  for i = 1, 200 do deep[i] = {name = "item" .. i, value = i} end
  local n = 0
  for _ in repl.pretty(deep):gmatch("\n") do n = n + 1 end
  H.check(n <= 61, "at most 60 lines and a mark, got " .. n)
end)

H.done()
