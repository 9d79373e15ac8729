/* Tests of storage and views (core/tensor.h): every view shares its source's storage and holds
 * a reference of its own, writes through a view reach the source, geometry (shape, strides,
 * offset, contiguity) is what the header promises, and bad arguments fail with a message and
 * leave `out` unset. */
#include <stdint.h>
#include <string.h>

#include "../../core/tensor.h"
#include "check.h"

static bool has(const char *msg, const char *part) { return strstr(msg, part) != NULL; }

static bool shape_is(const rl_tensor *t, int nd, int64_t s0, int64_t s1, int64_t s2) {
    int64_t want[3] = {s0, s1, s2};
    if (t->ndim != nd) return false;
    for (int d = 0; d < nd; d++)
        if (t->shape[d] != want[d]) return false;
    return true;
}

/* base (2, 3, 4) float32 holding 0..23 */
static rl_tensor make_base(void) {
    int64_t s[3] = {2, 3, 4};
    rl_tensor t = {0};
    CHECK_OK(rl_tensor_empty(&t, RL_FLOAT32, RL_DEVICE_CPU, 3, s));
    float *p = rl_tensor_data(&t);
    for (int i = 0; i < 24; i++)
        p[i] = (float)i;
    return t;
}

static double get3(const rl_tensor *t, int64_t i, int64_t j, int64_t k) {
    int64_t idx[3] = {i, j, k};
    return rl_tensor_get(t, idx);
}

static void test_basics(void) {
    rl_tensor t = make_base();
    CHECK(t.storage->refcount == 1);
    CHECK(t.stride[0] == 12 && t.stride[1] == 4 && t.stride[2] == 1 && t.offset == 0);
    CHECK(rl_tensor_numel(&t) == 24 && rl_tensor_is_contiguous(&t));
    CHECK(t.storage->nbytes == 24 * sizeof(float));
    char buf[128];
    CHECK(strcmp(rl_shape_str(&t, buf, sizeof buf), "(2, 3, 4)") == 0);
    CHECK(strcmp(rl_tensor_describe(&t, buf, sizeof buf), "float32 (2, 3, 4) on cpu") == 0);
    CHECK(get3(&t, 1, 2, 3) == 23);
    rl_tensor u = {0};
    rl_tensor_share(&u, &t);
    CHECK(u.storage == t.storage && t.storage->refcount == 2);
    rl_tensor_release(&u);
    CHECK(u.storage == NULL && t.storage->refcount == 1);
    rl_tensor_release(&u); /* releasing an unset tensor is a no-op */
    /* a 0-d tensor holds one element */
    rl_tensor s = {0};
    CHECK_OK(rl_tensor_empty(&s, RL_FLOAT64, RL_DEVICE_CPU, 0, NULL));
    CHECK(rl_tensor_numel(&s) == 1 && rl_tensor_is_contiguous(&s));
    rl_tensor_set(&s, NULL, 2.5);
    CHECK(rl_tensor_get(&s, NULL) == 2.5);
    CHECK(strcmp(rl_shape_str(&s, buf, sizeof buf), "()") == 0);
    rl_tensor_release(&s);
    /* dtypes and devices by name */
    rl_dtype dt;
    rl_device dev;
    CHECK_OK(rl_dtype_parse("int32", &dt));
    CHECK(dt == RL_INT32 && rl_dtype_size(dt) == 4 && strcmp(rl_dtype_name(dt), "int32") == 0);
    CHECK(rl_dtype_parse("float16", &dt) != RL_OK);
    CHECK_OK(rl_device_parse("cpu", &dev));
    CHECK(rl_device_eq(dev, RL_DEVICE_CPU));
    CHECK_OK(rl_device_parse("cuda:1", &dev));
    CHECK(dev.type == RL_CUDA && dev.index == 1);
    CHECK(rl_device_parse("tpu", &dev) != RL_OK);
    /* bad shapes */
    int64_t neg[2] = {2, -1};
    CHECK(rl_tensor_empty(&u, RL_FLOAT32, RL_DEVICE_CPU, 2, neg) == RL_ESHAPE);
    CHECK(u.storage == NULL);
    CHECK(rl_tensor_empty(&u, RL_FLOAT32, RL_DEVICE_CPU, RL_MAX_DIMS + 1, neg) == RL_ESHAPE);
    rl_tensor_release(&t);
}

