/*
 * dtype conversion (rules in dtype.h).
 *
 * The fast conversions work on bit patterns with integer arithmetic and
 * selects only, so the result does not depend on the floating-point
 * environment (rounding mode, flush-to-zero) and gcc vectorises the array
 * loops (variable shifts and blends: AVX2 and up). The references below
 * each one take the format apart into sign, exponent and significand and
 * round by the textbook rule; they share no code with the fast versions.
 */
#include "base/dtype.h"

#include <assert.h>
#include <math.h>
#include <string.h>

#include "base/log.h"

/* Below this many elements a parallel region costs more than it saves. */
#define PAR_MIN 65536

static const char *const dtype_names[] = {
    [LOOM_DTYPE_F32] = "fp32",  [LOOM_DTYPE_BF16] = "bf16", [LOOM_DTYPE_F16] = "fp16",
    [LOOM_DTYPE_F64] = "fp64",  [LOOM_DTYPE_I32] = "int32", [LOOM_DTYPE_I64] = "int64",
    [LOOM_DTYPE_U8] = "uint8",  [LOOM_DTYPE_I8] = "int8",   [LOOM_DTYPE_U16] = "uint16",
    [LOOM_DTYPE_I16] = "int16", [LOOM_DTYPE_BOOL] = "bool", [LOOM_DTYPE_U32] = "uint32",
    [LOOM_DTYPE_U64] = "uint64"};
static_assert(sizeof dtype_names / sizeof dtype_names[0] == LOOM_DTYPE_COUNT, "dtype_names");
static const size_t dtype_sizes[] = {
    [LOOM_DTYPE_F32] = 4, [LOOM_DTYPE_BF16] = 2, [LOOM_DTYPE_F16] = 2,  [LOOM_DTYPE_F64] = 8,
    [LOOM_DTYPE_I32] = 4, [LOOM_DTYPE_I64] = 8,  [LOOM_DTYPE_U8] = 1,   [LOOM_DTYPE_I8] = 1,
    [LOOM_DTYPE_U16] = 2, [LOOM_DTYPE_I16] = 2,  [LOOM_DTYPE_BOOL] = 1, [LOOM_DTYPE_U32] = 4,
    [LOOM_DTYPE_U64] = 8};
static_assert(sizeof dtype_sizes / sizeof dtype_sizes[0] == LOOM_DTYPE_COUNT, "dtype_sizes");

const char *loom_dtype_name(enum loom_dtype dt)
{
    return (unsigned)dt < LOOM_DTYPE_COUNT ? dtype_names[dt] : NULL;
}

size_t loom_dtype_size(enum loom_dtype dt)
{
    LOOM_ASSERT((unsigned)dt < LOOM_DTYPE_COUNT);
    return dtype_sizes[dt];
}

static inline uint32_t bits_of(float x)
{
    uint32_t u;
    memcpy(&u, &x, sizeof u);
    return u;
}

static inline float float_of(uint32_t u)
{
    float x;
    memcpy(&x, &u, sizeof x);
    return x;
}

#define F32_ABS 0x7fffffffu
#define F32_INF 0x7f800000u
#define BF16_NAN 0x7fc0u /* c10::BFloat16's canonical quiet NaN */
#define F16_NAN 0x7e00u  /* quiet, payload zero; the sign is kept */
#define F16_INF 0x7c00u

/* ---- the fast versions: bit patterns, no branches ------------------------- */

/* Adding 0x7fff plus the lowest kept bit and truncating rounds to nearest
 * even; a carry runs into the exponent (up to inf), and fp32 subnormals
 * round like any other bits, since both formats share the exponent. */
static inline uint16_t bf16_from_bits(uint32_t u)
{
    uint32_t rounded = (u + 0x7fffu + ((u >> 16) & 1u)) >> 16;
    return (u & F32_ABS) > F32_INF ? BF16_NAN : (uint16_t)rounded;
}

