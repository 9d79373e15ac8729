#!/usr/bin/env bash
# Tests of the rnnlua host program (lua/rnnlua.c) and of the embedded Lua library
# (lua/embed.c): options, the arg table, errors and tracebacks, exit codes, the preloads
# (lfs, rnnlua as `rl`), the package searcher and RNNLUA_LUA_DIR. Usage: test_host.sh BIN
set -u
source "${BASH_SOURCE%/*}/lib.sh"

# --version: the format, and the number from the one place it is written
want=$(sed -n 's/^#define RL_VERSION "\(.*\)"$/\1/p' "$repo/lua/version.h")
out=$("$bin" --version); rc=$?
check "--version exit code" 0 "$rc"
if [[ "$out" =~ ^rnnlua\ ([0-9]+\.[0-9]+\.[0-9]+)\ \(Lua\ 5\.4\.[0-9]+\)$ ]] && [ "${BASH_REMATCH[1]}" == "$want" ]; then
    ok "--version prints 'rnnlua $want (Lua 5.4.N)'"
else
    bad "--version format" "got: $out" "want: rnnlua $want (Lua 5.4.N)"
fi
check "-v is --version" "$out" "$("$bin" -v)"

# --help names every option and the environment variable
out=$("$bin" --help); rc=$?
check "--help exit code" 0 "$rc"
missing=""
for w in "-e CODE" "-l NAME" " -i " "--version" "--help" " -- " " - " RNNLUA_LUA_DIR "usage: rnnlua"; do
    [[ "$out" == *"$w"* ]] || missing="$missing [$w]"
done
check "--help lists the options and RNNLUA_LUA_DIR" "" "$missing"

# unknown options are usage errors
out=$("$bin" -x 2>&1); rc=$?
check "unknown option exits 1" 1 "$rc"
contains "unknown option is named" "unrecognized option '-x'" "$out"
contains "unknown option prints usage" "usage: rnnlua" "$out"
out=$("$bin" -e 2>&1); rc=$?
check "-e without its argument exits 1" 1 "$rc"

# -e, repeatable and in order; -eCODE; -l
check "-e runs code" "2" "$("$bin" -e 'print(1+1)')"
check "-e is repeatable, in order" "x=1 y=2" "$("$bin" -e 'x=1' -e 'y=x+1' -e 'print("x="..x.." y="..y)')"
check "-eCODE form" "7" "$("$bin" '-eprint(7)')"
check "-l requires into a global" "function" "$("$bin" -l lfs -e 'print(type(lfs.currentdir))')"

