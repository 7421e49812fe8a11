/*
 * Llama: parameter layout, forward and backward over a range of blocks for
 * one micro-batch slot (see llama.h). Each slot holds what its forward
 * saved for its backward; the backward walks the range in reverse and
 * announces each block to the strategy stack when its gradients are ready.
 */
#include "model/llama.h"

#include <math.h>
#include <stdio.h>
#include <string.h>

#include "base/log.h"
#include "base/mem.h"
#include "kernels/backend.h"
#include "kernels/kernels.h"
#include "kernels/sparse_layout.h"
#include "layers/fp8_linear.h"
#include "layers/pp_stages.h"
#include "layers/tp_regions.h"
#include "model/family.h"
#include "model/sparsity.h"

int loom_llama_config_check(const struct loom_llama_config *cfg, int T)
{
    if (cfg->num_layers < 1)
        return loom_error_set(LOOM_ERR_INPUT, "--num-layers must be >= 1, got %d", cfg->num_layers);
    if (cfg->heads < 1 || cfg->hidden < 1 || cfg->hidden % cfg->heads)
        return loom_error_set(LOOM_ERR_INPUT, "--hidden-size %d is not divisible by --num-attention-heads %d",
                              cfg->hidden, cfg->heads);
    if ((cfg->hidden / cfg->heads) % 2)
        return loom_error_set(
            LOOM_ERR_INPUT,
            "the head size (--hidden-size %d / --num-attention-heads %d) must be even for the "
            "rotary embedding",
            cfg->hidden, cfg->heads);
    if (cfg->kv_heads < 1 || cfg->heads % cfg->kv_heads)
        return loom_error_set(LOOM_ERR_INPUT,
                              "--num-query-groups %d does not divide --num-attention-heads %d", cfg->kv_heads,
                              cfg->heads);
    if (cfg->ffn < 1)
        return loom_error_set(LOOM_ERR_INPUT, "--ffn-hidden-size must be >= 1, got %d", cfg->ffn);
    if (cfg->vocab < 2)
        return loom_error_set(LOOM_ERR_INPUT, "--vocab-size must be >= 2, got %d", cfg->vocab);
    if (T > cfg->max_pos)
        return loom_error_set(LOOM_ERR_INPUT, "--seq-length %d exceeds --max-position-embeddings %d", T,
                              cfg->max_pos);
    if (!(cfg->rope_theta > 0))
        return loom_error_set(LOOM_ERR_INPUT, "--rotary-base must be positive, got %g", cfg->rope_theta);
    return LOOM_OK;
}

/* ---- layout ------------------------------------------------------------------ */

enum { LN1_W, Q_W, K_W, V_W, O_W, LN2_W, GATE_W, UP_W, DOWN_W };
enum { NORM_W, LM_HEAD_W };

enum { REPL = LOOM_TP_REPLICATED };

/* A tensor of the whole model's shape, this rank's part of dimension
 * `split` (REPL: all of it) under tensor parallelism. */
static void add(struct loom_llama *m, struct loom_block *b, const char *name, int ndim, int64_t d0,
                int64_t d1, enum loom_init init, int split)
{
    const int64_t shape[2] = {d0, d1};
    struct loom_tensor *t =
        loom_block_add_tensor_split(b, name, ndim, shape, 0, NULL, split, m->tp, m->tp_rank);
    t->init = init;
    t->init_std = 0.02; /* Hugging Face's initializer_range */
}

static void layout_blocks(struct loom_llama *m, int embedding, int head)
{
    const int L = m->cfg.num_layers, C = m->cfg.hidden, F = m->cfg.ffn, kvC = m->cfg.kv_heads * m->hs;
    char name[LOOM_TENSOR_NAME_MAX];
    if (embedding) {
        struct loom_block *e = &m->base.blocks[0];
        e->role = LOOM_ROLE_EMBEDDING;
        e->layer = -1;
        e->index = 0;
        add(m, e, "model.embed_tokens.weight", 2, m->cfg.vocab, C, LOOM_INIT_NORMAL, 0);
    }
    /* Megatron's splits in nn.Linear's [out, in]: q, k, v, gate and up by
     * output rows (a rank's heads, its key/value groups, its MLP columns),
     * o and down by input columns; the norms replicated */
    static const struct {
        const char *suffix;
        int ndim, rows, cols; /* in units: 0 = 1, 1 = C, 2 = kvC, 3 = F */
        enum loom_init init;
        int split;
    } layer_tensors[] = {
        {"input_layernorm.weight", 1, 1, 0, LOOM_INIT_ONE, REPL},
        {"self_attn.q_proj.weight", 2, 1, 1, LOOM_INIT_NORMAL, 0},
        {"self_attn.k_proj.weight", 2, 2, 1, LOOM_INIT_NORMAL, 0},
        {"self_attn.v_proj.weight", 2, 2, 1, LOOM_INIT_NORMAL, 0},
        {"self_attn.o_proj.weight", 2, 1, 1, LOOM_INIT_NORMAL, 1},
        {"post_attention_layernorm.weight", 1, 1, 0, LOOM_INIT_ONE, REPL},
        {"mlp.gate_proj.weight", 2, 3, 1, LOOM_INIT_NORMAL, 0},
        {"mlp.up_proj.weight", 2, 3, 1, LOOM_INIT_NORMAL, 0},
        {"mlp.down_proj.weight", 2, 1, 3, LOOM_INIT_NORMAL, 1},
    };
    const int64_t unit[] = {1, C, kvC, F};
    for (int l = 0; l < L; l++) {
        if (m->stage.block[l] < 0) continue;
        struct loom_block *b = &m->base.blocks[m->stage.block[l]];
        b->role = LOOM_ROLE_LAYER;
        b->layer = l;
        b->index = 1 + l;
        for (size_t i = 0; i < sizeof layer_tensors / sizeof layer_tensors[0]; i++) {
            snprintf(name, sizeof name, "model.layers.%d.%s", l, layer_tensors[i].suffix);
            add(m, b, name, layer_tensors[i].ndim, unit[layer_tensors[i].rows], unit[layer_tensors[i].cols],
                layer_tensors[i].init, layer_tensors[i].split);
        }
    }
    if (!head) return;
    struct loom_block *h = &m->base.blocks[m->base.nblocks - 1];
    h->role = LOOM_ROLE_HEAD;
    h->layer = -1;
    h->index = L + 1;
    add(m, h, "model.norm.weight", 1, C, 0, LOOM_INIT_ONE, REPL);
    if (m->cfg.untied) add(m, h, "lm_head.weight", 2, m->cfg.vocab, C, LOOM_INIT_NORMAL, 0);
}

static float *lm_head_weight(struct loom_llama *m)
{
    if (m->cfg.untied) return loom_param(&m->base.blocks[m->head], LM_HEAD_W);
    return m->emb >= 0 ? loom_param(&m->base.blocks[m->emb], 0) : m->tied_copy;
}