static void test_narrow_select(void) {
    rl_tensor t = make_base(), n = {0}, s = {0}, nn = {0};
    CHECK_OK(rl_tensor_narrow(&n, &t, 2, 1, 2));
    CHECK(n.storage == t.storage && t.storage->refcount == 2);
    CHECK(shape_is(&n, 3, 2, 3, 2) && n.offset == 1 && n.stride[2] == 1 && n.stride[1] == 4);
    CHECK(!rl_tensor_is_contiguous(&n));
    CHECK(get3(&n, 1, 2, 1) == 12 + 8 + 2);
    /* narrowing the first dim keeps contiguity */
    CHECK_OK(rl_tensor_narrow(&nn, &t, 0, 1, 1));
    CHECK(rl_tensor_is_contiguous(&nn) && nn.offset == 12);
    /* writes through a view reach the source */
    int64_t i3[3] = {0, 1, 0};
    rl_tensor_set(&n, i3, -7);
    CHECK(get3(&t, 0, 1, 1) == -7);
    CHECK_OK(rl_tensor_select(&s, &n, 1, 2)); /* (2, 2) */
    CHECK(s.ndim == 2 && s.shape[0] == 2 && s.shape[1] == 2 && s.offset == 1 + 8);
    CHECK(s.stride[0] == 12 && s.stride[1] == 1 && t.storage->refcount == 4);
    int64_t i2[2] = {1, 1};
    CHECK(rl_tensor_get(&s, i2) == 12 + 8 + 2);
    /* a view keeps the storage alive after its source is gone */
    rl_tensor_release(&t);
    rl_tensor_release(&n);
    rl_tensor_release(&nn);
    CHECK(s.storage->refcount == 1);
    CHECK(rl_tensor_get(&s, i2) == 22);
    /* errors leave out unset and name the function */
    rl_tensor bad = {0};
    CHECK(rl_tensor_narrow(&bad, &s, 1, 1, 2) == RL_EINDEX);
    CHECK(has(rl_errmsg(), "narrow") && bad.storage == NULL);
    CHECK(rl_tensor_narrow(&bad, &s, 2, 0, 1) == RL_EINDEX);
    CHECK(rl_tensor_select(&bad, &s, 0, 2) == RL_EINDEX);
    CHECK(has(rl_errmsg(), "select") && bad.storage == NULL);
    CHECK(s.storage->refcount == 1);
    /* a zero-length narrow is fine */
    CHECK_OK(rl_tensor_narrow(&bad, &s, 0, 2, 0));
    CHECK(rl_tensor_numel(&bad) == 0);
    rl_tensor_release(&bad);
    rl_tensor_release(&s);
}

static void test_transpose_permute(void) {
    rl_tensor t = make_base(), tr = {0}, p = {0}, bad = {0};
    CHECK_OK(rl_tensor_transpose(&tr, &t, 0, 2));
    CHECK(shape_is(&tr, 3, 4, 3, 2) && tr.stride[0] == 1 && tr.stride[2] == 12);
    CHECK(tr.storage == t.storage && !rl_tensor_is_contiguous(&tr));
    CHECK(get3(&tr, 3, 1, 1) == get3(&t, 1, 1, 3));
    int perm[3] = {1, 2, 0};
    CHECK_OK(rl_tensor_permute(&p, &t, perm));
    CHECK(shape_is(&p, 3, 3, 4, 2) && p.stride[0] == 4 && p.stride[1] == 1 && p.stride[2] == 12);
    CHECK(get3(&p, 2, 3, 1) == get3(&t, 1, 2, 3));
    CHECK(t.storage->refcount == 3);
    int dup[3] = {0, 0, 1};
    CHECK(rl_tensor_permute(&bad, &t, dup) != RL_OK);
    CHECK(has(rl_errmsg(), "permute") && bad.storage == NULL);
    CHECK(rl_tensor_transpose(&bad, &t, 0, 3) == RL_EINDEX && bad.storage == NULL);
    /* transposing twice gives back a contiguous view */
    rl_tensor back = {0};
    CHECK_OK(rl_tensor_transpose(&back, &tr, 0, 2));
    CHECK(rl_tensor_is_contiguous(&back) && rl_tensor_same_shape(&back, &t));
    rl_tensor_release(&back);
    rl_tensor_release(&tr);
    rl_tensor_release(&p);
    CHECK(t.storage->refcount == 1);
    rl_tensor_release(&t);
}

