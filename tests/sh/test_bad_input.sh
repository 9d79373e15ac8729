#!/usr/bin/env bash
# Bad input through the command line and the REPL (tests/lua/test_bad_input.lua covers the
# library): each case must end with a clear error that names what was wrong, a non-zero exit
# where a run fails, and never a crash (a signal), a hang or a silent success.
# Usage: test_bad_input.sh BIN
set -u
source "${BASH_SOURCE%/*}/lib.sh"

# fails NAME NEEDLE CMD...: CMD exits 1 (an error, not a signal or a timeout) within 60 s and
# its stderr names NEEDLE.
fails() {
    local name=$1 needle=$2
    shift 2
    timeout 60 "$@" >"$tmp/out" 2>"$tmp/err" </dev/null
    local rc=$?
    local err
    err=$(cat "$tmp/err")
    if [ "$rc" -ne 1 ]; then
        bad "$name" "exit status $rc (want 1)" "$err"
    elif [[ "$err" != *"$needle"* ]]; then
        bad "$name" "no $(printf %q "$needle") in:" "$err"
    else
        ok "$name"
    fi
}

# ---- a save on a full disk (a file size limit, SIGXFSZ ignored: writes fail with EFBIG) leaves
# the previous checkpoint as it was and no temporary file; the failed close inside libhdf5 made
# the process crash at exit (SIGSEGV in libhdf5's exit-time cleanup) before
"$bin" -e "
local ext = {data = {dim = 3}, classes = {dim = 2, sparse = true}}
rl.save_checkpoint('$tmp/full.h5', {net = rl.network({output = {class = 'softmax', loss = 'ce',
  target = 'classes'}}, ext), epoch = 1})" >"$tmp/out" 2>&1
cp "$tmp/full.h5" "$tmp/full.before"
fails "a save on a full disk is an error naming the file and the cause" \
    "rl.save_checkpoint: $tmp/full.h5: closing $tmp/full.h5.tmp." \
    bash -c "ulimit -f 64; trap '' XFSZ; exec \"\$0\" -e \"
local ext = {data = {dim = 3}, classes = {dim = 2, sparse = true}}
local net = rl.network({h = {class = 'linear', n_out = 4000}, output = {class = 'softmax',
  from = 'h', loss = 'ce', target = 'classes'}}, ext)
rl.save_checkpoint('$tmp/full.h5', {net = net, epoch = 2})\"" "$bin"
if grep -q "(HDF5: file write failed: File too large)" "$tmp/err" && cmp -s "$tmp/full.h5" "$tmp/full.before" &&
    [ -z "$(ls "$tmp" | grep 'full.h5.tmp')" ]; then
    ok "the full disk's save kept the previous checkpoint, left no temporary file, said why"
else
    bad "the full disk's save" "$(cat "$tmp/err")" "$(ls "$tmp")"
fi
fails "an hdf_writer on a full disk keeps its sequences for a retry" \
    "(the sequences are kept: close again to retry)" \
    bash -c "ulimit -f 64; trap '' XFSZ; exec \"\$0\" -e \"
local w = rl.hdf_writer('$tmp/fulld.h5', {data_dim = 100})
for i = 1, 10 do w:add('s' .. i, rl.ones(100, 100)) end
local ok, err = pcall(w.close, w)
assert(not ok and err:find('File too large', 1, true), err)
error(err, 0)\"" "$bin"

# ---- an error quoting a file's content (a tag, a name) sends no escape sequence to the
# terminal: control characters other than line breaks and tabs are written as \NNN
"$bin" -e 'error("tag t\27]0;title\7 x\nsecond line\tok")' >"$tmp/out" 2>"$tmp/err"
if [ "$?" -eq 1 ] && ! grep -q $'\033\|\007' "$tmp/err" &&
    grep -qxF 'rnnlua: (command line):1: tag t\027]0;title\007 x' "$tmp/err" &&
    grep -qxF "second line	ok" "$tmp/err"; then
    ok "an error's control characters are shown as \\NNN"
