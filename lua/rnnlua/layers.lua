-- rl.layers: the registry of layer classes, and the layer objects the network wires together.
--
-- A layer class is either a C class (layers/registry.c, bound by lua/l_layers.c) or a Lua
-- class given to rl.layers.register(name, class). The network sees one interface for both
-- (see `create`): params, bind, init_params, forward, backward and the fields name, class,
-- n_out, n_in, in_dims, is_loss, num_params.
--
-- A Lua layer class is a table of functions, called with the layer instance `self`:
--
--   init(self, opts, in_dims) -> n_out   (required) opts reads the layer's description
--       ({class = ..., n_out = ..., from = ...}); reading a key marks it as understood, and
--       every key no layer read (besides the network's own: class, from, loss, target,
--       is_output_layer, loss_scale) is an "unknown option" error. in_dims: the feature dim
--       of each input (a list).
--   params(self) -> {{name =, shape = {...}, init =, init_scale =, fan_in =, fan_out =}, ...}
--       (optional) init is "glorot" (default; init_scale is the gain), "zeros", "ones",
--       "constant" (init_scale is the value), "uniform" (U(-s, s)), "normal" (N(0, s^2)) or
--       "orthogonal" (each (r, r) block of an (r, k*r) matrix, else whole rows of an (r, c) one); fan_in/fan_out default to
--       the product of all dims but the last, and the last.
--   forward(self, inputs, lengths, train) -> out   (required) inputs: list of (T, B, in_dim)
--       tensors, lengths: (B) int32, train: dropout and the like act only when true. out:
--       (T, B, n_out) in the inputs' dtype. A layer may keep what backward needs in self.
--   backward(self, grad_out, inputs, lengths) -> {grad_input_1, ...}   (required)
--       The same gradient rule as a C layer: the input gradients are RETURNED (the network
--       copies them into its buffers, i.e. they are assigned with `=`), and the parameter
--       gradients are ACCUMULATED with `+=` into self.grads[name] (for instance
--       self.grads.W:add_(dW)); never assign a new tensor to self.grads[name].
--       backward runs at most once after each forward, with the same inputs.
--
-- During init and after it, self.name, self.class, self.dtype ("float32"/"float64") and
-- self.in_dims are set; after the network has bound the layer, self.params[name] and
-- self.grads[name] are views into the network's flat parameter and gradient buffers, and
-- self.device names their device ("cpu", "cuda:0", ...): after net:to(device) the dense inputs,
-- grad_out and params are tensors on that device (lengths and class indices stay on the CPU),
-- and the tensors a layer makes itself must be put there (rl.zeros(..., self.device),
-- t:to(self.device)). A class
-- without a metatable inherits the helpers of rl.layers.Base (self:frame_mask). A Lua error
-- inside a class function is raised as "layer 'NAME' (class CLASS): MESSAGE".
local M = {}

local rl -- the module table, set by install

local Size = debug.getregistry()["rnnlua.Size"]

-- Keys of a layer description that the network reads itself.
M.network_keys = {
  class = true, from = true, loss = true, target = true, is_output_layer = true,
  loss_scale = true,
}

local lua_classes = {}

---------------------------------------------------------------------------- helpers

local fail = require("rnnlua.util").fail
local layer_where = require("rnnlua.util").layer_where

local function c_class_set()
  local set = {}
  for _, n in ipairs(rl._layer_classes()) do set[n] = true end
  return set
end