static inline uint16_t f16_from_bits(uint32_t u)
{
    uint32_t sign = (u >> 16) & 0x8000u, a = u & F32_ABS;
    /* fp16 normal (a >= 2^-14): rebias the exponent 127 -> 15 and drop 13
     * mantissa bits, rounding as for bf16 above. */
    uint32_t normal = (a - 0x38000000u + 0xfffu + ((a >> 13) & 1u)) >> 13;
    /* fp16 subnormal: the value in units of 2^-24 is the 24-bit significand
     * shifted right by 126 - exponent (14 at 2^-15; from 25 on the result is
     * zero, so 25 stands in wherever this lane is not used), rounded to
     * nearest even. */
    uint32_t e = a >> 23;
    uint32_t shift = e >= 101u && e <= 112u ? 126u - e : 25u;
    uint32_t sig = (a & 0x7fffffu) | 0x800000u;
    uint32_t sub = (sig + (1u << (shift - 1)) - 1u + ((sig >> shift) & 1u)) >> shift;
    /* Selects as masks: gcc does not vectorise the mixed-width ternaries. */
    uint32_t is_sub = -(uint32_t)(a < 0x38800000u);
    uint32_t is_inf = -(uint32_t)(a >= 0x477ff000u); /* 65520 and up, inf included */
    uint32_t is_nan = -(uint32_t)(a > F32_INF);
    uint32_t h = (sub & is_sub) | (normal & ~is_sub);
    h = (F16_INF & is_inf) | (h & ~is_inf);
    h = (F16_NAN & is_nan) | (h & ~is_nan);
    return (uint16_t)(sign | h);
}

static inline uint32_t f16_to_bits(uint16_t h)
{
    uint32_t sign = (uint32_t)(h & 0x8000u) << 16, em = h & 0x7fffu;
    uint32_t normal = (em << 13) + 0x38000000u;                                /* rebias 15 -> 127 */
    uint32_t sub = bits_of((float)(int32_t)em * 0x1p-24f);                     /* zero, subnormal: exact */
    uint32_t special = (em << 13) | F32_INF | (em > F16_INF ? 0x400000u : 0u); /* NaN made quiet */
    uint32_t r = em < 0x400u ? sub : em >= F16_INF ? special : normal;
    return sign | r;
}

uint16_t loom_f32_to_bf16(float x)
{
    return bf16_from_bits(bits_of(x));
}

float loom_bf16_to_f32(uint16_t h)
{
    return float_of((uint32_t)h << 16);
}

uint16_t loom_f32_to_f16(float x)
{
    return f16_from_bits(bits_of(x));
}

float loom_f16_to_f32(uint16_t h)
{
    return float_of(f16_to_bits(h));
}

void loom_f32_to_bf16_array(uint16_t *restrict dst, const float *restrict src, size_t n)
{
#pragma omp parallel for simd schedule(static) if (n >= PAR_MIN)
    for (size_t i = 0; i < n; i++) dst[i] = bf16_from_bits(bits_of(src[i]));
}

void loom_bf16_to_f32_array(float *restrict dst, const uint16_t *restrict src, size_t n)
{
#pragma omp parallel for simd schedule(static) if (n >= PAR_MIN)
    for (size_t i = 0; i < n; i++) dst[i] = float_of((uint32_t)src[i] << 16);
}

void loom_f32_to_f16_array(uint16_t *restrict dst, const float *restrict src, size_t n)
{
#pragma omp parallel for simd schedule(static) if (n >= PAR_MIN)
    for (size_t i = 0; i < n; i++) dst[i] = f16_from_bits(bits_of(src[i]));
}

void loom_f16_to_f32_array(float *restrict dst, const uint16_t *restrict src, size_t n)
{
#pragma omp parallel for simd schedule(static) if (n >= PAR_MIN)
    for (size_t i = 0; i < n; i++) dst[i] = float_of(f16_to_bits(src[i]));
}

