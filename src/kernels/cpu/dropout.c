/*
 * Dropout on rows (kernels.h): each row's mask from its global index
 * (kernels/dropout_mask.h), applied in place, rows in parallel. The
 * reference beside it draws each element's mask on its own.
 */
#include "kernels/dropout_mask.h"

#include "kernels/kernels.h"

void loom_dropout_rows(float *x, size_t ld, const int64_t *row, int rows, int width,
                       const struct loom_dropout *d)
{
#pragma omp parallel for schedule(static) if ((size_t)rows * width >= 65536)
    for (int r = 0; r < rows; r++) {
        float m[256] __attribute__((aligned(64)));
        const uint64_t rk = loom_dropout_row_key(d, (uint64_t)row[r]);
        float *xr = x + (size_t)r * ld;
        for (int c0 = 0; c0 < width; c0 += 256) {
            const int n = width - c0 < 256 ? width - c0 : 256;
            loom_dropout_mask_row(m, d, rk, c0, n);
#pragma omp simd
            for (int c = 0; c < n; c++) xr[c0 + c] *= m[c];
        }
    }
}

void loom_dropout_rows_ref(float *x, size_t ld, const int64_t *row, int rows, int width,
                           const struct loom_dropout *d)
{
    for (int r = 0; r < rows; r++)
        for (int c = 0; c < width; c++) {
            float m;
            loom_dropout_mask_row(&m, d, loom_dropout_row_key(d, (uint64_t)row[r]), c, 1);
            x[(size_t)r * ld + c] *= m;
        }
}
