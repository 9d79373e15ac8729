#!/usr/bin/python3
"""PyTorch's CPU LSTM on the configurations of bench/lstm.c, for comparison.

A training step is forward + backward (zero_grad included, no optimizer step) of an
nn.LSTM stack (bidirectional for chime), a Linear output layer and CrossEntropy (summed),
float32, torch.set_num_threads(2). Prints the same Markdown columns as bench/lstm.c; FLOPs per
step count 24*T*B*H*(I+H) per LSTM direction and layer plus 6*T*B*H_last*C for the output.
Run with Debian's interpreter: /usr/bin/python3 bench/torch_lstm.py [config]
Environment: RL_BENCH_SECONDS (seconds per measurement, default 0.5), RL_BENCH_ROUNDS
(measurements, default 5; the median is reported).
"""
import os
import sys
import time

TOPOS = [  # name, layers, bidirectional, input, hidden, classes, T, B
    ("chime", 3, True, 45, 512, 1501, 250, 16),
    ("ptb_large", 2, False, 650, 650, 10000, 50, 20),
    ("seqmnist", 1, False, 28, 128, 10, 28, 64),
]


def main():
    try:
        import torch
    except ImportError:
        print("SKIP torch_lstm: PyTorch is not importable by %s; install it with "
              "`apt-get install -y python3-torch` and run /usr/bin/python3 bench/torch_lstm.py"
              % sys.executable)
        return 0
    torch.set_num_threads(2)
    torch.manual_seed(1)
    seconds = float(os.environ.get("RL_BENCH_SECONDS", "0.5"))
    rounds = int(os.environ.get("RL_BENCH_ROUNDS", "5"))
    only = sys.argv[1] if len(sys.argv) > 1 else None
    print("### LSTM training step (PyTorch %s, float32, CPU, %d threads)\n"
          % (torch.__version__, torch.get_num_threads()))
    print("| config | ms/step | frames/s | GFLOP/s |")
    print("|---|---:|---:|---:|")
    for name, layers, bidir, inp, hid, classes, T, B in TOPOS:
        if only and name != only:
            continue
        dirs = 2 if bidir else 1
        lstm = torch.nn.LSTM(inp, hid, num_layers=layers, bidirectional=bidir)
        out = torch.nn.Linear(dirs * hid, classes)
        params = list(lstm.parameters()) + list(out.parameters())
        x = torch.randn(T, B, inp)
        y = torch.randint(0, classes, (T * B,))
        ce = torch.nn.CrossEntropyLoss(reduction="sum")

        def step():
            for p in params:
                p.grad = None
            h, _ = lstm(x)
            loss = ce(out(h.reshape(T * B, dirs * hid)), y)
            loss.backward()

        step()
        reps, t = 1, 0.0
        while True:
            t0 = time.perf_counter()
            for _ in range(reps):
                step()
            t = time.perf_counter() - t0
            if t >= seconds / 10:
                break
            reps *= 2
        reps = max(1, round(seconds * reps / t))
        times = []
        for _ in range(rounds):
            t0 = time.perf_counter()
            for _ in range(reps):
                step()
            times.append((time.perf_counter() - t0) / reps)
        times.sort()
        sec = times[len(times) // 2]
        flops = 0.0
        for li in range(layers):
            i = dirs * hid if li else inp
            flops += dirs * 24.0 * T * B * hid * (i + hid)
        flops += 6.0 * T * B * dirs * hid * classes
        print("| %s | %.1f | %.0f | %.1f |" % (name, sec * 1e3, T * B / sec, flops / sec / 1e9))
        sys.stdout.flush()
    return 0


if __name__ == "__main__":
    sys.exit(main())
