/* The rnnlua host program: a Lua 5.4 interpreter with the rnnlua library as the global `rl`.
 *
 * Modelled on the stand-alone lua.c: the command line (script and args, -e, -l, -i, -),
 * every chunk run under lua_pcall with a traceback handler, Ctrl-C turned into an
 * "interrupted!" error through a debug hook. On top of that:
 *   - the Lua library compiled into the binary (lua/embedded.h) is found by a package
 *     searcher placed right after package.preload, or, when RNNLUA_LUA_DIR is set, read
 *     from that source tree, so the library can be edited without rebuilding;
 *   - `lfs` and `rnnlua` are in package.preload;
 *   - the REPL uses libedit (history, Tab completion from the Lua module rnnlua.repl) when
 *     stdin is a terminal, and plain lines without prompts when it is not, so that it can
 *     be driven through a pipe;
 *   - subcommands (`rnnlua serve MODEL.h5 ...`, the tools `rnnlua info MODEL.h5` ...) from a
 *     table: one line adds one. */
#include <errno.h>
#include <locale.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/select.h>
#include <sys/socket.h>
#include <sys/syscall.h>
#include <unistd.h>
#include <wchar.h>

#include <editline/readline.h>
#include <lauxlib.h>
#include <lua.h>
#include <lualib.h>

#include "core/dist.h"
#include "lua/l_open.h"
#include "lua/l_tensor.h"
#include "lua/serve.h"
#include "lua/version.h"

/* libmicrohttpd sends an answer's head and body with one sendmsg. The executable defines
 * sendmsg so that the library's calls come here first (a definition in the program comes before
 * the C library's for every shared library): `rnnlua serve` puts a JSON answer in place of the
 * library's own HTML error answers (lua/serve.c, rl_serve_own_answer); every other message goes
 * to the kernel unchanged. Only the executable does this, never librnnlua, so a program that
 * embeds the library keeps its C library's sendmsg. */
ssize_t sendmsg(int fd, const struct msghdr *m, int flags) {
    ssize_t r;
    if (rl_serve_own_answer(fd, m, &r)) return r;
    return syscall(SYS_sendmsg, fd, m, flags);
}

#define PROGNAME "rnnlua"
#define PROMPT "> "
#define PROMPT2 ">> "
#define HISTORY_FILE ".rnnlua_history"
#define HISTORY_MAX 1000
/* The tail of a syntax error that means "the chunk is not finished yet". */
#define EOFMARK "<eof>"
/* The REPL's chunks report errors as "stdin:LINE: ...", as in lua.c. */
#define REPL_CHUNKNAME "=stdin"
#define LIB_DIR_ENV RL_LUA_DIR_ENV

/* Where a SIGINT must land: the state running Lua code (set around every pcall). */
static lua_State *volatile running_L;
/* Set by SIGINT while the REPL waits for a line on a terminal. */
static volatile sig_atomic_t prompt_interrupted;

/* ---- subcommands: `rnnlua NAME args...` ---------------------------------------------------- */

static int docall(lua_State *L, int narg, int nres);
static int report(lua_State *L, int status);

/* The tools written in Lua (lua/rnnlua/tools.lua): rl.tools.main(argv[0], {argv[1..]}) returns
 * the exit status and reports its own errors; an error escaping it is reported here. */
static int run_tool(lua_State *L, int argc, char **argv) {
    lua_getglobal(L, "rl");
    lua_getfield(L, -1, "tools");
    lua_getfield(L, -1, "main");
    lua_pushstring(L, argv[0]);
    lua_createtable(L, argc - 1, 0);
    for (int i = 1; i < argc; i++) {
        lua_pushstring(L, argv[i]);
        lua_rawseti(L, -2, i);
    }
    int status = docall(L, 2, 1);
    if (status != LUA_OK) {
        report(L, status);
        return 1;
    }
    return lua_isinteger(L, -1) ? (int)lua_tointeger(L, -1) : 1;
}

/* A subcommand runs with the library loaded (the global `rl`); argv[0] is its name. It returns
 * the process exit status. Adding one is one line here. */
static const struct {
    const char *name;
    int (*run)(lua_State *L, int argc, char **argv);
    const char *summary;
} subcommands[] = {
    {"train", run_tool, "train CONFIG.lua|CONFIG.json [++key value ...]  rl.train on a config"},
    {"forward", run_tool, "forward ++model M ++data D ++layer L ++output O  the forward task"},
    {"search", run_tool, "search ++model M ++data D ++output O ++beam N  beam search"},
    {"serve", rl_serve_main, "serve MODEL.h5 [++port P] ...  an HTTP service (serve --help)"},
    {"info", run_tool, "info MODEL.h5                   describe a checkpoint"},
    {"dump-data", run_tool, "dump-data FILE.h5 [++seq N] [++stats]  describe an HDF dataset"},
    {"compare", run_tool, "compare A.h5 B.h5               max difference per parameter"},
    {"average", run_tool, "average A.h5 B.h5 ... -o OUT.h5  the mean of checkpoints"},
    {"plot", run_tool,
     "plot CURVE.jsonl | FILE.h5 ++heatmap KEY [++out OUT.png]  a learning curve or a heat map"},
};

