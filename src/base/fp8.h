/*
 * fp8 numbers, as Transformer Engine's delayed-scaling recipe uses them:
 * the two formats, the saturating quantisation of a scaled float32 value,
 * the amax of a tensor, and the scale computed from an amax history.
 *
 *   E4M3 (float8_e4m3fn): 4 exponent bits (bias 7), 3 mantissa bits, no
 *        infinities, largest finite 448, smallest subnormal 2^-9; NaN is
 *        S.1111.111.
 *   E5M2 (float8_e5m2): 5 exponent bits (bias 15), 2 mantissa bits, IEEE
 *        infinities, largest finite 57344, smallest subnormal 2^-16.
 *
 * Quantisation of x with scale s is fp8(clamp(x * s, -max, max)): the
 * product in float32, clamped to the format's largest finite value (so an
 * infinity saturates too), rounded to nearest, ties to even, subnormals
 * included, signs (and -0) kept; NaN stays NaN with its sign (0x7F / 0xFF),
 * as PyTorch's `.to(torch.float8_e4m3fn)` / `.to(torch.float8_e5m2)` after
 * `clamp` gives it. Every fp8 value is exact in bf16 (and float32), so the
 * arrays write the quantised values as bf16 bit patterns, ready for the
 * bf16 matrix-product units (a NaN as bf16's canonical 0x7FC0, as PyTorch
 * converts one); the scale is undone after the product.
 *
 * The scale (Transformer Engine's default): amax the largest of the history
 * ("max") or its newest entry ("most_recent"); s' = (max / amax) / 2^margin
 * in float32 (max / amax as PyTorch evaluates it: 1/amax times max),
 * keeping the previous s where amax is 0 or not finite, or where s'
 * overflows (an amax below max / FLT_MAX; loom's own guard).
 *
 * Each conversion has a branchy `_ref` written from the format definition
 * beside the branch-free one the arrays use; tests/test_fp8_torch.py holds
 * both against PyTorch on every float32 pattern class. Not here: stochastic
 * rounding, per-block scales (MXFP8), fp8 storage of tensors.
 */
#ifndef LOOM_BASE_FP8_H
#define LOOM_BASE_FP8_H

#include <stddef.h>
#include <stdint.h>

enum loom_fp8_format { LOOM_FP8_E4M3 = 0, LOOM_FP8_E5M2 = 1, LOOM_FP8_FORMAT_COUNT };

/* "e4m3", "e5m2". */
const char *loom_fp8_format_name(enum loom_fp8_format f);
/* The largest finite value: 448, 57344. */
float loom_fp8_max(enum loom_fp8_format f);

/* x quantised (saturating, ties to even) to its fp8 code, and back. */
uint8_t loom_fp8_encode(float x, enum loom_fp8_format f);
uint8_t loom_fp8_encode_ref(float x, enum loom_fp8_format f);
float loom_fp8_decode(uint8_t code, enum loom_fp8_format f);

/* out16 (n): the bf16 bits of the fp8 quantisation of x[i] * scale. */
void loom_fp8_quantize_bf16(uint16_t *out16, const float *x, size_t n, float scale, enum loom_fp8_format f);
/* The same from bf16 input (x16: a tensor stored in bf16). */
void loom_fp8_quantize_bf16_from16(uint16_t *out16, const uint16_t *x16, size_t n, float scale,
                                   enum loom_fp8_format f);
/* max |x[i]| (n), NaN when any element is NaN. */
float loom_fp8_amax(const float *x, size_t n);
float loom_fp8_amax16(const uint16_t *x16, size_t n);

enum loom_fp8_amax_algo { LOOM_FP8_AMAX_MAX = 0, LOOM_FP8_AMAX_MOST_RECENT = 1, LOOM_FP8_AMAX_ALGO_COUNT };
/* The next scale from an amax history (len entries, history[0] the newest)
 * and the current scale. */
float loom_fp8_scale_update(const float *history, int len, enum loom_fp8_amax_algo algo, float scale,
                            int margin, enum loom_fp8_format f);

#endif
