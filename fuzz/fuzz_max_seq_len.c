/* libFuzzer target: the arithmetic grammar of a rec layer's max_seq_len string (rnnlua.rec's
 * length_expr; the string is stored in checkpoints and never compiled as Lua) on arbitrary text.
 * A bad expression must be an error "fuzz: max_seq_len ..."; one it accepts must give a number
 * for every input length tried (an abort otherwise). The time of both is bounded by the
 * grammar's limits (256 characters, nesting 32 deep); libFuzzer's -timeout catches a hang.
 * Seeds: fuzz/corpus/max_seq_len. */
#define FUZZ_AS_FILE 0
#define FUZZ_LUA                                                                                   \
    "function(text)\n"                                                                             \
    "  local ok, f = pcall(require('rnnlua.rec').length_expr, text, 'fuzz')\n"                     \
    "  if not ok then\n"                                                                           \
    "    if type(f) ~= 'string' or not f:match('^fuzz: max_seq_len[ :]') then\n"                   \
    "      error('FUZZ INVARIANT: an error not naming max_seq_len: ' .. tostring(f), 0)\n"         \
    "    end\n"                                                                                    \
    "    return\n"                                                                                 \
    "  end\n"                                                                                      \
    "  for _, T in ipairs({0, 1, 7, 1000, 2^31}) do\n"                                             \
    "    local ok2, v = pcall(f, T)\n"                                                             \
    "    if not ok2 or type(v) ~= 'number' then\n"                                                 \
    "      error('FUZZ INVARIANT: ' .. text .. ' gave ' .. tostring(v) .. ' for T = ' .. T, 0)\n"  \
    "    end\n"                                                                                    \
    "  end\n"                                                                                      \
    "end"
#include "fuzz.h"
