/* rl.json_decode(text [, name]) -> value: JSON (RFC 8259) read by jansson, the library the HTTP
 * service already parses its requests with. Objects become tables with string keys, arrays
 * lists (1-based), numbers integers when written without a fraction or exponent and floats
 * otherwise, null the light userdata rl.json_null (a list keeps its length and a key its
 * presence). A key given twice in one object is an error, as is anything after the value.
 * Errors name the text (`name`, e.g. the file) with line and column:
 *   "config.json:3:14: unexpected token near '}'". */
#include <jansson.h>
#include <lauxlib.h>

#include "l_json.h"

/* Deeper than any config; keeps the C stack of the conversion small. */
#define MAX_DEPTH 200

static void push_json(lua_State *L, json_t *v, int depth, const char *name) {
    luaL_checkstack(L, 4, "json_decode: nesting too deep");
    if (depth > MAX_DEPTH) luaL_error(L, "%s: nesting deeper than %d", name, MAX_DEPTH);
    switch (json_typeof(v)) {
    case JSON_OBJECT: {
        lua_createtable(L, 0, (int)json_object_size(v));
        const char *key;
        json_t *x;
        json_object_foreach(v, key, x) {
            push_json(L, x, depth + 1, name);
            lua_setfield(L, -2, key);
        }
        break;
    }
    case JSON_ARRAY: {
        lua_createtable(L, (int)json_array_size(v), 0);
        size_t i;
        json_t *x;
        json_array_foreach(v, i, x) {
            push_json(L, x, depth + 1, name);
            lua_rawseti(L, -2, (lua_Integer)i + 1);
        }
        break;
    }
    case JSON_STRING: lua_pushlstring(L, json_string_value(v), json_string_length(v)); break;
    case JSON_INTEGER: lua_pushinteger(L, (lua_Integer)json_integer_value(v)); break;
    case JSON_REAL: lua_pushnumber(L, json_real_value(v)); break;
    case JSON_TRUE: lua_pushboolean(L, 1); break;
    case JSON_FALSE: lua_pushboolean(L, 0); break;
    case JSON_NULL: lua_pushlightuserdata(L, NULL); break;
    }
}

/* The conversion runs under lua_pcall so that the jansson document is freed on every path. */
static int decode_protected(lua_State *L) {
    json_t *doc = lua_touserdata(L, 1);
    push_json(L, doc, 0, lua_tostring(L, 2));
    return 1;
}

static int l_json_decode(lua_State *L) {
    size_t len;
    const char *text = luaL_checklstring(L, 1, &len);
    const char *name = luaL_optstring(L, 2, "json");
    json_error_t err;
    json_t *doc = json_loadb(text, len, JSON_REJECT_DUPLICATES | JSON_DECODE_ANY, &err);
    if (doc == NULL) return luaL_error(L, "%s:%d:%d: %s", name, err.line, err.column, err.text);
    lua_pushcfunction(L, decode_protected);
    lua_pushlightuserdata(L, doc);
    lua_pushstring(L, name);
    int st = lua_pcall(L, 2, 1, 0);
    json_decref(doc);
    if (st != LUA_OK) return lua_error(L);
    return 1;
}

void rl_lua_open_json(lua_State *L) {
    lua_pushcfunction(L, l_json_decode);
    lua_setfield(L, -2, "json_decode");
    lua_pushlightuserdata(L, NULL);
    lua_setfield(L, -2, "json_null");
}
