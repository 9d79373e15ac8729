#!/usr/bin/env bash
# Training and the forward task from the shell: a recipe with ++key overrides, resuming with
# ++load last, rnnlua forward (and recipes/forward.lua, which calls it), rnnlua train on a Lua
# and a RETURNN JSON config, and non-zero exit codes with a message naming the problem. Usage: test_cli_train.sh path/to/rnnlua (from the repository root)
set -u
source "${BASH_SOURCE%/*}/lib.sh"

small="++train.num_seqs 40 ++train.max_len 30 ++dev.num_seqs 10 ++dev.max_len 30 ++log_verbosity 2"

"$bin" recipes/12ax_blstm.lua ++num_epochs 1 ++model "$tmp/m" $small >"$tmp/out" 2>"$tmp/err"
ok "recipe with ++num_epochs 1 ++model runs" $?
[ -f "$tmp/m.001.h5" ] && [ ! -f "$tmp/m.002.h5" ]
ok "one checkpoint written" $?
[ "$(wc -l <"$tmp/m.curve.jsonl")" -eq 1 ] && grep -q '^{"epoch": 1, "lr": ' "$tmp/m.curve.jsonl"
ok "learning curve line" $?
grep -q "final dev frame error rate" "$tmp/out" &&
    grep -q "forward output:  $tmp/dev_output.h5" "$tmp/out"
ok "recipe prints its results and where they went" $?
grep -q "epoch   1/1  train score" "$tmp/out" && ! grep -q $'\r' "$tmp/out"
ok "plain summary lines when stdout is a file" $?

"$bin" recipes/12ax_blstm.lua ++num_epochs 2 ++model "$tmp/m" ++load last $small \
    >"$tmp/out" 2>"$tmp/err"
ok "++load last resumes" $?
grep -q "resumed from $tmp/m.001.h5 (epoch 1" "$tmp/out" && [ -f "$tmp/m.002.h5" ] &&
    [ "$(wc -l <"$tmp/m.curve.jsonl")" -eq 2 ]
ok "resumed at epoch 2, curve continued" $?

"$bin" forward ++model "$tmp/m.002.h5" ++data "$tmp/dev.h5" ++layer fw ++output "$tmp/fw.h5" \
    >"$tmp/out" 2>"$tmp/err"
ok "rnnlua forward runs" $?
"$bin" -e "
local ds = rl.dataset{class = 'hdf', files = {'$tmp/fw.h5'}}
local dev = rl.dataset{class = 'hdf', files = {'$tmp/dev.h5'}}
ds:init_epoch(1) dev:init_epoch(1)
assert(ds:num_seqs() == 10 and ds:extern_data().data.dim == 32, 'shape')
for i = 1, 10 do
  local a, b = ds:get_seq(i), dev:get_seq(i)
  assert(a.tag == b.tag and a.data:size(1) == b.data:size(1), 'seq ' .. i)
end" >"$tmp/err" 2>&1
ok "forward output: tags and lengths of the dev set, dim of layer fw" $?

"$bin" recipes/forward.lua ++model "$tmp/m.002.h5" ++data '{class = "12ax", num_seqs = 3}' \
    ++output "$tmp/o.h5" >"$tmp/out" 2>"$tmp/err"
ok "forward recipe with a dataset config literal" $?
grep -q "3 sequences" "$tmp/out"
ok "forward reports what it wrote" $?

# errors: non-zero exit, a message naming the key or the file
"$bin" recipes/12ax_blstm.lua ++num_epochs 1 ++model "$tmp/x" ++bogus_key 3 >"$tmp/out" 2>"$tmp/err"
[ $? -ne 0 ] && grep -q "unknown config key 'bogus_key'" "$tmp/err"
ok "unknown ++key exits non-zero naming it" $?
"$bin" recipes/12ax_blstm.lua --num_epochs 3 ++model "$tmp/x" >"$tmp/out" 2>"$tmp/err"
[ $? -ne 0 ] && grep -q "^rnnlua: recipes/12ax_blstm.lua:[0-9]*: --num_epochs: options are written ++key value (++num_epochs)$" "$tmp/err" &&
    ! grep -q "stack traceback\|lua/rnnlua/" "$tmp/err" && [ ! -f "$tmp/x.001.h5" ]
