#!/usr/bin/env bash
# The installed library and its C API (docs/embedding.md): `make install` into a temporary prefix
# (and with DESTDIR, then `make uninstall`), the installed binary from another directory, the man
# page; the header compiles as C99 and C++17 with -Wall -Werror; the shared library exports
# exactly the functions of the header; examples/embed.c, built with pkg-config against the
# installed library, gives rl.forward's numbers for a trained 12AX model exactly, and streamed
# in chunks of 1, 7 and 50 frames the whole-sequence numbers; tests/sh/embed_check.c (bad input,
# threads, a model freed under a session, refusals); Debian's lua5.4 loads the installed module;
# `rnnlua serve`'s POST /v1/stream/{id} (tests/sh/stream_check.py).
# Usage: test_embed.sh path/to/rnnlua (from the repository root; BUILD/rnnlua, BUILD/librnnlua.*
# built by `make test`, whose make variables come in RL_MAKE_VARS).
set -u
bin=$(cd "$(dirname "${1:?usage: test_embed.sh path/to/rnnlua}")" && pwd)/$(basename "$1")
build=$(dirname "$bin")
root=$(pwd)
# the build folder is where `make install` below builds and reads: a wrong argument (a folder, the
# repository root) would make it build into the source tree
if [ ! -f "$bin" ] || [ ! -x "$bin" ] || [ "$build" = "$root" ] || [ ! -f Makefile ]; then
    echo "test_embed.sh: $1 is not a built rnnlua inside a build folder (usage: test_embed.sh BUILD/rnnlua, run from the repository root)" >&2
    exit 2
fi
pass=0
fail=0
dir=$(mktemp -d)
trap 'rm -rf "$dir"' EXIT
unset MAKEFLAGS MFLAGS MAKELEVEL

ok() { pass=$((pass + 1)); }
bad() { fail=$((fail + 1)); echo "FAIL $*"; }
check() { if [ "$2" = "$3" ]; then ok; else bad "$1: got '$2', expected '$3'"; fi; }
finish() { echo "$pass passed, $fail failed"; [ "$fail" -eq 0 ]; exit; }

# the make variables of this build: from `make test`, else from the build folder's name
vars=${RL_MAKE_VARS-}
if [ -z "$vars" ]; then
    b=$(basename "$build")
    case $b in *-nocuda*) vars="CUDA=0" ;; *) vars="CUDA=1" ;; esac
    case $b in *-nompi*) vars="$vars MPI=0" ;; esac
    case $b in *-san*) vars="$vars SANITIZE=1" ;; esac
    case $b in *-blis*) vars="$vars BLAS=blis" ;; esac
fi
# A sanitized library needs its runtime in the programs that load it.
san=""
case $(basename "$build") in *-san*) san="-fsanitize=address,undefined" ;; esac
export ASAN_OPTIONS="${ASAN_OPTIONS:+$ASAN_OPTIONS:}detect_leaks=0"

# ---- make install / uninstall
prefix="$dir/prefix"
if ! make -s --no-print-directory $vars BUILD="$build" install PREFIX="$prefix" \
    >"$dir/install.log" 2>&1; then
    cat "$dir/install.log"
    bad "make install PREFIX=$prefix"
    finish
fi
ok
major=$(sed -n 's/^#define RL_API_VERSION \([0-9]*\)$/\1/p' include/rnnlua.h)
for f in bin/rnnlua lib/librnnlua.so.$major lib/librnnlua.a include/rnnlua.h \
    lib/pkgconfig/rnnlua.pc lib/lua/5.4/rnnlua.so share/man/man1/rnnlua.1 share/doc/rnnlua/docs/embedding.md \
    share/doc/rnnlua/examples/embed.c share/rnnlua/lua/rnnlua/capi.lua share/rnnlua/lua/rnnlua/init.lua; do
    if [ -f "$prefix/$f" ]; then ok; else bad "make install: no $f"; fi
done
check "librnnlua.so link" "$(readlink "$prefix/lib/librnnlua.so")" "librnnlua.so.$major"
check "soname" "$(readelf -d "$prefix/lib/librnnlua.so.$major" | sed -n 's/.*(SONAME).*\[\(.*\)\]/\1/p')" \
    "librnnlua.so.$major"
