#!/usr/bin/env bash
# Tests of the rnnlua REPL: driven through a pipe (no line editing, no prompts) and through
# a pseudo-terminal (libedit: prompts, continuation, Tab completion, Ctrl-C, Ctrl-D,
# history), plus the completion candidates of rnnlua.repl.complete called directly.
# Usage: test_repl.sh BIN
set -u
source "${BASH_SOURCE%/*}/lib.sh"

# ---- through a pipe: stdout carries exactly the results, errors go to stderr
repl() { printf "$1" | "$bin" 2>"$tmp/err"; }

check "expression prints its value, no prompt" "2" "$(repl '1+1\n')"
check "several results, tab-separated" "$(printf '1\ta\tnil\ttrue')" "$(repl '1, "a", nil, true\n')"
check "a statement prints nothing; globals persist" "5" "$(repl 'x = 5\nx\n')"
check "a call statement runs once" "hi" "$(repl 'print("hi")\n')"
check "=expr (Lua 5.1-5.3 habit) prints" "9" "$(repl '=3*3\n')"
check "multi-line function, then a call" "12" \
    "$(repl 'function triple(a)\n  local b = a * 3\n  return b\nend\ntriple(4)\n')"
check "a multi-line table constructor" "3" "$(repl 't = {\n1,\n2,\n3\n}\n#t\n')"
out=$(repl 'error("boom")\n2*3\n')
check "after an error the session continues" "6" "$out"
err=$(cat "$tmp/err")
contains "the error is printed" "stdin:1: boom" "$err"
contains "with a traceback" "stack traceback:" "$err"
out=$(repl 'local s = nil .. 1\n"next"\n')
check "a runtime error in a statement, then more" "next" "$out"
contains "the runtime error names the line" "attempt to concatenate" "$(cat "$tmp/err")"
out=$(repl 'x = = 1\n10\n')
check "a syntax error, then more" "10" "$out"
contains "the syntax error is printed" "unexpected symbol" "$(cat "$tmp/err")"
out=$(repl 'function f()\n')
contains "input ending inside a chunk reports <eof>" "<eof>" "$(cat "$tmp/err")"
check "values print with tostring (__tostring)" "<obj 7>" \
    "$(repl 'setmetatable({}, {__tostring = function() return "<obj 7>" end})\n')"
check "tensors print with their __tostring" "$("$bin" -e 'print(rl.tensor{1, 2})')" \
    "$(repl 'rl.tensor{1, 2}\n')"
check "an erroring __tostring is reported, not fatal" "ok" \
    "$(repl 'setmetatable({}, {__tostring = function() error("ts") end})\n"ok"\n')"
# ---- exploring: locals kept across lines, tables shown, help, "did you mean"
check "a top-level local outlives its line" "6" "$(repl 'local x = 5\nx + 1\n')"
check "local a, b = ... too" "3" "$(repl 'local a, b = 1, 2\na + b\n')"
check "local x without a value is nil" "nil" "$(repl 'y = 3\nlocal y\ny\n')"
check "local function" "9" "$(repl 'local function sq(v) return v * v end\nsq(3)\n')"
check "locals inside a block stay local" "true" "$(repl 'do local hidden = 1 end\nhidden == nil\n')"
check "a local inside a function stays local" "nil" \
    "$(repl 'local function f() local inner = 1 return inner end\ninner\n')"
check "a multi-line chunk's locals" "12" "$(repl 'local m =\n12\nm\n')"
check "a table is shown with its contents" "{1, 2, a = {b = 3}, s = \"x\"}" \
    "$(repl '{1, 2, a = {b = 3}, s = "x"}\n')"
check "nesting is cut at three levels" "{a = {b = {c = {...}}}}" "$(repl '{a = {b = {c = {d = 1}}}}\n')"
out=$(repl 't = {} for i = 1, 30 do t[i] = i end\nt\n')
contains "a long table is cut after 20 entries" "... (10 more)" "$out"
check "a cycle is marked" "yes" "$(repl 'c = {} c.me = c\nc\n' | grep -q '^{me = <cycle: table: ' && echo yes)"
check "a tensor inside a table by its summary" "{w = [float32 (2, 3) on cpu]}" "$(repl '{w = rl.zeros(2, 3)}\n')"
check "?rl.zeros shows the signature" "rl.zeros(d1, d2, ... | {shape} [, dtype])" "$(repl '?rl.zeros\n' | head -1)"
check "help(f) by value" "rl.edit_distance(a, b) -> integer" \
    "$(repl 'help(rl.edit_distance)\n' | head -1)"
