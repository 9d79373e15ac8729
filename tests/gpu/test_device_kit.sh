#!/usr/bin/env bash
# The device kit without a GPU (CI: .ci/run's CUDA part; by hand: bash tests/gpu/test_device_kit.sh
# from the repository root, as root). Builds it with `make device-kit` (whose own check fails on
# a library that is neither in the kit nor in the base set), then:
#   - its size is at most 60 MiB;
#   - ldd resolves every library of every program and library of the kit, each either inside
#     the kit or in the base set (C/C++ runtime, driver, CUDA toolkit), with LD_LIBRARY_PATH
#     holding only the CUDA folders; the loader's own trace (LD_DEBUG=libs) of rnnlua and of a
#     parity program shows every non-base library loaded from the kit;
#   - `run.sh --quick` runs end to end with the CPU as the device side in a private mount
#     namespace where the system's copies of the kit's libraries (and the folders of Lua and
#     HDF5 modules) are hidden behind empty files and LD_LIBRARY_PATH is empty, and its report
#     must show every parity suite passed, the 12AX run and the benchmarks;
#   - the same run from a copy of the kit with one library taken out must fail, quickly, with a
#     report that says rnnlua does not start (so the hiding hides: a missing library fails here);
#   - the kit's build (MPI=0, the only such build CI makes) passes test_dist.sh's checks for a
#     build without MPI.
# Libraries that the shell tools run.sh uses (bash, tar, python3, ...) need themselves stay
# visible (a GPU machine has them too); the loader trace above still shows the kit's copies used.
# Prints "N passed, N failed"; a SKIP line without nvcc (the kit is a CUDA build).
set -u
cd "$(dirname "$0")/../.."
pass=0
fail=0
ok() { echo "ok   $1"; pass=$((pass + 1)); }
bad() { echo "FAIL $1"; fail=$((fail + 1)); }
end() { echo "$pass passed, $fail failed"; [ "$fail" -eq 0 ]; exit $?; }

if ! command -v nvcc >/dev/null 2>&1 && [ ! -x /usr/local/cuda/bin/nvcc ]; then
    echo "SKIP test_device_kit: no nvcc on this machine (the kit is a CUDA=1 build)"
    end
fi
kit=build-device/kit
t0=$(date +%s)
mkdir -p build-device
if ! make --no-print-directory device-kit ${RL_KIT_MAKEFLAGS:-} >build-device/make.log 2>&1; then
    tail -n 30 build-device/make.log
    bad "make device-kit (log above)"
    end
fi
grep "^device kit:" build-device/make.log
ok "make device-kit ($(($(date +%s) - t0)) s)"
kit=$(cd "$kit" && pwd)

size=$(du -sk "$kit" | cut -f1)
if [ "$size" -le $((60 * 1024)) ]; then ok "kit size $((size / 1024)) MiB <= 60 MiB"; else bad "kit size $((size / 1024)) MiB > 60 MiB"; fi

base_re='^(linux-vdso\.so|ld-linux-x86-64\.so|libc\.so\.6|libm\.so\.6|libpthread\.so\.0|libdl\.so\.2|librt\.so\.1|libresolv\.so\.2|libstdc\+\+\.so\.6|libgcc_s\.so\.1|libcuda\.so\.1)'
cuda_re='^(libcudart|libcublas|libcublasLt|libcudnn[a-z_]*|libnccl)\.so'
# the folders of this machine's CUDA libraries (the toolkit: the base set allows them)
cuda_dirs=$(for so in $(sed -n 's/^cuda_libs //p' "$kit/MANIFEST"); do
    ldconfig -p | awk -v s="$so" '$1 == s {print $NF; exit}' | xargs -r dirname
done | sort -u | paste -sd:)
[ -d /usr/local/cuda/lib64 ] && cuda_dirs=${cuda_dirs:+$cuda_dirs:}/usr/local/cuda/lib64

