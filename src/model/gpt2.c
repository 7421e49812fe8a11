/*
 * GPT-2: parameter layout (with each tensor's initialisation and
 * tensor-parallel split), forward and backward over a range of blocks for
 * one micro-batch slot. Each slot holds what its forward saved for its
 * backward, so a pipeline schedule can keep several micro-batches in
 * flight; the backward walks the range in reverse and announces each block
 * to the strategy stack when its gradients are ready.
 *
 * Activation recomputation (Megatron's):
 *   selective  no layer keeps its attention probabilities (B,NH,T,T); one
 *              shared buffer receives them in the forward, and the backward
 *              of each layer recomputes them from its kept qkv.
 *   full       a recomputed layer keeps only its input (the residual stream
 *              into it, which is the previous layer's output res3); its
 *              forward runs into shared scratch (`scratch`: one layer's
 *              activations, N layers' under the uniform method) and runs
 *              again, into the same scratch, right before its backward.
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
 * then: attention, one sequence at a time, keeping no probabilities (the
 * backward recomputes them from the kept qkv, as selective recomputation
 * does: the same kernel on the same values gives the same bits); and the
 * loss on the logits, which the LM head's product writes and reads in 16
 * bits, LOOM_GPT2_HEAD_ROWS rows at a time through float32. The bf16
 * products take kept bf16 inputs and the stored bf16 weights as they are
 * (dense_forward, dense_backward). In the backward every activation
 * gradient is rounded too (round_act), in float32 buffers: one layer's,
 * reused. Parameter gradients are not rounded here: the precision strategy
 * owns them.
 *
 * Tensor parallelism (m->tp > 1): the layers compute on the rank's part
 * (Cl = C/tp channels of attention and 4 Cl of the MLP, NH/tp heads, Vl
 * vocabulary rows); the regions between column- and row-parallel matmuls
 * are entered and left through layers/tp_regions.h's loom_tp_region_input
 * and loom_tp_region_output (and their gradient forms), which are the
 * identity in one process, all-reduces under TP, and gathers/reduce-scatters
 * of each rank's rows under sequence parallelism (m->rg.sp), where the
 * residual stream, the norms and their saved state hold
 * loom_tp_rows_held() = B*T/tp rows.
 *
 * Not here: loading and saving weights (gpt2_io.c), the optimizer, data.
 */
#include "model/gpt2.h"

#include <math.h>
#include <stdio.h>
#include <string.h>

#include "base/log.h"
#include "base/mem.h"
#include "base/rng.h"
#include "kernels/backend.h"
#include "kernels/kernels.h"
#include "kernels/sparse_layout.h"
#include "layers/fp8_linear.h"
#include "layers/pp_stages.h"
#include "layers/tp_regions.h"
#include "model/family.h"
#include "model/sparsity.h"

int loom_gpt2_config_check(const struct loom_gpt2_config *cfg, int T)
{
    if (cfg->num_layers < 1)
        return loom_error_set(LOOM_ERR_INPUT, "--num-layers must be >= 1, got %d", cfg->num_layers);
    if (cfg->hidden < 1)
        return loom_error_set(LOOM_ERR_INPUT, "--hidden-size must be >= 1, got %d", cfg->hidden);
    if (cfg->heads < 1)
        return loom_error_set(LOOM_ERR_INPUT, "--num-attention-heads must be >= 1, got %d", cfg->heads);
    if (cfg->hidden % cfg->heads != 0)
        return loom_error_set(LOOM_ERR_INPUT, "--hidden-size %d is not divisible by --num-attention-heads %d",
                              cfg->hidden, cfg->heads);
    if (T > cfg->max_pos)
        return loom_error_set(LOOM_ERR_INPUT, "--seq-length %d exceeds --max-position-embeddings %d", T,
                              cfg->max_pos);
    if (cfg->vocab < 2)
        return loom_error_set(LOOM_ERR_INPUT, "--vocab-size must be >= 2, got %d", cfg->vocab);
    return LOOM_OK;
}

/* One tensor, its initialisation, and its tensor-parallel split: dimension
 * tp_split of view (NULL: the tensor's own shape), or REPL. */
static void add_tensor(struct loom_gpt2 *m, struct loom_block *b, const char *name, int ndim, int64_t d0,
                       int64_t d1, enum loom_init init, double std, int tp_split, int view_ndim,
                       const int64_t *view)
{
    const int64_t shape[2] = {d0, d1};
    struct loom_tensor *t =
        loom_block_add_tensor_split(b, name, ndim, shape, view_ndim, view, tp_split, m->tp, m->tp_rank);
    t->init = init;
    t->init_std = std;
}

enum { REPL = LOOM_TP_REPLICATED };

/* The blocks: [embedding, L layers, head]. Weights are stored [in, out]
 * (Conv1D), so Megatron's column-parallel layers (c_attn, c_fc) split
 * dimension 1 and its row-parallel ones (the c_proj) dimension 0; c_attn's
 * columns [q | k | v] split in the view [C, 3, C], so a rank holds q, k and
 * v of its heads; the embedding table and an untied LM head are split by
 * vocabulary rows. */
static void layout_blocks(struct loom_gpt2 *m, int embedding, int head)
{
    const int L = m->cfg.num_layers, C = m->cfg.hidden;
    const double std = 0.02, proj_std = 0.02 / sqrt(2.0 * L);
    char name[LOOM_TENSOR_NAME_MAX];
    if (embedding) {
        struct loom_block *e = &m->base.blocks[0];
        e->role = LOOM_ROLE_EMBEDDING;
        e->layer = -1;
        e->index = 0;
        add_tensor(m, e, "wte.weight", 2, m->cfg.vocab, C, LOOM_INIT_NORMAL, std, 0, 0, NULL);
        add_tensor(m, e, "wpe.weight", 2, m->cfg.max_pos, C, LOOM_INIT_NORMAL, std, REPL, 0, NULL);
    }
    const int64_t qkv_view[3] = {C, 3, C}, qkv_bias_view[2] = {3, C};
    static const struct {
        const char *suffix;
        int ndim, rows, cols;
        enum loom_init init;
        int residual_proj; /* normal(0, 0.02/sqrt(2L)) instead of 0.02 */
        int tp_split;      /* in the view when the tensor has one */
        int qkv;           /* 2: c_attn.weight's view, 1: its bias's, 0: none */
    } layer_tensors[] = {
        {"ln_1.weight", 1, 1, 0, LOOM_INIT_ONE, 0, REPL, 0},
        {"ln_1.bias", 1, 1, 0, LOOM_INIT_ZERO, 0, REPL, 0},
        {"attn.c_attn.weight", 2, 1, 3, LOOM_INIT_NORMAL, 0, 2, 2},
        {"attn.c_attn.bias", 1, 3, 0, LOOM_INIT_ZERO, 0, 1, 1},
        {"attn.c_proj.weight", 2, 1, 1, LOOM_INIT_NORMAL, 1, 0, 0},
        {"attn.c_proj.bias", 1, 1, 0, LOOM_INIT_ZERO, 0, REPL, 0},
        {"ln_2.weight", 1, 1, 0, LOOM_INIT_ONE, 0, REPL, 0},
        {"ln_2.bias", 1, 1, 0, LOOM_INIT_ZERO, 0, REPL, 0},
        {"mlp.c_fc.weight", 2, 1, 4, LOOM_INIT_NORMAL, 0, 1, 0},
        {"mlp.c_fc.bias", 1, 4, 0, LOOM_INIT_ZERO, 0, 0, 0},
        {"mlp.c_proj.weight", 2, 4, 1, LOOM_INIT_NORMAL, 1, 0, 0},
        {"mlp.c_proj.bias", 1, 1, 0, LOOM_INIT_ZERO, 0, REPL, 0},
    };
    for (int l = 0; l < L; l++) {
        if (m->stage.block[l] < 0) continue;
        struct loom_block *b = &m->base.blocks[m->stage.block[l]];
        b->role = LOOM_ROLE_LAYER;
        b->layer = l;
        b->index = 1 + l;
        for (size_t i = 0; i < sizeof layer_tensors / sizeof layer_tensors[0]; i++) {
            snprintf(name, sizeof name, "h.%d.%s", l, layer_tensors[i].suffix);
            const int q = layer_tensors[i].qkv;
            add_tensor(m, b, name, layer_tensors[i].ndim, (int64_t)layer_tensors[i].rows * C,
                       (int64_t)layer_tensors[i].cols * C, layer_tensors[i].init,
                       layer_tensors[i].residual_proj ? proj_std : std, layer_tensors[i].tp_split,
                       q ? q + 1 : 0,
                       q == 2   ? qkv_view
                       : q == 1 ? qkv_bias_view
                                : NULL);
        }
    }
    if (!head) return;
    struct loom_block *h = &m->base.blocks[m->base.nblocks - 1];
    h->role = LOOM_ROLE_HEAD;
    h->layer = -1;
    h->index = L + 1;
    add_tensor(m, h, "ln_f.weight", 1, C, 0, LOOM_INIT_ONE, 0, REPL, 0, NULL);
    add_tensor(m, h, "ln_f.bias", 1, C, 0, LOOM_INIT_ZERO, 0, REPL, 0, NULL);
    if (m->cfg.untied) /* Hugging Face's name for GPT2LMHeadModel's own head */
        add_tensor(m, h, "lm_head.weight", 2, m->cfg.vocab, C, LOOM_INIT_NORMAL, std, 0, 0, NULL);
}

