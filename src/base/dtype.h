/*
 * dtype conversion: float32 <-> bfloat16 and float32 <-> fp16 (IEEE 754
 * binary16), scalar and array, bit for bit as PyTorch's
 * `.to(torch.bfloat16)` / `.to(torch.float16)` and back.
 *
 * float32 -> 16 bit rounds to nearest, ties to even, everywhere:
 *   bf16  keeps fp32's exponent range, so fp32 subnormals become bf16
 *         subnormals (their top bits, rounded); values at or above
 *         0x1.ffp127 (half way past the largest finite, 0x1.fep127)
 *         round to inf.
 *   fp16  values >= 65520 (half way past the largest finite, 65504) round
 *         to inf; below 2^-14 the result is subnormal, at or below 2^-25
 *         (half the smallest subnormal) it is zero. Signs, -0.0 included,
 *         are kept.
 *   NaN   bf16: the canonical quiet NaN 0x7FC0, whatever the sign and
 *         payload (c10::BFloat16; PyTorch's AVX2 kernel writes 0xFFFF
 *         instead, see tests/test_dtype_torch.py). fp16: 0x7E00 with the
 *         input's sign, payload dropped.
 * 16 bit -> float32 is exact. bf16 is the top half of a float32, NaN bits
 * included; an fp16 NaN keeps sign and payload and comes back quiet (the
 * quiet bit set), as PyTorch converts it.
 *
 * Each conversion has a plain branchy reference (`_ref`, written from the
 * format definitions) beside the branch-free one the arrays use; the tests
 * hold one against the other and both against PyTorch. The array versions
 * are OpenMP-parallel for large n and vectorised by the compiler. Not here:
 * F16C/AVX-512 intrinsics (the hardware's NaN payload rules differ from
 * PyTorch's), stochastic rounding, fp8.
 */
#ifndef LOOM_BASE_DTYPE_H
#define LOOM_BASE_DTYPE_H

#include <stddef.h>
#include <stdint.h>

#include "loom/types.h" /* enum loom_dtype */

/* "fp32", "bf16", "fp16", "int32", ...; NULL for a value out of range. */
const char *loom_dtype_name(enum loom_dtype dt);
/* Bytes per element. */
size_t loom_dtype_size(enum loom_dtype dt);

/* Scalars. 16-bit values travel as their bit patterns. */
uint16_t loom_f32_to_bf16(float x);
float loom_bf16_to_f32(uint16_t h);
uint16_t loom_f32_to_f16(float x);
float loom_f16_to_f32(uint16_t h);

/* The references: same results, written for reading, not speed. */
uint16_t loom_f32_to_bf16_ref(float x);
float loom_bf16_to_f32_ref(uint16_t h);
uint16_t loom_f32_to_f16_ref(float x);
float loom_f16_to_f32_ref(uint16_t h);

/* Arrays: dst (n), src (n); dst and src do not overlap. */
void loom_f32_to_bf16_array(uint16_t *dst, const float *src, size_t n);
void loom_bf16_to_f32_array(float *dst, const uint16_t *src, size_t n);
void loom_f32_to_f16_array(uint16_t *dst, const float *src, size_t n);
void loom_f16_to_f32_array(float *dst, const uint16_t *src, size_t n);

/* x (n): rounds every element to the nearest value of dt, in place
 * (float32 -> dt -> float32): parameters held "in bf16" while the kernels
 * compute in float32. A no-op for LOOM_DTYPE_F32. */
void loom_dtype_round_trip(float *x, size_t n, enum loom_dtype dt);

/* Arrays in a 16-bit dtype chosen at run time (BF16 or F16): to and from
 * float32; dst = dt(float32(dst) + src), accumulating float32 values into
 * 16-bit storage; the sum of squares in double; whether any is inf or NaN. */
void loom_lp_from_f32(uint16_t *dst, const float *src, size_t n, enum loom_dtype dt);
void loom_lp_to_f32(float *dst, const uint16_t *src, size_t n, enum loom_dtype dt);
void loom_lp_accumulate(uint16_t *dst, const float *src, size_t n, enum loom_dtype dt);
/* x (n) rounded to dt in place, as loom_dtype_round_trip does, and its
 * 16-bit bits stored in dst (n): a kernel's float32 result kept in 16 bits
 * while the next kernel reads the rounded float32 values. */
void loom_lp_round_store(uint16_t *dst, float *x, size_t n, enum loom_dtype dt);
double loom_lp_sum_squares(const uint16_t *x, size_t n, enum loom_dtype dt);
int loom_lp_has_nonfinite(const uint16_t *x, size_t n, enum loom_dtype dt);

#endif
