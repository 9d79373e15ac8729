#!/usr/bin/env bash
# Data-parallel training over MPI (rnnlua.dist): tests/dist/checks.lua under `mpirun -np 2`
# (rl.dist's collectives; sync = one process on the union of the batches; average; 12AX; resume),
# then a rank killed, a rank raising a Lua error and a rank hanging mid-epoch
# (tests/dist/fail.lua): the job must end with an error naming rank 1 within a bounded time and
# every checkpoint must still load; ranks that disagree (tests/dist/checks.lua) and a launch MPI
# does not see must fail with a message naming what differs. A build
# without MPI prints SKIP lines and checks that asking for distributed training is an error.
# Usage: test_dist.sh path/to/rnnlua (from the repository root)
set -u
source "${BASH_SOURCE%/*}/lib.sh"

if [ "$("$bin" -e 'io.write(tostring(rl.dist.built()))')" != true ]; then
    "$bin" -e 'rl.train{network = {output = {class = "softmax", loss = "ce", target = "classes"}},
      train = {class = "12ax", num_seqs = 4}, distributed = {mode = "sync"}}' 2>"$tmp/err"
    [ $? -ne 0 ] && grep -q "config.distributed needs a build with MPI" "$tmp/err"
    ok "distributed training in a build without MPI is a clear error" $?
    OMPI_COMM_WORLD_SIZE=2 "$bin" -e 'print(1)' >/dev/null 2>"$tmp/err"
    [ $? -ne 0 ] && grep -q "built without MPI" "$tmp/err"
    ok "started by a launcher without MPI: a clear error" $?
    [ "$(SLURM_NTASKS=4 "$bin" -e 'io.write(rl.dist.size())' 2>"$tmp/err")" = 1 ]
    ok "an sbatch script's SLURM_NTASKS alone is no launch" $?
    echo "SKIP test_dist: built with MPI=0 (the mpirun tests need an MPI build)"
    finish
    exit
fi
if ! command -v mpirun >/dev/null; then
    echo "SKIP test_dist: no mpirun (install openmpi-bin: scripts/deps.sh)"
    echo "0 passed, 0 failed"
    exit 0
fi

# As root Open MPI needs these; sanitizer builds read the suppressions of MPI's own leaks.
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
# (full unwinding: MPI allocates in plugins it unloads, whose frames only name a library then)
export LSAN_OPTIONS="suppressions=$PWD/tests/dist/lsan.supp:print_suppressions=0:fast_unwind_on_malloc=0${LSAN_OPTIONS:+:$LSAN_OPTIONS}"
mpi=(mpirun -np 2 --oversubscribe --allow-run-as-root -x LSAN_OPTIONS)
[ -n "${ASAN_OPTIONS:-}" ] && mpi+=(-x ASAN_OPTIONS)

# the plain binary needs no launcher
[ "$("$bin" -e 'io.write(rl.dist.rank(), rl.dist.size(), tostring(rl.dist.active()))')" = 01false ]
ok "without a launcher: rank 0 of 1" $?
[ "$(SLURM_NTASKS=4 "$bin" -e 'io.write(rl.dist.rank(), rl.dist.size())')" = 01 ]
ok "an sbatch script's SLURM_NTASKS alone: rank 0 of 1" $?
# a launcher of another MPI: each process would be a world of 1 and train alone
OMPI_COMM_WORLD_SIZE=2 timeout 60 "$bin" -e 'print(1)' >/dev/null 2>"$tmp/err"
[ $? -ne 0 ] && grep -q "one of 2 processes (OMPI_COMM_WORLD_SIZE), but MPI_Init gave a world of 1" "$tmp/err"
ok "a launch that MPI_Init does not see: a clear error" $?

timeout 300 "${mpi[@]}" "$bin" tests/dist/checks.lua "$tmp/checks" >"$tmp/out" 2>"$tmp/err"
rc=$?
line=$(grep -E '^[0-9]+ passed, [0-9]+ failed' "$tmp/out" | tail -n 1)
if [ -n "$line" ]; then
    pass=$((pass + $(echo "$line" | awk '{print $1}')))
    fail=$((fail + $(echo "$line" | awk '{print $3}')))