/* The LM head's weight (V,C) and its gradient: the head block's own, or the
 * tied token embedding's. */
enum { LNF_W, LNF_B, LM_HEAD_W };
static float *lm_head_weight(struct loom_gpt2 *m)
{
    if (m->cfg.untied) return loom_param(&m->base.blocks[m->head], LM_HEAD_W);
    return m->emb >= 0 ? loom_param(&m->base.blocks[m->emb], 0) : m->tied_copy;
}

/* Tensor i of block b as stored in bf16 (NULL: stored otherwise, or not
 * held): what the bf16 products take without converting. */
static const uint16_t *param16(const struct loom_block *b, int i)
{
    if (b->params.dtype != LOOM_DTYPE_BF16 || !b->params.data) return NULL;
    return (const uint16_t *)b->params.data + b->tensors[i].offset;
}

/* The LM head's weight as stored in bf16, or NULL (a pipeline stage's
 * float32 copy of the tied table among them). */
static const uint16_t *lm_head_weight16(struct loom_gpt2 *m)
{
    if (m->cfg.untied) return param16(&m->base.blocks[m->head], LM_HEAD_W);
    return m->emb >= 0 ? param16(&m->base.blocks[m->emb], 0) : NULL;
}

static float *lm_head_grad(struct loom_gpt2 *m)
{
    if (m->cfg.untied) return loom_grad(&m->base.blocks[m->head], LM_HEAD_W);
    return m->emb >= 0 ? loom_grad(&m->base.blocks[m->emb], 0) : m->tied_grad;
}

/* Whether the tied table crosses stages: the embedding's stage sends it to
 * the head's (layers/pp_stages.h). */
static int tied_across_stages(const struct loom_gpt2 *m)
{
    return m->pipelined && !m->cfg.untied && (m->emb >= 0) != (m->head >= 0);
}

/* The head's share of the tied table's gradient goes to the embedding's
 * stage every micro-batch (--layout-invariant), not once a step. */
static int per_micro_tied(const struct loom_gpt2 *m)
{
    return tied_across_stages(m) && m->base.invariant_sums;
}

static float *act(size_t n)
{
    return loom_alloc(loom_mul_size(n, sizeof(float)), LOOM_MEM_ACTIVATIONS);
}

/* Activations are held in act_dtype: round what a kernel just wrote. */
static void round_act(const struct loom_gpt2 *m, float *buf, size_t n)
{
    if (m->act_dtype != LOOM_DTYPE_F32) loom_dtype_round_trip(buf, n, m->act_dtype);
}

/* ---- activations kept in act_dtype ------------------------------------------- */

/* Whether activations are kept in 16 bits. */
static int lp(const struct loom_gpt2 *m)
{
    return m->act_dtype != LOOM_DTYPE_F32;
}

static size_t act_size(const struct loom_gpt2 *m)
{
    return lp(m) ? sizeof(uint16_t) : sizeof(float);
}

/* Element i of kept activation x. */
static void *at(const struct loom_gpt2 *m, void *x, size_t i)
{
    return (char *)x + i * act_size(m);
}

/* Where a kernel writes the values of kept activation x: x itself in
 * float32, else float32 staging. */
static float *out_of(const struct loom_gpt2 *m, void *x, float *stage)
{
    return lp(m) ? stage : x;
}

/* The kernel's result v (n values, where out_of said) becomes activation x:
 * rounded to act_dtype in place, and kept. */
static void keep(const struct loom_gpt2 *m, void *x, float *v, size_t n)
{
    if (lp(m)) loom_lp_round_store(x, v, n, m->act_dtype);
}

/* Kept activation x (n values) as float32: x itself, or converted into
 * stage. */
static const float *view(const struct loom_gpt2 *m, const void *x, float *stage, size_t n)
{
    if (!lp(m)) return x;
    loom_lp_to_f32(stage, x, n, m->act_dtype);
    return stage;
}

/* float32 values in and out of kept activation x (n values; src is
 * act_dtype-valued, as every value that crosses a boundary is). */
static void put(const struct loom_gpt2 *m, void *x, const float *src, size_t n)
{
    if (lp(m))
        loom_lp_from_f32(x, src, n, m->act_dtype);
    else
        memcpy(x, src, n * sizeof(float));
}
static void get(const struct loom_gpt2 *m, float *dst, const void *x, size_t n)
{
    if (lp(m))
        loom_lp_to_f32(dst, x, n, m->act_dtype);
    else
        memcpy(dst, x, n * sizeof(float));
}

/* ---- activations and their recomputation ------------------------------------ */

/* Attention probabilities of B sequences: (B, NH, T, T), or the sparse
 * layout's blocks of this rank's heads. */
static size_t att_numel_of(const struct loom_gpt2 *m, int B)
{
    if (m->sparse) return loom_sparse_att_numel(m->sparse, B, m->NHl, m->tp_rank * m->NHl);
    return (size_t)B * m->NHl * m->T * m->T;
}

static size_t att_numel(const struct loom_gpt2 *m)
{
    return att_numel_of(m, m->B);
}

/* One sequence's attention probabilities (or their gradient). */
static size_t seq_att_numel(const struct loom_gpt2 *m)
{
    return att_numel_of(m, 1);
}

/* Whether full recomputation reruns layer l's forward in the backward. */
static int recomputed(const struct loom_gpt2 *m, int l)
{
    if (m->recompute != LOOM_RECOMPUTE_FULL) return 0;
    return m->recompute_method == LOOM_RECOMPUTE_UNIFORM || l - m->stage.lo[l] < m->recompute_num_layers;
}

/* Layers recomputed together: chunks of N under uniform (the last one
 * shorter when N does not divide L, as in Megatron), else one; counted from
 * the first layer of the pipeline model chunk, as Megatron counts them per
 * stage. */
static int chunk_len(const struct loom_gpt2 *m)
{
    return m->recompute_method == LOOM_RECOMPUTE_UNIFORM ? m->recompute_num_layers : 1;
}
static int chunk_first(const struct loom_gpt2 *m, int l)
{
    const int lo = m->stage.lo[l];
    return l - (l - lo) % chunk_len(m);
}
static int chunk_last(const struct loom_gpt2 *m, int l)
{
    const int last = chunk_first(m, l) + chunk_len(m) - 1;
    return last < m->stage.hi[l] ? last : m->stage.hi[l];
}

/* Whether layer l's output res3 has its own buffer: the next layer's input
 * (or the final norm's) is kept unless both layers are in one chunk. */
static int keeps_output(const struct loom_gpt2 *m, int l)
{
    return !recomputed(m, l) || l == chunk_last(m, l);
}

/* Layer l's input (n values) as float32: a pipeline chunk's received
 * input (float32), else the embedding's output or the previous layer's,
 * viewed through stage. */
