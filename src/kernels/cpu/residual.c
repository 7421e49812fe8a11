/*
 * Residual add: out = a + b, and its backward, which adds dout into both
 * branches (both accumulate: they feed the residual stream).
 * Deliberately not fused with anything (layernorm fusion would be the next
 * step); these loops are memory-bound and vectorised.
 */
#include "kernels/kernels.h"

/* Below this many elements a parallel region costs more than it saves. */
#define PAR_MIN 32768

/* out, a, b (n) */
void loom_residual_forward(float *out, const float *a, const float *b, size_t n)
{
#pragma omp parallel for simd schedule(static) if (n >= PAR_MIN)
    for (size_t i = 0; i < n; i++) out[i] = a[i] + b[i];
}

/* da, db, dout (n). dout is read before either write, so da or db may alias
 * it. */
void loom_residual_backward(float *da, float *db, const float *dout, size_t n)
{
#pragma omp parallel for simd schedule(static) if (n >= PAR_MIN)
    for (size_t i = 0; i < n; i++) {
        float d = dout[i];
        da[i] += d;
        db[i] += d;
    }
}
