/*
 * The decoder (decoder.h): parameter layout from the spec (with each
 * tensor's initialisation and tensor-parallel split), forward and backward
 * over a range of blocks for one micro-batch slot. Each slot holds what its
 * forward saved for its backward, so a pipeline schedule can keep several
 * micro-batches in flight; the backward walks the range in reverse and
 * announces each block to the strategy stack when its gradients are ready.
 *
 * Attention (decoder_attention.c) is the fused kernel (FlashAttention's
 * algorithm, the table's flash_attention_*): no (T,T) probabilities exist,
 * each layer keeps only the log-sum-exp of each (row, head), and the
 * backward recomputes the probabilities tile by tile from the kept qkv and
 * output. With --attention-backend unfused (m->unfused) the (T,T) kernels
 * run instead and keep the probabilities, as below. Under context
 * parallelism a layer holds its rank's rows of each sequence
 * (layers/context.h) and attention meets the other ranks there.
 *
 * Activation recomputation (Megatron's):
 *   selective  no layer keeps its attention probabilities (unfused; the
 *              fused kernel keeps none anyway); one shared buffer receives
 *              them in the forward, and the backward of each layer
 *              recomputes them from its kept qkv.
 *   full       a recomputed layer keeps only its input (the previous
 *              layer's output); its forward runs into shared scratch (one
 *              chunk of layers' activations) and runs again, into the same
 *              scratch, right before its backward.
 * Both reuse the forward's code (layer_forward), so the recomputed values
 * are bit for bit the first ones, and so are the gradients. The scratch is
 * needed only outside the life of the logits (from the LM head's forward to
 * its backward), so it lives in the logits' buffer.
 *
 * Activations in a 16-bit dtype (act_dtype BF16 or F16) are kept in it: the
 * kernels compute in float32, every activation a kernel writes is rounded
 * to the dtype right after it and stored in 16 bits (keep), and a kernel
 * reads the float32 values of a kept one (view). The float32 values live in
 * staging buffers: the backward's scratch, which the forward borrows (only
 * m->dres carries over between layers, so a recomputing forward may too),
 * and a few more (stage_res, seq_att, head_rows). Two things run in pieces
 * then: unfused attention, one sequence at a time, keeping no probabilities
 * (the backward recomputes them from the kept qkv, as selective
 * recomputation does: the same kernel on the same values gives the same
 * bits); and the
 * loss on the logits, which the LM head's product writes and reads in 16
 * bits, LOOM_DECODER_HEAD_ROWS rows at a time through float32. In the
 * backward every activation gradient is rounded too (round_act), in float32
 * buffers. Parameter gradients are not rounded here: the precision strategy
 * owns them.
 *
 * Tensor parallelism (m->tp > 1): the layers compute on the rank's part
 * (NH/tp query heads, G/tp key/value heads, F/tp MLP columns, Vl vocabulary
 * rows); the products are layers/linear.h's column- and row-parallel ones,
 * and the regions between them are entered and left through m->rg, which
 * under sequence parallelism (m->rg.sp) gathers and reduce-scatters the
 * rows: the residual stream, the norms and their saved state hold
 * loom_tp_rows_held() = B*T/tp rows.
 *
 * Not here: a family's spec, presets and weights formats (model/<family>*.c),
 * the optimizer, data.
 */
#include "model/decoder.h"

#include <math.h>
#include <stdio.h>
#include <string.h>

#include "base/log.h"
#include "base/mem.h"
#include "kernels/backend.h"
#include "kernels/dropout_mask.h"
#include "kernels/kernels.h"
#include "kernels/sparse_layout.h"
#include "layers/fp8_linear.h"
#include "layers/sum_tree.h"
#include "model/decoder_impl.h"
#include "model/sparsity.h"

enum { REPL = LOOM_TP_REPLICATED };

/* ---- layout ------------------------------------------------------------------ */

/* One tensor, its initialisation, and its tensor-parallel split: dimension
 * split of view (NULL: the tensor's own shape), or REPL. Returns its index. */
static int add(struct loom_decoder *m, struct loom_block *b, const char *name, int ndim, int64_t d0,
               int64_t d1, enum loom_init init, double std, int split, int view_ndim, const int64_t *view)
{
    const int64_t shape[2] = {d0, d1};
    struct loom_tensor *t =
        loom_block_add_tensor_split(b, name, ndim, shape, view_ndim, view, split, m->tp, m->tp_rank);
    t->init = init;
    t->init_std = std;
    return b->ntensors - 1;
}

/* "<layer prefix><name>.<suffix>" */
static void tensor_name(char *out, const struct loom_decoder_names *nm, int l, const char *name,
                        const char *suffix)
{
    char prefix[LOOM_TENSOR_NAME_MAX];
    snprintf(prefix, sizeof prefix, nm->layer, l);
    const int n = snprintf(out, LOOM_TENSOR_NAME_MAX, "%s%s.%s", prefix, name, suffix);
    LOOM_ASSERT(n > 0 && n < LOOM_TENSOR_NAME_MAX);
}

/* A projection of a layer: in -> out features ([in, out] or [out, in] as
 * the spec stores them), column- (column 1) or row-parallel (0), or whole
 * on every tensor-parallel rank (LINEAR_WHOLE), with a bias or not; the
 * weight's index, and the bias's into *bias (-1: none). view: a fused
 * weight's [C, 3, Cq] (and its bias's [3, Cq]). */
enum { LINEAR_WHOLE = 2 };
static int add_linear(struct loom_decoder *m, struct loom_block *b, int l, const char *name, int64_t in,
                      int64_t out, int column, int with_bias, double std, int *bias, int fused)
{
    const struct loom_decoder_spec *s = &m->spec;
    char full[LOOM_TENSOR_NAME_MAX];
    const int in_out = s->weights == LOOM_WEIGHTS_IN_OUT;
    const int64_t C = s->hidden, Cq = (int64_t)s->heads * m->hs;
    const int64_t wview[3] = {C, 3, Cq}, bview[2] = {3, Cq};
    tensor_name(full, s->names, l, name, "weight");
    int w;
    if (fused) /* [C, 3 Cq]: a rank's q, k and v columns are one box of the view */
        w = add(m, b, full, 2, in, out, LOOM_INIT_NORMAL, std, 2, 3, wview);
    else if (column == LINEAR_WHOLE)
        w = add(m, b, full, 2, in_out ? in : out, in_out ? out : in, LOOM_INIT_NORMAL, std, REPL, 0, NULL);
    else if (in_out)
        w = add(m, b, full, 2, in, out, LOOM_INIT_NORMAL, std, column ? 1 : 0, 0, NULL);
    else
        w = add(m, b, full, 2, out, in, LOOM_INIT_NORMAL, std, column ? 0 : 1, 0, NULL);
    *bias = -1;
    if (with_bias) {
        tensor_name(full, s->names, l, name, "bias");
        *bias = fused                    ? add(m, b, full, 1, out, 0, LOOM_INIT_ZERO, std, 1, 2, bview)
                : column == LINEAR_WHOLE ? add(m, b, full, 1, out, 0, LOOM_INIT_ZERO, std, REPL, 0, NULL)
                : column                 ? add(m, b, full, 1, out, 0, LOOM_INIT_ZERO, std, 0, 0, NULL)
                                         : add(m, b, full, 1, out, 0, LOOM_INIT_ZERO, std, REPL, 0, NULL);
    }
    return w;
}

/* A norm's weight (and LayerNorm's bias). */
static void add_norm(struct loom_decoder *m, struct loom_block *b, const char *full_prefix, int *w, int *bias)
{
    char full[LOOM_TENSOR_NAME_MAX];
    const double std = m->spec.init_std;
    snprintf(full, sizeof full, "%s.weight", full_prefix);
    /* the norm multiplies by norm_offset + w: 1 at the start either way */
    *w = add(m, b, full, 1, m->spec.hidden, 0, m->spec.norm_offset != 0 ? LOOM_INIT_ZERO : LOOM_INIT_ONE, std,
             REPL, 0, NULL);
    *bias = -1;
    if (m->spec.norm == LOOM_NORM_LAYERNORM) {
        snprintf(full, sizeof full, "%s.bias", full_prefix);
        *bias = add(m, b, full, 1, m->spec.hidden, 0, LOOM_INIT_ZERO, std, REPL, 0, NULL);
    }
}

static void add_layer_norm(struct loom_decoder *m, struct loom_block *b, int l, const char *name, int *w,
                           int *bias)
{
    char prefix[LOOM_TENSOR_NAME_MAX], full[LOOM_TENSOR_NAME_MAX];
    snprintf(prefix, sizeof prefix, m->spec.names->layer, l);
    snprintf(full, sizeof full, "%s%s", prefix, name);
    add_norm(m, b, full, w, bias);
}

/* An MoE layer's MLP tensors: the router, each expert's products (the
 * family's MLP kind, named under its prefix), the shared experts'. */
static void layout_moe(struct loom_decoder *m, struct loom_block *b, int l, double std, double proj_std)
{
    const struct loom_decoder_spec *s = &m->spec;
    const struct loom_decoder_names *nm = s->names;
    struct loom_decoder_slots *t = &m->t;
    const int64_t C = s->hidden, F = s->moe_ffn, Fs = s->shared_ffn;
    const int gated = s->mlp == LOOM_MLP_GATED;
    /* the experts' splits: column and row parallel, or whole on every tensor-parallel rank */
    const int col = s->experts_whole ? LINEAR_WHOLE : 1, row = s->experts_whole ? LINEAR_WHOLE : 0;
    char name[LOOM_TENSOR_NAME_MAX], prefix[LOOM_TENSOR_NAME_MAX];
    /* the router: replicated over the tensor-parallel ranks, each of which routes every row alike */
    tensor_name(name, nm, l, nm->router, "weight");
    t->router_w = s->weights == LOOM_WEIGHTS_IN_OUT
                      ? add(m, b, name, 2, C, s->experts, LOOM_INIT_NORMAL, std, REPL, 0, NULL)
                      : add(m, b, name, 2, s->experts, C, LOOM_INIT_NORMAL, std, REPL, 0, NULL);
    /* an expert's tensors: gate (gated MLPs), up and down, each with a bias or not */
    const int per_expert = (gated ? 3 : 2) * (s->mlp_bias ? 2 : 1);
    for (int e = 0; e < s->experts; e++) {
        if (e < m->ep.first || e >= m->ep.first + m->ep.local) { /* another expert-parallel rank's */
            loom_block_skip_tensors(b, per_expert);
            continue;
        }
        const int first = b->ntensors;
        snprintf(prefix, sizeof prefix, nm->expert, e);
        int gw = -1, gb = -1, uw, ub, dw, db;
        if (gated) {
            snprintf(name, sizeof name, "%s%s", prefix, nm->expert_gate);
            gw = add_linear(m, b, l, name, C, F, col, s->mlp_bias, std, &gb, 0);
        }
        snprintf(name, sizeof name, "%s%s", prefix, nm->expert_up);
        uw = add_linear(m, b, l, name, C, F, col, s->mlp_bias, std, &ub, 0);
        snprintf(name, sizeof name, "%s%s", prefix, nm->expert_down);
        dw = add_linear(m, b, l, name, F, C, row, s->mlp_bias, proj_std, &db, 0);
        if (e == m->ep.first)
            t->e_gate_w = gw, t->e_gate_b = gb, t->e_up_w = uw, t->e_up_b = ub, t->e_down_w = dw,
            t->e_down_b = db;
        t->expert_stride = b->ntensors - first;
        LOOM_ASSERT(t->expert_stride == per_expert);
        for (int i = first; i < b->ntensors; i++) b->tensors[i].expert = 1;
    }
    t->s_gate_w = t->s_gate_b = t->s_up_w = t->s_up_b = t->s_down_w = t->s_down_b = -1;
    if (!Fs) return;
    if (gated) {
        snprintf(name, sizeof name, "%s%s", nm->shared, nm->expert_gate);
        t->s_gate_w = add_linear(m, b, l, name, C, Fs, col, s->mlp_bias, std, &t->s_gate_b, 0);
    }
    snprintf(name, sizeof name, "%s%s", nm->shared, nm->expert_up);
    t->s_up_w = add_linear(m, b, l, name, C, Fs, col, s->mlp_bias, std, &t->s_up_b, 0);
    snprintf(name, sizeof name, "%s%s", nm->shared, nm->expert_down);
    t->s_down_w = add_linear(m, b, l, name, Fs, C, row, s->mlp_bias, proj_std, &t->s_down_b, 0);
}

/* The tensors of layer l's block, in block order: norm, the attention's
 * projections, the output projection, norm, the MLP's. Megatron's splits:
 * q, k, v (a rank's heads and key/value groups), fc, gate and up by output
 * features, the output projection and down by input features; the norms
 * replicated. */
static void layout_layer(struct loom_decoder *m, struct loom_block *b, int l)
{
    const struct loom_decoder_spec *s = &m->spec;
    const struct loom_decoder_names *nm = s->names;
    struct loom_decoder_slots *t = &m->t;
    const int64_t C = s->hidden, Cq = (int64_t)s->heads * m->hs, kvC = (int64_t)s->kv_heads * m->hs,
                  F = s->ffn;
    const double std = s->init_std, proj_std = s->scaled_init ? std / sqrt(2.0 * s->num_layers) : std;
    add_layer_norm(m, b, l, nm->norm1, &t->norm1_w, &t->norm1_b);
    if (s->fused_qkv) {
        t->nqkv = 1;
        t->qkv_w[0] = add_linear(m, b, l, nm->qkv, C, 3 * Cq, 1, s->qkv_bias, std, &t->qkv_b[0], 1);
    } else {
        const char *names[3] = {nm->q, nm->k, nm->v};
        const int64_t outs[3] = {Cq, kvC, kvC};
        t->nqkv = 3;
        for (int i = 0; i < 3; i++)
            t->qkv_w[i] = add_linear(m, b, l, names[i], C, outs[i], 1, s->qkv_bias, std, &t->qkv_b[i], 0);
    }
    t->o_w = add_linear(m, b, l, nm->o, Cq, C, 0, s->o_bias, proj_std, &t->o_b, 0);
    add_layer_norm(m, b, l, nm->norm2, &t->norm2_w, &t->norm2_b);
    if (loom_decoder_moe_layer(s, l)) {
        layout_moe(m, b, l, std, proj_std);
        return;
    }
    t->gate_w = t->gate_b = -1;
    if (s->mlp == LOOM_MLP_GATED)
        t->gate_w = add_linear(m, b, l, nm->gate, C, F, 1, s->mlp_bias, std, &t->gate_b, 0);
    t->up_w = add_linear(m, b, l, nm->up, C, F, 1, s->mlp_bias, std, &t->up_b, 0);
    t->down_w = add_linear(m, b, l, nm->down, F, C, 0, s->mlp_bias, proj_std, &t->down_b, 0);
}

/* The blocks: [embedding, L layers, head]; the token table and an untied
 * LM head split by vocabulary rows. */