static const float *layer_input(const struct loom_gpt2 *m, const struct loom_gpt2_acts *a, int l,
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
static void *piece(struct carve *c, size_t n, size_t size)
{
    const size_t bytes = loom_mul_size(n, size);
    if (!c) return loom_alloc(bytes, LOOM_MEM_ACTIVATIONS);
    void *p = c->base ? c->base + c->used : NULL;
    c->used += (bytes + 63) & ~(size_t)63;
    return p;
}

/* A layer's saved state; att (float32 activations only) and res3 only when
 * asked for. */
static void layer_buffers(const struct loom_gpt2 *m, struct loom_layer_acts *a, struct carve *c, int with_att,
                          int with_res3)
{
    const size_t N = (size_t)m->B * m->T, Nr = (size_t)loom_tp_rows_held(&m->rg, (int)N),
                 C = (size_t)m->cfg.hidden, Cl = (size_t)m->Cl, sz = act_size(m), f = sizeof(float);
    a->ln1 = piece(c, Nr * C, sz);
    a->ln1_mean = piece(c, Nr, f);
    a->ln1_rstd = piece(c, Nr, f);
    a->qkv = piece(c, N * 3 * Cl, sz);
    a->atty = piece(c, N * Cl, sz);
    a->att = with_att && !lp(m) ? piece(c, att_numel(m), f) : NULL;
    a->res2 = piece(c, Nr * C, sz);
    a->ln2 = piece(c, Nr * C, sz);
    a->ln2_mean = piece(c, Nr, f);
    a->ln2_rstd = piece(c, Nr, f);
    a->fch = piece(c, N * 4 * Cl, sz);
    a->fch_gelu = piece(c, N * 4 * Cl, sz);
    a->res3 = with_res3 ? piece(c, Nr * C, sz) : NULL;
}

static void free_layer_buffers(struct loom_layer_acts *a)
{
    void *bufs[] = {a->ln1, a->ln1_mean, a->ln1_rstd, a->qkv, a->atty,     a->att, a->res2,
                    a->ln2, a->ln2_mean, a->ln2_rstd, a->fch, a->fch_gelu, a->res3};
    for (size_t i = 0; i < sizeof bufs / sizeof bufs[0]; i++) loom_free(bufs[i]);
}

/* One slot's activation buffers, for the recompute settings. A recomputed
 * layer gets no buffer of its own but its kept output; the recompute
 * scratch (a chunk of layers, or selective's shared att) is carved from the
 * logits' buffer, which grows to hold it when B*T*V values would not. With
 * 16-bit activations there are no probabilities to share (attention keeps
 * none). */
static void alloc_slot(struct loom_gpt2 *m, struct loom_gpt2_acts *a)
{
    const int L = m->cfg.num_layers, selective = m->recompute == LOOM_RECOMPUTE_SELECTIVE && !lp(m);
    const int nscratch = m->recompute == LOOM_RECOMPUTE_FULL ? chunk_len(m) : 0;
    const size_t C = (size_t)m->cfg.hidden, N = (size_t)m->B * m->T,
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
        for (int s = 0; s < nscratch; s++) layer_buffers(m, &a->scratch[s], &c, 1, s < nscratch - 1);
        if (selective) shared_att = piece(&c, att_numel(m), sizeof(float));
        if (pass == 0) {
            a->logits_bytes = c.used > NV ? c.used : NV > 0 ? NV : 1;
            c.base = a->logits = loom_alloc(a->logits_bytes, LOOM_MEM_ACTIVATIONS);
        }
    }
    for (int l = 0; l < L; l++) {
        struct loom_layer_acts *x = &a->layers[l];
        if (m->stage.block[l] < 0) continue; /* another stage's */
        if (l > 0 && m->stage.lo[l] == l) a->chunk_input[l] = act(Nr * C);
        if (recomputed(m, l)) {
            *x = a->scratch[l - chunk_first(m, l)];
            if (keeps_output(m, l)) x->res3 = piece(NULL, Nr * C, act_size(m));
        } else {
            layer_buffers(m, x, NULL, !selective, 1);
            if (selective) x->att = shared_att;
        }
    }
    a->encoded = piece(NULL, Nr * C, act_size(m));
    a->lnf = act(Nr * C);
    a->lnf_mean = act(Nr);
    a->lnf_rstd = act(Nr);
    a->losses = act(N);
    a->lse = act(N);
}

static void free_slot(struct loom_gpt2 *m, struct loom_gpt2_acts *a)
{
    for (int l = 0; l < m->cfg.num_layers; l++) {
        struct loom_layer_acts *x = &a->layers[l];
        if (m->stage.block[l] < 0) continue;
        loom_free(a->chunk_input[l]);
        if (recomputed(m, l)) {
            if (keeps_output(m, l)) loom_free(x->res3);
            continue;
        }
        /* selective's shared att lives in the logits' buffer */
        if (m->recompute == LOOM_RECOMPUTE_SELECTIVE) x->att = NULL;
        free_layer_buffers(x);
    }
    void *bufs[] = {a->encoded, a->lnf, a->lnf_mean, a->lnf_rstd, a->logits, a->losses, a->lse};
    for (size_t i = 0; i < sizeof bufs / sizeof bufs[0]; i++) loom_free(bufs[i]);
    loom_free(a->layers);
    loom_free(a->chunk_input);
    loom_free(a->scratch);
}

static void alloc_activations(struct loom_gpt2 *m)
{
    const size_t C = (size_t)m->cfg.hidden, Cl = (size_t)m->Cl, N = (size_t)m->B * m->T,
                 Nr = (size_t)loom_tp_rows_held(&m->rg, (int)N);
    m->slots = loom_alloc(sizeof *m->slots * (size_t)m->nslots, LOOM_MEM_OTHER);
    for (int s = 0; s < m->nslots; s++) alloc_slot(m, &m->slots[s]);
    m->dres = act(Nr * C);
    if (m->rg.sp) {
        m->rg.gathered = act(N * C);
        m->rg.out_rows = act(Nr * C);
        m->rg.grad_rows = act(Nr * C);
        m->norm_grads = act(2 * C);
    }
    m->dbufC = act(N * C);
    m->dqkv = act(N * 3 * Cl);
    m->datt = act(lp(m) ? seq_att_numel(m) : att_numel(m));
    m->dbuf4a = act(N * 4 * Cl);
    m->dbuf4b = act(N * 4 * Cl);
    m->scratchC = act(N * C);
    if (m->tp > 1 || m->exact.pieces) m->ce_stats = act(3 * N);
    if (m->exact.pieces && !m->rg.sp) m->norm_grads = act(2 * C);
    if (lp(m)) {
        m->stage_res = act(Nr * C);
        m->seq_att = act(seq_att_numel(m));
        if (m->head >= 0) m->head_rows = act((size_t)LOOM_GPT2_HEAD_ROWS * m->Vl);
    }
}

static void free_activations(struct loom_gpt2 *m)
{
    if (!m->slots) return;
    for (int s = 0; s < m->nslots; s++) free_slot(m, &m->slots[s]);
    float *bufs[] = {m->dres,         m->dbufC,      m->dqkv,      m->datt,        m->dbuf4a,
                     m->dbuf4b,       m->scratchC,   m->ce_stats,  m->rg.gathered, m->rg.out_rows,
                     m->rg.grad_rows, m->norm_grads, m->stage_res, m->seq_att,     m->head_rows};
    for (size_t i = 0; i < sizeof bufs / sizeof bufs[0]; i++) loom_free(bufs[i]);
    loom_free(m->slots);
    m->slots = NULL;
}

void loom_gpt2_set_tp_invariant(struct loom_gpt2 *m, int pieces)
{
    LOOM_ASSERT(m->slots == NULL && pieces > 0 && pieces % m->tp == 0 && m->cfg.heads % pieces == 0);
    loom_tp_exact_init(&m->exact, pieces, m->tp, m->tp_rank);
}

void loom_gpt2_set_sequence_parallel(struct loom_gpt2 *m, int on)
{
    LOOM_ASSERT(m->slots == NULL && (!on || (m->tp > 1 && m->T % m->tp == 0)));
    m->rg.sp = on;
}

void loom_gpt2_set_recompute(struct loom_gpt2 *m, enum loom_recompute granularity,
                             enum loom_recompute_method method, int num_layers)
{
    const int L = m->cfg.num_layers;
    LOOM_ASSERT(m->slots == NULL); /* the activations are laid out for it at the first forward */
    LOOM_ASSERT(granularity >= 0 && granularity < LOOM_RECOMPUTE_COUNT);
    if (granularity == LOOM_RECOMPUTE_FULL) {
        LOOM_ASSERT(num_layers >= 1 && num_layers <= L);
        LOOM_ASSERT(method == LOOM_RECOMPUTE_BLOCK || method == LOOM_RECOMPUTE_UNIFORM);
    } else {
        LOOM_ASSERT(method == LOOM_RECOMPUTE_METHOD_NONE && num_layers == 0);
    }
    m->recompute = granularity;
    m->recompute_method = method;
    m->recompute_num_layers = num_layers;
}

/* ---- the loom_model interface ------------------------------------------------ */

static void forward(struct loom_model *model, int first, int last, struct loom_micro *mb);
static void backward(struct loom_model *model, int first, int last, struct loom_micro *mb, float loss_weight);

static void set_slots(struct loom_model *model, int n)
{
    struct loom_gpt2 *m = loom_gpt2_of(model);
    LOOM_ASSERT(m->slots == NULL && n >= 1);
    m->nslots = n;
}

static int b16(const struct loom_gpt2 *m);

