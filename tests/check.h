/*
 * The unit tests' checks: each failed check prints what and where, and the
 * test's main returns check_summary(), non-zero when anything failed.
 * Numeric comparisons print the first mismatching pairs and the max error
 * against the tolerance (llm.c's check_tensor, but one that can fail).
 */
#ifndef LOOM_TESTS_CHECK_H
#define LOOM_TESTS_CHECK_H

#include <math.h>
#include <spawn.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/wait.h>

static int check_failures;
static int check_count;

#define CHECK(cond)                                                                                          \
    do {                                                                                                     \
        check_count++;                                                                                       \
        if (!(cond)) {                                                                                       \
            check_failures++;                                                                                \
            fprintf(stderr, "FAIL %s:%d: %s\n", __FILE__, __LINE__, #cond);                                  \
        }                                                                                                    \
    } while (0)

/* Max relative error |a-b| / max(|b|, floor) over the tensor; floor keeps
 * near-zero entries from dominating (it is the scale below which an absolute
 * error is what matters). With CHECK_VERBOSE=1 in the environment every
 * comparison prints its measured error against its tolerance, passing or
 * not: how a bound's margin is measured on a machine. */
static inline int check_close(const char *name, const float *got, const float *want, size_t n, double rtol,
                              double floor)
{
    double max_err = 0;
    int shown = 0;
    size_t bad = 0;
    for (size_t i = 0; i < n; i++) {
        double scale = fabs(want[i]) > floor ? fabs(want[i]) : floor;
        double err = fabs((double)got[i] - want[i]) / scale;
        if (!(err <= rtol)) {
            bad++;
            if (shown < 5) {
                fprintf(stderr, "  %s[%zu]: got %.9g want %.9g\n", name, i, got[i], want[i]);
                shown++;
            }
        }
        if (err > max_err || err != err) max_err = err;
    }
    check_count++;
    if (getenv("CHECK_VERBOSE") && *getenv("CHECK_VERBOSE") == '1')
        printf("  measured %s: max rel err %.3g, tol %.3g\n", name, max_err, rtol);
    if (bad) {
        check_failures++;
        fprintf(stderr, "FAIL %s: %zu of %zu mismatch, max rel err %.3g > tol %.3g\n", name, bad, n, max_err,
                rtol);
        return 0;
    }
    return 1;
}

/* Relative L2 error ||a-b|| / ||b||. */
static inline double rel_l2(const float *got, const float *want, size_t n)
{
    double num = 0, den = 0;
    for (size_t i = 0; i < n; i++) {
        double d = (double)got[i] - want[i];
        num += d * d;
        den += (double)want[i] * want[i];
    }
    return den > 0 ? sqrt(num / den) : sqrt(num);
}

/* Seeded inputs: the state of one splitmix64 stream (a test sets its seed
 * first), its next value, n floats uniform in [-scale, scale) in multiples
 * of 2^-12 (x +- h exact for finite differences), n copies of v (both
 * malloc'ed); and check_scaled: got vs want with the error measured
 * against the tensor's scale, max |got - want| / max |want| (entries near
 * zero, results of cancellation, are judged by the absolute error a float
 * tensor of that scale can have, not by their own size). */
static inline uint64_t *check_rng(void)
{
    static uint64_t state = 0x9e3779b97f4a7c15ull;
    return &state;
}

static inline uint64_t check_rng_next(void)
{
    uint64_t z = (*check_rng() += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

static inline float *check_rand(size_t n, float scale)
{
    float *x = malloc(n * sizeof(float));
    for (size_t i = 0; i < n; i++) {
        const double u = (double)(check_rng_next() >> 11) / 9007199254740992.0;
        x[i] = (float)(nearbyint((2.0 * u - 1.0) * scale * 4096.0) / 4096.0);
    }
    return x;
}

static inline float *check_const(size_t n, float v)
{
    float *x = malloc(n * sizeof(float));
    for (size_t i = 0; i < n; i++) x[i] = v;
    return x;
}

static inline int check_scaled(const char *name, const float *got, const float *want, size_t n, double tol)
{
    double scale = 0.0;
    for (size_t i = 0; i < n; i++) scale = fabs(want[i]) > scale ? fabs(want[i]) : scale;
    return check_close(name, got, want, n, tol, scale > 0 ? scale : 1e-30);
}

/* Runs this program again with argv (argv[0] its name), for what a
 * process chooses once (the bf16 units); checks that it exits 0. */
extern char **environ;
static inline void check_run_self(char *const argv[])
{
    fflush(stdout);
    fflush(stderr);
    pid_t pid;
    int status = 0;
    const int rc = posix_spawn(&pid, "/proc/self/exe", NULL, NULL, argv, environ);
    CHECK(rc == 0);
    if (rc == 0) {
        CHECK(waitpid(pid, &status, 0) == pid);
        CHECK(WIFEXITED(status) && WEXITSTATUS(status) == 0);
    }
}

static inline int check_summary(const char *test)
{
    printf("%s: %d checks, %d failed\n", test, check_count, check_failures);
    return check_failures ? 1 : 0;
}

#endif
