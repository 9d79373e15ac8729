-- Handwritten text lines for recipes/htr_lines.lua: returns a table with
--   prepare(out_dir, opts) -> info {train = {files}, dev =, test =, font = (file names),
--                                   labels = {characters}, held_out_font =, train_fonts = {...}}
--   text(labels, t)        -> the string of a (L) int32 label tensor (0-based, as in the files)
--   lines(seed)            -> the corpus' distinct line texts in their seeded order
--   FONTS, HELD_OUT, CHARS, SMOKE (the smoke mode's opts), AUGMENT (the training lines')
--
-- Corpus: the King James Bible of Debian's bible-kjv packages (`bible -f Gen1:1-Rev22:21`, one
-- verse per line). Each verse is cut at word boundaries into lines of at most 14..32 characters
-- (drawn per line) and of at least 4; repeated texts are dropped, the rest shuffled (seed). The
-- first n_test texts are the test lines, the next n_dev the dev lines, the rest the training
-- pool, so no text of dev or test is a training line.
--
-- Fonts (Debian's handwriting fonts; see FONTS): every training, dev and test line is drawn in one
-- of the training fonts (chosen per line); the held-out font draws the test texts again (its own
-- augmentation), so "test" and "font" differ only in the font. The training fonts are many
-- typefaces, from print-like hands to joined scripts and a brush, because an unseen hand is read
-- only as well as the variety of hands seen: 15 fonts (12 typefaces) took the held-out font's
-- CER from 19.3% to 14.6% where 8 fonts (5 typefaces) trained as long (docs/recipes.md).
-- Excluded: fonts-bwht and fonts-humor-sans, whose lower case letters are small capitals (the
-- case cannot be read), fonts-levien-typoscript (it lacks most of CHARS), other weights of a
-- font already in (near copies).
--
-- Rendering: recipes/htr_render.py with Debian's python3 and python3-pil (FreeType), which draws
-- each line from its own seed (slant, stretch, stroke width, word baseline jitter, spacing, blur,
-- ink and paper levels, noise; height 32..48 pixels).
--
-- Files (out_dir, converted once; out_dir/DONE records the configuration and is written last):
--   train-N.h5 (parts of at most part_size lines), dev.h5, test.h5, font.h5
-- in the image layout of lua/rnnlua/datasets.lua: data (h, w, 1) = ink 0..1 per pixel with
-- /seqSizes, and target "classes" (sparse, dim #CHARS) = the line's characters, a sequence of its
-- own length (/seqLengths column 1), names in /targets/labels/classes. Tags "<split>-<n>:<font>".
--
-- opts: n_train (default 12000), n_dev (300), n_test (1000), seed (1), part_size (2000),
-- quiet (no progress lines). Missing Debian packages are installed with apt-get (as root or
-- through sudo -n); when that fails, the error names the packages to install by hand.
local M = {}

M.CHARS = " abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ,.:;?'!()-"

local TT, OT = "/usr/share/fonts/truetype/", "/usr/share/fonts/opentype/"
M.FONTS = {
  {name = "dkg", package = "fonts-dkg-handwriting", file = TT .. "fifthhorseman/dkg.ttf"},
  {name = "dkg-italic", package = "fonts-dkg-handwriting", file = TT .. "fifthhorseman/dkgIt.ttf"},
  {name = "dkg-bold", package = "fonts-dkg-handwriting", file = TT .. "fifthhorseman/dkgBd.ttf"},
  {name = "breip", package = "fonts-breip", file = TT .. "breip/Breip.ttf"},
  {name = "femkeklaver", package = "fonts-femkeklaver", file = TT .. "femkeklaver/femkeklaver.ttf"},
  {name = "kristi", package = "fonts-kristi", file = TT .. "kristi/Kristi.ttf"},
  {name = "comic-neue", package = "fonts-comic-neue",
   file = OT .. "comic-neue/ComicNeue-Regular.otf"},
  {name = "comic-neue-italic", package = "fonts-comic-neue",
   file = OT .. "comic-neue/ComicNeue-Italic.otf"},
  {name = "dancingscript", package = "fonts-dancingscript",
   file = OT .. "dancingscript/DancingScript-Regular.otf"},
  {name = "kaushanscript", package = "fonts-kaushanscript",
   file = OT .. "kaushanscript/KaushanScript-Regular.otf"},
  {name = "havana", package = "fonts-havana", file = OT .. "havana/Havana-Regular.otf"},
  {name = "ecolier", package = "fonts-ecolier-court",
   file = TT .. "ecolier-court/Ecolier-court.ttf"},
  {name = "cabinsketch", package = "fonts-cabinsketch",
   file = TT .. "cabinsketch/CabinSketch-Regular.ttf"},
  {name = "seto", package = "fonts-seto", file = TT .. "seto/setofont.ttf"},
  {name = "klee", package = "fonts-klee", file = TT .. "klee/KleeOne-Regular.ttf"},
  {name = "rufscript", package = "fonts-rufscript", file = TT .. "rufscript/Rufscript010.ttf"},
}
M.HELD_OUT = "rufscript"

-- The training lines' augmentation on the fly (the dataset's augment option, drawn anew each
-- sub-epoch; lua/rnnlua/augment.lua): a slant of up to +-0.3 (about 17 degrees), size +-10%,
-- rotation up to +-1 degree, a gentle elastic distortion, strokes a pixel thicker or thinner on
-- a third of the lines, and SpecAugment's masks kept narrower than a character (the image's
-- height as its frequency axis). The recipe trains with it unless ++augment 0.
M.AUGMENT = {
  affine = {p = 0.8, shear = 0.3, scale = 0.1, rotate = 1},
  elastic = {p = 0.5, alpha = 1, sigma = 5},
  stroke = {p = 0.3, radius = 1},
  spec = {p = 0.5, time_masks = 2, time_width = 5, freq_masks = 1, freq_width = 4},
}

