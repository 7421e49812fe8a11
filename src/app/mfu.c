/* sgemm calibration of the machine's peak FLOP/s (see mfu.h). */
#include "app/mfu.h"

#include <cblas.h>

#include "base/clock.h"
#include "base/mem.h"

double loom_calibrate_peak_flops(void)
{
    const int n = 1024;
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
