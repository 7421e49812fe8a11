/*
 * Block-sparse causal multi-head self-attention on the fused qkv
 * activation, forward and backward, for a layout of kernels/sparse_layout.h;
 * plus plain-loop `_ref` versions on a dense (B,NH,T,T) att with the same
 * token-level mask.
 *
 * Work is per (batch, head), in parallel over the B*NH pairs, and inside
 * per row block r of `block` queries. Its listed key blocks are taken in
 * runs of consecutive blocks, each run one cblas_sgemm on strided views of
 * qkv (row stride 3C), single-threaded inside the parallel region, so a
 * sliding window is one product per row block. The scores of row block r
 * sit in a panel (block, n_r * block), row-major: column p * block + t is
 * key t of the row's p-th listed block. `att` is those panels, row block
 * after row block, head after head (the heads from h0 on), batch after
 * batch: B * (blocks of the heads) * block * block floats
 * (loom_sparse_att_numel). Softmax subtracts the row max over the allowed
 * keys; the others are stored as exact zeros.
 *
 * Backward, with S = scale * Q K^T, P = softmax(S), O = P V, on each panel:
 *   dP = dO V^T;  dS = P * (dP - rowsum(P * dP));
 *   dQ = scale * dS K;  dK += scale * dS^T Q;  dV += P^T dO,
 * dK and dV zeroed first for the head, so dqkv is written as a whole, as
 * the dense kernel writes it. dS overwrites dP in `datt`, the same shape
 * as att.
 *
 * A layout that allows every causal pair (dense mode, a window >= T: the
 * layout's `dense`) runs loom_attention_forward/backward themselves on
 * their dense (B,NH,T,T) att, so the results are theirs bit for bit.
 *
 * Deliberately not: dropout, a flash-style kernel that never stores the
 * probabilities, or blocks that differ between sequences of a batch.
 */
#include "kernels/kernels.h"

#include <cblas.h>
#include <math.h>

#include "base/log.h"
#include "kernels/cpu/vexp.h"
#include "kernels/sparse_layout.h"

/* Below this many multiply-adds per product one thread does it all. */
#define PAR_MIN ((size_t)1 << 18)

static int layout_head(const struct loom_sparse_layout *l, int hg)
{
    return l->heads == 1 ? 0 : hg;
}

/* Blocks of heads [h0, h1) (global numbers). */
static size_t blocks_between(const struct loom_sparse_layout *l, int h0, int h1)
{
    if (l->heads == 1) return (size_t)(h1 - h0) * (size_t)l->head_off[1];
    return (size_t)(l->head_off[h1] - l->head_off[h0]);
}

/* The first float of (b, h)'s panels in att, h local to the NH heads from h0. */
static size_t att_base(const struct loom_sparse_layout *l, int b, int h, int NH, int h0)
{
    const size_t bs2 = (size_t)l->block * l->block;
    return ((size_t)b * blocks_between(l, h0, h0 + NH) + blocks_between(l, h0, h0 + h)) * bs2;
}

static void check_args(const struct loom_sparse_layout *l, int T, int C, int NH, int h0)
{
    LOOM_ASSERT(NH >= 1 && C % NH == 0);
    LOOM_ASSERT(l->T == T && h0 >= 0 && h0 + NH <= l->NH);
}

/* The allowed keys of query i inside the p-th listed block (key block c):
 * [*a, *e) of 0..block, from the token rule's range [lo, hi). */
static void block_span(int c, int block, int lo, int hi, int *a, int *e)
{
    const int j0 = c * block;
    int s = lo - j0, t = hi - j0;
    s = s < 0 ? 0 : s > block ? block : s;
    t = t < s ? s : t > block ? block : t;
    *a = s, *e = t;
}

/* Softmax of one panel row over its allowed keys, the others set to 0. */
static void softmax_panel_row(float *row, const int32_t *cols, int n, int block, int lo, int hi)
{
    float mx = -INFINITY;
    for (int p = 0; p < n; p++) {
        int a, e;
        block_span(cols[p], block, lo, hi, &a, &e);
        const float *x = row + (size_t)p * block;
#pragma omp simd reduction(max : mx)
        for (int j = a; j < e; j++) mx = x[j] > mx ? x[j] : mx;
    }
    float sum = 0.0f;
    for (int p = 0; p < n; p++) {
        int a, e;
        block_span(cols[p], block, lo, hi, &a, &e);
        float *x = row + (size_t)p * block;
        for (int j = 0; j < a; j++) x[j] = 0.0f;
#pragma omp simd reduction(+ : sum)
        for (int j = a; j < e; j++) {
            const float ex = vexpf(x[j] - mx);
            x[j] = ex;
            sum += ex;
        }
        for (int j = e; j < block; j++) x[j] = 0.0f;
    }
    const float inv = 1.0f / sum;
    const int width = n * block;
#pragma omp simd
    for (int j = 0; j < width; j++) row[j] *= inv;
}

