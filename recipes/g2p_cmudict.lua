-- Grapheme-to-phoneme conversion on the CMU pronouncing dictionary: letters in, phonemes out,
-- with an attention encoder-decoder (a rec layer) trained by teacher forcing and decoded with
-- beam search.
--
--   rnnlua recipes/g2p_cmudict.lua [++smoke] [++minutes M] [++num_epochs N] [++hidden H] [++emb E]
--                                  [++dropout P] [++beam K] [++batch B] [++lr R] [++threads N]
--                                  [++seed S] [++out DIR]     (--help: every option)
--
-- Data: cmudict-0.4.out of Debian's festlex-cmu (/usr/share/festival/dicts/cmu; installed with
-- apt-get when missing), ~106k entries ("word" pos (((syllable phonemes) stress) ...)).
-- Stress marks are dropped: the targets are the 39-symbol phoneme sequences (festival's
-- phone names). A word with several pronunciations (entries with another part of speech) is
-- one word with several references: training uses every (word, pronunciation) pair, scoring
-- takes the reference closest to the hypothesis. Split, fixed and deterministic by word: a
-- 32-bit FNV-1a hash of the word modulo 100 puts it in train (0..89), dev (90..94) or test
-- (95..99).
--
-- Model: letters -> embedding (E = 32) -> bidirectional LSTM encoder (H = 256 per direction);
-- decoder rec unit: embedding of the previous phoneme, an LSTM (H) over it and the previous
-- context, additive attention over the encoder, a tanh readout (H) from state and context, dropout
-- P = 0.25 (inverted, training only) on the encoder's output and on the readout (with H = 128 and
-- no dropout the model overfits after 10 of 28 minutes; H = 256 with dropout goes on improving:
-- docs/recipes.md; `++dropout 0` builds the network without the layers), a softmax over phonemes +
-- end-of-sequence (label 0) with the CE loss, and a choice (teacher forcing in training, beam
-- search at test time, max_seq_len = T + 5). Adam, learning rate 1e-3 halved when the dev score
-- stops improving, as RETURNN's newbob does: the score is the dev subset's cross entropy per
-- phoneme (teacher forcing), not its greedy PER, whose noise on 1000 words halved the rate at
-- epochs where the model still improved; a rate is kept for at least 2 epochs (RETURNN's
-- learning_rate_control_min_num_epochs_per_new_lr) and never falls below 1/64 of the start.
-- Global-norm clipping at 5.
--
-- Prints per epoch the training loss per phoneme, dev PER (greedy, on a dev subset) and time,
-- then `test PER X% WER Y%` (beam search): PER = edit distance / reference phonemes, WER =
-- words with any error. ++smoke: a tiny subset (256 train words) and model, 4 epochs, seconds
-- (run by make test, tests/sh/test_g2p_smoke.sh).
--
-- Files in ++out DIR (default out/g2p): net.h5 the trained model, test.h5 the test words (letters
-- as sparse inputs, the word as tag), test_hyp.h5 the search task's output on them (rl.search:
-- the best phonemes, scores, the n-best and the attention weights of each word), so that
--   rnnlua search ++model DIR/net.h5 ++data DIR/test.h5 ++output hyp.h5 ++beam 8
--   rnnlua plot DIR/test_hyp.h5 ++heatmap attention ++seq N
-- search again or draw where the decoder looked.
local o = require("rnnlua.cli").parse({
  usage = "rnnlua recipes/g2p_cmudict.lua [++key value ...]",
  about = "Grapheme-to-phoneme conversion with attention on CMUdict (recipes/g2p_cmudict.lua).",
  options = {
    {"minutes", "number", 25, "training budget"},
    {"num_epochs", "integer", 1000, "epochs at most"},
    {"hidden", "integer", 256, "LSTM units (encoder per direction, decoder)"},
    {"emb", "integer", 32, "letter and phoneme embedding size"},
    {"dropout", "number", 0.25, "dropout on the encoder output and the readout (0: none)"},
    {"beam", "integer", 4, "beam size of the test search"},
    {"batch", "integer", 64, "words per batch"},
    {"lr", "number", 1e-3, "Adam's initial learning rate"},
    {"threads", "integer", 2, "CPU threads"},
    {"seed", "integer", 1, "random seed"},
    {"out", "string", "out/g2p", "directory of the model and the search output"},
    {"smoke", "boolean", false, "a tiny subset and model, 4 epochs: seconds"},
  }}, arg)