# the gzipped large libraries, unpacked as run.sh does (a folder first on LD_LIBRARY_PATH, the
# kit's lib/ next)
unp=$(mktemp -d)
for so in $(sed -n 's/^packed //p' "$kit/MANIFEST"); do gzip -dc "$kit/lib/$so.gz" >"$unp/$so"; done
in_kit() { local r; r=$(readlink -f "$1"); [[ $r == "$kit"/lib/* ]] || [[ $r == "$unp"/* ]]; }
n_files=0
n_bad=0
for f in "$kit"/bin/* "$kit"/lib/* "$unp"/*; do
    case "$f" in *.gz) continue ;; esac
    n_files=$((n_files + 1))
    while read -r name arrow path _; do
        [ "$arrow" = "=>" ] || continue
        if [ "$path" = "not" ]; then
            echo "  $(basename "$f"): $name not found"
            n_bad=$((n_bad + 1))
        elif ! [[ $name =~ $base_re ]] && ! [[ $name =~ $cuda_re ]] && ! in_kit "$path"; then
            echo "  $(basename "$f"): $name resolves to $path, outside the kit"
            n_bad=$((n_bad + 1))
        fi
    done < <(LD_LIBRARY_PATH=$unp:$kit/lib:$cuda_dirs ldd "$f" 2>&1)
done
if [ "$n_bad" -eq 0 ]; then ok "ldd: all $n_files programs and libraries resolve inside the kit or the base set"; else bad "ldd: $n_bad libraries resolve outside the kit and the base set"; fi

for p in rnnlua test_parity; do
    args=()
    [ "$p" = rnnlua ] && args=(-e "")
    outside=$(LD_DEBUG=libs LD_LIBRARY_PATH=$unp:$kit/lib:$cuda_dirs "$kit/bin/$p" "${args[@]}" 2>&1 >/dev/null |
        sed -n 's/.*calling init: //p' | sort -u | while read -r lib; do
            n=$(basename "$lib")
            [[ $n =~ $base_re ]] || [[ $n =~ $cuda_re ]] || in_kit "$lib" || echo "$lib"
        done)
    if [ -z "$outside" ]; then ok "loader trace: $p loads every non-base library from the kit"; else bad "loader trace: $p loads $(echo $outside) from outside the kit"; fi
done

# The libraries the shell tools of run.sh need: left visible.
tools=$(for t in bash sh tar gzip timeout awk sed grep sort du date python3 tail cp mv mktemp seq readlink hostname paste; do
    command -v "$t"
done)
tool_libs=$(for t in $tools; do ldd "$(readlink -f "$t")" 2>/dev/null | awk '$2 == "=>" {print $1}'; done | sort -u)

# hidden_run KIT OUTDIR BUDGET [PRELUDE]: run.sh --quick of KIT in a mount namespace where the
# system's copies of the built kit's libraries are empty files, after the shell commands PRELUDE
# (run there; $empty is an empty file); prints run.sh's exit status last.
hidden_run() {
    unshare -m --propagation private env -u CUDA_HOME LD_LIBRARY_PATH= KIT="$1" OUTD="$2" \
        RL_KIT_BUDGET="$3" PRELUDE="${4:-}" TOOL_LIBS="$tool_libs" HIDE="$kit" bash -c '
        empty=$(mktemp) && kept=""
        for l in "$HIDE"/lib/*; do
            so=$(basename "$l" .gz)
            [ "$so" = librnnlua-kit.so ] && continue
            if printf "%s\n" $TOOL_LIBS | grep -qxF "$so"; then kept="$kept $so"; continue; fi
            for p in $(ldconfig -p | awk -v s="$so" "\$1 == s {print \$NF}"); do
                for q in "$p" "$(readlink -f "$p")"; do
                    [ -e "$q" ] && mount --bind "$empty" "$q"
                done
            done
        done
        for d in /usr/lib/x86_64-linux-gnu/hdf5 /usr/lib/x86_64-linux-gnu/lua /usr/local/lib/lua /usr/share/lua; do
            [ -d "$d" ] && mount -t tmpfs none "$d"
        done
        echo "hidden: the system copies of the kit libraries; left visible for the shell tools:$kept"
        [ -s "$(ldconfig -p | awk "\$1 == \"libjansson.so.4\" {print \$NF; exit}")" ] && echo "HIDING FAILED"
        eval "$PRELUDE"
        bash "$KIT/run.sh" --quick "$OUTD"
        echo "run.sh exit status $?"
    '
}

out=$(mktemp -d)
t1=$(date +%s)
log=$(hidden_run "$kit" "$out/full" 300 2>&1)
echo "$log" | grep -E "^hidden:|HIDING FAILED|run.sh exit"
if echo "$log" | grep -q "HIDING FAILED"; then bad "hiding the system libraries"; fi
if echo "$log" | grep -q "^run.sh exit status 0$"; then
    ok "run.sh --quick with the system libraries hidden: exit 0 ($(($(date +%s) - t1)) s)"
else
    bad "run.sh --quick with the system libraries hidden: $(echo "$log" | tail -n 1)"
    [ -f "$out/full/report.md" ] && cat "$out/full/report.md"
fi
rep=$out/full/report.md
if [ -f "$rep" ] && [ -f "$out/full/logs.tar.gz" ] && [ "$(ls "$out/full" | wc -l)" -le 8 ]; then
    ok "report.md and logs.tar.gz written, $(ls "$out/full" | wc -l) files"
else
    bad "the output folder: $(ls "$out/full" 2>&1 | paste -sd' ')"
fi
for s in $(sed -n 's/^parity //p' "$kit/MANIFEST") test_layers_parity train_12ax; do
    if grep -qE "^\| $s \| the CPU \(as the device side\) \| [0-9]+ \| 0 \|" "$rep" 2>/dev/null; then
        ok "report: $s passed"
    else
        bad "report: $s: $(grep -E "^\| $s \|" "$rep" 2>/dev/null || echo 'no line')"
    fi
done
for h in "Own kernels vs cuDNN" "rnnlua vs PyTorch" "MDLSTM training step" "CTC loss" "Run ended after"; do
    if grep -q "$h" "$rep" 2>/dev/null; then ok "report: $h"; else bad "report: no '$h'"; fi
done
if grep -qE "^\| seqmnist \| [0-9.]+ \|" "$rep" 2>/dev/null; then ok "report: rnnlua's seqmnist step timed"; else bad "report: no seqmnist figure"; fi

# One library taken out of a copy of the kit: rnnlua cannot start, and the report says so.
cp -a "$kit" "$out/kit"
rm "$out/kit/lib/libjansson.so.4"
t2=$(date +%s)
log=$(hidden_run "$out/kit" "$out/broken" 60 2>&1)
took=$(($(date +%s) - t2))
rep=$out/broken/report.md
if echo "$log" | grep -q "^run.sh exit status 1$" && grep -q "rnnlua does not start.*libjansson.so.4" "$rep" 2>/dev/null; then
    ok "a kit without libjansson fails in the hidden environment, reported, in $took s"
else
    bad "a kit without libjansson: $(echo "$log" | tail -n 1); $(grep -m 1 "rnnlua" "$rep" 2>/dev/null)"
fi
# Bad input, each with a budget too short for more than the first steps.
# A driver older than the kit's CUDA runtime (a stand-in nvidia-smi that says CUDA 12.2) and no
# cuDNN anywhere (the toolkit's files hidden): both said at the top of the report, exit 1.
mkdir -p "$out/fake"
cat >"$out/fake/nvidia-smi" <<'SMI'
#!/bin/sh
case "$*" in
*name,driver*) echo "Stand-in GPU, 535.00, 81559 MiB, 9.0" ;;
*name*) echo "Stand-in GPU" ;;
*) echo "| NVIDIA-SMI 535.00    Driver Version: 535.00    CUDA Version: 12.2 |" ;;
esac
SMI
chmod +x "$out/fake/nvidia-smi"
log=$(hidden_run "$kit" "$out/old" 10 "export PATH=$out/fake:\$PATH
    for f in \$(ldconfig -p | awk '\$1 ~ /^libcudnn/ {print \$NF}') /usr/local/cuda/lib64/libcudnn*; do
        [ -e \"\$f\" ] && mount --bind \"\$empty\" \"\$(readlink -f \"\$f\")\"
    done" 2>&1)
rep=$out/old/report.md
for want in "older than the kit's CUDA runtime (12.2 < " "libcudnn.so.9 | \*\*not found\*\*" \
    "Missing: libcudnn.so.9" "rnnlua does not start"; do
    if echo "$log" | grep -q "^run.sh exit status 1$" && grep -q "$want" "$rep" 2>/dev/null; then
        ok "old driver, no cuDNN: the report says '$want'"
    else
        bad "old driver, no cuDNN: no '$want' ($(echo "$log" | tail -n 1))"
    fi
done

# An output folder that fills up (a 4 KiB tmpfs): the report goes to stdout and says so.
log=$(hidden_run "$kit" "$out/small" 10 "mkdir -p $out/small && mount -t tmpfs -o size=4k none $out/small" 2>&1)
if echo "$log" | grep -q "is full or not writable: the report stopped being copied" &&
    echo "$log" | grep -q "^run.sh exit status 1$"; then
    ok "a full output folder: said, the report on stdout"
else
    bad "a full output folder: $(echo "$log" | tail -n 3 | paste -sd' ')"
fi

# SIGTERM in the middle of a step: the run ends at once with the report saying where.
bash "$kit/run.sh" --quick "$out/term" >/dev/null 2>&1 &
pid=$!
sleep 8
t3=$(date +%s)
kill -TERM "$pid"
wait "$pid"
rc=$?
if [ "$rc" -eq 1 ] && [ $(($(date +%s) - t3)) -le 10 ] &&
    grep -q "run.sh was stopped by SIGTERM after" "$out/term/report.md" 2>/dev/null; then
    ok "SIGTERM: $(grep -o 'stopped by SIGTERM after [0-9]* s (during: [^)]*)' "$out/term/report.md"), exit 1"
else
    bad "SIGTERM: exit $rc, $(grep -c . "$out/term/report.md" 2>/dev/null) report lines"
fi

# The kit's build is the one MPI=0 build that CI makes: test_dist.sh's branch for a build without
# MPI (distributed training asked of it is a clear error) runs on its rnnlua here.
dlog=$(LD_LIBRARY_PATH=$PWD/build-device/build bash tests/sh/test_dist.sh build-device/build/rnnlua 2>&1)
if echo "$dlog" | grep -q "^3 passed, 0 failed$"; then
    ok "the MPI=0 build: test_dist.sh's checks without MPI (3 passed)"
else
    bad "the MPI=0 build: test_dist.sh: $(echo "$dlog" | grep -m3 -e FAIL -e passed | paste -sd' ')"
fi

rm -rf "$out" "$unp"
end
