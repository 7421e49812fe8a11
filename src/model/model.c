/* Building a model of blocks and named tensors, its arenas, initialisation
 * from the tensors' init fields, and whole-model evaluation (see
 * loom/model.h). Not here: the strategy stack's dispatch (parallel/stack.c). */
#include "loom/model.h"

#include <string.h>

#include "base/buf.h"
#include "base/dtype.h"
#include "base/log.h"
#include "base/mem.h"
#include "base/rng.h"
#include "kernels/backend.h"

void loom_model_init(struct loom_model *m, const struct loom_model_ops *ops, const char *name, int nblocks)
{
    LOOM_ASSERT(ops && ops->forward && ops->backward && nblocks >= 1);
    memset(m, 0, sizeof *m);
    m->ops = ops;
    m->name = name;
    m->nblocks = nblocks;
    m->dtype = LOOM_DTYPE_F32;
    m->backend = loom_backend_cpu();
    m->blocks = loom_alloc(sizeof *m->blocks * (size_t)nblocks, LOOM_MEM_OTHER);
    for (int i = 0; i < nblocks; i++) {
        m->blocks[i].role = LOOM_ROLE_LAYER;
        m->blocks[i].grads_owner = LOOM_GRADS_NONE;
    }
}

struct loom_tensor *loom_block_add_tensor(struct loom_block *b, const char *name, int ndim,
                                          const int64_t *shape)
{
    LOOM_ASSERT(b->ntensors < LOOM_BLOCK_MAX_TENSORS && ndim >= 1 && ndim <= LOOM_TENSOR_MAX_DIMS);
    struct loom_tensor *t = &b->tensors[b->ntensors++];
    LOOM_ASSERT(strlen(name) < sizeof t->name);
    strcpy(t->name, name);
    t->ndim = ndim;
    t->numel = 1;
    for (int d = 0; d < LOOM_TENSOR_MAX_DIMS; d++) {
        t->shape[d] = d < ndim ? shape[d] : 1;
        LOOM_ASSERT(t->shape[d] >= 1);
        t->numel = loom_mul_size(t->numel, (size_t)t->shape[d]);
    }
    t->offset = b->numel;
    t->decay = ndim >= 2;
    t->init = LOOM_INIT_NORMAL;
    t->init_std = 0.02;
    t->tp_split = LOOM_TP_REPLICATED;
    b->numel += t->numel;
    return t;
}

void loom_model_layout_done(struct loom_model *m)
{
    m->num_params = 0;
    for (int i = 0; i < m->nblocks; i++) {
        m->blocks[i].offset = m->num_params;
        m->num_params += m->blocks[i].numel;
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
        m->params = loom_buf_alloc(m->arena_numel, m->dtype, LOOM_MEM_PARAMS);
    if (arenas & LOOM_MODEL_GRAD_ARENA) m->grads = loom_buf_alloc(m->arena_numel, m->dtype, LOOM_MEM_GRADS);
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
    loom_buf_free(&m->params);
    loom_buf_free(&m->grads);
    loom_buf_free(&m->grad_acc);
    loom_free(m->blocks);
    m->blocks = NULL;
}

void loom_model_init_block(struct loom_model *m, int bi, uint64_t seed, float *out)
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
            loom_rng_seed(&rng, loom_hash3(seed, (uint64_t)bi, (uint64_t)ti));
            for (size_t i = 0; i < t->numel; i++) p[i] = (float)(t->init_std * loom_rng_normal(&rng));
            break;
        }
        default:
            LOOM_ASSERT(!"tensor init out of range");
        }
    }
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
        struct loom_buf tmp = loom_buf_alloc(b->numel, LOOM_DTYPE_F32, LOOM_MEM_OTHER);
        loom_model_init_block(m, bi, seed, tmp.data);
        loom_buf_convert(b->params, tmp);
        loom_buf_free(&tmp);
    }
}

void loom_model_zero_grad(struct loom_model *m)
{
    if (m->grads.data) memset(m->grads.data, 0, loom_buf_bytes(m->grads));
    if (m->grad_acc.data) memset(m->grad_acc.data, 0, loom_buf_bytes(m->grad_acc));
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
