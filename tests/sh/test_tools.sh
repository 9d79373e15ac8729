#!/usr/bin/env bash
# The tool subcommands (lua/rnnlua/tools.lua): info, dump-data, compare, average and plot on
# fixture files
# made here, their output checked line by line; bad input (a missing file, a file that is not
# HDF5, a dataset given as a checkpoint and the other way round, a bad command line) gives an
# error naming the file and exit status 1 (2 for the command line). rl.train{plot = true}
# draws the curve after every epoch. Usage: test_tools.sh path/to/rnnlua
set -u
source "${BASH_SOURCE%/*}/lib.sh"

# The output has this exact line (leading spaces and runs of spaces squeezed to one).
has_line() { # name, file, line
    if sed 's/^ *//; s/  */ /g' "$2" | grep -qxF -- "$3"; then ok "$1"; else bad "$1" "no line '$3' in:" "$(cat "$2")"; fi
}

# Fixtures: checkpoint a.h5 (known parameter values, lr control with two epochs of scores),
# b.h5 = a.h5 with one value changed by 0.25, c.h5 a network with a different layer size, and
# a dataset d.h5 of three sequences with known values.
cd "$tmp" || exit 1
"$bin" -e '
local function make(n_out, bump)
  local net = rl.network({lstm1 = {class = "lstm", n_out = n_out},
    output = {class = "softmax", from = "lstm1", loss = "ce", target = "classes"}},
    {data = {dim = 2}, classes = {dim = 4, sparse = true}})
  local ps = net:params()
  for i = 1, ps:numel() do ps[i] = (i % 7) / 8 end
  ps[5] = ps[5] + bump
  local opt = rl.optimizer({class = "adam"}, net:params(), net:grads())
  local lrc = rl.lr_control{learning_rate = 0.5, learning_rate_control = "newbob"}
  lrc:lr(1)
  lrc:epoch_done(1, {train_score = 3, dev_score = 2.5})
  lrc:lr(2)
  lrc:epoch_done(2, {train_score = 2, dev_score = 2.5})
  return {net = net, optimizer = opt, lr_control = lrc, epoch = 2, step = 7}
end
rl.save_checkpoint("a.h5", make(3, 0))
rl.save_checkpoint("b.h5", make(3, 0.25))
rl.save_checkpoint("c.h5", make(5, 0))
rl.save_checkpoint("e.h5", {net = make(3, 0).net}) -- no optimizer, no lr control
local w = rl.hdf_writer("d.h5", {data_dim = 2, targets = {classes = {dim = 3, sparse = true}},
  target_labels = {classes = {"a", "b", "c"}}})
w:add("s1", rl.tensor{{1, 2}, {3, 4}}, {classes = rl.tensor({0, 2}, "int32")})
w:add("s2", rl.tensor{{5, 6}}, {classes = rl.tensor({2}, "int32")})
w:add("s3", rl.tensor{{1, 0}, {1, 0}, {1, 0}, {1, 0}}, {classes = rl.tensor({1, 1, 1, 2}, "int32")})
w:close()
' || echo "FAIL: fixtures"
echo "not HDF5" >text.h5
printf '%s\n' \
    '{"epoch": 1, "lr": 0.5, "train_score": 3, "train_error": 0.75, "dev_score": 2.5,' \
    '{"epoch": 2, "lr": 0.25, "train_score": 2, "train_error": 0.5, "dev_score": 2.5,' |
    sed '1s/$/ "dev_error": null}/; 2s/$/ "dev_error": 0.6}/' >net.curve.jsonl

# ---- info
run info a.h5
check "info status" 0 "$rc"
has_line "info epoch" out "epoch 2, step 7, dtype float32"
has_line "info lstm1" out "lstm1 lstm 3 data 72"
has_line "info output" out "output softmax - lstm1 16"
has_line "info total" out "total 88"
has_line "info param" out "lstm1/W (2, 12) 24"
has_line "info optimizer" out "optimizer: adam, 0 steps"
has_line "info history head" out "epoch lr dev_score train_score"
has_line "info history 1" out "1 0.5 2.5 3"
has_line "info history 2" out "2 0.5 2.5 2"
has_line "info history 3" out "3 0.25 - -"
run info e.h5
check "info without state" 0 "$rc"
has_line "info without optimizer" out "optimizer: (no state saved)"
has_line "info without lr control" out "learning rate: (no learning-rate control state saved)"
run info --help
check "info --help" "0:usage: rnnlua info MODEL" "$rc:$(head -c 24 "$tmp/out")"

