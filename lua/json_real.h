/* A float32 written as JSON the way jansson writes a real with JSON_REAL_PRECISION(9) (the
 * server's answers, lua/serve.c): printf's "%.9g" (9 significant digits, which read back as the
 * same float32), ".0" appended to an integral value, the exponent without '+' or leading zeros
 * ("1e+39" -> "1e39", "1e-05" -> "1e-5"). The digits are found with integer arithmetic, exactly
 * as printf rounds (to nearest, ties to even), at a tenth of snprintf's cost: an answer of 64
 * streams' frames is thousands of numbers, and snprintf was most of the time spent writing it.
 * Floats whose digits need more than 128 bits (below 1e-36) go through snprintf. */
#ifndef RL_JSON_REAL_H
#define RL_JSON_REAL_H

#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

/* jansson's form of snprintf's text in buf (len bytes): ".0" on an integral value, no '+' or
 * leading zeros in the exponent. Returns the new length. */
static inline int rl_json_real_fix(char *buf, int len) {
    if (strchr(buf, '.') == NULL && strchr(buf, 'e') == NULL) {
        memcpy(buf + len, ".0", 3);
        len += 2;
    }
    char *start = strchr(buf, 'e');
    if (start) { /* jansson's jsonp_dtostr */
        start++;
        char *end = start + 1;
        if (*start == '-') start++;
        while (*end == '0')
            end++;
        if (end != start) {
            memmove(start, end, (size_t)len - (size_t)(end - buf) + 1);
            len -= (int)(end - start);
        }
    }
    return len;
}

/* The reference: snprintf, then jansson's changes. buf holds at least 32 bytes. */
static inline int rl_json_real_slow(char *buf, double v) {
    int len = snprintf(buf, 32, "%.9g", v);
    return rl_json_real_fix(buf, len);
}

/* round(a * 2^e * 10^s) to nearest, ties to even, for a < 2^24 (a float's significand) and
 * the floor in *fl; false when it does not fit in 128 bits. */
static inline int rl_json_real_scaled(uint32_t m, int e, int s, unsigned __int128 *q,
                                      unsigned __int128 *fl) {
    typedef unsigned __int128 u128;
    if (s >= 0) {
        if (s > 44) return 0; /* m * 5^s stays below 2^128 up to 5^44 */
        u128 p = m;
        for (int i = 0; i < s; i++)
            p *= 5;
        int E = e + s; /* a * 10^s = m * 5^s * 2^(e + s) */
        if (E >= 0) {
            if (E >= 128 || (p >> (127 - E)) != 0) return 0;
            *q = *fl = p << E;
            return 1;
        }
        int k = -E;
        if (k >= 128) {
            *q = *fl = 0;
            return 1;
        }
        u128 f = p >> k, r = p & (((u128)1 << k) - 1), half = (u128)1 << (k - 1);
        *fl = f;
        *q = f + (r > half || (r == half && (f & 1)));
        return 1;
    }
    if (e < 0 || e > 104) return 0;
    u128 p = (u128)m << e, d = 1; /* below 2^128: a float is below 2^128 */
    for (int i = 0; i < -s; i++)
        d *= 10;
    u128 f = p / d, r = p % d;
    *fl = f;
    *q = f + (2 * r > d || (2 * r == d && (f & 1)));
    return 1;
}

/* Writes f into buf (at least 32 bytes) as jansson writes (double)f with JSON_REAL_PRECISION(9);
 * returns the length (the zero that ends it not counted). NaN and infinities (which JSON cannot
 * hold; the server refuses them before) take snprintf's path, so no input reaches the integer
 * arithmetic below with an exponent it cannot hold. */
static inline int rl_json_real(char *buf, float f) {
    if (!isfinite(f)) return rl_json_real_slow(buf, (double)f);
    uint32_t bits;
    memcpy(&bits, &f, sizeof bits);
    char *p = buf;
    if (bits >> 31) *p++ = '-';
    uint32_t ex = (bits >> 23) & 0xff, m = bits & 0x7fffff;
    if (ex == 0 && m == 0) {
        memcpy(p, "0.0", 4);
        return (int)(p - buf) + 3;
    }
    int e;
    if (ex == 0) {
        e = -149;
    } else {
        m |= 0x800000;
        e = (int)ex - 150;
    }
    /* d: the decimal exponent of the first digit, estimated then corrected exactly */
    int d = (int)floor(log10(fabs((double)f)));
    unsigned __int128 q = 0, fl = 0;
    for (int tries = 0;; tries++) {
        if (tries == 3 || !rl_json_real_scaled(m, e, 8 - d, &q, &fl))
            return rl_json_real_slow(buf, (double)f);
        if (fl < 100000000)
            d--;
        else if (fl >= 1000000000)
            d++;
        else
            break;
    }
    if (q == 1000000000) { /* rounded up to the next power of ten */
        q = 100000000;
        d++;
    }
    char dig[9];
    uint32_t n = (uint32_t)q;
    for (int i = 8; i >= 0; i--, n /= 10)
        dig[i] = (char)('0' + n % 10);
    int nd = 9; /* %g drops the trailing zeros */
    while (nd > 1 && dig[nd - 1] == '0')
        nd--;
    if (d < -4 || d >= 9) { /* exponential: d.ddde-5, 1e39 */
        *p++ = dig[0];
        if (nd > 1) {
            *p++ = '.';
            memcpy(p, dig + 1, (size_t)nd - 1);
            p += nd - 1;
        }
        *p++ = 'e';
        int x = d;
        if (x < 0) *p++ = '-', x = -x;
        if (x >= 10) *p++ = (char)('0' + x / 10);
        *p++ = (char)('0' + x % 10);
    } else if (d >= 0) { /* 123.45, 100.0 */
        memcpy(p, dig, (size_t)d + 1);
        p += d + 1;
        *p++ = '.';
        if (nd > d + 1) {
            memcpy(p, dig + d + 1, (size_t)(nd - d - 1));
            p += nd - d - 1;
        } else {
            *p++ = '0';
        }
    } else { /* 0.00123 */
        *p++ = '0';
        *p++ = '.';
        for (int i = 0; i < -d - 1; i++)
            *p++ = '0';
        memcpy(p, dig, (size_t)nd);
        p += nd;
    }
    *p = '\0';
    return (int)(p - buf);
}

#endif
