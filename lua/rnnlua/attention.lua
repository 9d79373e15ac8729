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
-- Buffers, sized once per batch shape (start): eb (B, Te, E) the encoder batch-major,
-- pre (B, Te, A) = eb W_e (additive), mask (B, Te), alpha (S, B, Te) the weights of every step
-- (kept for backward and readable with rec:attention_weights(name)), deb (B, Te, E) and dpre
-- (B, Te, A) the gradients accumulated over the steps of a backward. Backward at step t
-- recomputes tanh(pre + q W_q) rather than keeping it (S x B x Te x A floats).
local M = {}

local rl -- the module table, set by install

local Attention = {}
Attention.__index = Attention

local function fail(fmt, ...)
  error(string.format(fmt, ...), 0)
end

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

-- e (Te, B, E) and its lengths, for the S steps of a forward.
function Attention:start(e, len, S)
  local Te, B, E = e:size(1), e:size(2), e:size(3)
  local dev = e:device()
  self.e, self.len, self.Te, self.B = e, len, Te, B
  local shape_ok = self.eb and self.eb:size(1) == B and self.eb:size(2) == Te
  if not shape_ok then
    self.eb = rl.zeros({B, Te, E}, self.dtype, dev)
    self.deb = rl.zeros({B, Te, E}, self.dtype, dev)
    local j = rl.arange(Te, self.dtype):view(1, Te)
    self.mask = rl.lt(j, len:to(self.dtype):view(B, 1))
    if self.kind == "additive" then
      self.pre = rl.zeros({B, Te, self.A}, self.dtype, dev)
      self.dpre = rl.zeros({B, Te, self.A}, self.dtype, dev)
    end
  else
    local j = rl.arange(Te, self.dtype):view(1, Te)
    self.mask:copy_(rl.lt(j, len:to(self.dtype):view(B, 1)))
  end
  self.negmask = (self.mask - 1) * 1e30
  if not self.alpha or self.alpha:size(1) < S or self.alpha:size(2) ~= B
      or self.alpha:size(3) ~= Te then
    self.alpha = rl.zeros({S, B, Te}, self.dtype, dev)
  end
  self.S = S
  self.eb:copy_(e:transpose(1, 2))
  if self.kind == "additive" then
    rl.matmul(self.eb:view(B * Te, E), self.params.W_e, self.pre:view(B * Te, self.A))
  end
end

-- The scores s (B, Te) of query q (B, D); z (B, Te, A): the tanh activations (additive).
function Attention:scores(q)
  local B, Te = self.B, self.Te
  if self.kind == "dot" then
    return rl.matmul(self.eb, q:contiguous():view(B, self.q_dim, 1)):view(B, Te)
  end
  local hq = rl.matmul(q, self.params.W_q)
  local z = (self.pre + hq:view(B, 1, self.A)):tanh_()
  return rl.matmul(z:view(B * Te, self.A), self.params.v):view(B, Te), z
end

-- Step t (1-based): q (B, D) -> ctx (B, E); alpha[t] keeps the weights.
function Attention:forward_step(t, q)
  local s = self:scores(q)
  s:mul_(self.mask):add_(self.negmask)
  local m = s:max(2)
  local a = (s - m:view(self.B, 1)):exp_():mul_(self.mask)
  a:div_(a:sum(2, true))
  self.alpha[t]:copy_(a)
  return rl.matmul(a:view(self.B, 1, self.Te), self.eb):view(self.B, self.n_out)
end

function Attention:zero_grad_acc()
  self.deb:zero_()
  if self.dpre then self.dpre:zero_() end
end

-- Step t: dctx (B, E), q (B, D) -> dq (B, D); encoder and parameter gradients accumulate.
function Attention:backward_step(t, q, dctx)
  local B, Te = self.B, self.Te
  local a = self.alpha[t]
  local dalpha = rl.matmul(self.eb, dctx:contiguous():view(B, self.n_out, 1)):view(B, Te)
  self.deb:add_(a:view(B, Te, 1) * dctx:view(B, 1, self.n_out))
  local ds = a * (dalpha - (a * dalpha):sum(2, true))
  if self.kind == "dot" then
    self.deb:add_(ds:view(B, Te, 1) * q:view(B, 1, self.q_dim))
    return rl.matmul(ds:view(B, 1, Te), self.eb):view(B, self.q_dim)
  end
  local _, z = self:scores(q)
  local A = self.A
  local zf = z:view(B * Te, A)
  self.grads.v:add_(rl.matmul(zf:t(), ds:view(B * Te, 1)))
  local dzpre = (1 - z * z):mul_(ds:view(B, Te, 1)):mul_(self.params.v:view(1, 1, A))
  self.dpre:add_(dzpre)
  local dhq = dzpre:sum(2):view(B, A)
  self.grads.W_q:add_(rl.matmul(q:t(), dhq))
  return rl.matmul(dhq, self.params.W_q:t())
end

-- After the last step of a backward: de (Te, B, E) += the encoder's gradient.
function Attention:finish_backward(de)
  local B, Te = self.B, self.Te
  if self.kind == "additive" then
    local E, A = self.n_out, self.A
    self.grads.W_e:add_(rl.matmul(self.eb:view(B * Te, E):t(), self.dpre:view(B * Te, A)))
    self.deb:add_(rl.matmul(self.dpre:view(B * Te, A), self.params.W_e:t()):view(B, Te, E))
  end
  de:add_(self.deb:transpose(1, 2))
end

function M.install(module)
  rl = module
  return M
end

return M
