/*
 * Causal multi-head self-attention on the fused qkv activation, forward and
 * backward, plus plain-loop `_ref` versions.
 *
 * The fast path works per (batch, head), in parallel over the B*NH pairs;
 * inside, each product is a cblas_sgemm on strided views of qkv (row
 * stride 3C) and out (row stride C), single-threaded because it runs inside
 * the parallel region. Rows are taken in blocks of ROW_BLOCK so that the
 * products skip the key blocks wholly above the diagonal (about half the
 * work at long T); entries above the diagonal inside a block are computed
 * and then masked. Softmax subtracts the row max; `att` keeps the
 * probabilities with exact zeros above the diagonal.
 *
 * Backward, with S = scale * Q K^T, P = softmax(S), O = P V:
 *   dP = dO V^T;  dS = P * (dP - rowsum(P * dP));
 *   dQ = scale * dS K;  dK = scale * dS^T Q;  dV = P^T dO.
 * dS overwrites dP in `datt` (scratch); its entries above each row block
 * are left unwritten.
 *
 * Deliberately not: dropout, an attention mask other than causal, or a
 * flash-style tiled kernel that never stores the T x T probabilities.
 */
#include "kernels/kernels.h"

#include <cblas.h>
#include <math.h>

#include "base/log.h"
#include "kernels/cpu/vexp.h"

#define ROW_BLOCK 64
/* Below this many multiply-adds per product (B*NH*T*T*HS) one thread does
 * it all: waking the pool would cost more. */
#define PAR_MIN ((size_t)1 << 18)

static int min_int(int a, int b)
{
    return a < b ? a : b;
}

/* Softmax of row (n1) over its first n entries, the rest set to 0. */
static void softmax_causal_row(float *row, int n, int n1)
{
    float mx = -INFINITY;
#pragma omp simd reduction(max : mx)
    for (int j = 0; j < n; j++) mx = row[j] > mx ? row[j] : mx;
    float sum = 0.0f;
#pragma omp simd reduction(+ : sum)
    for (int j = 0; j < n; j++) {
        const float e = vexpf(row[j] - mx);
        row[j] = e;
        sum += e;
    }
    const float inv = 1.0f / sum;
#pragma omp simd
    for (int j = 0; j < n; j++) row[j] *= inv;
    for (int j = n; j < n1; j++) row[j] = 0.0f;
}

/* out (B,T,C), att (B,NH,T,T); qkv (B,T,3C) */
void loom_attention_forward(float *out, float *att, const float *qkv, int B, int T, int C, int NH)
{
    LOOM_ASSERT(NH >= 1 && C % NH == 0);
    const int HS = C / NH, C3 = 3 * C;
    const float scale = 1.0f / sqrtf((float)HS);
#pragma omp parallel for collapse(2) schedule(static) if ((size_t)B * NH * T * T * HS >= PAR_MIN)
    for (int b = 0; b < B; b++)
        for (int h = 0; h < NH; h++) {
            const float *q = qkv + (size_t)b * T * C3 + (size_t)h * HS;
            const float *k = q + C;
            const float *v = q + 2 * C;
            float *a = att + ((size_t)b * NH + h) * T * T;
            float *o = out + (size_t)b * T * C + (size_t)h * HS;
            for (int i0 = 0; i0 < T; i0 += ROW_BLOCK) {
                const int i1 = min_int(i0 + ROW_BLOCK, T), rows = i1 - i0;
                float *ablk = a + (size_t)i0 * T;
                /* S[i0:i1, 0:i1] = scale * Q[i0:i1] K[0:i1]^T */
                cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, rows, i1, HS, scale, q + (size_t)i0 * C3,
                            C3, k, C3, 0.0f, ablk, T);
                for (int i = i0; i < i1; i++) softmax_causal_row(a + (size_t)i * T, i + 1, T);
                /* O[i0:i1] = P[i0:i1, 0:i1] V[0:i1] */
                cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, rows, HS, i1, 1.0f, ablk, T, v, C3,
                            0.0f, o + (size_t)i0 * C, C);
            }
        }
}

/* dqkv (B,T,3C) written, datt (B,NH,T,T) scratch; dout (B,T,C),
 * att (B,NH,T,T), qkv (B,T,3C) */
