-- Options of the recurrent family (docs/layers.md, `lstm` and `gru`): zoneout, rec_dropout,
-- weight_dropout. Float64 gradient
-- checks in training (the masks repeat: rl.gradcheck resets the generator) and in evaluation,
-- both directions, ragged batches, as a layer and inside a rec unit; the evaluation formula
-- against a reference written from the equations; the training masks' semantics; the options
-- off giving the same bits; bits across thread counts; bad input naming the layer and option.
local H = dofile("tests/lua/harness.lua")

local function passed(r)
  H.check(r.passed, string.format("max relative error %.3g", r.max_rel_error))
end

for _, dir in ipairs{1, -1} do
  for _, train in ipairs{true, false} do
    H.test(string.format("gradcheck lstm zoneout, direction %d, train %s", dir, train), function()
      passed(rl.gradcheck{layer = {class = "lstm", n_out = 3, direction = dir,
        zoneout = {cell = 0.3, hidden = 0.4}}, in_dim = 4, train = train})
    end)
  end
  H.test("gradcheck lstm zoneout with peepholes, cell only, direction " .. dir, function()
    passed(rl.gradcheck{layer = {class = "lstm", n_out = 3, direction = dir, peepholes = true,
      zoneout = {cell = 0.5}}, in_dim = 2, train = true})
  end)
  H.test("gradcheck gru zoneout, direction " .. dir, function()
    passed(rl.gradcheck{layer = {class = "gru", n_out = 3, direction = dir,
      zoneout = {hidden = 0.35}}, in_dim = 4, train = true})
  end)
end

for _, dir in ipairs{1, -1} do
  H.test("gradcheck lstm rec_dropout with zoneout, direction " .. dir, function()
    passed(rl.gradcheck{layer = {class = "lstm", n_out = 4, direction = dir, rec_dropout = 0.4,
      zoneout = {cell = 0.2, hidden = 0.3}}, in_dim = 3, train = true})
  end)
  H.test("gradcheck gru rec_dropout, direction " .. dir, function()
    passed(rl.gradcheck{layer = {class = "gru", n_out = 4, direction = dir, rec_dropout = 0.4},
      in_dim = 3, train = true})
  end)
end

for _, class in ipairs{"lstm", "gru"} do
  for _, dir in ipairs{1, -1} do
    H.test(string.format("gradcheck %s weight_dropout, direction %d", class, dir), function()
      passed(rl.gradcheck{layer = {class = class, n_out = 4, direction = dir,
        weight_dropout = 0.4}, in_dim = 3, train = true})
    end)
  end
end
H.test("gradcheck lstm weight_dropout with rec_dropout and zoneout", function()
  passed(rl.gradcheck{layer = {class = "lstm", n_out = 3, weight_dropout = 0.3, rec_dropout = 0.2,
    zoneout = {cell = 0.2, hidden = 0.1}}, in_dim = 2, train = true})
end)

-- One mask per batch: about p of U's entries are dropped, the rest scaled by 1 / (1 - p), and the
-- next batch draws another.
H.test("weight_dropout: dropped fraction p, a new mask per batch", function()
  rl.manual_seed(43)
  local p = 0.3
  local net = rl.network({output = {class = "gru", n_out = 32, from = "data", weight_dropout = p,
    loss = "mse", target = "y"}}, {data = {dim = 3}, y = {dim = 32}})
  local batch = {data = rl.randn(4, 2, 3), y = rl.randn(4, 2, 32),
    lengths = rl.tensor({4, 4}, "int32")}
  local grads = {}
  for i = 1, 2 do
    net:forward(batch, {train = true})
    net:zero_grads()
    net:backward()
    grads[i] = net:layer("output").grads.U:clone()
  end
  local zeros, n, differ = 0, 0, 0
  local g1, g2 = grads[1]:view(-1):totable(), grads[2]:view(-1):totable()
  for i = 1, #g1 do
    n = n + 1
    if g1[i] == 0 then zeros = zeros + 1 end
    if (g1[i] == 0) ~= (g2[i] == 0) then differ = differ + 1 end
  end
  H.near(zeros / n, p, 0.03, "dropped fraction of dU")
  H.check(differ > 0.2 * n, "the second batch reused the first one's mask")
end)

