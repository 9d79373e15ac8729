#!/usr/bin/env bash
# `rnnlua serve` under wrk: 64 connections for 60 s (RL_WRK_SECONDS, RL_WRK_CONNECTIONS), a mix
# of good and malformed requests, while /healthz is polled four times a second (and for 10 s
# before, without wrk) and the server's resident memory once a second. Prints a Markdown section
# (bench/run.sh runs it; `make bench-wrk` alone) and exits 1 when a good request got anything
# but its 200 JSON answer, a malformed one anything but a 4xx JSON error, the /healthz p99 was
# 50 ms or more, or the memory grew
# by more than 20% between the first and the last 10 s.
#
# The model is bench/serve.c's: the 12AX BLSTM (lstm 32 each way, softmax 2 over 9 one-hot
# inputs, untrained weights from seed 1). A good request is one 100-frame sequence (POST
# /v1/forward); of every 10 requests wrk sends, 2 are malformed: JSON cut short (400), a frame of
# 8 values (422), an unknown path (404) and an unknown key (400), in turn. The server runs with
# its defaults (--threads 2, dynamic batching) but --max-connections (16 more than wrk's, for
# the /healthz polls); wrk runs 2 threads on the same cores.
# Usage: bench/serve_wrk.sh BUILD (the folder holding rnnlua)
set -u
build=${1:-build}
bin=$(cd "$build" && pwd)/rnnlua
seconds=${RL_WRK_SECONDS:-60}
conns=${RL_WRK_CONNECTIONS:-64}
echo "### rnnlua serve under wrk: $conns connections, $seconds s, good and malformed requests"
echo
if ! command -v wrk >/dev/null 2>&1; then
    echo "SKIP: no wrk (scripts/deps.sh installs it)"
    exit 0
fi
dir=$(mktemp -d)
pid=""
trap '[ -n "$pid" ] && kill "$pid" 2>/dev/null; wait 2>/dev/null; rm -rf "$dir"' EXIT

"$bin" -e "rl.manual_seed(1)
local net = rl.network({fw = {class = 'lstm', n_out = 32}, bw = {class = 'lstm', n_out = 32,
  direction = -1}, output = {class = 'softmax', from = {'fw', 'bw'}, loss = 'ce',
  target = 'classes'}}, {data = {dim = 9}, classes = {dim = 2, sparse = true}})
