-- rl.sample: text from a character language model, one character at a time (Torch7's
-- char-rnn sample.lua), at the REPL or in a recipe.
--
--   local text, full = rl.sample{model = "out/char_lm/lm.012.h5" | net, prime = "In the beginning",
--                                length = 500, temperature = 0.8, seed = 1, layer = "output"}
--   text: the `length` generated characters (after the prime; at most a million); full:
--   prime .. text.
--
-- model: a checkpoint path or a network in memory (rl.network, rl.train's result.net); only
-- what `layer` needs is run, without its loss, on the CPU in the model's dtype. layer: the
-- softmax giving the next character's distribution (default: the network's one loss layer,
-- else "output"). A character language model reads one sparse input whose extern_data carries
-- the vocabulary, labels = {c_0, c_1, ...} (one character per class, stored in the checkpoint
-- with the description: recipes/char_lm.lua gives it), and its softmax has one output per
-- character (and the same labels on its target, if they are given). Its every layer must be
-- causal, as for carried state (net:carry_unfit): the prime is fed once as one sequence, then
-- each drawn character as a sequence of one frame that continues from the state the one before
-- left (batch.state_from), so sampling costs one step per character.
-- Drawing: p_i^(1/temperature), normalised, sampled with a splitmix64 stream of `seed` (the
-- same seed, model and options give the same text; default: a seed drawn from the global
-- generator, rl.manual_seed). As temperature -> 0 it is the most likely character (ties: the
-- lowest class). prime: UTF-8, each character in the vocabulary (default "\n" when the
-- vocabulary has it). Bad options and a model that is not a character LM are errors naming
-- what is wrong.
local M = {}
local rl -- the module table, set by install
local forward = require("rnnlua.forward")
local new_rng = require("rnnlua.datasets").new_rng

-- One step per character: a million is hours of work for a large model, and a length beyond it
-- is a typo (or an exponent) that would otherwise run for ever.
local MAX_LENGTH = 1000000

local KEYS = {model = true, prime = true, length = true, temperature = true, seed = true,
              layer = true}

local function fail(fmt, ...)
  error("rl.sample: " .. string.format(fmt, ...), 0)
end

local util = require("rnnlua.util")
local sorted_keys = util.sorted_keys