static void layout_blocks(struct loom_decoder *m, int embedding, int head)
{
    const struct loom_decoder_spec *s = &m->spec;
    const int L = s->num_layers, C = s->hidden;
    char name[LOOM_TENSOR_NAME_MAX];
    if (embedding) {
        struct loom_block *e = &m->base.blocks[0];
        e->role = LOOM_ROLE_EMBEDDING;
        e->layer = -1;
        e->index = 0;
        snprintf(name, sizeof name, "%s.weight", s->names->embedding);
        add(m, e, name, 2, s->vocab, C, LOOM_INIT_NORMAL, s->init_std, 0, 0, NULL);
        if (s->positions == LOOM_POSITION_LEARNED) {
            snprintf(name, sizeof name, "%s.weight", s->names->positions);
            add(m, e, name, 2, s->max_pos, C, LOOM_INIT_NORMAL, s->init_std, REPL, 0, NULL);
        }
    }
    for (int l = 0; l < L; l++) {
        if (m->stage.block[l] < 0) continue;
        struct loom_block *b = &m->base.blocks[m->stage.block[l]];
        b->role = LOOM_ROLE_LAYER;
        b->layer = l;
        b->index = 1 + l;
        layout_layer(m, b, l);
    }
    if (!head) return;
    struct loom_block *h = &m->base.blocks[m->base.nblocks - 1];
    h->role = LOOM_ROLE_HEAD;
    h->layer = -1;
    h->index = L + 1;
    int w, bias;
    add_norm(m, h, s->names->final_norm, &w, &bias);
    if (s->untied) {
        snprintf(name, sizeof name, "%s.weight", s->names->lm_head);
        add(m, h, name, 2, s->vocab, C, LOOM_INIT_NORMAL, s->init_std, 0, 0, NULL);
    }
}

/* The head block's tensors: the final norm's weight (and bias), the LM head's. */
static int lnf_w(void)
{
    return 0;
}
static int lnf_b(const struct loom_decoder *m)
{
    return m->spec.norm == LOOM_NORM_LAYERNORM ? 1 : -1;
}
static int lm_head_w(const struct loom_decoder *m)
{
    return m->spec.norm == LOOM_NORM_LAYERNORM ? 2 : 1;
}

/* The LM head's weight (Vl, C) and its gradient: the head block's own, or
 * the tied token embedding's (a pipeline stage's copy of it). */
static float *lm_head_weight(struct loom_decoder *m)
{
    if (m->spec.untied) return loom_param(&m->base.blocks[m->head], lm_head_w(m));
    return m->emb >= 0 ? loom_param(&m->base.blocks[m->emb], 0) : m->tied_copy;
}

/* The LM head's weight as stored in bf16, or NULL (a pipeline stage's
 * float32 copy of the tied table among them). */
static const uint16_t *lm_head_weight16(struct loom_decoder *m)
{
    if (m->spec.untied) return loom_linear_param16(&m->base.blocks[m->head], lm_head_w(m));
    return m->emb >= 0 ? loom_linear_param16(&m->base.blocks[m->emb], 0) : NULL;
}

static float *lm_head_grad(struct loom_decoder *m)
{
    if (m->spec.untied) return loom_grad(&m->base.blocks[m->head], lm_head_w(m));
    return m->emb >= 0 ? loom_grad(&m->base.blocks[m->emb], 0) : m->tied_grad;
}

/* Whether the tied table crosses stages: the head's stage keeps a copy
 * (layers/pp_stages.h), exchanged by the embedding group's strategy
 * (ops->tied_stages). */
static int tied_across_stages(const struct loom_decoder *m)
{
    return m->pipelined && !m->spec.untied && (m->emb >= 0) != (m->head >= 0);
}

/* ---- activations kept in act_dtype ------------------------------------------- */

static float *act(const struct loom_decoder *m, size_t n)
{
    return dev(m)->alloc(loom_mul_size(n, sizeof(float)), LOOM_MEM_ACTIVATIONS);
}

static void act_free(const struct loom_decoder *m, void *p)
{
    dev(m)->free(p);
}

/* Whether packed documents change anything. */
static int documents(const struct loom_decoder *m)
{
    return m->docs.reset_positions || m->docs.reset_mask || m->docs.mask_loss;
}

/* Activations are held in act_dtype: round what a kernel just wrote. */
static void round_act(const struct loom_decoder *m, float *buf, size_t n)
{
    if (lp(m)) m->k->round_to(buf, n, m->act_dtype);
}

static size_t act_size(const struct loom_decoder *m)
{
    return lp(m) ? sizeof(uint16_t) : sizeof(float);
}

/* Element i of kept activation x. */
static void *at(const struct loom_decoder *m, void *x, size_t i)
{
    return (char *)x + i * act_size(m);
}

/* Where a kernel writes the values of kept activation x: x itself in
 * float32, else float32 staging. */
static float *out_of(const struct loom_decoder *m, void *x, float *stage)
{
    return lp(m) ? stage : x;
}

/* The kernel's result v (n values, where out_of said) becomes activation x:
 * rounded to act_dtype in place, and kept. */
static void keep(const struct loom_decoder *m, void *x, float *v, size_t n)
{
    if (lp(m)) m->k->round_store(x, v, n, m->act_dtype);
}

/* float32 values in and out of kept activation x (n values; src is
 * act_dtype-valued, as every value that crosses a boundary is). */
static void put(const struct loom_decoder *m, void *x, const float *src, size_t n)
{
    if (lp(m))
        dev(m)->convert(loom_buf_of(x, n, m->act_dtype), loom_buf_of_const(src, n, LOOM_DTYPE_F32));
    else
        dev(m)->copy(x, src, n * sizeof(float));
}
static void get(const struct loom_decoder *m, float *dst, const void *x, size_t n)
{
    if (lp(m))
        dev(m)->convert(loom_buf_f32(dst, n), loom_buf_of_const(x, n, m->act_dtype));
    else
        dev(m)->copy(dst, x, n * sizeof(float));
}

/* Whether the products take kept bf16 activations and stored bf16
 * parameters without converting them (the backend's optional *_b16 for the
 * spec's weight orientation). */
static int b16(const struct loom_decoder *m)
{
    if (m->act_dtype != LOOM_DTYPE_BF16 || !m->k->matmul_forward_b16) return 0;
    /* [out, in]: fp8's products and the exact pieces take float32 operands */
    return m->spec.weights == LOOM_WEIGHTS_IN_OUT || (!m->base.fp8 && !m->exact.pieces);
}

/* Kept activation x as those products take it, or NULL: a tensor-parallel
 * region's input (`region`) is other rows than the kept ones under sequence
 * parallelism (gathered). */
static const uint16_t *kept16(const struct loom_decoder *m, const void *x, int region)
{
    return b16(m) && !(region && m->rg.sp) ? x : NULL;
}

/* ---- activations and their recomputation ------------------------------------ */

/* Attention probabilities of B sequences: (B, NH, T, T), or the sparse
 * layout's blocks of this rank's heads. */
static size_t att_numel_of(const struct loom_decoder *m, int B)
{
    if (m->sparse) return loom_sparse_att_numel(m->sparse, B, m->NHl, m->tp_rank * m->NHl);
    return (size_t)B * m->NHl * m->T * m->T;
}

static size_t att_numel(const struct loom_decoder *m)
{
    return att_numel_of(m, m->B);
}

/* Whether full recomputation reruns layer l's forward in the backward. */
static int recomputed(const struct loom_decoder *m, int l)
{
    if (m->recompute != LOOM_RECOMPUTE_FULL) return 0;
    return m->recompute_method == LOOM_RECOMPUTE_UNIFORM || l - m->stage.lo[l] < m->recompute_num_layers;
}

/* Layers recomputed together: chunks of N under uniform (the last one
 * shorter when N does not divide L, as in Megatron), else one; counted from
 * the first layer of the pipeline model chunk, as Megatron counts them per
 * stage. */
static int chunk_len(const struct loom_decoder *m)
{
    return m->recompute_method == LOOM_RECOMPUTE_UNIFORM ? m->recompute_num_layers : 1;
}
static int chunk_first(const struct loom_decoder *m, int l)
{
    const int lo = m->stage.lo[l];
    return l - (l - lo) % chunk_len(m);
}
static int chunk_last(const struct loom_decoder *m, int l)
{
    const int last = chunk_first(m, l) + chunk_len(m) - 1;
    return last < m->stage.hi[l] ? last : m->stage.hi[l];
}

/* Whether layer l's output res3 has its own buffer: the next layer's input
 * (or the final norm's) is kept unless both layers are in one chunk. */
static int keeps_output(const struct loom_decoder *m, int l)
{
    return !recomputed(m, l) || l == chunk_last(m, l);
}

/* Layer l's input (n values) as float32: a pipeline chunk's received
 * input (float32), else the embedding's output or the previous layer's,
 * viewed through stage. */
static const float *layer_input(const struct loom_decoder *m, const struct loom_decoder_acts *a, int l,
                                float *stage, size_t n)
{
    if (l > 0 && a->chunk_input[l]) return a->chunk_input[l];
    return view(m, l == 0 ? a->encoded : a->layers[l - 1].res3, stage, n);
}

/* Consecutive pieces of one buffer; with base NULL, only counted. */
struct carve {
    char *base;
    size_t used; /* bytes */
};

/* n values of `size` bytes: allocated (c NULL), or the next piece of c's
 * buffer, 64-byte aligned like loom_alloc's, so the kernels see the same
 * alignment. */
static void *piece(const struct loom_decoder *m, struct carve *c, size_t n, size_t size)
{
    const size_t bytes = loom_mul_size(n, size);
    if (!c) return dev(m)->alloc(bytes, LOOM_MEM_ACTIVATIONS);
    void *p = c->base ? c->base + c->used : NULL;
    c->used += (bytes + 63) & ~(size_t)63;
    return p;
}

/* A layer's saved state; att (float32 activations only) and res3 only when
 * asked for. */
static void layer_buffers(const struct loom_decoder *m, struct loom_decoder_layer_acts *a, struct carve *c,
                          int with_att, int with_res3, int moe)
{
    const size_t N = (size_t)m->B * m->T, Nr = (size_t)loom_tp_rows_held(&m->rg, (int)N),
                 C = (size_t)m->spec.hidden, Cq = (size_t)m->Cq, F = (size_t)m->Fl, sz = act_size(m),
                 f = sizeof(float);
    const int ln = m->spec.norm == LOOM_NORM_LAYERNORM;
    a->ln1 = piece(m, c, Nr * C, sz);
    a->ln1_mean = ln ? piece(m, c, Nr, f) : NULL;
    a->ln1_rstd = piece(m, c, Nr, f);
    a->qkv = piece(m, c, N * (size_t)qkv_width(m), sz);
    a->atty = piece(m, c, N * Cq, sz);
    if (m->unfused)
        a->att = with_att && !lp(m) ? piece(m, c, att_numel(m), f) : NULL;
    else /* the fused kernel's log-sum-exp rows, kept by every layer (they are small) */
        a->lse = piece(m, c, (size_t)m->B * m->NHl * m->T, f);
    a->res2 = piece(m, c, Nr * C, sz);
    a->ln2 = piece(m, c, Nr * C, sz);
    a->ln2_mean = ln ? piece(m, c, Nr, f) : NULL;
    a->ln2_rstd = piece(m, c, Nr, f);
    /* an MoE layer's products are on the dispatched rows (m->moe_rows,
     * moe_ffn); a recompute scratch layer serves both kinds */
    const size_t E = (size_t)m->spec.experts, k = (size_t)m->spec.topk, Fs = (size_t)m->Fs,
                 R = (size_t)m->moe_rows, Rx = (size_t)m->moe_rows_ep, RF = Rx * (size_t)m->Fe;
    /* an MoE layer keeps its state in float32 (its values act_dtype's); a
     * scratch layer's buffer holds either */
    const size_t mlp_bytes = !moe ? N * F * sz : moe > 1 && N * F * sz > RF * f ? N * F * sz : RF * f;
    a->fc = piece(m, c, mlp_bytes, 1);
    a->up = m->spec.mlp == LOOM_MLP_GATED ? piece(m, c, mlp_bytes, 1) : NULL;
    a->h = piece(m, c, mlp_bytes, 1);
    a->res3 = with_res3 ? piece(m, c, Nr * C, sz) : NULL;
    if (!moe) return;
    a->rlogits = piece(m, c, N * E, f);
    a->rprobs = piece(m, c, N * k, f);
    a->rlse = piece(m, c, N, f);
    a->ridx = piece(m, c, N * k, sizeof(int32_t));
    a->rpos = piece(m, c, N * k, sizeof(int32_t));
    a->ey = piece(m, c, (m->spec.ep_allgather ? Rx : R) * C, f);
    a->xe = m->ep.ep > 1 ? piece(m, c, Rx * C, f) : NULL;
    a->gpos = m->spec.ep_allgather ? piece(m, c, (size_t)m->ep.ep * N * k, sizeof(int32_t)) : NULL;
    a->gprobs = m->spec.ep_allgather ? piece(m, c, (size_t)m->ep.ep * N * k, f) : NULL;
    if (Fs) {
        a->sfc = piece(m, c, N * Fs, f);
        a->sup = m->spec.mlp == LOOM_MLP_GATED ? piece(m, c, N * Fs, f) : NULL;
        a->sh = piece(m, c, N * Fs, f);
    }
}

static void free_layer_buffers(const struct loom_decoder *m, struct loom_decoder_layer_acts *a)
{
    void *bufs[] = {a->ln1,  a->ln1_mean, a->ln1_rstd, a->qkv,      a->atty, a->att,   a->lse,
                    a->res2, a->ln2,      a->ln2_mean, a->ln2_rstd, a->fc,   a->up,    a->h,
                    a->res3, a->rlogits,  a->rprobs,   a->rlse,     a->ridx, a->rpos,  a->ey,
                    a->sfc,  a->sup,      a->sh,       a->xe,       a->gpos, a->gprobs};
    for (size_t i = 0; i < sizeof bufs / sizeof bufs[0]; i++) act_free(m, bufs[i]);
}

/* One slot's activation buffers, for the recompute settings. A recomputed
 * layer gets no buffer of its own but its kept output; the recompute
 * scratch (a chunk of layers, or selective's shared att) is carved from the
 * logits' buffer, which grows to hold it when B*T*V values would not. With
 * 16-bit activations there are no probabilities to share (attention keeps
 * none). */
