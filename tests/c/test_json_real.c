/* The server's float writer (lua/json_real.h) against its reference, snprintf's "%.9g" with
 * jansson's changes: the same text for every sign and exponent, the powers of ten and their
 * neighbours (where the first digit's place and the rounding up to a power of ten are
 * decided), halfway cases, subnormals, and a spread of 2 million bit patterns. RL_JSON_REAL_ALL=1
 * compares every float (about 20 minutes). */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "../../lua/json_real.h"
#include "check.h"

static long mismatches;

static void same(float f) {
    char a[64], b[64];
    int na = rl_json_real(a, f), nb = rl_json_real_slow(b, (double)f);
    if (na == nb && strcmp(a, b) == 0 && (int)strlen(a) == na) return;
    if (mismatches++ < 20) {
        uint32_t bits;
        memcpy(&bits, &f, sizeof bits);
        fprintf(stderr, "  %08x: '%s' (%d), expected '%s' (%d)\n", (unsigned)bits, a, na, b, nb);
    }
}

static float from_bits(uint32_t bits) {
    float f;
    memcpy(&f, &bits, sizeof f);
    return f;
}

int main(void) {
    /* powers of ten and ten ulps either side of each, both signs */
    for (int x = -45; x <= 38; x++) {
        float f = (float)pow(10.0, x);
        uint32_t bits;
        memcpy(&bits, &f, sizeof bits);
        for (int k = -10; k <= 10; k++) {
            uint32_t b = bits + (uint32_t)k;
            if (((b >> 23) & 0xff) == 0xff) continue;
            same(from_bits(b));
            same(from_bits(b | 0x80000000u));
        }
    }
    CHECK(mismatches == 0);
    /* values that print exactly, halfway cases of the 9th digit, integers, the extremes */
    float special[] = {0.0f,
                       -0.0f,
                       1.0f,
                       0.5f,
                       0.1f,
                       1e-5f,
                       1e-4f,
                       1e8f,
                       1e9f,
                       123456789.0f,
                       999999999.f,
                       999999940.f,
                       16777216.0f,
                       3.40282347e38f,
                       1.17549435e-38f,
                       1.4e-45f,
                       2.5e-45f,
                       9.99999944e-5f,
                       0.000123456789f,
                       5.96046448e-8f};
    for (size_t i = 0; i < sizeof special / sizeof *special; i++) {
        same(special[i]);
        same(-special[i]);
    }
    for (uint32_t i = 0; i < 2000000; i++) /* every exponent, every sign */
        same(from_bits((uint32_t)(i * 2147.483648) & 0xffffffffu));
    for (uint32_t i = 0; i < 1000000; i++) /* small integers and their halves */
        same((float)i * 0.5f);
    CHECK(mismatches == 0);
    srand(1);
    for (int i = 0; i < 1000000; i++) {
        uint32_t b = ((uint32_t)rand() << 16) ^ (uint32_t)rand();
        if (((b >> 23) & 0xff) != 0xff) same(from_bits(b));
    }
    CHECK(mismatches == 0);
    const char *all = getenv("RL_JSON_REAL_ALL");
    if (all && strcmp(all, "1") == 0) {
        for (uint64_t b = 0; b <= 0xffffffffu; b++)
            if ((((uint32_t)b >> 23) & 0xff) != 0xff) same(from_bits((uint32_t)b));
        CHECK(mismatches == 0);
    }
    TEST_MAIN_END();
}
