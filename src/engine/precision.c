/* Mixed precision's float32 working copies around blocks (see precision.h). */
#include "engine/precision.h"

#include "base/log.h"
#include "base/mem.h"
#include "base/pool.h"

static void take_params(struct loom_precision *p, int b)
{
    struct loom_block *blk = &p->model->blocks[b];
    if (blk->params) return; /* still held (the pinned block) */
    LOOM_ASSERT(blk->params_lp);
    blk->params = loom_pool_take(blk->numel, 0, LOOM_MEM_OTHER);
    loom_lp_to_f32(blk->params, blk->params_lp, blk->numel, p->dtype);
}

static void release_params(struct loom_precision *p, int b)
{
    struct loom_block *blk = &p->model->blocks[b];
    if (!blk->params) return;
    loom_pool_give(blk->params, blk->numel);
    blk->params = NULL;
}

/* After a block's use: its copy goes back, unless it is the pinned one. */
static void give_params(struct loom_precision *p, int b)
{
    if (b != p->pinned) release_params(p, b);
}

static void pre_forward(void *ctx, int b)
{
    struct loom_precision *p = ctx;
    if (p->pre_forward) p->pre_forward(p->ctx, b);
    take_params(p, b);
}

static void post_forward(void *ctx, int b)
{
    struct loom_precision *p = ctx;
    give_params(p, b);
    if (p->post_forward) p->post_forward(p->ctx, b);
}

static void pre_backward(void *ctx, int b)
{
    struct loom_precision *p = ctx;
    struct loom_block *blk = &p->model->blocks[b];
    if (p->pre_backward) p->pre_backward(p->ctx, b);
    take_params(p, b);
    /* a strategy may provide the float32 gradient buffer (ZeRO-2/3, DDP's
     * reducing backward); otherwise it is ours, rounded into the 16-bit
     * gradients when the block is done */
    p->own_grads[b] = blk->grads == NULL;
    if (p->own_grads[b] && p->model->grads) /* the float32 accumulator of gradient accumulation */
        blk->grads = p->model->grads + (blk->grads_lp - p->model->grads_lp);
    else if (p->own_grads[b])
        blk->grads = loom_pool_take(blk->numel, 1, LOOM_MEM_OTHER);
}

static void grad_ready(void *ctx, int b)
{
    struct loom_precision *p = ctx;
    if (b >= 0) {
        struct loom_block *blk = &p->model->blocks[b];
        if (p->own_grads[b] && !p->model->grads) {
            loom_lp_accumulate(blk->grads_lp, blk->grads, blk->numel, p->dtype);
            loom_pool_give(blk->grads, blk->numel);
        }
        if (p->own_grads[b]) blk->grads = NULL;
        p->own_grads[b] = 0;
        give_params(p, b);
    }
    if (p->grad_ready) p->grad_ready(p->ctx, b);
}

void loom_precision_init(struct loom_precision *p, struct loom_model *m)
{
    LOOM_ASSERT(m->dtype == LOOM_DTYPE_BF16 || m->dtype == LOOM_DTYPE_F16);
    p->model = m;
    p->dtype = (enum loom_dtype)m->dtype;
    p->own_grads = loom_alloc(sizeof(int) * (size_t)m->nblocks, LOOM_MEM_OTHER);
    struct loom_tied_embedding te;
    p->pinned = m->ops->tied_embedding && m->ops->tied_embedding(m, &te) ? te.block : -1;
    p->pre_forward = m->pre_forward, p->post_forward = m->post_forward;
    p->pre_backward = m->pre_backward, p->grad_ready = m->grad_ready;
    p->ctx = m->hook_ctx;
    m->pre_forward = pre_forward, m->post_forward = post_forward;
    m->pre_backward = pre_backward, m->grad_ready = grad_ready;
    m->hook_ctx = p;
    for (int b = 0; b < m->nblocks; b++) m->blocks[b].params = m->blocks[b].grads = NULL;
}

void loom_precision_end_step(struct loom_precision *p)
{
    if (p->pinned >= 0) release_params(p, p->pinned);
}

void loom_precision_free(struct loom_precision *p)
{
    loom_precision_end_step(p);
    loom_free(p->own_grads);
    struct loom_model *m = p->model;
    if (m->hook_ctx == p) {
        m->pre_forward = p->pre_forward, m->post_forward = p->post_forward;
        m->pre_backward = p->pre_backward, m->grad_ready = p->grad_ready;
        m->hook_ctx = p->ctx;
    }
}
