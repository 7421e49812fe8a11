/*
 * A mixture of experts' kernels (kernels.h): the router (top k of E
 * experts per row, the routing weights, the statistics of the balancing
 * losses) with its backward, and the permutation of rows to the experts'
 * contiguous blocks and back (weighted by the routing weights).
 *
 * The router, per row n of logits l (E):
 *   lse_n = log sum_e exp(l_e),  s_e = exp(l_e - lse_n)  (the softmax);
 *   idx: the k largest logits, largest first (ties: the lower expert);
 *   probs_j = s_idx_j (pre_softmax), else exp(l_idx_j) / sum_i exp(l_idx_i)
 *   (the softmax of the top k: Mixtral's renormalised top k);
 *   score_sum_e = sum_n s_e (the load-balancing loss's P_e, summed in
 *   double in row order).
 * Its backward, with g_e = aux_grad_e (+ dprobs_j at idx_j, pre_softmax):
 *   dl_e = s_e (g_e - sum_i g_i s_i)
 *          + [not pre_softmax] p_j (dp_j - sum_i dp_i p_i) at e = idx_j
 *          + z_grad lse_n s_e  (the z-loss lse_n^2's gradient, halved into z_grad).
 */
#include <math.h>

#include "kernels/kernels.h"

/* Row n's top k, largest first, lower index on ties. */
static void top_k(int32_t *idx, const float *l, int E, int k)
{
    for (int j = 0; j < k; j++) {
        int best = -1;
        for (int e = 0; e < E; e++) {
            int taken = 0;
            for (int i = 0; i < j; i++) taken |= idx[i] == e;
            if (!taken && (best < 0 || l[e] > l[best])) best = e;
        }
        idx[j] = best;
    }
}

static float row_lse(const float *l, int E)
{
    float mx = l[0];
    for (int e = 1; e < E; e++) mx = l[e] > mx ? l[e] : mx;
    float sum = 0.0f;
    for (int e = 0; e < E; e++) sum += expf(l[e] - mx);
    return mx + logf(sum);
}

void loom_moe_router_forward(float *probs, int32_t *idx, float *lse, float *score_sum, const float *logits,
                             int N, int E, int k, int pre_softmax)
{
#pragma omp parallel for if (N >= 256)
    for (int n = 0; n < N; n++) {
        const float *l = logits + (size_t)n * E;
        int32_t *ix = idx + (size_t)n * k;
        float *p = probs + (size_t)n * k;
        lse[n] = row_lse(l, E);
        top_k(ix, l, E, k);
        if (pre_softmax) {
            for (int j = 0; j < k; j++) p[j] = expf(l[ix[j]] - lse[n]);
        } else {
            float sum = 0.0f;
            for (int j = 0; j < k; j++) sum += p[j] = expf(l[ix[j]] - l[ix[0]]); /* ix[0]: the largest */
            for (int j = 0; j < k; j++) p[j] /= sum;
        }
    }
    for (int e = 0; e < E; e++) {
        double sum = 0.0;
        for (int n = 0; n < N; n++) sum += expf(logits[(size_t)n * E + e] - lse[n]);
        score_sum[e] = (float)sum;
    }
}

void loom_moe_router_forward_ref(float *probs, int32_t *idx, float *lse, float *score_sum,
                                 const float *logits, int N, int E, int k, int pre_softmax)
{
    for (int e = 0; e < E; e++) score_sum[e] = 0.0f;
    for (int n = 0; n < N; n++) {
        const float *l = logits + (size_t)n * E;
        double z = 0.0;
        for (int e = 0; e < E; e++) z += exp((double)l[e]);
        lse[n] = (float)log(z);
        /* the top k by sorting indices (insertion, stable: lower index first on ties) */
        int32_t o[LOOM_MOE_MAX_EXPERTS];
        for (int e = 0; e < E; e++) {
            int i = e;
            while (i > 0 && l[o[i - 1]] < l[e]) o[i] = o[i - 1], i--;
            o[i] = e;
        }
        double zk = 0.0;
        for (int j = 0; j < k; j++) zk += exp((double)l[o[j]]);
        for (int j = 0; j < k; j++) {
            idx[(size_t)n * k + j] = o[j];
            probs[(size_t)n * k + j] = (float)(exp((double)l[o[j]]) / (pre_softmax ? z : zk));
        }
        for (int e = 0; e < E; e++) score_sum[e] += (float)(exp((double)l[e]) / z);
    }
}

