#!/usr/bin/env bash
# recipes/char_lm.lua in its smoke mode: 24 short King James chapters converted from Debian's
# bible-kjv, a tiny LSTM LM trained for 3 epochs with carried state (the dev bits per character
# must fall), the closing `dev X bits per char` line, and a sample drawn by rl.sample from the
# checkpoint, also at the REPL. Usage: test_char_lm_smoke.sh path/to/rnnlua
set -u
source "${BASH_SOURCE%/*}/lib.sh"
out=$tmp/run.log
log=$out

"$bin" recipes/char_lm.lua ++smoke ++out "$tmp" >"$out" 2>&1
ok "the smoke run exits 0" $?
grep -Eq '^dev [0-9.]+ bits per char$' "$out"
ok "it prints dev X bits per char" $?
# ok WHAT: the dev bits per character of epoch 3 in $out are below those of epoch 1
falls() {
  local first last
  first=$(grep -m1 '^epoch 1 dev bpc' "$out" | awk '{print $5}')
  last=$(grep -m1 '^epoch 3 dev bpc' "$out" | awk '{print $5}')
  awk -v a="${first:-0}" -v b="${last:-9}" 'BEGIN { exit !(b < a) }'
  ok "$1 (epoch 1: ${first:-none}, epoch 3: ${last:-none})" $?
}
falls "the dev bits per character fall"
[ "$(sed -n '/^sample: /,$p' "$out" | wc -c)" -ge 308 ]
ok "it prints a sample of 300 characters" $?
# at the REPL (through a pipe): the same seed gives the same 40 characters
ck=$(sed -n 's/^checkpoint //p' "$out")
repl() { printf '#rl.sample{model = "%s", prime = "And", length = 40, seed = 3}\nrl.sample{model = "%s", prime = "And", length = 40, seed = 3} == rl.sample{model = "%s", prime = "And", length = 40, seed = 3}\n' "$ck" "$ck" "$ck" | "$bin" 2>&1; }
[ "$(repl | tr '\n' ' ')" = "40 true " ]
ok "rl.sample at the REPL: 40 characters, the same for the same seed ($(repl | tr '\n' ' '))" $?
# the converted data is reused by a second run (DONE), which then trains from scratch again
"$bin" recipes/char_lm.lua ++smoke ++out "$tmp" ++num_epochs 1 >"$out" 2>&1
ok "a second run reuses the data" $?
! grep -q 'converted' "$out"
ok "... without converting it again" $?
# the LSTM options of the recipe: LSTMP layers (carried state h of P, c of H) in bf16 with
# layer norm and DropConnect; bf16 runs on every CPU (a generic path without bf16 instructions)
"$bin" recipes/char_lm.lua ++smoke ++out "$tmp" ++proj 12 ++layer_norm ++weight_dropout 0.1 \
  ++precision bf16 >"$out" 2>&1
ok "a smoke run with ++proj 12 ++layer_norm ++weight_dropout 0.1 ++precision bf16 exits 0" $?
grep -q 'x LSTM 24 proj 12,.*, bf16$' "$out"
ok "... and says so" $?
falls "... its dev bits per character fall"
"$bin" recipes/char_lm.lua ++smoke ++out "$tmp" ++proj 24 >"$out" 2>&1
[ $? -ne 0 ] && grep -q '++proj: must be 0 (none) or in 1..23' "$out"
ok "++proj not below ++hidden is refused by name" $?
"$bin" recipes/char_lm.lua ++smoke ++out "$tmp" ++precision fp16 >"$out" 2>&1
[ $? -ne 0 ] && grep -q '++precision: must be fp32 or bf16' "$out"
ok "an unknown ++precision is refused by name" $?
finish
