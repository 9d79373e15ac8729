#!/usr/bin/env bash
# Files written by rl.save are plain HDF5 that other tools read: h5dump shows the stored types,
# shapes, group layout and values; and a file rewritten by h5repack (chunked, gzip-compressed,
# as h5py often writes) loads back with rl.load. Usage: test_h5dump.sh path/to/rnnlua
set -u
source "${BASH_SOURCE%/*}/lib.sh"
f="$tmp/saved.h5"

# The values of one dataset as h5dump prints them, without indices or spaces.
values() {
    rm -f "$tmp/out.txt"
    if ! h5dump -d "$2" -y -w 0 -o "$tmp/out.txt" "$1" >/dev/null 2>&1; then
        echo "h5dump failed"
        return
    fi
    tr -d ' \n' <"$tmp/out.txt"
}

header() { h5dump -H -d "$2" "$1" 2>&1 | grep -E "$3" | sed 's/^ *//'; }

"$bin" -e "rl.save('$f', {
  ['params/lstm1/W'] = rl.tensor{{1.5, -2}, {3, 4.25}},
  labels = rl.tensor({7, -8, 2147483647}, 'int32'),
  s = rl.tensor(0.1, 'float64'),
  tr = rl.tensor{{1, 2, 3}, {4, 5, 6}}:t(),
})"
check "rl.save exit status" "0" "$?"

check "W values" "1.5,-2,3,4.25" "$(values "$f" /params/lstm1/W)"
check "W type" "DATATYPE  H5T_IEEE_F32LE" "$(header "$f" /params/lstm1/W DATATYPE)"
check "W shape" "DATASPACE  SIMPLE { ( 2, 2 ) / ( 2, 2 ) }" \
    "$(header "$f" /params/lstm1/W DATASPACE)"
check "labels values" "7,-8,2147483647" "$(values "$f" /labels)"
check "labels type" "DATATYPE  H5T_STD_I32LE" "$(header "$f" /labels DATATYPE)"
check "scalar value" "0.1" "$(values "$f" /s)"
check "scalar type" "DATATYPE  H5T_IEEE_F64LE" "$(header "$f" /s DATATYPE)"
check "scalar space" "DATASPACE  SCALAR" "$(header "$f" /s DATASPACE)"
check "transposed view values" "1,4,2,5,3,6" "$(values "$f" /tr)"
check "transposed view shape" "DATASPACE  SIMPLE { ( 3, 2 ) / ( 3, 2 ) }" \
    "$(header "$f" /tr DATASPACE)"
check "group layout" "/ /labels /params /params/lstm1 /params/lstm1/W /s /tr " \
    "$(h5ls -r "$f" | awk '{print $1}' | tr '\n' ' ')"

# rewritten by another writer: chunked and compressed storage
h5repack -f GZIP=6 -l CHUNK=1x1 "$f" "$tmp/repacked.h5" >/dev/null 2>&1
check "h5repack exit status" "0" "$?"
check "repacked is compressed" "1" "$(h5dump -p -H -d /tr "$tmp/repacked.h5" | grep -c DEFLATE)"
got=$("$bin" -e "
local t = rl.load('$tmp/repacked.h5')
local w, tr = t['params/lstm1/W']:totable(), t.tr:totable()
print(w[1][1], w[1][2], w[2][1], w[2][2], tr[3][1], tr[3][2], t.labels:totable()[3], t.s:item())
" 2>&1)
check "repacked file loads" "$(printf '1.5\t-2.0\t3.0\t4.25\t3.0\t6.0\t2147483647\t0.1')" "$got"

finish
