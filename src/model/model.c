/* Building a model of blocks and named tensors, its arenas, initialisation
 * from the tensors' init fields, whole-model evaluation, and its strategy
 * stack with the blocks' announcements to it (see loom/model.h). Not here:
 * the stack's step-level calls (parallel/stack.c). */
#include "loom/model.h"

#include <stdio.h>
#include <string.h>

#include "base/buf.h"
#include "base/dtype.h"
#include "base/log.h"
#include "base/mem.h"
#include "base/rng.h"
#include "base/testpoint.h"
#include "base/trace.h"
#include "kernels/backend.h"
#include "model/stack_order.h"

void loom_model_init(struct loom_model *m, const struct loom_model_ops *ops, const char *name, int nblocks)
{
    LOOM_ASSERT(ops && ops->forward && ops->backward && nblocks >= 1);
    memset(m, 0, sizeof *m);
    m->ops = ops;
    m->name = name;
    m->nblocks = nblocks;
    m->dtype = LOOM_DTYPE_F32;
    m->backend = loom_backend_default();
    m->tp = 1;
    m->blocks = loom_alloc(sizeof *m->blocks * (size_t)nblocks, LOOM_MEM_OTHER);
    for (int i = 0; i < nblocks; i++) {
        m->blocks[i].role = LOOM_ROLE_LAYER;
        m->blocks[i].index = i;
        m->blocks[i].grads_owner = LOOM_GRADS_NONE;
    }
}

struct loom_tensor *loom_block_add_tensor_split(struct loom_block *b, const char *name, int ndim,
                                                const int64_t *full, int view_ndim, const int64_t *view,
                                                int split, int tp, int tp_rank)
{
    LOOM_ASSERT(ndim >= 1 && ndim <= LOOM_TENSOR_MAX_DIMS);
    if (b->ntensors == b->tensors_cap) {
        b->tensors_cap = b->tensors_cap ? 2 * b->tensors_cap : 16;
        b->tensors = loom_realloc(b->tensors, sizeof *b->tensors * (size_t)b->tensors_cap, LOOM_MEM_OTHER);
    }
    const int own_view = view == NULL; /* the view is full itself: dimension d is view dimension d */
    if (own_view) view_ndim = ndim, view = full;
    LOOM_ASSERT(view_ndim >= 1 && view_ndim <= LOOM_TP_VIEW_MAX_DIMS);
    if (tp == 1) split = LOOM_TP_REPLICATED;
    LOOM_ASSERT(split == LOOM_TP_REPLICATED || (split >= 0 && split < view_ndim));
    struct loom_tensor *t = &b->tensors[b->ntensors++];
    memset(t, 0, sizeof *t);
    LOOM_ASSERT(strlen(name) < sizeof t->name);
    strcpy(t->name, name);
    t->ndim = ndim;
    t->view_ndim = view_ndim;
    for (int d = 0; d < view_ndim; d++) t->view[d] = view[d];
    t->tp_split = split;
    if (split != LOOM_TP_REPLICATED) loom_tp_part(view[split], tp, tp_rank, &t->tp_lo, &t->tp_hi);
    /* the part's shape: the full dims, the one holding the split view
     * dimension shrunk by the part's fraction of it */
    int v = 0;
    for (int d = 0; d < LOOM_TENSOR_MAX_DIMS; d++) {
        t->full[d] = d < ndim ? full[d] : 1;
        LOOM_ASSERT(t->full[d] >= 1);
        t->shape[d] = t->full[d];
        if (d >= ndim) continue;
        int64_t prod = 1;
        int v0 = v;
        if (own_view)
            prod = view[v++];
        else
            while (v < view_ndim && prod < full[d]) prod *= view[v++];
        LOOM_ASSERT(prod == full[d]); /* the view regroups full */
        if (split != LOOM_TP_REPLICATED && split >= v0 && split < v)
            t->shape[d] = full[d] / view[split] * (t->tp_hi - t->tp_lo);
    }
    LOOM_ASSERT(v == view_ndim);
    t->numel = 1;
    for (int d = 0; d < LOOM_TENSOR_MAX_DIMS; d++) t->numel = loom_mul_size(t->numel, (size_t)t->shape[d]);
    t->offset = b->numel;
    t->stream = b->ntensors - 1 + b->skipped;
    t->decay = ndim >= 2;
    t->init = LOOM_INIT_NORMAL;
    t->init_std = 0.02;
    b->numel += t->numel;
    return t;
}

