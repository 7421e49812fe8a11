/* fp8 numbers: formats, quantisation, amax and the delayed scale (see fp8.h). */
#include "base/fp8.h"

#include <math.h>
#include <string.h>

#include "base/log.h"

/* A format's constants. */
struct fmt {
    int mbits, bias;
    float max, min_normal, quantum, per_quantum; /* quantum: the subnormal step, 2^(1 - bias - mbits) */
};

static const struct fmt FMT[LOOM_FP8_FORMAT_COUNT] = {
    [LOOM_FP8_E4M3] = {3, 7, 448.0f, 0x1p-6f, 0x1p-9f, 0x1p9f},
    [LOOM_FP8_E5M2] = {2, 15, 57344.0f, 0x1p-14f, 0x1p-16f, 0x1p16f},
};

static const char *const NAMES[] = {"e4m3", "e5m2"};
_Static_assert(sizeof NAMES / sizeof NAMES[0] == LOOM_FP8_FORMAT_COUNT, "a name per fp8 format");

const char *loom_fp8_format_name(enum loom_fp8_format f)
{
    return (unsigned)f < LOOM_FP8_FORMAT_COUNT ? NAMES[f] : NULL;
}

float loom_fp8_max(enum loom_fp8_format f)
{
    LOOM_ASSERT((unsigned)f < LOOM_FP8_FORMAT_COUNT);
    return FMT[f].max;
}

static inline uint32_t bits_of(float x)
{
    uint32_t b;
    memcpy(&b, &x, sizeof b);
    return b;
}

static inline float float_of(uint32_t b)
{
    float x;
    memcpy(&x, &b, sizeof x);
    return x;
}

/* The fp8 value nearest x, clamped to +-max, as a float32 (x not NaN):
 * normal values round their float32 mantissa to mbits bits (ties to even,
 * a carry moving into the exponent); below the smallest normal, multiples
 * of the subnormal step. Branch-free, so the array loops vectorise. */
static inline float nearest(float x, const struct fmt *F)
{
    float a = fabsf(x);
    a = a < F->max ? a : F->max;
    const int sh = 23 - F->mbits;
    const uint32_t b = bits_of(a);
    const float normal = float_of((b + ((1u << (sh - 1)) - 1) + ((b >> sh) & 1)) & ~((1u << sh) - 1));
    const float sub = rintf(a * F->per_quantum) * F->quantum;
    return copysignf(a < F->min_normal ? sub : normal, x);
}

uint8_t loom_fp8_encode(float x, enum loom_fp8_format f)
{
    LOOM_ASSERT((unsigned)f < LOOM_FP8_FORMAT_COUNT);
    const struct fmt *F = &FMT[f];
    const uint8_t sign = (uint8_t)(bits_of(x) >> 31 << 7);
    if (isnan(x)) return sign | 0x7f;
    const float a = fabsf(nearest(x, F));
    if (a < F->min_normal) return sign | (uint8_t)(a * F->per_quantum);
    const uint32_t b = bits_of(a);
    const int e = (int)(b >> 23) - 127 + F->bias;
    return sign | (uint8_t)(e << F->mbits) | (uint8_t)((b >> (23 - F->mbits)) & ((1u << F->mbits) - 1));
}

/* From the definition: the two neighbouring fp8 values around |x|, the
 * nearer taken, the one with an even mantissa on a tie. */
uint8_t loom_fp8_encode_ref(float x, enum loom_fp8_format f)
{
    LOOM_ASSERT((unsigned)f < LOOM_FP8_FORMAT_COUNT);
    const struct fmt *F = &FMT[f];
    const uint8_t sign = signbit(x) ? 0x80 : 0;
    if (isnan(x)) return sign | 0x7f;
    double a = fabs((double)x);
    if (a > F->max) a = F->max;
    /* every non-negative code below the largest finite, in increasing value */
    int best = 0;
    double best_err = INFINITY;
    for (int c = 0; c < 0x80; c++) {
        const double v = loom_fp8_decode((uint8_t)c, f);
        if (isnan(v) || isinf(v)) continue;
        const double err = fabs(v - a);
        if (err < best_err || (err == best_err && (c & 1) == 0)) best = c, best_err = err;
    }
    return sign | (uint8_t)best;
}

