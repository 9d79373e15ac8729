-- rl.forward{model =, data =, layer = "output", output_file =, batch_size = 5000, max_seqs = 40,
--            log_verbosity = 1, device = "cpu"}: RETURNN's forward task.
--
-- Loads the checkpoint `model` (a path), builds its network from the description and
-- extern_data stored in it (no recipe needed), runs the dataset `data` (a dataset config or
-- object) through it with train = false and writes the activations of `layer` for each
-- sequence (its valid frames only, (T, n_out) float32) under the sequence's tag to
-- output_file, in the dataset layout of rl.hdf_writer, so it reads back with
-- rl.dataset{class = "hdf", files = {output_file}}.
--
-- A checkpoint with data_norm (rl.train on an audio dataset with normalize = "global") holds the
-- training set's normalisation: input data is raw features, normalised here before the network
-- (M.run, also serve's path); an audio dataset config leaves its own normalisation out (data_for).
--
-- device = "cuda" (or "cuda:N") runs the network there (net:to after the parameters are
-- loaded); the layer's output is copied to the host once per batch to be written.
--
-- Only what `layer` depends on is built, with the losses left out, so the data needs only
-- the inputs (no targets). A layer class registered by a recipe (rl.layers.register) must be
-- registered before rl.forward. Returns {output_file =, num_seqs =, n_frames =, dim =}.
--
-- decode = "ctc" (with beam = 1, best path, or beam = n, prefix beam search: rl.ctc_decode)
-- writes each sequence's decoded labels instead of the activations: the layer must be a
-- softmax trained with loss = "ctc"; the output file is sparse (/inputs [total labels] int32,
-- inputPattSize = the number of labels, /seqLengths the label count per sequence), with the
-- target's label numbers (the blank, at the layer's blank_index, removed). n_frames is then
-- the number of labels written. lm = {file =, weight =, bonus =, labels =, word_boundary =}
-- (decode = "ctc") fuses an n-gram LM into the prefix beam search (M.ctc_lm: labels and a
-- numeric word_boundary in the targets' numbering, labels defaulting to the target's labels
-- stored in the checkpoint).
--
-- attention = "att" (layer a rec layer, run teacher forced: the data must hold its target)
-- also writes the weights of attention layer att of its unit for each sequence, as rl.search
-- does (targets attention and attention_shape, lua/rnnlua/search.lua). A rec layer whose output
-- is a choice gives labels: the file is then sparse.
--
-- search = true runs rl.search (lua/rnnlua/search.lua: beam search through a rec layer's
-- choice) with the other keys instead.
--
-- From the shell: rnnlua forward ++model out/net.010.h5 ++data dev.h5 ++layer output
-- ++output fwd.h5  (lua/rnnlua/tools.lua; or rnnlua -e 'rl.forward{...}').
local M = {}
local rl -- the module table, set by install
local checkpoint = require("rnnlua.checkpoint")
local rec = require("rnnlua.rec")

local KEYS = {model = true, data = true, layer = true, output_file = true, batch_size = true,
              max_seqs = true, log_verbosity = true, device = true, decode = true, beam = true,
              search = true, attention = true, lm = true, precision = true}

local function fail(fmt, ...)
  error("rl.forward: " .. string.format(fmt, ...), 0)
end

local util = require("rnnlua.util")
local sorted_keys = util.sorted_keys

