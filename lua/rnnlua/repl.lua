-- REPL helpers of the rnnlua host (module "rnnlua.repl"): tab-completion candidates
-- (complete), top-level locals kept across lines (globalize), tables shown as tables (pretty),
-- help(x) and ?x (help, from rnnlua.help's signatures) and "did you mean" after an error naming
-- a missing field or method (hint). lua/rnnlua.c calls them; none of them runs user code.
--
-- The host's readline hook passes the word under the cursor, e.g. "rl.layers.re",
-- "string.fo", "x:si" or "pri", and shows what complete() returns. Completion only reads:
-- it walks tables with rawget and follows __index only where __index is a table, so a
-- TAB never runs a metamethod or any other user code. An __index function cannot be
-- listed, so a metatable may publish what it serves as a `__methods` table (rnnlua.Tensor
-- does: its __index function also handles t[i]).
local M = {}

local keywords = {
  "and", "break", "do", "else", "elseif", "end", "false", "for", "function", "goto", "if",
  "in", "local", "nil", "not", "or", "repeat", "return", "then", "true", "until", "while",
}

-- __index chains longer than this are taken to be cycles.
local MAX_DEPTH = 16

-- The table that v's __index serves fields from: __index itself when it is a table, else
-- the metatable's __methods table.
local function index_table(v)
  local mt = debug.getmetatable(v)
  if mt == nil then return nil end
  local idx = rawget(mt, "__index")
  if type(idx) == "table" then return idx end
  idx = rawget(mt, "__methods")
  if type(idx) == "table" then return idx end
  return nil
end

-- v[k] without running metamethods: own field first, then the __index tables.
local function lookup(v, k)
  for _ = 1, MAX_DEPTH do
    if type(v) == "table" then
      local x = rawget(v, k)
      if x ~= nil then return x end
    end
    v = index_table(v)
    if v == nil then return nil end
  end
  return nil
end

-- Calls fn(key, value) for each identifier key reachable from v: its own fields when v is
-- a table, then those of its __index tables; each key once, nearest first, as v.key would
-- find it.
local function each_field(v, fn)
  local seen = {}
  local t = type(v) == "table" and v or index_table(v)
  for _ = 1, MAX_DEPTH do
    if t == nil then break end
    for k, x in next, t do
      if type(k) == "string" and not seen[k] and k:match("^[%a_][%w_]*$") then
        seen[k] = true
        fn(k, x)
      end
    end
    t = index_table(t)
  end
end

local function is_callable(x)
  if type(x) == "function" then return true end
  local mt = debug.getmetatable(x)
  return mt ~= nil and rawget(mt, "__call") ~= nil
end

-- The candidates completing `word`, sorted: each is the whole word, e.g. complete("rl.ze")
-- gives {"rl.zeros"}. After "." it offers fields (own and inherited through __index
-- tables or __methods); after ":" only the callable ones (methods); with neither, globals
-- and keywords. `env` defaults to _G.
function M.complete(word, env)
  env = env or _G
  local out = {}
  local base, sep, part = word:match("^(.*)([.:])([%w_]*)$")
  if not base then
    part = word:match("^[%a_][%w_]*$") and word or (word == "" and "" or nil)
    if part == nil then return out end
    for _, k in ipairs(keywords) do
      if k:sub(1, #part) == part then out[#out + 1] = k end
    end
    each_field(env, function(k)
      if k:sub(1, #part) == part then out[#out + 1] = k end
    end)
  else
    local v = env
    for name in (base .. "."):gmatch("([^.]*)%.") do
      if not name:match("^[%a_][%w_]*$") then return out end
      v = lookup(v, name)
      if v == nil then return out end
    end
    each_field(v, function(k, x)
      -- names starting with "_" are the library's internals: offered only once typed
      if k:sub(1, #part) == part and (sep == "." or is_callable(x))
          and (k:sub(1, 1) ~= "_" or part:sub(1, 1) == "_") then
        out[#out + 1] = base .. sep .. k
      end
    end)
  end
  table.sort(out)
  local uniq = {}
  for i, c in ipairs(out) do
    if c ~= out[i - 1] then uniq[#uniq + 1] = c end
  end
  return uniq
end

---------------------------------------------------------------------------- locals

-- The tokens of Lua source: calls fn(kind, text, first, last) for each name ("name"), other
-- token ("op"; "..." is one), skipping blanks, comments and the insides of strings and numbers
-- ("value"). Good enough to find statements: the chunk was or will be checked by the parser.
local function tokens(src, fn)
  local i, n = 1, #src
  while i <= n do
    local c = src:sub(i, i)
    if c:match("%s") then
      i = i + 1
    elseif src:sub(i, i + 1) == "--" then
      local eq = src:match("^%[(=*)%[", i + 2)
      if eq then
        local _, e = src:find("]" .. eq .. "]", i, true)
        i = (e or n) + 1
      else
        i = (src:find("\n", i, true) or n) + 1
      end
    elseif c == '"' or c == "'" then
      local j = i + 1
      while j <= n do
        local d = src:sub(j, j)
        if d == "\\" then j = j + 2
        elseif d == c or d == "\n" then break
        else j = j + 1 end
      end
      fn("value", src:sub(i, j), i, j)
      i = j + 1
    elseif c == "[" and src:match("^%[=*%[", i) then
      local eq = src:match("^%[(=*)%[", i)
      local _, e = src:find("]" .. eq .. "]", i, true)
      fn("value", "", i, e or n)
      i = (e or n) + 1
    elseif c:match("[%a_]") then
      local s, e = src:find("^[%w_]+", i)
      fn("name", src:sub(s, e), s, e)
      i = e + 1
    elseif c:match("%d") or (c == "." and src:match("^%.%d", i)) then
      local _, e = src:find("^[%w_%.]+", i)
      while src:sub(e, e):match("[eEpP]") and src:sub(e + 1, e + 1):match("[+-]") do
        _, e = src:find("^[%w_%.]*", e + 2)
      end
      fn("value", "", i, e)
      i = e + 1
    else
      local op = src:match("^%.%.%.", i) or src:match("^[=~<>]=", i) or src:match("^::", i)
        or src:match("^//", i) or src:match("^%.%.", i) or src:match("^<<", i)
        or src:match("^>>", i) or c
      fn("op", op, i, i + #op - 1)
      i = i + #op
    end
  end
end

local OPENS = {["function"] = true, ["do"] = true, ["if"] = true, ["repeat"] = true}
local CLOSES = {["end"] = true, ["until"] = true}

-- The REPL compiles each chunk on its own, so `local x = 1` typed at the prompt would be gone
-- at the next line. As trepl does, the chunk's top-level local statements become assignments
-- to globals: `local a, b = f()` -> `a, b = f()`, `local x` -> `x = nil`, `local function f`
-- -> `function f`. Locals inside functions and blocks stay local; a statement with an
-- attribute (<const>, <close>) stays as it is, since a global can be neither. Newlines are
-- kept, so error messages keep their line numbers.
function M.globalize(src)
  local toks = {}
  tokens(src, function(kind, text, first, last)
    toks[#toks + 1] = {kind = kind, text = text, first = first, last = last}
  end)
  local depth, edits = 0, {}
  for k, t in ipairs(toks) do
    if t.kind == "name" then
      if OPENS[t.text] then
        depth = depth + 1
      elseif CLOSES[t.text] then
        depth = depth - 1
      elseif t.text == "local" and depth == 0 then
        local nx = toks[k + 1]
        if nx and nx.kind == "name" and nx.text == "function" then
          edits[#edits + 1] = {t.first, t.last + 1, ""}
        else
          -- name {, name}, then "=" or the statement's end; an attribute leaves it alone
          local j, last_name, attrib = k + 1, nil, false
          while toks[j] and toks[j].kind == "name" do
            last_name = toks[j]
            j = j + 1
            if toks[j] and toks[j].text == "<" then attrib = true break end
            if not (toks[j] and toks[j].text == ",") then break end
            j = j + 1
          end
          if last_name and not attrib then
            edits[#edits + 1] = {t.first, t.last + 1, ""}
            if not (toks[j] and toks[j].text == "=") then
              edits[#edits + 1] = {last_name.last + 1, last_name.last, " = nil"}
            end
          end
        end
      end
    end
  end
  if #edits == 0 then return src end
  local out, pos = {}, 1
  for _, e in ipairs(edits) do
    out[#out + 1] = src:sub(pos, e[1] - 1)
    out[#out + 1] = e[3]
    pos = e[2] + 1
    -- an edit {first, last + 1, ""} drops the word and the one blank after it
    if e[3] == "" then pos = e[2] end
    if e[3] == "" and src:sub(pos, pos):match("[ \t]") then pos = pos + 1 end
  end
  out[#out + 1] = src:sub(pos)
  return table.concat(out)
end

-- The script of `rnnlua -i FILE.lua` compiled with its top-level locals as globals, so the REPL
-- after it sees them: {function}, or {nil, message} as loadfile gives. A first line starting
-- with "#" (#!) is skipped, as lua.c does, keeping the line numbers.
function M.loadfile_globalized(path)
  local fh, err = io.open(path, "rb")
  if not fh then return {nil, "cannot open " .. tostring(err)} end
  local src = fh:read("a")
  fh:close()
  if src:sub(1, 1) == "#" then src = src:gsub("^[^\n]*", "", 1) end
  local fn, lerr = load(M.globalize(src), "@" .. path, "t")
  return {fn, lerr}
end

---------------------------------------------------------------------------- pretty

-- How much of a table the REPL shows: nesting, entries per table, characters of a string
-- inside a table, total lines; a line this wide or shorter is kept on one line.
local PRETTY = {depth = 3, entries = 20, string = 80, lines = 60, width = 80}

local function short_tostring(v)
  local ok, s = pcall(tostring, v)
  if not ok then return "<__tostring failed: " .. tostring(s) .. ">" end
  -- a value whose text runs over several lines (a tensor) is shown by its last line (its
  -- summary: dtype, shape, device)
  if s:find("\n") then s = s:match("([^\n]*)\n*$") end
  return s
end

local function key_order(a, b)
  local ta, tb = type(a), type(b)
  if ta ~= tb then return ta < tb end
  if ta == "number" or ta == "string" then return a < b end
  return tostring(a) < tostring(b)
end

local function render(v, depth, indent, seen)
  if type(v) == "string" then
    if #v > PRETTY.string then
      return string.format("%q", v:sub(1, PRETTY.string)):sub(1, -2) .. "...\" (" .. #v
        .. " bytes)"
    end
    return (string.format("%q", v):gsub("\\\n", "\\n"))
  end
  local mt = debug.getmetatable(v)
  if type(v) ~= "table" or (mt and (rawget(mt, "__tostring") or rawget(mt, "__name"))) then
    return short_tostring(v)
  end
  if seen[v] then return "<cycle: " .. tostring(v) .. ">" end
  if next(v) == nil then return "{}" end
  if depth >= PRETTY.depth then return "{...}" end
  seen[v] = true
  local n = #v
  local keys = {}
  for k in next, v do
    if not (math.type(k) == "integer" and k >= 1 and k <= n) then keys[#keys + 1] = k end
  end
  table.sort(keys, key_order)
  local parts, shown, total = {}, 0, n + #keys
  local function add(text)
    shown = shown + 1
    if shown <= PRETTY.entries then parts[#parts + 1] = text end
  end
  for i = 1, n do
    if shown >= PRETTY.entries then shown = shown + 1 else add(render(v[i], depth + 1,
      indent .. "  ", seen)) end
  end
  for _, k in ipairs(keys) do
    if shown >= PRETTY.entries then break end
    local ks = type(k) == "string" and k:match("^[%a_][%w_]*$") and k
      or "[" .. render(k, PRETTY.depth, "", seen) .. "]"
    add(ks .. " = " .. render(rawget(v, k), depth + 1, indent .. "  ", seen))
  end
  seen[v] = nil
  if total > #parts then parts[#parts + 1] = "... (" .. (total - #parts) .. " more)" end
  local one = "{" .. table.concat(parts, ", ") .. "}"
  if #one + #indent <= PRETTY.width and not one:find("\n") then return one end
  -- one entry a line, short ones (numbers of a list) packed side by side up to the width
  local lines, cur = {}, nil
  for i, p in ipairs(parts) do
    local item = p .. (i < #parts and "," or "")
    if cur and not p:find("\n") and not cur:find("\n")
        and #indent + 2 + #cur + 1 + #item <= PRETTY.width then
      cur = cur .. " " .. item
    else
      if cur then lines[#lines + 1] = cur end
      cur = item
    end
  end
  lines[#lines + 1] = cur
  return "{\n" .. indent .. "  " .. table.concat(lines, "\n" .. indent .. "  ") .. "\n"
    .. indent .. "}"
end

-- The text the REPL prints for a table without __tostring: nested (to 3 levels), sorted keys
-- (the list part first), at most 20 entries a table and 60 lines, cycles marked.
function M.pretty(v)
  local s = render(v, 0, "", {})
  local lines, count = {}, 0
  for line in (s .. "\n"):gmatch("([^\n]*)\n") do
    count = count + 1
    if count <= PRETTY.lines then lines[count] = line end
  end
  if count > PRETTY.lines then
    lines[#lines + 1] = "... (" .. (count - PRETTY.lines) .. " more lines)"
  end
  return table.concat(lines, "\n")
end

---------------------------------------------------------------------------- help and hints

local util = require("rnnlua.util")
local help_doc = require("rnnlua.help")

-- The value at a dotted path ("rl.dist.rank") from _G, without running metamethods.
local function at_path(path)
  local v = _G
  for name in (path .. "."):gmatch("([^.]*)%.") do
    if not name:match("^[%a_][%w_]*$") then return nil end
    v = lookup(v, name)
    if v == nil then return nil end
  end
  return v
end

local function documented_names()
  local names = {}
  for name in pairs(help_doc.by_name) do names[#names + 1] = name end
  return names
end

local function show_entry(e)
  return e[2] .. "\n  " .. e[3]
end

-- help(x): the signature of an rl function (x the function or its name, "rl.tensor" or
-- "tensor"); help() or help(rl): the sections and how to ask. Returns the text (the REPL's
-- global help prints it).
function M.help_text(x)
  local rl = rawget(_G, "rl")
  if x == nil or x == rl then
    local out = {"help(rl.f) or ?rl.f shows the signature of an rl function. Functions by subject:"}
    for _, sec in ipairs(help_doc.sections) do
      local names = {}
      for _, e in ipairs(sec[2]) do names[#names + 1] = e[1]:gsub("^rl%.", "") end
      out[#out + 1] = "  " .. sec[1] .. ": " .. table.concat(names, ", ")
    end
    out[#out + 1] = "The manual: docs/ (docs/repl.md for this REPL)."
    return table.concat(out, "\n")
  end
  local name
  if type(x) == "string" then
    name = x:gsub("^%s+", ""):gsub("%s+$", "")
    if not help_doc.by_name[name] and help_doc.by_name["rl." .. name] then name = "rl." .. name end
  elseif rl then
    name = help_doc.name_of(x, rl)
  end
  local e = name and help_doc.by_name[name]
  if e then return show_entry(e) end
  if type(x) == "string" then
    local names = documented_names()
    if not name:find("^rl%.") then -- "ctc_decod" is compared with "ctc_decode"
      for i, n in ipairs(names) do names[i] = n:gsub("^rl%.", "") end
    end
    local near = util.closest(name, names)
    for i, n in ipairs(near) do near[i] = n:find("^rl%.") and n or "rl." .. n end
    local v = at_path(name)
    if v ~= nil then
      return string.format("%s: %s, not an rl function with a documented signature", name,
        short_tostring(v))
    end
    if #near > 0 then
      return string.format("%s: not found; did you mean %s?", name, table.concat(near, " or "))
    end
    return name .. ": not found (help() lists the rl functions)"
  end
  return string.format("%s: not an rl function with a documented signature (help() lists them)",
    short_tostring(x))
end

function M.help(x)
  io.stdout:write(M.help_text(x), "\n")
  io.stdout:flush()
end

-- The REPL's global `help` (the argument is the name the host asks for).
function M.help_function()
  return M.help
end

-- The names of the methods of the library's objects, and of the objects the user holds in
-- globals (a network's methods come from its class table, reached through the network).
local function method_names()
  local names, seen = {}, {}
  local function add_from(t)
    if type(t) ~= "table" or seen[t] then return end
    seen[t] = true
    each_field(setmetatable({}, {__index = t}), function(k, x)
      if is_callable(x) and not names[k] then names[k] = true end
    end)
  end
  for k, mt in pairs(debug.getregistry()) do
    if type(k) == "string" and k:find("^rnnlua%.") and type(mt) == "table" then
      add_from(rawget(mt, "__methods"))
      add_from(rawget(mt, "__index"))
    end
  end
  for _, v in pairs(_G) do add_from(index_table(v)) end
  local list = {}
  for k in pairs(names) do list[#list + 1] = k end
  return list
end

local function field_names()
  local list, rl = {}, rawget(_G, "rl")
  for name in pairs(help_doc.by_name) do list[#list + 1] = name:match("([%w_]+)$") end
  if type(rl) == "table" then
    for k in pairs(rl) do
      if type(k) == "string" and k:sub(1, 1) ~= "_" then list[#list + 1] = k end
    end
  end
  for k in pairs(_G) do if type(k) == "string" then list[#list + 1] = k end end
  return list
end

-- For an error message that names a missing field, method or global ("attempt to call a nil
-- value (method 'sizee')"): "did you mean ...?" with the nearest names, or nil.
function M.hint(msg)
  msg = tostring(msg)
  local what, name = msg:match("attempt to %a+ a nil value %((%a+) '([%w_]+)'%)")
  if not what then return nil end
  local near = util.closest(name, what == "method" and method_names() or field_names())
  local uniq, out = {}, {}
  for _, n in ipairs(near) do
    if n ~= name and not uniq[n] then uniq[n] = true out[#out + 1] = n end
  end
  if #out == 0 then return nil end
  return string.format("did you mean %s?", table.concat(out, " or "))
end

return M
