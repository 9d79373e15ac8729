#!/usr/bin/env bash
# Files written by rl.save are plain HDF5 that other tools read: h5dump shows the stored types,
# shapes, group layout and values; and a file rewritten by h5repack (chunked, gzip-compressed,
# as h5py often writes) loads back with rl.load. Usage: test_h5dump.sh path/to/rnnlua
set -u
bin=${1:?usage: test_h5dump.sh path/to/rnnlua}
pass=0
fail=0
dir=$(mktemp -d)
trap 'rm -rf "$dir"' EXIT
f="$dir/saved.h5"

check() { # name, got, expected
    if [ "$2" = "$3" ]; then
        pass=$((pass + 1))
    else
        fail=$((fail + 1))
        echo "FAIL $1: got '$2', expected '$3'"
    fi
}

# The values of one dataset as h5dump prints them, without indices or spaces.
values() {
    rm -f "$dir/out.txt"
    if ! h5dump -d "$2" -y -w 0 -o "$dir/out.txt" "$1" >/dev/null 2>&1; then
        echo "h5dump failed"
        return
    fi
    tr -d ' \n' <"$dir/out.txt"
}

header() { h5dump -H -d "$2" "$1" 2>&1 | grep -E "$3" | sed 's/^ *//'; }

"$bin" -e "rl.save('$f', {
  ['params/lstm1/W'] = rl.tensor{{1.5, -2}, {3, 4.25}},
  labels = rl.tensor({7, -8, 2147483647}, 'int32'),
  s = rl.tensor(0.1, 'float64'),
  tr = rl.tensor{{1, 2, 3}, {4, 5, 6}}:t(),
})"
check "rl.save exit status" "$?" "0"

check "W values" "$(values "$f" /params/lstm1/W)" "1.5,-2,3,4.25"
check "W type" "$(header "$f" /params/lstm1/W DATATYPE)" "DATATYPE  H5T_IEEE_F32LE"
check "W shape" "$(header "$f" /params/lstm1/W DATASPACE)" \
    "DATASPACE  SIMPLE { ( 2, 2 ) / ( 2, 2 ) }"
check "labels values" "$(values "$f" /labels)" "7,-8,2147483647"
check "labels type" "$(header "$f" /labels DATATYPE)" "DATATYPE  H5T_STD_I32LE"
check "scalar value" "$(values "$f" /s)" "0.1"
check "scalar type" "$(header "$f" /s DATATYPE)" "DATATYPE  H5T_IEEE_F64LE"
check "scalar space" "$(header "$f" /s DATASPACE)" "DATASPACE  SCALAR"
check "transposed view values" "$(values "$f" /tr)" "1,4,2,5,3,6"
check "transposed view shape" "$(header "$f" /tr DATASPACE)" \
    "DATASPACE  SIMPLE { ( 3, 2 ) / ( 3, 2 ) }"
check "group layout" "$(h5ls -r "$f" | awk '{print $1}' | tr '\n' ' ')" \
    "/ /labels /params /params/lstm1 /params/lstm1/W /s /tr "

# rewritten by another writer: chunked and compressed storage
h5repack -f GZIP=6 -l CHUNK=1x1 "$f" "$dir/repacked.h5" >/dev/null 2>&1
check "h5repack exit status" "$?" "0"
check "repacked is compressed" "$(h5dump -p -H -d /tr "$dir/repacked.h5" | grep -c DEFLATE)" "1"
got=$("$bin" -e "
local t = rl.load('$dir/repacked.h5')
local w, tr = t['params/lstm1/W']:totable(), t.tr:totable()
print(w[1][1], w[1][2], w[2][1], w[2][2], tr[3][1], tr[3][2], t.labels:totable()[3], t.s:item())
" 2>&1)
check "repacked file loads" "$got" "$(printf '1.5\t-2.0\t3.0\t4.25\t3.0\t6.0\t2147483647\t0.1')"

echo "$pass passed, $fail failed"
[ "$fail" -eq 0 ]
