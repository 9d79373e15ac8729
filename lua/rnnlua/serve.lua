-- The Lua half of `rnnlua serve` (lua/serve.c): the served model.
--
--   local m = require("rnnlua.serve").load(path, layer, max_values) -- raises naming the file
--   m.key, m.in_dim, m.sparse, m.images    the network's one input (its extern_data entry)
--   m.out_dim, m.out_images                the served layer's n_out and whether it gives images
--   m:forward(x, geom) -> out, out_geom     x: (T, B, F) float32 with geom = lengths (B) int32,
--       (T, B) int32 class indices for a sparse input, or (H, W, B, F) with geom = sizes (B, 2);
--       out: the layer's output as a contiguous float32 CPU tensor, out_geom its lengths or sizes
--   m:decode(x, geom, beam, lm) -> {{labels...}, ...}  one label list per sequence (CTC models);
--       lm = {weight =, bonus =} fuses the server's LM (`--lm FILE`, given to load as
--       {file =, word_boundary =}, checked there) or nil
--   m.decode_error, m.decode_status    why POST /v1/decode cannot be answered, and the HTTP
--       status of that answer (nil when it can)
--   m:info() -> a table for GET /v1/model
--
-- The network is the one rl.forward builds (rnnlua.forward's load_model, losses left out) and
-- every batch goes through rnnlua.forward's run, so an answer is the number rl.forward writes
-- for that sequence: a model whose checkpoint holds data_norm (the training set's global
-- normalisation) takes raw features and normalises them there, and GET /v1/model shows the
-- statistics (data_norm = {mean =, std =}, false without). load() validates the checkpoint
-- before the server uses it: the network must read one input, and a short zero input must go
-- through it and give finite values. The C side calls these functions from its one model
-- thread only (a Lua state is single-threaded).
local M = {}
local forward = require("rnnlua.forward")
local rl = require("rnnlua")
local util = require("rnnlua.util")

local Model = {}
Model.__index = Model

local fail = require("rnnlua.util").fail

function Model:batch(x, geom)
  local batch = {lengths = geom}
  if self.images then batch = {sizes = geom} end
  if not self.sparse and self.net.dtype ~= "float32" then x = x:double() end
  batch[self.key] = x
  return batch
end

function Model:forward(x, geom)
  local out, og = forward.run(self.fm, self:batch(x, geom))
  if out:dtype() ~= "float32" then out = out:float() end
  return out:contiguous(), og
end

-- CTC models (the served layer is a softmax trained with loss = "ctc"): the labels that
-- rl.forward{decode = "ctc", beam = beam} writes, by the same function.
function Model:decode(x, geom, beam, lm)
  local out, og = forward.run(self.fm, self:batch(x, geom))
  local opt
  if lm then
    opt = util.copy(self.lm)
    opt.weight, opt.bonus = lm.weight, lm.bonus
  end
  return forward.ctc_labels(self.fm, out, og, beam, opt)
end

function Model:info()
  local ck = self.fm.ck
  return {
    model = self.path, epoch = ck.epoch, step = ck.step, dtype = ck.dtype, layer = self.layer,
    num_params = self.net:num_params(),
    input = {key = self.key, dim = self.in_dim, sparse = self.sparse,
             kind = self.images and "images" or "sequences"},
    output = {dim = self.out_dim, kind = self.out_images and "images" or "sequences"},
    decode = self.decode_error == nil and {blank = self.fm.blank,
      lm = self.lm and {file = self.lm.file, word_boundary = self.lm.word_boundary} or false}
      or false,
    data_norm = ck.data_norm and {mean = ck.data_norm.mean:totable(),
                                  std = ck.data_norm.std:totable()} or false,
    network = ck.description, extern_data = ck.extern_data,
  }
end

-- A short zero input through the network: a checkpoint whose network cannot run, or whose
-- parameters give NaN or Inf, is rejected here and not by the first client's request. Larger
-- inputs are tried when a small one fails: a network of four 2 x 2 poolings or a 9 x 9 "valid"
-- conv needs images larger than 8 x 8.
local function smoke_test(m)
  local ok, out, what
  for _, n in ipairs(m.images and {8, 32, 128, 256} or {4, 16, 64, 256}) do
    what = string.format(m.images and "%d x %d image of zeros" or m.sparse and "%d frames of class 0"
                         or "%d frames of zeros", n, n)
    ok, out = pcall(function() -- the input too: it may not fit in memory (a crafted dim)
      if m.images then return m:forward(rl.zeros(n, n, 1, m.in_dim), rl.tensor({{n, n}}, "int32")) end
      if m.sparse then return m:forward(rl.zeros({n, 1}, "int32"), rl.tensor({n}, "int32")) end
      return m:forward(rl.zeros(n, 1, m.in_dim), rl.tensor({n}, "int32"))
    end)
    if ok or tostring(out):find("memory") then break end -- a larger one will not fit either
  end
  if not ok then
    fail("%s: a test input (%s) does not go through the network: %s", m.path, what,
      util.strip_internal(out))
  end
  local s = out:sum()
  if s ~= s or s == math.huge or s == -math.huge then
    fail("%s: layer '%s' gives NaN or Inf on a zero input (broken parameters?)", m.path, m.layer)
  end
end

-- max_values: the most values a frame may have (a body of --max-body bytes holds at most half
-- as many numbers); a network reading more from a dense input cannot be given a single frame.
function M.load(path, layer, max_values, lm, precision)
  precision = precision or "fp32"
  require("rnnlua.network").check_precision("--precision", precision, "float32", "cpu")
  local fm = forward.load_model(path, layer, "cpu", "rnnlua serve")
  local net = fm.net
  if precision ~= "fp32" then net:set_precision(precision) end
  local keys = {}
  for k in pairs(net.used_extern) do keys[#keys + 1] = k end
  table.sort(keys)
  if #keys ~= 1 then
    fail("%s: layer '%s' reads %d inputs (%s); rnnlua serve takes networks with one input", path,
      layer, #keys, table.concat(keys, ", "))
  end
  local e = net.ext[keys[1]]
  if max_values and not e.sparse and e.dim > max_values then
    fail("%s: input '%s' takes %d values a frame; a request body (--max-body) holds at most %d",
      path, keys[1], e.dim, max_values)
  end
  local m = setmetatable({path = path, layer = layer, fm = fm, net = net, key = keys[1],
    in_dim = e.dim, sparse = e.sparse, images = e.spatial == 2, out_dim = fm.dim,
    out_images = fm.images}, Model)
  local why = forward.ctc_unfit(fm)
  if why then
    m.decode_error = string.format("POST /v1/decode %s (%s)", why, path)
    m.decode_status = 422
  end
  if lm then
    if why then fail("--lm %s: POST /v1/decode %s", lm.file, why) end
    m.lm = forward.ctc_lm({file = lm.file, word_boundary = lm.word_boundary, weight = 0},
      fm.blank, fm.dim, forward.target_labels(fm), "rnnlua serve --lm")
  end
  smoke_test(m)
  return m
end

return M
