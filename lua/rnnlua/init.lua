-- The Lua half of the rnnlua module. The C side (lua/l_module.c) has already put the tensor
-- functions into the module table `rl`; this file adds what is easier to write in Lua.
local rl = ...

local Tensor = debug.getregistry()["rnnlua.Tensor"]

function rl.cuda_available()
  return rl.device_count() > 0
end

---------------------------------------------------------------------------- printing

-- Positions shown along a dim of size n: all of them, or the first and last `edge` with a
-- gap (false) between.
local function shown(n, edge)
  local idx = {}
  if n <= 2 * edge + 1 then
    for i = 1, n do idx[#idx + 1] = i end
  else
    for i = 1, edge do idx[#idx + 1] = i end
    idx[#idx + 1] = false
    for i = n - edge + 1, n do idx[#idx + 1] = i end
  end
  return idx
end

-- One number format for all the values shown, chosen from them as Torch does.
local function number_format(t, values)
  if t:dtype() == "int32" then
    local w = 1
    for _, v in ipairs(values) do w = math.max(w, #string.format("%d", v)) end
    return "%" .. w .. "d"
  end
  local maxabs, minabs, allint = 0, math.huge, true
  for _, v in ipairs(values) do
    local a = math.abs(v)
    if a ~= a or a == math.huge then
      allint = false
    else
      maxabs = math.max(maxabs, a)
      if a > 0 then minabs = math.min(minabs, a) end
      if v ~= math.floor(v) then allint = false end
    end
  end
  if allint and maxabs < 1e9 then
    local w = 1
    for _, v in ipairs(values) do w = math.max(w, #string.format("%.0f", v)) end
    return "%" .. w .. ".0f"
  end
  if maxabs >= 1e5 or (minabs < 1e-4 and minabs > 0) then return "%11.4e" end
  local w = #string.format("%.4f", maxabs) + 1
  return "%" .. w .. ".4f"
end

local function collect(m, edge, out)
  if m:dim() == 1 then
    for _, i in ipairs(shown(m:size(1), edge)) do
      if i then out[#out + 1] = m[i] end
    end
  else
    for _, i in ipairs(shown(m:size(1), edge)) do
      if i then collect(m:select(1, i), edge, out) end
    end
  end
end

local function matrix_lines(m, fmt, edge, lines)
  if m:dim() == 1 then
    local cells = {}
    for _, i in ipairs(shown(m:size(1), edge)) do
      cells[#cells + 1] = i and string.format(fmt, m[i]) or "..."
    end
    lines[#lines + 1] = " " .. table.concat(cells, " ")
    return
  end
  local cols = shown(m:size(2), edge)
  for _, r in ipairs(shown(m:size(1), edge)) do
    if not r then
      lines[#lines + 1] = " ..."
    else
      local row, cells = m:select(1, r), {}
      for _, c in ipairs(cols) do
        cells[#cells + 1] = c and string.format(fmt, row[c]) or "..."
      end
      lines[#lines + 1] = " " .. table.concat(cells, " ")
    end
  end
end

-- Slices of a tensor of 3+ dims are printed as Torch does: "(i,j,.,.) =" then the matrix.
local function slices(m, prefix, fmt, edge, lines)
  if m:dim() <= 2 then
    lines[#lines + 1] = "(" .. table.concat(prefix, ",") .. ",.,.) ="
    matrix_lines(m, fmt, edge, lines)
    lines[#lines + 1] = ""
    return
  end
  for _, i in ipairs(shown(m:size(1), edge)) do
    if i then
      prefix[#prefix + 1] = tostring(i)
      slices(m:select(1, i), prefix, fmt, edge, lines)
      prefix[#prefix] = nil
    else
      lines[#lines + 1] = "..."
      lines[#lines + 1] = ""
    end
  end
end

local function describe(t)
  return string.format("[%s %s on %s]", t:dtype(), tostring(t:size()), t:device())
end

function Tensor.__tostring(t)
  local edge = 3
  local m = t:device() == "cpu" and t or t:cpu()
  if m:numel() == 0 then return "(empty)\n" .. describe(t) end
  if m:dim() == 0 then
    return string.format(number_format(m, {m:item()}), m:item()) .. "\n" .. describe(t)
  end
  local values = {}
  collect(m, edge, values)
  local fmt = number_format(m, values)
  local lines = {}
  if m:dim() <= 2 then
    matrix_lines(m, fmt, edge, lines)
  else
    slices(m, {}, fmt, edge, lines)
  end
  lines[#lines + 1] = describe(t)
  return table.concat(lines, "\n")
end

---------------------------------------------------------------------------- layers and networks

-- Registered before its parts load, so that a part that only needs the module table takes it with
-- require("rnnlua") (the table is complete by the time the part's functions run).
package.loaded["rnnlua"] = rl

require("rnnlua.layers").install(rl)    -- rl.layers (and the Lua layer classes)
require("rnnlua.rec")                  -- the rec layer (recurrent sub-networks), attention
require("rnnlua.network").install(rl)   -- rl.network
require("rnnlua.gradcheck").install(rl) -- rl.gradcheck
require("rnnlua.optim").install(rl)      -- rl.optimizer
require("rnnlua.lr_control").install(rl) -- rl.lr_control
require("rnnlua.datasets").install(rl)  -- rl.dataset, rl.batches, rl.hdf_writer, rl.dataset_write
require("rnnlua.engine").install(rl)    -- rl.train, rl.forward, rl.save/load_checkpoint
require("rnnlua.lm").install(rl)        -- language models for decoding (lm = {...})
require("rnnlua.ctc").install(rl)       -- rl.ctc_decode
require("rnnlua.score").install(rl)     -- rl.scorer, rl.ctc_score (CER, WER, PER)
require("rnnlua.search").install(rl)    -- rl.search (beam search over a dataset)
require("rnnlua.tools").install(rl)     -- rl.tools: info, dump-data, compare, plot
require("rnnlua.sample").install(rl)    -- rl.sample: text from a character language model

return rl
