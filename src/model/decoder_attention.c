/*
 * The decoder's attention (decoder_impl.h): the fused kernel on the kept
 * q | k | v rows (or the (T,T) kernels under --attention-backend unfused),
 * rotary positions and the rows' packing, and context parallelism's three
 * ways of meeting the other ranks (layers/context.h): a2a's head shares,
 * all_gather's whole keys and values, p2p's ring of key/value blocks.
 */
#include <math.h>
#include <string.h>

#include "base/log.h"
#include "kernels/backend.h"
#include "kernels/kernels.h"
#include "layers/context.h"
#include "model/decoder_impl.h"

/* ---- attention --------------------------------------------------------------- */

/* The fused kernel's description of this rank's heads in the kept
 * q | k | v rows of B sequences (its G key/value heads as they are), the
 * packed documents' starts, the layout's block-sparse pairs or window on
 * top. */
static struct loom_flash_attn flash_of(const struct loom_decoder *m, const struct loom_decoder_acts *a, int B)
{
    if (heads_parted(m)) { /* Ulysses: the whole sequence of this context rank's share of the heads */
        const int cp = m->ctx.cp, NH = m->NHl / cp;
        return (struct loom_flash_attn){.B = B,
                                        .doc_start = a->doc_start,
                                        .T = m->ctx.T,
                                        .NH = NH,
                                        .G = m->Gl / cp,
                                        .hs = m->hs,
                                        .ld_q = qkv_width(m) / cp,
                                        .ld_k = qkv_width(m) / cp,
                                        .ld_v = qkv_width(m) / cp,
                                        .layout = m->sparse,
                                        .h0 = m->tp_rank * m->NHl + m->ctx.rank * NH,
                                        .drop = m->attn_drop,
                                        .seq0 = a->drop_first,
                                        .NHg = m->spec.heads};
    }
    return (struct loom_flash_attn){.B = B,
                                    .doc_start = a->doc_start,
                                    .T = m->T,
                                    .NH = m->NHl,
                                    .G = m->Gl,
                                    .hs = m->hs,
                                    .ld_q = qkv_width(m),
                                    .ld_k = qkv_width(m),
                                    .ld_v = qkv_width(m),
                                    .layout = m->sparse,
                                    .h0 = m->tp_rank * m->NHl,
                                    .drop = m->attn_drop,
                                    .seq0 = a->drop_first,
                                    .NHg = m->spec.heads};
}

/* The kept qkv rows' segments: q, k and v of this rank's heads. */
static void qkv_segments(const struct loom_decoder *m, int seg[3])
{
    seg[0] = m->Cq, seg[1] = seg[2] = m->kvC;
}

/* Context parallelism, Ulysses: qkv (this rank's B Tl rows of every head)
 * becomes in place its share of the heads for the whole sequence (B Tw
 * rows, as many values), which the layer keeps. */
void loom_decoder_heads_in(struct loom_decoder *m, float *qkv, int B)
{
    if (!heads_parted(m)) return;
    int seg[3];
    qkv_segments(m, seg);
    loom_cp_to_heads(&m->ctx, m->k, qkv, qkv, B, seg, 3, m->cp_send, m->cp_recv);
}

/* The (T,T) kernels (--attention-backend unfused) on the packed
 * (q | k | v) of this rank's query heads: the layout's block-sparse ones,
 * else the dense causal ones of the table. */
static void attn_fwd(struct loom_decoder *m, float *out, float *att, const float *qkv, int B)
{
    if (m->sparse)
        m->k->sparse_attention_forward(out, att, qkv, B, m->T, m->Cq, m->NHl, m->tp_rank * m->NHl, m->sparse);
    else
        m->k->attention_forward(out, att, qkv, B, m->T, m->Cq, m->NHl);
}

static void attn_bwd(struct loom_decoder *m, float *dqkv, float *datt, const float *dout, const float *att,
                     const float *qkv, int B)
{
    if (m->sparse)
        m->k->sparse_attention_backward(dqkv, datt, dout, att, qkv, B, m->T, m->Cq, m->NHl,
                                        m->tp_rank * m->NHl, m->sparse);
    else
        m->k->attention_backward(dqkv, datt, dout, att, qkv, B, m->T, m->Cq, m->NHl);
}

