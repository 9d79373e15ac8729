-- The tools around training, subcommands of the rnnlua binary (lua/rnnlua.c dispatches to
-- M.main(name, args)):
--   rnnlua info MODEL.h5                      a checkpoint: network, parameters, epoch, step,
--                                             optimizer, learning rate, score history
--   rnnlua dump-data FILE.h5 [++seq N] [++stats]   a RETURNN-layout HDF dataset
--   rnnlua compare A.h5 B.h5                  parameter-wise max |a - b|; exit 0 iff identical
--   rnnlua average A.h5 B.h5 ... ++out OUT.h5  the mean of checkpoints of one network
--   rnnlua plot CURVE.jsonl [++out OUT.png|.svg] the learning curve drawn by gnuplot
--   rnnlua plot FILE.h5 ++heatmap KEY [++seq N] [++channel C] [++out OUT]   one sequence's
--                                             matrix (attention weights, images, activations)
--   rnnlua train CONFIG.lua|CONFIG.json       rl.train on a config file (rnnlua.config)
--   rnnlua forward ++model M ++data D ...     rl.forward; rnnlua search ...: rl.search
-- Options are parsed by rnnlua.cli (++key value; info, dump-data, compare, average and plot
-- also read --key value, and -o for ++out, the spelling of the pinned interface).
-- Checkpoints are read with rl.load_checkpoint (a data-only reader: nothing in the file is
-- run), datasets with rl.dataset{class = "hdf"}. Exit status: 0 success, 1 a bad or unreadable
-- file (or, for compare, different parameters), 2 a bad command line. Errors go to stderr as
-- "rnnlua: WHERE: WHAT", WHERE the file or the option.
local M = {}
local rl -- the module table, set by install
local cli = require("rnnlua.cli")
local util = require("rnnlua.util")
local lfs = require("lfs")

-- An error of the command line (exit 2) is a table, every other error is a string (exit 1).
local function usage(fmt, ...)
  error({usage = string.format(fmt, ...)}, 0)
end

local fail = require("rnnlua.util").fail

-- Text for the terminal. Its strings come from the files shown (tags, layer names, optimizer
-- classes): a control character other than a tab (and a line break, where `lines`) is written
-- as \NNN, so a crafted file can neither break the lines nor send escape sequences.
local function shown(s, lines)
  return (s:gsub("%c", function(c)
    if c == "\t" or (lines and c == "\n") then return c end
    return string.format("\\%03d", c:byte())
  end))
end

-- One line of output.
local function out(fmt, ...)
  io.stdout:write(shown(string.format(fmt, ...)), "\n")
end

local function shape_str(t)
  return "(" .. table.concat(t:size(), ", ") .. ")"
end

local function fmt_num(v)
  if v == nil then return "-" end
  if math.type(v) == "integer" then return tostring(v) end
  return string.format("%.6g", v)
end

