#!/usr/bin/env bash
# recipes/g2p_cmudict.lua in its smoke mode: a tiny subset of CMUdict, an attention
# encoder-decoder trained for 4 epochs (the loss must fall) and beam search on the test words,
# ending with the recipe's `test PER X% WER Y%` line. Usage: test_g2p_smoke.sh path/to/rnnlua
set -u
bin=${1:?usage: test_g2p_smoke.sh path/to/rnnlua}
pass=0
fail=0
out=$(mktemp)
trap 'rm -f "$out"' EXIT

ok() {
    if [ "$2" -eq 0 ]; then pass=$((pass + 1)); else fail=$((fail + 1)); echo "FAIL $1"; tail -n 8 "$out"; fi
}

"$bin" recipes/g2p_cmudict.lua --smoke >"$out" 2>&1
ok "the smoke run exits 0" $?
grep -Eq '^test PER [0-9.]+% WER [0-9.]+%$' "$out"
ok "it prints test PER X% WER Y%" $?
first=$(grep -m1 '^epoch 1:' "$out" | sed -E 's/.*train loss ([0-9.]+).*/\1/')
last=$(grep -m1 '^epoch 4:' "$out" | sed -E 's/.*train loss ([0-9.]+).*/\1/')
awk -v a="${first:-0}" -v b="${last:-9}" 'BEGIN { exit !(b < a) }'
ok "the training loss falls (epoch 1: ${first:-none}, epoch 4: ${last:-none})" $?
echo "$pass passed, $fail failed"
[ "$fail" -eq 0 ]