double loom_model_full_params(const struct loom_model *m)
{
    double n = 0;
    for (int b = 0; b < m->nblocks; b++)
        for (int t = 0; t < m->blocks[b].ntensors; t++) {
            const struct loom_tensor *x = &m->blocks[b].tensors[t];
            double k = 1;
            for (int d = 0; d < x->ndim; d++) k *= (double)x->full[d];
            n += k;
        }
    return n;
}

void loom_tensor_take_part(const struct loom_tensor *t, const float *full, float *part)
{
    if (t->tp_split == LOOM_TP_REPLICATED) {
        memcpy(part, full, t->numel * sizeof(float));
        return;
    }
    /* runs of `inner` contiguous entries, one per index of the dims up to the split one */
    int64_t inner = 1, outer = 1;
    for (int d = t->tp_split + 1; d < t->view_ndim; d++) inner *= t->view[d];
    for (int d = 0; d <= t->tp_split; d++) outer *= t->view[d];
    size_t j = 0;
    for (int64_t o = 0; o < outer; o++) {
        const int64_t k = o % t->view[t->tp_split];
        if (k < t->tp_lo || k >= t->tp_hi) continue;
        memcpy(part + j, full + o * inner, (size_t)inner * sizeof(float));
        j += (size_t)inner;
    }
    LOOM_ASSERT(j == t->numel);
}

void loom_block_skip_tensors(struct loom_block *b, int n)
{
    LOOM_ASSERT(n >= 0);
    b->skipped += n;
}

struct loom_tensor *loom_block_add_tensor(struct loom_block *b, const char *name, int ndim,
                                          const int64_t *shape)
{
    return loom_block_add_tensor_split(b, name, ndim, shape, 0, NULL, LOOM_TP_REPLICATED, 1, 0);
}

void loom_model_layout_done(struct loom_model *m)
{
    m->num_params = 0;
    for (int i = 0; i < m->nblocks; i++) {
        struct loom_block *b = &m->blocks[i];
        b->offset = m->num_params;
        m->num_params += b->numel;
        b->expert_lo = b->expert_hi = 0;
        for (int ti = 0, seen = 0; ti < b->ntensors; ti++) {
            const struct loom_tensor *t = &b->tensors[ti];
            if (!t->expert) continue;
            if (!seen++) b->expert_lo = b->expert_hi = t->offset;
            LOOM_ASSERT(t->offset == b->expert_hi); /* a block's experts are one run */
            b->expert_hi += t->numel;
        }
    }
    m->arena_numel = m->num_params;
}

void loom_block_hold_params(struct loom_model *m, int block, void *params)
{
    struct loom_block *b = &m->blocks[block];
    b->params = loom_buf_of(params, b->numel, m->dtype);
    if (m->dtype == LOOM_DTYPE_F32) b->work_params = params;
}

void loom_block_hold_grads(struct loom_model *m, int block, void *grads)
{
    struct loom_block *b = &m->blocks[block];
    b->grads = loom_buf_of(grads, b->numel, m->dtype);
    if (m->dtype == LOOM_DTYPE_F32) {
        b->work_grads = grads;
        b->grads_owner = grads ? LOOM_GRADS_ARENA : LOOM_GRADS_NONE;
    }
}

void loom_block_provide_grads(struct loom_model *m, int block, float *grads, int owner)
{
    struct loom_block *b = &m->blocks[block];
    LOOM_ASSERT((grads == NULL) == (owner == LOOM_GRADS_NONE));
    b->work_grads = grads;
    b->grads_owner = owner;
}

