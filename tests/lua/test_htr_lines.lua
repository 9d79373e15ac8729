-- recipes/htr_lines.lua's data (recipes/htr_lines_data.lua): the smoke-sized conversion of the
-- King James Bible lines rendered in Debian's handwriting fonts. Checks the image layout
-- (/seqSizes, heights 32..48, ink in [0, 1]), that the character labels read back to the corpus
-- texts, that the held-out font draws only the test texts and no training line, that no dev or
-- test text is a training line, that the conversion is deterministic and done once, the
-- batches the recipe trains on, its augmentation of the training lines, and that the recipe's
-- smoke mode trains (augmented) and prints its CERs.
local H = dofile("tests/lua/harness.lua")
local D = dofile("recipes/htr_lines_data.lua")
local lfs = require("lfs")

local dir = H.tmpdir()
local rm_rf = H.rm_rf

local opts = D.SMOKE
local info = D.prepare(dir .. "/data", {n_train = opts.n_train, n_dev = opts.n_dev,
  n_test = opts.n_test, part_size = opts.part_size, quiet = true})
local lines = D.lines(1)

-- every sequence of a file: {tag, font, index (0-based), text, h, w, data}
local function read_all(files)
  local ds = rl.dataset{class = "hdf", files = files}
  ds:init_epoch(1)
  local out = {}
  for i = 1, ds:num_seqs() do
    local s = ds:get_seq(i)
    local split, n, font = s.tag:match("^(%a+)%-(%d+):(.+)$")
    out[i] = {tag = s.tag, split = split, index = tonumber(n), font = font, data = s.data,
              text = D.text(info.labels, s.classes), len = s.classes:size(1)}
  end
  return out
end