static void alloc_slot(struct loom_decoder *m, struct loom_decoder_acts *a)
{
    const int L = m->spec.num_layers,
              selective = m->recompute == LOOM_RECOMPUTE_SELECTIVE && !lp(m) && m->unfused;
    const int nscratch = m->recompute == LOOM_RECOMPUTE_FULL ? chunk_len(m) : 0;
    const size_t C = (size_t)m->spec.hidden, N = (size_t)m->B * m->T,
                 Nr = (size_t)loom_tp_rows_held(&m->rg, (int)N),
                 NV = m->head >= 0 ? loom_mul_size(loom_mul_size(N, (size_t)m->Vl), act_size(m)) : 0;
    a->layers = loom_alloc(sizeof *a->layers * (size_t)L, LOOM_MEM_OTHER);
    a->chunk_input = loom_alloc(sizeof *a->chunk_input * (size_t)L, LOOM_MEM_OTHER);
    if (nscratch) a->scratch = loom_alloc(sizeof *a->scratch * (size_t)nscratch, LOOM_MEM_OTHER);
    /* measure the scratch, allocate, then carve it. The last scratch
     * layer's output is always a kept input (a chunk ends there), so it has
     * no res3. */
    struct carve c = {NULL, 0};
    float *shared_att = NULL;
    for (int pass = 0; pass < 2; pass++) {
        c.used = 0;
        for (int s = 0; s < nscratch; s++)
            layer_buffers(m, &a->scratch[s], &c, 1, s < nscratch - 1, m->spec.experts ? 2 : 0);
        if (selective) shared_att = piece(m, &c, att_numel(m), sizeof(float));
        if (pass == 0) {
            a->logits_bytes = c.used > NV ? c.used : NV > 0 ? NV : 1;
            c.base = a->logits = dev(m)->alloc(a->logits_bytes, LOOM_MEM_ACTIVATIONS);
        }
    }
    for (int l = 0; l < L; l++) {
        struct loom_decoder_layer_acts *x = &a->layers[l];
        if (m->stage.block[l] < 0) continue; /* another stage's */
        if (l > 0 && m->stage.lo[l] == l) a->chunk_input[l] = act(m, Nr * C);
        if (recomputed(m, l)) {
            *x = a->scratch[l - chunk_first(m, l)];
            if (keeps_output(m, l)) x->res3 = piece(m, NULL, Nr * C, act_size(m));
        } else {
            layer_buffers(m, x, NULL, !selective, 1, loom_decoder_moe_layer(&m->spec, l));
            if (selective) x->att = shared_att;
        }
    }
    if (m->spec.experts) { /* each layer's experts' row counts, on the host (a scratch layer's its own) */
        const size_t E = (size_t)m->spec.experts, E3 = 3 * E; /* counts, routed, recv */
        a->moe_counts = loom_alloc(sizeof(int) * E3 * (size_t)(L + nscratch), LOOM_MEM_OTHER);
        for (int s = 0; s < nscratch; s++) a->scratch[s].counts = a->moe_counts + E3 * (size_t)(L + s);
        for (int l = 0; l < L; l++)
            if (m->stage.block[l] >= 0)
                a->layers[l].counts = recomputed(m, l) ? a->scratch[l - chunk_first(m, l)].counts
                                                       : a->moe_counts + E3 * (size_t)l;
        for (int s = 0; s < nscratch; s++)
            a->scratch[s].routed = a->scratch[s].counts + E,
            a->scratch[s].recv = a->scratch[s].counts + 2 * E;
        for (int l = 0; l < L; l++)
            if (m->stage.block[l] >= 0)
                a->layers[l].routed = a->layers[l].counts + E,
                a->layers[l].recv = a->layers[l].counts + 2 * E;
        if (m->spec.balance == LOOM_MOE_HF_AUX_LOSS)
            a->moe_hf = loom_alloc(sizeof *a->moe_hf * (E + 1), LOOM_MEM_OTHER);
    }
    a->encoded = piece(m, NULL, Nr * C, act_size(m));
    a->lnf = act(m, Nr * C);
    a->lnf_mean = m->spec.norm == LOOM_NORM_LAYERNORM ? act(m, Nr) : NULL;
    a->lnf_rstd = act(m, Nr);
    a->losses = act(m, N);
    a->lse = act(m, N);
    const size_t whole = (size_t)m->B * m->ctx.T; /* tokens of the whole rows */
    a->tokens = dev(m)->alloc(loom_mul_size(3 * N + whole, sizeof(int32_t)), LOOM_MEM_ACTIVATIONS);
    if (documents(m) || m->ctx.cp > 1) {
        a->doc_host = loom_alloc(loom_mul_size(whole, sizeof(int32_t)), LOOM_MEM_OTHER);
        a->loss_keep = loom_alloc(N, LOOM_MEM_OTHER);
    }
}

static void free_slot(struct loom_decoder *m, struct loom_decoder_acts *a)
{
    for (int l = 0; l < m->spec.num_layers; l++) {
        struct loom_decoder_layer_acts *x = &a->layers[l];
        if (m->stage.block[l] < 0) continue;
        act_free(m, a->chunk_input[l]);
        if (recomputed(m, l)) {
            if (keeps_output(m, l)) act_free(m, x->res3);
            continue;
        }
        /* selective's shared att lives in the logits' buffer */
        if (m->recompute == LOOM_RECOMPUTE_SELECTIVE && m->unfused) x->att = NULL;
        free_layer_buffers(m, x);
    }
    void *bufs[] = {a->encoded, a->lnf, a->lnf_mean, a->lnf_rstd, a->logits, a->losses, a->lse, a->tokens};
    for (size_t i = 0; i < sizeof bufs / sizeof bufs[0]; i++) act_free(m, bufs[i]);
    loom_free(a->doc_host);
    loom_free(a->loss_keep);
    loom_free(a->moe_counts);
    loom_free(a->moe_hf);
    loom_free(a->layers);
    loom_free(a->chunk_input);
    loom_free(a->scratch);
}

static size_t max3(size_t a, size_t b, size_t c)
{
    const size_t ab = a > b ? a : b;
    return ab > c ? ab : c;
}

/* Whether any dropout site is on (loom_decoder_set_dropout). */
static int drops(const struct loom_decoder *m)
{
    return m->drop_hidden > 0 || m->drop_attn > 0 || m->drop_emb > 0;
}

/* The per-source trees' levels (decoder_moe.c's sources_done) of the MoE
 * layers this stage holds, for the step's micro-batches (spec.micros), so
 * that the footprint counts them: level k of layer i's source s at
 * moe_src_tree[(k nmoe + i) ep + s]. */
static void alloc_source_trees(struct loom_decoder *m)
{
    const int levels = loom_sum_tree_levels(m->spec.micros), nmoe = loom_decoder_moe_count(&m->spec),
              P = m->ep.ep;
    if (!levels) return;
    m->moe_src_tree = loom_alloc(loom_mul_size((size_t)levels * nmoe * P, sizeof(float *)), LOOM_MEM_OTHER);
    for (int l = 0; l < m->spec.num_layers; l++) {
        if (!loom_decoder_moe_layer(&m->spec, l) || m->stage.block[l] < 0) continue;
        const size_t i = (size_t)loom_decoder_moe_index(&m->spec, l);
        for (int k = 0; k < levels; k++)
            for (int s = 0; s < P; s++)
                m->moe_src_tree[((size_t)k * nmoe + i) * P + (size_t)s] =
                    dev(m)->alloc(loom_mul_size(m->moe_src_numel, sizeof(float)), LOOM_MEM_GRADS);
    }
}

/* The shared scratch. The MLP's buffers also stage, with 16-bit
 * activations, the attention's output (N, Cq) in the forward and its kept
 * qkv (N, 3 Cq) in the backward. */
static void alloc_activations(struct loom_decoder *m)
{
    const size_t C = (size_t)m->spec.hidden, Cq = (size_t)m->Cq, N = (size_t)m->B * m->T,
                 Nr = (size_t)loom_tp_rows_held(&m->rg, (int)N), F = (size_t)m->Fl, CC = C > Cq ? C : Cq;
    const int separate = !m->spec.fused_qkv, gated = m->spec.mlp == LOOM_MLP_GATED;
    m->slots = loom_alloc(sizeof *m->slots * (size_t)m->nslots, LOOM_MEM_OTHER);
    if (m->spec.experts) {
        const int Nk = (int)N * m->spec.topk,
                  cap = m->spec.pad_to_capacity ? loom_decoder_moe_capacity(&m->spec, (int)N) : 0;
        m->moe_rows = cap * m->spec.experts > Nk ? cap * m->spec.experts : Nk;
        /* a rank's experts take at most every rank's rows for them: each rank's at most moe_rows */
        m->moe_rows_ep = m->moe_rows * m->ep.ep;
    }
    /* under --layout-invariant with context parallelism also the gathered
     * and the whole rows' (exact_loss) */
    m->host_losses = loom_alloc(
        loom_mul_size((m->exact.block && m->ctx.cp > 1 ? 1 + 2 * (size_t)m->ctx.cp : 1) * N, sizeof(float)),
        LOOM_MEM_OTHER);
    if (drops(m)) {
        m->drop_rows_host = loom_alloc(loom_mul_size(Nr, sizeof(int64_t)), LOOM_MEM_OTHER);
        m->drop_rows = (int64_t *)act(m, 2 * Nr);
        if (m->drop_hidden > 0) m->drop_grad = act(m, Nr * C);
    }
    if (m->docs.reset_positions || m->ctx.cp > 1)
        m->host_positions = loom_alloc(loom_mul_size(N, sizeof(int32_t)), LOOM_MEM_OTHER);
    if (m->ctx.cp > 1) {
        const size_t W = (size_t)qkv_width(m), kv2 = 2 * (size_t)m->kvC, c = (size_t)m->ctx.c,
                     whole = (size_t)m->B * m->ctx.T;
        m->host_tokens = loom_alloc(loom_mul_size(2 * N, sizeof(int32_t)), LOOM_MEM_OTHER);
        if (m->cp_comm == LOOM_CP_COMM_A2A) {
            m->cp_send = act(m, N * W);
            m->cp_recv = act(m, N * W);
            m->cp_out = act(m, N * Cq);
            m->cp_dout = act(m, N * Cq);
            m->cp_dqkv = act(m, N * W);
        } else if (m->cp_comm == LOOM_CP_COMM_ALL_GATHER || exact_attention(m)) {
            m->cp_kv[0] = act(m, N * kv2);
            m->cp_recv = act(m, whole * kv2);
            if (!exact_attention(m)) {
                m->cp_whole = act(m, whole * kv2);
                m->cp_dwhole = act(m, whole * kv2);
                m->cp_tmp = act(m, (size_t)m->ctx.T * kv2);
            }
        } else {
            for (int i = 0; i < 2; i++) m->cp_kv[i] = act(m, N * kv2);
            for (int i = 0; i < 3; i++) m->cp_dkv[i] = act(m, N * kv2);
            m->cp_tmp = act(m, c * kv2);
            m->cp_o = act(m, c * Cq);
            m->cp_l = act(m, c * (size_t)m->NHl);
            m->cp_dq = act(m, c * W);
        }
    }
    if (exact_attention(m)) {
        const size_t kvw = 2 * (size_t)m->kvC / (size_t)(heads_parted(m) ? m->ctx.cp : 1),
                     Tw = (size_t)m->ctx.T, whole = (size_t)m->B * Tw;
        m->ex_kv = act(m, whole * kvw);
        m->ex_tmp = act(m, Tw * kvw);
        m->ex_dkv = (double *)act(m, 2 * whole * kvw);
    }
    if (m->exact.block && m->ctx.cp > 1) {
        const size_t whole = (size_t)m->B * m->ctx.T;
        m->ex_emb = act(m, whole * C);
        m->ex_emb_recv = act(m, whole * C);
        m->ex_tok = (int32_t *)act(m, 2 * whole);
        m->ex_tok_host = loom_alloc(loom_mul_size(4 * whole, sizeof(int32_t)), LOOM_MEM_OTHER);
    }
    for (int s = 0; s < m->nslots; s++) alloc_slot(m, &m->slots[s]);
    m->dres = act(m, Nr * C);
    if (m->rg.sp) {
        m->rg.gathered = act(m, N * C);
        m->rg.out_rows = act(m, Nr * C);
        m->rg.grad_rows = act(m, Nr * C);
        m->norm_parts = act(m, (m->exact.pieces ? 8 : 4) * C);
    }
    m->dbufC = act(m, N * CC);
    /* the linear layers' scratch (m->lc) holds a product's input gradient
     * of N rows (the experts' grouped products have their own, moe_dxs) */
    if (separate || gated) m->dbufC2 = act(m, N * CC);
    m->dqkv = act(m, N * 3 * Cq);
    if (m->unfused) m->datt = act(m, lp(m) ? att_numel_of(m, 1) : att_numel(m));
    if (separate) {
        m->q = act(m, N * Cq);
        m->kk = act(m, N * (size_t)m->kvC);
        m->v = act(m, N * (size_t)m->kvC);
    }
    m->dbufF[0] = act(m, N * (F > Cq ? F : Cq));
    m->dbufF[1] = act(m, N * max3(F, Cq, lp(m) ? 3 * Cq : 0));
    if (gated) m->dbufF[2] = act(m, N * F);
    m->scratchC = act(m, N * CC);
    if (m->spec.experts) { /* decoder_moe.c's scratch */
        const size_t E = (size_t)m->spec.experts, k = (size_t)m->spec.topk, Nk = N * k,
                     R = (size_t)m->moe_rows, Rx = (size_t)m->moe_rows_ep,
                     FF = Rx * (size_t)m->Fe > N * (size_t)m->Fs ? Rx * (size_t)m->Fe : N * (size_t)m->Fs;
        m->moe_xp = act(m, R * C);
        m->moe_dxp = act(m, R * C);
        m->moe_dy = act(m, R * C);
        if (m->ep.ep > 1) /* the exchanges' rows (decoder_moe.c) */
            m->moe_ep[0] = act(m, Rx * C), m->moe_ep[1] = act(m, Rx * C);
        if (m->spec.ep_allgather) {
            const size_t P = (size_t)m->ep.ep, rows = experts_by_source(m) ? Nk : N; /* slots, or rows */
            m->moe_gx = act(m, P * rows * C);
            m->moe_gout = act(m, P * rows * C);
            m->moe_gdp = act(m, P * Nk);
            if (experts_by_source(m)) {
                m->moe_slots = act(m, Nk * C);
                m->moe_spos = (int32_t *)act(m, Nk);
            }
            m->moe_all_host = loom_alloc(loom_mul_size(P * E, sizeof(int)), LOOM_MEM_OTHER);
            m->moe_gidx_host = loom_alloc(loom_mul_size(3 * P * Nk, sizeof(int32_t)), LOOM_MEM_OTHER);
            m->moe_gpos_host = m->moe_gidx_host + P * Nk;
            m->moe_lpos_host = m->moe_gpos_host + P * Nk;
        }
        for (int i = 0; i < 3; i++) m->moe_dF[i] = act(m, FF);
        if (gated) m->moe_dxs = act(m, Rx * C);
        if (experts_by_source(m)) { /* the largest run of experts a block holds, once a source */
            for (int b = 0; b < m->base.nblocks; b++) {
                const size_t x = m->base.blocks[b].expert_hi - m->base.blocks[b].expert_lo;
                m->moe_src_numel = x > m->moe_src_numel ? x : m->moe_src_numel;
            }
            m->moe_src_grads = act(m, (size_t)m->ep.ep * m->moe_src_numel);
            alloc_source_trees(m);
        }
        m->moe_dprobs = act(m, Nk);
        m->moe_dlogits = act(m, N * E);
        m->moe_out = act(m, N * C);
        m->moe_y = act(m, N * C);
        if (m->spec.shared_ffn && m->ep.ep > 1 && !m->spec.ep_allgather) m->moe_sdx = act(m, N * C);
        m->moe_sums = act(m, E);
        m->moe_aux_grad = act(m, E);
        m->moe_idx_host = loom_alloc(loom_mul_size(Nk, sizeof(int32_t)), LOOM_MEM_OTHER);
        m->moe_pos_host = loom_alloc(loom_mul_size(Nk, sizeof(int32_t)), LOOM_MEM_OTHER);
        m->moe_sums_host = loom_alloc(loom_mul_size(E, sizeof(float)), LOOM_MEM_OTHER);
        m->moe_lse_host = loom_alloc(loom_mul_size(N, sizeof(float)), LOOM_MEM_OTHER);
        m->moe_probs_host = loom_alloc(loom_mul_size(Nk, sizeof(float)), LOOM_MEM_OTHER);
        m->moe_keep_host = loom_alloc(loom_mul_size(Nk, sizeof(int32_t)), LOOM_MEM_OTHER);
        const int nmoe = loom_decoder_moe_count(&m->spec);
        /* each MoE layer's choices per expert, then its balancing loss's and z-loss's sums and forwards */
        m->moe_tokens = loom_alloc(loom_mul_size((size_t)nmoe * (E + 3), sizeof(double)), LOOM_MEM_OTHER);
        memset(m->moe_tokens, 0, sizeof(double) * (size_t)nmoe * (E + 3));
    }
    if ((m->docs.reset_positions || m->ctx.cp > 1) && m->spec.positions == LOOM_POSITION_LEARNED &&
        m->emb >= 0)
        m->pos_rows = act(m, N * C);
    if (m->tp > 1 || m->exact.pieces) m->ce_stats = act(m, 3 * N);
    if (m->exact.pieces) m->norm_grads = act(m, 2 * C);
    if (lp(m)) {
        m->stage_res = act(m, Nr * C);
        if (m->unfused) m->seq_att = act(m, att_numel_of(m, 1));
        if (m->head >= 0) m->head_rows = act(m, (size_t)LOOM_DECODER_HEAD_ROWS * m->Vl);
    }
    m->lc = (struct loom_linear_ctx){.k = m->k,
                                     .model = &m->base,
                                     .exact = &m->exact,
                                     .rg = &m->rg,
                                     .tp_rank = m->tp_rank,
                                     .orientation = m->spec.weights,
                                     .b16 = b16(m),
                                     .scratch = m->dbufC2};
    m->rg_moe = (struct loom_tp_regions){.tp = 1, .width = m->spec.hidden};
    m->lc_moe = m->lc;
    m->lc_moe.rg = &m->rg_moe;
    /* an MoE layer's products are one rank's (under --layout-invariant with
     * tensor parallelism the experts are whole, spec.experts_whole; with
     * expert parallelism a call a source rank, decoder_moe.c), so its sums
     * are the same calls in every layout, without the pieces */
    m->lc_moe.exact = &m->exact_off;
    if (m->spec.experts_whole) m->lc_moe.tp_rank = 0; /* whole on every rank: each adds the row biases */
}