void loom_attention_backward(float *dqkv, float *datt, const float *dout, const float *att, const float *qkv,
                             int B, int T, int C, int NH)
{
    LOOM_ASSERT(NH >= 1 && C % NH == 0);
    const int HS = C / NH, C3 = 3 * C;
    const float scale = 1.0f / sqrtf((float)HS);
#pragma omp parallel for collapse(2) schedule(static) if ((size_t)B * NH * T * T * HS >= PAR_MIN)
    for (int b = 0; b < B; b++)
        for (int h = 0; h < NH; h++) {
            const size_t qoff = (size_t)b * T * C3 + (size_t)h * HS;
            const float *q = qkv + qoff, *k = q + C, *v = q + 2 * C;
            float *dq = dqkv + qoff, *dk = dq + C, *dv = dq + 2 * C;
            const float *p = att + ((size_t)b * NH + h) * T * T;
            float *ds = datt + ((size_t)b * NH + h) * T * T;
            const float *dout_bh = dout + (size_t)b * T * C + (size_t)h * HS;
            for (int i0 = 0; i0 < T; i0 += ROW_BLOCK) {
                const int i1 = min_int(i0 + ROW_BLOCK, T), rows = i1 - i0;
                /* dP[i0:i1, 0:i1] = dO[i0:i1] V[0:i1]^T */
                cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, rows, i1, HS, 1.0f,
                            dout_bh + (size_t)i0 * C, C, v, C3, 0.0f, ds + (size_t)i0 * T, T);
                for (int i = i0; i < i1; i++) {
                    const float *pr = p + (size_t)i * T;
                    float *dr = ds + (size_t)i * T;
                    float dot = 0.0f;
#pragma omp simd reduction(+ : dot)
                    for (int j = 0; j <= i; j++) dot += pr[j] * dr[j];
#pragma omp simd
                    for (int j = 0; j <= i; j++) dr[j] = pr[j] * (dr[j] - dot);
                    for (int j = i + 1; j < i1; j++) dr[j] = 0.0f;
                }
                /* dQ[i0:i1] = scale * dS[i0:i1, 0:i1] K[0:i1] */
                cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, rows, HS, i1, scale,
                            ds + (size_t)i0 * T, T, k, C3, 0.0f, dq + (size_t)i0 * C3, C3);
            }
            /* Key block [j0, j1) is reached by query rows j0..T-1 only; every
             * such row's block extends to at least j1, so dS there is set. */
            for (int j0 = 0; j0 < T; j0 += ROW_BLOCK) {
                const int j1 = min_int(j0 + ROW_BLOCK, T), cols = j1 - j0, n = T - j0;
                /* dV[j0:j1] = P[j0:T, j0:j1]^T dO[j0:T] */
                cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, cols, HS, n, 1.0f,
                            p + (size_t)j0 * T + j0, T, dout_bh + (size_t)j0 * C, C, 0.0f,
                            dv + (size_t)j0 * C3, C3);
                /* dK[j0:j1] = scale * dS[j0:T, j0:j1]^T Q[j0:T] */
                cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, cols, HS, n, scale,
                            ds + (size_t)j0 * T + j0, T, q + (size_t)j0 * C3, C3, 0.0f, dk + (size_t)j0 * C3,
                            C3);
            }
        }
}

/* ---- reference versions: full T x T loops, double accumulators ----------- */

/* Whether query i of head h attends to key j: the mask's rule, or causal. */
static int allowed(const struct loom_attention_mask *mask, int h, int i, int j)
{
    return mask ? mask->allowed(mask->ctx, h, i, j) : j <= i;
}

