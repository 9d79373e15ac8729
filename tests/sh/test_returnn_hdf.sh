#!/usr/bin/env bash
# RETURNN itself on rnnlua's files and rnnlua on RETURNN's: every kind of HDF5 file rnnlua
# writes (rl.dataset_write with sparse, dense and own-length targets and without labels,
# rl.hdf_writer without targets and with sparse inputs, the forward task's output, rl.search's
# output with n-best lists, attention weights and an empty label sequence) opens in
# RETURNN's HDFDataset (returnn.datasets.hdf, from PyPI) with the same sequences, tags, lengths
# and values as rl.dataset reads; files from RETURNN's SimpleHDFWriter read in rl.dataset as in
# HDFDataset. RETURNN lives in a virtual environment under build/ (made on first use with pip:
# returnn, numpy, h5py); the test prints SKIP only when PyPI cannot be reached.
# Usage: test_returnn_hdf.sh path/to/rnnlua
set -u
bin=$(cd "$(dirname "${1:?usage: test_returnn_hdf.sh path/to/rnnlua}")" && pwd)/$(basename "$1")
venv=${RNNLUA_RETURNN_VENV:-build/returnn-venv}
py=$venv/bin/python
pass=0
fail=0
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT

if ! "$py" -c "import returnn.datasets.hdf, h5py, numpy" >/dev/null 2>&1; then
    if ! [ -x "$venv/bin/pip" ] && ! python3 -m venv "$venv"; then
        echo "FAIL cannot make a virtual environment in $venv (python3-venv, scripts/deps.sh)"
        echo "0 passed, 1 failed"
        exit 1
    fi
    if ! timeout 300 "$venv/bin/pip" download -q --no-deps -d "$tmp/probe" returnn >/dev/null 2>&1; then
        echo "SKIP test_returnn_hdf: PyPI cannot be reached to install returnn into $venv"
        echo "0 passed, 0 failed"
        exit 0
    fi
    echo "installing returnn, numpy and h5py into $venv"
    timeout 900 "$venv/bin/pip" install -q returnn numpy h5py || {
        echo "FAIL cannot install returnn into $venv"
        echo "0 passed, 1 failed"
        exit 1
    }
fi

# ---- the dump both sides print: per sequence its tag, then each key (sorted) with its length
# (first dim) and its values (%.6g floats, %d integers)
cat >"$tmp/dump.lua" <<'LUA'
local out = assert(io.open(arg[2], "w"))
local ds = rl.dataset{class = "hdf", files = {arg[1]}, allow_empty = true}
ds:init_epoch(1)
local keys = ds:keys()
table.sort(keys)
for i = 1, ds:num_seqs() do
  local seq = ds:get_seq(i)
  out:write(seq.tag, "\n")
  for _, k in ipairs(keys) do
    local t = seq[k]
    local flat = t:numel() > 0 and t:contiguous():view(t:numel()):totable() or {}
    local fmt = t:dtype() == "int32" and "%d" or "%.6g"
    for j, v in ipairs(flat) do flat[j] = string.format(fmt, v) end
    out:write(k, " ", t:size(1), ": ", table.concat(flat, " "), "\n")
  end
end
out:close()
LUA
cat >"$tmp/dump.py" <<'PY'
import sys
from returnn.log import log
log.initialize(verbosity=[0])
from returnn.datasets.hdf import HDFDataset
for path in sys.argv[1:]:
    try:
        ds = HDFDataset(files=[path])
        ds.initialize()
        ds.init_seq_order(epoch=1)
        ds.load_seqs(0, ds.num_seqs)
        with open(path + ".returnn.txt", "w") as out:
            for i in range(ds.num_seqs):
                out.write(ds.get_tag(i) + "\n")
                for k in sorted(ds.get_data_keys()):
                    x = ds.get_data(i, k)
                    fmt = "%d" if x.dtype.kind in "iu" else "%.6g"
                    out.write("%s %d: %s\n" % (k, x.shape[0],
                                              " ".join(fmt % v for v in x.ravel().tolist())))
    except Exception as e:  # the comparison reports it for this file
        with open(path + ".returnn.err", "w") as out:
            out.write("%s: %s\n" % (type(e).__name__, e))
