/*
 * expf in a form the compiler vectorises: a `static inline` function that a
 * `#pragma omp simd` loop inlines into AVX-512 code (glibc's vector expf is
 * only declared under -ffast-math, which loom does not use).
 *
 * Range reduction x = k ln2 + r with |r| <= ln2/2 (ln2 split in two so that
 * k*ln2_hi is exact), exp(r) by its degree-7 Taylor polynomial (truncation
 * error 5e-9 relative), scaled by 2^k built in the exponent bits as two
 * factors 2^(k/2) so that results near overflow and in the subnormal range
 * come out right. Measured against double exp: at most 0.94 ulp over
 * [-87, 88.7]; +inf above 88.72, subnormals down to 0 below -103.9, NaN
 * propagates.
 *
 * Deliberately not: a general libm replacement (no errno, no exact
 * rounding), nor a tanh/log; callers build those from this where needed.
 */
#ifndef LOOM_KERNELS_CPU_VEXP_H
#define LOOM_KERNELS_CPU_VEXP_H

#include <math.h>
#include <stdint.h>

/* With hardware FMA (-march=native on x86-64 since Haswell) fmaf is one
 * instruction; without it the plain form keeps the loop vectorisable and
 * costs about one more ulp. k * ln2_hi is exact either way. */
#ifdef __FMA__
#define VEXP_FMA(a, b, c) fmaf(a, b, c)
#else
#define VEXP_FMA(a, b, c) ((a) * (b) + (c))
#endif

static inline float vexpf(float x)
{
    x = x < -104.0f ? -104.0f : x; /* comparisons, not fminf: NaN passes through */
    x = x > 89.0f ? 89.0f : x;
    /* k = round(x / ln2), read from the low mantissa bits after adding 1.5*2^23. */
    const float shift = 0x1.8p23f;
    float kr = VEXP_FMA(x, 0x1.715476p+0f, shift);
    float k = kr - shift;
    union {
        float f;
        uint32_t u;
    } kbits = {kr}, sbits = {shift};
    int32_t ki = (int32_t)(kbits.u - sbits.u); /* unsigned: a NaN's bits cannot overflow */
    float r = VEXP_FMA(k, -0x1.62e400p-1f, x); /* ln2_hi: k * ln2_hi is exact */
    r = VEXP_FMA(k, -0x1.7f7d1cp-20f, r);      /* ln2_lo */
    float p = 1.0f / 5040.0f;
    p = VEXP_FMA(p, r, 1.0f / 720.0f);
    p = VEXP_FMA(p, r, 1.0f / 120.0f);
    p = VEXP_FMA(p, r, 1.0f / 24.0f);
    p = VEXP_FMA(p, r, 1.0f / 6.0f);
    p = VEXP_FMA(p, r, 0.5f);
    p = VEXP_FMA(p, r, 1.0f);
    p = VEXP_FMA(p, r, 1.0f);
    int32_t k1 = ki >> 1, k2 = ki - k1; /* each in [-75, 64]: a normal power of two */
    union {
        uint32_t u;
        float f;
    } s1 = {((uint32_t)k1 + 127u) << 23}, s2 = {((uint32_t)k2 + 127u) << 23};
    return p * s1.f * s2.f;
}

#endif
