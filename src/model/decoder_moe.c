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
 * Under expert parallelism (layers/experts.h) a rank holds experts
 * [ep.first, ep.first + ep.local): its routing, drops and dispatched rows
 * are its own, as above; the all-to-all dispatcher sends each expert's
 * rows to its rank and the outputs back (the layer keeps its experts'
 * input rows, x->xe), the allgather one gathers every rank's rows and
 * choices and reduce-scatters the partial outputs. The local experts' rows
 * are expert-major either way, each expert's from every rank in rank order.
 *
 * Under tensor parallelism the layer is one region (the caller's entry
 * and exit, decoder.c): x is every row, the router is replicated (every
 * tp rank routes alike), each expert's and the shared experts' input
 * products hold a rank's Fe / Fs columns and their down products the same
 * rows, run inside a one-rank region (m->lc_moe), so out is this rank's
 * partial sum; the routing weights' gradients are summed over the tp
 * group and the router's input gradient is added by tp rank 0 alone.
 * Under --layout-invariant the experts are whole on every tp rank instead
 * (spec.experts_whole: parted() is 0, lc_moe.tp_rank 0): each rank computes
 * the layer alike, out and dln whole, and the caller takes its rows.
 *
 * Under --layout-invariant with expert parallelism (experts_by_source)
 * each source rank's rows are their own grouped calls, and each source's
 * weight gradients are summed as one process's micro-batch tree sums them
 * (sources_done). The allgather dispatcher then moves each choice's row in
 * a slot of its own instead of summing routing-weighted outputs over the
 * group (allgather_slots_forward), so the token's rank combines the
 * choices as one process does.
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
#include "config/config.h" /* loom_moe_layers_is */
#include "kernels/backend.h"
#include "kernels/kernels.h" /* LOOM_MOE_MAX_EXPERTS */
#include "layers/sum_tree.h"
#include "model/decoder_impl.h"
#include "model/family.h" /* LOOM_MOE_STATS */

static struct loom_linear lin(struct loom_block *b, int w, int bias, int in, int out)
{
    return (struct loom_linear){.b = b, .w = w, .bias = bias, .in = in, .out = out};
}

/* Whether the experts' columns are split over the tensor-parallel ranks
 * (their outputs and input gradients partial sums), or whole on each. */
static int parted(const struct loom_decoder *m)
{
    return m->tp > 1 && !m->spec.experts_whole;
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
    const int C = m->spec.hidden, F = m->Fs;
    struct loom_linear_group g = {.n = 0, .fused = 0};
    if (t->s_gate_w >= 0) g.lin[g.n++] = lin(b, t->s_gate_w, t->s_gate_b, C, F);
    g.lin[g.n++] = lin(b, t->s_up_w, t->s_up_b, C, F);
    return g;
}

int loom_decoder_moe_layer(const struct loom_decoder_spec *s, int l)
{
    return s->experts > 0 && loom_moe_layers_is(&s->moe_layers, l);
}

int loom_decoder_moe_count(const struct loom_decoder_spec *s)
{
    return s->experts > 0 ? loom_moe_layers_count(&s->moe_layers, s->num_layers) : 0;
}

