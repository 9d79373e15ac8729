/* Tests of the random numbers: Philox4x32-10 against the Random123 known answers, the word
 * mapping of rl_op_uniform / rl_op_normal (the contract the CUDA kernels follow), the
 * generator state, and the moments of 1e5 draws. */
#include <math.h>
#include <stdint.h>

#include "../../core/philox.h"
#include "../../core/rng.h"
#include "../../core/tensor.h"
#include "../../kernels/ops.h"
#include "check.h"

static bool block_is(rl_philox_block b, uint32_t w0, uint32_t w1, uint32_t w2, uint32_t w3) {
    bool ok = b.v[0] == w0 && b.v[1] == w1 && b.v[2] == w2 && b.v[3] == w3;
    if (!ok)
        fprintf(stderr, "  philox gave %08x %08x %08x %08x, expected %08x %08x %08x %08x\n", b.v[0],
                b.v[1], b.v[2], b.v[3], w0, w1, w2, w3);
    return ok;
}

/* Random123's kat_vectors for philox4x32_10. rl_philox(seed, stream, counter) takes counter
 * words c0,c1 = low/high of `counter`, c2,c3 = low/high of `stream`, key k0,k1 = low/high of
 * `seed`. */
static void test_known_answers(void) {
    CHECK(block_is(rl_philox(0, 0, 0), 0x6627e8d5u, 0xe169c58du, 0xbc57ac4cu, 0x9b00dbd8u));
    CHECK(block_is(rl_philox(UINT64_MAX, UINT64_MAX, UINT64_MAX), 0x408f276du, 0x41c83b0eu,
                   0xa20bc7c6u, 0x6d5451fdu));
    /* counter {243f6a88 85a308d3 13198a2e 03707344}, key {a4093822 299f31d0} (digits of pi) */
    CHECK(block_is(rl_philox(0x299f31d0a4093822ull, 0x0370734413198a2eull, 0x85a308d3243f6a88ull),
                   0xd16cfe09u, 0x94fdccebu, 0x5001e420u, 0x24126ea1u));
}

static void test_word_mapping(void) {
    rl_philox_block b5 = rl_philox(77, 0, 5), b6 = rl_philox(77, 0, 6);
    CHECK(rl_philox_word(77, 0, 5, 0) == b5.v[0]);
    CHECK(rl_philox_word(77, 0, 5, 3) == b5.v[3]);
    CHECK(rl_philox_word(77, 0, 5, 4) == b6.v[0]);
    CHECK(rl_philox_word(77, 0, 4, 6) == b5.v[2]);
    CHECK(rl_u32_to_unit(0) == 0.0f);
    CHECK(rl_u32_to_unit(0xffffffffu) < 1.0f);
    CHECK(rl_u32_to_unit(0xffffffffu) == 1.0f - 1.0f / 16777216.0f);
    CHECK(rl_u32_to_unit_open(0) > 0.0);
    CHECK(rl_u32_to_unit_open(0xffffffffu) == 1.0);
}

static rl_tensor make(rl_dtype dt, int nd, const int64_t *shape) {
    rl_tensor t = {0};
    CHECK_OK(rl_tensor_empty(&t, dt, RL_DEVICE_CPU, nd, shape));
    return t;
}

static double at(const rl_tensor *t, int64_t i) { return rl_tensor_get(t, &i); }

/* The values follow ops.c's documented formulas element by element, in row-major order of the
 * tensor's own shape (here a transposed view, so memory order differs). */
static void test_op_mapping(void) {
    rl_rng g;
    rl_rng_seed(&g, 1234);
    g.offset = 10;
    int64_t s[2] = {3, 5};
    rl_tensor base = make(RL_FLOAT32, 2, s), t = {0};
    CHECK_OK(rl_tensor_transpose(&t, &base, 0, 1)); /* (5, 3) */
    CHECK_OK(rl_op_uniform(&t, &g, -1.0, 3.0));
    CHECK(g.offset == 10 + 4); /* 15 words: 4 blocks */
    int bad = 0;
    for (int64_t i = 0; i < 15; i++) {
        int64_t idx[2] = {i / 3, i % 3};
        double want = -1.0 + 4.0 * (double)rl_u32_to_unit(rl_philox_word(1234, 0, 10, i));
        bad += rl_tensor_get(&t, idx) != (double)(float)want;
    }
    CHECK(bad == 0);
    CHECK_OK(rl_op_normal(&t, &g, 0.5, 2.0));
    CHECK(g.offset == 14 + 8); /* 30 words: 8 blocks */
    bad = 0;
    for (int64_t i = 0; i < 15; i++) {
        int64_t idx[2] = {i / 3, i % 3};
        uint32_t w0 = rl_philox_word(1234, 0, 14, 2 * i),
                 w1 = rl_philox_word(1234, 0, 14, 2 * i + 1);
        double z = sqrt(-2.0 * log(((double)w0 + 1.0) / 4294967296.0)) *
                   cos(2.0 * 3.14159265358979323846 * (double)rl_u32_to_unit(w1));
        bad += rl_tensor_get(&t, idx) != (double)(float)(0.5 + 2.0 * z);
    }
    CHECK(bad == 0);
    rl_tensor_release(&t);
    rl_tensor_release(&base);
}