static float *lm_head_grad(struct loom_llama *m)
{
    if (m->cfg.untied) return loom_grad(&m->base.blocks[m->head], LM_HEAD_W);
    return m->emb >= 0 ? loom_grad(&m->base.blocks[m->emb], 0) : m->tied_grad;
}

/* Whether the tied table crosses stages (layers/pp_stages.h). */
static int tied_across_stages(const struct loom_llama *m)
{
    return m->pipelined && !m->cfg.untied && (m->emb >= 0) != (m->head >= 0);
}

/* The head's share of the tied table's gradient goes to the embedding's
 * stage every micro-batch (--layout-invariant), not once a step. */
static int per_micro_tied(const struct loom_llama *m)
{
    return tied_across_stages(m) && m->base.invariant_sums;
}

/* ---- activations ---------------------------------------------------------------- */

/* Activations are held in act_dtype: round what a kernel just wrote. */
static void round_act(const struct loom_llama *m, float *buf, size_t n)
{
    if (m->act_dtype != LOOM_DTYPE_F32) loom_dtype_round_trip(buf, n, m->act_dtype);
}

static float *act(size_t n)
{
    return loom_alloc(loom_mul_size(n, sizeof(float)), LOOM_MEM_ACTIVATIONS);
}

/* Attention probabilities: (B, NH, T, T), or the sparse layout's blocks of
 * this rank's query heads. */
static size_t att_numel(const struct loom_llama *m)
{
    if (m->sparse) return loom_sparse_att_numel(m->sparse, m->B, m->NHl, m->tp_rank * m->NHl);
    return (size_t)m->B * m->NHl * m->T * m->T;
}

/* The attention kernels on the packed (q | k | v) of this rank's query
 * heads: the layout's block-sparse ones, else the dense causal ones. */
static void attn_fwd(const struct loom_llama *m, float *out, float *att, const float *qkv, int B)
{
    if (m->sparse)
        loom_sparse_attention_forward(out, att, qkv, B, m->T, m->Cl, m->NHl, m->tp_rank * m->NHl, m->sparse);
    else
        m->k->attention_forward(out, att, qkv, B, m->T, m->Cl, m->NHl);
}

static void attn_bwd(const struct loom_llama *m, float *dqkv, float *datt, const float *dout,
                     const float *att, const float *qkv, int B)
{
    if (m->sparse)
        loom_sparse_attention_backward(dqkv, datt, dout, att, qkv, B, m->T, m->Cl, m->NHl,
                                       m->tp_rank * m->NHl, m->sparse);
    else
        m->k->attention_backward(dqkv, datt, dout, att, qkv, B, m->T, m->Cl, m->NHl);
}

int loom_llama_set_sparse(struct loom_llama *m, const struct loom_sparse_config *sc)
{
    LOOM_ASSERT(!m->slots && !m->sparse); /* before the activations are sized */
    return loom_model_sparse_layout(sc, m->cfg.heads, m->T, &m->sparse);
}

/* Whether full recomputation reruns layer l's forward in its backward, and
 * the chunks it reruns together (uniform: N layers, the last shorter;
 * block: one). */
static int recomputed(const struct loom_llama *m, int l)
{
    if (m->recompute != LOOM_RECOMPUTE_FULL) return 0;
    return m->recompute_method == LOOM_RECOMPUTE_UNIFORM || l - m->stage.lo[l] < m->recompute_num_layers;
}
static int chunk_len(const struct loom_llama *m)
{
    return m->recompute_method == LOOM_RECOMPUTE_UNIFORM ? m->recompute_num_layers : 1;
}
static int chunk_first(const struct loom_llama *m, int l)
{
    return l - (l - m->stage.lo[l]) % chunk_len(m);
}
static int chunk_last(const struct loom_llama *m, int l)
{
    const int last = chunk_first(m, l) + chunk_len(m) - 1;
    return last < m->stage.hi[l] ? last : m->stage.hi[l];
}
/* A layer's output has its own buffer unless the next layer is in its chunk. */
static int keeps_output(const struct loom_llama *m, int l)
{
    return !recomputed(m, l) || l == chunk_last(m, l);
}

/* One layer's buffers; att and res3 only when asked for. The residual
 * stream and the norms hold the rows this rank holds; the parallel regions
 * (q, k, v, attention, the MLP) every row of this rank's columns. */
static void layer_buffers(const struct loom_llama *m, struct loom_llama_layer_acts *x, int with_att,
                          int with_res3)
{
    const size_t N = (size_t)m->B * m->T, Nr = (size_t)loom_tp_rows_held(&m->rg, (int)N),
                 C = (size_t)m->cfg.hidden, F = (size_t)m->Fl, Cl = (size_t)m->Cl;
    x->ln1 = act(Nr * C);
    x->rstd1 = act(Nr);
    x->qkv = act(N * 3 * Cl);
    x->att = with_att ? act(att_numel(m)) : NULL;
    x->atty = act(N * Cl);
    x->res2 = act(Nr * C);
    x->ln2 = act(Nr * C);
    x->rstd2 = act(Nr);
    x->gate = act(N * F);
    x->up = act(N * F);
    x->h = act(N * F);
    x->res3 = with_res3 ? act(Nr * C) : NULL;
}

static void free_layer_buffers(struct loom_llama_layer_acts *x, int with_att)
{
    float *bufs[] = {x->ln1,   x->rstd1, x->qkv, x->atty, x->res2, x->ln2,
                     x->rstd2, x->gate,  x->up,  x->h,    x->res3};
    for (size_t i = 0; i < sizeof bufs / sizeof bufs[0]; i++) loom_free(bufs[i]);
    if (with_att) loom_free(x->att);
}

static void alloc_slot(struct loom_llama *m, struct loom_llama_acts *a)
{
    const size_t N = (size_t)m->B * m->T, Nr = (size_t)loom_tp_rows_held(&m->rg, (int)N),
                 C = (size_t)m->cfg.hidden;
    const int L = m->cfg.num_layers, selective = m->recompute == LOOM_RECOMPUTE_SELECTIVE;
    const int nscratch = m->recompute == LOOM_RECOMPUTE_FULL ? chunk_len(m) : 0;
    a->layers = loom_alloc(sizeof *a->layers * (size_t)L, LOOM_MEM_OTHER);
    a->chunk_input = loom_alloc(sizeof *a->chunk_input * (size_t)L, LOOM_MEM_OTHER);
    if (selective) a->shared_att = act(att_numel(m));
    if (nscratch) { /* a chunk's last layer keeps its output in a buffer of its own */
        a->scratch = loom_alloc(sizeof *a->scratch * (size_t)nscratch, LOOM_MEM_OTHER);
        for (int s = 0; s < nscratch; s++) layer_buffers(m, &a->scratch[s], 1, s < nscratch - 1);
    }
    for (int l = 0; l < L; l++) {
        struct loom_llama_layer_acts *x = &a->layers[l];
        if (m->stage.block[l] < 0) continue; /* another stage's */
        if (l > 0 && m->stage.lo[l] == l) a->chunk_input[l] = act(Nr * C);
        if (recomputed(m, l)) {
            *x = a->scratch[l - chunk_first(m, l)];
            if (keeps_output(m, l)) x->res3 = act(Nr * C);
        } else {
            layer_buffers(m, x, !selective, 1);
            if (selective) x->att = a->shared_att;
        }
    }
    a->encoded = act(Nr * C);
    a->lnf = act(Nr * C);
    a->rstdf = act(Nr);
    a->logits = act(m->head >= 0 ? loom_mul_size(N, (size_t)m->Vl) : 1);
    a->losses = act(N);
    a->lse = act(N);
}

