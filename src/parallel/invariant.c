/* Layout-invariant accumulation: micro-batch gradients in a binary tree (invariant.h). */
#include "parallel/invariant.h"

#include "base/log.h"
#include "base/mem.h"
#include "kernels/backend.h"
#include "kernels/pool.h"
#include "layers/sum_tree.h"

static void begin_backward(void *ctx, int micro, int last)
{
    struct loom_invariant *x = ctx;
    LOOM_ASSERT(micro >= 0 && micro < x->micros && last == (micro == x->micros - 1));
    x->micro = micro;
    x->last = last;
}

static void pre_backward(void *ctx, int b)
{
    struct loom_invariant *x = ctx;
    if (x->micros == 1) return; /* the kernels write the one gradient into the view itself */
    struct loom_model *m = x->model;
    struct loom_block *blk = &m->blocks[b];
    LOOM_ASSERT(x->own[b] == NULL && blk->work_grads != NULL);
    x->dest[b] = blk->work_grads;
    x->dest_owner[b] = blk->grads_owner;
    x->own[b] = loom_pool_take_f32(blk->numel, 1, LOOM_MEM_GRADS);
    loom_block_provide_grads(m, b, x->own[b], x->index);
}

/* s += v, n floats on the model's backend (float addition commutes: the
 * order of the operands is no matter) */
static void add(const struct loom_invariant *x, float *s, const float *v, size_t n)
{
    x->model->backend->k->accumulate(s, v, n);
}

static float **slot(struct loom_invariant *x, int k, int b)
{
    return &x->level[(size_t)k * x->model->nblocks + b];
}

static void grads_ready(void *ctx, int b)
{
    struct loom_invariant *x = ctx;
    if (b < 0 || x->micros == 1) return; /* the tied-head event: the table's gradient is still open */
    struct loom_model *m = x->model;
    const size_t n = m->blocks[b].numel;
    float *s = x->own[b];
    loom_sum_tree_add(m->backend, slot(x, 0, b), (size_t)m->nblocks, x->levels, s, n, (unsigned)x->micro,
                      x->last);
    if (x->last) add(x, x->dest[b], s, n); /* the view holds zeros until now */
    loom_pool_give_f32(s, n);
    x->own[b] = NULL;
    loom_block_provide_grads(m, b, x->dest[b], x->dest_owner[b]);
}

static void describe(void *ctx, char *buf, size_t n)
{
    const struct loom_invariant *x = ctx;
    snprintf(
        buf, n,
        "layout-invariant: split sums in %d tensor-parallel pieces, %d micro-batch gradient%s in a binary "
        "tree, data-parallel sums in the tree over the ranks, the norm in integers",
        x->pieces, x->micros, x->micros == 1 ? "" : "s");
}

/* The footprint's replay of block b in the replay's micro-batch: its own
 * gradient (pooled) and the levels it fills, allocated as grads_ready
 * allocates them. */
static void replay(void *ctx, enum loom_replay_point at, int b, struct loom_replay *r)
{
    struct loom_invariant *x = ctx;
    const int micro = r->micro;
    if (x->micros == 1 || b < 0) return;
    const size_t n = x->model->blocks[b].numel;
    if (at == LOOM_REPLAY_PRE_BACKWARD) {
        LOOM_ASSERT(x->own[b] == NULL);
        x->own[b] = loom_pool_take_f32(n, 1, LOOM_MEM_GRADS);
    } else if (at == LOOM_REPLAY_GRADS_READY) {
        int k = 0;
        for (unsigned t = (unsigned)micro; t & 1; t >>= 1) k++;
        if (micro < x->micros - 1) { /* the level grads_ready copies into */
            float **l = slot(x, k, b);
            if (!*l) *l = x->model->backend->alloc(n * sizeof(float), LOOM_MEM_GRADS);
        }
        loom_pool_give_f32(x->own[b], n);
        x->own[b] = NULL;
    }
}

static const struct loom_strategy invariant_strategy = {.name = "invariant",
                                                        .begin_backward = begin_backward,
                                                        .pre_backward = pre_backward,
                                                        .grads_ready = grads_ready,
                                                        .describe = describe,
                                                        .replay = replay};

void loom_invariant_init(struct loom_invariant *x, struct loom_model *m, int micros, int pieces)
{
    LOOM_ASSERT(micros >= 1 && pieces >= 1);
    *x = (struct loom_invariant){.model = m, .micros = micros, .pieces = pieces};
    x->levels = loom_sum_tree_levels(micros);
    const size_t nb = (size_t)m->nblocks;
    x->level = loom_alloc(sizeof *x->level * nb * (size_t)x->levels, LOOM_MEM_OTHER);
    x->own = loom_alloc(sizeof *x->own * nb * 2, LOOM_MEM_OTHER);
    x->dest = x->own + nb;
    x->dest_owner = loom_alloc(sizeof *x->dest_owner * nb, LOOM_MEM_OTHER);
    x->index = m->stack.n;
    loom_model_push_strategy(m, &invariant_strategy, x);
}

void loom_invariant_free(struct loom_invariant *x)
{
    if (!x->model) return;
    for (size_t i = 0; i < (size_t)x->model->nblocks * (size_t)x->levels; i++)
        x->model->backend->free(x->level[i]);
    loom_free(x->level);
    loom_free(x->own);
    loom_free(x->dest_owner);
    *x = (struct loom_invariant){0};
}
