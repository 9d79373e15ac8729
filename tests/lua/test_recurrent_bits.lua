-- The lstm and gru without the options n_proj and layer_norm compute what the code before those
-- options computed: tests/data/make_recurrent_bits_ref.lua, run by such an rnnlua, wrote
-- tests/data/recurrent_bits_ref.lua (the loss, parameters and gradients, as hexadecimal floats,
-- of a checkpoint of that time and of seeded bidirectional lstm and gru networks, in float32 and
-- float64); the same script is run here. On the machine that wrote the file the text is the same
-- bit for bit; another CPU (another BLAS kernel, another level of kernels/cpu/) rounds
-- differently, so the numbers are then compared within rounding: 1e-12 (float64) or 1e-4
-- (float32) of each vector's largest magnitude.
local H = dofile("tests/lua/harness.lua")

local function run_script(path)
  local parts = {}
  local real = io.write
  io.write = function(...) -- the script writes its fixture with io.write
    for _, s in ipairs{...} do parts[#parts + 1] = tostring(s) end
  end
  local ok, err = pcall(dofile, path)
  io.write = real
  if not ok then error(err, 0) end
  return table.concat(parts)
end

H.test("options off: the lstm and gru numbers of the code before n_proj and layer_norm", function()
  local f = assert(io.open("tests/data/recurrent_bits_ref.lua"))
  local want = f:read("a")
  f:close()
  local got = run_script("tests/data/make_recurrent_bits_ref.lua")
  if got == want then return end
  local a, b = load(want)(), load(got)()
  for _, net in ipairs{"checkpoint_v1", "lstm_pair", "gru_pair"} do
    for dt, tol in pairs{float32 = 1e-4, float64 = 1e-12} do
      local case = net .. "_" .. dt
      H.near(b[case].loss, a[case].loss, tol * math.abs(a[case].loss), case .. ": the loss")
      for _, k in ipairs{"params", "grads"} do
        local scale, err = 0, 0
        for i, v in ipairs(a[case][k]) do
          scale = math.max(scale, math.abs(v))
          err = math.max(err, math.abs(b[case][k][i] - v))
        end
        H.check(#b[case][k] == #a[case][k] and err <= tol * scale,
          string.format("%s: %s differ by %.3g (largest %.3g)", case, k, err, scale))
      end
    end
  end
end)

H.done()
