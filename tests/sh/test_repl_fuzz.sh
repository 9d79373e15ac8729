#!/usr/bin/env bash
# The REPL under a pseudo-terminal never dies of what is typed: for a few seconds (seeded, so a
# failure can be replayed) random bytes (8-bit ones too, which libedit's emacs map took as
# Meta keys), escape sequences, control keys, Tab and Enter are typed at the prompt; the REPL
# must still be running and answer 1+1 afterwards. Three keys are left out because the
# terminal, not the REPL, acts on them: Ctrl-Z (suspend), Ctrl-\ (SIGQUIT), and Ctrl-D, which
# ends the session on an empty line as it should.
# Usage: test_repl_fuzz.sh BIN [SECONDS [SEED]]
set -u
bin=$(cd "$(dirname "${1:?usage: test_repl_fuzz.sh path/to/rnnlua [seconds [seed]]}")" && pwd)/$(basename "$1")
secs=${2:-4}
seed=${3:-20261128}
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
if ! command -v python3 >/dev/null; then
    echo "FAIL the pty fuzz test needs python3"
    echo "0 passed, 1 failed"
    exit 1
fi
mkdir -p "$tmp/home"
cat >"$tmp/fuzz.py" <<'PY'
import os, pty, random, select, signal, sys, time
exe, home, secs, seed = sys.argv[1], sys.argv[2], float(sys.argv[3]), int(sys.argv[4])
rng = random.Random(seed)
pid, fd = pty.fork()
if pid == 0:
    os.environ["HOME"] = home
    os.environ["TERM"] = "xterm"
    os.execv(exe, [exe])

def drain(t):
    out = b""
    end = time.time() + t
    while time.time() < end:
        r, _, _ = select.select([fd], [], [], 0.01)
        if r:
            try:
                d = os.read(fd, 65536)
            except OSError:
                break
            if not d:
                break
            out += d
    return out

def alive():
    p, st = os.waitpid(pid, os.WNOHANG)
    return p == 0, st

ESC = [b"\x1b[A", b"\x1b[B", b"\x1b[C", b"\x1b[D", b"\x1b[H", b"\x1b[F", b"\x1b[3~", b"\x1b[2~",
       b"\x1b[5~", b"\x1b[1;5C", b"\x1b[1;5D", b"\x1bOH", b"\x1bOF", b"\x1b[200~", b"\x1b[201~",
       b"\x1bx", b"\x1bX", b"\x1bb", b"\x1bf", b"\x1bd", b"\x1b\x7f", b"\x1b:", b"\x1b\x1b",
       b"\x1b[", b"\x1bO", b"\x1b", b"\xf8", b"\xd8", b"\xe4"]
WORDS = [b"\t", b"\t\t", b'"', b"'", b"rl.", b"string.", b"x:", b"(", b"{", b"[[", b"--",
         b"\x7f", b"\r", "ø".encode(), "€".encode()]
SKIP = {0x04, 0x1a, 0x1c}  # Ctrl-D, Ctrl-Z, Ctrl-\ (see the header)
log = []
drain(0.5)
end = time.time() + secs
died = None
while time.time() < end:
    k = rng.random()
    if k < 0.3:
        b = bytes(rng.randrange(256) for _ in range(rng.randrange(1, 9)))
    elif k < 0.55:
        b = rng.choice(ESC) + rng.choice([b"", b'"', b"'", b"\t"])
    elif k < 0.75:
        b = bytes([rng.randrange(32)])
    else:
        b = rng.choice(WORDS)
    b = bytes(c for c in b if c not in SKIP)
    log.append(b)
    try:
        os.write(fd, b)
    except OSError:
        pass
    drain(0.003)
    ok, st = alive()
    if not ok:
        died = st
        break
if died is None:
    # Ctrl-Q (a Ctrl-S may have stopped the output), Ctrl-C twice (a chunk left open, a
    # statement running), Ctrl-U (the line), then the question
    os.write(fd, b"\x11\x03")
    drain(0.3)
    os.write(fd, b"\x03")
    drain(0.3)
    os.write(fd, b"\x151+1\r")
    out = drain(2.0)
    ok, st = alive()
    if not ok:
        died = st
if died is not None:
    how = ("signal %d" % os.WTERMSIG(died)) if os.WIFSIGNALED(died) else ("exit %d" % os.WEXITSTATUS(died))
    print("FAIL pty fuzz (seed %d): the REPL died (%s) after typing %r" % (seed, how, b"".join(log[-20:])))
elif b"\r\n2\r\n" not in out:
    print("FAIL pty fuzz (seed %d): no answer to 1+1 after %d keys; last output %r" % (seed, len(log), out[-300:]))
    os.kill(pid, signal.SIGKILL)
else:
    print("ok   pty fuzz (seed %d): %d keys in %.0f s, then 1+1 answered 2" % (seed, len(log), secs))
    os.kill(pid, signal.SIGKILL)
PY
pass=0
fail=0
while IFS= read -r line; do
    case "$line" in
        "ok   "*) pass=$((pass + 1)); echo "$line" ;;
        "FAIL "*) fail=$((fail + 1)); echo "$line" ;;
        *) echo "$line" ;;
    esac
done < <(timeout $((${secs%.*} + 30)) python3 "$tmp/fuzz.py" "$bin" "$tmp/home" "$secs" "$seed" 2>&1 \
    || echo "FAIL pty fuzz driver did not finish")
echo "$pass passed, $fail failed"
[ "$fail" -eq 0 ]