check "?name misspelt" "rl.tensr: not found; did you mean rl.tensor?" "$(repl '?rl.tensr\n')"
repl 'rl.tensr(1)\n' >/dev/null
contains "did you mean for a misspelt rl function" "did you mean tensor?" "$(cat "$tmp/err")"
repl 'local z = rl.zeros(2)\nz:sizee()\n' >/dev/null
contains "did you mean for a misspelt method" "did you mean size?" "$(cat "$tmp/err")"
printf '#!/usr/bin/env rnnlua\nlocal size = 42\nlocal function twice(v) return 2 * v end\n' >"$tmp/ex.lua"
check "rnnlua -i FILE keeps the file's top-level locals" "84" "$(printf 'twice(size)\n' | "$bin" -i "$tmp/ex.lua" 2>&1)"
printf '\nx = = 1\n' >"$tmp/bad.lua"
printf '1\n' | "$bin" -i "$tmp/bad.lua" >/dev/null 2>"$tmp/err"
contains "rnnlua -i FILE: a syntax error names the file and line" "bad.lua:2: unexpected symbol" "$(cat "$tmp/err")"
check "Ctrl-D (end of input) exits 0" "0" "$(printf '1\n' | "$bin" >/dev/null 2>&1; echo $?)"

# ---- completion candidates, through the function the REPL calls on Tab
cat >"$tmp/complete.lua" <<'LUA'
local complete = require("rnnlua.repl").complete
local function show(word) return table.concat(complete(word), " ") end
local cases = {}
local function case(name, got, want) cases[#cases + 1] = {name, got, want} end

case("string.fo", show("string.fo"), "string.format")
case("globals", show("pri"), "print")
case("keywords", show("whi"), "while")
case("unknown base", show("nosuch.x"), "")
case("not a name", show("1.5"), "")
foo = {bar = {baz = 1, bat = 2, qux = 3}}
case("nested tables", show("foo.bar.ba"), "foo.bar.bat foo.bar.baz")
-- an object: methods inherited through a chain of __index tables, after ":" only callables
local Base = {hello = function() end}
local Class = setmetatable({greet = function() end, count = 0}, {__index = Base})
Class.__index = Class
obj = setmetatable({name = "o"}, Class)
case("methods through __index chain", show("obj:"), "obj:greet obj:hello")
case("fields through __index chain", show("obj."), "obj.count obj.greet obj.hello obj.name")
case("\"_\" names once typed", show("obj._"), "obj.__index")
-- completion never runs user code: an __index function is not called
trap = setmetatable({}, {__index = function() error("completion ran __index") end})
case("no metamethod calls", show("trap.x"), "")
case("string methods after ':'", show("s:up"), "")
s = "text"
case("string value methods", show("s:up"), "s:upper")

-- rl: every candidate is a real field, and the pinned ones are there; internals ("_" names)
-- only after "rl._"
local rlc = complete("rl.")
local want = {}
for k in pairs(rl) do if type(k) == "string" and k:match("^[%a][%w_]*$") then want[#want + 1] = "rl." .. k end end
table.sort(want)
case("rl. gives all fields of rl but the internals", table.concat(rlc, " "), table.concat(want, " "))
case("rl._ gives the internals", complete("rl._ctc")[1], "rl._ctc_beam_search")
local has = {}
for _, c in ipairs(rlc) do has[c] = true end
case("rl. has rl.tensor and rl.zeros", tostring(has["rl.tensor"] and has["rl.zeros"]), "true")
case("rl.layers.re gives rl.layers.register", tostring(has["rl.layers"] and complete("rl.layers.re")[1]),
     "rl.layers.register")

-- a tensor's methods: each candidate is a real method (looked up through the tensor's own
-- __index, whatever it is), and the pinned ones are offered
t = rl.tensor{1, 2, 3}
local tc, all_methods = {}, true
for _, c in ipairs(complete("t:")) do
  tc[c] = true
  if type(t[c:sub(3)]) ~= "function" then all_methods = false end
end
case("tensor t: offers only methods", tostring(all_methods), "true")
case("tensor t: has size, sum, totable", tostring(tc["t:size"] and tc["t:sum"] and tc["t:totable"] or false), "true")
local ts = complete("t:s")
local only_s = #ts > 0
for _, c in ipairs(ts) do if c:sub(1, 3) ~= "t:s" then only_s = false end end
case("tensor t:s filters by prefix", tostring(only_s and #ts < #complete("t:")), "true")
-- a metatable with an __index table (the common case for objects made in Lua)
local Obj = {__index = {area = function() end, scale = function() end}}
box = setmetatable({}, Obj)
case("methods from a metatable's __index table", show("box:"), "box:area box:scale")
-- an __index function with a published __methods table
proxy = setmetatable({}, {__index = function() end, __methods = {alpha = print, beta = 1}})
case("methods from __methods beside an __index function", show("proxy:"), "proxy:alpha")

for _, c in ipairs(cases) do
  if c[2] == c[3] then print("ok   complete: " .. c[1])
  else print(string.format("FAIL complete: %s\n     expected: %q\n     got:      %q", c[1], c[3], c[2])) end
end
LUA
while IFS= read -r line; do
    case "$line" in
        "ok   "*) pass=$((pass + 1)); echo "$line" ;;
        "FAIL "*) fail=$((fail + 1)); echo "$line" ;;
        *) echo "$line" ;;
    esac