static void free_slot(struct loom_llama *m, struct loom_llama_acts *a)
{
    const int nscratch = m->recompute == LOOM_RECOMPUTE_FULL ? chunk_len(m) : 0;
    for (int l = 0; l < m->cfg.num_layers; l++) {
        struct loom_llama_layer_acts *x = &a->layers[l];
        if (m->stage.block[l] < 0) continue;
        loom_free(a->chunk_input[l]);
        if (recomputed(m, l)) {
            if (keeps_output(m, l)) loom_free(x->res3);
        } else {
            free_layer_buffers(x, m->recompute != LOOM_RECOMPUTE_SELECTIVE);
        }
    }
    for (int s = 0; s < nscratch; s++) free_layer_buffers(&a->scratch[s], 1);
    float *bufs[] = {a->encoded, a->lnf, a->rstdf, a->logits, a->losses, a->lse, a->shared_att};
    for (size_t i = 0; i < sizeof bufs / sizeof bufs[0]; i++) loom_free(bufs[i]);
    loom_free(a->layers);
    loom_free(a->chunk_input);
    loom_free(a->scratch);
}

static void alloc_activations(struct loom_llama *m)
{
    const size_t N = (size_t)m->B * m->T, Nr = (size_t)loom_tp_rows_held(&m->rg, (int)N),
                 C = (size_t)m->cfg.hidden, F = (size_t)m->Fl, Cl = (size_t)m->Cl, kvC = (size_t)m->kvC;
    m->slots = loom_alloc(sizeof *m->slots * (size_t)m->nslots, LOOM_MEM_OTHER);
    for (int s = 0; s < m->nslots; s++) alloc_slot(m, &m->slots[s]);
    m->q = act(N * Cl);
    m->kk = act(N * kvC);
    m->v = act(N * kvC);
    m->scratchC = act(N * C);
    m->dres = act(Nr * C);
    if (m->rg.sp) {
        m->rg.gathered = act(N * C);
        m->rg.out_rows = act(Nr * C);
        m->rg.grad_rows = act(Nr * C);
        m->norm_grads = act(C);
    }
    m->dbufC = act(N * C);
    m->dbufC2 = act(N * C);
    m->dqkv = act(N * 3 * Cl);
    m->datt = act(att_numel(m));
    m->dh = act(N * F);
    m->dgate = act(N * F);
    m->dup = act(N * F);
    if (m->tp > 1 || m->exact.pieces) m->ce_stats = act(3 * N);
    if (m->exact.pieces && !m->rg.sp) m->norm_grads = act(C);
}

static void free_activations(struct loom_llama *m)
{
    if (!m->slots) return;
    for (int s = 0; s < m->nslots; s++) free_slot(m, &m->slots[s]);
    float *bufs[] = {m->q,        m->kk,          m->v,           m->scratchC,     m->dres,      m->dbufC,
                     m->dbufC2,   m->dqkv,        m->datt,        m->dh,           m->dgate,     m->dup,
                     m->ce_stats, m->rg.gathered, m->rg.out_rows, m->rg.grad_rows, m->norm_grads};
    for (size_t i = 0; i < sizeof bufs / sizeof bufs[0]; i++) loom_free(bufs[i]);
    loom_free(m->slots);
    m->slots = NULL;
}

/* ---- grouped-query packing ------------------------------------------------------
 * The attention kernel takes (q | k | v) of NH heads each; key/value head g
 * serves query heads [g NH/G, (g+1) NH/G). */

static void pack_qkv(const struct loom_llama *m, float *qkv, const float *q, const float *k, const float *v,
                     int N)
{
    const int C = m->Cl, hs = m->hs, NH = m->NHl, rep = m->cfg.heads / m->cfg.kv_heads;
    for (int n = 0; n < N; n++) {
        float *row = qkv + (size_t)n * 3 * C;
        memcpy(row, q + (size_t)n * C, (size_t)C * sizeof(float));
        for (int h = 0; h < NH; h++) {
            const size_t src = (size_t)n * m->kvC + (size_t)(h / rep) * hs;
            memcpy(row + C + (size_t)h * hs, k + src, (size_t)hs * sizeof(float));
            memcpy(row + 2 * C + (size_t)h * hs, v + src, (size_t)hs * sizeof(float));
        }
    }
}

/* The converse for gradients: dq, and dk and dv summed over the query heads
 * a key/value head serves (all written). */
static void unpack_dqkv(const struct loom_llama *m, float *dq, float *dk, float *dv, const float *dqkv, int N)
{
    const int C = m->Cl, hs = m->hs, NH = m->NHl, rep = m->cfg.heads / m->cfg.kv_heads;
    memset(dk, 0, (size_t)N * m->kvC * sizeof(float));
    memset(dv, 0, (size_t)N * m->kvC * sizeof(float));
    for (int n = 0; n < N; n++) {
        const float *row = dqkv + (size_t)n * 3 * C;
        memcpy(dq + (size_t)n * C, row, (size_t)C * sizeof(float));
        for (int h = 0; h < NH; h++) {
            float *k = dk + (size_t)n * m->kvC + (size_t)(h / rep) * hs;
            float *v = dv + (size_t)n * m->kvC + (size_t)(h / rep) * hs;
            const float *gk = row + C + (size_t)h * hs, *gv = row + 2 * C + (size_t)h * hs;
            for (int j = 0; j < hs; j++) {
                k[j] += gk[j];
                v[j] += gv[j];
            }
        }
    }
}

/* ---- tensor-parallel regions: entered and left through m->rg (layers/tp_regions.h) */

/* RMSNorm's backward over the Nr rows this rank holds; under sequence
 * parallelism its weight gradient is a partial sum over those rows, summed
 * over the tp group before it accumulates. */