static void free_activations(struct loom_decoder *m)
{
    if (!m->slots) return;
    for (int s = 0; s < m->nslots; s++) free_slot(m, &m->slots[s]);
    void *bufs[] = {
        m->dres,         m->dbufC,       m->dbufC2,      m->dqkv,         m->datt,       m->q,
        m->kk,           m->v,           m->dbufF[0],    m->dbufF[1],     m->dbufF[2],   m->scratchC,
        m->ce_stats,     m->rg.gathered, m->rg.out_rows, m->rg.grad_rows, m->norm_grads, m->stage_res,
        m->seq_att,      m->head_rows,   m->norm_parts,  m->pos_rows,     m->cp_send,    m->cp_recv,
        m->cp_out,       m->cp_dout,     m->cp_dqkv,     m->cp_kv[0],     m->cp_kv[1],   m->cp_dkv[0],
        m->cp_dkv[1],    m->cp_dkv[2],   m->cp_whole,    m->cp_dwhole,    m->cp_tmp,     m->cp_o,
        m->cp_l,         m->cp_dq,       m->moe_xp,      m->moe_dxp,      m->moe_dy,     m->moe_dF[0],
        m->moe_dF[1],    m->moe_dF[2],   m->moe_dprobs,  m->moe_dlogits,  m->moe_out,    m->moe_sums,
        m->moe_aux_grad, m->moe_y,       m->moe_ep[0],   m->moe_ep[1],    m->moe_gx,     m->moe_gout,
        m->moe_gdp,      m->drop_rows,   m->drop_grad,   m->moe_dxs,      m->moe_slots,  m->moe_src_grads,
        m->moe_sdx,      m->moe_spos,    m->ex_kv,       m->ex_tmp,       m->ex_dkv,     m->ex_emb,
        m->ex_emb_recv,  m->ex_tok};
    for (size_t i = 0; i < sizeof bufs / sizeof bufs[0]; i++) act_free(m, bufs[i]);
    void *host[] = {m->moe_idx_host,  m->moe_pos_host, m->moe_sums_host, m->moe_lse_host,  m->moe_probs_host,
                    m->moe_keep_host, m->moe_tokens,   m->moe_all_host,  m->moe_gidx_host, m->ex_tok_host};
    for (size_t i = 0; i < sizeof host / sizeof host[0]; i++) loom_free(host[i]);
    const size_t ntrees = m->moe_src_tree ? (size_t)loom_sum_tree_levels(m->spec.micros) *
                                                (size_t)loom_decoder_moe_count(&m->spec) * (size_t)m->ep.ep
                                          : 0;
    for (size_t i = 0; i < ntrees; i++) act_free(m, m->moe_src_tree[i]);
    loom_free(m->moe_src_tree);
    m->moe_src_tree = NULL;
    loom_free(m->slots);
    loom_free(m->host_losses);
    loom_free(m->host_positions);
    loom_free(m->host_tokens);
    loom_free(m->drop_rows_host);
    m->host_positions = m->host_tokens = NULL;
    m->drop_rows_host = m->drop_rows = NULL;
    m->drop_grad = NULL;
    m->slots = NULL;
}

/* ---- settings ---------------------------------------------------------------- */

/* --layout-invariant's row blocks: each whole sequence in 2N blocks where
 * they divide it and are long enough (tp_exact.h). */
static void exact_rows(struct loom_decoder *m)
{
    if (!m->exact.pieces) return;
    loom_tp_exact_set_rows(&m->exact, loom_tp_exact_block_rows(m->ctx.T, m->exact.pieces), m->ctx.cp,
                           m->ctx.rank);
}

void loom_decoder_set_tp_invariant(struct loom_decoder *m, int pieces)
{
    LOOM_ASSERT(m->slots == NULL && pieces > 0 && pieces % m->tp == 0 && m->spec.heads % pieces == 0 &&
                m->spec.kv_heads % pieces == 0 && m->spec.ffn % pieces == 0);
    loom_tp_exact_init(&m->exact, dev(m), pieces, m->tp, m->tp_rank);
    exact_rows(m);
}

void loom_decoder_set_unfused_attention(struct loom_decoder *m, int on)
{
    LOOM_ASSERT(m->slots == NULL); /* before the activations are sized */
    m->unfused = on;
}

void loom_decoder_set_documents(struct loom_decoder *m, const struct loom_decoder_documents *d)
{
    LOOM_ASSERT(m->slots == NULL && d->eod >= 0 && d->eod < m->spec.vocab);
    LOOM_ASSERT(!d->reset_mask || !m->unfused);
    m->docs = *d;
}

void loom_decoder_set_context(struct loom_decoder *m, int cp, int rank, enum loom_cp_comm_type comm)
{
    LOOM_ASSERT(m->slots == NULL && !m->unfused && m->ctx.cp == 1 && !m->rg.sp);
    if (comm == LOOM_CP_COMM_A2A) LOOM_ASSERT(m->NHl % cp == 0 && m->Gl % cp == 0);
    m->ctx = loom_cp_of(cp, rank, m->T);
    m->cp_comm = comm;
    m->T = m->ctx.Tl;
    exact_rows(m);
}

void loom_decoder_set_sequence_parallel(struct loom_decoder *m, int on)
{
    LOOM_ASSERT(m->slots == NULL && (!on || (m->tp > 1 && m->T % m->tp == 0)));
    m->rg.sp = on;
}

void loom_decoder_set_recompute(struct loom_decoder *m, enum loom_recompute granularity,
                                enum loom_recompute_method method, int num_layers)
{
    LOOM_ASSERT(m->slots == NULL); /* the activations are laid out for it at the first forward */
    LOOM_ASSERT(granularity >= 0 && granularity < LOOM_RECOMPUTE_COUNT);
    if (granularity == LOOM_RECOMPUTE_FULL) {
        LOOM_ASSERT(num_layers >= 1 && num_layers <= m->spec.num_layers);
        LOOM_ASSERT(method == LOOM_RECOMPUTE_BLOCK || method == LOOM_RECOMPUTE_UNIFORM);
    } else {
        LOOM_ASSERT(method == LOOM_RECOMPUTE_METHOD_NONE && num_layers == 0);
    }
    m->recompute = granularity;
    m->recompute_method = method;
    m->recompute_num_layers = num_layers;
}

void loom_decoder_set_act_dtype(struct loom_decoder *m, enum loom_dtype dt)
{
    LOOM_ASSERT(m->slots == NULL);
    m->act_dtype = dt;
    m->k = loom_backend_kernels(m->base.backend, dt);
}

int loom_decoder_set_sparse(struct loom_decoder *m, const struct loom_sparse_config *sc)
{
    LOOM_ASSERT(!m->slots && !m->sparse); /* before the activations are sized */
    return loom_model_sparse_layout(sc, m->spec.heads, m->ctx.T, &m->sparse); /* the whole sequence's */
}

/* fp8 products in every linear layer of a layer block, in block order. */
void loom_decoder_set_fp8(struct loom_decoder *m, const struct loom_fp8_recipe *r)
{
    const struct loom_decoder_slots *t = &m->t;
    int w[8], n = 0;
    for (int i = 0; i < t->nqkv; i++) w[n++] = t->qkv_w[i];
    w[n++] = t->o_w;
    if (t->gate_w >= 0) w[n++] = t->gate_w;
    w[n++] = t->up_w;
    w[n++] = t->down_w;
    m->base.fp8 = loom_fp8_create(r, &m->base, w, n);
}

void loom_decoder_set_dropout(struct loom_decoder *m, double hidden, double attention, double embedding)
{
    LOOM_ASSERT(m->slots == NULL && hidden >= 0 && hidden < 1 && attention >= 0 && attention < 1 &&
                embedding >= 0 && embedding < 1 && (attention == 0 || !m->unfused));
    m->drop_hidden = hidden, m->drop_attn = attention, m->drop_emb = embedding;
}

/* ---- dropout ------------------------------------------------------------------- */

/* The rows this rank holds of slot a's micro-batch as global ids, (sequence
 * of the step) Tw + position, uploaded for the running forward or backward. */
static void drop_rows_set(struct loom_decoder *m, const struct loom_decoder_acts *a)
{
    if (!drops(m) || a->drop_step <= 0) return;
    const int T = m->T, N = a->rows * T, Nr = loom_tp_rows_held(&m->rg, N),
              r0 = m->rg.sp ? m->tp_rank * Nr : 0;
    for (int i = 0; i < Nr; i++) {
        const int n = r0 + i, b = n / T, t = n % T, pos = m->ctx.cp > 1 ? loom_cp_position(&m->ctx, t) : t;
        m->drop_rows_host[i] = ((int64_t)a->drop_first + b) * m->ctx.T + pos;
    }
    dev(m)->upload(m->drop_rows, m->drop_rows_host, (size_t)Nr * sizeof(int64_t));
}

/* The mask of a site of layer l (-1: the embedding) with p, into *d, or
 * NULL where nothing is dropped (p 0, or not a training step). */
static const struct loom_dropout *drop_site(const struct loom_decoder_acts *a, double p, int l,
                                            enum loom_dropout_site site, struct loom_dropout *d)
{
    if (p <= 0 || a->drop_step <= 0) return NULL;
    *d = loom_dropout_of(p, a->drop_seed, a->drop_step, l, site);
    return d;
}

/* x (the Nr rows this rank holds, of C) times a site's mask: the forward
 * on an output, or its backward on the output's gradient. */
static void drop_rows(struct loom_decoder *m, const struct loom_decoder_acts *a, float *x, double p, int l,
                      enum loom_dropout_site site)
{
    struct loom_dropout d;
    if (!drop_site(a, p, l, site, &d)) return;
    const int C = m->spec.hidden, Nr = loom_tp_rows_held(&m->rg, a->rows * m->T);
    m->k->dropout_rows(x, (size_t)C, m->drop_rows, Nr, C, &d);
}

/* The gradient at a dropped output, from the residual's (dres): dres itself
 * without dropout, else its masked copy. */
static const float *drop_grad(struct loom_decoder *m, const struct loom_decoder_acts *a, int l,
                              enum loom_dropout_site site)
{
    if (m->drop_hidden <= 0 || a->drop_step <= 0) return m->dres;
    const size_t NrC = (size_t)loom_tp_rows_held(&m->rg, a->rows * m->T) * m->spec.hidden;
    dev(m)->copy(m->drop_grad, m->dres, NrC * sizeof(float));
    drop_rows(m, a, m->drop_grad, m->drop_hidden, l, site);
    return m->drop_grad;
}

/* Attention's probabilities' mask for layer l's kernel calls (NULL: none). */
static void drop_attention(struct loom_decoder *m, const struct loom_decoder_acts *a, int l)
{
    m->attn_drop = drop_site(a, m->drop_attn, l, LOOM_DROPOUT_ATTENTION, &m->attn_drop_site);
}

/* ---- the loom_model interface ------------------------------------------------ */

static void forward(struct loom_model *model, int first, int last, struct loom_micro *mb);
static void backward(struct loom_model *model, int first, int last, struct loom_micro *mb, float loss_weight);

static void set_slots(struct loom_model *model, int n)
{
    struct loom_decoder *m = model->user;
    LOOM_ASSERT(m->slots == NULL && n >= 1);
    m->nslots = n;
}