# the installed binary from another directory (the Lua library is inside it)
check "installed rnnlua from /" "$(cd / && "$prefix/bin/rnnlua" -e 'io.write(rl.version)')" \
    "$(sed -n 's/^#define RL_VERSION "\(.*\)"$/\1/p' lua/version.h)"
# the man page renders without groff warnings
page=$(MANWIDTH=80 man -l "$prefix/share/man/man1/rnnlua.1" 2>"$dir/man.err" | col -b)
if echo "$page" | grep -q "^SYNOPSIS" && echo "$page" | grep -q "rnnlua serve" \
    && [ ! -s "$dir/man.err" ]; then ok; else bad "man -l rnnlua.1: $(head -c 300 "$dir/man.err")"; fi
# with DESTDIR the files go under it, and uninstall removes every one of them
if make -s --no-print-directory $vars BUILD="$build" install DESTDIR="$dir/stage" PREFIX=/opt/rl \
    >"$dir/install2.log" 2>&1 \
    && [ -x "$dir/stage/opt/rl/bin/rnnlua" ] \
    && grep -qx 'prefix=/opt/rl' "$dir/stage/opt/rl/lib/pkgconfig/rnnlua.pc" \
    && make -s --no-print-directory $vars BUILD="$build" uninstall DESTDIR="$dir/stage" \
        PREFIX=/opt/rl >>"$dir/install2.log" 2>&1; then
    left=$(find "$dir/stage" -type f -o -type l)
    check "files left by make uninstall" "$left" ""
else
    cat "$dir/install2.log"
    bad "make install DESTDIR=... PREFIX=/opt/rl, make uninstall"
fi

export PKG_CONFIG_PATH="$prefix/lib/pkgconfig"
cflags=$(pkg-config --cflags rnnlua)
libs="$(pkg-config --libs rnnlua) -Wl,-rpath,$(pkg-config --variable=libdir rnnlua)"

# ---- the header as C99 and C++17; the exported symbols
printf '#include <rnnlua.h>\nint main(void) { rl_info i; rl_batch b; b.T = 1; (void)b;\n'\
'return rl_model_info(0, &i) == RL_OK; }\n' >"$dir/h.c"
cp "$dir/h.c" "$dir/h.cpp"
if cc -std=c99 -Wall -Wextra -pedantic -Werror $cflags -c -o "$dir/h.o" "$dir/h.c"; then ok
else bad "rnnlua.h as C99 -Wall -Werror"; fi
if c++ -std=c++17 -Wall -Wextra -pedantic -Werror $cflags -c -o "$dir/hpp.o" "$dir/h.cpp"; then ok
else bad "rnnlua.h as C++17 -Wall -Werror"; fi
api=$(grep -oE '\brl_[a-z_]+\(' include/rnnlua.h | tr -d '(' | sort -u)
exported=$(nm -D --defined-only "$prefix/lib/librnnlua.so.$major" | awk '$2 ~ /^[TDBVWiu]$/ {print $3}' \
    | sed 's/@.*//' | sort -u)
check "exported symbols = the functions of rnnlua.h" "$exported" "$api"

# ---- examples/embed.c and tests/sh/embed_check.c against the installed library
if ! cc -std=c99 -Wall -Wextra -Werror $san $cflags -o "$dir/embed" examples/embed.c $libs; then
    bad "examples/embed.c does not build with pkg-config --cflags --libs rnnlua"
    finish
fi
if ! cc -std=c11 -Wall -Wextra -Werror $san $cflags -o "$dir/embed_check" tests/sh/embed_check.c \
    $libs -lpthread -lm; then
    bad "tests/sh/embed_check.c does not build"
    finish
fi
ok

# ---- models: a causal 12AX LSTM trained briefly, rl.forward's answers one sequence a batch,
# each dev sequence as embed's input text and rl.forward's output as text; a bidirectional
# model, a model with a Lua layer class, a sparse-input model; a dataset (not a model)
cp tests/data/scale_layer.lua "$dir/scale.lua"
if ! "$bin" -e "
local d = '$dir'
local cfg = {
  network = {
    l1 = {class = 'lstm', n_out = 16}, l2 = {class = 'lstm', n_out = 16, from = 'l1'},
    output = {class = 'softmax', from = 'l2', loss = 'ce', target = 'classes'},
  },
  train = {class = '12ax', num_seqs = 60, seed = 1, max_len = 40},
  num_epochs = 2, batch_size = 800, max_seqs = 10, learning_rate = 0.01,
  optimizer = {class = 'adam'}, model = d .. '/net', log_verbosity = 0, seed = 1,
}
os.rename(rl.train(cfg).checkpoint, d .. '/model.h5')
rl.dataset_write(d .. '/dev.h5', rl.dataset{class = '12ax', num_seqs = 5, seed = 2, min_len = 55,
                                            max_len = 90})
