#!/usr/bin/env bash
# Training and the forward task from the shell: a recipe with ++key overrides, resuming with
# ++load last, rnnlua forward (and recipes/forward.lua, which calls it), rnnlua train on a Lua
# and a RETURNN JSON config, and non-zero exit codes with a message naming the problem. Usage: test_cli_train.sh path/to/rnnlua (from the repository root)
set -u
bin=${1:?usage: test_cli_train.sh path/to/rnnlua}
pass=0
fail=0
dir=$(mktemp -d)
trap 'rm -rf "$dir"' EXIT

ok() { # name, condition result
    if [ "$2" -eq 0 ]; then
        pass=$((pass + 1))
    else
        fail=$((fail + 1))
        echo "FAIL $1"
        [ -f "$dir/err" ] && tail -n 5 "$dir/err"
    fi
}

small="++train.num_seqs 40 ++train.max_len 30 ++dev.num_seqs 10 ++dev.max_len 30 ++log_verbosity 2"

"$bin" recipes/12ax_blstm.lua ++num_epochs 1 ++model "$dir/m" $small >"$dir/out" 2>"$dir/err"
ok "recipe with ++num_epochs 1 ++model runs" $?
[ -f "$dir/m.001.h5" ] && [ ! -f "$dir/m.002.h5" ]
ok "one checkpoint written" $?
[ "$(wc -l <"$dir/m.curve.jsonl")" -eq 1 ] && grep -q '^{"epoch": 1, "lr": ' "$dir/m.curve.jsonl"
ok "learning curve line" $?
grep -q "final dev frame error rate" "$dir/out" &&
    grep -q "forward output:  $dir/dev_output.h5" "$dir/out"
ok "recipe prints its results and where they went" $?
grep -q "epoch   1/1  train score" "$dir/out" && ! grep -q $'\r' "$dir/out"
ok "plain summary lines when stdout is a file" $?

"$bin" recipes/12ax_blstm.lua ++num_epochs 2 ++model "$dir/m" ++load last $small \
    >"$dir/out" 2>"$dir/err"
ok "++load last resumes" $?
grep -q "resumed from $dir/m.001.h5 (epoch 1" "$dir/out" && [ -f "$dir/m.002.h5" ] &&
    [ "$(wc -l <"$dir/m.curve.jsonl")" -eq 2 ]
ok "resumed at epoch 2, curve continued" $?

"$bin" forward ++model "$dir/m.002.h5" ++data "$dir/dev.h5" ++layer fw ++output "$dir/fw.h5" \
    >"$dir/out" 2>"$dir/err"
ok "rnnlua forward runs" $?
"$bin" -e "
local ds = rl.dataset{class = 'hdf', files = {'$dir/fw.h5'}}
local dev = rl.dataset{class = 'hdf', files = {'$dir/dev.h5'}}
ds:init_epoch(1) dev:init_epoch(1)
assert(ds:num_seqs() == 10 and ds:extern_data().data.dim == 32, 'shape')
for i = 1, 10 do
  local a, b = ds:get_seq(i), dev:get_seq(i)
  assert(a.tag == b.tag and a.data:size(1) == b.data:size(1), 'seq ' .. i)
end" >"$dir/err" 2>&1
ok "forward output: tags and lengths of the dev set, dim of layer fw" $?

"$bin" recipes/forward.lua ++model "$dir/m.002.h5" ++data '{class = "12ax", num_seqs = 3}' \
    ++output "$dir/o.h5" >"$dir/out" 2>"$dir/err"
ok "forward recipe with a dataset config literal" $?
grep -q "3 sequences" "$dir/out"
ok "forward reports what it wrote" $?

# errors: non-zero exit, a message naming the key or the file
"$bin" recipes/12ax_blstm.lua ++num_epochs 1 ++model "$dir/x" ++bogus_key 3 >"$dir/out" 2>"$dir/err"
[ $? -ne 0 ] && grep -q "unknown config key 'bogus_key'" "$dir/err"
ok "unknown ++key exits non-zero naming it" $?
"$bin" recipes/12ax_blstm.lua --num_epochs 3 ++model "$dir/x" >"$dir/out" 2>"$dir/err"
[ $? -ne 0 ] && grep -q "^rnnlua: recipes/12ax_blstm.lua:[0-9]*: --num_epochs: options are written ++key value (++num_epochs)$" "$dir/err" &&
    ! grep -q "stack traceback\|lua/rnnlua/" "$dir/err" && [ ! -f "$dir/x.001.h5" ]