static void reserve(struct loom_model *model)
{
    struct loom_decoder *m = model->user;
    if (!m->slots) alloc_activations(m);
    /* the 16-bit head's own staging, taken and given back within a pass */
    if (lp(m) && m->head >= 0 && m->k->lm_head_lp_scratch)
        act_free(m, dev(m)->alloc(m->k->lm_head_lp_scratch(m->B * m->T, m->Vl), LOOM_MEM_ACTIVATIONS));
    const size_t N = (size_t)m->B * m->T, C = (size_t)m->spec.hidden, F = (size_t)m->Fl, Cq = (size_t)m->Cq;
    /* fp8's quantised operands (and their float32 copies without bf16
     * products), for the largest linear layer (rows: a region's, all of B*T) */
    if (m->base.fp8) {
        const size_t widest = max3(F, C, Cq);
        loom_fp8_reserve(m->base.fp8, N * widest, C * widest, N * widest,
                         m->spec.weights == LOOM_WEIGHTS_OUT_IN || !m->k->matmul_forward_b16);
    }
    if (m->exact.pieces) { /* --layout-invariant's scratch: the products and the head */
        const int Ni = (int)N, Ci = (int)C, in16 = b16(m) && !m->rg.sp, gated = m->spec.mlp == LOOM_MLP_GATED;
        const int qkv[3] = {m->Cq, m->spec.fused_qkv ? m->Cq : m->kvC, m->spec.fused_qkv ? m->Cq : m->kvC},
                  mlp[2] = {m->Fl, m->Fl};
        int layers = 0;
        for (int l = 0; l < m->spec.num_layers; l++) layers += m->stage.block[l] >= 0;
        if (layers) {
            loom_tp_exact_reserve_column(&m->exact, &m->rg, qkv, 3, in16, m->spec.qkv_bias, Ni, Ci);
            loom_tp_exact_reserve_column(&m->exact, &m->rg, mlp, gated ? 2 : 1, in16, m->spec.mlp_bias, Ni,
                                         Ci);
            loom_tp_exact_reserve_row(&m->exact, &m->rg, m->spec.weights, Ni, m->Cq, Ci);
            loom_tp_exact_reserve_row(&m->exact, &m->rg, m->spec.weights, Ni, m->Fl, Ci);
        }
        if (m->head >= 0) loom_tp_exact_reserve_head(&m->exact, &m->rg, m->act_dtype, Ni, Ci, m->spec.vocab);
    }
}

static size_t boundary_numel(const struct loom_model *model, int rows)
{
    const struct loom_decoder *m = model->user;
    return (size_t)loom_tp_rows_held(&m->rg, rows * m->T) * m->spec.hidden;
}

/* The tied table (the token embedding, also the LM head), offered to the
 * strategies: ZeRO-3 keeps its unit gathered for the step, DDP may reduce
 * the head's share early and scatter the lookup's itself. */
static int tied_embedding(struct loom_model *model, struct loom_tied_embedding *te)
{
    struct loom_decoder *m = model->user;
    const struct loom_decoder_acts *a = m->slots ? &m->slots[m->bwd_slot] : NULL;
    if (m->spec.untied || m->emb < 0 || m->head < 0) return 0; /* the head has its own weight, or a copy */
    *te = (struct loom_tied_embedding){.block = m->emb,
                                       .vocab = m->Vl,
                                       .width = m->spec.hidden,
                                       .max_rows = (size_t)m->B * m->T,
                                       .rows = a ? (size_t)a->rows * m->T : 0,
                                       .tokens = a ? a->inputs : NULL,
                                       .dout = m->dres,
                                       .defer = &m->defer_wte_scatter};
    return 1;
}

/* The tied table's ends across stages (loom/model.h): its exchange is the
 * pipeline's embedding-group strategy's. */
static int tied_stages(struct loom_model *model, struct loom_tied_stages *t)
{
    struct loom_decoder *m = model->user;
    if (!tied_across_stages(m)) return 0;
    *t = (struct loom_tied_stages){.block = m->head >= 0 ? m->head : m->emb,
                                   .holds_head = m->head >= 0,
                                   .copy = m->tied_copy,
                                   .grad = m->tied_grad,
                                   .n = (size_t)m->Vl * m->spec.hidden};
    return 1;
}

static int partial_grads(struct loom_model *model, const struct loom_partial_grad **out);

static const float *logits(struct loom_model *model)
{
    struct loom_decoder *m = model->user;
    LOOM_ASSERT(m->tp == 1 && !lp(m)); /* a tp rank holds its vocabulary's columns only; kept as float32 */
    return m->slots ? m->slots[0].logits : NULL;
}

void loom_decoder_logits(const struct loom_decoder *m, float *dst)
{
    const struct loom_decoder_acts *a = &m->slots[0];
    const size_t n = (size_t)a->rows * m->T * m->Vl;
    if (!lp(m)) {
        dev(m)->download(dst, a->logits, n * sizeof(float));
        return;
    }
    float *f32 = act(m, n);
    get(m, f32, a->logits, n);
    dev(m)->download(dst, f32, n * sizeof(float));
    act_free(m, f32);
}

static const struct loom_model_ops decoder_ops = {.forward = forward,
                                                  .backward = backward,
                                                  .set_slots = set_slots,
                                                  .boundary_numel = boundary_numel,
                                                  .tied_embedding = tied_embedding,
                                                  .tied_stages = tied_stages,
                                                  .partial_grads = partial_grads,
                                                  .logits = logits,
                                                  .reserve = reserve};

struct loom_decoder *loom_decoder_of(struct loom_model *m)
{
    return m && m->ops == &decoder_ops ? m->user : NULL;
}

struct loom_decoder *loom_decoder_create(const struct loom_decoder_spec *s, int B, int T, int tp, int tp_rank,
                                         int chunks, const int *lo, const int *hi, int embedding, int head)
{
    const int hs = s->head_dim ? s->head_dim : s->hidden / s->heads;
    LOOM_ASSERT(tp >= 1 && tp_rank >= 0 && tp_rank < tp && s->heads % tp == 0 && s->kv_heads % tp == 0 &&
                s->ffn % tp == 0 && s->heads % s->kv_heads == 0);
    LOOM_ASSERT(!s->fused_qkv || (s->kv_heads == s->heads && s->positions != LOOM_POSITION_ROPE));
    LOOM_ASSERT(s->mlp == LOOM_MLP_GATED ? s->activation != LOOM_MLP_GELU : s->activation != LOOM_MLP_SILU);
    struct loom_decoder *m = loom_alloc(sizeof *m, LOOM_MEM_OTHER);
    m->spec = *s;
    m->B = B;
    m->T = T;
    m->ctx = loom_cp_of(1, 0, T);
    m->ep = loom_ep_of(s->experts ? s->experts : 1, s->ep > 1 ? s->ep : 1, s->ep > 1 ? s->ep_rank : 0);
    m->hs = hs;
    m->tp = tp;
    m->tp_rank = tp_rank;
    m->rg = (struct loom_tp_regions){.tp = tp, .width = s->hidden};
    m->NHl = s->heads / tp;
    m->Gl = s->kv_heads / tp;
    m->Cq = m->NHl * hs;
    m->kvC = m->Gl * hs;
    m->Fl = s->ffn / tp;
    m->Fe = s->experts_whole ? s->moe_ffn : s->moe_ffn / tp;
    m->Fs = s->experts_whole ? s->shared_ffn : s->shared_ffn / tp;
    int64_t v0, v1;
    loom_tp_part(s->vocab, tp, tp_rank, &v0, &v1);
    m->v0 = (int)v0;
    m->Vl = (int)(v1 - v0);
    m->act_dtype = LOOM_DTYPE_F32;
    m->recompute = LOOM_RECOMPUTE_NONE;
    m->recompute_method = LOOM_RECOMPUTE_METHOD_NONE;
    m->nslots = 1;
    loom_pp_stage_layers_init(&m->stage, s->num_layers, chunks, lo, hi, embedding, head);
    loom_model_init(&m->base, &decoder_ops, s->name, m->stage.nblocks);
    m->base.tp = tp;
    m->base.tp_rank = tp_rank;
    m->base.user = m;
    m->base.family = s->family;
    m->k = m->base.backend->k;
    m->pipelined = !(embedding && head); /* a pipeline stage's blocks */
    layout_blocks(m, embedding, head);
    loom_model_layout_done(&m->base);
    m->emb = loom_model_find_role(&m->base, LOOM_ROLE_EMBEDDING);
    m->head = loom_model_find_role(&m->base, LOOM_ROLE_HEAD);
    if (s->norm_offset != 0) m->norm_w = dev(m)->alloc(sizeof(float) * (size_t)s->hidden, LOOM_MEM_OTHER);
    if (tied_across_stages(m))
        loom_pp_tied_alloc(dev(m), &m->tied_copy, &m->tied_grad, (size_t)m->Vl * s->hidden, m->head >= 0);
    return m;
}

void loom_decoder_free(struct loom_decoder *m)
{
    if (!m) return;
    loom_model_release(&m->base);
    free_activations(m);
    loom_pp_stage_layers_free(&m->stage);
    loom_pp_tied_free(dev(m), m->tied_copy, m->tied_grad);
    loom_fp8_destroy(m->base.fp8);
    loom_model_sparse_layout_free(m->sparse);
    loom_tp_exact_free(&m->exact);
    if (m->norm_w) dev(m)->free(m->norm_w);
    loom_free(m);
}

struct loom_decoder *loom_decoder_create_whole(const struct loom_decoder_spec *s, int B, int T)
{
    const int lo = 0, hi = s->num_layers - 1;
    struct loom_decoder_spec whole = *s; /* every expert too */
    whole.ep = whole.ep_rank = whole.ep_allgather = whole.experts_whole = 0;
    return loom_decoder_create(&whole, B, T, 1, 0, 1, &lo, &hi, 1, 1);
}

/* ---- norms ------------------------------------------------------------------ */

/* The norm of tensors (w, bias) of block b over Nr rows: LayerNorm (mean
 * and rstd saved) or RMSNorm (rstd). */
/* The weight a norm multiplies by: tensor w, or norm_offset + w (in m->norm_w). */
static const float *norm_weight(const struct loom_decoder *m, struct loom_block *b, int w)
{
    const float *x = loom_param(b, w);
    if (m->spec.norm_offset == 0) return x;
    const float off = (float)m->spec.norm_offset;
    m->k->add_scalar(m->norm_w, x, (size_t)m->spec.hidden, off);
    return m->norm_w;
}

static void norm_forward(const struct loom_decoder *m, float *out, float *mean, float *rstd, const float *inp,
                         struct loom_block *b, int w, int bias, int Nr)
{
    const int C = m->spec.hidden;
    const float eps = (float)m->spec.norm_eps, *weight = norm_weight(m, b, w);
    if (m->spec.norm == LOOM_NORM_LAYERNORM)
        m->k->layernorm_forward(out, mean, rstd, inp, weight, loom_param(b, bias), Nr, C, eps);
    else
        m->k->rmsnorm_forward(out, rstd, inp, weight, Nr, C, eps);
}

/* One norm kernel's backward into dinp (accumulated) and g (its parameter
 * gradients: C, or LayerNorm's 2C: weight then bias). */
static void norm_kernel_backward(const struct loom_decoder *m, float *dinp, float *gw, float *gb,
                                 const float *dout, const float *inp, const float *weight, const float *mean,
                                 const float *rstd, int rows)
{
    const int C = m->spec.hidden;
    if (m->spec.norm == LOOM_NORM_LAYERNORM)
        m->k->layernorm_backward(dinp, gw, gb, dout, inp, weight, mean, rstd, rows, C);
    else
        m->k->rmsnorm_backward(dinp, gw, dout, inp, weight, rstd, rows, C);
}

/* A part of a norm's gradient (n entries of dtype at part) for grad, summed
 * over the tp group by its strategy (loom/model.h's partial_grads). */
static void add_partial(struct loom_decoder *m, void *part, enum loom_dtype dtype, float *grad, size_t n)
{
    LOOM_ASSERT(m->npartials < (int)(sizeof m->partials / sizeof m->partials[0]));
    m->partials[m->npartials++] =
        (struct loom_partial_grad){.part = part, .dtype = dtype, .grad = grad, .n = n};
}

/* The 2C floats (or doubles) of the block's next norm's parts. */
static void *next_parts(struct loom_decoder *m, size_t elem)
{
    LOOM_ASSERT(m->nnorms < 2);
    return (char *)m->norm_parts + (size_t)m->nnorms++ * 2 * m->spec.hidden * elem;
}

/* A norm's backward over the rows this rank holds; under sequence
 * parallelism its parameter gradients are partial sums over those rows,
 * summed over the tp group by their strategy before they accumulate
 * (add_partial); under --layout-invariant they are taken in the row pieces
 * and summed exactly. */
static void norm_backward(struct loom_decoder *m, float *dinp, struct loom_block *b, int w, int bias,
                          const float *dout, const float *inp, const float *mean, const float *rstd, int Nr)
{
    const int C = m->spec.hidden, nw = bias >= 0 ? 2 * C : C;
    const float *weight = norm_weight(m, b, w); /* the gradient of w is that of norm_offset + w */
    float *dweight = loom_grad(b, w), *dbias = bias >= 0 ? loom_grad(b, bias) : NULL;
    if (m->exact.pieces) {
        const int N = m->rg.sp ? Nr * m->tp : Nr;
        float *g = m->norm_grads;
        double *acc = m->rg.sp ? next_parts(m, sizeof(double)) : loom_tp_exact_sum(&m->exact, (size_t)nw);
        if (m->rg.sp) dev(m)->memset(acc, 0, (size_t)nw * sizeof *acc);
        for (int j = 0; j < loom_tp_exact_row_pieces(&m->exact, &m->rg, N); j++) {
            int lo, hi;
            loom_tp_exact_row_piece(&m->exact, &m->rg, N, j, &lo, &hi);
            const size_t at0 = (size_t)lo * C;
            dev(m)->memset(g, 0, (size_t)nw * sizeof *g);
            norm_kernel_backward(m, dinp + at0, g, g + C, dout + at0, inp + at0, weight,
                                 mean ? mean + lo : NULL, rstd + lo, hi - lo);
            loom_tp_exact_add(&m->exact, acc, g, (size_t)nw);
        }
        loom_tp_exact_rows_cp(&m->exact, acc, (size_t)nw);
        if (m->rg.sp) {
            add_partial(m, acc, LOOM_DTYPE_F64, dweight, (size_t)C);
            if (dbias) add_partial(m, acc + C, LOOM_DTYPE_F64, dbias, (size_t)C);
            return;
        }
        loom_tp_exact_add_rounded(&m->exact, dweight, acc, (size_t)C);
        if (dbias) loom_tp_exact_add_rounded(&m->exact, dbias, acc + C, (size_t)C);
        return;
    }
    if (!m->rg.sp) {
        norm_kernel_backward(m, dinp, dweight, dbias, dout, inp, weight, mean, rstd, Nr);
        return;
    }
    float *g = next_parts(m, sizeof(float));
    dev(m)->memset(g, 0, (size_t)nw * sizeof *g);
    norm_kernel_backward(m, dinp, g, g + C, dout, inp, weight, mean, rstd, Nr);
    add_partial(m, g, LOOM_DTYPE_F32, dweight, (size_t)C);
    if (dbias) add_partial(m, g + C, LOOM_DTYPE_F32, dbias, (size_t)C);
}

