-- The training practice of rl.train: gradient accumulation against one larger batch, label
-- smoothing against a float64 transcription of PyTorch's formula (and a gradient check), the
-- parameter average (ema), keep_best_n, early stopping and the lr schedules across a resume
-- (bit for bit), `rnnlua average`, and the bad options of each.
local H = dofile("tests/lua/harness.lua")
local lfs = require("lfs")

local root = H.tmpdir()
local newdir = H.subdirs(root)

local NET = {
  fw = {class = "lstm", n_out = 6},
  output = {class = "softmax", from = "fw", loss = "ce", target = "classes"},
}

local function config(extra)
  local c = {
    network = NET,
    train = {class = "12ax", num_seqs = 20, seed = 1, min_len = 5, max_len = 16,
             seq_ordering = "random"},
    dev = {class = "12ax", num_seqs = 8, seed = 2, min_len = 5, max_len = 16},
    num_epochs = 4, batch_size = 100000, max_seqs = 4, optimizer = {class = "adam"},
    learning_rate = 0.02, log_verbosity = 0, seed = 3,
  }
  for k, v in pairs(extra or {}) do c[k] = v end
  return c
end

-- max |a - b| over two tensors of one shape, and max |a|
local function maxdiff(a, b)
  return (a:double() - b:double()):abs():max(), a:double():abs():max()
end

local function same_bits(a, b, what)
  H.check(a:numel() == b:numel(), what .. ": sizes differ")
  local d = maxdiff(a, b)
  H.check(d == 0, string.format("%s: max difference %.3g, expected bit-identical", what, d), 2)
end

local expect_fail = H.fails

