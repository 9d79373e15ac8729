"""The G2P model of recipes/g2p_cmudict.lua in PyTorch, for bench/g2p.lua: one measurement of
training steps (forward, backward, Adam) on random batches of the bench's shape.

Encoder: Embedding(V_in, E) -> bidirectional nn.LSTM(E, H). Decoder, a Python loop over the S
label steps (teacher forcing): Embedding(V_out, E) of the previous label, LSTMCell(E + 2H, H)
over it and the previous context, additive attention v . tanh(enc W_e + s W_q) with its
softmax over the encoder frames, readout tanh(Linear(H + 2H, H)), Linear(H, V_out) and the
cross entropy summed over the labels; Adam. float32, torch.set_num_threads(2). CELL gru: the
decoder's cell is GRUCell(E + 2H, H) instead (bench/g2p.lua's RL_G2P_CELL=gru).
Usage: python bench/torch_g2p.py T S B E H V_IN V_OUT SECONDS [THREADS [CELL]] -> prints
"ms/step X cpu_ms/step Y" (wall-clock and process CPU time per step)
"""
import sys
import time

import torch


def main():
    T, S, B, E, H, VI, VO = (int(a) for a in sys.argv[1:8])
    seconds = float(sys.argv[8])
    torch.set_num_threads(int(sys.argv[9]) if len(sys.argv) > 9 else 2)
    kind = sys.argv[10] if len(sys.argv) > 10 else "lstm"
    if kind not in ("lstm", "gru"):
        sys.exit("bench/torch_g2p.py: CELL '%s', expected lstm or gru" % kind)
    torch.manual_seed(1)
    nn = torch.nn
    emb_in, enc = nn.Embedding(VI, E), nn.LSTM(E, H, bidirectional=True)
    emb_out = nn.Embedding(VO, E)
    cell = (nn.LSTMCell if kind == "lstm" else nn.GRUCell)(E + 2 * H, H)
    W_e, W_q = nn.Linear(2 * H, H, bias=False), nn.Linear(H, H, bias=False)
    v = nn.Linear(H, 1, bias=False)
    readout, out = nn.Linear(3 * H, H), nn.Linear(H, VO)
    mods = [emb_in, enc, emb_out, cell, W_e, W_q, v, readout, out]
    params = [p for m in mods for p in m.parameters()]
    opt = torch.optim.Adam(params, lr=1e-3)
    x = torch.randint(0, VI, (T, B))
    y = torch.randint(1, VO, (S, B))
    ce = nn.CrossEntropyLoss(reduction="sum")

    def step():
        opt.zero_grad()
        e, _ = enc(emb_in(x))                     # (T, B, 2H)
        pre = W_e(e)                              # (T, B, H)
        h = torch.zeros(B, H)
        c = torch.zeros(B, H)
        ctx = torch.zeros(B, 2 * H)
        prev = torch.zeros(B, dtype=torch.long)
        logits = []
        for t in range(S):
            inp = torch.cat([emb_out(prev), ctx], 1)
            if kind == "lstm":
                h, c = cell(inp, (h, c))
            else:
                h = cell(inp, h)
            a = torch.softmax(v(torch.tanh(pre + W_q(h))).squeeze(2), 0)  # (T, B)
            ctx = (a.unsqueeze(2) * e).sum(0)
            logits.append(out(torch.tanh(readout(torch.cat([h, ctx], 1)))))
            prev = y[t]
        loss = ce(torch.stack(logits).view(S * B, VO), y.view(S * B))
        loss.backward()
        opt.step()

    for _ in range(3):
        step()
    n, t0, c0 = 0, time.perf_counter(), time.process_time()
    while time.perf_counter() - t0 < seconds:
        step()
        n += 1
    print("ms/step %.3f cpu_ms/step %.3f" % (1000 * (time.perf_counter() - t0) / n,
                                             1000 * (time.process_time() - c0) / n))


if __name__ == "__main__":
    main()
