#!/usr/bin/env bash
# Assembles the device kit (run by `make device-kit`, docs/gpu.md) from the programs of its build
# folder:  scripts/device_kit.sh BUILD_DIR KIT_DIR "PARITY PROGRAMS" (the Makefile's GPU_TESTS)
#   KIT_DIR/bin/      rnnlua, the parity programs, the GPU benchmarks and the CPU MDLSTM one
#                     (debug info stripped)
#   KIT_DIR/lib/      librnnlua-kit.so and every shared library they load that is not in the
#                     base set of the GPU machine (below); found through the programs' RPATH
#                     $ORIGIN/../lib and the libraries' own $ORIGIN (run.sh also puts the
#                     folder on LD_LIBRARY_PATH, beside the unpacked large ones: NAME.gz)
#   KIT_DIR/tests/, KIT_DIR/bench/   the Lua and Python files the run reads (paths as in the
#                     repository: run.sh runs from KIT_DIR)
#   KIT_DIR/run.sh    the script run on the GPU machine (scripts/kit_run.sh)
#   KIT_DIR/MANIFEST  commit, date, CUDA runtime, GPU architectures, the CUDA libraries needed,
#                     the gzipped libraries, the oldest glibc the kit runs on
#   KIT_DIR/LICENSE, THIRD_PARTY_NOTICES.md
# The base set: the C and C++ runtimes (glibc's libc, libm, libpthread, libdl, librt, libresolv
# and loader, which must match each other, libstdc++, libgcc_s), the driver (libcuda) and the CUDA toolkit's own libraries (cuBLAS,
# cuDNN, NCCL, found there by run.sh). The check at the end fails, naming the program and the
# library, when anything needs a library that is neither in the kit nor in the base set, and
# when the kit is larger than RL_KIT_MAX_MIB (default 60).
set -euo pipefail
usage="usage: device_kit.sh BUILD_DIR KIT_DIR 'PARITY PROGRAMS'"
build=${1:?$usage}
kit=${2:?$usage}
parity=${3:?$usage}
max_mib=${RL_KIT_MAX_MIB:-60}
cd "$(dirname "$0")/.."
for tool in patchelf readelf objdump strip ldd gzip; do
    command -v "$tool" >/dev/null || { echo "device_kit: $tool not found (scripts/deps.sh)" >&2; exit 1; }
done

# Sonames every Linux machine with the NVIDIA driver and toolkit has: never copied.
is_base() {
    case "$1" in
    linux-vdso.so.* | ld-linux-x86-64.so.* | libc.so.6 | libm.so.6 | libpthread.so.0 | libdl.so.2 | \
        librt.so.1 | libresolv.so.2 | libstdc++.so.6 | libgcc_s.so.1 | libcuda.so.1) return 0 ;;
    esac
    return 1
}
is_cuda() {
    case "$1" in
    libcudart.so.* | libcublas.so.* | libcublasLt.so.* | libcudnn*.so.* | libnccl.so.*) return 0 ;;
    esac
    return 1
}

programs=("$build/rnnlua")
for t in $parity; do programs+=("$build/tests-gpu/$t"); done
programs+=("$build/bench/rnn_gpu" "$build/bench/mdlstm_gpu" "$build/bench/mdlstm")
for p in "${programs[@]}" "$build/librnnlua-kit.so"; do
    [ -x "$p" ] || [ -f "$p" ] || { echo "device_kit: $p is missing (make device-kit builds it)" >&2; exit 1; }
done

rm -rf "$kit"
mkdir -p "$kit/bin" "$kit/lib"
cp "${programs[@]}" "$kit/bin/"
cp "$build/librnnlua-kit.so" "$kit/lib/"

# Every library the programs load on this machine (ldd: the whole closure), copied unless base
# or CUDA; the CUDA ones are listed for run.sh.
declare -A cuda_needed=()
while read -r name path; do
    if is_base "$name"; then continue; fi
    if is_cuda "$name"; then cuda_needed[$name]=1; continue; fi
    if [ ! -f "$kit/lib/$name" ]; then
        [ -f "$path" ] || { echo "device_kit: $name is not found on this machine" >&2; exit 1; }
        cp -L "$path" "$kit/lib/$name"
    fi
