/*
 * fp8 linear layers' elementwise kernels (layers/fp8_linear.c): quantising
 * an operand with its scale into bf16-held fp8 values, its amax, and the
 * scales undone on the float32 products. The conversions themselves are
 * base/fp8.c's; each loop here is the one the layer ran, so the bits are
 * the same.
 */
#include "kernels/kernels.h"

void loom_fp8_quantize(uint16_t *q, const float *x, const uint16_t *x16, size_t n, float scale,
                       enum loom_fp8_format fmt)
{
    if (x16)
        loom_fp8_quantize_bf16_from16(q, x16, n, scale, fmt);
    else
        loom_fp8_quantize_bf16(q, x, n, scale, fmt);
}

float loom_fp8_amax_of(const float *x, const uint16_t *x16, size_t n)
{
    return x16 ? loom_fp8_amax16(x16, n) : loom_fp8_amax(x, n);
}

void loom_fp8_unscale(float *out, const float *bias, int N, int OC, float undo)
{
#pragma omp parallel for schedule(static) if ((size_t)N * OC >= 65536)
    for (int i = 0; i < N; i++) {
        float *o = out + (size_t)i * OC;
        if (bias)
            for (int j = 0; j < OC; j++) o[j] = o[j] * undo + bias[j];
        else
            for (int j = 0; j < OC; j++) o[j] *= undo;
    }
}

void loom_fp8_scale_into(float *dinp, size_t nx, float undo_x, float *dweight, const float *dw, size_t nw,
                         float undo_w)
{
    if (dinp) {
#pragma omp parallel for simd schedule(static) if (nx >= 65536)
        for (size_t i = 0; i < nx; i++) dinp[i] *= undo_x;
    }
#pragma omp parallel for simd schedule(static) if (nw >= 65536)
    for (size_t i = 0; i < nw; i++) dweight[i] += dw[i] * undo_w;
}