static void reserve(struct loom_model *model)
{
    struct loom_gpt2 *m = loom_gpt2_of(model);
    if (!m->slots) alloc_activations(m);
    /* the 16-bit head's own staging, taken and given back within a pass */
    if (lp(m) && m->head >= 0 && m->k->lm_head_lp_scratch)
        loom_free(loom_alloc(m->k->lm_head_lp_scratch(m->B * m->T, m->Vl), LOOM_MEM_ACTIVATIONS));
    /* fp8's quantised operands, for the largest of the four linear layers
     * (rows: a tensor-parallel region's, all of B*T) */
    if (m->base.fp8) {
        const size_t N = (size_t)m->B * m->T, C = (size_t)m->cfg.hidden, F = 4 * (size_t)m->Cl;
        loom_fp8_reserve(m->base.fp8, N * F, C * F, N * F, !m->k->matmul_forward_b16);
    }
    if (m->exact.pieces) { /* --layout-invariant's scratch: the four products and the head */
        const int N = m->B * m->T, C = m->cfg.hidden, Cl = m->Cl;
        const int in16 = b16(m) && !m->rg.sp, qkv[3] = {Cl, Cl, Cl}, fc = 4 * Cl;
        int layers = 0;
        for (int l = 0; l < m->cfg.num_layers; l++) layers += m->stage.block[l] >= 0;
        if (layers) {
            loom_tp_exact_reserve_column(&m->exact, &m->rg, qkv, 3, in16, 1, N, C);
            loom_tp_exact_reserve_column(&m->exact, &m->rg, &fc, 1, in16, 1, N, C);
            loom_tp_exact_reserve_row(&m->exact, &m->rg, 0, N, Cl, C);
            loom_tp_exact_reserve_row(&m->exact, &m->rg, 0, N, 4 * Cl, C);
        }
        if (m->head >= 0) loom_tp_exact_reserve_head(&m->exact, &m->rg, m->act_dtype, N, C, m->cfg.vocab);
    }
    if (per_micro_tied(m) && m->head >= 0 && !m->tied_sends) /* each micro-batch's share of the table */
        m->tied_sends = loom_pp_tied_copies_alloc((size_t)m->Vl * m->cfg.hidden, m->base.step_micros);
}

static size_t boundary_numel(const struct loom_model *model, int rows)
{
    const struct loom_gpt2 *m = model->user;
    return (size_t)loom_tp_rows_held(&m->rg, rows * m->T) * m->cfg.hidden;
}

static int tied_embedding(struct loom_model *model, struct loom_tied_embedding *te)
{
    struct loom_gpt2 *m = loom_gpt2_of(model);
    const struct loom_gpt2_acts *a = m->slots ? &m->slots[m->bwd_slot] : NULL;
    if (m->cfg.untied || m->emb < 0 || m->head < 0) return 0; /* the head has its own weight, or a copy */
    *te = (struct loom_tied_embedding){.block = m->emb,
                                       .vocab = m->Vl,
                                       .width = m->cfg.hidden,
                                       .max_rows = (size_t)m->B * m->T,
                                       .rows = a ? (size_t)a->rows * m->T : 0,
                                       .tokens = a ? a->inputs : NULL,
                                       .dout = m->dres,
                                       .defer = &m->defer_wte_scatter};
    return 1;
}

static const float *logits(struct loom_model *model)
{
    struct loom_gpt2 *m = loom_gpt2_of(model);
    LOOM_ASSERT(m->tp == 1 && !lp(m)); /* a tp rank holds its vocabulary's columns only; kept as float32 */
    return m->slots ? m->slots[0].logits : NULL;
}

void loom_gpt2_logits(const struct loom_gpt2 *m, float *dst)
{
    const struct loom_gpt2_acts *a = &m->slots[0];
    get(m, dst, a->logits, (size_t)a->rows * m->T * m->Vl);
}

static const struct loom_model_ops gpt2_ops = {.forward = forward,
                                               .backward = backward,
                                               .set_slots = set_slots,
                                               .boundary_numel = boundary_numel,
                                               .tied_embedding = tied_embedding,
                                               .logits = logits,
                                               .reserve = reserve};

struct loom_gpt2 *loom_gpt2_of(struct loom_model *m)
{
    LOOM_ASSERT(m->ops == &gpt2_ops);
    return m->user;
}

struct loom_gpt2 *loom_gpt2_create(const struct loom_gpt2_config *cfg, int B, int T)
{
    return loom_gpt2_create_tp(cfg, B, T, 1, 0);
}

struct loom_gpt2 *loom_gpt2_create_tp(const struct loom_gpt2_config *cfg, int B, int T, int tp, int tp_rank)
{
    const int lo = 0, hi = cfg->num_layers - 1;
    struct loom_gpt2 *m = loom_gpt2_create_stage(cfg, B, T, tp, tp_rank, 1, &lo, &hi, 1, 1);
    m->pipelined = 0;
    return m;
}

struct loom_gpt2 *loom_gpt2_create_stage(const struct loom_gpt2_config *cfg, int B, int T, int tp,
                                         int tp_rank, int chunks, const int *lo, const int *hi, int embedding,
                                         int head)
{
    LOOM_ASSERT(tp >= 1 && tp_rank >= 0 && tp_rank < tp && cfg->hidden % tp == 0 && cfg->heads % tp == 0);
    struct loom_gpt2 *m = loom_alloc(sizeof *m, LOOM_MEM_OTHER);
    m->cfg = *cfg;
    m->tp = tp;
    m->rg = (struct loom_tp_regions){.tp = tp, .width = cfg->hidden};
    m->tp_rank = tp_rank;
    m->Cl = cfg->hidden / tp;
    m->NHl = cfg->heads / tp;
    int64_t v0, v1;
    loom_tp_part(cfg->vocab, tp, tp_rank, &v0, &v1);
    m->v0 = (int)v0;
    m->Vl = (int)(v1 - v0);
    m->B = B;
    m->T = T;
    m->act_dtype = LOOM_DTYPE_F32;
    m->recompute = LOOM_RECOMPUTE_NONE;
    m->recompute_method = LOOM_RECOMPUTE_METHOD_NONE;
    m->nslots = 1;
    loom_pp_stage_layers_init(&m->stage, cfg->num_layers, chunks, lo, hi, embedding, head);
    loom_model_init(&m->base, &gpt2_ops, "gpt2", m->stage.nblocks);
    m->base.tp = tp;
    m->base.tp_rank = tp_rank;
    m->base.user = m;
    m->base.family = &loom_gpt2_family;
    m->k = m->base.backend->k;
    m->pipelined = 1;
    layout_blocks(m, embedding, head);
    loom_model_layout_done(&m->base);
    m->emb = loom_model_find_role(&m->base, LOOM_ROLE_EMBEDDING);
    m->head = loom_model_find_role(&m->base, LOOM_ROLE_HEAD);
    if (tied_across_stages(m))
        loom_pp_tied_alloc(&m->tied_copy, &m->tied_grad, (size_t)m->Vl * cfg->hidden, m->head >= 0);
    return m;
}

void loom_gpt2_free(struct loom_gpt2 *m)
{
    if (!m) return;
    loom_model_release(&m->base);
    free_activations(m);
    loom_pp_stage_layers_free(&m->stage);
    loom_pp_tied_free(m->tied_copy, m->tied_grad);
    loom_pp_tied_copies_free(m->tied_sends, m->base.step_micros);
    loom_fp8_destroy(m->base.fp8);
    loom_model_sparse_layout_free(m->sparse);
    loom_tp_exact_free(&m->exact);
    loom_free(m);
}

/* indices of the tensors of a layer block, in layout order */
enum { LN1_W, LN1_B, QKV_W, QKV_B, ATTPROJ_W, ATTPROJ_B, LN2_W, LN2_B, FC_W, FC_B, FCPROJ_W, FCPROJ_B };

/* ---- tensor-parallel regions: entered and left through m->rg (layers/tp_regions.h) */

/* LayerNorm's backward over the rows this rank holds; under sequence
 * parallelism its weight and bias gradients are partial sums over those
 * rows, summed over the tp group before they accumulate. */