ok "--num_epochs is an error naming ++num_epochs and the recipe's line, not ignored" $?
"$bin" recipes/12ax_blstm.lua ++num_epochs 1 ++num_epochs 2 >"$tmp/out" 2>"$tmp/err"
[ $? -ne 0 ] && grep -q "++num_epochs: given twice, as '1' and as '2'" "$tmp/err"
ok "an option given twice with different values" $?
"$bin" recipes/12ax_blstm.lua --help >"$tmp/out" 2>"$tmp/err"
[ $? -eq 0 ] && grep -q "^  ++num_epochs  *\[8\]" "$tmp/out" && grep -q "^  ++learning_rate  *\[0.01\]" "$tmp/out"
ok "recipe --help lists rl.train's keys with the recipe's values" $?
nohelp=0
for r in recipes/*.lua; do
    case $r in *_data.lua|*/sub_epochs.lua|*/lm_fusion.lua) continue ;; esac # helpers, no recipes
    "$bin" "$r" --help >"$tmp/out" 2>"$tmp/err" && grep -q "usage: rnnlua" "$tmp/out" ||
        { echo "no --help: $r"; nohelp=1; }
done
ok "every recipe answers --help" $nohelp
"$bin" recipes/char_lm.lua ++hiden 8 >"$tmp/out" 2>"$tmp/err"
[ $? -ne 0 ] && grep -q "++hiden: unknown option (did you mean ++hidden?)" "$tmp/err"
ok "a misspelt recipe option names the closest" $?
"$bin" forward ++model "$tmp/none.h5" ++data "$tmp/dev.h5" ++output "$tmp/o2.h5" \
    >"$tmp/out" 2>"$tmp/err"
[ $? -ne 0 ] && grep -q "$tmp/none.h5" "$tmp/err" && [ ! -f "$tmp/o2.h5" ]
ok "forward with a missing checkpoint exits non-zero naming it" $?
head -c 3000 "$tmp/m.002.h5" >"$tmp/cut.h5"
"$bin" forward ++model "$tmp/cut.h5" ++data "$tmp/dev.h5" ++output "$tmp/o3.h5" \
    >"$tmp/out" 2>"$tmp/err"
[ $? -ne 0 ] && grep -q "$tmp/cut.h5" "$tmp/err"
ok "forward with a truncated checkpoint exits non-zero naming it" $?
"$bin" forward ++model "$tmp/m.002.h5" ++output "$tmp/o.h5" >"$tmp/out" 2>"$tmp/err"
[ $? -eq 2 ] && grep -q "^rnnlua: ++data: missing$" "$tmp/err" && grep -q "^(rnnlua forward --help)$" "$tmp/err"
ok "forward without ++data names it" $?
"$bin" forward model="$tmp/m.002.h5" >"$tmp/out" 2>"$tmp/err"
[ $? -eq 2 ] && grep -q "model=.*: options are written ++key value (++model " "$tmp/err"
ok "forward with key=value names ++key" $?

# a model with a Lua layer class: ++lua FILE registers it before the checkpoint loads
cp tests/data/scale_layer.lua "$tmp/scale.lua"
echo 'error("not today")' >"$tmp/raises.lua"
"$bin" -e "dofile('$tmp/scale.lua')
rl.save_checkpoint('$tmp/lua.h5', {net = rl.network({output = {class = 'scale', k = 3, from = 'data'}},
  {data = {dim = 9}}), epoch = 1})" >"$tmp/err" 2>&1
ok "a checkpoint of a network with a Lua layer class" $?
"$bin" forward ++model "$tmp/lua.h5" ++data "$tmp/dev.h5" ++output "$tmp/o4.h5" \
    >"$tmp/out" 2>"$tmp/err"