static void norm_backward(struct loom_llama *m, float *dinp, float *dweight, const float *dout,
                          const float *inp, const float *weight, const float *rstd, int Nr)
{
    const int C = m->cfg.hidden;
    if (m->exact.pieces) { /* the weight gradient in the row pieces, summed exactly */
        const int N = m->rg.sp ? Nr * m->tp : Nr;
        float *g = m->norm_grads;
        double *acc = loom_tp_exact_sum(&m->exact, (size_t)C);
        for (int j = 0; j < loom_tp_exact_row_pieces(&m->exact, &m->rg); j++) {
            int lo, hi;
            loom_tp_exact_row_piece(&m->exact, &m->rg, N, j, &lo, &hi);
            const size_t at = (size_t)lo * C;
            memset(g, 0, (size_t)C * sizeof *g);
            m->k->rmsnorm_backward(dinp + at, g, dout + at, inp + at, weight, rstd + lo, hi - lo, C);
            loom_tp_exact_add(acc, g, (size_t)C);
        }
        loom_tp_exact_rows_sum(&m->rg, acc, (size_t)C);
        loom_tp_exact_add_rounded(dweight, acc, (size_t)C);
        return;
    }
    if (!m->rg.sp) {
        m->k->rmsnorm_backward(dinp, dweight, dout, inp, weight, rstd, Nr, C);
        return;
    }
    float *g = m->norm_grads;
    memset(g, 0, (size_t)C * sizeof *g);
    m->k->rmsnorm_backward(dinp, g, dout, inp, weight, rstd, Nr, C);
    loom_tp_allreduce(g, (size_t)C, LOOM_OP_SUM);
    for (int c = 0; c < C; c++) dweight[c] += g[c];
}

/* ---- forward ----------------------------------------------------------------- */

/* The seven fp8 linear layers of each layer block, in block order. */
static const int FP8_LINEARS[7] = {Q_W, K_W, V_W, O_W, GATE_W, UP_W, DOWN_W};

void loom_llama_set_fp8(struct loom_llama *m, const struct loom_fp8_recipe *r)
{
    m->base.fp8 = loom_fp8_create(r, &m->base, FP8_LINEARS, 7);
}

/* y (N,out) = x (N,in) W^T, W tensor w of block b, (out,in) as nn.Linear
 * keeps it; with fp8, on the quantised operands. */
static void linear(const struct loom_llama *m, float *y, const float *x, struct loom_block *b, int w, int N,
                   int in, int out)
{
    if (m->base.fp8)
        loom_fp8_linear_t_forward(m->base.fp8, loom_fp8_linear_of(m->base.fp8, &m->base, b, w), m->k, y, x,
                                  loom_param(b, w), N, in, out);
    else
        m->k->lm_head_forward(y, x, loom_param(b, w), N, in, out);
}

/* --layout-invariant's products (layers/tp_exact.h): a column-parallel
 * region's weights w[s] of block b, out[s] features each, with outputs
 * out[s] or output gradients dout[s] (rows of out[s]). */
static int segments(struct loom_tp_segment *seg, struct loom_block *b, const int *w, const int *out,
                    float *const *y, float *const *dy, int nseg, int C)
{
    for (int s = 0; s < nseg; s++)
        seg[s] = (struct loom_tp_segment){.width = out[s],
                                          .W = loom_param(b, w[s]),
                                          .dW = dy ? loom_grad(b, w[s]) : NULL,
                                          .ldw = C,
                                          .out = y ? y[s] : NULL,
                                          .dout = dy ? dy[s] : NULL,
                                          .ld = out[s]};
    return nseg;
}

/* A row-parallel projection leaving its region (weight w, (C, in)): the
 * rows this rank holds of x (N, in) W^T. */
static float *row_forward(struct loom_llama *m, const float *x, struct loom_block *b, int w, int N, int in)
{
    const int C = m->cfg.hidden;
    if (m->exact.pieces)
        return loom_tp_exact_row_forward(&m->exact, &m->rg, m->k, x, NULL, loom_param(b, w), NULL, 1, NULL,
                                         m->scratchC, N, in, C);
    linear(m, m->scratchC, x, b, w, N, in, C);
    return loom_tp_region_output(&m->rg, m->scratchC, N);
}

static void layer_forward(struct loom_llama *m, struct loom_llama_acts *a, int l, const float *res, int B)
{
    const int T = m->T, C = m->cfg.hidden, Cl = m->Cl, F = m->Fl, NH = m->NHl, G = m->Gl, N = B * T,
              Nr = loom_tp_rows_held(&m->rg, N);
    const float eps = (float)m->cfg.norm_eps, theta = (float)m->cfg.rope_theta;
    const size_t NrC = (size_t)Nr * C, NCl = (size_t)N * Cl, NF = (size_t)N * F, NK = (size_t)N * m->kvC;
    struct loom_block *b = &m->base.blocks[m->stage.block[l]];
    struct loom_llama_layer_acts *x = &a->layers[l];
    m->k->rmsnorm_forward(x->ln1, x->rstd1, res, loom_param(b, LN1_W), Nr, C, eps);
    round_act(m, x->ln1, NrC);
    /* column-parallel q, k, v (this rank's heads and key/value groups), attention, row-parallel o */
    const float *in = loom_tp_region_input(&m->rg, x->ln1, N);
    if (m->exact.pieces) {
        struct loom_tp_segment seg[3];
        const int w[3] = {Q_W, K_W, V_W}, out[3] = {Cl, m->kvC, m->kvC};
        float *const y[3] = {m->q, m->kk, m->v};
        loom_tp_exact_column_forward(&m->exact, m->k, seg, segments(seg, b, w, out, y, NULL, 3, C), in, NULL,
                                     1, N, C);
    } else {
        linear(m, m->q, in, b, Q_W, N, C, Cl);
        linear(m, m->kk, in, b, K_W, N, C, m->kvC);
        linear(m, m->v, in, b, V_W, N, C, m->kvC);
    }
    m->k->rope_forward(m->q, B, T, NH, m->hs, theta);
    m->k->rope_forward(m->kk, B, T, G, m->hs, theta);
    round_act(m, m->q, NCl);
    round_act(m, m->kk, NK);
    round_act(m, m->v, NK);
    pack_qkv(m, x->qkv, m->q, m->kk, m->v, N);
    attn_fwd(m, x->atty, x->att, x->qkv, B);
    round_act(m, x->atty, NCl);
    float *proj = row_forward(m, x->atty, b, O_W, N, Cl);
    round_act(m, proj, NrC);
    m->k->residual_forward(x->res2, res, proj, NrC);
    round_act(m, x->res2, NrC);
    m->k->rmsnorm_forward(x->ln2, x->rstd2, x->res2, loom_param(b, LN2_W), Nr, C, eps);
    round_act(m, x->ln2, NrC);
    /* column-parallel gate and up, SwiGLU on this rank's columns, row-parallel down */
    in = loom_tp_region_input(&m->rg, x->ln2, N);
    if (m->exact.pieces) {
        struct loom_tp_segment seg[2];
        const int w[2] = {GATE_W, UP_W}, out[2] = {F, F};
        float *const y[2] = {x->gate, x->up};
        loom_tp_exact_column_forward(&m->exact, m->k, seg, segments(seg, b, w, out, y, NULL, 2, C), in, NULL,
                                     1, N, C);
    } else {
        linear(m, x->gate, in, b, GATE_W, N, C, F);
        linear(m, x->up, in, b, UP_W, N, C, F);
    }
    round_act(m, x->gate, NF);
    round_act(m, x->up, NF);
    m->k->swiglu_forward(x->h, x->gate, x->up, NF);
    round_act(m, x->h, NF);
    proj = row_forward(m, x->h, b, DOWN_W, N, F);
    round_act(m, proj, NrC);
    m->k->residual_forward(x->res3, x->res2, proj, NrC);
    round_act(m, x->res3, NrC);
}

