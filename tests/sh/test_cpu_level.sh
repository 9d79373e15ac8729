#!/usr/bin/env bash
# The run-time CPU level (kernels/cpu/cpu_level.h) through the host: RL_CPU_LEVEL is checked at
# start-up with a clear error, rl.cpu_level() reads and sets it, and an LSTM network's loss and
# gradient norm agree at every level this CPU supports. Usage: test_cpu_level.sh BIN
set -u
source "${BASH_SOURCE%/*}/lib.sh"

out=$(RL_CPU_LEVEL=avx3 "$bin" -e 'print(1)' 2>&1)
rc=$?
contains "unknown RL_CPU_LEVEL is refused as rnnlua: <where>: <what>" \
    "rnnlua: RL_CPU_LEVEL=avx3: expected generic, avx2 or avx512" "$out"
[[ "$out" != *"rnnlua: rnnlua:"* ]] && ok "the RL_CPU_LEVEL error has one prefix" ||
    bad "the RL_CPU_LEVEL error has one prefix" "$out"
[ "$rc" -ne 0 ] && ok "unknown RL_CPU_LEVEL exits non-zero" || bad "unknown RL_CPU_LEVEL exits non-zero" "rc $rc"

best=$("$bin" -e 'local _, b = rl.cpu_level(); io.write(b)')
contains "best level is named" "$best" "generic avx2 avx512"
out=$(RL_CPU_LEVEL=generic "$bin" -e 'io.write((rl.cpu_level()))')
contains "RL_CPU_LEVEL=generic is used" "generic" "$out"
out=$("$bin" -e 'print(pcall(rl.cpu_level, "sse9"))' 2>&1)
contains "bad level name is a Lua error" "cpu level 'sse9': expected generic, avx2 or avx512" "$out"
if [ "$best" != avx512 ]; then
    out=$("$bin" -e 'print(pcall(rl.cpu_level, "avx512"))' 2>&1)
    contains "unsupported level is a Lua error" "avx512 is not supported by this CPU" "$out"
fi

# One forward and backward of a bidirectional LSTM network (float32, sizes over the packed
# GEMM's panel and row blocks) at each level: loss and gradient norm within float32 noise.
cat >"$tmp/net.lua" <<'LUA'
rl.cpu_level(arg[1])
rl.manual_seed(3)
local net = rl.network({
  fw = {class = "lstm", n_out = 53, from = "data"},
  bw = {class = "lstm", n_out = 53, from = "data", direction = -1},
  output = {class = "softmax", from = {"fw", "bw"}, loss = "ce", target = "classes"},
}, {data = {dim = 13}, classes = {dim = 7, sparse = true}})
local T, B = 9, 11
local x = rl.randn(T, B, 13)
local y = rl.zeros(T, B):int()
for t = 1, T do for b = 1, B do y[t][b] = (t * 3 + b) % 7 end end
local len = rl.tensor({9, 8, 9, 1, 5, 9, 9, 2, 9, 7, 9}, "int32")
local loss = net:forward{data = x, classes = y, lengths = len}
net:backward()
io.write(string.format("%.6f %.6f", loss, net:grads():norm()))
LUA
# levels_agree NAME SCRIPT: the script's two figures at each level above generic against generic's
levels_agree() {
    local ref got agree lv levels=""
    ref=$("$bin" "$2" generic 2>&1)
    [ "$best" = avx2 ] && levels="avx2"
    [ "$best" = avx512 ] && levels="avx2 avx512"
    for lv in $levels; do
        got=$("$bin" "$2" "$lv" 2>&1)
        agree=$(awk -v a="$ref" -v b="$got" 'BEGIN { na = split(a, x, " "); nb = split(b, y, " ");
            d1 = x[1] - y[1]; d2 = x[2] - y[2]; if (d1 < 0) d1 = -d1; if (d2 < 0) d2 = -d2;
            print (na == 2 && nb == 2 && d1 <= 1e-4 * (1 + x[1]) && d2 <= 1e-4 * (1 + x[2])) ? "yes" : "no" }')
        if [ "$agree" = yes ]; then
            ok "$1 at $lv agrees with generic ($got vs $ref)"
        else
            bad "$1 at $lv agrees with generic" "generic: $ref" "$lv: $got"
        fi
    done
}
levels_agree network "$tmp/net.lua"
# The same with janet layers (kernels/cpu/janet.c, one pass per level; H = 37 leaves a remainder
# after the vectors) in both directions, one with zoneout.
sed -e 's/class = "lstm", n_out = 53, from = "data"}/class = "janet", n_out = 37, from = "data", zoneout = 0.2}/' \
    -e 's/class = "lstm", n_out = 53, from = "data", direction = -1}/class = "janet", n_out = 37, from = "data", direction = -1}/' \
    "$tmp/net.lua" >"$tmp/janet.lua"
