#!/usr/bin/env bash
# `rnnlua serve`: trains a tiny 12AX BLSTM, writes rl.forward's answers for a dev set, and hands
# them to tests/sh/serve_check.py, which starts servers on free loopback ports and checks them
# (answers equal rl.forward's, malformed requests, limits, load, reload, SIGTERM draining).
# Usage: test_serve.sh path/to/rnnlua (from the repository root). Debian's python3 with h5py.
set -u
bin=$(cd "$(dirname "${1:?usage: test_serve.sh path/to/rnnlua}")" && pwd)/$(basename "$1")
dir=$(mktemp -d)
trap 'rm -rf "$dir"' EXIT
py=/usr/bin/python3
if ! "$py" -c 'import h5py' 2>/dev/null; then
    echo "FAIL $py cannot import h5py (scripts/deps.sh installs python3-h5py)"
    echo "0 passed, 1 failed"
    exit 1
fi

# The model: one short epoch of the demo's BLSTM; a second checkpoint (other weights, epoch 7)
# and one of another interface for the reload tests; rl.forward's answers for both models; an
# image model (conv2d, collapse) and rl.forward's answers of an image layer and a sequence layer;
# a CTC model and rl.forward's decoded labels (best path and beam 4); a sparse-input model;
# an image model with a "valid" conv (small images fail in the network); a 1000-way softmax;
# a model with a Lua layer class (scale.lua registers it) and rl.forward's answers; a model
# whose Lua layer takes 50 ms a forward (slow_layer.lua).
cp tests/data/scale_layer.lua "$dir/scale.lua"
# the same, then a second and a half of work: a window for a SIGHUP while the model loads
printf 'dofile("%s")\nlocal t = os.clock()\nwhile os.clock() - t < 1.5 do end\n' "$dir/scale.lua" \
    >"$dir/slow.lua"
echo 'error("no layers here")' >"$dir/raises.lua"
# a layer that takes 50 ms a forward (the drain test's requests queue up behind it)
cat >"$dir/slow_layer.lua" <<'EOF_LUA'
rl.layers.register("slow", {
  init = function(self, opts, in_dims) return in_dims[1] end,
  params = function(self) return {} end,
  forward = function(self, inputs, lengths, train)
    local t = os.clock()
    while os.clock() - t < 0.05 do end
    return inputs[1] * 1
  end,
  backward = function(self, grad_out, inputs, lengths) return {grad_out * 1} end,
})
EOF_LUA
# a char n-gram LM over the CTC model's labels (the class numbers 0..3), and a malformed one
printf '%s\n' '\data\' 'ngram 1=6' 'ngram 2=3' '' '\1-grams:' '-1 <s> -0.5' '-1 </s>' \
    '-0.3 0 -0.2' '-0.9 1' '-1.2 2' '-1.5 3' '' '\2-grams:' '-0.05 <s> 0' '-0.1 0 0' \
    '-0.2 0 </s>' '' '\end\' >"$dir/lm.arpa"
printf '%s\n' '\data\' 'ngram 1=2' '' '\1-grams:' '-1 <s>' 'x </s>' '' '\end\' >"$dir/bad_lm.arpa"
if ! "$bin" -e "
local cfg = {
  network = {
    fw = {class = 'lstm', n_out = 16}, bw = {class = 'lstm', n_out = 16, direction = -1},
    output = {class = 'softmax', from = {'fw', 'bw'}, loss = 'ce', target = 'classes'},
  },
  train = {class = '12ax', num_seqs = 40, seed = 1, max_len = 30},
  num_epochs = 1, batch_size = 500, max_seqs = 10, learning_rate = 0.01,
  optimizer = {class = 'adam'}, model = '$dir/net', log_verbosity = 0, seed = 1,
}
local r = rl.train(cfg)
os.rename(r.checkpoint, '$dir/model.h5')
rl.dataset_write('$dir/dev.h5', rl.dataset{class = '12ax', num_seqs = 24, seed = 2, max_len = 60})
rl.forward{model = '$dir/model.h5', data = {class = 'hdf', files = {'$dir/dev.h5'}},
           output_file = '$dir/fwd.h5', log_verbosity = 0}
