-- The attention layer of a rec unit: {class = "attention", base = "base:enc", from = "s",
-- kind = "dot" | "additive", n_att = A (additive only)}. Once per step it scores every frame of
-- the encoder (the whole base sequence) against the query (this step's `from`), normalises
-- the scores over each sequence's own frames (padded encoder frames get weight 0) and gives
-- the weighted sum of the encoder frames, the context vector.
--
--   query q (B, D), encoder e (Te, B, E) with lengths len (B), step t:
--   dot (Luong):         s[b, j] = e[j, b] . q[b]                      (needs D = E)
--   additive (Bahdanau): s[b, j] = v . tanh(e[j, b] W_e + q[b] W_q)    W_e (E, A), W_q (D, A), v (A)
--   alpha[b, :] = softmax(s[b, :]) over j < len[b], 0 beyond;  ctx[b] = sum_j alpha[b, j] e[j, b]
--
-- The step math (scores, masked softmax, context, and their gradients) is one C kernel per
-- step and direction (kernels/attention.h through rl.attention_forward/backward); the GEMMs
-- around it stay here: pre = e W_e once per forward, hq = q W_q per step, and after the
-- backward steps the weight gradients (W_q's over all steps in one product) and de += dpre W_e^T.
--
-- Buffers, sized once per batch shape (start): e (Te, B, E) the encoder as given (contiguous),
-- pre and dpre (Te, B, A), alpha (S, B, Te) the weights of every step (kept for backward and
-- readable with rec:attention_weights(name)), hq and dhq (S, B, A) and qs (S, B, D) the
-- projected queries, their gradients and the queries of every step (additive), de (Te, B, E)
-- and dv (B, A) gradients accumulated over the steps of a backward, ds (B, Te) and dq (B, D)
-- per-step scratch. Backward at step t recomputes tanh(pre + hq) inside the kernel rather than
-- keeping it (S x B x Te x A floats).
local M = {}

local rl = require("rnnlua") -- the module table (init.lua registers it before loading its parts)

local Attention = {}
Attention.__index = Attention

local fail = require("rnnlua.util").fail

-- where: "layer 'dec' (rec), unit layer 'att'" for messages; q_dim: the query's dim;
-- e_dim: the encoder's dim.
function M.new(where, desc, q_dim, e_dim, dtype)
  local kind = desc.kind or "dot"
  if kind ~= "dot" and kind ~= "additive" then
    fail("%s (attention): kind must be \"dot\" or \"additive\", got %s", where, tostring(kind))
  end
  local self = setmetatable({where = where, kind = kind, dtype = dtype, q_dim = q_dim,
    n_out = e_dim, specs = {}, params = {}, grads = {}}, Attention)
  if kind == "dot" and q_dim ~= e_dim then
    fail("%s (attention): kind = \"dot\" needs the query's dim (%d) to equal the encoder's (%d); "
      .. "use kind = \"additive\" or a linear layer in between", where, q_dim, e_dim)
  end
  if kind == "additive" then
    local A = desc.n_att or e_dim
    if math.type(A) ~= "integer" or A < 1 then
      fail("%s (attention): n_att must be a positive integer", where)
    end
    self.specs = {
      {name = "W_e", shape = {e_dim, A}, init = "glorot"},
      {name = "W_q", shape = {q_dim, A}, init = "glorot"},
      {name = "v", shape = {A, 1}, init = "glorot"},
    }
    self.A = A
  end
  return self
end

-- The options this class reads (besides the network's own keys).
M.options = {kind = true, base = true, n_att = true}

function Attention:param_specs() return self.specs end

-- buf when it has this shape, else a new zeroed one.
local function ensure(buf, dtype, dev, ...)
  local shape = {...}
  if buf and buf:dim() == #shape and buf:device() == dev then
    local same = true
    for i, n in ipairs(shape) do if buf:size(i) ~= n then same = false end end
    if same then return buf end
  end
  return rl.zeros(shape, dtype, dev)
end

-- e (Te, B, E) and its lengths (B, int32 on the CPU), for the S steps of a forward.
function Attention:start(e, len, S)
  if not e:is_contiguous() then e = e:contiguous() end
  local Te, B, E = e:size(1), e:size(2), e:size(3)
  local dev, dt = e:device(), self.dtype
  if B > 0 and (len:min() < 0 or len:max() > Te) then
    fail("%s (attention): encoder lengths must lie in 0..%d (its frames), got %d..%d", self.where,
      Te, len:min(), len:max())
  end
  self.e, self.Te, self.B, self.S = e, Te, B, S
  self.len = dev == "cpu" and len or len:to(dev)
  local Sa = math.max(S, self.alpha and self.alpha:size(1) or 0)
  self.alpha = ensure(self.alpha, dt, dev, Sa, B, Te)
  self.de = ensure(self.de, dt, dev, Te, B, E)
  self.ds = ensure(self.ds, dt, dev, B, Te)
  self.dq = ensure(self.dq, dt, dev, B, self.q_dim)
  if self.kind == "additive" then
    local A = self.A
    self.pre = ensure(self.pre, dt, dev, Te, B, A)
    self.dpre = ensure(self.dpre, dt, dev, Te, B, A)
    self.hq = ensure(self.hq, dt, dev, Sa, B, A)
    self.dhq = ensure(self.dhq, dt, dev, Sa, B, A)
    self.qs = ensure(self.qs, dt, dev, Sa, B, self.q_dim)
    self.dv = ensure(self.dv, dt, dev, B, A)
    rl.matmul(e:view(Te * B, E), self.params.W_e, self.pre:view(Te * B, A))
  end
end

-- Step t (1-based): q (B, D) -> ctx (B, E), written into out (B, E) when given; alpha[t] keeps
-- the weights.
function Attention:forward_step(t, q, out)
  if not q:is_contiguous() then q = q:contiguous() end
  local ctx = out or rl.empty({self.B, self.n_out}, self.dtype, self.e:device())
  if self.kind == "dot" then
    rl.attention_forward("dot", self.e, self.len, q, nil, nil, self.alpha[t], ctx, self.where)
    return ctx
  end
  local hq = self.hq[t]
  rl.matmul(q, self.params.W_q, hq)
  self.qs[t]:copy_(q)
  rl.attention_forward("additive", self.e, self.len, hq, self.pre, self.params.v, self.alpha[t],
    ctx, self.where)
  return ctx
end

function Attention:zero_grad_acc()
  self.de:zero_()
  if self.dpre then
    self.dpre:zero_()
    self.dv:zero_()
  end
end

-- Step t: dctx (B, E), q (B, D) -> dq (B, D) (a buffer the next step overwrites); encoder and
-- parameter gradients accumulate.
function Attention:backward_step(t, q, dctx)
  if not dctx:is_contiguous() then dctx = dctx:contiguous() end
  if self.kind == "dot" then
    if not q:is_contiguous() then q = q:contiguous() end
    rl.attention_backward("dot", self.e, self.len, q, nil, nil, self.alpha[t], dctx, self.ds,
      self.de, self.dq, nil, nil, self.where)
    return self.dq
  end
  local dhq = self.dhq[t]
  rl.attention_backward("additive", self.e, self.len, self.hq[t], self.pre, self.params.v,
    self.alpha[t], dctx, self.ds, self.de, dhq, self.dpre, self.dv, self.where)
  return rl.gemm(dhq, self.params.W_q, {trans_b = true, out = self.dq})
end

-- After the last step of a backward: de (Te, B, E) += the encoder's gradient.
function Attention:finish_backward(de)
  local B, Te, S = self.B, self.Te, self.S
  if self.kind == "additive" then
    local E, A, D = self.n_out, self.A, self.q_dim
    local ef, dpf = self.e:view(Te * B, E), self.dpre:view(Te * B, A)
    rl.gemm(ef, dpf, {trans_a = true, beta = 1, out = self.grads.W_e})
    rl.gemm(dpf, self.params.W_e, {trans_b = true, beta = 1, out = self.de:view(Te * B, E)})
    rl.gemm(self.qs:narrow(1, 1, S):view(S * B, D), self.dhq:narrow(1, 1, S):view(S * B, A),
      {trans_a = true, beta = 1, out = self.grads.W_q})
    self.grads.v:add_(self.dv:sum(1):view(A, 1))
  end
  de:add_(self.de)
end

return M