static void test_view_squeeze_expand(void) {
    rl_tensor t = make_base(), v = {0}, tr = {0}, bad = {0};
    int64_t s2[2] = {6, -1};
    CHECK_OK(rl_tensor_view(&v, &t, 2, s2));
    CHECK(v.ndim == 2 && v.shape[0] == 6 && v.shape[1] == 4 && v.storage == t.storage);
    CHECK(v.stride[0] == 4 && v.stride[1] == 1);
    int64_t s5[2] = {5, -1}, s7[2] = {4, 7}, s2m[2] = {-1, -1};
    CHECK(rl_tensor_view(&bad, &t, 2, s5) == RL_ESHAPE);
    CHECK(has(rl_errmsg(), "view"));
    CHECK(rl_tensor_view(&bad, &t, 2, s7) == RL_ESHAPE);
    CHECK(rl_tensor_view(&bad, &t, 2, s2m) == RL_ESHAPE && bad.storage == NULL);
    CHECK_OK(rl_tensor_transpose(&tr, &t, 0, 1));
    int64_t s24[1] = {24};
    CHECK(rl_tensor_view(&bad, &tr, 1, s24) == RL_ESHAPE);
    CHECK(has(rl_errmsg(), "contiguous") && bad.storage == NULL);
    /* view of a narrowed-but-contiguous tensor keeps its offset */
    rl_tensor row = {0}, rv = {0};
    CHECK_OK(rl_tensor_narrow(&row, &t, 0, 1, 1));
    int64_t s12[1] = {12};
    CHECK_OK(rl_tensor_view(&rv, &row, 1, s12));
    int64_t i0 = 0;
    CHECK(rv.offset == 12 && rl_tensor_get(&rv, &i0) == 12);
    rl_tensor_release(&rv);
    rl_tensor_release(&row);

    /* unsqueeze / squeeze */
    rl_tensor u = {0}, u2 = {0}, q = {0}, q1 = {0};
    CHECK_OK(rl_tensor_unsqueeze(&u, &t, 1)); /* (2, 1, 3, 4) */
    CHECK(u.ndim == 4 && u.shape[1] == 1 && u.shape[2] == 3 && rl_tensor_is_contiguous(&u));
    CHECK_OK(rl_tensor_unsqueeze(&u2, &u, 4)); /* (2, 1, 3, 4, 1) */
    CHECK(u2.ndim == 5 && u2.shape[4] == 1 && rl_tensor_is_contiguous(&u2));
    CHECK(rl_tensor_unsqueeze(&bad, &u2, 0) == RL_ESHAPE && bad.storage == NULL);
    CHECK(rl_tensor_unsqueeze(&bad, &t, 4) == RL_EINDEX);
    CHECK_OK(rl_tensor_squeeze(&q, &u2, -1));
    CHECK(rl_tensor_same_shape(&q, &t) && q.stride[0] == 12 && q.stride[2] == 1);
    CHECK_OK(rl_tensor_squeeze(&q1, &u2, 1));
    CHECK(q1.ndim == 4 && q1.shape[3] == 1);
    CHECK(t.storage->refcount == 7);
    rl_tensor_release(&u);
    rl_tensor_release(&u2);
    rl_tensor_release(&q);
    rl_tensor_release(&q1);

    /* expand: stride 0 on size-1 dims and on new leading dims */
    rl_tensor col = {0}, e = {0};
    CHECK_OK(rl_tensor_narrow(&col, &v, 1, 2, 1)); /* (6, 1) */
    int64_t es[3] = {2, 6, 5};
    CHECK_OK(rl_tensor_expand(&e, &col, 3, es));
    CHECK(e.ndim == 3 && e.stride[0] == 0 && e.stride[1] == 4 && e.stride[2] == 0);
    CHECK(e.storage == t.storage && !rl_tensor_is_contiguous(&e));
    CHECK(get3(&e, 1, 5, 4) == 22);
    int64_t bs[2] = {7, 1};
    CHECK(rl_tensor_expand(&bad, &col, 2, bs) == RL_ESHAPE && bad.storage == NULL);
    CHECK(has(rl_errmsg(), "expand"));
    rl_tensor_release(&e);
    rl_tensor_release(&col);

    /* broadcast shapes */
    rl_tensor a = {0}, b = {0};
    int64_t sa[2] = {3, 1}, sb[2] = {1, 4};
    CHECK_OK(rl_tensor_empty(&a, RL_FLOAT32, RL_DEVICE_CPU, 2, sa));
    CHECK_OK(rl_tensor_empty(&b, RL_FLOAT32, RL_DEVICE_CPU, 2, sb));
    int nd;
    int64_t out[RL_MAX_DIMS];
    CHECK_OK(rl_broadcast_shape("add", &a, &b, &nd, out));
    CHECK(nd == 2 && out[0] == 3 && out[1] == 4);
    CHECK_OK(rl_broadcast_shape("add", &t, &b, &nd, out));
    CHECK(nd == 3 && out[0] == 2 && out[1] == 3 && out[2] == 4);
    CHECK(rl_broadcast_shape("mul", &a, &v, &nd, out) == RL_ESHAPE);
    CHECK(has(rl_errmsg(), "mul") && has(rl_errmsg(), "(3, 1)") && has(rl_errmsg(), "(6, 4)"));
    rl_tensor_release(&a);
    rl_tensor_release(&b);
    rl_tensor_release(&tr);
    rl_tensor_release(&v);
    CHECK(t.storage->refcount == 1);
    rl_tensor_release(&t);
}

/* Empty tensors: a fresh tensor is contiguous whatever its shape, so that view() takes it. */
static void test_empty_tensors(void) {
    int64_t s[2] = {2, 0}, s0[1] = {0};
    rl_tensor t = {0}, v = {0};
    CHECK_OK(rl_tensor_empty(&t, RL_FLOAT32, RL_DEVICE_CPU, 2, s));
    CHECK(rl_tensor_numel(&t) == 0);
    CHECK(rl_tensor_is_contiguous(&t));
    CHECK_OK(rl_tensor_view(&v, &t, 1, s0));
    rl_tensor_release(&v);
    rl_tensor_release(&t);
}

int main(void) {
    test_basics();
    test_narrow_select();
    test_transpose_permute();
    test_view_squeeze_expand();
    test_empty_tensors();
    TEST_MAIN_END();
}