# ---- dump-data
run dump-data d.h5 --seq 3 --stats
check "dump-data status" 0 "$rc"
has_line "dump-data counts" out "3 sequences, 7 frames"
has_line "dump-data data" out "data dim 2 dense"
has_line "dump-data classes" out "classes dim 3 sparse"
has_line "dump-data lengths" out "length (data frames): min 1, max 4, mean 2.33"
has_line "dump-data hist 4" out "4 1 ########################################"
has_line "dump-data tag" out "sequence 3: tag s3"
has_line "dump-data seq classes" out "1 1 1 2"
# feature 0: 1 3 5 1 1 1 1, feature 1: 2 4 6 0 0 0 0 (population std)
has_line "dump-data mean 0" out "0 1.85714 1.45686"
has_line "dump-data mean 1" out "1 1.71429 2.24972"
has_line "dump-data label 0" out '0 "a" 1 14.29%'
has_line "dump-data label 1" out '1 "b" 3 42.86%'
has_line "dump-data label 2" out '2 "c" 3 42.86%'
run dump-data d.h5 --seq 4
check "dump-data --seq out of range" "1:rnnlua: d.h5: ++seq 4: the dataset has 3 sequences" \
    "$rc:$(cat "$tmp/err")"

# ---- compare
run compare a.h5 a.h5
check "compare same status" 0 "$rc"
has_line "compare same" out "identical: all 5 parameters bit-identical"
run compare a.h5 b.h5
check "compare different status" 1 "$rc"
has_line "compare W" out "lstm1/W (2, 12) 0.25 DIFFERENT"
has_line "compare U" out "lstm1/U (3, 12) 0 identical"
has_line "compare summary" out "different: max |A-B| = 0.25"
run compare a.h5 c.h5
check "compare incompatible status" 1 "$rc"
has_line "compare incompatible" out "incompatible: lstm1/W has shape (2, 12) in A, (2, 20) in B; \
lstm1/U has shape (3, 12) in A, (5, 20) in B; lstm1/b has shape (12) in A, (20) in B; \
output/W has shape (3, 4) in A, (5, 4) in B"

# ---- average
run average a.h5 a.h5 a.h5 -o avg.h5
check "average status" "0:" "$rc:$(cat "$tmp/err")"
has_line "average wrote" out "wrote avg.h5: the average of 3 checkpoints (5 parameters)"
run compare a.h5 avg.h5
check "average of 3 identical = the input, bit for bit" 0 "$rc"
run average a.h5 b.h5 -o ab.h5
run compare ab.h5 a.h5
has_line "average of a and b" out "lstm1/W (2, 12) 0.125 DIFFERENT"
run average a.h5 c.h5 -o x.h5
check "average of other networks status" 1 "$rc"
check "average of other networks names the parameter" "rnnlua: c.h5 is not a checkpoint of the network of a.h5: parameter lstm1/W has \
shape (2, 12) in a.h5, (2, 20) in c.h5" \
    "$(cat "$tmp/err")"
run average a.h5 -o a.h5
check "average into an input status" 1 "$rc"
run average a.h5
check "average without -o: status 2 naming ++out" "2:rnnlua: ++out: missing" \
    "$rc:$(head -1 "$tmp/err")"
run average a.h5 a.h5 ++out avg2.h5
check "average ++out as -o" 0 "$rc"
check "nothing written by the refused averages" 1 "$(ls x.h5 2>&1 | grep -c 'No such')"

# ---- plot
run plot net.curve.jsonl -o curve.png
check "plot status" "0:" "$rc:$(cat "$tmp/err")"
# the PNG's IHDR chunk: signature, length, "IHDR", width, height (big-endian)
size=$(python3 -c '
import struct, sys
d = open(sys.argv[1], "rb").read(24)
assert d[:8] == b"\x89PNG\r\n\x1a\n" and d[12:16] == b"IHDR"
print("%dx%d" % struct.unpack(">II", d[16:24]))' curve.png 2>&1)
check "plot png size" "800x900" "$size"
run plot net.curve.jsonl -o curve.svg
check "plot svg" "0:1" "$rc:$(grep -c '<svg' curve.svg)"
run plot net.curve.jsonl
check "plot default name" "0:yes" "$rc:$(test -s net.curve.png && echo yes)"
echo '{"epoch": 1, "lr": oops}' >bad.jsonl
run plot bad.jsonl
check "plot bad curve" "1:rnnlua: bad.jsonl:1: lr is oops, not a number" \
    "$rc:$(cat "$tmp/err")"
run plot net.curve.jsonl -o curve.gif
check "plot bad format" "1:rnnlua: curve.gif: the output must end in .png or .svg" \
    "$rc:$(cat "$tmp/err")"
# the output naming the input (a curve or a dataset file whose name ends in .png): refused, the
# input untouched
cp net.curve.jsonl own.png
run plot own.png -o own.png
check "plot onto its own input" "1:rnnlua: own.png: the output is the input file itself:same" \
    "$rc:$(cat "$tmp/err"):$(cmp -s own.png net.curve.jsonl && echo same)"
ln -s own.png link.png
run plot own.png -o link.png
check "plot onto a link to its input" "1:same" "$rc:$(cmp -s own.png net.curve.jsonl && echo same)"
cp d.h5 d.png
run plot d.png --heatmap data -o d.png
check "heatmap onto its own input" "1:rnnlua: d.png: the output is the input file itself:same" \
    "$rc:$(cat "$tmp/err"):$(cmp -s d.png d.h5 && echo same)"
mkdir dir.jsonl
run plot dir.jsonl
check "plot of a directory" "1:rnnlua: dir.jsonl: cannot read: it is a directory" \
    "$rc:$(cat "$tmp/err")"

# ---- rl.train{plot = true}: the picture after every epoch
"$bin" -e 'rl.train{network = {output = {class = "softmax", loss = "ce", target = "classes"}},
  train = {class = "12ax", num_seqs = 4, max_len = 12}, num_epochs = 2, model = "m/net",
  log_verbosity = 0, plot = true}' >"$tmp/out" 2>&1