static void norm_backward(struct loom_gpt2 *m, float *dinp, float *dweight, float *dbias, const float *dout,
                          const float *inp, const float *weight, const float *mean, const float *rstd, int Nr)
{
    const int C = m->cfg.hidden;
    if (m->exact.pieces) { /* the weight and bias gradients in the row pieces, summed exactly */
        const int N = m->rg.sp ? Nr * m->tp : Nr;
        float *g = m->norm_grads;
        double *acc = loom_tp_exact_sum(&m->exact, 2 * (size_t)C);
        for (int j = 0; j < loom_tp_exact_row_pieces(&m->exact, &m->rg); j++) {
            int lo, hi;
            loom_tp_exact_row_piece(&m->exact, &m->rg, N, j, &lo, &hi);
            const size_t at = (size_t)lo * C;
            memset(g, 0, 2 * (size_t)C * sizeof *g);
            m->k->layernorm_backward(dinp + at, g, g + C, dout + at, inp + at, weight, mean + lo, rstd + lo,
                                     hi - lo, C);
            loom_tp_exact_add(acc, g, 2 * (size_t)C);
        }
        loom_tp_exact_rows_sum(&m->rg, acc, 2 * (size_t)C);
        loom_tp_exact_add_rounded(dweight, acc, (size_t)C);
        loom_tp_exact_add_rounded(dbias, acc + C, (size_t)C);
        return;
    }
    if (!m->rg.sp) {
        m->k->layernorm_backward(dinp, dweight, dbias, dout, inp, weight, mean, rstd, Nr, C);
        return;
    }
    float *g = m->norm_grads;
    memset(g, 0, 2 * (size_t)C * sizeof *g);
    m->k->layernorm_backward(dinp, g, g + C, dout, inp, weight, mean, rstd, Nr, C);
    loom_tp_allreduce(g, 2 * (size_t)C, LOOM_OP_SUM);
    for (int c = 0; c < C; c++) {
        dweight[c] += g[c];
        dbias[c] += g[C + c];
    }
}

/* ---- dense layers: bf16 operands go to the bf16 products as they are ------------ */

/* Whether the products take kept bf16 activations and stored bf16
 * parameters without converting them (the backend's optional *_b16). */
static int b16(const struct loom_gpt2 *m)
{
    return m->act_dtype == LOOM_DTYPE_BF16 && m->k->matmul_forward_b16;
}

/* Kept activation x as those products take it, or NULL: a tensor-parallel
 * region's input (`region`) is other rows than the kept ones under sequence
 * parallelism (gathered). */
static const uint16_t *kept16(const struct loom_gpt2 *m, const void *x, int region)
{
    return b16(m) && !(region && m->rg.sp) ? x : NULL;
}

/* The four fp8 linear layers of each layer block, in block order: QKV_W,
 * ATTPROJ_W, FC_W, FCPROJ_W. */
static const int FP8_LINEARS[4] = {QKV_W, ATTPROJ_W, FC_W, FCPROJ_W};

int loom_gpt2_set_sparse(struct loom_gpt2 *m, const struct loom_sparse_config *sc)
{
    LOOM_ASSERT(!m->slots && !m->sparse); /* before the activations are sized */
    return loom_model_sparse_layout(sc, m->cfg.heads, m->T, &m->sparse);
}

void loom_gpt2_set_fp8(struct loom_gpt2 *m, const struct loom_fp8_recipe *r)
{
    m->base.fp8 = loom_fp8_create(r, &m->base, FP8_LINEARS, 4);
}

/* out = inp @ W + bias, W tensor w of block b; inp (float32 values) may be
 * NULL where x16 (kept16's) holds it. */
static void dense_forward(struct loom_gpt2 *m, float *out, const float *inp, const uint16_t *x16,
                          struct loom_block *b, int w, const float *bias, int N, int C, int OC)
{
    if (m->base.fp8)
        loom_fp8_linear_forward(m->base.fp8, loom_fp8_linear_of(m->base.fp8, &m->base, b, w), m->k, out, inp,
                                x16, loom_param(b, w), param16(b, w), bias, N, C, OC);
    else if (b16(m))
        m->k->matmul_forward_b16(out, inp, x16, loom_param(b, w), param16(b, w), bias, N, C, OC);
    else
        m->k->matmul_forward(out, inp, loom_param(b, w), bias, N, C, OC);
}

/* Its backward: dinp written, W's gradient and its bias's (tensor w + 1)
 * accumulate. */
static void dense_backward(struct loom_gpt2 *m, float *dinp, struct loom_block *b, int w, const float *dout,
                           const float *inp, const uint16_t *x16, int N, int C, int OC)
{
    if (m->base.fp8)
        loom_fp8_linear_backward(m->base.fp8, loom_fp8_linear_of(m->base.fp8, &m->base, b, w), m->k, dinp,
                                 loom_grad(b, w), loom_grad(b, w + 1), dout, inp, x16, loom_param(b, w),
                                 param16(b, w), N, C, OC);
    else if (b16(m))
        m->k->matmul_backward_b16(dinp, loom_grad(b, w), loom_grad(b, w + 1), dout, inp, x16,
                                  loom_param(b, w), param16(b, w), N, C, OC);
    else
        m->k->matmul_backward(dinp, loom_grad(b, w), loom_grad(b, w + 1), dout, inp, loom_param(b, w), N, C,
                              OC);
}

/* The attention kernels: the layout's block-sparse ones, else the dense
 * causal ones of the table. */
static void attn_fwd(struct loom_gpt2 *m, float *out, float *att, const float *qkv, int B)
{
    if (m->sparse)
        loom_sparse_attention_forward(out, att, qkv, B, m->T, m->Cl, m->NHl, m->tp_rank * m->NHl, m->sparse);
    else
        m->k->attention_forward(out, att, qkv, B, m->T, m->Cl, m->NHl);
}

static void attn_bwd(struct loom_gpt2 *m, float *dqkv, float *datt, const float *dout, const float *att,
                     const float *qkv, int B)
{
    if (m->sparse)
        loom_sparse_attention_backward(dqkv, datt, dout, att, qkv, B, m->T, m->Cl, m->NHl,
                                       m->tp_rank * m->NHl, m->sparse);
    else
        m->k->attention_backward(dqkv, datt, dout, att, qkv, B, m->T, m->Cl, m->NHl);
}

/* Attention over B sequences from qkv (float32 values) into atty; the
 * probabilities into att, or with 16-bit activations one sequence at a time
 * into seq_att, not kept. */
static void attention_forward(struct loom_gpt2 *m, float *atty, float *att, const float *qkv, int B)
{
    const int T = m->T, Cl = m->Cl;
    if (!lp(m)) {
        attn_fwd(m, atty, att, qkv, B);
        return;
    }
    for (int b = 0; b < B; b++)
        attn_fwd(m, atty + (size_t)b * T * Cl, m->seq_att, qkv + (size_t)b * T * 3 * Cl, 1);
}

/* Attention's backward: m->dqkv from m->dbufC (the gradient at its output)
 * and qkv (float32 values). The probabilities are recomputed first where
 * none were kept (selective recomputation; 16-bit activations, one
 * sequence at a time, the output dropped into m->dbuf4a, which holds
 * nothing then). */
static void attention_backward(struct loom_gpt2 *m, struct loom_layer_acts *x, const float *qkv, int B)
{
    const int T = m->T, Cl = m->Cl;
    if (!lp(m)) {
        if (m->recompute == LOOM_RECOMPUTE_SELECTIVE) /* the kept atty is not overwritten */
            attn_fwd(m, m->scratchC, x->att, qkv, B);
        /* datt is the kernel's own scratch, read by nothing after it: not rounded */
        attn_bwd(m, m->dqkv, m->datt, m->dbufC, x->att, qkv, B);
        return;
    }
    for (int b = 0; b < B; b++) {
        const size_t q = (size_t)b * T * 3 * Cl, o = (size_t)b * T * Cl;
        attn_fwd(m, m->dbuf4a + o, m->seq_att, qkv + q, 1);
        attn_bwd(m, m->dqkv + q, m->datt, m->dbufC + o, m->seq_att, qkv + q, 1);
    }
}

/* --layout-invariant's products (layers/tp_exact.h) on weight w of block
 * b and its bias w + 1: a column-parallel product's OCl columns (C rows of
 * its [in, out] weight) are nseg equal segments (q | k | v, or fc's one),
 * with out or dout (N, OCl). */
static void segments(struct loom_tp_segment *seg, struct loom_block *b, int w, float *out, const float *dout,
                     int OCl, int nseg)
{
    const size_t width = (size_t)(OCl / nseg);
    for (int s = 0; s < nseg; s++) /* the gradients in the backward (dout) only */
        seg[s] = (struct loom_tp_segment){.width = (int)width,
                                          .W = loom_param(b, w) + s * width,
                                          .W16 = param16(b, w) ? param16(b, w) + s * width : NULL,
                                          .dW = dout ? loom_grad(b, w) + s * width : NULL,
                                          .ldw = OCl,
                                          .bias = loom_param(b, w + 1) + s * width,
                                          .dbias = dout ? loom_grad(b, w + 1) + s * width : NULL,
                                          .out = out ? out + s * width : NULL,
                                          .dout = dout ? dout + s * width : NULL,
                                          .ld = OCl};
}

