/* The Lua library compiled into the binary.
 *
 * `build/embed` (lua/embed.c) turns each Lua file of the library into a byte array of the
 * generated build/gen/embedded.c, named by module with one rule:
 *   lua/P.lua       -> module P with '/' read as '.'  (lua/rnnlua/nn.lua -> "rnnlua.nn",
 *                                                      lua/rnnlua/init.lua -> "rnnlua.init")
 *   layers/X.lua    -> "rnnlua.layers.X"
 * The host's package searcher loads them by module name; the path is kept so that chunk
 * names (and so tracebacks) name the source file. No Lua header is needed here: the table
 * is plain data. */
#ifndef RL_EMBEDDED_H
#define RL_EMBEDDED_H

#include <stddef.h>

typedef struct rl_embedded_file {
    const char *module; /* "rnnlua.init" */
    const char *path;   /* "lua/rnnlua/init.lua", relative to the repository root */
    const char *bytes;  /* the file's contents, NUL-terminated */
    size_t len;         /* bytes without the terminating NUL */
} rl_embedded_file;

/* The contents of `module` with its length in *len (len may be NULL), or NULL when no file
 * of that module is embedded. */
const char *rl_embedded_find(const char *module, size_t *len);

/* All embedded files, sorted by module name; their number in *count. */
const rl_embedded_file *rl_embedded_list(size_t *count);

#endif
