-- RETURNN's forward and search tasks from the shell: run a dataset through a trained
-- checkpoint and write one layer's activations per sequence to HDF5 (the dataset layout, tags
-- kept), or (search=true) the label sequences a rec layer's beam search finds.
--
--   rnnlua recipes/forward.lua model=out/12ax/net.010.h5 data=dev.h5 layer=output output=fwd.h5
--   rnnlua recipes/forward.lua search=true model=out/g2p/net.h5 data=test.h5 output=hyp.h5 \
--          beam=4 nbest=4 attention=att
--
-- model=   a checkpoint (its network description is inside: no recipe needed)
-- data=    HDF5 files in RETURNN's layout, comma-separated, or a dataset config as a Lua table
--          literal, e.g. data='{class = "12ax", num_seqs = 100, seed = 2}'
-- layer=   the layer to write (default output; with search=true the rec layer, default the one
--          with a choice)
-- output=  the file to write (output_file= too)
-- batch_size=, max_seqs=  batching (frames incl. padding, sequences)
-- decode=ctc beam=N  CTC decoding of a softmax trained with loss = "ctc" (rl.forward)
-- search=true beam=N eos=N max_seq_len=N|EXPR length_norm=true nbest=true|N attention=NAME
--          beam search (rl.search, lua/rnnlua/search.lua)
-- lm=FILE lm_weight=W [lm_bonus=B] [lm_word_boundary=LABEL]  shallow fusion of a language model
--          (docs/ctc.md): FILE an ARPA n-gram model (decode=ctc or search=true) or a char LM
--          checkpoint *.h5 (search=true); or lm='{file = "lm.arpa", weight = 0.5, ...}' whole
-- lua=     a Lua file to run first: the rl.layers.register calls of the model's Lua layer
--          classes (a checkpoint holds only their names, never their code)
local usage = "usage: rnnlua recipes/forward.lua model=CHECKPOINT data=FILES|'{dataset config}' "
  .. "[layer=output] output=FILE [batch_size=N] [max_seqs=N] [decode=ctc] [beam=N] "
  .. "[search=true [eos=N] [max_seq_len=N|EXPR] [length_norm=true] [nbest=true|N] "
  .. "[attention=NAME]] [lm=FILE|'{...}' lm_weight=W [lm_bonus=B] [lm_word_boundary=L]] [lua=FILE]"

local cfg = {}
local names = {model = "model", data = "data", layer = "layer", output = "output_file",
               output_file = "output_file", batch_size = "batch_size", max_seqs = "max_seqs",
               decode = "decode", beam = "beam", search = "search", eos = "eos",
               max_seq_len = "max_seq_len", length_norm = "length_norm", nbest = "nbest",
               attention = "attention", lua = "lua", lm = "lm", lm_weight = "lm_weight",
               lm_bonus = "lm_bonus", lm_word_boundary = "lm_word_boundary"}
for i = 1, #arg do
  local k, v = arg[i]:match("^([%w_]+)=(.*)$")
  if not k or not names[k] then
    error(string.format("forward: unexpected argument '%s'\n%s", arg[i], usage), 0)
  end
  cfg[names[k]] = v
end
if cfg.lua then
  local ok, err = pcall(dofile, cfg.lua) -- source only, as every file rnnlua runs
  if not ok then error(string.format("forward: lua=%s: %s", cfg.lua, tostring(err)), 0) end
  cfg.lua = nil
end
for _, k in ipairs({"model", "data", "output_file"}) do
  if not cfg[k] then error(string.format("forward: missing %s=\n%s", k == "output_file" and
    "output" or k, usage), 0) end
end
for _, k in ipairs({"batch_size", "max_seqs", "beam", "eos"}) do
  if cfg[k] then
    cfg[k] = math.tointeger(tonumber(cfg[k]))
    if not cfg[k] then error(string.format("forward: %s must be an integer\n%s", k, usage), 0) end
  end
end
for _, k in ipairs({"search", "length_norm", "nbest"}) do
  if cfg[k] == "true" then
    cfg[k] = true
  elseif cfg[k] == "false" then
    cfg[k] = false
  elseif cfg[k] and k == "nbest" and math.tointeger(tonumber(cfg[k])) then
    cfg[k] = math.tointeger(tonumber(cfg[k]))
  elseif cfg[k] then
    error(string.format("forward: %s must be true or false%s\n%s", k,
      k == "nbest" and " or an integer" or "", usage), 0)
  end
end
if cfg.max_seq_len then cfg.max_seq_len = tonumber(cfg.max_seq_len) or cfg.max_seq_len end
if cfg.lm then
  local lm = cfg.lm
  if lm:match("^%s*{") then
    lm = rl.checkpoint.deserialize(lm, "lm")
  else
    lm = lm:match("%.h5$") and {model = lm} or {file = lm}
  end
  for _, k in ipairs({"weight", "bonus"}) do
    local v = cfg["lm_" .. k]
    if v then
      lm[k] = tonumber(v)
      if not lm[k] then
        error(string.format("forward: lm_%s must be a number, got '%s'", k, v), 0)
      end
    end
  end
  lm.word_boundary = cfg.lm_word_boundary or lm.word_boundary
  cfg.lm = lm
elseif cfg.lm_weight or cfg.lm_bonus or cfg.lm_word_boundary then
  error("forward: lm_weight, lm_bonus and lm_word_boundary need lm=\n" .. usage, 0)
end
cfg.lm_weight, cfg.lm_bonus, cfg.lm_word_boundary = nil, nil, nil
if cfg.data:match("^%s*{") then
  cfg.data = rl.checkpoint.deserialize(cfg.data, "data")
else
  local files = {}
  for f in cfg.data:gmatch("[^,]+") do files[#files + 1] = f end
  cfg.data = {class = "hdf", files = files}
end
rl.forward(cfg)