done < <(for p in "$kit"/bin/* "$kit"/lib/librnnlua-kit.so; do
             LD_LIBRARY_PATH="$build" ldd "$p" | awk '$2 == "=>" {print $1, $3}'
         done | sort -u)

chmod u+w "$kit"/lib/*
strip --strip-debug "$kit"/bin/* "$kit"/lib/*
# DT_RPATH rather than DT_RUNPATH on the programs: it also applies to the libraries' own needs
for p in "$kit"/bin/*; do patchelf --force-rpath --set-rpath '$ORIGIN/../lib' "$p"; done
for l in "$kit"/lib/*; do patchelf --set-rpath '$ORIGIN' "$l"; done
# A library over 16 MiB (OpenBLAS, its kernels for every CPU: 35 MiB) travels gzipped (a third of
# its size); run.sh unpacks it into a temporary folder before anything runs.
packed=""
for l in "$kit"/lib/*; do
    if [ "$(stat -c %s "$l")" -gt $((16 * 1024 * 1024)) ]; then
        gzip -9 "$l"
        packed="$packed $(basename "$l")"
    fi
done

# What run.sh reads, at their repository paths
mkdir -p "$kit/tests/gpu" "$kit/tests/lua" "$kit/bench"
cp tests/gpu/test_layers_parity.lua tests/gpu/train_12ax.lua "$kit/tests/gpu/"
cp tests/lua/harness.lua "$kit/tests/lua/"
cp bench/bench.lua bench/lstm_step.lua bench/torch_lstm.py bench/ctc.lua bench/torch_ctc.py "$kit/bench/"
cp scripts/kit_run.sh "$kit/run.sh"
# whoever hands the kit on hands on the libraries in it: their licences go with it
cp LICENSE THIRD_PARTY_NOTICES.md "$kit/"
chmod +x "$kit/run.sh"

unpacked=$(mktemp)
trap 'rm -f "$unpacked"' EXIT
cuda_version=$("$(dirname "$(command -v nvcc || echo /usr/local/cuda/bin/nvcc)")"/nvcc --version 2>/dev/null |
    sed -n 's/.*release \([0-9.]*\),.*/\1/p')
{
    echo "commit $(git rev-parse --short HEAD 2>/dev/null || echo unknown)$(git diff --quiet HEAD 2>/dev/null || echo '+changes')"
    echo "built $(date -u +%Y-%m-%dT%H:%MZ)"
    echo "cuda_runtime ${cuda_version:-unknown}"
    echo "gpu_arch sm_80 sm_90"
    echo "parity $parity"
    echo "cuda_libs ${!cuda_needed[*]}"
    echo "packed$packed"
    # the newest glibc symbol version anything in the kit needs: the GPU machine's must be as new
    echo "glibc $(for f in "$kit"/bin/* "$kit"/lib/*; do
        case "$f" in *.gz) gzip -dc "$f" >"$unpacked" && f=$unpacked ;; esac
        objdump -T "$f" 2>/dev/null | grep -o 'GLIBC_2\.[0-9]*'
    done | sed 's/GLIBC_//' | sort -V | tail -n 1)"
} >"$kit/MANIFEST"

# The check: every NEEDED entry of every ELF file of the kit is in lib/ or in the base set.
bad=0
for f in "$kit"/bin/* "$kit"/lib/*; do
    elf=$f
    case "$f" in *.gz) gzip -dc "$f" >"$unpacked" && elf=$unpacked ;; esac
    for n in $(readelf -d "$elf" | sed -n 's/.*(NEEDED).*\[\(.*\)\]/\1/p'); do
        if ! is_base "$n" && ! is_cuda "$n" && [ ! -f "$kit/lib/$n" ] && [ ! -f "$kit/lib/$n.gz" ]; then
            echo "device_kit: $(basename "$f") needs $n, which is neither in the kit nor in the base set" >&2
            bad=1
        fi
    done
done
size_kib=$(du -sk "$kit" | cut -f1)
if [ "$size_kib" -gt $((max_mib * 1024)) ]; then
    echo "device_kit: $kit is $((size_kib / 1024)) MiB, more than $max_mib MiB" >&2
    bad=1
fi
[ "$bad" -eq 0 ] || exit 1
echo "device kit: $kit, $((size_kib / 1024)) MiB, $(ls "$kit/bin" | wc -l) programs, $(ls "$kit/lib" | wc -l) libraries; CUDA libraries found on the GPU machine: ${!cuda_needed[*]}"
