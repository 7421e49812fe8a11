/*
 * Rotary position embedding (Hugging Face's Llama convention, rotate_half),
 * in place over x (B,T,H,D): for position t, j < D/2 and the angle
 * a = t theta^(-2j/D),
 *   x'[j]       = x[j] cos a - x[j+D/2] sin a,
 *   x'[j+D/2]   = x[j+D/2] cos a + x[j] sin a.
 * The angles are computed as Hugging Face computes them: the inverse
 * frequency in float32 (1 / theta^(2j/D)), times the position in float32,
 * then cos and sin in float32. The backward rotates the gradient by -a.
 */
#include "kernels/kernels.h"

#include <math.h>

/* Row bt at position pos[bt], or bt % T without pos. */
static void rotate(float *x, const int32_t *pos, int B, int T, int H, int D, float theta, float sign)
{
    const int half = D / 2;
#pragma omp parallel for if ((size_t)B * T * H * D >= 65536)
    for (int bt = 0; bt < B * T; bt++) {
        const int t = pos ? pos[bt] : bt % T;
        for (int j = 0; j < half; j++) {
            const float inv_freq = 1.0f / powf(theta, (float)(2 * j) / (float)D);
            const float a = (float)t * inv_freq, c = cosf(a), s = sign * sinf(a);
            for (int h = 0; h < H; h++) {
                float *v = x + ((size_t)bt * H + h) * D;
                const float x0 = v[j], x1 = v[j + half];
                v[j] = x0 * c - x1 * s;
                v[j + half] = x1 * c + x0 * s;
            }
        }
    }
}

void loom_rope_forward(float *x, int B, int T, int H, int D, float theta)
{
    rotate(x, NULL, B, T, H, D, theta, 1.0f);
}

void loom_rope_backward(float *dx, int B, int T, int H, int D, float theta)
{
    rotate(dx, NULL, B, T, H, D, theta, -1.0f);
}

void loom_rope_forward_at(float *x, const int32_t *pos, int N, int H, int D, float theta)
{
    rotate(x, pos, N, 1, H, D, theta, 1.0f);
}

void loom_rope_backward_at(float *dx, const int32_t *pos, int N, int H, int D, float theta)
{
    rotate(dx, pos, N, 1, H, D, theta, -1.0f);
}
