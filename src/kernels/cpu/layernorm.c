/*
 * LayerNorm over the last axis (biased variance, eps added to it, as
 * torch.nn.LayerNorm), forward and backward.
 *
 * Rows are independent and split between threads. The backward's dweight
 * and dbias are sums over rows: each thread sums its own contiguous rows
 * into a partial (2*C doubles on its stack), and after a barrier the
 * partials are added column by column in thread order. No atomics, no
 * allocation, and the same bits on every run for a given thread count.
 * Deliberately not: RMSNorm, or fusion with the residual add.
 */
#include "kernels/kernels.h"

#ifdef _OPENMP
#include <omp.h>
#endif

#include <math.h>

#include "base/log.h"

#define MAX_THREADS 256
#define MAX_C 8192 /* keeps the per-thread partial (16*C bytes) small on a thread's stack */

/* out (N,C), mean (N), rstd (N); inp (N,C), weight (C), bias (C) */
void loom_layernorm_forward(float *out, float *mean, float *rstd, const float *inp, const float *weight,
                            const float *bias, int N, int C, float eps)
{
#pragma omp parallel for schedule(static) if ((size_t)N * C >= 32768)
    for (int i = 0; i < N; i++) {
        const float *x = inp + (size_t)i * C;
        float *o = out + (size_t)i * C;
        float s = 0.0f;
#pragma omp simd reduction(+ : s)
        for (int c = 0; c < C; c++) s += x[c];
        const float m = s / C;
        float v = 0.0f; /* two-pass variance: no cancellation */
#pragma omp simd reduction(+ : v)
        for (int c = 0; c < C; c++) v += (x[c] - m) * (x[c] - m);
        const float rs = 1.0f / sqrtf(v / C + eps);
#pragma omp simd
        for (int c = 0; c < C; c++) o[c] = (x[c] - m) * rs * weight[c] + bias[c];
        mean[i] = m;
        rstd[i] = rs;
    }
}

/* One row of the backward: dinp (C) accumulates; dw, db (C) are this
 * thread's partial sums. */
static void layernorm_backward_row(float *dinp, double *dw, double *db, const float *dout, const float *inp,
                                   const float *weight, float mean, float rstd, int C)
{
    /* xhat = (x - mean) * rstd, g = dout * weight;
     * dx = rstd * (g - mean(g) - xhat * mean(g * xhat)) */
    float sg = 0.0f, sgx = 0.0f;
#pragma omp simd reduction(+ : sg, sgx)
    for (int c = 0; c < C; c++) {
        const float xhat = (inp[c] - mean) * rstd;
        const float g = dout[c] * weight[c];
        sg += g;
        sgx += g * xhat;
    }
    const float mg = sg / C, mgx = sgx / C;
#pragma omp simd
    for (int c = 0; c < C; c++) {
        const float xhat = (inp[c] - mean) * rstd;
        const float g = dout[c] * weight[c];
        dinp[c] += rstd * (g - mg - xhat * mgx);
        dw[c] += (double)(dout[c] * xhat);
        db[c] += (double)dout[c];
    }
}

/* dinp (N,C) accumulates, dweight (C) and dbias (C) accumulate;
 * dout (N,C), inp (N,C), weight (C), mean (N), rstd (N) */
void loom_layernorm_backward(float *dinp, float *dweight, float *dbias, const float *dout, const float *inp,
                             const float *weight, const float *mean, const float *rstd, int N, int C)
{
    LOOM_ASSERT(C >= 1 && C <= MAX_C);
    double *partial[MAX_THREADS];
    int nthreads = 1;
#pragma omp parallel if ((size_t)N * C >= 32768)
    {
        int tid = 0;
#ifdef _OPENMP
        tid = omp_get_thread_num();
#pragma omp single
        nthreads = omp_get_num_threads();
#endif
        LOOM_ASSERT(nthreads <= MAX_THREADS);
        double acc[2 * (size_t)C]; /* dweight partial, then dbias partial */
        for (int c = 0; c < 2 * C; c++) acc[c] = 0.0;
        partial[tid] = acc;
        /* contiguous rows per thread, so each partial covers one range */
        const int lo = (int)((int64_t)N * tid / nthreads);
        const int hi = (int)((int64_t)N * (tid + 1) / nthreads);
        for (int i = lo; i < hi; i++) {
            const size_t off = (size_t)i * C;
            layernorm_backward_row(dinp + off, acc, acc + C, dout + off, inp + off, weight, mean[i], rstd[i],
                                   C);
        }
#pragma omp barrier
#pragma omp for schedule(static)
        for (int c = 0; c < C; c++) {
            double w = 0.0, b = 0.0;
            for (int t = 0; t < nthreads; t++) {
                w += partial[t][c];
                b += partial[t][C + c];
            }
            dweight[c] += (float)w;
            dbias[c] += (float)b;
        }
        /* the implicit barrier of the loop keeps every partial alive until here */
    }
}
