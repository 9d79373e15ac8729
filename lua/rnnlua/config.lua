-- The config files of `rnnlua train CONFIG`: a Lua file returning the rl.train table, or a JSON
-- file in the layout of RETURNN 2016 (a `network` map of layer names to {"class": ...,
-- "from": [...], "n_out": ..., "direction": ...}, the training parameters beside it) or of
-- CURRENNT's network files (a `layers` list, each reading the one before). docs/training.md has the table of every RETURNN key and its meaning
-- here; a key rnnlua does not read is an error naming it, never ignored.
--
--   local config = require("rnnlua.config")
--   config.load(path) -> the rl.train table
--   config.from_returnn(doc, path) -> the rl.train table of a decoded RETURNN JSON document
--   config.from_json(text, path) -> the same of JSON text (file `path`, named in errors)
--
-- A file ending in .lua is Lua, one ending in .json JSON; another name is JSON when its first
-- character that is not a space is "{", Lua when it compiles, and an error otherwise. Errors
-- are "FILE: what" or "FILE:LINE:COLUMN: what" (malformed JSON), and name the key's path in the
-- file (network.fw.from).
local M = {}
local rl = require("rnnlua") -- the module table (init.lua registers it before loading its parts)
local cli = require("rnnlua.cli")
local util = require("rnnlua.util")

local function fail(path, fmt, ...)
  error(path .. ": " .. string.format(fmt, ...), 0)
end

local function did_you_mean(name, known)
  local c = cli.closest(name, known)
  return c and string.format(" (did you mean '%s'?)", c) or ""
end

local function keys_of(t)
  return util.sorted_keys(t)
end

---------------------------------------------------------------------------- RETURNN's layers

-- RETURNN 2016 layer classes -> rnnlua's. rec/lstm/lstm_opt are one LSTM direction
-- (direction = 1 or -1), as RETURNN's LSTM layers were; blstm is both directions with n_out
-- units in all (n_out / 2 each, concatenated), as in CURRENNT.
local CLASSES = {
  rec = "lstm", lstm = "lstm", lstm_opt = "lstm", blstm = "blstm", gru = "gru",
  hidden = "linear", forward = "linear", linear = "linear", softmax = "softmax", copy = "copy",
  embedding = "embedding",
}
local REC_UNITS = {lstm = "lstm", lstmp = "lstm", gru = "gru"}

-- The layer keys RETURNN 2016 wrote that are read here; any other key goes to the rnnlua layer
-- as an option of the same name, which rejects those it does not know.
-- Adds rnnlua layer n, made from the file's layer `name`.
local function put(path, out, origin, n, d, name)
  if origin[n] ~= nil then
    fail(path .. ": network." .. name, "the layer name '%s' is taken twice (by '%s' and '%s'; "
      .. "blstm and dropout add layers NAME_fw, NAME_bw, NAME_dropout)", n, origin[n], name)
  end
  out[n], origin[n] = d, name
end

