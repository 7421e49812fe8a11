/*
 * What the decoder's files share (decoder.c, decoder_attention.c): a few
 * views of its state as inline helpers, and the attention's calls the
 * layers make. Internal to src/model/.
 */
#ifndef LOOM_MODEL_DECODER_IMPL_H
#define LOOM_MODEL_DECODER_IMPL_H

#include "kernels/backend.h"
#include "model/decoder.h"

/* The model's device memory (kernels/backend.h): every activation buffer
 * is allocated, set, copied and freed through it. */
static inline const struct loom_backend *dev(const struct loom_decoder *m)
{
    return m->base.backend;
}

/* Whether activations are kept in 16 bits. */
static inline int lp(const struct loom_decoder *m)
{
    return m->act_dtype != LOOM_DTYPE_F32;
}

/* The width of a kept qkv row: q | k | v of this rank's heads; the fused
 * attention reads grouped key/value heads as they are (Cq + 2 kvC), the
 * (T,T) kernels take them repeated to every query head (3 Cq). */
static inline int qkv_width(const struct loom_decoder *m)
{
    return m->unfused ? 3 * m->Cq : m->Cq + 2 * m->kvC;
}

/* Whether attention runs on a share of the heads for the whole sequence
 * (context parallelism's a2a, Ulysses): the kept qkv rows are that share. */
static inline int heads_parted(const struct loom_decoder *m)
{
    return m->ctx.cp > 1 && m->cp_comm == LOOM_CP_COMM_A2A;
}

/* Whether attention runs in --layout-invariant's row blocks
 * (decoder_attention.c): the fused kernel under the flag. */
static inline int exact_attention(const struct loom_decoder *m)
{
    return m->exact.block > 0 && !m->unfused;
}

/* Whether the local experts' products are taken per source rank
 * (--layout-invariant under expert parallelism, decoder_moe.c): each
 * source's rows their own calls and weight gradients. */
static inline int experts_by_source(const struct loom_decoder *m)
{
    return m->exact.pieces > 0 && m->ep.ep > 1;
}

/* Kept activation x (n values) as float32: x itself, or converted into
 * stage. */
static inline const float *view(const struct loom_decoder *m, const void *x, float *stage, size_t n)
{
    if (!lp(m)) return x;
    dev(m)->convert(loom_buf_f32(stage, n), loom_buf_of_const(x, n, m->act_dtype));
    return stage;
}

/* The MLP's activation (the spec's kind) on n values of its input
 * products' outputs (up NULL: a dense MLP's fc alone). */
void loom_decoder_mlp_act_forward(const struct loom_decoder *m, float *h, const float *fc, const float *up,
                                  size_t n);

/* ---- a mixture of experts (decoder_moe.c) ------------------------------------ */

/* Layer l's MoE MLP on its normed rows ln2 (N, C; float32, every row of
 * the tensor-parallel region) into out (N, C; this rank's partial sum, to
 * leave the region), keeping its state in x, its statistics in m->moe_*
 * and, for hf_aux_loss, its choices in the micro-batch's totals hf (NULL:
 * none); its backward from dout (N, C, every row): the parameters'
 * gradients accumulate, dln (N, C; the partial input gradient, to leave
 * the region) is written. */
void loom_decoder_moe_forward(struct loom_decoder *m, struct loom_decoder_layer_acts *x, struct loom_block *b,
                              const float *ln2, float *out, int N, int l, double *hf);
void loom_decoder_moe_backward(struct loom_decoder *m, struct loom_decoder_layer_acts *x,
                               struct loom_block *b, const float *ln2, const float *dout, float *dln, int N,
                               int l);

/* ---- attention (decoder_attention.c) ----------------------------------------- */

/* Rotary positions on x (B rows of T, H heads): forward rotates, else
 * the backward; at a->positions where they are given. */
void loom_decoder_rope(struct loom_decoder *m, const struct loom_decoder_acts *a, float *x, int B, int H,
                       int fwd);
/* q, k, v into the kept rows (qkv_width), and their gradients back. */
void loom_decoder_pack_qkv(const struct loom_decoder *m, float *qkv, const float *q, const float *k,
                           const float *v, int N);
void loom_decoder_unpack_dqkv(const struct loom_decoder *m, float *dq, float *dk, float *dv,
                              const float *dqkv, int N);
/* Context parallelism's a2a: qkv (this rank's rows) becomes in place its
 * share of the heads for the whole sequence, which the layer keeps;
 * nothing otherwise. */
void loom_decoder_heads_in(struct loom_decoder *m, float *qkv, int B);
/* Attention over B sequences from the kept qkv (float32 values) into atty
 * (its log-sum-exp rows, or probabilities, into x), and its backward:
 * m->dqkv from m->dbufC. */
void loom_decoder_attention_forward(struct loom_decoder *m, const struct loom_decoder_acts *a, float *atty,
                                    struct loom_decoder_layer_acts *x, const float *qkv, int B);
void loom_decoder_attention_backward(struct loom_decoder *m, const struct loom_decoder_acts *a,
                                     struct loom_decoder_layer_acts *x, const float *qkv, int B);

#endif