ok "--num_epochs is an error naming ++num_epochs and the recipe's line, not ignored" $?
"$bin" recipes/12ax_blstm.lua ++num_epochs 1 ++num_epochs 2 >"$dir/out" 2>"$dir/err"
[ $? -ne 0 ] && grep -q "++num_epochs: given twice, as '1' and as '2'" "$dir/err"
ok "an option given twice with different values" $?
"$bin" recipes/12ax_blstm.lua --help >"$dir/out" 2>"$dir/err"
[ $? -eq 0 ] && grep -q "^  ++num_epochs  *\[8\]" "$dir/out" && grep -q "^  ++learning_rate  *\[0.01\]" "$dir/out"
ok "recipe --help lists rl.train's keys with the recipe's values" $?
nohelp=0
for r in recipes/*.lua; do
    case $r in *_data.lua|*/sub_epochs.lua) continue ;; esac
    "$bin" "$r" --help >"$dir/out" 2>"$dir/err" && grep -q "usage: rnnlua" "$dir/out" ||
        { echo "no --help: $r"; nohelp=1; }
done
ok "every recipe answers --help" $nohelp
"$bin" recipes/char_lm.lua ++hiden 8 >"$dir/out" 2>"$dir/err"
[ $? -ne 0 ] && grep -q "++hiden: unknown option (did you mean ++hidden?)" "$dir/err"
ok "a misspelt recipe option names the closest" $?
"$bin" forward ++model "$dir/none.h5" ++data "$dir/dev.h5" ++output "$dir/o2.h5" \
    >"$dir/out" 2>"$dir/err"
[ $? -ne 0 ] && grep -q "$dir/none.h5" "$dir/err" && [ ! -f "$dir/o2.h5" ]
ok "forward with a missing checkpoint exits non-zero naming it" $?
head -c 3000 "$dir/m.002.h5" >"$dir/cut.h5"
"$bin" forward ++model "$dir/cut.h5" ++data "$dir/dev.h5" ++output "$dir/o3.h5" \
    >"$dir/out" 2>"$dir/err"
[ $? -ne 0 ] && grep -q "$dir/cut.h5" "$dir/err"
ok "forward with a truncated checkpoint exits non-zero naming it" $?
"$bin" forward ++model "$dir/m.002.h5" ++output "$dir/o.h5" >"$dir/out" 2>"$dir/err"
[ $? -eq 2 ] && grep -q "^rnnlua: ++data: missing$" "$dir/err" && grep -q "^(rnnlua forward --help)$" "$dir/err"
ok "forward without ++data names it" $?
"$bin" forward model="$dir/m.002.h5" >"$dir/out" 2>"$dir/err"
[ $? -eq 2 ] && grep -q "model=.*: options are written ++key value (++model " "$dir/err"
ok "forward with key=value names ++key" $?

# a model with a Lua layer class: ++lua FILE registers it before the checkpoint loads
cp tests/data/scale_layer.lua "$dir/scale.lua"
echo 'error("not today")' >"$dir/raises.lua"
"$bin" -e "dofile('$dir/scale.lua')
rl.save_checkpoint('$dir/lua.h5', {net = rl.network({output = {class = 'scale', k = 3, from = 'data'}},
  {data = {dim = 9}}), epoch = 1})" >"$dir/err" 2>&1
ok "a checkpoint of a network with a Lua layer class" $?
"$bin" forward ++model "$dir/lua.h5" ++data "$dir/dev.h5" ++output "$dir/o4.h5" \
    >"$dir/out" 2>"$dir/err"
[ $? -ne 0 ] && grep -q "'scale'" "$dir/err" && [ ! -f "$dir/o4.h5" ]
ok "forward of it without ++lua exits non-zero naming the class" $?
"$bin" forward ++model "$dir/lua.h5" ++data "$dir/dev.h5" ++output "$dir/o4.h5" \
    ++lua "$dir/scale.lua" >"$dir/out" 2>"$dir/err" &&
    "$bin" -e "
local o = rl.dataset{class = 'hdf', files = {'$dir/o4.h5'}}
local d = rl.dataset{class = 'hdf', files = {'$dir/dev.h5'}}
o:init_epoch(1) d:init_epoch(1)
for i = 1, d:num_seqs() do
  local a, b = o:get_seq(i).data, d:get_seq(i).data
  assert((a - b * 3):abs():max() < 1e-6, 'seq ' .. i)
end" >"$dir/err" 2>&1
ok "forward with ++lua scale.lua writes 3 x the input" $?
"$bin" forward ++model "$dir/lua.h5" ++data "$dir/dev.h5" ++output "$dir/o5.h5" \
    ++lua "$dir/raises.lua" >"$dir/out" 2>"$dir/err"
[ $? -ne 0 ] && grep -q "++lua $dir/raises.lua: .*not today" "$dir/err"
ok "++lua with a file that raises exits non-zero naming it and the error" $?

# rnnlua serve reads ++key value too (++max_batch_frames is --max-batch-frames)
"$bin" serve "$dir/m.002.h5" ++port 0 ++max_batch_frames 100 ++listen 127.0.0.1 \
    >"$dir/serve.out" 2>"$dir/serve.err" &