rl.forward{model = d .. '/model.h5', data = {class = 'hdf', files = {d .. '/dev.h5'}},
           output_file = d .. '/fwd.h5', log_verbosity = 0, max_seqs = 1}
local dev, fwd = rl.dataset{class = 'hdf', files = {d .. '/dev.h5'}},
                 rl.dataset{class = 'hdf', files = {d .. '/fwd.h5'}}
dev:init_epoch(1); fwd:init_epoch(1)
local function write(path, rows, header)
  local f = assert(io.open(path, 'w'))
  if header then f:write(#rows, ' ', #rows[1], '\n') end
  for _, r in ipairs(rows) do
    for j, v in ipairs(r) do r[j] = string.format('%.9g', v) end
    f:write(table.concat(r, ' '), '\n')
  end
  f:close()
end
for i = 1, dev:num_seqs() do
  write(d .. '/in' .. i .. '.txt', dev:get_seq(i).data:totable(), true)
  write(d .. '/ref' .. i .. '.txt', fwd:get_seq(i).data:totable())
end
rl.manual_seed(4)
local ext = {data = {dim = 9}, classes = {dim = 2, sparse = true}}
rl.save_checkpoint(d .. '/blstm.h5', {epoch = 1, net = rl.network({
  fw = {class = 'lstm', n_out = 4}, bw = {class = 'lstm', n_out = 4, direction = -1},
  output = {class = 'softmax', from = {'fw', 'bw'}, loss = 'ce', target = 'classes'}}, ext)})
-- finite on a zero input (serve checks that at start-up), but a large input overflows to Inf
local ovf = rl.network({l1 = {class = 'lstm', n_out = 2},
  h = {class = 'linear', n_out = 3, from = {'l1', 'data'}},
  output = {class = 'linear', n_out = 3, from = 'h', loss = 'mse', target = 'y'}},
  {data = {dim = 2}, y = {dim = 3}})
ovf:params():fill_(1e15)
rl.save_checkpoint(d .. '/overflow.h5', {epoch = 1, net = ovf})
dofile(d .. '/scale.lua')
rl.save_checkpoint(d .. '/lua_class.h5', {epoch = 1, net = rl.network({
  sc = {class = 'scale', k = 3, from = 'data'},
  output = {class = 'softmax', from = 'sc', loss = 'ce', target = 'classes'}}, ext)})
-- a causal stack of more kinds of C layers (pushes in C); two forward LSTMs side by side, which
-- net:forward runs as a pair (pushes through the Lua network)
rl.save_checkpoint(d .. '/stack.h5', {epoch = 1, net = rl.network({
  l1 = {class = 'lstm', n_out = 8}, g = {class = 'gru', n_out = 6, from = 'l1'},
  lin = {class = 'linear', n_out = 5, activation = 'tanh', from = {'l1', 'g'}},
  c = {class = 'copy', from = 'lin'},
  output = {class = 'softmax', from = {'c', 'g'}, loss = 'ce', target = 'classes'}}, ext)})
-- the stack again with the input normalisation of its training set (data_norm: pushes in C too)
rl.manual_seed(6)
rl.save_checkpoint(d .. '/norm.h5', {epoch = 1, net = rl.network({
  l1 = {class = 'lstm', n_out = 8}, g = {class = 'gru', n_out = 6, from = 'l1'},
  lin = {class = 'linear', n_out = 5, activation = 'tanh', from = {'l1', 'g'}},
  c = {class = 'copy', from = 'lin'},
  output = {class = 'softmax', from = {'c', 'g'}, loss = 'ce', target = 'classes'}}, ext),
  data_norm = {mean = rl.randn(9), std = rl.rand(9):add(0.5)}})
rl.save_checkpoint(d .. '/pair.h5', {epoch = 1, net = rl.network({
  a = {class = 'lstm', n_out = 4}, b = {class = 'lstm', n_out = 4},
  output = {class = 'softmax', from = {'a', 'b'}, loss = 'ce', target = 'classes'}}, ext)})
rl.save_checkpoint(d .. '/sparse.h5', {epoch = 1, net = rl.network({
  emb = {class = 'embedding', n_out = 4, from = 'data'}, l = {class = 'gru', n_out = 5, from = 'emb'},
  output = {class = 'softmax', from = 'l', loss = 'ce', target = 'classes'}},
  {data = {dim = 6, sparse = true}, classes = {dim = 2, sparse = true}})})
rl.save_checkpoint(d .. '/ctc.h5', {epoch = 1, net = rl.network({
  l = {class = 'lstm', n_out = 8},
  output = {class = 'softmax', from = 'l', loss = 'ctc', target = 'classes'}},
  {data = {dim = 9}, classes = {dim = 3, sparse = true, labels = {'a', 'b', 'c'}}})})
-- LMs of the CTC model's labels a, b, c: a character 3-gram, a 2-gram whose vocabulary lacks c, a
-- neural character LM; rl.forward's decodings of the dev sequences with them (a line a sequence)
rl.ngram_estimate{sentences = {{'a', 'b', 'c'}, {'a', 'b'}, {'c', 'a', 'b'}, {'b', 'c', 'c', 'a'},
  {'a', 'b', 'c', 'a', 'b'}}, order = 3, output = d .. '/lm.arpa'}
rl.ngram_estimate{sentences = {{'a', 'b'}}, order = 2, output = d .. '/lm_ab.arpa'}
local chars = {'\n', 'a', 'b', 'c', 'd'}
rl.manual_seed(5)
rl.save_checkpoint(d .. '/charlm.h5', {epoch = 1, net = rl.network({
  emb = {class = 'embedding', n_out = 5, from = 'data'}, l1 = {class = 'lstm', n_out = 8, from = 'emb'},
  output = {class = 'softmax', from = 'l1', loss = 'ce', target = 'classes'}},
  {data = {dim = 5, sparse = true, labels = chars}, classes = {dim = 5, sparse = true, labels = chars}})})
local function decode(name, beam, lm)
  rl.forward{model = d .. '/ctc.h5', data = {class = 'hdf', files = {d .. '/dev.h5'}},
    output_file = d .. '/' .. name .. '.h5', log_verbosity = 0, max_seqs = 1, decode = 'ctc',
    beam = beam, lm = lm}
  local r = rl.dataset{class = 'hdf', files = {d .. '/' .. name .. '.h5'}, allow_empty = true}
  r:init_epoch(1)
  local f = assert(io.open(d .. '/' .. name .. '.txt', 'w'))
  for i = 1, r:num_seqs() do
    local t = r:get_seq(i).data
    f:write(t:numel() > 0 and table.concat(t:totable(), ' ') or '', '\n')
  end
  f:close()
end
decode('dec_plain', 4)
decode('dec_arpa', 4, {file = d .. '/lm.arpa', weight = 1.5, bonus = 0.5})
decode('dec_arpa1', 1, {file = d .. '/lm.arpa', weight = 1, bonus = -0.25})
decode('dec_word', 4, {file = d .. '/lm.arpa', weight = 1, bonus = 0.5, word_boundary = 'b'})
decode('dec_neural', 3, {model = d .. '/charlm.h5', weight = 1, bonus = 0.2})
-- an attention decoder (untrained, its output layer sharpened so that hypotheses end at different
-- steps) and rl.search's labels of the dev sequences' first 12 frames, without and with an LM
local LBL = {'</e>', 'a', 'b', 'c', 'd', 'e'}
rl.manual_seed(11)
local s2s = rl.network({
  enc = {class = 'lstm', n_out = 4, from = 'data'},
  dec = {class = 'rec', from = {}, max_seq_len = 'T + 2', unit = {
    emb = {class = 'embedding', from = 'prev:output', n_out = 3},
    s = {class = 'lstm', from = {'emb', 'prev:att'}, n_out = 4},
    att = {class = 'attention', base = 'base:enc', from = 's', kind = 'additive'},
    readout = {class = 'linear', from = {'s', 'att'}, n_out = 5, activation = 'tanh'},
    output_prob = {class = 'softmax', from = 'readout', loss = 'ce', target = 'classes'},
    output = {class = 'choice', from = 'output_prob', target = 'classes', beam_size = 3}}}},
  {data = {dim = 9}, classes = {dim = 6, sparse = true, labels = LBL}})
s2s:layer('dec').params['output_prob.W']:mul_(4)
rl.save_checkpoint(d .. '/s2s.h5', {epoch = 1, net = s2s})
local seqs = {}
for i = 1, 5 do
  seqs[i] = {tag = 's' .. i, data = dev:get_seq(i).data:narrow(1, 1, 12):contiguous(),
    classes = rl.tensor({1, 2}, 'int32')}
end
rl.dataset_write(d .. '/s2s_data.h5', seqs,
  {extern_data = {data = {dim = 9}, classes = {dim = 6, sparse = true}}})
rl.ngram_estimate{sentences = {{'a', 'b'}, {'b', 'c', 'd'}, {'e', 'a'}, {'c', 'c', 'e'}},
  order = 2, output = d .. '/lm_s2s.arpa'}
local function search(name, beam, lm)
  local r = rl.search{model = d .. '/s2s.h5', data = {class = 'hdf', files = {d .. '/s2s_data.h5'}},
    output_file = d .. '/' .. name .. '.h5', layer = 'dec', beam = beam, lm = lm, log_verbosity = 0}
  local f = assert(io.open(d .. '/' .. name .. '.txt', 'w'))
  for _, res in ipairs(r.results) do f:write(table.concat(res.labels, ' '), '\n') end
  f:close()
end
search('search_plain')
search('search_beam1', 1)
search('search_lm', nil, {file = d .. '/lm_s2s.arpa', weight = 1, bonus = 0.3, labels = LBL})
" >"$dir/models.log" 2>&1; then
    cat "$dir/models.log"
    bad "training the 12AX model and writing rl.forward's answers"
    finish
fi
ok

# rl.forward's numbers exactly (CHUNK 0: the whole sequence), and streamed in chunks of 1, 7 and
# 50 frames the whole sequence's numbers to float32 rounding (2^-23 relative, 1e-7 absolute)
for i in 1 2 3 4 5; do
    if "$dir/embed" "$dir/model.h5" 0 <"$dir/in$i.txt" >"$dir/out$i.txt" 2>"$dir/err.txt" \
        && cmp -s "$dir/out$i.txt" "$dir/ref$i.txt"; then ok
    else bad "embed: sequence $i differs from rl.forward's ($(head -c 300 "$dir/err.txt"))"; fi
    for chunk in 1 7 50; do
        if ! "$dir/embed" "$dir/model.h5" "$chunk" <"$dir/in$i.txt" >"$dir/s.txt" 2>"$dir/err.txt"
        then
            bad "embed: sequence $i in chunks of $chunk: $(head -c 300 "$dir/err.txt")"
            continue
        fi
        worst=$(paste -d ' ' "$dir/s.txt" "$dir/out$i.txt" | awk '
            { n = NF / 2; if (n != 2) { print "bad line " NR; exit }
              for (j = 1; j <= n; j++) { a = $j; b = $(j + n); e = a - b; if (e < 0) e = -e
                  m = b < 0 ? -b : b; if (e > m * 2.4e-7 + 1e-7) { print "frame " NR ": " a " vs " b; exit } } }
            END { if (NR != rows) print "lines " NR " vs " rows }' rows="$(wc -l <"$dir/out$i.txt")")
        check "sequence $i streamed in chunks of $chunk" "$worst" ""
    done
done

# which path a model's pushes take (RNNLUA_CAPI_DEBUG=1, said at rl_model_load): in C for a stack
# of C layers, with data_norm too, and with a pair of layers that net:forward runs at once;
# through the Lua network when RNNLUA_CAPI_PUSH=lua asks for it
for m in model stack norm pair; do
    RNNLUA_CAPI_DEBUG=1 "$dir/embed" "$dir/$m.h5" 7 <"$dir/in1.txt" >/dev/null 2>"$dir/err.txt"
    want="pushes run in C"
    check "$m.h5: $want" "$(grep -c -F "$dir/$m.h5: $want" "$dir/err.txt")" 1
done
RNNLUA_CAPI_DEBUG=1 RNNLUA_CAPI_PUSH=lua "$dir/embed" "$dir/pair.h5" 7 <"$dir/in1.txt" >/dev/null \
    2>"$dir/err.txt"
want="pushes run through the Lua network: RNNLUA_CAPI_PUSH=lua"
check "pair.h5: $want" "$(grep -c -F "$dir/pair.h5: $want" "$dir/err.txt")" 1

# ---- the module for a system Lua: Debian's lua5.4 runs rl.forward through the installed
# lib/lua/5.4/rnnlua.so and writes rl.forward's numbers (a sanitized module needs its runtime
# loaded first, which lua5.4 is not built for: skipped there)
if [ -n "$san" ]; then
    echo "skipped: the system Lua module under the sanitizers"
elif ! command -v lua5.4 >/dev/null; then
    bad "no lua5.4 (scripts/deps.sh installs it)"
else
    cat >"$dir/sys.lua" <<EOF_LUA
local rl = require "rnnlua"
local d = "$dir"
rl.forward{model = d .. "/model.h5", data = {class = "hdf", files = {d .. "/dev.h5"}},
           output_file = d .. "/fwd_sys.h5", log_verbosity = 0, max_seqs = 1}
local f = rl.dataset{class = "hdf", files = {d .. "/fwd_sys.h5"}}
f:init_epoch(1)
for _, r in ipairs(f:get_seq(1).data:totable()) do
  for j, v in ipairs(r) do r[j] = string.format("%.9g", v) end
  print(table.concat(r, " "))
end
EOF_LUA
    if (cd / && LUA_CPATH="$prefix/lib/lua/5.4/?.so" lua5.4 "$dir/sys.lua") >"$dir/sys.txt" \
        2>"$dir/err.txt" && cmp -s "$dir/sys.txt" "$dir/ref1.txt"; then ok
    else bad "lua5.4 with require \"rnnlua\": $(head -c 300 "$dir/err.txt")"; fi
fi

# ---- rnnlua serve's POST /v1/stream/{id} (the same C API): sequence 1 in chunks of 7 frames
# gives the whole-sequence numbers; --max-streams, --stream-timeout, a model that cannot stream
serve_stream() { # model, options...; runs tests/sh/stream_check.py against a fresh server
    local model=$1
    shift
    "$bin" serve "$model" --port 0 "$@" >"$dir/serve.out" 2>"$dir/serve.err" &
    local pid=$!
    local port=""
    for _ in $(seq 100); do
        port=$(sed -n 's/^listening on http:\/\/127.0.0.1:\([0-9]*\)$/\1/p' "$dir/serve.out")
        [ -n "$port" ] && break
        sleep 0.1
    done
    if [ -z "$port" ]; then
        bad "rnnlua serve $model did not start: $(tail -c 300 "$dir/serve.err")"
    else
        python3 tests/sh/stream_check.py "$port" "$dir" "$(basename "$model")" >"$dir/stream.log" 2>&1
        grep -v '^[0-9]* passed' "$dir/stream.log"
        local line
        line=$(grep -E '^[0-9]+ passed, [0-9]+ failed' "$dir/stream.log")
        pass=$((pass + ${line%% *}))
        local f=${line#*, }
        f=${f%% *}
        fail=$((fail + ${f:-1}))
    fi
    kill "$pid" 2>/dev/null
    wait "$pid" 2>/dev/null
}
serve_stream "$dir/model.h5" --max-streams 2 --stream-timeout 1
serve_stream "$dir/blstm.h5"
serve_stream "$dir/overflow.h5"

# ---- embed_check: bad input, threads, refusals
"$dir/embed_check" "$dir/model.h5" "$dir/blstm.h5" "$dir/dev.h5" "$dir/lua_class.h5" \
    "$dir/sparse.h5" "$dir/scale.lua" "$dir/ctc.h5" "$dir" "$dir/stack.h5" "$dir/norm.h5" \
    >"$dir/check.log" 2>&1
rc=$?
line=$(grep -E '^[0-9]+ passed, [0-9]+ failed' "$dir/check.log")
grep -v '^[0-9]* passed' "$dir/check.log"
if [ -n "$line" ] && [ "$rc" -eq 0 ]; then
    pass=$((pass + $(echo "$line" | awk '{print $1}')))
else
    bad "embed_check (exit $rc): $line"
fi
finish