PY

names=()
files=()
check() { names+=("$1"); files+=("$2"); }
# compare: RETURNN dumps every file named by check in one run; rnnlua's dump must be the same
compare() {
    "$py" "$tmp/dump.py" "${files[@]}" >"$tmp/pylog" 2>&1 || { cat "$tmp/pylog"; }
    for i in "${!files[@]}"; do
        local name=${names[$i]} f=${files[$i]}
        if ! "$bin" "$tmp/dump.lua" "$f" "$f.rl.txt" 2>"$tmp/err"; then
            fail=$((fail + 1)); echo "FAIL $name: rl.dataset cannot read it: $(cat "$tmp/err")"
        elif [ -e "$f.returnn.err" ] || ! [ -e "$f.returnn.txt" ]; then
            fail=$((fail + 1))
            echo "FAIL $name: RETURNN's HDFDataset cannot read it: $(cat "$f.returnn.err" 2>/dev/null)"
        elif cmp -s "$f.rl.txt" "$f.returnn.txt" && [ -s "$f.rl.txt" ]; then
            pass=$((pass + 1)); echo "ok   $name ($(grep -c '^' "$f.rl.txt") lines agree)"
        else
            fail=$((fail + 1)); echo "FAIL $name: the readers differ"
            diff "$f.rl.txt" "$f.returnn.txt" | head -n 10
        fi
    done
    names=()
    files=()
}

# ---- files rnnlua writes
cat >"$tmp/write.lua" <<'LUA'
local d = arg[1]
rl.manual_seed(7)
local ext = {data = {dim = 3}, classes = {dim = 4, sparse = true}}
local seqs = {}
for i, T in ipairs{5, 1, 3} do
  seqs[i] = {tag = "seq-" .. i, data = rl.randn(T, 3),
             classes = rl.tensor((function() local c = {} for t = 1, T do c[t] = (i + t) % 4 end
                                   return c end)(), "int32")}
end
rl.dataset_write(d .. "/sparse_target.h5", seqs, {extern_data = ext})
local dense = {}
for i, s in ipairs(seqs) do
  dense[i] = {tag = s.tag, data = s.data, feat = rl.randn(s.data:size(1), 2)}
end
rl.dataset_write(d .. "/dense_target.h5", dense,
                 {extern_data = {data = {dim = 3}, feat = {dim = 2}}})
local own = {}
for i, s in ipairs(seqs) do
  own[i] = {tag = s.tag, data = s.data, classes = s.classes,
            orth = rl.tensor(i == 2 and {1} or {2, 0, 1}, "int32")}
end
rl.dataset_write(d .. "/own_length_target.h5", own, {extern_data = {data = {dim = 3},
  classes = {dim = 4, sparse = true}, orth = {dim = 3, sparse = true}}})
local w = rl.hdf_writer(d .. "/no_targets.h5", {data_dim = 3})
for _, s in ipairs(seqs) do w:add(s.tag, s.data) end
w:close()
w = rl.hdf_writer(d .. "/sparse_inputs.h5", {data_dim = 6, sparse = true,
                                              targets = {classes = {dim = 4, sparse = true}}})
for _, s in ipairs(seqs) do w:add(s.tag, s.classes + 1, {classes = s.classes}) end
w:close()
local net = rl.network({h = {class = "lstm", n_out = 4},
                        output = {class = "softmax", from = "h", loss = "ce", target = "classes"}}, ext)
rl.save_checkpoint(d .. "/model.h5", {net = net})
rl.forward{model = d .. "/model.h5", data = {class = "hdf", files = {d .. "/sparse_target.h5"}},
           layer = "output", output_file = d .. "/forward.h5"}
