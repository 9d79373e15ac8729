#!/usr/bin/env bash
# Full disks and read-only folders under rl.train, rl.forward and the audio dataset's feature
# cache: a small tmpfs (mounted in a private mount namespace) filled up before a write, the same
# folder remounted read-only, and /dev/full (every write fails with ENOSPC) as the log file and
# the learning curve. Each case must stop the run with exit status 1 and an error naming the
# file and the cause; the previous checkpoint must be left byte for byte as it was and no
# temporary file may stay behind. Needs root (mount); prints SKIP without it.
# Usage: test_full_disk.sh BIN
set -u
bin=$(cd "$(dirname "${1:?usage: test_full_disk.sh path/to/rnnlua}")" && pwd)/$(basename "$1")
here=$(cd "$(dirname "$0")" && pwd)

if [ -z "${RL_FULL_DISK_INNER:-}" ]; then
    if [ "$(id -u)" -ne 0 ] || ! unshare -m --propagation private true 2>/dev/null; then
        echo "SKIP full disks: needs root and unshare -m (mount namespaces)"
        echo "0 passed, 0 failed"
        exit 0
    fi
    RL_FULL_DISK_INNER=1 exec unshare -m --propagation private bash "$here/$(basename "$0")" "$bin"
fi

tmp=$(mktemp -d)
full=$tmp/full
mkdir -p "$full"
trap 'umount "$full" 2>/dev/null; rm -rf "$tmp"' EXIT
pass=0
fail=0
ok() { pass=$((pass + 1)); echo "ok   $1"; }
bad() {
    fail=$((fail + 1))
    echo "FAIL $1"
    shift
    for l in "$@"; do echo "     $l"; done
}

# fails NAME CMD...: CMD exits 1 within 120 s; its stderr is in $tmp/err for the checks after
fails() {
    local name=$1
    shift
    timeout 120 "$@" >"$tmp/out" 2>"$tmp/err" </dev/null
    local rc=$?
    if [ "$rc" -ne 1 ]; then
        bad "$name: exit status $rc (want 1)" "$(cat "$tmp/err")"
        return 1
    fi
    return 0
}
# names NAME TEXT...: every TEXT is in $tmp/err
names() {
    local name=$1 t
    shift
    for t in "$@"; do
        if ! grep -qF -- "$t" "$tmp/err"; then
            bad "$name: no '$t' in the error" "$(cat "$tmp/err")"
            return
        fi
    done
    ok "$name"
}
no_temporaries() {
    if ls -A "$full" | grep -q '\.tmp'; then bad "$1: temporary files left" "$(ls -A "$full")"; else ok "$1"; fi
}
# fill [KEEP]: the tmpfs has no free block left, or only KEEP KiB
fill() {
    local avail
    avail=$(df --output=avail -k "$full" | tail -1)
    dd if=/dev/zero of="$full/filler" bs=1k count=$((avail - ${1:-0})) >/dev/null 2>&1
}

cat >"$tmp/train.lua" <<'LUA'
rl.train{network = {fw = {class = "lstm", n_out = 8, from = "data"},
                    output = {class = "softmax", from = "fw", loss = "ce", target = "classes"}},
         train = {class = "12ax", num_seqs = 20, seed = 1}, num_epochs = 1, batch_size = 200,
         optimizer = {class = "adam"}, learning_rate = 0.01, log_verbosity = 2}
LUA

