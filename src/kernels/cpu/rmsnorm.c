/*
 * RMSNorm (Llama's; Hugging Face's LlamaRMSNorm), forward and backward:
 *   out = x * r * w,  r = 1 / sqrt(mean(x^2) + eps),
 * the mean and the product in float32 as Hugging Face computes them (in
 * double here for the sum, rounded once). The backward, with y = x r:
 *   dw += dout * y (summed over rows),
 *   dx  = r (g - y mean(g * y)),  g = dout * w.
 */
#include "kernels/kernels.h"

#include <math.h>

void loom_rmsnorm_forward(float *out, float *rstd, const float *inp, const float *weight, int N, int C,
                          float eps)
{
#pragma omp parallel for if ((size_t)N * C >= 65536)
    for (int i = 0; i < N; i++) {
        const float *x = inp + (size_t)i * C;
        float *y = out + (size_t)i * C;
        double ss = 0;
        for (int c = 0; c < C; c++) ss += (double)x[c] * x[c];
        const float r = 1.0f / sqrtf((float)(ss / C) + eps);
        for (int c = 0; c < C; c++) y[c] = weight[c] * (x[c] * r);
        rstd[i] = r;
    }
}

void loom_rmsnorm_backward(float *dinp, float *dweight, const float *dout, const float *inp,
                           const float *weight, const float *rstd, int N, int C)
{
    for (int i = 0; i < N; i++) { /* serial: dweight accumulates over the rows */
        const float *x = inp + (size_t)i * C, *dy = dout + (size_t)i * C;
        float *dx = dinp + (size_t)i * C;
        const float r = rstd[i];
        double dot = 0; /* sum of g * y */
        for (int c = 0; c < C; c++) dot += (double)(dy[c] * weight[c]) * (x[c] * r);
        const float mean_gy = (float)(dot / C);
        for (int c = 0; c < C; c++) {
            const float y = x[c] * r;
            dweight[c] += dy[c] * y;
            dx[c] += r * (dy[c] * weight[c] - y * mean_gy);
        }
    }
}
