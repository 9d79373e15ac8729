-- rl.lr_control: newbob's decisions on scripted dev scores (relative, absolute, multi-epoch),
-- the minimum, a function control, warmup values, the state round trip and bad options.
local H = dofile("tests/lua/harness.lua")

local SCORES = {1.0, 0.9, 0.895, 0.85, 0.849}

-- The lr of epochs 1 .. #scores + 1 when the scores arrive one epoch at a time.
local function lrs_for(cfg, scores, key)
  local lrc = rl.lr_control(cfg)
  local out = {lrc:lr(1, 1000)}
  for e, s in ipairs(scores) do
    lrc:epoch_done(e, {[key or "dev_score"] = s, train_score = 5})
    out[e + 1] = lrc:lr(e + 1, 1000)
  end
  return out, lrc
end

local function same(got, want, what)
  H.check(#got == #want, what .. ": length " .. #got)
  for i = 1, #want do
    H.near(got[i], want[i], 1e-15, string.format("%s: epoch %d", what, i))
  end
end

H.test("newbob (relative): decay unless the score improved by more than 1%", function()
  -- relative changes (new - old) / new: -0.111, -0.00559 (decay), -0.0529, -0.00118 (decay)
  local got = lrs_for({learning_rate = 1.0, learning_rate_control = "newbob",
    newbob_relative_error_threshold = -0.01, newbob_learning_rate_decay = 0.5}, SCORES)
  same(got, {1.0, 1.0, 1.0, 0.5, 0.5, 0.25}, "newbob")
end)

H.test("newbob_rel with another threshold and decay", function()
  -- threshold -0.1: only the first change (-0.111) is an improvement enough
  local got = lrs_for({learning_rate = 0.8, learning_rate_control = "newbob_rel",
    newbob_relative_error_threshold = -0.1, newbob_learning_rate_decay = 0.7}, SCORES)
  same(got, {0.8, 0.8, 0.8, 0.8 * 0.7, 0.8 * 0.7 * 0.7, 0.8 * 0.7 * 0.7 * 0.7}, "newbob_rel")
end)

H.test("newbob_abs with min_learning_rate", function()
  -- changes -0.1 (keep), -0.005, -0.045, -0.001 (all above -0.05: decay), floored at 0.2
  local got = lrs_for({learning_rate = 1.0, learning_rate_control = "newbob_abs",
    newbob_error_threshold = -0.05, min_learning_rate = 0.2}, SCORES)
  same(got, {1.0, 1.0, 1.0, 0.5, 0.25, 0.2}, "newbob_abs")
end)

H.test("newbob uses dev_score before train_score, and a chosen measure", function()
  -- the dev scores improve fast (no decay); train_score (constant) would decay every epoch
  local got = lrs_for({learning_rate = 1.0, learning_rate_control = "newbob"}, {3, 2, 1})
  same(got, {1, 1, 1, 1}, "dev_score")
  got = lrs_for({learning_rate = 1.0, learning_rate_control = "newbob",
    learning_rate_control_error_measure = "train_score"}, {3, 2, 1})
  same(got, {1, 1, 0.5, 0.25}, "train_score")
  -- without dev_score, the first dev_* key
  got = lrs_for({learning_rate = 1.0, learning_rate_control = "newbob"}, {3, 2, 1}, "dev_error")
  same(got, {1, 1, 1, 1}, "dev_error")
end)

H.test("newbob_multi_epoch averages relative changes and updates every n epochs", function()
  -- num_epochs 2, interval 2: decisions only for epochs 3 and 5 (= 1 mod 2).
  -- epoch 3: mean of (0.9-1)/0.9 = -0.1111 -> keep 1.0 (only epochs 1..2 known)
  -- epoch 5: mean of (0.895-0.9)/0.895, (0.85-0.895)/0.85 = -0.0293 -> keep
  local got = lrs_for({learning_rate = 1.0, learning_rate_control = "newbob_multi_epoch",
    newbob_multi_num_epochs = 2}, SCORES)
  same(got, {1, 1, 1, 1, 1, 1}, "multi, threshold -0.01")
  -- threshold -0.05: epoch 3 keeps (-0.111), epoch 5 decays (-0.0293 > -0.05), epoch 6 is
  -- between updates
  got = lrs_for({learning_rate = 1.0, learning_rate_control = "newbob_multi_epoch",
    newbob_multi_num_epochs = 2, newbob_relative_error_threshold = -0.05}, SCORES)
  same(got, {1, 1, 1, 1, 0.5, 0.5}, "multi, threshold -0.05")
end)

H.test("constant keeps the lr", function()
  local got = lrs_for({learning_rate = 0.3}, SCORES)
  same(got, {0.3, 0.3, 0.3, 0.3, 0.3, 0.3}, "constant")
end)

H.test("a function control gets epoch, step and the scores so far", function()
  local seen
  local lrc = rl.lr_control{learning_rate_control = function(epoch, step, scores)
    seen = scores
    local n = 0
    for _ in pairs(scores) do n = n + 1 end
    return 0.1 / epoch + step * 1e-6 + n
  end}
  H.near(lrc:lr(1, 10), 0.1 + 1e-5, 1e-15, "epoch 1")
  lrc:epoch_done(1, {dev_score = 2.5})
  H.near(lrc:lr(2, 20), 0.05 + 2e-5 + 1, 1e-15, "epoch 2")
  H.check(seen[1].dev_score == 2.5, "scores passed")
  local bad = rl.lr_control{learning_rate_control = function() return "x" end}
  H.check(not pcall(bad.lr, bad, 1, 1), "a non-number lr is an error")
end)

H.test("linear warmup over learning_rate_warmup_steps", function()
  local lrc = rl.lr_control{learning_rate = 0.01, learning_rate_warmup_steps = 4}
  local want = {0.0025, 0.005, 0.0075, 0.01, 0.01}
  for step = 1, 5 do H.near(lrc:lr(1, step), want[step], 1e-15, "step " .. step) end
  -- warmup multiplies the epoch's lr, whatever newbob decided
  local n = rl.lr_control{learning_rate = 1.0, learning_rate_control = "newbob",
    learning_rate_warmup_steps = 10}
  n:epoch_done(1, {dev_score = 1}); n:epoch_done(2, {dev_score = 1})
  H.near(n:lr(3, 5), 0.25, 1e-15, "decayed and warming up")
end)

H.test("state round trip: a restored control decides as the original", function()
  local cfg = {learning_rate = 1.0, learning_rate_control = "newbob",
    newbob_learning_rate_decay = 0.5}
  local a = rl.lr_control(cfg)
  for e = 1, 3 do a:epoch_done(e, {dev_score = SCORES[e], dev_error = 0.1}) end
  local st = a:state()
  for k, v in pairs(st) do
    H.check(type(k) == "string" and (type(v) == "number" or type(v) == "string"),
      "flat state: " .. tostring(k))
  end
  local b = rl.lr_control(cfg)
  b:load_state(st)
  H.check(b:log_line() == a:log_line(), "log line restored")
  H.near(b:lr(4, 1), 0.5, 0, "epoch 4 lr restored")
  for e = 4, 5 do
    a:epoch_done(e, {dev_score = SCORES[e]})
    b:epoch_done(e, {dev_score = SCORES[e]})
    H.near(b:lr(e + 1, 1), a:lr(e + 1, 1), 0, "epoch " .. (e + 1))
  end
  H.near(b:lr(6, 1), 0.25, 0, "epoch 6")
  local c = rl.lr_control{learning_rate_control = "newbob_abs"}
  H.check(not pcall(c.load_state, c, st), "state of another control refused")
end)

H.test("log_line describes the decision", function()
  local _, lrc = lrs_for({learning_rate = 1.0, learning_rate_control = "newbob"}, {1.0, 0.9, 0.895})
  local line = lrc:log_line()
  H.check(line:find("epoch 3", 1, true) and line:find("dev_score", 1, true)
    and line:find("1 -> 0.5", 1, true), line)
end)

H.expect_error("unknown option is named", function()
  rl.lr_control{learning_rate = 1, newbob_decay = 0.5}
end, "unknown option 'newbob_decay'")
H.expect_error("unknown control is named", function()
  rl.lr_control{learning_rate_control = "newbobb"}
end, "unknown learning_rate_control 'newbobb'")
H.expect_error("a bad value is named", function()
  rl.lr_control{learning_rate = -1}
end, "learning_rate must be a finite number >= 0, got -1")

-- Values that pass a ">= 0" check but break training later: an infinite rate (fails only at
-- the first update), an infinite warmup (silently lr 0), a fractional epoch count (an internal
-- error at the first decision).
for _, c in ipairs{
  {"learning_rate", 1 / 0, "learning_rate must be a finite number >= 0, got inf"},
  {"min_learning_rate", 1 / 0, "min_learning_rate must be a finite number >= 0"},
  {"learning_rate_warmup_steps", 1 / 0, "learning_rate_warmup_steps must be a finite number"},
  {"newbob_learning_rate_decay", 1 / 0, "newbob_learning_rate_decay must be a finite number"},
  {"newbob_multi_num_epochs", 2.5, "newbob_multi_num_epochs must be a finite integer >= 1, got 2.5"},
  {"newbob_multi_update_interval", 1.5, "newbob_multi_update_interval must be a finite integer"},
} do
  H.expect_error(c[1] .. " = " .. tostring(c[2]), function()
    rl.lr_control{learning_rate_control = "newbob_multi_epoch", [c[1]] = c[2]}
  end, c[3])
end
H.test("an infinite threshold is allowed (never decay)", function()
  local l = rl.lr_control{learning_rate_control = "newbob", learning_rate = 1,
                          newbob_relative_error_threshold = 1 / 0}
  l:epoch_done(1, {dev_score = 1})
  l:epoch_done(2, {dev_score = 2})
  H.near(l:lr(3), 1, 0, "lr")
end)
H.expect_error("a control function that returns inf", function()
  rl.lr_control{learning_rate_control = function() return 1 / 0 end}:lr(1, 1)
end, "returned inf for epoch 1 step 1 (expects a finite number >= 0)")

-- a state read from a crafted checkpoint: an lr that is no finite number >= 0 was taken (and
-- trained with), an epoch beyond 2^63 failed with "table index is nil"
for _, c in ipairs{
  {"lr.2", "abc", "lrc:load_state: lr.2 = abc is not a learning rate (a finite number >= 0)"},
  {"lr.2", "0.1", "lrc:load_state: lr.2 = 0.1 is not a learning rate (a finite number >= 0)"},
  {"lr.0", 0.1, "lrc:load_state: key lr.0: the epoch must be an integer in 1..2^63"},
  {"lr.2", 0 / 0, "is not a learning rate (a finite number >= 0)"},
  {"lr.2", -1, "lrc:load_state: lr.2 = -1 is not a learning rate"},
  {"lr.2", 1 / 0, "lrc:load_state: lr.2 = inf is not a learning rate"},
  {"score.1.dev_score", "low", "lrc:load_state: score.1.dev_score = low is not a score (a number)"},
  {"lr.99999999999999999999", 0.1,
   "lrc:load_state: key lr.99999999999999999999: the epoch must be an integer in 1..2^63"},
  {"score.0.dev_score", 1, "lrc:load_state: key score.0.dev_score: the epoch must be an integer"},
} do
  H.expect_error(string.format("load_state refuses %s = %s", c[1], tostring(c[2])), function()
    local a = rl.lr_control{learning_rate_control = "newbob"}
    local st = a:state()
    st[c[1]] = c[2]
    rl.lr_control{learning_rate_control = "newbob"}:load_state(st)
  end, c[3])
end

-- The schedules against their definitions: PyTorch's CosineAnnealingLR (closed form),
-- ESPnet's NoamLR and PyTorch's OneCycleLR, whose fixed points are checked exactly (the first
-- lr is max_lr / div_factor, step pct_start * total_steps reaches max_lr, the last step
-- max_lr / div_factor / final_div_factor, a phase's middle the mean of its ends under "cos").
H.test("cosine per epoch: PyTorch's closed form up to T_max, eta_min after it", function()
  local l = rl.lr_control{learning_rate_control = "cosine", learning_rate = 0.1, T_max = 4,
                          eta_min = 0.01}
  for e = 1, 7 do
    local t = math.min(e - 1, 4)
    H.near(l:lr(e, 1000 * e), 0.01 + 0.09 * (1 + math.cos(math.pi * t / 4)) / 2, 1e-16,
      "epoch " .. e)
  end
  H.near(l:lr(3, 1), 0.055, 1e-16, "the middle of the run is the mean")
  -- epoch_done changes nothing (the schedule is fixed), warmup applies on top
  l:epoch_done(1, {dev_score = 1})
  l:epoch_done(2, {dev_score = 5})
  H.near(l:lr(3, 1), 0.055, 1e-16, "no newbob decision")
  local w = rl.lr_control{learning_rate_control = "cosine", learning_rate = 0.1, T_max = 4,
                          learning_rate_warmup_steps = 10}
  H.near(w:lr(1, 5), 0.05, 1e-16, "warmup halves step 5 of 10")
end)

H.test("noam per step: ESPnet's NoamLR", function()
  local l = rl.lr_control{learning_rate_control = "noam", learning_rate = 2, model_size = 64,
                          warmup_steps = 100}
  for _, s in ipairs({1, 50, 99, 100, 101, 1000, 12345}) do
    H.near(l:lr(1, s), 2 * 64 ^ -0.5 * math.min(s ^ -0.5, s * 100 ^ -1.5), 1e-17, "step " .. s)
  end
  H.near(l:lr(1, 100), 2 / 8 / 10, 1e-17, "the peak at warmup_steps: lr / sqrt(d * w)")
  H.check(l:lr(1, 50) < l:lr(1, 100) and l:lr(1, 400) < l:lr(1, 100), "rises, then falls")
  H.near(l:lr(1, 400), l:lr(1, 100) / 2, 1e-17, "inverse square root after the warmup")
end)

H.test("one_cycle per step: PyTorch's OneCycleLR fixed points (cos, linear, three phases)",
    function()
  local max, div, fdiv = 0.4, 25, 1e4
  local l = rl.lr_control{learning_rate_control = "one_cycle", learning_rate = max,
                          total_steps = 100}
  H.near(l:lr(1, 1), max / div, 1e-15 * max, "first step")
  H.near(l:lr(1, 30), max, 1e-15 * max, "step pct_start * total_steps (PyTorch's step 29)")
  H.near(l:lr(1, 100), max / div / fdiv, 1e-15 * max / div / fdiv, "last step")
  -- the middle of phase 1: PyTorch's steps 0..29, pct 0.5 at its step 14.5: between 15 and 16
  H.check(l:lr(1, 15) < (max + max / div) / 2 and l:lr(1, 16) > (max + max / div) / 2, "phase 1")
  -- phase 2 runs over PyTorch's steps 29..99: its middle (step 64) is the mean of its ends
  H.near(l:lr(1, 65), (max + max / div / fdiv) / 2, 1e-15 * max, "the middle of phase 2")
  local lin = rl.lr_control{learning_rate_control = "one_cycle", learning_rate = max,
                            total_steps = 100, anneal_strategy = "linear", pct_start = 0.5}
  -- linear: PyTorch's step 10 of phase 1 (steps 0..49) is 10/49 of the way
  H.near(lin:lr(1, 11), max / div + (max - max / div) * 10 / 49, 1e-15 * max, "linear phase 1")
  local three = rl.lr_control{learning_rate_control = "one_cycle", learning_rate = max,
                              total_steps = 100, three_phase = true}
  H.near(three:lr(1, 30), max, 1e-15 * max, "three phases: the peak")
  H.near(three:lr(1, 59), max / div, 1e-15 * max,
    "three phases: back to the initial lr at 2 pct - 2")
  H.near(three:lr(1, 100), max / div / fdiv, 1e-15 * max / div / fdiv, "three phases: the end")
end)

for _, c in ipairs{
  {{learning_rate_control = "cosine", T_max = 0}, "T_max must be a finite integer >= 1"},
  {{learning_rate_control = "cosine", T_max = 2.5}, "T_max must be a finite integer"},
  {{learning_rate_control = "cosine", eta_min = 2, learning_rate = 1}, "eta_min = 2 is above"},
  {{learning_rate_control = "noam", warmup_steps = 0}, "warmup_steps must be a finite integer"},
  {{learning_rate_control = "noam", learning_rate_warmup_steps = 10},
   "learning_rate_warmup_steps does not combine with noam"},
  {{learning_rate_control = "one_cycle"}, "one_cycle\" needs total_steps"},
  {{learning_rate_control = "one_cycle", total_steps = 10, pct_start = 1}, "pct_start"},
  {{learning_rate_control = "one_cycle", total_steps = 10, anneal_strategy = "exp"},
   "anneal_strategy"},
  {{learning_rate_control = "one_cycle", total_steps = 10, div_factor = 0}, "div_factor"},
  {{learning_rate_control = "newbob", total_steps = 10}, "total_steps is an option of "
   .. "learning_rate_control = \"one_cycle\", not of newbob_rel"},
  {{learning_rate_control = "noam", min_learning_rate = 0.1}, "min_learning_rate is newbob's"},
  {{learning_rate_control = "warmup_cosine"}, "unknown learning_rate_control 'warmup_cosine'"},
} do
  H.expect_error("schedule option: " .. c[2], function() rl.lr_control(c[1]) end, c[2])
end

H.test("schedules: the state round trip, and a state of other options is refused", function()
  local cfg = {learning_rate_control = "one_cycle", learning_rate = 0.3, total_steps = 50}
  local a = rl.lr_control(cfg)
  a:epoch_done(1, {dev_score = 1})
  local b = rl.lr_control(cfg)
  b:load_state(a:state())
  for s = 1, 50 do H.check(a:lr(2, s) == b:lr(2, s), "step " .. s) end
  local other = rl.lr_control{learning_rate_control = "one_cycle", learning_rate = 0.3,
                              total_steps = 60}
  local ok, err = pcall(other.load_state, other, a:state())
  H.check(not ok and tostring(err):find("total_steps = 50, this config 60", 1, true),
    tostring(err))
  H.expect_error("a step beyond total_steps", function() a:lr(2, 51) end,
    "step 51 is beyond total_steps = 50")
  H.check(a.max_step == 50, "max_step")
end)

H.done()