-- The names of the layers `layer` reads, directly or not, itself included (a rec layer reads
-- its from and the base: layers of its unit).
local function needed(desc, layer)
  local need, stack = {}, {layer}
  while #stack > 0 do
    local name = table.remove(stack)
    local l = desc[name]
    if not need[name] and type(l) == "table" then
      need[name] = true
      local froms = l.class == "rec" and rec.sources(name, l, desc) or l.from or "data"
      if type(froms) == "string" then froms = {froms} end
      for _, f in ipairs(froms) do stack[#stack + 1] = f end
    end
  end
  return need
end

-- The description of what `layer` needs, with every loss taken out and `layer` as the one
-- output (a rec layer keeps the losses of its unit: with targets in the data it runs teacher
-- forced). A loss layer without n_out had its target's dim (rl.network's rule): it keeps it.
local function forward_description(desc, extern_data, layer)
  local d = {}
  local need = needed(desc, layer)
  for name, l in pairs(desc) do
    if not need[name] then goto continue end
    local c = util.copy(l)
    -- (a dim that is no integer, from a crafted checkpoint, is left to rl.network's check)
    if c.n_out == nil and c.loss ~= nil and type(extern_data[c.target]) == "table"
        and math.type(extern_data[c.target].dim) == "integer" then
      c.n_out = extern_data[c.target].dim + (c.loss == "ctc" and 1 or 0)
    end
    if c.loss == "ctc" then c.blank_index = nil end -- an option of the ctc loss only
    c.loss, c.target, c.loss_scale, c.is_output_layer = nil, nil, nil, nil
    d[name] = c
    ::continue::
  end
  d[layer].is_output_layer = true
  return d
end

-- The network of checkpoint `path` that computes `layer` (losses left out), with the saved
-- parameters, on `device`: {ck =, net =, layer =, dim = the layer's n_out, images = whether
-- it gives images, blank = the blank's class of a CTC layer}. rl.forward and `rnnlua serve` (rnnlua.serve) both run it, so the served
-- answers are rl.forward's. Errors name the file and the layer, prefixed by `who`. ck: the
-- checkpoint of `path` when the caller has loaded it already; ck.flat_params (the flat
-- parameter buffer of a network load_model built from the same checkpoint and layer) is shared
-- by the new network, not copied (rl.network's params).
function M.load_model(path, layer, device, who, ck)
  ck = ck or rl.load_checkpoint(path)
  if type(ck.description[layer]) ~= "table" then
    error(string.format("%s: no layer '%s' in the network of %s (layers: %s)", who, tostring(layer),
      path, table.concat(sorted_keys(ck.description), ", ")), 0)
  end
  -- the description is the file's: an error building it names the file
  local okn, net = pcall(function()
    local n = rl.network(forward_description(ck.description, ck.extern_data, layer),
      ck.extern_data, {dtype = ck.dtype, params = ck.flat_params})
    if not ck.flat_params then checkpoint.load_params(ck, n, {partial = true}) end
    return n
  end)
  if not okn then
    local msg = tostring(net):gsub("^[^:\n]*%.lua:%d+: ", "")
    if not msg:find(path, 1, true) then msg = "the network of " .. path .. ": " .. msg end
    error(string.format("%s: %s", who, msg), 0)
  end
  if device ~= "cpu" then
    local okt, err = pcall(net.to, net, device)
    if not okt then error(string.format("%s: %s", who, tostring(err)), 0) end
  end
  local L = net:layer(layer)
  local d = ck.description[layer]
  local norm = ck.data_norm
  return {ck = ck, net = net, layer = layer, dim = L.n_out, images = L.rank == 2,
          labels = L.object.sparse_out == true,
          blank = d.loss == "ctc" and (d.blank_index or L.n_out - 1) or nil,
          norm = norm and {mean = norm.mean, inv = norm.std:reciprocal()}}
end

-- The batch a model of load_model sees: with the checkpoint's data_norm (the training set's
-- global normalisation, part of the model) input "data" holds raw features and becomes
-- (x - mean) / std here, once for rl.forward and serve; the caller's batch is left as it is.
local function normalized(model, batch)
  local n, x = model.norm, batch.data
  if not n or not rl.is_tensor(x) then return batch end
  local shape = {}
  for i = 1, x:dim() - 1 do shape[i] = 1 end
  shape[x:dim()] = n.mean:numel()
  local mean, inv = n.mean:view(table.unpack(shape)), n.inv:view(table.unpack(shape))
  if x:dtype() == "float64" then mean, inv = mean:double(), inv:double() end
  if x:device() ~= "cpu" then mean, inv = mean:to(x:device()), inv:to(x:device()) end
  local c = util.copy(batch)
  c.data = (x - mean):mul_(inv)
  return c
end

-- The dataset config or object cfg.data of rl.forward for a model: an audio dataset config
-- leaves the global normalisation to the model when the checkpoint holds one (its statistics
-- are the training set's, which a new list of files has no other way to get); an audio dataset
-- object that normalises itself would be normalised twice: an error.
local function data_for(model, data, verbosity)
  if not model.norm or type(data) ~= "table" then return data end
  if type(data.norm_stats) == "function" then
    if data:norm_stats() ~= nil then
      fail("the dataset normalises its features (normalize = \"global\") and the model's "
        .. "checkpoint holds the normalisation of its training set (data_norm), which rl.forward "
        .. "applies: make the dataset without normalize")
    end
    return data
  end
  if data.class ~= "audio" then return data end
  local c = util.copy(data)
  c.normalize, c.norm_stats = nil, nil
  if verbosity >= 1 then
    print("forward: the features are normalised with the model's statistics (checkpoint "
      .. "/data_norm, the training set's)")
  end
  return c
end

-- The same for a network in memory (built by rl.network or rl.train): a copy that computes
-- `layer` without losses, on the CPU, with net's parameter values; ck = {description =,
-- extern_data =, dtype =} of net.
function M.model_of_net(net, layer, who)
  if type(net.description[layer]) ~= "table" then
    error(string.format("%s: no layer '%s' in the network (layers: %s)", who, tostring(layer),
      table.concat(sorted_keys(net.description), ", ")), 0)
  end
  local copy = rl.network(forward_description(net.description, net.extern_data, layer),
    net.extern_data, {dtype = net.dtype})
  local values, order = {}, {}
  for _, p in ipairs(net:param_list()) do
    local name = p.layer .. "/" .. p.name
    values[name], order[#order + 1] = p.value:cpu(), name
  end
  checkpoint.load_params({path = "(the network in memory)", param_tensors = values,
    param_order = order}, copy, {partial = true})
  local L = copy:layer(layer)
  return {ck = {description = net.description, extern_data = net.extern_data, dtype = net.dtype},
          net = copy, layer = layer, dim = L.n_out, images = L.rank == 2}
end

-- Why output_file cannot be written, or nil: it is the model's checkpoint or a file the dataset
-- ds reads (ds:files(); ds nil: the model only); the output would replace them (rl.forward and
-- rl.search).
function M.output_clash(output_file, model, ds)
  if type(model) == "string" and util.same_file(output_file, model) then
    return string.format("output_file %s is the model's checkpoint: writing it would replace "
      .. "the model", output_file)
  end
  for _, p in ipairs(ds and type(ds.files) == "function" and ds:files() or {}) do
    if util.same_file(output_file, p) then
      return string.format("output_file %s is a file of the dataset: writing it would replace "
        .. "the data being read", output_file)
    end
  end
  return nil
end

-- Why the layer of a model of load_model cannot be decoded with CTC, or nil when it can.
function M.ctc_unfit(model)
  local d = model.ck.description[model.layer]
  if d.class ~= "softmax" or d.loss ~= "ctc" then
    return string.format("needs a softmax layer trained with loss = \"ctc\"; layer '%s' is "
      .. "class %s with loss %s", model.layer, tostring(d.class), tostring(d.loss))
  end
  if model.images then return string.format("needs sequences; layer '%s' gives images", model.layer) end
  return nil
end

-- rl.ctc_decode's lm option for a CTC layer of V classes with blank `blank` from lm as its
-- callers (rl.forward, rl.ctc_score, rnnlua serve: `who`) give it, in the targets' numbering:
-- labels (V - 1 strings, default target_labels, the checkpoint's extern_data labels of the
-- layer's target, else the class numbers) and an integer word_boundary get the blank's place.
-- Checked (and the LM loaded) here, so that a bad option fails before any data is read.
function M.ctc_lm(lm, blank, V, target_labels, who)
  if lm == nil then return nil end
  if type(lm) ~= "table" then
    error(string.format("%s: lm must be a table {file =, weight =, bonus =}, got %s", who,
      type(lm)), 0)
  end
  local tl = lm.labels or target_labels
  if tl == nil then
    tl = {}
    for k = 0, V - 2 do tl[k + 1] = tostring(k) end
  end
  local okl = type(tl) == "table" and #tl == V - 1
  for k = 1, okl and V - 1 or 0 do okl = okl and type(tl[k]) == "string" end
  if not okl then
    error(string.format("%s: lm: labels must be a list of %d strings (the target's labels, "
      .. "the blank left out)", who, V - 1), 0)
  end
  local c = util.copy(lm)
  c.labels = {}
  for k = 0, V - 1 do
    c.labels[k + 1] = k == blank and "<blank>" or tl[(k < blank and k or k - 1) + 1]
  end
  local wb = lm.word_boundary
  if math.type(wb) == "integer" and wb >= 0 then c.word_boundary = wb < blank and wb or wb + 1 end
  require("rnnlua.lm").resolve(c, V, blank, who)
  return c
end

-- The labels of the target of CTC model `model` (load_model's) stored in its checkpoint, or nil.
function M.target_labels(model)
  local d = model.ck and model.ck.description[model.layer]
  local t = d and d.target and model.ck.extern_data and model.ck.extern_data[d.target]
  return t and type(t.labels) == "table" and t.labels or nil
end

-- The label sequences of one batch's output (M.run) of a CTC layer, by rl.ctc_decode (beam 1:
-- best path; n: prefix beam search), numbered as the targets are (the blank taken out).
-- The softmax gives probabilities: their log is a log-softmax, as rl.ctc_decode wants.
-- lm: rl.ctc_decode's lm option (M.ctc_lm's result) or nil.
function M.ctc_labels(model, out, geom, beam, lm)
  local blank = model.blank
  local hyp = rl.ctc_decode(out:double():log(), geom, {blank = blank, beam = beam, lm = lm})
  for _, labels in ipairs(hyp) do
    for k, c in ipairs(labels) do labels[k] = c < blank and c or c - 1 end
  end
  return hyp
end

-- One batch through a model of load_model, in inference mode: the layer's output on the host
-- ((T, B, n_out) or (H, W, B, n_out)) and its own geometry, which after a collapse or a
-- strided conv2d differs from the batch's ((B) lengths for sequences, (B, 2) sizes for images).
function M.run(model, batch)
  model.net:forward(normalized(model, batch), {train = false})
  local L = model.net:layer(model.layer)
  local out = L.output
  if out:device() ~= "cpu" then out = out:cpu() end
  return out, L.geometry
end

function M.forward(cfg)
  if type(cfg) ~= "table" then fail("expects a table {model =, data =, layer =, output_file =}") end
  if cfg.search == true then -- the same task as rl.search
    local c = {}
    for k, v in pairs(cfg) do if k ~= "search" then c[k] = v end end
    return rl.search(c)
  end
  if cfg.search ~= nil and cfg.search ~= false then
    fail("search must be true or false, got %s", tostring(cfg.search))
  end
  for k in pairs(cfg) do
    if not KEYS[k] then
      fail("unknown key '%s' (known: %s)", tostring(k), table.concat(sorted_keys(KEYS), ", "))
    end
  end
  if type(cfg.model) ~= "string" then fail("model must be a checkpoint path") end
  if type(cfg.output_file) ~= "string" then fail("output_file must be a path") end
  if cfg.data == nil then fail("data (a dataset config or object) is missing") end
  local layer = cfg.layer or "output"
  local device = cfg.device or "cpu"
  if type(device) ~= "string" or not (device == "cpu" or device:match("^cuda$")
      or device:match("^cuda:%d+$")) then
    fail("device must be \"cpu\", \"cuda\" or \"cuda:N\", got %s", tostring(device))
  end
  local verbosity = cfg.log_verbosity or 1
  local precision = cfg.precision or "fp32"
  require("rnnlua.network").check_precision("rl.forward", precision, "float32", device)

  local model = M.load_model(cfg.model, layer, device, "rl.forward")
  local net = model.net
  if precision ~= "fp32" then
    local okp, errp = pcall(net.set_precision, net, precision)
    if not okp then fail("%s: %s", cfg.model, tostring(errp)) end
  end

  local ds = rl.dataset(data_for(model, cfg.data, verbosity))
  local clash = M.output_clash(cfg.output_file, cfg.model, ds)
  if clash then fail("%s", clash) end
  local keys = sorted_keys(net.used_extern)
  local okd, err = pcall(rl.check_dataset_dims, ds, net.ext, keys)
  if not okd then
    fail("the dataset does not fit the network of %s: %s", cfg.model, tostring(err))
  end
  ds:init_epoch(1)
  if ds:num_seqs() == 0 then fail("the dataset is empty (0 sequences)") end

  local dim, images = model.dim, model.images
  local blank
  if cfg.decode ~= nil then
    if cfg.decode ~= "ctc" then fail("decode must be \"ctc\", got %s", tostring(cfg.decode)) end
    local why = M.ctc_unfit(model)
    if why then fail("decode = \"ctc\" %s", why) end
    if cfg.beam ~= nil and (math.type(cfg.beam) ~= "integer" or cfg.beam < 1) then
      fail("beam must be a positive integer, got %s", tostring(cfg.beam))
    end
    blank = model.blank
    cfg.lm = M.ctc_lm(cfg.lm, blank, model.dim, M.target_labels(model), "rl.forward")
  elseif cfg.beam ~= nil or cfg.lm ~= nil then
    fail("%s applies to decode = \"ctc\" only (search = true: rl.search)",
      cfg.beam ~= nil and "beam" or "lm")
  end
  local search = require("rnnlua.search")
  local att = cfg.attention
  if att ~= nil then
    if blank then fail("attention does not apply to decode = \"ctc\"") end
    search.check_attention(net:layer(layer).object, att, "rl.forward")
  end
  local w = rl.hdf_writer(cfg.output_file, {data_dim = blank and dim - 1 or dim,
    sparse = blank ~= nil or model.labels, spatial = images and 2 or nil,
    targets = att and search.attention_targets or nil})
  local nseqs, nframes = 0, 0
  local ok, err = pcall(function()
    local bopts = {batch_size = cfg.batch_size or 5000, max_seqs = cfg.max_seqs or 40}
    for batch in rl.batches(ds, bopts) do
      local out, geom = M.run(model, batch)
      if blank then
        for b, labels in ipairs(M.ctc_labels(model, out, geom, cfg.beam, cfg.lm)) do
          local tag = batch.tags and batch.tags[b] or string.format("seq-%d", nseqs + 1)
          w:add(tag, #labels > 0 and rl.tensor(labels, "int32") or rl.zeros({0}, "int32"))
          nframes, nseqs = nframes + #labels, nseqs + 1
        end
        goto next_batch
      end
      for b = 1, geom:size(1) do
        local tag = batch.tags and batch.tags[b] or string.format("seq-%d", nseqs + 1)
        if images then
          local h, wd = geom[b][1], geom[b][2]
          w:add(tag, out:select(3, b):narrow(1, 1, h):narrow(2, 1, wd):contiguous())
          nframes = nframes + h * wd
        else
          local len = geom[b]
          local t
          if att then -- the rec layer's S_out = len steps over the input's T_enc frames
            local alpha = net:layer(layer).object:attention_weights(att)
            local rows = {}
            for s = 1, len do rows[s] = b end
            t = search.attention_values({}, search.attention_matrix(alpha,
              {steps = len, rows = rows}, batch.lengths[b]))
          end
          w:add(tag, out:select(2, b):narrow(1, 1, len):contiguous(), t)
          nframes = nframes + len
        end
        nseqs = nseqs + 1
      end
      ::next_batch::
    end
    w:close()
  end)
  if not ok then
    fail("%s: %s", cfg.output_file, require("rnnlua.util").strip_internal(err))
  end
  if verbosity >= 1 then
    print(string.format("forward: %d sequences, %d %s of layer '%s' (dim %d) -> %s", nseqs,
      nframes, blank and "decoded labels" or "frames", layer, dim, cfg.output_file))
  end
  return {output_file = cfg.output_file, num_seqs = nseqs, n_frames = nframes, dim = dim}
end

function M.install(module)
  rl = module
  rl.forward = M.forward
  return M
end

return M
