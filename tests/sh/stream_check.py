"""POST /v1/stream/{id} of `rnnlua serve` (tests/sh/test_embed.sh starts the server).
Usage: stream_check.py PORT DIR MODEL, with DIR holding in1.txt (embed's input: "T F", then T
rows) and out1.txt (the whole sequence's outputs, a row a frame) of the causal model. For
model.h5 (served with --max-streams 2 --stream-timeout 1): the chunks of 7 frames give the
whole-sequence numbers to float32 rounding, so do two streams sent at once in chunks of 3 and
5 (batched together where their chunks wait at the same time), "end" closes a stream, a third stream is refused
(503), a stream idle past the timeout answers 410 once, bad chunks 400/422. For blstm.h5: 422
naming the layer. For overflow.h5: an output that overflows to Inf is a 500 naming it."""
import json
import sys
import threading
import time
import urllib.error
import urllib.request

port, d, model = sys.argv[1], sys.argv[2], sys.argv[3]
passed = failed = 0


def check(name, cond, detail=""):
    global passed, failed
    if cond:
        passed += 1
    else:
        failed += 1
        print(f"FAIL {name} {detail}")


def post(sid, body):
    req = urllib.request.Request(f"http://127.0.0.1:{port}/v1/stream/{sid}",
                                 data=json.dumps(body).encode(), method="POST")
    try:
        with urllib.request.urlopen(req, timeout=30) as r:
            return r.status, json.loads(r.read())
    except urllib.error.HTTPError as e:
        return e.code, json.loads(e.read())


frames = [[float(v) for v in line.split()] for line in open(f"{d}/in1.txt").read().splitlines()[1:]]
if model == "blstm.h5":
    st, ans = post("x", {"data": frames[:3]})
    check("bidirectional model refused", st == 422 and "'bw'" in ans.get("error", ""), f"{st} {ans}")
elif model == "overflow.h5":
    # an output JSON cannot write: an error naming it, not a row with the value left out
    st, ans = post("x", {"data": [[1, 2], [1e20, 1e20]]})
    check("an output that overflows: 500 naming it",
          st == 500 and "output[1][0]" in ans.get("error", "") and "Inf" in ans["error"],
          f"{st} {ans}")
    st, ans = post("y", {"data": [[1, 2]]})
    check("a finite output", st == 200 and len(ans["output"]) == 1 and len(ans["output"][0]) == 3,
          f"{st} {ans}")
else:
    ref = [[float(v) for v in line.split()] for line in open(f"{d}/out1.txt").read().splitlines()]
    # two streams at once, in chunks of 3 and 5 frames: chunks that wait together go through one
    # batched forward (rl_session_push_many), and each stream still gets its whole sequence
    def stream(sid, size, out):
        for t in range(0, len(frames), size):
            st, ans = post(sid, {"data": frames[t:t + size], "end": t + size >= len(frames)})
            if st != 200:
                out.append(None)
                return
            out += ans["output"]

    outs = {3: [], 5: []}
    threads = [threading.Thread(target=stream, args=(f"c{k}", k, outs[k])) for k in outs]
    for th in threads:
        th.start()
    for th in threads:
        th.join()
    for k, o in outs.items():
        w = max((abs(a - b) - 2.4e-7 * abs(b) for ra, rb in zip(o, ref) for a, b in zip(ra, rb)),
                default=1) if None not in o else 1
        check(f"stream in chunks of {k} beside another = whole sequence",
              len(o) == len(ref) and w <= 1e-7, f"{len(o)} rows, {w}")
    got = []
    for t in range(0, len(frames), 7):
        st, ans = post("s1", {"data": frames[t:t + 7]})
        check(f"chunk at frame {t}", st == 200 and ans["frames"] == min(t + 7, len(frames)),
              f"{st} {ans}")
        got += ans.get("output", [])
    worst = max((abs(a - b) - 2.4e-7 * abs(b) for ra, rb in zip(got, ref) for a, b in zip(ra, rb)),
                default=1)
    check("streamed = whole sequence", len(got) == len(ref) and worst <= 1e-7, f"{worst}")
    st, ans = post("s2", {"data": frames[:2]})
    check("a second stream", st == 200, f"{st} {ans}")
    st, ans = post("s3", {"data": frames[:2]})
    check("a third stream: 503", st == 503 and "--max-streams" in ans["error"], f"{st} {ans}")
    st, ans = post("s2", {"data": frames[:1], "end": True})
    check("end", st == 200 and ans["end"] is True and ans["frames"] == 3, f"{st} {ans}")
    st, ans = post("s3", {"data": [frames[0][:-1]]})
    check("a frame of too few values: 422", st == 422, f"{st} {ans}")
    st, ans = post("s3", {"batch": [{"data": frames[:2]}]})
    check("a batch: 400", st == 400 and "one sequence" in ans["error"], f"{st} {ans}")
    st, ans = post("s3", {"data": frames[:1], "end": 1})
    check("end not a boolean: 400", st == 400, f"{st} {ans}")
    st, ans = post("bad%20id", {"data": frames[:1]})
    check("a bad id: 400", st == 400, f"{st} {ans}")
    time.sleep(1.3)
    st, ans = post("s1", {"data": frames[:1]})
    check("idle past --stream-timeout: 410", st == 410 and "--stream-timeout" in ans["error"],
          f"{st} {ans}")
    st, ans = post("s1", {"data": frames[:1]})
    check("then a new stream", st == 200 and ans["frames"] == 1
          and abs(ans["output"][0][0] - ref[0][0]) <= 1e-6, f"{st} {ans}")
print(f"{passed} passed, {failed} failed")