-- The layer scoring the next character: the one loss layer of the description, else "output".
function M.default_layer(desc)
  local losses = {}
  for name, d in pairs(desc) do
    if type(d) == "table" and d.loss ~= nil then losses[#losses + 1] = name end
  end
  if #losses == 1 then return losses[1] end
  return "output"
end

-- The vocabulary of a character LM (a list: class k is vocab[k + 1]) and the class of each
-- character, or an error saying why `what` is not one.
function M.lm_vocab(model, what, who)
  local function fail(fmt, ...) -- who: rl.sample, or a decoding's lm = {model = ...} (rnnlua.lm)
    error((who or "rl.sample") .. ": " .. string.format(fmt, ...), 0)
  end
  local net, ck, layer = model.net, model.ck, model.layer
  local keys = sorted_keys(net.input_keys)
  if #keys ~= 1 or not net.ext[keys[1]].sparse then
    local descr = {}
    for _, k in ipairs(keys) do
      descr[#descr + 1] = string.format("'%s' (%s)", k, net.ext[k].sparse and "sparse" or "dense")
    end
    fail("%s is not a character language model: layer '%s' needs the inputs %s, a character "
      .. "LM reads one sparse input (class indices of characters)", what, layer,
      table.concat(descr, ", "))
  end
  local key = keys[1]
  local labels = ck.extern_data[key].labels
  local V = net.ext[key].dim
  if type(labels) ~= "table" or #labels ~= V then
    fail("%s is not a character language model: its input '%s' (dim %d) has no vocabulary "
      .. "(extern_data.%s.labels, a list of %d characters, is %s)", what, key, V, key, V,
      type(labels) == "table" and #labels .. " entries" or "missing")
  end
  local index = {}
  for k, c in ipairs(labels) do
    if type(c) ~= "string" or utf8.len(c) ~= 1 then
      fail("%s is not a character language model: label %d of input '%s' is %s, not one "
        .. "character", what, k - 1, key, type(c) == "string" and string.format("%q", c)
        or type(c))
    end
    if index[c] then
      fail("%s: the vocabulary of input '%s' has %q twice", what, key, c)
    end
    index[c] = k - 1
  end
  local d = ck.description[layer]
  if d.class ~= "softmax" then
    fail("%s is not a character language model: layer '%s' is class %s, not a softmax over the "
      .. "next character", what, layer, tostring(d.class))
  end
  if model.dim ~= V then
    fail("%s is not a character language model: layer '%s' gives %d classes, the input "
      .. "vocabulary has %d characters", what, layer, model.dim, V)
  end
  local target = d.target and ck.extern_data[d.target]
  if target and type(target.labels) == "table" then
    for k, c in ipairs(labels) do
      if target.labels[k] ~= c then
        fail("%s is not a character language model: the labels of target '%s' differ from "
          .. "those of input '%s' (class %d: %q vs %q)", what, d.target, key, k - 1,
          tostring(target.labels[k]), c)
      end
    end
  end
  local why = net:carry_unfit()
  if why then fail("%s cannot be sampled from one character at a time: %s", what, why) end
  return labels, index, key
end

-- The class drawn from probabilities p (a Lua list) at temperature temp with u in [0, 1);
-- n: the number of the character drawn (1-based), for the message of a NaN distribution.
local function draw(p, temp, u, n)
  local best, bi = -math.huge, 1
  local logs = {}
  for k, v in ipairs(p) do
    -- NaN (a model with NaN parameters) is no probability, but not "none" either: say so
    if v ~= v then
      fail("the model gave NaN as the probability of class %d for character %d (NaN in its "
        .. "parameters?)", k - 1, n)
    end
    local l = v > 0 and math.log(v) / temp or -math.huge
    logs[k] = l
    if l > best then best, bi = l, k end
  end
  if best == -math.huge then fail("the model gave no probability to any character") end
  local w, total = {}, 0
  for k, l in ipairs(logs) do
    w[k] = math.exp(l - best)
    total = total + w[k]
  end
  local r, acc = u * total, 0
  for k, x in ipairs(w) do
    acc = acc + x
    if r < acc then return k - 1 end
  end
  return bi - 1 -- rounding left r at the very top
end

function M.sample(opts)
  if type(opts) ~= "table" then
    fail("expects a table {model =, prime =, length =, temperature =, seed =}, got %s",
      type(opts))
  end
  for k in pairs(opts) do
    if not KEYS[k] then
      fail("unknown option '%s' (known: %s)", tostring(k), table.concat(sorted_keys(KEYS), ", "))
    end
  end
  local length = opts.length == nil and 500 or opts.length
  if math.type(length) == "float" then length = math.tointeger(length) or length end
  if math.type(length) ~= "integer" or length < 0 then
    fail("length must be an integer >= 0, got %s", tostring(length))
  end
  if length > MAX_LENGTH then
    fail("length %d is more than %d characters (sample longer texts in pieces: prime each with "
      .. "the end of the one before)", length, MAX_LENGTH)
  end
  local temp = opts.temperature == nil and 1.0 or opts.temperature
  if type(temp) ~= "number" or not (temp > 0) or temp == math.huge then
    fail("temperature must be a number > 0 (and finite), got %s", tostring(temp))
  end
  if opts.seed ~= nil and math.type(opts.seed) ~= "integer" then
    fail("seed must be an integer, got %s", tostring(opts.seed))
  end
  if opts.layer ~= nil and type(opts.layer) ~= "string" then
    fail("layer must be a layer name, got %s", type(opts.layer))
  end

  local m, what = opts.model, nil
  local model
  if type(m) == "string" then
    what = "model " .. m
    local ck = rl.load_checkpoint(m)
    model = forward.load_model(m, opts.layer or M.default_layer(ck.description), "cpu", "rl.sample")
  elseif type(m) == "table" and type(m.param_list) == "function" and m.description then
    what = "the network"
    model = forward.model_of_net(m, opts.layer or M.default_layer(m.description), "rl.sample")
  else
    fail("model must be a checkpoint path or a network, got %s", type(m))
  end
  local vocab, index, key = M.lm_vocab(model, what)

  local prime = opts.prime
  if prime == nil then
    if index["\n"] == nil then
      fail("prime is missing (the vocabulary has no \"\\n\" to start from)")
    end
    prime = "\n"
  end
  if type(prime) ~= "string" or prime == "" then
    fail("prime must be a non-empty string, got %s", prime == "" and "\"\"" or type(prime))
  end
  if not utf8.len(prime) then fail("prime is not valid UTF-8") end
  local ids, pos = {}, 0
  for _, code in utf8.codes(prime) do
    local c = utf8.char(code)
    pos = pos + 1
    if index[c] == nil then
      fail("prime character %q (character %d of the prime) is not in the vocabulary of %s (%d "
        .. "characters: %q)", c, pos, what, #vocab, table.concat(vocab))
    end
    ids[pos] = index[c]
  end

  local seed = opts.seed or math.floor(rl.rand(1)[1] * 2 ^ 31)
  local rng = new_rng(seed, 0x5A4D)
  local net, layer = model.net, model.layer
  local batch = {[key] = rl.tensor(ids, "int32"):view(#ids, 1),
                 lengths = rl.tensor({#ids}, "int32"), state_from = {0}}
  local step = {[key] = rl.zeros({1, 1}, "int32"), lengths = rl.tensor({1}, "int32"),
                state_from = {1}}
  local out = {}
  for n = 1, length do
    net:forward(batch, {train = false})
    local y = net:layer(layer).output
    local p = y:select(1, y:size(1)):select(1, 1):totable()
    local c = draw(p, temp, rng:uniform(), n)
    out[n] = vocab[c + 1]
    step[key]:fill_(c)
    batch = step
  end
  local text = table.concat(out)
  return text, prime .. text
end

function M.install(module)
  rl = module
  rl.sample = M.sample
  return M
end

return M
