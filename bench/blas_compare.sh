#!/usr/bin/env bash
# The BLAS libraries Debian ships, on rnnlua's GEMM shapes: OpenBLAS (pthread and OpenMP
# builds) and BLIS (pthread and OpenMP), each where installed (scripts/deps.sh installs the
# default one; apt-get install libopenblas0-openmp libblis4-pthread libblis4-openmp for the
# rest). bench/blas/shapes.c is built once per library; each round runs every library on a
# shape in turn (interleaved), 2 threads; the table has the median GFLOP/s of
# RL_BENCH_ROUNDS (default 5) rounds. RL_BENCH_LEVEL=avx2 runs OpenBLAS with its Haswell
# kernels (OPENBLAS_CORETYPE), as on an AVX2-only machine (BLIS 0.9 has no AVX-512 kernels).
#   bash bench/blas_compare.sh [BUILD_DIR]
set -u
build=${1:-build}
rounds=${RL_BENCH_ROUNDS:-5}
dir="$build/blas-compare"
mkdir -p "$dir"
lib=/usr/lib/$(gcc -print-multiarch)
declare -A LIBS=([openblas-pthread]="$lib/openblas-pthread/libopenblas.so.0"
    [openblas-openmp]="$lib/openblas-openmp/libopenblas.so.0"
    [blis-pthread]="$lib/blis-pthread/libblis.so.4" [blis-openmp]="$lib/blis-openmp/libblis.so.4")
names=()
for n in openblas-pthread openblas-openmp blis-pthread blis-openmp; do
    f=${LIBS[$n]}
    [ -f "$f" ] || continue
    cc -O2 -o "$dir/$n" bench/blas/shapes.c "$f" -Wl,-rpath,"$(dirname "$f")" || continue
    names+=("$n")
done
envs=(OPENBLAS_NUM_THREADS=2 OMP_NUM_THREADS=2 BLIS_NUM_THREADS=2)
[ "${RL_BENCH_LEVEL:-}" = avx2 ] && envs+=(OPENBLAS_CORETYPE=Haswell)
# name, trans_a, trans_b, m, n, k: the sgemm peak sizes, then the output layer (forward, dW,
# dX) of ptb_large and ptb_small, chime's input projection of layer 2 and its dW and dX
shapes=("peak 1024^3:0 0 1024 1024 1024" "peak 2048^3:0 0 2048 2048 2048"
    "ptb_large out fwd:0 0 1000 10000 650" "ptb_large out dW:1 0 650 10000 1000"
    "ptb_large out dX:0 1 1000 650 10000" "ptb_small out fwd:0 0 400 10000 200"
    "ptb_small out dW:1 0 200 10000 400" "ptb_small out dX:0 1 400 200 10000"
    "chime l2 in fwd:0 0 4000 2048 1024" "chime l2 dW:1 0 1024 2048 4000"
    "chime l2 dX:0 1 4000 1024 2048")
echo "### sgemm on rnnlua's shapes, GFLOP/s (2 threads${RL_BENCH_LEVEL:+, level $RL_BENCH_LEVEL})"
echo
echo "Median of $rounds interleaved rounds; load average $(cut -d' ' -f1-3 /proc/loadavg) at the start."
echo
printf '| shape (m x n x k) |'
printf ' %s |' "${names[@]}"
echo
printf '|---|'
printf -- '---:|%.0s' "${names[@]}"
echo
for s in "${shapes[@]}"; do
    label=${s%%:*}
    read -r ta tb m n k <<<"${s#*:}"
    declare -A res=()
    for ((r = 0; r < rounds; r++)); do
        for n_ in "${names[@]}"; do
            res[$n_]="${res[$n_]:-} $(env "${envs[@]}" "$dir/$n_" "$ta" "$tb" "$m" "$n" "$k" 0.3)"
        done
    done
    printf '| %s (%s x %s x %s) |' "$label" "$m" "$n" "$k"
    for n_ in "${names[@]}"; do
        printf ' %s |' "$(echo "${res[$n_]}" | tr ' ' '\n' | grep -v '^$' | sort -g |
            awk '{v[NR] = $1} END { print (NR % 2) ? v[(NR + 1) / 2] : (v[NR / 2] + v[NR / 2 + 1]) / 2 }')"
    done
    echo
    unset res
done
echo
echo "Load average at the end: $(cut -d' ' -f1-3 /proc/loadavg)."
