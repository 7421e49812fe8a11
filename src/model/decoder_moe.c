/*
 * A mixture of experts' MLP (Megatron's MoELayer; Mixtral's sparse MoE
 * block) in a decoder layer (decoder.h: the spec's experts): on the
 * normed rows x (N, C),
 *
 *   router     logits = x W_r (N, E), no bias; each row's top k experts and
 *              routing weights (the table's moe_router_*: the softmax of
 *              the top k, or the top k of the softmax);
 *   dispatch   each row copied once per choice into its expert's block of
 *              rows (expert-major, rows in token order within an expert: the
 *              order Megatron's permute and Mixtral's index_select give);
 *   experts    expert e's MLP (the family's kind: gated or dense) on its
 *              block, through the parallel linear layer (layers/linear.h);
 *   combine    out_n = sum_j probs_nj y_(n,j), then plus the shared
 *              experts' MLP of x when the spec has them.
 *
 * The balancing losses (Megatron's, per MoE layer and micro-batch of N
 * rows): the Switch loss aux = coeff E / (N^2 k) sum_e P_e f_e, P_e the
 * softmax's sum over the rows and f_e the rows routed to e; the z-loss
 * z = coeff mean_n lse_n^2. As Megatron's MoEAuxLossAutoScaler does, they
 * add their gradients in the backward, with the micro-batch's loss weight,
 * and do not add to the language-model loss itself.
 *
 * The routing is data-dependent: the experts' row counts come to the host
 * (they size the products), and the rows' places go back. Each forward
 * keeps the router's logits, the choices, the places, the counts, the
 * experts' products and outputs; the backward regathers the dispatched
 * rows (cheap) rather than keeping them.
 */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "base/log.h"
#include "kernels/backend.h"
#include "kernels/kernels.h" /* LOOM_MOE_MAX_EXPERTS */
#include "model/decoder_impl.h"
#include "model/family.h" /* LOOM_MOE_STATS */

static struct loom_linear lin(struct loom_block *b, int w, int bias, int in, int out)
{
    return (struct loom_linear){.b = b, .w = w, .bias = bias, .in = in, .out = out};
}

/* Expert e's input products (gate and up, or up alone) and its down. */
static struct loom_linear_group expert_in(const struct loom_decoder *m, struct loom_block *b, int e, int F)
{
    const struct loom_decoder_slots *t = &m->t;
    const int C = m->spec.hidden, o = e * t->expert_stride;
    struct loom_linear_group g = {.n = 0, .fused = 0};
    if (t->e_gate_w >= 0)
        g.lin[g.n++] = lin(b, t->e_gate_w + o, t->e_gate_b < 0 ? -1 : t->e_gate_b + o, C, F);
    g.lin[g.n++] = lin(b, t->e_up_w + o, t->e_up_b < 0 ? -1 : t->e_up_b + o, C, F);
    return g;
}
static struct loom_linear expert_down(const struct loom_decoder *m, struct loom_block *b, int e, int F)
{
    const struct loom_decoder_slots *t = &m->t;
    const int o = e * t->expert_stride;
    return lin(b, t->e_down_w + o, t->e_down_b < 0 ? -1 : t->e_down_b + o, F, m->spec.hidden);
}
static struct loom_linear_group shared_in(const struct loom_decoder *m, struct loom_block *b)
{
    const struct loom_decoder_slots *t = &m->t;
    const int C = m->spec.hidden, F = m->spec.shared_ffn;
    struct loom_linear_group g = {.n = 0, .fused = 0};
    if (t->s_gate_w >= 0) g.lin[g.n++] = lin(b, t->s_gate_w, t->s_gate_b, C, F);
    g.lin[g.n++] = lin(b, t->s_up_w, t->s_up_b, C, F);
    return g;
}

int loom_decoder_moe_capacity(const struct loom_decoder_spec *s, int N)
{
    if (!(s->capacity_factor > 0)) return 0;
    const double cap = ceil((double)N * s->topk / s->experts * s->capacity_factor);
    return cap < 1 ? 1 : (int)cap;
}

/* --moe-token-drop-policy probs: choices by routing weight, largest first,
 * then in token order (qsort's comparison, over the weights of the choice
 * indices being sorted). */
static const float *sort_probs;
static int by_weight(const void *a, const void *b)
{
    const int32_t i = *(const int32_t *)a, j = *(const int32_t *)b;
    if (sort_probs[i] != sort_probs[j]) return sort_probs[i] > sort_probs[j] ? -1 : 1;
    return (i > j) - (i < j);
}

/* Where each choice's row goes: experts' blocks in expert order, rows in
 * token order within one. Under a capacity an expert keeps at most that
 * many of its choices (the policy's), the others are dropped (place -1),
 * and with padding its block is the capacity whatever it keeps. x->routed
 * counts each expert's choices, x->counts its block's rows. */
