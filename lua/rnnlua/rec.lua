-- The rec layer: RETURNN's recurrent sub-network, {class = "rec", from = ..., unit = {...}}.
--
-- The unit is a table name -> layer description, evaluated once per step. Sources inside it:
--   "data:source"  the rec layer's input at this step (its one `from`; from = {} for none)
--   "x"            unit layer x at this step
--   "prev:x"       unit layer x at the previous step: zeros at the first step, or the number
--                  (a label for a choice layer) given as x's initial_output
--   "base:y"       layer y of the enclosing network, the whole sequence: an attention layer's
--                  `base` (other unit layers read it through an attention layer)
-- The unit's layer `output` is the rec layer's output (S, B, n_out), one frame per step.
-- Unit layers are ordinary layer objects (C or Lua classes) run on (1, B, F) views, one step at
-- a time, plus three kinds the rec layer drives itself:
--   lstm, gru           their state (h, c; a gru's h alone, its output) carried from step to
--                       step (prev state in, final state out, layers/layer.h "Per-step use")
--   attention           lua/rnnlua/attention.lua: base = "base:enc", from = the query
--   choice              {class = "choice", from = "output_prob", target = "classes",
--                       beam_size = n}: the label of this step, sparse (int32) with the
--                       target's dim; in training the target itself (teacher forcing), in
--                       search the beam's choice (rec:search)
-- A unit layer with loss = "ce" (a softmax) is scored over all steps at once in training: the
-- rec layer runs it once on the (S, B, F) outputs of its sources with the target's lengths, as
-- the network would run it outside the unit (it must read only layers of the same step, and
-- only a choice may read it). The rec layer reports that loss to the network as its own.
--
-- Steps: with a target (a choice's or a loss's) in the batch, one per target frame: S = the
-- longest target, lengths = batch.lengths_K when the batch has it (targets of their own
-- length), else the input's lengths. Without one, one per frame of the input.
--
-- Backward through time: the unit layers' outputs (S, B, F) and the further states of the
-- recurrent layers (an lstm's cell, (S, B, dim) each: the layer's state_names after the first,
-- which is its output) are kept in buffers sized once per batch shape. A layer object keeps only its last forward, so
-- in training with targets each step runs on its own object of each unit layer (Rec:step_obj:
-- objects sharing the parameters, made once and kept, up to M.max_step_objects steps), and
-- backward visits the steps last to first calling every unit layer's backward in reverse order
-- on that step's object. Beyond M.max_step_objects steps one object runs every step, and for
-- each step backward first re-runs the unit's forward of that step (the generator reset to the
-- state it had then, so dropout masks repeat) from the stored outputs. Parameter gradients
-- accumulate across steps in the network's flat buffer (a recurrent layer's weight gradients
-- once after the steps, one product over all of them: Rec:weight_grads), and the gradients of
-- each layer's output at each step gather in (S, B, F) buffers: from its readers at the same
-- step, from prev: readers at the next step and, for a recurrent layer, from its own state. No
-- activations are allocated per step.
local M = {}

local layers = require("rnnlua.layers")
local attention = require("rnnlua.attention")
local rl = require("rnnlua") -- the module table (init.lua registers it before loading its parts)

local Rec = {}
Rec.__index = Rec

local fail = require("rnnlua.util").fail

local util = require("rnnlua.util")

-- where a message of rec layer `name` points: util.layer_where, the one layer prefix
local function rec_where(name) return util.layer_where(name, "rec") end
local lmod = require("rnnlua.lm")
local sorted_keys, list_of = util.sorted_keys, util.list_of

-- Keys of a unit layer's description that the rec layer reads itself.
local UNIT_KEYS = {initial_output = true, beam_size = true}
local INT32_MAX = 2147483647

