#!/usr/bin/env bash
# Sets up a current PyTorch for the benchmarks' comparisons, in a virtual environment under the
# build directory (ignored by git), and prints the path of its python on the last line.
#   bash bench/torch_env.sh [BUILD_DIR]      (default: build)
# PyPI's Linux wheel of torch is the CUDA build; only its CPU half is used here. It is installed
# with --no-deps and given the few CUDA libraries it links against that the CUDA toolkit of
# this machine kind does not provide (cuFile, cuSPARSELt, NVSHMEM, a recent NCCL), so the
# download stays small and no GPU is needed. Pinned versions: the comparison is against one
# known release. Idempotent: an environment that imports torch is reused as it is.
# Exit status 1 (with a message on stderr) when PyPI cannot be reached or the import fails.
set -euo pipefail
build=${1:-build}
TORCH_VERSION=2.15.0
venv="$build/torch-venv"
py="$venv/bin/python"

if [ -x "$py" ] && "$py" -c "import torch; assert torch.__version__.startswith('$TORCH_VERSION')" \
    >/dev/null 2>&1; then
    echo "$py"
    exit 0
fi
mkdir -p "$build"
python3 -m venv "$venv" >&2
"$py" -m pip install -q --disable-pip-version-check --no-deps "torch==$TORCH_VERSION" \
    nvidia-cusparselt-cu13==0.8.1 nvidia-nvshmem-cu13==3.7.2 nvidia-nccl-cu13==2.30.7 \
    nvidia-cufile >&2
"$py" -m pip install -q --disable-pip-version-check numpy typing_extensions sympy networkx \
    jinja2 filelock fsspec >&2
if ! "$py" -c "import torch; torch.ones(2) @ torch.ones(2)" >&2; then
    echo "torch_env: torch $TORCH_VERSION installed in $venv but does not import" >&2
    exit 1
fi
echo "$py"
