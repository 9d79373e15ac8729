-- Bad input to the library, one case a line: each must raise a catchable error whose message
-- names what was wrong (the pattern after the function), never crash, hang or give a silently
-- wrong number. The command line and the REPL are in tests/sh/test_bad_input.sh; tampered
-- checkpoints in tests/lua/test_checkpoint.lua.
local H = dofile("tests/lua/harness.lua")
local lfs = require("lfs")
local dir = os.tmpname()
os.remove(dir)
assert(lfs.mkdir(dir))

local function cases(list)
  for _, c in ipairs(list) do
    if c[1] then H.expect_error(c[1], c[2], c[3]) end
  end
end

---------------------------------------------------------------- use after free
local FREED = "the tensor was freed"

-- A tensor closed by <close>, one closed with its coroutine, one resurrected by a finaliser.
local function closed()
  local keep
  do
    local t <close> = rl.ones(2, 3)
    keep = t
  end
  return keep
end

local function closed_by_coroutine()
  local keep
  local co = coroutine.create(function()
    local t <close> = rl.ones(4)
    keep = t
    coroutine.yield()
  end)
  coroutine.resume(co)
  coroutine.close(co)
  return keep
end

local function resurrected()
  local back
  do
    local t = rl.ones(3)
    setmetatable({t = t}, {__gc = function(h) back = h.t end})
  end
  collectgarbage()
  collectgarbage()
  assert(back, "the finaliser did not run")
  return back
end

