-- REPL helpers of the rnnlua host (module "rnnlua.repl"): tab-completion candidates.
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
      if k:sub(1, #part) == part and (sep == "." or is_callable(x)) then
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

return M
