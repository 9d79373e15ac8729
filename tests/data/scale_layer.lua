-- A Lua layer class for the tests of models with Lua layers (test_serve.sh, test_cli_train.sh):
-- "scale" multiplies its input by the option k (default 2); no parameters.
rl.layers.register("scale", {
  init = function(self, opts, in_dims) self.k = opts.k or 2; return in_dims[1] end,
  params = function(self) return {} end,
  forward = function(self, inputs, lengths, train) return inputs[1] * self.k end,
  backward = function(self, grad_out, inputs, lengths) return {grad_out * self.k} end,
})
