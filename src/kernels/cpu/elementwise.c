/*
 * The small elementwise and row-moving kernels a model needs between its
 * layers, so that no host loop touches a device buffer: scaling, adding
 * into, rounding to a 16-bit dtype, and grouped-query attention's packing
 * of q, k and v. Each element is the same float operation the model's loop
 * did, so the bits are the loop's.
 */
#include <string.h>

#include "base/dtype.h"
#include "kernels/kernels.h"

#define PAR_MIN 32768

void loom_scale(float *x, size_t n, float s)
{
#pragma omp parallel for simd schedule(static) if (n >= PAR_MIN)
    for (size_t i = 0; i < n; i++) x[i] *= s;
}

void loom_add_scalar(float *dst, const float *src, size_t n, float s)
{
#pragma omp parallel for simd schedule(static) if (n >= PAR_MIN)
    for (size_t i = 0; i < n; i++) dst[i] = s + src[i];
}

void loom_accumulate(float *dst, const float *src, size_t n)
{
#pragma omp parallel for simd schedule(static) if (n >= PAR_MIN)
    for (size_t i = 0; i < n; i++) dst[i] += src[i];
}

void loom_round_to(float *x, size_t n, enum loom_dtype dt)
{
    loom_dtype_round_trip(x, n, dt);
}

void loom_round_store(uint16_t *dst, float *x, size_t n, enum loom_dtype dt)
{
    loom_lp_round_store(dst, x, n, dt);
}

void loom_gqa_pack(float *qkv, const float *q, const float *k, const float *v, int N, int NH, int G, int hs)
{
    const int C = NH * hs, kvC = G * hs, rep = NH / G;
    for (int n = 0; n < N; n++) {
        float *row = qkv + (size_t)n * 3 * C;
        memcpy(row, q + (size_t)n * C, (size_t)C * sizeof(float));
        for (int h = 0; h < NH; h++) {
            const size_t src = (size_t)n * kvC + (size_t)(h / rep) * hs;
            memcpy(row + C + (size_t)h * hs, k + src, (size_t)hs * sizeof(float));
            memcpy(row + 2 * C + (size_t)h * hs, v + src, (size_t)hs * sizeof(float));
        }
    }
}

void loom_gqa_unpack(float *dq, float *dk, float *dv, const float *dqkv, int N, int NH, int G, int hs)
{
    const int C = NH * hs, kvC = G * hs, rep = NH / G;
    memset(dk, 0, (size_t)N * kvC * sizeof(float));
    memset(dv, 0, (size_t)N * kvC * sizeof(float));
    for (int n = 0; n < N; n++) {
        const float *row = dqkv + (size_t)n * 3 * C;
        memcpy(dq + (size_t)n * C, row, (size_t)C * sizeof(float));
        for (int h = 0; h < NH; h++) {
            float *kr = dk + (size_t)n * kvC + (size_t)(h / rep) * hs;
            float *vr = dv + (size_t)n * kvC + (size_t)(h / rep) * hs;
            const float *gk = row + C + (size_t)h * hs, *gv = row + 2 * C + (size_t)h * hs;
            for (int j = 0; j < hs; j++) {
                kr[j] += gk[j];
                vr[j] += gv[j];
            }
        }
    }
}
