/*
 * Moving and summing rows of matrices held with a row pitch, and float64
 * accumulators: the pieces of --layout-invariant's exact sums
 * (layers/tp_exact.c) that pack a piece of a split dimension, put it back,
 * and add float32 products into float64 sums in a fixed order. Each loop
 * is the one the layer ran, so the bits are the same.
 */
#include <string.h>

#include "base/dtype.h"
#include "base/log.h"
#include "kernels/kernels.h"

#define PAR_MIN 65536

void loom_convert_rows(void *dst, enum loom_dtype ddt, size_t ldd, const void *src, enum loom_dtype sdt,
                       size_t lds, size_t rows, size_t w)
{
    const size_t es = loom_dtype_size(sdt);
    LOOM_ASSERT(ddt == sdt || (ddt == LOOM_DTYPE_F32 && es == 2) ||
                (sdt == LOOM_DTYPE_F32 && ddt == LOOM_DTYPE_BF16));
#pragma omp parallel for schedule(static) if (rows * w >= PAR_MIN)
    for (size_t i = 0; i < rows; i++) {
        const char *s = (const char *)src + i * lds * es;
        if (ddt == sdt) {
            memcpy((char *)dst + i * ldd * es, s, w * es);
        } else if (ddt == LOOM_DTYPE_F32) {
            loom_lp_to_f32((float *)dst + i * ldd, (const uint16_t *)s, w, sdt);
        } else {
            uint16_t *d = (uint16_t *)dst + i * ldd;
            for (size_t c = 0; c < w; c++) d[c] = loom_f32_to_bf16(((const float *)s)[c]);
        }
    }
}

void loom_add_rows(float *dst, size_t ldd, const float *src, size_t lds, size_t rows, size_t w)
{
#pragma omp parallel for schedule(static) if (rows * w >= PAR_MIN)
    for (size_t i = 0; i < rows; i++) {
        float *d = dst + i * ldd;
        const float *q = src + i * lds;
        for (size_t c = 0; c < w; c++) d[c] += q[c];
    }
}

void loom_acc_add(double *acc, const float *v, size_t n)
{
#pragma omp parallel for schedule(static) if (n >= PAR_MIN)
    for (size_t i = 0; i < n; i++) acc[i] += v[i];
}

void loom_acc_round(float *dst, const double *acc, size_t n)
{
#pragma omp parallel for schedule(static) if (n >= PAR_MIN)
    for (size_t i = 0; i < n; i++) dst[i] = (float)acc[i];
}

void loom_acc_add_rounded(float *dst, const double *acc, size_t n)
{
    for (size_t i = 0; i < n; i++) dst[i] += (float)acc[i];
}