static int find_subcommand(const char *name) {
    for (size_t i = 0; i < sizeof subcommands / sizeof subcommands[0]; i++)
        if (strcmp(name, subcommands[i].name) == 0) return (int)i;
    return -1;
}

static void print_usage(FILE *f) {
    fputs("usage: " PROGNAME " [options] [script [args]]\n", f);
    for (size_t i = 0; i < sizeof subcommands / sizeof subcommands[0]; i++)
        fprintf(f, "       " PROGNAME " %s\n", subcommands[i].summary);
}

static void print_help(void) {
    print_usage(stdout);
    fputs("Runs a Lua 5.4 script (a recipe) with the rnnlua library loaded as the global `rl`.\n"
          "With no script and no -e or -v, opens the REPL.\n"
          "\n"
          "Options:\n"
          "  -e CODE        run the Lua chunk CODE (repeatable; in order, before the script)\n"
          "  -l NAME        require module NAME into the global NAME (repeatable)\n"
          "  -i             open the REPL after running the script and -e chunks\n"
          "  -v, --version  print the version\n"
          "  -h, --help     print this help and exit\n"
          "  --             stop handling options (the next argument is the script)\n"
          "  -              run the standard input as the script\n"
          "The script sees its arguments in the global `arg` (arg[0] the script, arg[1..] the\n"
          "arguments, negative indices the interpreter and options) and as `...`. Recipes and\n"
          "subcommands take options as ++key value (RECIPE.lua --help, rnnlua train --help).\n"
          "\n"
          "Environment:\n"
          "  " LIB_DIR_ENV "=DIR  load the Lua library (modules rnnlua.*) from the source\n"
          "                      tree at DIR instead of the copy built into the binary:\n"
          "                      rnnlua.X from DIR/lua/rnnlua/X.lua, rnnlua.layers.X from\n"
          "                      DIR/layers/X.lua (DIR is the repository root, e.g. `.`)\n"
          "\n"
          "REPL: an expression prints its values; a statement runs; an unfinished chunk\n"
          "continues on the next line (\">> \"). Tab completes globals, fields after `.` and\n"
          "methods after `:`. Ctrl-C interrupts a running computation or clears the line;\n"
          "Ctrl-D exits. History is kept in ~/" HISTORY_FILE ".\n",
          stdout);
}

static void print_version(void) {
    printf("%s %s (%s)\n", PROGNAME, RL_VERSION, LUA_RELEASE);
    fflush(stdout);
}

/* Errors and failures go to stderr as "rnnlua: <msg>", in a world of several processes as
 * "rnnlua: rank R: <msg>", so that each rank's error reaches the terminal with its rank. A
 * message may quote a file's content (a tag, a name): its control characters other than line
 * breaks and tabs are written as \NNN, so no escape sequence from a file reaches the terminal. */
static void message(const char *msg) {
    fflush(stdout);
    /* one write for the whole message: stderr is unbuffered, and the ranks of a job that all
     * fail at once would interleave their messages character by character */
    size_t cap = strlen(msg) * 4 + 64;
    char *buf = malloc(cap);
    if (buf == NULL) {
        fprintf(stderr, "%s: %s\n", PROGNAME, msg);
        return;
    }
    size_t len = rl_dist_size() > 1
                     ? (size_t)snprintf(buf, cap, "%s: rank %d: ", PROGNAME, rl_dist_rank())
                     : (size_t)snprintf(buf, cap, "%s: ", PROGNAME);
    for (const unsigned char *c = (const unsigned char *)msg; *c; c++) {
        if ((*c < 32 && *c != '\n' && *c != '\t') || *c == 127)
            len += (size_t)snprintf(buf + len, cap - len, "\\%03d", *c);
        else
            buf[len++] = (char)*c;
    }
    buf[len++] = '\n';
    fwrite(buf, 1, len, stderr);
    fflush(stderr);
    free(buf);
}

static int report(lua_State *L, int status) {
    if (status != LUA_OK) {
        const char *msg = lua_tostring(L, -1);
        message(msg ? msg : "(error object is not a string)");
        lua_pop(L, 1);
    }
    return status;
}

/* ---- Ctrl-C ---------------------------------------------------------------------------- */

static void interrupt_hook(lua_State *L, lua_Debug *ar) {
    (void)ar;
    lua_sethook(L, NULL, 0, 0);
    luaL_error(L, "interrupted!");
}

/* Installs handler for SIGINT; the previous action goes to *old when old is not NULL. */
static void set_sigint(void (*handler)(int), int flags, struct sigaction *old) {
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_handler = handler;
    sa.sa_flags = flags;
    sigemptyset(&sa.sa_mask);
    sigaction(SIGINT, &sa, old);
}

/* A hook is the only async-signal-safe way into a running Lua state (lua_sethook is
 * documented as safe here). A second Ctrl-C before the hook fires (e.g. inside a long C
 * call) kills the process, as in lua.c. */
static void on_sigint_running(int sig) {
    (void)sig;
    set_sigint(SIG_DFL, 0, NULL);
    lua_sethook(running_L, interrupt_hook,
                LUA_MASKCALL | LUA_MASKRET | LUA_MASKLINE | LUA_MASKCOUNT, 1);
}

