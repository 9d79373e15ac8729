-- Every rl.train config key with its type, its default as the manual writes it, and one line of
-- help: what `rnnlua train --help KEY` (and a recipe's, and rl.train's own argv) prints.
-- docs/training.md has a `| `KEY` | DEFAULT | ... |` row for each, with the same default
-- (tests/lua/test_docs.lua compares both ways, and this list with the keys rl.train and
-- rl.lr_control accept). The defaults themselves live in the code that applies them
-- (lua/rnnlua/engine.lua, lua/rnnlua/lr_control.lua); here they are text for people.
local M = {}

-- {key, type, default, help}
M.list = {
  {"network", "table", "(required)", "the layer descriptions (docs/layers.md)"},
  {"extern_data", "table", "the train dataset's",
    "{key = {dim =, sparse =, spatial =, labels =}}: the data keys and their sizes"},
  {"train", "table", "(required)", "a dataset config or object (docs/datasets.md)"},
  {"dev", "table", "none", "the same, scored after every epoch without dropout"},
  {"num_epochs", "integer", "1", "epochs to train (the last epoch number)"},
  {"batch_size", "integer", "5000", "frames of a batch, padding included (max T x B)"},
  {"max_seqs", "integer", "40", "sequences of a batch"},
  {"chunking", "string", "none", "\"size:step\" or \"size\": cut sequences into chunks"},
  {"carry_state", "boolean", "false", "carry the LSTM/GRU state from chunk to chunk"},
  {"optimizer", "table | function", "{class = \"adam\"}",
    "a config for rl.optimizer, an optimizer object or a function (params, grads, net)"},
  {"learning_rate", "number", "1e-3", "the initial learning rate"},
  {"learning_rate_control", "string | function", "\"constant\"",
    "constant, newbob (newbob_rel), newbob_abs, newbob_multi_epoch, cosine, noam, one_cycle, "
    .. "or a function (epoch, step, scores) -> lr"},
  {"lr_control", "table", "none",
    "an object with lr/epoch_done/state/load_state instead of the learning-rate keys"},
  {"learning_rate_control_error_measure", "string",
    "\"dev_score\" (else the first dev_* score, else \"train_score\")",
    "the score newbob follows, e.g. \"dev_ler\" with CTC"},
  {"newbob_relative_error_threshold", "number", "-0.01",
    "newbob: decay when the relative change of the score is above this"},
  {"newbob_error_threshold", "number", "-0.01",
    "newbob_abs: decay when the change of the score is above this"},
  {"newbob_learning_rate_decay", "number", "0.5", "the factor of a decay"},
  {"newbob_relative_error_div_by_old", "boolean", "false",
    "divide the change by the old score instead of the new"},
  {"newbob_multi_num_epochs", "integer", "5", "newbob_multi_epoch: epochs averaged"},
  {"newbob_multi_update_interval", "integer", "newbob_multi_num_epochs",
    "newbob_multi_epoch: epochs between decisions"},
  {"min_learning_rate", "number", "0", "floor of a decayed rate (newbob)"},
  {"learning_rate_warmup_steps", "integer", "0", "ramp the rate linearly over the first steps"},
  {"model", "string", "none", "checkpoint prefix: MODEL.001.h5, MODEL.002.h5, ..."},
  {"save_interval", "integer", "1", "epochs between checkpoints (the last is always saved)"},
  {"load", "string", "none", "\"last\" or a checkpoint path to resume from"},
  {"overwrite", "boolean", "false", "train afresh over an earlier run's checkpoints of model"},
  {"log_verbosity", "integer", "3",
    "0 quiet, 1 summaries, 2 + setup, checkpoints, skipped steps and lr changes, 3 + progress, "
    .. "4 + one line per batch"},
  {"log_file", "string", "none", "a copy of the log, with time stamps"},
  {"log_progress_interval", "number", "5", "seconds between plain progress lines"},
  {"learning_curve_file", "string", "model .. \".curve.jsonl\"", "one JSON line per epoch"},
  {"plot", "boolean", "false", "redraw MODEL.curve.png after every epoch (docs/tools.md)"},
  {"seed", "integer", "1", "seeds the network's initialisation and the random generator"},
  {"device", "string", "\"cpu\"", "\"cuda\" or \"cuda:N\" (docs/gpu.md)"},
  {"dtype", "string", "\"float32\"", "\"float64\" for references and checks"},
  {"precision", "string", "\"fp32\"",
    "\"bf16\" (CPU or CUDA) or \"fp16\" (CUDA): half operands and float32 sums in the matrix "
      .. "products (float32 master weights); \"int8\" is refused (inference only)"},
  {"grad_scaler", "boolean | table", "true with \"fp16\", else false",
    "fp16 dynamic loss scaling: true or {init_scale = 2^16, growth_factor = 2, "
      .. "backoff_factor = 0.5, growth_interval = 2000}"},
  {"num_threads", "integer", "all CPUs", "rl.set_num_threads for the run"},
  {"distributed", "table", "none (sync with several processes)",
    "{mode = \"sync\" | \"average\", ...} (docs/distributed.md)"},
  {"pretrain", "string | table | function", "none",
    "\"default\", a function or {construction =, repetitions =, output_layers =}"},
  {"accum_grad", "integer", "1", "sum the gradients of this many batches into one update"},
  {"ema", "number", "none",
    "decay in (0, 1) of an exponential moving average of the parameters, saved as MODEL.NNN.ema.h5"},
  {"ema_dev_score", "boolean", "false", "score the dev set with the averaged parameters (needs ema)"},
  {"keep_best_n", "integer", "none",
    "keep the checkpoints of the n best epochs by best_by (and the newest), delete the others"},
  {"early_stopping", "table", "none",
    "{patience = n}: stop after n epochs in a row without a better dev score (best_by)"},
  {"best_by", "string", "\"dev_score\"",
    "the dev score keep_best_n and early_stopping rank by: dev_score, dev_error or dev_ler"},
  {"label_smoothing", "number", "0", "uniform label smoothing eps in [0, 1) for the ce losses"},
  {"T_max", "integer", "num_epochs", "cosine: epochs from learning_rate down to eta_min"},
  {"eta_min", "number", "0", "cosine: the lowest lr"},
  {"warmup_steps", "integer", "25000", "noam: the update steps of the rise"},
  {"model_size", "integer", "256", "noam: the model dimension d of the formula"},
  {"total_steps", "integer", "needed", "one_cycle: the number of updates of the cycle"},
  {"pct_start", "number", "0.3", "one_cycle: the share of the steps that rise to max_lr"},
  {"anneal_strategy", "string", "\"cos\"", "one_cycle: \"cos\" or \"linear\""},
  {"div_factor", "number", "25", "one_cycle: the first lr is max_lr / div_factor"},
  {"final_div_factor", "number", "1e4",
    "one_cycle: the last lr is max_lr / div_factor / final_div_factor"},
  {"three_phase", "boolean", "false",
    "one_cycle: PyTorch's three-phase variant (up, down to the first lr, then to the last)"},
}

M.by_key = {}
for _, k in ipairs(M.list) do M.by_key[k[1]] = k end

-- The help of one key, a few lines; nil and the closest key (or nil) for an unknown one.
function M.describe(key)
  local k = M.by_key[key]
  if not k then
    local names = {}
    for _, e in ipairs(M.list) do names[#names + 1] = e[1] end
    return nil, require("rnnlua.cli").closest(key, names)
  end
  return string.format("++%s (%s, default %s)\n  %s\n  (docs/training.md, \"Config keys\")\n",
    k[1], k[2], k[3], k[4])
end

return M