void loom_attention_masked_forward_ref(float *out, float *att, const float *qkv, int B, int T, int C, int NH,
                                       const struct loom_attention_mask *mask)
{
    const int HS = C / NH, C3 = 3 * C;
    const double scale = 1.0 / sqrt((double)HS);
    for (int b = 0; b < B; b++)
        for (int h = 0; h < NH; h++) {
            float *a = att + ((size_t)b * NH + h) * T * T;
            const float *v0 = qkv + (size_t)b * T * C3 + 2 * C + (size_t)h * HS; /* row 0 */
            for (int i = 0; i < T; i++) {
                const float *q = qkv + ((size_t)b * T + i) * C3 + (size_t)h * HS;
                float *arow = a + (size_t)i * T;
                double mx = -INFINITY;
                for (int j = 0; j < T; j++) {
                    arow[j] = 0.0f;
                    if (!allowed(mask, h, i, j)) continue;
                    const float *k = qkv + ((size_t)b * T + j) * C3 + C + (size_t)h * HS;
                    double s = 0.0;
                    for (int d = 0; d < HS; d++) s += (double)q[d] * k[d];
                    arow[j] = (float)(s * scale);
                    if (arow[j] > mx) mx = arow[j];
                }
                double sum = 0.0;
                for (int j = 0; j < T; j++)
                    if (allowed(mask, h, i, j)) sum += exp(arow[j] - mx);
                for (int j = 0; j < T; j++)
                    if (allowed(mask, h, i, j)) arow[j] = (float)(exp(arow[j] - mx) / sum);
                float *o = out + ((size_t)b * T + i) * C + (size_t)h * HS;
                for (int d = 0; d < HS; d++) {
                    double s = 0.0;
                    for (int j = 0; j < T; j++) s += (double)arow[j] * v0[(size_t)j * C3 + d];
                    o[d] = (float)s;
                }
            }
        }
}

void loom_attention_masked_backward_ref(float *dqkv, float *datt, const float *dout, const float *att,
                                        const float *qkv, int B, int T, int C, int NH,
                                        const struct loom_attention_mask *mask)
{
    const int HS = C / NH, C3 = 3 * C;
    const double scale = 1.0 / sqrt((double)HS);
    for (int b = 0; b < B; b++)
        for (int h = 0; h < NH; h++) {
            const float *p = att + ((size_t)b * NH + h) * T * T;
            float *ds = datt + ((size_t)b * NH + h) * T * T;
            const size_t hoff = (size_t)h * HS;
            for (int i = 0; i < T; i++) {
                const float *d_o = dout + ((size_t)b * T + i) * C + hoff;
                /* dP[i][j] = dO[i] . V[j], then dS = P * (dP - sum_j P dP) */
                double dot = 0.0;
                for (int j = 0; j < T; j++) {
                    const float *v = qkv + ((size_t)b * T + j) * C3 + 2 * C + hoff;
                    double s = 0.0;
                    for (int d = 0; d < HS; d++) s += (double)d_o[d] * v[d];
                    ds[(size_t)i * T + j] = (float)s;
                    dot += (double)p[(size_t)i * T + j] * s;
                }
                for (int j = 0; j < T; j++) {
                    const size_t ij = (size_t)i * T + j;
                    ds[ij] = allowed(mask, h, i, j) ? (float)(p[ij] * (ds[ij] - dot)) : 0.0f;
                }
            }
            /* row 0 of this (b, h)'s q, k and dO; rows are C3 (dO: C) apart */
            const float *q0 = qkv + (size_t)b * T * C3 + hoff, *k0 = q0 + C;
            const float *do0 = dout + (size_t)b * T * C + hoff;
            for (int r = 0; r < T; r++) {
                const size_t row = ((size_t)b * T + r) * C3 + hoff;
                for (int d = 0; d < HS; d++) {
                    double sq = 0.0, sk = 0.0, sv = 0.0;
                    for (int j = 0; j < T; j++) { /* dQ[r] = scale * sum_j dS[r][j] K[j] */
                        sq += (double)ds[(size_t)r * T + j] * k0[(size_t)j * C3 + d];
                        /* dK[r], dV[r]: sums over the queries j that attend to key r */
                        sk += (double)ds[(size_t)j * T + r] * q0[(size_t)j * C3 + d];
                        sv += (double)p[(size_t)j * T + r] * do0[(size_t)j * C + d];
                    }
                    dqkv[row + d] = (float)(scale * sq);
                    dqkv[row + C + d] = (float)(scale * sk);
                    dqkv[row + 2 * C + d] = (float)sv;
                }
            }
        }
}

void loom_attention_forward_ref(float *out, float *att, const float *qkv, int B, int T, int C, int NH)
{
    loom_attention_masked_forward_ref(out, att, qkv, B, T, C, NH, NULL);
}

void loom_attention_backward_ref(float *dqkv, float *datt, const float *dout, const float *att,
                                 const float *qkv, int B, int T, int C, int NH)
{
    loom_attention_masked_backward_ref(dqkv, datt, dout, att, qkv, B, T, C, NH, NULL);
}