static void place(struct loom_decoder *m, struct loom_decoder_layer_acts *x, int N)
{
    const int E = m->spec.experts, k = m->spec.topk, Nk = N * k, cap = loom_decoder_moe_capacity(&m->spec, N);
    int32_t *idx = m->moe_idx_host, *pos = m->moe_pos_host;
    dev(m)->download(idx, x->ridx, (size_t)Nk * sizeof(int32_t));
    int *cnt = x->counts, *routed = x->routed, off[LOOM_MOE_MAX_EXPERTS + 1];
    memset(routed, 0, sizeof *routed * (size_t)E);
    for (int i = 0; i < Nk; i++) routed[idx[i]]++;
    if (!cap) {
        memcpy(cnt, routed, sizeof *cnt * (size_t)E);
        for (int e = 0, o = 0; e < E; o += cnt[e++]) off[e] = o;
        for (int i = 0; i < Nk; i++) pos[i] = off[idx[i]]++;
    } else {
        /* the choices in expert-major token order (pos as scratch), each expert's segment cut to cap */
        int32_t *order = pos, *keep = m->moe_keep_host;
        for (int e = 0, o = 0; e <= E; o += e < E ? routed[e] : 0, e++) off[e] = o;
        for (int i = 0; i < Nk; i++) order[off[idx[i]]++] = i;
        for (int e = 0, o = 0; e < E; o += routed[e++]) off[e] = o;
        if (m->spec.drop_policy == LOOM_MOE_DROP_PROBS) {
            dev(m)->download(m->moe_probs_host, x->rprobs, (size_t)Nk * sizeof(float));
            sort_probs = m->moe_probs_host;
            for (int e = 0; e < E; e++)
                if (routed[e] > cap) qsort(order + off[e], (size_t)routed[e], sizeof *order, by_weight);
        }
        memset(keep, 0, sizeof *keep * (size_t)Nk);
        for (int e = 0; e < E; e++)
            for (int r = 0; r < routed[e] && r < cap; r++) keep[order[off[e] + r]] = 1;
        for (int e = 0; e < E; e++) {
            cnt[e] = m->spec.pad_to_capacity ? cap : routed[e] < cap ? routed[e] : cap;
            if (!m->moe_recomputing) m->moe_dropped += routed[e] > cap ? routed[e] - cap : 0;
        }
        for (int e = 0, o = 0; e < E; o += cnt[e++]) off[e] = o;
        for (int i = 0; i < Nk; i++) pos[i] = keep[i] ? off[idx[i]]++ : -1; /* token order within an expert */
    }
    dev(m)->upload(x->rpos, pos, (size_t)Nk * sizeof(int32_t));
}

/* The rows the experts' blocks hold. */
static int rows_of(const struct loom_decoder *m, const struct loom_decoder_layer_acts *x)
{
    int R = 0;
    for (int e = 0; e < m->spec.experts; e++) R += x->counts[e];
    return R;
}

/* The shared experts' or expert e's MLP activation on n values, and its backward. */
static void act_backward(const struct loom_decoder *m, float *dgate, float *dup, const float *dh,
                         const float *gate, const float *up, size_t n)
{
    if (m->spec.mlp == LOOM_MLP_GATED && m->spec.activation == LOOM_MLP_SILU)
        m->k->swiglu_backward(dgate, dup, dh, gate, up, n);
    else if (m->spec.mlp == LOOM_MLP_GATED)
        m->k->geglu_backward(dgate, dup, dh, gate, up, n);
    else if (m->spec.activation == LOOM_MLP_GELU)
        m->k->gelu_exact_backward(dgate, dh, gate, n);
    else
        m->k->gelu_backward(dgate, dh, gate, n);
}

/* With 16-bit activations, what a kernel wrote is rounded to their dtype,
 * as the dense layers' kept activations and gradients are (decoder.c). */
static void round_act(const struct loom_decoder *m, float *buf, size_t n)
{
    if (lp(m)) m->k->round_to(buf, n, m->act_dtype);
}

/* An MLP (group g, then down) on n rows of in: fc (and up), h, and down's
 * output into y. */
static void mlp_forward(struct loom_decoder *m, const struct loom_linear_group *g,
                        const struct loom_linear *down, const float *in, float *fc, float *up, float *h,
                        float *y, int n)
{
    float *const outs[2] = {fc, up};
    const size_t nF = (size_t)n * g->lin[0].out;
    loom_linear_column_forward(&m->lc, g, outs, in, NULL, n);
    round_act(m, fc, nF);
    if (up) round_act(m, up, nF);
    loom_decoder_mlp_act_forward(m, h, fc, up, nF);
    round_act(m, h, nF);
    float *got = loom_linear_row_forward(&m->lc, down, h, NULL, y, n);
    LOOM_ASSERT(got == y); /* one rank: the product stays where it was written */
    round_act(m, y, (size_t)n * down->out);
}