static int partial_grads(struct loom_model *model, const struct loom_partial_grad **out)
{
    struct loom_decoder *m = model->user;
    const int n = m->npartials;
    *out = m->partials;
    m->npartials = m->nnorms = 0;
    return n;
}

/* ---- products ----------------------------------------------------------------- */

static struct loom_linear linear(struct loom_block *b, int w, int bias, int in, int out)
{
    return (struct loom_linear){.b = b, .w = w, .bias = bias, .in = in, .out = out};
}

/* The attention's input projections: one fused q | k | v, or q, k and v. */
static struct loom_linear_group qkv_group(const struct loom_decoder *m, struct loom_block *b)
{
    const struct loom_decoder_slots *t = &m->t;
    const int C = m->spec.hidden;
    struct loom_linear_group g = {.n = 3, .fused = m->spec.fused_qkv};
    if (g.fused) {
        g.lin[0] = linear(b, t->qkv_w[0], t->qkv_b[0], C, 3 * m->Cq);
        return g;
    }
    const int outs[3] = {m->Cq, m->kvC, m->kvC};
    for (int i = 0; i < 3; i++) g.lin[i] = linear(b, t->qkv_w[i], t->qkv_b[i], C, outs[i]);
    return g;
}

/* The MLP's input projections: fc, or gate and up. */
static struct loom_linear_group mlp_group(const struct loom_decoder *m, struct loom_block *b)
{
    const struct loom_decoder_slots *t = &m->t;
    const int C = m->spec.hidden;
    struct loom_linear_group g = {.n = 0, .fused = 0};
    if (t->gate_w >= 0) g.lin[g.n++] = linear(b, t->gate_w, t->gate_b, C, m->Fl);
    g.lin[g.n++] = linear(b, t->up_w, t->up_b, C, m->Fl);
    return g;
}

/* The MLP's activation on its input projections' outputs (n values). */
void loom_decoder_mlp_act_forward(const struct loom_decoder *m, float *h, const float *fc, const float *up,
                                  size_t n)
{
    if (m->spec.mlp == LOOM_MLP_GATED && m->spec.activation == LOOM_MLP_SILU)
        m->k->swiglu_forward(h, fc, up, n);
    else if (m->spec.mlp == LOOM_MLP_GATED)
        m->k->geglu_forward(h, fc, up, n);
    else if (m->spec.activation == LOOM_MLP_GELU)
        m->k->gelu_exact_forward(h, fc, n);
    else
        m->k->gelu_forward(h, fc, n);
}

/* ---- layers ------------------------------------------------------------------ */

/* Layer l's forward over B rows, from its input (the rows this rank holds,
 * of B*T) into a->layers[l] (the recompute scratch for a recomputed layer).
 * The backward reruns it to recompute, so nothing here may depend on when
 * it runs. With 16-bit activations the float32 values are staged in the
 * backward's scratch (the comments name it), each buffer reused once what
 * it held is read. */
static void layer_forward(struct loom_decoder *m, struct loom_decoder_acts *a, int l, int B)
{
    const int T = m->T, C = m->spec.hidden, Cq = m->Cq, N = B * T, Nr = loom_tp_rows_held(&m->rg, N);
    const size_t NrC = (size_t)Nr * C, NCq = (size_t)N * Cq, NF = (size_t)N * m->Fl, NK = (size_t)N * m->kvC;
    const struct loom_decoder_slots *t = &m->t;
    struct loom_block *b = &m->base.blocks[m->stage.block[l]];
    struct loom_decoder_layer_acts *x = &a->layers[l];
    const float *res = layer_input(m, a, l, m->dbufC, NrC);
    float *ln1 = out_of(m, x->ln1, m->scratchC);
    norm_forward(m, ln1, x->ln1_mean, x->ln1_rstd, res, b, t->norm1_w, t->norm1_b, Nr);
    keep(m, x->ln1, ln1, NrC);
    /* column-parallel q, k, v (this rank's heads and key/value groups), attention, row-parallel output */
    const struct loom_linear_group gqkv = qkv_group(m, b);
    float *qkv = out_of(m, x->qkv, m->dqkv);
    const float *in = loom_tp_region_input(&m->rg, ln1, N);
    if (gqkv.fused) {
        loom_linear_column_forward(&m->lc, &gqkv, &qkv, in, kept16(m, x->ln1, 1), N);
    } else {
        float *const y[3] = {m->q, m->kk, m->v};
        loom_linear_column_forward(&m->lc, &gqkv, y, in, kept16(m, x->ln1, 1), N);
        if (m->spec.positions == LOOM_POSITION_ROPE) {
            loom_decoder_rope(m, a, m->q, B, m->NHl, 1);
            loom_decoder_rope(m, a, m->kk, B, m->Gl, 1);
        }
        round_act(m, m->q, NCq);
        round_act(m, m->kk, NK);
        round_act(m, m->v, NK);
        loom_decoder_pack_qkv(m, qkv, m->q, m->kk, m->v, N);
    }
    loom_decoder_heads_in(m, qkv, B);
    keep(m, x->qkv, qkv, (size_t)N * qkv_width(m));
    float *atty = out_of(m, x->atty, m->dbufF[0]);
    drop_attention(m, a, l);
    loom_decoder_attention_forward(m, a, atty, x, qkv, B);
    keep(m, x->atty, atty, NCq);
    const struct loom_linear o = linear(b, t->o_w, t->o_b, Cq, C);
    float *proj = loom_linear_row_forward(&m->lc, &o, atty, kept16(m, x->atty, 0), m->scratchC, N);
    round_act(m, proj, NrC);
    drop_rows(m, a, proj, m->drop_hidden, l, LOOM_DROPOUT_ATTN_OUT);
    float *res2 = out_of(m, x->res2, m->stage_res);
    m->k->residual_forward(res2, res, proj, NrC);
    keep(m, x->res2, res2, NrC);
    float *ln2 = out_of(m, x->ln2, m->scratchC);
    norm_forward(m, ln2, x->ln2_mean, x->ln2_rstd, res2, b, t->norm2_w, t->norm2_b, Nr);
    keep(m, x->ln2, ln2, NrC);
    if (loom_decoder_moe_layer(&m->spec, l)) { /* a region of its own: every row in, partial sums out */
        loom_decoder_moe_forward(m, x, b, loom_tp_region_input(&m->rg, ln2, N), m->moe_y, N, l, a->moe_hf);
        float *y = m->spec.experts_whole
                       ? loom_tp_region_rows(&m->rg, m->moe_y, N, m->tp_rank) /* whole sums */
                       : loom_tp_region_output(&m->rg, m->moe_y, N);
        round_act(m, y, NrC);
        drop_rows(m, a, y, m->drop_hidden, l, LOOM_DROPOUT_MLP_OUT);
        float *res3 = out_of(m, x->res3, m->dbufC);
        m->k->residual_forward(res3, res2, y, NrC);
        keep(m, x->res3, res3, NrC);
        return;
    }
    /* column-parallel fc (or gate and up), the activation on this rank's columns, row-parallel down */
    const struct loom_linear_group gmlp = mlp_group(m, b);
    float *fc = out_of(m, x->fc, m->dbufF[0]), *up = x->up ? out_of(m, x->up, m->dbufF[1]) : NULL;
    float *const y[2] = {fc, up};
    loom_linear_column_forward(&m->lc, &gmlp, y, loom_tp_region_input(&m->rg, ln2, N), kept16(m, x->ln2, 1),
                               N);
    keep(m, x->fc, fc, NF);
    if (up) keep(m, x->up, up, NF);
    float *h = out_of(m, x->h, m->dbufF[up ? 2 : 1]);
    loom_decoder_mlp_act_forward(m, h, fc, up, NF);
    keep(m, x->h, h, NF);
    const struct loom_linear down = linear(b, t->down_w, t->down_b, m->Fl, C);
    proj = loom_linear_row_forward(&m->lc, &down, h, kept16(m, x->h, 0), m->scratchC, N);
    round_act(m, proj, NrC);
    drop_rows(m, a, proj, m->drop_hidden, l, LOOM_DROPOUT_MLP_OUT);
    float *res3 = out_of(m, x->res3, m->dbufC);
    m->k->residual_forward(res3, res2, proj, NrC);
    keep(m, x->res3, res3, NrC);
}

/* A dense MLP's backward from dout (every row of the region): its
 * parameters' gradients accumulate; the gradient at its input (the rows
 * this rank holds) is returned (in m->dbufC). */
static float *mlp_backward(struct loom_decoder *m, struct loom_decoder_layer_acts *x, struct loom_block *b,
                           const float *dout, int N)
{
    const int C = m->spec.hidden, Nr = loom_tp_rows_held(&m->rg, N);
    const size_t NrC = (size_t)Nr * C, NF = (size_t)N * m->Fl;
    const struct loom_decoder_slots *t = &m->t;
    float *const *F = m->dbufF;
    const struct loom_linear down = linear(b, t->down_w, t->down_b, m->Fl, C);
    const uint16_t *x16 = kept16(m, x->h, 0);
    loom_linear_row_backward(&m->lc, &down, F[0], dout, x16 ? NULL : view(m, x->h, F[1], NF), x16, N);
    round_act(m, F[0], NF);
    const struct loom_linear_group gmlp = mlp_group(m, b);
    float *dy[3];
    if (x->up) {
        /* the gate's and up's gradients over their staged values (elementwise: each read before written) */
        const float *gate = view(m, x->fc, F[1], NF), *up = view(m, x->up, F[2], NF);
        if (m->spec.activation == LOOM_MLP_SILU)
            m->k->swiglu_backward(F[1], F[2], F[0], gate, up, NF);
        else
            m->k->geglu_backward(F[1], F[2], F[0], gate, up, NF);
        round_act(m, F[1], NF);
        round_act(m, F[2], NF);
        dy[0] = F[1];
        dy[1] = F[2];
    } else {
        /* GELU's gradient into F[1], or over its output gradient in place
         * when F[1] stages fc (an elementwise kernel may) */
        const float *fc = view(m, x->fc, F[1], NF);
        float *dfc = lp(m) ? F[0] : F[1];
        if (m->spec.activation == LOOM_MLP_GELU)
            m->k->gelu_exact_backward(dfc, F[0], fc, NF);
        else
            m->k->gelu_backward(dfc, F[0], fc, NF);
        round_act(m, dfc, NF);
        dy[0] = dfc;
    }
    x16 = kept16(m, x->ln2, 1);
    float *dln = loom_linear_column_backward(
        &m->lc, &gmlp, dy, x16 ? NULL : loom_tp_region_input(&m->rg, view(m, x->ln2, m->scratchC, NrC), N),
        x16, m->dbufC, N);
    round_act(m, dln, NrC);
    return dln;
}

/* Layer l's backward over B rows: m->dres holds the gradient at its output
 * (the rows this rank holds) and receives the gradient at its input; its
 * parameter gradients accumulate. With 16-bit activations the kept ones are
 * viewed through staging (named below) that the gradients leave free. */
static void layer_backward(struct loom_decoder *m, struct loom_decoder_acts *a, int l, int B)
{
    const int T = m->T, C = m->spec.hidden, Cq = m->Cq, N = B * T, Nr = loom_tp_rows_held(&m->rg, N);
    const size_t NrC = (size_t)Nr * C, NCq = (size_t)N * Cq, NK = (size_t)N * m->kvC;
    const struct loom_decoder_slots *t = &m->t;
    struct loom_block *b = &m->base.blocks[m->stage.block[l]];
    struct loom_decoder_layer_acts *x = &a->layers[l];
    float *const *F = m->dbufF;
    /* MLP: res3 = res2 + down(act(m, fc(ln2(res2)))); the replicated bias's
     * gradient sums every row of dout, so it is the same on every tp rank */
    const float *dout = loom_tp_region_output_grad(&m->rg, drop_grad(m, a, l, LOOM_DROPOUT_MLP_OUT), N);
    float *dln;
    if (loom_decoder_moe_layer(&m->spec, l)) {
        if (m->rg.sp) { /* the gathered gradient moves aside: the gathered input takes its place */
            dev(m)->copy(m->moe_y, dout, sizeof(float) * (size_t)N * C);
            dout = m->moe_y;
        }
        const float *in = loom_tp_region_input(&m->rg, view(m, x->ln2, m->scratchC, NrC), N);
        loom_decoder_moe_backward(m, x, b, in, dout, m->dbufC, N, l);
        dln = m->spec.experts_whole
                  ? loom_tp_region_rows(&m->rg, m->dbufC, N, m->tp_rank) /* the whole gradient */
                  : loom_tp_region_input_grad(&m->rg, m->dbufC, N);
        round_act(m, dln, NrC);
    } else {
        dln = mlp_backward(m, x, b, dout, N);
    }
    norm_backward(m, m->dres, b, t->norm2_w, t->norm2_b, dln, view(m, x->res2, m->stage_res, NrC),
                  x->ln2_mean, x->ln2_rstd, Nr);
    round_act(m, m->dres, NrC);
    /* attention: res2 = res + o(attn(qkv(ln1(res)))) */
    dout = loom_tp_region_output_grad(&m->rg, drop_grad(m, a, l, LOOM_DROPOUT_ATTN_OUT), N);
    const struct loom_linear o = linear(b, t->o_w, t->o_b, Cq, C);
    const uint16_t *x16 = kept16(m, x->atty, 0);
    loom_linear_row_backward(&m->lc, &o, m->dbufC, dout, x16 ? NULL : view(m, x->atty, F[0], NCq), x16, N);
    round_act(m, m->dbufC, NCq);
    drop_attention(m, a, l);
    loom_decoder_attention_backward(m, a, x, view(m, x->qkv, F[1], (size_t)N * qkv_width(m)), B);
    const struct loom_linear_group gqkv = qkv_group(m, b);
    float *dy[3];
    if (gqkv.fused) {
        round_act(m, m->dqkv, 3 * NCq);
        dy[0] = m->dqkv;
    } else {
        loom_decoder_unpack_dqkv(m, m->q, m->kk, m->v, m->dqkv, N);
        if (m->spec.positions == LOOM_POSITION_ROPE) {
            loom_decoder_rope(m, a, m->q, B, m->NHl, 0);
            loom_decoder_rope(m, a, m->kk, B, m->Gl, 0);
        }
        round_act(m, m->q, NCq);
        round_act(m, m->kk, NK);
        round_act(m, m->v, NK);
        dy[0] = m->q;
        dy[1] = m->kk;
        dy[2] = m->v;
    }
    x16 = kept16(m, x->ln1, 1);
    dln = loom_linear_column_backward(
        &m->lc, &gqkv, dy, x16 ? NULL : loom_tp_region_input(&m->rg, view(m, x->ln1, m->scratchC, NrC), N),
        x16, m->dbufC, N);
    round_act(m, dln, NrC);
    norm_backward(m, m->dres, b, t->norm1_w, t->norm1_b, dln, layer_input(m, a, l, m->stage_res, NrC),
                  x->ln1_mean, x->ln1_rstd, Nr);
    round_act(m, m->dres, NrC);
}

