/* An order-free sum of squares (sumsq_exact.h). */
#include "base/sumsq_exact.h"

#include <math.h>
#include <string.h>

#include "base/log.h"

enum { EMIN = -352 };     /* the exponent of bin 0's lowest bit */
enum { CHUNK = 1 << 16 }; /* elements per pass: 2^16 squares of 48 bits fit a uint64 */

/* A float32 (its bits u) is m 2^(E - 150), m < 2^24 an integer, E its biased
 * exponent (1 for the subnormals, whose biased exponent is 0), so its square
 * m^2 2^(2E - 300) is an integer m^2 < 2^48 placed at bit 2E - 300 - EMIN.
 * A chunk adds the m^2 of each exponent in a uint64 (two rows, even and odd
 * elements, so consecutive additions do not wait on each other); the rows
 * then go into the bins. */
static uint32_t bits_of(const void *x, size_t i, enum loom_dtype dt)
{
    uint32_t u;
    if (dt == LOOM_DTYPE_BF16) return (uint32_t)((const uint16_t *)x)[i] << 16; /* float32's upper half */
    const float f = dt == LOOM_DTYPE_F32 ? ((const float *)x)[i] : loom_f16_to_f32(((const uint16_t *)x)[i]);
    memcpy(&u, &f, sizeof u);
    return u;
}

static void add_chunk(struct loom_sumsq_exact *s, const void *x, size_t lo, size_t hi, enum loom_dtype dt)
{
    uint64_t acc[2][256] = {{0}};
    if (dt == LOOM_DTYPE_F32) { /* the gradients' case, without the per-element switch */
        const uint32_t *u = x;
        for (size_t i = lo; i < hi; i++) {
            const uint32_t e = (u[i] >> 23) & 0xff;
            const uint64_t m = (u[i] & 0x7fffff) | (e ? 0x800000u : 0);
            acc[i & 1][e] += m * m;
        }
    } else {
        for (size_t i = lo; i < hi; i++) {
            const uint32_t b = bits_of(x, i, dt), e = (b >> 23) & 0xff;
            const uint64_t m = (b & 0x7fffff) | (e ? 0x800000u : 0);
            acc[i & 1][e] += m * m;
        }
    }
    for (int e = 0; e < 255; e++) {
        const unsigned __int128 a = (unsigned __int128)acc[0][e] + acc[1][e];
        if (!a) continue;
        const int at = 2 * (e ? e : 1) - 300 - EMIN;
        LOOM_ASSERT(at >= 0 && at / 32 < LOOM_SUMSQ_BINS);
        s->bin[at / 32] += a << (at % 32);
    }
    if (acc[0][255] | acc[1][255]) /* inf or NaN among them (m^2 > 0 for both) */
        for (size_t i = lo; i < hi; i++) {
            const uint32_t b = bits_of(x, i, dt);
            if (((b >> 23) & 0xff) == 0xff) { /* a NaN may carry a sign */
                if (b & 0x7fffff)
                    s->nan++;
                else
                    s->inf++;
            }
        }
}

/* s += the squares of x (n): in per-thread bins, then added (integers: the
 * same total whatever the threads and chunks) */
static void add_all(struct loom_sumsq_exact *s, const void *x, size_t n, enum loom_dtype dt)
{
    const size_t chunks = (n + CHUNK - 1) / CHUNK;
#pragma omp parallel if (chunks > 1)
    {
        struct loom_sumsq_exact mine = {0};
#pragma omp for schedule(static) nowait
        for (size_t c = 0; c < chunks; c++)
            add_chunk(&mine, x, c * CHUNK, c + 1 == chunks ? n : (c + 1) * CHUNK, dt);
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
    /* the total as one integer, 32-bit limbs (the bins' carries taken up) */
    enum { LIMBS = LOOM_SUMSQ_BINS + 4 };
    uint32_t limb[LIMBS] = {0};
    unsigned __int128 carry = 0;
    for (int i = 0; i < LIMBS; i++) {
        for (int b = 0; b < LOOM_SUMSQ_BINS; b++) /* bin b's 32-bit part j lands in limb b + j */
            if (i - b >= 0 && i - b < 4) carry += (uint32_t)(s->bin[b] >> (32 * (i - b)));
        limb[i] = (uint32_t)carry;
        carry >>= 32;
    }
    LOOM_ASSERT(carry == 0);
    int top = LIMBS - 1;
    while (top >= 0 && !limb[top]) top--;
    if (top < 0) return 0;
    /* its leading 128 bits, the rest as a sticky bit: rounded once, to nearest, ties to even */
    unsigned __int128 lead = 0;
    int sticky = 0;
    for (int i = top; i >= 0; i--) {
        if (i > top - 4)
            lead = lead << 32 | limb[i];
        else
            sticky |= limb[i] != 0;
    }
    const int low = top - 3; /* lead's lowest limb (negative: lead is shorter) */
    if (low < 0) lead <<= -32 * low;
    int lz = 0;
    while (!(lead >> 127)) { /* lead's leading 1 at bit 127 */
        lead <<= 1;
        lz++;
    }
    uint64_t m = (uint64_t)(lead >> 75); /* 53 bits */
    const unsigned __int128 rest = lead & ((((unsigned __int128)1) << 75) - 1), half = ((unsigned __int128)1)
                                                                                       << 74;
    if (rest > half || (rest == half && (sticky || (m & 1)))) m++; /* 2^53 when it carries: still exact */
    return ldexp((double)m, 32 * low + 75 - lz + EMIN);
}