else
    bad "an error's control characters are shown as \\NNN" "$(cat -v "$tmp/err")"
fi
"$bin" dump-data "$tmp/no"$'\033'"[2J.h5" >"$tmp/out" 2>"$tmp/err"
if [ "$?" -eq 1 ] && ! grep -q $'\033' "$tmp/err" && grep -qF 'no\027[2J.h5' "$tmp/err"; then
    ok "a tool's error shows control characters as \\NNN"
else
    bad "a tool's error shows control characters as \\NNN" "$(cat -v "$tmp/err")"
fi

# ---- recipes and -e are Lua source only: a precompiled chunk is refused, not run
"$bin" -e "local f = assert(io.open('$tmp/chunk.luac', 'wb')) f:write(string.dump(load('return 1'))) f:close()"
fails "a bytecode recipe is refused" "binary chunk" "$bin" "$tmp/chunk.luac"
head -c 20 "$tmp/chunk.luac" >"$tmp/cut.luac"
printf '\377\377\377\377\377\377\377\377' >>"$tmp/cut.luac"
fails "a corrupted bytecode recipe is refused, not run" "binary chunk" "$bin" "$tmp/cut.luac"
fails "a bytecode recipe on stdin is refused" "binary chunk" sh -c "'$bin' - <'$tmp/chunk.luac'"
fails "-e with a binary chunk is refused" "binary chunk" "$bin" -e "$(printf '\033Lua')"

# ---- and so are load, loadfile, dofile and require called from a recipe (or the REPL, below)
mkdir -p "$tmp/mods"
cp "$tmp/chunk.luac" "$tmp/mods/bcmod.lua"
printf 'return {answer = 42}\n' >"$tmp/mods/srcmod.lua"
bc="string.dump(load('return 1'))"
fails "load() of a precompiled chunk returns the reason" "load: attempt to load a binary chunk" \
    "$bin" -e "local f, e = load($bc) assert(f == nil) error(e, 0)"
fails "load() with mode \"b\" is refused" 'load: mode "b" refused' "$bin" -e "load($bc, 'x', 'b')"
fails "loadfile() of a precompiled file returns the reason" "loadfile: $tmp/chunk.luac: attempt" \
    "$bin" -e "local f, e = loadfile('$tmp/chunk.luac') assert(f == nil) error(e, 0)"
fails "dofile() of a precompiled file is an error" "dofile: $tmp/cut.luac: attempt to load a binary" \
    "$bin" -e "dofile('$tmp/cut.luac')"
fails "require() of a precompiled module is an error" "source text only" \
    "$bin" -e "package.path = '$tmp/mods/?.lua' require('bcmod')"
