/*
 * Softmax + cross-entropy over the vocabulary, fused: per-row loss and
 * log-sum-exp forward, and the logits gradient backward (in place allowed).
 *
 * Rows are split between threads. The forward reads each row once: it
 * walks the row in chunks of CHUNK floats (kept in L1), and keeps a running
 * max and a running sum of exp(x - max) in double, rescaling the sum when a
 * chunk raises the max (an online softmax at chunk granularity). The
 * exponentials are vexp.h's vectorised expf. Deliberately not: an ignore
 * index, label smoothing, or the mean over rows (the caller picks dloss).
 */
#include "kernels/kernels.h"

#include <math.h>

#include "base/log.h"
#include "kernels/cpu/vexp.h"

#define CHUNK 2048

/* log(sum(exp(x))) of one row (V), in one pass over memory. */
static float row_logsumexp(const float *x, int V)
{
    float mx = -INFINITY;
    double sum = 0.0;
    for (int c0 = 0; c0 < V; c0 += CHUNK) {
        const int n = V - c0 < CHUNK ? V - c0 : CHUNK;
        const float *xc = x + c0;
        float cmx = -INFINITY;
#pragma omp simd reduction(max : cmx)
        for (int j = 0; j < n; j++) cmx = xc[j] > cmx ? xc[j] : cmx;
        if (cmx > mx) {
            if (sum > 0.0) sum *= exp((double)mx - (double)cmx);
            mx = cmx;
        }
        float csum = 0.0f; /* at most CHUNK terms in (0, 1] */
#pragma omp simd reduction(+ : csum)
        for (int j = 0; j < n; j++) csum += vexpf(xc[j] - mx);
        sum += csum;
    }
    return (float)((double)mx + log(sum));
}

/* losses (N), lse (N); logits (N,V), targets (N) */
void loom_crossentropy_forward(float *losses, float *lse, const float *logits, const int32_t *targets, int N,
                               int V)
{
#pragma omp parallel for schedule(static) if ((size_t)N * V >= 32768)
    for (int i = 0; i < N; i++) {
        const float *x = logits + (size_t)i * V;
        const int32_t y = targets[i];
        LOOM_ASSERT(y >= 0 && y < V);
        const float l = row_logsumexp(x, V);
        lse[i] = l;
        losses[i] = l - x[y];
    }
}

/* dlogits (N,V) written, may alias logits; lse (N); logits (N,V),
 * targets (N) */
void loom_crossentropy_backward(float *dlogits, const float *lse, const float *logits, const int32_t *targets,
                                float dloss, int N, int V)
{
#pragma omp parallel for schedule(static) if ((size_t)N * V >= 32768)
    for (int i = 0; i < N; i++) {
        const float *x = logits + (size_t)i * V;
        float *d = dlogits + (size_t)i * V;
        const float l = lse[i];
        const int32_t y = targets[i];
        const float py = vexpf(x[y] - l); /* read before the row is overwritten */
#pragma omp simd
        for (int j = 0; j < V; j++) d[j] = dloss * vexpf(x[j] - l);
        d[y] = dloss * (py - 1.0f);
    }
}