/* Layer l's input: the embedding's output, a pipeline chunk's received
 * input, or the previous layer's output. */
static float *layer_input(struct loom_llama_acts *a, int l)
{
    if (l == 0) return a->encoded;
    return a->chunk_input[l] ? a->chunk_input[l] : a->layers[l - 1].res3;
}

/* The layers [l0, l1] a block range covers, consecutive (one pipeline
 * chunk); none: [0, -1] before them (the embedding alone), [L, L-1] after. */
static void layers_of(const struct loom_llama *m, int first, int last, int *l0, int *l1)
{
    *l0 = last == m->head && first == m->head ? m->cfg.num_layers : 0;
    *l1 = *l0 - 1;
    int seen = 0;
    for (int b = first; b <= last; b++) {
        const struct loom_block *blk = &m->base.blocks[b];
        if (blk->role != LOOM_ROLE_LAYER) continue;
        if (!seen) *l0 = blk->layer;
        LOOM_ASSERT(!seen || blk->layer == *l1 + 1);
        *l1 = blk->layer;
        seen = 1;
    }
}

/* The loss of every row from this rank's logits (N, Vl) of vocabulary rows
 * [v0, v0 + Vl), never gathering the whole vocabulary (Megatron's; as
 * GPT-2's): the row max, then the sum of exponentials and the target's
 * logit, each reduced over the tp group. */
static void vocab_parallel_crossentropy(struct loom_llama *m, struct loom_llama_acts *a, int N)
{
    float *rowmax = m->ce_stats, *sums = m->ce_stats + N; /* N sums of exponentials, N target logits */
    m->k->crossentropy_vp_max(rowmax, a->logits, N, m->Vl);
    loom_tp_allreduce(rowmax, (size_t)N, LOOM_OP_MAX);
    if (m->exact.pieces) { /* the sums over the vocabulary pieces */
        loom_tp_exact_crossentropy_begin(&m->exact, N);
        loom_tp_exact_crossentropy_rows(&m->exact, m->k, a->logits, rowmax, a->targets, 0, N, m->cfg.vocab,
                                        m->v0, m->Vl);
        loom_tp_exact_crossentropy_done(&m->exact, sums, sums + N, N);
    } else {
        m->k->crossentropy_vp_stats(sums, sums + N, a->logits, rowmax, a->targets, m->v0, N, m->Vl);
        loom_tp_allreduce(sums, 2 * (size_t)N, LOOM_OP_SUM);
    }
    for (int i = 0; i < N; i++) {
        a->lse[i] = rowmax[i] + logf(sums[i]);
        a->losses[i] = a->lse[i] - sums[N + i];
    }
}

static void forward(struct loom_model *model, int first, int last, struct loom_micro *mb)
{
    struct loom_llama *m = loom_llama_of(model);
    const int B = mb->rows;
    LOOM_ASSERT(B >= 1 && B <= m->B && mb->slot >= 0 && mb->slot < m->nslots);
    LOOM_ASSERT(first <= last && first >= 0 && last < model->nblocks);
    if (!m->slots) alloc_activations(m);
    /* V: this tensor-parallel rank's vocabulary rows [v0, v0 + V) */
    const int T = m->T, C = m->cfg.hidden, V = m->Vl, L = m->cfg.num_layers, N = B * T,
              Nr = loom_tp_rows_held(&m->rg, N);
    const size_t NrC = (size_t)Nr * C;
    struct loom_llama_acts *a = &m->slots[mb->slot];
    const struct loom_lm_batch *batch = mb->batch;
    a->inputs = batch ? batch->inputs : NULL;
    a->targets = batch ? batch->targets : NULL;
    a->rows = B;
    a->emb_open = 0;
    int l0, l1;
    layers_of(m, first, last, &l0, &l1);
    if (first == m->emb) {
        struct loom_block *emb = &model->blocks[m->emb];
        loom_model_forward_begin(model, m->emb);
        /* vocab-parallel: this rank's vocabulary, summed over the tp group */
        float *rows = m->rg.sp ? m->scratchC : a->encoded; /* summed in place without SP */
        m->k->embedding_vp_forward(rows, a->inputs, loom_param(emb, 0), NULL, m->v0, V, B, T, C);
        rows = loom_tp_region_output(&m->rg, rows, N);
        if (rows != a->encoded) memcpy(a->encoded, rows, NrC * sizeof(float));
        round_act(m, a->encoded, NrC);
        if (tied_across_stages(m) && mb->micro == 0) { /* the table, to the head's stage */
            memcpy(m->tied_copy, loom_param(emb, 0), (size_t)V * C * sizeof(float));
            loom_pp_tied_weights_send(m->tied_copy, (size_t)V * C);
        }
        loom_model_forward_end(model, m->emb);
    } else {
        /* full recomputation reruns layers from their kept inputs: a range starting
         * at a layer starts a pipeline chunk (its input is kept) */
        LOOM_ASSERT(mb->input != NULL &&
                    (m->recompute != LOOM_RECOMPUTE_FULL || l0 >= L || l0 == 0 || a->chunk_input[l0]));
        memcpy(l0 < L ? layer_input(a, l0) : a->layers[L - 1].res3, mb->input, NrC * sizeof(float));
    }
    for (int l = l0; l <= l1; l++) {
        loom_model_forward_begin(model, m->stage.block[l]);
        layer_forward(m, a, l, layer_input(a, l), B);
        loom_model_forward_end(model, m->stage.block[l]);
    }
    if (last != m->head) {
        memcpy(mb->output, l1 >= 0 ? a->layers[l1].res3 : a->encoded, NrC * sizeof(float));
        return;
    }
    struct loom_block *head = &model->blocks[m->head];
    const int announce_emb = first != m->emb && !m->cfg.untied && m->emb >= 0;
    if (announce_emb) loom_model_forward_begin(model, m->emb);
    if (tied_across_stages(m) && mb->micro == 0) { /* the table, from the embedding's stage */
        loom_pp_tied_weights_recv(m->tied_copy, (size_t)V * C);
        memset(m->tied_grad, 0, (size_t)V * C * sizeof(float));
    }
    loom_model_forward_begin(model, m->head);
    m->k->rmsnorm_forward(a->lnf, a->rstdf, a->layers[L - 1].res3, loom_param(head, NORM_W), Nr, C,
                          (float)m->cfg.norm_eps);
    round_act(m, a->lnf, NrC);
    if (m->exact.pieces)
        loom_tp_exact_head_forward(&m->exact, m->k, a->logits, LOOM_DTYPE_F32,
                                   loom_tp_region_input(&m->rg, a->lnf, N), lm_head_weight(m), NULL, N, C,
                                   m->cfg.vocab, V);
    else
        m->k->lm_head_forward(a->logits, loom_tp_region_input(&m->rg, a->lnf, N), lm_head_weight(m), N, C, V);
    round_act(m, a->logits, (size_t)N * V);
    loom_model_forward_end(model, m->head);
    if (announce_emb) loom_model_forward_end(model, m->emb);
    mb->loss = 0;
    if (!a->targets) return;
    if (m->tp == 1 && !m->exact.pieces)
        m->k->crossentropy_forward(a->losses, a->lse, a->logits, a->targets, N, V);
    else
        vocab_parallel_crossentropy(m, a, N);
    double sum = 0;
    for (int i = 0; i < N; i++) sum += a->losses[i];
    mb->loss = (float)(sum / N);
}

