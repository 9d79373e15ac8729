-- rl.search{model =, data =, output_file =, layer =, beam =, eos = 0, max_seq_len =,
--           length_norm = false, nbest =, attention =, batch_size = 5000, max_seqs = 40,
--           device = "cpu", log_verbosity = 1}: RETURNN's search task.
--
-- Runs the beam search of a rec layer's choice (net:search, lua/rnnlua/rec.lua) over a whole
-- dataset and writes each sequence's best label sequence to output_file in RETURNN's HDF
-- dataset layout (the same sparse layout as rl.forward's CTC decoding): /inputs the labels
-- (int32, inputPattSize = the choice's number of labels, the end label left out),
-- /seqLengths the label count of each sequence, /seqTags the dataset's tags, and targets of
-- their own length:
--   scores          dense dim 1, one frame: the best hypothesis' score
--   nbest           (nbest = n) sparse: the labels of the n best hypotheses one after another
--   nbest_lengths   dense dim 1, n frames: the label count of each of them
--   nbest_scores    dense dim 1, n frames: their scores (best first)
--   attention       (attention = "att") dense dim 1, S_out * T_enc frames: the best
--                   hypothesis' attention weights of unit layer att, row-major (step s, encoder
--                   frame j at frame (s - 1) * T_enc + j); S_out = its steps (its labels, plus
--                   the end label's step when it ended with one), T_enc = the input's length
--   attention_shape dense dim 2, one frame: (S_out, T_enc)
--   attention_K, attention_K_shape   (attention and nbest = n, K = 2..n) the same for the K-th
--                   best hypothesis; (0, T_enc) where the beam held fewer than K hypotheses
-- `rnnlua plot FILE --heatmap attention` draws the matrices (lua/rnnlua/tools.lua).
--
-- model: a checkpoint path or a network (rl.network); layer: the rec layer (default: the one
-- whose unit has a choice); beam: the beam size (default the choice's beam_size; 1 is greedy);
-- eos: the end label; max_seq_len: a number, a function of the input length or an expression
-- of T (default the rec layer's); length_norm: rank the final beam by score / steps (scores
-- are then normalised; see Rec:search); nbest: true (the whole beam) or n;
-- labels: the names of the choice's labels (written as /labels); lm = {file =, weight =,
-- bonus =, labels =, word_boundary =} or {model = a char LM checkpoint, ...}: shallow fusion of
-- an n-gram or neural LM (Rec:search, lua/rnnlua/lm.lua), its labels defaulting to labels.
-- The sequences are searched sorted by input length (less padding, fewer wasted steps) and
-- written in the dataset's order. Returns {output_file =, num_seqs =, n_labels =, results =
-- {{tag =, labels =, score =, logp =, hyps = {{labels =, score =, logp =, steps =}, ...}}, ...}
-- in the dataset's order}. rl.forward{..., search = true} is the same task.
local M = {}

local rl -- the module table, set by install
local forward = require("rnnlua.forward")

local KEYS = {model = true, data = true, output_file = true, output = true, layer = true,
  beam = true, eos = true, max_seq_len = true, length_norm = true, nbest = true,
  attention = true, batch_size = true, max_seqs = true, device = true, log_verbosity = true,
  labels = true, lm = true}

local function fail(fmt, ...)
  error("rl.search: " .. string.format(fmt, ...), 0)
end

local util = require("rnnlua.util")
local sorted_keys = util.sorted_keys

local function has_choice(d)
  if type(d) ~= "table" or d.class ~= "rec" or type(d.unit) ~= "table" then return false end
  for _, u in pairs(d.unit) do
    if type(u) == "table" and u.class == "choice" then return true end
  end
  return false
end

-- The rec layer to search in description desc (of `what`, for messages).
local function pick_layer(desc, layer, what)
  local names = {}
  for _, name in ipairs(sorted_keys(desc)) do
    if has_choice(desc[name]) then names[#names + 1] = name end
  end
  if layer ~= nil then
    if type(desc[layer]) ~= "table" then
      fail("no layer '%s' in the network of %s (layers: %s)", tostring(layer), what,
        table.concat(sorted_keys(desc), ", "))
    end
    if not has_choice(desc[layer]) then
      fail("layer '%s' of %s (class %s) is not a rec layer with a choice layer in its unit "
        .. "(such layers: %s)", layer, what, tostring(desc[layer].class),
        #names > 0 and table.concat(names, ", ") or "none")
    end
    return layer
  end
  if #names == 0 then
    fail("the network of %s has no rec layer with a choice layer in its unit (layers: %s)", what,
      table.concat(sorted_keys(desc), ", "))
  end
  if #names > 1 then
    fail("the network of %s has several rec layers with a choice (%s): name one with layer =",
      what, table.concat(names, ", "))
  end
  return names[1]
end

-- {net =, rec = the rec layer object, layer = its name} of cfg.model.
local function load(cfg)
  local m = cfg.model
  if type(m) == "string" then
    local ck = rl.load_checkpoint(m)
    local layer = pick_layer(ck.description, cfg.layer, m)
    local model = forward.load_model(m, layer, cfg.device or "cpu", "rl.search", ck)
    return {net = model.net, rec = model.net:layer(layer).object, layer = layer, what = m}
  end
  if type(m) ~= "table" or type(m.search) ~= "function" or type(m.nodes) ~= "table" then
    fail("model must be a checkpoint path or a network (rl.network), got %s", type(m))
  end
  if cfg.device ~= nil then fail("device applies to a checkpoint; move the network with net:to") end
  local layer = pick_layer(m.description, cfg.layer, "the given network")
  if not m.by_name[layer] then
    fail("layer '%s' is not built in the given network (nothing with a loss or "
      .. "is_output_layer reads it)", layer)
  end
  return {net = m, rec = m.by_name[layer].layer, layer = layer, what = "the given network"}
end

-- A view of dataset ds (at epoch 1) in order of ascending input length (ties in the dataset's
-- order): order[j] is the dataset position of the view's sequence j.
local function sorted_view(ds)
  local n = ds:num_seqs()
  local len, order = {}, {}
  for i = 1, n do
    len[i] = ds.seq_len and ds:seq_len(i) or ds:get_seq(i).data:size(1)
    order[i] = i
  end
  table.sort(order, function(a, b)
    if len[a] ~= len[b] then return len[a] < len[b] end
    return a < b
  end)
  local view = {name = ds.name}
  function view.num_seqs() return n end
  function view.init_epoch() end
  function view.get_seq(_, j) return ds:get_seq(order[j]) end
  function view.keys() return ds:keys() end
  function view.extern_data() return ds:extern_data() end
  return view, order
end

-- The (steps, T_enc) attention weights of hypothesis r (rows into alpha (S, B * K, Te)).
function M.attention_matrix(alpha, r, T_enc)
  local m = rl.zeros(r.steps, T_enc)
  for t = 1, r.steps do
    if T_enc > 0 then
      m[t]:copy_(alpha:select(1, t):select(1, r.rows[t]):narrow(1, 1, T_enc):float():cpu())
    end
  end
  return m
end

-- Raises (prefixed by who) unless `name` is an attention layer of the unit of rec layer `rec`.
function M.check_attention(rec, name, who)
  if rec.class ~= "rec" then
    error(string.format("%s: attention = '%s' needs a rec layer, layer '%s' is class %s", who,
      tostring(name), rec.name, tostring(rec.class)), 0)
  end
  local u = rec.by_name[name]
  if not u or u.kind ~= "attention" then
    local att = {}
    for _, unit in ipairs(rec.units) do
      if unit.kind == "attention" then att[#att + 1] = unit.name end
    end
    error(string.format("%s: layer '%s' (class rec): attention = '%s' is not an attention layer of the "
      .. "unit (attention layers: %s)", who, rec.name, tostring(name),
      #att > 0 and table.concat(att, ", ") or "none"), 0)
  end
end

-- The writer's targets of an (S_out, T_enc) matrix m per sequence, and their values.
M.attention_targets = {attention = {dim = 1}, attention_shape = {dim = 2}}
function M.attention_values(t, m, suffix)
  suffix = suffix or ""
  t["attention" .. suffix] = m:contiguous():view(m:numel(), 1)
  t["attention" .. suffix .. "_shape"] = rl.tensor({{m:size(1), m:size(2)}})
  return t
end

local function check(cfg)
  if type(cfg) ~= "table" then fail("expects a table {model =, data =, output_file =, ...}") end
  cfg = util.copy(cfg)
  for k in pairs(cfg) do
    if not KEYS[k] then
      fail("unknown key '%s' (known: %s)", tostring(k), table.concat(sorted_keys(KEYS), ", "))
    end
  end
  if cfg.output ~= nil and cfg.output_file ~= nil then
    fail("give output_file or output, not both")
  end
  cfg.output_file = cfg.output_file or cfg.output
  cfg.output = nil
  if type(cfg.output_file) ~= "string" then fail("output_file must be a path") end
  local clash = forward.output_clash(cfg.output_file, cfg.model) -- the dataset's files below
  if clash then fail("%s", clash) end
  if cfg.data == nil then fail("data (a dataset config or object) is missing") end
  if cfg.beam ~= nil and (math.type(cfg.beam) ~= "integer" or cfg.beam < 1) then
    fail("beam must be a positive integer, got %s", tostring(cfg.beam))
  end
  local msl = cfg.max_seq_len
  if msl ~= nil then
    if type(msl) == "number" then
      if msl ~= msl or msl < 1 then fail("max_seq_len must be >= 1, got %s", tostring(msl)) end
    elseif type(msl) ~= "string" and type(msl) ~= "function" then
      fail("max_seq_len must be a number, a function of the input length or an expression of T, "
        .. "got %s", type(msl))
    end
  end
  if cfg.length_norm ~= nil and type(cfg.length_norm) ~= "boolean" then
    fail("length_norm must be true or false, got %s", tostring(cfg.length_norm))
  end
  local nb = cfg.nbest
  if nb ~= nil and nb ~= true and nb ~= false and (math.type(nb) ~= "integer" or nb < 1) then
    fail("nbest must be true (the whole beam) or a positive integer, got %s", tostring(nb))
  end
  if cfg.attention ~= nil and type(cfg.attention) ~= "string" then
    fail("attention must be the name of an attention layer of the unit, got %s",
      type(cfg.attention))
  end
  return cfg
end

function M.search(cfg)
  cfg = check(cfg)
  local verbosity = cfg.log_verbosity or 1
  local m = load(cfg)
  local net, rec = m.net, m.rec
  local choice = rec.choice
  local where = string.format("layer '%s' (class rec)", m.layer)
  local beam = cfg.beam or choice.beam_size
  local nbest = cfg.nbest == true and beam or (cfg.nbest or nil)
  if nbest and nbest > beam then
    fail("nbest = %d is more than the beam (%d)", nbest, beam)
  end
  if cfg.max_seq_len == nil and rec.max_seq_len == nil then
    fail("%s of %s has no max_seq_len: give max_seq_len (a number, a function of the input "
      .. "length T or an expression of T such as \"2 * T + 3\")", where, m.what)
  end
  if cfg.attention ~= nil then M.check_attention(rec, cfg.attention, "rl.search") end
  local V = choice.n_out
  if cfg.labels ~= nil then
    local l = cfg.labels
    local okl = type(l) == "table" and #l == V
    for k = 1, okl and V or 0 do okl = okl and type(l[k]) == "string" end
    if not okl then
      fail("labels must be a list of %d strings (the names of the choice's labels)", V)
    end
  end

  local ds = rl.dataset(cfg.data)
  clash = forward.output_clash(cfg.output_file, cfg.model, ds)
  if clash then fail("%s", clash) end
  local okd, err = pcall(rl.check_dataset_dims, ds, net.ext, sorted_keys(net.input_keys))
  if not okd then fail("the dataset does not fit the network of %s: %s", m.what, tostring(err)) end
  ds:init_epoch(1)
  local n = ds:num_seqs()
  if n == 0 then fail("the dataset is empty (0 sequences)") end

  local view, order = sorted_view(ds)
  local lm = cfg.lm
  if type(lm) == "table" and lm.labels == nil and cfg.labels ~= nil then
    lm = util.copy(lm)
    lm.labels = cfg.labels
  end
  local opts = {layer = m.layer, beam_size = beam, eos = cfg.eos, max_seq_len = cfg.max_seq_len,
    length_norm = cfg.length_norm, lm = lm}
  local results, att = {}, {}
  local ok, e = pcall(function()
    local bopts = {batch_size = cfg.batch_size or 5000, max_seqs = cfg.max_seqs or 40}
    for batch in rl.batches(view, bopts) do
      local res = net:search(batch, opts)
      local alpha = cfg.attention and rec:attention_weights(cfg.attention)
      if alpha and alpha:device() ~= "cpu" then alpha = alpha:cpu() end
      for b, r in ipairs(res) do
        local i = order[batch.seqs[b]]
        local hyps = {}
        for k, h in ipairs(r.hyps) do
          hyps[k] = {labels = h.labels, score = h.score, logp = h.logp, steps = h.steps}
        end
        results[i] = {tag = batch.tags[b] or string.format("seq-%d", i), labels = r.labels,
          score = r.score, logp = r.logp, hyps = hyps}
        if alpha then
          att[i] = {}
          for k = 1, nbest or 1 do
            local h = k == 1 and r or r.hyps[k]
            att[i][k] = h and M.attention_matrix(alpha, h, batch.lengths[b])
              or rl.zeros(0, batch.lengths[b])
          end
        end
      end
    end
  end)
  if not ok then
    e = util.strip_internal(e):gsub("^rl%.search: ", "")
    fail("%s", e)
  end

  local targets = {scores = {dim = 1}}
  if nbest then
    targets.nbest = {dim = V, sparse = true}
    targets.nbest_lengths, targets.nbest_scores = {dim = 1}, {dim = 1}
  end
  if cfg.attention then
    for k = 1, nbest or 1 do
      local suffix = k == 1 and "" or ("_" .. k)
      targets["attention" .. suffix] = M.attention_targets.attention
      targets["attention" .. suffix .. "_shape"] = M.attention_targets.attention_shape
    end
  end
  local n_labels = 0
  ok, e = pcall(function()
    local w = rl.hdf_writer(cfg.output_file, {data_dim = V, sparse = true, targets = targets,
      labels = cfg.labels})
    local function labels_tensor(l)
      return #l > 0 and rl.tensor(l, "int32") or rl.zeros({0}, "int32")
    end
    for i, r in ipairs(results) do
      local t = {scores = rl.tensor({{r.score}})}
      if nbest then
        local all, lens, scores = {}, {}, {}
        for k = 1, math.min(nbest, #r.hyps) do
          local h = r.hyps[k]
          for _, v in ipairs(h.labels) do all[#all + 1] = v end
          lens[k], scores[k] = {#h.labels}, {h.score}
        end
        t.nbest, t.nbest_lengths, t.nbest_scores = labels_tensor(all), rl.tensor(lens),
          rl.tensor(scores)
      end
      if cfg.attention then
        for k, m in ipairs(att[i]) do M.attention_values(t, m, k == 1 and "" or ("_" .. k)) end
      end
      w:add(r.tag, labels_tensor(r.labels), t)
      n_labels = n_labels + #r.labels
    end
    w:close()
  end)
  if not ok then fail("%s: %s", cfg.output_file, tostring(e)) end
  if verbosity >= 1 then
    print(string.format("search: %d sequences, %d labels (beam %d) of layer '%s' -> %s", n,
      n_labels, beam, m.layer, cfg.output_file))
  end
  return {output_file = cfg.output_file, num_seqs = n, n_labels = n_labels, results = results}
end

function M.install(module)
  rl = module
  rl.search = M.search
  return M
end

return M