levels_agree "janet network" "$tmp/janet.lua"
# The bf16 products' own levels (kernels/cpu/gemm_bf16.h): RL_BF16_LEVEL is checked at start-up,
# and the same network in precision "bf16" gives the same loss and gradient norm, within bf16's
# rounding (2^-7 relative), at each bf16 level this machine has (RL_BF16_LEVEL above the CPU's
# best runs the best, so every name is tried).
out=$(RL_BF16_LEVEL=amx2 "$bin" -e 'print(1)' 2>&1)
rc=$?
contains "unknown RL_BF16_LEVEL is refused" "RL_BF16_LEVEL=amx2: expected generic, avx512bf16 or amx" "$out"
[ "$rc" -ne 0 ] && ok "unknown RL_BF16_LEVEL exits non-zero" || bad "unknown RL_BF16_LEVEL exits non-zero" "rc $rc"
sed -i 's/^}, {data = {dim = 13}, classes = {dim = 7, sparse = true}})$/}, {data = {dim = 13}, classes = {dim = 7, sparse = true}}, {precision = arg[2]})/' "$tmp/net.lua"
ref=$(RL_BF16_LEVEL=generic "$bin" "$tmp/net.lua" "$best" bf16 2>&1)
for lv in avx512bf16 amx; do
    got=$(RL_BF16_LEVEL=$lv "$bin" "$tmp/net.lua" "$best" bf16 2>&1)
    agree=$(awk -v a="$ref" -v b="$got" 'BEGIN { na = split(a, x, " "); nb = split(b, y, " ");
        d1 = x[1] - y[1]; d2 = x[2] - y[2]; if (d1 < 0) d1 = -d1; if (d2 < 0) d2 = -d2;
        print (na == 2 && nb == 2 && d1 <= 2^-7 * x[1] && d2 <= 2^-7 * x[2]) ? "yes" : "no" }')
    if [ "$agree" = yes ]; then
        ok "bf16 network at bf16 level $lv agrees with generic ($got vs $ref)"
    else
        bad "bf16 network at bf16 level $lv agrees with generic" "generic: $ref" "$lv: $got"
    fi
done
# The int8 products' own levels (kernels/cpu/gemm_int8.h): RL_INT8_LEVEL is checked at start-up,
# and an int8 network's forward gives the same bits at every int8 level (the same integer sums,
# scaled in the same steps) as the generic one at the same kernel level, RL_CPU_LEVEL=avx2 too
# (capped at the 256-bit kernels). A level this CPU lacks runs the next one down, so every name
# is tried.
out=$(RL_INT8_LEVEL=vnni "$bin" -e 'print(1)' 2>&1)
rc=$?
contains "unknown RL_INT8_LEVEL is refused" "RL_INT8_LEVEL=vnni: expected generic, avx2, avxvnni or avx512vnni" "$out"
[ "$rc" -ne 0 ] && ok "unknown RL_INT8_LEVEL exits non-zero" || bad "unknown RL_INT8_LEVEL exits non-zero" "rc $rc"
cat >"$tmp/int8.lua" <<'LUA'
rl.manual_seed(5)
local net = rl.network({
  l1 = {class = "linear", n_out = 45, activation = "tanh", from = "data"},
  fw = {class = "lstm", n_out = 70, from = "l1"},
  bw = {class = "lstm", n_out = 70, from = "l1", direction = -1},
  output = {class = "softmax", from = {"fw", "bw"}, loss = "ce", target = "classes"},
}, {data = {dim = 13}, classes = {dim = 7, sparse = true}}, {precision = "int8"})
local T, B = 9, 3
local x = rl.randn(T, B, 13)
local y = rl.zeros(T, B):int()
local loss = net:forward{data = x, classes = y, lengths = rl.tensor({9, 4, 7}, "int32")}
io.write(string.format("%.9g %.9g", loss, net:layer("fw").output:double():abs():sum()))
LUA
for cl in avx512 avx2; do
    [ "$cl" = avx512 ] && [ "$best" != avx512 ] && continue
    [ "$best" = generic ] && continue
    # the reference at the same kernel level (the pointwise passes' bits may differ by level)
    ref=$(RL_CPU_LEVEL=$cl RL_INT8_LEVEL=generic "$bin" "$tmp/int8.lua" 2>&1)
    for lv in avx2 avxvnni avx512vnni; do
        got=$(RL_CPU_LEVEL=$cl RL_INT8_LEVEL=$lv "$bin" "$tmp/int8.lua" 2>&1)
        if [[ "$ref" =~ ^[0-9.e+-]+\ [0-9.e+-]+$ ]] && [ "$got" = "$ref" ]; then
            ok "int8 network at cpu level $cl, int8 level $lv: the bits of generic ($got)"
        else
            bad "int8 network at cpu level $cl, int8 level $lv: the bits of generic" "generic: $ref" "$lv: $got"
        fi
    done
done
finish