-- The rec layer's own `from` (a list, possibly empty).
local function rec_froms(name, d)
  if d.from == nil then return {"data"} end
  local f = list_of(d.from)
  if type(f) ~= "table" then fail("%s: from must be a name or a list", rec_where(name)) end
  if #f > 1 then
    fail("%s: takes one from (data:source), got %d (concatenate them with a copy "
      .. "layer)", rec_where(name), #f)
  end
  return f
end

-- The unit's layers' sources, parsed: {kind = "same"|"prev"|"base"|"source", name = ...}.
local function parse_unit(name, d)
  local unit = d.unit
  if unit == nil then fail("%s: needs unit, a table of layers", rec_where(name)) end
  if type(unit) == "string" then
    fail("%s: unit must be a table of layers, got the string '%s' (RETURNN's "
      .. "rec layer with unit = \"%s\" is the layer {class = \"%s\"} here, without a rec "
      .. "layer)", rec_where(name), unit, unit, unit)
  end
  if type(unit) ~= "table" then
    fail("%s: unit must be a table of layers, got a %s", rec_where(name), type(unit))
  end
  if unit.output == nil then
    fail("%s: the unit has no 'output' layer (layers: %s)", rec_where(name),
      table.concat(sorted_keys(unit), ", "))
  end
  local parsed = {}
  for _, uname in ipairs(sorted_keys(unit)) do
    local u = unit[uname]
    local where = string.format("%s, unit layer '%s'", rec_where(name), tostring(uname))
    if type(uname) ~= "string" then fail("%s: unit layer names must be strings", rec_where(name)) end
    if type(u) ~= "table" then fail("%s: the description must be a table", where) end
    if type(u.class) ~= "string" then fail("%s: missing class", where) end
    local srcs = {}
    local froms = u.from
    if froms == nil then froms = {"data:source"} end
    froms = list_of(froms)
    for i, s in ipairs(froms) do
      if type(s) ~= "string" then fail("%s: from[%d] must be a name", where, i) end
      local src
      if s == "data:source" or s == "data" then
        src = {kind = "source"}
      elseif s:sub(1, 5) == "prev:" then
        src = {kind = "prev", name = s:sub(6)}
        if unit[src.name] == nil then
          fail("%s: '%s' names no layer of the unit (unit layers: %s)", where, s,
            table.concat(sorted_keys(unit), ", "))
        end
      elseif s:sub(1, 5) == "base:" then
        src = {kind = "base", name = s:sub(6)}
      else
        src = {kind = "same", name = s}
        if unit[s] == nil then
          fail("%s: unknown from '%s' (unit layers: %s; or data:source, prev:x, base:y)", where, s,
            table.concat(sorted_keys(unit), ", "))
        end
      end
      src.text = s
      srcs[i] = src
    end
    local base
    if u.class == "attention" then
      if type(u.base) ~= "string" or u.base:sub(1, 5) ~= "base:" then
        fail("%s (attention): needs base = \"base:LAYER\" (the encoder)", where)
      end
      base = u.base:sub(6)
    end
    parsed[uname] = {name = uname, desc = u, srcs = srcs, base = base, where = where}
  end
  return parsed
end

-- The layers of the enclosing network the unit reads (base:y), sorted.
local function base_names(parsed)
  local set = {}
  for _, p in pairs(parsed) do
    for _, s in ipairs(p.srcs) do if s.kind == "base" then set[s.name] = p end end
    if p.base then set[p.base] = p end
  end
  return set
end

-- The network node's sources: the rec layer's from, then the base layers it reads. desc: the
-- whole network description (base layers must exist and must not depend on the rec layer).
function M.sources(name, d, desc)
  local froms = rec_froms(name, d)
  local msl = d.max_seq_len
  if type(msl) == "string" then
    M.length_expr(msl, rec_where(name))
  elseif type(msl) == "number" then
    if not (msl >= 1 and msl < math.huge) then
      fail("%s: max_seq_len must be >= 1, got %s", rec_where(name), tostring(msl))
    end
  elseif msl ~= nil and type(msl) ~= "function" then
    fail("%s: max_seq_len must be a number, a function of the input length or an "
      .. "expression of T such as \"2 * T + 3\", got %s", rec_where(name), type(msl))
  end
  local parsed = parse_unit(name, d)
  local bases = base_names(parsed)
  local srcs = {table.unpack(froms)}
  for _, b in ipairs(sorted_keys(bases)) do
    local p = bases[b]
    if desc[b] == nil then
      fail("%s: base:%s names no layer of the network (layers: %s)", p.where, b,
        table.concat(sorted_keys(desc), ", "))
    end
    -- a base layer computed from the rec layer would be needed before it is computed
    local seen, stack = {}, {b}
    while #stack > 0 do
      local n = table.remove(stack)
      if n == name then
        fail("%s: base:%s depends on layer '%s' itself (a cycle)", p.where, b, name)
      end
      if not seen[n] and desc[n] then
        seen[n] = true
        local dn = desc[n]
        local fs = dn.class == "rec" and rec_froms(n, dn) or list_of(dn.from or "data")
        for _, f in ipairs(fs) do stack[#stack + 1] = f end
      end
    end
    srcs[#srcs + 1] = b
  end
  return srcs, #froms
end

-- Whether the unit has a layer with a loss (the rec layer then reports it).
function M.has_loss(d)
  if type(d.unit) ~= "table" then return false end
  for _, u in pairs(d.unit) do
    if type(u) == "table" and u.loss ~= nil then return true end
  end
  return false
end

---------------------------------------------------------------------------- construction

-- name, d: the rec layer's name and description; in_dims: the dims of its sources (the from,
-- then the base layers, as M.sources lists them); ext: the network's checked extern_data.
function M.create(name, d, srcs, n_from, in_dims, dtype, ext)
  for k in pairs(d) do
    if not (k == "unit" or k == "max_seq_len" or layers.network_keys[k]) then
      fail("%s: unknown option '%s'", rec_where(name), tostring(k))
    end
  end
  local parsed = parse_unit(name, d)
  if d.loss ~= nil then
    fail("%s: put the loss on a layer of the unit (or on a layer after the rec "
      .. "layer)", rec_where(name))
  end
  local self = setmetatable({name = name, class = "rec", dtype = dtype, n_from = n_from,
    n_in = #srcs, in_dims = {table.unpack(in_dims)}, is_loss = false, ext = ext, units = {},
    order = {}, parsed = parsed, base_index = {}, max_seq_len = d.max_seq_len}, Rec)
  for i = n_from + 1, #srcs do self.base_index[srcs[i]] = i end
  self.source_dim = n_from == 1 and in_dims[1] or nil

  -- declared dims, for prev: reads of layers not made yet
  local function declared(p)
    local u = p.desc
    if u.class == "choice" then
      local t = type(u.target) == "string" and ext[u.target]
      if not t or not t.sparse then
        fail("%s (choice): needs target, a sparse extern_data key (keys: %s)", p.where,
          table.concat(sorted_keys(ext), ", "))
      end
      return t.dim, true
    end
    -- a projected recurrent layer (n_proj) outputs its projection
    if u.n_proj ~= nil then return u.n_proj, false end
    if u.n_out ~= nil then return u.n_out, false end
    if u.class == "attention" and self.base_index[p.base] then
      return in_dims[self.base_index[p.base]], false
    end
    if u.loss ~= nil and type(u.target) == "string" and ext[u.target] then
      return ext[u.target].dim, false
    end
    return nil
  end

  -- same-step order: depth first over same-step sources
  local state = {}
  local function visit(uname, path)
    if state[uname] == "done" then return end
    if state[uname] == "active" then
      fail("%s, unit layer '%s': cycle within a step: %s (read the previous step "
        .. "with prev:)", rec_where(name), uname, table.concat(path, " -> ") .. " -> " .. uname)
    end
    state[uname] = "active"
    local p = parsed[uname]
    path[#path + 1] = uname
    for _, s in ipairs(p.srcs) do if s.kind == "same" then visit(s.name, path) end end
    path[#path] = nil
    state[uname] = "done"
    self.order[#self.order + 1] = uname
  end
  for _, uname in ipairs(sorted_keys(parsed)) do visit(uname, {}) end

  local made = {}
  for _, uname in ipairs(self.order) do
    local p = parsed[uname]
    local u = p.desc
    local in_d, sparse_in = {}, {}
    for k, s in ipairs(p.srcs) do
      local dim, sparse
      if s.kind == "source" then
        if not self.source_dim then
          fail("%s: reads data:source, but the rec layer has no from", p.where)
        end
        dim = self.source_dim
      elseif s.kind == "base" then
        dim = in_dims[self.base_index[s.name]]
      elseif s.kind == "same" then
        dim, sparse = made[s.name].n_out, made[s.name].sparse
      else
        local m = made[s.name]
        if m then
          dim, sparse = m.n_out, m.sparse
        else
          dim, sparse = declared(parsed[s.name])
          if not dim then
            fail("%s: reads %s before it is made; give '%s' an n_out", p.where, s.text, s.name)
          end
        end
      end
      in_d[k], sparse_in[k] = dim, sparse or false
    end
    local unit = {name = uname, desc = u, srcs = p.srcs, where = p.where, in_dims = in_d,
      sparse_in = sparse_in}
    local flags = rl._layer_class_flags(u.class) or 0
    for k, s in ipairs(p.srcs) do
      if sparse_in[k] and flags & 8 == 0 and u.class ~= "choice" then
        fail("%s (class %s): '%s' gives labels (sparse); feed it through an embedding layer",
          p.where, u.class, s.text)
      end
      if not sparse_in[k] and u.class == "embedding" then
        fail("%s (class %s): '%s' is dense; this class takes labels", p.where, u.class, s.text)
      end
    end
    if u.initial_output ~= nil and type(u.initial_output) ~= "number" then
      fail("%s: initial_output must be a number (a label for a choice layer)", p.where)
    end
    unit.initial = u.initial_output or 0
    if u.class == "choice" then
      unit.kind, unit.sparse = "choice", true
      unit.n_out = declared(p)
      unit.target = u.target
      for k in pairs(u) do
        if not (k == "class" or k == "from" or k == "target" or k == "beam_size"
            or k == "initial_output") then
          fail("%s (choice): unknown option '%s'", p.where, tostring(k))
        end
      end
      if #p.srcs ~= 1 or p.srcs[1].kind ~= "same" then
        fail("%s (choice): from must be one layer of the unit at this step (the scores)", p.where)
      end
      if in_d[1] ~= unit.n_out then
        fail("%s (choice): '%s' gives %d scores, target '%s' has %d classes", p.where,
          p.srcs[1].text, in_d[1], u.target, unit.n_out)
      end
      if u.beam_size ~= nil and (math.type(u.beam_size) ~= "integer" or u.beam_size < 1) then
        fail("%s (choice): beam_size must be a positive integer", p.where)
      end
      unit.beam_size = u.beam_size or 1
      if unit.initial ~= math.floor(unit.initial) or unit.initial < 0 or unit.initial >= unit.n_out then
        fail("%s (choice): initial_output must be a label in 0..%d", p.where, unit.n_out - 1)
      end
      -- search decides the labels of one choice; a second one would give nothing there
      if self.choice then
        fail("%s (choice): the unit already has choice layer '%s'; one choice per unit is "
          .. "supported", p.where, self.choice.name)
      end
      self.choice = unit
    elseif u.class == "attention" then
      unit.kind = "attention"
      for k in pairs(u) do
        if not (layers.network_keys[k] or attention.options[k]) then
          fail("%s (attention): unknown option '%s'", p.where, tostring(k))
        end
      end
      if #p.srcs ~= 1 or p.srcs[1].kind == "base" then
        fail("%s (attention): from must be one query (a layer of the unit, prev:x or "
          .. "data:source)", p.where)
      end
      local e_dim = in_dims[self.base_index[parsed[uname].base]]
      unit.base = parsed[uname].base
      unit.obj = attention.new(p.where, u, in_d[1], e_dim, dtype)
      unit.n_out = e_dim
    else
      for k, s in ipairs(p.srcs) do
        if s.kind == "base" then
          fail("%s: reads %s as a from; a unit layer reads the enclosing network through an "
            .. "attention layer", p.where, s.text)
        end
      end
      if u.beam_size ~= nil then
        fail("%s (class %s): beam_size is an option of a choice layer", p.where, u.class)
      end
      local clean = {}
      for k, v in pairs(u) do if not UNIT_KEYS[k] then clean[k] = v end end
      local ok, layer = pcall(layers.create, u.class, name .. "/" .. uname, clean, in_d, dtype,
        u.loss and type(u.target) == "string" and ext[u.target] and {n_out = ext[u.target].dim})
      if not ok then fail("%s, unit layer '%s': %s", rec_where(name), uname, tostring(layer)) end
      unit.obj, unit.n_out = layer, layer.n_out
      -- a recurrent layer (lstm, gru, ...) carries its states from step to step
      unit.kind = layers.has_state(layer) and "recurrent" or "layer"
      if unit.kind == "recurrent" then
        unit.state_names, unit.state_dims = layer:state_names()
        unit.n_states = #unit.state_names
        -- the step objects run one step each: one mask per sequence (or per batch) has no
        -- home there
        for _, opt in ipairs{"rec_dropout", "weight_dropout"} do
          if u[opt] ~= nil and u[opt] ~= 0 then
            fail("%s: %s is not supported inside a unit (one mask per %s over steps run one "
              .. "at a time); use zoneout or dropout on the unit's inputs", p.where, opt,
              opt == "rec_dropout" and "sequence" or "batch")
          end
        end
      end
      -- another object of the same layer (the per-step objects of Rec:step_obj)
      unit.make = function()
        return layers.create(u.class, name .. "/" .. uname, clean, in_d, dtype)
      end
      if unit.kind ~= "layer" and u.direction ~= nil and u.direction ~= 1 then
        fail("%s: direction = %s; inside a unit the %s runs one step at a time, forward in "
          .. "the rec layer's steps (direction = 1)", p.where, tostring(u.direction), u.class)
      end
      if u.loss ~= nil then
        if u.loss ~= "ce" or not layer.is_loss then
          fail("%s: only loss = \"ce\" on a softmax layer is supported inside a unit", p.where)
        end
        local t = type(u.target) == "string" and ext[u.target]
        if not t or not t.sparse or t.dim ~= layer.n_out then
          fail("%s: target '%s' must be a sparse extern_data key with %d classes", p.where,
            tostring(u.target), layer.n_out)
        end
        for _, s in ipairs(p.srcs) do
          if s.kind ~= "same" then
            fail("%s: a loss layer in a unit reads layers of the same step only, not %s", p.where,
              s.text)
          end
        end
        -- the backward over all steps has no scale: refused here, not after a forward that
        -- scaled the loss (and a string or NaN scale failed inside the arithmetic)
        if u.loss_scale ~= nil and u.loss_scale ~= 1 then
          fail("%s: loss_scale inside a unit is not supported, got %s", p.where,
            tostring(u.loss_scale))
        end
        unit.loss, unit.target = true, u.target
      end
    end
    if u.direction ~= nil and u.direction ~= 1 then
      fail("%s: a layer in a unit runs forward in time (direction = 1)", p.where)
    end
    local decl = declared(p)
    if decl and decl ~= unit.n_out then
      fail("%s: n_out is %d, expected %d", p.where, unit.n_out, decl)
    end
    made[uname] = unit
    self.units[#self.units + 1] = unit
  end
  for _, unit in ipairs(self.units) do
    for _, s in ipairs(unit.srcs) do
      local m = made[s.name]
      if m and m.loss and unit.kind ~= "choice" then
        fail("%s: reads the loss layer '%s'; only a choice layer may read a loss layer of the unit",
          unit.where, s.name)
      end
    end
  end
  self.by_name = made
  -- the prev: sources a recurrent layer reads as zeros at the first step (initial output 0):
  -- their products are skipped there (rl_recurrent_set_zero_inputs, layers/layers.h)
  for _, unit in ipairs(self.units) do
    if unit.kind == "recurrent" then
      unit.zero_first = 0
      for k, s in ipairs(unit.srcs) do
        if s.kind == "prev" and not unit.sparse_in[k] and made[s.name].initial == 0 then
          unit.zero_first = unit.zero_first | (1 << (k - 1))
        end
      end
    end
  end
  self.out_unit = made.output
  self.n_out = made.output.n_out
  self.sparse_out = made.output.sparse
  self.losses = {}
  for _, unit in ipairs(self.units) do
    if unit.loss then self.losses[#self.losses + 1] = unit end
  end
  -- Layers outside the recurrence run once over all steps in forward and backward (one large
  -- product instead of S small ones), as the loss layers do: plain layers that read only this
  -- step's layers or data:source and that nothing in the step loop reads, directly or through
  -- other layers. The loop needs the stateful layers (recurrent, attention), whatever is read
  -- through prev: (but a choice: in training its labels are the targets), and their same-step
  -- sources.
  local need, stack = {}, {}
  for _, unit in ipairs(self.units) do
    if unit.kind == "recurrent" or unit.kind == "attention" then
      stack[#stack + 1] = unit
    end
    for _, src in ipairs(unit.srcs) do
      local m = src.kind == "prev" and made[src.name]
      if m and m.kind ~= "choice" then stack[#stack + 1] = m end
    end
  end
  while #stack > 0 do
    local unit = table.remove(stack)
    if not need[unit] then
      need[unit] = true
      for _, src in ipairs(unit.srcs) do
        if src.kind == "same" then stack[#stack + 1] = made[src.name] end
      end
    end
  end
  for _, unit in ipairs(self.units) do
    local plain = unit.kind == "layer" and not unit.loss and not need[unit]
    for _, src in ipairs(unit.srcs) do
      plain = plain and (src.kind == "same" or src.kind == "source")
    end
    unit.hoisted = plain
  end
  self.target = (self.losses[1] and self.losses[1].target) or (self.choice and self.choice.target)
  for _, unit in ipairs(self.units) do
    if unit.target and unit.target ~= self.target then
      fail("%s: target '%s' differs from the unit's other target '%s'", unit.where, unit.target,
        self.target)
    end
  end
  self.num_params = 0
  for _, spec in ipairs(self:params()) do self.num_params = self.num_params + spec.numel end
  return self
end

---------------------------------------------------------------------------- parameters

local Size = debug.getregistry()["rnnlua.Size"]

function Rec:params()
  local list = {}
  for _, unit in ipairs(self.units) do
    if unit.kind == "attention" then
      for _, s in ipairs(unit.obj:param_specs()) do
        local numel = 1
        for _, n in ipairs(s.shape) do numel = numel * n end
        local fan_in = 1
        for dd = 1, #s.shape - 1 do fan_in = fan_in * s.shape[dd] end
        list[#list + 1] = {name = unit.name .. "." .. s.name, shape = setmetatable(
          {table.unpack(s.shape)}, Size), numel = numel, init = s.init, init_scale = 1,
          fan_in = fan_in, fan_out = s.shape[#s.shape]}
      end
    elseif unit.obj then
      for _, pr in ipairs(unit.obj:params()) do
        pr.name = unit.name .. "." .. pr.name
        list[#list + 1] = pr
      end
    end
  end
  return list
end

function Rec:bind(values, grads, offset)
  self.device = values:device()
  for _, unit in ipairs(self.units) do
    if unit.kind == "attention" then
      local a = unit.obj
      for _, s in ipairs(a:param_specs()) do
        local numel = 1
        for _, n in ipairs(s.shape) do numel = numel * n end
        a.params[s.name] = values:narrow(1, offset + 1, numel):view(s.shape)
        a.grads[s.name] = grads:narrow(1, offset + 1, numel):view(s.shape)
        offset = offset + numel
      end
    elseif unit.obj then
      unit.bound = {values, grads, offset}
      for _, c in pairs(unit.clones or {}) do c:bind(values, grads, offset) end
      offset = unit.obj:bind(values, grads, offset)
    end
  end
  return offset
end

function Rec:init_params()
  for _, unit in ipairs(self.units) do
    if unit.kind == "attention" then
      for _, s in ipairs(unit.obj:param_specs()) do
        local v = unit.obj.params[s.name]
        local fan_in = 1
        for dd = 1, #s.shape - 1 do fan_in = fan_in * s.shape[dd] end
        rl._param_init(v, s.init, 1, fan_in, s.shape[#s.shape], s.name)
      end
    elseif unit.obj then
      unit.obj:init_params()
    end
  end
end

---------------------------------------------------------------------------- buffers

-- buf when it is (S, B, F) of the rec layer's dtype and device, else a new zeroed one.
local function ensure(buf, dtype, device, ...)
  local shape = {...}
  if buf and buf:dim() == #shape and buf:dtype() == dtype and buf:device() == device then
    local same = true
    for i, n in ipairs(shape) do if buf:size(i) ~= n then same = false end end
    if same then return buf end
  end
  return rl.zeros(shape, dtype, device)
end

function Rec:size_buffers(S, B, search)
  local dt, dev = self.dtype, self.device or "cpu"
  for _, unit in ipairs(self.units) do
    if unit.sparse then
      unit.out = ensure(unit.out, "int32", "cpu", S, B)
      unit.init_buf = ensure(unit.init_buf, "int32", "cpu", 1, B)
    else
      unit.out = ensure(unit.out, dt, dev, S, B, unit.n_out)
      unit.grad = ensure(unit.grad, dt, dev, S, B, unit.n_out)
      unit.init_buf = ensure(unit.init_buf, dt, dev, 1, B, unit.n_out)
    end
    unit.init_buf:fill_(unit.initial)
    if unit.kind == "recurrent" then
      -- per state: zeros for step 1; beyond the first (the output): its rows over the steps and
      -- its running gradient in backward
      unit.zero_states, unit.states, unit.dstates =
        unit.zero_states or {}, unit.states or {}, unit.dstates or {}
      for k, d in ipairs(unit.state_dims) do
        unit.zero_states[k] = ensure(unit.zero_states[k], dt, dev, B, d)
        if k > 1 then
          unit.states[k] = ensure(unit.states[k], dt, dev, S, B, d)
          unit.dstates[k] = ensure(unit.dstates[k], dt, dev, B, d)
        end
      end
      -- the gates of every step in one buffer, row t the gates buffer of step t's object
      -- (Rec:run_unit), for the weight gradients over all steps (Rec:weight_grads); not for
      -- a search, which has no backward
      if M.defer_weight_grads and not search and dev == "cpu" then
        unit.dz = ensure(unit.dz, dt, dev, S, B, unit.obj:_gates_cols())
        if unit.dz_rows_of ~= unit.dz then
          unit.dz_rows, unit.dz_rows_of = {}, unit.dz
          for t = 1, S do unit.dz_rows[t] = unit.dz:narrow(1, t, 1) end
        end
      else
        unit.dz, unit.dz_rows, unit.dz_rows_of = nil, nil, nil
      end
    end
    if unit.loss then
      unit.loss_gin = unit.loss_gin or {}
      for k in ipairs(unit.srcs) do
        unit.loss_gin[k] = ensure(unit.loss_gin[k], dt, dev, S, B, unit.in_dims[k])
      end
    end
    if unit.hoisted then -- input gradients over all steps (none for labels)
      unit.whole_gin = unit.whole_gin or {}
      for k in ipairs(unit.srcs) do
        unit.whole_gin[k] = not unit.sparse_in[k]
          and ensure(unit.whole_gin[k] or nil, dt, dev, S, B, unit.in_dims[k])
      end
    end
    unit.gin = unit.gin or {}
    -- at the first step a prev: source is the initial output, a constant: its gradient goes
    -- nowhere, so the layer is not asked for it (an lstm then skips that input's product)
    unit.gin_first = unit.gin_first or {}
    for k, s in ipairs(unit.srcs) do
      if unit.sparse_in[k] or unit.kind == "choice" then
        unit.gin[k] = false
      else
        unit.gin[k] = ensure(unit.gin[k] or nil, dt, dev, 1, B, unit.in_dims[k])
      end
      unit.gin_first[k] = s.kind ~= "prev" and unit.gin[k]
    end
  end
  if not self.ones or self.ones:size(1) ~= B then self.ones = rl.ones({B}, "int32") end
end

---------------------------------------------------------------------------- forward

-- The (1, B, F) input of unit source s at step t (1-based) for a unit layer.
function Rec:step_input(s, t)
  if s.kind == "source" then return self.source:narrow(1, t, 1) end
  local src = self.by_name[s.name]
  if s.kind == "same" then return src.out:narrow(1, t, 1) end
  if t == 1 then return src.init_buf end
  return src.out:narrow(1, t - 1, 1)
end

-- The most steps that get a layer object each (see Rec:step_obj); longer runs re-run each step's
-- forward in backward.
M.max_step_objects = 64

-- Whether the step objects of a recurrent layer share their packed weights (packed once per pass
-- for all steps, layers/recurrent.h "Packed operands"); false: each step object packs its own,
-- once per pass too, so once per step (the tests compare the two: the same numbers).
M.share_packs = true

-- Whether the weight gradients of a recurrent layer in the unit are made once per backward over
-- all steps (Rec:weight_grads: one product with S*B rows per weight matrix) rather than by each
-- step's backward (B rows each); CPU only. false: the per-step products, which the tests compare
-- with (the same gradients up to the order of the sums).
M.defer_weight_grads = true

-- The current pass of the step loops (Rec:new_pass).
local passes = 0

-- The layer object of `unit` that runs step t. In forward (where a backward may follow; not in
-- search) with at most M.max_step_objects steps, every step has its own object sharing
-- unit.obj's parameters (made on first use, kept), so that backward through time finds each
-- step's activations where that step left them. Otherwise unit.obj runs every step and backward
-- re-runs each step's forward before its backward (self.stepwise false).
function Rec:step_obj(unit, t)
  if t == 1 or not self.stepwise then return unit.obj end
  local clones = unit.clones or {}
  unit.clones = clones
  local c = clones[t]
  if not c then
    c = unit.make()
    c:bind(table.unpack(unit.bound))
    if unit.kind == "recurrent" then
      if M.share_packs then c:_share_packs(unit.obj) else c:_set_pack_pass(passes) end
    end
    clones[t] = c
  end
  return c
end

-- A new pass of the step loop (a forward, a backward, a search): the parameters may have changed
-- since the last one, so the recurrent layers' step objects pack their weights anew, once for all
-- steps of the pass (layers/recurrent.h, "Packed operands"); shared packs take the pass once.
function Rec:new_pass()
  passes = passes + 1
  for _, unit in ipairs(self.units) do
    if unit.kind == "recurrent" then
      unit.obj:_set_pack_pass(passes)
      if not M.share_packs then
        for _, c in pairs(unit.clones or {}) do c:_set_pack_pass(passes) end
      end
    end
  end
end

-- Runs unit layer `unit` at step t; returns its (1, B, F) output (not yet stored, except an
-- attention layer's).
function Rec:run_unit(unit, t, train)
  local ins = unit.ins or {}
  unit.ins = ins
  for k, s in ipairs(unit.srcs) do ins[k] = self:step_input(s, t) end
  if unit.kind == "attention" then -- writes its row of unit.out itself
    unit.obj:forward_step(t, ins[1]:select(1, 1), unit.out:select(1, t))
    return unit.out:narrow(1, t, 1)
  end
  local obj = self:step_obj(unit, t)
  -- the object of step 1 may run other steps too (search, the re-run path)
  if unit.zero_first and unit.zero_first ~= 0 and obj == unit.obj then
    obj:_set_zero_inputs(t == 1 and unit.zero_first or 0)
  end
  if unit.kind == "recurrent" then
    obj:_set_gates(unit.dz_rows and unit.dz_rows[t] or nil)
    -- the previous step's states: its output, then the others' rows
    local init = unit.init_states or {}
    unit.init_states = init
    for k = 1, unit.n_states do
      local rows = k == 1 and unit.out or unit.states[k]
      init[k] = t == 1 and unit.zero_states[k] or rows:select(1, t - 1)
    end
    obj:set_initial_state(table.unpack(init, 1, unit.n_states))
  end
  local ok, out = pcall(obj.forward, obj, ins, self.ones, train)
  if not ok then fail("%s, unit layer '%s', step %d: %s", rec_where(self.name), unit.name, t,
      tostring(out)) end
  return out
end

-- Runs unit layer `unit` at step t and keeps its output (and a recurrent layer's other states)
-- as row t.
function Rec:store_unit(unit, t, train)
  local out = self:run_unit(unit, t, train)
  if unit.kind ~= "attention" then unit.out:narrow(1, t, 1):copy_(out) end
  if unit.kind == "recurrent" and unit.n_states > 1 then
    local final = {self:step_obj(unit, t):final_state()}
    for k = 2, unit.n_states do unit.states[k]:select(1, t):copy_(final[k]) end
  end
end

-- Whether unit runs in the step loop of forward and backward (loss layers and choices are
-- handled apart in training, the layers outside the recurrence always).
local function in_loop(unit, teacher)
  if unit.hoisted then return false end
  if teacher then return not unit.loss and unit.kind ~= "choice" end
  return true
end

-- The (S, B, F) input of unit source s over all steps, for layers run once over all steps.
function Rec:whole_input(s)
  if s.kind == "source" then return self.source end
  return self.by_name[s.name].out
end

-- The number of steps, their lengths and the target (S, B) int32 (or nil) of a batch.
function Rec:steps_of(inputs, geom, batch)
  local key = self.target
  local y = key and batch and batch[key]
  if y then
    local len = batch["lengths_" .. key]
    if len then
      local lo, hi = len:min(), len:max()
      if lo < 1 then
        fail("%s: target '%s' has an empty sequence (lengths_%s = %d); a decoder "
          .. "needs at least one label (end-of-sequence)", rec_where(self.name), key, key, lo)
      end
      return hi, len, y:narrow(1, 1, hi)
    end
    return y:size(1), geom, y
  end
  if self.source then return self.source:size(1), geom, nil end
  if self.choice then
    fail("%s, unit layer '%s': a choice without a target in the batch needs search "
      .. "(net:search), or give target '%s'", rec_where(self.name), self.choice.name, key)
  end
  fail("%s: nothing gives the number of steps: no target and no from "
    .. "(data:source)", rec_where(self.name))
end

-- forward(inputs, geom, train, batch) -> out [, loss, errors, frames]
function Rec:forward(inputs, geom, train, batch)
  self.forwarded = false
  self.source = self.n_from == 1 and inputs[1] or nil
  self.inputs = inputs
  local B = geom:size(1)
  self.B = B
  local S, len, y = self:steps_of(inputs, geom, batch)
  if self.source and self.source:size(1) ~= S then
    fail("%s: the unit reads data:source (%d frames) but runs %d steps (target '%s')",
      rec_where(self.name), self.source:size(1), S, tostring(self.target))
  end
  self.S, self.len, self.train = S, len, train
  self:size_buffers(S, B)
  local teacher = y ~= nil
  self.teacher = teacher
  self.stepwise = S <= M.max_step_objects
  if teacher then
    -- labels of padded frames become 0: they are read (as prev:) but never matter
    local V = self.ext[self.target].dim
    local yc = y:clone()
    local lens = len:totable()
    for b = 1, B do
      if lens[b] < S then yc:narrow(1, lens[b] + 1, S - lens[b]):select(2, b):fill_(0) end
    end
    if yc:min() < 0 or yc:max() >= V then
      for t, row in ipairs(yc:totable()) do
        for b, v in ipairs(row) do
          if v < 0 or v >= V then
            fail("%s, unit layer '%s': label %d at step %d of sequence %d is "
              .. "outside 0..%d (target '%s')", rec_where(self.name), (self.choice or self.losses[1]).name,
              v, t, b, V - 1, self.target)
          end
        end
      end
    end
    self.labels = yc
    if self.choice then self.choice.out:copy_(yc) end
  end
  for _, unit in ipairs(self.units) do
    if unit.kind == "attention" then
      local e = inputs[self.base_index[unit.base]]
      unit.obj:start(e, geom, S)
    end
  end
  self.rng_states = self.rng_states or {}
  self:new_pass()
  for t = 1, S do
    self.rng_states[t] = rl.get_rng_state()
    for _, unit in ipairs(self.units) do
      if in_loop(unit, teacher) then
        if unit.kind == "choice" then
          fail("%s, unit layer '%s': a choice without a target in the batch needs "
            .. "search (net:search)", rec_where(self.name), unit.name)
        end
        self:store_unit(unit, t, train)
      end
    end
  end
  for _, unit in ipairs(self.units) do
    if unit.hoisted then
      local ins = {}
      for k, s in ipairs(unit.srcs) do ins[k] = self:whole_input(s) end
      local ok, out = pcall(unit.obj.forward, unit.obj, ins, len, train)
      if not ok then fail("%s, unit layer '%s': %s", rec_where(self.name), unit.name,
          tostring(out)) end
      unit.out:copy_(out)
    end
  end
  local loss, errors, frames = 0, 0, nil
  for _, unit in ipairs(self.losses) do
    local ins = {}
    for k, s in ipairs(unit.srcs) do ins[k] = self.by_name[s.name].out end
    local ok, out, l, e, f = pcall(unit.obj.forward, unit.obj, ins, len, train, y)
    if not ok then fail("%s, unit layer '%s': %s", rec_where(self.name), unit.name, tostring(out)) end
    unit.out:copy_(out)
    loss, errors = loss + l, errors + e
    frames = frames or f
  end
  self.rng_after = rl.get_rng_state()
  self.forwarded = true
  self.out_len = len
  self.has_loss = #self.losses > 0 and teacher
  return self.out_unit.out, loss, errors, frames
end

function Rec:out_geometry() return self.out_len end

---------------------------------------------------------------------------- backward

-- Adds g (1, B, F) into the gradient of source s read at step t.
function Rec:route(s, t, g)
  if s.kind == "source" then
    if self.dsource then self.dsource:narrow(1, t, 1):add_(g) end
  elseif s.kind == "same" then
    self.by_name[s.name].grad:narrow(1, t, 1):add_(g)
  elseif t > 1 then
    self.by_name[s.name].grad:narrow(1, t - 1, 1):add_(g)
  end
end

function Rec:backward(grad_out, grad_in)
  if not self.forwarded then
    fail("%s: backward needs a forward before it (once per forward)", rec_where(self.name))
  end
  self.forwarded = false
  local S, B, teacher = self.S, self.B, self.teacher
  for _, unit in ipairs(self.units) do
    if unit.grad then unit.grad:zero_() end
    for _, d in pairs(unit.dstates or {}) do d:zero_() end
    if unit.kind == "attention" then unit.obj:zero_grad_acc() end
  end
  self.dsource = self.n_from == 1 and grad_in[1] or nil
  if self.dsource then self.dsource:zero_() end
  if grad_out then
    if self.sparse_out then
      fail("%s: its output is labels (unit layer 'output' is a choice) and takes "
        .. "no gradient", rec_where(self.name))
    end
    self.out_unit.grad:add_(grad_out)
  end
  -- the loss layers, over all steps at once
  for _, unit in ipairs(self.losses) do
    local gin = unit.loss_gin
    local ok, err = pcall(function()
      unit.obj:backward(nil, gin)
    end)
    if not ok then fail("%s, unit layer '%s': %s", rec_where(self.name), unit.name, tostring(err)) end
    for k, s in ipairs(unit.srcs) do self.by_name[s.name].grad:add_(gin[k]) end
  end
  -- the layers outside the recurrence, over all steps at once, readers before what they read
  for i = #self.units, 1, -1 do
    local unit = self.units[i]
    if unit.hoisted then
      local gin = unit.whole_gin
      local ok, err = pcall(unit.obj.backward, unit.obj, unit.grad, gin)
      if not ok then fail("%s, unit layer '%s': %s", rec_where(self.name), unit.name,
          tostring(err)) end
      for k, s in ipairs(unit.srcs) do
        if gin[k] then
          if s.kind == "source" then
            if self.dsource then self.dsource:add_(gin[k]) end
          else
            self.by_name[s.name].grad:add_(gin[k])
          end
        end
      end
    end
  end
  self:new_pass()
  for t = S, 1, -1 do
    -- re-run step t so that every layer object holds that step's activations (after the
    -- forward they hold the last step's already)
    rl.set_rng_state(self.rng_states[t])
    for _, unit in ipairs(self.units) do
      if in_loop(unit, teacher) and unit.kind ~= "attention" and t < S and not self.stepwise then
        self:run_unit(unit, t, self.train)
      elseif unit.kind == "attention" then
        local ins = unit.ins or {}
        unit.ins = ins
        ins[1] = self:step_input(unit.srcs[1], t)
      end
    end
    for i = #self.units, 1, -1 do
      local unit = self.units[i]
      if in_loop(unit, teacher) then
        local g = unit.grad:narrow(1, t, 1)
        if unit.kind == "attention" then
          local dq = unit.obj:backward_step(t, unit.ins[1]:select(1, 1), g:select(1, 1))
          self:route(unit.srcs[1], t, dq:view(1, B, unit.in_dims[1]))
        else
          local obj = self:step_obj(unit, t)
          if unit.kind == "recurrent" and unit.n_states > 1 then -- the output's comes as g
            obj:set_final_state_grad(nil, table.unpack(unit.dstates, 2, unit.n_states))
          end
          local gin = t == 1 and unit.gin_first or unit.gin
          local ok, err = pcall(obj.backward, obj, g, gin)
          if not ok then fail("%s, unit layer '%s', step %d: %s", rec_where(self.name),
              unit.name, t, tostring(err)) end
          if unit.kind == "recurrent" then
            -- the first state's gradient flows to the previous step's output (= that state),
            -- the others' to the step before through dstates
            local d0 = {obj:initial_state_grad()}
            for k = 2, unit.n_states do unit.dstates[k]:copy_(d0[k]) end
            if t > 1 then unit.grad:select(1, t - 1):add_(d0[1]) end
          end
          for k, s in ipairs(unit.srcs) do
            if gin[k] then self:route(s, t, gin[k]) end
          end
        end
      end
    end
  end
  for _, unit in ipairs(self.units) do
    if unit.dz then self:weight_grads(unit) end
  end
  rl.set_rng_state(self.rng_after)
  for i = self.n_from + 1, self.n_in do
    if grad_in[i] then grad_in[i]:zero_() end
  end
  for _, unit in ipairs(self.units) do
    if unit.kind == "attention" then
      local gi = grad_in[self.base_index[unit.base]]
      if gi then unit.obj:finish_backward(gi) end
    end
  end
end

-- The weight gradients of recurrent unit layer `unit` over all steps, after the backward
-- steps (whose objects leave them out: their gates buffers are the rows of unit.dz, which holds
-- every step's gate gradients afterwards): W_k's += X_k^T dZ and U's += Hprev^T dZ, each one
-- product over the S*B rows of whole-sequence buffers, as the plain lstm layer makes them over
-- T*B rows. Step t reads a prev: source and its previous state from row t - 1 of their outputs,
-- so those products pair rows 1..S-1 with dZ's rows 2..S; step 1's rows are left out where the
-- step read zeros (the zero state; a prev: source with initial output 0, unit.zero_first), and a
-- nonzero initial output gets its own product with step 1's rows. Padded steps of a ragged batch
-- have dZ = 0 (nothing reads them), so they add nothing.
function Rec:weight_grads(unit)
  local S, dz, obj = self.S, unit.dz, unit.obj
  local later = S > 1 and dz:narrow(1, 2, S - 1)
  for k, s in ipairs(unit.srcs) do
    if s.kind == "prev" then
      if later then obj:_weight_grads(k, self.by_name[s.name].out:narrow(1, 1, S - 1), later) end
      if (unit.zero_first or 0) & (1 << (k - 1)) == 0 then
        obj:_weight_grads(k, self.by_name[s.name].init_buf, unit.dz_rows[1])
      end
    else
      local x = self:whole_input(s)
      if not x:is_contiguous() then x = x:contiguous() end
      obj:_weight_grads(k, x, dz)
    end
  end
  if later then obj:_weight_grads(0, unit.out:narrow(1, 1, S - 1), later) end
end

---------------------------------------------------------------------------- search

-- max_seq_len as a string: an arithmetic expression of the input length T, such as
-- "2 * T + 3" or "math.max(T, 10)". It is stored in checkpoints, so it is parsed here and never
-- compiled as Lua: loading a model must not run what a crafted file put there (Lua's load with
-- an empty environment still runs loops). Grammar:
--   expr = term {("+" | "-") term};  term = unary {("*" | "/" | "//" | "%") unary}
--   unary = ("-" | "+") unary | power;  power = atom ["^" unary]
--   atom = number | "T" | func "(" expr {"," expr} ")" | "(" expr ")"
-- func: floor, ceil, min, max, abs (also as math.floor, ...). Evaluation is a fixed tree walk:
-- its time is bounded by the string's length (at most 256 characters, nesting 32 deep).
local EXPR_FUNCS = {floor = math.floor, ceil = math.ceil, min = math.min, max = math.max,
  abs = math.abs}
local EXPR_BINOPS = {
  ["+"] = function(a, b) return a + b end, ["-"] = function(a, b) return a - b end,
  ["*"] = function(a, b) return a * b end, ["/"] = function(a, b) return a / b end,
  ["//"] = function(a, b) return math.floor(a / b) end,
  ["%"] = function(a, b) return a - math.floor(a / b) * b end,
  ["^"] = function(a, b) return a ^ b end,
}

-- Returns f(T) for the expression s, or raises "who: max_seq_len '...': what".
function M.length_expr(s, who)
  local function bad(fmt, ...)
    fail("%s: max_seq_len '%s': %s", who, s, string.format(fmt, ...))
  end
  if #s > 256 then fail("%s: max_seq_len: an expression of at most 256 characters, got %d", who, #s) end
  -- tokens: numbers, names (with one "math." prefix allowed), operators, parentheses, commas
  local toks, i = {}, 1
  while i <= #s do
    local c = s:sub(i, i)
    if c:match("%s") then
      i = i + 1
    elseif c:match("[%d%.]") then
      local num = s:match("^%d*%.?%d*[eE][%+%-]?%d+", i) or s:match("^%d*%.?%d*", i)
      local v = tonumber(num)
      if not v then bad("'%s' at character %d is not a number", num, i) end
      toks[#toks + 1] = {k = "num", v = v, at = i}
      i = i + #num
    elseif c:match("[%a_]") then
      local name = s:match("^[%a_][%w_]*", i)
      local at = i
      i = i + #name
      if name == "math" and s:sub(i, i) == "." then
        name = s:match("^[%a_][%w_]*", i + 1) or ""
        i = i + 1 + #name
        if not EXPR_FUNCS[name] then
          bad("unknown name 'math.%s' at character %d (functions: floor, ceil, min, max, abs)",
            name, at)
        end
      elseif name ~= "T" and not EXPR_FUNCS[name] then
        bad("unknown name '%s' at character %d (T is the input length; functions: floor, "
          .. "ceil, min, max, abs)", name, at)
      end
      toks[#toks + 1] = {k = name == "T" and "T" or "fn", v = name, at = at}
    else
      local op = s:sub(i, i + 1) == "//" and "//" or c
      if not (EXPR_BINOPS[op] or op == "(" or op == ")" or op == ",") then
        bad("unexpected '%s' at character %d", op, i)
      end
      toks[#toks + 1] = {k = op, at = i}
      i = i + #op
    end
  end
  toks[#toks + 1] = {k = "end", at = #s + 1}

  local pos, depth = 1, 0
  local function peek() return toks[pos].k end
  local function take(k)
    local t = toks[pos]
    if t.k ~= k then
      bad("expected %s at character %d, got %s", k == "end" and "the end" or ("'" .. k .. "'"),
        t.at, t.k == "end" and "the end"
        or ("'" .. (t.v and tostring(t.v) or t.k) .. "'"))
    end
    pos = pos + 1
    return t
  end
  local expr
  local function nest()
    depth = depth + 1
    if depth > 32 then bad("nested more than 32 deep") end
  end
  local function atom()
    local t = toks[pos]
    if t.k == "num" then
      pos = pos + 1
      local v = t.v
      return function() return v end
    elseif t.k == "T" then
      pos = pos + 1
      return function(T) return T end
    elseif t.k == "fn" then
      pos = pos + 1
      take("(")
      nest()
      local args = {expr()}
      while peek() == "," do
        pos = pos + 1
        args[#args + 1] = expr()
      end
      take(")")
      depth = depth - 1
      local f, name = EXPR_FUNCS[t.v], t.v
      if name ~= "min" and name ~= "max" and #args ~= 1 then
        bad("%s takes one argument, got %d", name, #args)
      end
      return function(T)
        local v = {}
        for k, a in ipairs(args) do v[k] = a(T) end
        return f(table.unpack(v))
      end
    elseif t.k == "(" then
      pos = pos + 1
      nest()
      local e = expr()
      take(")")
      depth = depth - 1
      return e
    end
    bad("expected a number, T, a function or '(' at character %d, got %s", t.at,
      t.k == "end" and "the end" or ("'" .. (t.v and tostring(t.v) or t.k) .. "'"))
  end
  local unary
  local function power()
    local a = atom()
    if peek() == "^" then
      pos = pos + 1
      local b, f = unary(), EXPR_BINOPS["^"]
      return function(T) return f(a(T), b(T)) end
    end
    return a
  end
  unary = function()
    local k = peek()
    if k == "-" or k == "+" then
      pos = pos + 1
      nest()
      local a = unary()
      depth = depth - 1
      if k == "+" then return a end
      return function(T) return -a(T) end
    end
    return power()
  end
  local function chain(sub, ops)
    return function()
      local a = sub()
      while ops[peek()] do
        local f = EXPR_BINOPS[peek()]
        pos = pos + 1
        local l, r = a, sub()
        a = function(T) return f(l(T), r(T)) end
      end
      return a
    end
  end
  local term = chain(unary, {["*"] = true, ["/"] = true, ["//"] = true, ["%"] = true})
  expr = chain(term, {["+"] = true, ["-"] = true})
  local e = expr()
  take("end")
  return e
end

-- The step limit of each sequence: max_seq_len is a number, a function of the input length, or
-- a string expression of T (M.length_expr).
function Rec:limits(geom, max_seq_len)
  local f = max_seq_len
  local where = string.format("%s, unit layer '%s'", rec_where(self.name), self.choice.name)
  if f == nil then
    fail("%s: search needs max_seq_len (a number, a function of the input length T, or an "
      .. "expression of T such as \"2 * T + 3\")", where)
  end
  if type(f) == "string" then f = M.length_expr(f, where) end
  local lim = {}
  for b, T in ipairs(geom:totable()) do
    local n = type(f) == "function" and f(T) or f
    if type(n) ~= "number" or n ~= n or n == math.huge or n == -math.huge then
      fail("%s: max_seq_len gave %s for input length %d", where, tostring(n), T)
    end
    n = math.floor(n)
    if math.type(n) ~= "integer" then
      fail("%s: max_seq_len gave %.17g steps for input length %d, beyond any buffer", where, n, T)
    end
    if n <= 0 then
      fail("%s: max_seq_len must be >= 1, got %d for input length %d", where, n, T)
    end
    lim[b] = n
  end
  return lim
end

-- Beam search over the choice layer: inputs and geom as in forward (no target needed).
-- opts: beam_size (default the choice's), eos (the end-of-sequence label, default 0),
-- max_seq_len (default the rec layer's), length_norm (default false). Returns one entry per
-- sequence: {labels = {...} (without the end label), score, logp, steps, rows, hyps = {...}
-- (the same for each hypothesis of the final beam, best first)}: logp the sum of
-- log-probabilities (with the end label's), steps the steps the hypothesis ran (its labels,
-- plus 1 when it ended with eos), rows[t] the row of the (S, B * K, ...) step buffers that
-- computed its step t (rec:attention_weights(name)[t][rows[t]] are its weights at step t),
-- score = logp, or logp / steps with length_norm (the division by length of RETURNN's
-- length_normalization, applied to the final beam; the pruning step by step always compares
-- summed log-probabilities). Hypotheses that
-- reach max_seq_len stop there unfinished. Beam size 1 is greedy decoding.
-- opts.lm = {file = ARPA | model = a char LM checkpoint, weight =, bonus =, labels =,
-- word_boundary =} (lua/rnnlua/lm.lua): shallow fusion, each label adding weight log p_lm +
-- bonus to the ranking score (eos: log p(</s>), after a pending word of a word LM); score is
-- then the fused score and logp stays the model's own.
function Rec:search(inputs, geom, opts)
  opts = opts or {}
  local choice = self.choice
  if not choice then
    fail("%s: search needs a choice layer in the unit", rec_where(self.name))
  end
  local where = string.format("%s, unit layer '%s'", rec_where(self.name), choice.name)
  local K = opts.beam_size or choice.beam_size
  if math.type(K) ~= "integer" or K < 1 then
    fail("%s: beam_size must be a positive integer, got %s", where, tostring(K))
  end
  -- hypotheses are rows of int32 index tensors; B * K must not wrap (a crafted checkpoint's
  -- beam_size of 2^62 would make it 0 for 4 sequences) nor exceed those
  if K > INT32_MAX // math.max(geom:size(1), 1) then
    fail("%s: beam_size %d for %d sequences gives more than %d hypotheses", where, K,
      geom:size(1), INT32_MAX)
  end
  local V = choice.n_out
  local eos = opts.eos or 0
  if math.type(eos) ~= "integer" or eos < 0 or eos >= V then
    fail("%s: eos must be a label in 0..%d, got %s", where, V - 1, tostring(eos))
  end
  local norm = opts.length_norm
  if norm ~= nil and type(norm) ~= "boolean" then
    fail("%s: length_norm must be true or false, got %s", where, tostring(norm))
  end
  local lim = self:limits(geom, opts.max_seq_len or self.max_seq_len)
  local B = geom:size(1)
  -- shallow fusion: the ranking score adds the LM's weight log p + bonus of each label
  local scorer = opts.lm ~= nil and lmod.scorer(lmod.resolve(opts.lm, V, eos, where), V, eos)
  local BK = B * K
  local S = 0
  for _, n in ipairs(lim) do S = math.max(S, n) end
  -- every sequence K times: hypothesis k of sequence b is row (b - 1) * K + k (made in C: a
  -- Lua list of B * K numbers took 19 s to run out of memory for a beam of 2^30)
  local okr, rep_idx = pcall(function() return rl.arange(BK, "int32") / K + 1 end)
  if not okr then
    fail("%s: beam_size %d for %d sequences (%d hypotheses): %s", where, K, B, BK,
      util.strip_internal(rep_idx))
  end
  local glen = geom:index_select(1, rep_idx)
  self.B, self.S, self.train, self.teacher = BK, S, false, false
  self.stepwise = false
  self.source = self.n_from == 1 and inputs[1]:index_select(2, rep_idx) or nil
  if self.source and self.source:size(1) < S then
    fail("%s: the unit reads data:source (%d frames), max_seq_len allows %d steps", where,
      self.source:size(1), S)
  end
  -- buffers for the longest allowed search: a huge max_seq_len fails here, named
  local okb, errb = pcall(function()
    self:size_buffers(S, BK, true)
    for _, unit in ipairs(self.units) do
      if unit.kind == "attention" then
        unit.obj:start(inputs[self.base_index[unit.base]]:index_select(2, rep_idx), glen, S)
      end
    end
  end)
  if not okb then
    fail("%s: buffers for max_seq_len = %d steps of %d hypotheses (batch %d x beam %d): %s",
      where, S, BK, B, K, util.strip_internal(errb))
  end
  local score, done, am = {}, {}, {} -- am: the model's own log-probability (score without LM)
  for i = 1, BK do score[i], done[i] = (i - 1) % K == 0 and 0 or -math.huge, false end
  for i = 1, BK do am[i] = score[i] end
  local lm_state = scorer and scorer.init(BK)
  local back, labels = {}, {}
  local src = self.by_name[choice.srcs[1].name]
  self:new_pass()
  for t = 1, S do
    for _, unit in ipairs(self.units) do
      if unit.kind ~= "choice" then self:store_unit(unit, t, false) end
    end
    local logp = src.out:select(1, t):clamp(1e-30, 1):log():to{dtype = "float64",
      device = "cpu"}:totable()
    local origin, lab = {}, {}
    local ext = scorer and scorer.ext(lm_state)
    local new_am = {}
    for b = 1, B do
      -- the K best extensions of sequence b's hypotheses; a finished one extends only by
      -- itself (label eos, no cost)
      local cand = {}
      for k = 1, K do
        local i = (b - 1) * K + k
        if score[i] > -math.huge then
          if done[i] or t > lim[b] then
            cand[#cand + 1] = {score[i], i, eos, true, am[i]}
          else
            local row, e = logp[i], ext and ext[i]
            for v = 1, V do
              local s = score[i] + row[v]
              if e then s = s + e[v] end
              cand[#cand + 1] = {s, i, v - 1, v - 1 == eos, am[i] + row[v]}
            end
          end
        end
      end
      table.sort(cand, function(x, y)
        if x[1] ~= y[1] then return x[1] > y[1] end
        if x[2] ~= y[2] then return x[2] < y[2] end
        return x[3] < y[3]
      end)
      for k = 1, K do
        local i = (b - 1) * K + k
        local c = cand[k]
        if c then
          origin[i], lab[i] = c[2], c[3]
          score[i], done[i], new_am[i] = c[1], c[4] or (t >= lim[b]), c[5]
        else
          origin[i], lab[i], score[i], done[i], new_am[i] = i, eos, -math.huge, true, -math.huge
        end
      end
    end
    am = new_am
    if scorer then lm_state = scorer.advance(lm_state, origin, lab, done) end
    back[t], labels[t] = origin, lab
    -- the chosen hypotheses' states become row t
    local idx = rl.tensor(origin, "int32")
    for _, unit in ipairs(self.units) do
      if unit.kind ~= "choice" then
        local row = unit.out:select(1, t)
        row:copy_(row:index_select(1, idx))
        for k = 2, unit.n_states or 0 do
          local c = unit.states[k]:select(1, t)
          c:copy_(c:index_select(1, idx))
        end
      end
    end
    choice.out:select(1, t):copy_(rl.tensor(lab, "int32"))
    local all = true
    for i = 1, BK do all = all and done[i] end
    if all then S = t break end
  end
  self.S = S
  local results = {}
  for b = 1, B do
    local hyps = {}
    for k = 1, K do
      local i = (b - 1) * K + k
      if score[i] > -math.huge then
        local seq, rows, j = {}, {}, i
        for t = S, 1, -1 do
          seq[t] = labels[t][j]
          j = back[t][j]
          rows[t] = j
        end
        local out = {}
        for _, v in ipairs(seq) do
          if v == eos then break end
          out[#out + 1] = v
        end
        local steps = math.min(#out + 1, lim[b])
        local h = {labels = out, logp = am[i], steps = steps, rows = rows,
          score = norm and score[i] / steps or score[i], k = k}
        hyps[#hyps + 1] = h
      end
    end
    if norm then
      table.sort(hyps, function(x, y)
        if x.score ~= y.score then return x.score > y.score end
        return x.k < y.k
      end)
    end
    local best = hyps[1]
    results[b] = {labels = best.labels, score = best.score, logp = best.logp, steps = best.steps,
      rows = best.rows, hyps = hyps}
  end
  return results
end

-- net:search(batch, opts): runs the layers the rec layer reads (train = false), then its beam
-- search; opts.layer names the rec layer when the network has several.
-- rl.search's options are named otherwise (beam, nbest): a misspelt key would search silently
-- with the defaults
local SEARCH_KEYS = {layer = true, beam_size = true, eos = true, length_norm = true,
                     max_seq_len = true, lm = true}

function M.search(net, batch, opts)
  opts = opts or {}
  util.check_options("net:search", opts, SEARCH_KEYS)
  local target
  for _, node in ipairs(net.nodes) do
    if node.rec and node.layer.choice and (opts.layer == nil or opts.layer == node.name) then
      target = node
    end
  end
  if not target then
    fail("net:search: no rec layer with a choice in its unit%s", opts.layer
      and string.format(" named '%s'", tostring(opts.layer)) or "")
  end
  if type(batch) ~= "table" or not rl.is_tensor(batch.lengths) then
    fail("net:search: the batch must be a table with lengths (B) int32 and the inputs")
  end
  -- the layers the rec layer depends on
  local need = {[target.name] = true}
  for i = target.index, 1, -1 do
    local node = net.nodes[i]
    if need[node.name] then
      for _, s in ipairs(node.srcs) do need[s] = true end
    end
  end
  for key in pairs(net.input_keys) do
    if need[key] and not rl.is_tensor(batch[key]) then
      fail("net:search: the batch lacks input '%s'", key)
    end
  end
  local moved = {}
  for key in pairs(net.input_keys) do
    if need[key] then moved[key] = batch[key]:to(net:device_of(key)) end
  end
  local results
  for i = 1, target.index do
    local node = net.nodes[i]
    if need[node.name] then
      local inputs = {}
      for k, s in ipairs(node.srcs) do
        inputs[k] = net.by_name[s] and net.by_name[s].out or moved[s]
      end
      if node == target then
        results = node.layer:search(inputs, batch.lengths, opts)
      elseif node.rec or node.rank ~= 1 or node.fold then
        fail("net:search: layer '%s' (class %s) before the search is not supported", node.name,
          node.layer.class)
      else
        node.out = node.layer:forward(inputs, batch.lengths, false)
      end
    end
  end
  net.forwarded = false
  return results
end

-- The attention weights (S, B, Te) of unit layer `name` from the last forward.
function Rec:attention_weights(uname)
  local unit = self.by_name[uname]
  if not unit or unit.kind ~= "attention" then
    fail("%s: no attention layer '%s' in the unit", rec_where(self.name), tostring(uname))
  end
  return unit.obj.alpha:narrow(1, 1, self.S)
end

function Rec:__tostring()
  return string.format("Layer '%s' (rec, %d unit layers, n_out %d, %d params)", self.name,
    #self.units, self.n_out, self.num_params)
end

return M
