#!/usr/bin/env bash
# RETURNN-layout HDF5 files written by h5py as RETURNN writes them (SimpleHDFWriter: resizable
# chunked datasets, variable-length tags, dense and sparse inputs; hdf_dump.py: fixed-length "S"
# tags, gzip) load with rl.dataset value for value; and files written by rl.dataset_write read
# back in h5py with RETURNN's layout. Needs Debian's python3-h5py (run with /usr/bin/python3):
# without it the test prints a SKIP note and passes. Usage: test_returnn_layout.sh path/to/rnnlua
set -u
source "${BASH_SOURCE%/*}/lib.sh"
py=/usr/bin/python3
if ! [ -x "$py" ] || ! "$py" -c "import h5py, numpy" >/dev/null 2>&1; then
    echo "SKIP test_returnn_layout: /usr/bin/python3 with h5py not found (apt-get install python3-h5py)"
    echo "0 passed, 0 failed"
    exit 0
fi

# Writes three files and, for each, the text dump rnnlua must reproduce.
"$py" - "$tmp" <<'EOF'
import sys
import h5py
import numpy as np

d = sys.argv[1]
rng = np.random.RandomState(42)

def dump(path, seqs):
    with open(path, "w") as out:
        for tag, x, tg in seqs:
            out.write("%s %d\n" % (tag, len(x)))
            out.write(" ".join("%.4f" % v if x.dtype.kind == "f" else "%d" % v
                               for v in np.ravel(x)) + "\n")
            for k in sorted(tg):
                out.write("%s: %s\n" % (k, " ".join("%.4f" % v if tg[k].dtype.kind == "f"
                                                    else "%d" % v for v in np.ravel(tg[k]))))

def simple_hdf_writer(path, seqs, dim, sparse, targets):
    # as RETURNN's SimpleHDFWriter: empty resizable datasets, grown per sequence
    f = h5py.File(path, "w")
    keys = sorted(targets)
    f.create_dataset("seqTags", shape=(0,), maxshape=(None,), dtype=h5py.special_dtype(vlen=str))
    f.create_dataset("seqLengths", shape=(0, 1 + len(keys)), maxshape=(None, 1 + len(keys)),
                     dtype="int32")
    if sparse:
        f.create_dataset("inputs", shape=(0,), maxshape=(None,), dtype="int32")
    else:
        f.create_dataset("inputs", shape=(0, dim), maxshape=(None, dim), dtype="float32")
    for k in keys:
        tdim, tsparse = targets[k]
        shape = (0,) if tsparse else (0, tdim)
        f.create_dataset("targets/data/" + k, shape=shape, maxshape=(None,) + shape[1:],
                         dtype="int32" if tsparse else "float32")
        if "targets/size" not in f:
            f.create_group("targets/size")
        f["targets/size"].attrs[k] = np.array([tdim, 1 if tsparse else 2], dtype="int32")
    if "classes" in targets:
        f.create_dataset("targets/labels/classes", data=np.array(
            ["l%d" % i for i in range(targets["classes"][0])], dtype=object),
            dtype=h5py.special_dtype(vlen=str))
    total = 0
    for tag, x, tg in seqs:
        n = f["seqTags"].shape[0]
        f["seqTags"].resize((n + 1,))
        f["seqTags"][n] = tag
        f["seqLengths"].resize((n + 1, 1 + len(keys)))
        f["seqLengths"][n] = [len(x)] + [len(tg[k]) for k in keys]
        ds = f["inputs"]
        ds.resize((ds.shape[0] + len(x),) + ds.shape[1:])
        ds[ds.shape[0] - len(x):] = x
        for k in keys:
            ds = f["targets/data/" + k]
            ds.resize((ds.shape[0] + len(tg[k]),) + ds.shape[1:])
            ds[ds.shape[0] - len(tg[k]):] = tg[k]
        total += len(x)
    f.attrs["numSeqs"] = len(seqs)
    f.attrs["numTimesteps"] = total
    f.attrs["inputPattSize"] = dim
    f.attrs["numDims"] = 1
    f.attrs["numLabels"] = targets.get("classes", (1,))[0]
    f.close()

# 1: dense inputs, sparse classes and a dense target at twice the frame rate
seqs = []
for i in range(5):
    T = rng.randint(1, 9)
    seqs.append(("train/seq%d" % i, rng.randn(T, 4).astype("float32"),
                 {"classes": rng.randint(0, 6, size=T).astype("int32"),
                  "feat": rng.randn(2 * T, 3).astype("float32")}))
simple_hdf_writer(d + "/simple.h5", seqs, 4, False, {"classes": (6, True), "feat": (3, False)})
dump(d + "/simple.txt", seqs)

# 2: sparse inputs, one sparse target
seqs = []
for i in range(4):
    T = rng.randint(2, 7)
    seqs.append(("sp-%d" % i, rng.randint(0, 10, size=T).astype("int32"),
                 {"classes": rng.randint(0, 3, size=T).astype("int32")}))
