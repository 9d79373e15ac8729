-- rl.train: a short run learns; the learning curve, ++key overrides, unknown keys, the log
-- (plain progress lines off a terminal, log_file); resume bit-identity; and errors (bad
-- checkpoints, dims, an empty dataset, NaN inputs, a NaN loss) that stop with a clear message
-- and leave the existing checkpoints byte-identical.
local H = dofile("tests/lua/harness.lua")
local lfs = require("lfs")

local root = H.tmpdir()
local newdir = H.subdirs(root)

local NET = {
  fw = {class = "lstm", n_out = 8},
  drop = {class = "dropout", from = "fw", dropout = 0.1},
  output = {class = "softmax", from = "drop", loss = "ce", target = "classes"},
}

-- A small 12AX config; fields of `extra` are added or replace.
local function config(extra)
  local c = {
    network = NET,
    train = {class = "12ax", num_seqs = 24, seed = 1, min_len = 5, max_len = 20,
             seq_ordering = "random"},
    dev = {class = "12ax", num_seqs = 8, seed = 2, min_len = 5, max_len = 20},
    num_epochs = 3, batch_size = 120, max_seqs = 8, optimizer = {class = "adam"},
    learning_rate = 0.02, log_verbosity = 0, seed = 3,
  }
  for k, v in pairs(extra or {}) do c[k] = v end
  return c
end

-- Every file in dir with its bytes.
local function snapshot(dir)
  local s = {}
  for e in lfs.dir(dir) do
    if e ~= "." and e ~= ".." then s[e] = H.read_file(dir .. "/" .. e) end
  end
  return s
end

local function same_snapshot(a, b, what)
  for k, v in pairs(a) do
    if k:match("%.h5$") then H.check(b[k] == v, what .. ": " .. k .. " changed or vanished") end
  end
  for k in pairs(b) do
    if k:match("%.h5$") then H.check(a[k] ~= nil, what .. ": new file " .. k) end
  end
end

local expect_fail = H.fails