rl.save_checkpoint('$dir/model.h5', {net = net, epoch = 1})" || exit 1
port=$(python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
# room for the /healthz polls beside wrk's connections
"$bin" serve "$dir/model.h5" --port "$port" --max-connections $((conns + 16)) \
    >"$dir/server.log" 2>&1 &
pid=$!
url=http://127.0.0.1:$port
for _ in $(seq 100); do
    curl -sf "$url/healthz" >/dev/null 2>&1 && break
    sleep 0.1
done

cat >"$dir/mix.lua" <<'LUA'
-- one 100-frame one-hot sequence; every 5th request malformed, of four kinds in turn
local frames = {}
for t = 1, 100 do
  local f = {}
  for d = 1, 9 do f[d] = (d == (t * 7) % 9 + 1) and 1 or 0 end
  frames[t] = "[" .. table.concat(f, ",") .. "]"
end
local good = '{"data": [' .. table.concat(frames, ",") .. ']}'
local bad = {
  {"/v1/forward", good:sub(1, 200)},
  {"/v1/forward", '{"data": [[1,0,0,0,0,0,0,0]]}'},
  {"/v1/nothing", good},
  {"/v1/forward", '{"data": [[1,0,0,0,0,0,0,0,0]], "extra": 1}'},
}
local threads = {}
function setup(thread) table.insert(threads, thread) end
function init()
  n, k = 0, 0
  good_ok, good_bad, bad_ok, bad_bad = 0, 0, 0, 0
  wrk.headers["Content-Type"] = "application/json"
end
function request()
  n = n + 1
  if n % 5 == 0 then
    k = k % #bad + 1
    return wrk.format("POST", bad[k][1], nil, bad[k][2])
  end
  return wrk.format("POST", "/v1/forward", nil, good)
end
-- wrk sends a connection's next request when the answer is in, so the answers of one thread
-- come back in its requests' order only per connection: the kind is told by the answer itself
function response(status, headers, body)
  if status == 200 then
    if body:match('^{"output":%[%[') then good_ok = good_ok + 1 else good_bad = good_bad + 1 end
  elseif status >= 400 and status < 500 and body:match('^{"error":') then
    bad_ok = bad_ok + 1
  else
    bad_bad = bad_bad + 1
    if bad_bad <= 3 then io.stderr:write("unexpected answer ", status, ": ", body:sub(1, 200), "\n") end
  end
end
function done(summary, latency, requests)
  local g, gb, b, bb = 0, 0, 0, 0
  for _, t in ipairs(threads) do
    g, gb = g + t:get("good_ok"), gb + t:get("good_bad")
    b, bb = b + t:get("bad_ok"), bb + t:get("bad_bad")
  end
  io.write(string.format("answers: %d good 200 JSON, %d 200 not JSON output, %d 4xx JSON errors, "
    .. "%d other\n", g, gb, b, bb))
  io.write(string.format("latency_us: p50 %d p90 %d p99 %d max %d\n", latency:percentile(50),
    latency:percentile(90), latency:percentile(99), latency.max))
end
LUA

# /healthz before the load (RL_WRK_IDLE_SECONDS, 10 by default), four times a second: the same
# figure on the same machine at the same time without wrk, to tell the server's share of a slow
# /healthz from the machine's (other users' load)
idle_end=$((SECONDS + ${RL_WRK_IDLE_SECONDS:-10}))
while [ "$SECONDS" -lt "$idle_end" ]; do
    curl -s -o /dev/null -w '%{http_code} %{time_total}\n' --max-time 5 "$url/healthz" \
        >>"$dir/health_idle.txt"
    sleep 0.25
done

# /healthz four times a second and the server's memory once a second, during the run
(
    end_t=$((SECONDS + seconds))
    while [ "$SECONDS" -lt "$end_t" ]; do
        curl -s -o /dev/null -w '%{http_code} %{time_total}\n' --max-time 5 "$url/healthz" \
            >>"$dir/health.txt"
        sleep 0.25
    done
) &
hpid=$!
(
    for _ in $(seq "$seconds"); do
        awk '/^VmRSS:/ {print $2}' "/proc/$pid/status" >>"$dir/rss.txt" 2>/dev/null
        sleep 1
    done
) &
mpid=$!
wrk -t 2 -c "$conns" -d "${seconds}s" --timeout 10s -s "$dir/mix.lua" "$url" >"$dir/wrk.txt" \
    2>"$dir/wrk.err"
wait "$hpid" "$mpid"
kill -0 "$pid" 2>/dev/null || { echo "**the server died**"; cat "$dir/server.log"; exit 1; }

rps=$(awk '/^Requests\/sec:/ {print $2}' "$dir/wrk.txt")
total=$(awk '/requests in/ {print $1}' "$dir/wrk.txt")
read -r p50 p90 p99 pmax < <(awk '/^latency_us:/ {print $3, $5, $7, $9}' "$dir/wrk.txt")
answers=$(grep '^answers:' "$dir/wrk.txt")
read -r good_ok good_bad bad_ok other < <(echo "$answers" | awk '{print $2, $6, $11, $15}')
errors=$(grep -E 'Socket errors' "$dir/wrk.txt" || echo "Socket errors: none")
h_n=$(wc -l <"$dir/health.txt")
h_bad=$(awk '$1 != 200' "$dir/health.txt" | wc -l)
# p50, p99 and max in ms of a file of curl's "code seconds" lines
health_stats() {
    awk '{print $2 * 1000}' "$1" | sort -n | awk '{t[NR] = $1} END {
        i = int(NR * 0.99 + 0.5); if (i < 1) i = 1; j = int(NR * 0.5 + 0.5); if (j < 1) j = 1
        printf "%.1f %.1f %.1f\n", t[j], t[i], t[NR]}'
}
read -r h_p50 h_p99 h_max < <(health_stats "$dir/health.txt")
read -r i_p50 i_p99 i_max < <(health_stats "$dir/health_idle.txt")
i_n=$(wc -l <"$dir/health_idle.txt")
read -r rss_first rss_last rss_max < <(awk '{v[NR] = $1; if ($1 > m) m = $1}
    END {a = 0; b = 0; k = (NR < 10) ? NR : 10; for (i = 1; i <= k; i++) {a += v[i]; b += v[NR - k + i]}
         printf "%d %d %d\n", a / k / 1024, b / k / 1024, m / 1024}' "$dir/rss.txt")

echo "| figure | value |"
echo "|---|---|"
echo "| requests/s (all kinds) | $rps ($total in ${seconds} s) |"
awk -v a="$p50" -v b="$p90" -v c="$p99" -v d="$pmax" 'BEGIN {
    printf "| latency p50 / p90 / p99 / max | %.1f / %.1f / %.1f / %.1f ms |\n", a / 1e3, b / 1e3, c / 1e3, d / 1e3}'
echo "| good requests answered 200 with the output | $good_ok (wrong: $good_bad) |"
echo "| malformed requests answered 4xx in JSON | $bad_ok |"
echo "| any other answer | $other |"
echo "| wrk's socket errors | ${errors#Socket errors: } |"
echo "| /healthz during the run: polls, not 200, p50, p99, max | $h_n, $h_bad, $h_p50 ms, $h_p99 ms, $h_max ms |"
echo "| /healthz before it (no wrk): polls, p50, p99, max | $i_n, $i_p50 ms, $i_p99 ms, $i_max ms |"
awk -v a="$h_p99" -v b="$i_p99" 'BEGIN {
    printf "| /healthz p99 under load / without | %.1f |\n", (b > 0) ? a / b : 0}'
echo "| server RSS: mean of the first 10 s, of the last 10 s, max | $rss_first MiB, $rss_last MiB, $rss_max MiB |"
echo
echo "Load average at the end: $(cut -d' ' -f1-3 /proc/loadavg); the machine ($(nproc) CPUs) is shared."
echo
fail=0
[ "${good_bad:-1}" -eq 0 ] && [ "${other:-1}" -eq 0 ] && [ "${good_ok:-0}" -gt 0 ] &&
    [ "${bad_ok:-0}" -gt 0 ] || { echo "**FAILED: wrong answers**"; cat "$dir/wrk.err"; fail=1; }
awk -v m="$h_p99" -v b="$h_bad" 'BEGIN {exit !(m < 50 && b == 0)}' ||
    { echo "**FAILED: /healthz p99 ${h_p99} ms (limit 50) or failed $h_bad times**"; fail=1; }
[ "$rss_last" -le $((rss_first * 12 / 10 + 1)) ] ||
    { echo "**FAILED: memory grew from $rss_first to $rss_last MiB**"; fail=1; }
exit "$fail"
