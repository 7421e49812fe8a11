/*
 * SwiGLU's gate (Llama's MLP: down(silu(gate(x)) * up(x))), forward and
 * backward, over n elements:
 *   out = silu(g) u,  silu(g) = g s,  s = 1 / (1 + exp(-g));
 *   dg = dout u s (1 + g (1 - s)),  du = dout silu(g)   (both written).
 */
#include "kernels/kernels.h"

#include <math.h>

void loom_swiglu_forward(float *out, const float *gate, const float *up, size_t n)
{
#pragma omp parallel for if (n >= 65536)
    for (size_t i = 0; i < n; i++) {
        const float g = gate[i], s = 1.0f / (1.0f + expf(-g));
        out[i] = g * s * up[i];
    }
}

void loom_swiglu_backward(float *dgate, float *dup, const float *dout, const float *gate, const float *up,
                          size_t n)
{
#pragma omp parallel for if (n >= 65536)
    for (size_t i = 0; i < n; i++) {
        const float g = gate[i], s = 1.0f / (1.0f + expf(-g));
        dgate[i] = dout[i] * up[i] * s * (1.0f + g * (1.0f - s));
        dup[i] = dout[i] * g * s;
    }
}
