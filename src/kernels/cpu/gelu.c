/*
 * GELU, forward and backward, in two forms; and GeGLU's gate (Gemma's MLP:
 * down(gelu(gate(x)) * up(x))) on the tanh form.
 *
 * The tanh form (GPT-2's, Hugging Face's gelu_new), as
 * torch.nn.functional.gelu(x, approximate="tanh"):
 *   gelu(x) = 0.5 x (1 + tanh(u)),  u = sqrt(2/pi) (x + 0.044715 x^3).
 *
 * Computed through one exponential, using 0.5 (1 + tanh(u)) = sigmoid(2u):
 *   gelu(x)  = x s,  s = 1 / (1 + e),  e = exp(-2u),
 *   gelu'(x) = s + 2 x s (1 - s) u',  1 - s = e s,
 *   u' = sqrt(2/pi) (1 + 3 * 0.044715 x^2).
 * This has no 1 + tanh cancellation for negative x, so the relative error
 * stays at the level of the exponential (vexp.h) everywhere, and the loop
 * vectorises.
 *
 * The exact form (Hugging Face's and PyTorch's default "gelu"):
 *   gelu(x)  = x Phi(x),  Phi(x) = 0.5 (1 + erf(x / sqrt 2)),
 *   gelu'(x) = Phi(x) + x phi(x),  phi(x) = exp(-x^2 / 2) / sqrt(2 pi).
 * Phi through erfc for negative x, where 1 + erf(x) would cancel.
 */
#include "kernels/kernels.h"

#include <math.h>

#include "kernels/cpu/vexp.h"

#define GELU_K 0.7978845608028654f /* sqrt(2/pi) */
#define GELU_A 0.044715f
#define PAR_MIN 16384
/* exp(-2u) is capped at exp(80): below x ~ -9.3, s ~ 2e-35 and gelu(x) is 0
 * to float precision either way, and e stays finite so e * s is never
 * inf * 0. */
#define EXP_CAP 80.0f

static inline float neg_two_u(float x)
{
    const float t = -2.0f * GELU_K * (x + GELU_A * x * x * x);
    return t > EXP_CAP ? EXP_CAP : t; /* a comparison, so NaN passes through */
}

/* out, inp (n) */
void loom_gelu_forward(float *out, const float *inp, size_t n)
{
#pragma omp parallel for simd schedule(static) if (n >= PAR_MIN)
    for (size_t i = 0; i < n; i++) {
        const float x = inp[i];
        out[i] = x / (1.0f + vexpf(neg_two_u(x)));
    }
}

/* dinp (n) written; dout, inp (n) */
void loom_gelu_backward(float *dinp, const float *dout, const float *inp, size_t n)
{
#pragma omp parallel for simd schedule(static) if (n >= PAR_MIN)
    for (size_t i = 0; i < n; i++) {
        const float x = inp[i];
        const float e = vexpf(neg_two_u(x));
        const float s = 1.0f / (1.0f + e);
        const float du = GELU_K * (1.0f + 3.0f * GELU_A * x * x);
        dinp[i] = dout[i] * (s + 2.0f * x * s * (e * s) * du);
    }
}

/* GeGLU, on the tanh form's steps above, so that gelu(g) and gelu'(g) are
 * the bits loom_gelu_forward and loom_gelu_backward compute:
 *   out = gelu(g) u;  dg = (dout u) gelu'(g),  du = dout gelu(g).
 * out, gate, up (n) */
void loom_geglu_forward(float *out, const float *gate, const float *up, size_t n)
{
#pragma omp parallel for simd schedule(static) if (n >= PAR_MIN)
    for (size_t i = 0; i < n; i++) {
        const float x = gate[i];
        const float g = x / (1.0f + vexpf(neg_two_u(x)));
        out[i] = g * up[i];
    }
}

/* dgate, dup (n) written; dout, gate, up (n) */
void loom_geglu_backward(float *dgate, float *dup, const float *dout, const float *gate, const float *up,
                         size_t n)
{
#pragma omp parallel for simd schedule(static) if (n >= PAR_MIN)
    for (size_t i = 0; i < n; i++) {
        const float x = gate[i], d = dout[i];
        const float e = vexpf(neg_two_u(x));
        const float s = 1.0f / (1.0f + e);
        const float du = GELU_K * (1.0f + 3.0f * GELU_A * x * x);
        dgate[i] = d * up[i] * (s + 2.0f * x * s * (e * s) * du);
        dup[i] = d * (x / (1.0f + e));
    }
}

/* Phi(x), the standard normal's distribution function, without cancellation
 * in either tail. */
static inline float normal_cdf(float x)
{
    return 0.5f * erfcf(-x * 0.70710678118654752f);
}

/* out, inp (n) */
void loom_gelu_exact_forward(float *out, const float *inp, size_t n)
{
#pragma omp parallel for schedule(static) if (n >= PAR_MIN)
    for (size_t i = 0; i < n; i++) out[i] = inp[i] * normal_cdf(inp[i]);
}

/* dinp (n) written; dout, inp (n) */
void loom_gelu_exact_backward(float *dinp, const float *dout, const float *inp, size_t n)
{
#pragma omp parallel for schedule(static) if (n >= PAR_MIN)
    for (size_t i = 0; i < n; i++) {
        const float x = inp[i];
        const float pdf = 0.39894228040143268f * expf(-0.5f * x * x); /* 1/sqrt(2 pi) */
        dinp[i] = dout[i] * (normal_cdf(x) + x * pdf);
    }
}