H.test("a short run lowers the loss and writes curve, checkpoints and log", function()
  local d = newdir()
  local r = rl.train(config({model = d .. "/m", log_file = d .. "/log.txt", log_verbosity = 2}), {})
  local h = r.history
  H.check(#h == 3 and r.epoch == 3, "3 epochs")
  H.check(h[3].train_score < h[1].train_score, string.format("train score %g -> %g",
    h[1].train_score, h[3].train_score))
  H.check(h[3].dev_score < h[1].dev_score, "dev score falls")
  for e = 1, 3 do
    H.check(lfs.attributes(string.format("%s/m.%03d.h5", d, e)), "checkpoint " .. e)
  end
  local curve = H.lines(d .. "/m.curve.jsonl")
  H.check(#curve == 3, "3 curve lines")
  for e, l in ipairs(curve) do
    H.check(l:match('^{"epoch": (%d+),') == tostring(e), l)
    for _, k in ipairs({"lr", "train_score", "train_error", "dev_score", "dev_error", "time",
                        "steps"}) do
      H.check(l:find('"' .. k .. '": [%d.e-]+'), k .. " in " .. l)
    end
    H.near(tonumber(l:match('"dev_score": ([%d.e-]+)')), h[e].dev_score, 1e-8, "curve dev_score")
  end
  local log = H.read_file(d .. "/log.txt")
  H.check(log:find("epoch   1/3  train score", 1, true), "summary line in log")
  H.check(log:find("%d%d%d%d%-%d%d%-%d%d %d%d:%d%d:%d%d epoch   3/3"), "time stamps")
  H.check(log:find("saved " .. d .. "/m.003.h5", 1, true), "saved line")
end)

H.test("progress and summaries as plain lines when stdout is not a terminal", function()
  local d = newdir()
  local out = assert(io.open(d .. "/stdout.txt", "w"))
  local old = io.output()
  io.output(out)
  local ok, err = pcall(rl.train, config({num_epochs = 1, log_verbosity = 3,
                                          log_progress_interval = 0}), {})
  io.output(old)
  out:close()
  H.check(ok, tostring(err))
  local text = H.read_file(d .. "/stdout.txt")
  H.check(not text:find("\r", 1, true), "no carriage returns off a terminal")
  local n = 0
  for l in text:gmatch("[^\n]+") do
    if l:find("^epoch 1  batch %d+  %d+/24 seqs  %d+ frames/s  score [%d.]+  error [%d.]+%%  lr ")
      and l:find("ETA") then
      n = n + 1
    end
  end
  H.check(n >= 3, "progress lines: " .. n .. "\n" .. text)
  H.check(text:find("epoch   1/1  train score"), "summary line")
end)

H.test("++key value overrides, from argv and from the global arg", function()
  local r = rl.train(config(), {"++num_epochs", "1", "++train.num_seqs", "10",
                                "++learning_rate", "0.5", "++log_verbosity", "0"})
  H.check(#r.history == 1, "num_epochs overridden")
  H.check(r.history[1].lr == 0.5, "learning_rate overridden: " .. tostring(r.history[1].lr))
  local saved = _G.arg
  _G.arg = {[0] = "recipe.lua", "++num_epochs", "2"}
  local ok, r2 = pcall(rl.train, config())
  _G.arg = saved
  H.check(ok, tostring(r2))
  H.check(#r2.history == 2, "global arg read")
end)

H.test("unknown keys are errors naming the key", function()
  expect_fail(function() rl.train(config({num_epoch = 2}), {}) end,
    "unknown config key 'num_epoch'")
  expect_fail(function() rl.train(config(), {"++bogus_key", "1"}) end, "bogus_key")
  expect_fail(function() rl.train(config(), {"++num_epochs"}) end, "++num_epochs: lacks a value")
  expect_fail(function() rl.train(config({num_epoch = 2}), {}) end, "did you mean num_epochs?")
  -- other spellings are errors naming the ++key, never silently ignored
  expect_fail(function() rl.train(config(), {"--num_epochs", "3"}) end,
    "--num_epochs: options are written ++key value (++num_epochs)")
  expect_fail(function() rl.train(config(), {"num_epochs=3"}) end, "(++num_epochs)")
  expect_fail(function() rl.train(config(), {"++num_epoch", "3"}) end,
    "did you mean ++num_epochs?")
  expect_fail(function() rl.train(config(), {"++num_epochs", "3", "++num_epochs", "4"}) end,
    "++num_epochs: given twice, as '3' and as '4'")
  expect_fail(function() rl.train(config(), {"++num_epochs", "three"}) end,
    "++num_epochs: expects an integer, got 'three'")
end)

H.test("a resumed run ends bit-identical to an uninterrupted one", function()
  local a, b = newdir(), newdir()
  local full = rl.train(config({model = a .. "/m"}), {})
  local first = rl.train(config({model = b .. "/m", num_epochs = 2}), {})
  H.check(first.epoch == 2 and not lfs.attributes(b .. "/m.003.h5"), "2 epochs first")
  local resumed = rl.train(config({model = b .. "/m", load = "last"}), {})
  H.check(#resumed.history == 1 and resumed.history[1].epoch == 3, "only epoch 3 trained")
  H.check(resumed.step == full.step, string.format("steps %d vs %d", resumed.step, full.step))
  local pa, pb = full.net:params(), resumed.net:params()
  H.check((pa - pb):abs():max() == 0, "parameters differ after resume")
  H.check(full.history[3].dev_score == resumed.history[1].dev_score, "dev score differs")
  -- the comparison can fail: another seed gives other parameters
  local other = rl.train(config({seed = 4}), {})
  H.check((other.net:params() - pa):abs():max() > 0, "the seed changes nothing")
  -- the curve of the resumed run continues the old one
  H.check(#H.lines(b .. "/m.curve.jsonl") == 3, "resumed curve has 3 lines")
end)

-- A run with checkpoints 1 and 2 to break things against.
local function base_run()
  local d = newdir()
  rl.train(config({model = d .. "/m", num_epochs = 2}), {})
  return d, snapshot(d)
end

H.test("corrupt and truncated checkpoints: clear errors, other files untouched", function()
  local d, before = base_run()
  local s = H.read_file(d .. "/m.002.h5")
  local f = assert(io.open(d .. "/m.003.h5", "wb"))
  f:write(s:sub(1, #s // 2))
  f:close()
  before["m.003.h5"] = H.read_file(d .. "/m.003.h5")
  expect_fail(function()
    rl.train(config({model = d .. "/m", load = "last", num_epochs = 4}), {})
  end, d .. "/m.003.h5")
  f = assert(io.open(d .. "/junk.h5", "wb"))
  f:write(string.rep("not hdf5 ", 100))
  f:close()
  before["junk.h5"] = H.read_file(d .. "/junk.h5")
  expect_fail(function() rl.train(config({model = d .. "/m", load = d .. "/junk.h5"}), {}) end,
    d .. "/junk.h5")
  same_snapshot(before, snapshot(d), "bad checkpoints")
end)

H.test("a dataset whose dims disagree with the network", function()
  local d, before = base_run()
  expect_fail(function()
    rl.train(config({model = d .. "/m", load = "last",
                     dev = {class = "copy", num_seqs = 4, n_symbols = 3}}), {})
  end, "dev dataset does not fit the network", "has dim")
  same_snapshot(before, snapshot(d), "dims")
end)

-- A Lua dataset object: the given sequences, dim 9 / 2 classes like 12AX.
local function lua_dataset(seqs)
  return {
    num_seqs = function() return #seqs end, init_epoch = function() end,
    get_seq = function(_, i) return seqs[i] end, keys = function() return {"data", "classes"} end,
    extern_data = function() return {data = {dim = 9}, classes = {dim = 2, sparse = true}} end,
  }
end

H.test("an empty dataset", function()
  local d, before = base_run()
  expect_fail(function()
    rl.train(config({model = d .. "/m", load = "last", num_epochs = 3,
                     train = lua_dataset({})}), {})
  end, "epoch 3", "empty")
  same_snapshot(before, snapshot(d), "empty")
end)

H.test("NaN inputs in an HDF5 dataset: the dataset's error with the epoch", function()
  local d, before = base_run()
  local x = rl.zeros(6, 9)
  x[2][3] = 0 / 0
  local seqs = {{tag = "ok", data = rl.zeros(4, 9), classes = rl.zeros(4, "int32")},
                {tag = "bad", data = x, classes = rl.zeros(6, "int32")}}
  rl.dataset_write(d .. "/nan.hdf", seqs,
    {extern_data = {data = {dim = 9}, classes = {dim = 2, sparse = true}}})
  before["nan.hdf"] = H.read_file(d .. "/nan.hdf")
  local err = expect_fail(function()
    rl.train(config({model = d .. "/m", load = "last", num_epochs = 3,
                     train = {class = "hdf", files = {d .. "/nan.hdf"}}}), {})
  end, "epoch 3", "nan.hdf")
  H.check(err:lower():find("nan"), err)
  same_snapshot(before, snapshot(d), "nan inputs")
end)

H.test("a NaN loss stops with the epoch and step, checkpoints untouched", function()
  local d, before = base_run()
  local x = rl.zeros(5, 9)
  x:fill(1e30)
  local net = {lin = {class = "linear", n_out = 4, from = "data"},
               output = {class = "softmax", from = "lin", loss = "ce", target = "classes"}}
  rl.train(config({network = net, model = d .. "/n", num_epochs = 1}), {})
  before = snapshot(d)
  local seqs = {{tag = "huge", data = x:mul(1e30), classes = rl.zeros(5, "int32")}}
  local err = expect_fail(function()
    rl.train(config({network = net, model = d .. "/n", load = "last", num_epochs = 2,
                     train = lua_dataset(seqs)}), {})
  end, "epoch 2, step", "loss is")
  H.check(err:find("untouched"), err)
  same_snapshot(before, snapshot(d), "nan loss")
end)

-- A checkpoint whose optimizer or lr-control state is crafted (a negative second moment made
-- every parameter NaN after the first step; an lr entry of NaN stopped it at the first update
-- without naming the file): the error names the checkpoint, and no file changes.
for _, c in ipairs{
  {"a negative exp_avg_sq", function(ck) ck.optimizer_state.exp_avg_sq[1] = -1 end,
   "opt:load_state: 'exp_avg_sq' (a sum of squares) holds a negative value -1"},
  {"an lr of NaN", function(ck) ck.lr_control_state["lr.3"] = 0 / 0 end,
   "lrc:load_state: lr.3 = "},
} do
  H.test("resuming from a checkpoint with " .. c[1] .. " names the file", function()
    local d = base_run()
    local ck = rl.load_checkpoint(d .. "/m.002.h5")
    c[2](ck)
    local path = d .. "/crafted.h5"
    local r = rl.train(config({num_epochs = 1}), {})
    rl.save_checkpoint(path, {net = r.net, epoch = 2, step = ck.step, rng_state = ck.rng_state,
      optimizer = {state = function() return ck.optimizer_state end},
      lr_control = {state = function() return ck.lr_control_state end}})
    local before = snapshot(d)
    local err = expect_fail(function()
      rl.train(config({model = d .. "/m", load = path}), {})
    end, "rl.train: resuming from " .. path .. ": ", c[3])
    H.check(not err:find("lua/rnnlua/", 1, true), err)
    same_snapshot(before, snapshot(d), c[1])
  end)
end

-- A check inside the library raised one level up points into the library
-- ("lua/rnnlua/optim.lua:92: "), which tells a user nothing: rl.train names the key instead.
for _, c in ipairs{
  {"beta1 NaN", {optimizer = {class = "adam", beta1 = 0 / 0}}, "optimizer: beta1 = "},
  {"an infinite learning_rate", {learning_rate = 1 / 0},
   "rl.lr_control: learning_rate must be a finite number >= 0, got inf"},
  {"a control function returning inf", {learning_rate_control = function() return 1 / 0 end},
   "epoch 1, step 1: lrc:lr: the learning_rate_control function returned inf"},
  {"an infinite warmup (silently lr 0 before)", {learning_rate_warmup_steps = 1 / 0},
   "learning_rate_warmup_steps must be a finite number"},
  {"a log_verbosity that is a string", {log_verbosity = "x"},
   "log: verbosity must be an integer >= 0, got x"},
  {"a log_file that is a directory", {log_file = newdir()}, "log: cannot open log_file: "},
} do
  H.test("rl.train: " .. c[1] .. " names the key, not a library position", function()
    local err = expect_fail(function() rl.train(config(c[2]), {}) end, "rl.train: ", c[3])
    H.check(not err:find("lua/rnnlua/", 1, true), err)
  end)
end

H.test("forward task: the file reads back and matches a direct net:forward", function()
  local d = newdir()
  local r = rl.train(config({model = d .. "/m", num_epochs = 1}), {})
  local data = {class = "12ax", num_seqs = 6, seed = 7, min_len = 5, max_len = 20}
  for _, layer in ipairs({"output", "fw"}) do
    local res = rl.forward{model = r.checkpoint, data = data, layer = layer, log_verbosity = 0,
                           output_file = d .. "/" .. layer .. ".h5", batch_size = 60}
    H.check(res.num_seqs == 6, "6 sequences")
    local back = rl.dataset{class = "hdf", files = {d .. "/" .. layer .. ".h5"}}
    local src = rl.dataset(data)
    back:init_epoch(1)
    src:init_epoch(1)
    H.check(back:num_seqs() == 6, "reads back")
    for i = 1, 6 do
      local s, b = src:get_seq(i), back:get_seq(i)
      local T = s.data:size(1)
      H.check(b.tag == s.tag, "tag " .. b.tag .. " vs " .. s.tag)
      H.check(b.data:size(1) == T and b.data:size(2) == (layer == "fw" and 8 or 2), "shape")
      r.net:forward({data = s.data:view(T, 1, 9), classes = s.classes:view(T, 1),
                     lengths = rl.tensor({T}, "int32")}, {train = false})
      local want = r.net:layer(layer).output:select(2, 1)
      H.check((want - b.data):abs():max() < 1e-5, layer .. ": activations differ for " .. s.tag)
    end
  end
end)

-- A run without load into a model prefix that holds an earlier run's checkpoints goes on from
-- the newest, as RETURNN does (it replaced them from epoch 1); overwrite = true starts afresh;
-- a load of an earlier epoch that would replace later checkpoints is refused.
H.test("a run without load continues an earlier run of the same model prefix", function()
  local d = newdir()
  rl.train(config({model = d .. "/net", num_epochs = 2}))
  local before = snapshot(d)
  local r = rl.train(config({model = d .. "/net", num_epochs = 3}))
  H.check(r.epoch == 3 and #r.history == 1 and r.history[1].epoch == 3,
    "epoch " .. r.epoch .. ", " .. #r.history .. " epochs trained")
  local after = snapshot(d)
  H.check(after["net.001.h5"] == before["net.001.h5"]
    and after["net.002.h5"] == before["net.002.h5"], "the earlier run's checkpoints changed")
  -- the same as an uninterrupted 3-epoch run
  local full = rl.train(config({model = newdir() .. "/net", num_epochs = 3}))
  H.check((full.net:params() - r.net:params()):abs():max() == 0, "parameters differ")
  local again = rl.train(config({model = d .. "/net", num_epochs = 3}))
  H.check(#again.history == 0 and again.epoch == 3, "nothing to train")
  -- (the loaded model's dev scores, not nil: a recipe run twice prints them)
  H.check(again.dev_score == r.dev_score and again.dev_error == r.dev_error,
    string.format("dev score %s, after training %s", tostring(again.dev_score), r.dev_score))
  H.check(again.train_score == r.train_score and again.train_error == r.train_error,
    string.format("train score %s, after training %s", tostring(again.train_score),
      r.train_score))
  H.check(snapshot(d)["net.003.h5"] == after["net.003.h5"], "net.003.h5 changed")
  local fresh = rl.train(config({model = d .. "/net", num_epochs = 1, overwrite = true}))
  H.check(#fresh.history == 1 and fresh.history[1].epoch == 1, "overwrite = true starts afresh")
end)
H.expect_error("an earlier run's unreadable checkpoint is not trained over", function()
  local d = newdir()
  local f = assert(io.open(d .. "/net.004.h5", "wb"))
  f:write("not a checkpoint")
  f:close()
  rl.train(config({model = d .. "/net", num_epochs = 1}))
end, "prefix starts afresh): rl.load_checkpoint: ")
H.test("a load of this prefix's earlier epoch redoes the epochs after it (as RETURNN)", function()
  local d = newdir()
  local r2 = rl.train(config({model = d .. "/net", num_epochs = 2}))
  local r = rl.train(config({model = d .. "/net", num_epochs = 2, load = d .. "/net.001.h5"}))
  H.check(#r.history == 1 and r.history[1].epoch == 2, "epoch 2 was not trained again")
  H.check((r.net:params() - r2.net:params()):abs():max() == 0, "the resumed run differs")
end)
H.expect_error("a model loaded from elsewhere does not train over this prefix's checkpoints",
  function()
    local d, e = newdir(), newdir()
    rl.train(config({model = d .. "/net", num_epochs = 2}))
    rl.train(config({model = e .. "/pre", num_epochs = 1}))
    rl.train(config({model = d .. "/net", num_epochs = 2, load = e .. "/pre.001.h5"}))
  end, "net.002.h5 exists (an earlier run) and training epoch 2 would replace it; load = "
  .. '"last" continues from the newest checkpoint, overwrite = true replaces them')
H.expect_error("overwrite that is not a boolean", function()
  rl.train(config({overwrite = "yes"}))
end, "config.overwrite must be true or false, got string")

H.rm_rf(root)
H.done()
