/* RETURNN-layout files written by another writer load unchanged: this program writes two files
 * with the HDF5 C API directly, laid out as RETURNN's writers lay them out (SimpleHDFWriter:
 * variable-length UTF-8 /seqTags, int64 attributes; hdf_dump.py: fixed-length "S" tags, float64
 * inputs, int64 /seqLengths, int32 attributes), then reads them as one dataset through
 * rl.dataset in an embedded Lua state and checks every value against what it wrote. */
#include <hdf5.h>
#include <lauxlib.h>
#include <lua.h>
#include <lualib.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "../../lua/l_tensor.h"
#include "check.h"

static hid_t lcpl(void) {
    hid_t p = H5Pcreate(H5P_LINK_CREATE);
    H5Pset_create_intermediate_group(p, 1);
    return p;
}

static void write_ds(hid_t f, const char *name, hid_t ftype, hid_t mtype, int ndim,
                     const hsize_t *dims, const void *data) {
    hid_t space = H5Screate_simple(ndim, dims, NULL);
    hid_t lp = lcpl();
    hid_t ds = H5Dcreate2(f, name, ftype, space, lp, H5P_DEFAULT, H5P_DEFAULT);
    CHECK(ds >= 0);
    CHECK(H5Dwrite(ds, mtype, H5S_ALL, H5S_ALL, H5P_DEFAULT, data) >= 0);
    H5Dclose(ds);
    H5Pclose(lp);
    H5Sclose(space);
}

static void write_attr(hid_t obj, const char *name, hid_t ftype, hid_t mtype, int ndim, hsize_t n,
                       const void *data) {
    hsize_t dims[1] = {n};
    hid_t space = ndim == 0 ? H5Screate(H5S_SCALAR) : H5Screate_simple(1, dims, NULL);
    hid_t a = H5Acreate2(obj, name, ftype, space, H5P_DEFAULT, H5P_DEFAULT);
    CHECK(a >= 0);
    CHECK(H5Awrite(a, mtype, data) >= 0);
    H5Aclose(a);
    H5Sclose(space);
}

static void write_vlen_strings(hid_t f, const char *name, const char **strs, hsize_t n) {
    hid_t t = H5Tcopy(H5T_C_S1);
    H5Tset_size(t, H5T_VARIABLE);
    H5Tset_cset(t, H5T_CSET_UTF8);
    write_ds(f, name, t, t, 1, &n, strs);
    H5Tclose(t);
}

/* File A as RETURNN's SimpleHDFWriter writes it. */
static void write_file_a(const char *path) {
    hid_t f = H5Fcreate(path, H5F_ACC_TRUNC, H5P_DEFAULT, H5P_DEFAULT);
    CHECK(f >= 0);
    float inputs[7][3];
    for (int r = 0; r < 7; r++)
        for (int c = 0; c < 3; c++)
            inputs[r][c] = (float)(r * 10 + c);
    hsize_t d2[2] = {7, 3};
    write_ds(f, "inputs", H5T_IEEE_F32LE, H5T_NATIVE_FLOAT, 2, d2, inputs);
    int32_t sl[2][2] = {{3, 3}, {4, 4}};
    hsize_t dsl[2] = {2, 2};
    write_ds(f, "seqLengths", H5T_STD_I32LE, H5T_NATIVE_INT32, 2, dsl, sl);
    const char *tags[2] = {"corpus/a/1", "corpus/a/2"};
    write_vlen_strings(f, "seqTags", tags, 2);
    int32_t cls[7] = {0, 1, 2, 3, 0, 1, 2};
    hsize_t d1 = 7;
    write_ds(f, "targets/data/classes", H5T_STD_I32LE, H5T_NATIVE_INT32, 1, &d1, cls);
    const char *labels[4] = {"w", "x", "y", "z"};
    write_vlen_strings(f, "targets/labels/classes", labels, 4);
    hid_t lp = lcpl();
    hid_t g = H5Gcreate2(f, "targets/size", lp, H5P_DEFAULT, H5P_DEFAULT);
    int64_t size[2] = {4, 1};
    write_attr(g, "classes", H5T_STD_I64LE, H5T_NATIVE_INT64, 1, 2, size);
    H5Gclose(g);
    H5Pclose(lp);
    int64_t v;
    v = 2, write_attr(f, "numSeqs", H5T_STD_I64LE, H5T_NATIVE_INT64, 0, 1, &v);
    v = 7, write_attr(f, "numTimesteps", H5T_STD_I64LE, H5T_NATIVE_INT64, 0, 1, &v);
    v = 3, write_attr(f, "inputPattSize", H5T_STD_I64LE, H5T_NATIVE_INT64, 0, 1, &v);
    v = 1, write_attr(f, "numDims", H5T_STD_I64LE, H5T_NATIVE_INT64, 0, 1, &v);
    v = 4, write_attr(f, "numLabels", H5T_STD_I64LE, H5T_NATIVE_INT64, 0, 1, &v);
    H5Fclose(f);
}

