/*
 * The order-free sum of squares (base/sumsq_exact.h), the gradient norm of
 * --layout-invariant: the same bins whatever the order of the additions,
 * however the values are split into parts whose limbs are summed (as
 * ranks sum them) and however many threads and chunks add them; exact where
 * a double sum loses the small squares, and for the smallest subnormal; the
 * value the exact sum rounded once (ties to even, a carry out of the
 * rounding) and within a long double sum's rounding elsewhere; 16-bit inputs as
 * their float32 values; infinities and NaN as a double sum gives them.
 */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/dtype.h"
#include "base/sumsq_exact.h"
#include "check.h"

enum { N = 20000 };

static uint64_t state = 12345;
static uint64_t next(void)
{
    state ^= state << 13;
    state ^= state >> 7;
    state ^= state << 17;
    return state;
}

/* A float of any sign and exponent, subnormals included. */
static float any_float(void)
{
    const int e = (int)(next() % 254) - 149;
    const double m = 1.0 + (double)(next() % 1000000) / 1e6;
    return (float)((next() & 1 ? -1 : 1) * ldexp(m, e > 126 ? 126 : e));
}

/* The moderate values' reference: their squares (exact in long double,
 * 48 bits) summed with Kahan's compensation, whose error is at most 2 ulp
 * of the sum plus n ulp^2 whatever long double is (double on some
 * platforms): 2 x 2^-53 = 2.2e-16 at worst. The exact sum rounded once
 * errs by at most 2^-53 = 1.1e-16, and the reference's conversion to
 * double by as much again: 4.4e-16 in all, so SUM_TOL holds with 2.3x to
 * spare in the worst case, on any machine (a plain long double sum, as
 * before, relied on x86's 64-bit significand: in double it errs by about
 * 2^-53 sqrt(n / 3) = 3.5e-14 here). A dropped or doubled square errs by
 * 1e-6 of the sum or more. */
#define SUM_TOL 1e-15
static void kahan_add(long double *sum, long double *c, long double x)
{
    const long double y = x - *c, t = *sum + y;
    *c = (t - *sum) - y;
    *sum = t;
}

static int same_bins(const struct loom_sumsq_exact *a, const struct loom_sumsq_exact *b)
{
    return memcmp(a->bin, b->bin, sizeof a->bin) == 0 && a->inf == b->inf && a->nan == b->nan;
}