/* ---- backward ---------------------------------------------------------------- */

/* dx (N,in) = dy W; dW (out,in) += dy^T x, W tensor w of block b. With
 * acc, dx adds to what is there. */
static void linear_backward(const struct loom_llama *m, float *dx, float *scratch, struct loom_block *b,
                            int w, const float *dy, const float *x, int N, int in, int out, int acc)
{
    float *to = acc ? scratch : dx;
    if (m->base.fp8)
        loom_fp8_linear_t_backward(m->base.fp8, loom_fp8_linear_of(m->base.fp8, &m->base, b, w), m->k, to,
                                   loom_grad(b, w), dy, x, loom_param(b, w), N, in, out);
    else
        m->k->lm_head_backward(to, loom_grad(b, w), dy, x, loom_param(b, w), N, in, out);
    if (acc)
        for (size_t i = 0; i < (size_t)N * in; i++) dx[i] += scratch[i];
}

/* Layer l's backward: m->dres holds the gradient at its output and receives
 * the gradient at its input. */
static void layer_backward(struct loom_llama *m, struct loom_llama_acts *a, int l, int B)
{
    const int T = m->T, C = m->cfg.hidden, Cl = m->Cl, F = m->Fl, NH = m->NHl, G = m->Gl, N = B * T,
              Nr = loom_tp_rows_held(&m->rg, N);
    const float theta = (float)m->cfg.rope_theta;
    const size_t NrC = (size_t)Nr * C, NCl = (size_t)N * Cl, NF = (size_t)N * F, NK = (size_t)N * m->kvC;
    struct loom_block *b = &m->base.blocks[m->stage.block[l]];
    struct loom_llama_layer_acts *x = &a->layers[l];
    /* MLP: res3 = res2 + down(silu(gate(ln2)) * up(ln2)); dres flows to res2 unchanged */
    const float *dout = loom_tp_region_output_grad(&m->rg, m->dres, N);
    if (m->exact.pieces)
        loom_tp_exact_row_backward(&m->exact, m->k, m->dh, loom_grad(b, DOWN_W), NULL, dout, x->h, NULL,
                                   loom_param(b, DOWN_W), NULL, 1, N, F, C);
    else
        linear_backward(m, m->dh, NULL, b, DOWN_W, dout, x->h, N, F, C, 0);
    round_act(m, m->dh, NF);
    m->k->swiglu_backward(m->dgate, m->dup, m->dh, x->gate, x->up, NF);
    round_act(m, m->dgate, NF);
    round_act(m, m->dup, NF);
    const float *in = loom_tp_region_input(&m->rg, x->ln2, N);
    float *dln;
    if (m->exact.pieces) {
        struct loom_tp_segment seg[2];
        const int w[2] = {GATE_W, UP_W}, out[2] = {F, F};
        float *const dy[2] = {m->dgate, m->dup};
        dln = loom_tp_exact_column_backward(&m->exact, &m->rg, m->k, seg,
                                            segments(seg, b, w, out, NULL, dy, 2, C), in, NULL, 1, m->dbufC,
                                            N, C);
    } else {
        linear_backward(m, m->dbufC, NULL, b, GATE_W, m->dgate, in, N, C, F, 0);
        linear_backward(m, m->dbufC, m->dbufC2, b, UP_W, m->dup, in, N, C, F, 1);
        dln = loom_tp_region_input_grad(&m->rg, m->dbufC, N); /* partial over this rank's columns */
    }
    round_act(m, dln, NrC);
    norm_backward(m, m->dres, loom_grad(b, LN2_W), dln, x->res2, loom_param(b, LN2_W), x->rstd2, Nr);
    round_act(m, m->dres, NrC);
    /* attention: res2 = res + o(attn(rope(q), rope(k), v)) */
    dout = loom_tp_region_output_grad(&m->rg, m->dres, N);
    if (m->exact.pieces)
        loom_tp_exact_row_backward(&m->exact, m->k, m->dbufC, loom_grad(b, O_W), NULL, dout, x->atty, NULL,
                                   loom_param(b, O_W), NULL, 1, N, Cl, C);
    else
        linear_backward(m, m->dbufC, NULL, b, O_W, dout, x->atty, N, Cl, C, 0);
    round_act(m, m->dbufC, NCl);
    if (m->recompute == LOOM_RECOMPUTE_SELECTIVE) /* the probabilities again, from the kept qkv */
        attn_fwd(m, m->dbufC2, x->att, x->qkv, B);
    /* datt is the kernel's own scratch, read by nothing after it: not rounded */
    attn_bwd(m, m->dqkv, m->datt, m->dbufC, x->att, x->qkv, B);
    unpack_dqkv(m, m->q, m->kk, m->v, m->dqkv, N);
    m->k->rope_backward(m->q, B, T, NH, m->hs, theta);
    m->k->rope_backward(m->kk, B, T, G, m->hs, theta);
    round_act(m, m->q, NCl);
    round_act(m, m->kk, NK);
    round_act(m, m->v, NK);
    in = loom_tp_region_input(&m->rg, x->ln1, N);
    if (m->exact.pieces) {
        struct loom_tp_segment seg[3];
        const int w[3] = {Q_W, K_W, V_W}, out[3] = {Cl, m->kvC, m->kvC};
        float *const dy[3] = {m->q, m->kk, m->v};
        dln = loom_tp_exact_column_backward(&m->exact, &m->rg, m->k, seg,
                                            segments(seg, b, w, out, NULL, dy, 3, C), in, NULL, 1, m->dbufC,
                                            N, C);
    } else {
        linear_backward(m, m->dbufC, NULL, b, Q_W, m->q, in, N, C, Cl, 0);
        linear_backward(m, m->dbufC, m->dbufC2, b, K_W, m->kk, in, N, C, m->kvC, 1);
        linear_backward(m, m->dbufC, m->dbufC2, b, V_W, m->v, in, N, C, m->kvC, 1);
        dln = loom_tp_region_input_grad(&m->rg, m->dbufC, N);
    }
    round_act(m, dln, NrC);
    norm_backward(m, m->dres, loom_grad(b, LN1_W), dln, layer_input(a, l), loom_param(b, LN1_W), x->rstd1,
                  Nr);
    round_act(m, m->dres, NrC);
}