rl.forward{model = '$dir/model.h5', data = {class = 'hdf', files = {'$dir/dev.h5'}},
           output_file = '$dir/fwd_int8.h5', log_verbosity = 0, precision = 'int8'}
rl.manual_seed(5)
local net = rl.network(cfg.network, {data = {dim = 9}, classes = {dim = 2, sparse = true}})
rl.save_checkpoint('$dir/other.h5', {net = net, epoch = 7})
rl.forward{model = '$dir/other.h5', data = {class = 'hdf', files = {'$dir/dev.h5'}},
           output_file = '$dir/fwd_other.h5', log_verbosity = 0}
local net5 = rl.network({output = {class = 'softmax', n_out = 2, from = 'data'}},
                        {data = {dim = 5}})
rl.save_checkpoint('$dir/dim5.h5', {net = net5, epoch = 1})
-- a CTC model (untrained: decoding it gives varied labels) and rl.forward's decoded labels
rl.manual_seed(9)
local ctc = rl.network({
    fw = {class = 'lstm', n_out = 8}, bw = {class = 'lstm', n_out = 8, direction = -1},
    output = {class = 'softmax', from = {'fw', 'bw'}, loss = 'ctc', target = 'classes'},
  }, {data = {dim = 9}, classes = {dim = 4, sparse = true}})
rl.save_checkpoint('$dir/ctc.h5', {net = ctc, epoch = 2})
for _, beam in ipairs{1, 4} do
  rl.forward{model = '$dir/ctc.h5', data = {class = 'hdf', files = {'$dir/dev.h5'}},
             output_file = '$dir/dec' .. beam .. '.h5', decode = 'ctc', beam = beam,
             log_verbosity = 0}
end
-- rl.forward's labels fused with the n-gram LM lm.arpa (beam 4, weight 2, bonus 0.5)
rl.forward{model = '$dir/ctc.h5', data = {class = 'hdf', files = {'$dir/dev.h5'}},
           output_file = '$dir/declm.h5', decode = 'ctc', beam = 4,
           lm = {file = '$dir/lm.arpa', weight = 2, bonus = 0.5}, log_verbosity = 0}
-- a model with a sparse input (class indices through an embedding) and rl.forward's answers
local ws = rl.hdf_writer('$dir/sparse.h5', {data_dim = 9, sparse = true})
rl.manual_seed(4)
for i = 1, 8 do
  local ids = {}
  for t = 1, 5 + 3 * i do ids[t] = (7 * i + 3 * t) % 9 end
  ws:add('s' .. i, rl.tensor(ids, 'int32'))
end
ws:close()
local snet = rl.network({
    emb = {class = 'embedding', n_out = 6, from = 'data'},
    fw = {class = 'lstm', n_out = 8, from = 'emb'},
    output = {class = 'softmax', n_out = 3, from = 'fw'},
  }, {data = {dim = 9, sparse = true}})
rl.save_checkpoint('$dir/sparse_model.h5', {net = snet, epoch = 1})
rl.forward{model = '$dir/sparse_model.h5', data = {class = 'hdf', files = {'$dir/sparse.h5'}},
           output_file = '$dir/fwd_sparse.h5', log_verbosity = 0}
-- an image model: images in, an image layer (conv) and a sequence layer after a collapse (side)
local w = rl.hdf_writer('$dir/img.h5', {data_dim = 2, spatial = 2,
                                        targets = {classes = {dim = 3, sparse = true}}})
rl.manual_seed(3)
for i = 1, 6 do
  w:add('img' .. i, rl.rand(3 + i % 3, 4 + i % 2, 2), {classes = rl.tensor({i % 3}, 'int32')})
end
w:close()
rl.train{network = {
    conv = {class = 'conv2d', n_out = 4, filter_size = {3, 3}, from = 'data'},
    col = {class = 'collapse', mode = 'max', from = 'conv'},
    pool = {class = 'global_pool', mode = 'mean', from = 'conv'},
    output = {class = 'softmax', from = 'pool', loss = 'ce', target = 'classes'},
    side = {class = 'softmax', from = 'col', n_out = 3, is_output_layer = true},
  },
  train = {class = 'hdf', files = {'$dir/img.h5'}}, num_epochs = 1, model = '$dir/img',
  optimizer = {class = 'adam'}, learning_rate = 1e-3, log_verbosity = 0}
