-- A float32 lstm's and gru's step of many rows (33 x 512: a batch of streams pushed together, whose
-- products are split over the threads): outputs and final states have the same bits on 1 and 2
-- threads, with ragged lengths (padded rows carry their state through) and an initial state, in
-- both directions.
local H = dofile("tests/lua/harness.lua")

local function same_bits(class)
  local threads = rl.get_num_threads()
  local T, B, F, N = 3, 33, 8, 512
  rl.manual_seed(21)
  local x, len = rl.randn(T, B, F), rl.full({B}, T, "int32")
  for b = 1, B, 4 do len[b] = 1 + b % T end
  local h0, c0 = rl.randn(B, N), rl.randn(B, N)
  for _, dir in ipairs({1, -1}) do
    local res = {}
    for n = 1, 2 do
      rl.set_num_threads(n)
      rl.manual_seed(22)
      local net = rl.network({output = {class = class, n_out = N, from = "data", direction = dir,
        is_output_layer = true}}, {data = {dim = F}})
      local l = net:layer("output").object
      if class == "lstm" then l:set_initial_state(h0, c0) else l:set_initial_state(h0) end
      net:forward{data = x, lengths = len}
      local h, c = l:final_state()
      res[n] = {net:layer("output").output:clone(), h:clone(), c and c:clone()}
    end
    for k, what in ipairs({"outputs", "final h", "final c"}) do
      if res[1][k] then
        H.check(res[1][k]:abs():max() > 0, what .. " are all zero")
        H.check((res[1][k] - res[2][k]):abs():max() == 0,
          string.format("%s, direction %d: %s differ between 1 and 2 threads", class, dir, what))
      end
    end
  end
  rl.set_num_threads(threads)
end

H.test("float32 lstm, 33 rows x 512 units: the same bits on 1 and 2 threads", function()
  same_bits("lstm")
end)

H.test("float32 gru, 33 rows x 512 units: the same bits on 1 and 2 threads", function()
  same_bits("gru")
end)

H.done()
