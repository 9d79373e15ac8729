-- Layer-wise pretraining, RETURNN's `pretrain` option of rl.train: the network grows over the
-- first epochs, then the full network trains.
--
--   pretrain = "default" (or true)      RETURNN's default scheme ("from_output", below)
--   pretrain = function(net_desc, idx)  a custom scheme (the same as {construction = fn})
--   pretrain = {construction = "default" | function(net_desc, idx),
--               repetitions = n | {n_1, n_2, ...},    epochs per pretrain step (default 1)
--               output_layers = {"output", ...}}      the layers the default scheme feeds
--
-- The steps. The default scheme starts from the full description and, like RETURNN's
-- from_output construction, repeatedly replaces the sources of the output layers (default:
-- the layer named "output", else the layers with a loss) by the sources of those sources,
-- dropping the layers so bypassed: a 4-layer BLSTM (fw1/bw1 ... fw4/bw4 -> output) gives
--   step 1: fw1, bw1 -> output     step 2: ... fw2, bw2 -> output     step 3: ... fw3, bw3
--   -> output     then the full network (epoch 4 on, with repetitions = 1).
-- A reduction that would make an output read an extern input directly, or that removes only
-- layers without parameters (dropout, copy, window, ...), is not a step of its own (it merges
-- with the next one), and a step that adds no layer with parameters is dropped (RETURNN does
-- both). A layer other than the outputs that reads a layer missing from a step (an auxiliary
-- loss on a deeper layer) is left out of that step. A custom construction is called with a
-- fresh deep copy of config.network and idx = 1, 2, ... and returns the description of
-- pretrain step idx, or nil after the last one; the full network always follows. Every
-- step's network is built once when training starts (the random generator's state is kept),
-- so a bad scheme is an error before any data is read, naming the step and the option.
--
-- Repetitions: step i trains for repetitions epochs (a list gives one count per step, its last
-- entry repeated for the remaining steps; an entry for the final network is allowed, as in
-- RETURNN, and changes nothing: the full network trains to num_epochs). So pretraining takes
-- the first sum(repetitions) epochs; num_epochs smaller than that ends inside pretraining.
--
-- Growing. When an epoch's step differs from the previous epoch's, a new network is built from
-- the step's description (new layers initialised from the global generator, which the
-- checkpoints save), and every parameter whose layer and name exist in the old network with
-- the same shape is copied into it exactly. That covers all layers already trained, and the
-- output layer as long as its input dimension stays the same (a BLSTM with equal layer sizes);
-- a parameter whose shape changed (the output layer's weights when the new top layer is wider
-- or narrower; a custom scheme that changes a layer's input) keeps its fresh initialisation, as
-- RETURNN's copy_output_layer = "ifpossible" does, and the log names it (verbosity 2).
-- Optimizer state: the optimizer is built anew for each new network, as RETURNN's engine does
-- (it makes a new updater with each pretrain network). Adam's moments and its bias correction
-- thus restart together, so the first steps of the new layers are of the usual size (carrying
-- the old moments with the old step count would give zero-moment parameters steps of about
-- 3x the learning rate) and the outlier test's gradient-norm average restarts with the new
-- gradient. The learning-rate control and the global step count go on unchanged. Since
-- config.optimizer must build an optimizer for each network, it must be a config table or a
-- function(params, grads, net), not an object.
--
-- Checkpoints written during (and after) pretraining hold the epoch's network and, in group
-- /pretrain, the step: {scheme, step, num_steps, first_epoch, last_epoch, pretrain_epochs,
-- final, layers}. Resuming (load = ...) checks that the checkpoint's network is the one the
-- scheme gives its epoch, rebuilds that network and loads it; the next epoch then grows it as an
-- uninterrupted run would, with the same generator state, so the results are bit-identical.
-- rnnlua info shows the record.
local M = {}
local rl -- the module table, set by install
local checkpoint = require("rnnlua.checkpoint")
local rec = require("rnnlua.rec")

-- A custom construction that never returns nil is a mistake, not a deep network.
local MAX_STEPS = 1000

local function fail(fmt, ...)
  error("rl.train: config.pretrain" .. string.format(fmt, ...), 0)
end

local util = require("rnnlua.util")
local sorted_keys, deep_copy = util.sorted_keys, util.deep_copy

-- A layer's from as a list ({"data"} when absent; {} when it is no name nor list).
local function list_of(f)
  local l = util.list_of(f, {"data"})
  return type(l) == "table" and l or {}
end

-- What a layer reads, as the network sees it (a rec layer also reads its unit's base layers);
-- nil when the description is too broken to tell (rl.network will say why).
local function sources(desc, name)
  local d = desc[name]
  if d.class == "rec" then
    local ok, s = pcall(rec.sources, name, d, desc)
    return ok and s or nil
  end
  return list_of(d.from)
end

local function layer_names(desc)
  local names = {}
  for _, k in ipairs(sorted_keys(desc)) do
    if type(desc[k]) == "table" then names[#names + 1] = k end
  end
  return table.concat(names, ", ")
end

---------------------------------------------------------------------------- the default scheme

-- Drops, until none is left, every layer other than the outputs that reads a name which is
-- neither a layer of desc nor an extern input.
local function prune(desc, ext, is_output)
  local changed = true
  while changed do
    changed = false
    for _, name in ipairs(sorted_keys(desc)) do
      if not is_output[name] then
        local srcs = sources(desc, name)
        local ok = srcs ~= nil
        for _, s in ipairs(srcs or {}) do
          if desc[s] == nil and ext[s] == nil then ok = false end
        end
        if not ok then
          desc[name] = nil
          changed = true
        end
      end
    end
  end
end

-- The reduced descriptions, shallowest first (RETURNN's from_output construction).
-- trainable[name]: the layer has parameters (in the full network).
local function default_steps(full, ext, outputs, trainable)
  local is_output = {}
  for _, o in ipairs(outputs) do is_output[o] = true end
  local steps = {}
  local cur = full
  while true do
    local new = deep_copy(cur)
    local made = false
    while true do
      local before, srcs, seen, deleted = {}, {}, {}, {}
      local any_input, any_trainable = false, false
      local function add(s)
        if not seen[s] then
          seen[s] = true
          srcs[#srcs + 1] = s
        end
      end
      for _, o in ipairs(outputs) do
        for _, s in ipairs(list_of(new[o].from)) do
          before[s] = true
          if full[s] == nil or is_output[s] then
            add(s) -- an extern input (or another output) stays
          elseif new[s] ~= nil then
            for _, s2 in ipairs(list_of(new[s].from)) do add(s2) end
            any_trainable = any_trainable or trainable[s]
            deleted[#deleted + 1] = s
            new[s] = nil
          end
        end
      end
      local same = true
      for _, s in ipairs(srcs) do same = same and before[s] == true end
      for s in pairs(before) do same = same and seen[s] == true end
      if same or #deleted == 0 then break end
      for _, o in ipairs(outputs) do new[o].from = {table.unpack(srcs)} end
      for _, s in ipairs(srcs) do
        if full[s] == nil then any_input = true end
      end
      -- an output fed by an input directly would change its input dimension: go on reducing
      -- (RETURNN: "try again"), which ends the scheme once only inputs are left
      if not any_input and any_trainable then
        made = true
        break
      end
    end
    if not made then break end
    prune(new, ext, is_output)
    table.insert(steps, 1, new)
    cur = new
  end
  -- a step that adds no layer with parameters (outputs aside) to the one before is dropped
  local kept, prev = {}, {}
  for _, s in ipairs(steps) do
    local adds = false
    for name in pairs(s) do
      if not is_output[name] and prev[name] == nil and trainable[name] then adds = true end
    end
    if adds then kept[#kept + 1] = s end
    prev = s
  end
  return kept
end

local function output_layers(opts, full)
  local o = opts.output_layers
  if o == nil then
    if type(full.output) == "table" then return {"output"} end
    local list = {}
    for _, name in ipairs(sorted_keys(full)) do
      if type(full[name]) == "table" and full[name].loss ~= nil then list[#list + 1] = name end
    end
    if #list == 0 then
      fail(": the default scheme needs output layers: there is no layer 'output' and no layer "
        .. "with a loss (set config.pretrain.output_layers)")
    end
    return list
  end
  if type(o) == "string" then o = {o} end
  if type(o) ~= "table" or #o == 0 then
    fail(".output_layers must be a layer name or a non-empty list of them, got %s", type(o))
  end
  for i, name in ipairs(o) do
    if type(name) ~= "string" or type(full[name]) ~= "table" then
      fail(".output_layers[%d] = %s is not a layer of config.network (layers: %s)", i,
        tostring(name), layer_names(full))
    end
  end
  return o
end

---------------------------------------------------------------------------- the plan

local Plan = {}
Plan.__index = Plan

local function custom_steps(fn, full)
  local steps = {}
  for idx = 1, MAX_STEPS + 1 do
    if idx > MAX_STEPS then
      fail(".construction returned a network for %d steps and never nil: it must return nil "
        .. "after the last pretrain step", MAX_STEPS)
    end
    local ok, d = pcall(fn, deep_copy(full), idx)
    if not ok then
      fail(".construction(net_desc, %d) failed: %s", idx, tostring(d))
    end
    if d == nil or d == false then break end
    if type(d) ~= "table" then
      fail(".construction(net_desc, %d) returned a %s; expected a network description (a table "
        .. "of layers) or nil after the last step", idx, type(d))
    end
    if next(d) == nil then
      fail(".construction(net_desc, %d) returned an empty network description", idx)
    end
    for _, name in ipairs(sorted_keys(d)) do
      if type(name) ~= "string" or type(d[name]) ~= "table" then
        fail(".construction(net_desc, %d) returned a description whose entry %s is a %s, not a "
          .. "layer table", idx, tostring(name), type(d[name]))
      end
    end
    steps[#steps + 1] = d
  end
  return steps
end

local function check_repetitions(r, nsteps)
  if r == nil then return {1} end
  local list = type(r) == "table" and r or {r}
  local n = 0
  for k in pairs(list) do
    n = n + 1
    if math.type(k) ~= "integer" or k < 1 then
      fail(".repetitions must be a positive integer or a list of them, got a table with key %s",
        tostring(k))
    end
  end
  if n == 0 or n ~= #list then
    fail(".repetitions must be a positive integer or a non-empty list of them")
  end
  for i, v in ipairs(list) do
    if math.type(v) ~= "integer" or v < 1 then
      fail(".repetitions%s must be a positive integer (epochs per pretrain step), got %s",
        type(r) == "table" and "[" .. i .. "]" or "", tostring(v))
    end
  end
  if #list > nsteps + 1 then
    fail(".repetitions has %d entries, the scheme has %d pretrain steps (and the final network)",
      #list, nsteps)
  end
  return list
end

-- The plan of rl.train's config, or nil without pretraining. ext: the extern data;
-- build(desc) -> network (rl.network with the run's dtype, checked against the datasets).
function M.plan(cfg, extern, build)
  local p = cfg.pretrain
  if p == nil or p == false then return nil end
  local opts
  if p == "default" or p == true then
    opts = {construction = "default"}
  elseif type(p) == "function" then
    opts = {construction = p}
  elseif type(p) == "table" then
    opts = p
    for _, k in ipairs(sorted_keys(p)) do
      if k ~= "construction" and k ~= "repetitions" and k ~= "output_layers" then
        fail(": unknown option '%s' (known: construction, repetitions, output_layers)",
          tostring(k))
      end
    end
  else
    fail(": unknown scheme %s (known: \"default\", a function(net_desc, idx), or a table "
      .. "{construction =, repetitions =})", type(p) == "string" and "'" .. p .. "'" or "of type "
      .. type(p))
  end
  local construction = opts.construction == nil and "default" or opts.construction
  if type(construction) == "string" and construction ~= "default" then
    fail(".construction: unknown scheme '%s' (known: \"default\" or a function(net_desc, idx))",
      construction)
  elseif type(construction) ~= "string" and type(construction) ~= "function" then
    fail(".construction must be \"default\" or a function(net_desc, idx), got %s",
      type(construction))
  end
  if type(cfg.optimizer) == "table" and type(cfg.optimizer.step) == "function" then
    fail(": config.optimizer is an optimizer object bound to one network's parameters; with "
      .. "pretraining give a config table or a function(params, grads, net)")
  end

  local full = cfg.network
  -- the steps are built with the generator's state kept, so planning changes no result; an
  -- error of the full network is reported as it is without pretraining
  local rng = rl.get_rng_state()
  local okf, full_net = pcall(build, full)
  if not okf then
    rl.set_rng_state(rng)
    error(full_net, 0)
  end
  local trainable = {}
  for _, name in ipairs(full_net.order) do
    trainable[name] = full_net.by_name[name].layer.num_params > 0
  end
  full_net = nil
  local ok, err = pcall(function()
    local steps
    if construction == "default" then
      steps = default_steps(full, extern, output_layers(opts, full), trainable)
    else
      steps = custom_steps(construction, full)
    end
    for i, d in ipairs(steps) do
      local okb, e = pcall(build, d)
      if not okb then
        fail(": the network of pretrain step %d (layers %s) cannot be built: %s", i,
          layer_names(d), tostring(e))
      end
    end
    steps[#steps + 1] = full
    return steps
  end)
  rl.set_rng_state(rng)
  collectgarbage() -- the trial networks' buffers
  if not ok then
    local msg = tostring(err)
    if not msg:find("^rl%.train: config%.pretrain") then
      msg = "rl.train: config.pretrain: " .. msg
    end
    error(msg, 0)
  end
  local steps = err
  local reps = check_repetitions(opts.repetitions, #steps - 1)
  local self = setmetatable({scheme = construction == "default" and "default" or "custom",
    steps = steps, first = {}, last = {}}, Plan)
  local epoch = 1
  for i = 1, #steps - 1 do
    local r = reps[math.min(i, #reps)]
    self.first[i], self.last[i] = epoch, epoch + r - 1
    epoch = epoch + r
  end
  self.first[#steps] = epoch
  self.epochs = epoch - 1
  self.text = {}
  for i, d in ipairs(steps) do self.text[i] = checkpoint.serialize(d, "network") end
  return self
end

-- The step of an epoch (1-based); the full network's for epochs after pretraining.
function Plan:step_of(epoch)
  for i = 1, #self.steps - 1 do
    if epoch <= self.last[i] then return i end
  end
  return #self.steps
end

function Plan:description(epoch)
  return self.steps[self:step_of(epoch)]
end

-- What checkpoints record about an epoch.
function Plan:state(epoch)
  local i = self:step_of(epoch)
  local names = {}
  for _, k in ipairs(sorted_keys(self.steps[i])) do names[#names + 1] = k end
  return {scheme = self.scheme, step = i, num_steps = #self.steps, first_epoch = self.first[i],
          last_epoch = self.last[i] or -1, pretrain_epochs = self.epochs,
          final = i == #self.steps, layers = table.concat(names, ",")}
end

-- Log lines describing the scheme.
function Plan:describe()
  local lines = {}
  if #self.steps == 1 then
    lines[1] = string.format("pretrain (%s): the scheme gives no smaller network; the full "
      .. "network trains from epoch 1", self.scheme)
    return lines
  end
  lines[1] = string.format("pretrain (%s): %d step%s over epochs 1-%d, the full network from "
    .. "epoch %d", self.scheme, #self.steps - 1, #self.steps == 2 and "" or "s", self.epochs,
    self.epochs + 1)
  for i = 1, #self.steps - 1 do
    lines[#lines + 1] = string.format("pretrain step %d (epochs %d-%d): layers %s", i,
      self.first[i], self.last[i], layer_names(self.steps[i]))
  end
  return lines
end

-- Builds the network of `epoch` into ctx (ctx.net, ctx.opt, via ctx.new_network and
-- ctx.new_optimizer) if its step differs from ctx.pretrain_step. With `from`, the parameters of
-- the old network are copied where layer, name and shape agree. Returns nil when the step is
-- the same, else {step =, copied = n, new_layers = {names}, reshaped = {"layer/name (AxB ->
-- CxD)"}} (reshaped: kept their fresh initialisation).
function Plan:enter(ctx, epoch, from)
  local i = self:step_of(epoch)
  if ctx.pretrain_step == i then return nil end
  local old = ctx.net
  local net = ctx.new_network(self.steps[i])
  local report = {step = i, copied = 0, new_layers = {}, reshaped = {}}
  if from then
    local by, new_seen = {}, {}
    for _, p in ipairs(old:param_list()) do by[p.layer .. "/" .. p.name] = p.value end
    for _, p in ipairs(net:param_list()) do
      local key = p.layer .. "/" .. p.name
      local o = by[key]
      local os, ns = o and table.concat(o:size(), "x"), table.concat(p.value:size(), "x")
      if os == ns then
        p.value:copy_(o)
        report.copied = report.copied + 1
      elseif o then
        report.reshaped[#report.reshaped + 1] = string.format("%s (%s -> %s)", key, os, ns)
      elseif not new_seen[p.layer] then
        new_seen[p.layer] = true
        report.new_layers[#report.new_layers + 1] = p.layer
      end
    end
  end
  ctx.net, ctx.pretrain_step = net, i
  ctx.opt = ctx.new_optimizer(net)
  return report
end

-- Rebuilds the network a checkpoint holds (before its parameters are loaded), after checking
-- that it is the one the scheme gives the checkpoint's epoch.
function Plan:resume(ctx, ck)
  local epoch = math.max(ck.epoch, 1)
  local i = self:step_of(epoch)
  local ok, text = pcall(checkpoint.serialize, ck.description, "network")
  if not ok or text ~= self.text[i] then
    fail(": checkpoint %s (epoch %d) holds a network with layers %s, but the scheme gives epoch "
      .. "%d %s (layers %s): the network or config.pretrain changed since it was written", ck.path,
      ck.epoch, layer_names(ck.description), epoch, i == #self.steps and "the full network"
      or "pretrain step " .. i, layer_names(self.steps[i]))
  end
  self:enter(ctx, epoch, false)
end

function M.install(module)
  rl = module
end

return M
