/*
 * Dense layers through cblas_sgemm: matmul + bias with the weight stored
 * [in, out] (Hugging Face GPT-2's Conv1D layout), the LM head tied to the
 * token embedding (logits = inp @ wte^T), and the linear layer with the
 * weight stored [out, in] (torch.nn.Linear's), which is the LM head's
 * product plus a bias. Plus plain triple-loop `_ref` versions (double
 * accumulators) that the tests hold the BLAS path against.
 *
 * The BLAS is called outside any parallel region, so it uses every thread.
 * Deliberately not: a hand-written GEMM, or fused activations.
 */
#include "kernels/kernels.h"

#include <cblas.h>

#include "base/mem.h"

#define COL_BLOCK 128 /* columns per task in the bias-gradient reduction */

/* out (N,OC) += bias (OC), row by row */
void loom_bias_forward(float *out, const float *bias, int N, int OC)
{
#pragma omp parallel for schedule(static) if ((size_t)N * OC >= 32768)
    for (int i = 0; i < N; i++) {
        float *o = out + (size_t)i * OC;
#pragma omp simd
        for (int c = 0; c < OC; c++) o[c] += bias[c];
    }
}

/* dbias (OC) += column sums of dout (N,OC). Threads own column bands, so
 * there is no race and the rows are added in order. */
void loom_bias_backward(float *dbias, const float *dout, int N, int OC)
{
    const int nblocks = (OC + COL_BLOCK - 1) / COL_BLOCK;
#pragma omp parallel for schedule(static) if ((size_t)N * OC >= 32768)
    for (int blk = 0; blk < nblocks; blk++) {
        const int c0 = blk * COL_BLOCK;
        const int w = c0 + COL_BLOCK < OC ? COL_BLOCK : OC - c0;
        double acc[COL_BLOCK] = {0};
        for (int i = 0; i < N; i++) {
            const float *d = dout + (size_t)i * OC + c0;
#pragma omp simd
            for (int c = 0; c < w; c++) acc[c] += d[c];
        }
        for (int c = 0; c < w; c++) dbias[c0 + c] += (float)acc[c];
    }
}

/* out (N,OC) = inp (N,C) @ weight (C,OC) + bias (OC) */
void loom_matmul_forward(float *out, const float *inp, const float *weight, const float *bias, int N, int C,
                         int OC)
{
    float beta = 0.0f;
    if (bias) {
        /* start from the bias and let the GEMM add onto it (beta = 1) */
#pragma omp parallel for schedule(static) if ((size_t)N * OC >= 32768)
        for (int i = 0; i < N; i++) {
            float *o = out + (size_t)i * OC;
#pragma omp simd
            for (int c = 0; c < OC; c++) o[c] = bias[c];
        }
        beta = 1.0f;
    }
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, N, OC, C, 1.0f, inp, C, weight, OC, beta, out, OC);
}

/* dinp (N,C) = dout @ weight^T (written, skipped when NULL);
 * dweight (C,OC) += inp^T @ dout; dbias (OC) += sum over rows of dout */
void loom_matmul_backward(float *dinp, float *dweight, float *dbias, const float *dout, const float *inp,
                          const float *weight, int N, int C, int OC)
{
    if (dinp)
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, N, C, OC, 1.0f, dout, OC, weight, OC, 0.0f, dinp,
                    C);
    if (dweight)
        cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, C, OC, N, 1.0f, inp, C, dout, OC, 1.0f, dweight,
                    OC);
    if (dbias) loom_bias_backward(dbias, dout, N, OC);
}

/* logits (N,V) = inp (N,C) @ wte (V,C)^T */
void loom_lm_head_forward(float *logits, const float *inp, const float *wte, int N, int C, int V)
{
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, N, V, C, 1.0f, inp, C, wte, C, 0.0f, logits, V);
}

/* dinp (N,C) = dlogits (N,V) @ wte (V,C), written; dwte (V,C) += dlogits^T @ inp */
void loom_lm_head_backward(float *dinp, float *dwte, const float *dlogits, const float *inp, const float *wte,
                           int N, int C, int V)
{
    if (dinp)
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, N, C, V, 1.0f, dlogits, V, wte, C, 0.0f, dinp,
                    C);
    if (dwte)
        cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, V, C, N, 1.0f, dlogits, V, inp, C, 1.0f, dwte,
                    C);
}

/* x16 (n values, bf16) widened to float32 in a buffer to loom_free; NULL
 * when x16 is NULL. */
static float *widened(const uint16_t *x16, size_t n)
{
    if (!x16) return NULL;
    float *x = loom_alloc(loom_mul_size(n, sizeof(float)), LOOM_MEM_OTHER);
    loom_bf16_to_f32_array(x, x16, n);
    return x;
}

/* out (N,OC) = inp (N,C) @ weight (OC,C)^T + bias (OC): the LM head's
 * product, on the bf16 operands widened where given */
