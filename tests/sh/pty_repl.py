"""The rnnlua REPL on a pseudo-terminal, for the shell tests that type at it (test_repl.sh,
test_bad_input.sh; run with this folder on PYTHONPATH):

    import pty_repl as R
    R.start(exe, home)     # the REPL with HOME=home (its history, .editrc) and TERM=xterm
    R.send(b"1+1\\n")       # keystrokes
    R.expect(b"> ")        # what came before the pattern (consumed), None after the timeout
    R.alive()              # still running? (R.status: its wait status once it ended)

R.buf holds what was read and not consumed; R.fd and R.pid are the terminal and the process."""
import os
import pty
import select
import time

pid = fd = status = None
buf = b""


def start(exe, home):
    global pid, fd
    pid, fd = pty.fork()
    if pid == 0:
        os.environ["HOME"] = home
        os.environ["TERM"] = "xterm"
        os.execv(exe, [exe])


def send(s):
    os.write(fd, s)


def expect(pat, timeout=5.0):
    global buf
    end = time.time() + timeout
    while pat not in buf and time.time() < end:
        r, _, _ = select.select([fd], [], [], 0.05)
        if r:
            try:
                d = os.read(fd, 4096)
            except OSError:
                break
            if not d:
                break
            buf += d
    i = buf.find(pat)
    if i < 0:
        return None
    before, buf = buf[:i], buf[i + len(pat):]
    return before


def alive():
    global status
    if status is None:
        p, st = os.waitpid(pid, os.WNOHANG)
        if p:
            status = st
    return status is None
