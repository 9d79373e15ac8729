-- The signatures of the rl functions, in one table: help(x) / ?x at the REPL shows an entry, and
-- docs/repl.md's function reference is M.markdown() (tests/lua/test_help.lua fails when the two
-- differ, and when a public rl function has no entry here).
--
-- Each entry: {name, signature, what it does in one or two lines}; sections keep the order
-- of the reference.
local M = {}

M.sections = {
  {"Tensors", {
    {"rl.tensor", "rl.tensor(data [, dtype])", "A CPU tensor from nested tables of numbers (or a "
      .. "number); dtype \"float32\" (default), \"float64\" or \"int32\"."},
    {"rl.zeros", "rl.zeros(d1, d2, ... | {shape} [, dtype])", "A tensor of zeros."},
    {"rl.ones", "rl.ones(d1, d2, ... | {shape} [, dtype])", "A tensor of ones."},
    {"rl.empty", "rl.empty(d1, d2, ... | {shape} [, dtype])", "A tensor whose values are not set."},
    {"rl.full", "rl.full(shape, value [, opts])", "A tensor of `value`."},
    {"rl.arange", "rl.arange(stop) | rl.arange(start, stop [, step]) [, opts]",
      "start, start + step, ... below stop."},
    {"rl.rand", "rl.rand(d1, d2, ... | {shape} [, dtype])",
      "Uniform [0, 1) values from the seeded generator."},
    {"rl.randn", "rl.randn(d1, d2, ... | {shape} [, dtype])",
      "Standard normal values from the seeded generator."},
    {"rl.is_tensor", "rl.is_tensor(x) -> boolean", "Whether x is a tensor."},
    {"rl.cat", "rl.cat({t1, t2, ...} [, dim])", "Concatenation along dim (1-based, default 1)."},
    {"rl.matmul", "rl.matmul(a, b [, out])", "The matrix product a b."},
    {"rl.gemm", "rl.gemm(a, b, {trans_a =, trans_b =, alpha =, beta =, out =}) -> out",
      "out = alpha op(a) op(b) + beta out."},
    {"rl.storage_bytes", "rl.storage_bytes() -> bytes",
      "Bytes of tensor storage alive now, all tensors together (leak checks)."},
  }},
  {"Element-wise math", {
    {"rl.abs", "rl.abs(t)", "|t|, element-wise (new tensor)."},
    {"rl.add", "rl.add(a, b)", "a + b with broadcasting."},
    {"rl.sub", "rl.sub(a, b)", "a - b with broadcasting."},
    {"rl.mul", "rl.mul(a, b)", "a * b with broadcasting."},
    {"rl.div", "rl.div(a, b)", "a / b with broadcasting."},
    {"rl.pow", "rl.pow(a, b)", "a ^ b, element-wise."},
    {"rl.maximum", "rl.maximum(a, b)", "The larger of a and b, element-wise."},
    {"rl.minimum", "rl.minimum(a, b)", "The smaller of a and b, element-wise."},
    {"rl.clamp", "rl.clamp(t [, lo] [, hi])", "t limited to [lo, hi] (either bound may be nil)."},
    {"rl.eq", "rl.eq(a, b)", "1 where a == b, else 0."},
    {"rl.ne", "rl.ne(a, b)", "1 where a ~= b, else 0."},
    {"rl.lt", "rl.lt(a, b)", "1 where a < b, else 0."},
    {"rl.le", "rl.le(a, b)", "1 where a <= b, else 0."},
    {"rl.gt", "rl.gt(a, b)", "1 where a > b, else 0."},
    {"rl.ge", "rl.ge(a, b)", "1 where a >= b, else 0."},
    {"rl.neg", "rl.neg(t)", "-t."},
    {"rl.sign", "rl.sign(t)", "-1, 0 or 1 by the sign of t."},
    {"rl.exp", "rl.exp(t)", "e^t."},
    {"rl.expm1", "rl.expm1(t)", "e^t - 1, accurate near 0."},
    {"rl.log", "rl.log(t)", "The natural logarithm."},
    {"rl.log1p", "rl.log1p(t)", "log(1 + t), accurate near 0."},
    {"rl.sqrt", "rl.sqrt(t)", "The square root."},
    {"rl.rsqrt", "rl.rsqrt(t)", "1 / sqrt(t)."},
    {"rl.square", "rl.square(t)", "t * t."},
    {"rl.reciprocal", "rl.reciprocal(t)", "1 / t."},
    {"rl.sin", "rl.sin(t)", "The sine."},
    {"rl.cos", "rl.cos(t)", "The cosine."},
    {"rl.tanh", "rl.tanh(t)", "The hyperbolic tangent."},
    {"rl.sigmoid", "rl.sigmoid(t)", "1 / (1 + e^-t)."},
    {"rl.relu", "rl.relu(t)", "max(t, 0)."},
    {"rl.elu", "rl.elu(t [, alpha = 1])", "t for t > 0, alpha (e^t - 1) else."},
    {"rl.softplus", "rl.softplus(t)", "log(1 + e^t)."},
    {"rl.floor", "rl.floor(t)", "Rounded down."},
    {"rl.ceil", "rl.ceil(t)", "Rounded up."},
    {"rl.round", "rl.round(t)", "Rounded to the nearest integer."},
  }},
  {"Networks and training", {
    {"rl.network", "rl.network(description, extern_data [, {precision =}])",
      "A network from a RETURNN-style description (layer name -> {class =, from =, ...})."},
    {"rl.layers.register", "rl.layers.register(class, {...})", "A layer class written in Lua."},
    {"rl.train", "rl.train(config [, argv]) -> result",
      "The default training loop (every config key: docs/training.md)."},
    {"rl.forward", "rl.forward{model =, data =, layer = \"output\", output_file =, ...}",
      "RETURNN's forward task: a layer's output for a dataset, written as HDF5."},
    {"rl.search", "rl.search{model =, data =, output_file =, layer =, beam =, eos = 0, ...}",
      "Beam search over a rec layer with a choice layer."},
    {"rl.gradcheck", "rl.gradcheck{network =, extern_data =} | rl.gradcheck{layer =, in_dim =}",
      "Backward against central differences in float64: .passed, .max_rel_error."},
    {"rl.optimizer", "rl.optimizer(cfg, params, grads)",
      "An optimizer over a network's flat parameter and gradient buffers."},
    {"rl.lr_control", "rl.lr_control(cfg)", "The learning-rate control of rl.train."},
    {"rl.sample", "rl.sample{model =, prime =, length = 500, temperature = 1, seed =, layer =}",
      "Text from a character language model, one character at a time."},
    {"rl.manual_seed", "rl.manual_seed(seed)", "Seeds the global generator."},
    {"rl.get_rng_state", "rl.get_rng_state() -> state", "The global generator's state."},
    {"rl.set_rng_state", "rl.set_rng_state(state)", "Restores a state of get_rng_state."},
  }},
  {"Files and datasets", {
    {"rl.json_decode", "rl.json_decode(text [, name]) -> value", "JSON read by jansson into Lua "
      .. "values (objects as tables, null as rl.json_null); errors name `name`, the line and column."},
    {"rl.save", "rl.save(path, {name = tensor, ...})",
      "Tensors into an HDF5 file (written to a temporary file, then renamed)."},
    {"rl.load", "rl.load(path [, name])", "Every tensor of an HDF5 file, or the one named."},
    {"rl.save_checkpoint", "rl.save_checkpoint(path, {net =, optimizer =, lr_control =, epoch =, "
      .. "step =})", "A checkpoint file (layout: docs/datasets.md)."},
    {"rl.load_checkpoint", "rl.load_checkpoint(path) -> {description =, extern_data =, params =, "
      .. "...}", "What a checkpoint holds."},
    {"rl.h5file", "rl.h5file(path [, \"r\" | \"w\"])", "An HDF5 file to read or write by name."},
    {"rl.dataset", "rl.dataset(cfg)",
      "A dataset: {class = \"hdf\" | \"12ax\" | \"audio\" | ..., ...}."},
    {"rl.batches", "rl.batches(ds, {batch_size =, max_seqs =, chunking =})",
      "An iterator of padded batches of a dataset."},
    {"rl.hdf_writer", "rl.hdf_writer(path, {data_dim =, sparse =, targets =})",
      "Writes sequences one by one into an HDF dataset file."},
    {"rl.dataset_write", "rl.dataset_write(path, ds_or_seqs [, {epoch =, extern_data =}])",
      "A whole dataset (or a list of sequences) into an HDF dataset file."},
    {"rl.dataset_scan", "rl.dataset_scan(t) -> first_nan, first_inf | min, max",
      "A float tensor: the 1-based flat indices of its first NaN and infinity (nil when none); "
      .. "an int32 tensor: its min and max."},
    {"rl.check_dataset_dims", "rl.check_dataset_dims(ds, extern_data [, keys])",
      "Raises when a dataset's keys or dimensions do not match extern_data."},
  }},
  {"CTC and scoring", {
    {"rl.ctc_loss", "rl.ctc_loss(logits, targets, input_lengths, target_lengths [, {blank =, "
      .. "zero_infinity = false}]) -> loss, grad", "CTC loss (B) and its gradient (T, B, V)."},
    {"rl.ctc_decode", "rl.ctc_decode(logits, lengths [, {blank = V - 1, beam = 1, lm = {file =, "
      .. "weight =, bonus =, labels =, word_boundary =}}])",
      "Best path (beam = 1) or prefix beam search, with an n-gram or neural LM fused: one table "
      .. "of labels per sequence."},
    {"rl.ngram_estimate", "rl.ngram_estimate{sentences = {{tok, ...}, ...}, order =, output =, "
      .. "vocab =}", "An interpolated Witten-Bell n-gram LM written as an ARPA file."},
    {"rl.edit_distance", "rl.edit_distance(a, b) -> integer",
      "The Levenshtein distance of two label sequences."},
    {"rl.scorer", "rl.scorer{labels =, words =}", "Accumulates CER / WER / PER."},
    {"rl.ctc_score", "rl.ctc_score(net, dataset, {batch_size =, max_seqs =, layer =, beam =})",
      "A CTC model's error rates over a dataset."},
  }},
  {"Attention kernels", {
    {"rl.attention_forward", "rl.attention_forward(kind, e, len, q, pre, v, alpha, ctx [, who])",
      "One attention step's forward (the attention layer's kernel)."},
    {"rl.attention_backward", "rl.attention_backward(kind, e, len, q, pre, v, alpha, dctx, ds, de, "
      .. "dq, dpre, dv [, who])", "Its backward."},
  }},
  {"Devices, threads and the host", {
    {"rl.cuda_built", "rl.cuda_built() -> boolean", "Whether this build has CUDA."},
    {"rl.cuda_available", "rl.cuda_available() -> boolean", "Whether a CUDA device can be used."},
    {"rl.device_count", "rl.device_count() -> n", "The number of CUDA devices."},
    {"rl.synchronize", "rl.synchronize()", "Waits for the device's queued work."},
    {"rl.cpu_level", "rl.cpu_level([name]) -> in_use, best",
      "The CPU kernel level in use and the best this CPU supports; with a name, selects it."},
    {"rl.blas_core", "rl.blas_core() -> in_use, found",
      "OpenBLAS's kernels in use and the ones it chose itself (replaced where below the CPU's)."},
    {"rl.set_num_threads", "rl.set_num_threads(n)", "The CPU threads of kernels and BLAS."},
    {"rl.get_num_threads", "rl.get_num_threads() -> n", "Their number."},
    {"rl.isatty", "rl.isatty(fd) -> boolean", "Whether the file descriptor is a terminal."},
    {"rl.clock", "rl.clock() -> seconds", "A monotonic wall clock."},
  }},
  {"Distributed training", {
    {"rl.dist.rank", "rl.dist.rank() -> r", "This process's rank (0-based)."},
    {"rl.dist.size", "rl.dist.size() -> n", "The number of ranks."},
    {"rl.dist.local_rank", "rl.dist.local_rank() -> r", "The rank among those of this host."},
    {"rl.dist.active", "rl.dist.active() -> boolean",
      "Whether an MPI launcher started this process and it joined its world."},
    {"rl.dist.built", "rl.dist.built() -> boolean", "Whether this build has MPI."},
    {"rl.dist.allreduce", "rl.dist.allreduce(t)", "t summed over all ranks, in place."},
    {"rl.dist.broadcast", "rl.dist.broadcast(t, root)", "t from rank root, in place."},
    {"rl.dist.barrier", "rl.dist.barrier()", "Waits for every rank."},
    {"rl.dist.timeout", "rl.dist.timeout() -> seconds", "The collectives' timeout."},
    {"rl.dist.set_timeout", "rl.dist.set_timeout(seconds)", "Sets it (RL_DIST_TIMEOUT)."},
    {"rl.dist.broken", "rl.dist.broken() -> boolean",
      "Whether a collective failed (the world cannot be used any more)."},
    {"rl.dist.set_broken", "rl.dist.set_broken()",
      "This rank left the common sequence of collectives: its later ones fail at once."},
  }},
}

-- name -> entry
M.by_name = {}
for _, sec in ipairs(M.sections) do
  for _, e in ipairs(sec[2]) do M.by_name[e[1]] = e end
end

-- The reference in Markdown, as docs/repl.md holds it between its markers.
function M.markdown()
  local out = {}
  for _, sec in ipairs(M.sections) do
    out[#out + 1] = "#### " .. sec[1] .. "\n\n| function | what it does |\n|---|---|"
    for _, e in ipairs(sec[2]) do
      out[#out + 1] = string.format("| `%s` | %s |", e[2]:gsub("|", "\\|"), e[3])
    end
    out[#out + 1] = ""
  end
  return table.concat(out, "\n")
end

-- The name under which `v` is reachable from rl (rl.x, rl.dist.x), or nil.
function M.name_of(v, rl)
  for k, x in pairs(rl) do
    if x == v and type(k) == "string" then return "rl." .. k end
  end
  for _, sub in ipairs({"dist", "layers"}) do
    for k, x in pairs(rl[sub] or {}) do
      if x == v and type(k) == "string" then return "rl." .. sub .. "." .. k end
    end
  end
  return nil
end

return M
