#!/usr/bin/env bash
# The device kit's run (copied to build-device/kit/run.sh by `make device-kit`; docs/gpu.md):
#   bash build-device/kit/run.sh [--quick] [OUTDIR]
# On a GPU machine that has the NVIDIA driver, the CUDA toolkit and Python (cuDNN and NCCL from
# the toolkit or from Python wheels) and nothing else. Writes OUTDIR/report.md (default
# $OUT, else ./kit-out) and OUTDIR/logs.tar.gz, in this order so that the first results survive
# when time runs out: the GPU and the libraries found; every parity suite with the GPU as the
# device side; a 12AX training run on the GPU against the CPU; the benchmarks (own kernels vs
# cuDNN, rnnlua vs PyTorch on the GPU, MDLSTM GPU vs CPU, CTC vs torch's ctc_loss); NCCL on the
# one GPU; compute-sanitizer's memcheck over the parity programs while time is left.
# Without a GPU (or when rnnlua cannot use it) everything runs with the CPU as the device side,
# as `make test-gpu` does, and the report says so on every line.
# The report is rewritten after every step; each step has a time limit and the whole run a
# deadline (RL_KIT_BUDGET seconds, default 450; --quick: 240, fewer rounds and configurations),
# so a hang, a crash or a missing library becomes a line of the report, never the end of the
# run. Exit status: 0 when everything that ran passed, 1 when something failed or did not run,
# 2 when OUTDIR cannot be written (the report then goes to stdout).
set -u
kit=$(cd "$(dirname "$0")" && pwd)
quick=0
if [ "${1:-}" = "--quick" ]; then
    quick=1
    shift
fi
out=${1:-${OUT:-kit-out}}
budget=${RL_KIT_BUDGET:-$([ "$quick" = 1 ] && echo 240 || echo 450)}
t_start=$(date +%s)
failures=0

work=$(mktemp -d "${TMPDIR:-/tmp}/rnnlua-kit.XXXXXX") || { echo "run.sh: no temporary folder" >&2; exit 2; }
logs=$work/logs
mkdir -p "$logs"
body=$work/report.md
: >"$body"
trap 'rm -rf "$work"' EXIT

# ---- the report: kept in $work, copied to $out after every step (a full $out keeps the last
# copy that fit and the report says so on stdout)
out_ok=1
if ! mkdir -p "$out" 2>/dev/null || ! (: >"$out/report.md") 2>/dev/null; then
    out_ok=0
    echo "run.sh: cannot write $out/report.md (missing, read-only or full): the report goes to stdout" >&2
else
    out=$(cd "$out" && pwd) # the run changes into the kit's folder
fi

say() { printf '%s\n' "$*" >>"$body"; }