/* ---- context parallelism's attention: all_gather and p2p ---------------------- */

/* Whether attention meets the other context ranks by keys and values
 * (all_gather, p2p): the kept qkv rows are this rank's. */
static int keys_moved(const struct loom_decoder *m)
{
    return m->ctx.cp > 1 && m->cp_comm != LOOM_CP_COMM_A2A;
}

/* The fused kernel's description of one call: chunk hq of this rank's
 * rows of sequence b as the queries (rows of the kept qkv), the keys and
 * values [k0, k0 + Tk) of the whole sequence (rows of pitch ld_k), the
 * lse rows of the slot's (B, NH, Tl). */
static struct loom_flash_attn part_of(const struct loom_decoder *m, const struct loom_decoder_acts *a, int b,
                                      int hq, int k0, int Tk, int ld_k)
{
    return (struct loom_flash_attn){.B = 1,
                                    .T = m->ctx.T,
                                    .NH = m->NHl,
                                    .G = m->Gl,
                                    .hs = m->hs,
                                    .ld_q = qkv_width(m),
                                    .ld_k = ld_k,
                                    .ld_v = ld_k,
                                    .doc_start = a->doc_start ? a->doc_start + (size_t)b * m->ctx.T : NULL,
                                    .layout = m->sparse,
                                    .h0 = m->tp_rank * m->NHl,
                                    .q0 = loom_cp_position(&m->ctx, hq * m->ctx.c),
                                    .Tq = m->ctx.c,
                                    .k0 = k0,
                                    .Tk = Tk,
                                    .ld_lse = m->T,
                                    .drop = m->attn_drop,
                                    .seq0 = (int64_t)a->drop_first + b,
                                    .NHg = m->spec.heads};
}

/* The keys and values of the kept qkv rows (N), side by side (N, 2 kvC),
 * and gradients of them back into dqkv's columns. */
static void kv_rows(const struct loom_decoder *m, float *kv, const float *qkv, int N)
{
    const size_t kv2 = 2 * (size_t)m->kvC;
    m->k->convert_rows(kv, LOOM_DTYPE_F32, kv2, qkv + m->Cq, LOOM_DTYPE_F32, (size_t)qkv_width(m), (size_t)N,
                       kv2);
}

static void kv_into(const struct loom_decoder *m, float *dqkv, const float *dkv, int N)
{
    const size_t kv2 = 2 * (size_t)m->kvC;
    m->k->convert_rows(dqkv + m->Cq, LOOM_DTYPE_F32, (size_t)qkv_width(m), dkv, LOOM_DTYPE_F32, kv2,
                       (size_t)N, kv2);
}

/* all_gather: every rank's keys and values gathered into the whole
 * sequences (m->cp_whole), then each chunk's queries against the keys up
 * to its end. */
static void gather_attention_forward(struct loom_decoder *m, const struct loom_decoder_acts *a, float *atty,
                                     struct loom_decoder_layer_acts *x, const float *qkv, int B)
{
    const int Tl = m->T, T = m->ctx.T, c = m->ctx.c, W = qkv_width(m), kv2 = 2 * m->kvC;
    kv_rows(m, m->cp_kv[0], qkv, B * Tl);
    loom_cp_gather_rows(&m->ctx, m->k, m->cp_whole, m->cp_kv[0], B, kv2, m->cp_recv);
    for (int b = 0; b < B; b++)
        for (int h = 0; h < 2; h++) {
            const struct loom_flash_attn fa =
                part_of(m, a, b, h, 0, loom_cp_position(&m->ctx, h * c) + c, kv2);
            const size_t r = (size_t)b * Tl + (size_t)h * c;
            const float *kw = m->cp_whole + (size_t)b * T * kv2;
            m->k->flash_attention_forward(atty + r * m->Cq, x->lse + (size_t)b * m->NHl * Tl + (size_t)h * c,
                                          qkv + r * W, kw, kw + m->kvC, &fa);
        }
}

