-- A small test harness for the Lua tests: test(name, fn) runs fn under pcall and counts it;
-- expect_error(fn, pattern) passes when fn raises an error whose message matches pattern;
-- done() prints the closing "N passed, N failed" line and exits non-zero on failure.
local H = {passed = 0, failed = 0}

function H.test(name, fn)
  local ok, err = xpcall(fn, debug.traceback)
  if ok then
    H.passed = H.passed + 1
  else
    H.failed = H.failed + 1
    io.stderr:write("FAIL ", name, ": ", tostring(err), "\n")
  end
end

function H.check(cond, msg, level)
  if not cond then error(msg or "check failed", (level or 1) + 1) end
end

function H.near(a, b, tol, what)
  tol = tol or 1e-6
  if math.abs(a - b) > tol then
    error(string.format("%s: got %.9g, expected %.9g (tol %g)", what or "near", a, b, tol), 2)
  end
end

-- The error must be catchable, and its message must match `pattern` (plain find).
function H.expect_error(name, fn, pattern)
  H.test(name, function()
    local ok, err = pcall(fn)
    if ok then error("expected an error, got none", 0) end
    err = tostring(err)
    if pattern and not err:find(pattern, 1, true) then
      error(string.format("error message %q does not mention %q", err, pattern), 0)
    end
  end)
end

-- Inside a test: fn must raise an error whose message mentions each of the strings (plain find);
-- returns the message.
function H.fails(fn, ...)
  local ok, err = pcall(fn)
  H.check(not ok, "expected an error", 2)
  err = tostring(err)
  for _, p in ipairs({...}) do
    H.check(err:find(p, 1, true), string.format("error %q does not mention %q", err, p), 2)
  end
  return err
end

-- run(threads) returns a table of name -> array of numbers; they must be bit-identical on
-- every thread count in `counts` to those on one thread (and the one-thread ones free of NaN).
function H.same_on_threads(run, counts)
  local ref = run(1)
  local n = 0
  for name, vals in pairs(ref) do
    n = n + 1
    for i, v in ipairs(vals) do
      if v ~= v then error(string.format("%s[%d] is NaN on 1 thread", name, i), 2) end
    end
  end
  if n == 0 then error("no buffers compared", 2) end
  for _, threads in ipairs(counts or {2, 3}) do
    local got = run(threads)
    for name, vals in pairs(ref) do
      if not got[name] or #got[name] ~= #vals then
        error(string.format("%s: missing or of another length on %d threads", name, threads), 2)
      end
      for i, v in ipairs(vals) do
        if got[name][i] ~= v then
          error(string.format("%s[%d] on %d threads: %.17g, on 1 thread %.17g", name, i,
            threads, got[name][i], v), 2)
        end
      end
    end
  end
end

-- True when every layer class in `classes` is registered; else prints a SKIP note for the test
-- `name` and returns false.
function H.have_classes(classes, name)
  local have = {}
  for _, c in ipairs(rl.layers.classes()) do have[c] = true end
  for _, c in ipairs(classes) do
    if not have[c] then
      print(string.format("SKIP %s: class '%s' is not registered", name, c))
      return false
    end
  end
  return true
end

-- A test that rl.gradcheck(o) passes (something checked, every element within tolerance); a
-- failure names the worst element.
function H.gradcheck(name, o)
  H.test(name, function()
    local r = rl.gradcheck(o)
    H.check(r.n_checked > 0, "nothing was checked")
    if not r.passed then
      local w = r.worst
      error(string.format("max relative error %.3g at %s[%d]: analytic %.9g, numeric %.9g",
        r.max_rel_error, w.tensor, w.index, w.analytic, w.numeric), 0)
    end
  end)
end

-- The encoder-decoder of the search tests: an lstm encoder; a rec decoder (at most T + 2 steps)
-- of an embedding of the previous label, an lstm, additive attention over the encoder, a tanh
-- readout, a softmax and a choice of beam size `beam`. Returns a new description and its extern
-- data: data dim 3, `classes` labels, 0 ending a sequence.
function H.seq2seq(classes, beam)
  return {
    enc = {class = "lstm", n_out = 4, from = "data"},
    dec = {class = "rec", from = {}, max_seq_len = "T + 2", unit = {
      emb = {class = "embedding", from = "prev:output", n_out = 3},
      s = {class = "lstm", from = {"emb", "prev:att"}, n_out = 4},
      att = {class = "attention", base = "base:enc", from = "s", kind = "additive"},
      readout = {class = "linear", from = {"s", "att"}, n_out = 5, activation = "tanh"},
      output_prob = {class = "softmax", from = "readout", loss = "ce", target = "classes"},
      output = {class = "choice", from = "output_prob", target = "classes", beam_size = beam},
    }},
  }, {data = {dim = 3}, classes = {dim = classes, sparse = true}}
end

-- One training step (forward with train = true, backward) of the network desc in float64 and in
-- float32 with the same parameters and the same masks (seeded alike): the loss and the gradients
-- must agree to rel (1e-4 unless given) of their size. batch: float64 tensors and lengths.
function H.float32_is_float64(desc, ext, batch, rel)
  rel = rel or 1e-4
  local res = {}
  for _, dt in ipairs{"float64", "float32"} do
    rl.manual_seed(12)
    local net = rl.network(desc, ext, {dtype = dt})
    if res.params then net:params():copy_(res.params) end
    local b = {}
    for k, v in pairs(batch) do b[k] = k == "lengths" and v or v:to(dt) end
    rl.manual_seed(13)
    local loss = net:forward(b, {train = true})
    net:zero_grads()
    net:backward()
    res.params = res.params or net:params():clone()
    res[dt] = {loss = loss, grads = net:grads():to("float64")}
  end
  H.near(res.float32.loss, res.float64.loss, rel * math.abs(res.float64.loss), "loss")
  local d = (res.float32.grads - res.float64.grads):abs():max()
  local m = res.float64.grads:abs():max()
  H.check(d < rel * m, string.format("gradients differ by %.3g (max %.3g)", d, m), 3)
end

-- A new empty folder under the system's temporary folder; H.rm_rf removes a folder with all in it.
function H.tmpdir()
  local dir = os.tmpname()
  os.remove(dir)
  assert(require("lfs").mkdir(dir))
  return dir
end

-- A function that makes a new folder under root each time it is called: root/1, root/2, ...
function H.subdirs(root)
  local n = 0
  return function()
    n = n + 1
    local d = root .. "/" .. n
    assert(require("lfs").mkdir(d))
    return d
  end
end

-- The bytes of a file, or nil when it cannot be opened; and a file written with the bytes s.
function H.read_file(path)
  local f = io.open(path, "rb")
  if not f then return nil end
  local s = f:read("a")
  f:close()
  return s
end

function H.write_file(path, s)
  local f = assert(io.open(path, "wb"))
  f:write(s)
  f:close()
end

-- The lines of a file, in a list.
function H.lines(path)
  local t = {}
  for l in io.lines(path) do t[#t + 1] = l end
  return t
end

function H.rm_rf(path)
  local lfs = require("lfs")
  for e in lfs.dir(path) do
    if e ~= "." and e ~= ".." then
      local p = path .. "/" .. e
      if lfs.attributes(p, "mode") == "directory" then H.rm_rf(p) else os.remove(p) end
    end
  end
  lfs.rmdir(path)
end

function H.done()
  print(string.format("%d passed, %d failed", H.passed, H.failed))
  os.exit(H.failed == 0 and 0 or 1)
end

return H