static void on_sigint_prompt(int sig) {
    (void)sig;
    prompt_interrupted = 1;
}

/* ---- user-facing errors: "rnnlua: <where>: <what>" ------------------------------------------
 * <where> is the user's own file and line (the innermost frame of a recipe, config or REPL chunk)
 * when rnnlua's library raised the error: its message names the layer, option or file, and the
 * positions inside rnnlua's own Lua modules tell a user nothing, so they are left out, and so is
 * the traceback. An error raised by the user's own code (its message starts with a position in
 * a user's file) keeps its traceback, without the lines of rnnlua's own modules.
 * RNNLUA_TRACEBACK=1 shows every error with the full traceback (for working on rnnlua). */

/* Whether a chunk source is one of rnnlua's own modules: embedded ("@lua/rnnlua/x.lua",
 * "@layers/x.lua") or read from RNNLUA_LUA_DIR ("@DIR/lua/rnnlua/x.lua", "@DIR/layers/x.lua"). */
static int internal_source(const char *src) {
    if (src[0] != '@') return src[0] == '=' && strcmp(src, "=[C]") == 0;
    src++;
    if (strncmp(src, "lua/rnnlua/", 11) == 0 || strncmp(src, "layers/", 7) == 0) return 1;
    const char *dir = getenv(LIB_DIR_ENV);
    size_t n = dir ? strlen(dir) : 0;
    if (n == 0 || strncmp(src, dir, n) != 0) return 0;
    src += n;
    while (*src == '/')
        src++;
    return strncmp(src, "lua/rnnlua/", 11) == 0 || strncmp(src, "layers/", 7) == 0;
}

/* Pushes msg without the "<module>.lua:N: " positions of rnnlua's own modules. */
static const char *strip_internal(lua_State *L, const char *msg) {
    luaL_Buffer b;
    luaL_buffinit(L, &b);
    while (*msg) {
        const char *p = strstr(msg, "lua/rnnlua/");
        const char *q = strstr(msg, "layers/");
        if (p == NULL || (q != NULL && q < p)) p = q;
        if (p == NULL) break;
        /* back to the start of the path (RNNLUA_LUA_DIR's prefix) */
        const char *start = p;
        while (start > msg && start[-1] != ' ' && start[-1] != '\n' && start[-1] != '\t')
            start--;
        const char *e = p;
        while (*e && *e != ':' && *e != ' ' && *e != '\n')
            e++;
        /* a position that leads the message or a part of it ("what: pos: ..."); one inside a
         * sentence (a syntax error of a module loaded from RNNLUA_LUA_DIR) is information */
        int leads = start == msg || (start - msg >= 2 && start[-2] == ':' && start[-1] == ' ');
        int is_pos = leads && e - p > 4 && strncmp(e - 4, ".lua", 4) == 0 && e[0] == ':' &&
                     e[1] >= '0' && e[1] <= '9';
        if (!is_pos) {
            luaL_addlstring(&b, msg, (size_t)(e - msg));
            msg = e;
            continue;
        }
        const char *after = e + 1;
        while (*after >= '0' && *after <= '9')
            after++;
        if (after[0] == ':' && after[1] == ' ') after += 2;
        luaL_addlstring(&b, msg, (size_t)(start - msg));
        msg = after;
    }
    luaL_addstring(&b, msg);
    luaL_pushresult(&b);
    return lua_tostring(L, -1);
}

/* The traceback of L from `level` on, without the frames of rnnlua's own modules. */
static void user_traceback(lua_State *L, int level) {
    luaL_Buffer b;
    luaL_buffinit(L, &b);
    luaL_addstring(&b, "stack traceback:");
    lua_Debug ar;
    for (; lua_getstack(L, level, &ar); level++) {
        if (!lua_getinfo(L, "Sln", &ar) || internal_source(ar.source)) continue;
        lua_pushfstring(L, "\n\t%s:", ar.short_src);
        luaL_addvalue(&b);
        if (ar.currentline > 0) {
            lua_pushfstring(L, "%d:", ar.currentline);
            luaL_addvalue(&b);
        }
        if (*ar.what == 'm')
            lua_pushliteral(L, " in main chunk");
        else if (ar.name != NULL)
            lua_pushfstring(L, " in function '%s'", ar.name);
        else
            lua_pushliteral(L, " in ?");
        luaL_addvalue(&b);
    }
    luaL_pushresult(&b);
}