/* Its backward: the keys and values gathered again, each chunk's dk and dv
 * summed into the whole sequences' (m->cp_dwhole), then summed over the
 * group into this rank's rows (a reduce-scatter). */
static void gather_attention_backward(struct loom_decoder *m, const struct loom_decoder_acts *a,
                                      struct loom_decoder_layer_acts *x, const float *out, const float *qkv,
                                      int B)
{
    const int Tl = m->T, T = m->ctx.T, c = m->ctx.c, W = qkv_width(m), kv2 = 2 * m->kvC;
    kv_rows(m, m->cp_kv[0], qkv, B * Tl);
    loom_cp_gather_rows(&m->ctx, m->k, m->cp_whole, m->cp_kv[0], B, kv2, m->cp_recv);
    dev(m)->memset(m->cp_dwhole, 0, (size_t)B * T * kv2 * sizeof(float));
    for (int b = 0; b < B; b++)
        for (int h = 0; h < 2; h++) {
            const int Tk = loom_cp_position(&m->ctx, h * c) + c;
            const struct loom_flash_attn fa = part_of(m, a, b, h, 0, Tk, kv2);
            const size_t r = (size_t)b * Tl + (size_t)h * c;
            const float *kw = m->cp_whole + (size_t)b * T * kv2;
            m->k->flash_attention_backward(
                m->dqkv + r * W, m->cp_tmp, m->cp_tmp + m->kvC, m->dbufC + r * m->Cq, out + r * m->Cq,
                x->lse + (size_t)b * m->NHl * Tl + (size_t)h * c, qkv + r * W, kw, kw + m->kvC, &fa);
            m->k->accumulate(m->cp_dwhole + (size_t)b * T * kv2, m->cp_tmp, (size_t)Tk * kv2);
        }
    loom_cp_sum_rows(&m->ctx, m->k, m->cp_kv[0], m->cp_dwhole, B, kv2, m->cp_recv);
    kv_into(m, m->dqkv, m->cp_kv[0], B * Tl);
}

/* p2p: the ranks' keys and values go around the ring, each block sent on
 * while this rank computes on it; each chunk's queries against each chunk
 * of keys not all after them, merged by log-sum-exp (its own diagonal
 * chunk first, written directly). */
static void ring_attention_forward(struct loom_decoder *m, const struct loom_decoder_acts *a, float *atty,
                                   struct loom_decoder_layer_acts *x, const float *qkv, int B)
{
    const int Tl = m->T, c = m->ctx.c, W = qkv_width(m), kv2 = 2 * m->kvC, cp = m->ctx.cp, me = m->ctx.rank;
    kv_rows(m, m->cp_kv[0], qkv, B * Tl);
    for (int s = 0; s < cp; s++) {
        const int src = (me - s + cp) % cp;
        const float *cur = m->cp_kv[s & 1];
        struct loom_cp_ring ring;
        if (s + 1 < cp)
            loom_cp_ring_start(&m->ctx, &ring, cur, m->cp_kv[(s + 1) & 1], (size_t)B * Tl * kv2, 1);
        for (int b = 0; b < B; b++)
            for (int hq = 0; hq < 2; hq++)
                for (int i = 0; i < 2; i++) {
                    const int hk = i ? 1 - hq : hq, gq0 = loom_cp_position(&m->ctx, hq * c),
                              gk0 = loom_cp_position_of(&m->ctx, src, hk * c);
                    if (gk0 > gq0 + c - 1) continue; /* every key after every query */
                    const struct loom_flash_attn fa = part_of(m, a, b, hq, gk0, c, kv2);
                    const size_t r = (size_t)b * Tl + (size_t)hq * c;
                    const float *kb = cur + ((size_t)b * Tl + (size_t)hk * c) * kv2;
                    float *lse = x->lse + (size_t)b * m->NHl * Tl + (size_t)hq * c;
                    if (s == 0 && hk == hq) {
                        m->k->flash_attention_forward(atty + r * m->Cq, lse, qkv + r * W, kb, kb + m->kvC,
                                                      &fa);
                    } else {
                        struct loom_flash_attn f = fa;
                        f.ld_lse = 0;
                        m->k->flash_attention_forward(m->cp_o, m->cp_l, qkv + r * W, kb, kb + m->kvC, &f);
                        m->k->flash_attention_merge(atty + r * m->Cq, lse, m->cp_o, m->cp_l, c, m->NHl, m->hs,
                                                    Tl);
                    }
                }
        if (s + 1 < cp) loom_cp_ring_wait(&ring);
    }
}

