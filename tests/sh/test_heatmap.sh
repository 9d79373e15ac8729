#!/usr/bin/env bash
# The search task from the shell (recipes/forward.lua search=true) and heat maps of what the
# forward and search tasks write (rnnlua plot FILE.h5 --heatmap KEY): attention weights of a
# search, an MDLSTM layer's output images, an LSTM layer's activations. The PNGs read back with
# the right size; a bad key, sequence, channel or command line is an error naming it.
# Usage: test_heatmap.sh path/to/rnnlua
set -u
source "${BASH_SOURCE%/*}/lib.sh"
recipes=$(pwd)/recipes

png_size() { # the width x height of the PNG's IHDR chunk
    python3 -c '
import struct, sys
d = open(sys.argv[1], "rb").read(24)
assert d[:8] == b"\x89PNG\r\n\x1a\n" and d[12:16] == b"IHDR"
print("%dx%d" % struct.unpack(">II", d[16:24]))' "$1" 2>&1
}

cd "$tmp" || exit 1
# fixtures: an encoder-decoder with attention (s2s.h5) and data (d.h5, 3 sequences), an MDLSTM
# network on images (md.h5) and its images (img.h5)
"$bin" -e '
rl.manual_seed(3)
local net = rl.network({
  enc = {class = "lstm", n_out = 4},
  dec = {class = "rec", from = {}, max_seq_len = "T + 2", unit = {
    emb = {class = "embedding", from = "prev:output", n_out = 3},
    s = {class = "lstm", from = {"emb", "prev:att"}, n_out = 4},
    att = {class = "attention", base = "base:enc", from = "s", kind = "additive"},
    output_prob = {class = "softmax", from = {"s", "att"}, loss = "ce", target = "classes"},
    output = {class = "choice", from = "output_prob", target = "classes", beam_size = 2},
  }},
}, {data = {dim = 3}, classes = {dim = 6, sparse = true}})
local b = net:layer("dec").params["output_prob.b"]
b:zero_(); b[1] = -3 -- the end label unlikely: label sequences of several steps
rl.save_checkpoint("s2s.h5", {net = net})
local seqs = {}
for i, T in ipairs{4, 9, 2} do seqs[i] = {tag = "s" .. i, data = rl.randn(T, 3)} end
rl.dataset_write("d.h5", seqs, {extern_data = {data = {dim = 3}}})
local md = rl.network({
  md = {class = "mdlstm", n_out = 3, from = "data"},
  col = {class = "collapse", mode = "max", from = "md"},
  output = {class = "softmax", from = "col", loss = "ce", target = "classes"},
}, {data = {dim = 1, spatial = 2}, classes = {dim = 2, sparse = true}})
rl.save_checkpoint("md.h5", {net = md})
local w = rl.hdf_writer("img.h5", {data_dim = 1, spatial = 2})
w:add("img1", rl.rand(5, 7, 1))
w:add("img2", rl.rand(4, 6, 1))
w:close()
' >"$tmp/log" 2>&1
check "fixtures" "0" "$?"

# ---- the search task from the shell
run search ++model s2s.h5 ++data d.h5 ++output hyp.h5 ++beam 2 ++nbest true ++attention att
check "rnnlua search" "0:1" "$rc:$(grep -c '^search: 3 sequences, .* labels (beam 2) of layer .dec. -> hyp.h5$' "$tmp/out")"
run search ++model s2s.h5 ++data d.h5 ++output bad.h5 ++beam 0
check "search ++beam 0" "1:1" "$rc:$(grep -c 'rl.search: beam must be a positive integer, got 0' "$tmp/err")"
run search ++model s2s.h5 ++data d.h5 ++output bad.h5 ++length_norm maybe
check "search ++length_norm maybe" "2:rnnlua: ++length_norm: expects true or false, got 'maybe'" \
    "$rc:$(head -n 1 "$tmp/err")"
run "$recipes/forward.lua" ++search ++model s2s.h5 ++data d.h5 ++output hyp2.h5 ++beam 2
check "recipes/forward.lua ++search calls the same" "0:1" "$rc:$(grep -c '^search: 3 sequences' "$tmp/out")"
run search ++model s2s.h5 ++data d.h5 ++output bad.h5 ++attention s
check "search ++attention s" "1:1" "$rc:$(grep -c "attention = 's' is not an attention layer of the unit (attention layers: att)" "$tmp/err")"

# ---- heat maps of the attention weights
run plot hyp.h5 --heatmap attention --seq 2 -o att.png
check "attention heat map" "0:wrote att.png" "$rc:$(cat "$tmp/out")"
check "attention png size" "800x600" "$(png_size att.png)"
run plot hyp.h5 --heatmap attention --seq 3 -o att.svg
check "attention svg" "0:1" "$rc:$(grep -c '<svg' att.svg)"
run plot hyp.h5 --heatmap attention
check "default name" "0:800x600" "$rc:$(png_size hyp.attention.1.png)"
run plot hyp.h5 --heatmap attention_2 --seq 2 -o att2.png
check "the second best's heat map" "0:wrote att2.png" "$rc:$(cat "$tmp/out")"
# the matrix drawn is the one searched: (S_out, T_enc) with rows summing to 1
"$bin" -e '
local m = rl.tools.heatmap_matrix("hyp.h5", "attention", 2)
local names = {"end", "AA", "BB", "CC", "DD", "EE"}
local r = rl.search{model = "s2s.h5", data = {class = "hdf", files = {"d.h5"}}, beam = 2,
  output_file = "named.h5", attention = "att", labels = names, log_verbosity = 0}