static int msghandler(lua_State *L) {
    const char *msg = lua_tostring(L, 1);
    if (msg == NULL) {
        if (luaL_callmeta(L, 1, "__tostring") && lua_type(L, -1) == LUA_TSTRING) return 1;
        msg = lua_pushfstring(L, "(error object is a %s value)", luaL_typename(L, 1));
    }
    const char *full = getenv("RNNLUA_TRACEBACK");
    if (full != NULL && full[0] != '\0' && strcmp(full, "0") != 0) {
        luaL_traceback(L, L, msg, 1);
        return 1;
    }
    /* the innermost frame in a user's file; the error is the library's when a frame of
     * rnnlua's own modules or a C function other than error/assert raised it */
    lua_Debug ar;
    int level = 1, found = 0, library = 0;
    if (lua_getstack(L, 1, &ar) && lua_getinfo(L, "Sn", &ar) && *ar.what == 'C' &&
        !(ar.name && (strcmp(ar.name, "error") == 0 || strcmp(ar.name, "assert") == 0)))
        library = 1;
    for (; lua_getstack(L, level, &ar); level++) {
        if (!lua_getinfo(L, "Sl", &ar)) continue;
        if (ar.currentline > 0 && !internal_source(ar.source)) {
            found = 1;
            break;
        }
        if (*ar.what != 'C') library = 1;
    }
    const char *where = found ? lua_pushfstring(L, "%s:%d:", ar.short_src, ar.currentline) : NULL;
    if (!library && (where == NULL || strncmp(msg, where, strlen(where)) == 0)) {
        msg = strip_internal(L, msg);
        user_traceback(L, 1);
        lua_pushfstring(L, "%s\n%s", msg, lua_tostring(L, -1));
        return 1;
    }
    msg = strip_internal(L, msg);
    if (where != NULL && strncmp(msg, where, strlen(where)) == 0) return 1;
    if (where != NULL)
        lua_pushfstring(L, "%s %s", where, msg);
    else
        lua_pushstring(L, msg);
    return 1;
}

/* lua_pcall with the traceback handler and with Ctrl-C armed; the SIGINT action of the
 * caller (the REPL's, between lines) comes back afterwards. */
static int docall(lua_State *L, int narg, int nres) {
    int base = lua_gettop(L) - narg;
    lua_pushcfunction(L, msghandler);
    lua_insert(L, base);
    running_L = L;
    struct sigaction outer;
    set_sigint(on_sigint_running, SA_RESTART, &outer);
    int status = lua_pcall(L, narg, nres, base);
    sigaction(SIGINT, &outer, NULL);
    /* A Ctrl-C that came as the chunk finished must not hit the next one. */
    if (lua_gethook(L) == interrupt_hook) lua_sethook(L, NULL, 0, 0);
    lua_remove(L, base);
    return status;
}

/* global[name] = require(module) */
static int dorequire(lua_State *L, const char *module, const char *global) {
    lua_getglobal(L, "require");
    lua_pushstring(L, module);
    int status = docall(L, 1, 1);
    if (status == LUA_OK) lua_setglobal(L, global);
    return report(L, status);
}

/* ---- running chunks ------------------------------------------------------------------- */

static int dochunk(lua_State *L, int status) {
    if (status == LUA_OK) status = docall(L, 0, 0);
    return report(L, status);
}

static int dostring(lua_State *L, const char *s, const char *name) {
    return dochunk(L, luaL_loadbufferx(L, s, strlen(s), name, "t"));
}

/* The script's own arguments (after the script name) also go to it as `...`. */
static int pushargs(lua_State *L) {
    if (lua_getglobal(L, "arg") != LUA_TTABLE) luaL_error(L, "'arg' is not a table");
    int n = (int)luaL_len(L, -1);
    luaL_checkstack(L, n + 3, "too many arguments to script");
    for (int i = 1; i <= n; i++)
        lua_rawgeti(L, -i, i);
    lua_remove(L, -n - 1);
    return n;
}

static void repl_helper(lua_State *L, const char *name, int nargs);

/* Runs the script argv[0] with its arguments. explore (-i): its top-level locals become globals
 * (rnnlua.repl.globalize, as for the lines typed at the prompt), so the REPL that follows sees
 * them. */
static int handle_script(lua_State *L, char **argv, int explore) {
    const char *fname = argv[0];
    if (strcmp(fname, "-") == 0 && strcmp(argv[-1], "--") != 0) fname = NULL; /* stdin */
    int status;
    if (explore && fname) {
        lua_pushstring(L, fname);
        repl_helper(L, "loadfile_globalized", 1);
        /* a table {function} or {nil, message}: the helper's own failure is nil */
        if (lua_istable(L, -1)) {
            lua_rawgeti(L, -1, 1);
            status = lua_isfunction(L, -1) ? LUA_OK : LUA_ERRFILE;
            if (status != LUA_OK) {
                lua_pop(L, 1);
                lua_rawgeti(L, -1, 2);
            }
            lua_remove(L, -2);
        } else {
            lua_pop(L, 1);
            status = luaL_loadfilex(L, fname, "t");
        }
    } else {
        status = luaL_loadfilex(L, fname, "t");
    }
    if (status == LUA_OK) {
        int n = pushargs(L);
        status = docall(L, n, LUA_MULTRET);
    }
    return report(L, status);
}

/* arg[0] = the script (or the program when there is none), arg[1..] = its arguments, and the
 * interpreter with its options at negative indices. */
static void create_arg_table(lua_State *L, char **argv, int argc, int script) {
    if (script == argc) script = 0;
    lua_createtable(L, argc - script - 1, script + 1);
    for (int i = 0; i < argc; i++) {
        lua_pushstring(L, argv[i]);
        lua_rawseti(L, -2, i - script);
    }
    lua_setglobal(L, "arg");
}