-- origin: rnnlua layer name -> the file's layer it comes from (errors name the file's layer).
local function map_layer(path, name, l, out, origin)
  local where = string.format("%s: network.%s", path, name)
  if type(l) ~= "table" then fail(where, "the layer must be an object, got %s", type(l)) end
  local class = l.class
  if type(class) ~= "string" then
    fail(where, "missing \"class\" (RETURNN classes read: %s)",
      table.concat(keys_of(CLASSES), ", "))
  end
  local cls = CLASSES[class]
  if not cls then
    fail(where .. ".class", "unknown class '%s'%s (RETURNN classes read: %s)", class,
      did_you_mean(class, keys_of(CLASSES)), table.concat(keys_of(CLASSES), ", "))
  end
  local d = {}
  for k, v in pairs(l) do
    if v == rl.json_null then fail(where .. "." .. k, "null is not a value rnnlua reads") end
    if k ~= "class" and k ~= "unit" and k ~= "dropout" then d[k] = v end
  end
  if class == "rec" then
    local unit = l.unit == nil and "lstm" or l.unit
    if type(unit) ~= "string" or not REC_UNITS[unit] then
      fail(where .. ".unit", "unit '%s' is not read (units: %s)", tostring(unit),
        table.concat(keys_of(REC_UNITS), ", "))
    end
    cls = REC_UNITS[unit]
  elseif l.unit ~= nil then
    fail(where .. ".unit", "\"unit\" belongs to class rec only")
  end
  if cls == "linear" and l.activation == nil then
    -- RETURNN's default activation of a hidden layer differed between its versions
    fail(where, "class %s needs \"activation\" (tanh, sigmoid, relu, identity, ...)", class)
  end
  if cls == "softmax" and l.loss ~= nil and l.target == nil then d.target = "classes" end
  local from = l.from == nil and {"data"} or l.from
  if type(from) == "string" then from = {from} end
  if type(from) ~= "table" then fail(where .. ".from", "must be a name or a list of names") end
  for i, f in ipairs(from) do
    if type(f) ~= "string" then fail(where .. ".from", "entry %d is not a name", i) end
  end
  d.from = from
  if l.dropout ~= nil then
    -- RETURNN's dropout drops the layer's input in training
    if type(l.dropout) ~= "number" then fail(where .. ".dropout", "must be a number") end
    if l.dropout > 0 then
      local dn = name .. "_dropout"
      put(path, out, origin, dn, {class = "dropout", dropout = l.dropout, from = from}, name)
      d.from = {dn}
    end
  end
  if cls == "blstm" then
    local n = l.n_out
    if math.type(n) ~= "integer" or n < 2 or n % 2 ~= 0 then
      fail(where .. ".n_out", "class blstm needs an even n_out (both directions), got %s",
        tostring(n))
    end
    if d.direction ~= nil then fail(where .. ".direction", "class blstm runs both directions") end
    local fw, bw = util.copy(d), util.copy(d)
    fw.class, bw.class, fw.n_out, bw.n_out, bw.direction = "lstm", "lstm", n // 2, n // 2, -1
    put(path, out, origin, name .. "_fw", fw, name)
    put(path, out, origin, name .. "_bw", bw, name)
    put(path, out, origin, name, {class = "copy", from = {name .. "_fw", name .. "_bw"}}, name)
    return
  end
  d.class = cls
  put(path, out, origin, name, d, name)
end

-- The layers a `from` may name: every layer of the file and the inputs.
local function check_froms(path, net, inputs, origin)
  for _, name in ipairs(keys_of(net)) do
    for _, f in ipairs(net[name].from or {}) do
      if origin[f] == nil and not inputs[f] then
        local known = {}
        for _, v in pairs(origin) do known[v] = true end
        for k in pairs(inputs) do known[k] = true end
        known = keys_of(known)
        fail(path .. ": network." .. origin[name] .. ".from", "no layer '%s'%s (layers and "
          .. "inputs: %s)", f, did_you_mean(f, known), table.concat(known, ", "))
      end
    end
  end
end

---------------------------------------------------------------------------- CURRENNT's layers

-- CURRENNT's network file: "layers", a list in which each layer reads the one before, from an
-- "input" layer to an output layer and a post-output layer that names the loss.
local CURRENNT_TYPES = {
  feedforward_tanh = {"linear", "tanh"}, feedforward_logistic = {"linear", "sigmoid"},
  feedforward_identity = {"linear", "identity"}, lstm = {"lstm"}, blstm = {"blstm"},
  softmax = {"softmax"},
}
local CURRENNT_LOSSES = {multiclass_classification = {"ce", true}, sse = {"mse", false}}

