"""PyTorch's side of bench/ctc.lua: one measurement of CTC loss + gradient on the CPU, or on
DEVICE ("cuda": inputs there, each call ended by torch.cuda.synchronize()).

    python torch_ctc.py T B V S REPS THREADS [DEVICE]

builds the same inputs as bench/ctc.lua (logits 3 sin(0.1 t + 0.7 b + 1.3 v), labels
(7 s + 3 b) mod (V - 1), blank V - 1, full lengths), warms up once, then times REPS calls of
log_softmax + ctc_loss (reduction "sum") + backward, and prints "seconds_per_call loss_sum".
"""
import sys
import time

import torch


def main():
    T, B, V, S, reps, threads = (int(a) for a in sys.argv[1:7])
    device = sys.argv[7] if len(sys.argv) > 7 else "cpu"
    torch.set_num_threads(threads)
    t = torch.arange(T, dtype=torch.float64).view(T, 1, 1)
    b = torch.arange(B, dtype=torch.float64).view(1, B, 1)
    v = torch.arange(V, dtype=torch.float64).view(1, 1, V)
    logits = (3 * torch.sin(0.1 * t + 0.7 * b + 1.3 * v)).float().to(device)
    s = torch.arange(S).view(1, S)
    bb = torch.arange(B).view(B, 1)
    targets = ((7 * s + 3 * bb) % (V - 1)).int().to(device)
    il = torch.full((B,), T, dtype=torch.int32)
    tl = torch.full((B,), S, dtype=torch.int32)
    sync = torch.cuda.synchronize if device != "cpu" else (lambda: None)

    def step():
        x = logits.detach().requires_grad_(True)
        lp = torch.log_softmax(x, dim=2)
        loss = torch.nn.functional.ctc_loss(lp, targets, il, tl, blank=V - 1, reduction="sum")
        loss.backward()
        sync()
        return float(loss.detach())

    step()
    t0 = time.perf_counter()
    for _ in range(reps):
        total = step()
    dt = (time.perf_counter() - t0) / reps
    print(f"{dt:.9f} {total:.9g}")


if __name__ == "__main__":
    main()