void loom_model_alloc_arenas(struct loom_model *m, size_t multiple, int arenas)
{
    LOOM_ASSERT(multiple >= 1 && !m->params.data && !m->grads.data);
    m->arena_numel = (m->num_params + multiple - 1) / multiple * multiple;
    if (arenas & LOOM_MODEL_PARAM_ARENA)
        m->params = loom_backend_buf(m->backend, m->arena_numel, m->dtype, LOOM_MEM_PARAMS);
    if (arenas & LOOM_MODEL_GRAD_ARENA)
        m->grads = loom_backend_buf(m->backend, m->arena_numel, m->dtype, LOOM_MEM_GRADS);
    for (int i = 0; i < m->nblocks; i++) {
        const struct loom_block *b = &m->blocks[i];
        loom_block_hold_params(m, i,
                               m->params.data ? loom_buf_slice(m->params, b->offset, b->numel).data : NULL);
        loom_block_hold_grads(m, i,
                              m->grads.data ? loom_buf_slice(m->grads, b->offset, b->numel).data : NULL);
    }
}

void loom_model_release(struct loom_model *m)
{
    loom_backend_buf_free(m->backend, &m->params);
    loom_backend_buf_free(m->backend, &m->grads);
    loom_backend_buf_free(m->backend, &m->grad_acc);
    for (int i = 0; m->blocks && i < m->nblocks; i++) loom_free(m->blocks[i].tensors);
    loom_free(m->blocks);
    m->blocks = NULL;
}

/* A block's initial values into host memory out (its numel floats). */
static void init_block_host(struct loom_model *m, int bi, uint64_t seed, float *out)
{
    struct loom_block *b = &m->blocks[bi];
    if (m->ops->init_block) {
        float *held = b->work_params;
        b->work_params = out;
        m->ops->init_block(m, bi, seed);
        b->work_params = held;
        return;
    }
    for (int ti = 0; ti < b->ntensors; ti++) {
        const struct loom_tensor *t = &b->tensors[ti];
        float *p = out + t->offset;
        switch (t->init) {
        case LOOM_INIT_ZERO:
            memset(p, 0, t->numel * sizeof *p);
            break;
        case LOOM_INIT_ONE:
            for (size_t i = 0; i < t->numel; i++) p[i] = 1.0f;
            break;
        case LOOM_INIT_NORMAL: {
            /* each tensor its own stream: a block's values depend on no other's */
            struct loom_rng rng;
            loom_rng_seed(&rng, loom_hash3(seed, (uint64_t)b->index, (uint64_t)t->stream));
            if (t->tp_split == LOOM_TP_REPLICATED) {
                for (size_t i = 0; i < t->numel; i++) p[i] = (float)(t->init_std * loom_rng_normal(&rng));
                break;
            }
            /* a part: the whole tensor's stream, keeping the box's entries
             * (visited in the box's row-major order) */
            int64_t inner = 1, total = 1;
            for (int d = t->tp_split + 1; d < t->view_ndim; d++) inner *= t->view[d];
            for (int d = 0; d < t->view_ndim; d++) total *= t->view[d];
            size_t j = 0;
            for (int64_t i = 0; i < total; i++) {
                const float x = (float)(t->init_std * loom_rng_normal(&rng));
                const int64_t k = i / inner % t->view[t->tp_split];
                if (k >= t->tp_lo && k < t->tp_hi) p[j++] = x;
            }
            LOOM_ASSERT(j == t->numel);
            break;
        }
        default:
            LOOM_ASSERT(!"tensor init out of range");
        }
    }
}

void loom_model_init_block(struct loom_model *m, int bi, uint64_t seed, float *out)
{
    const struct loom_block *b = &m->blocks[bi];
    float *host = loom_alloc(loom_mul_size(b->numel + 1, sizeof(float)), LOOM_MEM_OTHER);
    init_block_host(m, bi, seed, host);
    m->backend->upload(out, host, b->numel * sizeof(float));
    loom_free(host);
}

void loom_model_init_weights(struct loom_model *m, uint64_t seed)
{
    LOOM_ASSERT(m->params.data != NULL);
    for (int bi = 0; bi < m->nblocks; bi++) {
        struct loom_block *b = &m->blocks[bi];
        if (m->dtype == LOOM_DTYPE_F32) {
            loom_model_init_block(m, bi, seed, b->params.data);
            continue;
        }
        struct loom_buf tmp = loom_backend_buf(m->backend, b->numel, LOOM_DTYPE_F32, LOOM_MEM_OTHER);
        loom_model_init_block(m, bi, seed, tmp.data);
        m->backend->convert(b->params, tmp);
        loom_backend_buf_free(m->backend, &tmp);
    }
    loom_test_host_read(m->params.data);
}