void loom_moe_router_backward(float *dlogits, const float *dprobs, const float *probs, const int32_t *idx,
                              const float *lse, const float *logits, const float *aux_grad, float z_grad,
                              int N, int E, int k, int pre_softmax)
{
#pragma omp parallel for if (N >= 256)
    for (int n = 0; n < N; n++) {
        const float *l = logits + (size_t)n * E, *p = probs + (size_t)n * k, *dp = dprobs + (size_t)n * k;
        const int32_t *ix = idx + (size_t)n * k;
        float *dl = dlogits + (size_t)n * E;
        /* g over the softmax of all E: the balancing loss's, and pre_softmax's dprobs */
        float gs = 0.0f;
        for (int e = 0; e < E; e++) {
            float g = aux_grad ? aux_grad[e] : 0.0f;
            if (pre_softmax)
                for (int j = 0; j < k; j++) g += ix[j] == e ? dp[j] : 0.0f;
            const float s = expf(l[e] - lse[n]);
            dl[e] = g;
            gs += g * s;
        }
        for (int e = 0; e < E; e++) {
            const float s = expf(l[e] - lse[n]);
            dl[e] = s * (dl[e] - gs) + z_grad * lse[n] * s;
        }
        if (!pre_softmax) {
            float dot = 0.0f;
            for (int j = 0; j < k; j++) dot += dp[j] * p[j];
            for (int j = 0; j < k; j++) dl[ix[j]] += p[j] * (dp[j] - dot);
        }
    }
}

void loom_moe_router_backward_ref(float *dlogits, const float *dprobs, const float *probs, const int32_t *idx,
                                  const float *lse, const float *logits, const float *aux_grad, float z_grad,
                                  int N, int E, int k, int pre_softmax)
{
    (void)probs;
    (void)lse;
    /* the Jacobians in double: d probs_j / d l_e and d s_i / d l_e, from the logits alone */
    for (int n = 0; n < N; n++) {
        const float *l = logits + (size_t)n * E;
        const int32_t *ix = idx + (size_t)n * k;
        double z = 0.0, zk = 0.0;
        for (int e = 0; e < E; e++) z += exp((double)l[e]);
        for (int j = 0; j < k; j++) zk += exp((double)l[ix[j]]);
        const double ln = log(z);
        for (int e = 0; e < E; e++) {
            const double se = exp((double)l[e]) / z;
            double d = 0.0;
            for (int i = 0; i < E; i++) { /* the balancing loss through s_i */
                const double si = exp((double)l[i]) / z;
                d += (aux_grad ? aux_grad[i] : 0.0) * si * ((i == e) - se);
            }
            for (int j = 0; j < k; j++) {
                const int c = ix[j];
                const double pj = exp((double)l[c]) / (pre_softmax ? z : zk);
                double in_k = 0.0; /* d probs_j / d l_e */
                if (pre_softmax) {
                    in_k = pj * ((c == e) - se);
                } else {
                    int sel = 0;
                    for (int i = 0; i < k; i++) sel |= ix[i] == e;
                    if (sel) in_k = pj * ((c == e) - exp((double)l[e]) / zk);
                }
                d += dprobs[(size_t)n * k + j] * in_k;
            }
            d += z_grad * ln * se;
            dlogits[(size_t)n * E + e] = (float)d;
        }
    }
}

void loom_moe_permute_forward(float *xp, const float *x, const int32_t *pos, int N, int k, int C)
{
#pragma omp parallel for if ((size_t)N * C >= 65536)
    for (int n = 0; n < N; n++)
        for (int j = 0; j < k; j++) {
            const int32_t r = pos[(size_t)n * k + j];
            if (r < 0) continue;
            for (int c = 0; c < C; c++) xp[(size_t)r * C + c] = x[(size_t)n * C + c];
        }
}

void loom_moe_permute_backward(float *dx, const float *dxp, const int32_t *pos, int N, int k, int C)
{
#pragma omp parallel for if ((size_t)N * C >= 65536)
    for (int n = 0; n < N; n++) {
        float *d = dx + (size_t)n * C;
        for (int c = 0; c < C; c++) d[c] = 0.0f;
        for (int j = 0; j < k; j++) {
            const int32_t r = pos[(size_t)n * k + j];
            if (r < 0) continue;
            for (int c = 0; c < C; c++) d[c] += dxp[(size_t)r * C + c];
        }
    }
}

void loom_moe_unpermute_forward(float *out, const float *y, const float *probs, const int32_t *pos, int N,
                                int k, int C)
{
#pragma omp parallel for if ((size_t)N * C >= 65536)
    for (int n = 0; n < N; n++) {
        float *o = out + (size_t)n * C;
        for (int c = 0; c < C; c++) o[c] = 0.0f;
        for (int j = 0; j < k; j++) {
            const int32_t r = pos[(size_t)n * k + j];
            if (r < 0) continue;
            const float w = probs[(size_t)n * k + j];
            for (int c = 0; c < C; c++) o[c] += w * y[(size_t)r * C + c];
        }
    }
}

void loom_moe_unpermute_backward(float *dy, float *dprobs, const float *dout, const float *y,
                                 const float *probs, const int32_t *pos, int N, int k, int C)
{
#pragma omp parallel for if ((size_t)N * C >= 65536)
    for (int n = 0; n < N; n++) {
        const float *d = dout + (size_t)n * C;
        for (int j = 0; j < k; j++) {
            const int32_t r = pos[(size_t)n * k + j];
            float dot = 0.0f;
            if (r >= 0) {
                const float w = probs[(size_t)n * k + j];
                for (int c = 0; c < C; c++) {
                    dy[(size_t)r * C + c] = w * d[c];
                    dot += d[c] * y[(size_t)r * C + c];
                }
            }
            dprobs[(size_t)n * k + j] = dot;
        }
    }
}