/* Its backward: the blocks go around again with their dk and dv, each
 * rank adding what its queries give them; after the last step each
 * rank's own arrives back. A block's gradients from the ranks before
 * travel while this rank computes its share of them apart (cp_dkv[2];
 * its own block's straight into the one it sends first), added once
 * they arrive. */
static void ring_attention_backward(struct loom_decoder *m, const struct loom_decoder_acts *a,
                                    struct loom_decoder_layer_acts *x, const float *out, const float *qkv,
                                    int B)
{
    const int Tl = m->T, c = m->ctx.c, W = qkv_width(m), kv2 = 2 * m->kvC, cp = m->ctx.cp, me = m->ctx.rank;
    const size_t n = (size_t)B * Tl * kv2;
    kv_rows(m, m->cp_kv[0], qkv, B * Tl);
    dev(m)->memset(m->dqkv, 0, (size_t)B * Tl * W * sizeof(float));
    dev(m)->memset(m->cp_dq, 0, (size_t)c * W * sizeof(float)); /* its k, v columns stay 0 */
    struct loom_cp_ring back; /* the last block's gradients on to the next rank, the next block's in */
    for (int s = 0; s < cp; s++) {
        const int src = (me - s + cp) % cp;
        const float *cur = m->cp_kv[s & 1];
        float *mine = s ? m->cp_dkv[2] : m->cp_dkv[0];
        dev(m)->memset(mine, 0, n * sizeof(float));
        struct loom_cp_ring ring;
        if (s + 1 < cp) loom_cp_ring_start(&m->ctx, &ring, cur, m->cp_kv[(s + 1) & 1], n, 1);
        for (int b = 0; b < B; b++)
            for (int hq = 0; hq < 2; hq++)
                for (int hk = 0; hk < 2; hk++) {
                    const int gq0 = loom_cp_position(&m->ctx, hq * c),
                              gk0 = loom_cp_position_of(&m->ctx, src, hk * c);
                    if (gk0 > gq0 + c - 1) continue;
                    const struct loom_flash_attn fa = part_of(m, a, b, hq, gk0, c, kv2);
                    const size_t r = (size_t)b * Tl + (size_t)hq * c, rk = (size_t)b * Tl + (size_t)hk * c;
                    const float *kb = cur + rk * kv2;
                    m->k->flash_attention_backward(
                        m->cp_dq, m->cp_tmp, m->cp_tmp + m->kvC, m->dbufC + r * m->Cq, out + r * m->Cq,
                        x->lse + (size_t)b * m->NHl * Tl + (size_t)hq * c, qkv + r * W, kb, kb + m->kvC, &fa);
                    m->k->accumulate(m->dqkv + r * W, m->cp_dq, (size_t)c * W);
                    m->k->accumulate(mine + rk * kv2, m->cp_tmp, (size_t)c * kv2);
                }
        if (s + 1 < cp) loom_cp_ring_wait(&ring);
        float *dcur = m->cp_dkv[s & 1];
        if (s) { /* the block's gradients from the ranks before, and this rank's share */
            loom_cp_ring_wait(&back);
            m->k->accumulate(dcur, mine, n);
        }
        loom_cp_ring_start(&m->ctx, &back, dcur, m->cp_dkv[(s + 1) & 1], n, 2);
    }
    loom_cp_ring_wait(&back);
    kv_into(m, m->dqkv, m->cp_dkv[cp & 1], B * Tl);
}

/* ---- --layout-invariant: attention in row blocks ----------------------------- */