-- rl.search's output: labels (one sequence empty: its search ends at once), scores, the n-best
-- and attention weights with their shapes
local s2s = rl.network({
  enc = {class = "lstm", n_out = 4},
  dec = {class = "rec", from = {}, max_seq_len = "T + 1", unit = {
    emb = {class = "embedding", from = "prev:output", n_out = 3},
    s = {class = "lstm", from = {"emb", "prev:att"}, n_out = 4},
    att = {class = "attention", base = "base:enc", from = "s", kind = "additive"},
    output_prob = {class = "softmax", from = {"s", "att"}, loss = "ce", target = "classes"},
    output = {class = "choice", from = "output_prob", target = "classes", beam_size = 2},
  }},
}, ext)
local b = s2s:layer("dec").params["output_prob.b"]
b:zero_()
b[1] = 1.5 -- the end label 0 likely from the start: an empty and some short sequences
rl.search{model = s2s, data = {class = "hdf", files = {d .. "/sparse_target.h5"}},
          output_file = d .. "/search.h5", nbest = true, attention = "att", log_verbosity = 0}
local r = rl.dataset{class = "hdf", files = {d .. "/search.h5"}, allow_empty = true}
r:init_epoch(1)
local empty = false
for i = 1, r:num_seqs() do empty = empty or r:get_seq(i).data:numel() == 0 end
assert(empty, "the search output should hold an empty label sequence for this test")
LUA
if ! "$bin" "$tmp/write.lua" "$tmp" >"$tmp/log" 2>&1; then
    fail=$((fail + 1)); echo "FAIL rnnlua could not write its files:"; tail -n 10 "$tmp/log"
else
    check "rl.dataset_write, sparse target without labels" "$tmp/sparse_target.h5"
    check "rl.dataset_write, dense target" "$tmp/dense_target.h5"
    check "rl.dataset_write, a target with its own lengths" "$tmp/own_length_target.h5"
    check "rl.hdf_writer without targets" "$tmp/no_targets.h5"
    check "rl.hdf_writer, sparse inputs" "$tmp/sparse_inputs.h5"
    check "the forward task's output" "$tmp/forward.h5"
    check "rl.search's output (n-best, attention weights, an empty label sequence)" "$tmp/search.h5"
    compare
fi

# ---- files RETURNN's SimpleHDFWriter writes
cat >"$tmp/returnn_write.py" <<'PY'
import sys
import numpy as np
from returnn.log import log
log.initialize(verbosity=[0])
from returnn.datasets.hdf import SimpleHDFWriter
d = sys.argv[1]
rng = np.random.RandomState(3)
lens = [4, 1, 6]
B, T = len(lens), max(lens)
tags = ["utt-%d" % i for i in range(B)]
x = rng.randn(B, T, 5).astype("float32")
c = rng.randint(0, 7, size=(B, T)).astype("int32")
w = SimpleHDFWriter(d + "/returnn_dense.h5", dim=5, extra_type={"classes": (7, 1, "int32")})
w.insert_batch(x, seq_len={0: np.array(lens)}, seq_tag=tags, extra={"classes": c})
w.close()
w = SimpleHDFWriter(d + "/returnn_sparse.h5", dim=9, ndim=1)
w.insert_batch(rng.randint(0, 9, size=(B, T)).astype("int32"), seq_len={0: np.array(lens)},
               seq_tag=tags)
w.close()
w = SimpleHDFWriter(d + "/returnn_no_targets.h5", dim=2)
w.insert_batch(x[:, :, :2], seq_len={0: np.array(lens)}, seq_tag=tags)
w.close()
PY
if ! "$py" "$tmp/returnn_write.py" "$tmp" >"$tmp/log" 2>&1; then
    fail=$((fail + 1)); echo "FAIL RETURNN's SimpleHDFWriter:"; tail -n 10 "$tmp/log"
else
    check "SimpleHDFWriter, dense inputs and sparse classes" "$tmp/returnn_dense.h5"
    check "SimpleHDFWriter, sparse inputs" "$tmp/returnn_sparse.h5"
    check "SimpleHDFWriter without targets" "$tmp/returnn_no_targets.h5"
    compare
fi

echo "$pass passed, $fail failed"
[ "$fail" -eq 0 ]