-- The masks come from the generator the checkpoint stores: a run resumed from epoch 2 ends with
-- the bits of the uninterrupted one (every cell of the driver, every mask option).
H.test("training with weight_dropout, rec_dropout and zoneout resumes bit-identical", function()
  local function config(extra)
    local c = {
      network = {
        a = {class = "lstm", n_out = 8, from = "data", weight_dropout = 0.3, rec_dropout = 0.2,
          zoneout = {cell = 0.1, hidden = 0.1}},
        b = {class = "gru", n_out = 6, from = "a", direction = -1, weight_dropout = 0.2},
        c = {class = "janet", n_out = 6, from = "b", weight_dropout = 0.25, zoneout = 0.1},
        output = {class = "softmax", from = "c", loss = "ce", target = "classes"},
      },
      train = {class = "12ax", num_seqs = 16, seed = 1, min_len = 5, max_len = 15,
        seq_ordering = "random"},
      num_epochs = 3, batch_size = 80, max_seqs = 8, optimizer = {class = "adam"},
      learning_rate = 0.01, log_verbosity = 0, seed = 3,
    }
    for k, v in pairs(extra) do c[k] = v end
    return c
  end
  local a, b = H.tmpdir(), H.tmpdir()
  local full = rl.train(config({model = a .. "/m"}), {})
  rl.train(config({model = b .. "/m", num_epochs = 2}), {})
  local resumed = rl.train(config({model = b .. "/m", load = "last"}), {})
  H.check(resumed.history[1].epoch == 3, "the resumed run trained epoch 3")
  H.check((full.net:params() - resumed.net:params()):abs():max() == 0,
    "parameters differ after resume")
  local other = rl.train(config({seed = 4}), {})
  H.check((other.net:params() - full.net:params()):abs():max() > 0, "the seed changes nothing")
  H.rm_rf(a)
  H.rm_rf(b)
end)

H.expect_error("weight_dropout inside a rec unit is refused", function()
  rl.network({
    dec = {class = "rec", from = "data", is_output_layer = true,
      unit = {output = {class = "gru", n_out = 2, weight_dropout = 0.2}}},
  }, {data = {dim = 3}})
end, "weight_dropout is not supported inside a unit")

-- rec_dropout = p close to 1 drops every unit of h_prev (a seeded draw), weight_dropout = p close
-- to 1 every entry of U (one draw per batch): either way the recurrent product adds nothing, so
-- the output is the one of the same layer with U = 0; in evaluation it is the plain layer's
-- (inverted dropout scales in training).
for _, opt in ipairs{{"rec_dropout", 0.999}, {"weight_dropout", 0.9999}} do
  H.test(opt[1] .. ": dropped inputs feed nothing, evaluation is the plain layer", function()
    for _, class in ipairs{"lstm", "gru", "janet"} do
      local ext = {data = {dim = 3}}
      local function net_of(d)
        rl.manual_seed(31)
        local dd = {class = class, n_out = 4, from = "data", is_output_layer = true}
        for k, v in pairs(d) do dd[k] = v end
        return rl.network({output = dd}, ext, {dtype = "float64"})
      end
      local a, b, c = net_of({[opt[1]] = opt[2]}), net_of({}), net_of({})
      b:layer("output").params.U:zero()
      local batch = {data = rl.randn(5, 2, 3, "float64"), lengths = rl.tensor({5, 4}, "int32")}
      rl.manual_seed(32)
      a:forward(batch, {train = true})
      b:forward(batch, {train = true})
      H.check((a:layer("output").output - b:layer("output").output):abs():max() == 0,
        class .. ": a dropped recurrent input still contributes")
      a:forward(batch, {train = false})
      c:forward(batch, {train = false})
      H.check((a:layer("output").output - c:layer("output").output):abs():max() == 0,
        class .. ": evaluation is not the plain layer")
    end
  end)
end

H.expect_error("rec_dropout inside a rec unit is refused", function()
  rl.network({
    dec = {class = "rec", from = "data", is_output_layer = true,
      unit = {output = {class = "lstm", n_out = 2, rec_dropout = 0.2}}},
  }, {data = {dim = 3}})
end, "rec_dropout is not supported inside a unit")

H.test("gradcheck: zoneout inside a rec unit (lstm, gru, janet), ragged", function()
  passed(rl.gradcheck{
    network = {
      dec = {class = "rec", from = "data", unit = {
        s = {class = "lstm", n_out = 3, zoneout = {cell = 0.3, hidden = 0.3},
          from = {"data:source", "prev:output"}},
        g = {class = "gru", n_out = 2, zoneout = 0.4, from = "s"},
        j = {class = "janet", n_out = 2, zoneout = 0.3, from = {"g", "prev:j"}},
        output = {class = "linear", activation = "tanh", n_out = 2, from = "j"},
      }},
      output = {class = "copy", from = "dec", loss = "mse", target = "target"},
    },
    extern_data = {data = {dim = 3}, target = {dim = 2}},
    T = 5, B = 3, lengths = {5, 2, 4}, train = true,
  })
end)

local function sig(x) return 1 / (1 + math.exp(-x)) end

