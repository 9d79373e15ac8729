#!/usr/bin/python3
"""Checks `rnnlua serve` from the outside (run by tests/sh/test_serve.sh).

Usage: serve_check.py RNNLUA DIR, where DIR holds model.h5 (a 12AX BLSTM), dev.h5 (its dev set)
and fwd.h5 (rl.forward's answers on it), other.h5 / fwd_other.h5 (another checkpoint, epoch 7,
and its answers) and dim5.h5 (a model with another input dim). Every server is started here
on a free loopback port (--port 0; the port is read from its first stdout line) and stopped.
Prints one line per check and "N passed, N failed" at the end.
"""
import ctypes
import http.client
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time

import h5py
import numpy as np

BIN, DIR = sys.argv[1], sys.argv[2]
SANITIZED = os.environ.get("RL_SERVE_TEST_SECONDS") is None and "-san" in BIN
PASSED, FAILED = [0], [0]


def check(name, cond, detail=""):
    if cond:
        PASSED[0] += 1
        print("ok   " + name)
    else:
        FAILED[0] += 1
        print("FAIL " + name + (": " + str(detail) if detail else ""))
    return cond


def read_seqs(path, sizes=False):
    """The sequences of a dataset file, (T, F) each; with sizes, also each image's [h, w]."""
    with h5py.File(path, "r") as f:
        x = np.asarray(f["inputs"], dtype=np.float32)
        lens = np.asarray(f["seqLengths"])[:, 0]
        hw = np.asarray(f["seqSizes"]).tolist() if sizes else None
    out, o = [], 0
    for n in lens:
        out.append(x[o:o + n])
        o += n
    return (out, hw) if sizes else out


INPUTS = read_seqs(os.path.join(DIR, "dev.h5"))
REF = read_seqs(os.path.join(DIR, "fwd.h5"))
REF_OTHER = read_seqs(os.path.join(DIR, "fwd_other.h5"))


class Server:
    def __init__(self, *args, model="model.h5"):
        self.path = os.path.join(DIR, model)
        self.err = open(os.path.join(DIR, "server.err"), "ab")
        self.p = subprocess.Popen([BIN, "serve", self.path, "--port", "0"] + list(args),
                                  stdout=subprocess.PIPE, stderr=self.err)
        line = self.p.stdout.readline().decode()
        if "listening on http://127.0.0.1:" not in line:
            self.p.kill()
            raise RuntimeError("the server did not start: %r" % line)
        self.port = int(line.rsplit(":", 1)[1])

    def conn(self, timeout=30):
        return http.client.HTTPConnection("127.0.0.1", self.port, timeout=timeout)

    def request(self, method, path, body=None, headers=None, conn=None):
        """(status, parsed JSON or None, headers); one connection per call unless given."""
        c = conn or self.conn()
        try:
            if isinstance(body, (dict, list)):
                body = json.dumps(body)
            c.request(method, path, body=body, headers=headers or {})
            r = c.getresponse()
            data = r.read()
            try:
                doc = json.loads(data)
            except ValueError:
                doc = None
            return r.status, doc, dict(r.getheaders())
        finally:
            if conn is None:
                c.close()

    def stop(self, timeout=30):
        self.p.send_signal(signal.SIGTERM)
        try:
            return self.p.wait(timeout)
        except subprocess.TimeoutExpired:
            self.p.kill()
            self.p.wait()
            return None
        finally:
            self.p.stdout.close()
            self.err.close()


def frames(i):
    return INPUTS[i].tolist()


def equal(doc, ref):
    if not isinstance(doc, dict) or "output" not in doc:
        return False
    got = np.asarray(doc["output"], dtype=np.float32)
    return got.shape == ref.shape and np.array_equal(got, ref)


def good_request(s, i=0, ref=REF):
    st, doc, _ = s.request("POST", "/v1/forward", {"data": frames(i)})
    return st == 200 and equal(doc, ref[i])


def test_answers(s):
    st, doc, _ = s.request("GET", "/healthz")
    check("GET /healthz is 200 ok", st == 200 and doc["status"] == "ok", doc)
    st, doc, _ = s.request("GET", "/v1/model")
    check("GET /v1/model: dims, layer, epoch, network",
          st == 200 and doc["input"]["dim"] == 9 and doc["output"]["dim"] == 2
          and doc["layer"] == "output" and doc["epoch"] == 1
          and doc["network"]["fw"]["class"] == "lstm", doc)
    ok = all(good_request(s, i) for i in range(len(INPUTS)))
    check("each dev sequence alone equals rl.forward's output (bit for bit)", ok)
    st, doc, _ = s.request("POST", "/v1/forward",
                           {"batch": [{"data": frames(i)} for i in range(len(INPUTS))]})
    ok = st == 200 and len(doc["batch"]) == len(INPUTS) and all(
        equal(d, REF[i]) for i, d in enumerate(doc["batch"]))
    check("one batch request of all dev sequences equals rl.forward's output", ok, st)
    # concurrent requests are batched together by the server: still the same numbers
    bad = []

    def worker(k):
        c = s.conn()
        for n in range(12):
            i = (k * 7 + n) % len(INPUTS)
            st, doc, _ = s.request("POST", "/v1/forward", {"data": frames(i)}, conn=c)
            if st != 200 or not equal(doc, REF[i]):
                bad.append((k, n, st))
        c.close()
    ts = [threading.Thread(target=worker, args=(k,)) for k in range(16)]
    [t.start() for t in ts]
    [t.join() for t in ts]
    check("16 concurrent clients x 12 requests (dynamically batched) equal rl.forward's", not bad,
          bad[:3])


def raw_exchange(port, data, timeout=5.0):
    """Sends raw bytes, returns what comes back until the server closes or the timeout."""
    sk = socket.create_connection(("127.0.0.1", port), timeout=timeout)
    try:
        sk.sendall(data)
        got = b""
        while True:
            try:
                chunk = sk.recv(65536)
            except socket.timeout:
                break
            if not chunk:
                break
            got += chunk
        return got
    finally:
        sk.close()


