#!/usr/bin/env bash
# Runs every C unit test (BUILD/tests/test_*) and every Lua test (tests/lua/test_*.lua,
# through the rnnlua binary), adds up their closing "N passed, N failed" lines and prints the
# total. A program that crashes or prints no closing line counts as one failure.
set -u
build=${1:-build}
# Under AddressSanitizer a failing allocation (a huge layer in the bad-input tests) returns NULL
# as it does in the normal build, so the library's out-of-memory errors are what is tested.
export ASAN_OPTIONS="${ASAN_OPTIONS:+$ASAN_OPTIONS:}allocator_may_return_null=1"
bin="$build/rnnlua"
total_pass=0
total_fail=0
log=$(mktemp)
trap 'rm -f "$log"' EXIT

# A program that hangs is stopped after RL_TEST_TIMEOUT seconds (default 1200; the slowest
# takes about a minute under the sanitizers) and counts as a failure, so that a hang fails the
# suite instead of holding CI until its own limit.
limit=${RL_TEST_TIMEOUT:-1200}
run_one() {
    local name=$1
    shift
    timeout -k 10 "$limit" "$@" >"$log" 2>&1
    local rc=$?
    if [ "$rc" -eq 124 ] || [ "$rc" -eq 137 ]; then
        echo "FAIL $name (still running after $limit s: stopped)"
        tail -n 30 "$log"
        total_fail=$((total_fail + 1))
        return
    fi
    local line
    line=$(grep -E '^[0-9]+ passed, [0-9]+ failed' "$log" | tail -n 1)
    local p=0 f=0
    if [ -n "$line" ]; then
        p=$(echo "$line" | awk '{print $1}')
        f=$(echo "$line" | awk '{print $3}')
    fi
    if [ -z "$line" ] || { [ "$rc" -ne 0 ] && [ "$f" -eq 0 ]; }; then
        f=$((f + 1))
        echo "FAIL $name (exit $rc, no clean closing line)"
        tail -n 30 "$log"
    elif [ "$f" -ne 0 ]; then
        echo "FAIL $name: $line"
        grep -vE '^(ok|[0-9]+ passed)' "$log" | tail -n 40
    else
        echo "ok   $name: $line"
    fi
    total_pass=$((total_pass + p))
    total_fail=$((total_fail + f))
}

for t in "$build"/tests/test_*; do
    [ -x "$t" ] || continue
    run_one "$(basename "$t")" "$t"
done
for t in tests/lua/test_*.lua; do
    [ -f "$t" ] || continue
    run_one "$(basename "$t")" "$bin" "$t"
done
for t in tests/sh/test_*.sh; do
    [ -f "$t" ] || continue
    run_one "$(basename "$t")" bash "$t" "$bin"
done

echo "$total_pass passed, $total_fail failed"
[ "$total_fail" -eq 0 ]