void loom_linear_forward(float *out, const float *inp, const uint16_t *inp16, const float *weight,
                         const uint16_t *weight16, const float *bias, int N, int C, int OC)
{
    float *x = widened(inp16, (size_t)N * C), *w = widened(weight16, (size_t)OC * C);
    loom_lm_head_forward(out, x ? x : inp, w ? w : weight, N, C, OC);
    if (bias) loom_bias_forward(out, bias, N, OC);
    loom_free(x);
    loom_free(w);
}

/* dinp (N,C) = dout @ weight, written; dweight (OC,C) += dout^T @ inp;
 * dbias (OC) += column sums of dout; each skipped when NULL */
void loom_linear_backward(float *dinp, float *dweight, float *dbias, const float *dout, const float *inp,
                          const uint16_t *inp16, const float *weight, const uint16_t *weight16, int N, int C,
                          int OC)
{
    float *x = dweight ? widened(inp16, (size_t)N * C) : NULL;
    float *w = dinp ? widened(weight16, (size_t)OC * C) : NULL;
    if (dinp || dweight) loom_lm_head_backward(dinp, dweight, dout, x ? x : inp, w ? w : weight, N, C, OC);
    if (dbias) loom_bias_backward(dbias, dout, N, OC);
    loom_free(x);
    loom_free(w);
}

/* A block of the (N, V) logits staged in float32: V columns of N rows
 * (or, called as lp_block(V, N), rows of V columns) at a time, about 1M
 * values, at least 64 (or all V). */
static int lp_block(int N, int V)
{
    const int cols = (1 << 20) / (N > 0 ? N : 1);
    return cols < 64 ? (V < 64 ? V : 64) : cols > V ? V : cols;
}

size_t loom_lm_head_lp_scratch(int N, int V)
{
    const size_t fwd = (size_t)lp_block(V, N) * V, bwd = (size_t)N * lp_block(N, V);
    return (fwd > bwd ? fwd : bwd) * sizeof(float);
}

void loom_lm_head_forward_lp(uint16_t *logits, enum loom_dtype dt, const float *inp, const float *wte,
                             const uint16_t *wte16, int N, int C, int V)
{
    (void)wte16;
    const int R = lp_block(V, N); /* rows: about 1M float32 values */
    float *blk = loom_alloc(loom_mul_size((size_t)R, (size_t)V * sizeof(float)), LOOM_MEM_ACTIVATIONS);
    for (int r0 = 0; r0 < N; r0 += R) {
        const int n = N - r0 < R ? N - r0 : R;
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, n, V, C, 1.0f, inp + (size_t)r0 * C, C, wte, C,
                    0.0f, blk, V);
        loom_lp_from_f32(logits + (size_t)r0 * V, blk, (size_t)n * V, dt);
    }
    loom_free(blk);
}

void loom_lm_head_backward_lp(float *dinp, float *dwte, const uint16_t *dlogits, enum loom_dtype dt,
                              const float *inp, const float *wte, const uint16_t *wte16, int N, int C, int V)
{
    (void)wte16;
    const int Vb = lp_block(N, V);
    float *blk = loom_alloc(loom_mul_size((size_t)N, (size_t)Vb * sizeof(float)), LOOM_MEM_ACTIVATIONS);
    for (int v0 = 0; v0 < V; v0 += Vb) {
        const int vb = V - v0 < Vb ? V - v0 : Vb;
#pragma omp parallel for schedule(static) if ((size_t)N * vb >= 65536)
        for (int i = 0; i < N; i++)
            loom_lp_to_f32(blk + (size_t)i * vb, dlogits + (size_t)i * V + v0, (size_t)vb, dt);
        /* dinp (+)= blk @ wte[v0:v0+vb];  dwte[v0:v0+vb] += blk^T @ inp */
        if (dinp)
            cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, N, C, vb, 1.0f, blk, vb,
                        wte + (size_t)v0 * C, C, v0 ? 1.0f : 0.0f, dinp, C);
        cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, vb, C, N, 1.0f, blk, vb, inp, C, 1.0f,
                    dwte + (size_t)v0 * C, C);
    }
    loom_free(blk);
}

/* ---- reference versions: plain loops, double accumulators ---------------- */

void loom_matmul_forward_ref(float *out, const float *inp, const float *weight, const float *bias, int N,
                             int C, int OC)
{
    for (int i = 0; i < N; i++)
        for (int o = 0; o < OC; o++) {
            double s = bias ? bias[o] : 0.0;
            for (int c = 0; c < C; c++) s += (double)inp[(size_t)i * C + c] * weight[(size_t)c * OC + o];
            out[(size_t)i * OC + o] = (float)s;
        }
}