simple_hdf_writer(d + "/sparse.h5", seqs, 10, True, {"classes": (3, True)})
dump(d + "/sparse.txt", seqs)

# 3: as hdf_dump.py: whole arrays at once, fixed-length "S" tags, gzip, float64 inputs
seqs = []
for i in range(3):
    T = rng.randint(3, 6)
    seqs.append(("dump_%d" % i, rng.randn(T, 2), {"classes": rng.randint(0, 4, size=T).astype("int32")}))
f = h5py.File(d + "/dump.h5", "w")
f.create_dataset("inputs", data=np.concatenate([s[1] for s in seqs]), compression="gzip")
f.create_dataset("seqLengths", data=np.array([[len(s[1])] * 2 for s in seqs], dtype="int32"))
tags = [s[0].encode() for s in seqs]
f.create_dataset("seqTags", data=np.array(tags, dtype="S%d" % max(map(len, tags))))
f.create_dataset("targets/data/classes", data=np.concatenate([s[2]["classes"] for s in seqs]),
                 compression="gzip")
f.create_group("targets/size").attrs["classes"] = [4, 1]
f.attrs["numSeqs"] = 3
f.attrs["inputPattSize"] = 2
f.attrs["numDims"] = 1
f.attrs["numLabels"] = 4
f.attrs["numTimesteps"] = sum(len(s[1]) for s in seqs)
f.close()
dump(d + "/dump.txt", seqs)
EOF
check "h5py wrote the files" "0" "$?"

for name in simple sparse dump; do
    "$bin" -e "
local ds = rl.dataset{class = 'hdf', files = {'$tmp/$name.h5'}}
local out = assert(io.open('$tmp/$name.got', 'w'))
local function fmt(t)
  local v, s = t:double():view(-1):totable(), {}
  for i, x in ipairs(v) do s[i] = t:dtype() == 'int32' and string.format('%d', x) or string.format('%.4f', x) end
  return table.concat(s, ' ')
end
for i = 1, ds:num_seqs() do
  local q = ds:get_seq(i)
  out:write(q.tag, ' ', q.data:size(1), '\n', fmt(q.data), '\n')
  for _, k in ipairs(ds:keys()) do
    if k ~= 'data' then out:write(k, ': ', fmt(q[k]), '\n') end
  end
end
out:close()" 2>"$tmp/err.txt"
    check "rnnlua reads $name.h5" "0" "$?"
    [ -s "$tmp/err.txt" ] && cat "$tmp/err.txt"
    check "$name.h5 contents" "same" "$(cmp -s "$tmp/$name.got" "$tmp/$name.txt" && echo same || diff "$tmp/$name.got" "$tmp/$name.txt" | head -5)"
done

# The other way: rl.dataset_write's file as h5py (and so RETURNN) sees it.
"$bin" -e "
local w = rl.hdf_writer('$tmp/ours.h5', {data_dim = 3, targets = {classes = {dim = 5, sparse = true},
  align = {dim = 2}}, target_labels = {classes = {'a', 'b', 'c', 'd', 'e'}}})
w:add('s/1', rl.tensor{{1, 2, 3}, {4, 5, 6}}, {classes = rl.tensor({4, 0}, 'int32'), align = rl.tensor{{1, 1}}})
w:add('s/2', rl.tensor{{7, 8, 9}}, {classes = rl.tensor({2}, 'int32'), align = rl.tensor{{2, 2}, {3, 3}}})
w:close()"
check "rl.hdf_writer" "0" "$?"
got=$("$py" - "$tmp/ours.h5" <<'EOF'
import sys
import h5py
f = h5py.File(sys.argv[1], "r")
tags = [t.decode() if isinstance(t, bytes) else t for t in f["seqTags"][...]]
print("tags", ",".join(tags))
print("seqLengths", f["seqLengths"].dtype, f["seqLengths"][...].tolist())
print("inputs", f["inputs"].dtype, f["inputs"].shape, f["inputs"][2].tolist())
print("classes", f["targets/data/classes"].dtype, f["targets/data/classes"][...].tolist())
print("align", f["targets/data/align"].shape)
print("size", list(f["targets/size"].attrs["classes"]), list(f["targets/size"].attrs["align"]))
print("labels", [l.decode() if isinstance(l, bytes) else l for l in f["targets/labels/classes"][...]])
print("attrs", *[int(f.attrs[a]) for a in ["numSeqs", "numTimesteps", "inputPattSize", "numDims", "numLabels"]])
EOF
)
want="tags s/1,s/2
seqLengths int32 [[2, 1, 2], [1, 2, 1]]
inputs float32 (3, 3) [7.0, 8.0, 9.0]
classes int32 [4, 0, 2]
align (3, 2)
size [5, 1] [2, 2]
labels ['a', 'b', 'c', 'd', 'e']
attrs 2 3 3 1 5"
check "h5py reads rl.hdf_writer's file" "$want" "$got"

finish