-- Rows of strings as columns padded to their widest entry.
local function print_table(rows, indent)
  local w = {}
  for _, r in ipairs(rows) do
    for i, c in ipairs(r) do w[i] = math.max(w[i] or 0, #c) end
  end
  for _, r in ipairs(rows) do
    local cells = {}
    for i, c in ipairs(r) do
      cells[i] = i < #r and c .. string.rep(" ", w[i] - #c) or c
    end
    out("%s%s", indent or "  ", (table.concat(cells, "  "):gsub("%s+$", "")))
  end
end

-- The values of a tensor as a flat Lua list (float32 values are exact as Lua floats).
local function flat(t)
  local n = t:numel()
  if n == 0 then return {} end
  return t:reshape(n):totable()
end

local function load_checkpoint(path)
  local ok, ck = pcall(rl.load_checkpoint, path)
  if not ok then
    ck = tostring(ck):gsub("^rl%.load_checkpoint: ", ""):gsub("^cannot read checkpoint ", "")
    if ck:sub(1, 2 * #path + 4) == path .. ": " .. path .. ": " then ck = ck:sub(#path + 3) end
    fail("%s", ck)
  end
  return ck
end

-- The "layer/name" parameters grouped by layer, layers in the order their parameters come.
local function params_by_layer(ck)
  local layers, by = {}, {}
  for _, name in ipairs(ck.param_order) do
    local layer, pname = name:match("^([^/]+)/(.+)$")
    if not by[layer] then
      by[layer] = {}
      layers[#layers + 1] = layer
    end
    table.insert(by[layer], {name = pname, tensor = ck.param_tensors[name]})
  end
  return layers, by
end

local function describe_from(from)
  if type(from) == "table" then
    local parts = {}
    for i, f in ipairs(from) do parts[i] = tostring(f) end
    return table.concat(parts, ",")
  end
  return from == nil and "data" or tostring(from)
end

---------------------------------------------------------------------------- info

local INFO_SPEC = {usage = "rnnlua info MODEL.h5", args = {name = "one checkpoint file",
  min = 1, max = 1}, about = [[
Describes an rnnlua checkpoint (written by rl.save_checkpoint / rl.train): the network's
layers with their class, size, inputs and parameter counts, every parameter's shape, the
total, epoch, step, dtype, the pretraining step (a checkpoint of rl.train with pretrain), the
input normalisation of a model trained on globally normalised features, the optimizer and its
step count, the learning rate and the score history kept by the learning-rate control, and
rl.train's own state (accum_grad, the parameter average, the epochs keep_best_n keeps, early
stopping's best). Nothing in the file is executed.]]}

-- The learning-rate control's state as {epoch = {lr =, <score key> = value}}, epochs sorted.
local function history_of(st)
  local by, epochs = {}, {}
  for k, v in pairs(st or {}) do
    if type(k) == "string" then
      local e = k:match("^lr%.(%d+)$")
      local se, key = k:match("^score%.(%d+)%.(.+)$")
      local ei = math.tointeger(tonumber(e or se))
      if ei then
        if not by[ei] then
          by[ei] = {}
          epochs[#epochs + 1] = ei
        end
        by[ei][key or "lr"] = v
      end
    end
  end
  table.sort(epochs)
  return epochs, by
end

local function info(opts)
  local path = opts.args[1]
  local ck = load_checkpoint(path)
  out("checkpoint %s", path)
  out("epoch %d, step %d, dtype %s", ck.epoch, ck.step, ck.dtype)
  local ext = {}
  for _, k in ipairs(M.sorted_keys(ck.extern_data)) do
    local e = ck.extern_data[k]
    ext[#ext + 1] = string.format("%s (dim %s%s%s)", k, fmt_num(e.dim),
      e.sparse and ", sparse" or "", e.spatial and ", " .. e.spatial .. "-D" or "")
  end
  out("extern data: %s", table.concat(ext, ", "))
  local layers, by = params_by_layer(ck)
  local seen = {}
  for _, l in ipairs(layers) do seen[l] = true end
  for _, l in ipairs(M.sorted_keys(ck.description)) do
    if not seen[l] then layers[#layers + 1] = l end
  end
  out("network: %d layers", #layers)
  local rows = {{"layer", "class", "n_out", "from", "params"}}
  local total = 0
  for _, l in ipairs(layers) do
    local d = ck.description[l] or {}
    local n = 0
    for _, p in ipairs(by[l] or {}) do n = n + p.tensor:numel() end
    total = total + n
    rows[#rows + 1] = {l, tostring(d.class or "?"), fmt_num(d.n_out), describe_from(d.from),
                       tostring(n)}
  end
  rows[#rows + 1] = {"total", "", "", "", tostring(total)}
  print_table(rows)
  out("parameters: %d tensors, %d values", #ck.param_order, total)
  rows = {}
  for _, name in ipairs(ck.param_order) do
    local t = ck.param_tensors[name]
    rows[#rows + 1] = {name, shape_str(t), tostring(t:numel())}
  end
  print_table(rows)
  local o = ck.optimizer_state
  if o then
    out("optimizer: %s, %s steps%s", tostring(o.class), fmt_num(o.num_steps),
      (o.skipped or 0) > 0 and string.format(" (%s skipped)", fmt_num(o.skipped)) or "")
  else
    out("optimizer: (no state saved)")
  end
  local pt = ck.pretrain_state
  if pt then
    if pt.final then
      out("pretrain: %s scheme, finished: the full network (pretrain step %s of %s) trains from "
        .. "epoch %s", tostring(pt.scheme), fmt_num(pt.step), fmt_num(pt.num_steps),
        fmt_num(pt.pretrain_epochs and pt.pretrain_epochs + 1))
    else
      out("pretrain: %s scheme, step %s of %s (epochs %s-%s; the full network from epoch %s), "
        .. "layers %s", tostring(pt.scheme), fmt_num(pt.step), fmt_num(pt.num_steps),
        fmt_num(pt.first_epoch), fmt_num(pt.last_epoch),
        fmt_num(pt.pretrain_epochs and pt.pretrain_epochs + 1), tostring(pt.layers))
    end
  end
  local en = ck.engine_state
  if en then
    local parts = {string.format("accum_grad %s", fmt_num(en.accum_grad))}
    if rl.is_tensor(en.ema) then
      parts[#parts + 1] = string.format("parameter average (ema) decay %s over %s updates",
        fmt_num(en.ema_decay), fmt_num(en.ema_updates))
    end
    local saved = {}
    for k, v in pairs(en) do
      local e = type(k) == "string" and tonumber(k:match("^saved%.(%d+)$"))
      if e then saved[#saved + 1] = {e, v} end
    end
    table.sort(saved, function(a, b) return a[1] < b[1] end)
    if #saved > 0 then
      local t = {}
      for i, sv in ipairs(saved) do t[i] = string.format("%d (%s)", sv[1], fmt_num(sv[2])) end
      parts[#parts + 1] = string.format("kept epochs by %s: %s", tostring(en.best_by),
        table.concat(t, ", "))
    end
    if en.es_best then
      parts[#parts + 1] = string.format("best %s %s at epoch %s, %s epochs without improvement",
        tostring(en.best_by), fmt_num(en.es_best), fmt_num(en.es_best_epoch), fmt_num(en.es_bad))
    end
    out("training: %s", table.concat(parts, "; "))
  end
  local dn = ck.data_norm
  if dn then
    out("input normalisation: (x - mean) / std of input data over %d columns, the training "
      .. "set's (rl.forward and serve apply it): mean %s to %s, std %s to %s", dn.mean:numel(),
      fmt_num(dn.mean:min()), fmt_num(dn.mean:max()), fmt_num(dn.std:min()), fmt_num(dn.std:max()))
  end
  local st = ck.lr_control_state
  if not st then
    out("learning rate: (no learning-rate control state saved)")
    return 0
  end
  local epochs, hist = history_of(st)
  local cur = hist[ck.epoch] and hist[ck.epoch].lr
  local nxt = hist[ck.epoch + 1] and hist[ck.epoch + 1].lr
  out("learning rate: %s at epoch %d%s (control %s%s)", fmt_num(cur), ck.epoch,
    nxt and string.format(", %s for epoch %d", fmt_num(nxt), ck.epoch + 1) or "",
    tostring(st.control), type(st.decision) == "string" and st.decision ~= ""
      and ": " .. st.decision or "")
  if #epochs == 0 then return 0 end
  local keys, has = {}, {}
  for _, e in ipairs(epochs) do
    for k in pairs(hist[e]) do
      if k ~= "lr" and not has[k] then
        has[k] = true
        keys[#keys + 1] = k
      end
    end
  end
  table.sort(keys)
  out("score history:")
  rows = {{"epoch", "lr", table.unpack(keys)}}
  for _, e in ipairs(epochs) do
    local r = {tostring(e), fmt_num(hist[e].lr)}
    for _, k in ipairs(keys) do r[#r + 1] = fmt_num(hist[e][k]) end
    rows[#rows + 1] = r
  end
  print_table(rows)
  return 0
end

---------------------------------------------------------------------------- dump-data

local DUMP_SPEC = {usage = "rnnlua dump-data FILE.h5 [++seq N] [++stats]",
  args = {name = "one dataset file", min = 1, max = 1}, about = [[
Describes a RETURNN-layout HDF dataset (as rl.dataset{class = "hdf"} reads it): the number of
sequences and frames, each key's dim and kind, and the length histogram.]],
  options = {
    {"seq", "integer", nil, "also print sequence N (1-based, file order): tag, shapes, values"},
    {"stats", "boolean", false, "also read every sequence: mean and std per feature of dense "
      .. "keys, counts per label of sparse keys"},
  }}

local function histogram(lens)
  local lo, hi = math.huge, -math.huge
  for _, l in ipairs(lens) do lo, hi = math.min(lo, l), math.max(hi, l) end
  local bins = math.min(10, hi - lo + 1)
  local width = math.max(1, math.ceil((hi - lo + 1) / bins))
  local counts = {}
  for _, l in ipairs(lens) do
    local b = (l - lo) // width + 1
    counts[b] = (counts[b] or 0) + 1
  end
  local rows = {}
  local nb = (hi - lo) // width + 1
  local most = 0
  for b = 1, nb do most = math.max(most, counts[b] or 0) end
  for b = 1, nb do
    local a = lo + (b - 1) * width
    local c = counts[b] or 0
    rows[#rows + 1] = {width == 1 and tostring(a) or string.format("%d-%d", a, a + width - 1),
      tostring(c), string.rep("#", math.ceil(40 * c / math.max(most, 1)))}
  end
  return lo, hi, rows
end

local function print_values(t, sparse)
  local v = flat(t)
  if sparse then
    local s = {}
    for i, x in ipairs(v) do s[i] = tostring(math.tointeger(x) or x) end
    out("    %s", table.concat(s, " "))
    return
  end
  local size = t:size()
  local cols = size[#size]
  for r = 0, #v // math.max(cols, 1) - 1 do
    local s = {}
    for c = 1, cols do s[c] = string.format("%.4g", v[r * cols + c]) end
    out("    %s", table.concat(s, " "))
  end
end

local function dump_data(opts)
  local path, seq, stats = opts.args[1], opts.seq, opts.stats
  local ok, ds = pcall(rl.dataset, {class = "hdf", files = path, allow_empty = true})
  if not ok then fail("%s", (tostring(ds):gsub("^rl%.dataset: ", ""))) end
  ds:init_epoch(1)
  local n = ds:num_seqs()
  local ext = ds:extern_data()
  local lens, frames = {}, 0
  for k = 1, n do
    lens[k] = ds:seq_len(k)
    frames = frames + lens[k]
  end
  out("dataset %s", path)
  out("%d sequences, %d frames", n, frames)
  out("keys:")
  local rows = {}
  for _, key in ipairs(ds:keys()) do
    local e = ext[key]
    rows[#rows + 1] = {key, "dim " .. tostring(e.dim), e.sparse and "sparse" or "dense",
                       e.spatial and "images" or ""}
  end
  print_table(rows)
  local lo, hi, hrows = histogram(lens)
  out("length (data frames): min %d, max %d, mean %.2f", lo, hi, frames / n)
  print_table(hrows)
  if seq then
    if seq < 1 or seq > n then fail("%s: ++seq %d: the dataset has %d sequences", path, seq, n) end
    local s = ds:get_seq(seq)
    out("sequence %d: tag %s", seq, tostring(s.tag))
    for _, key in ipairs(ds:keys()) do
      out("  %s %s:", key, shape_str(s[key]))
      print_values(s[key], ext[key].sparse)
    end
  end
  if stats then
    local f = rl.h5file(path, "r")
    local names = {}
    -- label names: /labels for the inputs, /targets/labels/<key> for the targets (optional)
    for _, key in ipairs(ds:keys()) do
      local where = key == "data" and "labels" or "targets/labels/" .. key
      if f:exists(where) then
        local okn, lab = pcall(f.read_strings, f, where)
        if okn then names[key] = lab end
      end
    end
    f:close()
    for _, key in ipairs(ds:keys()) do
      local e = ext[key]
      if e.sparse then
        local counts, total = {}, 0
        for k = 1, n do
          for _, c in ipairs(flat(ds:get_seq(k)[key])) do
            c = math.tointeger(c)
            counts[c] = (counts[c] or 0) + 1
            total = total + 1
          end
        end
        out("%s: label counts (%d labels in all)", key, total)
        rows = {}
        for c = 0, e.dim - 1 do
          if counts[c] then
            local nm = names[key] and names[key][c + 1]
            rows[#rows + 1] = {tostring(c), nm and string.format("%q", nm) or "",
              tostring(counts[c]), string.format("%.2f%%", 100 * counts[c] / total)}
          end
        end
        print_table(rows)
      else
        local sum, sq, count = {}, {}, 0
        for j = 1, e.dim do sum[j], sq[j] = 0, 0 end
        for k = 1, n do
          local x = ds:get_seq(k)[key]:double()
          local rows_n = x:numel() // e.dim
          x = x:reshape(rows_n, e.dim)
          local s1, s2 = flat(x:sum(1)), flat((x * x):sum(1))
          for j = 1, e.dim do sum[j], sq[j] = sum[j] + s1[j], sq[j] + s2[j] end
          count = count + rows_n
        end
        out("%s: mean and std per feature over %d frames", key, count)
        rows = {{"feature", "mean", "std"}}
        for j = 1, e.dim do
          local mean = sum[j] / count
          local var = math.max(0, sq[j] / count - mean * mean)
          rows[#rows + 1] = {tostring(j - 1), string.format("%.6g", mean),
            string.format("%.6g", math.sqrt(var))}
        end
        print_table(rows)
      end
    end
  end
  return 0
end

---------------------------------------------------------------------------- compare

local COMPARE_SPEC = {usage = "rnnlua compare A.h5 B.h5", args = {name = "two checkpoint files",
  min = 2, max = 2}, about = [[
Compares the parameters of two rnnlua checkpoints: per parameter the maximum absolute
difference and whether the values are bit-identical (for checking that a resumed run equals an
uninterrupted one, or CPU against GPU by hand). Exit status 0 when every parameter is
bit-identical, 1 when some differ or the networks do not match (the parameters only one file
has and those of different shapes are named).]]}

-- Same bits as doubles (float32 widens exactly): tells 0 from -0 and compares NaNs.
local function same_bits(x, y)
  return x == y and (x ~= 0 or 1 / x == 1 / y) or (x ~= x and y ~= y and
    string.pack("<d", x) == string.pack("<d", y))
end

local function compare(opts)
  local args = opts.args
  local a, b = load_checkpoint(args[1]), load_checkpoint(args[2])
  out("A %s (epoch %d, step %d)", args[1], a.epoch, a.step)
  out("B %s (epoch %d, step %d)", args[2], b.epoch, b.step)
  local problems = {}
  for _, name in ipairs(a.param_order) do
    if not b.param_tensors[name] then problems[#problems + 1] = name .. " only in A" end
  end
  for _, name in ipairs(b.param_order) do
    if not a.param_tensors[name] then problems[#problems + 1] = name .. " only in B" end
  end
  local rows = {{"parameter", "shape", "max |A-B|", ""}}
  local identical, worst = true, 0
  for _, name in ipairs(a.param_order) do
    local ta, tb = a.param_tensors[name], b.param_tensors[name]
    if tb then
      if shape_str(ta) ~= shape_str(tb) then
        problems[#problems + 1] = string.format("%s has shape %s in A, %s in B", name,
          shape_str(ta), shape_str(tb))
      else
        local va, vb = flat(ta), flat(tb)
        local maxd, same = 0, true
        for i = 1, #va do
          local x, y = va[i], vb[i]
          if not same_bits(x, y) then
            same = false
            local d = math.abs(x - y)
            if d ~= d then d = math.huge end -- a NaN on one side only
            if d > maxd then maxd = d end
          end
        end
        worst = math.max(worst, maxd)
        identical = identical and same
        rows[#rows + 1] = {name, shape_str(ta), string.format("%.6g", maxd),
                           same and "identical" or "DIFFERENT"}
      end
    end
  end
  print_table(rows)
  if #problems > 0 then
    out("incompatible: %s", table.concat(problems, "; "))
    return 1
  end
  if a.dtype ~= b.dtype then out("dtypes differ: A %s, B %s", a.dtype, b.dtype) end
  if identical then
    out("identical: all %d parameters bit-identical", #a.param_order)
    return 0
  end
  out("different: max |A-B| = %.6g", worst)
  return 1
end

---------------------------------------------------------------------------- average

local AVERAGE_SPEC = {usage = "rnnlua average A.h5 B.h5 ... ++out OUT.h5",
  args = {name = "the checkpoints to average", min = 1}, required = {"out"},
  options = {{"out", "string", nil, "the averaged checkpoint to write (also -o)"}},
  aliases = {["-o"] = "out"}, about = [[
Averages the parameters of rnnlua checkpoints of one network (checkpoint averaging, as ESPnet's
average_checkpoints and icefall's --avg do): each parameter of OUT is the mean of the inputs',
summed in float64 and divided by their number, then rounded once to the checkpoints' dtype (k
identical checkpoints give their parameters bit for bit). OUT holds the network, the input
normalisation and the epoch and step of the last input, and no optimizer or learning-rate
state (it is a model to use: rl.forward, serve, info; not a run to resume). It is written to a
temporary file and renamed, as every checkpoint. Refused: checkpoints of different networks
(the differing layer or parameter is named), of different dtypes or input normalisations, a
file that is not a checkpoint, and OUT naming one of the inputs.]]}

-- Why checkpoint b (path pb) is not of a's network, or nil.
local function network_difference(a, b, pa, pb)
  for _, name in ipairs(a.param_order) do
    local tb = b.param_tensors[name]
    if not tb then return string.format("parameter %s is in %s, not in %s", name, pa, pb) end
    local ta = a.param_tensors[name]
    if shape_str(ta) ~= shape_str(tb) then
      return string.format("parameter %s has shape %s in %s, %s in %s", name, shape_str(ta), pa,
        shape_str(tb), pb)
    end
  end
  for i, name in ipairs(b.param_order) do
    if not a.param_tensors[name] then
      return string.format("parameter %s is in %s, not in %s", name, pb, pa)
    end
    if a.param_order[i] ~= name then
      return string.format("the parameters come in another order (%s in %s, %s in %s)",
        tostring(a.param_order[i]), pa, name, pb)
    end
  end
  local ser = rl.checkpoint.serialize
  for _, layer in ipairs(M.sorted_keys(a.description)) do
    local db = b.description[layer]
    if db == nil then return string.format("layer '%s' is in %s, not in %s", layer, pa, pb) end
    if ser(a.description[layer], layer) ~= ser(db, layer) then
      return string.format("layer '%s' is described differently (%s: %s; %s: %s)", layer, pa,
        ser(a.description[layer], layer), pb, ser(db, layer))
    end
  end
  for _, layer in ipairs(M.sorted_keys(b.description)) do
    if a.description[layer] == nil then
      return string.format("layer '%s' is in %s, not in %s", layer, pb, pa)
    end
  end
  if ser(a.extern_data, "extern_data") ~= ser(b.extern_data, "extern_data") then
    return string.format("extern_data differs (%s: %s; %s: %s)", pa,
      ser(a.extern_data, "extern_data"), pb, ser(b.extern_data, "extern_data"))
  end
  if a.dtype ~= b.dtype then return string.format("dtype %s in %s, %s in %s", a.dtype, pa, b.dtype,
    pb) end
  local na, nb = a.data_norm, b.data_norm
  if (na == nil) ~= (nb == nil) then
    return string.format("%s normalises its input (data_norm), %s does not", na and pa or pb,
      na and pb or pa)
  end
  if na then
    for _, k in ipairs({"mean", "std"}) do
      local va, vb = flat(na[k]), flat(nb[k])
      for i = 1, #va do
        if not same_bits(va[i], vb[i]) then
          return string.format("the input normalisation differs (data_norm %s[%d]: %s in %s, %s "
            .. "in %s)", k, i, fmt_num(va[i]), pa, fmt_num(vb[i]), pb)
        end
      end
    end
  end
  return nil
end

local function average(opts)
  local inputs, outp = opts.args, opts.out
  local same_file = require("rnnlua.util").same_file
  for _, p in ipairs(inputs) do
    if p == outp or same_file(p, outp) then
      fail("the output %s is one of the inputs: it would be replaced while being averaged", outp)
    end
  end
  local cks = {}
  for k, p in ipairs(inputs) do
    cks[k] = load_checkpoint(p)
    if k > 1 then
      local why = network_difference(cks[1], cks[k], inputs[1], p)
      if why then fail("%s is not a checkpoint of the network of %s: %s", p, inputs[1], why) end
    end
  end
  local first, n = cks[1], #cks
  local params = {}
  for _, name in ipairs(first.param_order) do
    local sum = first.param_tensors[name]:double()
    for k = 2, n do sum:add_(cks[k].param_tensors[name]:double()) end
    -- a division, not a product with 1/n (inexact): k equal values give back their bits
    sum:div_(n)
    params[#params + 1] = {name = name,
                           value = first.dtype == "float64" and sum or sum:float()}
  end
  local last = cks[n]
  local ok, err = pcall(rl.checkpoint.save_model, outp, {description = first.description,
    extern_data = first.extern_data, dtype = first.dtype, params = params},
    {epoch = last.epoch, step = last.step, data_norm = first.data_norm,
     rng_state = last.rng_state})
  if not ok then fail("%s", (tostring(err):gsub("^rl%.save_checkpoint: ", ""))) end
  out("wrote %s: the average of %d checkpoint%s (%d parameters)", outp, n, n == 1 and "" or "s",
    #params)
  return 0
end

---------------------------------------------------------------------------- plot

local PLOT_SPEC = {usage = "rnnlua plot CURVE.jsonl [++out OUT.png|OUT.svg]\n"
  .. "       rnnlua plot FILE.h5 ++heatmap KEY [++seq N] [++channel C] [++out OUT.png|OUT.svg]",
  args = {name = "one file", min = 1, max = 1}, about = [[
Draws a learning curve (the JSON lines rl.train appends to MODEL.curve.jsonl) with gnuplot:
train and dev score per epoch (top), train and dev error (middle) and the learning rate on a
log scale (bottom). The output's format follows its extension; the default is CURVE.png
(CURVE.jsonl without .jsonl). rl.train{..., plot = true} draws MODEL.curve.png after every
epoch.
++heatmap KEY draws one sequence (++seq N, file order, default 1) of a key of a RETURNN-layout
HDF file as a heat map (row 1 at the top): the attention weights rl.search writes (attention,
output steps down, input frames across), an image of the forward task (the data of an MDLSTM
or conv2d layer's output: channel C, default 1), or any dense sequence (features down, frames
across). The default output is FILE.KEY.N.png (FILE.h5 without .h5).]],
  options = {
    {"out", "string", nil, "the output file, .png or .svg (also -o)"},
    {"heatmap", "string", nil, "the key of FILE.h5 to draw as a heat map"},
    {"seq", "integer", nil, "the sequence of the heat map (1-based, file order) [1]"},
    {"channel", "integer", nil, "the channel of an image sequence [1]"},
  }, aliases = {["-o"] = "out"}}

-- One line of the learning curve: a flat JSON object of numbers and nulls.
local function parse_curve_line(line, where)
  local rec = {}
  local body = line:match("^%s*{(.*)}%s*$")
  if not body then fail("%s: not a JSON object", where) end
  for item in body:gmatch("[^,]+") do
    local k, v = item:match('^%s*"([%w_]+)"%s*:%s*(%S+)%s*$')
    if not k then fail("%s: cannot read %q (expects \"key\": number)", where, item) end
    if v ~= "null" then
      local x = tonumber(v)
      if not x then fail("%s: %s is %s, not a number", where, k, v) end
      rec[k] = x
    end
  end
  if not rec.epoch then fail("%s: no epoch", where) end
  return rec
end

function M.read_curve(path)
  -- io.open opens a directory on Linux; only reading it fails, with a message of its own
  if lfs.attributes(path, "mode") == "directory" then
    fail("%s: cannot read: it is a directory", path)
  end
  local fh, err = io.open(path, "r")
  if not fh then fail("%s: cannot read: %s", path, err) end
  local recs, ln = {}, 0
  for line in fh:lines() do
    ln = ln + 1
    if line:find("%S") then
      recs[#recs + 1] = parse_curve_line(line, string.format("%s:%d", path, ln))
    end
  end
  fh:close()
  if #recs == 0 then fail("%s: the learning curve is empty", path) end
  return recs
end

local function find_gnuplot()
  local p = io.popen("command -v gnuplot 2>/dev/null")
  local where = p and p:read("l")
  if p then p:close() end
  if not where or where == "" then
    fail("gnuplot is not installed (Debian: apt-get install gnuplot-nox)")
  end
  return where
end

-- A string for gnuplot (single quotes: nothing is expanded). The strings come from the files
-- drawn (sequence tags, label names, file names), and a line break would end the quoted string
-- and its command: the rest of the line would run as gnuplot commands, "!cmd" in the shell. So
-- every control character but a tab is written as \NNN (its code; shown above), which gnuplot
-- shows as it is.
local function q(s)
  return "'" .. shown((s:gsub("'", "''"))) .. "'"
end

-- "png" or "svg" from the output's name.
local function out_format(outp)
  local ext = outp:match("%.(%w+)$")
  ext = ext and ext:lower()
  if ext ~= "png" and ext ~= "svg" then
    fail("%s: the output must end in .png or .svg", outp)
  end
  return ext
end

local function terminal(ext, width, height)
  return ext == "png" and string.format("set terminal pngcairo size %d,%d", width, height)
    or string.format("set terminal svg size %d,%d", width, height)
end

-- Runs fn(data) with two temporary files: fn writes what it draws to the file `data` and
-- returns the gnuplot commands (a list of lines) that draw outp from it. path and outp name the
-- input and the picture in errors; the temporary files are removed whatever happens.
local function draw(path, outp, fn)
  if util.same_file(path, outp) then fail("%s: the output is the input file itself", path) end
  local data, script = os.tmpname(), os.tmpname()
  local ok, err = pcall(function()
    local g = fn(data)
    local fh = assert(io.open(script, "w"))
    fh:write(table.concat(g, "\n"), "\n")
    fh:close()
    local gp = find_gnuplot()
    local cmd = string.format("'%s' '%s' 2>&1", gp, script) -- both without quotes
    local p = io.popen(cmd)
    local msg = p:read("a")
    local okx, _, code = p:close()
    if not okx then
      fail("%s: gnuplot failed (exit %s) drawing %s: %s", path, tostring(code), outp, msg)
    end
  end)
  os.remove(data)
  os.remove(script)
  if not ok then error(err, 0) end
  return outp
end

-- Draws the curve at `path` into `outp` (.png or .svg), width x height pixels.
function M.plot(path, outp, opts)
  opts = opts or {}
  local width, height = opts.width or 800, opts.height or 900
  local ext = out_format(outp)
  local recs = M.read_curve(path)
  return draw(path, outp, function(data)
    local cols = {"epoch", "train_score", "dev_score", "train_error", "dev_error", "lr"}
    local has = {}
    local fh = assert(io.open(data, "w"))
    for _, r in ipairs(recs) do
      local vals = {}
      for i, c in ipairs(cols) do
        local v = r[c]
        if c == "lr" and v and v <= 0 then v = nil end -- no place on a log scale
        if v and v == v and math.abs(v) ~= math.huge then
          has[c] = true
          vals[i] = string.format("%.10g", v)
        else
          vals[i] = "NaN"
        end
      end
      fh:write(table.concat(vals, " "), "\n")
    end
    fh:close()
    local function plots(list)
      local p = {}
      for _, it in ipairs(list) do
        if has[it[1]] then
          p[#p + 1] = string.format("%s using 1:%d with linespoints title %s", q(data), it[2],
            q(it[3]))
        end
      end
      if #p == 0 then return "set label 1 'no values' at graph 0.5, 0.5 center\n"
        .. "plot [0:1] [0:1] NaN notitle\nunset label 1" end
      return "plot " .. table.concat(p, ", ")
    end
    local title = path:match("[^/]*$"):gsub("_", "\\_")
    local g = {
      terminal(ext, width, height),
      "set output " .. q(outp),
      "set datafile missing 'NaN'",
      "set multiplot layout 3,1 title " .. q(title),
      "set grid", "set key outside right", "set xlabel 'epoch'",
      #recs <= 20 and "set xtics 1" or "", -- whole epochs
      "set ylabel 'score'",
      plots({{"train_score", 2, "train"}, {"dev_score", 3, "dev"}}),
      "set ylabel 'error'",
      plots({{"train_error", 4, "train"}, {"dev_error", 5, "dev"}}),
      "set ylabel 'learning rate'", has.lr and "set logscale y" or "",
      plots({{"lr", 6, "lr"}}),
      "unset multiplot", "set output",
    }
    return g
  end)
end

-- The matrix that `key` of sequence `seq` (1-based, file order) of the HDF dataset at `path`
-- holds, as a (rows, cols) float tensor, with the names of its axes, the sequence's tag and
-- (or nil) names of the rows:
--   a key K beside K_shape (rl.search's attention): K's S * T values as (S, T) (output steps,
--   input frames; row_names: the labels of the steps when the file names them); images
--   (h, w, F) (the forward task on an MDLSTM or conv2d layer): channel `channel` as (h, w);
--   dense sequences (T, F): (F, T), time along x.
function M.heatmap_matrix(path, key, seq, channel)
  local ok, ds = pcall(rl.dataset, {class = "hdf", files = path, allow_empty = true})
  if not ok then fail("%s", (tostring(ds):gsub("^rl%.dataset: ", ""))) end
  ds:init_epoch(1)
  local keys, has = ds:keys(), {}
  for _, k in ipairs(keys) do has[k] = true end
  if not has[key] then
    table.sort(keys)
    fail("%s: no key '%s' (keys: %s)", path, tostring(key), table.concat(keys, ", "))
  end
  local n = ds:num_seqs()
  if math.type(seq) ~= "integer" or seq < 1 or seq > n then
    fail("%s: sequence %s is out of range 1..%d", path, tostring(seq), n)
  end
  local s = ds:get_seq(seq)
  local x = s[key]
  local where = string.format("%s: sequence %d ('%s'), key '%s'", path, seq, s.tag, key)
  if x:dtype() == "int32" then
    fail("%s holds labels (sparse), not a matrix", where)
  end
  local shape = has[key .. "_shape"] and s[key .. "_shape"]
  local m, xlabel, ylabel, row_names
  if shape then
    if shape:size(1) ~= 1 or shape:size(2) ~= 2 then
      fail("%s_shape must be one frame (rows, cols), got %s", where, shape_str(shape))
    end
    local r, c = math.tointeger(shape[1][1]), math.tointeger(shape[1][2])
    if not r or not c or r < 0 or c < 0 or r * c ~= x:numel() then
      fail("%s: %s_shape says %s x %s, but it holds %d values", where, key, fmt_num(shape[1][1]),
        fmt_num(shape[1][2]), x:numel())
    end
    m, xlabel, ylabel = x:contiguous():view(r, c), "input frame", "output step"
    -- rl.search's attention: the rows are the steps of the labels in data (named by /labels
    -- when the file has them), and the end label's step after them
    local f = rl.h5file(path, "r")
    local okn, names = pcall(function() return f:exists("labels") and f:read_strings("labels") end)
    f:close()
    if okn and names and s.data:dtype() == "int32" and s.data:numel() <= r then
      local ids = s.data:numel() > 0 and s.data:totable() or {}
      local rows = {}
      for k = 1, r do rows[k] = ids[k] and names[ids[k] + 1] or "(end)" end
      row_names = rows
    end
  elseif x:dim() == 3 then
    local F = x:size(3)
    if math.type(channel) ~= "integer" or channel < 1 or channel > F then
      fail("%s: channel %s is out of range 1..%d", where, tostring(channel), F)
    end
    m, xlabel, ylabel = x:select(3, channel):contiguous(), "x", "y"
  else
    m, xlabel, ylabel = x:t():contiguous(), "frame", "feature"
  end
  if m:numel() == 0 then fail("%s is empty (%s)", where, shape_str(m)) end
  return m, xlabel, ylabel, s.tag, row_names
end

-- Draws the matrix of heatmap_matrix as a heat map (row 1 at the top) into outp (.png/.svg).
function M.heatmap(path, key, outp, opts)
  opts = opts or {}
  local ext = out_format(outp)
  local m, xlabel, ylabel, tag, row_names = M.heatmap_matrix(path, key, opts.seq or 1,
    opts.channel or 1)
  local rows, cols = m:size(1), m:size(2)
  local ytics = {}
  for k, name in ipairs(row_names or {}) do ytics[k] = q(name) .. " " .. k end
  return draw(path, outp, function(data)
    local fh = assert(io.open(data, "w"))
    for _, row in ipairs(m:double():totable()) do
      for j, v in ipairs(row) do row[j] = string.format("%.7g", v) end
      fh:write(table.concat(row, " "), "\n")
    end
    fh:close()
    local title = string.format("%s, %s, sequence %d (%s)", path:match("[^/]*$"), key,
      opts.seq or 1, tag):gsub("_", "\\_")
    return {
      terminal(ext, opts.width or 800, opts.height or 600),
      "set output " .. q(outp),
      "set title " .. q(title),
      "set xlabel " .. q(xlabel), "set ylabel " .. q(ylabel),
      string.format("set xrange [0.5:%d.5]", cols),
      string.format("set yrange [%d.5:0.5]", rows),
      "set palette defined (0 '#440154', 0.25 '#3b528b', 0.5 '#21918c', 0.75 '#5ec962', "
        .. "1 '#fde725')",
      "set tics out",
      cols <= 30 and "set xtics 1" or "", rows <= 30 and "set ytics 1" or "", -- whole frames
      row_names and rows <= 60 and "set ytics (" .. table.concat(ytics, ", ") .. ")" or "",
      -- gnuplot draws an image from 2 x 2 points on; a single row or column as boxes
      "plot " .. q(data) .. " matrix using ($1 + 1):($2 + 1):" .. (rows > 1 and cols > 1
        and "3 with image" or "(0.5):(0.5):3 with boxxyerror fill solid noborder lc palette")
        .. " notitle",
      "set output",
    }
  end)
end

local function plot(opts)
  local path, outp, key, seq, channel = opts.args[1], opts.out, opts.heatmap, opts.seq,
    opts.channel
  if key then
    outp = outp or string.format("%s.%s.%d.png", path:gsub("%.h5$", ""), key, seq or 1)
    M.heatmap(path, key, outp, {seq = seq, channel = channel})
    out("wrote %s", outp)
    return 0
  end
  if seq or channel then usage("++seq and ++channel apply to ++heatmap") end
  outp = outp or (path:gsub("%.jsonl$", "") .. ".png")
  M.plot(path, outp)
  out("wrote %s", outp)
  return 0
end

---------------------------------------------------------------------------- train

local TRAIN_SPEC = {usage = "rnnlua train CONFIG.lua|CONFIG.json [++key value ...]",
  args = {name = "a config file (CONFIG.lua or CONFIG.json)", min = 1, max = 1}, train = true,
  about = [[
Trains with rl.train. CONFIG.lua returns the rl.train config table; CONFIG.json is a RETURNN 2016
config (a "network" map of layers, the training keys beside it; docs/training.md maps every key).
++key value overrides a config key, as for a recipe. Prints the final dev error rate and the
last checkpoint.]]}

local function train(opts, rest)
  local path = opts.args[1]
  local cfg = require("rnnlua.config").load(path)
  local ok, r = pcall(rl.train, cfg, rest)
  if not ok then
    -- the config is where the mistake is (an override names itself)
    local msg = util.strip_internal(r)
    error(msg:sub(1, 2) == "++" and msg or path .. ": " .. msg, 0)
  end
  if r.dev_error then
    local ler = r.history[#r.history] and r.history[#r.history].dev_ler
    out("final dev %s error rate: %.2f%% (dev score %.4f) after %d epochs",
      ler and "label" or "frame", 100 * r.dev_error, r.dev_score, r.epoch)
  end
  if r.checkpoint then out("checkpoint: %s", r.checkpoint) end
  return 0
end

---------------------------------------------------------------------------- forward, search

local FORWARD_OPTIONS = {
  {"model", "string", nil, "a checkpoint (its network description is inside: no recipe needed)"},
  {"data", "string", nil, "HDF5 files (comma-separated) or a dataset config: '{class = ...}'"},
  {"layer", "string", nil, "the layer to write [output]"},
  {"output", "string", nil, "the HDF5 file to write"},
  {"batch_size", "integer", nil, "frames of a batch, padding included [5000]"},
  {"max_seqs", "integer", nil, "sequences of a batch [40]"},
  {"device", "string", nil, "cpu, cuda or cuda:N [cpu]"},
  {"lua", "string", nil, "a Lua file run first, registering the model's Lua layer classes"},
  {"beam", "integer", nil, "beam size"},
  {"attention", "string", nil, "also write the weights of this attention layer of the rec unit"},
  {"lm", "string", nil, "a language model fused into the beam search (docs/ctc.md): an ARPA "
    .. "file, a char-LM checkpoint *.h5 (search), or '{file = ..., weight = ...}'"},
  {"lm_weight", "number", nil, "the LM's weight"},
  {"lm_bonus", "number", nil, "the insertion bonus per LM token"},
  {"lm_word_boundary", "string", nil, "the label that ends a word, for a word-level LM"},
}
local FORWARD_SPEC = {usage = "rnnlua forward ++model M ++data D [++layer L] ++output O "
  .. "[++key value ...]", required = {"model", "data", "output"}, options = {
  {"decode", "string", nil, "ctc: write the labels of CTC decoding (best path, or ++beam N)"}},
  about = [[
RETURNN's forward task (rl.forward): runs the data through the checkpoint and writes the
activations of one layer per sequence (valid frames, tags kept) in the dataset layout.]]}
local SEARCH_SPEC = {usage = "rnnlua search ++model M ++data D ++output O [++key value ...]",
  required = {"model", "data", "output"}, options = {
  {"eos", "integer", nil, "the end-of-sequence label [0]"},
  {"max_seq_len", "value", nil, "most output steps: N or an expression of T"},
  {"length_norm", "boolean", nil, "rank hypotheses by score per label"},
  {"nbest", "value", nil, "also write the n best: true (the beam) or N"},
}, about = [[
RETURNN's search task (rl.search, lua/rnnlua/search.lua): beam search through the choice of a
rec layer; writes each sequence's best labels (and scores, n-best, attention weights).]]}
for _, spec in ipairs({FORWARD_SPEC, SEARCH_SPEC}) do
  table.move(FORWARD_OPTIONS, 1, #FORWARD_OPTIONS, #spec.options + 1, spec.options)
end

-- ++lm FILE|'{...}' with ++lm_weight, ++lm_bonus, ++lm_word_boundary as rl.forward's lm table
local function lm_option(opts)
  if opts.lm == nil then
    for _, k in ipairs({"lm_weight", "lm_bonus", "lm_word_boundary"}) do
      if opts[k] ~= nil then fail("++%s: needs ++lm", k) end
    end
    return nil
  end
  local lm
  if opts.lm:match("^%s*{") then
    lm = rl.checkpoint.deserialize(opts.lm, "++lm")
  else
    lm = opts.lm:match("%.h5$") and {model = opts.lm} or {file = opts.lm}
  end
  lm.weight = opts.lm_weight or lm.weight
  lm.bonus = opts.lm_bonus or lm.bonus
  lm.word_boundary = opts.lm_word_boundary or lm.word_boundary
  return lm
end

local function forward_task(opts, search)
  local cfg = {}
  for k, v in pairs(opts) do
    if k ~= "args" and k ~= "lua" and k ~= "output" and not k:match("^lm") then cfg[k] = v end
  end
  cfg.output_file, cfg.search = opts.output, search or nil
  cfg.lm = lm_option(opts)
  if opts.lua then
    local ok, err = pcall(dofile, opts.lua) -- source only, as every file rnnlua runs
    if not ok then fail("++lua %s: %s", opts.lua, util.strip_internal(err)) end
  end
  if opts.data:match("^%s*{") then
    cfg.data = rl.checkpoint.deserialize(opts.data, "++data")
  else
    local files = {}
    for f in opts.data:gmatch("[^,]+") do files[#files + 1] = f end
    cfg.data = {class = "hdf", files = files}
  end
  rl.forward(cfg)
  return 0
end

---------------------------------------------------------------------------- dispatch

M.sorted_keys = util.sorted_keys

-- name -> {function(opts, rest), the rnnlua.cli spec}
local TOOLS = {
  info = {info, INFO_SPEC}, ["dump-data"] = {dump_data, DUMP_SPEC},
  compare = {compare, COMPARE_SPEC}, plot = {plot, PLOT_SPEC}, train = {train, TRAIN_SPEC},
  forward = {function(o) return forward_task(o, false) end, FORWARD_SPEC},
  search = {function(o) return forward_task(o, true) end, SEARCH_SPEC},
  average = {average, AVERAGE_SPEC},
}
-- the tools whose options the pinned interface spells --key also read them so (docs/tools.md)
for _, name in ipairs({"info", "dump-data", "compare", "plot", "average"}) do
  TOOLS[name][2].dashes = true
end

-- Runs tool `name` on the list of strings `args`; returns the exit status: 0, 1 for an error
-- of the run, 2 for one of the command line. Errors go to stderr as "rnnlua: WHERE: WHAT".
function M.main(name, args)
  local tool = TOOLS[name]
  if not tool then
    io.stderr:write(string.format("rnnlua: no tool '%s'\n", tostring(name)))
    return 2
  end
  local spec = util.copy(tool[2])
  spec.on_help = function(text) return {help = text} end
  local ok, opts, rest = pcall(cli.parse, spec, args)
  if ok and opts.help then
    io.stdout:write(opts.help)
    return 0
  end
  local res
  if ok then ok, res = pcall(tool[1], opts, rest) else res = {usage = opts} end
  io.stdout:flush()
  if ok then return res end
  if type(res) == "table" and res.usage then
    io.stderr:write(string.format("rnnlua: %s\n(rnnlua %s --help)\n", shown(res.usage, true),
      name))
    return 2
  end
  io.stderr:write(string.format("rnnlua: %s\n", shown(util.strip_internal(res), true)))
  return 1
end

function M.install(module)
  rl = module
  rl.tools = M
  return M
end

return M