void loom_matmul_backward_ref(float *dinp, float *dweight, float *dbias, const float *dout, const float *inp,
                              const float *weight, int N, int C, int OC)
{
    if (dinp)
        for (int i = 0; i < N; i++)
            for (int c = 0; c < C; c++) {
                double s = 0.0;
                for (int o = 0; o < OC; o++)
                    s += (double)dout[(size_t)i * OC + o] * weight[(size_t)c * OC + o];
                dinp[(size_t)i * C + c] = (float)s;
            }
    if (dweight)
        for (int c = 0; c < C; c++)
            for (int o = 0; o < OC; o++) {
                double s = 0.0;
                for (int i = 0; i < N; i++) s += (double)inp[(size_t)i * C + c] * dout[(size_t)i * OC + o];
                dweight[(size_t)c * OC + o] += (float)s;
            }
    if (dbias)
        for (int o = 0; o < OC; o++) {
            double s = 0.0;
            for (int i = 0; i < N; i++) s += dout[(size_t)i * OC + o];
            dbias[o] += (float)s;
        }
}

void loom_lm_head_forward_ref(float *logits, const float *inp, const float *wte, int N, int C, int V)
{
    for (int i = 0; i < N; i++)
        for (int v = 0; v < V; v++) {
            double s = 0.0;
            for (int c = 0; c < C; c++) s += (double)inp[(size_t)i * C + c] * wte[(size_t)v * C + c];
            logits[(size_t)i * V + v] = (float)s;
        }
}

void loom_lm_head_forward_lp_ref(uint16_t *logits, enum loom_dtype dt, const float *inp, const float *wte,
                                 const uint16_t *wte16, int N, int C, int V)
{
    (void)wte16;
    float *l = loom_alloc(loom_mul_size((size_t)N * V, sizeof(float)), LOOM_MEM_OTHER);
    loom_lm_head_forward_ref(l, inp, wte, N, C, V);
    loom_lp_from_f32(logits, l, (size_t)N * V, dt);
    loom_free(l);
}

void loom_lm_head_backward_lp_ref(float *dinp, float *dwte, const uint16_t *dlogits, enum loom_dtype dt,
                                  const float *inp, const float *wte, const uint16_t *wte16, int N, int C,
                                  int V)
{
    (void)wte16;
    float *d = loom_alloc(loom_mul_size((size_t)N * V, sizeof(float)), LOOM_MEM_OTHER);
    loom_lp_to_f32(d, dlogits, (size_t)N * V, dt);
    loom_lm_head_backward_ref(dinp, dwte, d, inp, wte, N, C, V);
    loom_free(d);
}

void loom_lm_head_backward_ref(float *dinp, float *dwte, const float *dlogits, const float *inp,
                               const float *wte, int N, int C, int V)
{
    if (dinp)
        for (int i = 0; i < N; i++)
            for (int c = 0; c < C; c++) {
                double s = 0.0;
                for (int v = 0; v < V; v++) s += (double)dlogits[(size_t)i * V + v] * wte[(size_t)v * C + c];
                dinp[(size_t)i * C + c] = (float)s;
            }
    if (!dwte) return;
    for (int v = 0; v < V; v++)
        for (int c = 0; c < C; c++) {
            double s = 0.0;
            for (int i = 0; i < N; i++) s += (double)dlogits[(size_t)i * V + v] * inp[(size_t)i * C + c];
            dwte[(size_t)v * C + c] += (float)s;
        }
}

/* element i of an operand given in float32 (x) or in bf16 (x16, when non-NULL) */
static float at(const float *x, const uint16_t *x16, size_t i)
{
    return x16 ? loom_bf16_to_f32(x16[i]) : x[i];
}

void loom_linear_forward_ref(float *out, const float *inp, const uint16_t *inp16, const float *weight,
                             const uint16_t *weight16, const float *bias, int N, int C, int OC)
{
    for (int i = 0; i < N; i++)
        for (int o = 0; o < OC; o++) {
            double s = 0.0;
            for (int c = 0; c < C; c++)
                s += (double)at(inp, inp16, (size_t)i * C + c) * at(weight, weight16, (size_t)o * C + c);
            out[(size_t)i * OC + o] = bias ? (float)s + bias[o] : (float)s;
        }
}

void loom_linear_backward_ref(float *dinp, float *dweight, float *dbias, const float *dout, const float *inp,
                              const uint16_t *inp16, const float *weight, const uint16_t *weight16, int N,
                              int C, int OC)
{
    if (dinp)
        for (int i = 0; i < N; i++)
            for (int c = 0; c < C; c++) {
                double s = 0.0;
                for (int o = 0; o < OC; o++)
                    s += (double)dout[(size_t)i * OC + o] * at(weight, weight16, (size_t)o * C + c);
                dinp[(size_t)i * C + c] = (float)s;
            }
    if (dweight)
        for (int o = 0; o < OC; o++)
            for (int c = 0; c < C; c++) {
                double s = 0.0;
                for (int i = 0; i < N; i++)
                    s += (double)dout[(size_t)i * OC + o] * at(inp, inp16, (size_t)i * C + c);
                dweight[(size_t)o * C + c] += (float)s;
            }
    if (dbias)
        for (int o = 0; o < OC; o++) {
            double s = 0.0;
            for (int i = 0; i < N; i++) s += dout[(size_t)i * OC + o];
            dbias[o] += (float)s;
        }
}