float loom_fp8_decode(uint8_t code, enum loom_fp8_format f)
{
    LOOM_ASSERT((unsigned)f < LOOM_FP8_FORMAT_COUNT);
    const struct fmt *F = &FMT[f];
    const int m = code & ((1 << F->mbits) - 1), e = (code & 0x7f) >> F->mbits;
    const int emax = (1 << (7 - F->mbits)) - 1;
    float v;
    if (f == LOOM_FP8_E4M3 && e == emax && m == (1 << F->mbits) - 1)
        v = NAN;
    else if (f == LOOM_FP8_E5M2 && e == emax)
        v = m ? NAN : INFINITY;
    else if (e == 0)
        v = (float)m * F->quantum;
    else
        v = ldexpf(1.0f + (float)m / (float)(1 << F->mbits), e - F->bias);
    return code & 0x80 ? -v : v;
}

/* A value's bf16 bits: NaN as the canonical quiet NaN 0x7FC0, whatever its
 * sign, as PyTorch converts an fp8 NaN to bf16. */
static inline uint16_t bf16_bits(float q, float x)
{
    return isnan(x) ? (uint16_t)0x7fc0 : (uint16_t)(bits_of(q) >> 16);
}

void loom_fp8_quantize_bf16(uint16_t *out16, const float *x, size_t n, float scale, enum loom_fp8_format f)
{
    LOOM_ASSERT((unsigned)f < LOOM_FP8_FORMAT_COUNT);
    const struct fmt *F = &FMT[f];
#pragma omp parallel for simd schedule(static) if (n >= ((size_t)1 << 16))
    for (size_t i = 0; i < n; i++) {
        const float s = x[i] * scale;
        out16[i] = bf16_bits(nearest(s, F), s);
    }
}

void loom_fp8_quantize_bf16_from16(uint16_t *out16, const uint16_t *x16, size_t n, float scale,
                                   enum loom_fp8_format f)
{
    LOOM_ASSERT((unsigned)f < LOOM_FP8_FORMAT_COUNT);
    const struct fmt *F = &FMT[f];
#pragma omp parallel for simd schedule(static) if (n >= ((size_t)1 << 16))
    for (size_t i = 0; i < n; i++) {
        const float s = float_of((uint32_t)x16[i] << 16) * scale;
        out16[i] = bf16_bits(nearest(s, F), s);
    }
}

float loom_fp8_amax(const float *x, size_t n)
{
    float m = 0.0f;
    int nan = 0;
#pragma omp parallel for simd reduction(max : m) reduction(| : nan) if (n >= ((size_t)1 << 16))
    for (size_t i = 0; i < n; i++) {
        const float a = fabsf(x[i]);
        m = a > m ? a : m;
        nan |= a != a;
    }
    return nan ? NAN : m;
}

float loom_fp8_amax16(const uint16_t *x16, size_t n)
{
    unsigned m = 0;
#pragma omp parallel for simd reduction(max : m) if (n >= ((size_t)1 << 16))
    for (size_t i = 0; i < n; i++) {
        const unsigned a = x16[i] & 0x7fffu; /* ordered as the values are; above 0x7f80 a NaN */
        m = a > m ? a : m;
    }
    return m > 0x7f80u ? NAN : float_of((uint32_t)m << 16);
}

float loom_fp8_scale_update(const float *history, int len, enum loom_fp8_amax_algo algo, float scale,
                            int margin, enum loom_fp8_format f)
{
    LOOM_ASSERT(len >= 1 && (unsigned)algo < LOOM_FP8_AMAX_ALGO_COUNT && (unsigned)f < LOOM_FP8_FORMAT_COUNT);
    float amax = history[0];
    if (algo == LOOM_FP8_AMAX_MAX)
        for (int i = 1; i < len; i++) amax = isnan(history[i]) || history[i] > amax ? history[i] : amax;
    if (!(amax > 0.0f) || !isfinite(amax)) return scale;
    /* (max / amax) / 2^margin, with max / amax evaluated as Transformer
     * Engine's PyTorch expression `fp8_max / amax` does it: a Python number
     * over a tensor is the tensor's reciprocal times the number */
    const float s = (1.0f / amax) * FMT[f].max / ldexpf(1.0f, margin);
    return isfinite(s) ? s : scale; /* an amax so small the scale overflows: keep the last */
}