if o.smoke then o.hidden, o.emb, o.minutes, o.num_epochs, o.beam, o.lr = 16, 8, 5, 4, 2, 1e-2 end
rl.set_num_threads(o.threads)
rl.manual_seed(o.seed)
math.randomseed(o.seed)

local SRC = "/usr/share/festival/dicts/cmu/cmudict-0.4.out"

local function exists(path)
  local f = io.open(path, "rb")
  if f then f:close() end
  return f ~= nil
end

if not exists(SRC) then
  print("g2p: " .. SRC .. " is missing; installing festlex-cmu with apt-get")
  local sudo = io.popen("id -u"):read("*l") == "0" and "" or "sudo -n "
  local ok = os.execute(sudo .. "apt-get install -y --no-install-recommends festlex-cmu "
    .. ">/dev/null 2>&1") or os.execute(sudo .. "apt-get update >/dev/null 2>&1 && " .. sudo
    .. "apt-get install -y --no-install-recommends festlex-cmu >/dev/null 2>&1")
  if not ok or not exists(SRC) then
    error("g2p: could not install the Debian package festlex-cmu (needs root or password-less "
      .. "sudo and a reachable mirror); install it by hand: apt-get install festlex-cmu", 0)
  end
end

---------------------------------------------------------------------------- data

local function fnv1a(s)
  local h = 2166136261
  for k = 1, #s do
    h = ((h ~ s:byte(k)) * 16777619) & 0xffffffff
  end
  return h
end

