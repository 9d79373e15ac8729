-- A character-level LSTM language model on the King James Bible, trained by truncated BPTT
-- with the LSTM state carried from chunk to chunk (rl.train{carry_state = true}), scored in
-- bits per character on a held-out set of chapters; rl.sample draws text from the result.
--
--   rnnlua recipes/char_lm.lua [++smoke] [++minutes M] [++num_epochs N] [++hidden H] [++layers L]
--                              [++emb E] [++chunk C] [++streams S] [++partition P] [++lr R]
--                              [++proj P] [++layer_norm] [++weight_dropout p] [++rec_dropout p]
--                              [++zoneout p] [++precision fp32|bf16]
--                              [++threads N] [++seed S] [++out DIR]     (--help: every option)
--
-- Data: Debian's bible-kjv (`bible -f Gen1:1-Rev22:21`, one verse a line, "Ge1:1 In the
-- beginning ..."; installed with apt-get when missing). The verse references are dropped; each
-- of the 1189 chapters is one sequence: its verses, each ending in a newline (about 3.6k
-- characters a chapter, 4.3M in all). Split, fixed and deterministic: chapter k (1-based, in
-- the Bible's order) is a dev chapter when k % 40 == 0 (29 chapters), the rest train. The
-- vocabulary is every character of the text (sorted by byte). Converted once into DIR/data
-- (train.h5, dev.h5 in the dataset layout: sparse "data" = the characters 1..n-1 of a chapter
-- and "classes" = characters 2..n, the next character to predict; DIR/data/DONE written last
-- with the vocabulary).
--
-- Model: embedding (E) -> L LSTM layers (H) -> softmax over the characters with the CE loss.
-- ++proj P makes each an LSTMP (n_proj: the recurrent and output state h has P units, the cell
-- H; the carried state is that h and c), ++layer_norm, ++weight_dropout, ++rec_dropout and
-- ++zoneout set the LSTM options of the same names (docs/layers.md), ++precision bf16 the
-- network's precision (bf16 operands, float32 sums: much faster where the CPU has AMX or
-- AVX512-BF16; docs/training.md). Off by default: the default model is the plain LSTM in fp32.
-- Training: chunks of C characters, S streams (the batch: S chunks, each continuing the chunk
-- of its slot in the batch before, the LSTM state carried over, no gradient across the
-- boundary; a chapter starts from the zero state), Adam with global-norm clipping at 5,
-- learning rate R lowered by newbob (x0.7 when dev improves by less than 1%). An epoch is 1/P
-- of the training chapters (partition_epoch), so dev is scored often. Dev is scored the same
-- way (chunks, carried state), so its bits per character are those of whole chapters.
--
-- Prints `epoch N dev bpc X` after each epoch and at the end `dev X bits per char`, the
-- checkpoint (DIR/lm.NNN.h5) and a sample of 300 characters from "In the beginning" (seed 1,
-- temperature 0.8). Training stops before an epoch that would end after M minutes (judged by
-- the last epoch's time) or after N epochs. ++smoke: the first 24 train chapters (cut to 600 characters) and 2 dev chapters, a
-- tiny model, 3 epochs, a few seconds (make test: tests/sh/test_char_lm_smoke.sh).
local o = require("rnnlua.cli").parse({
  usage = "rnnlua recipes/char_lm.lua [++key value ...]",
  about = "A character-level LSTM language model on the King James Bible (recipes/char_lm.lua).",
  options = {
    {"minutes", "number", 30, "stop before an epoch that would end after this"},
    {"num_epochs", "integer", 1000, "epochs at most"},
    {"hidden", "integer", 256, "LSTM units per layer"},
    {"layers", "integer", 2, "LSTM layers"},
    {"emb", "integer", 64, "embedding size"},
    {"chunk", "integer", 100, "characters per chunk (truncated BPTT)"},
    {"streams", "integer", 32, "chunks per batch, each carrying its state on"},
    {"partition", "integer", 10, "an epoch is 1/P of the training chapters"},
    {"lr", "number", 3e-3, "Adam's learning rate"},
    {"proj", "integer", 0, "LSTMP: project the recurrent state to P units (n_proj; 0 = none)"},
    {"layer_norm", "boolean", false, "layer-normalised LSTM layers"},
    {"weight_dropout", "number", 0, "DropConnect on the recurrent weights U (p; 0 = off)"},
    {"rec_dropout", "number", 0, "dropout on the recurrent input h (p; 0 = off)"},
    {"zoneout", "number", 0, "zoneout of cell and hidden state (p; 0 = off)"},
    {"precision", "string", "fp32", "fp32 or bf16 (bf16 operands in the matrix products)"},
    {"threads", "integer", 2, "CPU threads"},
    {"seed", "integer", 1, "random seed"},
    {"out", "string", "out/char_lm", "directory of the data and the model"},
    {"smoke", "boolean", false, "a tiny subset and model, 3 epochs at most: seconds"},
  }}, arg)
if o.smoke then
  o.hidden, o.layers, o.emb, o.chunk, o.streams, o.partition, o.lr = 24, 2, 8, 20, 4, 1, 1e-2
  o.num_epochs = math.min(o.num_epochs, 3)
end
for _, k in ipairs{"num_epochs", "hidden", "layers", "emb", "chunk", "streams", "partition",
                   "threads"} do
  if o[k] < 1 then error(string.format("++%s: must be positive, got %d", k, o[k]), 0) end
end
if o.proj < 0 or (o.proj > 0 and o.proj >= o.hidden) then
  error(string.format("++proj: must be 0 (none) or in 1..%d (below ++hidden), got %d",
    o.hidden - 1, o.proj), 0)
end
for _, k in ipairs{"weight_dropout", "rec_dropout", "zoneout"} do
  if not (o[k] >= 0 and o[k] < 1) then
    error(string.format("++%s: must be in [0, 1), got %s", k, tostring(o[k])), 0)
  end
end
if o.precision ~= "fp32" and o.precision ~= "bf16" then
  error(string.format("++precision: must be fp32 or bf16, got %q", o.precision), 0)
end
rl.set_num_threads(o.threads)

local BIBLE = "/usr/bin/bible"

local function exists(path)
  local f = io.open(path, "rb")
  if f then f:close() end
  return f ~= nil
end

if not exists(BIBLE) or not exists("/usr/lib/bible.data") then
  print("char_lm: bible-kjv is missing; installing it with apt-get")
  local sudo = io.popen("id -u"):read("*l") == "0" and "" or "sudo -n "
  local install = sudo .. "apt-get install -y --no-install-recommends bible-kjv >/dev/null 2>&1"
  local ok = os.execute(install)
    or os.execute(sudo .. "apt-get update >/dev/null 2>&1 && " .. install)
  if not ok or not exists(BIBLE) then
    error("char_lm: could not install the Debian package bible-kjv (needs root or password-less "
      .. "sudo and a reachable mirror); install it by hand: apt-get install bible-kjv", 0)
  end
end

---------------------------------------------------------------------------- data

-- The chapters of the Bible in order, each a string of its verses with a newline after each.
local function chapters()
  local p = io.popen(BIBLE .. " -f Gen1:1-Rev22:21 2>/dev/null", "r")
  local text = p:read("a")
  p:close()
  local list, cur, last_ref, n_verses = {}, nil, nil, 0
  for line in text:gmatch("[^\n]+") do
    local book, chap, verse = line:match("^(%S-)(%d+):%d+ (.+)$")
    if not book then error("char_lm: unexpected line from " .. BIBLE .. ": " .. line, 0) end
    local ref = book .. chap
    if ref ~= last_ref then
      if cur then list[#list + 1] = table.concat(cur) end
      cur, last_ref = {}, ref
    end
    cur[#cur + 1] = verse .. "\n"
    n_verses = n_verses + 1
  end
  if cur then list[#list + 1] = table.concat(cur) end
  if n_verses ~= 31102 or #list ~= 1189 then
    error(string.format("char_lm: %s gave %d verses in %d chapters, expected the 31102 verses "
      .. "in 1189 chapters of the King James Bible", BIBLE, n_verses, #list), 0)
  end
  return list
end

local function mkdir_p(path)
  if not os.execute("mkdir -p '" .. path:gsub("'", "'\\''") .. "'") then
    error("char_lm: cannot create the directory " .. path, 0)
  end
end

-- Converts the text once into dir (train.h5, dev.h5, DONE); returns the vocabulary (a list of
-- one-character strings: class k is vocab[k + 1]).
local function prepare(dir, smoke)
  local done = dir .. "/DONE"
  local want = string.format("char_lm data v1 smoke=%s", tostring(smoke))
  local f = io.open(done, "r")
  if f then
    local head, vocab = f:read("l"), f:read("a")
    f:close()
    if head == want then return rl.checkpoint.deserialize(vocab, done) end
  end
  mkdir_p(dir)
  local list = chapters()
  local seen, vocab, index = {}, {}, {}
  for _, ch in ipairs(list) do
    for c in ch:gmatch(".") do
      if not seen[c] then seen[c], vocab[#vocab + 1] = true, c end
    end
  end
  table.sort(vocab)
  for k, c in ipairs(vocab) do index[c] = k - 1 end
  local ext = {data_dim = #vocab, sparse = true, labels = vocab,
    targets = {classes = {dim = #vocab, sparse = true}}, target_labels = {classes = vocab}}
  local train, dev = rl.hdf_writer(dir .. "/train.h5", ext), rl.hdf_writer(dir .. "/dev.h5", ext)
  local n_train, n_dev = 0, 0
  for k, ch in ipairs(list) do
    local is_dev = k % 40 == 0
    if smoke then
      if (is_dev and n_dev >= 2) or (not is_dev and n_train >= 24) then goto continue end
      ch = ch:sub(1, 600)
    end
    do
      local ids = {}
      for j = 1, #ch do ids[j] = index[ch:sub(j, j)] end
      local x = rl.tensor(table.move(ids, 1, #ids - 1, 1, {}), "int32")
      local y = rl.tensor(table.move(ids, 2, #ids, 1, {}), "int32")
      local tag = string.format("chapter-%04d", k)
      if is_dev then
        dev:add(tag, x, {classes = y})
        n_dev = n_dev + 1
      else
        train:add(tag, x, {classes = y})
        n_train = n_train + 1
      end
    end
    ::continue::
  end
  train:close()
  dev:close()
  f = assert(io.open(done, "w"))
  f:write(want, "\n", rl.checkpoint.serialize(vocab, "vocabulary"), "\n")
  f:close()
  print(string.format("char_lm: converted %d train and %d dev chapters, %d characters -> %s",
    n_train, n_dev, #vocab, dir))
  return vocab
end

local data_dir = o.out .. "/data"
local vocab = prepare(data_dir, o.smoke)
local V = #vocab

---------------------------------------------------------------------------- model and training

local network = {
  emb = {class = "embedding", n_out = o.emb, from = "data"},
  output = {class = "softmax", from = "lstm" .. o.layers, loss = "ce", target = "classes"},
}
for l = 1, o.layers do
  -- the options are left out when off, so the default layer is exactly the plain LSTM
  network["lstm" .. l] = {class = "lstm", n_out = o.hidden, from = l == 1 and "emb"
    or "lstm" .. (l - 1), n_proj = o.proj > 0 and o.proj or nil,
    layer_norm = o.layer_norm or nil,
    weight_dropout = o.weight_dropout > 0 and o.weight_dropout or nil,
    rec_dropout = o.rec_dropout > 0 and o.rec_dropout or nil,
    zoneout = o.zoneout > 0 and o.zoneout or nil}
end
-- the vocabulary travels with the model (the checkpoint's extern_data): rl.sample reads it
local extern_data = {data = {dim = V, sparse = true, labels = vocab},
                     classes = {dim = V, sparse = true, labels = vocab}}
local model = o.out .. "/lm"

local config = {
  network = network, extern_data = extern_data,
  train = {class = "hdf", files = {data_dir .. "/train.h5"}, seq_ordering = "random",
           partition_epoch = o.partition, seed = o.seed},
  dev = {class = "hdf", files = {data_dir .. "/dev.h5"}},
  chunking = tostring(o.chunk), carry_state = true, max_seqs = o.streams,
  batch_size = o.chunk * o.streams,
  optimizer = {class = "adam", gradient_clip_global_norm = 5},
  learning_rate = o.lr, learning_rate_control = "newbob_rel",
  newbob_relative_error_threshold = -0.01, newbob_learning_rate_decay = 0.7,
  precision = o.precision, model = model, seed = o.seed, log_verbosity = 1,
  -- the epochs are the loop's below: a run starts afresh and replaces an earlier run's
  -- checkpoints in ++out, where rl.train alone would continue from them
  overwrite = true,
}

local LN2 = math.log(2)
local t0 = rl.clock()
local cpu0 = os.clock()
local last
print(string.format("char_lm: %d characters, embedding %d, %d x LSTM %d%s, chunks of %d, %d "
  .. "streams, epoch = 1/%d of the train chapters, %s", V, o.emb, o.layers, o.hidden,
  o.proj > 0 and (" proj " .. o.proj) or "", o.chunk, o.streams, o.partition, o.precision))
local epoch_time = 0
for epoch = 1, o.num_epochs do
  -- stop when another epoch as long as the last one would overrun the budget
  if epoch > 1 and rl.clock() - t0 + epoch_time > o.minutes * 60 then break end
  local te = rl.clock()
  -- one epoch per call: resuming from the last checkpoint is exact (same order, RNG, state)
  config.num_epochs = epoch
  config.load = epoch > 1 and string.format("%s.%03d.h5", model, epoch - 1) or nil
  last = rl.train(config, {})
  local rec = last.history[#last.history]
  local minutes = (rl.clock() - t0) / 60
  print(string.format("epoch %d dev bpc %.4f  train bpc %.4f  lr %.3g  %.1f min (cpu %.1f min)",
    epoch, rec.dev_score / LN2, rec.train_score / LN2, rec.lr, minutes, (os.clock() - cpu0) / 60))
  io.stdout:flush()
  epoch_time = rl.clock() - te
end
print(string.format("dev %.4f bits per char", last.dev_score / LN2))
print("checkpoint " .. last.checkpoint)
local text = rl.sample{model = last.checkpoint, prime = "In the beginning", length = 300,
  temperature = 0.8, seed = 1}
print("sample: " .. text)
