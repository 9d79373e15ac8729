-- Checkpoints: one HDF5 file per save, readable with h5dump or h5py.
--
--   rl.save_checkpoint(path, {net =, optimizer =, lr_control =, epoch =, step =
--                             [, rng_state = (default: rl.get_rng_state())]
--                             [, pretrain = (rnnlua.pretrain's record of the epoch)]
--                             [, data_norm = {mean = (F), std = (F)}]
--                             [, engine = (rl.train's own state: rnnlua.practice)]})
--   rl.load_checkpoint(path) -> {path =, description =, extern_data =, dtype =, params = flat
--       tensor, param_tensors = {["layer/name"] = tensor}, param_order = {"layer/name", ...},
--       optimizer_state =, lr_control_state =, pretrain_state =, engine_state =,
--       rng_state = {seed =, offset =}, epoch =, step =, data_norm = {mean =, std =} or nil}
--   data_norm: the global normalisation (x - mean) / std the training set applied to input
--       "data" (an audio dataset with normalize = "global"): part of the model, so rl.forward
--       and `rnnlua serve` apply it to raw features (rnnlua.forward). Checkpoints without it
--       (all written before it existed) load with data_norm = nil.
--   rl.checkpoint.load_params(ck, net [, {partial = true}])  copies the saved values into the
--       net's parameters by layer and name (partial: the net may hold a subset of them)
--   rl.checkpoint.save_model(path, {description =, extern_data =, dtype =, params = {{name =
--       "layer/name", value = tensor}, ...}} [, {epoch =, step =, data_norm =, ...}])  a
--       checkpoint of parameters without a network object (rnnlua average writes with it)
--   rl.checkpoint.serialize(value, what) / rl.checkpoint.deserialize(text, what)
--
-- Layout:
--   /                  attrs format = "rnnlua-checkpoint", version (2; strings fixed-length), epoch, step, dtype,
--                      num_params, description and extern_data (Lua literals, see below)
--   /params/<layer>/<name>   each parameter with its shape; attr order on /params (a Lua
--                      list of "layer/name" in the flat buffer's order)
--   /optimizer, /lr_control, /pretrain, /engine (rl.train's own: rnnlua.practice)  their
--                      state tables: tensors as datasets, numbers and strings as attributes
--                      (integers int64, floats double) for h5dump and h5py, and attr _values, a Lua literal of every non-tensor entry, which is what
--                      load reads: it keeps integers and floats apart and takes booleans
--                      and tables, and HDF5 attributes cannot be listed through core/h5io
--   /data_norm         mean and std (F) float32 datasets (with the _values/_tensors attrs of a
--                      state table), only when the training set normalised its input globally
--   /rng               attrs seed, offset (int64) and state (the same as a Lua literal, read
--                      back exactly: rl.h5file reads numeric attributes as doubles)
-- The file is read and written with rl.h5file (lua/l_dataset.c). Tensors on a device (a
-- network moved with net:to, its optimizer's state) are copied to the host to be written, one
-- copy each; load gives CPU tensors, and load_params copies them into the network's
-- parameters on whatever device the network is.
-- Descriptions are written as Lua literals with sorted keys, so the same table always gives
-- the same text, and read back by a parser of literals that runs nothing (see parse_literal):
-- a function in a description cannot be saved and is an error naming its key.
-- The file is written under a temporary name and renamed when complete (core/h5io), so an
-- error or a crash while saving leaves the previous file at that path as it was.
local M = {}
local rl -- the module table, set by install
local util = require("rnnlua.util")

-- Version 2 stores every string attribute as a fixed-length string; version 1 (variable-length
-- strings) still loads, its strings read through core/h5io's isolated reader.
local FORMAT, VERSION = "rnnlua-checkpoint", 2

---------------------------------------------------------------------------- Lua literals

local KEYWORDS = {}
for w in ("and break do else elseif end false for function goto if in local nil not or "
  .. "repeat return then true until while"):gmatch("%a+") do
  KEYWORDS[w] = true
end

local TYPE_ORDER = {number = 1, string = 2, boolean = 3}

local function key_less(a, b)
  local ta, tb = type(a), type(b)
  if ta ~= tb then return (TYPE_ORDER[ta] or 9) < (TYPE_ORDER[tb] or 9) end
  if ta == "boolean" then return (a and 1 or 0) < (b and 1 or 0) end
  return a < b
end

local function number_literal(v)
  if v ~= v then return "0/0" end
  if v == math.huge then return "1/0" end
  if v == -math.huge then return "-1/0" end
  if math.type(v) == "integer" then
    -- "-9223372036854775808" would read back as a float
    if v == math.mininteger then return string.format("(%d - 1)", v + 1) end
    return string.format("%d", v)
  end
  local s = string.format("%.17g", v)
  if not s:find("[.eEni]") then s = s .. ".0" end -- stays a float when read back
  return s
end

local function emit(v, path, out, seen)
  local tv = type(v)
  if tv == "string" then
    out[#out + 1] = string.format("%q", v)
  elseif tv == "number" then
    out[#out + 1] = number_literal(v)
  elseif tv == "boolean" then
    out[#out + 1] = tostring(v)
  elseif tv == "table" then
    if rl.is_tensor(v) then
      error(string.format("%s: a tensor cannot be written as a Lua literal", path), 0)
    end
    if seen[v] then error(string.format("%s: the table contains itself", path), 0) end
    seen[v] = true
    local keys = {}
    for k in pairs(v) do
      if TYPE_ORDER[type(k)] == nil or (type(k) == "number" and (k ~= k or k == math.huge or
          k == -math.huge)) then
        error(string.format("%s: a key of type %s cannot be written", path, type(k)), 0)
      end
      keys[#keys + 1] = k
    end
    table.sort(keys, key_less)
    local n = #v
    out[#out + 1] = "{"
    for i, k in ipairs(keys) do
      if i > 1 then out[#out + 1] = ", " end
      local sub
      if math.type(k) == "integer" and k >= 1 and k <= n then
        sub = string.format("%s[%d]", path, k)
      elseif type(k) == "string" and k:match("^[%a_][%w_]*$") and not KEYWORDS[k] then
        out[#out + 1] = k .. " = "
        sub = path .. "." .. k
      else
        out[#out + 1] = "[" .. (type(k) == "string" and string.format("%q", k)
          or type(k) == "number" and number_literal(k) or tostring(k)) .. "] = "
        sub = string.format("%s[%s]", path, tostring(k))
      end
      emit(v[k], sub, out, seen)
    end
    out[#out + 1] = "}"
    seen[v] = nil
  else
    error(string.format("%s: a %s cannot be saved (only tables, strings, numbers and booleans)",
      path, tv), 0)
  end
end

-- The value as a Lua literal; `what` names it in errors ("network" -> "network.fw.fn: ...").
function M.serialize(v, what)
  local out = {}
  emit(v, what or "value", out, {})
  return table.concat(out)
end

-- The reader of those literals is a parser of data only: it never runs anything from the file
-- (a crafted checkpoint must not execute code or loop forever on load). It takes what
-- serialize writes: tables ({v, ...}, {name = v}, {[k] = v}), strings in double or single
-- quotes with Lua's escapes, decimal numbers, 0/0, 1/0, -1/0, (N - 1), true and false.
local MAX_DEPTH = 200
local SPECIAL_NUMBERS = {["0/0"] = 0 / 0, ["1/0"] = math.huge, ["-1/0"] = -math.huge}
local ESCAPES = {a = "\a", b = "\b", f = "\f", n = "\n", r = "\r", t = "\t", v = "\v",
                 ["\\"] = "\\", ['"'] = '"', ["'"] = "'", ["\n"] = "\n"}

local function parse_literal(text, what)
  local pos = 1
  local function fail(msg)
    if pos > #text and msg ~= "unexpected end" then msg = "unexpected end: " .. msg end
    error(string.format("%s: not a valid literal at byte %d: %s", what, pos, msg), 0)
  end
  local function skip()
    pos = text:find("[^ \t\r\n]", pos) or #text + 1
  end
  local function parse_string(quote)
    local parts, i = {}, pos + 1
    while true do
      local j = text:find("[\\" .. quote .. "\n]", i)
      if not j then pos = #text + 1; fail("unfinished string") end
      parts[#parts + 1] = text:sub(i, j - 1)
      local c = text:sub(j, j)
      if c == quote then pos = j + 1; return table.concat(parts) end
      if c == "\n" then pos = j; fail("unfinished string") end
      local e = text:sub(j + 1, j + 1)
      local digits = text:match("^%d%d?%d?", j + 1)
      if digits then
        local code = tonumber(digits)
        if code > 255 then pos = j; fail("escape \\" .. digits .. " is not a byte") end
        parts[#parts + 1] = string.char(code)
        i = j + 1 + #digits
      elseif ESCAPES[e] then
        parts[#parts + 1] = ESCAPES[e]
        i = j + 2
      else
        pos = j
        fail("unknown escape in a string")
      end
    end
  end
  local parse_value
  local function parse_table(depth)
    if depth > MAX_DEPTH then fail("tables nested deeper than " .. MAX_DEPTH) end
    pos = pos + 1
    local t, list = {}, {}
    while true do
      skip()
      local c = text:sub(pos, pos)
      if c == "}" then pos = pos + 1; break end
      local key, has_key
      if c == "[" then
        pos = pos + 1
        skip()
        local at = pos
        key = parse_value(depth + 1)
        if type(key) == "table" or key ~= key then pos = at; fail("a table key must be a "
          .. "string, a number (not NaN) or a boolean") end
        skip()
        if text:sub(pos, pos) ~= "]" then fail("expected ']'") end
        pos = pos + 1
        has_key = true
      else
        local name = text:match("^[%a_][%w_]*", pos)
        local after = name and text:find("^[ \t\r\n]*=", pos + #name)
        if name and after and name ~= "true" and name ~= "false" then
          key, has_key = name, true
          pos = pos + #name
        end
      end
      if has_key then
        skip()
        if text:sub(pos, pos) ~= "=" then fail("expected '='") end
        pos = pos + 1
        skip()
        if math.type(key) == "float" and key == math.floor(key) and key > -2^63 and
            key < 2^63 then
          key = math.tointeger(key)
        end
        if t[key] ~= nil then fail("key " .. tostring(key) .. " appears twice") end
        t[key] = parse_value(depth + 1)
      else
        list[#list + 1] = parse_value(depth + 1)
      end
      skip()
      c = text:sub(pos, pos)
      if c == "," or c == ";" then
        pos = pos + 1
      elseif c ~= "}" then
        fail("expected ',' or '}'")
      end
    end
    for i, v in ipairs(list) do
      if t[i] ~= nil then fail("key " .. i .. " appears twice") end
      t[i] = v
    end
    return t
  end
  function parse_value(depth)
    skip()
    local c = text:sub(pos, pos)
    if c == "{" then return parse_table(depth) end
    if c == '"' or c == "'" then return parse_string(c) end
    for lit, v in pairs(SPECIAL_NUMBERS) do
      if text:sub(pos, pos + #lit - 1) == lit and not text:find("^[%w_.]", pos + #lit) then
        pos = pos + #lit
        return v
      end
    end
    local word = text:match("^[%a_][%w_]*", pos)
    if word == "true" or word == "false" then
      pos = pos + #word
      return word == "true"
    end
    local n = text:match("^%(%s*%-9223372036854775807%s*%-%s*1%s*%)", pos)
    if n then
      pos = pos + #n
      return math.mininteger
    end
    local num = text:match("^%-?%d+%.?%d*[eE][%+%-]?%d+", pos) or text:match("^%-?%d+%.?%d*", pos)
    if num and not text:find("^[%w_.]", pos + #num) then
      pos = pos + #num
      return tonumber(num)
    end
    fail(word and ("'" .. word .. "' is not a value (only data: tables, strings, numbers, "
      .. "booleans)") or c == "" and "unexpected end" or ("unexpected '" .. c .. "'"))
  end
  if type(text) ~= "string" then
    error(string.format("%s: expected a string, got %s", what, type(text)), 0)
  end
  local v = parse_value(0)
  skip()
  if pos <= #text then fail("unexpected text after the value") end
  return v
end

function M.deserialize(text, what)
  return parse_literal(text, what or "literal")
end

---------------------------------------------------------------------------- state tables

local function on_host(t)
  return t:device() == "cpu" and t or t:cpu()
end

local function write_state(f, group, state)
  if type(state) ~= "table" then
    error(string.format("%s state must be a table, got %s", group, type(state)), 0)
  end
  local values, tensors = {}, {}
  for k, v in pairs(state) do
    if type(k) ~= "string" or k == "" or k:find("/", 1, true) or k:sub(1, 1) == "_" then
      error(string.format("%s state: key %s cannot be saved (a string without '/' or a "
        .. "leading '_')", group, tostring(k)), 0)
    end
    if rl.is_tensor(v) then
      f:write(group .. "/" .. k, on_host(v))
      tensors[#tensors + 1] = k
    else
      values[k] = v
      if type(v) == "number" or type(v) == "string" then f:set_attr(group, k, v) end
    end
  end
  table.sort(tensors)
  f:set_attr(group, "_values", M.serialize(values, group))
  f:set_attr(group, "_tensors", M.serialize(tensors, group))
end

-- A literal attribute that must decode to a table (of tables, with the_list: a list of strings);
-- a tampered file gets an error naming the attribute instead of a failure later on.
local function table_attr(f, obj, name, what, kind)
  local v = M.deserialize(f:attr_string(obj, name), what)
  if type(v) ~= "table" then
    error(string.format("%s is a %s, expected a table", what, type(v)), 0)
  end
  for k, x in pairs(v) do
    if kind == "strings" and (math.type(k) ~= "integer" or k < 1 or k > #v or
        type(x) ~= "string") then
      error(string.format("%s must be a list of strings, entry %s is a %s", what, tostring(k),
        type(x)), 0)
    elseif kind == "tables" and (type(k) ~= "string" or type(x) ~= "table") then
      error(string.format("%s: entry %s must be a table under a string key, got a %s", what,
        tostring(k), type(x)), 0)
    end
  end
  return v
end

local function read_state(f, group)
  local state = table_attr(f, group, "_values", group .. " _values")
  for _, k in ipairs(table_attr(f, group, "_tensors", group .. " _tensors", "strings")) do
    state[k] = f:read(group .. "/" .. k)
  end
  return state
end

---------------------------------------------------------------------------- save and load

local function check_int(v, what)
  if math.type(v) ~= "integer" or v < 0 then
    error(string.format("rl.save_checkpoint: %s must be an integer >= 0, got %s", what,
      tostring(v)), 3)
  end
end

-- norm = {mean = (F), std = (F)} for input "data" of extern_data, as float32 CPU tensors;
-- anything else is an error naming `what`.
local function check_data_norm(norm, extern_data, what)
  if type(norm) ~= "table" or not rl.is_tensor(norm.mean) or not rl.is_tensor(norm.std) then
    error(string.format("%s must be {mean = (F) tensor, std = (F) tensor}", what), 0)
  end
  local e = type(extern_data) == "table" and extern_data.data
  local dim = type(e) == "table" and not e.sparse and e.dim
  if not dim then
    error(string.format("%s needs a dense input \"data\" in extern_data", what), 0)
  end
  for _, k in ipairs({"mean", "std"}) do
    local t = norm[k]
    if t:dim() ~= 1 or t:numel() ~= dim or t:dtype() == "int32" then
      error(string.format("%s: %s must be a (%d) float tensor (the input's dim), got %s %s", what,
        k, dim, t:dtype(), "(" .. table.concat(t:size(), ", ") .. ")"), 0)
    end
  end
  return M.norm_values(norm.mean, norm.std, what)
end

-- The statistics (x - mean) / std as float32 contiguous CPU tensors {mean =, std =}, checked as
-- they are applied: a NaN or Inf mean, an Inf std or one whose reciprocal is Inf (below
-- 2^-128) would make every input NaN or Inf, or zero. Shared with the audio dataset's
-- norm_stats.
function M.norm_values(mean, std, what)
  mean = on_host(mean):float():contiguous()
  std = on_host(std):float():contiguous()
  local nan, inf = rl.dataset_scan(mean)
  if nan or inf then
    error(string.format("%s: mean must be finite everywhere, got %s at %d", what,
      nan and "NaN" or "Inf", nan or inf), 0)
  end
  local snan, sinf = rl.dataset_scan(std)
  local _, rinf = rl.dataset_scan(std:reciprocal())
  if snan or sinf or rinf or (std:numel() > 0 and std:min() <= 0) then
    error(string.format("%s: std must be positive everywhere (and finite, above 2^-128)", what), 0)
  end
  return {mean = mean, std = std}
end

-- Writes a checkpoint of model m = {description =, extern_data =, dtype =, params = {{name =
-- "layer/name", value = tensor}, ...} (the flat buffer's order)} with the states of s (those of
-- rl.save_checkpoint but net); errors are raised at `level`.
local function write(path, m, s, level)
  local rng = s.rng_state or rl.get_rng_state()
  local okf, f = pcall(rl.h5file, path, "w")
  if not okf then
    error("rl.save_checkpoint: " .. util.file_error(f, path), level)
  end
  local ok, err = pcall(function()
    local total = 0
    for _, p in ipairs(m.params) do total = total + p.value:numel() end
    f:set_attr("/", "format", FORMAT)
    f:set_attr("/", "version", VERSION)
    f:set_attr("/", "epoch", s.epoch or 0)
    f:set_attr("/", "step", s.step or 0)
    f:set_attr("/", "dtype", m.dtype or "float32")
    f:set_attr("/", "num_params", total)
    f:set_attr("/", "description", M.serialize(m.description, "network"))
    f:set_attr("/", "extern_data", M.serialize(m.extern_data, "extern_data"))
    local order = {}
    for _, p in ipairs(m.params) do
      local layer = p.name:match("^(.*)/[^/]*$")
      if not layer or layer:find("/", 1, true) then
        local d = type(m.description) == "table" and m.description[layer or p.name]
        error(string.format("%s: a name with '/' cannot be saved",
          util.layer_where(layer or p.name, type(d) == "table" and d.class)), 0)
      end
      f:write("params/" .. p.name, on_host(p.value))
      order[#order + 1] = p.name
    end
    f:set_attr("params", "order", M.serialize(order, "params"))
    if s.optimizer ~= nil then write_state(f, "optimizer", s.optimizer:state()) end
    if s.lr_control ~= nil then write_state(f, "lr_control", s.lr_control:state()) end
    if s.pretrain ~= nil then write_state(f, "pretrain", s.pretrain) end
    if s.engine ~= nil then write_state(f, "engine", s.engine) end
    if s.data_norm ~= nil then
      write_state(f, "data_norm", check_data_norm(s.data_norm, m.extern_data, "data_norm"))
    end
    f:set_attr("rng", "seed", rng.seed)
    f:set_attr("rng", "offset", rng.offset)
    f:set_attr("rng", "state", M.serialize({seed = rng.seed, offset = rng.offset}, "rng"))
    f:commit()
  end)
  if not ok then
    f:close()
    error("rl.save_checkpoint: " .. util.file_error(err, path), level)
  end
  return path
end

function M.save(path, s)
  if type(path) ~= "string" then
    error("rl.save_checkpoint: the path must be a string, got " .. type(path), 2)
  end
  if type(s) ~= "table" or type(s.net) ~= "table" or type(s.net.param_list) ~= "function" then
    error("rl.save_checkpoint: expects {net = network, optimizer =, lr_control =, epoch =, step =}",
      2)
  end
  check_int(s.epoch or 0, "epoch")
  check_int(s.step or 0, "step")
  local net = s.net
  local params = {}
  for _, p in ipairs(net:param_list()) do
    if p.layer:find("/", 1, true) then
      local d = type(net.description) == "table" and net.description[p.layer]
      error(string.format("rl.save_checkpoint: %s: a name with '/' cannot be saved",
        util.layer_where(p.layer, type(d) == "table" and d.class)), util.caller_level())
    end
    params[#params + 1] = {name = p.layer .. "/" .. p.name, value = p.value}
  end
  return write(path, {description = net.description, extern_data = net.extern_data,
                      dtype = net.dtype, params = params}, s, util.caller_level())
end

-- A checkpoint of parameters without a network object (rnnlua average): m as for write, from a
-- loaded checkpoint's description, extern_data and dtype.
function M.save_model(path, m, s)
  s = s or {}
  check_int(s.epoch or 0, "epoch")
  check_int(s.step or 0, "step")
  return write(path, m, s, util.caller_level())
end

-- version, epoch, step and num_params: integers >= 0 (a negative epoch would resume training
-- before epoch 1)
local function int_attr(f, obj, name)
  local v = f:attr_number(obj, name)
  if math.type(v) ~= "integer" or v < 0 then
    error(string.format("attribute %s of %s is %s, not an integer >= 0", name, obj, tostring(v)),
      0)
  end
  return v
end

function M.load(path)
  if type(path) ~= "string" then
    error("rl.load_checkpoint: the path must be a string, got " .. type(path), 2)
  end
  local okopen, f = pcall(rl.h5file, path, "r")
  if not okopen then
    error(string.format("rl.load_checkpoint: cannot read checkpoint %s: %s", path,
      (tostring(f):gsub("^rl%.h5file: ", ""))), util.caller_level())
  end
  local ok, ck = pcall(function()
    -- the version (a number) first: from version 2 on a variable-length string can only be
    -- a crafted file, and none is read
    local has_version, version = pcall(int_attr, f, "/", "version")
    if has_version and version >= 2 then f:refuse_vlen() end
    local has_fmt, fmt = pcall(f.attr_string, f, "/", "format")
    if not has_fmt or fmt ~= FORMAT then
      -- a format attribute that is there but unreadable (a crafted string) says why
      local why = not has_fmt and not tostring(fmt):find("no such attribute", 1, true)
      error("not an rnnlua checkpoint (no format = \"" .. FORMAT .. "\" attribute)"
        .. (why and ": " .. tostring(fmt) or ""), 0)
    end
    if not has_version then error(version, 0) end
    if version > VERSION then
      error(string.format("checkpoint version %d is newer than this rnnlua reads (%d)", version,
        VERSION), 0)
    end
    local ck = {
      path = path, epoch = int_attr(f, "/", "epoch"), step = int_attr(f, "/", "step"),
      dtype = f:attr_string("/", "dtype"),
      description = table_attr(f, "/", "description", "description", "tables"),
      extern_data = table_attr(f, "/", "extern_data", "extern_data", "tables"),
      rng_state = table_attr(f, "rng", "state", "rng state"),
      param_tensors = {},
    }
    if math.type(ck.rng_state.seed) ~= "integer" or math.type(ck.rng_state.offset) ~= "integer" then
      error("rng state must hold integers seed and offset", 0)
    end
    if ck.dtype ~= "float32" and ck.dtype ~= "float64" then
      error(string.format("attribute dtype must be \"float32\" or \"float64\", got %q", ck.dtype),
        0)
    end
    ck.param_order = table_attr(f, "params", "order", "params order", "strings")
    local total = 0
    for _, name in ipairs(ck.param_order) do
      if ck.param_tensors[name] then error("params order names " .. name .. " twice", 0) end
      local t = f:read("params/" .. name)
      -- parameters that are not numbers, or NaN/Inf (which no training saves: it stops at a
      -- non-finite loss), would give silently wrong outputs; checked in the checkpoint's dtype,
      -- where a float64 value beyond float32's range becomes Inf
      if t:dtype() == "int32" then
        error(string.format("parameter %s holds integers (int32), expected floats", name), 0)
      end
      if t:dtype() ~= ck.dtype then t = ck.dtype == "float32" and t:float() or t:double() end
      local nan, inf = rl.dataset_scan(t:contiguous())
      if nan or inf then
        error(string.format("parameter %s holds %s at value %d of %d (a diverged or corrupt "
          .. "model)", name, nan and "NaN" or "Inf", nan or inf, t:numel()), 0)
      end
      ck.param_tensors[name] = t
      total = total + t:numel()
    end
    if total ~= int_attr(f, "/", "num_params") then
      error(string.format("the parameters hold %d values, num_params says %d", total,
        int_attr(f, "/", "num_params")), 0)
    end
    ck.params = rl.zeros(total, ck.dtype)
    local off = 0
    for _, name in ipairs(ck.param_order) do
      local t = ck.param_tensors[name]
      local n = t:numel()
      if n > 0 then ck.params:narrow(1, off + 1, n):view(t:size()):copy_(t) end
      off = off + n
    end
    if f:exists("optimizer") then ck.optimizer_state = read_state(f, "optimizer") end
    if f:exists("lr_control") then ck.lr_control_state = read_state(f, "lr_control") end
    if f:exists("pretrain") then ck.pretrain_state = read_state(f, "pretrain") end
    if f:exists("engine") then ck.engine_state = read_state(f, "engine") end
    if f:exists("data_norm") then
      ck.data_norm = check_data_norm(read_state(f, "data_norm"), ck.extern_data, "/data_norm")
    end
    return ck
  end)
  f:close()
  if not ok then
    error("rl.load_checkpoint: " .. util.file_error(ck, path), util.caller_level())
  end
  return ck
end

local function shape_str(t)
  return "(" .. table.concat(t:size(), ", ") .. ")"
end

function M.load_params(ck, net, opts)
  local partial = opts and opts.partial
  local used = 0
  for _, p in ipairs(net:param_list()) do
    local name = p.layer .. "/" .. p.name
    local t = ck.param_tensors[name]
    if t == nil then
      error(string.format("checkpoint %s has no parameter %s: the network differs from the saved "
        .. "one (saved: %s)", ck.path or "?", name, table.concat(ck.param_order, ", ")), 2)
    end
    if shape_str(t) ~= shape_str(p.value) then
      error(string.format("checkpoint %s: parameter %s has shape %s, the network's is %s",
        ck.path or "?", name, shape_str(t), shape_str(p.value)), 2)
    end
    p.value:copy_(t)
    used = used + 1
  end
  if not partial and used ~= #ck.param_order then
    error(string.format("checkpoint %s holds %d parameters, the network has %d: the network "
      .. "differs from the saved one", ck.path or "?", #ck.param_order, used), 2)
  end
end

function M.install(module)
  rl = module
  rl.save_checkpoint = M.save
  rl.load_checkpoint = M.load
  rl.checkpoint = {serialize = M.serialize, deserialize = M.deserialize,
                   load_params = M.load_params, save_model = M.save_model}
  return M
end

return M
