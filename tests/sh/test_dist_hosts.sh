#!/usr/bin/env bash
# Data-parallel training across hosts: two "hosts" made of network namespaces (ip netns), joined
# by a veth pair (10.77.N.1 and 10.77.N.2; each namespace has its own loopback), with mpirun in
# the first launching the second's Open MPI daemon through an rsh agent that enters the other
# namespace (and a UTS namespace with its own host name, so Open MPI sees two nodes and talks
# TCP between them, not shared memory). Over that: tests/dist/checks.lua (2 ranks equal one
# process on the union of their batches, 12AX, resume), then tests/dist/fail.lua with rank 1
# killed, hanging, stopped (SIGSTOP), and cutting its link mid-epoch: the job ends within the distributed timeout
# with an error naming rank 1, and every checkpoint left loads. Needs root, ip netns and an MPI
# build; prints SKIP otherwise.
# Usage: test_dist_hosts.sh path/to/rnnlua (from the repository root)
set -u
bin=$(cd "$(dirname "${1:?usage: test_dist_hosts.sh path/to/rnnlua}")" && pwd)/$(basename "$1")
skip() {
    echo "SKIP test_dist_hosts: $1"
    echo "0 passed, 0 failed"
    exit 0
}
[ "$("$bin" -e 'io.write(tostring(rl.dist.built()))')" = true ] || skip "built with MPI=0"
command -v mpirun >/dev/null || skip "no mpirun (scripts/deps.sh installs openmpi-bin)"
[ "$(id -u)" -eq 0 ] || skip "needs root (ip netns)"
command -v ip >/dev/null || skip "no ip (iproute2)"

dir=$(mktemp -d)
id=$$
# a subnet of its own per run (10.77.X.0/24), so that runs in parallel do not meet
net=10.77.$((id % 250 + 1))
na=rlha$id nb=rlhb$id la=rlva$id lb=rlvb$id
cleanup() {
    ip netns del "$na" 2>/dev/null
    ip netns del "$nb" 2>/dev/null
    rm -rf "$dir"
}
trap cleanup EXIT
pass=0
fail=0
ok() { # name, condition result
    if [ "$2" -eq 0 ]; then
        pass=$((pass + 1))
        echo "ok   $1"
    else
        fail=$((fail + 1))
        echo "FAIL $1"
        [ -f "$dir/err" ] && tail -n 15 "$dir/err"
    fi
}

if ! { ip netns add "$na" && ip netns add "$nb" &&
    ip link add "$la" netns "$na" type veth peer name "$lb" netns "$nb" &&
    ip -n "$na" addr add "$net.1/24" dev "$la" && ip -n "$nb" addr add "$net.2/24" dev "$lb" &&
    ip -n "$na" link set "$la" up && ip -n "$nb" link set "$lb" up &&
    ip -n "$na" link set lo up && ip -n "$nb" link set lo up; } 2>"$dir/err"; then
    skip "cannot make network namespaces here: $(head -n 1 "$dir/err")"
fi

# mpirun's rsh agent: "AGENT HOST COMMAND..." runs COMMAND in HOST's namespaces
cat >"$dir/agent.sh" <<EOF
#!/bin/sh
host=\$1
shift
case \$host in
    $net.1) ns=$na ;;
    $net.2) ns=$nb ;;
    *) echo "agent: no namespace for host \$host" >&2; exit 1 ;;
esac
exec ip netns exec "\$ns" unshare -u sh -c 'hostname "\$0"; exec sh -c "\$1"' "node-\$host" "\$*"
EOF
chmod +x "$dir/agent.sh"
printf '%s slots=1\n%s slots=1\n' "$net.1" "$net.2" >"$dir/hosts"

export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 RL_TEST_RANK_PER_HOST=1
export LSAN_OPTIONS="suppressions=$PWD/tests/dist/lsan.supp:print_suppressions=0:fast_unwind_on_malloc=0${LSAN_OPTIONS:+:$LSAN_OPTIONS}"
mpi=(ip netns exec "$na" unshare -u sh -c "hostname node-$net.1; exec \"\$@\"" sh
     mpirun -np 2 --allow-run-as-root --hostfile "$dir/hosts" --mca plm_rsh_agent "$dir/agent.sh"
     --mca oob_tcp_if_include "$net.0/24" --mca btl_tcp_if_include "$net.0/24"
     --mca btl self,tcp -x LSAN_OPTIONS -x RL_TEST_CUT_LINK -x RL_TEST_RANK_PER_HOST)
[ -n "${ASAN_OPTIONS:-}" ] && mpi+=(-x ASAN_OPTIONS)

# the ranks are on the two hosts
"${mpi[@]}" sh -c 'echo "$OMPI_COMM_WORLD_RANK $(hostname)"' 2>"$dir/err" | sort >"$dir/out"
[ "$(cat "$dir/out")" = "$(printf '0 node-%s\n1 node-%s' "$net.1" "$net.2")" ]
ok "mpirun places rank 0 on host $net.1 and rank 1 on host $net.2" $?

