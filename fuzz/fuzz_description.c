/* libFuzzer target: the reader of stored network descriptions (rl.checkpoint.deserialize, the
 * data-only literal parser of lua/rnnlua/checkpoint.lua) on arbitrary text. What it accepts
 * must be data that serialize writes back to text that reads back as the same text (an abort
 * otherwise). Seeds: fuzz/corpus/description. */
#define FUZZ_AS_FILE 0
#define FUZZ_LUA                                                                                   \
    "function(text)\n"                                                                             \
    "  local C = rl.checkpoint\n"                                                                  \
    "  local v = C.deserialize(text, 'fuzz')\n"                                                    \
    "  local ok, s = pcall(C.serialize, v, 'fuzz')\n"                                              \
    "  if not ok then return end\n"                                                                \
    "  local ok2, back = pcall(C.deserialize, s, 'fuzz')\n"                                        \
    "  if not ok2 or C.serialize(back, 'fuzz') ~= s then\n"                                        \
    "    error('FUZZ INVARIANT: serialize/deserialize round trip differs for ' .. s, 0)\n"         \
    "  end\n"                                                                                      \
    "end"
#include "fuzz.h"
