/* core/h5io: round trips of every dtype, strided views, 0-dim tensors, nested groups, string
 * datasets and attributes; files written by other writers (raw HDF5 calls standing in for h5py:
 * int64, uint8, big-endian doubles, 6 dims, compound); the error cases (missing, garbage,
 * truncated files, missing datasets, data the file never stored) and the atomic-save guarantee.
 * Every check of a file also checks that no HDF5 handle stayed open. */
#include <hdf5.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "../../core/h5io.h"
#include "check.h"

static char dir[64];

static const char *in_dir(const char *name) {
    static char buf[4][256];
    static int k;
    k = (k + 1) % 4;
    snprintf(buf[k], sizeof buf[k], "%s/%s", dir, name);
    return buf[k];
}

static bool file_exists(const char *path) { return access(path, F_OK) == 0; }

static bool msg_has(const char *s) { return strstr(rl_errmsg(), s) != NULL; }

/* A contiguous tensor whose element i (row-major) is fn(i). */
static rl_tensor make(rl_dtype dt, int ndim, const int64_t *shape, double (*fn)(int64_t)) {
    rl_tensor t = {0};
    CHECK_OK(rl_tensor_empty(&t, dt, RL_DEVICE_CPU, ndim, shape));
    int64_t n = rl_tensor_numel(&t);
    for (int64_t i = 0; i < n; i++) {
        double v = fn(i);
        switch (dt) {
        case RL_FLOAT32: ((float *)rl_tensor_data(&t))[i] = (float)v; break;
        case RL_FLOAT64: ((double *)rl_tensor_data(&t))[i] = v; break;
        default: ((int32_t *)rl_tensor_data(&t))[i] = (int32_t)v; break;
        }
    }
    return t;
}

static double f_third(int64_t i) { return (double)(i + 1) / 3.0 - 2.0; }
static double f_int(int64_t i) { return (i % 2 ? -1.0 : 1.0) * (2000000000.0 - (double)i); }
static double f_idx(int64_t i) { return (double)i; }

static void test_round_trip_dtypes(void) {
    const char *p = in_dir("dtypes.h5");
    int64_t shape[3] = {2, 3, 4};
    rl_tensor f32 = make(RL_FLOAT32, 2, shape, f_third);
    rl_tensor f64 = make(RL_FLOAT64, 3, shape, f_third);
    rl_tensor i32 = make(RL_INT32, 1, shape + 2, f_int);
    rl_h5file *f;
    CHECK_OK(rl_h5_create(&f, p));
    CHECK(!file_exists(p));
    CHECK_OK(rl_h5_write_tensor(f, "f32", &f32));
    CHECK_OK(rl_h5_write_tensor(f, "/f64", &f64));
    CHECK_OK(rl_h5_write_tensor(f, "i32", &i32));
    CHECK(rl_h5_open_handles(f) == 0);
    CHECK_OK(rl_h5_commit(f));
    CHECK(file_exists(p));

    CHECK_OK(rl_h5_open(&f, p, false));
    rl_tensor a = {0}, b = {0}, c = {0};
    CHECK_OK(rl_h5_read_tensor(f, "f32", &a));
    CHECK_OK(rl_h5_read_tensor(f, "f64", &b));
    CHECK_OK(rl_h5_read_tensor(f, "/i32", &c));
    CHECK(a.dtype == RL_FLOAT32 && a.ndim == 2 && a.shape[0] == 2 && a.shape[1] == 3);
    CHECK(b.dtype == RL_FLOAT64 && b.ndim == 3 && b.shape[2] == 4);
    CHECK(c.dtype == RL_INT32 && c.ndim == 1 && c.shape[0] == 4);
    int bad = 0;
    for (int64_t i = 0; i < 6; i++)
        bad += ((float *)rl_tensor_data(&a))[i] != (float)f_third(i);
    for (int64_t i = 0; i < 24; i++)
        bad += ((double *)rl_tensor_data(&b))[i] != f_third(i); /* bit-exact float64 */
    for (int64_t i = 0; i < 4; i++)
        bad += ((int32_t *)rl_tensor_data(&c))[i] != (int32_t)f_int(i);
    CHECK(bad == 0);
    CHECK(((int32_t *)rl_tensor_data(&c))[1] == -1999999999);

    rl_dtype dt;
    int nd;
    int64_t sh[RL_MAX_DIMS];
    CHECK_OK(rl_h5_dataset_info(f, "f64", &dt, &nd, sh));
    CHECK(dt == RL_FLOAT64 && nd == 3 && sh[0] == 2 && sh[1] == 3 && sh[2] == 4);
    CHECK(rl_h5_open_handles(f) == 0);
    rl_h5_close(f);
    CHECK(file_exists(p)); /* closing an opened file never removes it */
    rl_tensor_release(&a);
    rl_tensor_release(&b);
    rl_tensor_release(&c);
    rl_tensor_release(&f32);
    rl_tensor_release(&f64);
    rl_tensor_release(&i32);
}