-- Evaluation uses the expectation: c = zc cp + (1 - zc) c~, h = zh hp + (1 - zh) o tanh(c~).
H.test("lstm zoneout in evaluation: the expectation, against a reference", function()
  local F, Hd, T, B, zc, zh = 2, 3, 4, 2, 0.3, 0.6
  rl.manual_seed(3)
  local net = rl.network({output = {class = "lstm", n_out = Hd, from = "data",
    zoneout = {cell = zc, hidden = zh}, is_output_layer = true}}, {data = {dim = F}},
    {dtype = "float64"})
  local p = net:layer("output").params
  local W, U, b = p.W:totable(), p.U:totable(), p.b:totable()
  local x = rl.randn(T, B, F, "float64")
  local len = rl.tensor({4, 3}, "int32")
  net:forward({data = x, lengths = len}, {train = false})
  local out, xs = net:layer("output").output:totable(), x:totable()
  local err = 0
  for bb = 1, B do
    local h, c = {0, 0, 0}, {0, 0, 0}
    for t = 1, len:totable()[bb] do
      local nh, nc = {}, {}
      for j = 1, Hd do
        local z = {}
        for g = 0, 3 do
          local col = g * Hd + j
          local s = b[col]
          for i = 1, F do s = s + xs[t][bb][i] * W[i][col] end
          for i = 1, Hd do s = s + h[i] * U[i][col] end
          z[g] = s
        end
        local ct = sig(z[1]) * c[j] + sig(z[0]) * math.tanh(z[2])
        local ht = sig(z[3]) * math.tanh(ct)
        nc[j] = zc * c[j] + (1 - zc) * ct
        nh[j] = zh * h[j] + (1 - zh) * ht
      end
      h, c = nh, nc
      for j = 1, Hd do err = math.max(err, math.abs(out[t][bb][j] - h[j])) end
    end
  end
  H.check(err < 1e-12, string.format("max difference %.3g", err))
end)

-- In training each unit keeps its previous value with probability z per step (the mask is 0 or
-- 1: the kept ones are exactly equal to the previous step's).
H.test("gru and lstm zoneout in training: the kept fraction is z, kept units exact", function()
  for _, class in ipairs{"gru", "lstm"} do
    local Hd, T, B, z = 64, 20, 8, 0.25
    rl.manual_seed(5)
    local net = rl.network({output = {class = class, n_out = Hd, from = "data",
      zoneout = {hidden = z}, is_output_layer = true}}, {data = {dim = 3}})
    net:forward({data = rl.randn(T, B, 3), lengths = rl.full({B}, T, "int32")}, {train = true})
    local out = net:layer("output").output:totable()
    local kept, n = 0, 0
    for t = 2, T do
      for bb = 1, B do
        for j = 1, Hd do
          n = n + 1
          if out[t][bb][j] == out[t - 1][bb][j] then kept = kept + 1 end
        end
      end
    end
    H.near(kept / n, z, 0.03, class .. ": kept fraction")
  end
end)

-- The training step's numbers do not depend on the thread count (masks from the one generator,
-- drawn before the row split).
for _, d in ipairs{
  {class = "lstm", zoneout = {cell = 0.2, hidden = 0.1}, rec_dropout = 0.3, seed = 7},
  {class = "gru", weight_dropout = 0.3, rec_dropout = 0.2, seed = 9},
} do
  H.test(d.class .. " with masks: the same bits on 1, 2 and 3 threads", function()
    H.same_on_threads(function(threads)
      rl.set_num_threads(threads)
      rl.manual_seed(d.seed)
      local desc = {n_out = 32, from = "data", loss = "mse", target = "y"}
      for k, v in pairs(d) do if k ~= "seed" then desc[k] = v end end
      local net = rl.network({output = desc}, {data = {dim = 5}, y = {dim = 32}})
      rl.manual_seed(d.seed + 1)
      local x, y = rl.randn(6, 24, 5), rl.randn(6, 24, 32)
      net:forward({data = x, y = y, lengths = rl.tensor({6, 5, 4, 3, 2, 1, 6, 6, 6, 6, 6, 6, 6,
        6, 6, 6, 6, 6, 6, 6, 6, 6, 6, 6}, "int32")}, {train = true})
      net:zero_grads()
      net:backward()
      rl.set_num_threads(1)
      return {out = net:layer("output").output:view(-1):totable(), grads = net:grads():totable()}
    end)
  end)
end

