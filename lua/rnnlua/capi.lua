-- The Lua half of the C API (include/rnnlua.h, lua/capi.c): the model a handle holds.
--
--   local m = require("rnnlua.capi").load(source, layer, device, who, lua_file)
--       source: a checkpoint's path or m:snapshot() of a model loaded before (a session's
--       copy); raises naming the file; lua_file (or nil): run first (rl.layers.register calls)
--   m.key, m.in_dim, m.sparse      the network's one input (its extern_data entry)
--   m.layer, m.out_dim             the model's layer and its n_out
--   m.not_causal                   why the network cannot stream (naming the layer), or nil
--   m.num_params
--   m.blank, m.labels              a CTC layer's blank class and its target's labels in the
--                                  checkpoint (a list of strings), each nil when none
--   m:set_precision(p, who)        "fp32", "bf16" or "int8": this model's and its later sessions' products
--   m:run(x, lengths, layer, state_from, who) -> out, out_lengths
--       x: (T, B, F) float32 or (T, B) int32 class indices, lengths (B) int32; layer: nil (the
--       model's) or any layer of the network; state_from: nil (a plain batch) or 0/1 for the one
--       stream of a push (0: it starts here, 1: it goes on from the previous push). out: the
--       layer's output as a contiguous float32 CPU tensor (T', B, dim), out_lengths (B) int32.
--       Refused for an attention decoder (m.choice).
--   m:state() -> the stream's carried state: a flat list of (1, dim) tensors (each carried layer's
--       states in net:carried_state() order), views of the network's buffers
--   m:batch_state(B) -> the flat list of the (B, dim) states a batch of B streams starts from
--   m:run_many(x, lengths, state_from, who) -> out, out_lengths, final: the pushes of B streams
--       as one batch (rl_session_push_many) from m:batch_state(B), which lua/capi.c filled;
--       final: the flat list of the (B, dim) final states (row b: stream b's)
--   m:own_state() -> the flat list of this stream's (1, dim) states, made its carried state
--   m.c_push_unfit_why             why lua/capi.c cannot run a push itself (m:c_push_unfit()),
--                                  or nil: then its pushes (and batched pushes) run in C
--   m:c_push_plan(rows) -> what they run: the layers, their wiring and the state buffers
--   m.choice                       the model's layer is an attention decoder (a rec layer with a
--                                  choice): {V = its labels, labels = their names or nil}
--   m:search(x, lengths, beam, lm, weight, bonus, who) -> {{labels =, score =}, ...}  (rl.search's)
--   m:lm_target()                  what an LM is fused into (a CTC layer, a decoder), or nil
--   M.lm_load(...), M.lm_decode(...)  an LM handle's state (rl_lm_load, rl_ctc_decode_lm)
--
-- The network is the one rl.forward builds (rnnlua.forward's load_model, losses left out) and
-- every batch goes through rnnlua.forward's run, so the C API gives the numbers rl.forward
-- writes; streaming is the network's carried state (rnnlua.network: batch.state_from), which
-- gives the outputs of the whole sequence. The C side keeps one Lua state per model and per
-- session and calls these functions from one thread at a time per state.
local M = {}
local forward = require("rnnlua.forward")
local util = require("rnnlua.util")
local BF16_PRODUCTS = require("rnnlua.network").BF16_CLASSES

local Model = {}
Model.__index = Model

local fail = require("rnnlua.util").fail

function Model:run(x, lengths, layer, state_from, who)
  if self.choice then -- its network runs only with the labels it chooses (or a target)
    fail("%s: layer '%s' (class rec) of %s is an attention decoder: its labels come from its beam "
      .. "search (rl_model_search); for another layer's output load the model with that layer",
      who, self.layer, self.path)
  end
  if state_from ~= nil and self.not_causal then
    fail("%s: %s: the model cannot stream: %s", who, self.path, self.not_causal)
  end
  if not self.sparse and self.net.dtype ~= "float32" then x = x:double() end
  local fm = self.fm
  if layer ~= nil and layer ~= self.layer then
    if not self.net.by_name[layer] then
      fail("%s: layer: no layer '%s' in the network of %s (it computes: %s)", who, layer,
        self.path, table.concat(self.net.order, ", "))
    end
    fm = util.copy(self.fm)
    fm.layer = layer
  end
  local batch = {[self.key] = x, lengths = lengths}
  if state_from ~= nil then
    batch.state_from = type(state_from) == "table" and state_from or {state_from}
  end
  -- a push's few-row input products read the model's packed W; a batch gives the model's numbers
  local pushing = state_from ~= nil
  if self.adopted and pushing ~= self.pushing then
    for _, l in ipairs(self.adopted) do l:_adopted_inputs(pushing) end
    self.pushing = pushing
  end
  local ok, out, og = pcall(forward.run, fm, batch)
  if not ok then fail("%s: %s", who, util.strip_internal(tostring(out))) end
  if out:dtype() ~= "float32" then out = out:float() end
  if out:dim() ~= 3 then
    fail("%s: layer '%s' gives %d-dimensional output; the C API gives sequences (T, B, dim)",
      who, fm.layer, out:dim())
  end
  return out:contiguous(), og
end

-- The carried state of the stream (see the header), after net:carry_unfit() filled net.carried.
function Model:state()
  local flat = {}
  for _, states in ipairs(self.net:carried_state()) do
    for _, t in ipairs(states) do flat[#flat + 1] = t end
  end
  return flat
end

-- Per carried layer the list of its states, each a zeroed (rows, dim) tensor.
local function state_buffers(net, rows)
  local out = {}
  for k, node in ipairs(net.carried) do
    local _, dims = node.layer:state_names()
    out[k] = {}
    for s, d in ipairs(dims) do out[k][s] = rl.zeros({rows, d}, net.dtype, net.device) end
  end
  return out
end

-- Streams pushed together: each stream is a row of one batch that starts from its own state
-- (net:set_carried_state puts the rows in place, state_from picks them), so every row gets the
-- numbers its stream pushed alone would get, up to the float32 rounding of a product of B rows
-- against one of one row. lua/capi.c copies the rows: each stream's state into the batch's
-- (m:batch_state(B), before m:run_many) and the batch's final states into each stream's
-- (m:own_state(), after), so that no tensor handle is made a row.
function Model:batch_state(n)
  if self.stack_n ~= n then
    self.stack, self.stack_n = state_buffers(self.net, n), n
    local flat = {}
    for _, states in ipairs(self.stack) do
      for _, t in ipairs(states) do flat[#flat + 1] = t end
    end
    self.stack_flat = flat
  end
  return self.stack_flat
end

function Model:run_many(x, lengths, state_from, who)
  if self.not_causal then fail("%s: %s: the model cannot stream: %s", who, self.path, self.not_causal) end
  self.net:set_carried_state(self.stack, self.stack_n)
  local out, og = self:run(x, lengths, nil, state_from, who)
  return out, og, self:state()
end

-- This stream's state buffers (1, dim) as its carried state; their flat list, which lua/capi.c
-- fills with the stream's row of a batch's final states.
function Model:own_state()
  local net = self.net
  if not self.own then
    self.own = state_buffers(net, 1)
    local flat = {}
    for _, states in ipairs(self.own) do
      for _, t in ipairs(states) do flat[#flat + 1] = t end
    end
    self.own_flat = flat
  end
  net:set_carried_state(self.own, 1)
  return self.own_flat
end

-- Why lua/capi.c cannot run a push of this model itself (a message naming the layer or the
-- option), or nil when it can: a float32 CPU network that streams (a checkpoint's data_norm
-- with a dense input is applied in C as Model:run's forward applies it), and whose
-- every node is a C layer fed by the input or by nodes before it (no rec unit, image or loss;
-- a pair of layers that net:forward runs at once runs one after the other, the same bits). The
-- network of such a model is a stack of C layers that net:forward would only hand tensors from
-- one to the next.
function Model:c_push_unfit()
  local net = self.net
  if self.not_causal then return self.not_causal end
  if self.choice then return "the model's layer is an attention decoder" end
  if net.device ~= "cpu" or net.dtype ~= "float32" then
    return string.format("the network runs on %s in %s (the C path: the CPU in float32)",
      net.device, net.dtype)
  end
  local ext = net.ext and net.ext[self.key]
  if self.fm.norm and (not ext or ext.sparse) then
    return "the checkpoint normalises its input (data_norm), which is sparse"
  end
  local index = {}
  for i, node in ipairs(net.nodes) do
    local class = node.rec and "rec" or node.layer.class
    local why = type(node.layer) ~= "userdata" and "is a Lua layer"
      or node.rec and "is a rec unit" or node.rank ~= 1 and "takes or gives images"
      or node.fold and "takes images" or node.loss and "computes a loss"
    if why then return util.layer_where(node.name, class) .. " " .. why end
    for _, src in ipairs(node.srcs) do
      if not index[src] and src ~= self.key then
        return util.layer_where(node.name, class) .. " reads '" .. src .. "'"
      end
    end
    index[node.name] = i
  end
  if not index[self.layer] then return "the model's layer is not among the network's nodes" end
  return nil
end

-- What lua/capi.c runs a session's pushes with (Model:c_push_unfit() is nil), taken at its
-- first push and after every plain forward: {nodes = {{layer =, srcs = {0: the input, k: node
-- k}, bf16 = its products in the network's precision (bf16 or int8)}, ...}, out = the model layer's node,
-- norm = {mean =, inv =} (F) of the checkpoint's data_norm, or nil, states = the own state
-- buffers (Model:own_state, the carried layers' in net.carried order, the one state the Lua path
-- reads and writes too), carried = their nodes, bf16_ctx =, params =}. rows: nil for a
-- session, or the rows of rl_session_push_many's batches on the model's batch network, whose
-- states are then Model:batch_state(rows). The recurrent layers' input products read the
-- adopted packs, as Model:run's pushes do, and net.carry_active makes the next plain forward
-- drop the initial states the C side set.
function Model:c_push_plan(rows)
  local net = self.net
  if self.adopted and not self.pushing then
    for _, l in ipairs(self.adopted) do l:_adopted_inputs(true) end
    self.pushing = true
  end
  -- bf16 and int8 products both run through the precision context (kernels/cpu/gemm_bf16.h),
  -- of the network's kind
  local p = net.precision
  local bf16 = p == "bf16" or p == "int8"
  if bf16 and not (net.bf16_ctx and rl._bf16_is_int8(net.bf16_ctx) == (p == "int8")) then
    net.bf16_ctx = rl._bf16_ctx(p)
  end
  local index, nodes = {}, {}
  for i, node in ipairs(net.nodes) do
    index[node.name] = i
    local srcs = {}
    for k, src in ipairs(node.srcs) do srcs[k] = index[src] or 0 end
    nodes[i] = {layer = node.layer, srcs = srcs, bf16 = bf16 and BF16_PRODUCTS[node.layer.class]}
  end
  local carried = {}
  for k, node in ipairs(net.carried) do carried[k] = index[node.name] end
  local states = rows and self:batch_state(rows) or self:own_state()
  net.carry_active = true
  local n = self.fm.norm
  return {nodes = nodes, out = index[self.layer], states = states, carried = carried,
    bf16_ctx = bf16 and net.bf16_ctx or nil, params = net.flat_params,
    norm = n and {mean = n.mean:contiguous(), inv = n.inv:contiguous()}}
end

-- What a session's state builds its network from (lua/capi.c shares its tensors with the
-- session's state, not copying them): the checkpoint as this model loaded it, without the
-- training state, and the network's flat parameter buffer, which the session's network binds
-- read-only (a forward writes no parameter). A model on a device other than the CPU gives the
-- saved parameters instead, which the session copies to its device.
-- What an LM (rl_lm_load) is fused into: this model's CTC layer or attention decoder, or nil.
function Model:lm_target()
  if self.blank then
    return {kind = "ctc", blank = self.blank, V = self.out_dim, labels = self.labels}
  end
  if self.choice then return {kind = "search", V = self.choice.V, labels = self.choice.labels} end
  return nil
end

-- rl_model_search: the beam search of the model's layer, an attention decoder, over one batch
-- as rl.search runs it (net:search, the end label 0, the choice's max_seq_len): per sequence
-- {labels = {0-based labels, the end label left out}, score =}. beam: nil (the choice's
-- beam_size) or the beam; lm: nil or an LM handle's table (M.lm_load's, search = true).
function Model:search(x, lengths, beam, lm, weight, bonus, who)
  if not self.choice then
    fail("%s: model: layer '%s' of %s is no attention decoder (a rec layer with a choice layer "
      .. "in its unit; load the model with options->layer naming one)", who, self.layer, self.path)
  end
  if not self.sparse and self.net.dtype ~= "float32" then x = x:double() end
  local opts = {layer = self.layer, beam_size = beam}
  if lm then
    opts.lm = util.copy(lm.lm)
    opts.lm.weight, opts.lm.bonus = weight, bonus
  end
  local ok, res = pcall(self.net.search, self.net, {[self.key] = x, lengths = lengths}, opts)
  if not ok then fail("%s: %s", who, util.strip_internal(tostring(res))) end
  return res
end

function Model:snapshot()
  local ck = self.fm.ck
  local snap = {path = ck.path, epoch = ck.epoch, step = ck.step, dtype = ck.dtype,
          description = ck.description, extern_data = ck.extern_data,
          data_norm = ck.data_norm and {mean = ck.data_norm.mean:cpu():contiguous(),
                                        std = ck.data_norm.std:cpu():contiguous()},
          param_order = ck.param_order}
  if self.net.device == "cpu" then
    snap.flat_params = self.net.flat_params
    snap.precision, snap.bf16_ctx = self.net.precision, self.net.bf16_ctx
    snap.packs = {}
    for _, node in ipairs(self.net.nodes) do
      if type(node.layer) == "userdata" then snap.packs[node.name] = node.layer:_frozen_packs() end
    end
  else
    snap.param_tensors = {}
    for name, t in pairs(ck.param_tensors) do snap.param_tensors[name] = t:cpu():contiguous() end
  end
  return snap
end

-- One frame of zeros through the model: the packs of its weights made.
local function warm_up(fm, ext)
  local net = fm.net
  local x = ext.sparse and rl.zeros({1, 1}, "int32") or rl.zeros({1, 1, ext.dim}, net.dtype)
  local key = util.sorted_keys(net.used_extern)[1]
  forward.run(fm, {[key] = x, lengths = rl.tensor({1}, "int32")})
end

-- The parameters of a loaded model never change, so its recurrent layers pack their recurrent
-- weights for the per-step kernel once (layer:_freeze_packs) instead of at every forward, and
-- the sessions' networks read the model's packs (Model:snapshot, layer:_adopt_packs) instead of
-- packing copies of their own. The model packs its input weights W too without using them (its
-- forward keeps OpenBLAS's product, rl.forward's numbers); a session's pushes read them
-- (layer:_adopted_inputs): OpenBLAS repacks W at every one-frame product. Pushes then differ
-- from the whole sequence's numbers by float32 rounding. Returns a session's adopting layers.
-- The model packs them in a one-frame forward here, so that sessions in many threads only read
-- them (packs a session lacks, of layers off the model layer's path, it makes itself).
local function share_packs(fm, snap, ext)
  local net = fm.net
  if snap then
    if snap.precision == "bf16" or snap.precision == "int8" then
      net:set_precision(snap.precision)
      net.bf16_ctx = snap.bf16_ctx
    end
    local adopted = {}
    for name, p in pairs(snap.packs or {}) do
      local node = net.by_name[name]
      if node and type(node.layer) == "userdata" then
        node.layer:_adopt_packs(p)
        adopted[#adopted + 1] = node.layer
      end
    end
    return adopted
  end
  local frozen = false
  for _, node in ipairs(net.nodes) do
    if type(node.layer) == "userdata" and node.layer:_freeze_packs() then frozen = true end
  end
  if not frozen then return end
  warm_up(fm, ext)
end

-- The precision of the model's products ("fp32", "bf16" or "int8", rl.network's precision
-- option) for its forwards and the sessions opened from now on. In bf16 (int8) the weights are
-- rounded (quantized) and packed once, into a context that never drops them (rl._bf16_freeze),
-- which those sessions share.
function Model:set_precision(p, who)
  if p ~= "fp32" and p ~= "bf16" and p ~= "int8" then
    fail("%s: precision: \"%s\" is none of \"fp32\", \"bf16\", \"int8\"", who, p)
  end
  local net = self.net
  local ok, err = pcall(net.set_precision, net, p)
  if not ok then fail("%s: precision: %s: %s", who, self.path, util.strip_internal(tostring(err))) end
  if net.bf16_ctx and p ~= "fp32" and rl._bf16_is_int8(net.bf16_ctx) ~= (p == "int8") then
    net.bf16_ctx = nil -- the other kind's
  end
  if p ~= "fp32" and not net.bf16_ctx then
    net.bf16_ctx = rl._bf16_ctx(p)
    rl._bf16_freeze(net.bf16_ctx)
    warm_up(self.fm, net.ext[self.key])
  end
end

-- The choice layer of layer `layer` of net when it is an attention decoder (a rec layer with a
-- choice in its unit), else nil.
function M.decoder_choice(net, layer)
  local node = net.by_name[layer]
  return node and node.rec and type(node.layer) == "table" and node.layer.choice or nil
end

-- The labels extern_data stores for `key` in checkpoint ck, or nil.
local function ck_labels(ck, key)
  local e = ck.extern_data and ck.extern_data[key]
  return e and type(e.labels) == "table" and e.labels or nil
end

-- source: a checkpoint's path, or a snapshot of a model (Model:snapshot)
function M.load(source, layer, device, who, lua_file)
  if lua_file then
    local ok, err = pcall(dofile, lua_file)
    if not ok then fail("%s: lua_file %s: %s", who, lua_file, tostring(err)) end
  end
  local path, ck = source, nil
  if type(source) == "table" then path, ck = source.path, source end
  local fm = forward.load_model(path, layer, device, who, ck)
  local net = fm.net
  local choice = M.decoder_choice(net, layer)
  local keys = {}
  for _, k in ipairs(util.sorted_keys(net.used_extern)) do
    if not (choice and k == choice.target) then keys[#keys + 1] = k end
  end
  if #keys ~= 1 then
    fail("%s: %s: layer '%s' reads %d inputs (%s); the C API takes networks with one input", who,
      path, layer, #keys, table.concat(keys, ", "))
  end
  local e = net.ext[keys[1]]
  if e.spatial == 2 or fm.images then
    fail("%s: %s: the network reads or gives images; the C API takes sequences", who, path)
  end
  -- a decoder's network runs as rl.search runs it, its packs its own
  local adopted = net.device == "cpu" and not choice and share_packs(fm, ck, e) or nil
  local m = setmetatable({path = path, layer = layer, fm = fm, net = net, key = keys[1],
    adopted = adopted, pushing = false, choice = choice and {V = choice.n_out,
      labels = ck_labels(fm.ck, choice.target)},
    in_dim = e.dim, sparse = e.sparse == true, out_dim = fm.dim, not_causal = net:carry_unfit(),
    num_params = net:num_params(), blank = fm.blank, labels = forward.target_labels(fm)}, Model)
  m.c_push_unfit_why = m:c_push_unfit()
  return m
end


-- ---- language models: rl_lm_load, rl_ctc_decode_lm (an LM handle has a Lua state of its own)

-- The LM of a handle for the model's target (Model:lm_target): for a CTC layer rl.ctc_decode's
-- lm option as rl.forward makes it (forward.ctc_lm: labels in the targets' numbering, the blank
-- left out, default the checkpoint's); for an attention decoder rl.search's, labels naming the
-- choice's V labels, the end label 0 among them. The LM is loaded and checked against them here;
-- kind "file" (an ARPA file) or "model" (a character LM checkpoint).
function M.lm_load(kind, path, target, labels, word_boundary, layer, who)
  local spec = {[kind] = path, weight = 0, labels = labels, word_boundary = word_boundary,
    layer = layer}
  if target.kind == "ctc" then
    return {lm = forward.ctc_lm(spec, target.blank, target.V, target.labels, who),
      blank = target.blank, V = target.V}
  end
  spec.labels = labels or target.labels
  require("rnnlua.lm").resolve(spec, target.V, 0, who)
  return {lm = spec, V = target.V, search = true}
end

-- The labels of the one sequence of y, (T, 1, V) float32 probabilities with lengths (1) int32,
-- by rl.forward's decoding (forward.ctc_labels) with the LM at weight and bonus.
function M.lm_decode(h, y, lengths, beam, weight, bonus)
  local opt = util.copy(h.lm)
  opt.weight, opt.bonus = weight, bonus
  return forward.ctc_labels({blank = h.blank}, y, lengths, beam, opt)[1]
end

return M