local function files_of(dir)
  local t = {}
  for e in lfs.dir(dir) do
    if e:match("%.h5$") then t[#t + 1] = e end
  end
  table.sort(t)
  return table.concat(t, " ")
end

---------------------------------------------------------------------------- accumulation

H.test("accumulated gradients of 3 batches = the gradient of their union", function()
  rl.manual_seed(4)
  local ds = rl.dataset({class = "12ax", num_seqs = 6, seed = 5, min_len = 4, max_len = 12})
  local net = rl.network(NET, ds:extern_data())
  ds:init_epoch(1)
  net:zero_grads()
  local n = 0
  for b in rl.batches(ds, {batch_size = 100000, max_seqs = 2}) do
    net:forward(b)
    net:backward()
    n = n + 1
  end
  H.check(n == 3, "3 batches, got " .. n)
  local acc = net:grads():clone()
  ds:init_epoch(1)
  net:zero_grads()
  local big = rl.batches(ds, {batch_size = 100000, max_seqs = 6})()
  net:forward(big)
  net:backward()
  local d, scale = maxdiff(acc, net:grads())
  H.check(scale > 0 and d <= 1e-6 * scale, string.format("max |acc - big| %.3g (scale %.3g)", d,
    scale))
end)

-- one epoch of sgd with global-norm clipping: k batches of 2 accumulated against batches of 2k
local function accum_run(max_seqs, accum, extra)
  local c = config({num_epochs = 1, max_seqs = max_seqs, accum_grad = accum,
    optimizer = {class = "sgd", gradient_clip_global_norm = 0.5}, learning_rate = 0.1,
    train = {class = "12ax", num_seqs = 14, seed = 1, min_len = 5, max_len = 16}, dev = nil})
  for k, v in pairs(extra or {}) do c[k] = v end
  return rl.train(c, {})
end

H.test("rl.train: accum_grad = 3 of batches of 2 = batches of 6 (clipped, lr per update)",
    function()
  -- 14 sequences: 7 batches of 2 in groups 3, 3, 1 against batches of 6, 6, 2
  local acc, big = accum_run(2, 3), accum_run(6, 1)
  H.check(acc.step == 3 and big.step == 3, string.format("updates %d and %d, expected 3",
    acc.step, big.step))
  H.check(acc.history[1].steps == 7, "7 batches, got " .. acc.history[1].steps)
  local d, scale = maxdiff(acc.net:params(), big.net:params())
  H.check(d <= 1e-6 * scale, string.format("max difference %.3g (scale %.3g)", d, scale))
  -- the comparison can fail: without accumulation the same batches of 2 train otherwise
  local plain = accum_run(2, 1)
  H.check(plain.step == 7, "7 updates without accumulation")
  local d2 = maxdiff(plain.net:params(), big.net:params())
  H.check(d2 > 100 * d, string.format("batches of 2 without accumulation differ only by %.3g", d2))
end)

H.test("accum_grad with chunking and carried state: one update per 2 batches of chunks",
    function()
  for _, carry in ipairs({false, true}) do
    local r = rl.train(config({num_epochs = 2, accum_grad = 2, chunking = "6:6", max_seqs = 3,
      carry_state = carry, dev = nil, network = {fw = {class = "lstm", n_out = 6},
      output = NET.output}}), {})
    local updates = 0
    for _, rec in ipairs(r.history) do updates = updates + (rec.steps + 1) // 2 end
    H.check(r.history[1].steps > 2 and r.step == updates, string.format("carry_state %s: %d "
      .. "updates for batches %d and %d", tostring(carry), r.step, r.history[1].steps,
      r.history[2].steps))
  end
end)

H.test("accum_grad: warmup counts updates", function()
  -- warmup over 3 updates: the lr of the first update is a third of the rate
  local seen = {}
  local lrc = {lr = function(_, _, step) seen[#seen + 1] = step; return 0.1 end,
               epoch_done = function() end}
  accum_run(2, 3, {lr_control = lrc})
  H.check(#seen >= 3, "lr asked for each update")
  local steps = {}
  for _, s in ipairs(seen) do steps[s] = true end
  H.check(steps[1] and steps[2] and steps[3] and not steps[4],
    "the updates are steps 1..3: " .. table.concat(seen, ","))
end)

---------------------------------------------------------------------------- label smoothing

-- A softmax output on the input itself, with random parameters, and its batch.
local function smooth_setup(dtype, eps)
  local T, B, F, C = 4, 3, 5, 7
  rl.manual_seed(11)
  local net = rl.network({output = {class = "softmax", from = "data", loss = "ce",
      target = "classes", n_out = C, label_smoothing = eps}},
    {data = {dim = F}, classes = {dim = C, sparse = true}}, {dtype = dtype})
  for _, p in ipairs(net:param_list()) do p.value:copy_(rl.randn(p.value:size())) end
  local x = rl.randn(T, B, F)
  local y = rl.zeros(T, B, "int32")
  for t = 1, T do
    for b = 1, B do y[t][b] = (t * 3 + b * 5) % C end
  end
  local len = rl.tensor({4, 2, 3}, "int32")
  return net, {data = dtype == "float64" and x:double() or x, classes = y, lengths = len}, C
end

-- PyTorch's CrossEntropyLoss(label_smoothing = eps, reduction = "sum") over the valid frames,
-- and the gradient of the bias (the sum over valid frames of p - (1 - eps) onehot - eps / C),
-- in float64 from the float64 parameters.
local function smooth_reference(net, batch, C, eps)
  local W, b
  for _, p in ipairs(net:param_list()) do
    if p.name == "W" then W = p.value:double():totable() else b = p.value:double():totable() end
  end
  local x, y, len = batch.data:double():totable(), batch.classes:totable(), batch.lengths
  local loss, db = 0, {}
  for c = 1, C do db[c] = 0 end
  for bi = 1, #len:totable() do
    for t = 1, len[bi] do
      local z, mx = {}, -math.huge
      for c = 1, C do
        local s = b[c]
        for f = 1, #x[t][bi] do s = s + x[t][bi][f] * W[f][c] end
        z[c] = s
        mx = math.max(mx, s)
      end
      local se = 0
      for c = 1, C do se = se + math.exp(z[c] - mx) end
      local lse = mx + math.log(se)
      local k = y[t][bi] + 1
      local smooth = 0
      for c = 1, C do smooth = smooth - (z[c] - lse) / C end
      loss = loss + (1 - eps) * (lse - z[k]) + eps * smooth
      for c = 1, C do
        db[c] = db[c] + math.exp(z[c] - lse) - eps / C - (c == k and 1 - eps or 0)
      end
    end
  end
  return loss, db
end

for _, dtype in ipairs({"float64", "float32"}) do
  H.test("label_smoothing = 0.1: loss and gradient = PyTorch's formula in float64 (" .. dtype
      .. ")", function()
    local eps = 0.1
    local net, batch, C = smooth_setup(dtype, eps)
    local ref, dbref = smooth_reference(net, batch, C, eps)
    local loss = net:forward(batch)
    local tol = dtype == "float64" and 1e-12 or 2e-6
    H.near(loss, ref, tol * math.abs(ref), "smoothed loss")
    net:zero_grads()
    net:backward()
    local db
    for _, p in ipairs(net:param_list()) do
      if p.name == "b" then db = p.grad:double():totable() end
    end
    for c = 1, C do H.near(db[c], dbref[c], dtype == "float64" and 1e-12 or 1e-5, "db " .. c) end
    -- scoring (train = false) reports the plain cross entropy
    local plain = smooth_reference(net, batch, C, 0)
    H.near(net:forward(batch, {train = false}), plain, tol * plain, "loss with train = false")
    H.check(math.abs(plain - ref) > 1e-3, "smoothing changes the loss")
  end)
end

H.test("label_smoothing: the gradient check passes", function()
  local r = rl.gradcheck{layer = {class = "softmax", n_out = 5, loss = "ce",
    label_smoothing = 0.2}, in_dim = 4, train = true}
  H.check(r.passed, string.format("max relative error %.3g", r.max_rel_error))
  -- a wrong smoothing gradient would show: the check sees the smoothed loss
  local plain = rl.gradcheck{layer = {class = "softmax", n_out = 5, loss = "ce"}, in_dim = 4,
    train = true}
  H.check(plain.passed, "plain ce")
end)

H.test("rl.train's label_smoothing sets every ce softmax that sets none", function()
  local r = rl.train(config({num_epochs = 1, label_smoothing = 0.1, dev = nil}), {})
  H.check(r.net.description.output.label_smoothing == 0.1, "the output layer got it")
  local own = {fw = NET.fw, output = {class = "softmax", from = "fw", loss = "ce",
    target = "classes", label_smoothing = 0.3}}
  r = rl.train(config({num_epochs = 1, label_smoothing = 0.1, network = own, dev = nil}), {})
  H.check(r.net.description.output.label_smoothing == 0.3, "a layer's own value stays")
  H.check(own.output.label_smoothing == 0.3 and NET.output.label_smoothing == nil,
    "the recipe's tables are not changed")
end)

---------------------------------------------------------------------------- ema

H.test("ema: the average follows decay * ema + (1 - decay) * params", function()
  local practice = require("rnnlua.practice")
  local p = rl.tensor({1, -2, 0.5})
  local fake = {params = function() return p end}
  local ema = practice.ema(fake, 0.75)
  local want = {1, -2, 0.5}
  for step = 1, 5 do
    p:copy_(rl.tensor({step, step * step, -step}))
    ema:update(fake)
    local v = p:double():totable()
    for i = 1, 3 do want[i] = 0.75 * want[i] + 0.25 * v[i] end
  end
  local got = ema.values:double():totable()
  for i = 1, 3 do H.near(got[i], want[i], 1e-5 * math.abs(want[i]), "ema " .. i) end
  H.check(ema.updates == 5, "5 updates")
  local swapped = ema:with_average(fake, function() return p[2] end)
  H.check(swapped == ema.values[2] and p[2] == 25, "with_average swaps in and back")
end)

H.test("ema: MODEL.NNN.ema.h5 beside each checkpoint, loadable, and ema_dev_score", function()
  local d = newdir()
  local r = rl.train(config({model = d .. "/m", num_epochs = 2, ema = 0.9,
    learning_rate_control = "constant"}), {})
  for e = 1, 2 do
    local main = rl.load_checkpoint(string.format("%s/m.%03d.h5", d, e))
    local avg = rl.load_checkpoint(string.format("%s/m.%03d.ema.h5", d, e))
    H.check(avg.optimizer_state == nil and avg.epoch == e and avg.step == main.step,
      "the average is a model of the same epoch and step, without optimizer state")
    same_bits(avg.params, main.engine_state.ema, "the .ema.h5 parameters = /engine/ema")
    local diff = maxdiff(avg.params, main.params)
    H.check(diff > 0, "the average differs from the trained parameters")
  end
  same_bits(r.ema.values, rl.load_checkpoint(d .. "/m.002.ema.h5").params, "the returned ema")
  -- the average as a model: rl.forward loads it like any checkpoint
  local out = d .. "/fwd.h5"
  rl.forward{model = d .. "/m.002.ema.h5", data = config().dev, layer = "output",
             output_file = out, log_verbosity = 0}
  H.check(lfs.attributes(out, "mode") == "file", "rl.forward wrote the ema model's output")
  -- scoring with the average changes the dev score, not the training
  local r2 = rl.train(config({num_epochs = 2, ema = 0.9, ema_dev_score = true,
    learning_rate_control = "constant"}), {})
  same_bits(r2.net:params(), r.net:params(), "training with ema_dev_score")
  H.check(r2.history[2].dev_score ~= r.history[2].dev_score, "the dev score is the average's")
end)

---------------------------------------------------------------------------- resume

-- Everything a resumed run must have bit for bit: parameters, optimizer state, the average,
-- and which checkpoints are left.
local function compare_runs(d1, d2, epoch, what)
  local a = rl.load_checkpoint(string.format("%s/m.%03d.h5", d1, epoch))
  local b = rl.load_checkpoint(string.format("%s/m.%03d.h5", d2, epoch))
  same_bits(a.params, b.params, what .. ": parameters")
  H.check(a.step == b.step, what .. ": steps")
  for k, v in pairs(a.optimizer_state) do
    if rl.is_tensor(v) then same_bits(v, b.optimizer_state[k], what .. ": optimizer " .. k) end
  end
  if a.engine_state.ema then
    same_bits(a.engine_state.ema, b.engine_state.ema, what .. ": ema")
    H.check(a.engine_state.ema_updates == b.engine_state.ema_updates, what .. ": ema updates")
  end
  for k, v in pairs(a.engine_state) do
    if not rl.is_tensor(v) and k ~= "model" then
      H.check(b.engine_state[k] == v, string.format("%s: engine %s = %s, resumed %s", what, k,
        tostring(v), tostring(b.engine_state[k])))
    end
  end
  H.check(files_of(d1) == files_of(d2), string.format("%s: files %s, resumed %s", what,
    files_of(d1), files_of(d2)))
end

local SCHEDULES = {
  -- T_max would be num_epochs, 2 in the first part of the split run: a schedule of its own
  {learning_rate_control = "cosine", eta_min = 0.001, T_max = 5},
  {learning_rate_control = "noam", learning_rate = 0.5, model_size = 16, warmup_steps = 6},
  {learning_rate_control = "one_cycle", total_steps = 20, pct_start = 0.25},
}
for _, sched in ipairs(SCHEDULES) do
  H.test(sched.learning_rate_control .. " with ema, keep_best_n, accum_grad: a resume after "
      .. "epoch 2 is bit-identical", function()
    local extra = {ema = 0.8, keep_best_n = 2, accum_grad = 2,
                   early_stopping = {patience = 3}, num_epochs = 5}
    for k, v in pairs(sched) do extra[k] = v end
    local d1, d2 = newdir(), newdir()
    extra.model = d1 .. "/m"
    local full = rl.train(config(extra), {})
    extra.model, extra.num_epochs = d2 .. "/m", 2
    rl.train(config(extra), {})
    extra.num_epochs = 5
    local resumed = rl.train(config(extra), {})
    H.check(resumed.epoch == 5 and full.epoch == 5, "5 epochs")
    compare_runs(d1, d2, 5, sched.learning_rate_control)
    -- keep-best kept the 2 best epochs by dev score and the newest
    local scores = {}
    for _, rec in ipairs(full.history) do scores[#scores + 1] = rec end
    table.sort(scores, function(x, y)
      if x.dev_score ~= y.dev_score then return x.dev_score < y.dev_score end
      return x.epoch < y.epoch
    end)
    local keep = {[5] = true, [scores[1].epoch] = true, [scores[2].epoch] = true}
    for e = 1, 5 do
      local exists = lfs.attributes(string.format("%s/m.%03d.h5", d1, e)) ~= nil
      local ema = lfs.attributes(string.format("%s/m.%03d.ema.h5", d1, e)) ~= nil
      H.check(exists == (keep[e] == true) and ema == exists, string.format("epoch %d: kept %s, "
        .. "expected %s", e, tostring(exists), tostring(keep[e] == true)))
    end
    -- the lr of each epoch's last update is the schedule's
    local lcfg = {learning_rate = config().learning_rate}
    for k, v in pairs(sched) do lcfg[k] = v end
    local lrc = rl.lr_control(lcfg)
    for _, rec in ipairs(full.history) do
      H.check(rec.lr == lrc:lr(rec.epoch, rec.epoch * 3),
        string.format("epoch %d lr %.17g", rec.epoch, rec.lr))
    end
  end)
end

H.test("a resume with other schedule options is refused, naming the option", function()
  local d = newdir()
  rl.train(config({model = d .. "/m", num_epochs = 1, learning_rate_control = "noam",
    model_size = 16, warmup_steps = 4}), {})
  expect_fail(function()
    rl.train(config({model = d .. "/m", num_epochs = 2, learning_rate_control = "noam",
      model_size = 16, warmup_steps = 8}), {})
  end, "m.001.h5", "warmup_steps = 4")
end)

---------------------------------------------------------------------------- early stopping

H.test("early_stopping: stops after `patience` epochs without improvement; a resume too", function()
  -- learning rate 0: the dev score never improves after epoch 1
  local d = newdir()
  local c = config({model = d .. "/m", num_epochs = 8, learning_rate = 0, save_interval = 10,
    early_stopping = {patience = 2}, log_verbosity = 1, log_file = d .. "/log"})
  local r = rl.train(c, {})
  H.check(r.stopped_early == 3 and r.epoch == 3 and #r.history == 3, "stopped after epoch 3")
  H.check(r.best_epoch == 1, "best epoch 1")
  H.check(files_of(d) == "m.003.h5", "the stopping epoch is saved: " .. files_of(d))
  local f = assert(io.open(d .. "/log"))
  local log = f:read("a")
  f:close()
  H.check(log:find("early stopping after epoch 3: dev_score did not improve for 2 epochs", 1,
    true), "logged: " .. log)
  -- resumed: stays stopped
  local again = rl.train(c, {})
  H.check(again.epoch == 3 and #again.history == 0 and again.stopped_early == 3,
    "a stopped run stays stopped")
  -- a larger patience goes on: 2 more bad epochs
  c.early_stopping = {patience = 4}
  local more = rl.train(c, {})
  H.check(more.stopped_early == 5 and more.epoch == 5, "patience 4: stopped after epoch 5, got "
    .. tostring(more.stopped_early))
  -- split run: the counters survive a checkpoint
  local d2 = newdir()
  c.model, c.log_file, c.early_stopping, c.save_interval = d2 .. "/m", nil, {patience = 2}, 1
  c.num_epochs = 2
  rl.train(c, {})
  c.num_epochs = 8
  local split = rl.train(c, {})
  H.check(split.stopped_early == 3, "resumed after epoch 2: stopped after 3")
end)

---------------------------------------------------------------------------- bad options

for _, case in ipairs({
  {{accum_grad = 0}, "accum_grad"}, {{accum_grad = 1.5}, "accum_grad"},
  {{accum_grad = "2"}, "accum_grad"}, {{ema = 0}, "ema"}, {{ema = 1}, "ema"},
  {{ema = -0.5}, "ema"}, {{ema_dev_score = true}, "ema_dev_score"},
  {{early_stopping = {patience = 0}}, "early_stopping.patience"},
  {{early_stopping = {patience = 2, min_delta = 1}}, "min_delta"},
  {{early_stopping = 3}, "early_stopping"}, {{keep_best_n = 0}, "keep_best_n"},
  {{keep_best_n = 2}, "config.model"}, {{label_smoothing = 1}, "label_smoothing"},
  {{label_smoothing = -0.1}, "label_smoothing"},
  {{learning_rate_control = "linear_warmup"}, "unknown learning_rate_control 'linear_warmup'"},
  {{learning_rate_control = "one_cycle"}, "total_steps"},
  {{learning_rate_control = "cosine", warmup_steps = 3}, "warmup_steps"},
  {{learning_rate_control = "cosine", min_learning_rate = 0.1}, "eta_min"},
  {{best_by = "train_score", keep_best_n = 1, model = "x"}, "best_by"},
  {{label_smoothing = 0.1, network = {output = {class = "softmax", loss = "ctc",
    target = "classes"}}}, "loss = \"ce\""},
}) do
  H.test("bad option: " .. case[2], function()
    expect_fail(function() rl.train(config(case[1]), {}) end, case[2])
  end)
end

H.test("bad layer option: label_smoothing outside [0, 1) names the layer", function()
  expect_fail(function()
    rl.network({output = {class = "softmax", n_out = 2, loss = "ce", target = "classes",
      label_smoothing = 1.5}}, {data = {dim = 2}, classes = {dim = 2, sparse = true}})
  end, "layer 'output'", "label_smoothing")
end)

H.test("one_cycle: a step beyond total_steps stops training, naming total_steps", function()
  expect_fail(function()
    rl.train(config({learning_rate_control = "one_cycle", total_steps = 4}), {})
  end, "total_steps = 4")
end)

---------------------------------------------------------------------------- average

-- rl.tools.main(name, {...}): its exit status, stderr and stdout
local function run_tool(name, ...)
  local oldout, olderr = io.stdout, io.stderr
  local outfile, errfile = root .. "/stdout.txt", root .. "/stderr.txt"
  local of, ef = assert(io.open(outfile, "w")), assert(io.open(errfile, "w"))
  io.stdout, io.stderr = of, ef
  local ok, status = pcall(rl.tools.main, name, {...})
  io.stdout, io.stderr = oldout, olderr
  of:close()
  ef:close()
  H.check(ok, tostring(status))
  return status, H.read_file(errfile), H.read_file(outfile)
end

local function tool(...) return run_tool("average", ...) end

H.test("rnnlua average: k identical checkpoints bit for bit, two = their mean", function()
  local d = newdir()
  rl.train(config({model = d .. "/m", num_epochs = 2, ema = 0.9}), {})
  local a, b = d .. "/m.001.h5", d .. "/m.002.h5"
  H.check(tool(a, a, a, "-o", d .. "/avg3.h5") == 0, "average of 3")
  local ca, c3 = rl.load_checkpoint(a), rl.load_checkpoint(d .. "/avg3.h5")
  same_bits(c3.params, ca.params, "3 identical")
  H.check(c3.optimizer_state == nil and c3.description.fw.n_out == 6, "a model, no optimizer")
  H.check(tool(a, b, "-o", d .. "/avg2.h5") == 0, "average of 2")
  local cb, c2 = rl.load_checkpoint(b), rl.load_checkpoint(d .. "/avg2.h5")
  local want = ((ca.params:double() + cb.params:double()) / 2):float()
  same_bits(c2.params, want, "the mean of 2")
  H.check(c2.epoch == 2, "the last input's epoch")
  -- averages are checkpoints too, and so are the ema models
  H.check(tool(d .. "/avg2.h5", d .. "/m.002.ema.h5", "-o", d .. "/avg4.h5") == 0, "of averages")
  -- rnnlua info shows rl.train's own state
  local st, _, out = run_tool("info", b)
  H.check(st == 0 and out:find("training: accum_grad 1; parameter average (ema) decay 0.9 over "
    .. "10 updates", 1, true), "info: " .. out)
end)

H.test("rnnlua average refuses other networks, non-checkpoints and OUT = an input", function()
  local d = newdir()
  rl.train(config({model = d .. "/a", num_epochs = 1}), {})
  rl.train(config({model = d .. "/b", num_epochs = 1,
    network = {fw = {class = "lstm", n_out = 7}, output = NET.output}}), {})
  rl.train(config({model = d .. "/c", num_epochs = 1,
    network = {fw = {class = "lstm", n_out = 6, direction = -1}, output = NET.output}}), {})
  local a = d .. "/a.001.h5"
  local st, err = tool(a, d .. "/b.001.h5", "-o", d .. "/x.h5")
  H.check(st == 1 and err:find("parameter fw/", 1, true) and err:find("b.001.h5", 1, true),
    "a parameter of another shape is named: " .. err)
  st, err = tool(a, d .. "/c.001.h5", "-o", d .. "/x.h5")
  H.check(st == 1 and err:find("layer 'fw'", 1, true), "another layer description: " .. err)
  st, err = tool(a, d .. "/a.curve.jsonl", "-o", d .. "/x.h5")
  H.check(st == 1 and err:find("a.curve.jsonl", 1, true), "not a checkpoint: " .. err)
  st, err = tool(a, d .. "/./a.001.h5", "-o", d .. "/a.001.h5")
  H.check(st == 1 and err:find("one of the inputs", 1, true), "OUT = an input: " .. err)
  st = tool(a, a)
  H.check(st == 2, "no -o is a usage error")
  H.check(lfs.attributes(d .. "/x.h5") == nil, "nothing written")
end)

H.rm_rf(root)
H.done()
