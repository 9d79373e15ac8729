"""rnnlua's gru layer against PyTorch's nn.GRU, training steps on the CPU, in one interleaved run.

    PY=$(bash bench/torch_env.sh) && $PY bench/torch_gru.py BUILD/bench/gru [config]

For each configuration of bench/gru.c (the LSTM benchmark's topologies: chime 3 bidirectional
layers x 512, input 45, T=250, B=16; ptb_large 2 x 650, input 650, T=50, B=20; seqmnist
1 x 128, input 28, T=28, B=64), rnnlua runs as a child process (`gru --serve CONFIG`, one
measurement per request) and PyTorch in this process, measured alternately: round k times
rnnlua, then PyTorch, so the machine's other load hits both alike; the median of
RL_BENCH_ROUNDS (default 5) measurements of about RL_BENCH_SECONDS (default 0.5) each is
reported. A training step is forward + backward of the GRU stack (float32, gradients zeroed,
no optimizer step) with a fixed random gradient at the top output and no input gradient at the
bottom, on RL_BENCH_THREADS threads (default 2) on both sides (torch.set_num_threads; rnnlua:
OPENBLAS_NUM_THREADS, which its GEMMs and per-step products follow). On a machine loaded by
other jobs, 2 threads per side measure mostly the threads' waiting (PyTorch's OpenMP threads
lose most); 1 thread per side compares the computation.
FLOPs per step: 18*T*B*H*(I+H) per direction and layer, the same count as bench/gru.c.
"""
import os
import subprocess
import sys
import time

TOPOS = [  # name, layers, bidirectional, input, hidden, T, B (bench/gru.c)
    ("chime", 3, True, 45, 512, 250, 16),
    ("ptb_large", 2, False, 650, 650, 50, 20),
    ("seqmnist", 1, False, 28, 128, 28, 64),
]


def calibrate(run, seconds):
    """The repetition count that makes one measurement take about `seconds`."""
    run(1)
    reps = 1
    while True:
        t = run(reps)
        if t >= seconds / 10:
            break
        reps *= 2
    return max(1, round(seconds * reps / t))


def main():
    import torch

    if len(sys.argv) < 2:
        print("usage: torch_gru.py BUILD/bench/gru [config]", file=sys.stderr)
        return 2
    bench, only = sys.argv[1], sys.argv[2] if len(sys.argv) > 2 else None
    threads = int(os.environ.get("RL_BENCH_THREADS", "2"))
    torch.set_num_threads(threads)
    torch.manual_seed(1)
    seconds = float(os.environ.get("RL_BENCH_SECONDS", "0.5"))
    rounds = int(os.environ.get("RL_BENCH_ROUNDS", "5"))
    print("### GRU training step: rnnlua vs PyTorch %s nn.GRU (float32, CPU, %d threads)\n"
          % (torch.__version__, torch.get_num_threads()))
    print("| config | rnnlua ms/step | PyTorch ms/step | speed-up | rnnlua GFLOP/s |")
    print("|---|---:|---:|---:|---:|")
    for name, layers, bidir, inp, hid, T, B in TOPOS:
        if only and name != only:
            continue
        dirs = 2 if bidir else 1
        gru = torch.nn.GRU(inp, hid, num_layers=layers, bidirectional=bidir)
        params = list(gru.parameters())
        x = torch.randn(T, B, inp)
        gtop = torch.randn(T, B, dirs * hid) * 0.1

        def torch_run(reps):
            t0 = time.perf_counter()
            for _ in range(reps):
                for p in params:
                    p.grad = None
                h, _ = gru(x)
                h.backward(gtop)
            return time.perf_counter() - t0

        env = dict(os.environ, OPENBLAS_NUM_THREADS=str(threads))
        child = subprocess.Popen([bench, "--serve", name], stdin=subprocess.PIPE,
                                 stdout=subprocess.PIPE, text=True, env=env)
        ready = child.stdout.readline().split()
        if not ready or ready[0] != "ready":
            print("torch_gru: %s --serve %s did not start" % (bench, name), file=sys.stderr)
            return 1
        flops = float(ready[1])

        def rnnlua_run(reps):
            child.stdin.write("%d\n" % reps)
            child.stdin.flush()
            return float(child.stdout.readline())

        reps_r, reps_t = calibrate(rnnlua_run, seconds), calibrate(torch_run, seconds)
        tr, tt = [], []
        for _ in range(rounds):
            tr.append(rnnlua_run(reps_r) / reps_r)
            tt.append(torch_run(reps_t) / reps_t)
        child.stdin.close()
        child.wait()
        tr.sort()
        tt.sort()
        r, t = tr[len(tr) // 2], tt[len(tt) // 2]
        print("| %s | %.1f | %.1f | %.2fx | %.1f |" % (name, r * 1e3, t * 1e3, t / r, flops / r / 1e9))
        sys.stdout.flush()
    print("\nMedians of %d interleaved measurements of ~%g s each; speed-up = PyTorch time / "
          "rnnlua time." % (rounds, seconds))
    return 0


if __name__ == "__main__":
    sys.exit(main())