int loom_decoder_moe_index(const struct loom_decoder_spec *s, int l)
{
    return loom_moe_layers_count(&s->moe_layers, l);
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

/* The rows each of this rank's experts computes (all of them without
 * expert parallelism: the dispatched rows; with it, every rank's rows for
 * it), into n (local). */
static void local_counts(const struct loom_decoder *m, const struct loom_decoder_layer_acts *x, int *n)
{
    const struct loom_ep *p = &m->ep;
    for (int j = 0; j < p->local; j++) {
        n[j] = p->ep > 1 ? 0 : x->counts[j];
        for (int s = 0; p->ep > 1 && s < p->ep; s++) n[j] += x->recv[s * p->local + j];
    }
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
    loom_linear_column_forward(&m->lc_moe, g, outs, in, NULL, n);
    round_act(m, fc, nF);
    if (up) round_act(m, up, nF);
    loom_decoder_mlp_act_forward(m, h, fc, up, nF);
    round_act(m, h, nF);
    float *got = loom_linear_row_forward(&m->lc_moe, down, h, NULL, y, n);
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
    loom_linear_row_backward(&m->lc_moe, down, dF[0], dy, h, NULL, n);
    round_act(m, dF[0], nF);
    act_backward(m, dF[1], dF[2], dF[0], fc, up, nF);
    round_act(m, dF[1], nF);
    if (up) round_act(m, dF[2], nF);
    float *const dys[2] = {dF[1], dF[2]};
    float *got = loom_linear_column_backward(&m->lc_moe, g, dys, in, NULL, dinp, n);
    LOOM_ASSERT(got == dinp);
    round_act(m, dinp, (size_t)n * down->out);
}

/* The local experts' products, G = ep.local of each: their input
 * products (gate and up, or up alone: how many, returned) and their down. */
static int expert_products(const struct loom_decoder *m, struct loom_block *b,
                           struct loom_linear (*in)[LOOM_MOE_MAX_EXPERTS], struct loom_linear *down)
{
    int nin = 0;
    for (int e = 0; e < m->ep.local; e++) {
        const struct loom_linear_group g = expert_in(m, b, e, m->Fe);
        for (int s = 0; s < g.n; s++) in[s][e] = g.lin[s];
        nin = g.n;
        down[e] = expert_down(m, b, e, m->Fe);
    }
    return nin;
}

static size_t rows_sum(const struct loom_decoder *m, const int *n)
{
    size_t R = 0;
    for (int e = 0; e < m->ep.local; e++) R += (size_t)n[e];
    return R;
}

/* The calls the local experts' rows are taken in: one over every row, or
 * with experts_by_source one for each source rank's rows (calls, returned);
 * call s's rows of each expert in rows, where they start in first (NULL:
 * each expert's right after the one before). The rows are expert-major,
 * each expert's from every rank in rank order (x->recv: source s's rows of
 * local expert e at s x local + e). */
static int call_rows(const struct loom_decoder *m, const struct loom_decoder_layer_acts *x, const int *n,
                     int s, int *rows, size_t *first)
{
    const struct loom_ep *p = &m->ep;
    if (!experts_by_source(m)) {
        memcpy(rows, n, sizeof *rows * (size_t)p->local);
        return 1;
    }
    size_t o = 0;
    for (int e = 0; e < p->local; o += (size_t)n[e++]) {
        first[e] = o;
        for (int r = 0; r < s; r++) first[e] += (size_t)x->recv[r * p->local + e];
        rows[e] = x->recv[s * p->local + e];
    }
    return p->ep;
}

/* The local experts' MLPs on their rows of in (expert-major, n rows each),
 * into y; their state in x (fc, up, h). Each product is one grouped call
 * over the experts (layers/linear.h; or one per source rank, call_rows),
 * the activation one call over every row. */
static void experts_forward(struct loom_decoder *m, struct loom_decoder_layer_acts *x, struct loom_block *b,
                            const float *in, float *y, const int *n)
{
    struct loom_linear ins[2][LOOM_MOE_MAX_EXPERTS], down[LOOM_MOE_MAX_EXPERTS];
    int rows[LOOM_MOE_MAX_EXPERTS];
    size_t first[LOOM_MOE_MAX_EXPERTS];
    const int G = m->ep.local, nin = expert_products(m, b, ins, down), split = experts_by_source(m);
    const size_t R = rows_sum(m, n), RF = R * (size_t)m->Fe;
    float *fc = x->fc, *up = x->up, *h = x->h;
    float *const outs[2] = {fc, up};
    for (int s = 0, calls = 1; s < calls; s++) {
        calls = call_rows(m, x, n, s, rows, first);
        for (int i = 0; i < nin; i++)
            loom_linear_grouped_forward(&m->lc_moe, ins[i], G, rows, split ? first : NULL, outs[i], in, 1);
    }
    for (int i = 0; i < nin; i++) round_act(m, outs[i], RF);
    loom_decoder_mlp_act_forward(m, h, fc, up, RF);
    round_act(m, h, RF);
    for (int s = 0, calls = 1; s < calls; s++) { /* a row-parallel bias: added by tp rank 0 alone */
        calls = call_rows(m, x, n, s, rows, first);
        loom_linear_grouped_forward(&m->lc_moe, down, G, rows, split ? first : NULL, y, h,
                                    m->lc_moe.tp_rank == 0);
    }
    round_act(m, y, R * (size_t)m->spec.hidden);
}

/* experts_by_source: the sources' weight gradients of this micro-batch
 * (m->moe_src_grads, span each) into the block's as one process's
 * micro-batch tree adds them. Source s is data rank q ep + s of its
 * expert group, whose micro-batches one process takes consecutively: each
 * source's micro-batches summed in a tree of its own (layers/sum_tree.h),
 * at the last the sources' sums in the pairwise tree over them, then into
 * the block's (zeros until then; the tree over the expert groups is the
 * tree sums' on LOOM_GROUP_EXPERT_DP). */
static void sources_done(struct loom_decoder *m, struct loom_block *b, int l, size_t span)
{
    const int P = m->ep.ep, micros = m->bwd_micros > 1 ? m->bwd_micros : 1, last = m->bwd_micro == micros - 1;
    float *const src = m->moe_src_grads;
    if (micros > 1) { /* the trees alloc_source_trees made for the step's micro-batches */
        const int nmoe = loom_decoder_moe_count(&m->spec), levels = loom_sum_tree_levels(micros);
        LOOM_ASSERT(m->moe_src_tree && micros == m->spec.micros && m->bwd_micro < micros);
        const size_t i = (size_t)loom_decoder_moe_index(&m->spec, l);
        for (int s = 0; s < P; s++)
            loom_sum_tree_add(dev(m), &m->moe_src_tree[i * P + (size_t)s], (size_t)nmoe * P, levels,
                              src + s * span, span, (unsigned)m->bwd_micro, last);
        if (!last) return;
    }
    for (int w = 1; w < P; w *= 2) /* the pairwise tree over the sources (ep a power of two) */
        for (int s = 0; s + w < P; s += 2 * w) m->k->accumulate(src + s * span, src + (s + w) * span, span);
    m->k->accumulate(b->work_grads + b->expert_lo, src, span);
}

/* Its backward from dy, the input rows' gradient into dx: the input
 * products' gradients summed in order (the gate's, then the up's, as one
 * column product's are). With experts_by_source each source's weight
 * gradients are taken apart (m->moe_src_grads, from zeros; sources_done). */
static void experts_backward(struct loom_decoder *m, struct loom_decoder_layer_acts *x, struct loom_block *b,
                             const float *in, const float *dy, float *dx, const int *n, int l)
{
    struct loom_linear ins[2][LOOM_MOE_MAX_EXPERTS], down[LOOM_MOE_MAX_EXPERTS];
    int rows[LOOM_MOE_MAX_EXPERTS];
    size_t first[LOOM_MOE_MAX_EXPERTS];
    const int G = m->ep.local, nin = expert_products(m, b, ins, down), split = experts_by_source(m);
    const size_t R = rows_sum(m, n), RF = R * (size_t)m->Fe, RC = R * (size_t)m->spec.hidden;
    const size_t span = b->expert_hi - b->expert_lo;
    float *const *dF = m->moe_dF;
    struct loom_grad_place to[LOOM_MOE_MAX_EXPERTS];
    if (split) {
        LOOM_ASSERT(span <= m->moe_src_numel);
        dev(m)->memset(m->moe_src_grads, 0, (size_t)m->ep.ep * span * sizeof(float));
        for (int s = 0; s < m->ep.ep; s++)
            to[s] = (struct loom_grad_place){m->moe_src_grads + s * span, b->expert_lo};
    }
    const size_t *at = split ? first : NULL;
    for (int s = 0, calls = 1; s < calls; s++) {
        calls = call_rows(m, x, n, s, rows, first);
        loom_linear_grouped_backward(&m->lc_moe, down, G, rows, at, dF[0], dy, x->h, split ? &to[s] : NULL);
    }
    round_act(m, dF[0], RF);
    act_backward(m, dF[1], dF[2], dF[0], x->fc, x->up, RF);
    round_act(m, dF[1], RF);
    if (x->up) round_act(m, dF[2], RF);
    for (int s = 0, calls = 1; s < calls; s++) {
        calls = call_rows(m, x, n, s, rows, first);
        loom_linear_grouped_backward(&m->lc_moe, ins[0], G, rows, at, dx, dF[1], in, split ? &to[s] : NULL);
        if (nin > 1)
            loom_linear_grouped_backward(&m->lc_moe, ins[1], G, rows, at, m->moe_dxs, dF[2], in,
                                         split ? &to[s] : NULL);
    }
    if (nin > 1) m->k->accumulate(dx, m->moe_dxs, RC);
    round_act(m, dx, RC);
    if (split) sources_done(m, b, l, span);
}

/* Under --layout-invariant (experts_by_source) the allgather dispatcher
 * keeps every choice apart: each rank gathers its experts' output rows
 * into (N, k) slots of every source's tokens (zero where another rank's
 * expert holds the choice), the slots are reduce-scattered to the tokens'
 * ranks (each slot's sum adds zeros to one row: exact), and the tokens'
 * rank weighs and adds them with one process's kernel and order, keeping
 * the slots (x->ey) for the backward. The places of this rank's slots:
 * its choices' own index, or -1 where dropped. */
static const int32_t *slot_places(struct loom_decoder *m, const struct loom_decoder_layer_acts *x, int Nk)
{
    int32_t *h = m->moe_idx_host;
    dev(m)->download(h, x->rpos, (size_t)Nk * sizeof(int32_t));
    for (int i = 0; i < Nk; i++) h[i] = h[i] < 0 ? -1 : i;
    dev(m)->upload(m->moe_spos, h, (size_t)Nk * sizeof(int32_t));
    return m->moe_spos;
}

static void allgather_slots_forward(struct loom_decoder *m, struct loom_decoder_layer_acts *x, float *out,
                                    const float *ey, int N)
{
    const int k = m->spec.topk, C = m->spec.hidden, Nk = N * k;
    const size_t NkC = (size_t)Nk * C;
    for (int s = 0; s < m->ep.ep; s++) /* a gather of rows: each slot 0 + its row, or 0 */
        m->k->moe_permute_backward(m->moe_gout + s * NkC, ey, x->gpos + (size_t)s * Nk, Nk, 1, C);
    loom_ep_reduce_scatter(&m->ep, x->ey, m->moe_gout, NkC);
    m->k->moe_unpermute_forward(out, x->ey, x->rprobs, slot_places(m, x, Nk), N, k, C);
}

/* Its backward: the tokens' rank takes the routing weights' gradients and
 * the slots' output gradients as one process does; the slots go to every
 * rank, each places its experts' rows, and their input gradients come back
 * in slots (reduce-scattered: exact) for one process's sum over the
 * choices. */
static void allgather_slots_backward(struct loom_decoder *m, struct loom_decoder_layer_acts *x,
                                     struct loom_block *b, const float *dout, float *dln, int N, const int *n,
                                     int l)
{
    const int k = m->spec.topk, C = m->spec.hidden, Nk = N * k, R = loom_ep_rows(&m->ep, x->recv);
    const size_t NkC = (size_t)Nk * C;
    const int32_t *sp = slot_places(m, x, Nk);
    dev(m)->memset(m->moe_slots, 0, NkC * sizeof(float)); /* a dropped choice's slot: no row */
    m->k->moe_unpermute_backward(m->moe_slots, m->moe_dprobs, dout, x->ey, x->rprobs, sp, N, k, C);
    round_act(m, m->moe_slots, NkC);
    loom_ep_gather(&m->ep, m->moe_gx, m->moe_slots, NkC, LOOM_DTYPE_F32);
    float *dy = m->moe_ep[0], *dx = m->moe_ep[1];
    if (m->spec.pad_to_capacity) dev(m)->memset(dy, 0, (size_t)R * C * sizeof(float));
    for (int s = 0; s < m->ep.ep; s++) /* a scatter of rows: each slot to its place among the experts' */
        m->k->moe_permute_forward(dy, m->moe_gx + s * NkC, x->gpos + (size_t)s * Nk, Nk, 1, C);
    experts_backward(m, x, b, x->xe, dy, dx, n, l);
    for (int s = 0; s < m->ep.ep; s++)
        m->k->moe_permute_backward(m->moe_gout + s * NkC, dx, x->gpos + (size_t)s * Nk, Nk, 1, C);
    loom_ep_reduce_scatter(&m->ep, m->moe_slots, m->moe_gout, NkC);
    m->k->moe_permute_backward(dln, m->moe_slots, sp, N, k, C);
}

/* The shared experts under the all-to-all dispatcher: run while the rows
 * travel to the experts' ranks (Megatron's --moe-shared-expert-overlap),
 * forward and backward; they post no collective (a one-rank region), and
 * their output is added where it was before, so the bits do not change. */
static int shared_overlap(const struct loom_decoder *m)
{
    return m->spec.shared_ffn && m->ep.ep > 1 && !m->spec.ep_allgather;
}

struct shared_job {
    struct loom_decoder *m;
    struct loom_decoder_layer_acts *x;
    struct loom_block *b;
    const float *ln2, *dout; /* the layer's input, its output's gradient (backward) */
    float *y;                /* the output (m->moe_out), or the input's gradient */
    int N;
};

static void shared_forward(void *ctx)
{
    const struct shared_job *j = ctx;
    struct loom_decoder *m = j->m;
    const struct loom_linear_group g = shared_in(m, j->b);
    const struct loom_linear down = lin(j->b, m->t.s_down_w, m->t.s_down_b, m->Fs, m->spec.hidden);
    mlp_forward(m, &g, &down, j->ln2, j->x->sfc, j->x->sup, j->x->sh, j->y, j->N);
}

static void shared_backward(void *ctx)
{
    const struct shared_job *j = ctx;
    struct loom_decoder *m = j->m;
    const struct loom_linear_group g = shared_in(m, j->b);
    const struct loom_linear down = lin(j->b, m->t.s_down_w, m->t.s_down_b, m->Fs, m->spec.hidden);
    mlp_backward(m, &g, &down, j->ln2, j->x->sfc, j->x->sup, j->x->sh, j->dout, j->y, m->moe_dF, j->N);
}

/* The allgather dispatcher (layers/experts.h): every rank's rows, choices
 * and routing weights gathered; this rank's experts' rows placed in the
 * expert-major layout (as the all-to-all lays them out), computed, and
 * every rank's rows' partial outputs over these experts reduce-scattered
 * into out. n: the local experts' rows. */
static void allgather_forward(struct loom_decoder *m, struct loom_decoder_layer_acts *x, struct loom_block *b,
                              const float *ln2, float *out, int N, int *n)
{
    const struct loom_ep *p = &m->ep;
    const int E = m->spec.experts, k = m->spec.topk, C = m->spec.hidden, Nk = N * k;
    const size_t P = (size_t)p->ep, NC = (size_t)N * C;
    loom_ep_gather(p, m->moe_all_host, x->counts, (size_t)E, LOOM_DTYPE_I32);
    loom_ep_recv_of(p, m->moe_all_host, E, x->recv);
    local_counts(m, x, n);
    /* the choices' places among this rank's experts' rows */
    int32_t *gidx = m->moe_gidx_host, *gpos = m->moe_gpos_host, *lpos = m->moe_lpos_host;
    loom_ep_gather(p, m->moe_gdp, x->ridx, (size_t)Nk, LOOM_DTYPE_I32); /* scratch on the device */
    dev(m)->download(gidx, m->moe_gdp, P * Nk * sizeof(int32_t));
    loom_ep_gather(p, m->moe_gdp, x->rpos, (size_t)Nk, LOOM_DTYPE_I32);
    dev(m)->download(gpos, m->moe_gdp, P * Nk * sizeof(int32_t));
    loom_ep_local_places(p, lpos, gidx, gpos, m->moe_all_host, x->recv, E, Nk);
    dev(m)->upload(x->gpos, lpos, P * Nk * sizeof(int32_t));
    loom_ep_gather(p, x->gprobs, x->rprobs, (size_t)Nk, LOOM_DTYPE_F32);
    loom_ep_gather(p, m->moe_gx, ln2, NC, LOOM_DTYPE_F32);
    const int R = loom_ep_rows(p, x->recv);
    if (m->spec.pad_to_capacity) dev(m)->memset(x->xe, 0, (size_t)R * C * sizeof(float));
    for (size_t s = 0; s < P; s++)
        m->k->moe_permute_forward(x->xe, m->moe_gx + s * NC, x->gpos + s * Nk, N, k, C);
    if (experts_by_source(m)) { /* the experts' rows into scratch, the slots kept in x->ey */
        experts_forward(m, x, b, x->xe, m->moe_ep[0], n);
        allgather_slots_forward(m, x, out, m->moe_ep[0], N);
        return;
    }
    experts_forward(m, x, b, x->xe, x->ey, n);
    for (size_t s = 0; s < P; s++)
        m->k->moe_unpermute_forward(m->moe_gout + s * NC, x->ey, x->gprobs + s * Nk, x->gpos + s * Nk, N, k,
                                    C);
    loom_ep_reduce_scatter(p, out, m->moe_gout, NC);
}

/* Its backward: every rank's output gradients gathered; the routing
 * weights' gradients and the inputs' partial gradients over these experts
 * reduce-scattered back (into m->moe_dprobs and dln). */
static void allgather_backward(struct loom_decoder *m, struct loom_decoder_layer_acts *x,
                               struct loom_block *b, const float *dout, float *dln, int N, const int *n,
                               int l)
{
    if (experts_by_source(m)) {
        allgather_slots_backward(m, x, b, dout, dln, N, n, l);
        return;
    }
    const struct loom_ep *p = &m->ep;
    const int k = m->spec.topk, C = m->spec.hidden, Nk = N * k;
    const size_t P = (size_t)p->ep, NC = (size_t)N * C;
    const int R = loom_ep_rows(p, x->recv);
    loom_ep_gather(p, m->moe_gx, dout, NC, LOOM_DTYPE_F32);
    float *dy = m->moe_ep[0], *dx = m->moe_ep[1];
    if (m->spec.pad_to_capacity) dev(m)->memset(dy, 0, (size_t)R * C * sizeof(float));
    for (size_t s = 0; s < P; s++)
        m->k->moe_unpermute_backward(dy, m->moe_gdp + s * Nk, m->moe_gx + s * NC, x->ey, x->gprobs + s * Nk,
                                     x->gpos + s * Nk, N, k, C);
    loom_ep_reduce_scatter(p, m->moe_dprobs, m->moe_gdp, (size_t)Nk);
    if (parted(m))
        loom_tp_allreduce(m->moe_dprobs, (size_t)Nk, LOOM_OP_SUM); /* partial sums over the columns */
    round_act(m, dy, (size_t)R * C);
    experts_backward(m, x, b, x->xe, dy, dx, n, l);
    for (size_t s = 0; s < P; s++)
        m->k->moe_permute_backward(m->moe_gout + s * NC, dx, x->gpos + s * Nk, N, k, C);
    loom_ep_reduce_scatter(p, dln, m->moe_gout, NC);
}

void loom_decoder_moe_forward(struct loom_decoder *m, struct loom_decoder_layer_acts *x, struct loom_block *b,
                              const float *ln2, float *out, int N, int l, double *hf)
{
    const int E = m->spec.experts, k = m->spec.topk, C = m->spec.hidden;
    struct shared_job shared = {m, x, b, ln2, NULL, m->moe_out, N};
    const struct loom_linear_group router = {.lin = {lin(b, m->t.router_w, -1, C, E)}, .n = 1};
    float *const logits[1] = {x->rlogits};
    loom_linear_column_forward(&m->lc_moe, &router, logits, ln2, NULL, N);
    m->k->moe_router_forward(x->rprobs, x->ridx, x->rlse, m->moe_sums, x->rlogits, N, E, k,
                             m->spec.pre_softmax);
    place(m, x, N);
    /* under context parallelism the balancing losses are the whole
     * micro-batch's: each expert's choices over every context rank's rows
     * (dropless: each rank's own places stand) */
    loom_cp_sum_all(&m->ctx, loom_buf_of(x->routed, (size_t)E, LOOM_DTYPE_I32));
    if (m->spec.pad_to_capacity) dev(m)->memset(m->moe_xp, 0, (size_t)rows_of(m, x) * C * sizeof(float));
    m->k->moe_permute_forward(m->moe_xp, ln2, x->rpos, N, k, C);
    int n[LOOM_MOE_MAX_EXPERTS];
    if (m->spec.ep_allgather) {
        allgather_forward(m, x, b, ln2, out, N, n);
    } else if (m->ep.ep > 1) { /* every rank's rows for this rank's experts, and their outputs back */
        loom_ep_exchange_counts(&m->ep, x->counts, x->recv);
        local_counts(m, x, n);
        loom_ep_dispatch_while(&m->ep, m->moe_ep[0], x->recv, m->moe_xp, x->counts, C,
                               shared_overlap(m) ? shared_forward : NULL, &shared);
        loom_ep_regroup(&m->ep, dev(m), x->xe, m->moe_ep[0], x->recv, C, 1);
        experts_forward(m, x, b, x->xe, m->moe_ep[1], n);
        loom_ep_regroup(&m->ep, dev(m), m->moe_ep[0], m->moe_ep[1], x->recv, C, 0);
        loom_ep_combine(&m->ep, x->ey, x->counts, m->moe_ep[0], x->recv, C);
    } else {
        local_counts(m, x, n);
        experts_forward(m, x, b, m->moe_xp, x->ey, n);
    }
    if (!m->spec.ep_allgather) m->k->moe_unpermute_forward(out, x->ey, x->rprobs, x->rpos, N, k, C);
    round_act(m, out, (size_t)N * C);
    if (m->spec.shared_ffn) {
        if (!shared_overlap(m)) shared_forward(&shared);
        m->k->residual_forward(out, out, m->moe_out, (size_t)N * C);
        round_act(m, out, (size_t)N * C);
    }
    /* the balancing losses' values and the experts' choices, for the step's summary */
    if (m->moe_recomputing) return;
    const double Ng = (double)N * m->ctx.cp; /* the micro-batch's rows */
    for (int e = 0; hf && e < E; e++) hf[e] += x->routed[e];
    if (hf) hf[E] += Ng;
    float *sums = m->moe_sums_host, *lse = m->moe_lse_host;
    dev(m)->download(sums, m->moe_sums, (size_t)E * sizeof(float));
    dev(m)->download(lse, x->rlse, (size_t)N * sizeof(float));
    loom_cp_sum_all(&m->ctx, loom_buf_of(sums, (size_t)E, LOOM_DTYPE_F32));
    double aux = 0, z = 0;
    for (int e = 0; e < E; e++) aux += (double)sums[e] * x->routed[e];
    for (int i = 0; i < N; i++) z += (double)lse[i] * lse[i];
    aux = aux * E / (Ng * Ng * k);
    m->moe_aux_sum += aux;
    m->moe_z_sum += z / N; /* a context rank's mean: the ranks' average is the micro-batch's */
    m->moe_layers_seen++;
    m->moe_choices += (double)N * k;
    const int i = loom_decoder_moe_index(&m->spec, l), nmoe = loom_decoder_moe_count(&m->spec);
    double *tokens = m->moe_tokens + (size_t)i * E, *layer = m->moe_tokens + (size_t)nmoe * E + 3 * (size_t)i;
    for (int e = 0; e < E; e++) tokens[e] += x->routed[e];
    layer[0] += aux, layer[1] += z / N, layer[2] += 1;
}

int loom_decoder_moe_take(struct loom_decoder *m, double *out)
{
    if (!m->spec.experts) return 0;
    const int E = m->spec.experts, nmoe = loom_decoder_moe_count(&m->spec),
              n = LOOM_MOE_STATS + nmoe * (E + 3);
    if (!out) return n;
    out[0] = m->moe_aux_sum, out[1] = m->moe_z_sum, out[2] = m->moe_layers_seen, out[3] = m->moe_dropped;
    out[4] = m->moe_choices;
    for (int i = 0; i < nmoe * (E + 3); i++) out[LOOM_MOE_STATS + i] = m->moe_tokens ? m->moe_tokens[i] : 0;
    m->moe_aux_sum = m->moe_z_sum = m->moe_choices = 0;
    m->moe_layers_seen = m->moe_dropped = 0;
    if (m->moe_tokens) memset(m->moe_tokens, 0, sizeof(double) * (size_t)nmoe * (E + 3));
    return n;
}

void loom_decoder_moe_backward(struct loom_decoder *m, struct loom_decoder_layer_acts *x,
                               struct loom_block *b, const float *ln2, const float *dout, float *dln, int N,
                               int l)
{
    const int E = m->spec.experts, k = m->spec.topk, C = m->spec.hidden;
    const size_t NC = (size_t)N * C;
    struct shared_job shared = {m, x, b, ln2, dout, shared_overlap(m) ? m->moe_sdx : m->moe_out, N};
    /* combine: the experts' outputs' and the routing weights' gradients (padding rows': none) */
    if (m->spec.pad_to_capacity) {
        const size_t bytes = (size_t)rows_of(m, x) * C * sizeof(float);
        dev(m)->memset(m->moe_dy, 0, bytes);
        dev(m)->memset(m->moe_xp, 0, bytes);
    }
    int n[LOOM_MOE_MAX_EXPERTS];
    local_counts(m, x, n);
    if (m->spec.ep_allgather) {
        allgather_backward(m, x, b, dout, dln, N, n, l);
    } else {
        m->k->moe_unpermute_backward(m->moe_dy, m->moe_dprobs, dout, x->ey, x->rprobs, x->rpos, N, k, C);
        if (parted(m)) loom_tp_allreduce(m->moe_dprobs, (size_t)N * k, LOOM_OP_SUM);
        round_act(m, m->moe_dy, (size_t)rows_of(m, x) * C);
        if (m->ep.ep > 1) { /* the outputs' gradients to the experts' ranks, the inputs' back */
            loom_ep_dispatch_while(&m->ep, m->moe_ep[0], x->recv, m->moe_dy, x->counts, C,
                                   shared_overlap(m) ? shared_backward : NULL, &shared);
            loom_ep_regroup(&m->ep, dev(m), m->moe_ep[1], m->moe_ep[0], x->recv, C, 1);
            experts_backward(m, x, b, x->xe, m->moe_ep[1], m->moe_ep[0], n, l);
            loom_ep_regroup(&m->ep, dev(m), m->moe_ep[1], m->moe_ep[0], x->recv, C, 0);
            loom_ep_combine(&m->ep, m->moe_dxp, x->counts, m->moe_ep[1], x->recv, C);
        } else {
            m->k->moe_permute_forward(m->moe_xp, ln2, x->rpos, N, k, C);
            experts_backward(m, x, b, m->moe_xp, m->moe_dy, m->moe_dxp, n, l);
        }
        m->k->moe_permute_backward(dln, m->moe_dxp, x->rpos, N, k, C);
    }
    /* the router: the routing weights', the balancing loss's and the z-loss's gradients */
    const double w = m->moe_loss_weight, Ng = (double)N * m->ctx.cp; /* the micro-batch's rows */
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
                             (hf ? tot[e] / (tot[E] * tot[E]) : x->routed[e] / (Ng * Ng * k)));
        dev(m)->upload(m->moe_aux_grad, aux, (size_t)E * sizeof(float));
    }
    const float zg = (float)(2.0 * w * m->spec.z_coeff / Ng);
    m->k->moe_router_backward(m->moe_dlogits, m->moe_dprobs, x->rprobs, x->ridx, x->rlse, x->rlogits,
                              with_aux ? m->moe_aux_grad : NULL, zg, N, E, k, m->spec.pre_softmax);
    const struct loom_linear_group router = {.lin = {lin(b, m->t.router_w, -1, C, E)}, .n = 1};
    float *const dl[1] = {m->moe_dlogits};
    float *got = loom_linear_column_backward(&m->lc_moe, &router, dl, ln2, NULL, m->moe_out, N);
    LOOM_ASSERT(got == m->moe_out);
    if (m->lc_moe.tp_rank == 0) /* the same on every tp rank: added once to the partial sums */
        m->k->residual_forward(dln, dln, m->moe_out, NC);
    if (m->spec.shared_ffn) {
        if (!shared_overlap(m)) shared_backward(&shared);
        m->k->residual_forward(dln, dln, shared.y, NC);
    }
}