static void test_generators(void) {
    int64_t n = 1000;
    rl_tensor a = make(RL_FLOAT64, 1, &n), b = make(RL_FLOAT64, 1, &n), c = make(RL_FLOAT64, 1, &n);
    rl_rng g1, g2, g3;
    rl_rng_seed(&g1, 42);
    rl_rng_seed(&g2, 42);
    rl_rng_seed(&g3, 43);
    CHECK_OK(rl_op_uniform(&a, &g1, 0, 1));
    CHECK_OK(rl_op_uniform(&b, &g2, 0, 1));
    CHECK_OK(rl_op_uniform(&c, &g3, 0, 1));
    int same = 0, same_other = 0;
    for (int64_t i = 0; i < n; i++) {
        same += at(&a, i) == at(&b, i);
        same_other += at(&a, i) == at(&c, i);
    }
    CHECK(same == n);
    CHECK(same_other < 5);
    /* the next draw continues the stream instead of repeating it */
    CHECK_OK(rl_op_uniform(&b, &g2, 0, 1));
    int repeat = 0;
    for (int64_t i = 0; i < n; i++)
        repeat += at(&a, i) == at(&b, i);
    CHECK(repeat < 5);
    /* re-seeding starts over */
    rl_rng_seed(&g2, 42);
    CHECK_OK(rl_op_normal(&a, &g1, 0, 1));
    CHECK_OK(rl_op_uniform(&b, &g2, 0, 1));
    CHECK_OK(rl_op_normal(&b, &g2, 0, 1));
    same = 0;
    for (int64_t i = 0; i < n; i++)
        same += at(&a, i) == at(&b, i);
    CHECK(same == n);
    /* no generator: the default one advances */
    uint64_t before = rl_rng_default()->offset;
    CHECK_OK(rl_op_uniform(&c, NULL, 0, 1));
    CHECK(rl_rng_default()->offset == before + 250);
    /* int32 tensors are refused */
    rl_tensor i32 = make(RL_INT32, 1, &n);
    CHECK(rl_op_uniform(&i32, &g1, 0, 1) == RL_EDTYPE);
    CHECK(rl_op_normal(&i32, &g1, 0, 1) == RL_EDTYPE);
    rl_tensor_release(&i32);
    rl_tensor_release(&a);
    rl_tensor_release(&b);
    rl_tensor_release(&c);
}

static void test_moments(void) {
    int64_t n = 100000;
    rl_tensor u = make(RL_FLOAT32, 1, &n), z = make(RL_FLOAT32, 1, &n);
    rl_rng g;
    rl_rng_seed(&g, 7);
    CHECK_OK(rl_op_uniform(&u, &g, -2.0, 3.0));
    CHECK_OK(rl_op_normal(&z, &g, 1.5, 0.5));
    double su = 0, su2 = 0, sz = 0, sz2 = 0, lo = 1e9, hi = -1e9;
    for (int64_t i = 0; i < n; i++) {
        double x = at(&u, i), y = at(&z, i);
        su += x;
        su2 += x * x;
        sz += y;
        sz2 += y * y;
        lo = x < lo ? x : lo;
        hi = x > hi ? x : hi;
    }
    double mu = su / n, vu = su2 / n - mu * mu, mz = sz / n, sdz = sqrt(sz2 / n - mz * mz);
    /* uniform on [-2, 3): mean 0.5, variance 25/12; standard errors about 0.005 and 0.01 */
    CHECK_NEAR(mu, 0.5, 0.03);
    CHECK_NEAR(vu, 25.0 / 12.0, 0.05);
    CHECK(lo >= -2.0 && hi < 3.0 && lo < -1.99 && hi > 2.99);
    /* normal(1.5, 0.5): standard errors about 0.0016 and 0.0011 */
    CHECK_NEAR(mz, 1.5, 0.01);
    CHECK_NEAR(sdz, 0.5, 0.01);
    rl_tensor_release(&u);
    rl_tensor_release(&z);
}

int main(void) {
    rl_ops_init();
    test_known_answers();
    test_word_mapping();
    test_op_mapping();
    test_generators();
    test_moments();
    TEST_MAIN_END();
}