def test_malformed(s, max_body, max_frames):
    f0 = frames(0)
    cases = [  # name, method, path, body, status, text in the error
        ("bad JSON", "POST", "/v1/forward", '{"data": [[1, 2}', 400, "bad JSON"),
        ("empty body", "POST", "/v1/forward", "", 400, "bad JSON"),
        ("a list, not an object", "POST", "/v1/forward", "[]", 400, "JSON object"),
        ("a string", "POST", "/v1/forward", '"x"', 400, "bad JSON"),
        ("an empty object", "POST", "/v1/forward", "{}", 400, "needs \"data\""),
        ("data and batch", "POST", "/v1/forward", {"data": f0, "batch": [{"data": f0}]}, 400,
         "not both"),
        ("unknown key", "POST", "/v1/forward", {"data": f0, "foo": 1}, 400, "'foo'"),
        ("beam on forward", "POST", "/v1/forward", {"data": f0, "beam": 2}, 400, "'beam'"),
        ("duplicate key", "POST", "/v1/forward", '{"data": [[0,0,0,0,0,0,0,0,0]], "data": 1}',
         400, "duplicate"),
        ("trailing garbage", "POST", "/v1/forward", '{"data": [[0,0,0,0,0,0,0,0,0]]} xx', 400,
         "bad JSON"),
        ("data a number", "POST", "/v1/forward", {"data": 5}, 400, "list of frames"),
        ("data an object", "POST", "/v1/forward", {"data": {"a": 1}}, 400, "list of frames"),
        ("no frames", "POST", "/v1/forward", {"data": []}, 422, "no frames"),
        ("8 values a frame", "POST", "/v1/forward", {"data": [[0] * 8]}, 422,
         "data[0] has 8 values"),
        ("10 values in frame 3", "POST", "/v1/forward",
         {"data": [[0] * 9, [0] * 9, [0] * 9, [0] * 10]}, 422, "data[3] has 10 values"),
        ("a frame that is a number", "POST", "/v1/forward", {"data": [1, 2]}, 422,
         "data[0] must be a list"),
        ("a string value", "POST", "/v1/forward", {"data": [[0] * 8 + ["1"]]}, 422,
         "data[0][8] is not a number"),
        ("a null value", "POST", "/v1/forward", {"data": [[None] + [0] * 8]}, 422,
         "data[0][0] is not a number"),
        ("a nested list value", "POST", "/v1/forward", {"data": [[[1]] + [0] * 8]}, 422,
         "is not a number"),
        ("NaN", "POST", "/v1/forward", '{"data": [[NaN,0,0,0,0,0,0,0,0]]}', 400, "bad JSON"),
        ("Infinity", "POST", "/v1/forward", '{"data": [[Infinity,0,0,0,0,0,0,0,0]]}', 400,
         "bad JSON"),
        ("1e999", "POST", "/v1/forward", '{"data": [[1e999,0,0,0,0,0,0,0,0]]}', 400,
         "bad JSON"),
        ("1e39 (beyond float32)", "POST", "/v1/forward", {"data": [[0, 1e39] + [0] * 7]}, 422,
         "data[0][1] = 1e+39 is not a finite float32"),
        ("-1e39 in frame 2", "POST", "/v1/forward", {"data": [[0] * 9, [0] * 9, [-1e39] + [0] * 8]},
         422, "data[2][0]"),
        ("invalid UTF-8", "POST", "/v1/forward", b'{"data": "\xff\xfe"}', 400, "bad JSON"),
        ("nesting 30000 deep", "POST", "/v1/forward", "[" * 30000 + "]" * 30000, 400,
         "bad JSON"),
        ("batch not a list", "POST", "/v1/forward", {"batch": 3}, 400, "non-empty list"),
        ("batch empty", "POST", "/v1/forward", {"batch": []}, 400, "non-empty list"),
        ("batch entry not an object", "POST", "/v1/forward", {"batch": [{"data": f0}, 7]}, 400,
         "batch[1] must be an object"),
        ("bad frame in batch entry 2", "POST", "/v1/forward",
         {"batch": [{"data": f0}, {"data": f0}, {"data": [[0] * 3]}]}, 422,
         "batch[2].data[0] has 3 values"),
        ("unknown key in a batch entry", "POST", "/v1/forward", {"batch": [{"data": f0, "x": 1}]},
         400, "batch[0]: unknown key 'x'"),
        ("size on a sequence model", "POST", "/v1/forward", {"data": f0, "size": [1, 1]}, 400,
         "unknown key 'size'"),
        ("too many frames", "POST", "/v1/forward", {"data": [[0] * 9] * (max_frames + 1)}, 413,
         "--max-frames"),
        ("too many frames over a batch", "POST", "/v1/forward",
         {"batch": [{"data": [[0] * 9] * (max_frames // 2 + 1)}] * 2}, 413, "--max-frames"),
        ("body over --max-body", "POST", "/v1/forward", " " * (max_body + 1), 413, "--max-body"),
        ("GET /v1/forward", "GET", "/v1/forward", None, 405, "takes POST"),
        ("PUT /v1/forward", "PUT", "/v1/forward", {"data": f0}, 405, "takes POST"),
        ("POST /healthz", "POST", "/healthz", "{}", 405, "takes GET"),
        ("DELETE /v1/model", "DELETE", "/v1/model", None, 405, "takes GET"),
        ("GET /v1/reload", "GET", "/v1/reload", None, 405, "takes POST"),
        ("unknown path", "GET", "/v2/forward", None, 404, "no such path"),
        ("path with a suffix", "POST", "/v1/forward/x", {"data": f0}, 404, "no such path"),
        ("the root", "GET", "/", None, 404, "no such path"),
        ("a %00 in the path (cut the path to /healthz)", "GET", "/healthz%00x", None, 404,
         "no such path '/healthz%00x'"),
        ("a %00 in the path of a POST", "POST", "/v1/forward%00", {"data": f0}, 404,
         "no such path"),
    ]
    n = 0
    for name, method, path, body, status, text in cases:
        st, doc, hdr = s.request(method, path, body)
        err = doc.get("error", "") if isinstance(doc, dict) else ""
        ok = st == status and text in err
        if status == 405:
            ok = ok and hdr.get("Allow") in ("GET, HEAD", "POST")
        check("malformed: %s -> %d naming it" % (name, status), ok, (st, err or doc))
        n += 1
        check("  ... and the next good request is answered", good_request(s, n % len(INPUTS)))

    for path in ("/healthz", "/v1/model"):
        st, doc, hdr = s.request("HEAD", path)
        check("HEAD %s: 200 without a body (it was 405)" % path, st == 200 and doc is None
              and int(hdr.get("Content-Length", 0)) > 0, (st, doc))
    n += 2
    # a chunked body (no Content-Length) beyond --max-body is read, dropped and refused
    c = s.conn()
    chunks = iter([b" " * 8192] * (max_body // 8192 + 2))
    c.request("POST", "/v1/forward", body=chunks, encode_chunked=True)
    r = c.getresponse()
    doc = json.loads(r.read())
    c.close()
    check("malformed: a chunked body over --max-body -> 413", r.status == 413
          and "--max-body" in doc["error"], (r.status, doc))
    n += 1
    # slow clients: a body that stops half-way, and a connection that never sends anything,
    # are closed after --timeout (1 s here) while other clients are served
    t0 = time.time()
    req = ("POST /v1/forward HTTP/1.1\r\nHost: x\r\nContent-Length: 100\r\n\r\n"
           '{"data": [[0,').encode()
    got = raw_exchange(s.port, req, timeout=8)
    waited = time.time() - t0
    check("malformed: a stalled body is closed after the timeout without an answer",
          got == b"" and waited < 6, (got[:80], waited))
    t0 = time.time()
    got = raw_exchange(s.port, b"", timeout=8)
    check("malformed: an idle connection is closed after the timeout",
          got == b"" and time.time() - t0 < 6, got[:80])
    # headers sent a byte at a time (each byte within the idle timeout) held a connection for
    # as long as the client liked; also the second request on a kept-alive connection
    for keep in (False, True):
        sk = socket.create_connection(("127.0.0.1", s.port), timeout=8)
        if keep:
            body = json.dumps({"data": frames(0)}).encode()
            sk.sendall(b"POST /v1/forward HTTP/1.1\r\nHost: x\r\nContent-Length: %d\r\n\r\n"
                       % len(body) + body)
            first = sk.recv(65536)
        t0, closed = time.time(), False
        try:
            for ch in b"POST /v1/forward HTTP/1.1\r\nHost: x\r\nX-Slow: " + b"a" * 60:
                sk.sendall(bytes([ch]))
                time.sleep(0.1)
        except OSError:
            closed = True
        waited = time.time() - t0
        sk.close()
        check("malformed: headers trickled a byte per 0.1 s%s are closed after the timeout (%.1f s)"
              % (" (a kept-alive connection's second request)" if keep else "", waited),
              closed and waited < 4 and (not keep or first.startswith(b"HTTP/1.1 200")), waited)
    n += 4
    # a client that disconnects in the middle of its body
    sk = socket.create_connection(("127.0.0.1", s.port))
    sk.sendall(b"POST /v1/forward HTTP/1.1\r\nHost: x\r\nContent-Length: 1000\r\n\r\n{\"da")
    sk.close()
    # garbage instead of HTTP: libmicrohttpd closes such connections without an answer
    for junk in (b"\x00\x01\x02 not http\r\n\r\n", b"GARBAGE\r\n\r\n"):
        got = raw_exchange(s.port, junk, timeout=5)
        check("malformed: %r is closed without an answer" % junk[:8], got == b"", got[:60])
    n += 2
    # what libmicrohttpd answered itself, in HTML (and for a huge Content-Length with its
    # headers twice): answered in JSON before it reads the request
    def json_answer(got):
        head, _, body = got.partition(b"\r\n\r\n")
        try:
            return head, json.loads(body)
        except ValueError:
            return head, None
    for name, raw, status, text in (
            ("HTTP/9.9", b"GET /healthz HTTP/9.9\r\nHost: x\r\n\r\n", 505, "HTTP/9.9"),
            ("a 9000-byte path", b"GET /" + b"a" * 9000 + b" HTTP/1.1\r\nHost: x\r\n\r\n", 414,
             "request line is longer than 8192 bytes"),
            ("a 9000-byte request line still arriving", b"GET /" + b"a" * 9000, 414,
             "request line is longer"),
            ("40 kB of headers", b"GET /healthz HTTP/1.1\r\nHost: x\r\n"
             + b"".join(b"X-H%d: %s\r\n" % (i, b"v" * 1000) for i in range(40)) + b"\r\n", 431,
             "headers are larger than 32768 bytes"),
            ("Content-Length: abc", b"POST /v1/forward HTTP/1.1\r\nHost: x\r\n"
             b"Content-Length: abc\r\n\r\n", 400, "bad Content-Length 'abc'"),
            ("a huge Content-Length", b"POST /v1/forward HTTP/1.1\r\nHost: x\r\n"
             b"Content-Length: 99999999999999999999999\r\n\r\n", 400, "bad Content-Length"),
            ("Content-Length: -5", b"POST /v1/forward HTTP/1.1\r\nHost: x\r\n"
             b"Content-Length: -5\r\n\r\n", 400, "bad Content-Length '-5'"),
            ("a header line without a colon", b"GET /v1/model HTTP/1.1\r\nHost: x\r\nBadHeader"
             b"\r\n\r\n", 400, "a header line without a colon: 'BadHeader'"),
            ("two different Content-Lengths", b"POST /v1/forward HTTP/1.1\r\nHost: x\r\n"
             b"Content-Length: 5\r\ncontent-length: 6\r\n\r\n{}   ", 400, "the same each time")):
        got = raw_exchange(s.port, raw, timeout=5)
        head, doc = json_answer(got)
        check("malformed: %s -> %d in JSON, one answer" % (name, status),
              head.startswith(b"HTTP/1.1 %d" % status) and doc is not None
              and text in doc.get("error", "") and got.count(b"\r\n\r\n") == 1, got[:200])
        n += 1
    # the same sizes on the second request of a kept-alive connection
    c = s.conn()
    # (a forward request first: the gate answers a /healthz itself and keeps the connection)
    st, doc, _ = s.request("POST", "/v1/forward", {"data": frames(0)}, conn=c)
    st = st if equal(doc, REF[0]) else 0
    st2, doc2, _ = s.request("GET", "/" + "a" * 9000, conn=c)
    c.close()
    check("malformed: a 9000-byte path as a kept-alive connection's second request -> 414 JSON",
          st == 200 and st2 == 414 and "longer than 8192" in doc2["error"], (st, st2, doc2))
    n += 1
    check("  ... and the next good request is answered", good_request(s, 1))
    # a bad Content-Length on a kept-alive connection's second request: libmicrohttpd parses it
    # before any callback and answered it in HTML
    good = json.dumps({"data": frames(0)}).encode()
    for bad in (b"abc", b"99999999999999999999999", b"-5", b"5\r\ncontent-length: 6"):
        got = raw_exchange(s.port, b"POST /v1/forward HTTP/1.1\r\nHost: x\r\nContent-Length: %d"
                           b"\r\n\r\n" % len(good) + good + b"POST /v1/forward HTTP/1.1\r\nHost: x"
                           b"\r\nContent-Length: " + bad + b"\r\n\r\n{\"data\": [[1]]}", timeout=5)
        parts = got.split(b"HTTP/1.1 ")
        second = json_answer(b"HTTP/1.1 " + parts[2]) if len(parts) == 3 else (b"", None)
        check("malformed: Content-Length: %s on a kept-alive connection's second request -> "
              "400 in JSON, one answer" % bad.split(b"\r")[0].decode(),
              parts[1].startswith(b"200 OK") and second[0].startswith(b"HTTP/1.1 400")
              and second[1] is not None and "bad Content-Length" in second[1]["error"]
              and got.count(b"\r\n\r\n") == 2, got[-300:])
        n += 1
    # what libmicrohttpd answers itself on a later request of a kept-alive connection (the gate
    # sees only the first), and a malformed chunked body on any request: JSON, one answer, the
    # connection closed after it (lua/serve.c, rl_serve_own_answer)
    first = (b"POST /v1/forward HTTP/1.1\r\nHost: x\r\nContent-Length: %d\r\n\r\n" % len(good)
             + good)
    chunked = b"POST /v1/forward HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n"
    for name, later, status, text in (
            ("a header line without a colon", b"GET /v1/model HTTP/1.1\r\nHost: x\r\nBadHeader"
             b"\r\n\r\n", 400, "without a colon"),
            ("HTTP/9.9", b"GET /v1/model HTTP/9.9\r\nHost: x\r\n\r\n", 505,
             "HTTP version not supported"),
            ("a chunk size that is not hexadecimal", chunked + b"zz\r\n{}\r\n0\r\n\r\n", 400,
             "malformed chunked request body"),
            ("no line end after a chunk's data", chunked + b"2\r\n{}XY\r\n0\r\n\r\n", 400,
             "malformed chunked request body"),
            ("a chunk size over 64 bits", chunked + b"fffffffffffffffffffff\r\n", 413,
             "chunk size of the chunked request body is too large"),
            ("a trailer line without a colon", chunked + b"2\r\n{}\r\n0\r\nBadTrailer\r\n\r\n",
             400, "without a colon")):
        for where, raw, answers in (("a kept-alive connection's second request", first + later, 2),
                                    ("a first request", later, 1)):
            if answers == 1 and not later.startswith(b"POST"):
                continue  # the gate's own answers to these are checked above
            got = raw_exchange(s.port, raw, timeout=5)
            parts = got.split(b"HTTP/1.1 ")
            last = json_answer(b"HTTP/1.1 " + parts[-1]) if len(parts) == answers + 1 else (b"", None)
            check("malformed: %s on %s -> %d in JSON, one answer, closed" % (name, where, status),
                  (answers == 1 or parts[1].startswith(b"200 OK"))
                  and last[0].startswith(b"HTTP/1.1 %d" % status) and b"Connection: close" in last[0]
                  and last[1] is not None and text in last[1]["error"]
                  and got.count(b"\r\n\r\n") == answers and b"<html>" not in got, got[-300:])
            n += 1
    check("  ... and the next good request is answered", good_request(s, 1))
    check("at least 30 malformed requests tried (%d)" % n, n >= 30)


def read_labels(path):
    with h5py.File(path, "r") as f:
        x = np.asarray(f["inputs"]).tolist()
        lens = np.asarray(f["seqLengths"])[:, 0]
    out, o = [], 0
    for n in lens:
        out.append(x[o:o + n])
        o += n
    return out


def test_decode(s):
    st, doc, _ = s.request("POST", "/v1/decode", {"data": frames(0)})
    check("decode on a model without CTC -> 422 naming why",
          st == 422 and "loss = \"ctc\"" in doc["error"], (st, doc))


def test_ctc_lm():
    lm = os.path.join(DIR, "lm.arpa")
    s = Server("--lm", lm, model="ctc.h5")
    try:
        st, doc, _ = s.request("GET", "/v1/model")
        check("--lm: /v1/model names the LM", st == 200 and doc["decode"]["lm"]["file"] == lm, doc)
        ref, plain = read_labels(os.path.join(DIR, "declm.h5")), read_labels(os.path.join(DIR, "dec4.h5"))
        check("the LM changes some labels (else the check below proves nothing)", ref != plain)
        st, doc, _ = s.request("POST", "/v1/decode", {
            "batch": [{"data": frames(i)} for i in range(len(INPUTS))], "beam": 4,
            "lm": {"weight": 2, "bonus": 0.5}})
        check("decode with lm: equals rl.forward{decode = 'ctc', lm = ...}'s labels",
              st == 200 and [d["labels"] for d in doc["batch"]] == ref, st)
        st, doc, _ = s.request("POST", "/v1/decode", {
            "batch": [{"data": frames(i)} for i in range(len(INPUTS))], "beam": 4})
        check("decode without lm on an --lm server: no fusion",
              st == 200 and [d["labels"] for d in doc["batch"]] == plain, st)
        for lmv, code, word in (({"weight": "2"}, 422, "weight"), ({"bonus": 1}, 422, "weight"),
                                ({"weight": 1, "wieght": 2}, 400, "wieght"), ([1], 400, "object"),
                                ({"weight": 1, "file": "/etc/passwd"}, 422, "file")):
            st, doc, _ = s.request("POST", "/v1/decode", {"data": frames(0), "lm": lmv})
            check("decode: lm %r -> %d naming %s" % (lmv, code, word),
                  st == code and word in doc["error"], (st, doc))
        st, doc, _ = s.request("POST", "/v1/forward", {"data": frames(0), "lm": {"weight": 1}})
        check("forward: lm -> 400 (decode only)", st == 400 and "'lm'" in doc["error"], (st, doc))
    finally:
        rc = s.stop()
    check("--lm server stops with exit 0", rc == 0, rc)
    bad = os.path.join(DIR, "bad_lm.arpa")
    for args, word in ((["--lm", bad], bad + ":6: the log10 probability 'x'"),
                       (["--lm", lm, "--lm-word-boundary", "9"], "word_boundary '9'")):
        try:
            Server(*args, model="ctc.h5").stop()
            check("a bad --lm (%s) stops the start-up" % word, False)
        except RuntimeError:
            with open(os.path.join(DIR, "server.err"), "rb") as f:
                err = f.read().decode(errors="replace")
            check("a bad --lm: the start-up fails naming %s" % word, word in err, err[-300:])


def test_ctc():
    s = Server(model="ctc.h5")
    try:
        st, doc, _ = s.request("GET", "/v1/model")
        check("CTC model: /v1/model names the blank", st == 200 and doc["decode"]["blank"] == 4,
              doc)
        for beam in (1, 4):
            ref = read_labels(os.path.join(DIR, "dec%d.h5" % beam))
            ok = True
            for i in range(len(INPUTS)):
                body = {"data": frames(i)}
                if beam > 1:
                    body["beam"] = beam
                st, doc, _ = s.request("POST", "/v1/decode", body)
                ok = ok and st == 200 and doc["labels"] == ref[i]
            check("decode beam %d: each sequence equals rl.forward{decode = 'ctc'}'s labels" % beam,
                  ok and sum(len(r) for r in ref) > 0)
            st, doc, _ = s.request("POST", "/v1/decode", {
                "batch": [{"data": frames(i)} for i in range(len(INPUTS))], "beam": beam})
            check("decode beam %d: one batch request equals rl.forward's labels" % beam,
                  st == 200 and [d["labels"] for d in doc["batch"]] == ref, st)
        bad = []

        def worker(k):
            ref1 = read_labels(os.path.join(DIR, "dec1.h5"))
            for n in range(8):
                i = (k * 3 + n) % len(INPUTS)
                st, doc, _ = s.request("POST", "/v1/decode", {"data": frames(i)})
                if st != 200 or doc["labels"] != ref1[i]:
                    bad.append((k, n, st))
        ts = [threading.Thread(target=worker, args=(k,)) for k in range(8)]
        [t.start() for t in ts]
        [t.join() for t in ts]
        check("decode: 8 concurrent clients (batched) equal rl.forward's labels", not bad, bad[:3])
        for beam in (0, 65, 1.5, "2"):
            st, doc, _ = s.request("POST", "/v1/decode", {"data": frames(0), "beam": beam})
            check("decode: beam %r -> 422" % (beam,), st == 422 and "beam" in doc["error"], doc)
        # a request padded beyond --max-frames runs in pieces: the same labels
        s2 = Server("--max-frames", "200", model="ctc.h5")
        try:
            ref1, pick, total = read_labels(os.path.join(DIR, "dec1.h5")), [], 0
            for i in range(len(INPUTS)):
                if total + len(INPUTS[i]) <= 200:
                    pick.append(i)
                    total += len(INPUTS[i])
            padded = len(pick) * max(len(INPUTS[i]) for i in pick)
            st, doc, _ = s2.request("POST", "/v1/decode",
                                    {"batch": [{"data": frames(i)} for i in pick]})
            check("decode: %d sequences of %d frames padded to %d (> --max-frames 200) equal "
                  "rl.forward's labels" % (len(pick), total, padded), padded > 200 and st == 200
                  and [d["labels"] for d in doc["batch"]] == [ref1[i] for i in pick], st)
        finally:
            s2.stop()
        st, doc, _ = s.request("POST", "/v1/decode", {"data": frames(0), "lm": {"weight": 1}})
        check("decode: lm on a server without --lm -> 422", st == 422 and "--lm" in doc["error"],
              doc)
        st, doc, _ = s.request("POST", "/v1/forward", {"data": frames(0)})
        check("CTC model: /v1/forward gives the softmax's 5 outputs",
              st == 200 and len(doc["output"][0]) == 5, st)
    finally:
        rc = s.stop()
    check("CTC server stops with exit 0", rc == 0, rc)


def wait_connections(s, cond, timeout=10):
    """Polls /healthz until its count of open connections satisfies cond; returns the last count
    seen (the caller checks it)."""
    t0 = time.time()
    while True:
        # (a poll that is itself one connection too many, while closed ones still count on the
        # server, is answered 503 without the count)
        doc = s.request("GET", "/healthz")[1]
        n = doc.get("connections") if doc else None
        if (n is not None and cond(n)) or time.time() - t0 >= timeout:
            return n
        time.sleep(0.02)


def test_open_limit():
    """Connections beyond --max-connections + 16 a thread are answered 503 (JSON) as soon as
    they open, instead of waiting in the kernel's accept queue."""
    # (--max-connections 2: the /healthz connections of the polling below close on the server
    # a moment after the client closes them, and one of them may still count)
    s = Server("--max-connections", "2", "--threads", "1", "--timeout", "4")
    try:
        idle = [socket.create_connection(("127.0.0.1", s.port)) for _ in range(18)]
        t0 = time.time()  # until they are in: /healthz counts them, or is itself one too many
        while time.time() - t0 < 10:
            st, doc, _ = s.request("GET", "/healthz")
            if st == 503 or doc["connections"] >= 18:
                break
            time.sleep(0.02)
        t0 = time.time()
        got = raw_exchange(s.port, b"", timeout=3)
        took = time.time() - t0
        body = got.split(b"\r\n\r\n", 1)[1] if b"\r\n\r\n" in got else b""
        try:
            doc = json.loads(body)
        except ValueError:
            doc = None
        check("a connection over the open limit is answered 503 JSON at once (%.2f s)" % took,
              got.startswith(b"HTTP/1.1 503") and doc is not None
              and "--max-connections 2" in doc["error"] and took < 2, got[:300])
        for sk in idle:
            sk.close()
        wait_connections(s, lambda n: n <= 1)
        check("  ... and once the others close, requests are answered", good_request(s, 1))
    finally:
        rc = s.stop()
    check("open-limit server stops with exit 0", rc == 0, rc)


def test_limits():
    s = Server("--max-connections", "4", "--timeout", "5")
    try:
        st, doc, _ = s.request("POST", "/v1/reload")
        check("without --admin-token POST /v1/reload is off -> 403 JSON",
              st == 403 and "--admin-token" in doc["error"], (st, doc))
        idle = [socket.create_connection(("127.0.0.1", s.port)) for _ in range(5)]
        wait_connections(s, lambda n: n >= 6)  # the 5 idle ones and the /healthz asking
        st, doc, _ = s.request("POST", "/v1/forward", {"data": frames(0)})
        check("over --max-connections -> 503 naming the limit",
              st == 503 and "--max-connections" in doc["error"], (st, doc))
        for sk in idle:
            sk.close()
        wait_connections(s, lambda n: n <= 1)
        check("  ... and after they close, requests are answered", good_request(s, 2))
    finally:
        rc = s.stop()
    check("server with limits stops with exit 0", rc == 0, rc)


def load_test(s, clients, seconds):
    lat, bad, lock = [], [], threading.Lock()
    stop = time.time() + seconds

    def worker(k):
        c = s.conn()
        i, mine = k, []
        while time.time() < stop:
            i = (i + 5) % len(INPUTS)
            body = json.dumps({"data": frames(i)})
            t0 = time.perf_counter()
            try:
                c.request("POST", "/v1/forward", body=body)
                r = c.getresponse()
                data = r.read()
                ok = r.status == 200 and equal(json.loads(data), REF[i])
            except (OSError, http.client.HTTPException, ValueError) as e:
                ok = False
                c.close()
                c = s.conn()
                data = str(e)
            mine.append(time.perf_counter() - t0)
            if not ok:
                with lock:
                    bad.append(data[:100])
        c.close()
        with lock:
            lat.extend(mine)
    ts = [threading.Thread(target=worker, args=(k,)) for k in range(clients)]
    t0 = time.time()
    [t.start() for t in ts]
    [t.join() for t in ts]
    wall = time.time() - t0
    lat.sort()
    n = len(lat)
    p50 = lat[n // 2] * 1e3 if n else 0
    p99 = lat[min(n - 1, int(n * 0.99))] * 1e3 if n else 0
    print("load: %d clients, %.1f s: %d requests, %.0f requests/s, p50 %.2f ms, p99 %.2f ms, "
          "%d failed" % (clients, wall, n, n / wall, p50, p99, len(bad)))
    check("load test: %d clients x %.0f s, every answer right, none lost" % (clients, seconds),
          n > 0 and not bad, bad[:3])


def stop_threads(pid, name):
    """Stops the threads of process pid whose name starts with `name` (ptrace: the rest of the process
    runs on); returns a function that lets them go on, or None where ptrace is not allowed."""
    libc = ctypes.CDLL(None, use_errno=True)
    libc.ptrace.argtypes = [ctypes.c_long, ctypes.c_long, ctypes.c_void_p, ctypes.c_void_p]
    seize, interrupt, detach = 0x4206, 0x4207, 17
    def named():
        found = []
        for t in os.listdir("/proc/%d/task" % pid):
            try:
                with open("/proc/%d/task/%s/comm" % (pid, t)) as f:
                    if f.read().strip().startswith(name):
                        found.append(int(t))
            except OSError:
                pass
        return sorted(found)
    # a thread names itself after it starts: wait until the set stays the same for 0.2 s
    tids, deadline = named(), time.time() + 5
    while time.time() < deadline:
        time.sleep(0.2)
        again = named()
        if again == tids and tids:
            break
        tids = again
    stopped = []
    for t in tids:
        if libc.ptrace(seize, t, None, None) != 0:
            break
        libc.ptrace(interrupt, t, None, None)
        os.waitpid(t, 0x40000000)  # __WALL: the event stop of a thread
        stopped.append(t)
    def go_on():
        for t in stopped:
            libc.ptrace(detach, t, None, None)
    if len(stopped) < len(tids) or not tids:
        go_on()
        return None
    return go_on


def test_health_alone():
    # /healthz is answered by the thread that takes the connections, not by libmicrohttpd's
    # threads, which parse the requests and write the answers: with those stopped, a monitor
    # still gets its answer (on a new connection, and again on the same one) while a request for
    # /v1/model waits
    s = Server("--threads", "2")
    try:
        # libmicrohttpd's threads are up once they have answered (the server's readiness comes
        # from /healthz, which the gate answers alone)
        s.request("GET", "/v1/model")
        go_on = stop_threads(s.p.pid, "MHD")
        if go_on is None:
            print("SKIP /healthz with libmicrohttpd's threads stopped: ptrace is not allowed here")
            return
        try:
            c = s.conn(timeout=3)
            got = []
            for _ in range(3):
                t0 = time.perf_counter()
                try:
                    st, doc, hd = s.request("GET", "/healthz", conn=c)
                    got.append((st, doc and doc.get("status"), time.perf_counter() - t0))
                except (OSError, http.client.HTTPException) as e:
                    got.append((repr(e), None, time.perf_counter() - t0))
                    c.close()
                    c = s.conn(timeout=3)
            head = s.conn(timeout=3)
            try:
                head.request("HEAD", "/healthz")
                r = head.getresponse()
                hb = (r.status, r.getheader("Content-Length"), r.read())
            except OSError as e:
                hb = (repr(e), None, None)
            head.close()
            try:
                s.request("GET", "/v1/model", conn=s.conn(timeout=1))
                model = "answered"
            except OSError:
                model = "waits"
        finally:
            go_on()
        check("/healthz with libmicrohttpd's threads stopped: answered at once, three times on "
              "one connection", all(g[:2] == (200, "ok") and g[2] < 2 for g in got), got)
        check("  ... HEAD /healthz too (no body)", hb[0] == 200 and int(hb[1] or 0) > 0
              and hb[2] == b"", hb)
        check("  ... while GET /v1/model waits for those threads", model == "waits", model)
        st, doc, _ = s.request("GET", "/v1/model")
        check("  ... and is answered once they run again", st == 200 and "input" in doc, st)
        c.close()
    finally:
        s.stop()


ADMIN = "s3cret-admin-token"
AUTH = {"Authorization": "Bearer " + ADMIN}


def test_reload(s):
    path = s.path
    for name, headers in (("no Authorization header", None),
                          ("a wrong token", {"Authorization": "Bearer s3cret-admin-tokeN"}),
                          ("a prefix of the token", {"Authorization": "Bearer s3cret"}),
                          ("the token longer", {"Authorization": "Bearer " + ADMIN + "x"}),
                          ("another scheme", {"Authorization": "Basic " + ADMIN})):
        st, doc, hdr = s.request("POST", "/v1/reload", headers=headers)
        check("reload with %s -> 401 JSON with WWW-Authenticate: Bearer" % name,
              st == 401 and "--admin-token" in doc["error"]
              and hdr.get("WWW-Authenticate") == "Bearer", (st, doc, hdr))
    keep = os.path.join(DIR, "model.keep.h5")
    shutil.copy(path, keep)
    shutil.copy(os.path.join(DIR, "other.h5"), path + ".tmp")
    os.replace(path + ".tmp", path)
    st, doc, _ = s.request("POST", "/v1/reload", headers=AUTH)
    check("POST /v1/reload loads the new checkpoint (epoch 7)",
          st == 200 and doc["epoch"] == 7 and doc["previous_epoch"] == 1, (st, doc))
    check("  ... answers are the new model's", good_request(s, 3, REF_OTHER))
    st, doc, _ = s.request("GET", "/v1/model")
    check("  ... and /v1/model says epoch 7", doc["epoch"] == 7, doc)
    with open(path, "wb") as f:
        f.write(b"not a checkpoint")
    st, doc, _ = s.request("POST", "/v1/reload", headers=AUTH)
    check("reload of a broken file -> 409 naming the file, old model kept",
          st == 409 and path in doc["error"], (st, doc))
    check("  ... answers are still epoch 7's", good_request(s, 4, REF_OTHER))
    shutil.copy(os.path.join(DIR, "dim5.h5"), path)
    st, doc, _ = s.request("POST", "/v1/reload", headers=AUTH)
    check("reload of a model with another input dim -> 409", st == 409
          and "input dim 5" in doc["error"], (st, doc))
    shutil.copy(os.path.join(DIR, "sparse9.h5"), path)
    st, doc, _ = s.request("POST", "/v1/reload", headers=AUTH)
    check("reload of a model of the same dims taking class indices -> 409 saying so", st == 409
          and "(input dim 9 (class indices), output dim 2 (sequences)) differs from the served "
          "one (input dim 9 (frames), output dim 2 (sequences))" in doc["error"], (st, doc))
    shutil.copy(keep, path)
    s.p.send_signal(signal.SIGHUP)
    epoch, t0 = None, time.time()
    while time.time() - t0 < 10 and epoch != 1:
        time.sleep(0.05)
        epoch = s.request("GET", "/v1/model")[1]["epoch"]
    check("SIGHUP reloads (epoch 1 again)", epoch == 1, epoch)
    check("  ... answers are the first model's again", good_request(s, 5))


def test_drain():
    # each request runs alone (--max-batch-frames 0) through a layer that takes 50 ms, so the
    # requests queue up; SIGTERM comes once three are in the server (one running, two queued).
    # (With the 12AX model a request took ~10 ms: on a loaded machine the clients' uploads were
    # slower than the answers and no request was queued when SIGTERM came.)
    s = Server("--max-batch-frames", "0", "--lua", os.path.join(DIR, "slow_layer.lua"),
               model="slow_model.h5")
    body = {"batch": [{"data": frames(i)} for i in range(4)]}
    per_request = sum(len(INPUTS[i]) for i in range(4))
    results, lock = [], threading.Lock()

    def one():
        try:
            st, doc, _ = s.request("POST", "/v1/forward", body)
            ok = st == 200 and [len(d["output"]) for d in doc["batch"]] == \
                [len(INPUTS[i]) for i in range(4)]
            outcome = "ok" if ok else ("503" if st == 503 and "shutting down" in doc["error"]
                                       else "wrong %s" % st)
        except ConnectionRefusedError:
            outcome = "refused"  # connected after the listening socket was closed
        except (OSError, http.client.HTTPException, ValueError) as e:
            outcome = "lost: %r" % e
        with lock:
            results.append((outcome, time.time()))

    ts = [threading.Thread(target=one) for _ in range(12)]
    [t.start() for t in ts]
    t0, queued = time.time(), 0
    while time.time() - t0 < 30 and queued < 3 * per_request and len(results) < 12:
        queued = s.request("GET", "/healthz")[1]["queued_frames"]
    t_term = time.time()
    rc = s.stop()
    [t.join() for t in ts]
    outcomes = [o for o, _ in results]
    check("SIGTERM with requests in flight: exit 0", rc == 0, rc)
    check("  ... every request answered right, refused at connect or told 503, none lost",
          len(results) == 12 and all(o in ("ok", "503", "refused") for o in outcomes), outcomes)
    check("  ... requests queued at SIGTERM (%d frames, %d requests' worth) were still answered"
          % (queued, queued // per_request), queued >= 3 * per_request
          and any(o == "ok" and t > t_term for o, t in results), results)
    try:
        socket.create_connection(("127.0.0.1", s.port), timeout=2).close()
        refused = False
    except OSError:
        refused = True
    check("  ... and the port is closed afterwards", refused)


def test_images():
    imgs, sizes = read_seqs(os.path.join(DIR, "img.h5"), sizes=True)
    for layer in ("conv", "side"):
        ref, ref_sizes = read_seqs(os.path.join(DIR, "fwd_%s.h5" % layer), sizes=True) \
            if layer == "conv" else (read_seqs(os.path.join(DIR, "fwd_side.h5")), None)
        s = Server("--layer", layer, model="img.001.h5")
        try:
            st, doc, _ = s.request("GET", "/v1/model")
            check("image model, layer %s: /v1/model says images in" % layer,
                  st == 200 and doc["input"]["kind"] == "images", doc)
            ok = True
            for i in range(len(imgs)):
                st, doc, _ = s.request("POST", "/v1/forward",
                                       {"data": imgs[i].tolist(), "size": sizes[i]})
                ok = ok and st == 200 and equal(doc, ref[i])
                if layer == "conv":
                    ok = ok and doc.get("size") == ref_sizes[i]
            check("image model, layer %s: each image alone equals rl.forward's" % layer, ok)
            st, doc, _ = s.request("POST", "/v1/forward", {"batch": [
                {"data": imgs[i].tolist(), "size": sizes[i]} for i in range(len(imgs))]})
            check("image model, layer %s: all images in one batch equal rl.forward's" % layer,
                  st == 200 and all(equal(d, ref[i]) for i, d in enumerate(doc["batch"])), st)
            h, w = sizes[0]
            st, doc, _ = s.request("POST", "/v1/forward", {"data": imgs[0].tolist()})
            check("image model: data without size -> 422", st == 422
                  and "needs \"size\"" in doc["error"], doc)
            st, doc, _ = s.request("POST", "/v1/forward",
                                   {"data": imgs[0].tolist(), "size": [h + 1, w]})
            check("image model: a size that does not fit the frames -> 422", st == 422
                  and "does not match" in doc["error"], doc)
            st, doc, _ = s.request("POST", "/v1/forward", {"data": imgs[0].tolist(), "size": [h]})
            check("image model: size not [h, w] -> 422", st == 422, doc)
        finally:
            rc = s.stop()
        check("image server (layer %s) stops with exit 0" % layer, rc == 0, rc)


def test_sparse():
    with h5py.File(os.path.join(DIR, "sparse.h5"), "r") as f:
        ids = np.asarray(f["inputs"]).reshape(-1).tolist()
        lens = np.asarray(f["seqLengths"])[:, 0]
    seqs, o = [], 0
    for n in lens:
        seqs.append(ids[o:o + n])
        o += n
    ref = read_seqs(os.path.join(DIR, "fwd_sparse.h5"))
    s = Server(model="sparse_model.h5")
    try:
        ok = True
        for i, q in enumerate(seqs):
            st, doc, _ = s.request("POST", "/v1/forward", {"data": q})
            ok = ok and st == 200 and equal(doc, ref[i])
        check("sparse input: each sequence of class indices equals rl.forward's", ok)
        st, doc, _ = s.request("POST", "/v1/forward", {"batch": [{"data": q} for q in seqs]})
        check("sparse input: one batch request equals rl.forward's", st == 200
              and all(equal(d, ref[i]) for i, d in enumerate(doc["batch"])), st)
        for body, text in (({"data": [1, 9]}, "data[1] = 9 is not a class index in 0..8"),
                           ({"data": [1, -1]}, "data[1] = -1 is not a class index"),
                           ({"data": [1, 2.5]}, "data[1] must be a class index"),
                           ({"data": [[1, 0]]}, "data[0] must be a class index")):
            st, doc, _ = s.request("POST", "/v1/forward", body)
            check("sparse input: %s -> 422" % json.dumps(body), st == 422 and text in doc["error"],
                  doc)
    finally:
        rc = s.stop()
    check("sparse-input server stops with exit 0", rc == 0, rc)


def vm_peak_mb(pid):
    with open("/proc/%d/status" % pid) as f:
        for line in f:
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) / 1024.0
    return 0.0


def test_padding():
    # 1999 one-frame sequences and one of 2000 frames are 4000 frames, but padded to the longest
    # they were one batch of 2000 x 2000 frames (3.9 GB of activations for this small BLSTM)
    s = Server("--max-frames", "4000")
    try:
        short, long_ = frames(0)[:1], (frames(1) * 100)[:2000]
        _, one, _ = s.request("POST", "/v1/forward", {"data": short})
        _, alone, _ = s.request("POST", "/v1/forward", {"data": long_})
        base = vm_peak_mb(s.p.pid)
        st, doc, _ = s.request("POST", "/v1/forward",
                               {"batch": [{"data": short}] * 1999 + [{"data": long_}]})
        peak = vm_peak_mb(s.p.pid)
        check("1999 one-frame sequences and one of 2000 in one request: each answer is the "
              "sequence's alone", st == 200 and len(doc["batch"]) == 2000
              and all(d == one for d in doc["batch"][:1999]) and doc["batch"][1999] == alone, st)
        check("  ... and they are not padded to 2000 x 2000 frames (peak RSS %.0f MB, %.0f before)"
              % (peak, base), peak - base < 500)
    finally:
        rc = s.stop()
    check("padding server stops with exit 0", rc == 0, rc)


def good_request_wide(s, x):
    st, doc, _ = s.request("POST", "/v1/forward", {"data": x[:20]})
    return st == 200 and len(doc["output"]) == 20


def test_wide():
    # 5000 frames of a 1000-way softmax: 5 million numbers, once built as a jansson tree of
    # about 50 bytes a number (20000 frames, within the default limits, took 1.5 GB)
    s = Server("--max-frames", "5000", "--max-queue-frames", "10000", model="wide.h5")
    try:
        # against the server's own peak so far: a CUDA build maps its libraries (~150 MB more)
        base = vm_peak_mb(s.p.pid)
        x = [[((7 * t + d) % 11) / 5.0 - 1 for d in range(9)] for t in range(5000)]
        c = s.conn(timeout=120)
        c.request("POST", "/v1/forward", body=json.dumps({"batch": [{"data": x[:1000]},
                                                                      {"data": x[1000:]}]}))
        r = c.getresponse()
        text = r.read()
        c.close()
        peak = vm_peak_mb(s.p.pid)
        doc = json.loads(text)
        parts = [s.request("POST", "/v1/forward", {"data": x[a:a + 500]})
                 for a in range(0, 5000, 500)]
        rows = [row for _, d, _ in parts for row in d["output"]]
        check("5 million numbers in an answer (streamed, chunked) equal the answers of its "
              "500-frame pieces", r.status == 200 and r.getheader("Transfer-Encoding") == "chunked"
              and doc["batch"][0]["output"] + doc["batch"][1]["output"] == rows, r.status)
        check("  ... the pieces' answers (buffered) have a Content-Length",
              all(int(h.get("Content-Length", 0)) > 0 for _, _, h in parts))
        check("  ... and the answer is not built in memory (peak RSS %.0f MB, %.0f before, %d "
              "bytes)" % (peak, base, len(text)), peak - base < 120)
        # clients that do not read their answers: their frames stay counted, so the server
        # does not hold an answer for every connection (80 MB each at 20000 frames)
        body = json.dumps({"data": x}).encode()
        idle = []
        for _ in range(2):
            sk = socket.create_connection(("127.0.0.1", s.port), timeout=30)
            sk.sendall(b"POST /v1/forward HTTP/1.1\r\nHost: x\r\nContent-Length: %d\r\n\r\n"
                       % len(body) + body)
            idle.append(sk)
        started = [sk.recv(12) for sk in idle]  # the answers are being written: the model is done
        queued = s.request("GET", "/healthz")[1]["queued_frames"]
        st, doc, _ = s.request("POST", "/v1/forward", {"data": x[:10]})
        check("two 5000-frame answers not read: a request -> 503 (--max-queue-frames 10000)",
              started == [b"HTTP/1.1 200"] * 2 and queued == 10000 and st == 503
              and "being answered" in doc["error"], (started, queued, st, str(doc)[:200]))
        for sk in idle:
            sk.close()
        t0 = time.time()
        while time.time() - t0 < 20 and queued != 0:
            time.sleep(0.05)
            queued = s.request("GET", "/healthz")[1]["queued_frames"]
        st, doc, _ = s.request("POST", "/v1/forward", {"data": x[:10]})
        check("  ... once those clients are gone, requests are answered", st == 200, (queued, st))
    finally:
        rc = s.stop()
    check("wide-output server stops with exit 0", rc == 0, rc)
    # a client that reads its long answer a little at a time, too slowly: cut off --timeout
    # seconds after its answer was queued, while another client is answered meanwhile
    s = Server("--max-frames", "5000", "--timeout", "2", model="wide.h5")
    try:
        body = json.dumps({"data": x}).encode()
        sk = socket.create_connection(("127.0.0.1", s.port), timeout=30)
        sk.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
        sk.sendall(b"POST /v1/forward HTTP/1.1\r\nHost: x\r\nContent-Length: %d\r\n\r\n"
                   % len(body) + body)
        t0, got, closed, other = time.time(), 0, False, None
        while time.time() - t0 < 30:
            try:
                chunk = sk.recv(512)
            except ConnectionResetError:
                chunk = b""
            if not chunk:
                closed = True
                break
            got += len(chunk)
            if other is None:  # its answer is being written: the model is free again
                t1 = time.time()
                other = (good_request_wide(s, x), time.time() - t1)
            time.sleep(0.05)
        took = time.time() - t0
        sk.close()
        check("a reader taking 512 bytes per 50 ms (10 kB/s) of a 50 MB answer is cut off (--timeout "
              "2 and 1 s a MB made: %.1f s, %d bytes read)" % (took, got),
              closed and 1.5 < took < 25, (closed, took))
        check("  ... while another client got its answer (%.2f s)" % (other[1] if other else -1),
              other is not None and other[0] and other[1] < 2, other)
        # (on a loaded machine closing the cut-off connection has taken longer than 10 s)
        n = wait_connections(s, lambda n: n <= 1, timeout=60)
        check("  ... and its connection is gone", n == 1, n)
    finally:
        rc = s.stop()
    check("slow-reader server stops with exit 0", rc == 0, rc)


def test_model_errors():
    """A network that raises on one input (an image smaller than a "valid" 3 x 3 conv): 422 for
    that request naming the sequence and the layer, answers for the requests batched with it."""
    # --timeout and --max-wait-ms far above what the test needs: on a loaded machine the
    # requests below take seconds to queue, and the body held back must not be cut off meanwhile
    s = Server("--layer", "conv", "--max-wait-ms", "20000", "--timeout", "60", model="valid.h5")
    z = [0.5, -0.25]
    good, bad = {"data": [z] * 16, "size": [4, 4]}, {"data": [z], "size": [1, 1]}
    try:
        _, alone, _ = s.request("POST", "/v1/forward", good)
        st, doc, _ = s.request("POST", "/v1/forward", bad)
        text = "layer 'conv' (class conv2d): image 1 is 1 x 1, smaller than the 3 x 3 filter"
        check("an image the network cannot take -> 422 with the layer's message",
              st == 422 and doc["error"].startswith("the model cannot take this input: ")
              and text in doc["error"], (st, doc))
        st, doc, _ = s.request("POST", "/v1/forward", {"batch": [good, bad, good]})
        check("  ... in a batch request -> 422 naming batch[1]",
              st == 422 and doc["error"].startswith("batch[1]: the model cannot take")
              and text in doc["error"], (st, doc))
        # three requests in one model batch: a body still on its way keeps the model thread
        # waiting (--max-wait-ms) until the good and the bad request are both queued
        body = json.dumps(good).encode()
        sk = socket.create_connection(("127.0.0.1", s.port), timeout=30)
        sk.sendall(b"POST /v1/forward HTTP/1.1\r\nHost: x\r\nConnection: close\r\n"
                   b"Content-Length: %d\r\n\r\n" % len(body) + body[:10])
        # the server has read its headers (on a loaded machine that can come after the other
        # two requests, which then run alone)
        t0, incoming = time.time(), 0
        while time.time() - t0 < 30 and incoming != 1:
            incoming = s.request("GET", "/healthz")[1]["incoming"]
        check("a forward request whose body is on its way is counted as incoming", incoming == 1,
              incoming)
        res = {}

        def one(k, b):
            res[k] = s.request("POST", "/v1/forward", b)
        ts = [threading.Thread(target=one, args=(k, b)) for k, b in (("good", good), ("bad", bad))]
        [t.start() for t in ts]
        t0, queued = time.time(), 0
        while time.time() - t0 < 30 and queued != 17:
            queued = s.request("GET", "/healthz")[1]["queued_frames"]
        check("the good and the bad request are queued beside the held-back body",
              queued == 17, queued)
        sk.sendall(body[10:])
        got = b""
        while True:
            chunk = sk.recv(65536)
            if not chunk:
                break
            got += chunk
        sk.close()
        [t.join() for t in ts]
        slow = json.loads(got.split(b"\r\n\r\n", 1)[1]) if b"\r\n\r\n" in got else None
        check("one model batch of a good, a bad and a good request (17 frames queued: %d): the "
              "bad one 422, the others their answers" % queued,
              queued == 17 and res["good"][0] == 200 and res["good"][1] == alone
              and slow == alone and res["bad"][0] == 422 and text in res["bad"][1]["error"],
              (res, got[:200]))
        # images padded to 150 x 150 in one batch (45000 frames > --max-frames 20000) run one
        # by one
        tall, wide = {"data": [z] * 450, "size": [150, 3]}, {"data": [z] * 450, "size": [3, 150]}
        _, a1, _ = s.request("POST", "/v1/forward", tall)
        _, a2, _ = s.request("POST", "/v1/forward", wide)
        st, doc, _ = s.request("POST", "/v1/forward", {"batch": [tall, wide]})
        check("a 150 x 3 and a 3 x 150 image in one request equal each image alone",
              st == 200 and doc["batch"] == [a1, a2], st)
        # one bad image among 1002: found by halving the batch, not by running each alone
        small = {"data": [z] * 9, "size": [3, 3]}
        before = s.request("GET", "/healthz")[1].get("batches_run", 0)
        st, doc, _ = s.request("POST", "/v1/forward", {"batch": [small] * 500 + [bad] +
                                                                [small] * 501})
        runs = s.request("GET", "/healthz")[1].get("batches_run", 0) - before
        check("a bad image at batch[500] of 1002 -> 422 naming it after %d model batches "
              "(it took 501)" % runs, st == 422 and doc["error"].startswith("batch[500]: ")
              and 2 <= runs <= 23, (st, doc, runs))
    finally:
        rc = s.stop()
    check("valid-conv server stops with exit 0", rc == 0, rc)


def test_test_input():
    # the load's test input grows until the network takes it (not only 8 x 8)
    try:
        s = Server(model="pool4.h5")
    except RuntimeError as e:
        check("a model of four 2 x 2 poolings (images of 16 x 16 or more) is served", False, e)
        return
    z = [0.5, -0.5]
    try:
        st, doc, _ = s.request("POST", "/v1/forward", {"data": [z] * 256, "size": [16, 16]})
        check("a model of four 2 x 2 poolings (images of 16 x 16 or more) is served",
              st == 200 and len(doc["output"]) == 1, (st, doc))
        st, doc, _ = s.request("POST", "/v1/forward", {"data": [z] * 225, "size": [15, 15]})
        check("  ... a 15 x 15 image -> 422 naming the pooling", st == 422
              and "layer 'p4' (class pool2d)" in doc["error"], (st, doc))
    finally:
        rc = s.stop()
    check("pooling server stops with exit 0", rc == 0, rc)
    try:  # it was served: no request could hold a frame
        r = subprocess.run([BIN, "serve", os.path.join(DIR, "dim40k.h5"), "--port", "0",
                            "--max-body", "65536"], capture_output=True, timeout=20)
    except subprocess.TimeoutExpired:
        r = subprocess.CompletedProcess([], None, b"", b"still running after 20 s")
    check("a model taking frames of 40000 values with --max-body 65536: exit 1 naming why",
          r.returncode == 1 and b"input 'data' takes 40000 values a frame; a request body "
          b"(--max-body) holds at most 32768" in r.stderr, (r.returncode, r.stderr[-300:]))
    r = subprocess.run([BIN, "serve", os.path.join(DIR, "bigfilter.h5"), "--port", "0"],
                       capture_output=True, timeout=60)
    check("a model no test input up to 256 x 256 goes through: exit 1 naming the input and why",
          r.returncode == 1 and b"a test input (256 x 256 image of zeros) does not go through"
          in r.stderr and b"smaller than the 300 x 300 filter" in r.stderr, r.stderr[-300:])


def test_int8():
    """--precision int8: the answers are rl.forward{precision = "int8"}'s bit for bit (each row
    of an int8 product is quantized on its own: batching does not change it), and within 8/254
    of the float32 answers (tests/lua/test_int8.lua's bound), not equal to them."""
    ref8 = read_seqs(os.path.join(DIR, "fwd_int8.h5"))
    s = Server("--precision", "int8")
    try:
        check("--precision int8: each dev sequence equals rl.forward's int8 output",
              all(good_request(s, i, ref8) for i in range(len(INPUTS))))
        st, doc, _ = s.request("POST", "/v1/forward",
                               {"batch": [{"data": frames(i)} for i in range(len(INPUTS))]})
        check("  ... and so does one batch request of all of them", st == 200 and all(
            equal(d, ref8[i]) for i, d in enumerate(doc["batch"])), st)
    finally:
        rc = s.stop()
    check("int8 server stops with exit 0", rc == 0, rc)
    worst = max(float(np.abs(a - b).max()) for a, b in zip(ref8, REF))
    check("int8 answers within 8/254 of float32's and not equal", 0 < worst <= 8 / 254, worst)


def test_cli():
    r = subprocess.run([BIN, "serve"], capture_output=True)
    check("serve without a model: exit 2 with the usage", r.returncode == 2
          and b"usage: rnnlua serve" in r.stderr, r.returncode)
    r = subprocess.run([BIN, "serve", os.path.join(DIR, "model.h5"), "--frobnicate"],
                       capture_output=True)
    check("unknown option: exit 2 naming it as rnnlua: <where>: <what>", r.returncode == 2
          and b"rnnlua: --frobnicate: unknown option" in r.stderr, r.stderr[-200:])
    r = subprocess.run([BIN, "serve", os.path.join(DIR, "model.h5"), "--port", "x"],
                       capture_output=True)
    check("bad --port: exit 2 naming it", r.returncode == 2 and b"--port" in r.stderr)
    for opt, val, text in (("--port", "0x10", b"rnnlua: --port: needs an integer in 0..65535, got '0x10'"),
                           ("--threads", "0", b"rnnlua: --threads: needs an integer in 1..256"),
                           ("--max-wait-ms", "-1", b"rnnlua: --max-wait-ms: needs a number in 0..60000")):
        try:  # --port 0x10 listened on port 16
            r = subprocess.run([BIN, "serve", os.path.join(DIR, "model.h5"), opt, val, "--port",
                                "0"], capture_output=True, timeout=10)
        except subprocess.TimeoutExpired:
            r = subprocess.CompletedProcess([], None, b"", b"still running after 10 s")
        check("%s %s: exit 2 naming the range" % (opt, val), r.returncode == 2
              and text in r.stderr, r.stderr[-200:])
    r = subprocess.run([BIN, "serve", os.path.join(DIR, "missing.h5"), "--port", "0"],
                       capture_output=True)
    check("missing checkpoint: exit 1 naming the file", r.returncode == 1
          and b"missing.h5" in r.stderr, r.stderr[-200:])
    r = subprocess.run([BIN, "serve", os.path.join(DIR, "model.h5"), "--port", "0", "--layer",
                        "nope"], capture_output=True)
    check("unknown layer: exit 1 naming it (once 'rnnlua: serve: ')", r.returncode == 1
          and b"rnnlua: serve: no layer 'nope' in the network of" in r.stderr
          and b"rnnlua serve:" not in r.stderr, r.stderr[-200:])
    r = subprocess.run([BIN, "serve", os.path.join(DIR, "model.h5"), "--port", "0",
                        "--precision", "int4"], capture_output=True)
    check("unknown precision: exit 1 naming --precision", r.returncode == 1
          and b'--precision: precision must be "fp32", "bf16", "int8" or "fp16", got "int4"'
          in r.stderr, r.stderr[-200:])
    s = Server()
    try:
        r = subprocess.run([BIN, "serve", os.path.join(DIR, "model.h5"), "--port", str(s.port)],
                           capture_output=True, timeout=30)
        check("a port in use: exit 1 naming it", r.returncode == 1
              and str(s.port).encode() in r.stderr, r.stderr[-200:])
    finally:
        s.stop()
    r = subprocess.run([BIN, "serve", "--help"], capture_output=True)
    check("serve --help lists the options", r.returncode == 0 and b"--max-batch-frames" in r.stdout
          and b"--max-wait-ms" in r.stdout)


def test_lua_layers():
    """A model with a Lua layer class: refused naming the class without --lua, served with the
    file that registers it; a --lua file that raises or is missing; a SIGHUP while the model
    loads (it ended the process: the handlers came after the load)."""
    lua_model = os.path.join(DIR, "lua_model.h5")
    r = subprocess.run([BIN, "serve", lua_model, "--port", "0"], capture_output=True, timeout=30)
    check("a model with a Lua layer class, no --lua: exit 1 naming the class",
          r.returncode == 1 and b"'scale'" in r.stderr, r.stderr[-300:])
    ref = read_seqs(os.path.join(DIR, "fwd_lua.h5"))
    s = Server("--lua", os.path.join(DIR, "scale.lua"), model="lua_model.h5")
    try:
        check("  ... with --lua scale.lua: answers equal rl.forward's",
              all(good_request(s, i, ref) for i in range(3)))
    finally:
        rc = s.stop()
    check("Lua-layer server stops with exit 0", rc == 0, rc)
    # the NaN-answer path: the scale layer (k = 3) turns 2e38 into Inf in float32
    s = Server("--lua", os.path.join(DIR, "scale.lua"), "--layer", "sc", model="lua_model.h5")
    try:
        big = [[2e38] + [0.0] * 8] * 3
        st, doc, _ = s.request("POST", "/v1/forward", {"data": big})
        check("an answer with Inf -> 500 JSON naming the layer",
              st == 500 and doc["error"] == "layer 'sc' gave NaN or Inf", (st, doc))
        st, doc, _ = s.request("POST", "/v1/forward", {"batch": [{"data": frames(0)},
                                                                 {"data": big}]})
        check("  ... in a batch request -> 500 naming batch[1]",
              st == 500 and doc["error"].startswith("batch[1]: ") and "gave NaN or Inf"
              in doc["error"], (st, doc))
        st, doc, _ = s.request("POST", "/v1/forward", {"data": frames(1)})
        check("  ... and the next request is answered (3 x its input)", st == 200 and np.allclose(
            np.asarray(doc["output"], dtype=np.float32), 3 * INPUTS[1]), (st, str(doc)[:200]))
    finally:
        rc = s.stop()
    check("NaN-answer server stops with exit 0", rc == 0, rc)
    for name, text in (("raises.lua", b"no layers here"), ("missing.lua", b"missing.lua")):
        path = os.path.join(DIR, name)
        r = subprocess.run([BIN, "serve", lua_model, "--port", "0", "--lua", path],
                           capture_output=True, timeout=30)
        check("--lua %s: exit 1 naming the file and why" % name, r.returncode == 1
              and ("--lua " + path).encode() in r.stderr and text in r.stderr, r.stderr[-300:])
    p = subprocess.Popen([BIN, "serve", lua_model, "--port", "0", "--lua",
                          os.path.join(DIR, "slow.lua")], stdout=subprocess.PIPE,
                         stderr=subprocess.DEVNULL)
    time.sleep(0.5)
    p.send_signal(signal.SIGHUP)
    line = p.stdout.readline().decode()
    check("a SIGHUP while the model loads: the server still starts", "listening on" in line,
          (line, p.poll()))
    p.send_signal(signal.SIGTERM)
    try:
        rc = p.wait(30)
    except subprocess.TimeoutExpired:
        p.kill()
        rc = p.wait()
    p.stdout.close()
    check("  ... and stops on SIGTERM with exit 0", rc == 0, rc)


def main():
    max_body, max_frames = 65536, 1000
    seconds = float(os.environ.get("RL_SERVE_TEST_SECONDS", "1.5" if SANITIZED else "3"))
    s = Server("--max-body", str(max_body), "--max-frames", str(max_frames), "--timeout", "1",
               "--max-connections", "48", "--admin-token", ADMIN)
    try:
        test_answers(s)
        test_malformed(s, max_body, max_frames)
        test_decode(s)
        load_test(s, 32, seconds)
        test_reload(s)
    finally:
        rc = s.stop()
    check("the server stops on SIGTERM with exit 0 after all that", rc == 0, rc)
    test_health_alone()
    test_limits()
    test_open_limit()
    test_drain()
    test_ctc()
    test_ctc_lm()
    test_images()
    test_sparse()
    test_padding()
    test_wide()
    test_model_errors()
    test_test_input()
    test_cli()
    test_int8()
    test_lua_layers()
    print("%d passed, %d failed" % (PASSED[0], FAILED[0]))
    return 1 if FAILED[0] else 0


if __name__ == "__main__":
    sys.exit(main())