local words, prons = {}, {} -- word -> list of phoneme lists
for line in io.lines(SRC) do
  local w, _, rest = line:match('^%("([^"]*)"%s+(%S+)%s+(.*)$')
  if w then
    local ph = {}
    for p in rest:gmatch("%a+") do ph[#ph + 1] = p end
    if #ph > 0 then
      if not prons[w] then
        prons[w] = {}
        words[#words + 1] = w
      end
      local key = table.concat(ph, " ")
      local dup = false
      for _, q in ipairs(prons[w]) do dup = dup or table.concat(q, " ") == key end
      if not dup then prons[w][#prons[w] + 1] = ph end
    end
  end
end
table.sort(words)

local split = {train = {}, dev = {}, test = {}}
for _, w in ipairs(words) do
  local r = fnv1a(w) % 100
  local part = r < 90 and "train" or (r < 95 and "dev" or "test")
  table.insert(split[part], w)
end

-- symbols: letters from every word, phonemes from every pronunciation (label 0 = end)
local letters, phones, lidx, pidx = {}, {"</s>"}, {}, {["</s>"] = 0}
for _, w in ipairs(words) do
  for c in w:gmatch(".") do
    if not lidx[c] then letters[#letters + 1] = c; lidx[c] = true end
  end
  for _, ph in ipairs(prons[w]) do
    for _, p in ipairs(ph) do
      if not pidx[p] then phones[#phones + 1] = p; pidx[p] = true end
    end
  end
end
table.sort(letters)
for k, c in ipairs(letters) do lidx[c] = k - 1 end
local sorted = {table.unpack(phones, 2)}
table.sort(sorted)
phones = {"</s>", table.unpack(sorted)}
for k, p in ipairs(phones) do pidx[p] = k - 1 end

if o.smoke then
  for _, part in ipairs({"train", "dev", "test"}) do
    local keep = {}
    for k = 1, math.min(#split[part], part == "train" and 256 or 32) do
      keep[k] = split[part][k * 7 % #split[part] + 1]
    end
    split[part] = keep
  end
end
print(string.format("g2p: %d words (%d train, %d dev, %d test), %d letters, %d phonemes + end",
  #words, #split.train, #split.dev, #split.test, #letters, #phones - 1))

-- training pairs, every pronunciation
local pairs_train = {}
for _, w in ipairs(split.train) do
  for _, ph in ipairs(prons[w]) do pairs_train[#pairs_train + 1] = {w, ph} end
end

-- a batch of words (and, for training, one pronunciation each): data (T, B), classes (S, B)
local function make_batch(items)
  local B, T, S = #items, 0, 0
  for _, it in ipairs(items) do
    T = math.max(T, #it[1])
    if it[2] then S = math.max(S, #it[2] + 1) end
  end
  local x, len = rl.zeros({T, B}, "int32"), rl.zeros({B}, "int32")
  local batch = {data = x, lengths = len}
  local xt, lt = x:totable(), {}
  for b, it in ipairs(items) do
    lt[b] = #it[1]
    for t = 1, #it[1] do xt[t][b] = lidx[it[1]:sub(t, t)] end
  end
  x:copy_(rl.tensor(xt, "int32"))
  len:copy_(rl.tensor(lt, "int32"))
  if S > 0 then
    local yt, ylen = {}, {}
    for t = 1, S do yt[t] = {} for b = 1, B do yt[t][b] = 0 end end
    for b, it in ipairs(items) do
      for t, p in ipairs(it[2]) do yt[t][b] = pidx[p] end
      ylen[b] = #it[2] + 1 -- the end label 0 closes every sequence
    end
    batch.classes = rl.tensor(yt, "int32")
    batch.lengths_classes = rl.tensor(ylen, "int32")
  end
  return batch
end

-- batches of similar input length (sorted, then cut; their order shuffled each epoch)
local function batches_of(list, bsize, shuffle)
  local idx = {}
  for k = 1, #list do idx[k] = k end
  if shuffle then
    for k = #idx, 2, -1 do local j = math.random(k); idx[k], idx[j] = idx[j], idx[k] end
  end
  table.sort(idx, function(a, b)
    local la, lb = #list[a][1], #list[b][1]
    if la ~= lb then return la < lb end
    return a < b
  end)
  local out = {}
  for s = 1, #idx, bsize do
    local items = {}
    for k = s, math.min(s + bsize - 1, #idx) do items[#items + 1] = list[idx[k]] end
    out[#out + 1] = items
  end
  if shuffle then
    for k = #out, 2, -1 do local j = math.random(k); out[k], out[j] = out[j], out[k] end
  end
  return out
end

---------------------------------------------------------------------------- model

local H, E, P = o.hidden, o.emb, o.dropout
if not (P >= 0 and P < 1) then error("++dropout: must lie in [0, 1)", 0) end
local desc = {
  emb_in = {class = "embedding", from = "data", n_out = E},
  fw = {class = "lstm", from = "emb_in", n_out = H},
  bw = {class = "lstm", from = "emb_in", n_out = H, direction = -1},
  enc = {class = "copy", from = {"fw", "bw"}},
  dec = {class = "rec", from = {}, max_seq_len = "T + 5", unit = {
    emb = {class = "embedding", from = "prev:output", n_out = E},
    s = {class = "lstm", from = {"emb", "prev:att"}, n_out = H},
    att = {class = "attention", base = "base:enc", from = "s", kind = "additive", n_att = H},
    readout = {class = "linear", from = {"s", "att"}, n_out = H, activation = "tanh"},
    output_prob = {class = "softmax", from = "readout", loss = "ce", target = "classes"},
    output = {class = "choice", from = "output_prob", target = "classes", beam_size = o.beam},
  }},
}
if P > 0 then -- on the encoder's output (what attention reads) and on the readout
  desc.enc_drop = {class = "dropout", from = "enc", dropout = P}
  desc.dec.unit.att.base = "base:enc_drop"
  desc.dec.unit.readout_drop = {class = "dropout", from = "readout", dropout = P}
  desc.dec.unit.output_prob.from = "readout_drop"
end
local net = rl.network(desc, {data = {dim = #letters, sparse = true},
  classes = {dim = #phones, sparse = true}})
print(string.format("g2p: %d parameters (embedding %d, BLSTM %d x 2, decoder LSTM %d, additive "
  .. "attention, dropout %g, beam %d)", net:num_params(), E, H, H, P, o.beam))
local opt = rl.optimizer({class = "adam", gradient_clip_global_norm = 5}, net:params(),
  net:grads())

---------------------------------------------------------------------------- scoring

-- Adds hypothesis `labels` (phoneme numbers) of word w to sc (rl.scorer): scored against the
-- closest of w's pronunciations.
local function add_score(sc, w, labels)
  local hyp = {}
  for k, v in ipairs(labels) do hyp[k] = phones[v + 1] end
  sc:add(hyp, prons[w])
end

-- PER and WER (percent) of a scorer: phoneme errors per reference phoneme, words with an error.
local function rates(sc)
  local r = sc:result()
  return 100 * r.label_error_rate, 100 * r.seq_error_rate
end

-- PER and WER (percent) of the words in list, decoded with beam k (in memory, net:search).
local function score(list, k)
  local items = {}
  for _, w in ipairs(list) do items[#items + 1] = {w} end
  local sc = rl.scorer()
  for _, chunk in ipairs(batches_of(items, 128, false)) do
    local res = net:search(make_batch(chunk), {beam_size = k, eos = 0})
    for b, it in ipairs(chunk) do add_score(sc, it[1], res[b].labels) end
  end
  return rates(sc)
end

---------------------------------------------------------------------------- training

local dev_sub = {}
for k = 1, math.min(#split.dev, o.smoke and 32 or 1000) do dev_sub[k] = split.dev[k] end
-- the dev subset's words with their first pronunciation, for the dev score
local dev_pairs = {}
for k, w in ipairs(dev_sub) do dev_pairs[k] = {w, prons[w][1]} end
-- cross entropy per phoneme (the end label included) over dev_pairs, teacher forcing
local function dev_score()
  local sum, frames = 0, 0
  for _, items in ipairs(batches_of(dev_pairs, o.batch, false)) do
    sum, frames = sum + net:forward(make_batch(items), {train = false}), frames + net.n_frames
  end
  return sum / math.max(frames, 1)
end
local t0, c0 = rl.clock(), os.clock()
local budget = o.minutes * 60
local lr, best_score, epoch, stop, total_steps = o.lr, math.huge, 0, false, 0
local lr_epochs = 0 -- epochs trained at the current rate
while not stop do
  epoch = epoch + 1
  local sum, frames, steps = 0, 0, 0
  for _, items in ipairs(batches_of(pairs_train, o.batch, true)) do
    local batch = make_batch(items)
    local loss = net:forward(batch)
    net:zero_grads()
    net:backward()
    opt:step(lr)
    sum, frames, steps = sum + loss, frames + net.n_frames, steps + 1
    total_steps = total_steps + 1
    if rl.clock() - t0 > budget then stop = true break end
  end
  local per, dev_ce = score(dev_sub, 1), dev_score()
  print(string.format("epoch %d: %d steps, train loss %.4f per phoneme, dev %.4f, dev PER %.2f%% "
    .. "(greedy, %d words), lr %.2g, %.1f min", epoch, steps, sum / math.max(frames, 1), dev_ce,
    per, #dev_sub, lr, (rl.clock() - t0) / 60))
  lr_epochs = lr_epochs + 1
  if dev_ce < best_score then
    best_score = dev_ce
  elseif not o.smoke and lr_epochs >= 2 and lr > o.lr / 64 then
    lr, lr_epochs = lr / 2, 0
  end
  if epoch >= o.num_epochs then stop = true end
end
local train_min, cpu_min = (rl.clock() - t0) / 60, (os.clock() - c0) / 60

-- the test set through the search task: the model and the test words on disk, the searched
-- phonemes (with the attention weights) in test_hyp.h5, scored in the words' order
os.execute("mkdir -p '" .. o.out:gsub("'", "'\\''") .. "'")
rl.save_checkpoint(o.out .. "/net.h5", {net = net, epoch = epoch, step = total_steps})
local test_seqs = {}
for k, w in ipairs(split.test) do
  local ids = {}
  for c in w:gmatch(".") do ids[#ids + 1] = lidx[c] end
  test_seqs[k] = {tag = w, data = rl.tensor(ids, "int32")}
end
rl.dataset_write(o.out .. "/test.h5", test_seqs,
  {extern_data = {data = {dim = #letters, sparse = true}}, labels = letters})
local found = rl.search{model = net, data = {class = "hdf", files = {o.out .. "/test.h5"}},
  output_file = o.out .. "/test_hyp.h5", beam = o.beam, nbest = true, attention = "att",
  labels = phones,
  max_seqs = 128, batch_size = 128 * 40, log_verbosity = 0}
local sc = rl.scorer()
for k, r in ipairs(found.results) do
  assert(r.tag == split.test[k], "rl.search returns the results in the dataset's order")
  add_score(sc, r.tag, r.labels)
end
local per, wer = rates(sc)
print(string.format("g2p: trained %.1f min wall, %.1f min CPU (%d epochs, %d steps of %d words, "
  .. "%d threads), test set %d words, beam %d", train_min, cpu_min, epoch, total_steps, o.batch,
  o.threads, #split.test, o.beam))
print(string.format("g2p: model %s/net.h5, test words %s/test.h5, searched phonemes (n-best, "
  .. "attention weights) %s/test_hyp.h5", o.out, o.out, o.out))
print(string.format("test PER %.2f%% WER %.2f%%", per, wer))