static void backward(struct loom_model *model, int first, int last, struct loom_micro *mb, float loss_weight)
{
    struct loom_llama *m = loom_llama_of(model);
    struct loom_llama_acts *a = &m->slots[mb->slot];
    const int B = a->rows, T = m->T, C = m->cfg.hidden, V = m->Vl, L = m->cfg.num_layers, N = B * T,
              Nr = loom_tp_rows_held(&m->rg, N);
    const size_t NrC = (size_t)Nr * C;
    m->bwd_slot = mb->slot;
    int l0, l1;
    layers_of(m, first, last, &l0, &l1);
    if (last == m->head) {
        LOOM_ASSERT(a->targets != NULL);
        struct loom_block *head = &model->blocks[m->head];
        if (m->tp == 1 && !m->exact.pieces)
            m->k->crossentropy_backward(a->logits, a->lse, a->logits, a->targets, loss_weight / (float)N, N,
                                        V);
        else
            m->k->crossentropy_vp_backward(a->logits, a->lse, a->logits, a->targets, m->v0,
                                           loss_weight / (float)N, N, V);
        round_act(m, a->logits, (size_t)N * V);
        const int tied_here = !m->cfg.untied && m->emb >= 0;
        if (tied_here) {
            loom_model_backward_begin(model, m->emb);
            a->emb_open = 1;
        }
        loom_model_backward_begin(model, m->head);
        if (per_micro_tied(m)) { /* this micro-batch's share alone, sent below */
            memset(m->tied_grad, 0, (size_t)V * C * sizeof(float));
        }
        float *dlnf;
        if (m->exact.pieces) {
            dlnf = loom_tp_exact_head_backward(&m->exact, &m->rg, m->k, lm_head_grad(m), a->logits,
                                               LOOM_DTYPE_F32, loom_tp_region_input(&m->rg, a->lnf, N),
                                               lm_head_weight(m), NULL, m->dbufC, N, C, m->cfg.vocab, V);
        } else {
            m->k->lm_head_backward(m->dbufC, lm_head_grad(m), a->logits,
                                   loom_tp_region_input(&m->rg, a->lnf, N), lm_head_weight(m), N, C, V);
            dlnf = loom_tp_region_input_grad(&m->rg, m->dbufC, N); /* partial over this rank's vocabulary */
        }
        round_act(m, dlnf, NrC);
        if (tied_here) loom_model_grads_ready(model, LOOM_GRAD_READY_TIED_HEAD);
        /* the copy's gradient over the step, to the embedding's stage */
        if (per_micro_tied(m)) {
            LOOM_ASSERT(m->tied_sends && mb->micro < m->base.step_micros);
            loom_pp_tied_grads_send_copy(m->tied_grad, m->tied_sends[mb->micro], (size_t)V * C);
        } else if (tied_across_stages(m) && mb->micro == mb->micros - 1)
            loom_pp_tied_grads_send(m->tied_grad, (size_t)V * C);
        memset(m->dres, 0, NrC * sizeof(float));
        norm_backward(m, m->dres, loom_grad(head, NORM_W), dlnf, a->layers[L - 1].res3,
                      loom_param(head, NORM_W), a->rstdf, Nr);
        round_act(m, m->dres, NrC);
        loom_model_grads_ready(model, m->head);
    } else {
        memcpy(m->dres, mb->doutput, NrC * sizeof(float));
    }
    for (int l = l1; l >= l0; l--) {
        if (!recomputed(m, l)) {
            loom_model_backward_begin(model, m->stage.block[l]);
        } else if (l == chunk_last(m, l)) {
            /* entering a chunk from the top: rerun its forward from its kept input */
            const int cfirst = chunk_first(m, l);
            for (int k = l; k >= cfirst; k--) loom_model_backward_begin(model, m->stage.block[k]);
            for (int k = cfirst; k <= l; k++) layer_forward(m, a, k, layer_input(a, k), B);
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
        loom_pp_tied_grads_add(loom_grad(emb, 0), m->tied_grad, (size_t)V * C);
    /* this rank's vocabulary rows, from every row's gradient */
    m->k->embedding_vp_backward(m->defer_wte_scatter ? NULL : loom_grad(emb, 0), NULL,
                                loom_tp_region_output_grad(&m->rg, m->dres, N), a->inputs, m->v0, V, B, T, C);
    /* the head's share, from its stage, once per step */
    if (tied_across_stages(m) && !per_micro_tied(m) && mb->micro == mb->micros - 1)
        loom_pp_tied_grads_add(loom_grad(emb, 0), m->tied_grad, (size_t)V * C);
    loom_model_grads_ready(model, m->emb);
    a->emb_open = 0;
}

/* ---- the loom_model interface ---------------------------------------------------- */

static void set_slots(struct loom_model *model, int n)
{
    struct loom_llama *m = loom_llama_of(model);
    LOOM_ASSERT(m->slots == NULL && n >= 1);
    m->nslots = n;
}

static void reserve(struct loom_model *model)
{
    struct loom_llama *m = loom_llama_of(model);
    if (!m->slots) alloc_activations(m);
    /* fp8's quantised operands and their float32 copies, for the largest
     * linear layer (rows: a tensor-parallel region's, all of B*T) */
    if (m->base.fp8) {
        const size_t N = (size_t)m->B * m->T, C = (size_t)m->cfg.hidden, F = (size_t)m->Fl;
        const size_t W = (F > C ? F : C) * C, X = N * (F > C ? F : C);
        loom_fp8_reserve(m->base.fp8, X, W, X, 1);
    }
    if (m->exact.pieces) { /* --layout-invariant's scratch: q|k|v, gate|up, o, down and the head */
        const int N = m->B * m->T, C = m->cfg.hidden;
        const int qkv[3] = {m->Cl, m->kvC, m->kvC}, gate_up[2] = {m->Fl, m->Fl};
        int layers = 0;
        for (int l = 0; l < m->cfg.num_layers; l++) layers += m->stage.block[l] >= 0;
        if (layers) {
            loom_tp_exact_reserve_column(&m->exact, &m->rg, qkv, 3, 0, 0, N, C);
            loom_tp_exact_reserve_column(&m->exact, &m->rg, gate_up, 2, 0, 0, N, C);
            loom_tp_exact_reserve_row(&m->exact, &m->rg, 1, N, m->Cl, C);
            loom_tp_exact_reserve_row(&m->exact, &m->rg, 1, N, m->Fl, C);
        }
        if (m->head >= 0) loom_tp_exact_reserve_head(&m->exact, &m->rg, LOOM_DTYPE_F32, N, C, m->cfg.vocab);
    }
    if (per_micro_tied(m) && m->head >= 0 && !m->tied_sends) /* each micro-batch's share of the table */
        m->tied_sends = loom_pp_tied_copies_alloc((size_t)m->Vl * m->cfg.hidden, m->base.step_micros);
}

static size_t boundary_numel(const struct loom_model *model, int rows)
{
    const struct loom_llama *m = model->user;
    return (size_t)loom_tp_rows_held(&m->rg, rows * m->T) * m->cfg.hidden;
}

/* The tied table (embed_tokens, also the LM head), offered to the strategies
 * as GPT-2's is: ZeRO-3 keeps its unit gathered for the step, DDP may reduce
 * the head's share early and scatter the lookup's itself. */
static int tied_embedding(struct loom_model *model, struct loom_tied_embedding *te)
{
    struct loom_llama *m = loom_llama_of(model);
    const struct loom_llama_acts *a = m->slots ? &m->slots[m->bwd_slot] : NULL;
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
    struct loom_llama *m = loom_llama_of(model);
    return m->slots ? m->slots[0].logits : NULL;
}

static const struct loom_model_ops llama_ops = {.forward = forward,
                                                .backward = backward,
                                                .set_slots = set_slots,
                                                .boundary_numel = boundary_numel,
                                                .tied_embedding = tied_embedding,
                                                .logits = logits,
                                                .reserve = reserve};

struct loom_llama *loom_llama_of(struct loom_model *m)
{
    LOOM_ASSERT(m->ops == &llama_ops);
    return m->user;
}

struct loom_llama *loom_llama_create(const struct loom_llama_config *cfg, int B, int T)
{
    const int lo = 0, hi = cfg->num_layers - 1;
    struct loom_llama *m = loom_llama_create_stage(cfg, B, T, 1, 0, 1, &lo, &hi, 1, 1);
    m->pipelined = 0;
    return m;
}

struct loom_llama *loom_llama_create_stage(const struct loom_llama_config *cfg, int B, int T, int tp,
                                           int tp_rank, int chunks, const int *lo, const int *hi,
                                           int embedding, int head)
{
    LOOM_ASSERT(loom_llama_config_check(cfg, T) == LOOM_OK);
    LOOM_ASSERT(tp >= 1 && tp_rank >= 0 && tp_rank < tp && cfg->heads % tp == 0 && cfg->kv_heads % tp == 0 &&
                cfg->ffn % tp == 0);
    struct loom_llama *m = loom_alloc(sizeof *m, LOOM_MEM_OTHER);
    m->cfg = *cfg;
    m->B = B;
    m->T = T;
    m->hs = cfg->hidden / cfg->heads;
    m->tp = tp;
    m->rg = (struct loom_tp_regions){.tp = tp, .width = cfg->hidden};
    m->tp_rank = tp_rank;
    m->NHl = cfg->heads / tp;
    m->Gl = cfg->kv_heads / tp;
    m->Cl = m->NHl * m->hs;
    m->kvC = m->Gl * m->hs;
    m->Fl = cfg->ffn / tp;
    int64_t v0, v1;
    loom_tp_part(cfg->vocab, tp, tp_rank, &v0, &v1);
    m->v0 = (int)v0;
    m->Vl = (int)(v1 - v0);
    m->nslots = 1;
    m->act_dtype = LOOM_DTYPE_F32;
    m->recompute = LOOM_RECOMPUTE_NONE;
    m->recompute_method = LOOM_RECOMPUTE_METHOD_NONE;
    loom_pp_stage_layers_init(&m->stage, cfg->num_layers, chunks, lo, hi, embedding, head);
    loom_model_init(&m->base, &llama_ops, "llama", m->stage.nblocks);
    m->base.tp = tp;
    m->base.tp_rank = tp_rank;
    m->base.user = m;
    m->base.family = &loom_llama_family;
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

void loom_llama_set_recompute(struct loom_llama *m, enum loom_recompute granularity,
                              enum loom_recompute_method method, int num_layers)
{
    LOOM_ASSERT(m->slots == NULL); /* the activations are laid out for it at the first forward */
    if (granularity == LOOM_RECOMPUTE_FULL)
        LOOM_ASSERT(num_layers >= 1 && num_layers <= m->cfg.num_layers &&
                    (method == LOOM_RECOMPUTE_BLOCK || method == LOOM_RECOMPUTE_UNIFORM));
    else
        LOOM_ASSERT(method == LOOM_RECOMPUTE_METHOD_NONE && num_layers == 0);
    m->recompute = granularity;
    m->recompute_method = method;
    m->recompute_num_layers = num_layers;
}

void loom_llama_set_tp_invariant(struct loom_llama *m, int pieces)
{
    LOOM_ASSERT(m->slots == NULL && pieces > 0 && pieces % m->tp == 0 && m->cfg.heads % pieces == 0 &&
                m->cfg.kv_heads % pieces == 0 && m->cfg.ffn % pieces == 0);
    loom_tp_exact_init(&m->exact, pieces, m->tp, m->tp_rank);
}

void loom_llama_set_sequence_parallel(struct loom_llama *m, int on)
{
    LOOM_ASSERT(m->slots == NULL && (!on || (m->tp > 1 && m->T % m->tp == 0)));
    m->rg.sp = on;
}

void loom_llama_free(struct loom_llama *m)
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

double loom_llama_num_params(const struct loom_llama_config *cfg)
{
    const double C = cfg->hidden, V = cfg->vocab, F = cfg->ffn,
                 kvC = (double)cfg->kv_heads * (C / cfg->heads);
    return V * C * (cfg->untied ? 2 : 1) + cfg->num_layers * (2 * C * C + 2 * C * kvC + 3 * C * F + 2 * C) +
           C;
}

double loom_llama_flops_per_token(const struct loom_llama *m)
{
    /* a sparse layout's attention counts its share of the causal blocks */
    const double attn = 12.0 * m->cfg.num_layers * (double)m->T * m->cfg.hidden;
    return 6.0 * loom_llama_num_params(&m->cfg) + attn * loom_model_sparsity_share(m->sparse);
}

float loom_llama_forward(struct loom_llama *m, const int32_t *inputs, const int32_t *targets, int B)
{
    const struct loom_lm_batch batch = {inputs, targets};
    struct loom_micro mb = {.slot = 0, .batch = &batch, .rows = B, .micros = 1};
    forward(&m->base, 0, m->base.nblocks - 1, &mb);
    return (float)mb.loss;
}

void loom_llama_backward(struct loom_llama *m, float loss_weight)
{
    struct loom_micro mb = {.slot = 0, .micros = 1};
    backward(&m->base, 0, m->base.nblocks - 1, &mb, loss_weight);
}