int main(void)
{
    static float x[N], y[N];
    for (int i = 0; i < N; i++) x[i] = any_float();

    struct loom_sumsq_exact fwd = {0}, rev = {0}, parts = {0};
    loom_sumsq_exact_add_f32(&fwd, x, N);
    for (int i = N - 1; i >= 0; i--) loom_sumsq_exact_add_f32(&rev, &x[i], 1);
    CHECK(same_bins(&fwd, &rev));
    /* shuffled, in three parts whose limbs are summed as ranks sum them */
    memcpy(y, x, sizeof x);
    for (int i = N - 1; i > 0; i--) {
        const int j = (int)(next() % (uint64_t)(i + 1));
        const float t = y[i];
        y[i] = y[j];
        y[j] = t;
    }
    uint64_t total[LOOM_SUMSQ_LIMBS] = {0}, limbs[LOOM_SUMSQ_LIMBS];
    const int cut[4] = {0, 7, 12345, N};
    for (int p = 0; p < 3; p++) {
        struct loom_sumsq_exact s = {0};
        loom_sumsq_exact_add_f32(&s, y + cut[p], (size_t)(cut[p + 1] - cut[p]));
        loom_sumsq_exact_limbs(&s, limbs);
        for (int k = 0; k < LOOM_SUMSQ_LIMBS; k++) total[k] += limbs[k];
    }
    loom_sumsq_exact_from_limbs(&parts, total);
    CHECK(same_bins(&fwd, &parts));
    CHECK(loom_sumsq_exact_value(&fwd) == loom_sumsq_exact_value(&parts));

    /* a large array, summed by the threads at once, is the same as in small serial parts */
    enum { BIG = 300000 };
    float *big_x = malloc(sizeof(float) * BIG);
    for (int i = 0; i < BIG; i++) big_x[i] = any_float();
    struct loom_sumsq_exact whole = {0}, pieces = {0};
    loom_sumsq_exact_add_f32(&whole, big_x, BIG);
    for (int i = 0; i < BIG; i += 1000) loom_sumsq_exact_add_f32(&pieces, big_x + i, 1000);
    CHECK(same_bins(&whole, &pieces));
    /* across chunks and threads: moderate values within a long double sum's
     * rounding, and an inf and a NaN found in a later chunk */
    long double big_ld = 0, big_c = 0;
    for (int i = 0; i < BIG; i++) {
        big_x[i] = (float)((double)(next() % 2000001) / 1e6 - 1.0);
        kahan_add(&big_ld, &big_c, (long double)big_x[i] * big_x[i]);
    }
    struct loom_sumsq_exact mod = {0};
    loom_sumsq_exact_add_f32(&mod, big_x, BIG);
    const double big_err = fabs(loom_sumsq_exact_value(&mod) - (double)big_ld) / (double)big_ld;
    printf("sumsq_exact of %d moderate values: rel err %.3g against a compensated sum (tol %g)\n", BIG,
           big_err, SUM_TOL);
    CHECK(big_err <= SUM_TOL);
    big_x[200001] = INFINITY;
    big_x[70000] = NAN;
    struct loom_sumsq_exact special = {0};
    loom_sumsq_exact_add_f32(&special, big_x, BIG);
    CHECK(special.inf == 1 && special.nan == 1 && isnan(loom_sumsq_exact_value(&special)));
    free(big_x);
    /* the smallest subnormal's square, 2^-298, exactly */
    struct loom_sumsq_exact tiny = {0};
    const float sub = ldexpf(1.0f, -149);
    loom_sumsq_exact_add_f32(&tiny, &sub, 1);
    CHECK(loom_sumsq_exact_value(&tiny) == ldexp(1, -298));

    /* exact: 2^60 and 1024 ones is 2^60 + 1024 (a double sum in order loses every 1) */
    struct loom_sumsq_exact e = {0};
    const float big = 1073741824.0f, one = 1.0f;
    loom_sumsq_exact_add_f32(&e, &big, 1);
    double naive = (double)big * big;
    for (int i = 0; i < 1024; i++) {
        loom_sumsq_exact_add_f32(&e, &one, 1);
        naive += 1.0;
    }
    CHECK(naive == ldexp(1, 60));
    CHECK(loom_sumsq_exact_value(&e) == ldexp(1, 60) + 1024);

    /* rounded once, to nearest, ties to even: 1 + 2^-53 is the tie between 1
     * and 1 + 2^-52 (to 1); 2^-80 more puts it above (to 1 + 2^-52), where
     * a sum of doubles loses the 2^-80 */
    struct loom_sumsq_exact tie = {0};
    const float unit = 1.0f, h = ldexpf(1.0f, -27), t = ldexpf(1.0f, -40);
    loom_sumsq_exact_add_f32(&tie, &unit, 1);
    loom_sumsq_exact_add_f32(&tie, &h, 1);
    loom_sumsq_exact_add_f32(&tie, &h, 1);
    CHECK(loom_sumsq_exact_value(&tie) == 1.0);
    loom_sumsq_exact_add_f32(&tie, &t, 1);
    CHECK(loom_sumsq_exact_value(&tie) == 1.0 + ldexp(1, -52));
    /* a carry out of the rounding: 2^53 - 1 + 2^-1 (every power of two from
     * 2^-1 to 2^52, an even power the square of one value, an odd one of two
     * equal values) is a tie above an odd significand: up to 2^53 */
    struct loom_sumsq_exact carry = {0};
    for (int k = -1; k <= 52; k++) {
        const int odd = k & 1;
        const float v = ldexpf(1.0f, (k - odd) / 2);
        for (int c = 0; c <= odd; c++) loom_sumsq_exact_add_f32(&carry, &v, 1);
    }
    CHECK(loom_sumsq_exact_value(&carry) == ldexp(1, 53));

    /* moderate values: within a long double sum's rounding */
    struct loom_sumsq_exact m = {0};
    long double ld = 0, ld_c = 0;
    for (int i = 0; i < N; i++) {
        y[i] = (float)((double)(next() % 2000001) / 1e6 - 1.0);
        kahan_add(&ld, &ld_c, (long double)y[i] * y[i]);
    }
    loom_sumsq_exact_add_f32(&m, y, N);
    const double err = fabs(loom_sumsq_exact_value(&m) - (double)ld) / (double)ld;
    printf("sumsq_exact of %d moderate values: rel err %.3g against a compensated sum (tol %g)\n", N, err,
           SUM_TOL);
    CHECK(err <= SUM_TOL);

    /* 16-bit values count as their float32 values */
    uint16_t b16[64], f16[64];
    float fb[64], ff[64];
    for (int i = 0; i < 64; i++) {
        const float v = (float)((double)(next() % 2001) / 100.0 - 10.0);
        b16[i] = loom_f32_to_bf16(v);
        f16[i] = loom_f32_to_f16(v);
        fb[i] = loom_bf16_to_f32(b16[i]);
        ff[i] = loom_f16_to_f32(f16[i]);
    }
    struct loom_sumsq_exact a = {0}, b = {0};
    loom_sumsq_exact_add(&a, b16, 64, LOOM_DTYPE_BF16);
    loom_sumsq_exact_add_f32(&b, fb, 64);
    CHECK(same_bins(&a, &b));
    memset(&a, 0, sizeof a);
    memset(&b, 0, sizeof b);
    loom_sumsq_exact_add(&a, f16, 64, LOOM_DTYPE_F16);
    loom_sumsq_exact_add_f32(&b, ff, 64);
    CHECK(same_bins(&a, &b));

    /* non-finite: inf, and NaN over inf */
    struct loom_sumsq_exact z = {0};
    const float inf = INFINITY, nan = NAN;
    loom_sumsq_exact_add_f32(&z, x, 10);
    loom_sumsq_exact_add_f32(&z, &inf, 1);
    CHECK(isinf(loom_sumsq_exact_value(&z)));
    loom_sumsq_exact_add_f32(&z, &nan, 1);
    CHECK(isnan(loom_sumsq_exact_value(&z)));
    struct loom_sumsq_exact neg = {0}; /* a NaN with its sign bit set (inf - inf gives one) */
    const float negnan = -NAN;
    loom_sumsq_exact_add_f32(&neg, &negnan, 1);
    CHECK(neg.nan == 1 && isnan(loom_sumsq_exact_value(&neg)));
    struct loom_sumsq_exact none = {0};
    CHECK(loom_sumsq_exact_value(&none) == 0);
    return check_summary("sumsq_exact");
}
