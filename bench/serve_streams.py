"""S concurrent streams against `rnnlua serve`'s POST /v1/stream/{id}: each client thread opens
its stream with its first chunk and then sends one F-value frame a chunk over its own keep-alive
connection for SECONDS; prints the chunks answered, the latency percentiles of the chunks after
each stream's first (the first opens the session: its latency is reported apart), the clients
that failed, and, given the server's PID, its peak resident memory (VmHWM).
Usage: serve_streams.py PORT STREAMS SECONDS F [SERVER_PID]
The client is Python threads on the same machine: its own CPU time is in the figures."""
import http.client
import json
import sys
import threading
import time

port, streams, seconds, nfeat = (int(a) for a in sys.argv[1:5])
pid = sys.argv[5] if len(sys.argv) > 5 else None
lat, first, errors = [], [], []
lock = threading.Lock()
start = threading.Barrier(streams)


def client(i):
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=120)
    mine, opened = [], None
    try:
        start.wait()
        t_end = time.time() + seconds
        k = 0
        while time.time() < t_end:
            frame = [((k * 31 + j * 7) % 17) / 17.0 - 0.5 for j in range(nfeat)]
            body = json.dumps({"data": [frame]})
            t0 = time.perf_counter()
            conn.request("POST", f"/v1/stream/c{i}", body, {"Content-Type": "application/json"})
            r = conn.getresponse()
            ans = r.read()
            dt = time.perf_counter() - t0
            if r.status != 200:
                raise RuntimeError(f"chunk {k}: {r.status} {ans[:200]!r}")
            if k == 0:
                opened = dt
            else:
                mine.append(dt)
            k += 1
    except Exception as e:  # reported, counted: a failed client is a figure of the run
        with lock:
            errors.append(f"client {i}: {e}")
    finally:
        conn.close()
    with lock:
        lat.extend(mine)
        if opened is not None:
            first.append(opened)


threads = [threading.Thread(target=client, args=(i,)) for i in range(streams)]
for t in threads:
    t.start()
for t in threads:
    t.join()


def pct(v, p):
    return v[min(len(v) - 1, int(p / 100 * (len(v) - 1) + 0.5))] * 1e3 if v else float("nan")


lat.sort()
first.sort()
print(f"{streams} streams, {seconds} s: {len(lat) + len(first)} chunks answered; chunk latency "
      f"p50 {pct(lat, 50):.1f} ms, p99 {pct(lat, 99):.1f} ms, max {pct(lat, 100):.1f} ms; "
      f"first chunk (opening the stream) p50 {pct(first, 50):.1f} ms, max {pct(first, 100):.1f} ms; "
      f"{len(errors)} clients failed")
for e in errors[:5]:
    print(" ", e)
if pid:
    for line in open(f"/proc/{pid}/status"):
        if line.startswith("VmHWM"):
            print("server peak RSS:", line.split(":")[1].strip())
