/* libFuzzer target: the JSON config reader of `rnnlua train CONFIG.json` (rnnlua.config's
 * from_json: rl.json_decode, jansson behind it, then the mapping of RETURNN 2016 and CURRENNT
 * layouts to an rl.train table) on arbitrary text. A bad text must be a Lua error whose message
 * starts with the file's name ("fuzz.json:LINE:COLUMN: ..." or "fuzz.json: network.x: ...");
 * any other error (an internal "attempt to index ..." or a message without the name) aborts.
 * Seeds: fuzz/corpus/config. */
#define FUZZ_AS_FILE 0
#define FUZZ_LUA                                                                                   \
    "function(text)\n"                                                                             \
    "  local config = require('rnnlua.config')\n"                                                  \
    "  local ok, err = pcall(config.from_json, text, 'fuzz.json')\n"                               \
    "  if not ok and (type(err) ~= 'string' or err:sub(1, 9) ~= 'fuzz.json') then\n"               \
    "    error('FUZZ INVARIANT: an error not naming the file: ' .. tostring(err), 0)\n"            \
    "  end\n"                                                                                      \
    "end"
#include "fuzz.h"