/* ---- the REPL ------------------------------------------------------------------------- */

/* One byte of the terminal, or EOF on end of input, an error or Ctrl-C. SIGINT stays blocked
 * except inside pselect, so a Ctrl-C between the flag test and the wait cannot be missed (it
 * would otherwise only count at the next key). */
static int read_byte(int fd) {
    sigset_t block, outer;
    sigemptyset(&block);
    sigaddset(&block, SIGINT);
    sigprocmask(SIG_BLOCK, &block, &outer);
    int c = EOF;
    for (;;) {
        if (prompt_interrupted) break;
        fd_set in;
        FD_ZERO(&in);
        FD_SET(fd, &in);
        int r = pselect(fd + 1, &in, NULL, NULL, NULL, &outer);
        if (r < 0 && errno == EINTR) continue;
        if (r < 0) break;
        unsigned char ch;
        ssize_t n = read(fd, &ch, 1);
        if (n == 1) c = ch;
        if (n == 1 || n == 0 || errno != EINTR) break;
    }
    sigprocmask(SIG_SETMASK, &outer, NULL);
    return c;
}

/* libedit calls this for each key; returning EOF on Ctrl-C makes readline() give up the line.
 * libedit takes what it returns as one character (a wchar_t), without decoding, so a character
 * of several bytes (UTF-8) is decoded here by the locale; a byte that starts no character of
 * it is U+FFFD. */
static int getc_interruptible(FILE *f) {
    int fd = f ? fileno(f) : STDIN_FILENO;
    mbstate_t st;
    memset(&st, 0, sizeof st);
    for (;;) {
        int c = read_byte(fd);
        if (c == EOF) return EOF;
        char b = (char)c;
        wchar_t w;
        size_t r = mbrtowc(&w, &b, 1, &st);
        if (r == (size_t)-2) continue; /* the character goes on */
        if (r == (size_t)-1) return 0xfffd;
        return r == 0 ? 0 : (int)w;
    }
}

enum { LINE_OK, LINE_EOF, LINE_CANCEL };

/* Reads one line (without its newline) into a malloc'd *line. */
static int read_line(int tty, const char *prompt, char **line) {
    *line = NULL;
    if (tty) {
        prompt_interrupted = 0;
        char *s = readline(prompt);
        if (prompt_interrupted) {
            free(s);
            fputs("\n", stdout);
            fflush(stdout);
            return LINE_CANCEL;
        }
        if (s == NULL) return LINE_EOF;
        *line = s;
        return LINE_OK;
    }
    size_t cap = 0;
    ssize_t n = getline(line, &cap, stdin);
    if (n < 0) {
        free(*line);
        *line = NULL;
        return LINE_EOF;
    }
    if (n > 0 && (*line)[n - 1] == '\n') (*line)[n - 1] = '\0';
    return LINE_OK;
}

static void save_history(int tty, const char *chunk) {
    if (tty && chunk[0] != '\0') add_history(chunk);
}

static int incomplete(lua_State *L, int status) {
    if (status != LUA_ERRSYNTAX) return 0;
    size_t len;
    const char *msg = lua_tolstring(L, -1, &len);
    size_t mlen = sizeof EOFMARK - 1;
    return len >= mlen && strcmp(msg + len - mlen, EOFMARK) == 0;
}

/* rnnlua.repl[name](the nargs values on top of the stack), its one result, under pcall; the
 * arguments are popped and the result (nil when the call failed: the REPL goes on without the
 * help) pushed. */
static int repl_helper_call(lua_State *L) {
    int nargs = lua_gettop(L) - 1;
    lua_getglobal(L, "require");
    lua_pushliteral(L, "rnnlua.repl");
    lua_call(L, 1, 1);
    lua_getfield(L, -1, lua_tostring(L, 1));
    lua_replace(L, 1);
    lua_pop(L, 1);
    lua_call(L, nargs, 1);
    return 1;
}

static void repl_helper(lua_State *L, const char *name, int nargs) {
    lua_pushcfunction(L, repl_helper_call);
    lua_pushstring(L, name);
    lua_rotate(L, -nargs - 2, 2); /* under the arguments: function, name, args... */
    if (lua_pcall(L, nargs + 1, 1, 0) != LUA_OK) {
        lua_pop(L, 1);
        lua_pushnil(L);
    }
}

/* The chunk of a line that only asked for help. */
static int nothing(lua_State *L) {
    (void)L;
    return 0;
}

enum { CHUNK_EOF = -1, CHUNK_CANCEL = -2 };

/* Reads and compiles one chunk: pushes the function (LUA_OK) or an error message (a load
 * status), or pushes nothing (CHUNK_EOF, CHUNK_CANCEL). A line is first tried as an
 * expression ("return " .. line, as lua.c does), then as statements continued over further
 * lines while the parser stops at <eof>. */