-- The float32 passes (every CPU level's compilation of the fused loops) against float64 with the
-- same masks (z exact in both: the draws are the same words).
H.test("zoneout and rec_dropout in float32 are float64's (lstm, gru, both directions, ragged)",
  function()
  local desc = {
    a = {class = "lstm", n_out = 24, from = "data", zoneout = {cell = 0.25, hidden = 0.5},
      rec_dropout = 0.5},
    b = {class = "gru", n_out = 20, from = "a", direction = -1, zoneout = 0.25, rec_dropout = 0.25},
    output = {class = "linear", n_out = 3, from = {"a", "b"}, loss = "mse", target = "y"},
  }
  rl.manual_seed(11)
  H.float32_is_float64(desc, {data = {dim = 5}, y = {dim = 3}},
    {data = rl.randn(7, 4, 5, "float64"), y = rl.randn(7, 4, 3, "float64"),
     lengths = rl.tensor({7, 3, 5, 6}, "int32")})
end)

-- The options travel in the checkpoint's description: a network rebuilt from it is the same.
H.test("zoneout is stored in checkpoints through the description", function()
  local dir = H.tmpdir()
  rl.manual_seed(21)
  local ext = {data = {dim = 3}}
  local net = rl.network({output = {class = "lstm", n_out = 4, from = "data",
    zoneout = {cell = 0.2, hidden = 0.3}, is_output_layer = true}}, ext)
  rl.save_checkpoint(dir .. "/m.h5", {net = net})
  local ck = rl.load_checkpoint(dir .. "/m.h5")
  H.check(ck.description.output.zoneout.cell == 0.2 and ck.description.output.zoneout.hidden == 0.3,
    "zoneout in the stored description")
  local again = rl.network(ck.description, ck.extern_data)
  rl.checkpoint.load_params(ck, again)
  local batch = {data = rl.randn(5, 2, 3), lengths = rl.tensor({5, 3}, "int32")}
  net:forward(batch, {train = false})
  again:forward(batch, {train = false})
  H.check((net:layer("output").output - again:layer("output").output):abs():max() == 0,
    "the rebuilt network's evaluation output differs")
  H.rm_rf(dir)
end)

-- Options off: the same numbers as the layer without them.
H.test("zoneout, rec_dropout, weight_dropout = 0: the same bits as none (lstm, gru)", function()
  for _, class in ipairs{"lstm", "gru"} do
    local res = {}
    for k, extra in ipairs{{}, {zoneout = {cell = class == "lstm" and 0 or nil, hidden = 0},
      rec_dropout = 0, weight_dropout = 0}} do
      local d = {class = class, n_out = 8, from = "data", loss = "mse", target = "y"}
      for kk, v in pairs(extra) do d[kk] = v end
      rl.manual_seed(2)
      local net = rl.network({output = d}, {data = {dim = 3}, y = {dim = 8}})
      rl.manual_seed(4)
      net:forward({data = rl.randn(5, 3, 3), y = rl.randn(5, 3, 8),
        lengths = rl.tensor({5, 3, 4}, "int32")}, {train = true})
      net:zero_grads()
      net:backward()
      res[k] = net:grads()
    end
    H.check((res[1] - res[2]):abs():max() == 0, class .. ": gradients differ")
  end
end)

local function build(d)
  d.from, d.is_output_layer = "data", true
  return rl.network({l = d}, {data = {dim = 3}})
end
for _, bad in ipairs{
  {{class = "lstm", n_out = 2, zoneout = 1}, "layer 'l' (class lstm): option zoneout.cell = 1"},
  {{class = "lstm", n_out = 2, zoneout = {hidden = -0.1}}, "option zoneout.hidden = -0.1"},
  {{class = "lstm", n_out = 2, zoneout = {cel = 0.1}}, "option zoneout has no field 'cel'"},
  {{class = "lstm", n_out = 2, zoneout = "0.1"}, "option zoneout.cell must be a number"},
  {{class = "gru", n_out = 2, zoneout = {cell = 0.1}},
    "layer 'l' (class gru): option zoneout has no field 'cell' (it has hidden)"},
  {{class = "lstm", n_out = 2, zoneout = 0.1, impl = "cudnn"},
    "option zoneout and impl = \"cudnn\" do not go together"},
  {{class = "gru", n_out = 2, rec_dropout = 1}, "layer 'l' (class gru): option rec_dropout = 1"},
  {{class = "lstm", n_out = 2, rec_dropout = 0.5, impl = "cudnn"},
    "option rec_dropout and impl = \"cudnn\" do not go together"},
  {{class = "lstm", n_out = 2, rec_dropout = true}, "option rec_dropout must be a number"},
  {{class = "lstm", n_out = 2, weight_dropout = 1},
    "layer 'l' (class lstm): option weight_dropout = 1, expected a probability in [0, 1)"},
  {{class = "gru", n_out = 2, weight_dropout = -0.5},
    "layer 'l' (class gru): option weight_dropout = -0.5"},
  {{class = "gru", n_out = 2, weight_dropout = 0.5, impl = "cudnn"},
    "option weight_dropout and impl = \"cudnn\" do not go together"},
  {{class = "lstm", n_out = 2, weight_dropout = "x"}, "option weight_dropout must be a number"},
} do
  H.expect_error("bad option: " .. bad[2], function() build(bad[1]) end, bad[2])
end

H.done()