/* The length of the run of consecutive key blocks starting at cols[p]. */
static int run_length(const int32_t *cols, int n, int p)
{
    int len = 1;
    while (p + len < n && cols[p + len] == cols[p] + len) len++;
    return len;
}

/* out (B,T,C), att (loom_sparse_att_numel); qkv (B,T,3C). NH heads from
 * global head h0. */
void loom_sparse_attention_forward(float *out, float *att, const float *qkv, int B, int T, int C, int NH,
                                   int h0, const struct loom_sparse_layout *l)
{
    check_args(l, T, C, NH, h0);
    if (l->dense) {
        loom_attention_forward(out, att, qkv, B, T, C, NH);
        return;
    }
    const int HS = C / NH, C3 = 3 * C, bs = l->block, nb = l->nb;
    const float scale = 1.0f / sqrtf((float)HS);
    const size_t work = (size_t)B * blocks_between(l, h0, h0 + NH) * bs * bs * HS;
#pragma omp parallel for collapse(2) schedule(static) if (work >= PAR_MIN)
    for (int b = 0; b < B; b++)
        for (int h = 0; h < NH; h++) {
            const int g = layout_head(l, h0 + h);
            const int64_t *rp = l->row_ptr + (size_t)g * (nb + 1);
            const int32_t *cols = l->col + l->head_off[g];
            const float *q = qkv + (size_t)b * T * C3 + (size_t)h * HS;
            const float *k = q + C, *v = q + 2 * C;
            float *a = att + att_base(l, b, h, NH, h0);
            float *o = out + (size_t)b * T * C + (size_t)h * HS;
            for (int r = 0; r < nb; r++) {
                const int n = (int)(rp[r + 1] - rp[r]), width = n * bs, i0 = r * bs;
                const int32_t *cl = cols + rp[r];
                float *panel = a + (size_t)rp[r] * bs * bs;
                /* S[:, run] = scale * Q[i0:i0+bs] K[run]^T */
                for (int p = 0, len; p < n; p += len) {
                    len = run_length(cl, n, p);
                    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, bs, len * bs, HS, scale,
                                q + (size_t)i0 * C3, C3, k + (size_t)cl[p] * bs * C3, C3, 0.0f,
                                panel + (size_t)p * bs, width);
                }
                for (int i = 0; i < bs; i++) {
                    int lo, hi;
                    loom_sparse_token_range(l, i0 + i, &lo, &hi);
                    softmax_panel_row(panel + (size_t)i * width, cl, n, bs, lo, hi);
                }
                /* O[i0:i0+bs] = sum over runs of P[:, run] V[run] */
                for (int p = 0, len; p < n; p += len) {
                    len = run_length(cl, n, p);
                    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, bs, HS, len * bs, 1.0f,
                                panel + (size_t)p * bs, width, v + (size_t)cl[p] * bs * C3, C3,
                                p ? 1.0f : 0.0f, o + (size_t)i0 * C, C);
                }
            }
        }
}

/* dqkv (B,T,3C) written, datt (as att) scratch; dout (B,T,C), att, qkv
 * (B,T,3C). */
