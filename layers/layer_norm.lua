-- layer_norm: a layer written in Lua, registered at start-up as class "layer_norm"; it shows
-- the way for Lua layers (the contract is at the top of lua/rnnlua/layers.lua).
--
-- Normalises each frame over the feature dim F, with a learnable gain g and bias b (F):
--   mu = mean_f x,  var = mean_f (x - mu)^2,  rstd = 1 / sqrt(var + epsilon)
--   xhat = (x - mu) * rstd,  y = (g * xhat + b) * mask          (T, B, F)
-- mask is 1 on valid frames and 0 on padding, so padded frames give 0 and never reach g, b.
-- backward, with dy masked and dxhat = dy * g:
--   dg += sum_{t,b} dy * xhat,  db += sum_{t,b} dy
--   dx  = rstd * (dxhat - mean_f dxhat - xhat * mean_f (dxhat * xhat))
-- forward keeps xhat, rstd and mask for backward.
--
-- Options: epsilon (default 1e-5); n_out, when given, must equal the input dim. One input.
local LayerNorm = {}

function LayerNorm:init(opts, in_dims)
  if #in_dims ~= 1 then error(string.format("takes one input, got %d", #in_dims), 0) end
  local F = in_dims[1]
  if opts.n_out ~= nil and opts.n_out ~= F then
    error(string.format("n_out = %s differs from the input dim %d", tostring(opts.n_out), F), 0)
  end
  self.epsilon = opts.epsilon or 1e-5
  if type(self.epsilon) ~= "number" or self.epsilon <= 0 then
    error("option epsilon must be a positive number", 0)
  end
  return F
end

function LayerNorm:params()
  local F = self.in_dims[1]
  return {
    {name = "g", shape = {F}, init = "ones"},
    {name = "b", shape = {F}, init = "zeros"},
  }
end

function LayerNorm:forward(inputs, lengths, train)
  local x = inputs[1]
  local xc = x - x:mean(3, true)
  self.rstd = ((xc * xc):mean(3, true) + self.epsilon):rsqrt() -- (T, B, 1)
  self.xhat = xc * self.rstd                                   -- (T, B, F)
  self.mask = self:frame_mask(lengths, x:size(1))              -- (T, B, 1)
  return (self.xhat * self.params.g + self.params.b) * self.mask
end

function LayerNorm:backward(grad_out, inputs, lengths)
  local dy, xhat = grad_out * self.mask, self.xhat
  self.grads.g:add_((dy * xhat):sum(1):sum(1))
  self.grads.b:add_(dy:sum(1):sum(1))
  local dxhat = dy * self.params.g
  local dx = (dxhat - dxhat:mean(3, true) - xhat * (dxhat * xhat):mean(3, true)) * self.rstd
  return {dx}
end

return LayerNorm