/* Views: a transpose, a narrowed column range and a 0-stride broadcast are stored as their
 * logical contents; 0-dim and empty tensors keep their shapes. */
static void test_views_scalars(void) {
    const char *p = in_dir("views.h5");
    int64_t shape[2] = {3, 4};
    rl_tensor base = make(RL_FLOAT64, 2, shape, f_idx); /* base[i][j] = 4i + j */
    rl_tensor tr = {0}, nar = {0}, col = {0}, ex = {0}, sc = {0}, empty = {0};
    CHECK_OK(rl_tensor_transpose(&tr, &base, 0, 1));  /* (4, 3): tr[j][i] = 4i + j */
    CHECK_OK(rl_tensor_narrow(&nar, &base, 1, 1, 2)); /* (3, 2): nar[i][k] = 4i + k + 1 */
    CHECK_OK(rl_tensor_select(&col, &base, 1, 2));    /* (3): 4i + 2 */
    int64_t exshape[2] = {3, 5};
    rl_tensor colv = {0};
    CHECK_OK(rl_tensor_unsqueeze(&colv, &col, 1));
    CHECK_OK(rl_tensor_expand(&ex, &colv, 2, exshape)); /* (3, 5): 4i + 2 */
    int64_t zshape[2] = {0, 3};
    CHECK_OK(rl_tensor_empty(&sc, RL_INT32, RL_DEVICE_CPU, 0, zshape));
    *(int32_t *)rl_tensor_data(&sc) = -7;
    CHECK_OK(rl_tensor_empty(&empty, RL_FLOAT32, RL_DEVICE_CPU, 2, zshape));

    rl_h5file *f;
    CHECK_OK(rl_h5_create(&f, p));
    CHECK_OK(rl_h5_write_tensor(f, "tr", &tr));
    CHECK_OK(rl_h5_write_tensor(f, "nar", &nar));
    CHECK_OK(rl_h5_write_tensor(f, "ex", &ex));
    CHECK_OK(rl_h5_write_tensor(f, "scalar", &sc));
    CHECK_OK(rl_h5_write_tensor(f, "empty", &empty));
    CHECK_OK(rl_h5_commit(f));

    CHECK_OK(rl_h5_open(&f, p, false));
    rl_tensor r = {0};
    CHECK_OK(rl_h5_read_tensor(f, "tr", &r));
    CHECK(r.ndim == 2 && r.shape[0] == 4 && r.shape[1] == 3);
    int bad = 0;
    for (int j = 0; j < 4; j++)
        for (int i = 0; i < 3; i++)
            bad += ((double *)rl_tensor_data(&r))[j * 3 + i] != 4.0 * i + j;
    rl_tensor_release(&r);
    CHECK_OK(rl_h5_read_tensor(f, "nar", &r));
    CHECK(r.ndim == 2 && r.shape[0] == 3 && r.shape[1] == 2);
    for (int i = 0; i < 3; i++)
        for (int k = 0; k < 2; k++)
            bad += ((double *)rl_tensor_data(&r))[i * 2 + k] != 4.0 * i + k + 1;
    rl_tensor_release(&r);
    CHECK_OK(rl_h5_read_tensor(f, "ex", &r));
    CHECK(r.storage && r.ndim == 2 && r.shape[0] == 3 && r.shape[1] == 5);
    for (int i = 0; i < 3 && r.storage; i++)
        for (int k = 0; k < 5; k++)
            bad += ((double *)rl_tensor_data(&r))[i * 5 + k] != 4.0 * i + 2;
    CHECK(bad == 0);
    rl_tensor_release(&r);
    CHECK_OK(rl_h5_read_tensor(f, "scalar", &r));
    CHECK(r.ndim == 0 && r.dtype == RL_INT32 && *(int32_t *)rl_tensor_data(&r) == -7);
    rl_tensor_release(&r);
    CHECK_OK(rl_h5_read_tensor(f, "empty", &r));
    CHECK(r.ndim == 2 && r.shape[0] == 0 && r.shape[1] == 3 && r.dtype == RL_FLOAT32);
    rl_tensor_release(&r);

    /* rows [1, 3) of the (4, 3) transpose, without the rest */
    CHECK_OK(rl_h5_read_rows(f, "tr", 1, 2, &r));
    CHECK(r.ndim == 2 && r.shape[0] == 2 && r.shape[1] == 3);
    CHECK(r.storage && ((double *)rl_tensor_data(&r))[0] == 1.0 &&
          ((double *)rl_tensor_data(&r))[5] == 4.0 * 2 + 2);
    rl_tensor_release(&r);
    CHECK_OK(rl_h5_read_rows(f, "tr", 4, 0, &r));
    CHECK(r.ndim == 2 && r.shape[0] == 0);
    rl_tensor_release(&r);
    CHECK(rl_h5_read_rows(f, "tr", 3, 2, &r) == RL_EINDEX && r.storage == NULL);
    CHECK(rl_h5_read_rows(f, "scalar", 0, 1, &r) == RL_EIO && msg_has("scalar"));
    CHECK(rl_h5_open_handles(f) == 0);
    rl_h5_close(f);
    rl_tensor_release(&base);
    rl_tensor_release(&tr);
    rl_tensor_release(&nar);
    rl_tensor_release(&col);
    rl_tensor_release(&colv);
    rl_tensor_release(&ex);
    rl_tensor_release(&sc);
    rl_tensor_release(&empty);
}

