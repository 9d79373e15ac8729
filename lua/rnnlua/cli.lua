-- The command-line convention of every recipe, subcommand and rl.train: RETURNN's
-- `++key value` (docs/tools.md). One parser, so that the same mistake gets the same message
-- everywhere.
--
--   local cli = require("rnnlua.cli")
--   local opts, rest = cli.parse(spec, argv)
--
-- spec = {
--   usage = "rnnlua recipes/x.lua [++key value ...]",  -- the first line of --help
--   about = "what it does, a few lines",                 -- (optional) printed under it
--   options = {{"num_epochs", "integer", 10, "epochs to train"}, ...},
--     -- name, type ("string" | "integer" | "number" | "boolean" | "value": a boolean, number or
--     -- string as written), default (nil: unset), one line of help
--   required = {"model", ...},          -- options that must be given
--   args = {name = "FILE.h5", min = 1, max = 1},  -- positional arguments (default: none)
--   dashes = true,    -- `--key value` is the same option as `++key value` (the tools, whose
--                     -- pinned spelling is --seq, --heatmap: a dash inside a key is `_`)
--   aliases = {["-o"] = "out"},
--   train = true,     -- a `++key value` that is no option here but a key of rl.train's config
--                     -- (nested with dots: ++train.num_seqs 100) is handed on in `rest`
-- }
-- argv: a list of strings (the global `arg` works: only its positive indices are read).
-- Returns opts (name -> value, defaults filled in; opts.args the positional arguments) and rest
-- (the `++key value` strings for rl.train). `--help` or `-h` prints the help and ends the
-- process with status 0 (spec.on_help(text) instead, when given).
--
-- Errors (raised as strings "WHERE: WHAT", WHERE an option `++key` or the argument): an unknown
-- option names the closest known one (edit distance), an option given twice with different
-- values, a value of the wrong type, a missing value, a required option left out, a `--key`
-- where only `++key` is read (naming `++key`), a stray `key=value` or positional argument.
-- A boolean option may stand alone (`++smoke`): it is then true.
--
-- cli.overrides(argv, is_key, defaults) parses argv as rl.train overrides only: a list of
-- {key = "train.num_seqs", path = {"train", "num_seqs"}, value =}; values are read as booleans,
-- numbers or strings ("nil" unsets a key); a key whose default (defaults[first part]) is a
-- number takes only a number.
local M = {}

M.distance = require("rnnlua.util").distance