void loom_sparse_attention_backward(float *dqkv, float *datt, const float *dout, const float *att,
                                    const float *qkv, int B, int T, int C, int NH, int h0,
                                    const struct loom_sparse_layout *l)
{
    check_args(l, T, C, NH, h0);
    if (l->dense) {
        loom_attention_backward(dqkv, datt, dout, att, qkv, B, T, C, NH);
        return;
    }
    const int HS = C / NH, C3 = 3 * C, bs = l->block, nb = l->nb;
    const float scale = 1.0f / sqrtf((float)HS);
    const size_t work = (size_t)B * blocks_between(l, h0, h0 + NH) * bs * bs * HS;
#pragma omp parallel for collapse(2) schedule(static) if (work >= PAR_MIN)
    for (int b = 0; b < B; b++)
        for (int h = 0; h < NH; h++) {
            const int g = layout_head(l, h0 + h);
            const int64_t *rp = l->row_ptr + (size_t)g * (nb + 1);
            const int32_t *cols = l->col + l->head_off[g];
            const size_t qoff = (size_t)b * T * C3 + (size_t)h * HS;
            const float *q = qkv + qoff, *k = q + C, *v = q + 2 * C;
            float *dq = dqkv + qoff, *dk = dq + C, *dv = dq + 2 * C;
            const size_t base = att_base(l, b, h, NH, h0);
            const float *dout_bh = dout + (size_t)b * T * C + (size_t)h * HS;
            for (int t = 0; t < T; t++)
                for (int d = 0; d < HS; d++) dk[(size_t)t * C3 + d] = dv[(size_t)t * C3 + d] = 0.0f;
            for (int r = 0; r < nb; r++) {
                const int n = (int)(rp[r + 1] - rp[r]), width = n * bs, i0 = r * bs;
                const int32_t *cl = cols + rp[r];
                const float *pp = att + base + (size_t)rp[r] * bs * bs;
                float *ds = datt + base + (size_t)rp[r] * bs * bs;
                const float *dor = dout_bh + (size_t)i0 * C, *qr = q + (size_t)i0 * C3;
                /* dP[:, run] = dO[i0:i0+bs] V[run]^T */
                for (int p = 0, len; p < n; p += len) {
                    len = run_length(cl, n, p);
                    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, bs, len * bs, HS, 1.0f, dor, C,
                                v + (size_t)cl[p] * bs * C3, C3, 0.0f, ds + (size_t)p * bs, width);
                }
                /* dS = P * (dP - rowsum(P * dP)); masked keys have P = 0 */
                for (int i = 0; i < bs; i++) {
                    const float *pr = pp + (size_t)i * width;
                    float *dr = ds + (size_t)i * width;
                    float dot = 0.0f;
#pragma omp simd reduction(+ : dot)
                    for (int j = 0; j < width; j++) dot += pr[j] * dr[j];
#pragma omp simd
                    for (int j = 0; j < width; j++) dr[j] = pr[j] * (dr[j] - dot);
                }
                for (int p = 0, len; p < n; p += len) {
                    len = run_length(cl, n, p);
                    const size_t kv = (size_t)cl[p] * bs * C3;
                    /* dQ[i0:i0+bs] = scale * sum over runs of dS[:, run] K[run] */
                    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, bs, HS, len * bs, scale,
                                ds + (size_t)p * bs, width, k + kv, C3, p ? 1.0f : 0.0f, dq + (size_t)i0 * C3,
                                C3);
                    /* dK[run] += scale * dS[:, run]^T Q[i0:i0+bs] */
                    cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, len * bs, HS, bs, scale,
                                ds + (size_t)p * bs, width, qr, C3, 1.0f, dk + kv, C3);
                    /* dV[run] += P[:, run]^T dO[i0:i0+bs] */
                    cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, len * bs, HS, bs, 1.0f,
                                pp + (size_t)p * bs, width, dor, C, 1.0f, dv + kv, C3);
                }
            }
        }
}

/* ---- reference versions: full T x T loops over the allowed pairs, double
 * accumulators; att and datt (B,NH,T,T) dense, zero where not allowed ------ */

/* The layout's rule for a head numbered from h0 (attention.c's masked references). */
struct sparse_mask {
    const struct loom_sparse_layout *l;
    int h0;
};

static int sparse_allowed(const void *ctx, int h, int i, int j)
{
    const struct sparse_mask *m = ctx;
    return loom_sparse_allowed(m->l, m->h0 + h, i, j);
}

void loom_sparse_attention_forward_ref(float *out, float *att, const float *qkv, int B, int T, int C, int NH,
                                       int h0, const struct loom_sparse_layout *l)
{
    check_args(l, T, C, NH, h0);
    const struct sparse_mask m = {l, h0};
    loom_attention_masked_forward_ref(out, att, qkv, B, T, C, NH,
                                      &(struct loom_attention_mask){sparse_allowed, &m});
}

void loom_sparse_attention_backward_ref(float *dqkv, float *datt, const float *dout, const float *att,
                                        const float *qkv, int B, int T, int C, int NH, int h0,
                                        const struct loom_sparse_layout *l)
{
    check_args(l, T, C, NH, h0);
    const struct sparse_mask m = {l, h0};
    loom_attention_masked_backward_ref(dqkv, datt, dout, att, qkv, B, T, C, NH,
                                       &(struct loom_attention_mask){sparse_allowed, &m});
}
