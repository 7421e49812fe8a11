/*
 * AdamW update of one tensor, as torch.optim.AdamW's single-tensor path
 * (torch 1.13, amsgrad off, maximize off):
 *   g = grad * grad_scale
 *   p *= 1 - lr*wd;  m = b1 m + (1-b1) g;  v = b2 v + (1-b2) g^2
 *   p -= lr/(1-b1^t) * m / (sqrt(v)/sqrt(1-b2^t) + eps)
 * The step scalars are computed in double and rounded to float once, as
 * PyTorch does with Python floats; the element loop is float, vectorised
 * and split between threads. Deliberately not: the schedule, clipping's
 * norm (the caller passes grad_scale), or mixed-precision master copies.
 */
#include "kernels/kernels.h"

#include <math.h>

#include "base/log.h"

/* param, m, v (n) updated; grad (n) */
void loom_adamw_update(float *param, float *m, float *v, const float *grad, size_t n, float lr, float beta1,
                       float beta2, float eps, float weight_decay, float grad_scale, int t)
{
    LOOM_ASSERT(t >= 1);
    const double b1 = beta1, b2 = beta2;
    const float decay = (float)(1.0 - (double)lr * weight_decay);
    const float one_m_b1 = (float)(1.0 - b1), one_m_b2 = (float)(1.0 - b2);
    const float step_size = (float)((double)lr / (1.0 - pow(b1, t)));
    const float bc2_sqrt = (float)sqrt(1.0 - pow(b2, t));
#pragma omp parallel for simd schedule(static) if (n >= 32768)
    for (size_t i = 0; i < n; i++) {
        const float g = grad[i] * grad_scale;
        const float mi = beta1 * m[i] + one_m_b1 * g;
        const float vi = beta2 * v[i] + one_m_b2 * (g * g);
        const float denom = sqrtf(vi) / bc2_sqrt + eps;
        param[i] = param[i] * decay - step_size * (mi / denom);
        m[i] = mi;
        v[i] = vi;
    }
}
