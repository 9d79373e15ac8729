-- rl.train(config [, argv]): the default training loop. A recipe may write its own: this one
-- only uses the dataset, optimizer and learning-rate-control interfaces, so any Lua object
-- with those methods can stand in for each (config.train/dev: a dataset config or object;
-- config.optimizer: a config for rl.optimizer, an object with step/state/load_state, or a
-- function(params, grads, net) returning one; config.lr_control: an object with
-- lr/epoch_done/state/load_state instead of the learning_rate* keys).
--
-- Per epoch: train:init_epoch(epoch); for each batch of rl.batches: zero the gradients,
-- forward, backward, opt:step(lrc:lr(epoch, step)) (a skipped step is logged; with
-- accum_grad = k the gradients of k batches are summed before each step, an epoch's last group
-- possibly shorter, so every epoch ends with an update); then the dev
-- set is scored with train = false (loss per frame, frame error rate), a summary line is
-- logged, one JSON line is appended to learning_curve_file (with plot = true also drawn by
-- rl.tools.plot into the same name ending in .png instead of .jsonl),
-- lrc:epoch_done(epoch, scores)
-- (a network with a ctc loss reports the label error rate instead of the frame error rate:
-- edit distances of the best paths over reference labels, summed over the whole set, as
-- "LER" in the lines and as train_ler/dev_ler in the curve and the scores, so that
-- learning_rate_control_error_measure = "dev_ler" lets newbob follow it; sequences the ctc
-- loss skipped (no alignment fits) are logged at verbosity 2 and counted as ctc_skipped)
-- decides the next learning rate and every save_interval epochs (and after the last) a
-- checkpoint model .. ".%03d.h5" is written. `step` counts updates over the whole run,
-- skipped ones included (with accum_grad = 1 one per batch).
--
-- Training practice (rnnlua.practice; docs/training.md): ema = decay keeps an average of the
-- parameters (written beside each checkpoint as model .. ".%03d.ema.h5"; ema_dev_score = true
-- scores dev with it), keep_best_n deletes all but the best saved checkpoints and the newest,
-- early_stopping = {patience = n} stops after n epochs without a better dev score (best_by),
-- label_smoothing = eps sets that option of every ce softmax; their state is in each
-- checkpoint's /engine group, so a resume continues them bit for bit.
--
-- Devices: device = "cuda" (or "cuda:N"; default "cpu") builds the network on the CPU (the
-- same initial values as a CPU run), moves it there with net:to, then builds the optimizer, so
-- its state lives on the device too. Each batch is assembled on the host by rl.batches and
-- its input and target tensors are copied to the device by net:forward (one copy each;
-- lengths and sizes stay on the host); dev scoring runs on the device; checkpoints copy the
-- parameters and optimizer state to the host, and load = ... copies them back onto the
-- device. Overlap: kernels are queued asynchronously, so the host assembles the next batch
-- (reading, padding, stacking) while the device still runs the current step's backward; the
-- host-to-device copies themselves are synchronous (pageable memory), and the loss of each
-- step is read back at the end of its forward (a synchronisation point). A device that cannot
-- be used (no CUDA build, no GPU, no such ordinal) is an error before any data is read.
--
-- Carried state (truncated BPTT): carry_state = true with chunking = "size" cuts each sequence
-- into consecutive chunks, keeps each sequence's chunks in one batch slot (rl.batches'
-- carry_state) and starts the lstm/gru layers of every chunk from the final state of the
-- chunk before (net:forward's state_from), without a gradient through the boundary; dev is
-- scored the same way. The network must be causal (no backward recurrence: an error names the
-- layer).
--
-- Command-line overrides: `rnnlua recipe.lua ++num_epochs 3 ++train.num_seqs 100` sets
-- config keys (nested with dots) from argv (default: the global `arg`); values are read as
-- booleans, numbers or strings. A key that rl.train does not know, in the config or in an
-- override, is an error naming it.
--
-- Resuming: load = "last" continues from the newest model.NNN.h5 (if there is none, training
-- starts from scratch), and so does a run without load whose model prefix already has
-- checkpoints (RETURNN's behaviour; overwrite = true trains afresh and replaces them instead);
-- a checkpoint that training would replace otherwise (load of an earlier epoch) is refused.
-- load = path from that file: parameters, optimizer state, lr control,
-- RNG state, epoch and step are restored and training goes on with the next epoch. Since the
-- dataset's order depends only on its seed and the epoch, a resumed run on the CPU ends with
-- the same parameters, bit for bit, as an uninterrupted one.
--
-- Pretraining: pretrain = "default" | function(net_desc, idx) | {construction =, repetitions =}
-- grows the network layer by layer over the first epochs, as RETURNN's pretrain does
-- (lua/rnnlua/pretrain.lua: the schemes, what is copied, the optimizer, checkpoints).
--
-- Several processes (`mpirun -np N`, config.distributed): rnnlua.dist deals the data to the
-- ranks, sums the gradients (sync) or averages the parameters (average), adds up the scores;
-- only rank 0 writes files and the log. With one process ctx.dist is nil and nothing changes.
--
-- Returns {config = (the config used: defaults and overrides applied), net =, optimizer =,
-- lr_control =, epoch =, step =, history = {per-epoch records}, checkpoint = last path written
-- or loaded, learning_curve_file =, train_score =, train_error =, dev_score =, dev_error =
-- (the scores of the last epoch trained; with nothing to train, the loaded model's dev scores
-- and the train scores its epoch recorded), ema = (the average, or nil), stopped_early = (the
-- epoch early stopping ended the run with, or nil), best_epoch = (early stopping's best)}.
local M = {}
local rl -- the module table, set by install
local checkpoint = require("rnnlua.checkpoint")
local logmod = require("rnnlua.log")
local distmod = require("rnnlua.dist")
local pretrainmod = require("rnnlua.pretrain")
local practice = require("rnnlua.practice")
local grad_scaler = require("rnnlua.grad_scaler")

-- Every key rl.train knows, with its default (false: no default).
local KEYS = {
  network = false, extern_data = false, train = false, dev = false, num_epochs = 1,
  batch_size = 5000, max_seqs = 40, chunking = false, optimizer = {class = "adam"},
  learning_rate = 1e-3, learning_rate_control = "constant", lr_control = false,
  min_learning_rate = false, learning_rate_warmup_steps = false, model = false,
  save_interval = 1, load = false, log_verbosity = 3, log_file = false,
  log_progress_interval = 5, learning_curve_file = false, seed = 1, device = "cpu",
  dtype = "float32", num_threads = false, distributed = false, plot = false, pretrain = false,
  carry_state = false, overwrite = false, accum_grad = 1, ema = false, ema_dev_score = false,
  keep_best_n = false, early_stopping = false, best_by = false, label_smoothing = false,
  precision = "fp32", grad_scaler = false,
}
-- learning-rate-control options handed to rl.lr_control besides those above: newbob's, the
-- learning_rate* ones and the schedules' (rl.lr_control_options)
local LR_OPTIONS
local function is_lr_key(k)
  if not LR_OPTIONS then
    LR_OPTIONS = {}
    for _, o in ipairs(rl.lr_control_options) do LR_OPTIONS[o] = true end
  end
  return LR_OPTIONS[k] == true
end

local function fail(fmt, ...)
  error("rl.train: " .. string.format(fmt, ...), 0)
end

local smooth_labels -- defined with the configuration
local ahead_lr -- defined with the loop

---------------------------------------------------------------------------- configuration

local copy_table = require("rnnlua.util").copy
local cli = require("rnnlua.cli")

local function is_key(k)
  return type(k) == "string" and (KEYS[k] ~= nil or is_lr_key(k))
end
M.is_key = is_key

-- The names of KEYS and of the lr control's options, sorted.
function M.known_keys()
  local keys = require("rnnlua.util").sorted_keys(KEYS)
  for _, o in ipairs(rl.lr_control_options) do
    if KEYS[o] == nil then keys[#keys + 1] = o end
  end
  table.sort(keys)
  return keys
end

-- The ++key value pairs of argv (a list of strings, cli.overrides) applied to cfg.
local function apply_overrides(cfg, argv)
  for _, o in ipairs(cli.overrides(argv, is_key, KEYS)) do
    local t, path = cfg, o.path
    for j = 1, #path - 1 do
      local sub = t[path[j]]
      if sub == nil then sub = {} end
      if type(sub) ~= "table" then
        fail("override ++%s: '%s' is a %s, not a table", o.key,
          table.concat(path, ".", 1, j), type(sub))
      end
      -- a plain table is copied so that the recipe's own config is not changed
      if getmetatable(sub) == nil then sub = copy_table(sub) end
      t[path[j]] = sub
      t = sub
    end
    t[path[#path]] = o.value
  end
end

-- The value of config key k this run would use, as --help shows it ("" when unset).
local function shown_value(config, k)
  local v = config[k]
  if v == nil and KEYS[k] ~= false then v = KEYS[k] end
  return type(v) == "table" and "{...}" or type(v) == "function" and "(a function)"
    or v ~= nil and tostring(v) or ""
end

-- `--help` among the arguments of rl.train: the config keys, with this config's values; `--help
-- KEY` (the next argument, a key name): that key's type, default and help (rnnlua.train_keys).
local function print_help(config, word)
  local key = word and (word:match("^%+%+([%a_][%w_]*)$") or word:match("^([%a_][%w_]*)$"))
  local lines
  if key then
    local text, near = require("rnnlua.train_keys").describe(key)
    if not text then
      fail("--help %s: no config key of that name%s", key,
        near and " (did you mean ++" .. near .. "?)" or "")
    end
    local v = shown_value(config, key)
    lines = {text .. (v ~= "" and "  this run: " .. v or "  this run: unset")}
  else
    local script = type(_G.arg) == "table" and _G.arg[0] or "SCRIPT"
    lines = {string.format("usage: rnnlua %s [++key value ...]", script),
      "rl.train's config keys (nested with dots: ++train.num_seqs 100; docs/training.md), with "
      .. "this run's values (--help KEY describes one):"}
    local keys = M.known_keys()
    for k in pairs(config) do
      if not is_key(k) then keys[#keys + 1] = tostring(k) end
    end
    for _, k in ipairs(keys) do
      local shown = shown_value(config, k)
      lines[#lines + 1] = string.format("  ++%-32s %s", k, shown ~= "" and "[" .. shown .. "]" or "")
    end
  end
  io.stdout:write(table.concat(lines, "\n"), "\n")
  io.stdout:flush()
  os.exit(0, true)
end

-- The global `arg` as overrides: without a script its positive entries are the interpreter's
-- own options (-e CODE ...), not arguments for rl.train.
local function script_args()
  local a = _G.arg
  if type(a) ~= "table" then return {} end
  if a[-1] == nil and type(a[1]) == "string" and a[1]:match("^%-") and not a[1]:match("^%+%+") then
    return {}
  end
  local list = {}
  for i = 1, #a do list[i] = a[i] end
  return list
end

-- The network description with label_smoothing = eps on every softmax layer with loss "ce"
-- (also inside rec units) that does not set its own; a network without one is an error.
smooth_labels = function(network, eps)
  if type(network) ~= "table" then return network end
  local net = require("rnnlua.util").deep_copy(network)
  local n = 0
  local function walk(layers)
    for _, d in pairs(layers) do
      if type(d) == "table" then
        if d.class == "softmax" and d.loss == "ce" then
          if d.label_smoothing == nil then d.label_smoothing = eps end
          n = n + 1
        elseif d.class == "rec" and type(d.unit) == "table" then
          walk(d.unit)
        end
      end
    end
  end
  walk(net)
  if n == 0 then
    fail("config.label_smoothing applies to softmax layers with loss = \"ce\"; the network "
      .. "has none")
  end
  return net
end

local function check_config(config, argv)
  if type(config) ~= "table" then fail("expects a config table, got %s", type(config)) end
  if type(argv) ~= "table" then fail("argv must be a list of strings, got %s", type(argv)) end
  for i, a in ipairs(argv) do
    if a == "--help" or a == "-h" then print_help(config, argv[i + 1]) end
  end
  local cfg = copy_table(config)
  for k in pairs(cfg) do
    if type(k) ~= "string" or (KEYS[k] == nil and not is_lr_key(k)) then
      local near = type(k) == "string" and cli.closest(k, M.known_keys())
      fail("unknown config key '%s'%s", tostring(k),
        near and " (did you mean " .. near .. "?)" or "")
    end
  end
  apply_overrides(cfg, argv)
  for k, d in pairs(KEYS) do
    if cfg[k] == nil and d ~= false then cfg[k] = d end
  end
  if type(cfg.network) ~= "table" then fail("config.network must be a table of layers") end
  if cfg.train == nil then fail("config.train (a dataset config or object) is missing") end
  local function posint(k)
    if math.type(cfg[k]) ~= "integer" or cfg[k] < 1 then
      fail("config.%s must be a positive integer, got %s", k, tostring(cfg[k]))
    end
  end
  posint("num_epochs")
  posint("batch_size")
  posint("max_seqs")
  posint("save_interval")
  if type(cfg.device) ~= "string" or not (cfg.device == "cpu" or cfg.device:match("^cuda$")
      or cfg.device:match("^cuda:%d+$")) then
    fail("config.device must be \"cpu\", \"cuda\" or \"cuda:N\", got %s", tostring(cfg.device))
  end
  require("rnnlua.network").check_precision("config.precision", cfg.precision, cfg.dtype,
    cfg.device, true)
  if cfg.load ~= nil and type(cfg.load) ~= "string" then
    fail("config.load must be \"last\" or a checkpoint path, got %s", type(cfg.load))
  end
  if cfg.load == "last" and cfg.model == nil then fail("load = \"last\" needs config.model") end
  if cfg.plot ~= nil and type(cfg.plot) ~= "boolean" then
    fail("config.plot must be true or false, got %s", type(cfg.plot))
  end
  if cfg.model ~= nil and type(cfg.model) ~= "string" then
    fail("config.model must be a path prefix (string), got %s", type(cfg.model))
  end
  if cfg.overwrite ~= nil and type(cfg.overwrite) ~= "boolean" then
    fail("config.overwrite must be true or false, got %s", type(cfg.overwrite))
  end
  if cfg.carry_state ~= nil and type(cfg.carry_state) ~= "boolean" then
    fail("config.carry_state must be true or false, got %s", type(cfg.carry_state))
  end
  if cfg.carry_state and not cfg.chunking then
    fail("carry_state = true needs chunking = \"size\" (the chunks the state is carried over)")
  end
  if cfg.carry_state and cfg.distributed then
    fail("carry_state = true does not work with distributed training yet")
  end
  if math.type(cfg.accum_grad) ~= "integer" or cfg.accum_grad < 1 then
    fail("config.accum_grad must be an integer >= 1 (batches per update), got %s",
      tostring(cfg.accum_grad))
  end
  if cfg.ema ~= nil and (type(cfg.ema) ~= "number" or not (cfg.ema > 0 and cfg.ema < 1)) then
    fail("config.ema must be a decay in (0, 1) (e.g. 0.999), got %s", tostring(cfg.ema))
  end
  if cfg.ema and type(cfg.distributed) == "table" and cfg.distributed.mode == "average" then
    fail("config.ema does not work with distributed = {mode = \"average\"} (the ranks' "
      .. "parameters differ between averagings); mode = \"sync\" keeps them identical")
  end
  if cfg.ema_dev_score ~= nil and type(cfg.ema_dev_score) ~= "boolean" then
    fail("config.ema_dev_score must be true or false, got %s", type(cfg.ema_dev_score))
  end
  if cfg.ema_dev_score and not cfg.ema then
    fail("config.ema_dev_score = true needs config.ema (the decay of the averaged parameters)")
  end
  if cfg.keep_best_n ~= nil then
    if math.type(cfg.keep_best_n) ~= "integer" or cfg.keep_best_n < 1 then
      fail("config.keep_best_n must be an integer >= 1, got %s", tostring(cfg.keep_best_n))
    end
    if not cfg.model then fail("config.keep_best_n needs config.model (the checkpoints kept)") end
    if cfg.dev == nil then fail("config.keep_best_n needs a dev set (config.dev) to rank by") end
  end
  if cfg.early_stopping ~= nil then
    local es = cfg.early_stopping
    if type(es) ~= "table" then
      fail("config.early_stopping must be a table {patience = n}, got %s", type(es))
    end
    for k in pairs(es) do
      if k ~= "patience" then fail("config.early_stopping: unknown option '%s' (patience)",
        tostring(k)) end
    end
    if math.type(es.patience) ~= "integer" or es.patience < 1 then
      fail("config.early_stopping.patience must be an integer >= 1 (epochs without "
        .. "improvement), got %s", tostring(es.patience))
    end
    if cfg.dev == nil then fail("config.early_stopping needs a dev set (config.dev)") end
  end
  if cfg.best_by ~= nil and (type(cfg.best_by) ~= "string" or not cfg.best_by:match("^dev_")) then
    fail("config.best_by must name a dev score (dev_score, dev_error, dev_ler), got %s",
      tostring(cfg.best_by))
  end
  local eps = cfg.label_smoothing
  if eps ~= nil and (type(eps) ~= "number" or not (eps >= 0 and eps < 1)) then
    fail("config.label_smoothing must be a number in [0, 1), got %s", tostring(eps))
  end
  if eps and eps > 0 then cfg.network = smooth_labels(cfg.network, eps) end
  -- dynamic loss scaling (rnnlua.grad_scaler): on by default in fp16 only (bf16 and fp32 have
  -- float32's range), allowed in any precision
  if cfg.grad_scaler == nil then cfg.grad_scaler = cfg.precision == "fp16" end
  if cfg.grad_scaler ~= false then
    if cfg.distributed then
      fail("config.grad_scaler does not work with distributed training yet (grad_scaler = false "
        .. "trains fp16 without loss scaling)")
    end
    local okg, o = pcall(grad_scaler.options, "config.grad_scaler", cfg.grad_scaler)
    if not okg then fail("%s", o) end
    cfg.grad_scaler = o
  end
  return cfg
end

---------------------------------------------------------------------------- helpers

-- The newest <model>.NNN.h5, or nil.
local function last_checkpoint(model)
  local lfs = require("lfs")
  local dir, base = model:match("^(.*)/([^/]*)$")
  local where = dir == nil and "." or dir == "" and "/" or dir
  if lfs.attributes(where, "mode") ~= "directory" then return nil end
  local best, best_epoch = nil, -1
  local pattern = "^" .. (dir and base or model):gsub("%p", "%%%0") .. "%.(%d+)%.h5$"
  for entry in lfs.dir(where) do
    local e = tonumber(entry:match(pattern))
    if e and e > best_epoch then
      best, best_epoch = dir and dir .. "/" .. entry or entry, e
    end
  end
  return best
end

local function mkdir_p(path)
  local ok, err = require("rnnlua.util").mkdir_p(path)
  if not ok then fail("%s", err) end
end

local function dir_of(path)
  return path:match("^(.*)/[^/]*$")
end

-- The dataset's streams must match what the network reads.
local function check_dims(ds, net, which)
  local keys = {}
  for k in pairs(net.used_extern) do keys[#keys + 1] = k end
  table.sort(keys)
  local ok, err = pcall(rl.check_dataset_dims, ds, net.ext, keys)
  if not ok then fail("the %s dataset does not fit the network: %s", which, tostring(err)) end
end

local function json_number(v)
  if v == nil or v ~= v or v == math.huge or v == -math.huge then return "null" end
  if math.type(v) == "integer" then return string.format("%d", v) end
  return string.format("%.10g", v)
end

local CURVE_KEYS = {"epoch", "lr", "train_score", "train_error", "dev_score", "dev_error",
                    "time", "steps", "skipped"}
-- a network with a ctc loss adds its label error rates and the sequences it skipped
local CTC_CURVE_KEYS = {"train_ler", "dev_ler", "ctc_skipped"}

local function curve_line(rec, ctc)
  local parts = {}
  local keys = CURVE_KEYS
  if ctc then
    keys = table.move(CURVE_KEYS, 1, #CURVE_KEYS, 1, {})
    table.move(CTC_CURVE_KEYS, 1, #CTC_CURVE_KEYS, #keys + 1, keys)
  end
  for _, k in ipairs(keys) do
    parts[#parts + 1] = string.format("%q: %s", k, json_number(rec[k]))
  end
  return "{" .. table.concat(parts, ", ") .. "}"
end

local function fmt_time(s)
  if s == nil or s ~= s or s == math.huge then return "?" end
  s = math.floor(s + 0.5)
  if s >= 3600 then return string.format("%dh%02dm", s // 3600, s % 3600 // 60) end
  if s >= 60 then return string.format("%dm%02ds", s // 60, s % 60) end
  return string.format("%ds", s)
end

local function pct(e)
  return e and string.format("%.2f%%", 100 * e) or "-"
end

local function score(s)
  return s and string.format("%.4f", s) or "-"
end

local function finite(x) return x == x and x ~= math.huge and x ~= -math.huge end

---------------------------------------------------------------------------- the loop

local function make_optimizer(cfg, net)
  local o = cfg.optimizer
  if type(o) == "function" then return o(net:params(), net:grads(), net) end
  if type(o) == "table" and type(o.step) == "function" then return o end
  if type(o) ~= "table" then
    fail("config.optimizer must be a table or an object, got %s", type(o))
  end
  local ocfg = copy_table(o)
  if ocfg.max_norm ~= nil and ocfg.param_list == nil then ocfg.param_list = net:param_list() end
  return rl.optimizer(ocfg, net:params(), net:grads())
end

local function make_lr_control(cfg)
  if cfg.lr_control ~= nil then return cfg.lr_control end
  local lcfg = {}
  for k, v in pairs(cfg) do
    if is_lr_key(k) then lcfg[k] = v end
  end
  -- cosine anneals over the whole run unless told otherwise (PyTorch recipes' T_max)
  if lcfg.learning_rate_control == "cosine" and lcfg.T_max == nil then
    lcfg.T_max = cfg.num_epochs
  end
  return rl.lr_control(lcfg)
end

-- Loss per frame and error rate of a dataset, without training: frame errors per frame, or
-- for a ctc network label errors (edit distance of the best paths) per reference label over
-- the whole set; and the number of sequences a ctc loss skipped (dist: sums of the world).
local function evaluate(net, ds, cfg, which, dist)
  ds:init_epoch(1)
  if ds:num_seqs() == 0 and not dist then fail("the %s dataset is empty (0 sequences)", which) end
  local loss, errors, frames, units, skipped = 0, 0, 0, 0, 0
  -- carried state: dev is cut into the same chunks and scored with the state carried over
  local bopts = {batch_size = cfg.batch_size, max_seqs = cfg.max_seqs}
  if cfg.carry_state then bopts.chunking, bopts.carry_state = cfg.chunking, true end
  for batch in rl.batches(ds, bopts) do
    local l, e = net:forward(batch, {train = false})
    loss, errors, frames = loss + l, errors + e, frames + net.n_frames
    units, skipped = units + net.n_error_units, skipped + net.n_skipped
  end
  if dist then
    loss, errors, frames, units, skipped = dist:sum(loss, errors, frames, units, skipped)
  end
  if frames == 0 then fail("the %s dataset gave no frames", which) end
  return loss / frames, errors / math.max(units, 1), skipped
end

-- The lr of a step to come (logs and checks): one_cycle defines none beyond total_steps, and
-- a run ending exactly there looks one step ahead of its last.
ahead_lr = function(lrc, epoch, step)
  return lrc:lr(epoch, lrc.max_step and math.min(step, lrc.max_step) or step)
end

-- The dev scores of evaluate, with ema_dev_score from the averaged parameters.
local function score_dev(net, dev, cfg, dist, ctx)
  if cfg.ema_dev_score then
    return ctx.ema:with_average(net, function() return evaluate(net, dev, cfg, "dev", dist) end)
  end
  return evaluate(net, dev, cfg, "dev", dist)
end

local function train_epoch(ctx, epoch)
  local cfg, net, opt, lrc, log, ds = ctx.cfg, ctx.net, ctx.opt, ctx.lrc, ctx.log, ctx.train
  local dist = ctx.dist
  if dist then dist:epoch_begins(epoch) end
  ds:init_epoch(epoch)
  local nseqs = ds:num_seqs()
  if nseqs == 0 and not dist then
    fail("epoch %d: the train dataset is empty (0 sequences)", epoch)
  end
  -- chunks that do not overlap (carried state) cover each frame once
  local total = ds.total_frames and (cfg.chunking == nil or cfg.carry_state)
    and ds:total_frames() or nil
  local t0 = rl.clock()
  local loss, errors, frames, seqs, steps, skipped, lr, updates = 0, 0, 0, 0, 0, 0, nil, 0
  local units, ctc_skipped = 0, 0
  local ename = net.has_ctc and "LER" or "error"
  local bopts = {batch_size = cfg.batch_size, max_seqs = cfg.max_seqs, chunking = cfg.chunking,
                 carry_state = cfg.carry_state}
  -- gradient accumulation: the gradients of accum_grad batches are summed (backward adds to
  -- them) and one update is taken; an epoch's last group may be shorter, so that every
  -- checkpoint (written at an epoch's end) follows an update and holds no partial sum
  local accum, in_group, group_has = cfg.accum_grad, 0, false
  local ok, err = pcall(function()
    -- dist: false is an empty step of a rank whose share is used up (others still train)
    local next_batch = dist and dist:batches(ds, bopts) or rl.batches(ds, bopts)
    -- {ok, batch or error}: an error in assembling a batch is raised when its turn comes
    local function fetch() return table.pack(pcall(next_batch)) end
    local pending = fetch()
    while true do
      if not pending[1] then error(pending[2], 0) end
      local batch = pending[2]
      if batch == nil then break end
      steps = steps + 1
      if in_group == 0 then net:zero_grads() end
      local l, e = 0, 0
      if batch then l, e = net:forward(batch) end
      if not finite(l) then
        error(string.format("the loss is %s (batch of %d sequences, first tag %s); stopped "
          .. "before the update, existing checkpoints are untouched%s", tostring(l),
          batch.lengths:size(1), tostring(batch.tags and batch.tags[1]),
          ctx.checkpoint and " (last: " .. ctx.checkpoint .. ")" or ""), 0)
      end
      if batch and net.n_skipped > 0 then
        ctc_skipped = ctc_skipped + net.n_skipped
        log:write(2, "epoch %d batch %d: %d sequence(s) skipped by the ctc loss: no alignment "
          .. "fits (more labels than frames allow; first tag %s)", epoch, steps,
          net.n_skipped, tostring(batch.tags and batch.tags[1]))
      end
      if batch then
        net.grad_scale = ctx.scaler and ctx.scaler.scale or 1
        net:backward()
      end
      in_group, group_has = in_group + 1, group_has or batch ~= false
      -- the next batch is assembled on the host while the device runs this backward
      pending = fetch()
      -- every rank of a world sees the same sequence of batches and ends (nil) in lock step,
      -- so all take their updates (and collectives) at the same batches
      if in_group == accum or (pending[1] and pending[2] == nil) then
        ctx.step = ctx.step + 1
        lr = lrc:lr(epoch, ctx.step)
        local applied, reason
        local scaler = ctx.scaler
        local overflow = scaler and scaler:unscale(net:grads())
        if overflow then
          -- an fp16 overflow: nothing of this group reaches the parameters or the optimizer
          local was = scaler.scale
          scaler:update(true)
          applied, reason = false, string.format("gradients not finite at loss scale %g; "
            .. "scale now %g", was, scaler.scale)
        elseif dist then
          applied, reason = dist:step(opt, lr, net, ctx.step, group_has)
        else
          applied, reason = opt:step(lr)
        end
        if scaler and not overflow and scaler:update(false) == "grow" then
          log:write(2, "epoch %d step %d: loss scale grown to %g after %d clean steps", epoch,
            ctx.step, scaler.scale, scaler.opts.growth_interval)
        end
        if applied == false then
          skipped = skipped + 1
          log:write(2, "epoch %d step %d: update skipped (%s)", epoch, ctx.step, tostring(reason))
        elseif ctx.ema then
          ctx.ema:update(net)
        end
        in_group, group_has = 0, false
        updates = updates + 1
      end
      local nf = batch and net.n_frames or 0
      loss, errors, frames = loss + l, errors + e, frames + nf
      units = units + (batch and net.n_error_units or 0)
      if batch and batch.state_from then
        -- carried state: a slot is a new sequence only where its state starts from zeros
        for _, s in ipairs(batch.state_from) do seqs = seqs + (s == 0 and 1 or 0) end
      else
        seqs = seqs + (batch and batch.lengths:size(1) or 0)
      end
      local dt = rl.clock() - t0
      local done = total and frames / total or seqs / nseqs
      local eta = done > 0 and dt * (1 - done) / done or nil
      local line = string.format("epoch %d  batch %d  %d/%d seqs  %.0f frames/s  score %.4f  "
        .. "%s %s  lr %s  ETA %s", epoch, steps, math.min(seqs, nseqs), nseqs,
        dt > 0 and frames / dt or 0, loss / frames, ename, pct(errors / math.max(units, 1)),
        lr and string.format("%.3g", lr) or "-", fmt_time(math.max(0, eta or 0)))
      if log.verbosity >= 4 then
        log:write(4, "%s  batch loss %.4f", line, l / math.max(nf, 1))
      else
        log:progress(line)
      end
    end
  end)
  if not ok then
    fail("epoch %d, step %d: %s", epoch, ctx.step, (tostring(err):gsub("^rl%.train: ", "")))
  end
  if steps == 0 then fail("epoch %d: the train dataset gave no batches", epoch) end
  log:clear_progress()
  if dist then
    loss, errors, frames, units, ctc_skipped = dist:epoch_ends(net, opt, loss, errors, frames,
      units, ctc_skipped)
  end
  return {loss = loss / frames, error = errors / math.max(units, 1), frames = frames,
          steps = steps, updates = updates, skipped = skipped, lr = lr, time = rl.clock() - t0,
          ctc_skipped = ctc_skipped}
end

function M.train(config, argv)
  if argv == nil then argv = script_args() end
  local cfg = check_config(config, argv)
  -- a world of several processes (mpirun): rnnlua.dist; only rank 0 writes files and the log
  local dist = distmod.setup(cfg)
  local writer = not dist or dist:writer()
  for _, k in ipairs({"model", "log_file", "learning_curve_file"}) do
    if writer and type(cfg[k]) == "string" and dir_of(cfg[k]) then mkdir_p(dir_of(cfg[k])) end
  end
  -- a bad log_verbosity or an unopenable log_file: "rl.train: log: ...", not the position of
  -- this call
  local okl, log = pcall(logmod.new, {verbosity = writer and cfg.log_verbosity or 0,
                                      file = writer and cfg.log_file or nil,
                                      progress_interval = cfg.log_progress_interval})
  if not okl then fail("%s", require("rnnlua.util").strip_internal(log)) end
  local ok, result = pcall(function()
    if cfg.device ~= "cpu" then
      local probe = rl.zeros(1)
      local okd, err = pcall(probe.to, probe, cfg.device)
      if not okd then
        fail("config.device = \"%s\": %s", cfg.device, (tostring(err):gsub("^to: ", "")))
      end
    end
    if cfg.num_threads then rl.set_num_threads(cfg.num_threads) end
    local train = rl.dataset(cfg.train)
    -- a training set that normalises its input globally (the audio dataset) hands its statistics
    -- to every checkpoint: they are part of the model (rl.forward and serve apply them)
    local data_norm = type(train.norm_stats) == "function" and train:norm_stats() or nil
    local dev = cfg.dev ~= nil and rl.dataset(cfg.dev) or nil
    if dist then
      train, dev = dist:train_set(train), dev and dist:dev_set(dev)
      log:write(2, "%s", dist:describe())
    end
    local extern = cfg.extern_data or train:extern_data()
    -- pretraining (rnnlua.pretrain): the network of each epoch, planned before the seed is set
    -- a network is built on the CPU and moved: one in fp16 (CUDA only) takes its precision there
    local built_precision = cfg.precision == "fp16" and "fp32" or cfg.precision
    local pre = pretrainmod.plan(cfg, extern, function(desc)
      local n = rl.network(desc, extern, {dtype = cfg.dtype, precision = built_precision})
      check_dims(train, n, "train")
      if dev then check_dims(dev, n, "dev") end
      return n
    end)
    rl.manual_seed(cfg.seed)
    local ctx = {cfg = cfg, log = log, train = train, step = 0, history = {}, dist = dist,
      scaler = cfg.grad_scaler and grad_scaler.new(cfg.grad_scaler) or nil}
    function ctx.new_network(desc)
      local n = rl.network(desc, extern, {dtype = cfg.dtype, precision = built_precision})
      if cfg.device ~= "cpu" then
        n:to(cfg.device)
        log:write(2, "network moved to %s", n.device)
      end
      if built_precision ~= cfg.precision then n:set_precision(cfg.precision) end
      check_dims(train, n, "train")
      if dev then check_dims(dev, n, "dev") end
      if cfg.carry_state then
        local why = n:carry_unfit()
        if why then fail("carry_state = true: %s", why) end
      end
      return n
    end
    function ctx.new_optimizer(n) return make_optimizer(cfg, n) end
    if pre then
      for _, line in ipairs(pre:describe()) do log:write(2, "%s", line) end
      pre:enter(ctx, 1, false)
    else
      ctx.net = ctx.new_network(cfg.network)
      ctx.opt = ctx.new_optimizer(ctx.net)
    end
    local net = ctx.net
    ctx.lrc = make_lr_control(cfg)
    ctx.best_by, ctx.keep_best = cfg.best_by or "dev_score", cfg.keep_best_n
    ctx.patience = cfg.early_stopping and cfg.early_stopping.patience
    ctx.saved_scores = {}
    log:write(2, "network: %d parameters, layers %s", net:num_params(),
      table.concat(net.order, ", "))

    local start = 1
    local load, loaded = cfg.load, nil
    -- checkpoints of an earlier run with this prefix and no load: go on from the newest, as
    -- RETURNN does, rather than train afresh over them (overwrite = true does that)
    local auto = load == nil and not cfg.overwrite and cfg.model and last_checkpoint(cfg.model)
    if auto then
      load = auto
      log:write(1, "%s exists (an earlier run with model = %s): continuing from it, as RETURNN "
        .. "does; overwrite = true starts afresh and replaces its checkpoints, another model "
        .. "prefix keeps them", auto, cfg.model)
    elseif load == "last" then
      load = last_checkpoint(cfg.model)
      if not load then
        log:write(2, "no checkpoint %s.NNN.h5 yet: training from scratch", cfg.model)
      end
    end
    if load then
      local okc, ck = pcall(rl.load_checkpoint, load)
      if not okc then
        if auto then
          fail("continuing the earlier run of model = %s (overwrite = true or another model "
            .. "prefix starts afresh): %s", cfg.model, require("rnnlua.util").strip_internal(ck))
        end
        error(ck, 0)
      end
      if pre then pre:resume(ctx, ck) end
      net = ctx.net
      -- the states a checkpoint restores check what they are given: their errors name the file
      local okl, lerr = pcall(function()
        checkpoint.load_params(ck, net)
        if ck.optimizer_state and ctx.opt.load_state then ctx.opt:load_state(ck.optimizer_state) end
        if ck.lr_control_state and ctx.lrc.load_state then
          ctx.lrc:load_state(ck.lr_control_state)
        end
        rl.set_rng_state(ck.rng_state)
      end)
      if not okl then
        fail("resuming from %s%s: %s", load, auto and " (the newest checkpoint of an earlier "
          .. "run of this model prefix; overwrite = true or another model prefix starts afresh)"
          or "", require("rnnlua.util").strip_internal(lerr))
      end
      start, ctx.step, ctx.checkpoint, loaded = ck.epoch + 1, ck.step, load, ck
      log:write(1, "resumed from %s (epoch %d, step %d)", load, ck.epoch, ck.step)
    end
    if cfg.ema then ctx.ema = practice.ema(net, cfg.ema) end
    if loaded then
      local okr, rerr = pcall(practice.restore, ctx, loaded, log)
      if not okr then fail("resuming from %s: %s", load, tostring(rerr)) end
    end
    -- a run that early stopping ended stays ended unless the patience was raised
    local stopped = ctx.patience and ctx.es_bad and ctx.es_bad >= ctx.patience
    if stopped then
      log:write(1, "early stopping ended this run at epoch %d: %s did not improve for %d epochs "
        .. "(best %.6g at epoch %d); a larger early_stopping.patience goes on", start - 1,
        ctx.best_by, ctx.es_bad, ctx.es_best, ctx.es_best_epoch)
    end
    -- a saved model is never replaced unless asked: overwrite = true, or a load of one of this
    -- prefix's own checkpoints (resuming a run from an earlier epoch redoes the epochs after
    -- it, as RETURNN does); a model loaded from elsewhere does not train over this prefix's
    local own = load and cfg.model and load:sub(1, #cfg.model + 1) == cfg.model .. "."
      and load:sub(#cfg.model + 2):match("^%d+%.h5$") ~= nil
    if cfg.model and writer and not cfg.overwrite then
      local lfs = require("lfs")
      for epoch = start, cfg.num_epochs do
        local path = cfg.model .. string.format(".%03d.h5", epoch)
        if (epoch % cfg.save_interval == 0 or epoch == cfg.num_epochs)
            and lfs.attributes(path, "mode") ~= nil then
          if not own then
            fail("%s exists (an earlier run) and training epoch %d would replace it; load = "
              .. "\"last\" continues from the newest checkpoint, overwrite = true replaces them, "
              .. "another model prefix keeps them", path, epoch)
          end
          log:write(1, "%s will be replaced: resuming from %s redoes epoch %d", path, load, epoch)
        end
      end
    end
    if dist then
      -- before the first collective: ranks that differ would pair collectives of other sizes
      dist:check_world(cfg, net, start, ctx.step, ahead_lr(ctx.lrc, start, ctx.step + 1))
      dist:sync_params(net)
    end

    local curve_path = cfg.learning_curve_file or (cfg.model and cfg.model .. ".curve.jsonl")
    if not writer then curve_path = nil end
    if curve_path and start == 1 then
      local f, err = io.open(curve_path, "w")
      if not f then
        fail("cannot write learning_curve_file %s: %s", curve_path, tostring(err):gsub("^[^:]*: ", ""))
      end
      f:close()
    end

    local last, stopped_early
    for epoch = start, stopped and start - 1 or cfg.num_epochs do
      local grown = pre and pre:enter(ctx, epoch, true)
      if grown then
        net = ctx.net
        if dist then dist:sync_params(net) end
        if cfg.ema then
          ctx.ema = practice.ema(net, cfg.ema)
          log:write(2, "epoch %d: the parameter average (ema) starts anew with the grown network",
            epoch)
        end
        log:write(2, "epoch %d: pretrain step %d, layers %s: %d parameters (%d tensors copied; "
          .. "new layers: %s%s)", epoch, grown.step, table.concat(net.order, ", "),
          net:num_params(), grown.copied, table.concat(grown.new_layers, ", "),
          #grown.reshaped == 0 and "" or "; initialised anew, their shape changed: "
          .. table.concat(grown.reshaped, ", "))
      end
      local tr = train_epoch(ctx, epoch)
      local rec = {epoch = epoch, lr = tr.lr, train_score = tr.loss, train_error = tr.error,
                   time = tr.time, steps = tr.steps, skipped = tr.skipped}
      local ctc = net.has_ctc
      if ctc then rec.train_ler, rec.ctc_skipped = tr.error, tr.ctc_skipped end
      if dev then
        local okd, s, e, sk = pcall(score_dev, net, dev, cfg, dist, ctx)
        if not okd then
          fail("epoch %d, dev scoring: %s", epoch, (tostring(s):gsub("^rl%.train: ", "")))
        end
        if not finite(s) then fail("epoch %d: the dev loss is %s", epoch, tostring(s)) end
        rec.dev_score, rec.dev_error = s, e
        if ctc then rec.dev_ler, rec.ctc_skipped = e, rec.ctc_skipped + sk end
      end
      -- a ctc network's error is its label error rate (LER)
      local ename = ctc and "LER" or "error"
      log:write(1, "epoch %3d/%d  train score %s %s %s  dev score %s %s %s  lr %.3g  "
        .. "%.1f s  %.0f frames/s  %d steps%s%s", epoch, cfg.num_epochs, score(rec.train_score),
        ename, pct(rec.train_error), score(rec.dev_score), ename, pct(rec.dev_error), tr.lr,
        tr.time, tr.frames / math.max(tr.time, 1e-9), tr.steps,
        (tr.updates ~= tr.steps and string.format(" (%d updates)", tr.updates) or "")
        .. (tr.skipped > 0 and string.format(" (%d skipped)", tr.skipped) or ""),
        ctc and rec.ctc_skipped > 0
          and string.format(" (%d sequences without a fitting alignment skipped)", rec.ctc_skipped)
          or "")
      ctx.lrc:epoch_done(epoch, {dev_score = rec.dev_score, dev_error = rec.dev_error,
                                 train_score = rec.train_score, train_error = rec.train_error,
                                 dev_ler = rec.dev_ler, train_ler = rec.train_ler})
      if dist then
        dist:agree("the next learning rate", ahead_lr(ctx.lrc, epoch + 1, ctx.step + 1))
      end
      if ctx.lrc.log_line then
        -- shown by default only when the rate changes
        local changed = tr.lr ~= ahead_lr(ctx.lrc, epoch + 1, ctx.step + 1)
        log:write(changed and 2 or 4, "lr control: %s", ctx.lrc:log_line())
      end
      if curve_path then
        -- a full disk or a read-only folder stops the run, naming the file and the cause
        local f, err = io.open(curve_path, "a")
        local ok = f ~= nil
        if ok then ok, err = f:write(curve_line(rec, net.has_ctc), "\n") end
        if f then
          local okc, errc = f:close()
          if ok and not okc then ok, err = false, errc end
        end
        if not ok then
          fail("cannot append to learning_curve_file %s: %s", curve_path,
            tostring(err):gsub("^[^:]*: ", ""))
        end
        -- plot = true: the picture next to the curve (MODEL.curve.png), redrawn every epoch
        if cfg.plot then
          local okp, perr = pcall(rl.tools.plot, curve_path, curve_path:gsub("%.jsonl$", "")
            .. ".png")
          if not okp then fail("epoch %d, plot: %s", epoch, tostring(perr)) end
        end
      end
      if ctx.patience and practice.early_stop(ctx, epoch, practice.score_of(ctx, rec)) then
        stopped_early = epoch
        log:write(1, "early stopping after epoch %d: %s did not improve for %d epochs (best "
          .. "%.6g at epoch %d)", epoch, ctx.best_by, ctx.es_bad, ctx.es_best, ctx.es_best_epoch)
      end
      if cfg.model and (epoch % cfg.save_interval == 0 or epoch == cfg.num_epochs
          or stopped_early) then
        local path, ema_path = practice.paths(cfg.model, epoch)
        local gone = ctx.keep_best and practice.prune(ctx, epoch, practice.score_of(ctx, rec))
        if writer then
          -- the average first: a main checkpoint (what a resume finds) always has its average
          if ctx.ema then
            ctx.ema:with_average(net, function()
              rl.save_checkpoint(ema_path, {net = net, lr_control = ctx.lrc, epoch = epoch,
                                            step = ctx.step, data_norm = data_norm})
            end)
            log:write(2, "saved %s (the parameter average, ema = %g)", ema_path, ctx.ema.decay)
          end
          rl.save_checkpoint(path, {net = net, optimizer = ctx.opt, lr_control = ctx.lrc,
                                    epoch = epoch, step = ctx.step,
                                    pretrain = pre and pre:state(epoch), data_norm = data_norm,
                                    engine = practice.state(ctx)})
          log:write(2, "saved %s", path)
          if gone and #gone > 0 then
            practice.delete(ctx, gone, log)
            log:write(2, "keep_best_n = %d: deleted the checkpoints of epoch(s) %s", ctx.keep_best,
              table.concat(gone, ", "))
          end
        end
        ctx.checkpoint = path
      end
      ctx.history[#ctx.history + 1] = rec
      last = rec
      if stopped_early then break end
    end
    -- nothing to train (a run continued at or past num_epochs): dev_score and dev_error are
    -- the loaded model's, so a recipe run twice reports its model instead of nil
    local dev_score, dev_error = last and last.dev_score, last and last.dev_error
    local train_score, train_error = last and last.train_score, last and last.train_error
    if not last then
      -- the train scores of the loaded epoch, as its lr control state recorded them
      local rec = ctx.lrc.scores and ctx.lrc.scores[start - 1]
      if rec then train_score, train_error = rec.train_score, rec.train_error end
      if dev then
        local okd, s, e = pcall(score_dev, net, dev, cfg, dist, ctx)
        if not okd then fail("dev scoring: %s", (tostring(s):gsub("^rl%.train: ", ""))) end
        dev_score, dev_error = s, e
      end
      log:write(1, "nothing to train: the checkpoint is at epoch %d, num_epochs = %d%s%s",
        start - 1, cfg.num_epochs, stopped and " (stopped early)" or "",
        dev_score and string.format("; its dev score %s error %s",
        score(dev_score), pct(dev_error)) or "")
    end
    if dist then dist:finish() end
    return {config = cfg, net = net, optimizer = ctx.opt, lr_control = ctx.lrc,
      epoch = math.max(start - 1, last and last.epoch or 0), step = ctx.step, history = ctx.history,
      checkpoint = ctx.checkpoint, learning_curve_file = curve_path,
      train_score = train_score, train_error = train_error,
      dev_score = dev_score, dev_error = dev_error, ema = ctx.ema,
      stopped_early = stopped_early or (stopped and start - 1) or nil,
      best_epoch = ctx.es_best_epoch}
  end)
  if not ok then
    if dist then dist:abandon() end
    local msg = require("rnnlua.util").strip_internal(result)
    if not msg:find("^rl%.train: ") then msg = "rl.train: " .. msg end
    log:to_file(msg)
    log:close()
    error(msg, 0)
  end
  log:close()
  return result
end

function M.install(module)
  rl = module
  checkpoint.install(module)
  require("rnnlua.forward").install(module)
  pretrainmod.install(module)
  rl.train = M.train
  -- a copy, for the documentation test and --help: rl.train's own KEYS stay private
  rl.train_options = require("rnnlua.util").sorted_keys(KEYS)
  return M
end

return M
