/*
 * GPT-2: parameter layout, initialisation, forward and backward over the
 * blocks. The forward saves what the backward needs; the backward walks the
 * blocks in reverse and calls the grad-ready hook after each one.
 *
 * Activation recomputation (Megatron's):
 *   selective  no layer keeps its attention probabilities (B,NH,T,T); one
 *              shared buffer receives them in the forward, and the backward
 *              of each layer recomputes them from its kept qkv.
 *   full       a recomputed layer keeps only its input (the residual stream
 *              into it, which is the previous layer's output res3); its
 *              forward runs into shared scratch (`slots`: one layer's
 *              activations, N layers' under the uniform method) and runs
 *              again, into the same scratch, right before its backward.
 * Both reuse the forward's code (layer_forward), so the recomputed values
 * are bit for bit the first ones, and so are the gradients. The scratch is
 * needed only outside the life of the logits (from the LM head's forward to
 * its backward), so it lives in the logits' buffer.
 *
 * Activations in a 16-bit dtype (act_dtype BF16 or F16) are emulated: the
 * buffers stay float32 and the kernels compute in float32, but every
 * activation a kernel writes is rounded to the dtype right after it
 * (round_act), and in the backward every activation gradient too. Parameter
 * gradients are not rounded here: the engine's precision layer owns them.
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
#include "kernels/kernels.h"

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

static void add_tensor(struct loom_block *b, const char *name, int ndim, int64_t d0, int64_t d1)
{
    const int64_t shape[2] = {d0, d1};
    loom_block_add_tensor(b, name, ndim, shape);
}

static void layout_blocks(struct loom_gpt2 *m)
{
    const int L = m->cfg.num_layers, C = m->cfg.hidden;
    char name[LOOM_TENSOR_NAME_MAX];
    struct loom_block *e = &m->base.blocks[0];
    e->kind = LOOM_BLOCK_EMBEDDING;
    e->layer = -1;
    add_tensor(e, "wte.weight", 2, m->cfg.vocab, C);
    add_tensor(e, "wpe.weight", 2, m->cfg.max_pos, C);
    static const struct {
        const char *suffix;
        int ndim, rows, cols;
    } layer_tensors[] = {
        {"ln_1.weight", 1, 1, 0},      {"ln_1.bias", 1, 1, 0},          {"attn.c_attn.weight", 2, 1, 3},
        {"attn.c_attn.bias", 1, 3, 0}, {"attn.c_proj.weight", 2, 1, 1}, {"attn.c_proj.bias", 1, 1, 0},
        {"ln_2.weight", 1, 1, 0},      {"ln_2.bias", 1, 1, 0},          {"mlp.c_fc.weight", 2, 1, 4},
        {"mlp.c_fc.bias", 1, 4, 0},    {"mlp.c_proj.weight", 2, 4, 1},  {"mlp.c_proj.bias", 1, 1, 0},
    };
    for (int l = 0; l < L; l++) {
        struct loom_block *b = &m->base.blocks[1 + l];
        b->kind = LOOM_BLOCK_LAYER;
        b->layer = l;
        for (size_t i = 0; i < sizeof layer_tensors / sizeof layer_tensors[0]; i++) {
            snprintf(name, sizeof name, "h.%d.%s", l, layer_tensors[i].suffix);
            add_tensor(b, name, layer_tensors[i].ndim, (int64_t)layer_tensors[i].rows * C,
                       (int64_t)layer_tensors[i].cols * C);
        }
    }
    struct loom_block *h = &m->base.blocks[L + 1];
    h->kind = LOOM_BLOCK_HEAD;
    h->layer = -1;
    add_tensor(h, "ln_f.weight", 1, C, 0);
    add_tensor(h, "ln_f.bias", 1, C, 0);
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

/* ---- activations and their recomputation ------------------------------------ */

static size_t att_numel(const struct loom_gpt2 *m)
{
    return (size_t)m->B * m->cfg.heads * m->T * m->T;
}

/* Whether full recomputation reruns layer l's forward in the backward. */
static int recomputed(const struct loom_gpt2 *m, int l)
{
    if (m->recompute != LOOM_RECOMPUTE_FULL) return 0;
    return m->recompute_method == LOOM_RECOMPUTE_UNIFORM || l < m->recompute_num_layers;
}