check "train plot" "0:PNG image data, 800 x 900" "$?:$(file -b m/net.curve.png | cut -d, -f1,2)"

"$bin" -e 'rl.train{network = {output = {class = "softmax", loss = "ce", target = "classes"}},
  train = {class = "12ax", num_seqs = 4}, plot = "yes"}' >"$tmp/out" 2>&1
check "train plot not a boolean" "1:1" \
    "$?:$(grep -c 'config.plot must be true or false' "$tmp/out")"

# ---- bad input: the error names the file, exit status 1
for tool in info "dump-data" plot; do
    run "$tool" missing.h5
    check "$tool missing file" "1:1" "$rc:$(grep -c 'missing.h5' "$tmp/err")"
done
run compare a.h5 missing.h5
check "compare missing file" "1:1" "$rc:$(grep -c 'missing.h5' "$tmp/err")"
run info text.h5
check "info not hdf5" "1:rnnlua: text.h5: not an HDF5 file" "$rc:$(cat "$tmp/err")"
run dump-data text.h5
check "dump-data not hdf5" "1:rnnlua: text.h5: not an HDF5 file" "$rc:$(cat "$tmp/err")"
run info d.h5
check "info on a dataset" '1:rnnlua: d.h5: not an rnnlua checkpoint (no format = "rnnlua-checkpoint" attribute)' \
    "$rc:$(cat "$tmp/err")"
run dump-data a.h5
check "dump-data on a checkpoint" "1:rnnlua: a.h5: not a RETURNN HDF dataset: it has no /inputs" \
    "$rc:$(cat "$tmp/err")"
run compare a.h5 d.h5
check "compare with a dataset" "1:1" "$rc:$(grep -c 'd.h5: not an rnnlua checkpoint' "$tmp/err")"
run plot a.h5
check "plot on a checkpoint" "1:1" "$rc:$(grep -c 'a.h5:1: not a JSON object' "$tmp/err")"

# ---- the command line: exit status 2
run info
check "info no file" "2:rnnlua: expects one checkpoint file" \
    "$rc:$(head -1 "$tmp/err")"
run dump-data d.h5 --bogus
check "dump-data bad option" "2:rnnlua: --bogus: unknown option (did you mean ++stats?)" \
    "$rc:$(head -1 "$tmp/err")"
run compare a.h5
check "compare one file" "2:rnnlua: expects two checkpoint files" \
    "$rc:$(head -1 "$tmp/err")"
# the one convention: ++key value reads as --key value does; a misspelt option names the closest
run dump-data d.h5 ++seq 3 ++stats
check "dump-data ++seq ++stats" "0:1" "$rc:$(grep -c 'sequence 3: tag s3' "$tmp/out")"
run dump-data d.h5 ++sqe 3
check "dump-data misspelt option" "2:rnnlua: ++sqe: unknown option (did you mean ++seq?)" \
    "$rc:$(head -1 "$tmp/err")"
run dump-data d.h5 ++seq 2 --seq 3
check "an option given twice" "2:rnnlua: ++seq: given twice, as '2' and as '3'" \
    "$rc:$(head -1 "$tmp/err")"
run dump-data d.h5 ++seq two
check "an option of the wrong type" "2:rnnlua: ++seq: expects an integer, got 'two'" \
    "$rc:$(head -1 "$tmp/err")"
run dump-data --help
check "dump-data --help lists its options" "0:2" "$rc:$(grep -c '^  ++seq N\|^  ++stats' "$tmp/out")"

# ---- strings from a crafted file (a tag with an escape sequence and a line break) are shown
# with their control characters as \NNN: one line, nothing sent to the terminal
"$bin" -e '
local w = rl.hdf_writer("esc.h5", {data_dim = 1})
w:add("t\27]0;title\7\nfake line", rl.ones(1, 1))
w:close()' >"$tmp/log" 2>&1
run dump-data esc.h5 --seq 1
check "a tag with control characters" "0:0:0" "$rc:$(grep -c $'\033' "$tmp/out"):$(grep -c '^fake line' "$tmp/out")"
has_line "the tag shown escaped" out 'sequence 1: tag t\027]0;title\007\010fake line'

finish
