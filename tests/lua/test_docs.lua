-- The manual against the code: every layer class the registry knows has a `### \`CLASS\``
-- heading in docs/layers.md, every rl.train config key (rl.train_options, plus the
-- learning-rate keys rl.lr_control takes, rl.lr_control_options) has a `| \`KEY\` |` row in
-- docs/training.md, and every relative link of README.md, bench/README.md and docs/*.md names
-- a file that exists (and, with #anchor, a heading of that file). The lists come from the
-- running library, so a new class or key without its entry fails here.
local H = dofile("tests/lua/harness.lua")
local lfs = require("lfs")

local function read(path)
  local f, err = io.open(path, "rb")
  if not f then error("cannot read " .. tostring(err), 2) end
  local s = f:read("a")
  f:close()
  return s
end

-- Markdown without fenced code blocks and inline code spans, where `](` or a heading-like
-- line is an example, not a link or a heading.
local function prose(text)
  local out, fenced = {}, false
  for line in (text .. "\n"):gmatch("(.-)\n") do
    if line:match("^%s*```") then
      fenced = not fenced
    elseif not fenced then
      out[#out + 1] = line
    end
  end
  return table.concat(out, "\n")
end

-- Names of `list` for which no line of `text` matches `pattern` (its capture is the name).
local function missing(text, list, pattern)
  local have = {}
  for line in (text .. "\n"):gmatch("(.-)\n") do
    local name = line:match(pattern)
    if name then have[name] = true end
  end
  local miss = {}
  for _, n in ipairs(list) do if not have[n] then miss[#miss + 1] = n end end
  return miss
end
local HEADING = "^###%s+`([^`]+)`"      -- ### `CLASS` (anything may follow)
local ROW = "^|%s*`([^`]+)`%s*|"         -- | `KEY` | ...

-- The anchors GitHub gives a file's headings: lower case, without punctuation other than
-- '-' and '_', spaces as '-', a repeated one suffixed -1, -2, ...
local function anchors(text)
  local set, seen = {}, {}
  for line in (prose(text) .. "\n"):gmatch("(.-)\n") do
    local title = line:match("^#+%s+(.-)%s*$")
    if title then
      local a = title:lower():gsub("[^%w%s_-]", ""):gsub("%s", "-")
      local n = seen[a]
      seen[a] = (n or -1) + 1
      set[n and (a .. "-" .. (n + 1)) or a] = true
    end
  end
  return set
end

-- Relative link targets of a Markdown file that name a missing file, or a heading that file
-- does not have (`file#anchor`). Links to other sites, mail addresses and anchors within the
-- same file are not checked.
local function broken_links(path, text, read_file)
  local dir = path:match("^(.*)/[^/]*$") or "."
  local bad = {}
  local body = prose(text):gsub("`[^`\n]*`", "")
  for target in body:gmatch("%]%(([^)%s]+)[^)]*%)") do
    if not target:match("^%a[%w+.-]*:") and not target:match("^#") then
      local file, anchor = target:match("^([^#]*)#?(.*)$")
      local full = dir .. "/" .. file
      if lfs.attributes(full) == nil then
        bad[#bad + 1] = target
      elseif anchor ~= "" and not anchors(read_file(full))[anchor] then
        bad[#bad + 1] = target
      end
    end
  end
  return bad
end

local function docs_files()
  local list = {"README.md", "bench/README.md"}
  for name in lfs.dir("docs") do
    if name:match("%.md$") then list[#list + 1] = "docs/" .. name end
  end
  table.sort(list)
  return list
end

-- The rec layer and the classes only a rec unit takes are built by the network itself
-- (lua/rnnlua/rec.lua), not through the registry; they are documented like the others.
local NETWORK_CLASSES = {"rec", "attention", "choice"}

local function all_classes()
  local list = rl.layers.classes()
  for _, c in ipairs(NETWORK_CLASSES) do list[#list + 1] = c end
  return list
end

local function all_train_keys()
  local list, seen = {}, {}
  for _, src in ipairs({rl.train_options, rl.lr_control_options}) do
    for _, k in ipairs(src) do
      if not seen[k] then seen[k], list[#list + 1] = true, k end
    end
  end
  return list
end

H.test("the checks find what is missing", function()
  local text = "### `lstm`\n```\n### `gru`\n```\n| `num_epochs` | 1 |\n| x | `batch_size` |\n"
  local m = missing(prose(text), {"lstm", "gru"}, HEADING)
  H.check(#m == 1 and m[1] == "gru", "a heading inside a code block does not count")
  m = missing(text, {"num_epochs", "batch_size"}, ROW)
  H.check(#m == 1 and m[1] == "batch_size", "only a row that starts with the key counts")
  local bad = broken_links("docs/x.md", "[a](layers.md) [b](nope.md#x) `[c](no.md)` "
    .. "[d](https://example.org/) [e](#here) [f](../README.md) [g](layers.md#lstm) "
    .. "[h](layers.md#no-such-heading)", read)
  H.check(#bad == 2 and bad[1] == "nope.md#x" and bad[2] == "layers.md#no-such-heading",
    "broken: " .. table.concat(bad, ", "))
  local a = anchors("# A title\n## What rl.train returns\n## Twice\n## Twice\n"
    .. "```\n## In code\n```\n### `lstm`\n")
  H.check(a["what-rltrain-returns"] and a["twice"] and a["twice-1"] and a["lstm"]
    and not a["in-code"] and not a["twice-2"], "anchors as GitHub makes them")
end)

H.test("the registry and the engine give lists to check", function()
  local classes, keys = all_classes(), all_train_keys()
  H.check(#classes >= 10, "only " .. #classes .. " layer classes")
  H.check(#keys >= 20, "only " .. #keys .. " config keys")
  local has = {}
  for _, k in ipairs(keys) do has[k] = true end
  H.check(has.num_epochs and has.newbob_learning_rate_decay, "engine and lr keys are both there")
end)

H.test("every layer class has a heading in docs/layers.md", function()
  local m = missing(prose(read("docs/layers.md")), all_classes(), HEADING)
  H.check(#m == 0, "no `### `CLASS`` heading for: " .. table.concat(m, ", "))
end)

H.test("every rl.train key has a row in docs/training.md", function()
  local m = missing(prose(read("docs/training.md")), all_train_keys(), ROW)
  H.check(#m == 0, "no `| `KEY` |` row for: " .. table.concat(m, ", "))
end)

-- `| `KEY` | DEFAULT |` rows of docs/training.md: key -> default (code spans unquoted); the
-- first row of a key counts (a later section may say more of it).
local function doc_rows(text)
  local rows = {}
  for line in (text .. "\n"):gmatch("(.-)\n") do
    local key, default = line:match("^|%s*`([^`]+)`%s*|%s*(.-)%s*|")
    if key and rows[key] == nil then rows[key] = default:gsub("`", "") end
  end
  return rows
end

H.test("rnnlua.train_keys, docs/training.md and rl.train name the same keys", function()
  local tk = require("rnnlua.train_keys")
  local rows = doc_rows(prose(read("docs/training.md")))
  local code = {}
  for _, k in ipairs(all_train_keys()) do code[k] = true end
  local bad = {}
  for _, e in ipairs(tk.list) do
    if rows[e[1]] == nil then bad[#bad + 1] = e[1] .. ": no row in docs/training.md" end
    if not code[e[1]] then bad[#bad + 1] = e[1] .. ": not a key rl.train takes" end
    if rows[e[1]] and rows[e[1]] ~= e[3] then
      bad[#bad + 1] = string.format("%s: default '%s' in the table, '%s' in the manual", e[1],
        e[3], rows[e[1]])
    end
  end
  for k in pairs(rows) do
    if not tk.by_key[k] then bad[#bad + 1] = k .. ": a row in docs/training.md, not in the table" end
  end
  for k in pairs(code) do
    if not tk.by_key[k] then bad[#bad + 1] = k .. ": rl.train takes it, the table lacks it" end
  end
  table.sort(bad)
  H.check(#bad == 0, table.concat(bad, "; "))
  local r = doc_rows("| `a` | `\"x\"` | y |\n| `b` | 1 | z |\n| `a` | 2 | w |\n")
  H.check(r.a == '"x"' and r.b == "1", "rows: the first of a key, code spans unquoted")
end)

H.test("relative links point at files and headings that exist", function()
  local bad = {}
  for _, path in ipairs(docs_files()) do
    for _, t in ipairs(broken_links(path, read(path), read)) do bad[#bad + 1] = path .. ": " .. t end
  end
  H.check(#bad == 0, "broken links: " .. table.concat(bad, "; "))
end)

H.test("the manual has the map's files and README.md stays short", function()
  local map = read("docs/README.md")
  for name in lfs.dir("docs") do
    if name:match("%.md$") and name ~= "README.md" then
      H.check(map:find("(" .. name .. ")", 1, true), "docs/README.md does not link " .. name)
    end
  end
  local n = select(2, read("README.md"):gsub("\n", ""))
  H.check(n <= 250, "README.md has " .. n .. " lines (at most 250)")
end)

H.done()
