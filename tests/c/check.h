/* A minimal test harness for the C unit tests: CHECK counts a pass or prints the failing
 * expression with its place, and TEST_MAIN_END prints the closing "N passed, N failed" line
 * that tests/run.sh adds up. A test program exits non-zero when anything failed. */
#ifndef RL_CHECK_H
#define RL_CHECK_H

#include <math.h>
#include <stdio.h>

/* atomic: some tests check from several threads at once (a plain int lost counts there, and
 * with them possibly a failure) */
static _Atomic int check_passed, check_failed;

#define CHECK(cond)                                                                                \
    do {                                                                                           \
        if (cond) {                                                                                \
            check_passed++;                                                                        \
        } else {                                                                                   \
            check_failed++;                                                                        \
            fprintf(stderr, "%s:%d: CHECK failed: %s\n", __FILE__, __LINE__, #cond);               \
        }                                                                                          \
    } while (0)

/* Check a status; on failure print the library's error message. */
#define CHECK_OK(expr)                                                                             \
    do {                                                                                           \
        rl_status check_st_ = (expr);                                                              \
        if (check_st_ == RL_OK) {                                                                  \
            check_passed++;                                                                        \
        } else {                                                                                   \
            check_failed++;                                                                        \
            fprintf(stderr, "%s:%d: %s failed: %s\n", __FILE__, __LINE__, #expr, rl_errmsg());     \
        }                                                                                          \
    } while (0)

#define CHECK_NEAR(a, b, tol)                                                                      \
    do {                                                                                           \
        double check_a_ = (a), check_b_ = (b);                                                     \
        if (fabs(check_a_ - check_b_) <= (tol)) {                                                  \
            check_passed++;                                                                        \
        } else {                                                                                   \
            check_failed++;                                                                        \
            fprintf(stderr, "%s:%d: %s = %.9g, expected %.9g (tol %g)\n", __FILE__, __LINE__, #a,  \
                    check_a_, check_b_, (double)(tol));                                            \
        }                                                                                          \
    } while (0)

#define TEST_MAIN_END()                                                                            \
    do {                                                                                           \
        printf("%d passed, %d failed\n", check_passed, check_failed);                              \
        return check_failed ? 1 : 0;                                                               \
    } while (0)

#endif