static bool has_name(char **names, int64_t n, const char *s) {
    for (int64_t i = 0; i < n; i++)
        if (strcmp(names[i], s) == 0) return true;
    return false;
}

static void test_groups_attrs_strings(void) {
    const char *p = in_dir("groups.h5");
    int64_t shape[2] = {2, 2};
    rl_tensor w = make(RL_FLOAT32, 2, shape, f_third);
    rl_tensor dimattr = make(RL_INT32, 1, shape, f_idx);
    rl_h5file *f;
    CHECK_OK(rl_h5_create(&f, p));
    CHECK_OK(rl_h5_write_tensor(f, "/params/lstm1/W", &w));
    CHECK_OK(rl_h5_write_tensor(f, "params/lstm1/b", &w));
    CHECK_OK(rl_h5_write_tensor(f, "params/out/W", &w));
    CHECK_OK(rl_h5_write_tensor(f, "x", &w));
    CHECK_OK(rl_h5_write_tensor(f, "x", &dimattr)); /* replaces */
    const char *tags[3] = {"seq-0", "", "ünïcode/tag 2"};
    CHECK_OK(rl_h5_write_strings(f, "seqTags", tags, 3));
    CHECK_OK(rl_h5_attr_write_string(f, "/", "network", "{\"fw\": {\"class\": \"lstm\"}}"));
    CHECK_OK(rl_h5_attr_write_int64(f, "", "numTimesteps", 5000000000LL));
    CHECK_OK(rl_h5_attr_write_double(f, "params/lstm1/W", "scale", 0.1));
    CHECK_OK(rl_h5_attr_write_tensor(f, "targets/size", "classes", &dimattr));
    CHECK_OK(rl_h5_attr_write_int64(f, "/", "numSeqs", 1));
    CHECK_OK(rl_h5_attr_write_int64(f, "/", "numSeqs", 3)); /* replaces */
    CHECK(rl_h5_open_handles(f) == 0);
    CHECK_OK(rl_h5_commit(f));

    CHECK_OK(rl_h5_open(&f, p, false));
    char **names;
    int64_t n;
    CHECK_OK(rl_h5_list(f, NULL, &names, &n));
    CHECK(n == 5);
    CHECK(has_name(names, n, "params/lstm1/W") && has_name(names, n, "params/lstm1/b") &&
          has_name(names, n, "params/out/W") && has_name(names, n, "x") &&
          has_name(names, n, "seqTags"));
    rl_h5_list_free(names, n);
    CHECK_OK(rl_h5_list(f, "/params/lstm1", &names, &n));
    CHECK(n == 2 && has_name(names, n, "W") && has_name(names, n, "b"));
    rl_h5_list_free(names, n);
    CHECK(rl_h5_list(f, "nope", &names, &n) == RL_EIO && msg_has("nope") && names == NULL);

    bool e;
    CHECK_OK(rl_h5_exists(f, "params/lstm1", &e));
    CHECK(e);
    CHECK_OK(rl_h5_exists(f, "no/such/thing", &e));
    CHECK(!e);

    rl_tensor r = {0};
    CHECK_OK(rl_h5_read_tensor(f, "x", &r));
    CHECK(r.dtype == RL_INT32 && r.ndim == 1 && r.shape[0] == 2);
    rl_tensor_release(&r);

    char **s;
    CHECK_OK(rl_h5_read_strings(f, "seqTags", &s, &n));
    CHECK(n == 3 && strcmp(s[0], "seq-0") == 0 && strcmp(s[1], "") == 0 &&
          strcmp(s[2], "ünïcode/tag 2") == 0);
    rl_h5_list_free(s, n);

    char *str = NULL;
    CHECK_OK(rl_h5_attr_read_string(f, "/", "network", &str));
    CHECK(str && strcmp(str, "{\"fw\": {\"class\": \"lstm\"}}") == 0);
    free(str);
    int64_t iv = 0;
    CHECK_OK(rl_h5_attr_read_int64(f, "/", "numTimesteps", &iv));
    CHECK(iv == 5000000000LL);
    CHECK_OK(rl_h5_attr_read_int64(f, "/", "numSeqs", &iv));
    CHECK(iv == 3);
    double dv = 0;
    CHECK_OK(rl_h5_attr_read_double(f, "/params/lstm1/W", "scale", &dv));
    CHECK(dv == 0.1);
    CHECK_OK(rl_h5_attr_read_double(f, "/", "numSeqs", &dv));
    CHECK(dv == 3.0);
    CHECK(rl_h5_attr_read_int64(f, "params/lstm1/W", "scale", &iv) == RL_EIO && msg_has("scale") &&
          msg_has("not an integer"));
    CHECK_OK(rl_h5_attr_read_tensor(f, "targets/size", "classes", &r));
    CHECK(r.dtype == RL_INT32 && r.ndim == 1 && r.shape[0] == 2 &&
          ((int32_t *)rl_tensor_data(&r))[1] == 1);
    rl_tensor_release(&r);

    CHECK(rl_h5_attr_read_string(f, "/", "missing", &str) == RL_EIO && msg_has(p) &&
          msg_has("missing"));
    CHECK(rl_h5_attr_read_string(f, "/", "numSeqs", &str) == RL_EIO && msg_has("not a string"));
    CHECK(rl_h5_attr_read_double(f, "/", "network", &dv) == RL_EIO && msg_has("not a number"));
    CHECK(rl_h5_attr_read_double(f, "nothere", "a", &dv) == RL_EIO && msg_has("nothere"));
    CHECK(rl_h5_read_tensor(f, "seqTags", &r) == RL_EIO && msg_has("seqTags") &&
          msg_has("unsupported type") && r.storage == NULL);
    CHECK(rl_h5_read_strings(f, "x", &s, &n) == RL_EIO && msg_has("not a string"));
    CHECK(rl_h5_read_tensor(f, "params/lstm1", &r) == RL_EIO && msg_has("params/lstm1"));
    CHECK(rl_h5_read_tensor(f, "params/nope/W", &r) == RL_EIO && msg_has(p) &&
          msg_has("params/nope/W") && msg_has("no such dataset"));
    /* opened read-only: writing fails and names the dataset */
    CHECK(rl_h5_write_tensor(f, "y", &w) == RL_EIO && msg_has(p) && msg_has("y"));
    CHECK(rl_h5_open_handles(f) == 0);
    rl_h5_close(f);

    /* opened read-write: a dataset is added and replaced in place */
    CHECK_OK(rl_h5_open(&f, p, true));
    CHECK_OK(rl_h5_write_tensor(f, "params/out/W", &dimattr));
    CHECK_OK(rl_h5_commit(f));
    CHECK_OK(rl_h5_open(&f, p, false));
    CHECK_OK(rl_h5_read_tensor(f, "params/out/W", &r));
    CHECK(r.dtype == RL_INT32 && r.ndim == 1);
    rl_tensor_release(&r);
    rl_h5_close(f);
    rl_tensor_release(&w);
    rl_tensor_release(&dimattr);
}