H.test("files in the image layout: /seqSizes, heights 32..48, ink in [0, 1]", function()
  H.check(#info.train == 2, "24 training lines in parts of 16: two files")
  local files = {info.dev, info.test, info.font, table.unpack(info.train)}
  local want = {opts.n_dev, opts.n_test, opts.n_test, opts.part_size, opts.n_train - opts.part_size}
  for k, path in ipairs(files) do
    local f = rl.h5file(path, "r")
    local sizes, sl, inputs = f:read("seqSizes"), f:read("seqLengths"), f:read("inputs")
    local labels = f:read_strings("targets/labels/classes")
    f:close()
    H.check(sizes:size(1) == want[k] and sizes:size(2) == 2, path .. ": /seqSizes (n, 2)")
    H.check(sl:size(2) == 2, path .. ": /seqLengths has the input and the classes column")
    H.check(table.concat(labels) == D.CHARS, path .. ": label names are the characters")
    local total = 0
    for i = 1, sizes:size(1) do
      local h, w = sizes[i][1], sizes[i][2]
      H.check(h >= 32 and h <= 48, string.format("%s: height %d not in 32..48", path, h))
      H.check(w >= 8, string.format("%s: width %d", path, w))
      H.check(sl[i][1] == h * w, path .. ": /seqLengths column 0 = h * w")
      total = total + h * w
    end
    H.check(inputs:size(1) == total and inputs:size(2) == 1, path .. ": /inputs (sum h w, 1)")
    H.check(inputs:min() >= 0 and inputs:max() <= 1, path .. ": ink in [0, 1]")
    H.check(inputs:max() > 0.5, path .. ": some ink")
  end
end)

H.test("labels read back to the corpus texts; targets have their own lengths", function()
  local first = {test = 0, font = 0, dev = opts.n_test, train = opts.n_test + opts.n_dev}
  for _, files in ipairs({{info.test}, {info.font}, {info.dev}, info.train}) do
    for _, s in ipairs(read_all(files)) do
      local want = lines[first[s.split] + s.index + 1]
      H.check(s.text == want, string.format("%s: labels read %q, the corpus line is %q", s.tag,
        s.text, tostring(want)))
      H.check(s.len == #want and #want >= 4 and #want <= 32, s.tag .. ": target length")
      H.check(s.data:dim() == 3 and s.data:size(3) == 1, s.tag .. ": data (h, w, 1)")
      H.check(s.data:size(2) ~= s.len, s.tag .. ": not frame-aligned")
    end
  end
end)

H.test("one font held out: it draws the test texts, and nothing else uses it", function()
  local train_font = {}
  for _, name in ipairs(info.train_fonts) do
    H.check(name ~= info.held_out_font, "the held-out font is not a training font")
    train_font[name] = true
  end
  local train_text = {}
  for _, files in ipairs({info.train, {info.dev}, {info.test}}) do
    for _, s in ipairs(read_all(files)) do
      H.check(train_font[s.font], s.tag .. ": drawn in a training font")
      if s.split == "train" then train_text[s.text] = true end
    end
  end
  local test = read_all({info.test})
  local font = read_all({info.font})
  H.check(#font == #test, "the held-out font draws every test text")
  for i, s in ipairs(font) do
    H.check(s.font == info.held_out_font, s.tag .. ": drawn in the held-out font")
    H.check(s.text == test[i].text, s.tag .. ": the same text as " .. test[i].tag)
    H.check(not train_text[s.text], s.tag .. ": a held-out text is not a training line")
  end
  for _, s in ipairs(read_all({info.dev})) do
    H.check(not train_text[s.text], s.tag .. ": a dev text is not a training line")
  end
end)

H.test("deterministic from the seed; converted once", function()
  local again = D.prepare(dir .. "/again", {n_train = 1, n_dev = 1, n_test = opts.n_test,
    quiet = true})
  local a, b = rl.h5file(info.test, "r"), rl.h5file(again.test, "r")
  local xa, xb = a:read("inputs"), b:read("inputs")
  H.check(xa:size() == xb:size(), "the same test images from the same seed")
  H.near((xa - xb):abs():max(), 0, 0, "the same pixels")
  H.check(a:read_strings("seqTags")[opts.n_test] == b:read_strings("seqTags")[opts.n_test],
    "the same fonts")
  a:close()
  b:close()
  local stamp = dir .. "/data/DONE"
  lfs.touch(info.test, 1000, 1000) -- a rewrite would give it the current time
  D.prepare(dir .. "/data", {n_train = opts.n_train, n_dev = opts.n_dev, n_test = opts.n_test,
    part_size = opts.part_size, quiet = true})
  H.check(lfs.attributes(info.test, "modification") == 1000, "a second prepare converts nothing")
  H.check(lfs.attributes(stamp, "mode") == "file", "DONE records the configuration")
  local other, same = D.lines(2), 0
  for i = 1, 20 do same = same + (other[i] == lines[i] and 1 or 0) end
  H.check(same < 20, "another seed, other lines")
end)

H.test("image batches with the characters as a padded label sequence", function()
  local ds = rl.dataset{class = "hdf", files = info.train}
  ds:init_epoch(1)
  local seen = 0
  for batch in rl.batches(ds, {batch_size = 48 * 400 * 8, max_seqs = 8}) do
    local B = batch.data:size(3)
    H.check(batch.data:dim() == 4 and batch.sizes:size(1) == B, "data (H, W, B, 1), sizes")
    H.check(batch.lengths_classes:dtype() == "int32", "lengths_classes int32")
    for b = 1, B do
      local s = ds:get_seq(batch.seqs[b])
      H.check(batch.lengths_classes[b] == s.classes:size(1), "lengths_classes = text length")
    end
    seen = seen + B
  end
  H.check(seen == opts.n_train, "every training line in a batch")
end)

H.test("the recipe's augmentation of the training lines: drawn per epoch, ink within [0, 1]",
  function()
    local raw = rl.dataset{class = "hdf", files = info.train}
    local aug = rl.dataset{class = "hdf", files = info.train, augment = D.AUGMENT}
    local again = rl.dataset{class = "hdf", files = info.train, augment = D.AUGMENT}
    raw:init_epoch(1)
    aug:init_epoch(1)
    again:init_epoch(1)
    local changed, resized = 0, 0
    for i = 1, aug:num_seqs() do
      local a, r, b = aug:get_seq(i), raw:get_seq(i), again:get_seq(i)
      H.check(a.data:dim() == 3 and a.data:size(3) == 1, "an image")
      H.check(a.data:min() >= -1e-6 and a.data:max() <= 1 + 1e-6, "ink within [0, 1]")
      H.check(a.data:size(1) == b.data:size(1) and a.data:size(2) == b.data:size(2)
        and (a.data - b.data):abs():max() == 0, "the same epoch gives the same image")
      local same = a.data:size(1) == r.data:size(1) and a.data:size(2) == r.data:size(2)
      if not same then resized = resized + 1 end
      if not same or (a.data - r.data):abs():max() > 0 then changed = changed + 1 end
      H.check(a.tag == r.tag and (a.classes - r.classes):abs():max() == 0, "labels as they were")
    end
    H.check(changed >= aug:num_seqs() - 2, "most lines changed: " .. changed)
    H.check(resized >= aug:num_seqs() // 2, "the affine map resized many: " .. resized)
    aug:init_epoch(2)
    local a2 = aug:get_seq(1).data
    aug:init_epoch(1)
    local a1 = aug:get_seq(1).data
    H.check(a1:size(2) ~= a2:size(2) or (a1 - a2):abs():max() > 0, "epoch 2 draws anew")
  end)

H.test("the recipe's smoke mode trains one epoch and prints both CER lines", function()
  local p = io.popen(string.format("%s recipes/htr_lines.lua ++smoke ++out %s 2>&1", arg[-1], dir))
  local out = p:read("a")
  local ok = p:close()
  H.check(ok, "htr_lines.lua smoke failed:\n" .. out)
  H.check(out:find("epoch   1/1  train score", 1, true), "an epoch line:\n" .. out)
  H.check(out:find("\ntest CER %d+%.%d+%% %(with LM %d+%.%d+%%%)\n"), "the test CER line:\n" .. out)
  H.check(out:find("\nheld%-out font CER %d+%.%d+%% %(with LM %d+%.%d+%%%) %(rufscript%)\n"),
    "the font CER line:\n" .. out)
  H.check(out:find("character 7-gram LM of 3000 lines", 1, true), "the LM line:\n" .. out)
  H.check(not out:find("htr_lines: test:", 1, true), "the data converted above is reused")
  H.check(lfs.attributes(dir .. "/smoke/net.001.h5", "mode") == "file", "a checkpoint")
end)

H.test("the recipe's ++aug_from, ++lr, ++lm and ++freq_warp: a bad value is an error naming the "
  .. "option, before any training", function()
  for _, case in ipairs{{"++aug_from 0", "aug_from= wants a sub-epoch >= 1, got 0"},
      {"++lr 0", "lr= wants a learning rate > 0, got 0"},
      {"++lm -2", "lm= wants an order >= 1 (0: no LM), got -2"},
      {"++freq_warp 0.5", "freq_warp= augment.spec.freq_warp must be in [0, 0.2], got 0.5"}} do
    local p = io.popen(string.format("%s recipes/htr_lines.lua ++smoke ++out %s %s 2>&1", arg[-1],
      dir, case[1]))
    local out = p:read("a")
    local ok = p:close()
    H.check(not ok, case[1] .. " must fail")
    H.check(out:find(case[2], 1, true), case[1] .. ": " .. out)
    H.check(not out:find("epoch +%d+/%d+"), case[1] .. ": trained first: " .. out)
  end
end)

H.expect_error("more lines than the corpus has", function()
  D.prepare(dir .. "/big", {n_train = 10 ^ 7, quiet = true})
end, "distinct ones")

rm_rf(dir)
H.done()