/* Its backward from dy (n, C): the weights' gradients accumulate, the
 * input's gradient is written into dinp (n, C). dF: three (n, F) scratch. */
static void mlp_backward(struct loom_decoder *m, const struct loom_linear_group *g,
                         const struct loom_linear *down, const float *in, const float *fc, const float *up,
                         const float *h, const float *dy, float *dinp, float *const *dF, int n)
{
    const size_t nF = (size_t)n * g->lin[0].out;
    loom_linear_row_backward(&m->lc, down, dF[0], dy, h, NULL, n);
    round_act(m, dF[0], nF);
    act_backward(m, dF[1], dF[2], dF[0], fc, up, nF);
    round_act(m, dF[1], nF);
    if (up) round_act(m, dF[2], nF);
    float *const dys[2] = {dF[1], dF[2]};
    float *got = loom_linear_column_backward(&m->lc, g, dys, in, NULL, dinp, n);
    LOOM_ASSERT(got == dinp);
    round_act(m, dinp, (size_t)n * down->out);
}

void loom_decoder_moe_forward(struct loom_decoder *m, struct loom_decoder_layer_acts *x, struct loom_block *b,
                              const float *ln2, float *out, int N, int l, double *hf)
{
    const int E = m->spec.experts, k = m->spec.topk, C = m->spec.hidden, F = m->spec.moe_ffn;
    const struct loom_linear_group router = {.lin = {lin(b, m->t.router_w, -1, C, E)}, .n = 1};
    float *const logits[1] = {x->rlogits};
    loom_linear_column_forward(&m->lc, &router, logits, ln2, NULL, N);
    m->k->moe_router_forward(x->rprobs, x->ridx, x->rlse, m->moe_sums, x->rlogits, N, E, k,
                             m->spec.pre_softmax);
    place(m, x, N);
    if (m->spec.pad_to_capacity) dev(m)->memset(m->moe_xp, 0, (size_t)rows_of(m, x) * C * sizeof(float));
    m->k->moe_permute_forward(m->moe_xp, ln2, x->rpos, N, k, C);
    for (int e = 0, o = 0; e < E; o += x->counts[e++]) {
        if (!x->counts[e]) continue;
        const struct loom_linear_group g = expert_in(m, b, e, F);
        const struct loom_linear down = expert_down(m, b, e, F);
        mlp_forward(m, &g, &down, m->moe_xp + (size_t)o * C, (float *)x->fc + (size_t)o * F,
                    x->up ? (float *)x->up + (size_t)o * F : NULL, (float *)x->h + (size_t)o * F,
                    x->ey + (size_t)o * C, x->counts[e]);
    }
    m->k->moe_unpermute_forward(out, x->ey, x->rprobs, x->rpos, N, k, C);
    round_act(m, out, (size_t)N * C);
    if (m->spec.shared_ffn) {
        const struct loom_linear_group g = shared_in(m, b);
        const struct loom_linear down = lin(b, m->t.s_down_w, m->t.s_down_b, m->spec.shared_ffn, C);
        mlp_forward(m, &g, &down, ln2, x->sfc, x->sup, x->sh, m->moe_out, N);
        m->k->residual_forward(out, out, m->moe_out, (size_t)N * C);
        round_act(m, out, (size_t)N * C);
    }
    /* the balancing losses' values and the experts' choices, for the step's summary */
    if (m->moe_recomputing) return;
    for (int e = 0; hf && e < E; e++) hf[e] += x->routed[e];
    if (hf) hf[E] += N;
    float *sums = m->moe_sums_host, *lse = m->moe_lse_host;
    dev(m)->download(sums, m->moe_sums, (size_t)E * sizeof(float));
    dev(m)->download(lse, x->rlse, (size_t)N * sizeof(float));
    double aux = 0, z = 0;
    for (int e = 0; e < E; e++) aux += (double)sums[e] * x->routed[e];
    for (int n = 0; n < N; n++) z += (double)lse[n] * lse[n];
    m->moe_aux_sum += aux * E / ((double)N * N * k);
    m->moe_z_sum += z / N;
    m->moe_layers_seen++;
    m->moe_choices += (double)N * k;
    double *tokens = m->moe_tokens + (size_t)(l / m->spec.moe_freq) * E;
    for (int e = 0; e < E; e++) tokens[e] += x->routed[e];
}

