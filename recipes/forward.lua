-- RETURNN's forward and search tasks from a recipe's command line: the same as the subcommands
-- `rnnlua forward ...` and `rnnlua search ...` (lua/rnnlua/tools.lua), which this calls.
--
--   rnnlua recipes/forward.lua ++model out/12ax/net.008.h5 ++data dev.h5 ++layer output \
--          ++output fwd.h5
--   rnnlua recipes/forward.lua ++search ++model out/g2p/net.h5 ++data test.h5 ++output hyp.h5
--   rnnlua recipes/forward.lua --help
local argv, search = {}, false
for i = 1, #arg do
  if arg[i] == "++search" then search = true else argv[#argv + 1] = arg[i] end
end
local status = rl.tools.main(search and "search" or "forward", argv)
if status ~= 0 then os.exit(status, true) end