/* Files as other writers make them, written with raw HDF5 calls. */
static void write_raw(hid_t file, const char *name, hid_t ftype, hid_t mtype, int ndim,
                      const hsize_t *dims, const void *buf) {
    hid_t sp = H5Screate_simple(ndim, dims, NULL);
    hid_t ds = H5Dcreate2(file, name, ftype, sp, H5P_DEFAULT, H5P_DEFAULT, H5P_DEFAULT);
    CHECK(ds >= 0 && H5Dwrite(ds, mtype, H5S_ALL, H5S_ALL, H5P_DEFAULT, buf) >= 0);
    H5Dclose(ds);
    H5Sclose(sp);
}

static void test_foreign_types(void) {
    const char *p = in_dir("foreign.h5");
    hid_t file = H5Fcreate(p, H5F_ACC_TRUNC, H5P_DEFAULT, H5P_DEFAULT);
    CHECK(file >= 0);
    long long i64[3] = {-5, 7, 2147483647};
    long long big[2] = {1, 3000000000LL};
    unsigned char u8[4] = {0, 1, 200, 255};
    double be[2] = {0.1, -2.5};
    float f6[64];
    for (int i = 0; i < 64; i++)
        f6[i] = (float)i;
    hsize_t d3[1] = {3}, d2[1] = {2}, d4[1] = {4}, d6[6] = {2, 2, 2, 2, 2, 2};
    write_raw(file, "i64", H5T_STD_I64LE, H5T_NATIVE_LLONG, 1, d3, i64);
    write_raw(file, "big", H5T_STD_I64LE, H5T_NATIVE_LLONG, 1, d2, big);
    write_raw(file, "u8", H5T_STD_U8LE, H5T_NATIVE_UCHAR, 1, d4, u8);
    write_raw(file, "be", H5T_IEEE_F64BE, H5T_NATIVE_DOUBLE, 1, d2, be);
    write_raw(file, "six", H5T_NATIVE_FLOAT, H5T_NATIVE_FLOAT, 6, d6, f6);
    hid_t ct = H5Tcreate(H5T_COMPOUND, 8);
    H5Tinsert(ct, "a", 0, H5T_NATIVE_INT);
    H5Tinsert(ct, "b", 4, H5T_NATIVE_FLOAT);
    char cbuf[16] = {0};
    write_raw(file, "comp", ct, ct, 1, d2, cbuf);
    H5Tclose(ct);
    /* a crafted shape: 2^40 x 2^30 values in a tiny file (chunked, nothing written) */
    hsize_t dhuge[2] = {(hsize_t)1 << 40, (hsize_t)1 << 30}, chunk[2] = {1, 1};
    hid_t sp = H5Screate_simple(2, dhuge, NULL), pl = H5Pcreate(H5P_DATASET_CREATE);
    CHECK(sp >= 0 && pl >= 0 && H5Pset_chunk(pl, 2, chunk) >= 0);
    hid_t dh = H5Dcreate2(file, "huge", H5T_NATIVE_FLOAT, sp, H5P_DEFAULT, pl, H5P_DEFAULT);
    CHECK(dh >= 0);
    H5Dclose(dh);
    H5Pclose(pl);
    H5Sclose(sp);
    H5Fclose(file);

    rl_h5file *f;
    CHECK_OK(rl_h5_open(&f, p, false));
    rl_tensor r = {0};
    CHECK_OK(rl_h5_read_tensor(f, "i64", &r));
    CHECK(r.dtype == RL_INT32 && ((int32_t *)rl_tensor_data(&r))[0] == -5 &&
          ((int32_t *)rl_tensor_data(&r))[2] == 2147483647);
    rl_tensor_release(&r);
    CHECK(rl_h5_read_tensor(f, "big", &r) == RL_EIO && msg_has("big") && msg_has("3000000000") &&
          r.storage == NULL);
    CHECK_OK(rl_h5_read_tensor(f, "u8", &r));
    CHECK(r.dtype == RL_INT32 && ((int32_t *)rl_tensor_data(&r))[2] == 200 &&
          ((int32_t *)rl_tensor_data(&r))[3] == 255);
    rl_tensor_release(&r);
    CHECK_OK(rl_h5_read_tensor(f, "be", &r));
    CHECK(r.dtype == RL_FLOAT64 && ((double *)rl_tensor_data(&r))[0] == 0.1 &&
          ((double *)rl_tensor_data(&r))[1] == -2.5);
    rl_tensor_release(&r);
    CHECK(rl_h5_read_tensor(f, "six", &r) == RL_EIO && msg_has("six") && msg_has("6 dims"));
    CHECK(rl_h5_read_tensor(f, "comp", &r) == RL_EIO && msg_has("comp") &&
          msg_has("unsupported type") && msg_has("compound"));
    /* the error of a shape too large names the file and the dataset (it named neither) */
    CHECK(rl_h5_read_tensor(f, "huge", &r) != RL_OK && msg_has(p) && msg_has(": huge: ") &&
          msg_has("1099511627776, 1073741824") && r.storage == NULL);
    CHECK(rl_h5_open_handles(f) == 0);
    rl_h5_close(f);
}