/* The layers [l0, l1] a block range [first, last] covers (l1 < l0: none). */
static void layers_of(const struct loom_decoder *m, int first, int last, int *l0, int *l1)
{
    /* no layer: [0, -1] before them (the embedding alone), [L, L-1] after (the head alone) */
    *l0 = last == m->head && first == m->head ? m->spec.num_layers : 0;
    *l1 = *l0 - 1;
    int seen = 0;
    for (int b = first; b <= last; b++) {
        const struct loom_block *blk = &m->base.blocks[b];
        if (blk->role != LOOM_ROLE_LAYER) continue;
        if (!seen) *l0 = blk->layer;
        LOOM_ASSERT(!seen || blk->layer == *l1 + 1); /* consecutive layers: one pipeline chunk */
        *l1 = blk->layer;
        seen = 1;
    }
}

/* ---- the head ---------------------------------------------------------------- */

/* Rows of logits the head computes at a time: all N, or with 16-bit
 * activations LOOM_DECODER_HEAD_ROWS through float32 staging. */
static int head_rows(const struct loom_decoder *m, int N)
{
    return lp(m) && N > LOOM_DECODER_HEAD_ROWS ? LOOM_DECODER_HEAD_ROWS : N;
}

/* Logits rows [r0, r0 + n) as float32: in place, or converted into
 * m->head_rows (n <= head_rows). */
static float *logits_rows(struct loom_decoder *m, struct loom_decoder_acts *a, int r0, int n)
{
    const size_t at0 = (size_t)r0 * m->Vl;
    if (!lp(m)) return (float *)a->logits + at0;
    const size_t nV = (size_t)n * m->Vl;
    dev(m)->convert(loom_buf_f32(m->head_rows, nV), loom_buf_of(at(m, a->logits, at0), nV, m->act_dtype));
    return m->head_rows;
}

/* The loss of every row from this rank's logits (N, Vl) of vocabulary rows
 * [v0, v0 + Vl), never gathering the whole vocabulary: the row max, then the
 * sum of exponentials and the target's logit, each reduced over the tp
 * group; lse = max + log(sum), loss = lse - target logit. */
static void vocab_parallel_crossentropy(struct loom_decoder *m, struct loom_decoder_acts *a, int N)
{
    float *rowmax = m->ce_stats, *sums = m->ce_stats + N; /* sums: N sums of exponentials, N target logits */
    const int R = head_rows(m, N);
    for (int r0 = 0; r0 < N; r0 += R) {
        const int n = N - r0 < R ? N - r0 : R;
        m->k->crossentropy_vp_max(rowmax + r0, logits_rows(m, a, r0, n), n, m->Vl);
    }
    loom_tp_allreduce(rowmax, (size_t)N, LOOM_OP_MAX);
    if (m->exact.pieces) { /* the sums over the vocabulary pieces */
        loom_tp_exact_crossentropy_begin(&m->exact, N);
        for (int r0 = 0; r0 < N; r0 += R) {
            const int n = N - r0 < R ? N - r0 : R;
            loom_tp_exact_crossentropy_rows(&m->exact, m->k, logits_rows(m, a, r0, n), rowmax, a->targets, r0,
                                            n, m->spec.vocab, m->v0, m->Vl);
        }
        loom_tp_exact_crossentropy_done(&m->exact, sums, sums + N, N);
    } else {
        for (int r0 = 0; r0 < N; r0 += R) {
            const int n = N - r0 < R ? N - r0 : R;
            m->k->crossentropy_vp_stats(sums + r0, sums + N + r0, logits_rows(m, a, r0, n), rowmax + r0,
                                        a->targets + r0, m->v0, n, m->Vl);
        }
        loom_tp_allreduce(sums, 2 * (size_t)N, LOOM_OP_SUM);
    }
    m->k->crossentropy_vp_finish(a->losses, a->lse, rowmax, sums, sums + N, N);
}

/* The embedding's forward into the slot's encoded: this rank's vocabulary
 * (the learned positions added once, by tp rank 0), summed over the group. */
static void embedding_forward(struct loom_decoder *m, struct loom_decoder_acts *a, int B)
{
    struct loom_model *model = &m->base;
    struct loom_block *emb = &model->blocks[m->emb];
    const int T = m->T, C = m->spec.hidden, N = B * T;
    const size_t NrC = (size_t)loom_tp_rows_held(&m->rg, N) * C;
    loom_model_forward_begin(model, m->emb); /* its float32 views are valid from here */
    const float *wpe =
        m->spec.positions == LOOM_POSITION_LEARNED && m->tp_rank == 0 ? loom_param(emb, 1) : NULL;
    float *enc = out_of(m, a->encoded, m->dbufC);
    /* every row of this rank's vocabulary, summed in place unless sequence
     * parallelism keeps a rank's rows (then gathered from scratchC) */
    float *rows = m->rg.sp ? m->scratchC : enc;
    if (wpe && a->positions) { /* positions restarting at documents: their rows gathered, then added */
        m->k->embedding_vp_forward(rows, a->inputs, loom_param(emb, 0), NULL, m->v0, m->Vl, B, T, C);
        m->k->embedding_vp_forward(m->pos_rows, a->positions, wpe, NULL, 0, m->spec.max_pos, B, T, C);
        m->k->residual_forward(rows, rows, m->pos_rows, (size_t)N * C);
    } else {
        m->k->embedding_vp_forward(rows, a->inputs, loom_param(emb, 0), wpe, m->v0, m->Vl, B, T, C);
    }
    rows = loom_tp_region_output(&m->rg, rows, N);
    if (rows != enc) dev(m)->copy(enc, rows, NrC * sizeof(float));
    if (m->spec.embed_scale != 0) {
        const float scale = (float)m->spec.embed_scale;
        m->k->scale(enc, NrC, scale);
    }
    drop_rows(m, a, enc, m->drop_emb, -1, LOOM_DROPOUT_EMBEDDING);
    keep(m, a->encoded, enc, NrC);
    loom_model_forward_end(model, m->emb);
}

/* The tokens a micro-batch's mean loss is over: its whole rows', or the
 * ones that count (--eod-mask-loss). */
static int loss_count(const struct loom_decoder *m, const struct loom_decoder_acts *a)
{
    return m->docs.mask_loss ? a->nkeep : a->rows * m->ctx.T;
}

/* --layout-invariant under context parallelism: the micro-batch's mean
 * loss as one process sums it, over the whole rows in order, from every
 * rank's losses (those not counted as zeros: a sum of non-negative
 * values adds them exactly). */
static float exact_loss(struct loom_decoder *m, const struct loom_decoder_acts *a, float *losses, int B)
{
    const struct loom_cp *p = &m->ctx;
    const size_t n = (size_t)B * p->Tl;
    for (size_t i = 0; i < n; i++)
        if (m->docs.mask_loss && !a->loss_keep[i]) losses[i] = 0;
    float *all = m->host_losses + n, *whole = all + n * (size_t)p->cp;
    loom_cp_gather_host(p, whole, losses, all, B, LOOM_DTYPE_F32);
    double sum = 0;
    for (size_t i = 0; i < (size_t)B * p->T; i++) sum += whole[i];
    const int count = loss_count(m, a);
    return (float)(m->docs.mask_loss ? (count ? sum / count : 0.0) : sum / count);
}

/* The head's forward: final norm, logits, and with targets the loss. */
static void head_forward(struct loom_decoder *m, struct loom_decoder_acts *a, struct loom_micro *mb,
                         int first, int B)
{
    struct loom_model *model = &m->base;
    const int T = m->T, C = m->spec.hidden, Vl = m->Vl, L = m->spec.num_layers, N = B * T,
              Nr = loom_tp_rows_held(&m->rg, N);
    const size_t NrC = (size_t)Nr * C;
    struct loom_block *head = &model->blocks[m->head];
    /* a tied LM head reads the embedding's table: announced again when the
     * embedding is not in this range (its holder gathered or converted it
     * once more) */
    const int announce_emb = first != m->emb && !m->spec.untied && m->emb >= 0;
    if (announce_emb) loom_model_forward_begin(model, m->emb);
    loom_model_forward_begin(model, m->head);
    norm_forward(m, a->lnf, a->lnf_mean, a->lnf_rstd, view(m, a->layers[L - 1].res3, m->dbufC, NrC), head,
                 lnf_w(), lnf_b(m), Nr);
    round_act(m, a->lnf, NrC);
    /* the logits: 16-bit ones as the product rounds them */
    const float *lnf = loom_tp_region_input(&m->rg, a->lnf, N);
    if (m->exact.pieces)
        loom_tp_exact_head_forward(&m->exact, m->k, a->logits, m->act_dtype, lnf, lm_head_weight(m),
                                   lm_head_weight16(m), N, C, m->spec.vocab, Vl);
    else if (lp(m))
        m->k->lm_head_forward_lp(a->logits, m->act_dtype, lnf, lm_head_weight(m), lm_head_weight16(m), N, C,
                                 Vl);
    else
        m->k->lm_head_forward(a->logits, lnf, lm_head_weight(m), N, C, Vl);
    loom_model_forward_end(model, m->head);
    if (announce_emb) loom_model_forward_end(model, m->emb);
    mb->loss = 0;
    if (!a->targets) return;
    if (m->tp == 1 && !m->exact.pieces) {
        const int R = head_rows(m, N);
        for (int r0 = 0; r0 < N; r0 += R) {
            const int n = N - r0 < R ? N - r0 : R;
            m->k->crossentropy_forward(a->losses + r0, a->lse + r0, logits_rows(m, a, r0, n), a->targets + r0,
                                       n, Vl);
        }
    } else {
        vocab_parallel_crossentropy(m, a, N);
    }
    /* the mean, on the host in row order; a context-parallel rank's share
     * of the whole rows' mean, summed over the group */
    float *losses = m->host_losses;
    dev(m)->download(losses, a->losses, (size_t)N * sizeof(float));
    if (m->exact.block && m->ctx.cp > 1) { /* --layout-invariant: one process's sum, in its order */
        mb->loss = exact_loss(m, a, losses, B);
        return;
    }
    double sum = 0, mean;
    if (!m->docs.mask_loss) {
        for (int i = 0; i < N; i++) sum += losses[i];
        mean = sum / loss_count(m, a);
    } else {
        for (int i = 0; i < N; i++)
            if (a->loss_keep[i]) sum += losses[i];
        mean = a->nkeep ? sum / a->nkeep : 0.0;
    }
    mb->loss = (float)(m->ctx.cp > 1 ? loom_cp_sum(&m->ctx, mean) : mean);
}

/* The slot's packed documents and positions from its B whole rows of input
 * tokens (host; Tw tokens each): each token's document start (1 + the last
 * end-of-document token before it in its row, else 0), which of this
 * rank's tokens' losses count and how many of the whole rows' do, and on
 * the device this rank's tokens' positions (restarting at each document;
 * under context parallelism, else with documents' restarts only) and the
 * starts the attention reads. */
static void documents_of(struct loom_decoder *m, struct loom_decoder_acts *a, const int32_t *inputs, int B)
{
    const int T = m->T, Tw = m->ctx.T, N = B * T, docs = documents(m);
    int32_t *pos = m->host_positions; /* NULL unless positions restart or are a context rank's */
    a->nkeep = 0;
    for (int b = 0; b < B; b++) {
        const int32_t *row = inputs + (size_t)b * Tw;
        int32_t *start = a->doc_host + (size_t)b * Tw;
        for (int t = 0, s = 0; t < Tw; t++) {
            const int eod = docs && row[t] == m->docs.eod;
            start[t] = s;
            a->nkeep += !(m->docs.mask_loss && eod);
            if (eod) s = t + 1;
        }
        for (int t = 0; t < T; t++) {
            const int g = m->ctx.cp > 1 ? loom_cp_position(&m->ctx, t) : t, i = b * T + t;
            a->loss_keep[i] = !(m->docs.mask_loss && row[g] == m->docs.eod);
            if (pos) pos[i] = m->docs.reset_positions ? g - start[g] : g;
        }
    }
    int32_t *dev_pos = a->tokens + 2 * (size_t)m->B * T, *dev_doc = a->tokens + 3 * (size_t)m->B * T;
    if (pos) {
        dev(m)->upload(dev_pos, pos, (size_t)N * sizeof(int32_t));
        a->positions = dev_pos;
    }
    if (m->docs.reset_mask) {
        dev(m)->upload(dev_doc, a->doc_host, (size_t)B * Tw * sizeof(int32_t));
        a->doc_start = dev_doc;
    }
}

/* Blocks [first, last] on the slot's micro-batch. A range starting after the
 * embedding reads its input into the residual buffer the previous layer
 * would have written; one ending before the head writes its last layer's
 * output out. Full recomputation needs ranges that start a pipeline chunk. */
static void forward(struct loom_model *model, int first, int last, struct loom_micro *mb)
{
    struct loom_decoder *m = model->user;
    const int B = mb->rows;
    LOOM_ASSERT(B >= 1 && B <= m->B && mb->slot >= 0 && mb->slot < m->nslots);
    LOOM_ASSERT(first <= last && first >= 0 && last < model->nblocks);
    if (!m->slots) alloc_activations(m);
    const int L = m->spec.num_layers, N = B * m->T;
    const size_t NrC = (size_t)loom_tp_rows_held(&m->rg, N) * m->spec.hidden;
    struct loom_decoder_acts *a = &m->slots[mb->slot];
    const struct loom_lm_batch *batch = mb->batch;
    a->inputs = a->targets = NULL;
    /* whole rows; a context-parallel rank's own tokens of them */
    const int32_t *inputs = batch ? batch->inputs : NULL, *targets = batch ? batch->targets : NULL;
    if (m->ctx.cp > 1) {
        if (inputs) loom_cp_take_rows(&m->ctx, m->host_tokens, inputs, B), inputs = m->host_tokens;
        if (targets) loom_cp_take_rows(&m->ctx, m->host_tokens + N, targets, B), targets = m->host_tokens + N;
    }
    if (inputs) {
        dev(m)->upload(a->tokens, inputs, (size_t)N * sizeof(int32_t));
        a->inputs = a->tokens;
    }
    if (targets) {
        dev(m)->upload(a->tokens + (size_t)m->B * m->T, targets, (size_t)N * sizeof(int32_t));
        a->targets = a->tokens + (size_t)m->B * m->T;
    }
    a->rows = B;
    a->emb_open = 0;
    a->drop_step = mb->step, a->drop_first = mb->first_row, a->drop_seed = mb->seed;
    drop_rows_set(m, a);
    a->positions = a->doc_start = NULL;
    if (documents(m) || m->ctx.cp > 1) {
        LOOM_ASSERT(batch && batch->inputs); /* every stage reads them */
        documents_of(m, a, batch->inputs, B);
    }
    int l0, l1;
    layers_of(m, first, last, &l0, &l1);
    if (first == m->emb) {
        embedding_forward(m, a, B);
    } else {
        /* full recomputation reruns layers from their kept inputs: a range
         * starting at a layer starts a pipeline chunk (its input is kept) */
        LOOM_ASSERT(mb->input != NULL &&
                    (m->recompute != LOOM_RECOMPUTE_FULL || l0 >= L || l0 == 0 || a->chunk_input[l0]));
        if (l0 < L && l0 > 0 && a->chunk_input[l0])
            dev(m)->copy(a->chunk_input[l0], mb->input, NrC * sizeof(float));
        else /* the embedding's output, or the layer's before, which another range ran */
            put(m, l0 == 0 ? a->encoded : a->layers[l0 - 1].res3, mb->input, NrC);
    }
    if (a->moe_hf && l0 == 0) /* the micro-batch's choices over its MoE layers start */
        memset(a->moe_hf, 0, sizeof *a->moe_hf * (size_t)(m->spec.experts + 1));
    for (int l = l0; l <= l1; l++) {
        loom_model_forward_begin(model, m->stage.block[l]);
        layer_forward(m, a, l, B);
        loom_model_forward_end(model, m->stage.block[l]);
    }
    if (last != m->head) {
        get(m, mb->output, l1 >= 0 ? a->layers[l1].res3 : a->encoded, NrC);
        return;
    }
    head_forward(m, a, mb, first, B);
}

