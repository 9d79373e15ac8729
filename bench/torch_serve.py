"""A minimal PyTorch model server, the comparison of bench/serve.c.

Python's http.server (ThreadingHTTPServer, HTTP/1.1 keep-alive) with the 12AX BLSTM of the
benchmark in PyTorch: nn.LSTM(9, H, bidirectional=True) and a Linear + softmax output, with the
weights of the rnnlua checkpoint (rnnlua's W is weight_ih^T, U is weight_hh^T, b is bias_ih;
bias_hh = 0), so both servers give the same numbers. POST /v1/forward {"data": [[9 floats],
...]} answers {"output": [[p_L, p_R], ...]}, one request at a time per thread, no batching.
Usage: PY bench/torch_serve.py WEIGHTS.txt  (WEIGHTS: lines "layer/name n v1 ... vn" that the
benchmark writes from the checkpoint); prints "listening on http://127.0.0.1:PORT".
"""
import json
import sys
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import torch


def load_weights(path):
    w = {}
    with open(path) as f:
        for line in f:
            parts = line.split()
            w[parts[0]] = torch.tensor([float(v) for v in parts[2:]], dtype=torch.float32)
    return w


def build(w, hidden):
    lstm = torch.nn.LSTM(9, hidden, bidirectional=True)
    out = torch.nn.Linear(2 * hidden, 2)
    with torch.no_grad():
        for suffix, layer in (("", "fw"), ("_reverse", "bw")):
            getattr(lstm, "weight_ih_l0" + suffix).copy_(w[layer + "/W"].view(9, 4 * hidden).t())
            getattr(lstm, "weight_hh_l0" + suffix).copy_(
                w[layer + "/U"].view(hidden, 4 * hidden).t())
            getattr(lstm, "bias_ih_l0" + suffix).copy_(w[layer + "/b"])
            getattr(lstm, "bias_hh_l0" + suffix).zero_()
        out.weight.copy_(w["output/W"].view(2 * hidden, 2).t())
        out.bias.copy_(w["output/b"])
    return lstm.eval(), out.eval()


def main():
    torch.set_num_threads(1)  # requests run in parallel threads; one op thread each
    w = load_weights(sys.argv[1])
    hidden = w["fw/b"].numel() // 4
    lstm, out = build(w, hidden)

    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"
        # headers and body go out in two writes: without TCP_NODELAY, Nagle's algorithm and the
        # client's delayed ACK would hold the body back by ~40 ms
        disable_nagle_algorithm = True

        def log_message(self, *args):
            pass

        def reply(self, status, doc):
            body = json.dumps(doc).encode()
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def do_POST(self):
            n = int(self.headers.get("Content-Length", "0"))
            try:
                x = torch.tensor(json.loads(self.rfile.read(n))["data"], dtype=torch.float32)
                if x.dim() != 2 or x.shape[1] != 9:
                    raise ValueError("data must be (T, 9)")
            except (ValueError, KeyError, TypeError) as e:
                return self.reply(400, {"error": str(e)})
            with torch.inference_mode():
                h, _ = lstm(x.unsqueeze(1))
                p = torch.softmax(out(h.squeeze(1)), dim=-1)
            self.reply(200, {"output": p.tolist()})

    srv = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    srv.daemon_threads = True
    print("listening on http://127.0.0.1:%d" % srv.server_address[1], flush=True)
    try:
        srv.serve_forever()
    except KeyboardInterrupt:
        pass


if __name__ == "__main__":
    main()
