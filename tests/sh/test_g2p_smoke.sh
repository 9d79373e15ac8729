#!/usr/bin/env bash
# recipes/g2p_cmudict.lua in its smoke mode: a tiny subset of CMUdict, an attention
# encoder-decoder trained for 4 epochs (the loss must fall) and beam search on the test words
# through the search task (rl.search), ending with the recipe's `test PER X% WER Y%` line; the
# model, the test words and the search output (with attention weights that `rnnlua plot
# --heatmap` draws) land in ++out. Usage: test_g2p_smoke.sh path/to/rnnlua
set -u
source "${BASH_SOURCE%/*}/lib.sh"
out=$tmp/run.log
log=$out

"$bin" recipes/g2p_cmudict.lua ++smoke ++out "$tmp" >"$out" 2>&1
ok "the smoke run exits 0" $?
grep -Eq '^test PER [0-9.]+% WER [0-9.]+%$' "$out"
ok "it prints test PER X% WER Y%" $?
first=$(grep -m1 '^epoch 1:' "$out" | sed -E 's/.*train loss ([0-9.]+).*/\1/')
last=$(grep -m1 '^epoch 4:' "$out" | sed -E 's/.*train loss ([0-9.]+).*/\1/')
awk -v a="${first:-0}" -v b="${last:-9}" 'BEGIN { exit !(b < a) }'
ok "the training loss falls (epoch 1: ${first:-none}, epoch 4: ${last:-none})" $?
cat >"$tmp/check.lua" <<'LUA'
local ds = rl.dataset{class = "hdf", files = {arg[1] .. "/test_hyp.h5"}, allow_empty = true}
ds:init_epoch(1)
local words = rl.dataset{class = "hdf", files = {arg[1] .. "/test.h5"}}
words:init_epoch(1)
assert(ds:num_seqs() == words:num_seqs() and ds:num_seqs() > 0, "one hypothesis per test word")
for i = 1, ds:num_seqs() do
  assert(ds:get_seq(i).tag == words:get_seq(i).tag, "the words in order")
end
LUA
"$bin" "$tmp/check.lua" "$tmp" >>"$out" 2>&1
ok "test_hyp.h5 holds one hypothesis per test word, in order" $?
"$bin" plot "$tmp/test_hyp.h5" --heatmap attention --seq 2 -o "$tmp/att.png" >>"$out" 2>&1
ok "its attention weights draw as a heat map" $?
finish
