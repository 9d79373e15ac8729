-- Small table helpers the library's modules share (one definition each).
--
--   local util = require("rnnlua.util")
--   util.sorted_keys(t)        t's keys (t may be nil: none), ordered by tostring, so tables
--                              that mix strings and numbers sort too (names in error messages)
--   util.copy(t)               a shallow copy of t
--   util.deep_copy(v)          v with every nested table copied (other values shared)
--   util.list_of(v, default)   a description's from as a list: nil -> default (or {}),
--                              a string -> {v}, anything else as it is (the caller checks it)
--   util.strip_internal(msg)   msg without the positions inside the library
--                              ("lua/rnnlua/x.lua:12: ") that an error raised one level up
--                              from a library function called by the library carries

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

-- A user reads "rl.train: epoch 1, step 1: opt:step: ...", not where inside the library the
-- check sits; positions in the user's own files (a recipe, a Lua layer) stay.
function M.strip_internal(msg)
  return (tostring(msg):gsub("lua/rnnlua/[%w_/]+%.lua:%d+: ", ""))
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

return M
