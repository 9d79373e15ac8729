#!/usr/bin/env bash
# Sets up flashlight-text (the CTC beam-search decoder with KenLM that torchaudio's
# models.decoder.ctc_decoder calls) for bench/ctc_lm.lua, in a virtual environment under the
# build directory (ignored by git), and prints the path of its python on the last line.
#   bash bench/flashlight_env.sh [BUILD_DIR]      (default: build)
# torchaudio itself is not used: its newest release on PyPI (2.11.0) installs next to
# bench/torch_env.sh's torch 2.15.0 but refuses to import (torch and torchaudio built for CUDA 13.2
# and 13.0); the decoder is the same C++ code either way (torchaudio's ctc_decoder is a thin wrapper that builds the same
# LexiconFreeDecoder with the same options). Pinned version; idempotent.
# Exit status 1 (with a message on stderr) when PyPI cannot be reached or the import fails.
set -euo pipefail
build=${1:-build}
FLASHLIGHT_TEXT_VERSION=0.0.7
venv="$build/fl-venv"
py="$venv/bin/python"
check="import flashlight.lib.text.decoder as d, numpy; d.KenLM; assert '$FLASHLIGHT_TEXT_VERSION'"
if [ -x "$py" ] && "$py" -c "$check" >/dev/null 2>&1 &&
    "$venv/bin/pip" show flashlight-text 2>/dev/null | grep -q "^Version: $FLASHLIGHT_TEXT_VERSION$"; then
    echo "$py"
    exit 0
fi
mkdir -p "$build"
python3 -m venv "$venv" >&2
"$venv/bin/pip" install -q --disable-pip-version-check "flashlight-text==$FLASHLIGHT_TEXT_VERSION" \
    numpy >&2
if ! "$py" -c "$check" >&2; then
    echo "flashlight_env: flashlight-text $FLASHLIGHT_TEXT_VERSION installed in $venv but does not import" >&2
    exit 1
fi
echo "$py"