done < <("$bin" "$tmp/complete.lua" 2>&1 || echo "FAIL complete.lua did not run to its end")

# ---- through a pseudo-terminal
if ! command -v python3 >/dev/null; then
    bad "pty tests need python3"
else
    mkdir -p "$tmp/home"
    cat >"$tmp/drive_pty.py" <<'PY'
import os, signal, sys, time
import pty_repl as R
from pty_repl import expect, send
exe, home = sys.argv[1], sys.argv[2]
R.start(exe, home)

def result(name, good, detail=b""):
    print(("ok   " if good else "FAIL ") + "pty: " + name)
    if not good:
        print("     output: %r" % (detail or R.buf))

PROMPT = b"\r\n> "
result("banner and prompt", expect(b"> ") is not None)
send(b"1+1\n")
out = expect(PROMPT)
result("1+1 prints 2", out is not None and out.endswith(b"\r\n2"), out)
send(b"function sq(x)\n")
result("continuation prompt", expect(b">> ") is not None)
send(b"  return x * x\nend\n")
expect(PROMPT)
send(b"sq(9)\n")
out = expect(PROMPT)
result("multi-line function, then a call", out is not None and out.endswith(b"\r\n81"), out)
send(b'error("boom")\n')
out = expect(PROMPT)
result("error prints and the prompt returns", out is not None and b"boom" in out and b"stack traceback" in out, out)
send(b"2+2\n")
out = expect(PROMPT)
result("the session continues after an error", out is not None and out.endswith(b"\r\n4"), out)
send(b"string.fo\t\n")
out = expect(PROMPT)
result("Tab completes string.fo to string.format", out is not None and b"function: " in out, out)
send(b"while true do end\n")
time.sleep(0.5)
send(b"\x03")
out = expect(PROMPT)
result("Ctrl-C interrupts a running loop", out is not None and b"interrupted!" in out, out)
send(b"1+2\n")
out = expect(PROMPT)
result("after the interrupt 1+2 answers 3", out is not None and out.endswith(b"\r\n3"), out)
send(b"error_if_run(")
time.sleep(0.3)
send(b"\x03")
cleared = expect(PROMPT)
send(b"10*10\n")
out = expect(PROMPT)
result("Ctrl-C at the prompt clears the line", cleared is not None and out is not None
       and out.endswith(b"\r\n100") and b"error_if_run" not in out, (cleared or b"") + b"|" + (out or b""))
send(b"function never()\n")
expect(b">> ")
time.sleep(0.2)
send(b"\x03")
cleared = expect(PROMPT)
send(b"never == nil\n")
out = expect(PROMPT)
result("Ctrl-C at the continuation prompt drops the chunk", cleared is not None and out is not None
       and out.endswith(b"\r\ntrue"), (cleared or b"") + b"|" + (out or b""))
send(b"local kept = 7\n")
expect(PROMPT)
send(b"kept * 2\n")
out = expect(PROMPT)
result("a local typed at the prompt is kept", out is not None and out.endswith(b"\r\n14"), out)
send(b"?rl.zeros\n")
out = expect(PROMPT)
result("?rl.zeros shows the signature", out is not None and b"rl.zeros(d1, d2" in out, out)
send('#"äøé€"\n'.encode())
out = expect(PROMPT)
result("non-ASCII characters are text (libedit took 128-255 as Meta keys)",
       out is not None and out.endswith(b"\r\n9"), out)
send(b'\xf8"\n')
expect(PROMPT)
send(b"5+5\n")
out = expect(PROMPT)
result("Meta-x as an 8-bit byte, then a quote: no crash", out is not None and out.endswith(b"\r\n10"), out)
time.sleep(0.2)
send(b"\x04")
status = None
end = time.time() + 5
while time.time() < end:
    try:
        os.read(R.fd, 4096)
    except OSError:
        pass
    p, st = os.waitpid(R.pid, os.WNOHANG)
    if p:
        status = st
        break
    time.sleep(0.05)
if status is None:
    os.kill(R.pid, signal.SIGKILL)
result("Ctrl-D exits with status 0", status is not None and os.WIFEXITED(status) and os.WEXITSTATUS(status) == 0)
try:
    hist = open(os.path.join(home, ".rnnlua_history"), "rb").read()
except OSError:
    hist = b""
result("history saved to ~/.rnnlua_history", b"sq(9)" in hist and b"1+1" in hist, hist)
PY
    while IFS= read -r line; do
        case "$line" in
            "ok   "*) pass=$((pass + 1)); echo "$line" ;;
            "FAIL "*) fail=$((fail + 1)); echo "$line" ;;
            *) echo "$line" ;;
        esac
    done < <(PYTHONPATH="$repo/tests/sh" timeout 60 python3 "$tmp/drive_pty.py" "$bin" "$tmp/home" 2>&1 || echo "FAIL pty driver did not finish")
fi

finish