static void copy_prefix(const char *from, const char *to, long nbytes) {
    FILE *a = fopen(from, "rb"), *b = fopen(to, "wb");
    CHECK(a && b);
    if (!a || !b) return;
    char buf[4096];
    long left = nbytes;
    size_t got;
    while (left > 0 && (got = fread(buf, 1, left < 4096 ? (size_t)left : 4096, a)) > 0) {
        fwrite(buf, 1, got, b);
        left -= (long)got;
    }
    fclose(a);
    fclose(b);
}

static void test_bad_files(void) {
    rl_h5file *f = NULL;
    const char *missing = in_dir("does-not-exist.h5");
    CHECK(rl_h5_open(&f, missing, false) == RL_EIO && f == NULL && msg_has(missing));

    const char *garbage = in_dir("garbage.h5");
    FILE *g = fopen(garbage, "wb");
    for (int i = 0; i < 5000; i++)
        fputc((i * 7919) & 0xff, g);
    fclose(g);
    CHECK(rl_h5_open(&f, garbage, false) == RL_EIO && f == NULL && msg_has(garbage) &&
          msg_has("not an HDF5 file"));

    CHECK(rl_h5_open(&f, dir, false) == RL_EIO && f == NULL && msg_has(dir));

    /* a valid file cut in half: the superblock is there, the rest is not */
    const char *good = in_dir("dtypes.h5");
    const char *cut = in_dir("truncated.h5");
    struct stat st;
    CHECK(stat(good, &st) == 0);
    copy_prefix(good, cut, (long)st.st_size / 2);
    rl_status s = rl_h5_open(&f, cut, false);
    if (s == RL_OK) { /* should HDF5 open it anyway, reading the data must still fail */
        rl_tensor r = {0};
        s = rl_h5_read_tensor(f, "f64", &r);
        rl_h5_close(f);
    }
    CHECK(s == RL_EIO && msg_has(cut) && msg_has("truncated"));

    /* the directory of a created file does not exist */
    const char *nodir = in_dir("no/such/dir/x.h5");
    CHECK(rl_h5_create(&f, nodir) == RL_EIO && f == NULL && msg_has(nodir));
}