fi
[ "$rc" -eq 0 ] && [ -n "$line" ]
ok "tests/dist/checks.lua under mpirun -np 2 (exit $rc)" $?
grep -E '^FAIL' "$tmp/err" | head -n 20

"$bin" tests/dist/checks.lua "$tmp/checks" resume >"$tmp/out" 2>"$tmp/err" &&
    grep -q '^1 passed, 0 failed' "$tmp/out"
ok "a 2-rank run resumed by 1 process" $?

loadable() { # every checkpoint of a model prefix loads in a plain process
    local n=0 f
    for f in "$1".*.h5; do
        [ -f "$f" ] || continue
        "$bin" -e "rl.load_checkpoint('$f')" 2>>"$tmp/err" || return 1
        n=$((n + 1))
    done
    [ "$n" -ge 1 ]
}

start=$(date +%s)
timeout 120 "${mpi[@]}" "$bin" tests/dist/fail.lua "$tmp/kill/net" kill >"$tmp/out" 2>"$tmp/err"
rc=$?
took=$(($(date +%s) - start))
[ "$rc" -ne 0 ] && [ "$rc" -ne 124 ] && [ "$took" -lt 60 ]
ok "a killed rank ends the job (exit $rc after ${took}s)" $?
grep -q "rank 1" "$tmp/err"
ok "the error names rank 1" $?
[ -f "$tmp/kill/net.001.h5" ] && [ ! -f "$tmp/kill/net.003.h5" ] && loadable "$tmp/kill/net"
ok "after the kill: epoch 1's checkpoint is there and every checkpoint loads" $?

start=$(date +%s)
timeout 120 "${mpi[@]}" "$bin" tests/dist/fail.lua "$tmp/error/net" error >"$tmp/out" 2>"$tmp/err"
rc=$?
took=$(($(date +%s) - start))
[ "$rc" -ne 0 ] && [ "$rc" -ne 124 ] && [ "$took" -lt 30 ]
ok "a Lua error on one rank ends the job (exit $rc after ${took}s)" $?
grep -q "rnnlua: rank 1: tests/dist/fail.lua:[0-9]*: rl.train: epoch 2, step 12: .*a Lua error on rank 1 only" "$tmp/err"
ok "the error names rank 1, the epoch, the step and the error" $?
loadable "$tmp/error/net"
ok "after the error: every checkpoint loads" $?

# rank 1's rl.train fails (a bad dataset option) and the recipe catches it and ends normally:
# the job ends (rank 0 would wait for rank 1) with a message that says why
start=$(date +%s)
timeout 120 "${mpi[@]}" "$bin" -e 'print(pcall(rl.train, {network = {output = {class = "softmax",
  loss = "ce", target = "classes"}}, train = {class = "12ax", num_seqs = rl.dist.rank() == 1
  and "x" or 20}, log_verbosity = 0, distributed = {timeout = 20}}))' >"$tmp/out" 2>"$tmp/err"
rc=$?
took=$(($(date +%s) - start))
[ "$rc" -ne 0 ] && [ "$rc" -ne 124 ] && [ "$took" -lt 15 ] &&
    grep -q "rnnlua: rank 1: the recipe ended, but the distributed world was broken" "$tmp/err"
ok "an error caught on one rank: the job ends and says why (exit $rc after ${took}s)" $?

start=$(date +%s)
timeout 120 "${mpi[@]}" "$bin" tests/dist/fail.lua "$tmp/hang/net" hang >"$tmp/out" 2>"$tmp/err"
rc=$?
took=$(($(date +%s) - start))
[ "$rc" -ne 0 ] && [ "$rc" -ne 124 ] && [ "$took" -lt 40 ]
ok "a hanging rank ends the job after the timeout (exit $rc after ${took}s)" $?
grep -q "rank 0: .*rank 1 never reached it (dead or hung)" "$tmp/err"
ok "rank 0's error names the hanging rank 1" $?
loadable "$tmp/hang/net"
ok "after the hang: every checkpoint loads" $?

finish