/* Under --layout-invariant (exact_attention) every layout makes the same
 * kernel calls: for each sequence and each row block of m->exact.block
 * query rows (tp_exact.h's blocks), its queries against the keys up to
 * the block's end, [0, q0 + block), of the whole sequence. A query row's
 * output and dq are then one call's, as in one process. Each call's dk
 * and dv are added in float64 into the whole sequence's sums, over the
 * context group where the keys moved, and rounded once: an exact sum has
 * no order. The keys and values are the heads' here of the whole
 * sequence: this rank's own (one process, a2a's head share) or gathered
 * (all_gather, and p2p, whose ring this replaces under the flag). */
struct exact_heads {
    int parted;              /* a2a: the whole sequence of a share of the heads */
    int Tl, W, Cq, kvC, kv2; /* rows a sequence holds here; the kept rows' widths */
    int NH, G, h0;
};

static struct exact_heads exact_heads_of(const struct loom_decoder *m)
{
    const int parted = heads_parted(m), cp = parted ? m->ctx.cp : 1;
    const int kvC = m->kvC / cp, NH = m->NHl / cp;
    return (struct exact_heads){.parted = parted,
                                .Tl = parted ? m->ctx.T : m->T,
                                .W = qkv_width(m) / cp,
                                .Cq = m->Cq / cp,
                                .kvC = kvC,
                                .kv2 = 2 * kvC,
                                .NH = NH,
                                .G = m->Gl / cp,
                                .h0 = m->tp_rank * m->NHl + (parted ? m->ctx.rank * NH : 0)};
}

/* The call for sequence b's local rows [r, r + block). */
static struct loom_flash_attn exact_call(const struct loom_decoder *m, const struct loom_decoder_acts *a,
                                         const struct exact_heads *e, int b, int r)
{
    const int q0 = keys_moved(m) ? loom_cp_position(&m->ctx, r) : r, R = m->exact.block;
    return (struct loom_flash_attn){.B = 1,
                                    .T = m->ctx.T,
                                    .NH = e->NH,
                                    .G = e->G,
                                    .hs = m->hs,
                                    .ld_q = e->W,
                                    .ld_k = e->kv2,
                                    .ld_v = e->kv2,
                                    .doc_start = a->doc_start ? a->doc_start + (size_t)b * m->ctx.T : NULL,
                                    .layout = m->sparse,
                                    .h0 = e->h0,
                                    .q0 = q0,
                                    .Tq = R,
                                    .k0 = 0,
                                    .Tk = q0 + R,
                                    .ld_lse = e->Tl,
                                    .drop = m->attn_drop,
                                    .seq0 = (int64_t)a->drop_first + b,
                                    .NHg = m->spec.heads};
}

/* The whole sequences' keys and values (m->ex_kv, B Tw rows of kv2) from
 * the kept rows qkv. */
static const float *exact_keys(struct loom_decoder *m, const struct exact_heads *e, const float *qkv, int B)
{
    if (keys_moved(m)) {
        kv_rows(m, m->cp_kv[0], qkv, B * m->T);
        loom_cp_gather_rows(&m->ctx, m->k, m->ex_kv, m->cp_kv[0], B, e->kv2, m->cp_recv);
    } else {
        m->k->convert_rows(m->ex_kv, LOOM_DTYPE_F32, (size_t)e->kv2, qkv + e->Cq, LOOM_DTYPE_F32,
                           (size_t)e->W, (size_t)B * e->Tl, (size_t)e->kv2);
    }
    return m->ex_kv;
}

static void exact_attention_forward(struct loom_decoder *m, const struct loom_decoder_acts *a, float *atty,
                                    struct loom_decoder_layer_acts *x, const float *qkv, int B)
{
    const struct exact_heads e = exact_heads_of(m);
    const int R = m->exact.block, Tw = m->ctx.T;
    const float *kv = exact_keys(m, &e, qkv, B);
    float *out = e.parted ? m->cp_out : atty;
    for (int b = 0; b < B; b++)
        for (int r = 0; r < e.Tl; r += R) {
            const struct loom_flash_attn fa = exact_call(m, a, &e, b, r);
            const size_t row = (size_t)b * e.Tl + r;
            const float *kw = kv + (size_t)b * Tw * e.kv2;
            m->k->flash_attention_forward(out + row * e.Cq, x->lse + (size_t)b * e.NH * e.Tl + r,
                                          qkv + row * e.W, kw, kw + e.kvC, &fa);
        }
    if (e.parted) loom_cp_to_rows(&m->ctx, m->k, atty, m->cp_out, B, &m->Cq, 1, m->cp_send, m->cp_recv);
}