/* Layers recomputed together: chunks of N under uniform (the last one
 * shorter when N does not divide L, as in Megatron), else one. */
static int chunk_len(const struct loom_gpt2 *m)
{
    return m->recompute_method == LOOM_RECOMPUTE_UNIFORM ? m->recompute_num_layers : 1;
}
static int chunk_first(const struct loom_gpt2 *m, int l)
{
    return l - l % chunk_len(m);
}
static int chunk_last(const struct loom_gpt2 *m, int l)
{
    const int last = chunk_first(m, l) + chunk_len(m) - 1;
    return last < m->cfg.num_layers - 1 ? last : m->cfg.num_layers - 1;
}

/* Whether layer l's output res3 has its own buffer: the next layer's input
 * (or the final norm's) is kept unless both layers are in one chunk. */
static int keeps_output(const struct loom_gpt2 *m, int l)
{
    return !recomputed(m, l) || l == chunk_last(m, l);
}

static const float *layer_input(const struct loom_gpt2 *m, int l)
{
    return l > 0 ? m->layers[l - 1].res3 : m->encoded;
}

/* Consecutive pieces of one buffer; with base NULL, only counted. */
struct carve {
    float *base;
    size_t used; /* floats */
};

/* n floats: allocated (c NULL), or the next piece of c's buffer, 64-byte
 * aligned like loom_alloc's, so the kernels see the same alignment. */
static float *piece(struct carve *c, size_t n)
{
    if (!c) return act(n);
    float *p = c->base ? c->base + c->used : NULL;
    c->used += (n + 15) & ~(size_t)15;
    return p;
}

/* A layer's saved state; att and res3 only when asked for. */
static void layer_buffers(const struct loom_gpt2 *m, struct loom_layer_acts *a, struct carve *c, int with_att,
                          int with_res3)
{
    const size_t N = (size_t)m->B * m->T, C = (size_t)m->cfg.hidden;
    a->ln1 = piece(c, N * C);
    a->ln1_mean = piece(c, N);
    a->ln1_rstd = piece(c, N);
    a->qkv = piece(c, N * 3 * C);
    a->atty = piece(c, N * C);
    a->att = with_att ? piece(c, att_numel(m)) : NULL;
    a->res2 = piece(c, N * C);
    a->ln2 = piece(c, N * C);
    a->ln2_mean = piece(c, N);
    a->ln2_rstd = piece(c, N);
    a->fch = piece(c, N * 4 * C);
    a->fch_gelu = piece(c, N * 4 * C);
    a->res3 = with_res3 ? piece(c, N * C) : NULL;
}

static void free_layer_buffers(struct loom_layer_acts *a)
{
    float *bufs[] = {a->ln1, a->ln1_mean, a->ln1_rstd, a->qkv, a->atty,     a->att, a->res2,
                     a->ln2, a->ln2_mean, a->ln2_rstd, a->fch, a->fch_gelu, a->res3};
    for (size_t i = 0; i < sizeof bufs / sizeof bufs[0]; i++) loom_free(bufs[i]);
}

/* Every activation buffer, for the recompute settings. A recomputed layer
 * gets no buffer of its own but its kept output; the recompute scratch (the
 * slots, or selective's shared att) is carved from the logits' buffer,
 * which grows to hold it when B*T*V floats would not. */