/* A dataset of n float32 values, chunked (n / 8 a chunk) and deflated when `deflate`, filled
 * with zeros when `write`, otherwise never written (HDF5 then stores nothing for it). */
static void add_floats(hid_t file, const char *name, hsize_t n, bool deflate, bool write) {
    hsize_t chunk[1] = {n / 8};
    hid_t sp = H5Screate_simple(1, &n, NULL), pl = H5Pcreate(H5P_DATASET_CREATE);
    CHECK(sp >= 0 && pl >= 0);
    if (deflate) CHECK(H5Pset_chunk(pl, 1, chunk) >= 0 && H5Pset_deflate(pl, 9) >= 0);
    hid_t d = H5Dcreate2(file, name, H5T_IEEE_F32LE, sp, H5P_DEFAULT, pl, H5P_DEFAULT);
    CHECK(d >= 0);
    if (write) {
        float *z = calloc(n, sizeof *z);
        CHECK(z && H5Dwrite(d, H5T_NATIVE_FLOAT, H5S_ALL, H5S_ALL, H5P_DEFAULT, z) >= 0);
        free(z);
    }
    H5Dclose(d);
    H5Pclose(pl);
    H5Sclose(sp);
}

/* HDF5 reads what a file never stored as zeros: a read of over 16 MiB from a dataset that claims
 * more than 4096 times what is stored is refused before anything is allocated; a deflated one of
 * zeros (about 1000 times smaller), a small unwritten one and a few rows of a large one read. */
