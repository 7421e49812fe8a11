/* Mixed precision's float32 working views around blocks (see precision.h). */
#include "parallel/precision.h"

#include <stdio.h>

#include "base/buf.h"
#include "base/log.h"
#include "base/mem.h"
#include "kernels/backend.h"
#include "kernels/pool.h"

static void take_params(struct loom_precision *p, int b)
{
    struct loom_block *blk = &p->model->blocks[b];
    if (blk->work_params) return; /* still held (the pinned block) */
    LOOM_ASSERT(blk->params.data);
    struct loom_buf w = loom_pool_take(blk->numel, LOOM_DTYPE_F32, 0, LOOM_MEM_OTHER);
    p->model->backend->convert(w, blk->params);
    blk->work_params = w.data;
}

static void release_params(struct loom_precision *p, int b)
{
    struct loom_block *blk = &p->model->blocks[b];
    if (!blk->work_params) return;
    loom_pool_give_f32(blk->work_params, blk->numel);
    blk->work_params = NULL;
}

/* After a block's use: its copy goes back, unless it is the pinned one. */
static void give_params(struct loom_precision *p, int b)
{
    if (b != p->pinned) release_params(p, b);
}

static void pre_forward(void *ctx, int b)
{
    take_params(ctx, b);
}

static void post_forward(void *ctx, int b)
{
    give_params(ctx, b);
}

static void pre_backward(void *ctx, int b)
{
    struct loom_precision *p = ctx;
    struct loom_model *m = p->model;
    struct loom_block *blk = &m->blocks[b];
    take_params(p, b);
    if (blk->work_grads) return; /* provided by a strategy before this one */
    float *g = m->grad_acc.data ? (float *)loom_buf_slice(m->grad_acc, blk->offset, blk->numel).data
                                : loom_pool_take_f32(blk->numel, 1, LOOM_MEM_OTHER);
    loom_block_provide_grads(m, b, g, p->index);
}

static void grads_ready(void *ctx, int b)
{
    struct loom_precision *p = ctx;
    if (b < 0) return;
    struct loom_model *m = p->model;
    struct loom_block *blk = &m->blocks[b];
    if (blk->grads_owner == p->index) {
        if (!m->grad_acc.data) {
            m->backend->k->lp_accumulate(blk->grads.data, blk->work_grads, blk->numel, blk->grads.dtype);
            loom_pool_give_f32(blk->work_grads, blk->numel);
        }
        loom_block_provide_grads(m, b, NULL, LOOM_GRADS_NONE);
    }
    give_params(p, b);
}

static void after_step(void *ctx)
{
    struct loom_precision *p = ctx;
    if (p->pinned >= 0) release_params(p, p->pinned);
}

static void describe(void *ctx, char *buf, size_t n)
{
    const struct loom_precision *p = ctx;
    snprintf(buf, n, "precision: %s parameters and gradients, float32 working copies per block in use",
             loom_dtype_name(p->dtype));
}

/* The footprint's replay: the float32 working copies of block b's
 * parameters, and of its gradient unless a strategy below provides it or
 * the float32 accumulator holds it; the bookkeeping of which it holds,
 * from the step's start to its end. */
static void replay(void *ctx, enum loom_replay_point at, int b, struct loom_replay *r)
{
    struct loom_precision *p = ctx;
    struct loom_model *m = p->model;
    switch (at) {
    case LOOM_REPLAY_BEGIN_STEP: {
        const size_t nb = (size_t)m->nblocks;
        p->replay_params = loom_alloc(2 * nb * sizeof *p->replay_params, LOOM_MEM_OTHER);
        p->replay_grads = p->replay_params + nb;
        return;
    }
    case LOOM_REPLAY_PRE_FORWARD:
    case LOOM_REPLAY_PRE_BACKWARD: { /* take_params (the pinned copy may be held), and the gradient's */
        const size_t n = m->blocks[b].numel;
        if (!p->replay_params[b]) p->replay_params[b] = loom_pool_take_f32(n, 0, LOOM_MEM_OTHER);
        if (at == LOOM_REPLAY_PRE_BACKWARD && !r->grads_provided && !m->grad_acc.data)
            p->replay_grads[b] = loom_pool_take_f32(n, 1, LOOM_MEM_OTHER);
        return;
    }
    case LOOM_REPLAY_POST_FORWARD:
    case LOOM_REPLAY_GRADS_READY: {
        const size_t n = m->blocks[b].numel;
        if (p->replay_grads[b]) loom_pool_give_f32(p->replay_grads[b], n);
        p->replay_grads[b] = NULL;
        if (b != p->pinned && p->replay_params[b]) {
            loom_pool_give_f32(p->replay_params[b], n);
            p->replay_params[b] = NULL;
        }
        return;
    }
    case LOOM_REPLAY_FINISH:
        if (p->pinned >= 0 && p->replay_params[p->pinned]) /* after_step */
            loom_pool_give_f32(p->replay_params[p->pinned], m->blocks[p->pinned].numel);
        loom_free(p->replay_params);
        p->replay_params = p->replay_grads = NULL;
        return;
    default:
        return;
    }
}

static const struct loom_strategy precision_strategy = {.name = "precision",
                                                        .pre_forward = pre_forward,
                                                        .post_forward = post_forward,
                                                        .pre_backward = pre_backward,
                                                        .grads_ready = grads_ready,
                                                        .after_step = after_step,
                                                        .describe = describe,
                                                        .replay = replay};

void loom_precision_init(struct loom_precision *p, struct loom_model *m)
{
    LOOM_ASSERT(m->dtype == LOOM_DTYPE_BF16 || m->dtype == LOOM_DTYPE_F16);
    p->model = m;
    p->dtype = m->dtype;
    struct loom_tied_embedding te;
    p->pinned = m->ops->tied_embedding && m->ops->tied_embedding(m, &te) ? te.block : -1;
    p->index = m->stack.n;
    loom_model_push_strategy(m, &precision_strategy, p);
}

void loom_precision_free(struct loom_precision *p)
{
    after_step(p);
}