static void exact_attention_backward(struct loom_decoder *m, const struct loom_decoder_acts *a,
                                     struct loom_decoder_layer_acts *x, const float *out, const float *qkv,
                                     int B)
{
    const struct exact_heads e = exact_heads_of(m);
    const int R = m->exact.block, Tw = m->ctx.T;
    const size_t whole = (size_t)B * Tw * e.kv2;
    const float *kv = exact_keys(m, &e, qkv, B), *dout = m->dbufC;
    float *dq = m->dqkv;
    if (e.parted) {
        loom_cp_to_heads(&m->ctx, m->k, m->cp_out, out, B, &m->Cq, 1, m->cp_send, m->cp_recv);
        loom_cp_to_heads(&m->ctx, m->k, m->cp_dout, m->dbufC, B, &m->Cq, 1, m->cp_send, m->cp_recv);
        out = m->cp_out, dout = m->cp_dout, dq = m->cp_dqkv;
    }
    dev(m)->memset(m->ex_dkv, 0, whole * sizeof(double));
    for (int b = 0; b < B; b++)
        for (int r = 0; r < e.Tl; r += R) {
            const struct loom_flash_attn fa = exact_call(m, a, &e, b, r);
            const size_t row = (size_t)b * e.Tl + r;
            const float *kw = kv + (size_t)b * Tw * e.kv2;
            m->k->flash_attention_backward(dq + row * e.W, m->ex_tmp, m->ex_tmp + e.kvC, dout + row * e.Cq,
                                           out + row * e.Cq, x->lse + (size_t)b * e.NH * e.Tl + r,
                                           qkv + row * e.W, kw, kw + e.kvC, &fa);
            m->k->acc_add(m->ex_dkv + (size_t)b * Tw * e.kv2, m->ex_tmp, (size_t)fa.Tk * e.kv2);
        }
    /* this rank's rows of the sums, rounded into dq's k and v columns */
    float *dkv = m->ex_kv; /* the keys are read: their rows hold the rounded gradients */
    if (keys_moved(m)) {
        loom_tp_wait(
            loom_comm_allreduce(LOOM_GROUP_CP, loom_buf_of(m->ex_dkv, whole, LOOM_DTYPE_F64), LOOM_OP_SUM));
        const int c = m->ctx.c;
        for (int b = 0; b < B; b++)
            for (int h = 0; h < 2; h++)
                m->k->acc_round(dkv + ((size_t)b * m->T + (size_t)h * c) * e.kv2,
                                m->ex_dkv + ((size_t)b * Tw + loom_cp_position(&m->ctx, h * c)) * e.kv2,
                                (size_t)c * e.kv2);
    } else {
        m->k->acc_round(dkv, m->ex_dkv, whole);
    }
    m->k->convert_rows(dq + e.Cq, LOOM_DTYPE_F32, (size_t)e.W, dkv, LOOM_DTYPE_F32, (size_t)e.kv2,
                       (size_t)B * e.Tl, (size_t)e.kv2);
    if (e.parted) {
        int seg[3];
        qkv_segments(m, seg);
        loom_cp_to_rows(&m->ctx, m->k, m->dqkv, dq, B, seg, 3, m->cp_send, m->cp_recv);
    }
}

/* Attention over B sequences from qkv (float32 values) into atty. Fused:
 * the log-sum-exp rows into x->lse. Unfused: the probabilities into x->att,
 * or with 16-bit activations one sequence at a time into seq_att, not
 * kept. */