static void test_unstored_data(void) {
    const char *p = in_dir("unstored.h5");
    hid_t file = H5Fcreate(p, H5F_ACC_TRUNC, H5P_DEFAULT, H5P_DEFAULT);
    CHECK(file >= 0);
    const hsize_t big = (hsize_t)6 << 20; /* 24 MiB of float32 */
    add_floats(file, "never", big, false, false);
    add_floats(file, "chunks_never", big, true, false);
    add_floats(file, "zeros_deflated", big, true, true);
    add_floats(file, "small_never", 1 << 20, false, false);
    H5Fclose(file);

    rl_h5file *f;
    CHECK_OK(rl_h5_open(&f, p, false));
    rl_tensor r = {0};
    CHECK(rl_h5_read_tensor(f, "never", &r) == RL_EIO && msg_has(p) && msg_has(": never: ") &&
          msg_has("[6291456]") && msg_has("stores 0 bytes") && r.storage == NULL);
    CHECK(rl_h5_read_rows(f, "chunks_never", 0, 5 << 20, &r) == RL_EIO &&
          msg_has(": chunks_never: ") && msg_has("corrupt") && r.storage == NULL);
    CHECK_OK(rl_h5_read_rows(f, "chunks_never", 7, 2, &r));
    CHECK(rl_tensor_numel(&r) == 2 && ((float *)rl_tensor_data(&r))[1] == 0.0f);
    rl_tensor_release(&r);
    CHECK_OK(rl_h5_read_rows(f, "zeros_deflated", 5, 3, &r));
    CHECK(rl_tensor_numel(&r) == 3 && ((float *)rl_tensor_data(&r))[2] == 0.0f);
    rl_tensor_release(&r);
    CHECK_OK(rl_h5_read_tensor(f, "small_never", &r));
    CHECK(rl_tensor_numel(&r) == 1 << 20 && ((float *)rl_tensor_data(&r))[12345] == 0.0f);
    rl_tensor_release(&r);
    CHECK(rl_h5_open_handles(f) == 0);
    rl_h5_close(f);
}

