/* An order-free sum of squares (sumsq_exact.h). */
#include "base/sumsq_exact.h"

#include <math.h>
#include <string.h>

#include "base/log.h"

enum { EMIN = -352 }; /* the exponent of bin 0's lowest bit */

static void add_square(struct loom_sumsq_exact *s, float v)
{
    const double q = (double)v * (double)v; /* exact, and a normal double (2^-298 <= q < 2^256) or 0 */
    uint64_t bits;
    memcpy(&bits, &q, sizeof bits);
    const int biased = (int)(bits >> 52) & 0x7ff; /* a NaN may carry a sign */
    if (biased == 0x7ff) {                        /* inf or NaN */
        if (bits << 12)
            s->nan++;
        else
            s->inf++;
        return;
    }
    if (!biased) return; /* 0 */
    const uint64_t m = (bits & ((UINT64_C(1) << 52) - 1)) | (UINT64_C(1) << 52);
    const int at = biased - 1075 - EMIN; /* q = m 2^(biased - 1075) = m 2^(at + EMIN) */
    LOOM_ASSERT(at >= 0 && at / 32 < LOOM_SUMSQ_BINS);
    s->bin[at / 32] += (unsigned __int128)m << (at % 32);
}

/* s += the squares of x (n): in per-thread bins, then added (integers: the
 * same total whatever the threads) */
static void add_all(struct loom_sumsq_exact *s, const void *x, size_t n, enum loom_dtype dt)
{
    const float *f = x;
    const uint16_t *h = x;
#pragma omp parallel if (n >= 65536)
    {
        struct loom_sumsq_exact mine = {0};
        if (dt == LOOM_DTYPE_BF16) {
#pragma omp for schedule(static) nowait
            for (size_t i = 0; i < n; i++) { /* bf16 is float32's upper half */
                const uint32_t u = (uint32_t)h[i] << 16;
                float v;
                memcpy(&v, &u, sizeof v);
                add_square(&mine, v);
            }
        } else {
#pragma omp for schedule(static) nowait
            for (size_t i = 0; i < n; i++)
                add_square(&mine, dt == LOOM_DTYPE_F32 ? f[i] : loom_f16_to_f32(h[i]));
        }
#pragma omp critical
        {
            for (int b = 0; b < LOOM_SUMSQ_BINS; b++) s->bin[b] += mine.bin[b];
            s->inf += mine.inf;
            s->nan += mine.nan;
        }
    }
}

void loom_sumsq_exact_add_f32(struct loom_sumsq_exact *s, const float *x, size_t n)
{
    add_all(s, x, n, LOOM_DTYPE_F32);
}

void loom_sumsq_exact_add(struct loom_sumsq_exact *s, const void *x, size_t n, enum loom_dtype dt)
{
    LOOM_ASSERT(dt == LOOM_DTYPE_F32 || dt == LOOM_DTYPE_BF16 || dt == LOOM_DTYPE_F16);
    add_all(s, x, n, dt);
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
