-- The two directions of a bidirectional LSTM pair run concurrently inside a network (CPU):
-- the same loss, gradients and input gradients as run one after the other; errors on the
-- layer's thread come back as catchable errors naming the layer; the BLAS thread count is
-- restored after every pair, also after an error.
local H = dofile("tests/lua/harness.lua")

local function build(concurrent, layers)
  rl.manual_seed(7)
  local desc, prev = {}, {"data"}
  for li = 1, layers do
    desc["f" .. li] = {class = "lstm", n_out = 19, from = prev}
    desc["b" .. li] = {class = "lstm", n_out = 19, from = prev, direction = -1}
    prev = {"f" .. li, "b" .. li}
  end
  desc.output = {class = "softmax", from = prev, loss = "ce", target = "classes"}
  return rl.network(desc, {data = {dim = 5}, classes = {dim = 4, sparse = true}},
    {concurrent = concurrent, input_grads = true})
end

local T, B = 7, 6
rl.manual_seed(11)
local x = rl.randn(T, B, 5)
local y = rl.zeros(T, B):int()
for t = 1, T do for b = 1, B do y[t][b] = (t + 2 * b) % 4 end end
local len = rl.tensor({7, 3, 7, 1, 6, 7}, "int32")
local batch = {data = x, classes = y, lengths = len}

H.test("pairs agree with the sequential run (2 levels, 3 steps)", function()
  local saved = rl.get_num_threads()
  rl.set_num_threads(2) -- pairs run concurrently only with more than one thread
  local threads = rl.get_num_threads()
  local a, b = build(true, 2), build(false, 2)
  H.check(a:concurrent_pairs() and a.nodes[1].pair_next, "no concurrent pair at 2 threads")
  for _ = 1, 3 do
    local la = a:forward(batch)
    a:backward()
    local lb = b:forward(batch)
    b:backward()
    H.near(la, lb, 1e-5 * math.abs(lb), "loss")
    local d = (a:grads() - b:grads()):abs():max()
    H.check(d <= 1e-6 * (1 + b:grads():abs():max()), "gradients differ by " .. d)
    local dx = (a:input_grad("data") - b:input_grad("data")):abs():max()
    H.check(dx <= 1e-6, "input gradients differ by " .. dx)
    H.check(rl.get_num_threads() == threads, "BLAS threads not restored")
  end
  rl.set_num_threads(saved)
end)

-- A user who sets one thread gets one: the pair's layers then run one after the other.
H.test("one thread: pairs run in order, with the same numbers", function()
  local saved = rl.get_num_threads()
  rl.set_num_threads(2)
  local a = build(true, 1)
  local la = a:forward(batch)
  a:backward()
  local g2 = a:grads():clone()
  rl.set_num_threads(1)
  local b = build(true, 1) -- the same weights (the same seed), fresh gradients
  H.check(not b:concurrent_pairs(), "pairs would still run concurrently on one thread")
  local l1 = b:forward(batch)
  b:backward()
  H.near(l1, la, 1e-5 * math.abs(la), "loss")
  H.check((b:grads() - g2):abs():max() <= 1e-6 * (1 + g2:abs():max()), "gradients")
  H.check(rl.get_num_threads() == 1, "thread count changed")
  rl.set_num_threads(saved)
end)

H.test("a layer's own thread: results, errors, misuse", function()
  local threads = rl.get_num_threads()
  local l = rl._layer_new("lstm", "side", {n_out = 3}, {5})
  local n = 0
  for _, p in ipairs(l:params()) do n = n + p.numel end
  l:bind(rl.zeros(n), rl.zeros(n), 0)
  l:init_params()
  l:_forward_start({x}, len, true)
  local ok, err = pcall(l.forward, l, {x}, len, true)
  H.check(not ok and tostring(err):find("layer 'side': a forward or backward of it is still running",
    1, true), "touching a running layer: " .. tostring(err))
  local out = l:_wait()
  local ref = l:forward({x}, len, true)
  H.check((out - ref):abs():max() == 0, "threaded forward differs")
  ok, err = pcall(l._wait, l)
  H.check(not ok and tostring(err):find("nothing was started", 1, true), tostring(err))
  -- an error raised on the thread: lengths beyond T
  l:_forward_start({x}, rl.tensor({7, 3, 7, 1, 6, 9}, "int32"), true)
  ok, err = pcall(l._wait, l)
  H.check(not ok and tostring(err):find("side", 1, true), "thread error: " .. tostring(err))
  H.check(rl.get_num_threads() == threads, "BLAS threads not restored after an error")
  local g = rl.zeros(T, B, 3):fill_(0.1)
  l:forward({x}, len, true)
  l:_backward_start(g, {false})
  l:_wait()
end)

H.expect_error("a bad batch for a pair is an error naming the input", function()
  local a = build(true, 1)
  a:forward{data = rl.randn(T, B, 4), classes = y, lengths = len}
end, "data")

H.done()
