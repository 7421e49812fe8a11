/*
 * Softmax + cross-entropy over the vocabulary, fused: per-row loss and
 * log-sum-exp forward, and the logits gradient backward (in place allowed).
 *
 * Rows are split between threads. The forward reads each row once: it
 * walks the row in chunks of CHUNK floats (kept in L1), and keeps a running
 * max and a running sum of exp(x - max) in double, rescaling the sum when a
 * chunk raises the max (an online softmax at chunk granularity). The
 * exponentials are vexp.h's vectorised expf.
 *
 * The vocabulary-parallel form (Megatron's): a tensor-parallel rank holds
 * the logits of columns [v0, v0 + V) only. It takes three passes with two
 * all-reduces between them, which are the caller's: the row max of its
 * columns (all-reduce max), then with the global max the sum of exp over
 * its columns and the target's logit where it holds the target (both
 * all-reduce sum), so lse = max + log(sum) and loss = lse - target logit;
 * the backward needs only lse. The sum walks the same chunks with the same
 * float-per-chunk, double-across-chunks accumulation as the fused forward,
 * and the fused backward is the vocabulary-parallel one at v0 = 0, so one
 * rank holding the whole vocabulary agrees with the fused kernels to
 * rounding (to the bit in the backward).
 *
 * Deliberately not: an ignore index, label smoothing, or the mean over rows
 * (the caller picks dloss).
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

/* ---- vocabulary-parallel ---------------------------------------------------- */

/* rowmax (N) written; logits (N,V) */
void loom_crossentropy_vp_max(float *rowmax, const float *logits, int N, int V)
{
#pragma omp parallel for schedule(static) if ((size_t)N * V >= 32768)
    for (int i = 0; i < N; i++) {
        const float *x = logits + (size_t)i * V;
        float mx = -INFINITY;
#pragma omp simd reduction(max : mx)
        for (int j = 0; j < V; j++) mx = x[j] > mx ? x[j] : mx;
        rowmax[i] = mx;
    }
}

/* sumexp (N), target_logit (N) written; logits (N,V) columns v0.., max (N)
 * the whole vocabulary's, targets (N) */
void loom_crossentropy_vp_stats(float *sumexp, float *target_logit, const float *logits, const float *max,
                                const int32_t *targets, int v0, int N, int V)
{
#pragma omp parallel for schedule(static) if ((size_t)N * V >= 32768)
    for (int i = 0; i < N; i++) {
        const float *x = logits + (size_t)i * V;
        const float mx = max[i];
        double sum = 0.0;
        for (int c0 = 0; c0 < V; c0 += CHUNK) {
            const int n = V - c0 < CHUNK ? V - c0 : CHUNK;
            const float *xc = x + c0;
            float csum = 0.0f; /* at most CHUNK terms in (0, 1] */
#pragma omp simd reduction(+ : csum)
            for (int j = 0; j < n; j++) csum += vexpf(xc[j] - mx);
            sum += csum;
        }
        sumexp[i] = (float)sum;
        const int32_t y = targets[i];
        LOOM_ASSERT(y >= 0);
        const int64_t yl = (int64_t)y - v0;
        target_logit[i] = yl >= 0 && yl < V ? x[yl] : 0.0f;
    }
}

/* dlogits (N,V) written, may alias logits; lse (N) the whole vocabulary's;
 * logits (N,V) columns v0.., targets (N) */
void loom_crossentropy_vp_backward(float *dlogits, const float *lse, const float *logits,
                                   const int32_t *targets, int v0, float dloss, int N, int V)
{
#pragma omp parallel for schedule(static) if ((size_t)N * V >= 32768)
    for (int i = 0; i < N; i++) {
        const float *x = logits + (size_t)i * V;
        float *d = dlogits + (size_t)i * V;
        const float l = lse[i];
        const int64_t yl = (int64_t)targets[i] - v0;
        const int here = yl >= 0 && yl < V;
        const float py = here ? vexpf(x[yl] - l) : 0.0f; /* read before the row is overwritten */
#pragma omp simd
        for (int j = 0; j < V; j++) d[j] = dloss * vexpf(x[j] - l);
        if (here) d[yl] = dloss * (py - 1.0f);
    }
}

/* dlogits (N,V) written, may alias logits; lse (N); logits (N,V),
 * targets (N) */
void loom_crossentropy_backward(float *dlogits, const float *lse, const float *logits, const int32_t *targets,
                                float dloss, int N, int V)
{
    loom_crossentropy_vp_backward(dlogits, lse, logits, targets, 0, dloss, N, V);
}

void loom_crossentropy_vp_finish(float *losses, float *lse, const float *max, const float *sumexp,
                                 const float *target_logit, int N)
{
    for (int i = 0; i < N; i++) {
        lse[i] = max[i] + logf(sumexp[i]);
        losses[i] = lse[i] - target_logit[i];
    }
}