function M.classes()
  local set = c_class_set()
  for n in pairs(lua_classes) do set[n] = true end
  local list = {}
  for n in pairs(set) do list[#list + 1] = n end
  table.sort(list)
  return list
end

-- Helpers every Lua layer class inherits (unless it has a metatable of its own).
local Base = {}
M.Base = Base

-- (T, B, 1) in the layer's dtype on its device: 1 on valid frames t <= lengths[b], 0 on
-- padding. Built on the CPU from the CPU lengths and copied once to the device.
function Base:frame_mask(lengths, T)
  local B = lengths:size(1)
  local t = rl.arange(T, self.dtype):view(T, 1)
  local m = rl.lt(t, lengths:to(self.dtype):view(1, B)):view(T, B, 1)
  local dev = self.device or "cpu"
  return dev == "cpu" and m or m:to(dev)
end

---------------------------------------------------------------------------- registration

function M.register(name, class, opts)
  if type(name) ~= "string" or name == "" then
    error("rl.layers.register: the name must be a non-empty string", 2)
  end
  if type(class) ~= "table" then
    error(string.format("rl.layers.register('%s'): the class must be a table, got %s", name,
      type(class)), 2)
  end
  for _, f in ipairs({"init", "forward", "backward"}) do
    if type(class[f]) ~= "function" then
      error(string.format("rl.layers.register('%s'): the class lacks a function %s", name, f), 2)
    end
  end
  if class.params ~= nil and type(class.params) ~= "function" then
    error(string.format("rl.layers.register('%s'): params must be a function", name), 2)
  end
  local replace = type(opts) == "table" and opts.replace
  if not replace then
    if c_class_set()[name] then
      error(string.format("rl.layers.register: '%s' is a built-in C class (pass {replace = true} to "
        .. "shadow it)", name), 2)
    end
    if lua_classes[name] then
      error(string.format("rl.layers.register: '%s' is already registered (pass {replace = true} to "
        .. "replace it)", name), 2)
    end
  end
  if getmetatable(class) == nil then setmetatable(class, {__index = Base}) end
  lua_classes[name] = class
  return class
end

---------------------------------------------------------------------------- options

local function check_unknown(name, cls, desc, read)
  local unknown = {}
  for k in pairs(desc) do
    if type(k) ~= "string" then
      fail("%s: option names must be strings, got %s", layer_where(name, cls), type(k))
    end
    if not read[k] and not M.network_keys[k] then unknown[#unknown + 1] = k end
    -- an option with named fields (zoneout = {cell = .., hidden = ..}): read[k] is the set of
    -- fields the layer read
    if type(read[k]) == "table" and type(desc[k]) == "table" then
      for f in pairs(desc[k]) do
        if not read[k][f] then
          local known = {}
          for n in pairs(read[k]) do known[#known + 1] = n end
          table.sort(known)
          fail("%s: option %s has no field '%s' (it has %s)", layer_where(name, cls), k,
            tostring(f), table.concat(known, ", "))
        end
      end
    end
  end
  if #unknown == 1 then
    fail("%s: unknown option '%s'", layer_where(name, cls), unknown[1])
  elseif #unknown > 1 then
    table.sort(unknown)
    fail("%s: unknown options '%s'", layer_where(name, cls), table.concat(unknown, "', '"))
  end
end

-- A read-only view of desc that records every key read into `read`.
local function options_proxy(desc, read)
  return setmetatable({}, {
    __index = function(_, k)
      read[k] = true
      return desc[k]
    end,
    __newindex = function() error("layer options are read-only", 2) end,
  })
end

---------------------------------------------------------------------------- Lua layer objects

local LuaLayer = {}
LuaLayer.__index = LuaLayer

local init_kinds = {
  glorot = true, zeros = true, ones = true, constant = true, uniform = true, normal = true,
  orthogonal = true,
}
local default_scale = {glorot = 1, constant = 0, uniform = 0.1, normal = 0.1, orthogonal = 1}

-- Calls class function f; a Lua error becomes one naming the layer and the class.
local function call(self, what, f, ...)
  local res = table.pack(pcall(f, self.inst, ...))
  if not res[1] then fail("%s: %s: %s", layer_where(self.name, self.class), what,
      tostring(res[2])) end
  return table.unpack(res, 2, res.n)
end

local function check_specs(self, specs)
  if type(specs) ~= "table" then
    fail("%s: params must return a list, got %s", layer_where(self.name, self.class),
      type(specs))
  end
  local seen, out, total = {}, {}, 0
  for i, s in ipairs(specs) do
    local where = string.format("%s: parameter %d", layer_where(self.name, self.class), i)
    if type(s) ~= "table" or type(s.name) ~= "string" or s.name == "" then
      fail("%s: needs a name", where)
    end
    if seen[s.name] then fail("%s: name '%s' is used twice", where, s.name) end
    seen[s.name] = true
    if type(s.shape) ~= "table" or #s.shape == 0 then fail("%s (%s): needs a shape", where, s.name) end
    local shape, numel = {}, 1
    for d, n in ipairs(s.shape) do
      if math.type(n) ~= "integer" or n < 1 then
        fail("%s (%s): size %d must be a positive integer", where, s.name, d)
      end
      shape[d] = n
      if n > rl.MAX_NUMEL // numel then -- checked: a Lua integer product would wrap around
        fail("%s (%s): shape has more than %d elements", where, s.name, rl.MAX_NUMEL)
      end
      numel = numel * n
    end
    local init = s.init or "glorot"
    if not init_kinds[init] then
      fail("%s (%s): unknown init '%s' (known: constant, glorot, normal, ones, orthogonal, "
        .. "uniform, zeros)", where, s.name, tostring(init))
    end
    local fan_in = 1
    for d = 1, #shape - 1 do fan_in = fan_in * shape[d] end
    out[i] = {
      name = s.name, shape = setmetatable(shape, Size), numel = numel, init = init,
      init_scale = s.init_scale or default_scale[init] or 1,
      fan_in = s.fan_in or fan_in, fan_out = s.fan_out or shape[#shape],
    }
    total = total + numel
    if total > rl.MAX_NUMEL then
      fail("%s: more than %d parameters", layer_where(self.name, self.class), rl.MAX_NUMEL)
    end
  end
  return out, total
end

local function new_lua_layer(cls_name, class, name, desc, in_dims, dtype)
  local inst = setmetatable({
    name = name, class = cls_name, dtype = dtype, in_dims = {table.unpack(in_dims)}, params = {},
    grads = {},
  }, {__index = class})
  local self = setmetatable({
    inst = inst, cls = class, name = name, class = cls_name, n_in = #in_dims,
    in_dims = {table.unpack(in_dims)}, is_loss = false, forwarded = false,
  }, LuaLayer)
  local read = {}
  local n_out = call(self, "init", class.init, options_proxy(desc, read), {table.unpack(in_dims)})
  if math.type(n_out) ~= "integer" or n_out < 1 then
    fail("%s: init must return n_out, a positive integer (got %s)", layer_where(name, cls_name),
      tostring(n_out))
  end
  self.n_out, inst.n_out = n_out, n_out
  local specs = {}
  if class.params then specs = call(self, "params", class.params) end
  self.specs, self.num_params = check_specs(self, specs)
  return self, read
end

function LuaLayer:params()
  local list = {}
  for i, s in ipairs(self.specs) do
    list[i] = {
      name = s.name, shape = setmetatable({table.unpack(s.shape)}, Size), numel = s.numel,
      init = s.init, init_scale = s.init_scale, fan_in = s.fan_in, fan_out = s.fan_out,
    }
  end
  return list
end

function LuaLayer:bind(values, grads, offset)
  self.inst.device = values:device()
  for _, s in ipairs(self.specs) do
    self.inst.params[s.name] = values:narrow(1, offset + 1, s.numel):view(s.shape)
    self.inst.grads[s.name] = grads:narrow(1, offset + 1, s.numel):view(s.shape)
    offset = offset + s.numel
  end
  return offset
end

function LuaLayer:init_params()
  for _, s in ipairs(self.specs) do
    local v = self.inst.params[s.name]
    if not v then fail("%s: init_params before bind", layer_where(self.name, self.class)) end
    if s.init == "ones" then
      v:fill_(1)
    else
      rl._param_init(v, s.init, s.init_scale, s.fan_in, s.fan_out, s.name)
    end
  end
end

local function describe(t)
  return string.format("%s %s", t:dtype(), tostring(t:size()))
end

function LuaLayer:forward(inputs, lengths, train)
  self.forwarded = false
  if #inputs ~= self.n_in then
    fail("%s: %d inputs given, %d expected", layer_where(self.name, self.class), #inputs,
      self.n_in)
  end
  local x1 = inputs[1]
  for i, x in ipairs(inputs) do
    if not rl.is_tensor(x) or x:dim() ~= 3 or x:size(3) ~= self.in_dims[i] then
      fail("%s: input %d must be a (T, B, %d) tensor, got %s", layer_where(self.name, self.class),
        i, self.in_dims[i], rl.is_tensor(x) and describe(x) or type(x))
    end
    if x:size(1) ~= x1:size(1) or x:size(2) ~= x1:size(2) then
      fail("%s: input %d is %s, input 1 is %s", layer_where(self.name, self.class), i,
        describe(x), describe(x1))
    end
  end
  local out = call(self, "forward", self.cls.forward, inputs, lengths, train)
  if not rl.is_tensor(out) or out:dim() ~= 3 or out:size(1) ~= x1:size(1)
      or out:size(2) ~= x1:size(2) or out:size(3) ~= self.n_out or out:dtype() ~= x1:dtype() then
    fail("%s: forward must return a %s (%d, %d, %d) tensor, got %s",
      layer_where(self.name, self.class), x1:dtype(), x1:size(1), x1:size(2), self.n_out,
      rl.is_tensor(out) and describe(out) or type(out))
  end
  self.inputs, self.lengths, self.forwarded = inputs, lengths, true
  return out
end

function LuaLayer:backward(grad_out, grad_in)
  if not self.forwarded then
    fail("%s: backward needs a forward before it (once per forward)",
      layer_where(self.name, self.class))
  end
  self.forwarded = false
  local grads = call(self, "backward", self.cls.backward, grad_out, self.inputs, self.lengths)
  if type(grads) ~= "table" then
    fail("%s: backward must return a list of input gradients, got %s",
      layer_where(self.name, self.class), type(grads))
  end
  for i = 1, self.n_in do
    local buf = grad_in[i]
    if buf then
      local g = grads[i]
      if not rl.is_tensor(g) or g:size() ~= self.inputs[i]:size() then
        fail("%s: backward returned %s for input %d, expected a %s tensor",
          layer_where(self.name, self.class), rl.is_tensor(g) and describe(g) or type(g), i,
          describe(self.inputs[i]))
      end
      buf:copy_(g)
    end
  end
end

function LuaLayer:__tostring()
  return string.format("Layer '%s' (Lua class %s, %d inputs, n_out %d, %d params)", self.name,
    self.class, self.n_in, self.n_out, self.num_params)
end

---------------------------------------------------------------------------- creation

-- Whether layer object `layer` has recurrent state (layers/layer.h, rl_state_ops): the C layers
-- built on layers/recurrent.c (lstm, gru, ...). Callers ask this, never the class name.
function M.has_state(layer)
  return type(layer) == "userdata" and #layer:state_names() > 0
end

-- Whether a layer described by `desc` draws from the shared generator in a training forward
-- besides a dropout layer's own (the recurrent driver's masks: zoneout, rec_dropout,
-- weight_dropout; layers/recurrent.c). Such layers must draw in layer order, so the network
-- never runs them concurrently in training (Network:forward_pair).
function M.draws_in_training(desc)
  local z = desc.zoneout
  if type(z) == "table" then z = (tonumber(z.cell) or 0) + (tonumber(z.hidden) or 0) end
  return (tonumber(z) or 0) > 0 or (tonumber(desc.rec_dropout) or 0) > 0
    or (tonumber(desc.weight_dropout) or 0) > 0
end

-- One layer object of class `cls`, named `name`, from the description `desc`, with inputs of
-- feature dims in_dims, computing in dtype. `defaults` (optional) supplies options the
-- description lacks (the network gives n_out from a loss layer's target); a layer need not
-- read them. Errors name the layer.
function M.create(cls, name, desc, in_dims, dtype, defaults)
  local opts = desc
  if defaults and next(defaults) then
    opts = {}
    for k, v in pairs(defaults) do opts[k] = v end
    for k, v in pairs(desc) do opts[k] = v end
  end
  local class = lua_classes[cls]
  if class then
    local layer, read = new_lua_layer(cls, class, name, opts, in_dims, dtype)
    check_unknown(name, cls, desc, read)
    return layer
  end
  if not c_class_set()[cls] then
    -- a checkpoint names a Lua layer's class, never holds its code: the user registers it
    fail("%s: unknown class '%s' (known: %s; a Lua layer class is registered with "
      .. "rl.layers.register before the network is built or loaded: rnnlua serve --lua FILE, "
      .. "rnnlua forward ++lua FILE)", layer_where(name), tostring(cls),
      table.concat(M.classes(), ", "))
  end
  local layer, read = rl._layer_new(cls, name, opts, in_dims)
  check_unknown(name, cls, desc, read)
  return layer
end

---------------------------------------------------------------------------- install

function M.install(module)
  rl = module
  rl.layers = M
  M.register("layer_norm", require("rnnlua.layers.layer_norm"))
  return M
end

return M
