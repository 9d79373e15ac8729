#!/usr/bin/env bash
# The AArch64 paths of the CPU kernels (the NEON packed GEMM, the level names, the LSTM and GRU
# pointwise passes; the bf16 products' generic path, and the int8 products' it calls, are compiled
# in, as gemm_small.c asks for its
# mode): tests/aarch64/test_kernels.c cross-compiled with aarch64-linux-gnu-gcc and
# run under qemu-aarch64 (both from scripts/deps.sh). Prints SKIP without them. The argument
# (the rnnlua binary) is not used: the program links the kernel sources directly.
# Usage: test_aarch64.sh [BIN]
set -u
cd "$(dirname "$0")/../.."
cc=aarch64-linux-gnu-gcc
qemu=qemu-aarch64
for tool in "$cc" "$qemu"; do
    if ! command -v "$tool" >/dev/null; then
        echo "SKIP test_aarch64: no $tool (gcc-aarch64-linux-gnu, libc6-dev-arm64-cross and qemu-user: scripts/deps.sh)"
        echo "0 passed, 0 failed"
        exit 0
    fi
done
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
# the flags of the Makefile's build, with warnings as errors; static, so that qemu needs no
# AArch64 library path
if ! "$cc" -O2 -g -std=c11 -D_GNU_SOURCE -fno-trapping-math -fno-math-errno -Wall -Wextra \
    -Wshadow -Wmissing-prototypes -Wno-unused-parameter -Werror -I. -static \
    -o "$tmp/test_kernels" tests/aarch64/test_kernels.c kernels/cpu/gemm_small.c \
    kernels/cpu/gemm_neon.c kernels/cpu/gemm_bf16.c kernels/cpu/gemm_int8.c kernels/cpu/cpu_level.c \
    kernels/cpu/parallel.c kernels/cpu/scratch.c \
    kernels/cpu/lstm.c kernels/cpu/gru.c core/error.c -lm -lpthread; then
    echo "FAIL test_aarch64: the cross compilation failed"
    echo "0 passed, 1 failed"
    exit 1
fi
"$qemu" "$tmp/test_kernels"