publish() {
    [ "$out_ok" = 1 ] || return 0
    if ! cp "$body" "$out/report.md.tmp" 2>/dev/null || ! mv "$out/report.md.tmp" "$out/report.md" 2>/dev/null; then
        rm -f "$out/report.md.tmp" 2>/dev/null
        out_ok=0
        say ""
        say "**$out is full or not writable: the report stopped being copied there at this point.**"
        echo "run.sh: writing $out/report.md failed ($out full?): the report goes to stdout" >&2
        return 0
    fi
    # the logs, each cut to its last 4 MiB, as one file
    local cut=$work/cut
    rm -rf "$cut"
    mkdir -p "$cut"
    for f in "$logs"/*; do [ -f "$f" ] && tail -c 4194304 "$f" >"$cut/$(basename "$f")"; done
    if ! tar -czf "$out/logs.tar.gz.tmp" -C "$cut" . 2>/dev/null || ! mv "$out/logs.tar.gz.tmp" "$out/logs.tar.gz" 2>/dev/null; then
        rm -f "$out/logs.tar.gz.tmp" 2>/dev/null
        say "**logs.tar.gz could not be written to $out (full?); report.md is complete.**"
        cp "$body" "$out/report.md" 2>/dev/null || out_ok=0
    fi
}

elapsed() { echo $(($(date +%s) - t_start)); }
left() { echo $((budget - $(elapsed))); }

finish() {
    say ""
    say "Run ended after $(elapsed) s of a $budget s budget; $failures step(s) failed or did not run."
    publish
    [ "$out_ok" = 1 ] || cat "$body"
    if [ "$failures" -eq 0 ]; then exit 0; fi
    exit 1
}
step_pid=""
on_signal() {
    [ -n "$step_pid" ] && kill -TERM "$step_pid" 2>/dev/null
    say ""
    say "**run.sh was stopped by $1 after $(elapsed) s (during: ${current:-setup}).**"
    failures=$((failures + 1))
    finish
}
current=""
trap 'on_signal SIGTERM' TERM
trap 'on_signal SIGINT' INT

# run_step NAME LIMIT_S CMD...: runs CMD (stdout and stderr to logs/NAME.log) for at most
# LIMIT_S seconds and what is left of the budget; sets step_rc (124: time limit, 125: not run
# for lack of time) and step_s.
run_step() {
    local name=$1 limit=$2
    shift 2
    current=$name
    local l
    l=$(left)
    [ "$l" -lt "$limit" ] && limit=$l
    if [ "$limit" -lt 5 ]; then
        step_rc=125
        step_s=0
        echo "not run: the budget of $budget s was spent" >"$logs/$name.log"
        return
    fi
    local t0
    t0=$(date +%s)
    # in the background, so that a SIGTERM or SIGINT is handled at once (bash runs a trap only
    # after the foreground command ends) and stops the step too
    timeout -k 5 "$limit" "$@" >"$logs/$name.log" 2>&1 </dev/null &
    step_pid=$!
    wait "$step_pid"
    step_rc=$?
    step_pid=""
    [ "$step_rc" -eq 137 ] && step_rc=124
    step_s=$(($(date +%s) - t0))
    current=""
}

# What a failed step's exit status means, for the report.
why() {
    case "$1" in
    124) echo "killed by its time limit after $2 s" ;;
    125) echo "not run: out of time" ;;
    127) echo "could not start (a program or library missing: see its log)" ;;
    *) if [ "$1" -gt 128 ]; then echo "crashed (signal $(($1 - 128)))"; else echo "exit status $1"; fi ;;
    esac
}

manifest() { sed -n "s/^$1 //p" "$kit/MANIFEST" 2>/dev/null; }
cd "$kit" || exit 2

# The large libraries travel gzipped (scripts/device_kit.sh): unpacked into the temporary
# folder, which comes first on LD_LIBRARY_PATH, the kit's lib/ next (a library's own $ORIGIN
# cannot reach from one folder to the other).
mkdir -p "$work/lib"
unpack_err=""
for so in $(manifest packed); do
    gzip -dc "lib/$so.gz" >"$work/lib/$so" 2>"$logs/unpack.log" || unpack_err="$unpack_err $so"
done
kit_ldpath=$work/lib:$kit/lib

# ---- 1. the machine and the libraries
say "# rnnlua device kit report"
say ""
say "Kit: commit $(manifest commit), built $(manifest built), CUDA runtime $(manifest cuda_runtime) (linked in), for $(manifest gpu_arch), needs glibc $(manifest glibc) or newer (here: $(getconf GNU_LIBC_VERSION 2>/dev/null || echo ?)). Run $(date -u +%Y-%m-%dT%H:%MZ) on $(hostname 2>/dev/null || echo '?'), mode $([ "$quick" = 1 ] && echo quick || echo full), budget $budget s."
say ""
glibc=$(getconf GNU_LIBC_VERSION 2>/dev/null | awk '{print $2}')
if [ -n "$glibc" ] && [ "$(printf '%s\n%s\n' "$glibc" "$(manifest glibc)" | sort -V | head -n 1)" != "$(manifest glibc)" ]; then
    say "**This machine's glibc is $glibc, the kit needs $(manifest glibc) or newer: its programs cannot start here (build the kit on an older system).**"
    say ""
    failures=$((failures + 1))
fi
gpu="the CPU"
gpu_ok=0
if command -v nvidia-smi >/dev/null 2>&1; then
    run_step nvidia-smi 30 nvidia-smi
    if [ "$step_rc" -eq 0 ]; then
        name=$(timeout 20 nvidia-smi --query-gpu=name --format=csv,noheader 2>/dev/null | head -n 1)
        [ -n "$name" ] && gpu=$name && gpu_ok=1
        say "GPU: $(timeout 20 nvidia-smi --query-gpu=name,driver_version,memory.total,compute_cap --format=csv,noheader 2>/dev/null | head -n 1)"
        drv_cuda=$(sed -n 's/.*CUDA Version: *\([0-9.]*\).*/\1/p' "$logs/nvidia-smi.log" | head -n 1)
        say "Driver supports CUDA ${drv_cuda:-?}; the kit's runtime is $(manifest cuda_runtime)."
        if [ -n "$drv_cuda" ] && [ "$(printf '%s\n%s\n' "$drv_cuda" "$(manifest cuda_runtime)" | sort -V | head -n 1)" != "$(manifest cuda_runtime)" ]; then
            say "**The driver is older than the kit's CUDA runtime ($drv_cuda < $(manifest cuda_runtime)): rnnlua cannot use this GPU, every suite below runs with the CPU as the device side. Rebuild the kit with a toolkit no newer than $drv_cuda.**"
            failures=$((failures + 1))
        fi
    else
        say "**nvidia-smi failed ($(why "$step_rc" "$step_s")): no usable GPU; the CPU is the device side.**"
    fi
else
    say "No nvidia-smi on this machine: no GPU; every suite runs with the CPU as the device side."
fi

# cuBLAS, cuDNN and NCCL: the toolkit first, then the Python wheels (nvidia.cudnn, ...), then the
# loader's cache; each soname the kit needs from the first folder that has it.
cand=()
for d in ${CUDA_HOME:+"$CUDA_HOME/lib64" "$CUDA_HOME/lib"} /usr/local/cuda/lib64 /usr/local/cuda/lib \
    /usr/local/cuda/targets/x86_64-linux/lib; do
    [ -d "$d" ] && cand+=("$d")
done
wheels=$(timeout 60 python3 -c '
import glob, os
try:
    import nvidia
except Exception:
    raise SystemExit(0)
for p in nvidia.__path__:
    for d in sorted(glob.glob(os.path.join(p, "*", "lib"))):
        print(d)
' 2>/dev/null)
while read -r d; do [ -n "$d" ] && cand+=("$d"); done <<<"$wheels"
ldpath=""
say ""
say "| CUDA library | found in | file |"
say "|---|---|---|"
missing_libs=""
for so in $(manifest cuda_libs); do
    found=""
    for d in "${cand[@]}"; do
        if [ -s "$d/$so" ]; then found=$d; break; fi
    done
    if [ -z "$found" ]; then
        p=$(ldconfig -p 2>/dev/null | awk -v s="$so" '$1 == s {print $NF; exit}')
        [ -n "$p" ] && [ -s "$p" ] && found=$(dirname "$p")
    fi
    if [ -n "$found" ]; then
        case "$found" in */site-packages/* | */dist-packages/*) src="Python wheel" ;; *) src="toolkit" ;; esac
        say "| $so | $src: $found | $(basename "$(readlink -f "$found/$so")") |"
        case ":$ldpath:" in *":$found:"*) ;; *) ldpath=${ldpath:+$ldpath:}$found ;; esac
    else
        say "| $so | **not found** (toolkit, Python wheels, ldconfig) | - |"
        missing_libs="$missing_libs $so"
    fi
done
export LD_LIBRARY_PATH=$kit_ldpath${ldpath:+:$ldpath}
if [ -n "$unpack_err" ]; then
    say ""
    say "**Unpacking$unpack_err into $work failed (temporary folder full?): $(head -c 300 "$logs/unpack.log")**"
    failures=$((failures + 1))
fi
if [ -n "$missing_libs" ]; then
    say ""
    say "**Missing:$missing_libs. The kit's programs are linked against them and cannot start without them (e.g. no cuDNN: install the nvidia-cudnn wheel or the toolkit's cuDNN).**"
    failures=$((failures + 1))
fi
torch_py=""
if timeout 120 python3 -c "import torch" >/dev/null 2>&1; then
    torch_py=python3
    say ""
    say "PyTorch: $(timeout 120 python3 -c 'import torch; print(torch.__version__, "CUDA", torch.version.cuda, "cuDNN", torch.backends.cudnn.version(), "GPU available", torch.cuda.is_available())' 2>&1 | tail -n 1)"
else
    say ""
    say "PyTorch: not importable by python3 (the comparisons with PyTorch are skipped)."
fi
# what rnnlua itself sees: a GPU that nvidia-smi lists but rnnlua cannot use is said here
run_step rnnlua-devices 60 bin/rnnlua -e 'print(rl.device_count())'
n_dev=$(tail -n 1 "$logs/rnnlua-devices.log" 2>/dev/null)
if [ "$step_rc" -ne 0 ]; then
    say ""
    say "**rnnlua does not start ($(why "$step_rc" "$step_s")):** $(tail -n 2 "$logs/rnnlua-devices.log" | tr '\n' ' ')"
    failures=$((failures + 1))
    side="nothing (rnnlua does not start)"
elif [ "$n_dev" = "0" ] || [ -z "$n_dev" ]; then
    if [ "$gpu_ok" = 1 ]; then
        say ""
        say "**nvidia-smi lists $gpu, but rnnlua sees no CUDA device (driver/runtime mismatch?): the suites run with the CPU as the device side.**"
        failures=$((failures + 1))
    fi
    side="the CPU (no GPU)"
    gpu_ok=0
else
    side=$gpu
fi
publish

# ---- 2. the parity suites
say ""
say "## Parity suites (device side: $side)"
say ""
say "| suite | ran on | passed | failed | s | note |"
say "|---|---|---:|---:|---:|---|"
suite_line() { # NAME (the log's closing line and its device line)
    local log=$logs/$1.log pass="-" fail="-" on note=""
    local last
    last=$(grep -E '^[0-9]+ passed, [0-9]+ failed' "$log" | tail -n 1)
    [ -n "$last" ] && pass=$(echo "$last" | awk '{print $1}') && fail=$(echo "$last" | awk '{print $3}')
    if grep -q "^device side: cuda" "$log"; then on=$gpu; else on="the CPU (as the device side)"; fi
    if [ "$step_rc" -ne 0 ] || [ -z "$last" ] || [ "$fail" != 0 ]; then
        failures=$((failures + 1))
        note=$(why "$step_rc" "$step_s")
        [ "$step_rc" -eq 0 ] && note="no closing line"
        [ -n "$last" ] && [ "$fail" != 0 ] && note="failures: see logs/$1.log"
    fi
    grep -q "^SKIP" "$log" && note="${note:+$note; }$(grep -m 1 '^SKIP' "$log")"
    say "| $1 | $on | $pass | $fail | $step_s | $note |"
}
limit=$([ "$quick" = 1 ] && echo 60 || echo 120)
for t in $(manifest parity); do
    run_step "$t" "$limit" "bin/$t"
    suite_line "$t"
    publish
done
run_step test_layers_parity "$((limit * 2))" bin/rnnlua tests/gpu/test_layers_parity.lua
suite_line test_layers_parity
publish

# ---- 3. 12AX: rl.train on the device against the CPU, its checkpoint on the CPU
say ""
say "## 12AX training, device = \"cuda\" against the CPU (device side: $side)"
say ""
run_step train_12ax 180 bin/rnnlua tests/gpu/train_12ax.lua "$([ "$quick" = 1 ] && echo 2 || echo 4)"
grep -E "^(cpu|device|device checkpoint)" "$logs/train_12ax.log" | sed "s/^/    /" >>"$body"
say ""
suite_line train_12ax
publish

# ---- 4. benchmarks (each table is headed by the GPU it ran on)
say ""
say "## Benchmarks on $side"
bench_table() { # NAME: the log's Markdown lines (headings and tables) into the report
    say ""
    if [ "$step_rc" -ne 0 ]; then
        say "$1: $(why "$step_rc" "$step_s") (logs/$1.log)"
        failures=$((failures + 1))
    fi
    grep -E '^(\||###|SKIP|A step)' "$logs/$1.log" >>"$body"
}
# the C benchmarks' rounds (bench/bench.h): interleaved variants, medians
benv=(env RL_BENCH_ROUNDS="$([ "$quick" = 1 ] && echo 1 || echo 3)" RL_BENCH_SECONDS="$([ "$quick" = 1 ] && echo 0.1 || echo 0.3)")
say ""
say "### Own kernels vs cuDNN, LSTM and GRU stacks, on $side"
run_step rnn_gpu "$([ "$quick" = 1 ] && echo 60 || echo 150)" "${benv[@]}" bin/rnn_gpu $([ "$quick" = 1 ] && echo seqmnist)
bench_table rnn_gpu
publish

say ""
say "### rnnlua vs PyTorch (cuDNN), LSTM training step, on $side"
say ""
dev_kind=$([ "$gpu_ok" = 1 ] && echo cuda || echo cpu)
rounds=$([ "$quick" = 1 ] && echo 1 || echo 2)
secs=$([ "$quick" = 1 ] && echo 0.5 || echo 1.0)
configs=$([ "$quick" = 1 ] && echo seqmnist || echo "seqmnist ptb_small odd ptb_large chime")
say "A step: zero grads, forward, backward (bench/lstm_step.lua, bench/torch_lstm.py), float32 on $dev_kind; median ms of $rounds interleaved process rounds of ~$secs s each."
say ""
say "| config | rnnlua ms | PyTorch ms | PyTorch/rnnlua |"
say "|---|---:|---:|---:|"
median() { sort -g | awk '{v[NR] = $1} END {if (NR == 0) print "-"; else if (NR % 2) print v[(NR + 1) / 2]; else print (v[NR / 2] + v[NR / 2 + 1]) / 2}'; }
for c in $configs; do
    : >"$work/ours" && : >"$work/theirs"
    for r in $(seq "$rounds"); do
        run_step "lstm_step-$c-$r" 60 bin/rnnlua bench/lstm_step.lua "$c" "$secs" "$dev_kind"
        [ "$step_rc" -eq 0 ] || failures=$((failures + 1))
        awk '$1 == "RESULT" {print $3}' "$logs/lstm_step-$c-$r.log" >>"$work/ours"
        if [ -n "$torch_py" ]; then
            run_step "torch_lstm-$c-$r" 90 "$torch_py" bench/torch_lstm.py "$c" "$secs" "$dev_kind"
            awk '$1 == "RESULT" {print $3}' "$logs/torch_lstm-$c-$r.log" >>"$work/theirs"
        fi
    done
    mo=$(median <"$work/ours")
    mt=$(median <"$work/theirs")
    ratio=$(awk -v a="$mo" -v b="$mt" 'BEGIN {if (a == "-" || b == "-" || a == 0) print "-"; else printf "%.2f", b / a}')
    say "| $c | $mo | $mt | $ratio |"
    publish
done

say ""
say "### MDLSTM training step: GPU ($side) and CPU (this machine's cores)"
run_step mdlstm_gpu "$([ "$quick" = 1 ] && echo 60 || echo 120)" "${benv[@]}" bin/mdlstm_gpu
bench_table mdlstm_gpu
run_step mdlstm_cpu 120 "${benv[@]}" RL_BENCH_MDLSTM=$([ "$quick" = 1 ] && echo small || echo large) bin/mdlstm
bench_table mdlstm_cpu
publish

say ""
say "### CTC loss + gradient vs torch.nn.functional.ctc_loss, on $side"
run_step ctc "$([ "$quick" = 1 ] && echo 90 || echo 120)" env RL_BENCH_DEVICE="$([ "$gpu_ok" = 1 ] && echo cuda:0 || echo cpu)" \
    RL_BENCH_PYTHON="$torch_py" RL_BENCH_ROUNDS="$rounds" RL_BENCH_SECONDS=0.3 bin/rnnlua bench/ctc.lua
bench_table ctc
publish

# ---- 5. NCCL on the one GPU (rnnlua's NCCL collectives need MPI, which the kit leaves out:
# tests/gpu/test_dist_nccl.sh runs them under mpirun on a two-GPU machine)
say ""
say "## NCCL allreduce on one GPU ($side)"
say ""
if [ "$gpu_ok" = 1 ] && [ -n "$torch_py" ]; then
    run_step nccl 60 "$torch_py" -c '
import time, torch, torch.cuda.nccl as nccl
print("NCCL", ".".join(map(str, nccl.version())))
for n in (1 << 10, 1 << 20, 1 << 26):
    x = torch.ones(n, device="cuda")
    nccl.all_reduce([x]); torch.cuda.synchronize()
    t0 = time.perf_counter()
    for _ in range(20):
        nccl.all_reduce([x])
    torch.cuda.synchronize()
    dt = (time.perf_counter() - t0) / 20
    assert float(x[0]) == 1.0, "allreduce of one rank changed the values"
    print("| %d floats | %.3f ms | %.1f GB/s |" % (n, dt * 1e3, 4 * n / dt / 1e9))
'
    if [ "$step_rc" -eq 0 ]; then
        say "$(grep '^NCCL' "$logs/nccl.log") (PyTorch's, through torch.cuda.nccl), on $gpu:"
        say ""
        say "| size | ms per allreduce | GB/s |"
        say "|---|---:|---:|"
        grep '^|' "$logs/nccl.log" >>"$body"
    else
        say "NCCL allreduce: $(why "$step_rc" "$step_s") (logs/nccl.log)"
        failures=$((failures + 1))
    fi
else
    say "Not run: needs a GPU and PyTorch."
fi
publish

# ---- 6. compute-sanitizer memcheck over the parity programs, while time is left
say ""
say "## compute-sanitizer memcheck ($side)"
say ""
san=$(command -v compute-sanitizer || ls /usr/local/cuda/bin/compute-sanitizer 2>/dev/null)
if [ "$gpu_ok" = 1 ] && [ -n "$san" ]; then
    say "| program | result | s |"
    say "|---|---|---:|"
    for t in $(manifest parity); do
        if [ "$(left)" -lt 30 ]; then
            say "| $t | not run: out of time | - |"
            continue
        fi
        run_step "memcheck-$t" 120 "$san" --tool memcheck --error-exitcode 99 "bin/$t"
        res=$(grep -E "ERROR SUMMARY" "$logs/memcheck-$t.log" | tail -n 1 | sed 's/^=* *//')
        case "$step_rc" in
        0) say "| $t | ${res:-no errors} | $step_s |" ;;
        99) say "| $t | **$res** | $step_s |"; failures=$((failures + 1)) ;;
        124) say "| $t | stopped by its time limit (${res:-no error so far}) | $step_s |" ;;
        *) say "| $t | $(why "$step_rc" "$step_s") ${res:+($res)} | $step_s |"; failures=$((failures + 1)) ;;
        esac
        publish
    done
else
    say "Not run: needs a GPU and compute-sanitizer."
fi
finish
