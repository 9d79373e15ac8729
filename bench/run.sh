#!/usr/bin/env bash
# Runs every benchmark in turn and prints one Markdown report, ready to paste into bench/README.md:
# a header naming the machine, then each benchmark's own Markdown section (title, table, notes).
#   1. the bench programs BUILD/bench/* (built from bench/*.c): gemm first, then the others in
#      name order;
#      right after BUILD/bench/lstm, bench/lstm_compare.sh times LSTM networks' training steps
#      against a current PyTorch (bench/torch_env.sh sets it up under BUILD), interleaved, with
#      peak memory; on an AVX-512 machine a second table forces both to AVX2
#      (RL_BENCH_LEVEL=avx2), which is what an AVX2-only machine runs;
#      BUILD/bench/gru runs under bench/torch_gru.py with the PyTorch of bench/torch_env.sh,
#      which interleaves its measurements with nn.GRU's (alone, with a SKIP line, when that
#      PyTorch cannot be set up);
#   2. bench/serve_wrk.sh: `rnnlua serve` under wrk for 60 s, good and malformed requests;
#   3. the Lua scripts bench/*.lua, each run by BUILD/rnnlua (bench/lstm_step.lua is
#      lstm_compare.sh's worker and bench/bench.lua their shared helpers, not run on their own).
# gemm prints "sgemm peak: X GFLOP/s"; X is exported as RL_SGEMM_PEAK_GFLOPS to everything run
# after it, so that later benchmarks can report a fraction of the machine's GEMM speed.
# RL_BENCH_SECONDS (seconds per measurement, default 0.5) and RL_BENCH_ROUNDS (measurements
# per variant, default 5) pass through to the benchmarks. Exits 1 if any benchmark failed.
set -u
build=${1:-build}
bin="$build/rnnlua"
log=$(mktemp)
trap 'rm -f "$log"' EXIT
failed=0

cpu=$(grep -m1 '^model name' /proc/cpuinfo | sed 's/^[^:]*: *//')
blas_threads=$("$bin" -e 'io.write(rl.get_num_threads())' 2>/dev/null || echo '?')
echo "## rnnlua benchmarks"
echo
echo "- machine: $(nproc) CPUs, ${cpu:-unknown CPU}, $(free -g | awk '/^Mem:/ {print $2}') GiB," \
    "load average $(cut -d' ' -f1-3 /proc/loadavg) at the start"
echo "- OpenBLAS threads: $blas_threads (default; the elementwise loops run on 1 thread)"
echo "- $(date -u '+%Y-%m-%d %H:%M UTC'), rnnlua $("$bin" -v 2>/dev/null | head -n 1)," \
    "build dir \`$build\`"
echo "- timing: median of ${RL_BENCH_ROUNDS:-5} interleaved measurements of" \
    "~${RL_BENCH_SECONDS:-0.5} s each, wall clock"
echo

run_one() {
    local name=$1
    shift
    "$@" >"$log" 2>&1
    local rc=$?
    cat "$log"
    echo
    if [ "$rc" -ne 0 ]; then
        echo "**FAILED: $name (exit $rc)**"
        echo
        failed=1
    fi
    local peak
    peak=$(sed -n 's/^sgemm peak: \([0-9.]*\) GFLOP\/s.*/\1/p' "$log" | tail -n 1)
    if [ -n "$peak" ]; then
        export RL_SGEMM_PEAK_GFLOPS=$peak
    fi
}

programs=()
[ -x "$build/bench/gemm" ] && programs+=("$build/bench/gemm")
for p in "$build"/bench/*; do
    case $p in *.d | */gemm) continue ;; esac
    [ -f "$p" ] && [ -x "$p" ] && programs+=("$p")
done
for p in "${programs[@]}"; do
    if [ "$(basename "$p")" = gru ]; then
        if py=$(bash bench/torch_env.sh "$build" 2>/dev/null | tail -n 1) && [ -x "$py" ]; then
            run_one torch_gru "$py" bench/torch_gru.py "$p"
        else
            echo "SKIP torch_gru: bench/torch_env.sh could not set up PyTorch; rnnlua alone:"
            echo
            run_one gru "$p"
        fi
        continue
    fi
    run_one "$(basename "$p")" "$p"
    if [ "$(basename "$p")" = lstm ]; then
        run_one lstm_compare bash bench/lstm_compare.sh "$build"
        if [ "$("$bin" -e 'io.write(select(2, rl.cpu_level()))')" = avx512 ]; then
            RL_BENCH_LEVEL=avx2 run_one "lstm_compare (avx2)" bash bench/lstm_compare.sh "$build"
        fi
    fi
done
run_one serve_wrk bash bench/serve_wrk.sh "$build"
for s in bench/*.lua; do
    [ -f "$s" ] || continue
    [ "$s" = bench/lstm_step.lua ] || [ "$s" = bench/bench.lua ] && continue
    run_one "$s" "$bin" "$s"
done
echo "Load average at the end: $(cut -d' ' -f1-3 /proc/loadavg) (the machine's other work" \
    "slows all variants of a row alike, as they are interleaved, but not whole rows alike)."
exit "$failed"