for _, how in ipairs{{"closed", closed}, {"closed coroutine", closed_by_coroutine},
                     {"resurrected", resurrected}} do
  local name, make = how[1], how[2]
  cases{
    {name .. ": item", function() make():item() end, FREED},
    {name .. ": totable", function() make():totable() end, FREED},
    {name .. ": tostring", function() tostring(make()) end, FREED},
    {name .. ": t[1]", function() return make()[1] end, FREED},
    {name .. ": t[1] = 0", function() make()[1] = 0 end, FREED},
    {name .. ": #t", function() return #make() end, FREED},
    {name .. ": t + 1", function() return make() + 1 end, FREED},
    {name .. ": size", function() make():size() end, FREED},
    {name .. ": narrow", function() make():narrow(1, 1, 1) end, FREED},
    {name .. ": copy_ into it", function() make():copy_(rl.ones(2, 3)) end, FREED},
    {name .. ": copy_ from it", function() rl.ones(2, 3):copy_(make()) end, FREED},
    {name .. ": matmul", function() rl.matmul(make(), rl.ones(3, 1)) end, FREED},
    {name .. ": cat", function() rl.cat({make(), make()}) end, FREED},
    {name .. ": rl.save", function() rl.save(dir .. "/freed.h5", {x = make()}) end, FREED},
  }
end
-- A batch tensor closed between net:forward and net:backward: the layers keep their own
-- shares, so the backward gives the gradients it gives without the close (it raised
-- "reshape: the source is not a tensor (unset)" or "backward needs the forward's lengths").
for _, cls in ipairs{"linear", "lstm", "gru", "embedding"} do
  for _, which in ipairs{"data", "classes", "lengths"} do
    H.test(cls .. ": " .. which .. " closed between forward and backward", function()
      local ext1 = {data = {dim = 3}, classes = {dim = 4, sparse = true}}
      local h = {class = cls, n_out = 5}
      if cls == "embedding" then h.from = "classes" end
      local desc = {h = h, output = {class = "softmax", from = {"h", "data"}, loss = "ce",
                                     target = "classes"}}
      local function grads(close)
        rl.manual_seed(3)
        local net = rl.network(desc, ext1)
        do
          local b = {data = rl.randn(4, 2, 3), classes = rl.tensor({{1, 2}, {0, 3}, {2, 2},
                     {3, 1}}, "int32"), lengths = rl.tensor({4, 4}, "int32")}
          local c <close> = close and b[which] or nil
          net:forward(b)
        end
        collectgarbage()
        collectgarbage()
        net:backward()
        return net:grads():clone()
      end
      H.check((grads(true) - grads(false)):abs():max() == 0, "the gradients differ")
    end)
  end
end
H.test("a freed tensor is still a tensor for is_tensor", function()
  H.check(rl.is_tensor(closed()))
end)

---------------------------------------------------------------- sizes and positions
-- Sizes and positions near 2^31, 2^32, 2^62 and the ends of the integers: an error naming the
-- function, never a view outside its storage or a wrapped position.
local MAXI, MINI = math.maxinteger, math.mininteger
local BIG = {1 << 31, 1 << 32, (1 << 32) + 1, 1 << 62, MAXI, MINI, -1, -(1 << 32)}
local ext = {data = {dim = 3}, classes = {dim = 4, sparse = true}}

for _, n in ipairs(BIG) do
  local v = rl.zeros(4)
  local m = rl.zeros(2, 3)
  local tag = string.format(" (%d)", n)
  cases{
    {"narrow start" .. tag, function() v:narrow(1, n, 1) end, "narrow"},
    {"narrow length" .. tag, function() v:narrow(1, 2, n) end, "narrow"},
    {"t[i]" .. tag, function() return v[n] end, string.format("position %d", n)},
    {"t[i] = x" .. tag, function() v[n] = 1 end, string.format("position %d", n)},
    {"select" .. tag, function() m:select(1, n == -1 and -3 or n) end, "select"},
    {"index_select table" .. tag, function() v:index_select(1, {1, n}) end,
     string.format("position %d (entry 2", n)},
    {"view" .. tag, function() m:view(n, n) end, "view"},
    {"reshape" .. tag, function() m:reshape(n, n, 6) end, "reshape"},
    {"expand" .. tag, function() rl.zeros(1, 3):expand(n, n, 3) end, "expand"},
    {"zeros" .. tag, function() rl.zeros(n, n) end, "zeros"},
    -- n_out in the range an allocation could satisfy is left to the out-of-memory case below
    n < (1 << 40) and n > 0 and {} or {"n_out" .. tag, function()
       rl.network({h = {class = "linear", n_out = n},
                   output = {class = "softmax", from = "h", loss = "ce", target = "classes"}}, ext)
     end, "layer 'h'"},
    n < (1 << 40) and n > 0 and {} or {"lstm n_out" .. tag, function()
       rl.network({h = {class = "lstm", n_out = n},
                   output = {class = "softmax", from = "h", loss = "ce", target = "classes"}}, ext)
     end, "layer 'h'"},
  }
end
cases{
  {"index_select with an int32 index tensor reports positions 1-based",
   function() rl.zeros(4):index_select(1, rl.tensor({1, 5}, "int32")) end,
   "position 5 (entry 2 of the index) out of range 1..4"},
  {"index_select position 0", function() rl.zeros(4):index_select(1, {0}) end, "position 0"},
  {"index_select with a 2-D index", function()
     rl.zeros(4):index_select(1, rl.ones(1, 1, "int32")) end, "1-D int32"},
  {"view of 2^32 x 2^32 elements that wraps to 0", function()
     rl.zeros(0):view(1 << 32, 1 << 32, 0) end, "view"},
  {"reshape that wraps to the element count", function()
     rl.zeros(2, 3):reshape(1 << 62, 4, 6) end, "reshape"},
  {"expand to a negative size", function() rl.zeros(1, 3):expand(-5, 3) end, "negative size"},
  {"narrow at position 0", function() rl.zeros(4):narrow(1, 0, 2) end, "start position 0"},
  {"narrow past the end", function() rl.zeros(4):narrow(1, 3, 3) end,
   "3 elements from position 3 are out of range"},
  {"dim 2^32 + 1", function() rl.zeros(4):size((1 << 32) + 1) end, "dim 4294967297"},
}
for _, shape in ipairs{{1 << 31, 1 << 31, 1 << 31}, {1 << 62}, {MAXI}, {1 << 40, 1 << 40}} do
  H.expect_error("a Lua layer with param shape " .. table.concat(shape, "x"), function()
    rl.layers.register("huge_" .. #shape .. "_" .. shape[1], {
      init = function() return 2 end,
      params = function() return {{name = "W", shape = shape}} end,
      forward = function(self, x) return x[1] end,
      backward = function(self, g) return {g} end,
    })
    rl.network({h = {class = "huge_" .. #shape .. "_" .. shape[1]},
                output = {class = "softmax", from = "h", loss = "ce", target = "classes"}}, ext)
  end, "elements")
end

do
  local path = dir .. "/rows.h5"
  local w = rl.h5file(path, "w")
  w:write("x", rl.ones(4, 2))
  w:commit()
  local f = rl.h5file(path)
  for _, r in ipairs{{1, MAXI}, {MAXI, 1}, {MAXI, MAXI}, {1 << 62, 1 << 62}, {0, 1}, {MINI, 1},
                     {1, -1}, {1, MINI}, {5, 1}, {(1 << 32) + 1, 1}} do
    H.expect_error(string.format("read_rows(%d, %d)", r[1], r[2]), function()
      f:read_rows("x", r[1], r[2])
    end, path)
  end
  H.test("read_rows of the last row still works", function()
    H.check(f:read_rows("x", 4, 1):size(1) == 1)
  end)
  f:close()
end

---------------------------------------------------------------- aliasing
-- An output that overlaps an input: the right numbers (through a temporary), or an error when
-- the output repeats elements.
local function flat(t) return table.concat(t:contiguous():view(t:numel()):totable(), ",") end
local function same(a, b) return flat(a) == flat(b) end
local function sq() return rl.tensor{{1, 2}, {3, 4}} end

H.test("matmul(a, a, a) gives a @ a", function()
  local a = sq()
  local want = rl.matmul(sq(), sq())
  rl.matmul(a, a, a)
  H.check(same(a, want), flat(a))
end)
H.test("matmul into a transposed view of its input", function()
  local a = sq()
  local want = rl.matmul(sq(), sq()):t()
  rl.matmul(a, a, a:t())
  H.check(same(a, want), flat(a))
end)
H.test("gemm with beta = 1 into its own input", function()
  local d = sq()
  rl.gemm(d, d, {out = d, beta = 1})
  H.check(flat(d) == "8.0,12.0,18.0,26.0", flat(d))
end)
H.test("a 3-D matmul into its first operand", function()
  local a = rl.randn(2, 3, 3)
  local want = rl.matmul(a:clone(), a:clone())
  rl.matmul(a, a, a)
  H.check((a - want):abs():max() < 1e-5)
end)
H.test("a:copy_(a:t()) transposes", function()
  local a = sq()
  a:copy_(a:t())
  H.check(flat(a) == "1.0,3.0,2.0,4.0", flat(a))
end)
H.test("copy_ of a shifted view of itself", function()
  local v = rl.arange(1, 7)
  v:narrow(1, 2, 5):copy_(v:narrow(1, 1, 5))
  H.check(flat(v) == "1.0,1.0,2.0,3.0,4.0,5.0", flat(v))
end)
H.test("a:add_(a:t())", function()
  local a = sq()
  a:add_(a:t())
  H.check(flat(a) == "2.0,5.0,5.0,8.0", flat(a))
end)
H.test("a:mul_(a) (the same view) squares", function()
  local a = sq()
  a:mul_(a)
  H.check(flat(a) == "1.0,4.0,9.0,16.0", flat(a))
end)
local EXPANDED = "is an expanded view"
cases{
  {"matmul into an expanded output", function()
     rl.matmul(sq(), sq(), rl.zeros(1, 2):expand(2, 2)) end, EXPANDED},
  {"matmul into an output expanded along columns", function()
     rl.matmul(sq(), sq(), rl.zeros(2, 1):expand(2, 2)) end, EXPANDED},
  {"gemm into an expanded output", function()
     rl.gemm(sq(), sq(), {out = rl.zeros(1, 2):expand(2, 2)}) end, EXPANDED},
  {"copy_ into an expanded view", function() rl.zeros(1, 2):expand(2, 2):copy_(sq()) end,
   EXPANDED},
  {"add_ into an expanded view", function() rl.zeros(1, 2):expand(2, 2):add_(1) end, EXPANDED},
  {"exp_ of an expanded view", function() rl.zeros(1, 2):expand(2, 2):exp_() end, EXPANDED},
}

---------------------------------------------------------------- NaN in padding
-- A NaN or Inf in a padded frame (t > length) is no input: the loss and every gradient stay
-- finite and equal to those of the same batch with zeros there.
for _, dt in ipairs{"float32", "float64"} do
  for _, cls in ipairs{"lstm", "linear"} do
    H.test(string.format("NaN and Inf in padded frames (%s, %s)", cls, dt), function()
      local function run(fill)
        rl.manual_seed(3)
        local net = rl.network({h = {class = cls, n_out = 4}, output = {class = "softmax",
          from = "h", loss = "ce", target = "classes"}}, ext, {dtype = dt})
        rl.manual_seed(4)
        local x = rl.randn(5, 2, 3, dt)
        if fill then
          x[5][1]:fill(0 / 0)
          x[4][1]:fill(1 / 0)
        else
          x[5][1]:fill(0)
          x[4][1]:fill(0)
        end
        local y = rl.zeros(5, 2, "int32")
        local loss = net:forward{data = x, classes = y, lengths = rl.tensor({3, 5}, "int32")}
        net:backward()
        return loss, net:grads():clone(), x
      end
      local l1, g1, x1 = run(true)
      local l0, g0 = run(false)
      H.check(l1 == l1 and l1 == l0, "loss " .. l1 .. " vs " .. l0)
      H.check(g1:ne(g1):sum() == 0, "NaN in the gradients")
      H.check((g1 - g0):abs():max() == 0, "the gradients differ from those with zero padding")
      H.check(x1[5][1][1] ~= x1[5][1][1], "the caller's batch was changed")
    end)
  end
end
-- The same for images: NaN and Inf in the padding of a batch of ragged images (outside each
-- image's own height and width) reach no loss, output or gradient of the 2-D layers.
local img_ext = {data = {dim = 2, spatial = 2}, classes = {dim = 3, sparse = true}}
local img_nets = {
  conv = {conv = {class = "conv2d", n_out = 3, filter_size = 3, activation = "tanh"},
          col = {class = "collapse", mode = "sum", from = "conv"}},
  conv_pool = {conv = {class = "conv2d", n_out = 3, filter_size = {2, 3}, strides = {1, 2}},
               pool = {class = "pool2d", mode = "max", pool_size = 2, padding = "same",
                       from = "conv"},
               col = {class = "collapse", mode = "max", from = "pool"}},
  mdlstm = {md = {class = "mdlstm", n_out = 3}, col = {class = "collapse", mode = "last",
            from = "md"}},
  avg_pool = {pool = {class = "pool2d", mode = "avg", pool_size = 2, padding = "same"},
              col = {class = "collapse", mode = "sum", from = "pool"}},
}
for _, name in ipairs{"conv", "conv_pool", "mdlstm", "avg_pool"} do
  H.test("NaN and Inf in image padding (" .. name .. ")", function()
    local sizes = rl.tensor({{4, 6}, {2, 3}, {3, 5}}, "int32")
    local function run(fill)
      local desc = {output = {class = "softmax", from = "col", loss = "ce", target = "classes"}}
      for k, v in pairs(img_nets[name]) do desc[k] = v end
      rl.manual_seed(3)
      local net = rl.network(desc, img_ext, {dtype = "float64"})
      rl.manual_seed(4)
      local x = rl.randn(4, 6, 3, 2, "float64")
      local sz = sizes:totable()
      for b = 1, 3 do
        for yy = 1, 4 do
          for xx = 1, 6 do
            if yy > sz[b][1] or xx > sz[b][2] then
              x[yy][xx][b]:fill(fill == "nan" and ((yy + xx) % 2 == 0 and 0 / 0 or 1 / 0) or 0)
            end
          end
        end
      end
      local batch = {data = x, sizes = sizes, classes = rl.zeros(6, 3, "int32")}
      if name == "conv_pool" then batch.classes = rl.zeros(2, 3, "int32") end
      if name == "avg_pool" then batch.classes = rl.zeros(3, 3, "int32") end
      local loss = net:forward(batch)
      net:backward()
      return loss, net:grads():clone()
    end
    local l1, g1 = run("nan")
    local l0, g0 = run("zero")
    H.check(l1 == l1 and l1 == l0, "loss " .. l1 .. " vs " .. l0)
    H.check(g1:ne(g1):sum() == 0, "NaN in the gradients")
    H.check((g1 - g0):abs():max() == 0, "the gradients differ from those with zero padding")
  end)
end

H.test("logits of +-1000 give a finite ce loss", function()
  local net = rl.network({output = {class = "softmax", loss = "ce", target = "classes"}},
    {data = {dim = 2}, classes = {dim = 2, sparse = true}})
  net:params():copy_(rl.tensor({1000, -1000, 0, 0, 0, 0}))
  local x = rl.tensor({{{1, 0}}})
  local loss = net:forward{data = x, classes = rl.zeros(1, 1, "int32"),
                           lengths = rl.tensor({1}, "int32")}
  H.check(loss == loss and loss < 1e-3, "loss " .. tostring(loss))
end)

---------------------------------------------------------------- messages that name the cause
local function seq_batch(B, lengths)
  return {data = rl.zeros(4, B, 3), classes = rl.zeros(4, B, "int32"),
          lengths = rl.tensor(lengths, "int32")}
end
local softmax_ce = {output = {class = "softmax", loss = "ce", target = "classes"}}
cases{
  {"a loss without a target", function()
     rl.network({output = {class = "softmax", loss = "ce"}}, ext) end,
   "loss 'ce' needs a target"},
  {"a loss with an unknown target", function()
     rl.network({output = {class = "softmax", loss = "ce", target = "nope"}}, ext) end,
   "target 'nope' is not in extern_data"},
  {"a loss with a non-string target", function()
     rl.network({output = {class = "softmax", loss = "ce", target = 3}}, ext) end,
   "target '3' is not in extern_data"},
  {"lengths with one entry too many", function()
     rl.network(softmax_ce, ext):forward(seq_batch(2, {4, 4, 4})) end,
   "batch.lengths has 3 entries, but batch.classes and batch.data hold 2 sequences"},
  {"lengths with one entry too few", function()
     rl.network(softmax_ce, ext):forward(seq_batch(2, {4})) end,
   "batch.lengths has 1 entries"},
  {"out of memory for a huge layer names the layer", function()
     rl.network({huge = {class = "linear", n_out = 1 << 40},
                 output = {class = "softmax", from = "huge", loss = "ce", target = "classes"}},
                ext) end, "the largest layer is 'output'"},
  {"out of memory names the largest layer", function()
     -- (within the recurrent layers' sanity bound on the parameter count, 2^44)
     rl.network({huge = {class = "lstm", n_out = 1 << 20},
                 output = {class = "softmax", from = "huge", loss = "ce", target = "classes"}},
                ext) end, "the largest layer is 'huge' (class lstm"},
  {"a recurrent layer beyond the parameter bound names the layer", function()
     rl.network({huge = {class = "lstm", n_out = 1 << 28},
                 output = {class = "softmax", from = "huge", loss = "ce", target = "classes"}},
                ext) end, "layer 'huge' (class lstm): n_out = 268435456 with 3 input features"},
}

-- A dataset object written in Lua whose methods return the wrong types.
local function lua_dataset(over)
  local ds = {name = "mine"}
  function ds:init_epoch() end
  function ds:num_seqs() return 1 end
  function ds:keys() return {"data", "classes"} end
  function ds:extern_data() return {data = {dim = 3}, classes = {dim = 4, sparse = true}} end
  function ds:get_seq() return {tag = "s", data = rl.zeros(2, 3), classes = rl.zeros(2, "int32")} end
  for k, v in pairs(over) do ds[k] = v end
  return ds
end
for _, c in ipairs{
  {"num_seqs", function() return "3" end, "num_seqs() returned 3 (a string)"},
  {"num_seqs", function() return 2.5 end, "num_seqs() returned 2.5"},
  {"keys", function() return "data" end, "keys() returned a string"},
  {"extern_data", function() return 7 end, "extern_data() returned a number"},
  {"get_seq", function() return 5 end, "get_seq(1) gave no data tensor"},
} do
  H.expect_error("a dataset whose " .. c[1] .. " returns the wrong type", function()
    rl.train{network = softmax_ce, extern_data = ext, train = lua_dataset({[c[1]] = c[2]}),
             num_epochs = 1, batch_size = 100, optimizer = {class = "sgd"}, learning_rate = 0.1,
             log_verbosity = 0}
  end, c[3])
end

H.expect_error("a sequence of length 0 in a file names the file and the sequence", function()
  local path = dir .. "/empty_seq.h5"
  rl.dataset_write(path, {{data = rl.ones(3, 3), classes = rl.zeros(3, "int32"), tag = "a"},
                          {data = rl.ones(0, 3), classes = rl.zeros(0, "int32"), tag = "b"}},
                   {extern_data = ext})
  rl.train{network = softmax_ce, extern_data = ext, train = {class = "hdf", files = {path}},
           num_epochs = 1, batch_size = 100, optimizer = {class = "sgd"}, learning_rate = 0.1,
           log_verbosity = 0}
end, "empty_seq.h5: sequence 'b' (number 2 in the file) has length 0")

for _, c in ipairs{
  {{"++train.files.1", dir .. "/no-such-file.h5"}, "no-such-file.h5"},
  {{"++train..files", "x"}, "a key part is empty"},
  {{"++nosuchkey", "1"}, "unknown config key 'nosuchkey'"},
  {{"++num_epochs"}, "lacks a value"},
} do
  H.expect_error("override " .. c[1][1], function()
    rl.train({network = softmax_ce, extern_data = ext,
              train = {class = "hdf", files = {dir .. "/empty_seq.h5"}}, num_epochs = 1,
              batch_size = 100, optimizer = {class = "sgd"}, learning_rate = 0.1,
              log_verbosity = 0}, c[1])
  end, c[2])
end

---------------------------------------------------------------- network descriptions
local function net_of(desc, e) return function() rl.network(desc, e or ext) end end
local function out_from(src, extra)
  local d = {class = "softmax", from = src, loss = "ce", target = "classes"}
  for k, v in pairs(extra or {}) do d[k] = v end
  return d
end
cases{
  {"a description that is a string", net_of("output"), "the description must be a table"},
  {"a layer that is a number", net_of({output = 5}), "layer 'output': the description must be"},
  {"a layer without class", net_of({h = {n_out = 2}, output = out_from("h")}),
   "layer 'h': missing class"},
  {"an unknown class", net_of({h = {class = "lstmm", n_out = 2}, output = out_from("h")}),
   "lstmm"},
  {"a class that is a table", net_of({h = {class = {}, n_out = 2}, output = out_from("h")}),
   "class must be a string"},
  {"from an unknown layer", net_of({output = out_from("nope")}), "unknown from 'nope'"},
  {"from a number", net_of({output = out_from(3)}), "from"},
  {"an empty from list", net_of({output = out_from({})}), "from"},
  {"a cycle", net_of({a = {class = "linear", n_out = 2, from = "b"},
                      b = {class = "linear", n_out = 2, from = "a"}, output = out_from("a")}),
   "cycle"},
  {"a layer feeding itself", net_of({output = out_from("output")}), "cycle"},
  {"n_out as a string", net_of({h = {class = "linear", n_out = "8"}, output = out_from("h")}),
   "layer 'h'"},
  {"n_out 0", net_of({h = {class = "linear", n_out = 0}, output = out_from("h")}), "n_out"},
  {"n_out 2.5", net_of({h = {class = "linear", n_out = 2.5}, output = out_from("h")}), "n_out"},
  {"n_out NaN", net_of({h = {class = "linear", n_out = 0 / 0}, output = out_from("h")}), "n_out"},
  {"n_out inf", net_of({h = {class = "lstm", n_out = 1 / 0}, output = out_from("h")}), "n_out"},
  {"an unknown option", net_of({h = {class = "linear", n_out = 2, n_outt = 3},
                                output = out_from("h")}), "n_outt"},
  {"an unknown loss", net_of({output = out_from("data", {loss = "hinge"})}), "unknown loss"},
  {"loss_scale as a string", net_of({output = out_from("data", {loss_scale = "2"})}),
   "loss_scale must be a finite number, got 2"},
  {"loss_scale NaN", net_of({output = out_from("data", {loss_scale = 0 / 0})}),
   "layer 'output' (class softmax): loss_scale must be a finite number"},
  {"loss_scale inf", net_of({output = out_from("data", {loss_scale = 1 / 0})}),
   "layer 'output' (class softmax): loss_scale must be a finite number, got inf"},
  {"mse on a sparse target", net_of({output = {class = "linear", n_out = 4, loss = "mse",
                                               target = "classes"}}), "needs a dense target"},
  {"n_out that disagrees with the target", net_of({output = out_from("data", {n_out = 7})}),
   "n_out is 7"},
  {"a sparse input feeding an lstm", net_of({h = {class = "lstm", n_out = 2, from = "classes"},
                                             output = out_from("h")}), "is sparse"},
  {"a layer named like an input", net_of({data = {class = "linear", n_out = 2},
                                          output = out_from("data")}), "taken by an extern_data"},
  {"a numeric layer name", net_of({[1] = {class = "linear", n_out = 2},
                                   output = out_from("data")}), "names must be strings"},
  {"no loss and no output layer", net_of({h = {class = "linear", n_out = 2}}), "output"},
  {"lstm direction 2", net_of({h = {class = "lstm", n_out = 2, direction = 2},
                               output = out_from("h")}), "direction"},
  {"extern_data that is a list", net_of(softmax_ce, {3}), "extern_data"},
  {"extern_data dim 0", net_of(softmax_ce, {data = {dim = 0}, classes = {dim = 4,
                                                                         sparse = true}}), "dim"},
  {"a network dtype int32", function() rl.network(softmax_ce, ext, {dtype = "int32"}) end,
   "dtype must be float32 or float64"},
  -- options that were ignored: {trian = false} scored with dropout on
  {"a misspelt network option", function() rl.network(softmax_ce, ext, {dtyp = "float64"}) end,
   "rl.network: unknown option 'dtyp' (known: concurrent, dtype, input_grads, params, precision, seed)"},
  {"network options that are a string", function() rl.network(softmax_ce, ext, "float64") end,
   "rl.network: opts must be a table, got string"},
  {"a misspelt forward option", function()
     rl.network(softmax_ce, ext):forward(seq_batch(1, {4}), {trian = false}) end,
   "net:forward: unknown option 'trian' (known: train)"},
  {"forward options that are a boolean", function()
     rl.network(softmax_ce, ext):forward(seq_batch(1, {4}), false) end,
   "net:forward: opts must be a table, got boolean"},
  {"forward train as a string", function()
     rl.network(softmax_ce, ext):forward(seq_batch(1, {4}), {train = "false"}) end,
   "net:forward: train must be true or false, got false"},
}

---------------------------------------------------------------- dataset files
-- RETURNN-layout files with one defect each; the error names the file and the defect.
local function h5_with(name, parts)
  local path = dir .. "/" .. name .. ".h5"
  local f = rl.h5file(path, "w")
  local p = {inputs = rl.ones(5, 3), seqLengths = rl.tensor({{2, 2}, {3, 3}}, "int32"),
             classes = rl.zeros(5, "int32"), size = rl.tensor({4, 1}, "int32"),
             tags = {"a", "b"}, attrs = {inputPattSize = 3, numSeqs = 2}}
  for k, v in pairs(parts) do p[k] = v end
  if p.inputs then f:write("inputs", p.inputs) end
  if p.seqLengths then f:write("seqLengths", p.seqLengths) end
  if p.classes then f:write("targets/data/classes", p.classes) end
  if p.size then f:set_attr("targets/size", "classes", p.size) end
  if p.tags then f:write_strings("seqTags", p.tags) end
  for k, v in pairs(p.attrs) do f:set_attr("/", k, v) end
  f:commit()
  return path
end
local function reads(path)
  return function()
    local ds = rl.dataset{class = "hdf", files = {path}}
    ds:init_epoch(1)
    for i = 1, ds:num_seqs() do ds:get_seq(i) end
  end
end
H.test("the unchanged crafted file reads", function()
  local ds = rl.dataset{class = "hdf", files = {h5_with("fine", {})}}
  ds:init_epoch(1)
  H.check(ds:num_seqs() == 2 and ds:get_seq(2).data:size(1) == 3)
end)
for _, c in ipairs{
  {"no /inputs", {inputs = false}, "has no /inputs"},
  {"no /seqLengths", {seqLengths = false}, "has no /seqLengths"},
  {"3-dim inputs", {inputs = rl.ones(5, 3, 1)}, "must be 1-dim (sparse) or 2-dim"},
  {"float seqLengths", {seqLengths = rl.tensor({{2, 2}, {3, 3}})}, "must hold integers"},
  {"seqLengths without the target's column", {seqLengths = rl.tensor({{2}, {3}}, "int32")},
   "/seqLengths has 1 columns, needs 1 + 1"},
  {"a negative length", {seqLengths = rl.tensor({{-1, 2}, {6, 3}}, "int32")},
   "negative length"},
  {"lengths that overrun /inputs", {seqLengths = rl.tensor({{2, 2}, {9, 3}}, "int32")},
   "input frames but /inputs has 5 rows"},
  {"lengths that overrun a target", {seqLengths = rl.tensor({{2, 2}, {3, 9}}, "int32")},
   "frames of 'classes'"},
  {"numSeqs that disagrees", {attrs = {inputPattSize = 3, numSeqs = 7}}, "numSeqs = 7"},
  {"inputPattSize that disagrees", {attrs = {inputPattSize = 4, numSeqs = 2}},
   "inputPattSize = 4"},
  {"a tag missing", {tags = {"a"}}, "1 tags for 2 sequences"},
  {"float class targets", {classes = rl.zeros(5)}, "must hold integers"},
  {"a sparse target without its size", {size = false}, "no attribute /targets/size"},
  {"a class outside the target's dim", {classes = rl.tensor({0, 1, 2, 3, 9}, "int32")},
   "holds class 9, outside 0..3"},
  {"a negative class", {classes = rl.tensor({0, -1, 2, 3, 1}, "int32")}, "holds class -1"},
  {"NaN in the inputs", {inputs = rl.tensor({{1, 1, 1}, {1, 0 / 0, 1}, {1, 1, 1}, {1, 1, 1},
                                            {1, 1, 1}})}, "NaN in 'data' at frame 2"},
  {"Inf in the inputs", {inputs = rl.tensor({{1, 1, 1}, {1, 1, 1}, {1, 1, 1}, {1, 1, 1},
                                            {1, 1, 1 / 0}})}, "Inf in 'data' at frame 3"},
  {"a length-0 sequence", {seqLengths = rl.tensor({{0, 0}, {5, 5}}, "int32")},
   "sequence 'a' (number 1 in the file) has length 0"},
} do
  local path = h5_with(c[1]:gsub("[^%w]", "_"), c[2])
  H.expect_error("dataset file with " .. c[1], reads(path), c[3])
  H.expect_error("dataset file with " .. c[1] .. " names the file", reads(path), path)
end
for _, c in ipairs{
  {"a missing file", dir .. "/none.h5", "no such file"},
  {"a directory", dir, dir},
  {"a text file", (function()
     local f = assert(io.open(dir .. "/text.h5", "w")); f:write("hello\n"); f:close()
     return dir .. "/text.h5" end)(), "not an HDF5 file"},
  {"a truncated file", (function()
     local src = assert(io.open(h5_with("whole", {}), "rb")); local b = src:read("a"); src:close()
     local f = assert(io.open(dir .. "/cut.h5", "wb")); f:write(b:sub(1, #b // 3)); f:close()
     return dir .. "/cut.h5" end)(), "cut.h5"},
} do
  H.expect_error("dataset: " .. c[1], reads(c[2]), c[3])
end
cases{
  {"files as a string of a missing file", function()
     rl.dataset{class = "hdf", files = "x.h5"} end, "x.h5: no such file"},
  {"an empty file list", function() rl.dataset{class = "hdf", files = {}} end, "needs files"},
  {"a file path that is a number", function() rl.dataset{class = "hdf", files = {5}} end,
   "files must be paths"},
  {"an unknown dataset class", function() rl.dataset{class = "nope"} end, "unknown class 'nope'"},
  {"num_seqs -1 for a generated task", function()
     rl.dataset{class = "12ax", num_seqs = -1} end, "num_seqs"},
  {"batch_size 0", function()
     rl.batches(rl.dataset{class = "12ax", num_seqs = 2}, {batch_size = 0}) end,
   "batch_size must be a positive"},
  {"batches of a config table", function() rl.batches({class = "12ax", num_seqs = 2}) end,
   "rl.batches: expects a dataset object (rl.dataset{...} or an object with get_seq), got a "
   .. "table without get_seq"},
  {"batches of nothing", function() rl.batches() end, "rl.batches: expects a dataset object"},
  {"batches with opts that are a number", function()
     rl.batches(rl.dataset{class = "12ax", num_seqs = 2}, 5) end,
   "rl.batches: opts must be a table, got number"},
  {"check_dataset_dims of a number", function() rl.check_dataset_dims(5, {}) end,
   "check_dataset_dims: expects a dataset object"},
  {"check_dataset_dims without extern_data", function()
     rl.check_dataset_dims(rl.dataset{class = "12ax", num_seqs = 2}) end,
   "check_dataset_dims: extern_data must be a table, got nil"},
  {"an unknown batches option", function()
     rl.batches(rl.dataset{class = "12ax", num_seqs = 2}, {batchsize = 10}) end,
   "unknown option 'batchsize'"},
  {"chunking as garbage", function()
     local it = rl.batches(rl.dataset{class = "12ax", num_seqs = 2}, {chunking = "a:b"})
     it() end, "chunking"},
}

for entry in lfs.dir(dir) do
  if entry ~= "." and entry ~= ".." then os.remove(dir .. "/" .. entry) end
end
lfs.rmdir(dir)
H.done()