static double f_one(int64_t i) { return 1.0 + (double)i; }
static double f_two(int64_t i) { return 2.0; }

static double first_value(const char *path) {
    rl_h5file *f;
    rl_tensor r = {0};
    double v = -1;
    if (rl_h5_open(&f, path, false) != RL_OK) return v;
    if (rl_h5_read_tensor(f, "v", &r) == RL_OK) {
        v = ((float *)rl_tensor_data(&r))[0];
        rl_tensor_release(&r);
    }
    rl_h5_close(f);
    return v;
}

static void test_atomic_save(void) {
    const char *p = in_dir("atomic.h5");
    char tmp[300];
    rl_h5_temp_name(p, tmp, sizeof tmp);
    int64_t shape[1] = {3};
    rl_tensor one = make(RL_FLOAT32, 1, shape, f_one), two = make(RL_FLOAT32, 1, shape, f_two);
    rl_h5file *f;
    CHECK_OK(rl_h5_create(&f, p));
    CHECK_OK(rl_h5_write_tensor(f, "v", &one));
    CHECK_OK(rl_h5_commit(f));
    CHECK(first_value(p) == 1.0);

    /* a write fails half way ("v" is a dataset, not a group); the caller gives up */
    CHECK_OK(rl_h5_create(&f, p));
    CHECK(file_exists(tmp));
    char host[80];
    CHECK(gethostname(host, sizeof host) == 0);
    CHECK(strstr(tmp, host) != NULL); /* saves from several hosts into one folder stay apart */
    CHECK_OK(rl_h5_write_tensor(f, "v", &two));
    CHECK(rl_h5_write_tensor(f, "v/w", &two) == RL_EIO && msg_has(p) && msg_has("v/w"));
    CHECK(rl_h5_open_handles(f) == 0);
    rl_h5_close(f);
    CHECK(!file_exists(tmp));
    CHECK(first_value(p) == 1.0);

    /* the commit itself fails (a directory sits at the path): the temporary file goes away */
    const char *d = in_dir("adir.h5");
    CHECK(mkdir(d, 0700) == 0);
    CHECK_OK(rl_h5_create(&f, d));
    CHECK_OK(rl_h5_write_tensor(f, "v", &two));
    CHECK(rl_h5_commit(f) == RL_EIO && msg_has(d));
    rl_h5_temp_name(d, tmp, sizeof tmp);
    CHECK(!file_exists(tmp));
    rmdir(d);

    /* a successful save replaces the old file */
    CHECK_OK(rl_h5_create(&f, p));
    CHECK_OK(rl_h5_write_tensor(f, "v", &two));
    CHECK(first_value(p) == 1.0); /* not yet committed */
    CHECK_OK(rl_h5_commit(f));
    CHECK(first_value(p) == 2.0);
    rl_tensor_release(&one);
    rl_tensor_release(&two);
}

static void cleanup(void) {
    const char *names[] = {"dtypes.h5",  "views.h5",     "groups.h5", "foreign.h5",
                           "garbage.h5", "truncated.h5", "atomic.h5"};
    for (size_t i = 0; i < sizeof names / sizeof names[0]; i++)
        unlink(in_dir(names[i]));
    rmdir(dir);
}

int main(void) {
    snprintf(dir, sizeof dir, "/tmp/rl_h5io_XXXXXX");
    if (!mkdtemp(dir)) {
        perror("mkdtemp");
        return 1;
    }
    test_round_trip_dtypes();
    test_views_scalars();
    test_groups_attrs_strings();
    test_foreign_types();
    test_bad_files();
    test_unstored_data();
    test_atomic_save();
    cleanup();
    TEST_MAIN_END();
}