static int read_chunk(lua_State *L, int tty) {
    char *line;
    int got = read_line(tty, PROMPT, &line);
    if (got != LINE_OK) return got == LINE_EOF ? CHUNK_EOF : CHUNK_CANCEL;
    const char *expr = line[0] == '=' ? line + 1 : line; /* "=x", as Lua 5.1-5.3 took it */
    if (line[0] == '?') {                                /* "?rl.tensor" asks for help about it */
        lua_pushstring(L, line + 1);
        repl_helper(L, "help", 1);
        lua_pop(L, 1);
        save_history(tty, line);
        free(line);
        lua_pushcfunction(L, nothing); /* the help is printed: nothing to run */
        return LUA_OK;
    }
    const char *ret = lua_pushfstring(L, "return %s;", expr);
    if (luaL_loadbufferx(L, ret, strlen(ret), REPL_CHUNKNAME, "t") == LUA_OK) {
        lua_remove(L, -2);
        save_history(tty, line);
        free(line);
        return LUA_OK;
    }
    lua_pop(L, 2);
    lua_pushstring(L, line);
    free(line);
    for (;;) {
        size_t len;
        const char *chunk = lua_tolstring(L, -1, &len);
        /* the chunk's top-level locals as globals, so they outlive the line */
        lua_pushvalue(L, -1);
        repl_helper(L, "globalize", 1);
        size_t glen;
        const char *g = lua_tolstring(L, -1, &glen);
        int status = g ? luaL_loadbufferx(L, g, glen, REPL_CHUNKNAME, "t")
                       : luaL_loadbufferx(L, chunk, len, REPL_CHUNKNAME, "t");
        lua_remove(L, -2);
        if (!incomplete(L, status)) {
            save_history(tty, chunk);
            lua_remove(L, -2);
            return status;
        }
        got = read_line(tty, PROMPT2, &line);
        if (got == LINE_EOF) { /* the input ended inside a chunk: report the <eof> error */
            save_history(tty, chunk);
            lua_remove(L, -2);
            return status;
        }
        lua_pop(L, 1);
        if (got == LINE_CANCEL) {
            save_history(tty, chunk);
            lua_pop(L, 1);
            return CHUNK_CANCEL;
        }
        lua_pushliteral(L, "\n");
        lua_pushstring(L, line);
        free(line);
        lua_concat(L, 3);
    }
}

/* Prints all values on the stack with tostring, separated by tabs (as print does, but
 * without going through a global `print` the user may have replaced); a table without
 * __tostring or __name is shown with its contents (rnnlua.repl.pretty). */
static int print_values(lua_State *L) {
    int n = lua_gettop(L);
    for (int i = 1; i <= n; i++) {
        size_t len;
        const char *s = NULL;
        if (lua_type(L, i) == LUA_TTABLE && luaL_getmetafield(L, i, "__tostring") == LUA_TNIL &&
            luaL_getmetafield(L, i, "__name") == LUA_TNIL) {
            lua_pushvalue(L, i);
            repl_helper(L, "pretty", 1);
            s = lua_tolstring(L, -1, &len);
            if (s == NULL) lua_pop(L, 1);
        } else if (lua_type(L, i) == LUA_TTABLE) {
            lua_pop(L, 1); /* the metafield found */
        }
        if (s == NULL) s = luaL_tolstring(L, i, &len);
        if (i > 1) fputc('\t', stdout);
        fwrite(s, 1, len, stdout);
        lua_pop(L, 1);
    }
    fputc('\n', stdout);
    fflush(stdout);
    return 0;
}

/* The candidates of rnnlua.repl.complete(text), called under pcall from the completer. */
static int complete_in_lua(lua_State *L) {
    lua_getglobal(L, "require");
    lua_pushliteral(L, "rnnlua.repl");
    lua_call(L, 1, 1);
    lua_getfield(L, -1, "complete");
    lua_pushvalue(L, 1);
    lua_call(L, 1, 1);
    return 1;
}

static lua_State *repl_L;

/* libedit's completion hook: matches[0] is what replaces the word (the candidates' longest
 * common prefix), then the candidates, then NULL. */
static char **complete_word(const char *text, int start, int end) {
    (void)start;
    (void)end;
    rl_attempted_completion_over = 1; /* never fall back to file names */
    lua_State *L = repl_L;
    int top = lua_gettop(L);
    lua_pushcfunction(L, complete_in_lua);
    lua_pushstring(L, text);
    char **m = NULL;
    if (lua_pcall(L, 1, 1, 0) == LUA_OK && lua_istable(L, -1)) {
        size_t n = (size_t)lua_rawlen(L, -1);
        m = n ? calloc(n + 2, sizeof *m) : NULL;
        for (size_t i = 0; m && i < n; i++) {
            lua_rawgeti(L, -1, (lua_Integer)i + 1);
            const char *c = lua_tostring(L, -1);
            m[i + 1] = strdup(c ? c : "");
            lua_pop(L, 1);
        }
        if (m) {
            size_t common = strlen(m[1]);
            for (size_t i = 2; i <= n; i++) {
                size_t k = 0;
                while (k < common && m[i][k] == m[1][k])
                    k++;
                common = k;
            }
            m[0] = strndup(m[1], common);
            if (n == 1) { /* a single candidate is the replacement itself */
                free(m[1]);
                m[1] = NULL;
            }
        }
    }
    lua_settop(L, top);
    return m;
}