local function from_currennt(path, list, net, origin, ext)
  if type(list) ~= "table" or list[1] == nil then
    fail(path .. ": layers", "must be a list of layers (CURRENNT's network file)")
  end
  local prev
  for i, l in ipairs(list) do
    local where = string.format("%s: layers[%d]", path, i)
    if type(l) ~= "table" then fail(where, "must be an object") end
    for k, v in pairs(l) do
      if k == "bias" then
        -- CURRENNT's bias is an input of constant value; 1.0 is the ordinary bias rnnlua has
        if v ~= 1 then fail(where .. ".bias", "only 1.0 (an ordinary bias) is read, got %s", v) end
      elseif k == "weights" then
        fail(where .. ".weights", "CURRENNT's trained weights are not read (train in rnnlua)")
      elseif k ~= "name" and k ~= "type" and k ~= "size" then
        fail(where, "unknown key '%s' (CURRENNT keys read: name, type, size, bias)", k)
      end
    end
    local name, t, size = l.name, l.type, l.size
    if type(name) ~= "string" then fail(where, "needs a \"name\"") end
    if math.type(size) ~= "integer" or size < 1 then fail(where .. ".size", "must be a dim") end
    if i == 1 then
      if t ~= "input" then fail(where, "the first layer must be of type input") end
      ext.data = {dim = size}
      prev = "data"
    elseif CURRENNT_LOSSES[t] then
      if i ~= #list then fail(where, "a %s layer must come last", t) end
      local out = net[prev]
      if not out or out.class ~= "softmax" and CURRENNT_LOSSES[t][1] == "ce" then
        fail(where, "%s needs a softmax layer before it", t)
      end
      out.loss, out.target = CURRENNT_LOSSES[t][1], "classes"
      ext.classes = {dim = size, sparse = CURRENNT_LOSSES[t][2]}
    else
      local m = CURRENNT_TYPES[t]
      if not m then
        local known = keys_of(CURRENNT_TYPES)
        for k in pairs(CURRENNT_LOSSES) do known[#known + 1] = k end
        fail(where .. ".type", "'%s' is not read (types: input, %s)", tostring(t),
          table.concat(known, ", "))
      end
      map_layer(path, name, {class = m[1] == "linear" and "hidden" or m[1], n_out = size,
        activation = m[2], from = {prev}}, net, origin)
      prev = name
    end
  end
end

---------------------------------------------------------------------------- RETURNN's top level

local DATASET_CLASSES = {Task12AXDataset = "12ax", HDFDataset = "hdf"}

local function dataset(path, key, v)
  local where = path .. ": " .. key
  if type(v) == "string" then
    local files = {}
    for f in v:gmatch("[^,]+") do files[#files + 1] = f end
    return {class = "hdf", files = files}
  end
  if type(v) ~= "table" then fail(where, "must be a file name, a list of them or an object") end
  if v[1] ~= nil then
    for i, f in ipairs(v) do
      if type(f) ~= "string" then fail(where, "entry %d is not a file name", i) end
    end
    return {class = "hdf", files = v}
  end
  local d = {}
  for k, x in pairs(v) do d[k] = x end
  if type(d.class) ~= "string" then fail(where, "an object needs \"class\"") end
  d.class = DATASET_CLASSES[d.class] or d.class
  return d
end

-- num_outputs: 2, or {"classes": 2}, or {"classes": [2, 1], "data": [9, 2]} ([dim, ndim]: ndim 1
-- is sparse class indices, 2 dense vectors, as RETURNN wrote them).
local function outputs(path, v, ext)
  if math.type(v) == "integer" then
    ext.classes = {dim = v, sparse = true}
    return
  end
  if type(v) ~= "table" then fail(path .. ": num_outputs", "must be an integer or an object") end
  for k, x in pairs(v) do
    local where = path .. ": num_outputs." .. k
    if math.type(x) == "integer" then
      ext[k] = {dim = x, sparse = k ~= "data"}
    elseif type(x) == "table" and math.type(x[1]) == "integer" and (x[2] == 1 or x[2] == 2) then
      ext[k] = {dim = x[1], sparse = x[2] == 1}
    else
      fail(where, "must be a dim or [dim, ndim] with ndim 1 (sparse) or 2 (dense)")
    end
  end
end

local function device(path, v)
  if v == "cpu" or v == "gpu" or (type(v) == "string" and v:match("^gpu%d+$")) then
    return v == "cpu" and "cpu" or v == "gpu" and "cuda" or "cuda:" .. v:sub(4)
  end
  if type(v) == "string" and (v == "cuda" or v:match("^cuda:%d+$")) then return v end
  fail(path .. ": device", "must be \"cpu\", \"gpu\" or \"gpuN\", got %s", tostring(v))
end

-- RETURNN 2016 top-level keys read here and what each does to the rl.train table; rl.train's
-- own keys (docs/training.md) are read as themselves.
local TOP = {
  network = true, num_inputs = true, num_outputs = true, train = true, dev = true, task = true,
  log = true, device = true, adam = true, momentum = true, gradient_clip = true,
  multiprocessing = true, layers = true,
}

function M.from_returnn(doc, path)
  if type(doc) ~= "table" or doc[1] ~= nil then
    fail(path, "must hold a JSON object (RETURNN's config layout)")
  end
  local engine = require("rnnlua.engine")
  local cfg, ext, optimizer, origin = {}, {}, nil, nil
  for k, v in pairs(doc) do
    if v == rl.json_null then fail(path .. ": " .. k, "null is not a value rnnlua reads") end
    if not TOP[k] and not engine.is_key(k) then
      local known = keys_of(TOP)
      table.move(engine.known_keys(), 1, #engine.known_keys(), #known + 1, known)
      fail(path, "unknown key '%s'%s (docs/training.md lists the RETURNN keys rnnlua reads)", k,
        did_you_mean(k, known))
    end
  end
  for k, v in pairs(doc) do
    if k == "network" then
      if type(v) ~= "table" or v[1] ~= nil then
        fail(path .. ": network", "must be an object of layer names")
      end
      cfg.network, origin = {}, {}
      for _, name in ipairs(keys_of(v)) do map_layer(path, name, v[name], cfg.network, origin) end
    elseif k == "layers" then
      if doc.network ~= nil then fail(path, "give \"network\" or CURRENNT's \"layers\", not both") end
      cfg.network, origin = {}, {}
      from_currennt(path, v, cfg.network, origin, ext)
    elseif k == "num_inputs" then
      if math.type(v) ~= "integer" or v < 1 then fail(path .. ": num_inputs", "must be a dim") end
      ext.data = {dim = v}
    elseif k == "num_outputs" then
      outputs(path, v, ext)
    elseif k == "train" or k == "dev" then
      cfg[k] = dataset(path, k, v)
    elseif k == "task" then
      if v ~= "train" then
        fail(path .. ": task", "'%s': `rnnlua train` runs task train (`rnnlua forward`, "
          .. "`rnnlua search` the others)", tostring(v))
      end
    elseif k == "log" then
      cfg.log_file = v
    elseif k == "device" then
      cfg.device = device(path, v)
    elseif k == "multiprocessing" then
      -- RETURNN ran the device in a second process; rnnlua runs it in this one
      if type(v) ~= "boolean" then fail(path .. ": multiprocessing", "must be true or false") end
    elseif k == "adam" then
      if v ~= true and v ~= false then fail(path .. ": adam", "must be true or false") end
      if v then optimizer = optimizer or {}; optimizer.class = "adam" end
    elseif k == "momentum" then
      if type(v) ~= "number" then fail(path .. ": momentum", "must be a number") end
      if v > 0 then
        optimizer = optimizer or {}
        optimizer.class, optimizer.momentum = optimizer.class or "momentum", v
      end
    elseif k == "gradient_clip" then
      if type(v) ~= "number" then fail(path .. ": gradient_clip", "must be a number") end
      if v > 0 then optimizer = optimizer or {}; optimizer.gradient_clip = v end
    else
      cfg[k] = v
    end
  end
  if optimizer then
    if doc.optimizer ~= nil then
      fail(path, "give \"optimizer\" or RETURNN's adam/momentum/gradient_clip, not both")
    end
    if optimizer.class == "adam" and optimizer.momentum then
      fail(path, "adam and momentum: RETURNN 2016 used one of them")
    end
    optimizer.class = optimizer.class or "sgd"
    cfg.optimizer = optimizer
  end
  if cfg.network == nil then fail(path, "has no \"network\"") end
  if next(ext) ~= nil then
    if cfg.extern_data ~= nil then fail(path, "give extern_data or num_inputs/num_outputs") end
    cfg.extern_data = ext
  end
  local inputs = {data = true}
  for k in pairs(cfg.extern_data or {}) do inputs[k] = true end
  check_froms(path, cfg.network, inputs, origin)
  return cfg
end

---------------------------------------------------------------------------- files

local function read_all(path)
  local f, err = io.open(path, "rb")
  if not f then fail(path, "cannot open: %s", tostring(err):gsub("^[^:]*: ", "")) end
  local text = f:read("a")
  f:close()
  if text == nil then fail(path, "cannot read") end
  return text
end

-- The rl.train table of the JSON text of file `path`.
function M.from_json(text, path)
  local ok, doc = pcall(rl.json_decode, text, path)
  if not ok then error(tostring(doc), 0) end
  return M.from_returnn(doc, path)
end

local function load_lua(path, chunk)
  local ok, cfg = pcall(chunk)
  if not ok then error(cfg, 0) end
  if type(cfg) ~= "table" then
    fail(path, "must return the rl.train config table, got %s", type(cfg))
  end
  return cfg
end

function M.load(path)
  local text = read_all(path)
  local lname = path:lower()
  if lname:match("%.json$") then return M.from_json(text, path) end
  local chunk, err = load(text, "@" .. path, "t")
  if lname:match("%.lua$") then
    if not chunk then error(err, 0) end
    return load_lua(path, chunk)
  end
  if text:match("^%s*{") then return M.from_json(text, path) end
  if chunk then return load_lua(path, chunk) end
  fail(path, "neither a Lua config (.lua: %s) nor a JSON one (.json: it does not start with '{')",
    tostring(err):gsub("^[^:]*:(%d+):", "line %1:"))
end

return M