static void column_forward(struct loom_gpt2 *m, float *out, const float *inp, const uint16_t *x16,
                           struct loom_block *b, int w, int N, int OCl, int nseg)
{
    if (!m->exact.pieces) {
        dense_forward(m, out, inp, x16, b, w, loom_param(b, w + 1), N, m->cfg.hidden, OCl);
        return;
    }
    struct loom_tp_segment seg[3];
    segments(seg, b, w, out, NULL, OCl, nseg);
    loom_tp_exact_column_forward(&m->exact, m->k, seg, nseg, inp, inp ? NULL : x16, 0, N, m->cfg.hidden);
}

/* Its backward: the weight's and bias's gradients accumulate, and the rows
 * this rank holds of the input gradient are returned (summed over the tp
 * group). */
static float *column_backward(struct loom_gpt2 *m, struct loom_block *b, int w, const float *dout,
                              const float *inp, const uint16_t *x16, int N, int OCl, int nseg)
{
    const int C = m->cfg.hidden;
    if (!m->exact.pieces) {
        dense_backward(m, m->dbufC, b, w, dout, inp, x16, N, C, OCl);
        return loom_tp_region_input_grad(&m->rg, m->dbufC, N);
    }
    struct loom_tp_segment seg[3];
    segments(seg, b, w, NULL, dout, OCl, nseg);
    return loom_tp_exact_column_backward(&m->exact, &m->rg, m->k, seg, nseg, inp, inp ? NULL : x16, 0,
                                         m->dbufC, N, C);
}

/* A row-parallel projection leaving its region: the rows this rank holds
 * of inp (N, Kl) @ W + bias. The bias is added once: by tp rank 0 to the
 * partial sums the reduction adds up, or under --layout-invariant to the sum. */
static float *row_forward(struct loom_gpt2 *m, const float *inp, const uint16_t *x16, struct loom_block *b,
                          int w, int N, int Kl)
{
    const int C = m->cfg.hidden;
    if (m->exact.pieces)
        return loom_tp_exact_row_forward(&m->exact, &m->rg, m->k, x16 ? NULL : inp, x16, loom_param(b, w),
                                         param16(b, w), 0, loom_param(b, w + 1), m->scratchC, N, Kl, C);
    dense_forward(m, m->scratchC, inp, x16, b, w, m->tp_rank == 0 ? loom_param(b, w + 1) : NULL, N, Kl, C);
    return loom_tp_region_output(&m->rg, m->scratchC, N);
}

/* Its backward from dout (every row): dinp (N, Kl) written, the weight's
 * and bias's gradients accumulate. */
static void row_backward(struct loom_gpt2 *m, float *dinp, struct loom_block *b, int w, const float *dout,
                         const float *inp, const uint16_t *x16, int N, int Kl)
{
    const int C = m->cfg.hidden;
    if (!m->exact.pieces) {
        dense_backward(m, dinp, b, w, dout, inp, x16, N, Kl, C);
        return;
    }
    loom_tp_exact_row_backward(&m->exact, m->k, dinp, loom_grad(b, w), loom_grad(b, w + 1), dout,
                               x16 ? NULL : inp, x16, loom_param(b, w), param16(b, w), 0, N, Kl, C);
}

/* Layer l's forward over B rows, from its input (the rows this rank holds,
 * of B*T) into a->layers[l] (the recompute scratch for a recomputed layer).
 * The backward reruns it to recompute, so nothing here may depend on when
 * it runs. With 16-bit activations the float32 values are staged in the
 * backward's scratch (the comments name it), each buffer reused once what
 * it held is read. */
static void layer_forward(struct loom_gpt2 *m, struct loom_gpt2_acts *a, int l, int B)
{
    const int T = m->T, C = m->cfg.hidden, Cl = m->Cl, N = B * T, Nr = loom_tp_rows_held(&m->rg, N);
    const size_t NrC = (size_t)Nr * C, NCl = (size_t)N * Cl;
    struct loom_block *b = &m->base.blocks[m->stage.block[l]];
    struct loom_layer_acts *x = &a->layers[l];
    const float *res = layer_input(m, a, l, m->dbufC, NrC);
    float *ln1 = out_of(m, x->ln1, m->scratchC);
    m->k->layernorm_forward(ln1, x->ln1_mean, x->ln1_rstd, res, loom_param(b, LN1_W), loom_param(b, LN1_B),
                            Nr, C, (float)m->cfg.norm_eps);
    keep(m, x->ln1, ln1, NrC);
    /* column-parallel QKV (this rank's heads), attention on them, row-parallel output projection */
    float *qkv = out_of(m, x->qkv, m->dqkv);
    column_forward(m, qkv, loom_tp_region_input(&m->rg, ln1, N), kept16(m, x->ln1, 1), b, QKV_W, N, 3 * Cl,
                   3);
    keep(m, x->qkv, qkv, 3 * NCl);
    float *atty = out_of(m, x->atty, m->dbuf4a);
    attention_forward(m, atty, x->att, qkv, B);
    keep(m, x->atty, atty, NCl);
    float *proj = row_forward(m, atty, kept16(m, x->atty, 0), b, ATTPROJ_W, N, Cl);
    round_act(m, proj, NrC);
    float *res2 = out_of(m, x->res2, m->stage_res);
    m->k->residual_forward(res2, res, proj, NrC);
    keep(m, x->res2, res2, NrC);
    float *ln2 = out_of(m, x->ln2, m->scratchC);
    m->k->layernorm_forward(ln2, x->ln2_mean, x->ln2_rstd, res2, loom_param(b, LN2_W), loom_param(b, LN2_B),
                            Nr, C, (float)m->cfg.norm_eps);
    keep(m, x->ln2, ln2, NrC);
    /* column-parallel fc, GELU on this rank's columns, row-parallel projection */
    float *fch = out_of(m, x->fch, m->dbuf4a);
    column_forward(m, fch, loom_tp_region_input(&m->rg, ln2, N), kept16(m, x->ln2, 1), b, FC_W, N, 4 * Cl, 1);
    keep(m, x->fch, fch, 4 * NCl);
    float *fch_gelu = out_of(m, x->fch_gelu, m->dbuf4b);
    if (m->cfg.activation == LOOM_ACTIVATION_GELU)
        m->k->gelu_exact_forward(fch_gelu, fch, 4 * NCl);
    else
        m->k->gelu_forward(fch_gelu, fch, 4 * NCl);
    keep(m, x->fch_gelu, fch_gelu, 4 * NCl);
    proj = row_forward(m, fch_gelu, kept16(m, x->fch_gelu, 0), b, FCPROJ_W, N, 4 * Cl);
    round_act(m, proj, NrC);
    float *res3 = out_of(m, x->res3, m->dbufC);
    m->k->residual_forward(res3, res2, proj, NrC);
    keep(m, x->res3, res3, NrC);
}

/* The layers [l0, l1] a block range [first, last] covers (l1 < l0: none). */
static void layers_of(const struct loom_gpt2 *m, int first, int last, int *l0, int *l1)
{
    /* no layer: [0, -1] before them (the embedding alone), [L, L-1] after (the head alone) */
    *l0 = last == m->head && first == m->head ? m->cfg.num_layers : 0;
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

/* Rows of logits the head computes at a time: all N, or with 16-bit
 * activations LOOM_GPT2_HEAD_ROWS through float32 staging. */
static int head_rows(const struct loom_gpt2 *m, int N)
{
    return lp(m) && N > LOOM_GPT2_HEAD_ROWS ? LOOM_GPT2_HEAD_ROWS : N;
}

/* Logits rows [r0, r0 + n) as float32: in place, or converted into
 * m->head_rows (n <= head_rows). */
static float *logits_rows(struct loom_gpt2 *m, struct loom_gpt2_acts *a, int r0, int n)
{
    const size_t at0 = (size_t)r0 * m->Vl;
    if (!lp(m)) return (float *)a->logits + at0;
    loom_lp_to_f32(m->head_rows, at(m, a->logits, at0), (size_t)n * m->Vl, m->act_dtype);
    return m->head_rows;
}

/* The loss of every row from this rank's logits (N, Vl) of vocabulary rows
 * [v0, v0 + Vl), never gathering the whole vocabulary: the row max, then the
 * sum of exponentials and the target's logit, each reduced over the tp
 * group; lse = max + log(sum), loss = lse - target logit. */
static void vocab_parallel_crossentropy(struct loom_gpt2 *m, struct loom_gpt2_acts *a, int N)
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
                                            n, m->cfg.vocab, m->v0, m->Vl);
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
    for (int i = 0; i < N; i++) {
        a->lse[i] = rowmax[i] + logf(sums[i]);
        a->losses[i] = a->lse[i] - sums[N + i];
    }
}

