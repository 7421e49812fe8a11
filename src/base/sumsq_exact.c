/* An order-free sum of squares (sumsq_exact.h). */
#include "base/sumsq_exact.h"

#include <math.h>
#include <string.h>

#include "base/log.h"

enum { EMIN = -352 }; /* the exponent of bin 0's lowest bit */

static void add_square(struct loom_sumsq_exact *s, float v)
{
    const double q = (double)v * (double)v; /* exact */
    if (q == 0) return;
    if (!isfinite(q)) {
        if (isnan(q))
            s->nan++;
        else
            s->inf++;
        return;
    }
    int e;
    const double f = frexp(q, &e); /* q = f 2^e, f in [0.5, 1) */
    const uint64_t m = (uint64_t)ldexp(f, 53);
    const int at = e - 53 - EMIN; /* q = m 2^(at + EMIN) */
    LOOM_ASSERT(at >= 0 && at / 32 < LOOM_SUMSQ_BINS);
    s->bin[at / 32] += (unsigned __int128)m << (at % 32);
}

void loom_sumsq_exact_add_f32(struct loom_sumsq_exact *s, const float *x, size_t n)
{
    for (size_t i = 0; i < n; i++) add_square(s, x[i]);
}

void loom_sumsq_exact_add(struct loom_sumsq_exact *s, const void *x, size_t n, enum loom_dtype dt)
{
    if (dt == LOOM_DTYPE_F32) {
        loom_sumsq_exact_add_f32(s, x, n);
        return;
    }
    LOOM_ASSERT(dt == LOOM_DTYPE_BF16 || dt == LOOM_DTYPE_F16);
    const uint16_t *h = x;
    for (size_t i = 0; i < n; i++)
        add_square(s, dt == LOOM_DTYPE_BF16 ? loom_bf16_to_f32(h[i]) : loom_f16_to_f32(h[i]));
}

void loom_sumsq_exact_limbs(const struct loom_sumsq_exact *s, uint64_t *limbs)
{
    for (int b = 0; b < LOOM_SUMSQ_BINS; b++)
        for (int j = 0; j < 4; j++) limbs[4 * b + j] = (uint64_t)(s->bin[b] >> (32 * j)) & 0xffffffffu;
    limbs[4 * LOOM_SUMSQ_BINS] = s->inf;
    limbs[4 * LOOM_SUMSQ_BINS + 1] = s->nan;
}

void loom_sumsq_exact_from_limbs(struct loom_sumsq_exact *s, const uint64_t *limbs)
{
    memset(s, 0, sizeof *s);
    for (int b = 0; b < LOOM_SUMSQ_BINS; b++)
        for (int j = 0; j < 4; j++) s->bin[b] += (unsigned __int128)limbs[4 * b + j] << (32 * j);
    s->inf = limbs[4 * LOOM_SUMSQ_BINS];
    s->nan = limbs[4 * LOOM_SUMSQ_BINS + 1];
}

double loom_sumsq_exact_value(const struct loom_sumsq_exact *s)
{
    if (s->nan) return NAN;
    if (s->inf) return INFINITY;
    double v = 0;
    for (int b = LOOM_SUMSQ_BINS - 1; b >= 0; b--) /* highest first: the small ones last */
        v += ldexp((double)s->bin[b], 32 * b + EMIN);
    return v;
}