static const char *history_path(void) {
    static char path[4096];
    const char *home = getenv("HOME");
    if (home == NULL || home[0] == '\0') return NULL;
    if ((size_t)snprintf(path, sizeof path, "%s/%s", home, HISTORY_FILE) >= sizeof path)
        return NULL;
    return path;
}

static void repl_init_tty(lua_State *L) {
    repl_L = L;
    rl_readline_name = PROGNAME;
    /* Ctrl-C at the prompt is ours (getc_interruptible), not libedit's. */
    rl_catch_signals = 0;
    rl_getc_function = getc_interruptible;
    /* "." and ":" stay inside the word so that "rl.layers.re" completes as one word. */
    static char breaks[] = " \t\n\"\\'`@$><=;|&{(,+-*/%^~#[]}";
    rl_basic_word_break_characters = breaks;
    rl_completer_word_break_characters = breaks;
    rl_attempted_completion_function = complete_word;
    rl_completion_append_character = '\0';
    /* libedit decodes what is typed by the locale's character type: in the default "C" it
     * drops every non-ASCII character from the line it returns. Only LC_CTYPE: numbers keep
     * Lua's "." in every locale. */
    setlocale(LC_CTYPE, "");
    rl_initialize();
    /* libedit's command mode (Meta-x in emacs mode, ':' in vi command mode, even when ~/.editrc
     * chose vi) reads and runs editline commands; a stray quote there crashes libedit (el_wparse
     * takes the tokenizer's NULL argv after an unmatched quote). No keystroke at the rnnlua
     * prompt may do that, so those keys do nothing. */
    static const char *const no_command_mode[] = {
        "bind '\\ex' ed-unassigned", "bind '\\eX' ed-unassigned", "bind -a : ed-unassigned"};
    for (size_t i = 0; i < sizeof no_command_mode / sizeof no_command_mode[0]; i++)
        rl_parse_and_bind(no_command_mode[i]);
    /* libedit's emacs map takes the characters 128-255 as Meta plus a 7-bit key ("ø", U+00F8,
     * or a lone byte 0xf8 is Meta-x: the command mode above; "ä" is Meta-d and deletes a
     * word). At this prompt they are text: Latin-1 letters in strings and comments insert
     * themselves; Meta is the Escape prefix. */
    for (int c = 0x80; c <= 0xff; c++) {
        char bind[32];
        snprintf(bind, sizeof bind, "bind '\\%03o' ed-insert", c);
        rl_parse_and_bind(bind);
    }
    using_history();
    stifle_history(HISTORY_MAX);
    const char *hp = history_path();
    if (hp) read_history(hp);
}

/* The error message on top, with "did you mean ...?" (rnnlua.repl.hint) after its first line
 * when it names a missing field or method close to an existing one. */
static void add_hint(lua_State *L) {
    lua_pushvalue(L, -1);
    repl_helper(L, "hint", 1);
    const char *hint = lua_tostring(L, -1);
    if (hint == NULL) {
        lua_pop(L, 1);
        return;
    }
    const char *msg = lua_tostring(L, -2);
    const char *nl = strchr(msg, '\n');
    size_t first = nl ? (size_t)(nl - msg) : strlen(msg);
    lua_pushlstring(L, msg, first);
    lua_pushfstring(L, "\n  %s", hint);
    lua_pushstring(L, msg + first);
    lua_concat(L, 3);
    lua_replace(L, -3);
    lua_pop(L, 1);
}

static void do_repl(lua_State *L, int banner) {
    int tty = isatty(STDIN_FILENO);
    struct sigaction outer;
    if (tty) {
        if (banner) print_version();
        repl_init_tty(L);
        /* Between lines too (printing, completing), Ctrl-C must not kill the session. No
         * SA_RESTART: the read() under readline must return EINTR. */
        set_sigint(on_sigint_prompt, 0, &outer);
    }
    /* help(x) at the prompt: the signature of an rl function (also ?x) */
    repl_helper(L, "help_function", 0);
    if (!lua_isnil(L, -1)) lua_setglobal(L, "help");
    lua_settop(L, 0);
    for (;;) {
        int status = read_chunk(L, tty);
        if (status == CHUNK_EOF) break;
        if (status == CHUNK_CANCEL) continue;
        if (status == LUA_OK) status = docall(L, 0, LUA_MULTRET);
        if (status == LUA_OK && lua_gettop(L) > 0) {
            lua_pushcfunction(L, print_values);
            lua_insert(L, 1);
            status = docall(L, lua_gettop(L) - 1, 0);
        }
        if (status != LUA_OK && lua_type(L, -1) == LUA_TSTRING) add_hint(L);
        report(L, status);
        lua_settop(L, 0);
    }
    if (tty) {
        sigaction(SIGINT, &outer, NULL);
        fputs("\n", stdout);
        fflush(stdout);
        const char *hp = history_path();
        if (hp) write_history(hp);
    }
}

/* ---- command line --------------------------------------------------------------------- */

enum { HAS_ERROR = 1, HAS_I = 2, HAS_V = 4, HAS_E = 8, HAS_HELP = 16 };