void loom_decoder_attention_forward(struct loom_decoder *m, const struct loom_decoder_acts *a, float *atty,
                                    struct loom_decoder_layer_acts *x, const float *qkv, int B)
{
    const int T = m->T, Cq = m->Cq;
    if (exact_attention(m)) {
        exact_attention_forward(m, a, atty, x, qkv, B);
        return;
    }
    if (keys_moved(m)) {
        if (m->cp_comm == LOOM_CP_COMM_ALL_GATHER)
            gather_attention_forward(m, a, atty, x, qkv, B);
        else
            ring_attention_forward(m, a, atty, x, qkv, B);
        return;
    }
    if (heads_parted(m)) { /* the output of this rank's heads, then every head of this rank's rows */
        const struct loom_flash_attn fa = flash_of(m, a, B);
        const int cq = Cq / m->ctx.cp, kv = m->kvC / m->ctx.cp;
        m->k->flash_attention_forward(m->cp_out, x->lse, qkv, qkv + cq, qkv + cq + kv, &fa);
        loom_cp_to_rows(&m->ctx, m->k, atty, m->cp_out, B, &m->Cq, 1, m->cp_send, m->cp_recv);
        return;
    }
    if (!m->unfused) {
        const struct loom_flash_attn fa = flash_of(m, a, B);
        m->k->flash_attention_forward(atty, x->lse, qkv, qkv + Cq, qkv + Cq + m->kvC, &fa);
        return;
    }
    if (!lp(m)) {
        attn_fwd(m, atty, x->att, qkv, B);
        return;
    }
    for (int b = 0; b < B; b++)
        attn_fwd(m, atty + (size_t)b * T * Cq, m->seq_att, qkv + (size_t)b * T * 3 * Cq, 1);
}

/* Attention's backward: m->dqkv from m->dbufC (the gradient at its output)
 * and qkv (float32 values). Fused: from the kept output (with 16-bit
 * activations its float32 values staged in m->dbufF[0], which holds
 * nothing then) and log-sum-exp rows. Unfused: the probabilities are
 * recomputed first where none were kept (selective recomputation; 16-bit
 * activations, one sequence at a time, the output dropped into
 * m->dbufF[0]). */
void loom_decoder_attention_backward(struct loom_decoder *m, const struct loom_decoder_acts *a,
                                     struct loom_decoder_layer_acts *x, const float *qkv, int B)
{
    const int T = m->T, Cq = m->Cq;
    if (exact_attention(m)) {
        exact_attention_backward(m, a, x, view(m, x->atty, m->dbufF[0], (size_t)B * T * Cq), qkv, B);
        return;
    }
    if (keys_moved(m)) {
        const float *out = view(m, x->atty, m->dbufF[0], (size_t)B * T * Cq);
        if (m->cp_comm == LOOM_CP_COMM_ALL_GATHER)
            gather_attention_backward(m, a, x, out, qkv, B);
        else
            ring_attention_backward(m, a, x, out, qkv, B);
        return;
    }
    if (heads_parted(m)) { /* the output and its gradient to this rank's heads, dqkv back to its rows */
        const struct loom_flash_attn fa = flash_of(m, a, B);
        const int cq = Cq / m->ctx.cp, kv = m->kvC / m->ctx.cp;
        const float *out = view(m, x->atty, m->dbufF[0], (size_t)B * T * Cq);
        loom_cp_to_heads(&m->ctx, m->k, m->cp_out, out, B, &m->Cq, 1, m->cp_send, m->cp_recv);
        loom_cp_to_heads(&m->ctx, m->k, m->cp_dout, m->dbufC, B, &m->Cq, 1, m->cp_send, m->cp_recv);
        float *d = m->cp_dqkv;
        m->k->flash_attention_backward(d, d + cq, d + cq + kv, m->cp_dout, m->cp_out, x->lse, qkv, qkv + cq,
                                       qkv + cq + kv, &fa);
        int seg[3];
        qkv_segments(m, seg);
        loom_cp_to_rows(&m->ctx, m->k, m->dqkv, d, B, seg, 3, m->cp_send, m->cp_recv);
        return;
    }
    if (!m->unfused) {
        const struct loom_flash_attn fa = flash_of(m, a, B);
        const float *out = view(m, x->atty, m->dbufF[0], (size_t)B * T * Cq);
        m->k->flash_attention_backward(m->dqkv, m->dqkv + Cq, m->dqkv + Cq + m->kvC, m->dbufC, out, x->lse,
                                       qkv, qkv + Cq, qkv + Cq + m->kvC, &fa);
        return;
    }
    if (!lp(m)) {
        if (m->recompute == LOOM_RECOMPUTE_SELECTIVE) /* the kept atty is not overwritten */
            attn_fwd(m, m->scratchC, x->att, qkv, B);
        /* datt is the kernel's own scratch, read by nothing after it: not rounded */
        attn_bwd(m, m->dqkv, m->datt, m->dbufC, x->att, qkv, B);
        return;
    }
    for (int b = 0; b < B; b++) {
        const size_t q = (size_t)b * T * 3 * Cq, o = (size_t)b * T * Cq;
        attn_fwd(m, m->dbufF[0] + o, m->seq_att, qkv + q, 1);
        attn_bwd(m, m->dqkv + q, m->datt, m->dbufC + o, m->seq_att, qkv + q, 1);
    }
}

