/*
 * An order-free sum of squares: the gradient norm of --layout-invariant.
 *
 * A float is an integer m < 2^24 times a power of two, so its square is
 * the integer m^2 < 2^48 times a power of two. Each square is added as an
 * integer: the squares of one exponent summed in a uint64 a chunk of 2^16
 * at a time, each such sum shifted into one of a few 128-bit bins by the
 * exponent. Integer addition is associative, so
 * the total does not depend on the order of the additions, nor on how the
 * elements are split over shards, ranks and stages (their bins are summed
 * as integers, loom_sumsq_exact_limbs), and one conversion makes it a
 * double. Every finite float32 (or 16-bit) value is counted exactly; a
 * non-finite one makes the total infinite or NaN as a double sum would.
 */
#ifndef LOOM_BASE_SUMSQ_EXACT_H
#define LOOM_BASE_SUMSQ_EXACT_H

#include <stddef.h>
#include <stdint.h>

#include "base/dtype.h"

/* bins of 32 exponents from 2^-352 (below the square of the smallest
 * float32 subnormal) to 2^288 (above the square of the largest float32) */
enum { LOOM_SUMSQ_BINS = 20, LOOM_SUMSQ_LIMBS = 4 * LOOM_SUMSQ_BINS + 2 };

struct loom_sumsq_exact {
    unsigned __int128 bin[LOOM_SUMSQ_BINS];
    uint64_t inf, nan; /* counts of infinite and NaN squares */
};

void loom_sumsq_exact_add_f32(struct loom_sumsq_exact *s, const float *x, size_t n);
/* x of dtype dt (F32, BF16 or F16) */
void loom_sumsq_exact_add(struct loom_sumsq_exact *s, const void *x, size_t n, enum loom_dtype dt);
/* As 32-bit limbs in uint64 (LOOM_SUMSQ_LIMBS), which sum without
 * overflow over up to 2^31 ranks; and back (a sum of such). */
void loom_sumsq_exact_limbs(const struct loom_sumsq_exact *s, uint64_t *limbs);
void loom_sumsq_exact_from_limbs(struct loom_sumsq_exact *s, const uint64_t *limbs);
/* The total as a double: the exact sum rounded once (to nearest, ties to
 * even), so the same total gives the same double whatever held it. */
double loom_sumsq_exact_value(const struct loom_sumsq_exact *s);

#endif
