-- rnnlua.cli, the one parser of ++key value for recipes, subcommands and rl.train: types,
-- defaults, booleans alone, the closest name of a misspelt option, an option given twice,
-- --key where only ++key is read, the tools' --key and -o, rl.train's pass-through keys.
local H = dofile("tests/lua/harness.lua")
local cli = require("rnnlua.cli")

local function spec(extra)
  local s = {usage = "rnnlua x.lua", options = {
    {"num_epochs", "integer", 3, "epochs"},
    {"lr", "number", 0.5, "learning rate"},
    {"out", "string", "out/x", "directory"},
    {"smoke", "boolean", false, "a tiny run"},
    {"nbest", "value", nil, "true or N"},
  }}
  for k, v in pairs(extra or {}) do s[k] = v end
  return s
end

local function fails(s, argv, text)
  local ok, err = pcall(cli.parse, s, argv)
  H.check(not ok, "no error for " .. table.concat(argv, " "))
  H.check(tostring(err):find(text, 1, true),
    "error '" .. tostring(err) .. "' lacks '" .. text .. "'")
end

H.test("values by type, defaults, a boolean alone", function()
  local o, rest = cli.parse(spec(), {"++num_epochs", "7", "++smoke", "++out", "d", "++nbest", "4"})
  H.check(o.num_epochs == 7 and math.type(o.num_epochs) == "integer", "integer")
  H.check(o.lr == 0.5 and o.out == "d" and o.smoke == true and o.nbest == 4, "values")
  H.check(#rest == 0 and #o.args == 0, "nothing left")
  o = cli.parse(spec(), {"++smoke", "false", "++lr", "1e-3", "++nbest", "true"})
  H.check(o.smoke == false and o.lr == 1e-3 and o.nbest == true, "explicit boolean, number")
  o = cli.parse(spec(), {"++num_epochs", "2", "++num_epochs", "2"})
  H.check(o.num_epochs == 2, "the same value twice is fine")
end)

H.test("errors name the option", function()
  fails(spec(), {"++num_epoch", "2"}, "++num_epoch: unknown option (did you mean ++num_epochs?)")
  fails(spec(), {"++ou", "d"}, "did you mean ++out?")
  fails(spec(), {"++num_epochs", "2.5"}, "++num_epochs: expects an integer, got '2.5'")
  fails(spec(), {"++lr", "fast"}, "++lr: expects a number, got 'fast'")
  fails(spec(), {"++smoke", "maybe"}, "++smoke: expects true or false, got 'maybe'")
  fails(spec(), {"++out"}, "++out: lacks a value")
  fails(spec(), {"++num_epochs", "1", "++num_epochs", "2"},
    "++num_epochs: given twice, as '1' and as '2'")
  fails(spec(), {"--num_epochs", "3"},
    "--num_epochs: options are written ++key value (++num_epochs)")
  fails(spec(), {"num_epochs=3"}, "num_epochs=3: options are written ++key value (++num_epochs 3)")
  fails(spec(), {"file.h5"}, "file.h5: unexpected argument")
  fails(spec({required = {"out"}, options = {{"out", "string", nil, "x"}}}), {}, "++out: missing")
end)

H.test("the tools: positional files, --key, -o", function()
  local s = spec({args = {name = "one file", min = 1, max = 1}, dashes = true,
                  aliases = {["-o"] = "out"}})
  local o = cli.parse(s, {"a.h5", "--num-epochs", "4", "-o", "x.png", "--smoke"})
  H.check(o.args[1] == "a.h5" and o.num_epochs == 4 and o.out == "x.png" and o.smoke, "parsed")
  fails(s, {}, "expects one file")
  fails(s, {"a.h5", "b.h5"}, "b.h5: unexpected argument")
  fails(s, {"a.h5", "--seq", "2"}, "--seq: unknown option")
  fails(s, {"a.h5", "--out", "p", "-o", "q"}, "++out: given twice")
end)

H.test("rl.train's keys pass through a recipe", function()
  local o, rest = cli.parse(spec({train = true}),
    {"++smoke", "++learning_rate", "0.1", "++train.num_seqs", "10"})
  H.check(o.smoke and #rest == 4 and rest[1] == "++learning_rate" and rest[4] == "10", "rest")
  fails(spec({train = true}), {"++learnin_rate", "0.1"}, "did you mean ++learning_rate?")
  fails(spec({train = true}), {"++train..x", "1"}, "a key part is empty")
end)

H.test("--help prints every option", function()
  local text = cli.parse(spec({on_help = function(t) return t end}), {"++lr", "1", "--help"})
  for _, k in ipairs({"++num_epochs N", "++lr X", "++out S", "++smoke", "++nbest V"}) do
    H.check(text:find(k, 1, true), "help lacks " .. k .. ":\n" .. text)
  end
  H.check(text:find("[out/x]", 1, true), "help shows defaults")
end)

H.test("--help KEY describes one option or rl.train key; an unknown one names the closest", function()
  local on_help = function(t) return t end
  local text = cli.parse(spec({on_help = on_help}), {"--help", "lr"})
  H.check(text == "  ++lr X  learning rate [0.5]\n", "one option's line, got: " .. text)
  text = cli.parse(spec({on_help = on_help, train = true}), {"--help", "++newbob_learning_rate_decay"})
  H.check(text:find("++newbob_learning_rate_decay (number, default 0.5)\n  the factor of a decay",
    1, true), "an rl.train key's type, default and help, got: " .. text)
  text = cli.parse(spec({on_help = on_help, train = true}), {"-h", "num_epochs"})
  H.check(text:find("[3]", 1, true), "the recipe's own option wins over the config key: " .. text)
  text = cli.parse(spec({on_help = on_help}), {"--help", "out/x.lua"})
  H.check(text:find("^usage: rnnlua x.lua"), "a word that is no key name: the whole help")
  fails(spec({on_help = on_help, train = true}), {"--help", "lerning_rate"},
    "--help lerning_rate: no option or config key of that name (did you mean ++learning_rate?)")
  fails(spec({on_help = on_help}), {"--help", "batch_size"},
    "--help batch_size: no option or config key of that name")
end)

H.test("rl.train's --help KEY, from its own argv", function()
  local cfg = {network = {}, train = {class = "12ax"}, num_epochs = 4}
  local ok, err = pcall(rl.train, cfg, {"--help", "num_epochs_"})
  H.check(not ok and tostring(err):find("rl.train: --help num_epochs_: no config key of that name "
    .. "(did you mean ++num_epochs?)", 1, true), "unknown key: " .. tostring(err))
end)

H.test("edit distance", function()
  H.check(cli.distance("", "abc") == 3 and cli.distance("abc", "abc") == 0, "trivial")
  H.check(cli.distance("num_epcohs", "num_epochs") == 1, "a transposition is one edit")
  H.check(cli.distance("kitten", "sitting") == 3, "kitten")
  H.check(cli.closest("hiden", {"layers", "hidden", "emb"}) == "hidden", "closest")
end)

H.test("RETURNN JSON configs: the mapping", function()
  local config = require("rnnlua.config")
  local cfg = config.from_returnn(rl.json_decode([[{
    "num_inputs": 9, "num_outputs": {"classes": [2, 1]}, "adam": true, "gradient_clip": 5,
    "train": "a.h5,b.h5", "dev": {"class": "Task12AXDataset", "num_seqs": 5}, "log": "x.log",
    "device": "gpu1", "network": {
      "l1": {"class": "blstm", "n_out": 8},
      "h": {"class": "hidden", "activation": "tanh", "n_out": 4, "from": "l1", "dropout": 0.1},
      "g": {"class": "rec", "unit": "gru", "n_out": 3, "direction": -1, "from": ["h"]},
      "output": {"class": "softmax", "loss": "ce", "from": ["g", "l1"]}}}]], "t.json"), "t.json")
  local n = cfg.network
  H.check(n.l1_fw.class == "lstm" and n.l1_fw.n_out == 4 and n.l1_bw.direction == -1, "blstm")
  H.check(n.l1.class == "copy" and n.l1.from[1] == "l1_fw" and n.l1.from[2] == "l1_bw", "concat")
  H.check(n.h.class == "linear" and n.h.from[1] == "h_dropout", "hidden after its dropout")
  H.check(n.h_dropout.class == "dropout" and n.h_dropout.dropout == 0.1
    and n.h_dropout.from[1] == "l1", "RETURNN's dropout is on the input")
  H.check(n.g.class == "gru" and n.g.direction == -1, "rec unit gru")
  H.check(n.output.target == "classes" and n.output.loss == "ce", "target defaults to classes")
  H.check(cfg.extern_data.data.dim == 9 and cfg.extern_data.classes.sparse, "extern_data")
  H.check(cfg.optimizer.class == "adam" and cfg.optimizer.gradient_clip == 5, "optimizer")
  H.check(cfg.train.class == "hdf" and cfg.train.files[2] == "b.h5", "files")
  H.check(cfg.dev.class == "12ax" and cfg.log_file == "x.log" and cfg.device == "cuda:1", "rest")
  local function bad(text, want)
    local ok, err = pcall(function() return config.from_returnn(rl.json_decode(text), "t.json") end)
    H.check(not ok and tostring(err):find(want, 1, true), tostring(err) .. " lacks " .. want)
  end
  bad([[{"network": {"a": {"class": "rec", "unit": "tanh"}}}]], "t.json: network.a.unit: unit 'tanh'")
  bad([[{"network": {"a": {"class": "hidden", "n_out": 2}}}]], "needs \"activation\"")
  bad([[{"network": {"a": {"class": "blstm", "n_out": 3}}}]], "even n_out")
  bad([[{"network": {"a": {"class": "blstm", "n_out": 2}, "a_fw": {"class": "rec", "n_out": 2}}}]],
    "taken twice")
  bad([[{"network": {"a": {"class": "rec", "n_out": 2, "from": null}}}]], "null is not a value")
  bad([[{"network": {}, "task": "forward"}]], "t.json: task: 'forward'")
  bad([[{"network": {}, "adam": true, "momentum": 0.9}]], "adam and momentum")
  bad("[1, 2]", "must hold a JSON object")
  -- found by fuzz/fuzz_config.c: the conversion's depth limit did not name the file
  local deep = '{"network": ' .. string.rep("[", 300) .. string.rep("]", 300) .. "}"
  local ok, err = pcall(config.from_json, deep, "t.json")
  H.check(not ok and err == "t.json: nesting deeper than 200", tostring(err))
  ok, err = pcall(config.from_json, '{"network": {}', "t.json")
  H.check(not ok and tostring(err):find("^t%.json:1:%d+: "), tostring(err))
end)

H.test("CURRENNT network files: a list of layers, each reading the one before", function()
  local config = require("rnnlua.config")
  local cfg = config.from_returnn(rl.json_decode([[{"layers": [
    {"size": 9, "name": "input", "type": "input"},
    {"size": 8, "name": "l1", "bias": 1.0, "type": "blstm"},
    {"size": 5, "name": "ff", "bias": 1.0, "type": "feedforward_tanh"},
    {"size": 2, "name": "output", "bias": 1.0, "type": "softmax"},
    {"size": 2, "name": "postoutput", "type": "multiclass_classification"}]}]]), "c.json")
  local n = cfg.network
  H.check(n.l1_fw.from[1] == "data" and n.l1_bw.n_out == 4 and n.l1.class == "copy", "blstm")
  H.check(n.ff.class == "linear" and n.ff.activation == "tanh" and n.ff.from[1] == "l1", "ff")
  H.check(n.output.from[1] == "ff" and n.output.loss == "ce" and n.output.target == "classes",
    "the post-output layer is the loss")
  H.check(n.postoutput == nil and cfg.extern_data.classes.dim == 2
    and cfg.extern_data.data.dim == 9, "extern_data from the sizes")
  local function bad(text, want)
    local ok, err = pcall(function() return config.from_returnn(rl.json_decode(text), "c.json") end)
    H.check(not ok and tostring(err):find(want, 1, true), tostring(err) .. " lacks " .. want)
  end
  bad([[{"layers": [{"size": 9, "name": "in", "type": "input"},
    {"size": 2, "name": "o", "type": "rnn"}]}]], "c.json: layers[2].type: 'rnn' is not read")
  bad([[{"layers": [{"size": 9, "name": "in", "type": "input"},
    {"size": 2, "name": "o", "type": "lstm", "bias": 0.5}]}]], "layers[2].bias: only 1.0")
  bad([[{"layers": [{"size": 9, "name": "in", "type": "lstm"}]}]], "must be of type input")
end)

H.done()