void loom_dtype_round_trip(float *x, size_t n, enum loom_dtype dt)
{
    switch (dt) {
    case LOOM_DTYPE_F32:
        return;
    case LOOM_DTYPE_BF16:
#pragma omp parallel for simd schedule(static) if (n >= PAR_MIN)
        for (size_t i = 0; i < n; i++) x[i] = float_of((uint32_t)bf16_from_bits(bits_of(x[i])) << 16);
        return;
    case LOOM_DTYPE_F16:
#pragma omp parallel for simd schedule(static) if (n >= PAR_MIN)
        for (size_t i = 0; i < n; i++) x[i] = float_of(f16_to_bits(f16_from_bits(bits_of(x[i]))));
        return;
    default:
        break;
    }
    LOOM_ASSERT(!"not a floating-point dtype of 32 bits or fewer");
}

void loom_lp_from_f32(uint16_t *dst, const float *src, size_t n, enum loom_dtype dt)
{
    LOOM_ASSERT(dt == LOOM_DTYPE_BF16 || dt == LOOM_DTYPE_F16);
    if (dt == LOOM_DTYPE_BF16)
        loom_f32_to_bf16_array(dst, src, n);
    else
        loom_f32_to_f16_array(dst, src, n);
}

void loom_lp_to_f32(float *dst, const uint16_t *src, size_t n, enum loom_dtype dt)
{
    LOOM_ASSERT(dt == LOOM_DTYPE_BF16 || dt == LOOM_DTYPE_F16);
    if (dt == LOOM_DTYPE_BF16)
        loom_bf16_to_f32_array(dst, src, n);
    else
        loom_f16_to_f32_array(dst, src, n);
}

void loom_lp_round_store(uint16_t *dst, float *x, size_t n, enum loom_dtype dt)
{
    LOOM_ASSERT(dt == LOOM_DTYPE_BF16 || dt == LOOM_DTYPE_F16);
    if (dt == LOOM_DTYPE_BF16) {
#pragma omp parallel for simd schedule(static) if (n >= PAR_MIN)
        for (size_t i = 0; i < n; i++) {
            const uint16_t h = bf16_from_bits(bits_of(x[i]));
            dst[i] = h;
            x[i] = float_of((uint32_t)h << 16);
        }
    } else {
#pragma omp parallel for simd schedule(static) if (n >= PAR_MIN)
        for (size_t i = 0; i < n; i++) {
            const uint16_t h = f16_from_bits(bits_of(x[i]));
            dst[i] = h;
            x[i] = float_of(f16_to_bits(h));
        }
    }
}

void loom_lp_accumulate(uint16_t *dst, const float *src, size_t n, enum loom_dtype dt)
{
    LOOM_ASSERT(dt == LOOM_DTYPE_BF16 || dt == LOOM_DTYPE_F16);
    if (dt == LOOM_DTYPE_BF16) {
#pragma omp parallel for simd schedule(static) if (n >= PAR_MIN)
        for (size_t i = 0; i < n; i++)
            dst[i] = bf16_from_bits(bits_of(float_of((uint32_t)dst[i] << 16) + src[i]));
    } else {
#pragma omp parallel for simd schedule(static) if (n >= PAR_MIN)
        for (size_t i = 0; i < n; i++)
            dst[i] = f16_from_bits(bits_of(float_of(f16_to_bits(dst[i])) + src[i]));
    }
}

double loom_lp_sum_squares(const uint16_t *x, size_t n, enum loom_dtype dt)
{
    LOOM_ASSERT(dt == LOOM_DTYPE_BF16 || dt == LOOM_DTYPE_F16);
    double ss = 0;
    if (dt == LOOM_DTYPE_BF16) {
#pragma omp parallel for simd reduction(+ : ss) schedule(static) if (n >= PAR_MIN)
        for (size_t i = 0; i < n; i++) {
            double v = float_of((uint32_t)x[i] << 16);
            ss += v * v;
        }
    } else {
#pragma omp parallel for simd reduction(+ : ss) schedule(static) if (n >= PAR_MIN)
        for (size_t i = 0; i < n; i++) {
            double v = float_of(f16_to_bits(x[i]));
            ss += v * v;
        }
    }
    return ss;
}