static void alloc_activations(struct loom_gpt2 *m)
{
    const int L = m->cfg.num_layers, selective = m->recompute == LOOM_RECOMPUTE_SELECTIVE;
    const int nslots = m->recompute == LOOM_RECOMPUTE_FULL ? chunk_len(m) : 0;
    const size_t C = (size_t)m->cfg.hidden, N = (size_t)m->B * m->T,
                 NV = loom_mul_size(N, (size_t)m->cfg.vocab);
    m->layers = loom_alloc(sizeof *m->layers * (size_t)L, LOOM_MEM_OTHER);
    if (nslots) m->slots = loom_alloc(sizeof *m->slots * (size_t)nslots, LOOM_MEM_OTHER);
    /* measure the scratch, allocate, then carve it. The last slot's output
     * is always a kept input (a chunk ends there), so it has no res3. */
    struct carve c = {NULL, 0};
    float *shared_att = NULL;
    for (int pass = 0; pass < 2; pass++) {
        c.used = 0;
        for (int s = 0; s < nslots; s++) layer_buffers(m, &m->slots[s], &c, 1, s < nslots - 1);
        if (selective) shared_att = piece(&c, att_numel(m));
        if (pass == 0) {
            m->logits_numel = c.used > NV ? c.used : NV;
            c.base = m->logits = act(m->logits_numel);
        }
    }
    for (int l = 0; l < L; l++) {
        struct loom_layer_acts *a = &m->layers[l];
        if (recomputed(m, l)) {
            *a = m->slots[l - chunk_first(m, l)];
            if (keeps_output(m, l)) a->res3 = act(N * C);
        } else {
            layer_buffers(m, a, NULL, !selective, 1);
            if (selective) a->att = shared_att;
        }
    }
    m->encoded = act(N * C);
    m->lnf = act(N * C);
    m->lnf_mean = act(N);
    m->lnf_rstd = act(N);
    m->losses = act(N);
    m->lse = act(N);
    m->dres = act(N * C);
    m->dbufC = act(N * C);
    m->dqkv = act(N * 3 * C);
    m->datt = act(att_numel(m));
    m->dbuf4a = act(N * 4 * C);
    m->dbuf4b = act(N * 4 * C);
    m->scratchC = act(N * C);
}

static void free_activations(struct loom_gpt2 *m)
{
    if (!m->layers) return;
    for (int l = 0; l < m->cfg.num_layers; l++) {
        struct loom_layer_acts *a = &m->layers[l];
        if (recomputed(m, l)) {
            if (keeps_output(m, l)) loom_free(a->res3);
            continue;
        }
        /* selective's shared att lives in the logits' buffer */
        if (m->recompute == LOOM_RECOMPUTE_SELECTIVE) a->att = NULL;
        free_layer_buffers(a);
    }
    float *bufs[] = {m->encoded, m->lnf,   m->lnf_mean, m->lnf_rstd, m->logits, m->losses, m->lse,
                     m->dres,    m->dbufC, m->dqkv,     m->datt,     m->dbuf4a, m->dbuf4b, m->scratchC};
    for (size_t i = 0; i < sizeof bufs / sizeof bufs[0]; i++) loom_free(bufs[i]);
    loom_free(m->layers);
    loom_free(m->slots);
    m->layers = m->slots = NULL;
}