# ---- checkpoints: epoch 1 saved, then the disk fills (all of it, or all but 8 KiB: the
# checkpoint's file is made and its data does not fit) or turns read-only, and epoch 2's save
# fails: the run stops, net.001.h5 is as it was, no net.002.h5 and no temporary file
for kind in full nearly-full read-only; do
    mount -t tmpfs -o size=1m tmpfs "$full"
    if ! "$bin" "$tmp/train.lua" ++model "$full/net" ++learning_curve_file "$tmp/curve.jsonl" \
        >"$tmp/out" 2>"$tmp/err"; then
        bad "$kind: epoch 1 trains and saves" "$(cat "$tmp/err")"
    fi
    cp "$full/net.001.h5" "$tmp/net.001.before"
    want="No space left on device"
    case $kind in
        full) fill ;;
        nearly-full) fill 8 ;;
        read-only) mount -o remount,ro "$full"; want="Read-only file system" ;;
    esac
    if fails "$kind disk: epoch 2's checkpoint" "$bin" "$tmp/train.lua" ++model "$full/net" \
        ++num_epochs 2 ++learning_curve_file "$tmp/curve.jsonl"; then
        names "$kind disk: the failed save names the checkpoint and the cause" "$full/net.002.h5" \
            "$want"
        if cmp -s "$full/net.001.h5" "$tmp/net.001.before" && [ ! -e "$full/net.002.h5" ]; then
            ok "$kind disk: the previous checkpoint is intact, no new one"
        else
            bad "$kind disk: checkpoints after the failed save" "$(ls -l "$full")"
        fi
        no_temporaries "$kind disk: no temporary file left by the checkpoint"
    fi
    umount "$full"
done

# ---- the log file and the learning curve on a full disk (/dev/full: writes fail with ENOSPC)
if fails "log_file on a full disk" "$bin" "$tmp/train.lua" ++log_file /dev/full; then
    names "log_file on a full disk: the error names the file and the cause" \
        "log_file /dev/full" "No space left on device"
fi
if fails "learning curve on a full disk" "$bin" "$tmp/train.lua" ++model "$tmp/m/net" \
    ++learning_curve_file /dev/full; then
    names "learning curve on a full disk: the error names the file and the cause" \
        "learning_curve_file /dev/full" "No space left on device"
fi

# ---- rl.forward's output file on a full disk: an error naming it, nothing half-written left
mkdir -p "$tmp/m"
"$bin" "$tmp/train.lua" ++model "$tmp/m/net" >/dev/null 2>&1
"$bin" -e "rl.dataset_write('$tmp/dev.h5', rl.dataset{class = '12ax', num_seqs = 200, seed = 3})" \
    >/dev/null 2>"$tmp/err" || bad "writing the dev set" "$(cat "$tmp/err")"
mount -t tmpfs -o size=64k tmpfs "$full"
if fails "rl.forward on a full disk" "$bin" -e "rl.forward{model = '$tmp/m/net.001.h5',
    data = {class = 'hdf', files = {'$tmp/dev.h5'}}, layer = 'output',
    output_file = '$full/fwd.h5'}"; then
    names "rl.forward on a full disk: the error names the output and the cause" "$full/fwd.h5" \
        "No space left on device"
    no_temporaries "rl.forward on a full disk: no temporary file left"
    [ -e "$full/fwd.h5" ] && bad "rl.forward on a full disk: a fwd.h5 was left" "$(ls -l "$full")"
fi
umount "$full"

# ---- the audio dataset's feature cache on a full disk: the dataset is not made, the error names
# the cache file and the cause
mkdir -p "$tmp/audio"
: >"$tmp/audio/list.tsv"
for i in 1 2 3 4 5 6; do
    sox -n -r 16000 -b 16 -c 1 "$tmp/audio/$i.wav" synth 1 sine $((200 * i)) 2>/dev/null
    printf '%s.wav\tab\n' "$i" >>"$tmp/audio/list.tsv"
done
mount -t tmpfs -o size=64k tmpfs "$full"
if fails "audio feature cache on a full disk" "$bin" -e "rl.dataset{class = 'audio',
    list = '$tmp/audio/list.tsv', vocab = 'chars', cache = '$full/cache.h5', quiet = true}"; then
    names "audio feature cache on a full disk: the error names the cache and the cause" \
        "$full/cache.h5" "No space left on device"
    no_temporaries "audio feature cache on a full disk: no temporary file left"
fi
umount "$full"

echo "$pass passed, $fail failed"
[ "$fail" -eq 0 ]