int loom_decoder_moe_take(struct loom_decoder *m, double *out)
{
    if (!m->spec.experts) return 0;
    const int E = m->spec.experts, nmoe = (m->spec.num_layers + m->spec.moe_freq - 1) / m->spec.moe_freq,
              n = LOOM_MOE_STATS + nmoe * E;
    if (!out) return n;
    out[0] = m->moe_aux_sum, out[1] = m->moe_z_sum, out[2] = m->moe_layers_seen, out[3] = m->moe_dropped;
    out[4] = m->moe_choices;
    for (int i = 0; i < nmoe * E; i++) out[LOOM_MOE_STATS + i] = m->moe_tokens ? m->moe_tokens[i] : 0;
    m->moe_aux_sum = m->moe_z_sum = m->moe_choices = 0;
    m->moe_layers_seen = m->moe_dropped = 0;
    if (m->moe_tokens) memset(m->moe_tokens, 0, sizeof(double) * (size_t)nmoe * E);
    return n;
}

void loom_decoder_moe_backward(struct loom_decoder *m, struct loom_decoder_layer_acts *x,
                               struct loom_block *b, const float *ln2, const float *dout, float *dln, int N)
{
    const int E = m->spec.experts, k = m->spec.topk, C = m->spec.hidden, F = m->spec.moe_ffn;
    const size_t NC = (size_t)N * C;
    /* combine: the experts' outputs' and the routing weights' gradients (padding rows': none) */
    if (m->spec.pad_to_capacity) {
        const size_t bytes = (size_t)rows_of(m, x) * C * sizeof(float);
        dev(m)->memset(m->moe_dy, 0, bytes);
        dev(m)->memset(m->moe_xp, 0, bytes);
    }
    m->k->moe_unpermute_backward(m->moe_dy, m->moe_dprobs, dout, x->ey, x->rprobs, x->rpos, N, k, C);
    round_act(m, m->moe_dy, (size_t)rows_of(m, x) * C);
    m->k->moe_permute_forward(m->moe_xp, ln2, x->rpos, N, k, C);
    for (int e = 0, o = 0; e < E; o += x->counts[e++]) {
        if (!x->counts[e]) continue;
        const struct loom_linear_group g = expert_in(m, b, e, F);
        const struct loom_linear down = expert_down(m, b, e, F);
        const size_t oF = (size_t)o * F;
        mlp_backward(m, &g, &down, m->moe_xp + (size_t)o * C, (float *)x->fc + oF,
                     x->up ? (float *)x->up + oF : NULL, (float *)x->h + oF, m->moe_dy + (size_t)o * C,
                     m->moe_dxp + (size_t)o * C, m->moe_dF, x->counts[e]);
    }
    m->k->moe_permute_backward(dln, m->moe_dxp, x->rpos, N, k, C);
    /* the router: the routing weights', the balancing loss's and the z-loss's gradients */
    const double w = m->moe_loss_weight;
    float *aux = m->moe_sums_host;
    const int with_aux = m->spec.aux_coeff > 0;
    if (with_aux) {
        /* the gradient at any row's softmax of e: Megatron's layer loss E f_e / (N^2 k); Hugging Face's,
         * E sum_e (F_e / M) (P_e / M) over the M rows of all MoE layers (F_e their choices of e, P_e
         * their softmax's sum), E F_e / M^2 */
        const int hf = m->spec.balance == LOOM_MOE_HF_AUX_LOSS;
        const double *tot = m->slots[m->bwd_slot].moe_hf;
        for (int e = 0; e < E; e++)
            aux[e] = (float)(w * m->spec.aux_coeff * E *
                             (hf ? tot[e] / (tot[E] * tot[E]) : x->routed[e] / ((double)N * N * k)));
        dev(m)->upload(m->moe_aux_grad, aux, (size_t)E * sizeof(float));
    }
    const float zg = (float)(2.0 * w * m->spec.z_coeff / N);
    m->k->moe_router_backward(m->moe_dlogits, m->moe_dprobs, x->rprobs, x->ridx, x->rlse, x->rlogits,
                              with_aux ? m->moe_aux_grad : NULL, zg, N, E, k, m->spec.pre_softmax);
    const struct loom_linear_group router = {.lin = {lin(b, m->t.router_w, -1, C, E)}, .n = 1};
    float *const dl[1] = {m->moe_dlogits};
    float *got = loom_linear_column_backward(&m->lc, &router, dl, ln2, NULL, m->moe_out, N);
    LOOM_ASSERT(got == m->moe_out);
    m->k->residual_forward(dln, dln, m->moe_out, NC);
    if (m->spec.shared_ffn) {
        const struct loom_linear_group g = shared_in(m, b);
        const struct loom_linear down = lin(b, m->t.s_down_w, m->t.s_down_b, m->spec.shared_ffn, C);
        mlp_backward(m, &g, &down, ln2, x->sfc, x->sup, x->sh, dout, m->moe_out, m->moe_dF, N);
        m->k->residual_forward(dln, dln, m->moe_out, NC);
    }
}
