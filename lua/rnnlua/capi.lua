-- The Lua half of the C API (include/rnnlua.h, lua/capi.c): the model a handle holds.
--
--   local m = require("rnnlua.capi").load(source, layer, device, who, lua_file)
--       source: a checkpoint's path or m:snapshot() of a model loaded before (a session's
--       copy); raises naming the file; lua_file (or nil): run first (rl.layers.register calls)
--   m.key, m.in_dim, m.sparse      the network's one input (its extern_data entry)
--   m.layer, m.out_dim             the model's layer and its n_out
--   m.not_causal                   why the network cannot stream (naming the layer), or nil
--   m.num_params
--   m:run(x, lengths, layer, state_from, who) -> out, out_lengths
--       x: (T, B, F) float32 or (T, B) int32 class indices, lengths (B) int32; layer: nil (the
--       model's) or any layer of the network; state_from: nil (a plain batch) or 0/1 for the one
--       stream of a push (0: it starts here, 1: it goes on from the previous push). out: the
--       layer's output as a contiguous float32 CPU tensor (T', B, dim), out_lengths (B) int32.
--
-- The network is the one rl.forward builds (rnnlua.forward's load_model, losses left out) and
-- every batch goes through rnnlua.forward's run, so the C API gives the numbers rl.forward
-- writes; streaming is the network's carried state (rnnlua.network: batch.state_from), which
-- gives the outputs of the whole sequence. The C side keeps one Lua state per model and per
-- session and calls these functions from one thread at a time per state.
local M = {}
local forward = require("rnnlua.forward")
local util = require("rnnlua.util")

local Model = {}
Model.__index = Model

local fail = require("rnnlua.util").fail

function Model:run(x, lengths, layer, state_from, who)
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
  if state_from ~= nil then batch.state_from = {state_from} end
  local ok, out, og = pcall(forward.run, fm, batch)
  if not ok then fail("%s: %s", who, util.strip_internal(tostring(out))) end
  if out:dtype() ~= "float32" then out = out:float() end
  if out:dim() ~= 3 then
    fail("%s: layer '%s' gives %d-dimensional output; the C API gives sequences (T, B, dim)",
      who, fm.layer, out:dim())
  end
  return out:contiguous(), og
end

-- What a session's state builds its network from (lua/capi.c shares its tensors with the
-- session's state, not copying them): the checkpoint as this model loaded it, without the
-- training state, and the network's flat parameter buffer, which the session's network binds
-- read-only (a forward writes no parameter). A model on a device other than the CPU gives the
-- saved parameters instead, which the session copies to its device.
function Model:snapshot()
  local ck = self.fm.ck
  local snap = {path = ck.path, epoch = ck.epoch, step = ck.step, dtype = ck.dtype,
          description = ck.description, extern_data = ck.extern_data,
          data_norm = ck.data_norm and {mean = ck.data_norm.mean:cpu():contiguous(),
                                        std = ck.data_norm.std:cpu():contiguous()},
          param_order = ck.param_order}
  if self.net.device == "cpu" then
    snap.flat_params = self.net.flat_params
  else
    snap.param_tensors = {}
    for name, t in pairs(ck.param_tensors) do snap.param_tensors[name] = t:cpu():contiguous() end
  end
  return snap
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
  local keys = util.sorted_keys(net.used_extern)
  if #keys ~= 1 then
    fail("%s: %s: layer '%s' reads %d inputs (%s); the C API takes networks with one input", who,
      path, layer, #keys, table.concat(keys, ", "))
  end
  local e = net.ext[keys[1]]
  if e.spatial == 2 or fm.images then
    fail("%s: %s: the network reads or gives images; the C API takes sequences", who, path)
  end
  return setmetatable({path = path, layer = layer, fm = fm, net = net, key = keys[1],
    in_dim = e.dim, sparse = e.sparse == true, out_dim = fm.dim, not_causal = net:carry_unfit(),
    num_params = net:num_params()}, Model)
end

return M
