#!/usr/bin/env bash
# Runs tests/gpu/test_dist_nccl.lua under `mpirun -np 2` (run by `make test-gpu`); a SKIP line
# without MPI or mpirun. Usage: test_dist_nccl.sh path/to/rnnlua (from the repository root)
set -u
bin=${1:?usage: test_dist_nccl.sh path/to/rnnlua}
if [ "$("$bin" -e 'io.write(tostring(rl.dist.built()))')" != true ] || ! command -v mpirun >/dev/null
then
    echo "SKIP test_dist_nccl: needs a build with MPI and mpirun"
    exit 0
fi
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
timeout 300 mpirun -np 2 --oversubscribe --allow-run-as-root "$bin" tests/gpu/test_dist_nccl.lua