-- The candidate closest to name (ties: the first in sorted order), or nil when none is.
function M.closest(name, candidates)
  local best, bestd
  local sorted = {}
  for _, c in ipairs(candidates) do sorted[#sorted + 1] = c end
  table.sort(sorted)
  for _, c in ipairs(sorted) do
    local d = M.distance(name, c)
    if not bestd or d < bestd then best, bestd = c, d end
  end
  return best
end

local fail = require("rnnlua.util").fail

-- A value as rl.train's overrides read it: true, false, nil ("nil"), a number or the string.
local function loose_value(s)
  if s == "true" then return true end
  if s == "false" then return false end
  if s == "nil" then return nil end
  return math.tointeger(tonumber(s)) or tonumber(s) or s
end

local TYPE_WORDS = {integer = "an integer", number = "a number", boolean = "true or false",
                    string = "a string", value = "a value"}

local function typed(name, kind, s, shown)
  if kind == "string" then return s end
  if kind == "value" then return loose_value(s) end
  if kind == "boolean" then
    if s == "true" then return true end
    if s == "false" then return false end
  elseif kind == "integer" then
    local v = math.tointeger(tonumber(s))
    if v then return v end
  elseif kind == "number" then
    local v = tonumber(s)
    if v then return v end
  else
    error("rnnlua.cli: option " .. name .. " has an unknown type '" .. tostring(kind) .. "'")
  end
  fail("%s: expects %s, got '%s'", shown or "++" .. name, TYPE_WORDS[kind], s)
end

-- "did you mean ++x?" for name among the known names (a list).
local function suggestion(name, known)
  local c = M.closest(name, known)
  return c and string.format(" (did you mean ++%s?)", c) or ""
end

local function train_keys()
  return require("rnnlua.engine").known_keys()
end

local function is_train_key(k)
  return require("rnnlua.engine").is_key(k)
end

-- The dotted key of ++key as a path: ++train.files.1 sets the list entry files[1].
local function key_path(key)
  if key == "" then fail("'++' lacks a key name") end
  if key:find("^%.") or key:find("%.$") or key:find("%.%.") then
    fail("++%s: a key part is empty", key)
  end
  local path = {}
  for part in key:gmatch("[^.]+") do
    path[#path + 1] = part:match("^%d+$") and math.tointeger(tonumber(part)) or part
  end
  return path
end

-- The help line of option o ({name, type, default, help}), its head padded to width w.
local function option_line(o, w)
  local word = ({integer = "N", number = "X", boolean = "[true|false]", string = "S",
                 value = "V"})[o[2]]
  local head = "++" .. o[1] .. " " .. word
  local d = o[3] ~= nil and string.format(" [%s]", tostring(o[3])) or ""
  return string.format("  %-" .. (w or #head) .. "s  %s%s", head, o[4] or "", d), head
end

local function help_text(spec)
  local lines = {"usage: " .. spec.usage}
  if spec.about then lines[#lines + 1] = spec.about end
  local opts = spec.options or {}
  if #opts > 0 then
    lines[#lines + 1] = ""
    lines[#lines + 1] = "Options (++key value; a boolean option alone means true; defaults in "
      .. "brackets):"
    local w = 0
    for _, o in ipairs(opts) do w = math.max(w, #select(2, option_line(o))) end
    for _, o in ipairs(opts) do lines[#lines + 1] = (option_line(o, w)) end
  end
  if spec.train then
    lines[#lines + 1] = ""
    lines[#lines + 1] = "Any key of rl.train's config too, nested with dots (++learning_rate 0.01,"
    lines[#lines + 1] = "++train.num_seqs 100): " .. table.concat(train_keys(), ", ")
    lines[#lines + 1] = "--help KEY describes one of them."
  end
  return table.concat(lines, "\n") .. "\n"
end
M.help_text = help_text

-- `--help KEY`: the help of one option of spec (decl: name -> option) or, with spec.train, of
-- one key of rl.train's config (rnnlua.train_keys); an unknown name is an error naming the
-- closest known one (all: every name).
local function key_help(spec, decl, key, all)
  if decl[key] then return option_line(decl[key]) .. "\n" end
  if spec.train then
    local text = require("rnnlua.train_keys").describe(key)
    if text then return text end
  end
  fail("--help %s: no option or config key of that name%s", key, suggestion(key, all))
end

-- Records ++key = raw: the same key twice must have the same value.
local function note(seen, key, raw)
  if seen[key] ~= nil and seen[key] ~= raw then
    fail("++%s: given twice, as '%s' and as '%s'", key, seen[key], raw)
  end
  local again = seen[key] ~= nil
  seen[key] = raw
  return again
end

function M.parse(spec, argv)
  argv = argv or {}
  local decl, names = {}, {}
  for _, o in ipairs(spec.options or {}) do
    decl[o[1]] = o
    names[#names + 1] = o[1]
  end
  local function all_names()
    if not spec.train then return names end
    local l = table.move(names, 1, #names, 1, {})
    return table.move(train_keys(), 1, #train_keys(), #l + 1, l)
  end
  local opts, rest, args, seen = {}, {}, {}, {}
  local n = #argv
  for i = 1, n do
    if argv[i] == "--help" or argv[i] == "-h" then
      local w = argv[i + 1]
      local key = w and (w:match("^%+%+([%a_][%w_]*)$") or w:match("^([%a_][%w_]*)$"))
      local text = key and key_help(spec, decl, key, all_names()) or help_text(spec)
      if spec.on_help then return spec.on_help(text) end
      io.stdout:write(text)
      io.stdout:flush()
      os.exit(0, true)
    end
  end
  local i = 1
  while i <= n do
    local a = argv[i]
    local key
    if a:sub(1, 2) == "++" then
      key = a:sub(3)
    elseif spec.aliases and spec.aliases[a] then
      key = spec.aliases[a]
    elseif a:sub(1, 2) == "--" and #a > 2 then
      local k = a:sub(3):gsub("-", "_")
      if spec.dashes then
        key = k
      else
        local known = decl[k] or (spec.train and is_train_key(k:match("^[^.]*")))
        fail("%s: options are written ++key value%s", a,
          known and string.format(" (++%s)", k) or suggestion(k, all_names()))
      end
    elseif a:match("^[%a_][%w_.]*=") and not (spec.args and a:find("/")) then
      local k = a:match("^([^=]*)")
      fail("%s: options are written ++key value (++%s %s)", a, k, a:sub(#k + 2))
    else
      if not spec.args or #args >= (spec.args.max or math.huge) then
        fail("%s: unexpected argument (options are written ++key value)", a)
      end
      args[#args + 1] = a
      i = i + 1
      goto continue
    end
    do
      local head = key:match("^[^.]*")
      local o = decl[key]
      local value = argv[i + 1]
      if o then
        if o[2] == "boolean" and (value == nil or value:sub(1, 2) == "++" or
            (spec.dashes and value:sub(1, 1) == "-")) then
          value, i = "true", i - 1
        elseif value == nil then
          fail("%s: lacks a value", a) -- as it was written: --seq, -o, ++seq
        end
        if not note(seen, key, value) then opts[key] = typed(key, o[2], value, a) end
      elseif spec.train and is_train_key(head) then
        key_path(key)
        if value == nil then fail("++%s: lacks a value", key) end
        if not note(seen, key, value) then
          rest[#rest + 1] = "++" .. key
          rest[#rest + 1] = value
        end
      else
        if key == "" then fail("'++' lacks a key name") end
        fail("%s: unknown option%s", a, suggestion(head, all_names()))
      end
      i = i + 2
    end
    ::continue::
  end
  for _, o in ipairs(spec.options or {}) do
    if opts[o[1]] == nil then opts[o[1]] = o[3] end
  end
  for _, k in ipairs(spec.required or {}) do
    if opts[k] == nil then fail("++%s: missing", k) end
  end
  if spec.args and #args < (spec.args.min or 0) then
    fail("expects %s", spec.args.name or "an argument")
  end
  opts.args = args
  return opts, rest
end

function M.overrides(argv, is_key, defaults)
  local list, seen = {}, {}
  local i = 1
  while argv[i] ~= nil do
    local a = argv[i]
    if type(a) ~= "string" then fail("argument %d is a %s, not a string", i, type(a)) end
    if a:sub(1, 2) ~= "++" then
      local k = a:match("^%-%-([%w_.]+)$") or a:match("^([%a_][%w_.]*)=")
      if k and is_key(k:match("^[^.]*")) then
        fail("%s: options are written ++key value (++%s)", a, k)
      end
      fail("%s: unexpected argument (options are written ++key value)", a)
    end
    local key = a:sub(3)
    local path = key_path(key)
    if not is_key(path[1]) then
      local known = {}
      for k in pairs(defaults) do known[#known + 1] = k end
      fail("++%s: unknown config key '%s'%s", key, path[1], suggestion(tostring(path[1]), known))
    end
    local raw = argv[i + 1]
    if raw == nil then fail("++%s: lacks a value", key) end
    if not note(seen, key, raw) then
      local value = loose_value(raw)
      local d = #path == 1 and defaults[path[1]]
      if type(d) == "number" and type(value) ~= "number" then
        fail("++%s: expects %s, got '%s'", key,
          math.type(d) == "integer" and "an integer" or "a number", raw)
      end
      list[#list + 1] = {key = key, path = path, value = value}
    end
    i = i + 2
  end
  return list
end

return M
