#!/usr/bin/env bash
# Installs the system packages rnnlua builds against, from Debian's archive.
# `deps.sh --check` only reports (exit 1 when something is missing). RL_BLAS=blis (make BLAS=blis)
# adds BLIS to the default OpenBLAS.
set -euo pipefail

# hdf5-tools (h5dump) and python3-h5py are for the tests: files written by other writers;
# festlex-cmu (CMUdict) for recipes/g2p_cmudict.lua and its smoke test;
# bible-kjv, python3-pil, python3-numpy and the fonts-* are recipes/htr_lines.lua's data, which
# tests/lua/test_htr_lines.lua converts;
# libmicrohttpd-dev and libjansson-dev for `rnnlua serve` (HTTP, JSON);
# libopenmpi-dev and openmpi-bin (mpirun) for data-parallel training (make MPI=0 builds without);
# clang and libclang-rt-dev (libFuzzer) for `make fuzz`; python3-venv for the virtual
# environment tests/sh/test_returnn_hdf.sh installs RETURNN into;
# gnuplot-nox for `rnnlua plot` and rl.train{plot = true};
# libsndfile1-dev, libsamplerate0-dev and libfftw3-dev for rl.audio (core/audio.c);
# espeak-ng, festival (with the festvox-* voices), flite and sox synthesize
# recipes/speech_digits.lua's data (its smoke test too);
# gcc-aarch64-linux-gnu, libc6-dev-arm64-cross and qemu-user build and run the AArch64 (NEON)
# kernels' test, tests/sh/test_aarch64.sh (about 55 MB to download, 11 s to install);
# patchelf gives the programs of `make device-kit` their $ORIGIN-relative library path;
# wrk drives `rnnlua serve` in bench/serve_wrk.sh (`make bench`);
# g++ (the C API's header compiled as C++), man-db (`man -l` of the man page) and lua5.4 (the
# module for a system Lua) for tests/sh/test_embed.sh
pkgs=(pkg-config liblua5.4-dev lua-filesystem-dev libhdf5-dev libopenblas-dev libedit-dev hdf5-tools
      python3-h5py festlex-cmu bible-kjv python3-pil python3-numpy fonts-dkg-handwriting
      fonts-breip fonts-femkeklaver fonts-kristi fonts-comic-neue fonts-rufscript
      fonts-dancingscript fonts-kaushanscript fonts-havana fonts-ecolier-court fonts-cabinsketch
      fonts-seto fonts-klee
      libmicrohttpd-dev libjansson-dev libopenmpi-dev openmpi-bin clang libclang-rt-dev python3-venv
      gnuplot-nox libsndfile1-dev libsamplerate0-dev libfftw3-dev espeak-ng sox festival flite
      festvox-kallpc16k festvox-kdlpc16k festvox-us-slt-hts
      gcc-aarch64-linux-gnu libc6-dev-arm64-cross qemu-user patchelf wrk g++ man-db lua5.4)
[ "${RL_BLAS:-openblas}" = blis ] && pkgs+=(libblis-dev)

missing=()
for p in "${pkgs[@]}"; do
    dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done

if [ "${1:-}" = "--check" ]; then
    [ ${#missing[@]} -eq 0 ] && exit 0
    echo "missing: ${missing[*]}"
    exit 1
fi
if [ ${#missing[@]} -eq 0 ]; then
    echo "deps: all present"
    exit 0
fi

echo "deps: installing ${missing[*]}"
sudo=""
[ "$(id -u)" -eq 0 ] || sudo="sudo"
export DEBIAN_FRONTEND=noninteractive
$sudo apt-get update -qq
$sudo apt-get install -y -qq --no-install-recommends "${missing[@]}"