timeout 300 "${mpi[@]}" "$bin" tests/dist/checks.lua "$dir/checks" >"$dir/out" 2>"$dir/err"
rc=$?
line=$(grep -E '^[0-9]+ passed, [0-9]+ failed' "$dir/out" | tail -n 1)
[ "$rc" -eq 0 ] && [ -n "$line" ] && [ "$(echo "$line" | awk '{print $3}')" = 0 ]
ok "tests/dist/checks.lua across 2 hosts over TCP: ${line:-no result} (exit $rc)" $?
grep -E '^FAIL' "$dir/err" | head -n 20
"$bin" tests/dist/checks.lua "$dir/checks" resume >"$dir/out" 2>"$dir/err" &&
    grep -q '^1 passed, 0 failed' "$dir/out"
ok "the 2-host run resumed by 1 process" $?

loadable() { # every checkpoint of a model prefix loads in a plain process
    local n=0 f
    for f in "$1".*.h5; do
        [ -f "$f" ] || continue
        "$bin" -e "rl.load_checkpoint('$f')" 2>>"$dir/err" || return 1
        n=$((n + 1))
    done
    [ "$n" -ge 1 ]
}

# fail.lua's distributed timeout is 3 s
for how in kill hang; do
    start=$(date +%s)
    timeout 120 "${mpi[@]}" "$bin" tests/dist/fail.lua "$dir/$how/net" "$how" >"$dir/out" 2>"$dir/err"
    rc=$?
    took=$(($(date +%s) - start))
    [ "$rc" -ne 0 ] && [ "$rc" -ne 124 ] && [ "$took" -lt 60 ]
    ok "rank 1 on the other host ($how): the job ends (exit $rc after ${took}s)" $?
    grep -q "rank 1" "$dir/err"
    ok "  ... the error names rank 1" $?
    loadable "$dir/$how/net"
    ok "  ... every checkpoint left loads" $?
done

# rank 1 stops itself with SIGSTOP mid-epoch (alive to the kernel and to TCP, answering nothing):
# rank 0 must say within its timeout that rank 1 is lost, and the job must end (mpirun's
# daemons end a stopped rank too)
timeout 120 "${mpi[@]}" "$bin" tests/dist/fail.lua "$dir/stop/net" stop >"$dir/out" 2>"$dir/err" &
job=$!
stop_at=""
for _ in $(seq 1200); do
    if ps -eo stat=,args= | grep -v grep | grep "$dir/stop/net" | grep -q '^T'; then
        stop_at=$(date +%s%N)
        break
    fi
    kill -0 "$job" 2>/dev/null || break
    sleep 0.05
done
said=-1
if [ -n "$stop_at" ]; then
    for _ in $(seq 600); do
        grep -q "rnnlua: rank 0: " "$dir/err" && break
        sleep 0.05
    done
    said=$((($(date +%s%N) - stop_at) / 1000000))
fi
wait "$job"
rc=$?
took=$((($(date +%s%N) - ${stop_at:-0}) / 1000000))
[ -n "$stop_at" ] && grep -q "rnnlua: rank 0: .*rank 1" "$dir/err" && [ "$said" -ge 0 ] &&
    [ "$said" -lt 6000 ]
ok "rank 1 on the other host stopped (SIGSTOP): rank 0 names rank 1 ${said} ms after (timeout 3 s)" $?
[ "$rc" -ne 0 ] && [ "$rc" -ne 124 ] && [ "$took" -lt 60000 ]
ok "  ... the job ends (exit $rc, ${took} ms after the stop)" $?
loadable "$dir/stop/net"
ok "  ... every checkpoint left loads" $?

# rank 1 takes its host's link down mid-epoch: rank 0 must say within its timeout that rank 1
# is lost; then the link comes back, so that mpirun can reach the other host's daemon and end
# the job (while the link is down, mpirun itself waits for that daemon)
RL_TEST_CUT_LINK=$lb timeout 120 "${mpi[@]}" "$bin" tests/dist/fail.lua "$dir/cut/net" cut \
    >"$dir/out" 2>"$dir/err" &
job=$!
for _ in $(seq 600); do
    ip -n "$nb" link show "$lb" | grep -q "state DOWN" && break
    sleep 0.1
done
cut_at=$(date +%s%N)
for _ in $(seq 300); do
    grep -q "rnnlua: rank 0: " "$dir/err" && break
    sleep 0.1
done
said=$((($(date +%s%N) - cut_at) / 1000000))
ip -n "$nb" link set "$lb" up
wait "$job"
rc=$?
grep -q "rnnlua: rank 0: .*rank 1" "$dir/err" && [ "$said" -lt 15000 ]
ok "the link of rank 1's host cut: rank 0 names rank 1 ${said} ms after the cut (timeout 3 s)" $?
[ "$rc" -ne 0 ] && [ "$rc" -ne 124 ]
ok "  ... the job ends once the link is back (exit $rc)" $?
loadable "$dir/cut/net"
ok "  ... every checkpoint left loads" $?

echo "$pass passed, $fail failed"
[ "$fail" -eq 0 ]
