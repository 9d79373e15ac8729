-- rl.network: a network from a RETURNN-style description, with one flat parameter buffer.
--
--   local net = rl.network(layers, extern_data [, {dtype = "float32"|"float64", seed = n,
--                                                   input_grads = false, params = flat}])
--   layers:      name -> {class = ..., from = name | {names} (default "data"), loss = "ce" |
--                "ctc" | "mse", target = key, loss_scale = 1, is_output_layer = true, ...options}
--   extern_data: key -> {dim = F} (dense (T, B, F) float input) or {dim = C, sparse = true}
--                ((T, B) int32 class indices, 0-based) or {dim = F, spatial = 2} (images:
--                (H, W, B, F) float with batch.sizes (B, 2) int32 = (height, width) per image)
--
-- Starting from the layers with a loss and those with is_output_layer (or, when no layer has
-- a loss, the layer named "output"), the network instantiates every layer they depend on, in
-- dependency order (depth first, roots and froms visited in sorted/given order, so the order
-- is deterministic). All parameters live in one flat buffer and all gradients in another, of
-- the network's dtype; each layer's weights are views of them, initialised in that order
-- from the seeded generator (rl.manual_seed before rl.network reproduces them). With
-- params = flat (a contiguous 1-D CPU tensor of the dtype, as long as the network's parameters:
-- another network's net:params() of the same description) the network binds flat as its
-- parameter buffer, shared and not initialised: writes through either network show in both.
-- The C API's sessions share their model's parameters so (lua/capi.c); nothing of a forward
-- writes parameters.
--
--   net:forward{data = x, classes = y, lengths = len} [, {train = false}] -> loss, errors
--       with image inputs also sizes = (B, 2) int32; lengths is then needed only when a
--       sequence input feeds a layer.
--       Targets of their own length: a target key K may come with lengths_K = (B) int32, its
--       own length per sequence, and then be (S, B) int32 (sparse) with any S >= max
--       lengths_K, padded after each sequence's end with anything (masked by lengths_K), as
--       rl.batches gives it: the label sequences of loss = "ctc". A frame-level loss (ce,
--       mse) checks that its target has its output's frames and lengths and raises an error
--       naming the layer and the key otherwise. Without lengths_K a target must have the
--       input's T and lengths.
--       loss: the sum over loss layers of loss_scale * (loss summed over valid frames);
--       errors: wrongly classified frames (ce), plus label errors (ctc: the edit distance of
--       each sequence's best path to its target); net.n_frames: the valid frames;
--       net.n_error_units: what errors counts from (the frames of ce/mse layers plus the
--       reference labels of ctc layers: errors / n_error_units is the frame or label error
--       rate); net.n_labels: the reference labels of ctc layers; net.n_skipped: sequences a
--       ctc layer left out (no alignment fits their input: infinite loss, zero gradient);
--       net.has_ctc: a ctc loss is in the network. train defaults to true (dropout active).
--   loss = "ctc" (softmax layers): Connectionist Temporal Classification against a target of
--       label sequences (sparse, dim = the number of labels, with lengths_<key>); the layer
--       has n_out = dim + 1 classes, the blank at blank_index (default dim, the last class),
--       so label k of the target is class k of the output. See layers/softmax.c.
--   net:backward()      gradients of that loss, ADDED to net:grads() (zero them first)
--   net:zero_grads(), net:params(), net:grads(), net:num_params(), net:param_list(),
--   net:layer(name), net:input_grad(key) (with input_grads = true): the tensors these give
--   are shares of the network's buffers (closing one releases only it), net.description,
--   net.extern_data, net.order (layer names in dependency order), net.dtype, net.device
--   net:to(device)      moves the network to "cpu", "cuda" or "cuda:N" (returns net)
--   net:set_precision(p) "fp32", "bf16", "int8" or (on a CUDA device) "fp16" (rl.network's
--                       precision option, default "fp32"): bf16 (fp16) operands, float32 sums in
--                       the products of linear, softmax, lstm and gru layers (CPU:
--                       kernels/cpu/gemm_bf16.h; CUDA: cublasGemmEx, kernels/cuda/context.h);
--                       weights, gradients and states stay float32. "int8" (CPU, inference only:
--                       net:backward refuses it): those products with int8 weights (per output
--                       unit scales) and activations quantized per row at each product, int32
--                       sums (kernels/cpu/gemm_int8.h)
--   net.grad_scale      1 unless set: net:backward multiplies the gradient of every loss by it
--                       (rl.train's fp16 loss scaling, rnnlua.grad_scaler)
--
-- Devices. A network is built on the CPU (so its initial values do not depend on the device)
-- and moved with net:to(device): the flat parameter and gradient buffers are copied once each,
-- every layer is bound again to the new buffers (values kept), and the layers' activation and
-- scratch buffers follow on their next forward. Tensors taken from the network before the move
-- (net:params(), net:grads(), net:param_list(), an optimizer built on them) still refer to the
-- old buffers: build the optimizer after net:to. net:forward takes a batch on any device and
-- copies each dense input and target tensor that is not on the network's device there (one copy
-- per tensor and batch); class indices (sparse keys, inputs and targets alike), lengths and
-- sizes go to or stay on the CPU, where the layers read them (embedding, linear, ctc and rec
-- check and gather class indices on the host; the ce loss copies its target to the logits'
-- device itself). Layers written in Lua receive their dense inputs and params on the network's
-- device (self.device names it; self:frame_mask gives the mask there) and class indices on the
-- CPU. An unavailable device (no CUDA build, no GPU, no
-- such ordinal) is an error naming it; lstm, mdlstm and the 2-D layers (conv2d, pool2d,
-- collapse, global_pool) raise an error naming the layer and the device when given CUDA data.
--
-- Backward walks the layers in reverse order. A layer's grad_out is the sum of the input
-- gradients its consumers wrote; with a single consumer that consumer's grad_in buffer is
-- used directly. Layers whose output no loss depends on, and layers with no parameter above
-- or below them that needs a gradient, are skipped. Gradient buffers are sized on the first
-- batch of a shape and reused. loss = "ce" is the softmax layer's own loss; loss = "mse" is
-- computed by the layer itself when it takes it (is_loss), else by the network on the
-- layer's output.
--
-- Carried state (truncated BPTT over consecutive chunks of long sequences). A batch with
-- state_from = {s_1, ..., s_B} (a Lua list of integers, as rl.batches{carry_state = true}
-- gives it) makes every lstm and gru layer start slot b from the final state that the previous
-- carrying forward left in its slot s_b, or from zeros where s_b = 0 (the sequence starts in
-- this batch). The network keeps a copy of each such layer's final state after every forward
-- whose batch has state_from, for the next one; a batch without state_from starts from zeros
-- and drops what was kept. The state is taken as a value: no gradient crosses the boundary
-- (the gradient of the initial state is not passed on). Only networks whose every layer is
-- causal and frame by frame can carry: forward lstm/gru layers and the frame-wise classes
-- (embedding, softmax, linear, activation, dropout, combine, copy, layer_norm); a backward
-- (direction = -1) recurrence, a window, a rec layer or any other class is an error naming the
-- layer (net:carry_unfit() gives the reason, or nil). So a long sequence cut into chunks gives
-- the outputs of the whole sequence (tests/lua/test_carry_state.lua).
--
-- Images (2-D data). What a layer takes and gives is its class's (rl._layer_class_flags):
-- image classes (conv2d, pool2d, mdlstm) take (H, W, B, F) with sizes and give images, with
-- the sizes their layer reports (layer:out_geometry(), e.g. after a strided conv2d) or else
-- those of their input; collapse and global_pool take images and give sequences whose
-- lengths they report (the widths; ones); "any rank" classes (copy, linear, activation,
-- dropout, combine) keep the rank of their inputs: on images the network hands them
-- (H*W, B, F) views with every position counted as valid, which is exact for these
-- position-wise layers because padded positions carry zero gradient (the layer contract) and
-- image layers never read their input's padding. Every other class (lstm, softmax, window,
-- Lua classes) takes sequences. A layer given the wrong rank, or inputs of different
-- rank or geometry, is an error naming it; a loss layer must give sequences. Each layer
-- receives the sizes or lengths of its own inputs, so layers after a collapse see the widths.
local M = {}

local layers = require("rnnlua.layers")
local rec = require("rnnlua.rec")
local rl -- the module table, set by install

local Network = {}
Network.__index = Network

local fail = require("rnnlua.util").fail

local util = require("rnnlua.util")
local sorted_keys = util.sorted_keys
local where = util.layer_where

local function is_int(v) return math.type(v) == "integer" or (type(v) == "number" and v == math.floor(v)) end

---------------------------------------------------------------------------- construction

local function check_extern(extern_data)
  if type(extern_data) ~= "table" then
    fail("rl.network: extern_data must be a table (key -> {dim = ..., sparse = ...}), got %s",
      type(extern_data))
  end
  local ext = {}
  for _, key in ipairs(sorted_keys(extern_data)) do
    local e = extern_data[key]
    if type(key) ~= "string" then fail("rl.network: extern_data keys must be strings") end
    if type(e) ~= "table" then fail("rl.network: extern_data '%s' must be a table", key) end
    if not is_int(e.dim) or e.dim < 1 then
      fail("rl.network: extern_data '%s' needs dim, a positive integer", key)
    end
    if e.sparse ~= nil and type(e.sparse) ~= "boolean" then
      fail("rl.network: extern_data '%s': sparse must be a boolean", key)
    end
    if e.spatial ~= nil and e.spatial ~= 1 and e.spatial ~= 2 then
      fail("rl.network: extern_data '%s': spatial must be 2 (images) or 1 (sequences), got %s",
        key, tostring(e.spatial))
    end
    if e.spatial == 2 and e.sparse then
      fail("rl.network: extern_data '%s': images (spatial = 2) must be dense", key)
    end
    ext[key] = {dim = math.tointeger(e.dim), sparse = e.sparse == true,
      spatial = e.spatial == 2 and 2 or nil}
  end
  if next(ext) == nil then fail("rl.network: extern_data is empty") end
  return ext
end

local function froms_of(name, d)
  local f = d.from
  if f == nil then return {"data"} end
  if type(f) == "string" then return {f} end
  if type(f) ~= "table" or #f == 0 then
    fail("%s: from must be a layer or input name or a non-empty list of them", where(name, d.class))
  end
  local list = {}
  for i, s in ipairs(f) do
    if type(s) ~= "string" then fail("%s: from[%d] must be a name, got %s",
      where(name, d.class), i, type(s)) end
    list[i] = s
  end
  return list
end

-- What layer `name` reads: its from, and for a rec layer also the base layers of its unit.
local function sources_of(desc, name, d)
  if d.class == "rec" then return rec.sources(name, d, desc) end
  return froms_of(name, d), nil
end

-- Depth-first post-order from the roots: each layer after all the layers it reads.
local function topological_order(desc, ext, roots)
  local order, state, stack = {}, {}, {}
  local function visit(name)
    if state[name] == "done" then return end
    if state[name] == "active" then
      local path, start = {}, 1
      for i, n in ipairs(stack) do if n == name then start = i end end
      for i = start, #stack do path[#path + 1] = stack[i] end
      path[#path + 1] = name
      fail("%s: cycle in from: %s", where(name, desc[name].class), table.concat(path, " -> "))
    end
    state[name] = "active"
    stack[#stack + 1] = name
    for _, src in ipairs((sources_of(desc, name, desc[name]))) do
      if ext[src] == nil then
        if desc[src] == nil then
          fail("%s: unknown from '%s' (layers: %s; inputs: %s)", where(name, desc[name].class), src,
            table.concat(sorted_keys(desc), ", "), table.concat(sorted_keys(ext), ", "))
        end
        visit(src)
      end
    end
    stack[#stack] = nil
    state[name] = "done"
    order[#order + 1] = name
  end
  for _, r in ipairs(roots) do visit(r) end
  return order
end

-- A loss layer's target: checked before the layer is made, since without n_out the layer takes
-- its size from the target's dim (an unknown target must not read as "missing option n_out").
local function check_target(name, d, ext)
  if type(d.loss) ~= "string" then fail("%s: loss must be a string", where(name, d.class)) end
  if d.target == nil then
    fail("%s: loss '%s' needs a target (one of the extern_data keys: %s)",
      where(name, d.class), d.loss,
      table.concat(sorted_keys(ext), ", "))
  end
  local t = type(d.target) == "string" and ext[d.target]
  if not t then
    fail("%s: target '%s' is not in extern_data (keys: %s)",
      where(name, d.class), tostring(d.target),
      table.concat(sorted_keys(ext), ", "))
  end
  return t
end

local function check_loss(node, d, ext)
  local name, layer = node.name, node.layer
  if d.loss == nil then
    if d.target ~= nil and (type(d.target) ~= "string" or not ext[d.target]) then
      fail("%s: target '%s' is not in extern_data (keys: %s)",
        where(name, d.class), tostring(d.target),
        table.concat(sorted_keys(ext), ", "))
    end
    return
  end
  local t = check_target(name, d, ext)
  -- NaN or inf would turn every loss and gradient into NaN (the description is also read
  -- from checkpoints)
  local ls = d.loss_scale
  if ls ~= nil and (type(ls) ~= "number" or ls ~= ls or ls == math.huge or ls == -math.huge) then
    fail("%s: loss_scale must be a finite number, got %s", where(name, d.class), tostring(ls))
  end
  node.loss, node.target, node.loss_scale = d.loss, d.target, d.loss_scale or 1
  if d.loss == "ce" then
    if d.class ~= "softmax" or not layer.is_loss then
      fail("%s: loss 'ce' needs a softmax layer (this one is class %s)",
        where(name, d.class), d.class)
    end
    if not t.sparse then
      fail("%s: loss 'ce' needs a sparse target, extern_data '%s' is dense",
        where(name, d.class), d.target)
    end
    node.loss_kind = "layer"
  elseif d.loss == "ctc" then
    if d.class ~= "softmax" or not layer.is_loss then
      fail("%s: loss 'ctc' needs a softmax layer (this one is class %s)",
        where(name, d.class), d.class)
    end
    if not t.sparse then
      fail("%s: loss 'ctc' needs a sparse target (label sequences), extern_data '%s' "
        .. "is dense", where(name, d.class), d.target)
    end
    if t.dim + 1 ~= layer.n_out then
      fail("%s: loss 'ctc': target '%s' has %d labels, so the layer's n_out must be %d "
        .. "(the labels and the blank), got %d",
          where(name, d.class), d.target, t.dim, t.dim + 1, layer.n_out)
    end
    node.loss_kind, node.ctc = "layer", true
    return
  elseif d.loss == "mse" then
    if t.sparse then
      fail("%s: loss 'mse' needs a dense target, extern_data '%s' is sparse", where(name, d.class),
        d.target)
    end
    node.loss_kind = layer.is_loss and "layer" or "mse"
  else
    fail("%s: unknown loss '%s' (known: ce, ctc, mse)", where(name, d.class), d.loss)
  end
  if t.dim ~= layer.n_out then
    fail("%s: target '%s' has dim %d, the layer's n_out is %d",
      where(name, d.class), d.target, t.dim,
      layer.n_out)
  end
end

local RANK_NAME = {"sequences (T, B, F)", "images (H, W, B, F)"}

-- node.rank: 1 (sequences) or 2 (images) of the output; node.fold: an any-rank layer on images.
function Network:set_rank(node, d)
  local flags = rl._layer_class_flags(d.class) or 0
  local in_2d, out_2d, any = flags & 1 ~= 0, flags & 2 ~= 0, flags & 4 ~= 0
  local rank
  for k, src in ipairs(node.srcs) do
    local r = self.ext[src] and (self.ext[src].spatial or 1) or self.by_name[src].rank
    if rank and r ~= rank then
      fail("%s: its inputs mix %s ('%s') and %s ('%s')", where(node.name, d.class), RANK_NAME[rank],
        node.srcs[1], RANK_NAME[r], src)
    end
    rank = r
    local want = in_2d and 2 or (not any and 1 or r)
    if r ~= want then
      fail("layer '%s' (class %s) takes %s but '%s' gives %s%s", node.name, d.class,
        RANK_NAME[want], src, RANK_NAME[r], want == 1
        and " (use a collapse or global_pool layer in between)" or "")
    end
  end
  if in_2d then
    node.rank = out_2d and 2 or 1
  elseif any then
    node.rank, node.fold = rank, rank == 2
  elseif out_2d then
    fail("layer '%s' (class %s): a class that gives images from sequences is not supported",
      node.name, d.class)
  else
    node.rank = 1
  end
end

-- The options of rl.network and of net:forward, checked: a misspelt one would be ignored
-- (net:forward(b, {trian = false}) would score with dropout on).
local NETWORK_OPTS = {dtype = true, seed = true, input_grads = true, concurrent = true,
  precision = true, params = true}
local FORWARD_OPTS = {train = true}

local check_opts = util.check_options

-- precision = "bf16" (or "fp16", CUDA only): the classes whose matrix products (linear and
-- softmax layers, the LSTM's and GRU's input and recurrent products) run with bf16 (fp16)
-- operands and float32 sums (kernels/cpu/gemm_bf16.h; on CUDA kernels/cuda/context.h's half
-- context); parameters, gradients, optimizer state, cell states and losses stay
-- float32. Layers of the classes without matrix products need no bf16 path; any other layer (a
-- Lua layer, conv2d, mdlstm, rec, attention) runs its products in float32 and says so once.
local BF16_CLASSES = {linear = true, softmax = true, lstm = true, gru = true}
M.BF16_CLASSES = BF16_CLASSES -- lua/rnnlua/capi.lua's pushes in C turn bf16 on for these too
local NO_PRODUCTS = {activation = true, collapse = true, combine = true, copy = true,
  dropout = true, embedding = true, global_pool = true, pool2d = true, window = true,
  layer_norm = true}
local PRECISIONS = {fp32 = true, bf16 = true, int8 = true, fp16 = true}

-- p checked for a network of dtype on device (who names the caller and option; training: the
-- network is to be trained)
local function check_precision(who, p, dtype, device, training)
  if not PRECISIONS[p] then
    fail("%s: precision must be \"fp32\", \"bf16\", \"int8\" or \"fp16\", got %s", who,
      type(p) == "string" and string.format("%q", p) or tostring(p))
  end
  if p == "int8" and training then
    fail("%s: precision \"int8\" is for inference only (its products have no backward); "
      .. "train in \"fp32\" or \"bf16\" and run the trained model in \"int8\"", who)
  end
  if p ~= "fp32" and dtype ~= "float32" then
    fail("%s: precision \"%s\" needs dtype float32 (its master weights), got %s", who, p, dtype)
  end
  if p == "int8" and device ~= "cpu" then
    fail("%s: precision \"int8\" runs on the CPU only in this version (the network is on %s)",
      who, device)
  end
  if p == "fp16" and device == "cpu" then
    -- a network is built on the CPU and moved; a config names its device
    local how = (who == "rl.network" or who:sub(1, 4) == "net:")
      and "move the network first (net:to(\"cuda\"), then net:set_precision(\"fp16\"))"
      or "set device = \"cuda\""
    fail("%s: precision \"fp16\" needs a CUDA device (its products run on tensor cores; the "
      .. "network is on cpu): %s, or use \"bf16\" on the CPU", who, how)
  end
end
M.check_precision = check_precision

function M.new(desc, extern_data, opts)
  if type(desc) ~= "table" then
    fail("rl.network: the description must be a table (name -> layer), got %s", type(desc))
  end
  opts = opts or {}
  check_opts("rl.network", opts, NETWORK_OPTS)
  local dtype = opts.dtype or "float32"
  if dtype ~= "float32" and dtype ~= "float64" then
    fail("rl.network: dtype must be float32 or float64, got %s", tostring(dtype))
  end
  local precision = opts.precision or "fp32"
  check_precision("rl.network", precision, dtype, "cpu")
  local ext = check_extern(extern_data)
  local names = sorted_keys(desc)
  local roots, has_loss = {}, false
  for _, name in ipairs(names) do
    local d = desc[name]
    if type(name) ~= "string" then fail("rl.network: layer names must be strings") end
    -- a name becomes an HDF5 group in checkpoints: "a\0b" would save as "a", "." and ".."
    -- name the group itself and its parent, control characters break logs and h5dump
    if name == "" or name == "." or name == ".." or name:find("[%c/]") then
      fail("rl.network: layer name %q cannot be used (a name must be non-empty, not '.' or "
        .. "'..', without '/' and without control characters such as NUL)", name)
    end
    if type(d) ~= "table" then fail("%s: the description must be a table", where(name)) end
    if ext[name] then fail("%s: the name is taken by an extern_data input", where(name)) end
    local inner_loss = d.class == "rec" and rec.has_loss(d)
    if d.loss ~= nil or inner_loss then has_loss = true end
    if d.loss ~= nil or inner_loss or d.is_output_layer then roots[#roots + 1] = name end
  end
  if not has_loss and desc.output ~= nil and not desc.output.is_output_layer then
    roots[#roots + 1] = "output"
    table.sort(roots)
  end
  if #roots == 0 then
    fail("rl.network: nothing to build: no layer has a loss or is_output_layer = true, and "
      .. "there is no layer named 'output'")
  end
  if opts.seed ~= nil then rl.manual_seed(opts.seed) end

  local self = setmetatable({
    description = desc, extern_data = extern_data, dtype = dtype, ext = ext, order = {},
    nodes = {}, by_name = {}, loss_nodes = {}, used_extern = {}, input_keys = {}, input_grads_on =
    opts.input_grads == true, input_grad_bufs = {}, forwarded = false, device = "cpu",
    precision = precision, fp32_noted = {}, grad_scale = 1,
  }, Network)

  for i, name in ipairs(topological_order(desc, ext, roots)) do
    local d = desc[name]
    local srcs, n_from = sources_of(desc, name, d)
    local in_dims = {}
    for k, src in ipairs(srcs) do
      if ext[src] then
        if ext[src].sparse and (rl._layer_class_flags(d.class or "") or 0) & 8 == 0 then
          fail("%s: input '%s' is sparse (int32 class indices) and cannot feed a layer "
            .. "of class %s (embedding takes it)", where(name, d.class), src, tostring(d.class))
        end
        in_dims[k] = ext[src].dim
        self.used_extern[src], self.input_keys[src] = true, true
      else
        in_dims[k] = self.by_name[src].layer.n_out
      end
    end
    if d.class == nil then
      fail("%s: missing class (known: %s)",
        where(name, d.class), table.concat(layers.classes(), ", "))
    end
    if type(d.class) ~= "string" then fail("%s: class must be a string", where(name, d.class)) end
    -- as in RETURNN, a loss layer without n_out gets its target's dim
    local defaults = {}
    if d.n_out == nil and d.loss ~= nil then
      -- loss "ctc" adds the blank to the target's labels
      defaults.n_out = check_target(name, d, ext).dim + (d.loss == "ctc" and 1 or 0)
    end
    local node = {
      name = name, index = i, srcs = srcs, rec = d.class == "rec",
      layer = d.class == "rec" and rec.create(name, d, srcs, n_from, in_dims, dtype, ext)
        or layers.create(d.class, name, d, in_dims, dtype, defaults),
      in_dims = in_dims, consumers = {}, grad_in = {}, inputs = {},
      draws = layers.draws_in_training(d), cudnn = d.impl == "cudnn",
    }
    self:set_rank(node, d)
    check_loss(node, d, ext)
    if node.rec and #node.layer.losses > 0 then
      -- the losses of the unit's layers, reported by the rec layer as its own
      node.loss, node.loss_kind, node.target, node.loss_scale = "unit", "rec", node.layer.target, 1
    end
    if node.loss and node.rank == 2 then
      fail("%s: a loss layer must give sequences, its output is images (put a collapse "
        .. "or global_pool layer before it)", where(name, d.class))
    end
    if node.loss then
      self.loss_nodes[#self.loss_nodes + 1] = node
      self.used_extern[node.target] = true
      self.has_ctc = self.has_ctc or node.ctc == true
    end
    self.nodes[i], self.by_name[name], self.order[i] = node, node, name
  end

  -- who reads whom, and who needs gradients
  for _, node in ipairs(self.nodes) do
    node.requires_grad = node.layer.num_params > 0
    for k, src in ipairs(node.srcs) do
      local p = self.by_name[src]
      if p then
        p.consumers[#p.consumers + 1] = {node = node, slot = k}
        node.requires_grad = node.requires_grad or p.requires_grad
      else
        node.requires_grad = node.requires_grad or self.input_grads_on
      end
    end
  end
  for i = #self.nodes, 1, -1 do
    local node = self.nodes[i]
    node.on_loss_path = node.loss ~= nil
    for _, c in ipairs(node.consumers) do
      node.on_loss_path = node.on_loss_path or c.node.on_loss_path
    end
    node.do_backward = node.on_loss_path and node.requires_grad
    node.grad_edges = {}
    for _, c in ipairs(node.consumers) do
      if c.node.do_backward then node.grad_edges[#node.grad_edges + 1] = c end
    end
    if node.loss_kind == "layer" and node.loss_scale == 0 and #node.grad_edges > 0 then
      fail("%s: loss_scale = 0 on a loss layer that feeds other layers ('%s') is not "
        .. "supported", where(node.name, desc[node.name].class), node.grad_edges[1].node.name)
    end
    node.wants_grad_in = {}
    for k, src in ipairs(node.srcs) do
      local p = self.by_name[src]
      node.wants_grad_in[k] = (p and p.requires_grad)
        or (not p and self.input_grads_on and not self.ext[src].sparse) or false
    end
  end

  -- Neighbours in the order that are two C LSTM (or two GRU) layers, neither reading the other
  -- (the two directions of a bidirectional pair), run concurrently on the CPU, one thread each,
  -- when rl.set_num_threads allows more than one (opts.concurrent = false runs every layer
  -- alone, each with every BLAS thread).
  if opts.concurrent ~= false then
    local i = 1
    while i < #self.nodes do
      local a, b = self.nodes[i], self.nodes[i + 1]
      local independent = layers.has_state(a.layer) and layers.has_state(b.layer)
        and b.layer.class == a.layer.class and not a.loss and not b.loss
      for _, src in ipairs(b.srcs) do independent = independent and src ~= a.name end
      a.pair_next = independent
      i = independent and i + 2 or i + 1
    end
  end

  -- the flat buffers, the views and the initial values (in layer order, from the seeded
  -- generator, on the CPU)
  local total = 0
  local biggest
  for _, node in ipairs(self.nodes) do
    total = total + node.layer.num_params -- each is at most rl.MAX_NUMEL: this cannot wrap
    if total > rl.MAX_NUMEL then
      fail("rl.network: more than %d parameters (at layer '%s')", rl.MAX_NUMEL, node.name)
    end
    if not biggest or node.layer.num_params > biggest.layer.num_params then biggest = node end
  end
  local shared = opts.params
  if shared ~= nil and not (rl.is_tensor(shared) and shared:dim() == 1 and shared:numel() == total
      and shared:dtype() == dtype and shared:device() == "cpu" and shared:is_contiguous()) then
    fail("rl.network: params must be a contiguous 1-D %s CPU tensor of the network's %d "
      .. "parameters, got %s", dtype, total, rl.is_tensor(shared)
        and string.format("%s %s on %s", shared:dtype(), tostring(shared:size()), shared:device())
        or type(shared))
  end
  local ok, values = true, shared
  if shared == nil then ok, values = pcall(rl.zeros, total, dtype) end
  local ok2, grads = false, values
  -- on shared parameters the gradient buffer is zeroed on its first use (ready_grads), so a
  -- network that only runs forward (a C API session) never touches its pages
  if ok then ok2, grads = pcall(shared and rl.empty or rl.zeros, total, dtype) end
  if not ok2 then
    fail("rl.network: cannot allocate the %d parameters (%s): the largest layer is '%s' "
      .. "(class %s, n_out %d, %d parameters): %s", total, dtype, biggest.name,
      biggest.layer.class, biggest.layer.n_out, biggest.layer.num_params, tostring(grads))
  end
  self:bind_buffers(values, grads)
  if shared == nil then
    for _, node in ipairs(self.nodes) do node.layer:init_params() end
  end
  self.grads_unset = shared ~= nil
  self.total = total
  return self
end

-- The gradient buffer, zeroed first when it was left unset (rl.network's params).
local function ready_grads(self)
  if self.grads_unset then
    self.flat_grads:zero_()
    self.grads_unset = false
  end
  return self.flat_grads
end

-- Makes p and g (1-D, the network's dtype, one device) the flat parameter and gradient
-- buffers: every layer is bound to them and the views of param_list are rebuilt.
function Network:bind_buffers(p, g)
  self.flat_params, self.flat_grads = p, g
  self.plist = {}
  local off = 0
  for _, node in ipairs(self.nodes) do
    local start = off
    off = node.layer:bind(p, g, off)
    node.views = {}
    for _, pr in ipairs(node.layer:params()) do
      local v = {
        layer = node.name, name = pr.name,
        value = p:narrow(1, start + 1, pr.numel):view(pr.shape),
        grad = g:narrow(1, start + 1, pr.numel):view(pr.shape),
      }
      start = start + pr.numel
      node.views[#node.views + 1] = v
      self.plist[#self.plist + 1] = v
    end
  end
end

-- "cpu", "cuda", "cuda:N": the names rl tensors take.
local function check_device_name(device, who)
  if type(device) ~= "string" or not (device == "cpu" or device:match("^cuda$")
      or device:match("^cuda:%d+$")) then
    fail("%s: device must be \"cpu\", \"cuda\" or \"cuda:N\", got %s", who, tostring(device))
  end
end
M.check_device_name = check_device_name

function Network:to(device)
  local guard <close> = self:enter("net:to")
  check_device_name(device, "net:to")
  check_precision("net:to", self.precision, self.dtype, device)
  local okp, p = pcall(self.flat_params.to, self.flat_params, device)
  if not okp then
    fail("net:to(\"%s\"): %s", device, (tostring(p):gsub("^to: ", "")))
  end
  local dev = p:device()
  if dev == self.device then return self end
  self:bind_buffers(p, ready_grads(self):to(dev))
  self.device = dev
  -- the network's own per-batch buffers are made again on the new device
  for _, node in ipairs(self.nodes) do
    node.grad_in, node.grad_out, node.loss_grad, node.out, node.inputs = {}, nil, nil, nil, {}
    node.folded = nil
  end
  self.input_grad_bufs, self.last_batch, self.forwarded = {}, nil, false
  self:carry_reset() -- the kept states are on the old device
  return self
end

---------------------------------------------------------------------------- forward

local function describe(t)
  return string.format("%s %s", t:dtype(), tostring(t:size()))
end

-- Checks the batch against extern_data; returns B.
function Network:check_batch(batch)
  if type(batch) ~= "table" then
    fail("net:forward: the batch must be a table {data = ..., lengths = ...}, got %s", type(batch))
  end
  local keys = sorted_keys(self.used_extern)
  local images, seq_inputs = false, false
  for _, key in ipairs(keys) do
    if self.ext[key].spatial == 2 then images = true
    elseif self.input_keys[key] then seq_inputs = true end
  end
  local len, sizes, B = batch.lengths, batch.sizes, nil
  if images then
    if not rl.is_tensor(sizes) or sizes:dim() ~= 2 or sizes:size(2) ~= 2
        or sizes:dtype() ~= "int32" then
      fail("net:forward: batch.sizes must be a (B, 2) int32 tensor of (height, width) per image, "
        .. "got %s", rl.is_tensor(sizes) and describe(sizes) or tostring(sizes))
    end
    B = sizes:size(1)
  end
  if not images or seq_inputs then
    if not rl.is_tensor(len) or len:dim() ~= 1 or len:dtype() ~= "int32" then
      fail("net:forward: batch.lengths must be a (B) int32 tensor, got %s",
        rl.is_tensor(len) and describe(len) or tostring(len))
    end
    if B and len:size(1) ~= B then
      fail("net:forward: batch.lengths has %d entries, batch.sizes %d", len:size(1), B)
    end
    B = len:size(1)
    -- a lengths of the wrong size must be named as such, not as a wrong input
    local first
    for _, key in ipairs(keys) do
      local x = batch[key]
      if self.ext[key].spatial ~= 2 and rl.is_tensor(x) and x:dim() >= 2 then
        if first and x:size(2) == first[2] and x:size(2) ~= B then
          fail("net:forward: batch.lengths has %d entries, but batch.%s and batch.%s hold %d "
            .. "sequences (dim 2)", B, first[1], key, x:size(2))
        end
        first = first or {key, x:size(2)}
      end
    end
    if first and #keys == 1 and first[2] ~= B then
      fail("net:forward: batch.lengths has %d entries, but batch.%s holds %d sequences (dim 2)",
        B, first[1], first[2])
    end
  end
  local T, HW = nil, nil
  for _, key in ipairs(keys) do
    local e, x = self.ext[key], batch[key]
    if x == nil then fail("net:forward: the batch lacks '%s'", key) end
    if not rl.is_tensor(x) then fail("net:forward: batch.%s must be a tensor, got %s", key, type(x)) end
    if e.spatial == 2 then
      if x:dim() ~= 4 or x:size(3) ~= B or x:size(4) ~= e.dim or x:dtype() ~= self.dtype then
        fail("net:forward: batch.%s must be an (H, W, %d, %d) %s tensor of images, got %s", key,
          B, e.dim, self.dtype, describe(x))
      end
      if HW and (HW[1] ~= x:size(1) or HW[2] ~= x:size(2)) then
        fail("net:forward: batch.%s is %s, other images are %d x %d", key, describe(x), HW[1],
          HW[2])
      end
      HW = {x:size(1), x:size(2)}
    else
      if e.sparse then
        if x:dim() ~= 2 or x:dtype() ~= "int32" or x:size(2) ~= B then
          fail("net:forward: batch.%s must be a (T, %d) int32 tensor of class indices (sparse, "
            .. "dim %d), got %s", key, B, e.dim, describe(x))
        end
      elseif x:dim() ~= 3 or x:size(2) ~= B or x:size(3) ~= e.dim or x:dtype() ~= self.dtype then
        fail("net:forward: batch.%s must be a (T, %d, %d) %s tensor, got %s", key, B, e.dim,
          self.dtype, describe(x))
      end
      local own = not self.input_keys[key] and batch["lengths_" .. key]
      if own then
        -- a target of its own length (S, B): checked against its layer in forward
        if not rl.is_tensor(own) or own:dim() ~= 1 or own:dtype() ~= "int32"
            or own:size(1) ~= B then
          fail("net:forward: batch.lengths_%s must be a (%d) int32 tensor, got %s", key, B,
            rl.is_tensor(own) and describe(own) or tostring(own))
        end
        if own:min() < 0 or own:max() > x:size(1) then
          fail("net:forward: batch.lengths_%s must lie within 0..%d (the length of batch.%s), "
            .. "got %d..%d", key, x:size(1), key, own:min(), own:max())
        end
      elseif not images or self.input_keys[key] then
        -- with images, targets follow the frames of the layers that score them (one per
        -- image, one per column, ...): the loss layers check them
        if T and x:size(1) ~= T then
          fail("net:forward: batch.%s has T = %d, other inputs have T = %d", key, x:size(1), T)
        end
        T = x:size(1)
      end
    end
  end
  if not B or B == 0 or (T == nil and HW == nil) then fail("net:forward: empty batch") end
  if T then
    local lo, hi = len:min(), len:max()
    if lo < 1 or hi > T then
      fail("net:forward: batch.lengths must lie within 1..%d (T), got %d..%d", T, lo, hi)
    end
  end
  if HW then
    local hs, ws = sizes:select(2, 1), sizes:select(2, 2)
    if hs:min() < 1 or hs:max() > HW[1] or ws:min() < 1 or ws:max() > HW[2] then
      fail("net:forward: batch.sizes must lie within 1..%d x 1..%d (H x W), got heights %d..%d, "
        .. "widths %d..%d", HW[1], HW[2], hs:min(), hs:max(), ws:min(), ws:max())
    end
  end
  return B
end

-- The (B) lengths of T for a folded any-rank layer: every position valid.
function Network:full_lengths(T, B)
  local f = self.full_len
  if not f or f:size(1) ~= B or f[1] ~= T then
    f = rl.full({B}, T, "int32")
    self.full_len = f
  end
  return f
end

local function same_geometry(a, b)
  if rawequal(a, b) then return true end
  if a:size() ~= b:size() then return false end
  return rl.eq(a, b):min() == 1
end

-- A frame-level loss (ce, mse) scores one target frame per output frame of the layer: a
-- target of another length (a label sequence) is an error naming the layer and the key.
local function check_frame_target(node, batch, T, geom)
  local key = node.target
  local y, own = batch[key], batch["lengths_" .. key]
  if y:size(1) ~= T or (own and not same_geometry(own, geom)) then
    fail("%s: loss '%s' scores frames, but target '%s' is not frame-aligned with the "
      .. "layer's output (%d target frames, lengths %s; the layer gives %d frames, lengths %s)",
      where(node.name, node.layer.class), node.loss, key, y:size(1),
      own and table.concat(own:totable(), ",") or "-", T,
      table.concat(geom:totable(), ","))
  end
end

-- Where the network reads extern_data key: class indices (sparse) on the CPU, the layers read
-- them there; everything else on the network's device.
function Network:device_of(key)
  return self.ext[key].sparse and "cpu" or self.device
end

-- The batch with each tensor the network reads (inputs and targets) where it reads them
-- (Network:device_of): the batch itself when they all are there, else a shallow copy with
-- those tensors copied.
-- The padded frames of a dense sequence input, and the padding of dense images, are set to 0 by
-- selection (masked_fill of a copy): a weight gradient dW += x^T dz reads the padding with
-- dz = 0 there, and 0 * NaN is NaN, so a NaN or Inf left in padding would reach it.
function Network:on_device(batch)
  local moved
  local function copy_batch()
    if not moved then
      moved = {}
      for k, v in pairs(batch) do moved[k] = v end
    end
  end
  local pad
  for key in pairs(self.used_extern) do
    local x, e = batch[key], self.ext[key]
    local where = self:device_of(key)
    if x:device() ~= where then
      copy_batch()
      moved[key] = x:to(where)
    end
    local len = batch.lengths
    if self.input_keys[key] and not e.sparse and e.spatial ~= 2 and len
        and len:min() < x:size(1) then
      local T, B = x:size(1), len:size(1)
      pad = pad or rl.arange(T):view(T, 1, 1):ge(len:float():view(1, B, 1)):to(self.device)
      copy_batch()
      moved[key] = (moved[key] == x and x:clone() or moved[key]):masked_fill_(pad, 0)
    end
    -- the same for the padding of images (outside each image's height and width), which a
    -- layer's weight gradient reads too (mdlstm: dW += X^T dZ)
    local sz = batch.sizes
    if self.input_keys[key] and not e.sparse and e.spatial == 2 and sz and x:dim() == 4
        and sz:dim() == 2 and sz:size(1) == x:size(3)
        and (sz:select(2, 1):min() < x:size(1) or sz:select(2, 2):min() < x:size(2)) then
      local H, W, B = x:size(1), x:size(2), x:size(3)
      local hs, ws = sz:select(2, 1):float():view(1, 1, B, 1), sz:select(2, 2):float():view(1, 1, B, 1)
      local ipad = (rl.arange(H):view(H, 1, 1, 1):ge(hs):float()
        + rl.arange(W):view(1, W, 1, 1):ge(ws):float()):gt(0):to(self.device)
      copy_batch()
      moved[key] = (moved[key] == x and x:clone() or moved[key]):masked_fill_(ipad, 0)
    end
  end
  return moved or batch
end

-- The inputs of node and their sequence lengths or image sizes (checked to agree).
function Network:gather_inputs(node, batch)
  local inputs, geom = node.inputs, nil
  for k, src in ipairs(node.srcs) do
    local p = self.by_name[src]
    local g
    if p then
      inputs[k], g = p.out, p.geom
    else
      inputs[k] = batch[src]
      g = self.ext[src].spatial == 2 and batch.sizes or batch.lengths
    end
    if geom and not same_geometry(geom, g) then
      fail("%s: its inputs '%s' and '%s' have different %s",
        where(node.name, node.layer.class), node.srcs[1],
        src, node.rank == 2 and "image sizes" or "sequence lengths")
    end
    geom = g
  end
  return inputs, geom
end

-- Runs first(), then second(), then finish(), always all three (finish joins what first
-- started); raises the first error of them.
-- The calls of a pair (forward_pair, backward): queue_a() and queue_b() check and queue the two
-- layers' calls (layer:_forward_queue, _backward_queue), wait_a() and wait_b() run them at once
-- (the first _wait runs both, one on the pool's helper) and take their results. Every call
-- queued is waited for, also after an error elsewhere, and the first error is raised.
local function run_pair(queue_a, queue_b, wait_a, wait_b)
  local okqa, eqa = pcall(queue_a)
  local okqb, eqb, okwa, ewa, okwb, ewb = true, nil, true, nil, true, nil
  if okqa then okqb, eqb = pcall(queue_b) end
  if okqa then okwa, ewa = pcall(wait_a) end
  if okqa and okqb then okwb, ewb = pcall(wait_b) end
  if not okqa then error(eqa, 0) end
  if not okqb then error(eqb, 0) end
  if not okwa then error(ewa, 0) end
  if not okwb then error(ewb, 0) end
end

-- Whether the pairs of M.new run concurrently now: on the CPU with more than one thread (on one
-- thread, as a user who set one asks, the two layers of a pair run one after the other).
function Network:concurrent_pairs()
  return self.device == "cpu" and rl.get_num_threads() > 1
end

-- The forward of the pair a, b (see pair_next in M.new): both at once, one per thread.
function Network:forward_pair(a, b, batch, train)
  local ga, gb
  run_pair(function()
    local inputs
    inputs, ga = self:gather_inputs(a, batch)
    a.layer:_forward_queue(inputs, ga, train)
  end, function()
    local inputs
    inputs, gb = self:gather_inputs(b, batch)
    b.layer:_forward_queue(inputs, gb, train)
  end, function()
    a.out, a.geom = a.layer:_wait(), ga
  end, function()
    b.out, b.geom = b.layer:_wait(), gb
  end)
end

---------------------------------------------------------------------------- carried state

-- Classes that look at one frame at a time (their output at t depends on frame t alone).
local FRAME_WISE = {embedding = true, softmax = true, linear = true, activation = true,
  dropout = true, combine = true, copy = true, layer_norm = true}

-- Why the network cannot carry its state over chunks (a message naming the layer), or nil.
-- Fills self.carried: the nodes of forward lstm/gru layers.
function Network:carry_unfit()
  if self.carried then return nil end
  local carried = {}
  for _, node in ipairs(self.nodes) do
    local d = self.description[node.name]
    local class = node.rec and "rec" or node.layer.class
    if not node.rec and layers.has_state(node.layer) then
      if d.direction == -1 then
        return util.layer_where(node.name, class) .. " runs backwards in time (direction = -1): "
          .. "its state cannot be carried from one chunk to the next (a backward or bidirectional "
          .. "model sees the rest of the sequence, which a chunk does not have)"
      end
      carried[#carried + 1] = node
    elseif not FRAME_WISE[class] then
      return string.format("layer '%s' (class %s) is not a forward lstm/gru or a frame-wise layer "
        .. "(%s): its state or context cannot be carried over chunks", node.name, class,
        "embedding, softmax, linear, activation, dropout, combine, copy, layer_norm")
    end
  end
  self.carried = carried
  return nil
end

-- Before the forward of a batch with state_from: each carried layer's initial state, gathered
-- from the final states kept by the previous carrying forward (zeros where state_from is 0).
function Network:carry_in(state_from, B)
  local why = self:carry_unfit()
  if why then fail("net:forward: batch.state_from (carried state): %s", why) end
  if type(state_from) ~= "table" or #state_from ~= B then
    fail("net:forward: batch.state_from must be a list of %d integers (one per sequence), got %s",
      B, type(state_from) == "table" and #state_from .. " entries" or type(state_from))
  end
  local prev = self.carried_B or 0
  local identity = prev == B
  for b = 1, B do
    local s = state_from[b]
    if math.type(s) ~= "integer" or s < 0 or s > prev then
      fail("net:forward: batch.state_from[%d] = %s: expected 0 (a sequence starts) or a slot "
        .. "1..%d of the previous carrying forward%s", b, tostring(s), prev,
        prev == 0 and " (there was none: the first batch must have state_from all 0)" or "")
    end
    identity = identity and (s == 0 or s == b)
  end
  for _, node in ipairs(self.carried) do
    local layer = node.layer
    local st = node.carry or {init = {}, kept = {}}
    node.carry = st
    local names, dims = layer:state_names()
    for k in ipairs(names) do
      local init = st.init[k]
      if not init or init:size(1) ~= B or init:device() ~= self.device then
        init = rl.zeros({B, dims[k]}, self.dtype, self.device)
        st.init[k] = init
      end
      local kept = st.kept[k]
      if identity then
        init:copy_(kept)
        for b = 1, B do
          if state_from[b] == 0 then init:select(1, b):zero_() end
        end
      else
        for b = 1, B do
          local row = init:select(1, b)
          if state_from[b] == 0 then row:zero_() else row:copy_(kept:select(1, state_from[b])) end
        end
      end
    end
    layer:set_initial_state(table.unpack(st.init, 1, #names))
    self.carry_active = true -- until carry_reset, even if this forward fails
  end
end

-- After a forward with state_from: keep each carried layer's final state for the next batch.
function Network:carry_out(B)
  for _, node in ipairs(self.carried) do
    local st, final = node.carry, {node.layer:final_state()}
    for k, s in ipairs(final) do st.kept[k] = self:buffer_like(st.kept[k], s):copy_(s) end
  end
  self.carried_B = B
end

-- The final states the last carrying forward kept: per carried layer (in self.carried's
-- order) the list of its state tensors in layer:state_names() order, each (B, dim), views of
-- the network's buffers (copy what must outlive the next forward). set_carried_state(states, B)
-- puts such states (B rows each) in their place, so that the next forward's
-- state_from = {i, ...} starts from row i: a caller that keeps states of its own (a decoder's
-- hypotheses, lua/rnnlua/lm.lua) restores any of them.
function Network:carried_state()
  local out = {}
  for k, node in ipairs(self.carried or {}) do
    out[k] = table.move(node.carry.kept, 1, #node.carry.kept, 1, {})
  end
  return out
end

function Network:set_carried_state(states, B)
  local why = self:carry_unfit()
  if why then fail("net:set_carried_state: %s", why) end
  for k, node in ipairs(self.carried) do
    local st = node.carry or {init = {}, kept = {}}
    node.carry = st
    st.kept = table.move(states[k], 1, #states[k], 1, {})
  end
  self.carried_B = B
end

-- A forward without state_from: the layers start from zeros again and nothing is kept.
function Network:carry_reset()
  for _, node in ipairs(self.carried or {}) do
    node.layer:set_initial_state(nil)
    node.carry = nil
  end
  self.carried_B, self.carry_active = nil, nil
end

-- A layer (a Lua layer, a rec unit's layer) that calls its own network's forward, backward,
-- search or to while that network runs it would overwrite the outputs, buffers and state the
-- running call is using, or recurse without end: an error naming the layer. net.running is
-- {what =, node =} while one of them runs; the to-be-closed guard clears it on every exit,
-- an error's included.
local Guard = {__close = function(g) g.net.running = nil end}
function Network:enter(what)
  local r = self.running
  if r then
    local node = r.node
    fail("%s: re-entrant call while %s runs%s: a layer must not call its own network's "
      .. "forward, backward, search or to", what, r.what,
      node and string.format(" layer '%s' (class %s)", node.name, node.layer.class) or "")
  end
  self.running = {what = what}
  return setmetatable({net = self}, Guard)
end

-- net:set_precision(p): "fp32", "bf16", "int8" or, on a CUDA device, "fp16" (see BF16_CLASSES)
-- from the next forward on.
function Network:set_precision(p)
  check_precision("net:set_precision", p, self.dtype, self.device)
  self.precision = p
  return self
end

-- The precision context around a forward or a backward: on the CPU the bf16 context
-- (kernels/cpu/gemm_bf16.h), whose bf16 copies of the weights are made once per pass (the
-- weights may have changed since the last forward; the backward takes them transposed, into the
-- forward's buffers); on a CUDA device the half context (kernels/cuda/context.h), which rounds
-- the flat parameters to bf16 or fp16 when their storage version changed. It is this network's
-- and active on this thread only: a float32 network enters with none, so that it never runs in
-- the precision of a network that called it (a Lua layer's); closed, the context of the caller
-- comes back, also on an error.
local Bf16Guard = {__close = function(g) rl._bf16_leave(g.prev) end}
local HalfGuard = {__close = function(g) rl._cuda_half_leave(g.prev) end}
function Network:bf16_enter()
  if self.dtype ~= "float32" then return nil end
  if self.device ~= "cpu" then
    if not rl._cuda_half_enter then return nil end -- a build without CUDA has no such network
    local ctx = nil
    if self.precision ~= "fp32" then
      if self.half_fmt ~= self.precision then
        self.half_ctx, self.half_fmt = rl._cuda_half_ctx(self.precision), self.precision
      end
      ctx = self.half_ctx
    end
    return setmetatable({prev = rl._cuda_half_enter(ctx, self.flat_params)}, HalfGuard)
  end
  local ctx = nil
  local p = self.precision
  if p == "bf16" or p == "int8" then
    -- one context per kind: a network switched between bf16 and int8 gets a new one
    if self.bf16_ctx and rl._bf16_is_int8(self.bf16_ctx) ~= (p == "int8") then
      self.bf16_ctx = nil
    end
    self.bf16_ctx = self.bf16_ctx or rl._bf16_ctx(p)
    ctx = self.bf16_ctx
  end
  return setmetatable({prev = rl._bf16_enter(ctx, self.flat_params)}, Bf16Guard)
end

-- Before a node's layer runs: bf16 (fp16) products for the classes that have them, float32 for
-- the rest (said once per layer when it has products of its own). cuDNN's RNNs (impl = "cudnn")
-- take their float32 path: their products are cuDNN's, not the context's.
function Network:bf16_node(node)
  local p = self.precision
  if p == "fp32" then return end
  local cls = node.layer.class
  local gpu = self.device ~= "cpu"
  local on = BF16_CLASSES[cls] and type(node.layer) == "userdata" and not (gpu and node.cudnn)
  if gpu then
    rl._cuda_half_on(on and self.half_ctx or nil)
  else
    rl._bf16_on(on and self.bf16_ctx or nil)
  end
  if not on and not NO_PRODUCTS[cls] and not self.fp32_noted[node.name] then
    self.fp32_noted[node.name] = true
    io.stderr:write(string.format("rnnlua: %s has no %s path%s: its products run in float32 "
      .. "(precision \"%s\")\n", where(node.name, cls), p,
      (gpu and node.cudnn) and " with impl = \"cudnn\"" or "", p))
  end
end

function Network:forward(batch, fopts)
  local guard <close> = self:enter("net:forward")
  local train = true
  if fopts ~= nil then
    check_opts("net:forward", fopts, FORWARD_OPTS)
    if fopts.train ~= nil and type(fopts.train) ~= "boolean" then
      fail("net:forward: train must be true or false, got %s", tostring(fopts.train))
    end
    if fopts.train ~= nil then train = fopts.train end
  end
  local B = self:check_batch(batch)
  batch = self:on_device(batch)
  if batch.state_from ~= nil then
    self:carry_in(batch.state_from, B)
  elseif self.carry_active then
    self:carry_reset()
  end
  self.forwarded = false
  local bf16 <close> = self:bf16_enter()
  local loss, errors, n_frames = 0, 0, nil
  local n_units, n_labels, n_skipped = 0, 0, 0
  local skip = nil
  for i, node in ipairs(self.nodes) do
    if node == skip then goto continue end
    self.running.node = node
    self:bf16_node(node)
    -- a pair whose layers draw masks runs one layer after the other in training: both would
    -- take their draws from the one generator at once, in whichever order the threads reach it
    if node.pair_next and self:concurrent_pairs()
        and not (train and (node.draws or self.nodes[i + 1].draws)) then
      skip = self.nodes[i + 1]
      self:forward_pair(node, skip, batch, train)
      goto continue
    end
    do
      local inputs, geom = self:gather_inputs(node, batch)
      local l, e, f = 0, 0, nil
      if node.rec then
        node.out, l, e, f = node.layer:forward(inputs, geom or batch.lengths, train, batch)
        node.geom = node.layer:out_geometry()
        n_units = n_units + (f or 0)
      elseif node.fold then
        -- an any-rank layer on images: (H, W, B, F) as (H*W, B, F) frames
        local x1 = inputs[1]
        local H, W = x1:size(1), x1:size(2)
        node.folded = node.folded or {}
        for k, x in ipairs(inputs) do
          node.folded[k] = (x:is_contiguous() and x or x:contiguous()):view(H * W, B, x:size(4))
        end
        local out = node.layer:forward(node.folded, self:full_lengths(H * W, B), train)
        node.out, node.geom = out:view(H, W, B, node.layer.n_out), geom
      elseif node.ctc then
        local tlen = batch["lengths_" .. node.target]
        if tlen == nil then
          fail("%s: loss 'ctc' needs batch.lengths_%s, the (B) int32 lengths of the "
            .. "label sequences in batch.%s (rl.batches gives them)",
              where(node.name, node.layer.class), node.target,
            node.target)
        end
        local r, sk
        node.out, l, e, f, r, sk = node.layer:forward(inputs, geom, train, batch[node.target],
          tlen)
        node.geom = geom
        n_labels, n_skipped = n_labels + r, n_skipped + sk
        n_units = n_units + r
      elseif node.loss_kind == "layer" then
        check_frame_target(node, batch, inputs[1]:size(1), geom)
        node.out, l, e, f = node.layer:forward(inputs, geom, train, batch[node.target])
        node.geom = geom
        n_units = n_units + (f or 0)
      else
        node.out = node.layer:forward(inputs, geom, train)
        node.geom = node.layer.out_geometry and node.layer:out_geometry() or geom
        if node.geom:dim() ~= (node.rank == 2 and 2 or 1) then
          fail("layer '%s' (class %s) gives %s but reports no %s", node.name, node.layer.class,
            RANK_NAME[node.rank], node.rank == 2 and "image sizes" or "sequence lengths")
        end
        if node.loss_kind == "mse" then
          check_frame_target(node, batch, node.out:size(1), node.geom)
          node.loss_grad = self:buffer_like(node.loss_grad, node.out)
          l, f = rl._loss_mse(node.out, batch[node.target], node.geom, node.loss_grad)
          if node.loss_scale ~= 1 then node.loss_grad:mul_(node.loss_scale) end
          n_units = n_units + (f or 0)
        end
      end
      if node.loss then
        node.last_loss, node.last_errors = l * node.loss_scale, e
        loss, errors = loss + l * node.loss_scale, errors + e
        n_frames = n_frames or f
      end
    end
    ::continue::
  end
  if batch.state_from ~= nil then self:carry_out(B) end
  self.B, self.lengths, self.sizes, self.last_batch = B, batch.lengths, batch.sizes, batch
  self.loss, self.n_errors = loss, errors
  self.n_frames = n_frames or (batch.lengths and batch.lengths:sum()) or B
  self.n_error_units = n_units > 0 and n_units or self.n_frames
  self.n_labels, self.n_skipped = n_labels, n_skipped
  self.forwarded = true
  return loss, errors
end

---------------------------------------------------------------------------- backward

-- buf when it has the shape of t, else a new zeroed one.
function Network:buffer_like(buf, t)
  local size = t:size()
  if buf and buf:size() == size then return buf end
  return rl.zeros(size, self.dtype, self.device)
end

-- A (H*W, B, F) view of an image tensor (H, W, B, F), for a folded layer.
local function fold(t)
  return t:view(t:size(1) * t:size(2), t:size(3), t:size(4))
end

-- Sum of the grad_in buffers of edges into acc (with `=` for the first unless add).
local function sum_into(acc, edges, add)
  for i, e in ipairs(edges) do
    local g = e.node.grad_in[e.slot]
    if i == 1 and not add then acc:copy_(g) else acc:add_(g) end
  end
end

-- The backward of a layer that computes its own loss, with that loss scaled by s: the layer
-- adds the gradient of (own loss + <grad_out, out>), so it gets grad_out / s and the result
-- is scaled by s (param grads: old + s * (new - old); input grads: s * new).
local function scaled_loss_backward(node, gout, grad_in, s)
  local before = {}
  if gout then gout:mul_(1 / s) end
  for i, v in ipairs(node.views) do before[i] = v.grad:clone() end
  node.layer:backward(gout, grad_in)
  for i, v in ipairs(node.views) do v.grad:sub_(before[i]):mul_(s):add_(before[i]) end
  for _, g in ipairs(grad_in) do if g then g:mul_(s) end end
end

-- The gradient flowing into node's output (nil for a loss layer that starts from its own
-- loss), with node.grad_in made ready for its input gradients.
function Network:prepare_backward(node)
  local gout = nil
  local edges = node.grad_edges
  if node.loss_kind == "mse" then
    gout = node.loss_grad
    -- the loss gradient times the dynamic loss scale (the forward made it with loss_scale)
    if self.grad_scale ~= 1 then gout:mul_(self.grad_scale) end
    sum_into(gout, edges, true)
  elseif #edges == 1 and node.loss_kind == nil then
    gout = edges[1].node.grad_in[edges[1].slot]
  elseif #edges > 0 then
    node.grad_out = self:buffer_like(node.grad_out, node.out)
    gout = node.grad_out
    sum_into(gout, edges, false)
  end
  for k = 1, #node.srcs do
    if node.wants_grad_in[k] then
      node.grad_in[k] = self:buffer_like(node.grad_in[k] or nil, node.inputs[k])
    else
      node.grad_in[k] = false
    end
  end
  return gout
end

function Network:backward()
  local guard <close> = self:enter("net:backward")
  if not self.forwarded then
    error("net:backward: needs a net:forward before it (once per forward)", 2)
  end
  if #self.loss_nodes == 0 then error("net:backward: the network has no loss", 2) end
  if self.precision == "int8" then
    error("net:backward: precision \"int8\" is for inference only (its products have no "
      .. "backward); net:set_precision(\"fp32\") or \"bf16\" to train", 2)
  end
  local gs = self.grad_scale
  if math.type(gs) == nil or not (gs > 0 and gs < math.huge) then
    error(string.format("net:backward: net.grad_scale must be a finite number > 0, got %s",
      tostring(gs)), 2)
  end
  self.forwarded = false
  ready_grads(self)
  local bf16 <close> = self:bf16_enter()
  local i = #self.nodes
  while i >= 1 do
    local node, prev = self.nodes[i], self.nodes[i - 1]
    self.running.node = node
    self:bf16_node(node)
    if prev and prev.pair_next and self:concurrent_pairs() and node.do_backward
        and prev.do_backward then
      -- the pair of forward_pair, both at once
      run_pair(function()
        node.layer:_backward_queue(self:prepare_backward(node), node.grad_in)
      end, function()
        prev.layer:_backward_queue(self:prepare_backward(prev), prev.grad_in)
      end, function() node.layer:_wait() end, function() prev.layer:_wait() end)
      i = i - 2
    else
      if node.do_backward then
        local gout = self:prepare_backward(node)
        if node.fold then
          local gin = {}
          for k = 1, #node.srcs do gin[k] = node.grad_in[k] and fold(node.grad_in[k]) end
          node.layer:backward(gout and fold(gout), gin)
        elseif (node.loss_kind == "layer" or node.loss_kind == "rec")
            and node.loss_scale * self.grad_scale ~= 1 then
          scaled_loss_backward(node, gout, node.grad_in, node.loss_scale * self.grad_scale)
        else
          node.layer:backward(gout, node.grad_in)
        end
      end
      i = i - 1
    end
  end
  if self.input_grads_on then
    for key in pairs(self.input_keys) do
      if self.ext[key].sparse then goto continue end -- class indices have no gradient
      local edges = {}
      for _, node in ipairs(self.nodes) do
        if node.do_backward then
          for k, src in ipairs(node.srcs) do
            if src == key then edges[#edges + 1] = {node = node, slot = k} end
          end
        end
      end
      local buf = self:buffer_like(self.input_grad_bufs[key], self.last_batch[key])
      buf:zero_()
      sum_into(buf, edges, true)
      self.input_grad_bufs[key] = buf
      ::continue::
    end
  end
end

---------------------------------------------------------------------------- access

-- Beam search through the rec layer's choice (lua/rnnlua/rec.lua, M.search).
function Network:search(batch, opts)
  local guard <close> = self:enter("net:search")
  return rec.search(self, batch, opts)
end

-- Tensors handed out (params, grads, param_list, layer views, input_grad) are shares: new
-- tensor objects on the network's storage, as Torch7's and PyTorch's parameters() give views.
-- Closing one (`local p <close> = net:params()`, a finished coroutine) releases only that
-- reference; the network's own tensor stays usable (closing it made net:to, a checkpoint and
-- the next optimizer fail, 'the tensor was freed').
local function share(t)
  if t == nil or t:dim() == 0 then return t end
  return t:narrow(1, 1, t:size(1))
end

function Network:params() return share(self.flat_params) end
function Network:grads() return share(ready_grads(self)) end
function Network:zero_grads() ready_grads(self):zero_() end
function Network:num_params() return self.total end

function Network:param_list()
  ready_grads(self)
  local list = {}
  for i, v in ipairs(self.plist) do
    list[i] = {layer = v.layer, name = v.name, value = share(v.value), grad = share(v.grad)}
  end
  return list
end

-- The gradient of the loss with respect to a dense input, after backward (input_grads = true).
function Network:input_grad(key)
  if not self.input_grads_on then
    error("net:input_grad: build the network with {input_grads = true}", 2)
  end
  return share(self.input_grad_bufs[key])
end

local LayerView = {}
LayerView.__index = LayerView

function LayerView:__tostring()
  local lines = {string.format("layer '%s' (class %s, from %s, n_out %d)", self.name, self.class,
    table.concat(self.from, ", "), self.n_out)}
  for _, v in ipairs(self.param_names) do
    lines[#lines + 1] = string.format("  %s %s", v, tostring(self.params[v]:size()))
  end
  if self.output then lines[#lines + 1] = "  output " .. describe(self.output) end
  return table.concat(lines, "\n")
end

-- The layer `name` as seen from the REPL: output (of the last forward), params and grads by
-- name (views of the flat buffers), class, n_out, from, and the layer object itself; rank (1
-- sequences, 2 images) and geometry: the (B) lengths or (B, 2) sizes of the last output.
function Network:layer(name)
  local node = self.by_name[name]
  if not node then
    error(string.format("net:layer: no layer '%s' in the network (layers: %s)", tostring(name),
      table.concat(self.order, ", ")), 2)
  end
  local view = setmetatable({
    name = name, class = node.layer.class, n_out = node.layer.n_out, from = node.srcs,
    output = share(node.out), params = {}, grads = {}, param_names = {}, object = node.layer,
    rank = node.rank, geometry = node.geom,
  }, LayerView)
  for i, v in ipairs(node.views) do
    if self.grads_unset then v.grad:zero_() end -- the layer's part only (ready_grads)
    view.params[v.name], view.grads[v.name], view.param_names[i] = share(v.value), share(v.grad),
      v.name
  end
  return view
end

function Network:__tostring()
  local lines = {string.format("network (%s, %s, %d parameters)", self.dtype, self.device,
    self.total)}
  for _, node in ipairs(self.nodes) do
    lines[#lines + 1] = string.format("  %-12s %-10s from %-16s n_out %-5d params %d%s", node.name,
      node.layer.class, table.concat(node.srcs, ","), node.layer.n_out, node.layer.num_params,
      node.loss and string.format("  loss %s -> %s", node.loss, node.target) or "")
  end
  return table.concat(lines, "\n")
end

function M.install(module)
  rl = module
  rl.network = M.new
  return M
end

return M