/* Blocks [first, last] on the slot's micro-batch. A range starting after the
 * embedding reads its input into the residual buffer the previous layer
 * would have written; one ending before the head writes its last layer's
 * output out. The head's LM head reads the tied table, which the embedding
 * block holds: a range with the head but not the embedding announces that
 * block around its use, so the model must hold it (one process; a pipeline's
 * last stage will hold a copy synced through the embedding group). Full
 * recomputation needs ranges that start at the embedding. */
static void forward(struct loom_model *model, int first, int last, struct loom_micro *mb)
{
    struct loom_gpt2 *m = loom_gpt2_of(model);
    const int B = mb->rows;
    LOOM_ASSERT(B >= 1 && B <= m->B && mb->slot >= 0 && mb->slot < m->nslots);
    LOOM_ASSERT(first <= last && first >= 0 && last < model->nblocks);
    if (!m->slots) alloc_activations(m);
    const int T = m->T, C = m->cfg.hidden, Vl = m->Vl, L = m->cfg.num_layers, N = B * T,
              Nr = loom_tp_rows_held(&m->rg, N);
    const size_t NrC = (size_t)Nr * C;
    struct loom_gpt2_acts *a = &m->slots[mb->slot];
    const struct loom_lm_batch *batch = mb->batch;
    a->inputs = batch ? batch->inputs : NULL;
    a->targets = batch ? batch->targets : NULL;
    a->rows = B;
    a->emb_open = 0;
    int l0, l1;
    layers_of(m, first, last, &l0, &l1);
    /* full recomputation reruns layers from their kept inputs: a range
     * starting at a layer must start a pipeline chunk (its input is kept) */
    LOOM_ASSERT(first == m->emb ||
                (mb->input && (m->recompute != LOOM_RECOMPUTE_FULL || (l0 < L && a->chunk_input[l0]))));
    if (first == m->emb) {
        struct loom_block *emb = &model->blocks[m->emb];
        loom_model_forward_begin(model, m->emb);
        float *enc = out_of(m, a->encoded, m->dbufC);
        if (m->tp == 1) {
            m->k->embedding_forward(enc, a->inputs, loom_param(emb, 0), loom_param(emb, 1), B, T, C);
        } else { /* vocab-parallel: this rank's vocabulary, the positions added once (tp rank 0), summed */
            m->k->embedding_vp_forward(m->scratchC, a->inputs, loom_param(emb, 0),
                                       m->tp_rank == 0 ? loom_param(emb, 1) : NULL, m->v0, Vl, B, T, C);
            memcpy(enc, loom_tp_region_output(&m->rg, m->scratchC, N), NrC * sizeof(float));
        }
        keep(m, a->encoded, enc, NrC);
        if (tied_across_stages(m) && mb->micro == 0) { /* the table, to the head's stage */
            memcpy(m->tied_copy, loom_param(emb, 0), (size_t)Vl * C * sizeof(float));
            loom_pp_tied_weights_send(m->tied_copy, (size_t)Vl * C);
        }
        loom_model_forward_end(model, m->emb);
    } else if (l0 < L && a->chunk_input[l0]) {
        memcpy(a->chunk_input[l0], mb->input, NrC * sizeof(float));
    } else { /* the embedding's output, or the layer's before, which another range ran */
        put(m, l0 == 0 ? a->encoded : a->layers[l0 - 1].res3, mb->input, NrC);
    }
    for (int l = l0; l <= l1; l++) {
        loom_model_forward_begin(model, m->stage.block[l]);
        layer_forward(m, a, l, B);
        loom_model_forward_end(model, m->stage.block[l]);
    }
    if (last != m->head) {
        get(m, mb->output, l1 >= 0 ? a->layers[l1].res3 : a->encoded, NrC);
        return;
    }
    struct loom_block *head = &model->blocks[m->head];
    /* a tied LM head reads the embedding's table: announced again when the
     * embedding is not in this range (its holder gathered or converted it
     * once more) */
    const int announce_emb = first != m->emb && !m->cfg.untied && m->emb >= 0;
    if (announce_emb) loom_model_forward_begin(model, m->emb);
    if (tied_across_stages(m) && mb->micro == 0) { /* the table, from the embedding's stage */
        loom_pp_tied_weights_recv(m->tied_copy, (size_t)Vl * C);
        memset(m->tied_grad, 0, (size_t)Vl * C * sizeof(float));
    }
    loom_model_forward_begin(model, m->head);
    m->k->layernorm_forward(a->lnf, a->lnf_mean, a->lnf_rstd, view(m, a->layers[L - 1].res3, m->dbufC, NrC),
                            loom_param(head, LNF_W), loom_param(head, LNF_B), Nr, C, (float)m->cfg.norm_eps);
    round_act(m, a->lnf, NrC);
    /* the logits: 16-bit ones as the product rounds them */
    const float *lnf = loom_tp_region_input(&m->rg, a->lnf, N);
    if (m->exact.pieces)
        loom_tp_exact_head_forward(&m->exact, m->k, a->logits, m->act_dtype, lnf, lm_head_weight(m),
                                   lm_head_weight16(m), N, C, m->cfg.vocab, Vl);
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
    double sum = 0;
    for (int i = 0; i < N; i++) sum += a->losses[i];
    mb->loss = (float)(sum / N);
}

/* Layer l's backward over B rows: m->dres holds the gradient at its output
 * (the rows this rank holds) and receives the gradient at its input; its
 * parameter gradients accumulate. With 16-bit activations the kept ones are
 * viewed through staging (named below) that the gradients leave free. */
static void layer_backward(struct loom_gpt2 *m, struct loom_gpt2_acts *a, int l, int B)
{
    const int T = m->T, C = m->cfg.hidden, Cl = m->Cl, N = B * T, Nr = loom_tp_rows_held(&m->rg, N);
    const size_t NrC = (size_t)Nr * C, NCl = (size_t)N * Cl;
    struct loom_block *b = &m->base.blocks[m->stage.block[l]];
    struct loom_layer_acts *x = &a->layers[l];
    /* MLP: res3 = res2 + fc_proj(gelu(fc(ln2(res2)))); the replicated bias's
     * gradient sums every row of dout, so it is the same on every tp rank */
    const float *dout = loom_tp_region_output_grad(&m->rg, m->dres, N);
    const uint16_t *x16 = kept16(m, x->fch_gelu, 0);
    row_backward(m, m->dbuf4a, b, FCPROJ_W, dout, x16 ? NULL : view(m, x->fch_gelu, m->dbuf4b, 4 * NCl), x16,
                 N, 4 * Cl);
    round_act(m, m->dbuf4a, 4 * NCl);
    /* GELU's gradient into dbuf4b, or over its output gradient in place
     * when dbuf4b stages fch (an elementwise kernel may) */
    const float *fch = view(m, x->fch, m->dbuf4b, 4 * NCl);
    float *dfch = lp(m) ? m->dbuf4a : m->dbuf4b;
    if (m->cfg.activation == LOOM_ACTIVATION_GELU)
        m->k->gelu_exact_backward(dfch, m->dbuf4a, fch, 4 * NCl);
    else
        m->k->gelu_backward(dfch, m->dbuf4a, fch, 4 * NCl);
    round_act(m, dfch, 4 * NCl);
    x16 = kept16(m, x->ln2, 1);
    float *dln = column_backward(
        m, b, FC_W, dfch, x16 ? NULL : loom_tp_region_input(&m->rg, view(m, x->ln2, m->scratchC, NrC), N),
        x16, N, 4 * Cl, 1);
    round_act(m, dln, NrC);
    norm_backward(m, m->dres, loom_grad(b, LN2_W), loom_grad(b, LN2_B), dln,
                  view(m, x->res2, m->stage_res, NrC), loom_param(b, LN2_W), x->ln2_mean, x->ln2_rstd, Nr);
    round_act(m, m->dres, NrC);
    /* attention: res2 = res + c_proj(attn(c_attn(ln1(res)))) */
    dout = loom_tp_region_output_grad(&m->rg, m->dres, N);
    x16 = kept16(m, x->atty, 0);
    row_backward(m, m->dbufC, b, ATTPROJ_W, dout, x16 ? NULL : view(m, x->atty, m->dbuf4a, NCl), x16, N, Cl);
    round_act(m, m->dbufC, NCl);
    attention_backward(m, x, view(m, x->qkv, m->dbuf4b, 3 * NCl), B);
    round_act(m, m->dqkv, 3 * NCl);
    x16 = kept16(m, x->ln1, 1);
    dln = column_backward(m, b, QKV_W, m->dqkv,
                          x16 ? NULL : loom_tp_region_input(&m->rg, view(m, x->ln1, m->scratchC, NrC), N),
                          x16, N, 3 * Cl, 3);
    round_act(m, dln, NrC);
    norm_backward(m, m->dres, loom_grad(b, LN1_W), loom_grad(b, LN1_B), dln,
                  layer_input(m, a, l, m->stage_res, NrC), loom_param(b, LN1_W), x->ln1_mean, x->ln1_rstd,
                  Nr);
    round_act(m, m->dres, NrC);
}

