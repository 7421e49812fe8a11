/* Calibration of the machine's peak FLOP/s for a compute dtype (see mfu.h). */
#include "app/mfu.h"

#include <cblas.h>

#include "base/clock.h"
#include "base/mem.h"
#include "kernels/kernels.h"

double loom_calibrate_peak_flops(enum loom_dtype compute)
{
    const int n = 1024;
    const int bf16 = compute == LOOM_DTYPE_BF16 && loom_bf16_units() != LOOM_BF16_UNITS_F32;
    size_t bytes = sizeof(float) * (size_t)n * n;
    float *a = loom_alloc(bytes, LOOM_MEM_OTHER), *b = loom_alloc(bytes, LOOM_MEM_OTHER),
          *c = loom_alloc(bytes, LOOM_MEM_OTHER);
    for (size_t i = 0; i < (size_t)n * n; i++) {
        a[i] = (float)(i % 13) * 0.01f;
        b[i] = (float)(i % 7) * 0.01f;
    }
    double best = 0;
    for (int r = 0; r < 4; r++) {
        double t0 = loom_now();
        if (bf16) /* the bf16 product as training calls it, operands converted */
            loom_lm_head_forward_bf16(c, a, b, n, n, n);
        else
            cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, n, n, n, 1.0f, a, n, b, n, 0.0f, c, n);
        double dt = loom_now() - t0;
        double flops = 2.0 * n * n * n / dt;
        if (r > 0 && flops > best) best = flops; /* the first run warms up */
    }
    loom_free(a);
    loom_free(b);
    loom_free(c);
    return best;
}
