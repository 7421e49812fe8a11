/* Building a model of blocks and named tensors, its arenas (see loom/model.h). */
#include "loom/model.h"

#include <string.h>

#include "base/dtype.h"
#include "base/log.h"
#include "base/mem.h"

void loom_model_init(struct loom_model *m, const struct loom_model_ops *ops, const char *name, int nblocks)
{
    LOOM_ASSERT(ops && ops->forward && ops->backward && ops->init_block && nblocks >= 1);
    memset(m, 0, sizeof *m);
    m->ops = ops;
    m->name = name;
    m->nblocks = nblocks;
    m->blocks = loom_alloc(sizeof *m->blocks * (size_t)nblocks, LOOM_MEM_OTHER);
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
    b->numel += t->numel;
    return t;
}

void loom_model_layout_done(struct loom_model *m)
{
    m->num_params = 0;
    for (int i = 0; i < m->nblocks; i++) m->num_params += m->blocks[i].numel;
    m->arena_numel = m->num_params;
}

void loom_model_alloc_arenas(struct loom_model *m, size_t multiple, int arenas)
{
    LOOM_ASSERT(multiple >= 1 && !m->params && !m->grads && !m->params_lp && !m->grads_lp);
    m->arena_numel = (m->num_params + multiple - 1) / multiple * multiple;
    const size_t esize = m->dtype ? sizeof(uint16_t) : sizeof(float);
    void *p = arenas & LOOM_MODEL_PARAM_ARENA
                  ? loom_alloc(loom_mul_size(m->arena_numel, esize), LOOM_MEM_PARAMS)
                  : NULL;
    void *g = arenas & LOOM_MODEL_GRAD_ARENA
                  ? loom_alloc(loom_mul_size(m->arena_numel, esize), LOOM_MEM_GRADS)
                  : NULL;
    if (m->dtype)
        m->params_lp = p, m->grads_lp = g;
    else
        m->params = p, m->grads = g;
    for (size_t i = 0, off = 0; i < (size_t)m->nblocks; off += m->blocks[i].numel, i++) {
        struct loom_block *b = &m->blocks[i];
        b->params = m->params ? m->params + off : NULL;
        b->grads = m->grads ? m->grads + off : NULL;
        b->params_lp = m->params_lp ? m->params_lp + off : NULL;
        b->grads_lp = m->grads_lp ? m->grads_lp + off : NULL;
    }
}

void loom_model_release(struct loom_model *m)
{
    loom_free(m->params);
    loom_free(m->grads);
    loom_free(m->params_lp);
    loom_free(m->grads_lp);
    loom_free(m->blocks);
    m->params = m->grads = NULL;
    m->params_lp = m->grads_lp = NULL;
    m->blocks = NULL;
}

void loom_model_init_weights(struct loom_model *m, uint64_t seed)
{
    LOOM_ASSERT(m->dtype ? m->params_lp != NULL : m->params != NULL);
    for (int b = 0; b < m->nblocks; b++) {
        struct loom_block *blk = &m->blocks[b];
        if (!m->dtype) {
            m->ops->init_block(m, b, seed);
            continue;
        }
        blk->params = loom_alloc(loom_mul_size(blk->numel, sizeof(float)), LOOM_MEM_OTHER);
        m->ops->init_block(m, b, seed);
        loom_lp_from_f32(blk->params_lp, blk->params, blk->numel, (enum loom_dtype)m->dtype);
        loom_free(blk->params);
        blk->params = NULL;
    }
}

void loom_model_zero_grad(struct loom_model *m)
{
    if (m->grads) memset(m->grads, 0, m->arena_numel * sizeof(float));
    if (m->grads_lp) memset(m->grads_lp, 0, m->arena_numel * sizeof(uint16_t));
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