/* Rotary positions on x (B rows of T, H heads): forward rotates, else
 * the backward; at a->positions where they are given. */
void loom_decoder_rope(struct loom_decoder *m, const struct loom_decoder_acts *a, float *x, int B, int H,
                       int fwd)
{
    const int T = m->T, hs = m->hs;
    const float theta = (float)m->spec.rope_theta;
    if (a->positions) /* restarting at documents, or a context rank's places */
        (fwd ? m->k->rope_forward_at : m->k->rope_backward_at)(x, a->positions, B * T, H, hs, theta);
    else
        (fwd ? m->k->rope_forward : m->k->rope_backward)(x, B, T, H, hs, theta);
}

/* Separate q, k, v into the kept rows (qkv_width): side by side for the
 * fused attention; for the (T,T) kernels, grouped-query packing: (q | k |
 * v) of NH heads each, key/value head g serving query heads [g NH/G,
 * (g+1) NH/G). */
void loom_decoder_pack_qkv(const struct loom_decoder *m, float *qkv, const float *q, const float *k,
                           const float *v, int N)
{
    if (m->unfused) {
        m->k->gqa_pack(qkv, q, k, v, N, m->NHl, m->kvC / m->hs, m->hs);
        return;
    }
    const size_t w = (size_t)qkv_width(m), Cq = (size_t)m->Cq, kvC = (size_t)m->kvC;
    m->k->convert_rows(qkv, LOOM_DTYPE_F32, w, q, LOOM_DTYPE_F32, Cq, (size_t)N, Cq);
    m->k->convert_rows(qkv + Cq, LOOM_DTYPE_F32, w, k, LOOM_DTYPE_F32, kvC, (size_t)N, kvC);
    m->k->convert_rows(qkv + Cq + kvC, LOOM_DTYPE_F32, w, v, LOOM_DTYPE_F32, kvC, (size_t)N, kvC);
}

/* The converse for gradients: dq, dk and dv written (for the (T,T)
 * kernels, dk and dv the sums over the query heads a key/value head
 * serves; the fused kernel summed them). */
void loom_decoder_unpack_dqkv(const struct loom_decoder *m, float *dq, float *dk, float *dv,
                              const float *dqkv, int N)
{
    if (m->unfused) {
        m->k->gqa_unpack(dq, dk, dv, dqkv, N, m->NHl, m->kvC / m->hs, m->hs);
        return;
    }
    const size_t w = (size_t)qkv_width(m), Cq = (size_t)m->Cq, kvC = (size_t)m->kvC;
    m->k->convert_rows(dq, LOOM_DTYPE_F32, Cq, dqkv, LOOM_DTYPE_F32, w, (size_t)N, Cq);
    m->k->convert_rows(dk, LOOM_DTYPE_F32, kvC, dqkv + Cq, LOOM_DTYPE_F32, w, (size_t)N, kvC);
    m->k->convert_rows(dv, LOOM_DTYPE_F32, kvC, dqkv + Cq + kvC, LOOM_DTYPE_F32, w, (size_t)N, kvC);
}
