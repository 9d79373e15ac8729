-- Speech features: rl.audio.features (log-mel filterbank, Kaldi's defaults, 80 mels) against
-- torchaudio.compliance.kaldi.fbank on the same 10 s waveform at 16 kHz, both on 1 thread
-- (rl.audio.features is single-threaded; torch.set_num_threads(1)). Speed is seconds of audio
-- per second of wall clock. PyTorch comes from bench/torch_env.sh plus torchaudio 2.11
-- (pip --no-deps; its kaldi.py only, see bench/torch_audio.py); a SKIP column where it cannot
-- be set up. Each torchaudio measurement is one run of bench/torch_audio.py, which warms up and
-- times its calls itself. Rounds alternate rnnlua, torchaudio, ...; each side's figure is the
-- median over RL_BENCH_ROUNDS (default 5) rounds of about RL_BENCH_SECONDS (default 0.5) s.
local B = dofile("bench/bench.lua")
local seconds, rounds, median = B.seconds, B.rounds, B.median
local build = os.getenv("RL_BUILD_DIR") or "build"
local audio_s, n_mels = 10, 80

local function sh(cmd)
  local p = io.popen(cmd)
  local out = p and p:read("a") or ""
  local ok = p and p:close()
  return ok, out
end

local py
do
  local _, out = sh("bash bench/torch_env.sh " .. build .. " 2>/dev/null")
  local last = out:match("([^\n]+)\n?$")
  if last and last:match("python") then
    local has = sh(last .. " -c 'import importlib.util as u; assert u.find_spec(\"torchaudio\")'" ..
      " 2>/dev/null")
    if not has then
      has = sh(last .. " -m pip install -q --disable-pip-version-check --no-deps " ..
        "torchaudio==2.11.0 >/dev/null 2>&1")
    end
    if has then py = last end
  end
end

local function torch_round(reps)
  local cmd = string.format("%s bench/torch_audio.py %g %d %d 2>&1", py, audio_s, n_mels, reps)
  local _, out = sh(cmd)
  local dt, mean = out:match("([%d.e-]+) ([%d.e+-]+)\n?$")
  if not dt then error("bench/torch_audio.py failed: " .. cmd .. "\n" .. out) end
  return tonumber(dt), tonumber(mean)
end

local n = audio_s * 16000
local i = rl.arange(n):double()
local x = (i * 0.0863):sin():mul(0.3) + (i * 0.5403):sin():mul(0.2):mul((i * 0.00071):sin())
  + (i * 2.7):sin():mul(0.05)
x = x:float():contiguous()
local cfg = {rate = 16000, n_mels = n_mels}
local feats = rl.audio.features(x, cfg)
local t0 = rl.clock()
rl.audio.features(x, cfg)
local one = rl.clock() - t0
local reps = math.max(1, math.floor(seconds / math.max(one, 1e-6) + 0.5))
local ours, theirs, treps, tmean = {}, {}, nil, nil
for r = 1, rounds do
  t0 = rl.clock()
  for _ = 1, reps do rl.audio.features(x, cfg) end
  ours[r] = (rl.clock() - t0) / reps
  if py then
    if not treps then
      local d = torch_round(1)
      treps = math.max(1, math.floor(seconds / math.max(d, 1e-6) + 0.5))
    end
    theirs[r], tmean = torch_round(treps)
  end
end
local mo, mt = median(ours), py and median(theirs)

print("### Speech features (rl.audio.features vs torchaudio.compliance.kaldi.fbank)")
print()
print(string.format("log-mel fbank, %d mels, 25/10 ms povey window, float32, %g s of 16 kHz " ..
  "audio, 1 thread on both sides, median of %d interleaved rounds of ~%.1f s%s.", n_mels, audio_s,
  rounds, seconds, py and "" or " (SKIP: torchaudio could not be set up)"))
print()
print("| | ms per call | s of audio per s | speed-up | mean of the features |")
print("|---|---:|---:|---:|---:|")
print(string.format("| rnnlua (FFTW) | %.2f | %.0f | | %.6g |", mo * 1e3, audio_s / mo,
  feats:double():mean()))
if py then
  print(string.format("| torchaudio | %.2f | %.0f | %.2fx | %.6g |", mt * 1e3, audio_s / mt,
    mt / mo, tmean))
end
print()