if out=$("$bin" -e "package.path = '$tmp/mods/?.lua'
assert(require('srcmod').answer == 42)
assert(load('return x', 'c', 't', {x = 5})() == 5 and load('return 2')() == 2)
assert(dofile('$tmp/mods/srcmod.lua').answer == 42)
assert(loadfile('$tmp/mods/srcmod.lua', 't', {})().answer == 42)
print('source ok')" 2>&1) && [ "$out" = "source ok" ]; then
    ok "load, loadfile, dofile and require still take source"
else
    bad "load, loadfile, dofile and require still take source" "$out"
fi

# ---- the command line
fails "an unknown option" "unrecognized option '--nope'" "$bin" --nope
fails "-e without code" "'-e' needs an argument" "$bin" -e
fails "a missing recipe" "cannot open $tmp/none.lua" "$bin" "$tmp/none.lua"
fails "a directory as the recipe" "Is a directory" "$bin" "$tmp"
fails "-e with a syntax error" "(command line):1:" "$bin" -e 'x ='
fails "-e that raises" "boom" "$bin" -e 'error("boom")'
printf 'local x = \n' >"$tmp/syntax.lua"
fails "a recipe with a syntax error names file and line" "syntax.lua:2:" "$bin" "$tmp/syntax.lua"
printf 'local t = rl.zeros(2)\nreturn t[3]\n' >"$tmp/index.lua"
fails "a recipe indexing out of range names the position" "position 3 out of range 1..2" \
    "$bin" "$tmp/index.lua"
cat >"$tmp/train.lua" <<'LUA'
rl.train{network = {output = {class = "softmax", loss = "ce", target = "classes"}},
         train = {class = "12ax", num_seqs = 4, seed = 1}, num_epochs = 1, batch_size = 100,
         optimizer = {class = "sgd"}, learning_rate = 0.1, log_verbosity = 0}
LUA
fails "++ with an unknown key" "unknown config key 'nope'" "$bin" "$tmp/train.lua" ++nope 1
fails "++ without a value" "lacks a value" "$bin" "$tmp/train.lua" ++num_epochs
fails "++num_epochs as a word" "num_epochs" "$bin" "$tmp/train.lua" ++num_epochs many
sed "s|train = {class = \"12ax\", num_seqs = 4, seed = 1}|train = {class = \"hdf\", files = {\"$tmp/first.h5\"}}|" \
    "$tmp/train.lua" >"$tmp/train_hdf.lua"
fails "++train.files.1 is applied, not ignored" "$tmp/second.h5" \
    "$bin" "$tmp/train_hdf.lua" ++train.files.1 "$tmp/second.h5"
fails "++ with an empty key part" "a key part is empty" "$bin" "$tmp/train.lua" ++train..seed 1
fails "a recipe loading a tampered checkpoint names it" "$tmp/ck.h5" \
    "$bin" -e "local f = rl.h5file('$tmp/ck.h5', 'w') f:set_attr('/', 'format', 'rnnlua-checkpoint')
f:set_attr('/', 'version', 1) f:set_attr('/', 'epoch', 0) f:set_attr('/', 'step', 0)
f:set_attr('/', 'dtype', 'float32') f:set_attr('/', 'description', 'os.exit(0)') f:commit()
rl.load_checkpoint('$tmp/ck.h5')"

# ---- the REPL through a pseudo-terminal: no keystroke may crash it (libedit's command mode,
# Meta-x in emacs mode and ':' in vi command mode, crashed on a quote)
mkdir -p "$tmp/home"
cat >"$tmp/keys.py" <<'PY'
import os, select, signal, sys, time
import pty_repl as R
from pty_repl import expect, alive
exe, home, vi = sys.argv[1], sys.argv[2], sys.argv[3] == "vi"
if vi:
    open(os.path.join(home, ".editrc"), "w").write("bind -v\n")
R.start(exe, home)

def answers(n):
    # vi mode keeps command mode across lines: Escape then i is insert mode in either
    R.send((b"\x1bi" if vi else b"") + b"print('ok'..%d)\n" % n)
    return expect(b"ok%d" % n) is not None and alive()

mode = "vi" if vi else "emacs"
expect(b"> ")
cases = [("Meta-x then a quote", b"\x1bx\""), ("Meta-X then a quote", b"\x1bX'"),
         ("Meta-x then Enter", b"\x1bx")]
if vi:
    cases += [("Escape, ':' and a quote (vi command mode)", b"\x1b:\"")]
else:
    # in vi mode Escape starts command mode, where most keys wait for more (a motion, a search)
    for c in b"abcdefghijklmnopqrstuvwxyz0!#$&*-_=[{;:,.<>/?|":
        cases.append(("Meta-%c" % c, b"\x1b" + bytes([c]) + b"\"'"))
# a precompiled chunk typed at the prompt is refused by load like everywhere
cases_bc = b"print(select(2, load(string.dump(load('return 1')))))\n"
n, failed = 10, []
for name, keys in cases:
    R.send(keys)
    time.sleep(0.05)
    R.send(b"\x03")
    # Ctrl-C gives a fresh prompt; waiting for it keeps a loaded machine from mixing the
    # answer line into the interrupted one
    expect(b"> ")
    time.sleep(0.05)
    if not answers(n):
        failed.append(name + ": " + repr(R.buf[-200:]))
        break
    n += 10
R.send((b"\x1bi" if vi else b"") + cases_bc)
print(("ok   " if expect(b"source text only") is not None and alive() else "FAIL ") +
      "%s mode: load() at the prompt refuses a precompiled chunk" % mode)
print(("ok   " if not failed else "FAIL ") + "%s mode: %d keystroke sequences, the REPL still "
      "answers%s" % (mode, len(cases), (" (broke at " + failed[0] + ")") if failed else ""))
R.send(b"\x04")
# drain what the REPL still prints without ever blocking in read (a REPL that does not take
# the Ctrl-D at once would otherwise hold the driver until the outer timeout)
end = time.time() + 5
while time.time() < end and alive():
    r, _, _ = select.select([R.fd], [], [], 0.05)
    if r:
        try:
            os.read(R.fd, 4096)
        except OSError:
            pass
if alive():
    os.kill(R.pid, signal.SIGKILL)
    os.waitpid(R.pid, 0)
PY
# ---- a beam too large for memory names the layer and beam_size (it said "rec.lua:1045: /: out
# of host memory ..."), run under a 3 GiB address-space limit (ASan's shadow memory cannot be
# reserved under one: skipped in the sanitizer build)
if ldd "$bin" 2>/dev/null | grep -q libasan; then
    echo "SKIP beam out of memory (ASan build)"
else
    fails "a beam of 2^30 out of memory" \
        "layer 'dec' (class rec), unit layer 'output': beam_size 1073741824 for 1 sequences" \
        bash -c 'ulimit -v 3000000; exec "$0" -e "
          local unit = {emb = {class = \"embedding\", from = \"prev:output\", n_out = 3},
            output_prob = {class = \"softmax\", from = \"emb\", loss = \"ce\", target = \"classes\"},
            output = {class = \"choice\", from = \"output_prob\", target = \"classes\"}}
          local net = rl.network({dec = {class = \"rec\", from = {}, unit = unit, max_seq_len = 2}},
            {data = {dim = 3}, classes = {dim = 6, sparse = true}})
          net:search({data = rl.randn(3, 1, 3), lengths = rl.tensor({3}, \"int32\")},
            {beam_size = 1 << 30})"' "$bin"
fi

# ---- found by fuzz/fuzz_wav.c: a 45-byte FLAC header promising 3.9e9 frames made rl.audio.load
# allocate 15 GB for them before reading any; the buffer now grows with what is decoded (run
# under an address-space limit of 1 GB above what the binary maps at start, which is over 1 GB
# in a CUDA build: below that OpenBLAS's threads retry their buffers for ever at exit; skipped
# in the sanitizer build, as above)
if ldd "$bin" 2>/dev/null | grep -q libasan; then
    echo "SKIP a sound file promising 3.9e9 frames (ASan build)"
else
    vm_kib=$("$bin" -e 'io.write(io.open("/proc/self/status"):read("a"):match("VmPeak:%s*(%d+)"))')
    printf '\146\114\141\103\000\000\000\042\020\000\020\000\000\003\013\000\003\013\003\000\001\160\350\000\003\040\377\377\377\377\377\000\000\000\000\000\000\000\000\310\236\025\256\220\006' >"$tmp/huge.flac"
    fails "a sound file promising 3.9e9 frames is read as far as it goes" \
        "huge.flac' is truncated or corrupt: 0 of 3892314912 frames read" \
        bash -c 'ulimit -v $(($2 + 1000000)); exec "$0" -e "rl.audio.load(\"$1\")"' "$bin" "$tmp/huge.flac" "$vm_kib"
fi

for mode in emacs vi; do
    rm -f "$tmp/home/.editrc"
    while IFS= read -r line; do
        case "$line" in
            "ok   "*) ok "${line#ok   }" ;;
            "FAIL "*) bad "${line#FAIL }" ;;
            *) echo "$line" ;;
        esac
    done < <(PYTHONPATH="$repo/tests/sh" timeout 120 python3 -u "$tmp/keys.py" "$bin" "$tmp/home" "$mode" 2>&1 || echo "FAIL pty driver ($mode) did not finish")
done

finish
