/*
 * The fused attention kernels' references: every (query, key) pair in
 * plain loops, sums in double, the softmax of each row from its own scores
 * (not the forward's lse), to hold flash_attention.c and its bf16 variant
 * against. Memory O(T) (one row of scores at a time); time O(B NH T^2 hs).
 * Deliberately not: fast, or tiled.
 */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "base/log.h"
#include "kernels/cpu/flash_tile.h"

/* Whether query t of head h (sequence b) sees key j (positions). */
static int sees(const struct loom_flash_attn *a, int b, int h, int t, int j)
{
    if (j > t || j < fa_key_lo(a, b, t) || j >= fa_kend(a)) return 0;
    return !a->layout || loom_sparse_allowed(a->layout, a->h0 + h, t, j);
}

/* p[lo..hi] times attention dropout's mask of the row (kernels/dropout_mask.h), element by element */
static void drop_row(double *p, const struct loom_flash_attn *a, int b, int h, int t, int lo, int hi)
{
    if (!a->drop) return;
    for (int j = lo; j <= hi; j++) {
        float m;
        fa_drop_row(&m, a, b, h, t, j, 1);
        p[j] *= m;
    }
}

/* Row t (a position) of head h of sequence b: p (T) the probabilities of
 * the keys it sees (double), 0 for the others in [lo, hi]; returns lo,
 * *hi the last key it may see, *lse_out the row's log-sum-exp (-inf, and
 * every p 0, when it sees none). */
static int row_probs(double *p, int *hi, double *lse_out, const float *q, const float *k,
                     const struct loom_flash_attn *a, double scale, int b, int h, int t)
{
    const int hs = a->hs, g = h / (a->NH / a->G), lo = fa_key_lo(a, b, t);
    const float *qr = q + ((size_t)b * fa_tq(a) + t - a->q0) * a->ld_q + (size_t)h * hs;
    *hi = fa_min(t, fa_kend(a) - 1);
    double mx = -INFINITY;
    for (int j = lo; j <= *hi; j++) {
        p[j] = -INFINITY;
        if (!sees(a, b, h, t, j)) continue;
        const float *kr = k + ((size_t)b * fa_tk(a) + j - a->k0) * a->ld_k + (size_t)g * hs;
        double s = 0.0;
        for (int d = 0; d < hs; d++) s += (double)qr[d] * kr[d];
        p[j] = s * scale;
        if (p[j] > mx) mx = p[j];
    }
    if (mx == -INFINITY) { /* no key of the part */
        for (int j = lo; j <= *hi; j++) p[j] = 0.0;
        *lse_out = -INFINITY;
        return lo;
    }
    double sum = 0.0;
    for (int j = lo; j <= *hi; j++) sum += exp(p[j] - mx); /* exp(-inf) = 0 for the keys it does not see */
    for (int j = lo; j <= *hi; j++) p[j] = exp(p[j] - mx) / sum;
    *lse_out = mx + log(sum);
    return lo;
}

void loom_flash_attention_forward_ref(float *out, float *lse, const float *q, const float *k, const float *v,
                                      const struct loom_flash_attn *a)
{
    const double scale = loom_flash_attn_check(a);
    const int T = a->T, Tq = fa_tq(a), Tk = fa_tk(a), hs = a->hs;
    double *p = malloc((size_t)T * sizeof(double));
    LOOM_ASSERT(p);
    for (int b = 0; b < a->B; b++)
        for (int h = 0; h < a->NH; h++) {
            const int g = h / (a->NH / a->G);
            for (int r = 0; r < Tq; r++) {
                const int t = a->q0 + r;
                double l;
                int hi;
                const int lo = row_probs(p, &hi, &l, q, k, a, scale, b, h, t);
                lse[((size_t)b * a->NH + h) * fa_ld_lse(a) + r] = (float)l;
                drop_row(p, a, b, h, t, lo, hi);
                float *o = out + ((size_t)b * Tq + r) * a->NH * hs + (size_t)h * hs;
                for (int d = 0; d < hs; d++) {
                    double s = 0.0;
                    for (int j = lo; j <= hi; j++)
                        s += p[j] * v[((size_t)b * Tk + j - a->k0) * a->ld_v + (size_t)g * hs + d];
                    o[d] = (float)s;
                }
            }
        }
    free(p);
}