-- The smoke mode's data (tests/lua/test_htr_lines.lua, `htr_lines.lua smoke`): two train parts.
M.SMOKE = {n_train = 24, n_dev = 4, n_test = 6, part_size = 16}

local PYTHON = "/usr/bin/python3" -- Debian's, the one python3-pil is installed for
local BIBLE = "/usr/bin/bible"
local RENDER = "recipes/htr_render.py"

local function fail(fmt, ...) error("htr_lines: " .. string.format(fmt, ...), 0) end

local function exists(path)
  local f = io.open(path, "rb")
  if f then f:close() end
  return f ~= nil
end

local function shell_quote(s) return "'" .. s:gsub("'", "'\\''") .. "'" end

local function ensure_packages()
  local need, seen = {}, {}
  local function want(pkg, ok)
    if not ok and not seen[pkg] then need[#need + 1], seen[pkg] = pkg, true end
  end
  want("python3-pil", os.execute(PYTHON .. " -c 'import PIL, numpy' >/dev/null 2>&1"))
  want("python3-numpy", os.execute(PYTHON .. " -c 'import numpy' >/dev/null 2>&1"))
  want("bible-kjv", exists(BIBLE) and exists("/usr/lib/bible.data"))
  for _, f in ipairs(M.FONTS) do want(f.package, exists(f.file)) end
  if #need == 0 then return end
  local list = table.concat(need, " ")
  print("htr_lines: installing the missing Debian packages " .. list .. " with apt-get")
  local sudo = io.popen("id -u"):read("*l") == "0" and "" or "sudo -n "
  local install = sudo .. "apt-get install -y --no-install-recommends " .. list
    .. " >/dev/null 2>&1"
  local ok = os.execute(install)
    or os.execute(sudo .. "apt-get update >/dev/null 2>&1 && " .. install)
  if not ok then
    fail("could not install the Debian packages %s (needs root or password-less sudo and a "
      .. "reachable mirror); install them by hand: apt-get install %s", list, list)
  end
end

-- The corpus as a list of distinct line texts in a seeded random order (kept per seed: the
-- callers must not change it).
local corpus = {}
function M.lines(seed)
  if corpus[seed] then return corpus[seed] end
  local p = io.popen(BIBLE .. " -f Gen1:1-Rev22:21 2>/dev/null", "r")
  local verses = p:read("a")
  p:close()
  local rng = require("rnnlua.datasets").new_rng(seed, 0x4854)
  local lines, seen = {}, {}
  local function emit(words)
    local s = table.concat(words, " ")
    if #s >= 4 and not seen[s] then
      seen[s] = true
      lines[#lines + 1] = s
    end
  end
  local n_verses = 0
  local foreign = "[^%a ,.:;?'!()%-]" -- not in CHARS (%a: a set of 52 is slow to scan)
  for verse in verses:gmatch("[^\n]+") do
    local text = verse:match("^%S+%d:%d+ (.+)$") -- "Ge1:1 In the beginning ..."
    if text and not text:find(foreign) then
      n_verses = n_verses + 1
      local words, len, max_len = {}, 0, rng:int(14, 32)
      for w in text:gmatch("%S+") do
        if #words > 0 and len + 1 + #w > max_len then
          emit(words)
          words, len, max_len = {}, 0, rng:int(14, 32)
        end
        if #w <= max_len then
          words[#words + 1] = w
          len = len + (#words > 1 and 1 or 0) + #w
        end
      end
      if #words > 0 then emit(words) end
    end
  end
  if n_verses < 30000 then
    fail("%s gave %d verses, expected the 31102 of the King James Bible", BIBLE, n_verses)
  end
  local perm = rng:permutation(#lines)
  local out = {}
  for i, j in ipairs(perm) do out[i] = lines[j] end
  corpus[seed] = out
  return out
end

function M.text(labels, t)
  local s = {}
  for i = 1, t:size(1) do s[i] = labels[t[i] + 1] end
  return table.concat(s)
end

-- Renders the jobs {seed =, font =, text =, tag =} of every set {jobs =, files =, part_size =}
-- in one run of the renderer and writes each set's files of at most part_size lines each.
local function render(sets, out_dir)
  local label = {}
  for i = 1, #M.CHARS do label[M.CHARS:sub(i, i)] = i - 1 end
  local labels = {}
  for i = 1, #M.CHARS do labels[i] = M.CHARS:sub(i, i) end
  local jobs_file, bin_file = out_dir .. "/render.jobs", out_dir .. "/render.bin"
  local f = assert(io.open(jobs_file, "w"))
  for _, s in ipairs(sets) do
    for _, j in ipairs(s.jobs) do
      f:write(string.format("%d\t%s\t%s\n", j.seed, j.font.file, j.text))
    end
  end
  f:close()
  local ok = os.execute(string.format("%s %s %s %s", PYTHON, RENDER, shell_quote(jobs_file),
    shell_quote(bin_file)))
  if not ok then fail("%s %s failed (see its message above)", PYTHON, RENDER) end
  local bin = assert(io.open(bin_file, "rb"))
  for _, s in ipairs(sets) do
    local jobs = s.jobs
    for p, path in ipairs(s.files) do
      local w = rl.hdf_writer(path, {data_dim = 1, spatial = 2,
        targets = {classes = {dim = #M.CHARS, sparse = true}}, target_labels = {classes = labels}})
      for n = (p - 1) * s.part_size + 1, math.min(#jobs, p * s.part_size) do
        local j = jobs[n]
        local head = bin:read(8)
        if not head or #head < 8 then fail("%s: ends before image %s", bin_file, j.tag) end
        local h, wd = string.unpack("<I4I4", head)
        local px = bin:read(h * wd)
        if not px or #px < h * wd then fail("%s: image %s is cut short", bin_file, j.tag) end
        local img = rl.tensor({px:byte(1, -1)}):mul_(1 / 255):view(h, wd, 1)
        local y = {}
        for i = 1, #j.text do y[i] = label[j.text:sub(i, i)] end
        w:add(j.tag, img, {classes = rl.tensor(y, "int32")})
      end
      w:close()
    end
  end
  bin:close()
  os.remove(jobs_file)
  os.remove(bin_file)
end

function M.prepare(out_dir, opts)
  opts = opts or {}
  local n_train, n_dev, n_test = opts.n_train or 12000, opts.n_dev or 300, opts.n_test or 1000
  local seed, part_size = opts.seed or 1, opts.part_size or 2000
  local say = opts.quiet and function() end or print
  local train_fonts, held
  train_fonts = {}
  for _, f in ipairs(M.FONTS) do
    if f.name == M.HELD_OUT then held = f else train_fonts[#train_fonts + 1] = f end
  end
  local labels = {}
  for i = 1, #M.CHARS do labels[i] = M.CHARS:sub(i, i) end
  local info = {train = {}, dev = out_dir .. "/dev.h5", test = out_dir .. "/test.h5",
    font = out_dir .. "/font.h5", labels = labels, held_out_font = held.name, train_fonts = {}}
  for i, f in ipairs(train_fonts) do info.train_fonts[i] = f.name end
  local n_parts = (n_train + part_size - 1) // part_size
  for p = 1, n_parts do info.train[p] = string.format("%s/train-%d.h5", out_dir, p) end

  local config = string.format("n_train=%d n_dev=%d n_test=%d seed=%d part_size=%d fonts=%s",
    n_train, n_dev, n_test, seed, part_size,
    table.concat(info.train_fonts, ",") .. "|" .. held.name)
  local util = require("rnnlua.util")
  if util.made_with(out_dir, config) then return info end

  local t0 = rl.clock()
  assert(util.mkdir_p(out_dir))
  os.remove(out_dir .. "/DONE")
  ensure_packages()
  local lines = M.lines(seed)
  if n_test + n_dev + n_train > #lines then
    fail("asked for %d lines, the corpus has %d distinct ones", n_test + n_dev + n_train, #lines)
  end
  local rng = require("rnnlua.datasets").new_rng(seed, 0x464F4E54)
  local function jobs_of(split, first, n, font_of)
    local jobs = {}
    for i = 1, n do
      local f = font_of()
      jobs[i] = {seed = rng:int(0, 0x7FFFFFFF), font = f, text = lines[first + i - 1],
                 tag = string.format("%s-%d:%s", split, i - 1, f.name)}
    end
    return jobs
  end
  local any = function() return train_fonts[rng:int(1, #train_fonts)] end
  local sets = {
    {name = "test", jobs = jobs_of("test", 1, n_test, any), files = {info.test}},
    {name = "font", jobs = jobs_of("font", 1, n_test, function() return held end),
     files = {info.font}},
    {name = "dev", jobs = jobs_of("dev", n_test + 1, n_dev, any), files = {info.dev}},
    {name = "train", jobs = jobs_of("train", n_test + n_dev + 1, n_train, any),
     files = info.train, part_size = part_size},
  }
  for _, s in ipairs(sets) do s.part_size = s.part_size or #s.jobs end
  render(sets, out_dir)
  for _, s in ipairs(sets) do
    say(string.format("htr_lines: %s: %d lines in %d file(s)", s.name, #s.jobs, #s.files))
  end
  util.mark_made(out_dir, config)
  say(string.format("htr_lines: data ready in %s (%.1f s)", out_dir, rl.clock() - t0))
  return info
end

return M