/* Scans the options; returns flags and sets *script to the script's index (argc if none). */
static int collect_args(char **argv, int argc, int *script) {
    int flags = 0;
    *script = argc;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        if (a[0] != '-' || strcmp(a, "-") == 0) {
            *script = i;
            return flags;
        }
        if (strcmp(a, "--") == 0) {
            *script = i + 1 < argc ? i + 1 : argc;
            return flags;
        }
        if (strcmp(a, "--help") == 0 || strcmp(a, "-h") == 0) {
            flags |= HAS_HELP;
        } else if (strcmp(a, "--version") == 0 || strcmp(a, "-v") == 0) {
            flags |= HAS_V;
        } else if (strcmp(a, "-i") == 0) {
            flags |= HAS_I;
        } else if (a[1] == 'e' || a[1] == 'l') { /* -e CODE, -eCODE, -l NAME, -lNAME */
            if (a[1] == 'e') flags |= HAS_E;
            if (a[2] == '\0' && ++i >= argc) {
                fprintf(stderr, "%s: '%s' needs an argument\n", PROGNAME, a);
                return HAS_ERROR;
            }
        } else {
            fprintf(stderr, "%s: unrecognized option '%s'\n", PROGNAME, a);
            return HAS_ERROR;
        }
    }
    return flags;
}

/* Runs the -e and -l options in their order (collect_args has checked them). */
static int run_options(lua_State *L, char **argv, int script) {
    for (int i = 1; i < script; i++) {
        const char *a = argv[i];
        if (a[0] != '-' || (a[1] != 'e' && a[1] != 'l')) continue;
        const char *val = a[2] != '\0' ? a + 2 : argv[++i];
        int status = a[1] == 'e' ? dostring(L, val, "=(command line)") : dorequire(L, val, val);
        if (status != LUA_OK) return 0;
    }
    return 1;
}

/* The standard libraries, the package searchers and the rnnlua library as the global `rl`. */
static int open_library(lua_State *L) {
    rl_lua_open_state(L);
    lua_gc(L, LUA_GCRESTART);
    lua_gc(L, LUA_GCGEN, 0, 0);
    return dorequire(L, "rnnlua", "rl") == LUA_OK;
}

/* Everything that runs Lua, itself run under lua_pcall so that memory errors are caught. */
static int pmain(lua_State *L) {
    int argc = (int)lua_tointeger(L, 1);
    char **argv = (char **)lua_touserdata(L, 2);
    int sub = argc > 1 ? find_subcommand(argv[1]) : -1;
    if (sub >= 0) {
        if (!open_library(L)) return 0;
        lua_pushinteger(L, subcommands[sub].run(L, argc - 1, argv + 1)); /* the exit status */
        return 1;
    }
    int script;
    int flags = collect_args(argv, argc, &script);
    if (flags & HAS_ERROR) {
        print_usage(stderr);
        fputs("(" PROGNAME " --help lists the options)\n", stderr);
        return 0;
    }
    if (flags & HAS_HELP) {
        print_help();
        lua_pushboolean(L, 1);
        return 1;
    }
    if (flags & HAS_V) print_version();
    create_arg_table(L, argv, argc, script);
    if (!open_library(L)) return 0;
    if (!run_options(L, argv, script)) return 0;
    if (script < argc && handle_script(L, argv + script, flags & HAS_I) != LUA_OK) return 0;
    if ((flags & HAS_I) || (script == argc && !(flags & (HAS_E | HAS_V))))
        do_repl(L, !(flags & HAS_V));
    lua_pushboolean(L, 1);
    return 1;
}

int main(int argc, char **argv) {
    /* Under mpirun/srun this process joins the MPI world (a plain run does not need one). */
    if (rl_dist_init() != RL_OK) {
        message(rl_errmsg());
        rl_dist_finalize(1);
        return EXIT_FAILURE;
    }
    lua_State *L = luaL_newstate();
    if (L == NULL) {
        message("cannot create state: not enough memory");
        return EXIT_FAILURE;
    }
    lua_gc(L, LUA_GCSTOP);
    lua_pushcfunction(L, pmain);
    lua_pushinteger(L, argc);
    lua_pushlightuserdata(L, argv);
    int status = lua_pcall(L, 2, 1, 0);
    int ok = lua_toboolean(L, -1);
    int code = (ok && status == LUA_OK) ? EXIT_SUCCESS : EXIT_FAILURE;
    if (status == LUA_OK && lua_isinteger(L, -1)) code = (int)lua_tointeger(L, -1);
    report(L, status);
    /* A recipe that caught an error of rl.train or a collective and ended normally: the world
     * is broken and the job ends with MPI_Abort, which would otherwise say nothing of why. */
    if (ok && status == LUA_OK && rl_dist_broken()) {
        char why[700];
        snprintf(why, sizeof why,
                 "the recipe ended, but the distributed world was broken (the job is aborted, "
                 "other ranks may wait for this one): %s",
                 rl_dist_broken_reason());
        message(why);
        code = EXIT_FAILURE;
    }
    lua_close(L);
    /* After an error the other ranks may wait in a collective for this one: MPI_Abort ends the
     * job instead of MPI_Finalize, which would wait for them. */
    rl_dist_finalize(!(ok && status == LUA_OK));
    return code;
}
