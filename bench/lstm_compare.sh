#!/usr/bin/env bash
# rnnlua against a current PyTorch on LSTM training steps, as a user writes them: rnnlua runs
# bench/lstm_step.lua (rl.network, softmax output with CE loss), PyTorch bench/torch_lstm.py
# (nn.LSTM, Linear, CrossEntropyLoss), same sizes, float32, 2 threads each (RL_BENCH_THREADS
# sets another count for both).
#   bash bench/lstm_compare.sh [BUILD_DIR] [CONFIG...]     (default: every config)
# Each measurement is one process of each framework per config and round, the rounds
# interleaved (rnnlua, PyTorch, next config, ...; who goes first alternates by round), so that
# the machine's other work hits both alike; each process times its steps for
# RL_BENCH_STEP_SECONDS (default 2) after one warm-up step and reports their median; the table
# has the median over RL_BENCH_ROUNDS (default 3) rounds. Memory: the process's peak resident
# set after the steps, and that peak minus the resident set before the model was built (the
# model, its activations and workspaces, without the runtime itself).
# RL_BENCH_LEVEL=avx2 measures what an AVX2-only machine runs: rnnlua with RL_CPU_LEVEL=avx2 and
# OpenBLAS with OPENBLAS_CORETYPE=Haswell; PyTorch with ATEN_CPU_CAPABILITY=avx2 for its own
# kernels, and its MKL and oneDNN (which run nn.LSTM's products) with MKL_ENABLE_INSTRUCTIONS=AVX2
# and ONEDNN_MAX_CPU_ISA=AVX2 (ATEN_CPU_CAPABILITY alone leaves those on AVX-512: oneDNN's
# verbose mode says so). rnnlua's own -march build flags still apply: build with
# ARCH=x86-64-v3 for a strict one.
# RL_SGEMM_PEAK_GFLOPS (exported by bench/run.sh) adds rnnlua's fraction of the sgemm peak.
# RL_BENCH_PRECISIONS (default "fp32") lists the precisions to run, each a row per config:
# "fp32 bf16" runs rnnlua with precision = "bf16" and PyTorch under bf16 autocast too, in the
# same interleaved rounds, and adds each row's speed against rnnlua's float32 row; "int8" (the
# forward-only configs utt768, utt512) runs rnnlua with precision = "int8" and PyTorch's
# quantize_dynamic copy of the model (qint8 LSTM and Linear).
# The tiny-batch configs (tiny1, tiny3: training at batch 1 and 3; utt768, utt512: one
# utterance's forward at batch 1) are run only when named.
# PyTorch comes from bench/torch_env.sh; without it the PyTorch columns say "n/a".
# With chime among the configs the same rounds also time LSTMP on its shapes (n_out = 1024,
# n_proj = 256 in every layer against nn.LSTM's proj_size = 256), for a second table: LSTMP
# against PyTorch's and against the plain 512 LSTM of the first, all in the same run.
set -u
build=${1:-build}
shift || true
configs=("$@")
[ ${#configs[@]} -eq 0 ] && configs=(seqmnist ptb_small odd ptb_large chime)
rounds=${RL_BENCH_ROUNDS:-3}
secs=${RL_BENCH_STEP_SECONDS:-2}
level=${RL_BENCH_LEVEL:-}
precs=(${RL_BENCH_PRECISIONS:-fp32})
bin="$build/rnnlua"

envs=()
if [ -n "$level" ]; then
    envs=(RL_CPU_LEVEL="$level")
    if [ "$level" = avx2 ]; then
        envs+=(ATEN_CPU_CAPABILITY=avx2 MKL_ENABLE_INSTRUCTIONS=AVX2 ONEDNN_MAX_CPU_ISA=AVX2
            OPENBLAS_CORETYPE=Haswell)
    fi
fi
py=$(bash bench/torch_env.sh "$build" 2>/dev/null | tail -n 1)
[ -x "$py" ] || py=""
tv=n/a
[ -n "$py" ] && tv=$("$py" -c 'import torch; print(torch.__version__.split("+")[0])' 2>/dev/null)

declare -A ms mem base
measure() { # KEY CMD... -> appends "ms peak base" of the RESULT line to ms/mem/base[KEY]
    local key=$1 line
    shift
    line=$(env "${envs[@]}" timeout 900 "$@" 2>&1 | grep '^RESULT' | tail -n 1)
    [ -n "$line" ] || return 0
    set -- $line
    ms[$key]="${ms[$key]:-} $3"
    mem[$key]="${mem[$key]:-} $4"
    base[$key]="${base[$key]:-} $5"
}
median() { tr ' ' '\n' | grep -v '^$' | sort -g | awk '{v[NR] = $1} END {
    if (NR == 0) print "n/a"; else if (NR % 2) print v[(NR + 1) / 2]; else print (v[NR / 2] + v[NR / 2 + 1]) / 2 }'; }

load0=$(cut -d' ' -f1-3 /proc/loadavg)
for ((r = 0; r < rounds; r++)); do
    for c in "${configs[@]}"; do
        for p in "${precs[@]}"; do
            if ((r % 2 == 0)); then
                measure "rl/$c/$p" "$bin" bench/lstm_step.lua "$c" "$secs" cpu "$p"
                [ -n "$py" ] && measure "pt/$c/$p" "$py" bench/torch_lstm.py "$c" "$secs" cpu "$p"
            else
                [ -n "$py" ] && measure "pt/$c/$p" "$py" bench/torch_lstm.py "$c" "$secs" cpu "$p"
                measure "rl/$c/$p" "$bin" bench/lstm_step.lua "$c" "$secs" cpu "$p"
            fi
        done
        [ "$c" = chime ] || continue
        measure rl/lstmp "$bin" bench/lstm_step.lua chime "$secs" cpu fp32 "n_out=1024,n_proj=256"
        [ -n "$py" ] && measure pt/lstmp "$py" bench/torch_lstm.py chime "$secs" cpu fp32 \
            "hidden=1024,proj=256"
    done
done

# FLOPs per step: 24*T*B*H*(I+H) per LSTM direction and layer + 6*T*B*dirs*H*C (output); a
# forward alone a third of that
declare -A FLOPS=(
    [tiny1]=$((24 * 311 * 257 * 514 * 3 + 6 * 311 * 257 * 257))
    [tiny3]=$((3 * (24 * 311 * 257 * 514 * 3 + 6 * 311 * 257 * 257)))
    [utt768]=$((8 * 400 * 768 * (80 + 768) + 2 * 8 * 400 * 768 * 1536 + 2 * 400 * 768 * 1000))
    [utt512]=$((2 * 8 * 500 * 512 * (80 + 512) + 2 * 8 * 500 * 512 * 1536 + 2 * 500 * 1024 * 1000))
    [seqmnist]=$((24 * 28 * 64 * 128 * (28 + 128) + 6 * 28 * 64 * 128 * 10))
    [ptb_small]=$((24 * 20 * 20 * 200 * 400 + 6 * 20 * 20 * 200 * 10000))
    [odd]=$((2 * 24 * 137 * 7 * 300 * (61 + 300) + 2 * 24 * 137 * 7 * 300 * 900 + 6 * 137 * 7 * 600 * 43))
    [ptb_large]=$((2 * 24 * 50 * 20 * 650 * 1300 + 6 * 50 * 20 * 650 * 10000))
    [chime]=$((2 * 24 * 250 * 16 * 512 * 557 + 4 * 24 * 250 * 16 * 512 * 1536 + 6 * 250 * 16 * 1024 * 1501))
)
peak=${RL_SGEMM_PEAK_GFLOPS:-}
echo "### LSTM training step: rnnlua vs PyTorch $tv${level:+ (level forced to $level)}"
echo
echo "rnnlua \`bench/lstm_step.lua\` (rl.network) vs \`bench/torch_lstm.py\`, ${precs[*]}, CPU," \
    "${RL_BENCH_THREADS:-2} thread(s) each; median of $rounds interleaved rounds (one process per framework, config" \
    "and round, each the median of its steps over ${secs} s); load average $load0 at the start," \
    "$(cut -d' ' -f1-3 /proc/loadavg) at the end."
echo
echo "| config | precision | rnnlua ms | PyTorch ms | rnnlua speed / PyTorch |" \
    "rnnlua speed / its fp32 | rnnlua GFLOP/s${peak:+ (of sgemm peak)} |" \
    "rnnlua peak MiB (above start) | PyTorch peak MiB (above start) |"
echo "|---|---|---:|---:|---:|---:|---:|---:|---:|"
for c in "${configs[@]}"; do
    a32=$(echo "${ms[rl/$c/fp32]:-}" | median)
    for p in "${precs[@]}"; do
        a=$(echo "${ms[rl/$c/$p]:-}" | median)
        b=$(echo "${ms[pt/$c/$p]:-}" | median)
        ma=$(echo "${mem[rl/$c/$p]:-}" | median)
        mb=$(echo "${mem[pt/$c/$p]:-}" | median)
        ba=$(echo "${base[rl/$c/$p]:-}" | median)
        bb=$(echo "${base[pt/$c/$p]:-}" | median)
        awk -v c="$c" -v p="$p" -v a="$a" -v b="$b" -v a32="$a32" -v ma="$ma" -v mb="$mb" \
            -v ba="$ba" -v bb="$bb" -v f="${FLOPS[$c]}" -v peak="$peak" 'function mib(x, y) {
                return x == "n/a" ? "n/a" : sprintf("%.0f (%.0f)", x / 1024, (x - y) / 1024) }
            BEGIN {
                ratio = (a != "n/a" && b != "n/a") ? sprintf("%.2fx", b / a) : "n/a"
                own = (a != "n/a" && a32 != "n/a") ? sprintf("%.2fx", a32 / a) : "n/a"
                gf = a != "n/a" ? sprintf("%.1f", f / (a * 1e-3) / 1e9) : "n/a"
                if (peak != "" && a != "n/a") gf = gf sprintf(" (%.0f%%)", 100 * f / (a * 1e-3) / 1e9 / peak)
                printf "| %s | %s | %s | %s | %s | %s | %s | %s | %s |\n", c, p,
                    a == "n/a" ? a : sprintf("%.1f", a), b == "n/a" ? b : sprintf("%.1f", b),
                    ratio, own, gf, mib(ma, ba), mib(mb, bb) }'
    done
done
echo
if [ -n "${ms[rl/lstmp]:-}" ]; then
    a=$(echo "${ms[rl/lstmp]}" | median)
    b=$(echo "${ms[pt/lstmp]:-}" | median)
    p=$(echo "${ms[rl/chime/fp32]:-}" | median)
    echo "### LSTMP (n_proj) on the chime shapes: rnnlua vs PyTorch's proj_size, and vs the plain LSTM"
    echo
    echo '3 bidirectional layers of LSTMP 1024 -> 256 (rnnlua `n_out = 1024, n_proj = 256`,' \
        'PyTorch `nn.LSTM(hidden_size=1024, proj_size=256)`), input 45, T 250, B 16, 1501' \
        'classes, measured in the same rounds as the table above.'
    echo
    awk -v a="$a" -v b="$b" -v p="$p" 'function f(x) { return x == "n/a" ? x : sprintf("%.1f", x) }
        function r(x, y) { return (x == "n/a" || y == "n/a") ? "n/a" : sprintf("%.2fx", x / y) }
        BEGIN {
            print "| model | rnnlua ms | PyTorch ms | rnnlua speed / PyTorch | LSTMP speed / plain 512 (rnnlua) |"
            print "|---|---:|---:|---:|---:|"
            printf "| LSTMP 1024 -> 256 | %s | %s | %s | %s |\n", f(a), f(b), r(b, a), r(p, a) }'
    echo
fi
[ -n "$py" ] || echo "PyTorch: bench/torch_env.sh could not set up a current PyTorch (no PyPI?)."
if [ -n "$py" ]; then # the instruction set PyTorch's oneDNN (its LSTM products) ran with
    isa=$(env "${envs[@]}" ONEDNN_VERBOSE=1 timeout 120 "$py" -c 'import torch
torch.nn.LSTM(8, 8)(torch.zeros(2, 1, 8))' 2>&1 | sed -n 's/.*info,cpu,isa://p' | head -n 1)
    echo "PyTorch's oneDNN ran with: ${isa:-(not reported)}."
fi