void loom_flash_attention_backward_ref(float *dq, float *dk, float *dv, const float *dout, const float *out,
                                       const float *lse, const float *q, const float *k, const float *v,
                                       const struct loom_flash_attn *a)
{
    /* a part's probabilities are its keys' share of the whole row's: the
     * forward's lse (the whole row's) scales them; the whole sequence's own
     * (no part) are recomputed in double */
    const int part = fa_tq(a) != a->T || fa_tk(a) != a->T;
    const double scale = loom_flash_attn_check(a);
    const int B = a->B, T = a->T, Tq = fa_tq(a), Tk = fa_tk(a), hs = a->hs, G = a->G;
    double *p = malloc((size_t)T * sizeof(double)), *dp = malloc((size_t)T * sizeof(double)),
           *pd = malloc((size_t)T * sizeof(double));
    double *dkv = calloc((size_t)2 * B * Tk * G * hs, sizeof(double)),
           *dqr = malloc((size_t)hs * sizeof(double));
    LOOM_ASSERT(p && dp && pd && dkv && dqr);
    double *dka = dkv, *dva = dkv + (size_t)B * Tk * G * hs; /* (B,Tk,G,hs) */
    for (int b = 0; b < B; b++)
        for (int h = 0; h < a->NH; h++) {
            const int g = h / (a->NH / G);
            for (int r = 0; r < Tq; r++) {
                const int t = a->q0 + r;
                double l;
                int hi;
                const int lo = row_probs(p, &hi, &l, q, k, a, scale, b, h, t);
                const float *d_o = dout + ((size_t)b * Tq + r) * a->NH * hs + (size_t)h * hs;
                const float *qr = q + ((size_t)b * Tq + r) * a->ld_q + (size_t)h * hs;
                const float *o = out + ((size_t)b * Tq + r) * a->NH * hs + (size_t)h * hs;
                if (part) { /* rescaled to the whole row's softmax; D from the whole row's output */
                    const double w = exp(l - (double)lse[((size_t)b * a->NH + h) * fa_ld_lse(a) + r]);
                    for (int j = lo; j <= hi; j++) p[j] *= l == -INFINITY ? 0.0 : w;
                }
                double D = 0.0;
                if (part)
                    for (int d = 0; d < hs; d++) D += (double)d_o[d] * o[d];
                for (int j = lo; j <= hi; j++) pd[j] = p[j];
                drop_row(pd, a, b, h, t, lo, hi); /* the dropped probabilities, what the output took */
                for (int j = lo; j <= hi; j++) {
                    const float *vr = v + ((size_t)b * Tk + j - a->k0) * a->ld_v + (size_t)g * hs;
                    double s = 0.0;
                    for (int d = 0; d < hs; d++) s += (double)d_o[d] * vr[d];
                    dp[j] = p[j] != 0.0 ? s * (pd[j] / p[j]) : 0.0; /* through the mask */
                    if (!part) D += pd[j] * s;
                }
                memset(dqr, 0, (size_t)hs * sizeof(double));
                for (int j = lo; j <= hi; j++) {
                    const double ds = p[j] * (dp[j] - D) * scale;
                    const float *kr = k + ((size_t)b * Tk + j - a->k0) * a->ld_k + (size_t)g * hs;
                    double *dkr = dka + (((size_t)b * Tk + j - a->k0) * G + g) * hs;
                    double *dvr = dva + (((size_t)b * Tk + j - a->k0) * G + g) * hs;
                    for (int d = 0; d < hs; d++) {
                        dqr[d] += ds * kr[d];
                        dkr[d] += ds * qr[d];
                        dvr[d] += pd[j] * d_o[d];
                    }
                }
                float *dqo = dq + ((size_t)b * Tq + r) * a->ld_q + (size_t)h * hs;
                for (int d = 0; d < hs; d++) dqo[d] = (float)dqr[d];
            }
        }
    for (int b = 0; b < B; b++)
        for (int t = 0; t < Tk; t++)
            for (int g = 0; g < G; g++)
                for (int d = 0; d < hs; d++) {
                    const size_t i = (((size_t)b * Tk + t) * G + g) * hs + d;
                    dk[((size_t)b * Tk + t) * a->ld_k + (size_t)g * hs + d] = (float)dka[i];
                    dv[((size_t)b * Tk + t) * a->ld_v + (size_t)g * hs + d] = (float)dva[i];
                }
    free(p), free(dp), free(pd), free(dkv), free(dqr);
}