-- four 2 x 2 poolings need images of 16 x 16 or more (its load was refused: 8 x 8 failed);
-- a 300 x 300 "valid" filter takes no test input up to 256 x 256
local pools = {output = {class = 'global_pool', mode = 'mean', from = 'p4'}}
for i = 1, 4 do
  pools['p' .. i] = {class = 'pool2d', mode = 'max', pool_size = {2, 2}, from = i == 1 and 'data' or 'p' .. (i - 1)}
end
rl.save_checkpoint('$dir/pool4.h5', {net = rl.network(pools, {data = {dim = 2, spatial = 2}}), epoch = 1})
rl.save_checkpoint('$dir/bigfilter.h5', {net = rl.network({
    output = {class = 'conv2d', n_out = 1, filter_size = {300, 300}, padding = 'valid', from = 'data'},
  }, {data = {dim = 1, spatial = 2}}), epoch = 1})
-- the 12AX model's dims (9 in, 2 out), but class indices in
rl.save_checkpoint('$dir/sparse9.h5', {net = rl.network({
    emb = {class = 'embedding', n_out = 4, from = 'data'},
    output = {class = 'softmax', n_out = 2, from = 'emb'},
  }, {data = {dim = 9, sparse = true}}), epoch = 1})
-- frames of 40000 values (no parameters: a crafted checkpoint can name any dim)
rl.save_checkpoint('$dir/dim40k.h5', {net = rl.network({
    output = {class = 'activation', activation = 'tanh', from = 'data'},
  }, {data = {dim = 40000}}), epoch = 1})
-- a wide output (a 1000-way softmax on each frame): large answers
rl.manual_seed(6)
local wide = rl.network({output = {class = 'softmax', n_out = 1000, from = 'data'}}, {data = {dim = 9}})
rl.save_checkpoint('$dir/wide.h5', {net = wide, epoch = 1})
-- an image model whose conv has no padding: an image smaller than its 3 x 3 filter fails in it
rl.manual_seed(3)
local valid = rl.network({
    conv = {class = 'conv2d', n_out = 2, filter_size = {3, 3}, padding = 'valid', from = 'data'},
    output = {class = 'global_pool', mode = 'mean', from = 'conv'},
  }, {data = {dim = 2, spatial = 2}})
rl.save_checkpoint('$dir/valid.h5', {net = valid, epoch = 1})
for _, layer in ipairs{'conv', 'side'} do
  rl.forward{model = '$dir/img.001.h5', data = {class = 'hdf', files = {'$dir/img.h5'}},
             layer = layer, output_file = '$dir/fwd_' .. layer .. '.h5', log_verbosity = 0}
end
dofile('$dir/scale.lua')
rl.manual_seed(8)
rl.save_checkpoint('$dir/lua_model.h5', {net = rl.network({
    sc = {class = 'scale', k = 3, from = 'data'},
    output = {class = 'softmax', n_out = 2, from = 'sc'},
  }, {data = {dim = 9}}), epoch = 1})
rl.forward{model = '$dir/lua_model.h5', data = {class = 'hdf', files = {'$dir/dev.h5'}},
           output_file = '$dir/fwd_lua.h5', log_verbosity = 0}
dofile('$dir/slow_layer.lua')
rl.save_checkpoint('$dir/slow_model.h5', {net = rl.network({
    sl = {class = 'slow', from = 'data'},
    output = {class = 'softmax', n_out = 2, from = 'sl'},
  }, {data = {dim = 9}}), epoch = 1})
" >"$dir/setup.log" 2>&1; then
    echo "FAIL setting up the models and rl.forward's answers"
    tail -n 20 "$dir/setup.log"
    echo "0 passed, 1 failed"
    exit 1
fi

timeout 300 "$py" tests/sh/serve_check.py "$bin" "$dir"
