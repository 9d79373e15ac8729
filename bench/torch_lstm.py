"""One PyTorch process of bench/lstm_compare.sh: the training step of bench/lstm_step.lua.

A step is zero_grad + forward + backward (no optimizer update) of an nn.LSTM stack
(bidirectional where the config says so), a Linear output layer and CrossEntropy (summed),
float32 on the CPU, torch.set_num_threads(2) (RL_BENCH_THREADS overrides), or on DEVICE ("cuda": cuDNN's LSTM, the device kit's
comparison; a step then ends with torch.cuda.synchronize()).
Usage: PYTHON bench/torch_lstm.py CONFIG [SECONDS] [DEVICE] [PRECISION] [OPTIONS]
with the python of bench/torch_env.sh (a current PyTorch) or any other that imports torch.
PRECISION "bf16" runs the model under torch.autocast(dtype=torch.bfloat16) (float32 weights,
bf16 products), as lstm_step.lua's precision "bf16"; a forward-only configuration (utt768,
utt512) runs under torch.inference_mode(). PRECISION "int8" (forward-only configurations) runs
torch.ao.quantization.quantize_dynamic's copy of the LSTM and Linear (qint8 weights, activations
quantized dynamically at each product), as lstm_step.lua's precision "int8".
OPTIONS: "hidden=H,proj=P" (either may be left out) overrides the config's hidden size and gives
nn.LSTM proj_size = P (LSTMP), as lstm_step.lua's "n_out=H,n_proj=P".
Prints "RESULT config ms_per_step peak_rss_kib rss_before_model_kib steps cpu_ms_per_step" as
lstm_step.lua does, or a SKIP line (exit 0) where torch is not importable.
"""
import contextlib
import os
import resource
import sys
import time

# layers, bidirectional, input, hidden, classes, T, B, forward only (as bench/lstm_step.lua)
CONFIGS = {
    "seqmnist": (1, False, 28, 128, 10, 28, 64, False),
    "ptb_small": (1, False, 200, 200, 10000, 20, 20, False),
    "odd": (2, True, 61, 300, 43, 137, 7, False),
    "ptb_large": (2, False, 650, 650, 10000, 50, 20, False),
    "chime": (3, True, 45, 512, 1501, 250, 16, False),
    "tiny1": (3, False, 257, 257, 257, 311, 1, False),
    "tiny3": (3, False, 257, 257, 257, 311, 3, False),
    "utt768": (3, False, 80, 768, 1000, 400, 1, True),
    "utt512": (2, True, 80, 512, 1000, 500, 1, True),
}


def status_kib(field):
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(field + ":"):
                return int(line.split()[1])
    return 0


def main():
    name = sys.argv[1]
    seconds = float(sys.argv[2]) if len(sys.argv) > 2 else 3.0
    device = sys.argv[3] if len(sys.argv) > 3 else "cpu"
    precision = sys.argv[4] if len(sys.argv) > 4 else "fp32"
    if precision not in ("fp32", "bf16", "int8"):
        print("torch_lstm: precision must be fp32, bf16 or int8, got %r" % precision,
              file=sys.stderr)
        return 2
    try:
        import torch
    except ImportError:
        print("SKIP torch_lstm: PyTorch is not importable by %s" % sys.executable)
        return 0
    torch.set_num_threads(int(os.environ.get("RL_BENCH_THREADS", "2")))
    torch.manual_seed(1)
    layers, bidir, inp, hid, classes, T, B, fwd_only = CONFIGS[name]
    opts = dict(kv.split("=") for kv in sys.argv[5].split(",")) if len(sys.argv) > 5 else {}
    hid = int(opts.get("hidden", hid))
    proj = int(opts.get("proj", 0))
    rss0 = status_kib("VmRSS")
    dirs = 2 if bidir else 1
    lstm = torch.nn.LSTM(inp, hid, num_layers=layers, bidirectional=bidir, proj_size=proj)
    lstm = lstm.to(device)
    width = proj if proj else hid  # of each direction's output
    out = torch.nn.Linear(dirs * width, classes).to(device)
    params = list(lstm.parameters()) + list(out.parameters())
    if precision == "int8":
        if not fwd_only or device != "cpu":
            print("torch_lstm: int8 is for the CPU's forward-only configurations", file=sys.stderr)
            return 2
        both = torch.ao.quantization.quantize_dynamic(
            torch.nn.ModuleList([lstm, out]), {torch.nn.LSTM, torch.nn.Linear}, dtype=torch.qint8)
        lstm, out = both[0], both[1]
    x = torch.randn(T, B, inp).to(device)
    y = torch.tensor([(i * 2654435761) % classes for i in range(T * B)]).to(device)
    ce = torch.nn.CrossEntropyLoss(reduction="sum")
    sync = torch.cuda.synchronize if device != "cpu" else (lambda: None)

    def amp():
        if precision == "bf16":
            return torch.autocast(device.split(":")[0], dtype=torch.bfloat16)
        return contextlib.nullcontext()

    def step():
        if fwd_only:
            with torch.inference_mode(), amp():
                h, _ = lstm(x)
                out(h.reshape(T * B, dirs * width))
            sync()
            return
        for p in params:
            p.grad = None
        with amp():
            h, _ = lstm(x)
            loss = ce(out(h.reshape(T * B, dirs * width)), y)
        loss.backward()
        sync()

    step()
    times = []
    t_end = time.perf_counter() + seconds
    cpu0 = time.process_time()
    while len(times) < 2 or time.perf_counter() < t_end:
        t0 = time.perf_counter()
        step()
        times.append(time.perf_counter() - t0)
    times.sort()
    n = len(times)
    med = times[n // 2] if n % 2 else 0.5 * (times[n // 2 - 1] + times[n // 2])
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    cpu_ms = (time.process_time() - cpu0) * 1e3 / n
    print("RESULT %s %.3f %d %d %d %.3f" % (name, med * 1e3, peak, rss0, n, cpu_ms))
    return 0


if __name__ == "__main__":
    sys.exit(main())