# a script with arguments: the arg table and `...`
cat >"$tmp/args.lua" <<'LUA'
print(arg[0], #arg, arg[1], arg[2], arg[3])
print(select("#", ...), ...)
print(arg[-1] == nil and "no-interp" or arg[-1]:match("[^/]*$"))
LUA
out=$("$bin" "$tmp/args.lua" a "b c" -e)
check "script sees arg[0..n], ... and arg[-1]" \
    "$tmp/args.lua	3	a	b c	-e
3	a	b c	-e
$(basename "$bin")" "$out"
out=$("$bin" -e 'x=5' "$tmp/args.lua" z)
contains "options before the script sit at negative indices" "$tmp/args.lua	1	z" "$out"
check "with no script, arg[0] is the interpreter (as in lua.c)" "$(basename "$bin") -e" \
    "$("$bin" -e 'print(arg[0]:match("[^/]*$") .. " " .. arg[1])')"
check "-- ends the options" "$tmp/args.lua	1	-x	nil	nil" "$("$bin" -- "$tmp/args.lua" -x | head -n 1)"

# - runs stdin; -i continues in the REPL (reading the pipe when stdin is not a terminal)
check "- runs stdin as a script" "from stdin 1" "$(echo 'print("from stdin " .. select("#", ...))' | "$bin" - x)"
check "-i opens the REPL after the script" "42" "$(echo 'answer' | "$bin" -i -e 'answer = 42')"

# exit codes
"$bin" -e 'os.exit(3)'; check "os.exit code passes through" 3 "$?"
"$bin" -e 'x = 1' >/dev/null 2>&1; check "a good chunk exits 0" 0 "$?"

# an error in a script: exit 1, "rnnlua: <msg>" and a traceback naming the file and line
cat >"$tmp/err.lua" <<'LUA'
local function inner(x)
  error("bad thing " .. x)
end
local function outer() inner(7) end
outer()
LUA
err=$("$bin" "$tmp/err.lua" 2>&1 >/dev/null); rc=$?
check "script error exits 1" 1 "$rc"
check "error message line" "rnnlua: $tmp/err.lua:2: bad thing 7" "$(echo "$err" | head -n 1)"
contains "traceback header" "stack traceback:" "$err"
contains "traceback names the caller's line" "$tmp/err.lua:4: in " "$err"
contains "traceback names the main chunk" "$tmp/err.lua:5: in main chunk" "$err"
# an error of the library called from a script: "rnnlua: FILE:LINE: what", the script's own line
# first, no positions or traceback of rnnlua's own modules (RNNLUA_TRACEBACK=1 shows them)
cat >"$tmp/lib.lua" <<'LUA'
local desc = {output = {class = "lstm", n_out = 2, from = "nope"}}
local net = rl.network(desc, {data = {dim = 2}})
LUA
err=$("$bin" "$tmp/lib.lua" 2>&1 >/dev/null); rc=$?
check "library error exits 1" 1 "$rc"
check "library error: the user's line first, one line" \
    "rnnlua: $tmp/lib.lua:2: layer 'output' (class lstm): unknown from 'nope' (layers: output; inputs: data)" "$err"
err=$(RNNLUA_TRACEBACK=1 "$bin" "$tmp/lib.lua" 2>&1 >/dev/null)
contains "RNNLUA_TRACEBACK=1: the full traceback" "lua/rnnlua/network.lua:" "$err"
err=$("$bin" -e 'error({})' 2>&1); rc=$?
check "non-string error object exits 1" 1 "$rc"
contains "non-string error object is described" "(error object is a table value)" "$err"
err=$("$bin" -e 'error(setmetatable({}, {__tostring = function() return "custom" end}))' 2>&1)
contains "error object with __tostring" "rnnlua: custom" "$err"
printf 'x = = 1\n' >"$tmp/syntax.lua"
err=$("$bin" "$tmp/syntax.lua" 2>&1); rc=$?
check "syntax error exits 1" 1 "$rc"
contains "syntax error names file and line" "$tmp/syntax.lua:1:" "$err"
err=$("$bin" -e 'print(1)' -e 'error("second")' -e 'print(3)' 2>&1); rc=$?
check "a failing -e stops the run" "1 1" "$rc $(echo "$err" | grep -c '^[13]$')"

# a missing script
err=$("$bin" "$tmp/no/such.lua" 2>&1); rc=$?
check "missing script exits 1" 1 "$rc"
contains "missing script is named" "rnnlua: cannot open $tmp/no/such.lua" "$err"

# the preloads
check "require 'lfs' works" "$tmp" "$(cd "$tmp" && "$bin" -e 'print(require("lfs").currentdir())')"
check "rl is the rnnlua module table" "table true function" \
    "$("$bin" -e 'print(type(rl), rl == require("rnnlua"), type(rl.tensor))' | tr '\t' ' ')"

# the embedded library: found from any directory, chunks named after their source files
check "embedded module loads outside the repo" "function @lua/rnnlua/repl.lua" \
    "$(cd "$tmp" && "$bin" -e 'local f = require("rnnlua.repl").complete; print(type(f) .. " " .. debug.getinfo(f, "S").source)')"
check "the searcher sits right after preload" "true" \
    "$("$bin" -e 'print(package.searchers[2]("rnnlua.repl") ~= nil and #package.searchers == 5)')"
err=$("$bin" -e 'require("rnnlua.no_such_module")' 2>&1)
contains "a missing rnnlua.* module is explained" "no embedded module 'rnnlua.no_such_module'" "$err"
err=$("$bin" -e 'require("no_such_plain_module")' 2>&1)
contains "other modules go to the standard searchers" "no field package.preload['no_such_plain_module']" "$err"

# RNNLUA_LUA_DIR: the library from a source tree; same naming rule as the embedding
dev="$tmp/dev"
mkdir -p "$dev/lua" "$dev/layers"
cp -r "$repo/lua/rnnlua" "$dev/lua/"
cp "$repo"/layers/*.lua "$dev/layers/" 2>/dev/null
echo 'return "hello from dir"' >"$dev/lua/rnnlua/hello.lua"
mkdir -p "$dev/lua/rnnlua/sub"
echo 'return "nested"' >"$dev/lua/rnnlua/sub/deep.lua"
echo 'return "a layer"' >"$dev/layers/dirlayer.lua"
check "RNNLUA_LUA_DIR loads rnnlua.X from DIR/lua/rnnlua/X.lua" "hello from dir" \
    "$(RNNLUA_LUA_DIR="$dev" "$bin" -e 'print((require("rnnlua.hello")))')"
check "RNNLUA_LUA_DIR: rnnlua.a.b from lua/rnnlua/a/b.lua" "nested" \
    "$(RNNLUA_LUA_DIR="$dev" "$bin" -e 'print((require("rnnlua.sub.deep")))')"
check "RNNLUA_LUA_DIR: rnnlua.layers.X from layers/X.lua" "a layer" \
    "$(RNNLUA_LUA_DIR="$dev" "$bin" -e 'print((require("rnnlua.layers.dirlayer")))')"
check "RNNLUA_LUA_DIR replaces the embedded copy" "@$dev/lua/rnnlua/repl.lua" \
    "$(RNNLUA_LUA_DIR="$dev" "$bin" -e 'print(debug.getinfo(require("rnnlua.repl").complete, "S").source)')"
err=$(RNNLUA_LUA_DIR="$dev" "$bin" -e 'require("rnnlua.absent")' 2>&1)
contains "RNNLUA_LUA_DIR: a missing file is named" "no file '$dev/lua/rnnlua/absent.lua' (RNNLUA_LUA_DIR)" "$err"
echo 'return = 1' >"$dev/lua/rnnlua/broken.lua"
err=$(RNNLUA_LUA_DIR="$dev" "$bin" -e 'require("rnnlua.broken")' 2>&1); rc=$?
contains "RNNLUA_LUA_DIR: a syntax error names the file" "$dev/lua/rnnlua/broken.lua:1:" "$err"
check "without RNNLUA_LUA_DIR the dir is not read" "false" \
    "$(cd "$dev" && "$bin" -e 'print(pcall(require, "rnnlua.hello"))' | cut -f1)"

# the embed tool: naming rule, rejected paths, and byte-exact contents through the lookup
embed="$(dirname "$bin")/embed"
if [ -x "$embed" ] && command -v cc >/dev/null; then
    e="$tmp/embed"
    mkdir -p "$e/lua/rnnlua/deep" "$e/layers" "$e/other"
    printf 'return 1\n' >"$e/lua/rnnlua/init.lua"
    printf 'a\000b\377c"\\\n' >"$e/lua/rnnlua/deep/bin.lua"
    printf '' >"$e/layers/empty.lua"
    printf 'x' >"$e/other/x.lua"
    (cd "$e" && "$embed" out.c lua/rnnlua/init.lua layers/empty.lua lua/rnnlua/deep/bin.lua)
    check "embed exits 0" 0 "$?"
    cat >"$e/main.c" <<'C'
#include <stdio.h>
#include <string.h>
#include "lua/embedded.h"
int main(int argc, char **argv) {
    size_t n, len = 99;
    const rl_embedded_file *f = rl_embedded_list(&n);
    for (size_t i = 0; i < n; i++) printf("%s=%s:%zu ", f[i].module, f[i].path, f[i].len);
    printf("| %s\n", rl_embedded_find("rnnlua.nope", &len) ? "found" : "none");
    const char *b = rl_embedded_find(argv[1], &len);
    if (!b || b[len] != '\0') return 2;
    fwrite(b, 1, len, stderr);
    return 0;
}
C
    if cc -std=c11 -I"$repo" -o "$e/main" "$e/main.c" "$e/out.c" 2>"$e/cc.log"; then
        out=$("$e/main" rnnlua.deep.bin 2>"$e/got.bin")
        check "embed names modules by the rule, sorted" \
            "rnnlua.deep.bin=lua/rnnlua/deep/bin.lua:8 rnnlua.init=lua/rnnlua/init.lua:9 rnnlua.layers.empty=layers/empty.lua:0 | none" "$out"
        if cmp -s "$e/got.bin" "$e/lua/rnnlua/deep/bin.lua"; then ok "embedded bytes are exact (NUL, 0xff, quotes)"; else bad "embedded bytes differ"; fi
    else
        bad "generated embedded.c compiles" "$(cat "$e/cc.log")"
    fi
    (cd "$e" && "$embed" out2.c other/x.lua 2>/dev/null)
    check "embed rejects a file outside lua/ and layers/" 1 "$?"
    mkdir -p "$e/lua/rnnlua/layers" && printf '' >"$e/lua/rnnlua/layers/empty.lua"
    (cd "$e" && "$embed" out3.c layers/empty.lua lua/rnnlua/layers/empty.lua 2>/dev/null)
    check "embed rejects two files of one module" 1 "$?"
    [ ! -e "$e/out3.c" ] && ok "a failed embed leaves no output" || bad "a failed embed left out3.c"
else
    echo "skip embed tool tests (no $embed or no cc)"
fi

finish
