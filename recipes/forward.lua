-- RETURNN's forward task from the shell: run a dataset through a trained checkpoint and write
-- one layer's activations per sequence to HDF5 (the dataset layout, tags kept).
--
--   rnnlua recipes/forward.lua model=out/12ax/net.010.h5 data=dev.h5 layer=output output=fwd.h5
--
-- model=   a checkpoint (its network description is inside: no recipe needed)
-- data=    HDF5 files in RETURNN's layout, comma-separated, or a dataset config as a Lua table
--          literal, e.g. data='{class = "12ax", num_seqs = 100, seed = 2}'
-- layer=   the layer to write (default output)
-- output=  the file to write (output_file= too)
-- batch_size=, max_seqs=  batching (frames incl. padding, sequences)
local usage = "usage: rnnlua recipes/forward.lua model=CHECKPOINT data=FILES|'{dataset config}' "
  .. "[layer=output] output=FILE [batch_size=N] [max_seqs=N]"

local cfg = {}
local names = {model = "model", data = "data", layer = "layer", output = "output_file",
               output_file = "output_file", batch_size = "batch_size", max_seqs = "max_seqs"}
for i = 1, #arg do
  local k, v = arg[i]:match("^([%w_]+)=(.*)$")
  if not k or not names[k] then
    error(string.format("forward: unexpected argument '%s'\n%s", arg[i], usage), 0)
  end
  cfg[names[k]] = v
end
for _, k in ipairs({"model", "data", "output_file"}) do
  if not cfg[k] then error(string.format("forward: missing %s=\n%s", k == "output_file" and
    "output" or k, usage), 0) end
end
for _, k in ipairs({"batch_size", "max_seqs"}) do
  if cfg[k] then
    cfg[k] = math.tointeger(tonumber(cfg[k]))
    if not cfg[k] then error(string.format("forward: %s must be an integer\n%s", k, usage), 0) end
  end
end
if cfg.data:match("^%s*{") then
  cfg.data = rl.checkpoint.deserialize(cfg.data, "data")
else
  local files = {}
  for f in cfg.data:gmatch("[^,]+") do files[#files + 1] = f end
  cfg.data = {class = "hdf", files = files}
end
rl.forward(cfg)
