-- OpenBLAS's kernels (core/blas.c, rl.blas_core): where OpenBLAS chose kernels older than AVX
-- on a CPU with AVX (a CPU model it does not know gets its generic "Prescott" kernels), rnnlua
-- runs it again with its AVX ("Sandybridge") ones; a user's OPENBLAS_CORETYPE and a lowered
-- RL_CPU_LEVEL are followed. Each case runs in its own process, since the kernels are chosen
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

if dynamic and (level == "avx512" or level == "avx2") then
  H.test("the kernels in use have AVX at the CPU level " .. level, function()
    local u, f, env_after = cores()
    H.check(AVX[u], string.format("OpenBLAS runs %s (it chose %s) at the CPU level %s", u, f, level))
    H.check(u == f or u == "Sandybridge", "replaced " .. f .. " by " .. u)
    H.check(env_after == "nil", "OPENBLAS_CORETYPE left set to " .. env_after)
  end)
  H.test("RL_CPU_LEVEL=avx2 too", function()
    local u, f = cores("RL_CPU_LEVEL=avx2")
    H.check(AVX[u] and (u == f or u == "Sandybridge"), string.format("runs %s (OpenBLAS chose %s)", u, f))
  end)
  H.test("RL_CPU_LEVEL=generic keeps OpenBLAS's own choice", function()
    local u, f = cores("RL_CPU_LEVEL=generic")
    H.check(u == f, "replaced " .. f .. " by " .. u)
  end)
  H.test("the user's OPENBLAS_CORETYPE is followed", function()
    local u = cores("OPENBLAS_CORETYPE=Haswell")
    H.check(u == "Haswell", "OPENBLAS_CORETYPE=Haswell but " .. u .. " in use")
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
