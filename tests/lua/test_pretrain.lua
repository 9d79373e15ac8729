-- Pretraining (rl.train's pretrain, lua/rnnlua/pretrain.lua): the layers of each epoch's network
-- follow the default scheme and a custom one, with repetitions; parameters already trained are
-- carried into the grown network exactly (the output layer's too when its input keeps its
-- size; weights whose shape changes keep a fresh initialisation); a run resumed in the middle of
-- pretraining ends bit-identical to an uninterrupted one; rnnlua info shows the step; and bad
-- configs are errors naming the option.
local H = dofile("tests/lua/harness.lua")

local root = H.tmpdir()
local newdir = H.subdirs(root)

-- A 3-layer BLSTM with dropout between the layers (the generator matters for resume).
local function blstm(sizes)
  sizes = sizes or {6, 6, 6}
  local net, prev = {}, {"data"}
  for i, n in ipairs(sizes) do
    net["fw" .. i] = {class = "lstm", n_out = n, from = prev}
    net["bw" .. i] = {class = "lstm", n_out = n, direction = -1, from = prev}
    net["drop" .. i] = {class = "dropout", dropout = 0.1, from = {"fw" .. i, "bw" .. i}}
    prev = {"drop" .. i}
  end
  net.output = {class = "softmax", from = prev, loss = "ce", target = "classes"}
  return net
end

local function config(extra)
  local c = {
    network = blstm(),
    train = {class = "12ax", num_seqs = 16, seed = 1, min_len = 5, max_len = 15,
             seq_ordering = "random"},
    dev = {class = "12ax", num_seqs = 6, seed = 2, min_len = 5, max_len = 15},
    num_epochs = 4, batch_size = 100, max_seqs = 8, optimizer = {class = "adam"},
    learning_rate = 0.02, log_verbosity = 0, seed = 5, pretrain = "default",
  }
  for k, v in pairs(extra or {}) do c[k] = v end
  return c
end

local function layers_of(desc)
  local names = {}
  for k in pairs(desc) do names[#names + 1] = k end
  table.sort(names)
  return table.concat(names, ",")
end

local function ck(dir, epoch) return rl.load_checkpoint(string.format("%s/m.%03d.h5", dir, epoch)) end

local expect_fail = H.fails

local STEP1 = "bw1,drop1,fw1,output"
local STEP2 = "bw1,bw2,drop1,drop2,fw1,fw2,output"
local FULL = "bw1,bw2,bw3,drop1,drop2,drop3,fw1,fw2,fw3,output"

H.test("default scheme: one more BLSTM layer per epoch, then the full network", function()
  local d = newdir()
  local r = rl.train(config({model = d .. "/m"}), {})
  local want = {STEP1, STEP2, FULL, FULL}
  for e = 1, 4 do
    local c = ck(d, e)
    H.check(layers_of(c.description) == want[e], string.format("epoch %d: %s", e,
      layers_of(c.description)))
    H.check(c.pretrain_state.step == math.min(e, 3) and c.pretrain_state.num_steps == 3,
      "recorded step of epoch " .. e)
    H.check(c.pretrain_state.final == (e >= 3), "final flag of epoch " .. e)
    H.check(c.pretrain_state.pretrain_epochs == 2, "2 pretrain epochs")
  end
  -- the output reads the top layer of each step
  H.check(ck(d, 1).description.output.from[1] == "drop1", "step 1 output from drop1")
  H.check(ck(d, 2).description.output.from[1] == "drop2", "step 2 output from drop2")
  H.check(#r.net.order == 10 and r.epoch == 4, "full network at the end")
end)

H.test("repetitions: each step trains n epochs; a list gives one count per step", function()
  local d = newdir()
  rl.train(config({model = d .. "/m", num_epochs = 5, pretrain = {repetitions = 2}}), {})
  local want = {STEP1, STEP1, STEP2, STEP2, FULL}
  for e = 1, 5 do
    H.check(layers_of(ck(d, e).description) == want[e], "epoch " .. e)
  end
  local c = ck(d, 3).pretrain_state
  H.check(c.first_epoch == 3 and c.last_epoch == 4 and c.pretrain_epochs == 4, "epochs 3-4")
  local d2 = newdir()
  rl.train(config({model = d2 .. "/m", num_epochs = 4,
                   pretrain = {construction = "default", repetitions = {1, 2}}}), {})
  want = {STEP1, STEP2, STEP2, FULL}
  for e = 1, 4 do
    H.check(layers_of(ck(d2, e).description) == want[e], "list, epoch " .. e)
  end
end)

H.test("a custom scheme (function(net_desc, idx)) sets the network of each step", function()
  local d = newdir()
  local calls = {}
  -- steps: only fw1 -> output, then fw1 + bw1 (both directions), then the full network
  local function scheme(net, idx)
    calls[#calls + 1] = idx
    if idx > 2 then return nil end
    local t = {fw1 = net.fw1, output = net.output}
    t.output.from = idx == 1 and {"fw1"} or {"fw1", "bw1"}
    if idx == 2 then t.bw1 = net.bw1 end
    return t
  end
  local r = rl.train(config({model = d .. "/m", pretrain = {construction = scheme,
                                                            repetitions = {1, 2}}}), {})
  H.check(table.concat(calls, ",") == "1,2,3", "called with idx 1, 2, 3")
  local want = {"fw1,output", "bw1,fw1,output", "bw1,fw1,output", FULL}
  for e = 1, 4 do
    H.check(layers_of(ck(d, e).description) == want[e], string.format("epoch %d: %s", e,
      layers_of(ck(d, e).description)))
  end
  H.check(ck(d, 2).pretrain_state.scheme == "custom", "scheme recorded")
  -- the shorthand: pretrain = function
  local d2 = newdir()
  calls = {}
  rl.train(config({model = d2 .. "/m", num_epochs = 2, pretrain = scheme}), {})
  H.check(layers_of(ck(d2, 2).description) == "bw1,fw1,output", "shorthand, epoch 2")
  H.check(#r.net.order == 10, "full network at the end")
end)

-- The parameters of a network as {["layer/name"] = clone}.
local function snapshot(net)
  local s = {}
  for _, p in ipairs(net:param_list()) do s[p.layer .. "/" .. p.name] = p.value:clone() end
  return s
end

H.test("parameters already trained are carried into the grown network exactly", function()
  for _, sizes in ipairs({{6, 6, 6}, {6, 4, 6}}) do
    local d = newdir()
    -- the optimizer is built for each network right after the copy: see what it gets
    local seen = {}
    local function make_opt(params, grads, net)
      seen[#seen + 1] = snapshot(net)
      return rl.optimizer({class = "adam"}, params, grads)
    end
    rl.train(config({model = d .. "/m", num_epochs = 3, network = blstm(sizes),
                     optimizer = make_opt}), {})
    H.check(#seen == 3, "one optimizer per network: " .. #seen)
    for e = 1, 2 do
      local before = ck(d, e) -- the network trained in epoch e
      local after = seen[e + 1] -- the network epoch e + 1 starts with
      local copied, fresh = 0, 0
      for name, t in pairs(before.param_tensors) do
        local a = after[name]
        H.check(a ~= nil, name .. " is in the grown network")
        local same_shape = table.concat(a:size(), ",") == table.concat(t:size(), ",")
        if same_shape then
          H.check((a - t):abs():max() == 0, string.format("%s changed in the copy "
            .. "(epoch %d -> %d)", name, e, e + 1))
          copied = copied + 1
        else
          fresh = fresh + 1
          H.check(name == "output/W", "only the output weights change shape: " .. name)
        end
      end
      -- the output reads drop1 (12 wide), then drop2 (12, or 8 with sizes 6, 4, 6)
      local output_resized = sizes[e] ~= sizes[e + 1]
      H.check(fresh == (output_resized and 1 or 0), string.format("%d fresh tensors, sizes %s",
        fresh, table.concat(sizes, ",")))
      -- the new layers hold their own initial values
      local new_layer = "fw" .. (e + 1) .. "/W"
      H.check(before.param_tensors[new_layer] == nil and after[new_layer]:abs():max() > 0,
        new_layer .. " initialised")
    end
  end
end)

H.test("a run resumed in the middle of pretraining ends bit-identical", function()
  for _, case in ipairs({{stop = 1, pretrain = "default"}, {stop = 2, pretrain = "default"},
                         {stop = 1, pretrain = {repetitions = 2}},
                         {stop = 3, pretrain = {repetitions = 2}}}) do
    local a, b = newdir(), newdir()
    local full = rl.train(config({model = a .. "/m", num_epochs = 5, pretrain = case.pretrain}),
      {})
    rl.train(config({model = b .. "/m", num_epochs = case.stop, pretrain = case.pretrain}), {})
    local resumed = rl.train(config({model = b .. "/m", num_epochs = 5, load = "last",
                                     pretrain = case.pretrain}), {})
    local what = string.format("stopped after epoch %d (%s)", case.stop,
      type(case.pretrain) == "table" and "repetitions 2" or "default")
    H.check(#resumed.history == 5 - case.stop, what .. ": epochs trained")
    H.check(resumed.step == full.step, what .. ": steps")
    H.check((full.net:params() - resumed.net:params()):abs():max() == 0,
      what .. ": parameters differ")
    H.check(full.history[5].dev_score == resumed.history[#resumed.history].dev_score,
      what .. ": dev score differs")
    for e = case.stop + 1, 5 do
      local pa, pb = ck(a, e).params, ck(b, e).params
      H.check(pa:numel() == pb:numel() and (pa - pb):abs():max() == 0,
        what .. ": checkpoint " .. e)
    end
  end
  -- the comparison can fail: without pretraining the result differs
  local plain = rl.train(config({num_epochs = 5, pretrain = false}), {})
  local pre = rl.train(config({num_epochs = 5}), {})
  H.check((plain.net:params() - pre.net:params()):abs():max() > 0, "pretraining changes nothing")
end)

H.test("rnnlua info shows the pretrain step", function()
  local d = newdir()
  rl.train(config({model = d .. "/m", num_epochs = 3}), {})
  local function info(e)
    local p = io.popen(string.format("%s info %s/m.%03d.h5 2>&1", arg[-1], d, e))
    local out = p:read("a")
    p:close()
    return out
  end
  local o = info(2)
  H.check(o:find("pretrain: default scheme, step 2 of 3 (epochs 2-2; the full network from "
    .. "epoch 3), layers bw1,bw2,drop1,drop2,fw1,fw2,output", 1, true), o)
  o = info(3)
  H.check(o:find("pretrain: default scheme, finished: the full network (pretrain step 3 of 3) "
    .. "trains from epoch 3", 1, true), o)
end)

H.test("a network with nothing to reduce trains in full from epoch 1", function()
  local r = rl.train(config({num_epochs = 1, network = {
    fw = {class = "lstm", n_out = 4},
    output = {class = "softmax", from = "fw", loss = "ce", target = "classes"},
  }}), {})
  H.check(#r.net.order == 2, "fw and output")
end)

H.test("bad pretrain configs are errors naming the option", function()
  expect_fail(function() rl.train(config({pretrain = "greedy"}), {}) end, "config.pretrain",
    "unknown scheme 'greedy'")
  expect_fail(function() rl.train(config({pretrain = 3}), {}) end, "config.pretrain",
    "unknown scheme of type number")
  expect_fail(function() rl.train(config({pretrain = {construction = "from_input"}}), {}) end,
    "config.pretrain.construction", "unknown scheme 'from_input'")
  expect_fail(function() rl.train(config({pretrain = {repetition = 2}}), {}) end,
    "config.pretrain", "unknown option 'repetition'")
  for _, r in ipairs({0, -1, 1.5, "2"}) do
    expect_fail(function() rl.train(config({pretrain = {repetitions = r}}), {}) end,
      "config.pretrain.repetitions", "positive integer")
  end
  expect_fail(function() rl.train(config({pretrain = {repetitions = {1, 0}}}), {}) end,
    "config.pretrain.repetitions[2]", "got 0")
  expect_fail(function() rl.train(config({pretrain = {repetitions = {}}}), {}) end,
    "config.pretrain.repetitions")
  expect_fail(function() rl.train(config({pretrain = {repetitions = {1, 1, 1, 1}}}), {}) end,
    "config.pretrain.repetitions has 4 entries", "2 pretrain steps")
  expect_fail(function()
    rl.train(config({pretrain = function() error("my scheme broke") end}), {})
  end, "config.pretrain.construction(net_desc, 1) failed", "my scheme broke")
  expect_fail(function() rl.train(config({pretrain = function() return 42 end}), {}) end,
    "config.pretrain.construction(net_desc, 1) returned a number")
  expect_fail(function()
    rl.train(config({pretrain = function(_, i) if i == 1 then return {fw1 = "lstm"} end end}), {})
  end, "config.pretrain.construction(net_desc, 1)", "entry fw1 is a string")
  expect_fail(function()
    rl.train(config({pretrain = function(_, i) if i == 1 then return {} end end}), {})
  end, "config.pretrain.construction(net_desc, 1) returned an empty network")
  expect_fail(function()
    rl.train(config({pretrain = function(net, i)
      if i == 1 then return {output = net.output} end -- reads drop3, which is not there
    end}), {})
  end, "config.pretrain: the network of pretrain step 1", "drop3")
  expect_fail(function() rl.train(config({pretrain = function(net) return net end}), {}) end,
    "config.pretrain.construction", "never nil")
  expect_fail(function()
    rl.train(config({pretrain = {output_layers = {"nope"}}}), {})
  end, "config.pretrain.output_layers[1] = nope is not a layer")
  -- an error of the full network is the network's, not the scheme's
  local broken = blstm()
  broken.fw2.class = "lstmm"
  local err = expect_fail(function() rl.train(config({network = broken}), {}) end,
    "unknown class 'lstmm'")
  H.check(not err:find("config.pretrain", 1, true), err)
  local net = rl.network(blstm(), {data = {dim = 9}, classes = {dim = 2, sparse = true}})
  local opt = rl.optimizer({class = "adam"}, net:params(), net:grads())
  expect_fail(function() rl.train(config({optimizer = opt}), {}) end, "config.pretrain",
    "config.optimizer is an optimizer object")
  -- a checkpoint that is not the scheme's network for its epoch
  local d = newdir()
  rl.train(config({model = d .. "/m", num_epochs = 1, pretrain = false}), {})
  expect_fail(function() rl.train(config({model = d .. "/m", load = "last"}), {}) end,
    "config.pretrain: checkpoint", "the network or config.pretrain changed")
end)

H.done()