void loom_gpt2_set_recompute(struct loom_gpt2 *m, enum loom_recompute granularity,
                             enum loom_recompute_method method, int num_layers)
{
    const int L = m->cfg.num_layers;
    LOOM_ASSERT(m->layers == NULL); /* the activations are laid out for it at the first forward */
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

static void init_block(struct loom_model *model, int bi, uint64_t seed);

static float forward(struct loom_model *model, const void *batch, int rows)
{
    const struct loom_gpt2_batch *b = batch;
    return loom_gpt2_forward(loom_gpt2_of(model), b->inputs, b->targets, rows);
}

static void backward(struct loom_model *model, float loss_weight)
{
    loom_gpt2_backward(loom_gpt2_of(model), loss_weight);
}

static int tied_embedding(struct loom_model *model, struct loom_tied_embedding *te)
{
    struct loom_gpt2 *m = loom_gpt2_of(model);
    *te = (struct loom_tied_embedding){.block = 0,
                                       .vocab = m->cfg.vocab,
                                       .width = m->cfg.hidden,
                                       .max_rows = (size_t)m->B * m->T,
                                       .rows = (size_t)m->fwd_B * m->T,
                                       .tokens = m->inputs,
                                       .dout = m->dres,
                                       .defer = &m->defer_wte_scatter};
    return 1;
}

static const struct loom_model_ops gpt2_ops = {forward, backward, init_block, tied_embedding};

struct loom_gpt2 *loom_gpt2_of(struct loom_model *m)
{
    LOOM_ASSERT(m->ops == &gpt2_ops);
    return m->user;
}

struct loom_gpt2 *loom_gpt2_create(const struct loom_gpt2_config *cfg, int B, int T)
{
    struct loom_gpt2 *m = loom_alloc(sizeof *m, LOOM_MEM_OTHER);
    m->cfg = *cfg;
    m->B = B;
    m->T = T;
    m->act_dtype = LOOM_DTYPE_F32;
    m->recompute = LOOM_RECOMPUTE_NONE;
    m->recompute_method = LOOM_RECOMPUTE_METHOD_NONE;
    const int L = cfg->num_layers;
    loom_model_init(&m->base, &gpt2_ops, "gpt2", L + 2);
    m->base.user = m;
    layout_blocks(m);
    loom_model_layout_done(&m->base);
    return m;
}

void loom_gpt2_free(struct loom_gpt2 *m)
{
    if (!m) return;
    loom_model_release(&m->base);
    free_activations(m);
    loom_free(m);
}

static void init_block(struct loom_model *model, int bi, uint64_t seed)
{
    struct loom_gpt2 *m = loom_gpt2_of(model);
    const double proj_std = 0.02 / sqrt(2.0 * m->cfg.num_layers);
    {
        struct loom_block *b = &m->base.blocks[bi];
        for (int ti = 0; ti < b->ntensors; ti++) {
            struct loom_tensor *t = &b->tensors[ti];
            float *p = b->params + t->offset;
            const char *leaf = strrchr(t->name, '.') + 1;
            int is_norm = strstr(t->name, "ln_") != NULL;
            if (strcmp(leaf, "bias") == 0) {
                memset(p, 0, t->numel * sizeof *p);
            } else if (is_norm) {
                for (size_t i = 0; i < t->numel; i++) p[i] = 1.0f;
            } else {
                double std = strstr(t->name, "c_proj.weight") ? proj_std : 0.02;
                struct loom_rng rng;
                loom_rng_seed(&rng, loom_hash3(seed, (uint64_t)bi, (uint64_t)ti));
                for (size_t i = 0; i < t->numel; i++) p[i] = (float)(std * loom_rng_normal(&rng));
            }
        }
    }
}

/* indices of the tensors of a layer block, in layout order */
enum { LN1_W, LN1_B, QKV_W, QKV_B, ATTPROJ_W, ATTPROJ_B, LN2_W, LN2_B, FC_W, FC_B, FCPROJ_W, FCPROJ_B };

/* Layer l's forward over B rows, from its input res (B,T,C) into m->layers[l]
 * (the recompute scratch for a recomputed layer). The backward reruns it to
 * recompute, so nothing here may depend on when it runs. */
static void layer_forward(struct loom_gpt2 *m, int l, const float *res, int B)
{
    const int T = m->T, C = m->cfg.hidden, NH = m->cfg.heads, N = B * T;
    const size_t NC = (size_t)N * C;
    struct loom_block *b = &m->base.blocks[1 + l];
    struct loom_layer_acts *a = &m->layers[l];
    loom_layernorm_forward(a->ln1, a->ln1_mean, a->ln1_rstd, res, loom_param(b, LN1_W), loom_param(b, LN1_B),
                           N, C);
    round_act(m, a->ln1, NC);
    loom_matmul_forward(a->qkv, a->ln1, loom_param(b, QKV_W), loom_param(b, QKV_B), N, C, 3 * C);
    round_act(m, a->qkv, 3 * NC);
    loom_attention_forward(a->atty, a->att, a->qkv, B, T, C, NH);
    round_act(m, a->atty, NC);
    loom_matmul_forward(m->scratchC, a->atty, loom_param(b, ATTPROJ_W), loom_param(b, ATTPROJ_B), N, C, C);
    round_act(m, m->scratchC, NC);
    loom_residual_forward(a->res2, res, m->scratchC, NC);
    round_act(m, a->res2, NC);
    loom_layernorm_forward(a->ln2, a->ln2_mean, a->ln2_rstd, a->res2, loom_param(b, LN2_W),
                           loom_param(b, LN2_B), N, C);
    round_act(m, a->ln2, NC);
    loom_matmul_forward(a->fch, a->ln2, loom_param(b, FC_W), loom_param(b, FC_B), N, C, 4 * C);
    round_act(m, a->fch, 4 * NC);
    loom_gelu_forward(a->fch_gelu, a->fch, 4 * NC);
    round_act(m, a->fch_gelu, 4 * NC);
    loom_matmul_forward(m->scratchC, a->fch_gelu, loom_param(b, FCPROJ_W), loom_param(b, FCPROJ_B), N, 4 * C,
                        C);
    round_act(m, m->scratchC, NC);
    loom_residual_forward(a->res3, a->res2, m->scratchC, NC);
    round_act(m, a->res3, NC);
}

float loom_gpt2_forward(struct loom_gpt2 *m, const int32_t *inputs, const int32_t *targets, int B)
{
    LOOM_ASSERT(B >= 1 && B <= m->B);
    if (!m->layers) alloc_activations(m);
    const int T = m->T, C = m->cfg.hidden, V = m->cfg.vocab;
    const int L = m->cfg.num_layers, N = B * T;
    m->inputs = inputs;
    m->targets = targets;
    m->fwd_B = B;
    struct loom_block *emb = &m->base.blocks[0];
    loom_model_forward_begin(&m->base, 0);
    loom_embedding_forward(m->encoded, inputs, loom_param(emb, 0), loom_param(emb, 1), B, T, C);
    round_act(m, m->encoded, (size_t)N * C);
    loom_model_forward_end(&m->base, 0);
    for (int l = 0; l < L; l++) {
        loom_model_forward_begin(&m->base, 1 + l);
        layer_forward(m, l, layer_input(m, l), B);
        loom_model_forward_end(&m->base, 1 + l);
    }
    struct loom_block *head = &m->base.blocks[L + 1];
    loom_model_forward_begin(&m->base, L + 1);
    loom_layernorm_forward(m->lnf, m->lnf_mean, m->lnf_rstd, layer_input(m, L), loom_param(head, 0),
                           loom_param(head, 1), N, C);
    round_act(m, m->lnf, (size_t)N * C);
    loom_model_forward_end(&m->base, L + 1);
    loom_lm_head_forward(m->logits, m->lnf, loom_param(emb, 0), N, C, V);
    round_act(m, m->logits, (size_t)N * V);
    if (!targets) return 0.0f;
    loom_crossentropy_forward(m->losses, m->lse, m->logits, targets, N, V);
    double sum = 0;
    for (int i = 0; i < N; i++) sum += m->losses[i];
    return (float)(sum / N);
}

/* Layer l's backward over B rows: m->dres holds the gradient at its output
 * and receives the gradient at its input; its parameter gradients accumulate. */
static void layer_backward(struct loom_gpt2 *m, int l, int B)
{
    const int T = m->T, C = m->cfg.hidden, NH = m->cfg.heads, N = B * T;
    const size_t NC = (size_t)N * C;
    struct loom_block *b = &m->base.blocks[1 + l];
    struct loom_layer_acts *a = &m->layers[l];
    /* MLP: res3 = res2 + fc_proj(gelu(fc(ln2(res2)))) */
    loom_matmul_backward(m->dbuf4a, loom_grad(b, FCPROJ_W), loom_grad(b, FCPROJ_B), m->dres, a->fch_gelu,
                         loom_param(b, FCPROJ_W), N, 4 * C, C);
    round_act(m, m->dbuf4a, 4 * NC);
    loom_gelu_backward(m->dbuf4b, m->dbuf4a, a->fch, 4 * NC);
    round_act(m, m->dbuf4b, 4 * NC);
    loom_matmul_backward(m->dbufC, loom_grad(b, FC_W), loom_grad(b, FC_B), m->dbuf4b, a->ln2,
                         loom_param(b, FC_W), N, C, 4 * C);
    round_act(m, m->dbufC, NC);
    loom_layernorm_backward(m->dres, loom_grad(b, LN2_W), loom_grad(b, LN2_B), m->dbufC, a->res2,
                            loom_param(b, LN2_W), a->ln2_mean, a->ln2_rstd, N, C);
    round_act(m, m->dres, NC);
    /* attention: res2 = res + c_proj(attn(c_attn(ln1(res)))) */
    loom_matmul_backward(m->dbufC, loom_grad(b, ATTPROJ_W), loom_grad(b, ATTPROJ_B), m->dres, a->atty,
                         loom_param(b, ATTPROJ_W), N, C, C);
    round_act(m, m->dbufC, NC);
    if (m->recompute == LOOM_RECOMPUTE_SELECTIVE) {
        /* the probabilities again, from the kept qkv; the output (kept as atty) is dropped */
        loom_attention_forward(m->scratchC, a->att, a->qkv, B, T, C, NH);
    }
    /* datt is the kernel's own scratch, read by nothing after it: not rounded */
    loom_attention_backward(m->dqkv, m->datt, m->dbufC, a->att, a->qkv, B, T, C, NH);
    round_act(m, m->dqkv, 3 * NC);
    loom_matmul_backward(m->dbufC, loom_grad(b, QKV_W), loom_grad(b, QKV_B), m->dqkv, a->ln1,
                         loom_param(b, QKV_W), N, C, 3 * C);
    round_act(m, m->dbufC, NC);
    loom_layernorm_backward(m->dres, loom_grad(b, LN1_W), loom_grad(b, LN1_B), m->dbufC, layer_input(m, l),
                            loom_param(b, LN1_W), a->ln1_mean, a->ln1_rstd, N, C);
    round_act(m, m->dres, NC);
}

void loom_gpt2_backward(struct loom_gpt2 *m, float loss_weight)
{
    LOOM_ASSERT(m->targets != NULL);
    const int B = m->fwd_B, T = m->T, C = m->cfg.hidden, V = m->cfg.vocab;
    const int L = m->cfg.num_layers, N = B * T;
    struct loom_block *emb = &m->base.blocks[0], *head = &m->base.blocks[L + 1];

    /* loss -> logits (in place) -> final norm */
    loom_crossentropy_backward(m->logits, m->lse, m->logits, m->targets, loss_weight / (float)N, N, V);
    round_act(m, m->logits, (size_t)N * V);
    loom_model_backward_begin(&m->base, 0);
    loom_model_backward_begin(&m->base, L + 1);
    loom_lm_head_backward(m->dbufC, loom_grad(emb, 0), m->logits, m->lnf, loom_param(emb, 0), N, C, V);
    round_act(m, m->dbufC, (size_t)N * C);
    loom_model_grads_ready(&m->base, LOOM_GRAD_READY_TIED_HEAD);
    memset(m->dres, 0, (size_t)N * C * sizeof(float));
    loom_layernorm_backward(m->dres, loom_grad(head, 0), loom_grad(head, 1), m->dbufC, layer_input(m, L),
                            loom_param(head, 0), m->lnf_mean, m->lnf_rstd, N, C);
    round_act(m, m->dres, (size_t)N * C);
    loom_model_grads_ready(&m->base, L + 1);
    /* the logits are dead from here on: the recompute scratch in their buffer is free */

    /* m->dres is the gradient of the residual stream, flowing down */
    for (int l = L - 1; l >= 0; l--) {
        if (!recomputed(m, l)) {
            loom_model_backward_begin(&m->base, 1 + l);
        } else if (l == chunk_last(m, l)) {
            /* entering a chunk from the top: rerun its forward from its kept input */
            const int first = chunk_first(m, l);
            for (int k = l; k >= first; k--) loom_model_backward_begin(&m->base, 1 + k);
            for (int k = first; k <= l; k++) layer_forward(m, k, layer_input(m, k), B);
        }
        layer_backward(m, l, B);
        loom_model_grads_ready(&m->base, 1 + l);
    }
    loom_embedding_backward(m->defer_wte_scatter ? NULL : loom_grad(emb, 0), loom_grad(emb, 1), m->dres,
                            m->inputs, B, T, C);
    loom_model_grads_ready(&m->base, 0);
}

double loom_gpt2_flops_per_token(const struct loom_gpt2 *m)
{
    return 6.0 * (double)m->base.num_params + 12.0 * m->cfg.num_layers * (double)m->T * m->cfg.hidden;
}