assert(m:size(2) == 9, "T_enc")
assert(m:size(1) == math.min(#r.results[2].labels + 1, 11), "S_out")
assert((m:sum(2) - 1):abs():max() < 1e-5, "rows sum to 1")
assert(select(5, rl.tools.heatmap_matrix("hyp.h5", "attention", 2)) == nil, "no label names")
local _, _, _, _, rows = rl.tools.heatmap_matrix("named.h5", "attention", 2)
for k, v in ipairs(r.results[2].labels) do
  assert(rows[k] == names[v + 1], "row " .. k .. " is named by its label")
end
assert(#rows == m:size(1) and (#rows == #r.results[2].labels or rows[#rows] == "(end)"), "end row")
io.open("row1.txt", "w"):write(rows[1], "\n"):close()
' >"$tmp/log" 2>&1
check "the matrix of sequence 2" "0:" "$?:$(tail -n 3 "$tmp/log")"
run plot named.h5 --heatmap attention --seq 2 -o named.svg
check "rows named by the labels" "0:yes" "$rc:$(grep -q ">$(cat row1.txt)<" named.svg && echo yes)"

# ---- heat maps of forward outputs: MDLSTM images (a channel), LSTM activations
"$bin" forward ++model md.h5 ++data img.h5 ++layer md ++output md_out.h5 >"$tmp/log" 2>&1
check "forward md" "0" "$?"
run plot md_out.h5 --heatmap data --seq 2 --channel 3 -o md.png
check "mdlstm heat map" "0:800x600" "$rc:$(png_size md.png)"
"$bin" forward ++model s2s.h5 ++data d.h5 ++layer enc ++output enc.h5 >"$tmp/log" 2>&1
check "forward enc" "0" "$?"
run plot enc.h5 --heatmap data --seq 2 -o enc.png
check "lstm activations heat map" "0:800x600" "$rc:$(png_size enc.png)"

# ---- a crafted file: a tag with line breaks (gnuplot would run "!cmd" of its second line in
# the shell); it is drawn as text and nothing runs
"$bin" -e '
local w = rl.hdf_writer("crafted.h5", {data_dim = 2})
w:add("t\n!touch pwned\nset title (", rl.ones(3, 2))
w:close()
' >"$tmp/log" 2>&1
run plot crafted.h5 --heatmap data -o crafted.svg
check "a tag with line breaks runs nothing" "0:" "$rc:$([ -e pwned ] && echo ran)"

# ---- bad input
run plot hyp.h5 --heatmap att
check "unknown key" "1:rnnlua: hyp.h5: no key 'att' (keys: attention, attention_2, attention_2_shape, attention_shape, data, nbest, nbest_lengths, nbest_scores, scores)" \
    "$rc:$(cat "$tmp/err")"
run plot hyp.h5 --heatmap attention --seq 4
check "sequence beyond the file" "1:rnnlua: hyp.h5: sequence 4 is out of range 1..3" \
    "$rc:$(cat "$tmp/err")"
run plot hyp.h5 --heatmap attention --seq 0
check "sequence 0" "1:rnnlua: hyp.h5: sequence 0 is out of range 1..3" "$rc:$(cat "$tmp/err")"
run plot hyp.h5 --heatmap nbest
check "a sparse key" "1:rnnlua: hyp.h5: sequence 1 ('s1'), key 'nbest' holds labels (sparse), not a matrix" \
    "$rc:$(cat "$tmp/err")"
run plot md_out.h5 --heatmap data --channel 13
check "channel out of range" "1:rnnlua: md_out.h5: sequence 1 ('img1'), key 'data': channel 13 is out of range 1..12" \
    "$rc:$(cat "$tmp/err")"
run plot hyp.h5 --heatmap attention -o att.gif
check "bad format" "1:rnnlua: att.gif: the output must end in .png or .svg" "$rc:$(cat "$tmp/err")"
run plot missing.h5 --heatmap attention
check "missing file" "1:1" "$rc:$(grep -c 'missing.h5' "$tmp/err")"
run plot hyp.h5 --heatmap
check "--heatmap without a key" "2:rnnlua: --heatmap: lacks a value" \
    "$rc:$(head -n 1 "$tmp/err")"
run plot hyp.h5 --heatmap attention --seq two
check "--seq not a number" "2:rnnlua: --seq: expects an integer, got 'two'" "$rc:$(head -n 1 "$tmp/err")"
run plot net.curve.jsonl --seq 2
check "--seq without --heatmap" "2:rnnlua: ++seq and ++channel apply to ++heatmap" \
    "$rc:$(head -n 1 "$tmp/err")"

finish
