# What every shell test shares; sourced (after `set -u`) by tests/sh/test_*.sh, which run.sh
# calls as `bash tests/sh/test_X.sh path/to/rnnlua` from the repository root. It sets
#   bin   the rnnlua binary under test, as an absolute path (some tests cd elsewhere),
#   repo  the repository root (where they start),
#   tmp   a scratch folder removed at exit,
#   log   the file whose tail `ok NAME STATUS` shows on a failure ($tmp/err unless changed),
# counts the checks in pass and fail, and `finish` prints the closing line run.sh adds up.
bin=$(cd "$(dirname "${1:?usage: $0 path/to/rnnlua}")" && pwd)/$(basename "$1")
repo=$(pwd)
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
log=$tmp/err
pass=0
fail=0

# bad NAME [LINE...]: a failed check, with the lines that say why.
bad() {
    fail=$((fail + 1))
    echo "FAIL $1"
    shift
    local l
    for l in "$@"; do echo "     $l"; done
}

# ok NAME [STATUS]: a passed check; with STATUS (a command's $?), passed only when it is 0,
# else failed with the last lines of $log.
ok() {
    if [ "${2:-0}" -eq 0 ]; then
        pass=$((pass + 1))
        echo "ok   $1"
    else
        bad "$1" "status $2; the end of $(basename "$log"):"
        [ -f "$log" ] && tail -n 15 "$log"
    fi
}

# check NAME EXPECTED GOT
check() {
    if [ "$2" == "$3" ]; then ok "$1"; else bad "$1" "expected: $(printf %q "$2")" "got:      $(printf %q "$3")"; fi
}

# contains NAME NEEDLE HAYSTACK
contains() {
    if [[ "$3" == *"$2"* ]]; then ok "$1"; else bad "$1" "no $(printf %q "$2") in:" "$3"; fi
}

# run ARG...: runs rnnlua with ARG...; its exit status goes to $rc, stdout to $tmp/out, stderr to
# $tmp/err.
run() {
    "$bin" "$@" >"$tmp/out" 2>"$tmp/err"
    rc=$?
}

# The closing line, and the script's status.
finish() {
    echo "$pass passed, $fail failed"
    [ "$fail" -eq 0 ]
}