[ $? -ne 0 ] && grep -q "'scale'" "$tmp/err" && [ ! -f "$tmp/o4.h5" ]
ok "forward of it without ++lua exits non-zero naming the class" $?
"$bin" forward ++model "$tmp/lua.h5" ++data "$tmp/dev.h5" ++output "$tmp/o4.h5" \
    ++lua "$tmp/scale.lua" >"$tmp/out" 2>"$tmp/err" &&
    "$bin" -e "
local o = rl.dataset{class = 'hdf', files = {'$tmp/o4.h5'}}
local d = rl.dataset{class = 'hdf', files = {'$tmp/dev.h5'}}
o:init_epoch(1) d:init_epoch(1)
for i = 1, d:num_seqs() do
  local a, b = o:get_seq(i).data, d:get_seq(i).data
  assert((a - b * 3):abs():max() < 1e-6, 'seq ' .. i)
end" >"$tmp/err" 2>&1
ok "forward with ++lua scale.lua writes 3 x the input" $?
"$bin" forward ++model "$tmp/lua.h5" ++data "$tmp/dev.h5" ++output "$tmp/o5.h5" \
    ++lua "$tmp/raises.lua" >"$tmp/out" 2>"$tmp/err"
[ $? -ne 0 ] && grep -q "++lua $tmp/raises.lua: .*not today" "$tmp/err"
ok "++lua with a file that raises exits non-zero naming it and the error" $?

# rnnlua serve reads ++key value too (++max_batch_frames is --max-batch-frames)
"$bin" serve "$tmp/m.002.h5" ++port 0 ++max_batch_frames 100 ++listen 127.0.0.1 \
    >"$tmp/serve.out" 2>"$tmp/serve.err" &
spid=$!
for _ in $(seq 100); do grep -q "listening on http://127.0.0.1:" "$tmp/serve.out" && break; sleep 0.1; done
grep -q "listening on http://127.0.0.1:" "$tmp/serve.out"
ok "serve ++port 0 ++max_batch_frames 100 listens" $?
kill -TERM "$spid" 2>/dev/null
wait "$spid"
ok "serve exits 0 on SIGTERM" $?
"$bin" serve "$tmp/m.002.h5" ++prot 0 >"$tmp/out" 2>"$tmp/err"
[ $? -eq 2 ] && grep -qF "rnnlua: ++prot: unknown option (did you mean --port?)" "$tmp/err"
ok "serve: an unknown ++option" $?

# rnnlua train: the seed paper's Figure 1 network (a BLSTM) as a RETURNN 2016 JSON config learns
# 12AX to 0% dev frame error (about 15 s on 2 loaded cores)
"$bin" train recipes/12ax_returnn.json ++model "$tmp/j/net" ++log_file "$tmp/j/log" \
    >"$tmp/out" 2>"$tmp/err"
ok "rnnlua train CONFIG.json runs" $?
grep -q "^final dev frame error rate: 0.00% .* after 10 epochs$" "$tmp/out" && [ -f "$tmp/j/net.010.h5" ]
ok "Figure 1 as JSON: 0% dev frame error after 10 epochs" $?
"$bin" info "$tmp/j/net.010.h5" >"$tmp/out" 2>"$tmp/err" &&
    grep -q "^  *fw0  *lstm  *32  *data" "$tmp/out" && grep -q "^  *bw0  *lstm  *32" "$tmp/out"
ok "class rec with unit lstm and direction is rnnlua's lstm" $?
cat >"$tmp/c.lua" <<'LUA'
return {network = {fw = {class = "lstm", n_out = 8},
                   output = {class = "softmax", from = "fw", loss = "ce", target = "classes"}},
        train = {class = "12ax", num_seqs = 20, max_len = 20, seed = 1},
        dev = {class = "12ax", num_seqs = 5, max_len = 20, seed = 2},
        num_epochs = 3, log_verbosity = 1}
LUA
"$bin" train "$tmp/c.lua" ++num_epochs 1 ++model "$tmp/c/net" >"$tmp/out" 2>"$tmp/err" &&
    [ -f "$tmp/c/net.001.h5" ] && [ ! -f "$tmp/c/net.002.h5" ]