spid=$!
for _ in $(seq 100); do grep -q "listening on http://127.0.0.1:" "$dir/serve.out" && break; sleep 0.1; done
grep -q "listening on http://127.0.0.1:" "$dir/serve.out"
ok "serve ++port 0 ++max_batch_frames 100 listens" $?
kill -TERM "$spid" 2>/dev/null
wait "$spid"
ok "serve exits 0 on SIGTERM" $?
"$bin" serve "$dir/m.002.h5" ++prot 0 >"$dir/out" 2>"$dir/err"
[ $? -eq 2 ] && grep -q "unknown option '++prot' (did you mean --port?)" "$dir/err"
ok "serve: an unknown ++option" $?

# rnnlua train: the seed paper's Figure 1 network (a BLSTM) as a RETURNN 2016 JSON config learns
# 12AX to 0% dev frame error (about 15 s on 2 loaded cores)
"$bin" train recipes/12ax_returnn.json ++model "$dir/j/net" ++log_file "$dir/j/log" \
    >"$dir/out" 2>"$dir/err"
ok "rnnlua train CONFIG.json runs" $?
grep -q "^final dev frame error rate: 0.00% .* after 10 epochs$" "$dir/out" && [ -f "$dir/j/net.010.h5" ]
ok "Figure 1 as JSON: 0% dev frame error after 10 epochs" $?
"$bin" info "$dir/j/net.010.h5" >"$dir/out" 2>"$dir/err" &&
    grep -q "^  *fw0  *lstm  *32  *data" "$dir/out" && grep -q "^  *bw0  *lstm  *32" "$dir/out"
ok "class rec with unit lstm and direction is rnnlua's lstm" $?
cat >"$dir/c.lua" <<'LUA'
return {network = {fw = {class = "lstm", n_out = 8},
                   output = {class = "softmax", from = "fw", loss = "ce", target = "classes"}},
        train = {class = "12ax", num_seqs = 20, max_len = 20, seed = 1},
        dev = {class = "12ax", num_seqs = 5, max_len = 20, seed = 2},
        num_epochs = 3, log_verbosity = 1}
LUA
"$bin" train "$dir/c.lua" ++num_epochs 1 ++model "$dir/c/net" >"$dir/out" 2>"$dir/err" &&
    [ -f "$dir/c/net.001.h5" ] && [ ! -f "$dir/c/net.002.h5" ]
ok "rnnlua train CONFIG.lua with an override" $?
# bad configs: errors naming the file, the line and column, the key or the layer
bad() { # name, expected text (grep -F), file content, extension
    printf '%s' "$3" >"$dir/bad.$4"
    "$bin" train "$dir/bad.$4" ++model "$dir/bad/net" >"$dir/out" 2>"$dir/err"
    rc=$?
    [ $rc -ne 0 ] && grep -qF -- "$2" "$dir/err" && ! grep -q "stack traceback\|lua/rnnlua/" "$dir/err" &&
        [ ! -f "$dir/bad/net.001.h5" ]
    ok "$1" $?
}
net='"network": {"fw": {"class": "rec", "n_out": 4}, "output": {"class": "softmax", "loss": "ce", "from": ["fw"]}}'
ds='"train": {"class": "Task12AXDataset", "num_seqs": 5}'
bad "malformed JSON: line and column" "rnnlua: $dir/bad.json:3:1: " $'{
  "num_epochs": 1,
}' json
bad "unknown RETURNN key" "rnnlua: $dir/bad.json: unknown key 'num_epoch' (did you mean 'num_epochs'?" \
    "{$net, $ds, \"num_epoch\": 2}" json
bad "from names a missing layer" "rnnlua: $dir/bad.json: network.output.from: no layer 'fw2' (did you mean 'fw'?)" \
    "{${net/\[\"fw\"\]/[\"fw2\"]}, $ds}" json
bad "unknown layer class" "rnnlua: $dir/bad.json: network.fw.class: unknown class 'recc' (did you mean 'rec'?)" \
    "{${net/\"rec\"/\"recc\"}, $ds}" json
bad "a key rnnlua's layer does not have" "rnnlua: $dir/bad.json: rl.train: " \
    "{${net/\"n_out\": 4/\"n_out\": 4, \"sharpgates\": \"none\"}, $ds}" json
bad "neither Lua nor JSON" "rnnlua: $dir/bad.cfg: neither a Lua config" 'num_epochs = = 3' cfg
bad "a Lua config returning no table" "rnnlua: $dir/bad.lua: must return the rl.train config table, got nil" \
    'x = 1' lua
bad "a Lua config with an error: its own line first" "rnnlua: $dir/bad.lua:2: " $'local x = 1\nerror("oops")' lua
"$bin" train recipes/12ax_returnn.json ++num_epochs 1 ++num_epochs 2 >"$dir/out" 2>"$dir/err"
[ $? -eq 2 ] && grep -q "^rnnlua: ++num_epochs: given twice, as '1' and as '2'$" "$dir/err"
ok "rnnlua train: an option given twice" $?
"$bin" train "$dir/nothing.json" >"$dir/out" 2>"$dir/err"
[ $? -ne 0 ] && grep -q "rnnlua: $dir/nothing.json: cannot open" "$dir/err"
ok "rnnlua train: a missing config" $?

echo "$pass passed, $fail failed"
[ "$fail" -eq 0 ]