int loom_lp_has_nonfinite(const uint16_t *x, size_t n, enum loom_dtype dt)
{
    LOOM_ASSERT(dt == LOOM_DTYPE_BF16 || dt == LOOM_DTYPE_F16);
    const uint16_t exp = dt == LOOM_DTYPE_BF16 ? 0x7f80 : 0x7c00;
    int bad = 0;
#pragma omp parallel for simd reduction(| : bad) schedule(static) if (n >= PAR_MIN)
    for (size_t i = 0; i < n; i++) bad |= (x[i] & exp) == exp;
    return bad;
}

/* ---- the references ----------------------------------------------------------- */

/* Keeps the top (width - drop) bits of sig, rounded to nearest, ties to the
 * even result. drop in [1, 31]. */
static uint32_t round_shift_ref(uint32_t sig, int drop)
{
    uint32_t kept = sig >> drop, rest = sig & ((1u << drop) - 1u), half = 1u << (drop - 1);
    if (rest > half || (rest == half && (kept & 1u))) kept++;
    return kept;
}

uint16_t loom_f32_to_bf16_ref(float x)
{
    uint32_t u = bits_of(x);
    if ((u & F32_ABS) > F32_INF) return BF16_NAN;
    /* Same exponent field: rounding the low 16 bits away is the whole job;
     * a carry out of the mantissa is the next binade (or inf). */
    return (uint16_t)round_shift_ref(u, 16);
}

float loom_bf16_to_f32_ref(uint16_t h)
{
    int neg = h >> 15, exp = (h >> 7) & 0xff, mant = h & 0x7f;
    if (exp == 0xff) return float_of((uint32_t)h << 16); /* inf, NaN: bits as they are */
    float v = exp == 0 ? ldexpf((float)mant, -133) : ldexpf((float)(mant | 0x80), exp - 134);
    return neg ? -v : v;
}

uint16_t loom_f32_to_f16_ref(float x)
{
    uint32_t u = bits_of(x);
    uint16_t sign = (uint16_t)((u >> 16) & 0x8000u);
    int exp = (int)((u >> 23) & 0xff);
    uint32_t mant = u & 0x7fffffu;
    if (exp == 0xff) return sign | (mant ? F16_NAN : F16_INF);
    if (exp == 0) return sign; /* zero, fp32 subnormal: far below 2^-25 */
    int e = exp - 127;         /* the value is sig * 2^(e - 23), sig 24 bits */
    uint32_t sig = mant | 0x800000u;
    if (e >= -14) {                            /* fp16 normal: 11 significant bits, exponent e + 15 */
        uint32_t q = round_shift_ref(sig, 13); /* in [2^10, 2^11] */
        uint32_t h = ((uint32_t)(e + 15) << 10) + (q - 0x400u); /* q == 2^11 carries on */
        return sign | (h >= F16_INF ? F16_INF : (uint16_t)h);
    }
    /* fp16 subnormal: the value in units of 2^-24 */
    int drop = 13 + (-14 - e);
    if (drop > 24) return sign;                         /* below 2^-25 */
    return sign | (uint16_t)round_shift_ref(sig, drop); /* 2^10 is the smallest normal */
}

float loom_f16_to_f32_ref(uint16_t h)
{
    int neg = h >> 15, exp = (h >> 10) & 0x1f, mant = h & 0x3ff;
    if (exp == 0x1f) {
        uint32_t bits = (uint32_t)neg << 31 | F32_INF | (uint32_t)mant << 13;
        return float_of(mant ? bits | 0x400000u : bits); /* a NaN comes back quiet */
    }
    float v = exp == 0 ? ldexpf((float)mant, -24) : ldexpf((float)(mant | 0x400), exp - 25);
    return neg ? -v : v;
}