ok "rnnlua train CONFIG.lua with an override" $?
# bad configs: errors naming the file, the line and column, the key or the layer
bad() { # name, expected text (grep -F), file content, extension
    printf '%s' "$3" >"$tmp/bad.$4"
    "$bin" train "$tmp/bad.$4" ++model "$tmp/bad/net" >"$tmp/out" 2>"$tmp/err"
    rc=$?
    [ $rc -ne 0 ] && grep -qF -- "$2" "$tmp/err" && ! grep -q "stack traceback\|lua/rnnlua/" "$tmp/err" &&
        [ ! -f "$tmp/bad/net.001.h5" ]
    ok "$1" $?
}
net='"network": {"fw": {"class": "rec", "n_out": 4}, "output": {"class": "softmax", "loss": "ce", "from": ["fw"]}}'
ds='"train": {"class": "Task12AXDataset", "num_seqs": 5}'
bad "malformed JSON: line and column" "rnnlua: $tmp/bad.json:3:1: " $'{
  "num_epochs": 1,
}' json
bad "unknown RETURNN key" "rnnlua: $tmp/bad.json: unknown key 'num_epoch' (did you mean 'num_epochs'?" \
    "{$net, $ds, \"num_epoch\": 2}" json
bad "from names a missing layer" "rnnlua: $tmp/bad.json: network.output.from: no layer 'fw2' (did you mean 'fw'?)" \
    "{${net/\[\"fw\"\]/[\"fw2\"]}, $ds}" json
bad "unknown layer class" "rnnlua: $tmp/bad.json: network.fw.class: unknown class 'recc' (did you mean 'rec'?)" \
    "{${net/\"rec\"/\"recc\"}, $ds}" json
bad "a key rnnlua's layer does not have" "rnnlua: $tmp/bad.json: rl.train: " \
    "{${net/\"n_out\": 4/\"n_out\": 4, \"sharpgates\": \"none\"}, $ds}" json
bad "neither Lua nor JSON" "rnnlua: $tmp/bad.cfg: neither a Lua config" 'num_epochs = = 3' cfg
bad "a Lua config returning no table" "rnnlua: $tmp/bad.lua: must return the rl.train config table, got nil" \
    'x = 1' lua
bad "a Lua config with an error: its own line first" "rnnlua: $tmp/bad.lua:2: " $'local x = 1\nerror("oops")' lua
"$bin" train recipes/12ax_returnn.json ++num_epochs 1 ++num_epochs 2 >"$tmp/out" 2>"$tmp/err"
[ $? -eq 2 ] && grep -q "^rnnlua: ++num_epochs: given twice, as '1' and as '2'$" "$tmp/err"
ok "rnnlua train: an option given twice" $?
"$bin" train "$tmp/nothing.json" >"$tmp/out" 2>"$tmp/err"
[ $? -ne 0 ] && grep -q "rnnlua: $tmp/nothing.json: cannot open" "$tmp/err"
ok "rnnlua train: a missing config" $?

# --help KEY: one config key's type, default and help; a misspelt one names the closest (exit 2)
out=$("$bin" train --help num_epochs 2>"$tmp/err")
ok "rnnlua train --help num_epochs exits 0" $?
[ "$(head -n 2 <<<"$out")" = "++num_epochs (integer, default 1)
  epochs to train (the last epoch number)" ]
ok "rnnlua train --help num_epochs: type, default and help" $?
"$bin" train --help nm_epochs >/dev/null 2>"$tmp/err"
[ $? -eq 2 ] && grep -qF "rnnlua: --help nm_epochs: no option or config key of that name (did you mean ++num_epochs?)" "$tmp/err"
ok "rnnlua train --help nm_epochs: status 2, the closest key named" $?
"$bin" recipes/12ax_blstm.lua --help learning_rate_control >"$tmp/out" 2>"$tmp/err"
[ $? -eq 0 ] && grep -qx "  this run: newbob" "$tmp/out"
ok "rl.train's --help KEY shows the recipe's value" $?
finish