/* The loss's gradient on the logits of rows [r0, r0 + n) (lg, in place),
 * each row's weighted by w. */
static void crossentropy_backward_rows(struct loom_decoder *m, struct loom_decoder_acts *a, float *lg, int r0,
                                       int n, float w)
{
    if (m->tp == 1 && !m->exact.pieces)
        m->k->crossentropy_backward(lg, a->lse + r0, lg, a->targets + r0, w, n, m->Vl);
    else
        m->k->crossentropy_vp_backward(lg, a->lse + r0, lg, a->targets + r0, m->v0, w, n, m->Vl);
}

/* The head's backward: loss -> logits (in place) -> LM head -> final norm,
 * into m->dres. */
static void head_backward(struct loom_decoder *m, struct loom_decoder_acts *a, float loss_weight)
{
    struct loom_model *model = &m->base;
    const int B = a->rows, T = m->T, C = m->spec.hidden, Vl = m->Vl, L = m->spec.num_layers, N = B * T,
              Nr = loom_tp_rows_held(&m->rg, N);
    const size_t NrC = (size_t)Nr * C;
    LOOM_ASSERT(a->targets != NULL);
    struct loom_block *head = &model->blocks[m->head];
    const int R = head_rows(m, N);
    for (int r0 = 0; r0 < N; r0 += R) {
        const int n = N - r0 < R ? N - r0 : R;
        float *lg = logits_rows(m, a, r0, n);
        if (!m->docs.mask_loss) {
            crossentropy_backward_rows(m, a, lg, r0, n, loss_weight / (float)loss_count(m, a));
        } else { /* runs of rows that count; the others' gradient is 0 */
            const float w = a->nkeep ? loss_weight / (float)a->nkeep : 0.0f;
            for (int i = 0, j; i < n; i = j) {
                const int counts = a->loss_keep[r0 + i];
                for (j = i; j < n && a->loss_keep[r0 + j] == counts; j++) {
                }
                if (counts)
                    crossentropy_backward_rows(m, a, lg + (size_t)i * Vl, r0 + i, j - i, w);
                else
                    dev(m)->memset(lg + (size_t)i * Vl, 0, (size_t)(j - i) * Vl * sizeof(float));
            }
        }
        keep(m, at(m, a->logits, (size_t)r0 * Vl), lg, (size_t)n * Vl); /* the logits' gradient, in place */
    }
    const int tied_here = !m->spec.untied && m->emb >= 0;
    if (tied_here) {
        loom_model_backward_begin(model, m->emb);
        a->emb_open = 1; /* the embedding's gradients are open until its own backward */
    }
    loom_model_backward_begin(model, m->head);
    const float *lnf = loom_tp_region_input(&m->rg, a->lnf, N);
    float *dlnf;
    if (m->exact.pieces) {
        dlnf = loom_tp_exact_head_backward(&m->exact, &m->rg, m->k, lm_head_grad(m), a->logits, m->act_dtype,
                                           lnf, lm_head_weight(m), lm_head_weight16(m), m->dbufC, N, C,
                                           m->spec.vocab, Vl);
    } else {
        if (lp(m)) /* the logits' gradient read in 16 bits */
            m->k->lm_head_backward_lp(m->dbufC, lm_head_grad(m), a->logits, m->act_dtype, lnf,
                                      lm_head_weight(m), lm_head_weight16(m), N, C, Vl);
        else
            m->k->lm_head_backward(m->dbufC, lm_head_grad(m), a->logits, lnf, lm_head_weight(m), N, C, Vl);
        dlnf = loom_tp_region_input_grad(&m->rg, m->dbufC, N); /* partial over this rank's vocabulary */
    }
    round_act(m, dlnf, NrC);
    if (tied_here) loom_model_grads_ready(model, LOOM_GRAD_READY_TIED_HEAD);
    dev(m)->memset(m->dres, 0, NrC * sizeof(float));
    norm_backward(m, m->dres, head, lnf_w(), lnf_b(m), dlnf,
                  view(m, a->layers[L - 1].res3, m->stage_res, NrC), a->lnf_mean, a->lnf_rstd, Nr);
    round_act(m, m->dres, NrC);
    loom_model_grads_ready(model, m->head);
    /* the logits are dead from here on: the recompute scratch in their buffer is free */
}

/* Every context rank's n ids (B rows of Tl, device) as the whole rows'
 * (host, B rows of Tw), through the host scratch. */
static void gather_ids(struct loom_decoder *m, int32_t *whole, const int32_t *ids, int B)
{
    const struct loom_cp *p = &m->ctx;
    const size_t n = (size_t)B * p->Tl;
    int32_t *mine = m->ex_tok_host + 2 * (size_t)B * p->T, *all = mine + n;
    dev(m)->download(mine, ids, n * sizeof(int32_t));
    loom_cp_gather_host(p, whole, mine, all, B, LOOM_DTYPE_I32);
}

/* --layout-invariant under context parallelism: the embedding's gradient
 * is one process's, taken on context rank 0 from every rank's rows (their
 * gradient, tokens and positions gathered); the other ranks add nothing
 * (tp_exact.h: the data-parallel sums add their zeros). */
static void exact_embedding_backward(struct loom_decoder *m, const struct loom_decoder_acts *a,
                                     const float *dout, float *dwte, float *dwpe)
{
    const struct loom_cp *p = &m->ctx;
    const int B = a->rows, Tw = p->T, C = m->spec.hidden, reset = m->docs.reset_positions;
    LOOM_ASSERT(!m->defer_wte_scatter);
    const size_t whole = (size_t)B * Tw;
    int32_t *host = m->ex_tok_host;
    loom_cp_gather_rows(p, m->k, m->ex_emb, dout, B, C, m->ex_emb_recv);
    gather_ids(m, host, a->inputs, B);
    if (reset) gather_ids(m, host + whole, a->positions, B);
    if (p->rank) return;
    dev(m)->upload(m->ex_tok, host, (reset ? 2 : 1) * whole * sizeof(int32_t));
    if (dwpe && reset) { /* one process's: positions restarting at documents */
        if (dwte) m->k->embedding_vp_backward(dwte, NULL, m->ex_emb, m->ex_tok, m->v0, m->Vl, B, Tw, C);
        m->k->embedding_vp_backward(dwpe, NULL, m->ex_emb, m->ex_tok + whole, 0, m->spec.max_pos, B, Tw, C);
    } else {
        m->k->embedding_vp_backward(dwte, dwpe, m->ex_emb, m->ex_tok, m->v0, m->Vl, B, Tw, C);
    }
}

/* The embedding's backward from m->dres: this rank's vocabulary rows, from
 * every row's gradient (the positions' gradient is the same on every tp
 * rank); the tied table's head share added as one process adds it. */
static void embedding_backward(struct loom_decoder *m, struct loom_decoder_acts *a)
{
    struct loom_model *model = &m->base;
    const int B = a->rows, T = m->T, C = m->spec.hidden, N = B * T;
    struct loom_block *emb = &model->blocks[m->emb];
    if (!a->emb_open) loom_model_backward_begin(model, m->emb);
    drop_rows(m, a, m->dres, m->drop_emb, -1, LOOM_DROPOUT_EMBEDDING);
    if (m->spec.embed_scale !=
        0) { /* the lookup's gradient (the tied table's deferred scatter reads it too) */
        const float scale = (float)m->spec.embed_scale;
        const size_t NrC = (size_t)loom_tp_rows_held(&m->rg, N) * C;
        m->k->scale(m->dres, NrC, scale);
    }
    float *dwpe = m->spec.positions == LOOM_POSITION_LEARNED ? loom_grad(emb, 1) : NULL,
          *dwte = m->defer_wte_scatter ? NULL : loom_grad(emb, 0);
    const float *dout = loom_tp_region_output_grad(&m->rg, m->dres, N);
    if (m->exact.block && m->ctx.cp > 1) {
        exact_embedding_backward(m, a, dout, dwte, dwpe);
    } else if (dwpe && a->positions) { /* the positions' rows as a table looked up by position */
        if (dwte) m->k->embedding_vp_backward(dwte, NULL, dout, a->inputs, m->v0, m->Vl, B, T, C);
        m->k->embedding_vp_backward(dwpe, NULL, dout, a->positions, 0, m->spec.max_pos, B, T, C);
    } else {
        m->k->embedding_vp_backward(dwte, dwpe, dout, a->inputs, m->v0, m->Vl, B, T, C);
    }
    loom_model_grads_ready(model, m->emb);
    a->emb_open = 0;
}

static void backward(struct loom_model *model, int first, int last, struct loom_micro *mb, float loss_weight)
{
    struct loom_decoder *m = model->user;
    struct loom_decoder_acts *a = &m->slots[mb->slot];
    const size_t NrC = (size_t)loom_tp_rows_held(&m->rg, a->rows * m->T) * m->spec.hidden;
    m->bwd_slot = mb->slot;
    m->bwd_micro = mb->micro, m->bwd_micros = mb->micros;
    m->moe_loss_weight = loss_weight; /* the balancing losses' gradients carry the micro-batch's weight */
    drop_rows_set(m, a);
    int l0, l1;
    layers_of(m, first, last, &l0, &l1);
    if (last == m->head)
        head_backward(m, a, loss_weight);
    else
        dev(m)->copy(m->dres, mb->doutput, NrC * sizeof(float));
    /* m->dres is the gradient of the residual stream, flowing down */
    for (int l = l1; l >= l0; l--) {
        if (!recomputed(m, l)) {
            loom_model_backward_begin(model, m->stage.block[l]);
        } else if (l == chunk_last(m, l)) {
            /* entering a chunk from the top: rerun its forward from its kept input */
            const int cfirst = chunk_first(m, l);
            for (int k = l; k >= cfirst; k--) loom_model_backward_begin(model, m->stage.block[k]);
            m->moe_recomputing = 1; /* the statistics were counted by the first forward */
            for (int k = cfirst; k <= l; k++) layer_forward(m, a, k, a->rows);
            m->moe_recomputing = 0;
        }
        layer_backward(m, a, l, a->rows);
        loom_model_grads_ready(model, m->stage.block[l]);
    }
    if (first != m->emb) {
        dev(m)->copy(mb->dinput, m->dres, NrC * sizeof(float));
        return;
    }
    embedding_backward(m, a);
}

/* ---- whole-model calls -------------------------------------------------------- */

float loom_decoder_forward(struct loom_decoder *m, const int32_t *inputs, const int32_t *targets, int B)
{
    const struct loom_lm_batch batch = {inputs, targets};
    struct loom_micro mb = {.slot = 0, .batch = &batch, .rows = B, .micros = 1};
    forward(&m->base, 0, m->base.nblocks - 1, &mb);
    return (float)mb.loss;
}

void loom_decoder_backward(struct loom_decoder *m, float loss_weight)
{
    struct loom_micro mb = {.slot = 0, .micros = 1};
    backward(&m->base, 0, m->base.nblocks - 1, &mb, loss_weight);
}

/* An MLP of F columns of the spec's kind, its biases too. */
static double mlp_params(const struct loom_decoder_spec *s, double F)
{
    const double C = s->hidden;
    if (F == 0) return 0;
    return (s->mlp == LOOM_MLP_GATED ? 3 : 2) * C * F +
           (s->mlp_bias ? (s->mlp == LOOM_MLP_GATED ? 2 : 1) * F + C : 0);
}

double loom_decoder_num_params(const struct loom_decoder_spec *s)
{
    const double C = s->hidden, V = s->vocab, F = s->ffn, hs = s->head_dim ? s->head_dim : C / s->heads,
                 Cq = s->heads * hs, kvC = s->kv_heads * hs, nb = s->norm == LOOM_NORM_LAYERNORM ? 2 : 1;
    const double qkv = C * (Cq + 2 * kvC) + (s->qkv_bias ? Cq + 2 * kvC : 0),
                 o = Cq * C + (s->o_bias ? C : 0);
    const double mlp = mlp_params(s, F);
    const double pos = s->positions == LOOM_POSITION_LEARNED ? (double)s->max_pos * C : 0;
    double moe = 0; /* an MoE layer's MLP instead of the dense one */
    for (int l = 0; s->experts && l < s->num_layers; l++)
        if (loom_decoder_moe_layer(s, l))
            moe +=
                C * s->experts + s->experts * mlp_params(s, s->moe_ffn) + mlp_params(s, s->shared_ffn) - mlp;
    return V * C * (s->untied ? 2 : 1) + pos + s->num_layers * (qkv + o + mlp + 2 * nb * C) + nb * C + moe;
}

/* The parameters a token meets: an MoE layer's top k experts of all. */
static double active_params(const struct loom_decoder_spec *s)
{
    double inactive = 0;
    for (int l = 0; s->experts && l < s->num_layers; l++)
        if (loom_decoder_moe_layer(s, l)) inactive += (s->experts - s->topk) * mlp_params(s, s->moe_ffn);
    return loom_decoder_num_params(s) - inactive;
}

double loom_decoder_flops_per_token(const struct loom_decoder *m)
{
    /* the whole model's (MFU divides by the whole job's peak), whatever part this rank holds; a sparse
     * layout's attention counts its share of the causal blocks */
    const double attn = 12.0 * m->spec.num_layers * (double)m->ctx.T * m->spec.hidden;
    return 6.0 * active_params(&m->spec) + attn * loom_model_sparsity_share(m->sparse);
}
