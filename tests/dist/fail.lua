-- Run by tests/sh/test_dist.sh (and test_dist_hosts.sh) under `mpirun -np 2`: a 12AX training
-- in which rank 1 kills itself (arg[2] = "kill"), hangs (arg[2] = "hang"), stops itself with
-- SIGSTOP (arg[2] = "stop": a process that answers nothing and takes no CPU), raises a Lua error
-- (arg[2] = "error") or takes its network link down (arg[2] = "cut": `ip link set
-- $RL_TEST_CUT_LINK down` in its network namespace) in the middle of epoch 2. arg[1]: the
-- model prefix. The job must end with an error naming rank 1, leaving loadable checkpoints.
local model, how = assert(arg[1]), assert(arg[2])
local steps = 0
local function make_opt(params, grads)
  local inner = rl.optimizer({class = "adam"}, params, grads)
  return {step = function(_, lr)
            steps = steps + 1
            if rl.dist.rank() == 1 and steps == 12 then
              if how == "kill" then
                os.execute("kill -9 $PPID") -- the shell's parent: this rank
              elseif how == "stop" then
                os.execute("kill -STOP $PPID")
              elseif how == "cut" then
                assert(os.execute("ip link set " .. assert(os.getenv("RL_TEST_CUT_LINK")) .. " down"))
              elseif how == "error" then
                error("a Lua error on rank 1 only")
              else
                local t0 = rl.clock()
                while rl.clock() - t0 < 60 do end
              end
            end
            return inner:step(lr)
          end,
          state = function() return inner:state() end,
          load_state = function(_, st) return inner:load_state(st) end}
end
rl.train({
  network = {fw = {class = "lstm", n_out = 16},
             output = {class = "softmax", from = {"fw"}, loss = "ce", target = "classes"}},
  train = {class = "12ax", num_seqs = 160, seed = 1, max_len = 40},
  num_epochs = 3, batch_size = 400, max_seqs = 10, optimizer = make_opt, learning_rate = 0.01,
  model = model, log_verbosity = 1, seed = 1, distributed = {timeout = 3},
}, {}) -- the script's arguments (the model, how to fail) are its own
