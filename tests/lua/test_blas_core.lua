-- OpenBLAS's kernels (core/blas.c, rl.blas_core): at the avx2 and avx512 levels (float32 products
-- then run rnnlua's own kernels, float64 ones OpenBLAS's) rnnlua has OpenBLAS run its AVX2
-- ("Haswell") kernels unless it chose Haswell or Zen itself; at the generic level its AVX
-- ("Sandybridge") ones where it chose AVX2 or AVX-512 ones, else its own choice; a user's
-- OPENBLAS_CORETYPE is followed. Each case runs in its own process, since the kernels are chosen
-- once. (That the kernels in use give a row the same bits at any row count is test_blas.c's.)
local H = dofile("tests/lua/harness.lua")

local exe = arg[-1]
local AVX = {Sandybridge = true, Haswell = true, Zen = true, SkylakeX = true, Cooperlake = true,
  SapphireRapids = true, Bulldozer = true, Piledriver = true, Steamroller = true, Excavator = true}

-- in_use, found of a fresh process with ENV (a shell prefix), after one product
local function cores(env)
  local cmd = string.format("%s %q -e %q 2>&1", env or "", exe,
    "rl.tensor({{1, 2}}, 'float32'):matmul(rl.tensor({{3}, {4}}, 'float32'))" ..
    " local u, f = rl.blas_core() io.write(u, ' ', f, ' ', tostring(os.getenv('OPENBLAS_CORETYPE')))")
  local p = io.popen(cmd)
  local out = p:read("a")
  p:close()
  local u, f, env_after = out:match("^(%S+) (%S+) (%S+)$")
  H.check(u, "unexpected output of " .. cmd .. ": " .. out)
  return u, f, env_after
end

local level = rl.cpu_level() -- in use: RL_CPU_LEVEL may have lowered it for the whole run
local in_use, found = rl.blas_core()
local dynamic = in_use ~= "BLIS" and (AVX[found] or in_use ~= found or found == "Prescott" or
  found == "Nehalem" or found == "Core2")

H.test("rl.blas_core names the kernels", function()
  H.check(type(in_use) == "string" and in_use ~= "", "in_use: " .. tostring(in_use))
  H.check(type(found) == "string" and found ~= "", "found: " .. tostring(found))
end)

-- what rnnlua should run, OpenBLAS having chosen `found`, at the CPU level `lv`
local function expected(found_core, lv)
  if lv == "avx512" or lv == "avx2" then
    return (found_core == "Haswell" or found_core == "Zen") and found_core or "Haswell"
  end
  return (AVX[found_core] and found_core ~= "Sandybridge") and "Sandybridge" or found_core
end

if dynamic and (level == "avx512" or level == "avx2") then
  H.test("the kernels in use at the CPU level " .. level, function()
    local u, f, env_after = cores()
    H.check(u == expected(f, level), string.format("OpenBLAS runs %s (it chose %s) at the CPU level %s", u, f, level))
    H.check(env_after == "nil", "OPENBLAS_CORETYPE left set to " .. env_after)
  end)
  H.test("RL_CPU_LEVEL=avx2 too", function()
    local u, f = cores("RL_CPU_LEVEL=avx2")
    H.check(u == expected(f, "avx2"), string.format("runs %s (OpenBLAS chose %s)", u, f))
  end)
  H.test("RL_CPU_LEVEL=generic", function()
    local u, f = cores("RL_CPU_LEVEL=generic")
    H.check(u == expected(f, "generic"), string.format("runs %s (OpenBLAS chose %s)", u, f))
  end)
  H.test("the user's OPENBLAS_CORETYPE is followed", function()
    local u = cores("OPENBLAS_CORETYPE=SkylakeX")
    H.check(u == "SkylakeX", "OPENBLAS_CORETYPE=SkylakeX but " .. u .. " in use")
  end)
end

H.test("products are right after the choice", function()
  local a = rl.randn({37, 53}, "float64")
  local b = rl.randn({53, 29}, "float64")
  local ref = a:matmul(b)
  local got = a:float():matmul(b:float()):double()
  local err = (got - ref):abs():max()
  H.check(err < 1e-4, "float32 product off by " .. err)
end)

H.done()