static void backward(struct loom_model *model, int first, int last, struct loom_micro *mb, float loss_weight)
{
    struct loom_gpt2 *m = loom_gpt2_of(model);
    struct loom_gpt2_acts *a = &m->slots[mb->slot];
    const int B = a->rows, T = m->T, C = m->cfg.hidden, Vl = m->Vl, L = m->cfg.num_layers, N = B * T,
              Nr = loom_tp_rows_held(&m->rg, N);
    const size_t NrC = (size_t)Nr * C;
    m->bwd_slot = mb->slot;
    int l0, l1;
    layers_of(m, first, last, &l0, &l1);
    if (last == m->head) {
        LOOM_ASSERT(a->targets != NULL);
        struct loom_block *head = &model->blocks[m->head];
        /* loss -> logits (in place, head_rows(N) rows at a time) -> final norm */
        const int R = head_rows(m, N);
        for (int r0 = 0; r0 < N; r0 += R) {
            const int n = N - r0 < R ? N - r0 : R;
            float *lg = logits_rows(m, a, r0, n);
            if (m->tp == 1 && !m->exact.pieces)
                m->k->crossentropy_backward(lg, a->lse + r0, lg, a->targets + r0, loss_weight / (float)N, n,
                                            Vl);
            else
                m->k->crossentropy_vp_backward(lg, a->lse + r0, lg, a->targets + r0, m->v0,
                                               loss_weight / (float)N, n, Vl);
            keep(m, at(m, a->logits, (size_t)r0 * Vl), lg,
                 (size_t)n * Vl); /* the logits' gradient, in place */
        }
        const int tied_here = !m->cfg.untied && m->emb >= 0;
        if (tied_here) {
            loom_model_backward_begin(model, m->emb);
            a->emb_open = 1; /* the embedding's gradients are open until its own backward */
        }
        loom_model_backward_begin(model, m->head);
        if (per_micro_tied(m)) { /* this micro-batch's share alone, sent below */
            memset(m->tied_grad, 0, (size_t)Vl * C * sizeof(float));
        }
        const float *lnf = loom_tp_region_input(&m->rg, a->lnf, N);
        float *dlnf;
        if (m->exact.pieces) {
            dlnf = loom_tp_exact_head_backward(&m->exact, &m->rg, m->k, lm_head_grad(m), a->logits,
                                               m->act_dtype, lnf, lm_head_weight(m), lm_head_weight16(m),
                                               m->dbufC, N, C, m->cfg.vocab, Vl);
        } else {
            if (lp(m)) /* the logits' gradient read in 16 bits */
                m->k->lm_head_backward_lp(m->dbufC, lm_head_grad(m), a->logits, m->act_dtype, lnf,
                                          lm_head_weight(m), lm_head_weight16(m), N, C, Vl);
            else
                m->k->lm_head_backward(m->dbufC, lm_head_grad(m), a->logits, lnf, lm_head_weight(m), N, C,
                                       Vl);
            dlnf = loom_tp_region_input_grad(&m->rg, m->dbufC, N); /* partial over this rank's vocabulary */
        }
        round_act(m, dlnf, NrC);
        if (tied_here) loom_model_grads_ready(model, LOOM_GRAD_READY_TIED_HEAD);
        /* the copy's gradient over the step, to the embedding's stage */
        if (per_micro_tied(m)) {
            LOOM_ASSERT(m->tied_sends && mb->micro < m->base.step_micros);
            loom_pp_tied_grads_send_copy(m->tied_grad, m->tied_sends[mb->micro], (size_t)Vl * C);
        } else if (tied_across_stages(m) && mb->micro == mb->micros - 1)
            loom_pp_tied_grads_send(m->tied_grad, (size_t)Vl * C);
        memset(m->dres, 0, NrC * sizeof(float));
        norm_backward(m, m->dres, loom_grad(head, LNF_W), loom_grad(head, LNF_B), dlnf,
                      view(m, a->layers[L - 1].res3, m->stage_res, NrC), loom_param(head, LNF_W), a->lnf_mean,
                      a->lnf_rstd, Nr);
        round_act(m, m->dres, NrC);
        loom_model_grads_ready(model, m->head);
        /* the logits are dead from here on: the recompute scratch in their buffer is free */
    } else {
        memcpy(m->dres, mb->doutput, NrC * sizeof(float));
    }
    /* m->dres is the gradient of the residual stream, flowing down */
    for (int l = l1; l >= l0; l--) {
        if (!recomputed(m, l)) {
            loom_model_backward_begin(model, m->stage.block[l]);
        } else if (l == chunk_last(m, l)) {
            /* entering a chunk from the top: rerun its forward from its kept input */
            const int cfirst = chunk_first(m, l);
            for (int k = l; k >= cfirst; k--) loom_model_backward_begin(model, m->stage.block[k]);
            for (int k = cfirst; k <= l; k++) layer_forward(m, a, k, B);
        }
        layer_backward(m, a, l, B);
        loom_model_grads_ready(model, m->stage.block[l]);
    }
    if (first != m->emb) {
        memcpy(mb->dinput, m->dres, NrC * sizeof(float));
        return;
    }
    struct loom_block *emb = &model->blocks[m->emb];
    if (!a->emb_open) loom_model_backward_begin(model, m->emb);
    if (per_micro_tied(m)) /* the head's share of this micro-batch first, as one process adds it */
        loom_pp_tied_grads_add(loom_grad(emb, 0), m->tied_grad, (size_t)Vl * C);
    if (m->tp == 1)
        m->k->embedding_backward(m->defer_wte_scatter ? NULL : loom_grad(emb, 0), loom_grad(emb, 1), m->dres,
                                 a->inputs, B, T, C);
    else /* this rank's vocabulary rows, from every row's gradient; the positions' gradient is the same on
          * every tp rank */
        m->k->embedding_vp_backward(loom_grad(emb, 0), loom_grad(emb, 1),
                                    loom_tp_region_output_grad(&m->rg, m->dres, N), a->inputs, m->v0, m->Vl,
                                    B, T, C);
    /* the head's share, from its stage, once per step */
    if (tied_across_stages(m) && !per_micro_tied(m) && mb->micro == mb->micros - 1)
        loom_pp_tied_grads_add(loom_grad(emb, 0), m->tied_grad, (size_t)Vl * C);
    loom_model_grads_ready(model, m->emb);
    a->emb_open = 0;
}

float loom_gpt2_forward(struct loom_gpt2 *m, const int32_t *inputs, const int32_t *targets, int B)
{
    const struct loom_lm_batch batch = {inputs, targets};
    struct loom_micro mb = {.slot = 0, .batch = &batch, .rows = B, .micros = 1};
    forward(&m->base, 0, m->base.nblocks - 1, &mb);
    return (float)mb.loss;
}

void loom_gpt2_backward(struct loom_gpt2 *m, float loss_weight)
{
    struct loom_micro mb = {.slot = 0, .micros = 1};
    backward(&m->base, 0, m->base.nblocks - 1, &mb, loss_weight);
}

double loom_gpt2_flops_per_token(const struct loom_gpt2 *m)
{
    /* the whole model's (MFU divides by the whole job's peak), whatever part this rank holds; a sparse
     * layout's attention counts its share of the causal blocks */
    const double attn = 12.0 * m->cfg.num_layers * (double)m->T * m->cfg.hidden;
    return 6.0 * loom_gpt2_num_params(&m->cfg) + attn * loom_model_sparsity_share(m->sparse);
}

double loom_gpt2_num_params(const struct loom_gpt2_config *cfg)
{
    const double C = cfg->hidden, V = cfg->vocab;
    return V * C * (cfg->untied ? 2 : 1) + (double)cfg->max_pos * C +
           cfg->num_layers * (12 * C * C + 13 * C) + 2 * C;
}