void loom_model_zero_grad(struct loom_model *m)
{
    if (m->grads.data) m->backend->memset(m->grads.data, 0, loom_buf_bytes(m->grads));
    if (m->grad_acc.data) m->backend->memset(m->grad_acc.data, 0, loom_buf_bytes(m->grad_acc));
}

struct loom_tensor *loom_model_find(struct loom_model *m, const char *name, int *block_out)
{
    for (int i = 0; i < m->nblocks; i++)
        for (int j = 0; j < m->blocks[i].ntensors; j++)
            if (strcmp(m->blocks[i].tensors[j].name, name) == 0) {
                if (block_out) *block_out = i;
                return &m->blocks[i].tensors[j];
            }
    return NULL;
}

int loom_model_find_role(const struct loom_model *m, enum loom_block_role role)
{
    for (int i = 0; i < m->nblocks; i++)
        if (m->blocks[i].role == role) return i;
    return -1;
}

float loom_model_eval(struct loom_model *m, const void *batch, int rows)
{
    struct loom_micro mb = {.slot = 0, .batch = batch, .rows = rows};
    m->ops->forward(m, 0, m->nblocks - 1, &mb);
    return (float)mb.loss;
}

const float *loom_model_logits(struct loom_model *m)
{
    return m->ops->logits ? m->ops->logits(m) : NULL;
}

/* ---- the stack (loom/strategy.h): its strategies, and the blocks announced
 * to them, in stack order on the way in, in reverse on the way out */

void loom_model_push_strategy(struct loom_model *m, const struct loom_strategy *s, void *ctx)
{
    LOOM_ASSERT(m->stack.n < LOOM_STRATEGY_MAX);
    m->stack.s[m->stack.n] = s;
    m->stack.ctx[m->stack.n] = ctx;
    m->stack.n++;
}

int loom_model_strategy_index(const struct loom_model *m, const void *ctx)
{
    for (int i = 0; i < m->stack.n; i++)
        if (m->stack.ctx[i] == ctx) return i;
    return -1;
}

/* The trace's name of a pass over block b: "forward layer 3", "backward head". */
static const char *pass_name(char *buf, size_t n, const struct loom_model *m, int b, const char *pass)
{
    LOOM_ASSERT(b >= 0 && b < m->nblocks);
    const struct loom_block *blk = &m->blocks[b];
    if (blk->role == LOOM_ROLE_LAYER)
        snprintf(buf, n, "%s layer %d", pass, blk->layer);
    else
        snprintf(buf, n, "%s %s", pass, blk->role == LOOM_ROLE_EMBEDDING ? "embedding" : "head");
    return buf;
}

void loom_model_forward_begin(struct loom_model *m, int b)
{
    char name[64];
    if (loom_trace_on()) loom_trace_push(pass_name(name, sizeof name, m, b, "forward"));
    LOOM_STACK_FORWARD(m, pre_forward, b);
}
void loom_model_forward_end(struct loom_model *m, int b)
{
    char name[64];
    LOOM_STACK_REVERSE(m, post_forward, b);
    if (loom_trace_on()) loom_trace_pop(pass_name(name, sizeof name, m, b, "forward"));
}
void loom_model_backward_begin(struct loom_model *m, int b)
{
    char name[64];
    if (loom_trace_on()) loom_trace_push(pass_name(name, sizeof name, m, b, "backward"));
    LOOM_STACK_FORWARD(m, pre_backward, b);
}
void loom_model_grads_ready(struct loom_model *m, int b)
{
    char name[64];
    LOOM_STACK_REVERSE(m, grads_ready, b);
    /* LOOM_GRAD_READY_TIED_HEAD (negative) is no block's end */
    if (b >= 0 && loom_trace_on()) loom_trace_pop(pass_name(name, sizeof name, m, b, "backward"));
}
