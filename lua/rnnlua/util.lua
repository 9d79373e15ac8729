-- Small table helpers the library's modules share (one definition each).
--
--   local util = require("rnnlua.util")
--   util.sorted_keys(t)        t's keys (t may be nil: none), ordered by tostring, so tables
--                              that mix strings and numbers sort too (names in error messages)
--   util.copy(t)               a shallow copy of t
--   util.deep_copy(v)          v with every nested table copied (other values shared)
--   util.list_of(v, default)   a description's from as a list: nil -> default (or {}),
--                              a string -> {v}, anything else as it is (the caller checks it)
--   util.caller_level()        the level for error() in a library function: 2 (its caller's
--                              line) for a user's script, 0 when rnnlua's own Lua code called it
--   util.same_file(a, b)       whether paths a and b name one existing file (device and inode)
--   util.file_error(msg, path) an error raised while reading the file `path` as "path: what":
--                              without the position in rnnlua's own Lua code or the name of
--                              the rl.h5file method, which tell a user nothing
--   util.check_options(who, opts, known)   raises "who: unknown option 'k' (known: ...)"
--                              for a key of opts not in the set known (a misspelt option
--                              would otherwise be ignored), or when opts is no table
--   util.fail(fmt, ...)        raises string.format(fmt, ...) without a Lua position
--   util.layer_where(name, class)  "layer 'name' (class class)": the one way a message names a
--                              layer (RL_LAYER_WHERE in C); "layer 'name'" while it has no class
--   util.strip_internal(msg)   msg without the positions inside the library
--                              ("lua/rnnlua/x.lua:12: ") that an error raised one level up
--                              from a library function called by the library carries
--   util.made_with(dir, config) whether dir/DONE records the string config: data made once
--   util.mark_made(dir, config) (written last, after the data) is not made again for the same
--                              settings; a run that stops midway leaves no DONE
--   util.distance(a, b)        edit distance, a swapped pair of letters counting as one edit
--   util.closest(word, names)  the names (a list) nearest to word by edit distance, when near
--                              enough to be a misspelling of it (at most a third of its
--                              letters), sorted; {} when none is

local M = {}

function M.sorted_keys(t)
  local keys = {}
  for k in pairs(t or {}) do keys[#keys + 1] = k end
  table.sort(keys, function(a, b) return tostring(a) < tostring(b) end)
  return keys
end

function M.copy(t)
  local c = {}
  for k, v in pairs(t) do c[k] = v end
  return c
end

function M.deep_copy(v)
  if type(v) ~= "table" then return v end
  local c = {}
  for k, x in pairs(v) do c[k] = M.deep_copy(x) end
  return c
end

function M.list_of(v, default)
  if v == nil then return default or {} end
  if type(v) == "string" then return {v} end
  return v
end

function M.caller_level()
  -- 1: this function, 2: the library function, 3: its caller (embedded chunks are named
  -- "@lua/rnnlua/<module>.lua", whose lines tell a user nothing)
  local info = debug.getinfo(3, "S")
  if info and info.source:find("^@lua/rnnlua/") then return 0 end
  return 2
end

function M.same_file(a, b)
  local lfs = require("lfs")
  local x, y = lfs.attributes(a), lfs.attributes(b)
  return x ~= nil and y ~= nil and x.dev == y.dev and x.ino == y.ino
end

function M.check_options(who, opts, known)
  if type(opts) ~= "table" then
    error(string.format("%s: opts must be a table, got %s", who, type(opts)), 0)
  end
  for _, k in ipairs(M.sorted_keys(opts)) do
    if not known[k] then
      error(string.format("%s: unknown option '%s' (known: %s)", who, tostring(k),
        table.concat(M.sorted_keys(known), ", ")), 0)
    end
  end
end

-- Raises string.format(fmt, ...) without a position: the message names what and where itself
-- (rnnlua's errors read "<where>: <what>"; a Lua position inside rnnlua tells a user nothing).
function M.fail(fmt, ...)
  error(string.format(fmt, ...), 0)
end

function M.layer_where(name, class)
  if type(class) ~= "string" then return string.format("layer '%s'", tostring(name)) end
  return string.format("layer '%s' (class %s)", tostring(name), class)
end

-- A user reads "rl.train: epoch 1, step 1: opt:step: ...", not where inside the library the
-- check sits; positions in the user's own files (a recipe, a Lua layer) stay.
function M.strip_internal(msg)
  return (tostring(msg):gsub("lua/rnnlua/[%w_/]+%.lua:%d+: ", ""))
end

function M.file_error(msg, path)
  msg = M.strip_internal(msg):gsub("^[^:\n]*%.lua:%d+: ", ""):gsub("^r?l?%.?h5file[:%w_]*: ", "")
  if msg:sub(1, #path + 2) == path .. ": " then return msg end
  return path:gsub("%z", "\\0") .. ": " .. msg -- (a NUL, refused by rl.h5file, shown)
end

-- Creates path and its missing parents (mkdir -p); true, or nil and a message naming the
-- directory that could not be made.
function M.mkdir_p(path)
  local lfs = require("lfs")
  local cur = path:sub(1, 1) == "/" and "/" or ""
  for part in path:gmatch("[^/]+") do
    cur = cur .. part
    if lfs.attributes(cur, "mode") == nil then
      local ok, err = lfs.mkdir(cur)
      if not ok and lfs.attributes(cur, "mode") ~= "directory" then
        return nil, string.format("cannot create directory %s: %s", cur, tostring(err))
      end
    end
    cur = cur .. "/"
  end
  return true
end

function M.made_with(dir, config)
  local f = io.open(dir .. "/DONE", "r")
  if not f then return false end
  local have = f:read("a")
  f:close()
  return have == config .. "\n"
end

function M.mark_made(dir, config)
  local f = assert(io.open(dir .. "/DONE", "w"))
  f:write(config, "\n")
  f:close()
end

-- Edit distance of two strings (bytes): Levenshtein's with adjacent transpositions (a swapped
-- pair of letters is one edit), the measure of every "did you mean".
function M.distance(a, b)
  local prev2, prev = nil, {}
  for j = 0, #b do prev[j] = j end
  for i = 1, #a do
    local cur = {[0] = i}
    for j = 1, #b do
      local cost = a:byte(i) == b:byte(j) and 0 or 1
      local d = math.min(prev[j] + 1, cur[j - 1] + 1, prev[j - 1] + cost)
      if prev2 and i > 1 and j > 1 and a:byte(i) == b:byte(j - 1)
          and a:byte(i - 1) == b:byte(j) then
        d = math.min(d, prev2[j - 2] + 1)
      end
      cur[j] = d
    end
    prev2, prev = prev, cur
  end
  return prev[#b]
end

function M.closest(word, names)
  local best, out = math.max(1, #word // 3), {}
  for _, n in ipairs(names) do
    local d = M.distance(word:lower(), n:lower())
    if d < best then best, out = d, {n} elseif d == best then out[#out + 1] = n end
  end
  table.sort(out)
  return out
end

return M