/* File B as hdf_dump.py writes it: fixed-length tags (h5py dtype "S12"), float64 inputs. */
static void write_file_b(const char *path) {
    hid_t f = H5Fcreate(path, H5F_ACC_TRUNC, H5P_DEFAULT, H5P_DEFAULT);
    CHECK(f >= 0);
    double inputs[5][3];
    for (int r = 0; r < 5; r++)
        for (int c = 0; c < 3; c++)
            inputs[r][c] = 100.0 + r * 10 + c + 0.5;
    hsize_t d2[2] = {5, 3};
    write_ds(f, "inputs", H5T_IEEE_F64LE, H5T_NATIVE_DOUBLE, 2, d2, inputs);
    int64_t sl[1][2] = {{5, 5}};
    hsize_t dsl[2] = {1, 2};
    write_ds(f, "seqLengths", H5T_STD_I64LE, H5T_NATIVE_INT64, 2, dsl, sl);
    char tags[1][12];
    memset(tags, 0, sizeof tags);
    memcpy(tags[0], "corpus/b/1", 10);
    hid_t st = H5Tcopy(H5T_C_S1);
    H5Tset_size(st, 12);
    H5Tset_strpad(st, H5T_STR_NULLPAD);
    hsize_t one = 1;
    write_ds(f, "seqTags", st, st, 1, &one, tags);
    H5Tclose(st);
    int32_t cls[5] = {3, 3, 2, 1, 0};
    hsize_t d1 = 5;
    write_ds(f, "targets/data/classes", H5T_STD_I32LE, H5T_NATIVE_INT32, 1, &d1, cls);
    hid_t lp = lcpl();
    hid_t g = H5Gcreate2(f, "targets/size", lp, H5P_DEFAULT, H5P_DEFAULT);
    int32_t size[2] = {4, 1};
    write_attr(g, "classes", H5T_STD_I32LE, H5T_NATIVE_INT32, 1, 2, size);
    H5Gclose(g);
    H5Pclose(lp);
    int32_t v;
    v = 1, write_attr(f, "numSeqs", H5T_STD_I32LE, H5T_NATIVE_INT32, 0, 1, &v);
    v = 5, write_attr(f, "numTimesteps", H5T_STD_I32LE, H5T_NATIVE_INT32, 0, 1, &v);
    v = 3, write_attr(f, "inputPattSize", H5T_STD_I32LE, H5T_NATIVE_INT32, 0, 1, &v);
    H5Fclose(f);
}

static int l_check(lua_State *L) {
    if (lua_toboolean(L, 1)) {
        check_passed++;
    } else {
        check_failed++;
        fprintf(stderr, "CHECK failed in Lua: %s\n", luaL_optstring(L, 2, "?"));
    }
    return 0;
}

/* Reads both files as one dataset; expected values are those written above. */
static const char *reader =
    "local a, b = ...\n"
    "local ds = rl.dataset{class = 'hdf', files = {a, b}}\n"
    "CHECK(ds:num_seqs() == 3, 'num_seqs')\n"
    "local e = ds:extern_data()\n"
    "CHECK(e.data.dim == 3 and not e.data.sparse, 'data dim')\n"
    "CHECK(e.classes.dim == 4 and e.classes.sparse, 'classes dim')\n"
    "local tags = {'corpus/a/1', 'corpus/a/2', 'corpus/b/1'}\n"
    "local lens = {3, 4, 5}\n"
    "local first = {0, 3, 0}\n"
    "local cls = {{0, 1, 2}, {3, 0, 1, 2}, {3, 3, 2, 1, 0}}\n"
    "for i = 1, 3 do\n"
    "  local s = ds:get_seq(i)\n"
    "  CHECK(s.tag == tags[i], 'tag ' .. i .. ': ' .. tostring(s.tag))\n"
    "  CHECK(s.data:dtype() == 'float32' and s.data:size(1) == lens[i], 'data ' .. i)\n"
    "  local rows = s.data:totable()\n"
    "  for r = 1, lens[i] do for c = 1, 3 do\n"
    "    local want = (i == 3 and 100.5 or 0) + (first[i] + r - 1) * 10 + c - 1\n"
    "    CHECK(rows[r][c] == want, string.format('seq %d [%d][%d] = %g', i, r, c, rows[r][c]))\n"
    "  end end\n"
    "  local got = s.classes:totable()\n"
    "  CHECK(s.classes:dtype() == 'int32', 'classes dtype')\n"
    "  for t = 1, lens[i] do CHECK(got[t] == cls[i][t], 'classes ' .. i .. ' ' .. t) end\n"
    "end\n"
    "local f = rl.h5file(a)\n"
    "CHECK(f:read_strings('targets/labels/classes')[4] == 'z', 'labels')\n"
    "f:close()\n";

int main(void) {
    char dir[] = "/tmp/rl_ds_h5_XXXXXX";
    if (!mkdtemp(dir)) {
        perror("mkdtemp");
        return 1;
    }
    char a[256], b[256];
    snprintf(a, sizeof a, "%s/a.h5", dir);
    snprintf(b, sizeof b, "%s/b.h5", dir);
    write_file_a(a);
    write_file_b(b);

    lua_State *L = luaL_newstate();
    luaL_openlibs(L);
    /* luaopen_rnnlua installs the searcher of the embedded rnnlua.* modules */
    luaL_requiref(L, "rnnlua", luaopen_rnnlua, 0);
    lua_setglobal(L, "rl");
    lua_register(L, "CHECK", l_check);
    int st = luaL_loadstring(L, reader);
    if (st == LUA_OK) {
        lua_pushstring(L, a);
        lua_pushstring(L, b);
        st = lua_pcall(L, 2, 0, 0);
    }
    CHECK(st == LUA_OK);
    if (st != LUA_OK) fprintf(stderr, "Lua error: %s\n", lua_tostring(L, -1));
    lua_close(L);
    unlink(a);
    unlink(b);
    rmdir(dir);
    TEST_MAIN_END();
}
