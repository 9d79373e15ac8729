-- The two directions of a bidirectional LSTM pair run concurrently inside a network (CPU), one
-- part each of the helper pool: the same loss, gradients and input gradients, bit for bit, as
-- run one after the other and on any thread count; errors on the helper come back as catchable
-- errors naming the layer; the BLAS thread count is restored after every pair, also after an
-- error; no thread is created per call.
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
  l:_forward_queue({x}, len, true)
  local ok, err = pcall(l.forward, l, {x}, len, true)
  H.check(not ok and tostring(err):find("layer 'side' (class lstm): a forward or backward of it is queued",
    1, true), "touching a running layer: " .. tostring(err))
  local out = l:_wait()
  local ref = l:forward({x}, len, true)
  H.check((out - ref):abs():max() == 0, "threaded forward differs")
  ok, err = pcall(l._wait, l)
  H.check(not ok and tostring(err):find("nothing was queued", 1, true), tostring(err))
  -- an error raised on the thread: lengths beyond T
  l:_forward_queue({x}, rl.tensor({7, 3, 7, 1, 6, 9}, "int32"), true)
  ok, err = pcall(l._wait, l)
  H.check(not ok and tostring(err):find("side", 1, true), "thread error: " .. tostring(err))
  H.check(rl.get_num_threads() == threads, "BLAS threads not restored after an error")
  local g = rl.zeros(T, B, 3):fill_(0.1)
  l:forward({x}, len, true)
  l:_backward_queue(g, {false})
  l:_wait()
end)

-- The pair's numbers are those of the plain order and of one thread, bit for bit (each
-- direction runs on one thread either way, and a product's K is never split).
H.test("pairs are bit-identical to the plain order and to one thread", function()
  local saved = rl.get_num_threads()
  H.same_on_threads(function(threads)
    rl.set_num_threads(threads)
    local got = {}
    for _, concurrent in ipairs({true, false}) do
      local net = build(concurrent, 2)
      local loss
      for _ = 1, 2 do
        net:zero_grads()
        loss = net:forward(batch)
        net:backward()
      end
      local k = concurrent and "pair" or "plain"
      got[k .. " loss"] = {loss}
      got[k .. " grads"] = net:grads():totable()
      got[k .. " dx"] = net:input_grad("data"):view(-1):totable()
    end
    for _, what in ipairs({" loss", " grads", " dx"}) do
      for i, v in ipairs(got["pair" .. what]) do
        if got["plain" .. what][i] ~= v then
          error(string.format("%s[%d] on %d threads: pair %.17g, plain %.17g", what, i, threads,
            v, got["plain" .. what][i]))
        end
      end
    end
    return got
  end, {2, 3})
  rl.set_num_threads(saved)
end)

local function layer(name)
  local l = rl._layer_new("lstm", name, {n_out = 3}, {5})
  local n = 0
  for _, p in ipairs(l:params()) do n = n + p.numel end
  l:bind(rl.zeros(n), rl.zeros(n), 0)
  l:init_params()
  return l
end

H.test("two queued layers: each its own result, an error names its layer", function()
  local saved = rl.get_num_threads()
  rl.set_num_threads(2)
  local a, b = layer("left"), layer("right")
  local ra = a:forward({x}, len, true):clone()
  local rb = b:forward({x}, len, true):clone()
  a:_forward_queue({x}, len, true)
  b:_forward_queue({x}, len, true)
  H.check((a:_wait() - ra):abs():max() == 0, "left differs")
  H.check((b:_wait() - rb):abs():max() == 0, "right differs")
  -- the error of one (on whichever thread ran it) names it; the other's call is unharmed
  local bad = rl.tensor({7, 3, 7, 1, 6, 9}, "int32")
  for _, order in ipairs({{a, b}, {b, a}}) do
    a:_forward_queue({x}, len, true)
    b:_forward_queue({x}, bad, true)
    local first, second = order[1], order[2]
    local ok1, e1 = pcall(first._wait, first)
    local ok2, e2 = pcall(second._wait, second)
    local okb, eb = ok1, e1
    if first == a then okb, eb = ok2, e2 else H.check(ok2, "left failed: " .. tostring(e2)) end
    if first == a then H.check(ok1, "left failed: " .. tostring(e1)) end
    H.check(not okb and tostring(eb):find("right", 1, true)
      and not tostring(eb):find("left", 1, true), "right's error: " .. tostring(eb))
    H.check(rl.get_num_threads() == 2, "threads not restored after an error")
  end
  -- backward of both at once, against one after the other
  local g = rl.zeros(T, B, 3):fill_(0.1)
  local dxa, dxb = rl.zeros(T, B, 5), rl.zeros(T, B, 5)
  a:forward({x}, len, true)
  a:backward(g, {dxa})
  b:forward({x}, len, true)
  b:backward(g, {dxb})
  local ga, gb = dxa:clone(), dxb:clone()
  a:forward({x}, len, true)
  b:forward({x}, len, true)
  a:_backward_queue(g, {dxa})
  b:_backward_queue(g, {dxb})
  b:_wait()
  a:_wait()
  H.check((dxa - ga):abs():max() == 0 and (dxb - gb):abs():max() == 0, "backward differs")
  -- a layer freed while queued leaves the queue; the other still runs
  local c = layer("gone")
  c:_forward_queue({x}, len, true)
  a:_forward_queue({x}, len, true)
  c = nil -- luacheck: ignore
  collectgarbage()
  collectgarbage()
  H.check((a:_wait() - ra):abs():max() == 0, "left after a freed neighbour")
  rl.set_num_threads(saved)
end)

H.test("a full queue is an error; the queued calls still run", function()
  local saved = rl.get_num_threads()
  rl.set_num_threads(2)
  local ls, ref = {}, {}
  for i = 1, 9 do
    ls[i] = layer("q" .. i) -- weights of its own (the seeded generator moves on)
    ref[i] = ls[i]:forward({x}, len, true):clone()
  end
  for i = 1, 8 do ls[i]:_forward_queue({x}, len, true) end
  local ok, err = pcall(ls[9]._forward_queue, ls[9], {x}, len, true)
  H.check(not ok and tostring(err):find("8 calls are queued already", 1, true), tostring(err))
  for i = 1, 8 do
    H.check((ls[i]:_wait() - ref[i]):abs():max() == 0, "queued layer " .. i .. " differs")
  end
  H.check((ls[9]:forward({x}, len, true) - ref[9]):abs():max() == 0, "the refused layer")
  rl.set_num_threads(saved)
end)

-- The process's thread count (Linux), or nil elsewhere.
local function threads_now()
  local f = io.open("/proc/self/status")
  if not f then return nil end
  local n = tonumber(f:read("a"):match("Threads:%s*(%d+)"))
  f:close()
  return n
end

H.test("no thread per pair: the thread count stays, also after the network is freed", function()
  local saved = rl.get_num_threads()
  rl.set_num_threads(2)
  local net = build(true, 2)
  net:forward(batch)
  net:backward()
  local before = threads_now()
  if before then
    for _ = 1, 20 do
      net:forward(batch)
      net:backward()
      H.check(threads_now() == before, "threads went from " .. before .. " to " .. threads_now())
    end
    net = nil -- luacheck: ignore
    collectgarbage()
    collectgarbage()
    H.check(threads_now() == before, "threads after the network was freed: " .. threads_now())
  end
  rl.set_num_threads(saved)
end)

H.expect_error("a bad batch for a pair is an error naming the input", function()
  local a = build(true, 1)
  a:forward{data = rl.randn(T, B, 4), classes = y, lengths = len}
end, "data")

H.done()
