/* DDP: buckets, the grad-ready hook, and the naive reference (see ddp.h). */
#include "parallel/ddp.h"

#include <time.h>

#include "base/log.h"
#include "base/mem.h"
#include "base/pool.h"
#include "kernels/kernels.h"

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + ts.tv_nsec * 1e-9;
}

static void post_bucket(struct loom_ddp *d, struct loom_ddp_bucket *b)
{
    LOOM_ASSERT(b->handle == NULL && b->grads);
    if (d->reduce16) { /* --grad-reduce-dtype bf16/fp16: this rank's sum rounded once, then summed in 16 bits
                        */
        loom_lp_from_f32(b->grads_lp, b->grads, b->count, (enum loom_dtype)d->model->dtype);
        b->handle =
            loom_comm_allreduce(LOOM_GROUP_DP, loom_buf_of(b->grads_lp, b->count, d->reduce16), LOOM_OP_SUM);
        return;
    }
    b->handle = loom_comm_allreduce(LOOM_GROUP_DP, loom_buf_f32(b->grads, b->count), LOOM_OP_SUM);
}

/* Mixed precision: during the backward that reduces, a bucket's blocks
 * accumulate into a float32 buffer that starts from their 16-bit gradients
 * so far; it is reduced in float32 and rounded once into the 16-bit
 * gradients, so every layout rounds the same sum. */
static void open_bucket(struct loom_ddp *d, struct loom_ddp_bucket *b)
{
    struct loom_model *m = d->model;
    b->grads = loom_pool_take(b->count, 0, LOOM_MEM_COMM);
    loom_lp_to_f32(b->grads, b->grads_lp, b->count, d->dtype);
    for (int i = b->first_block; i <= b->last_block; i++)
        m->blocks[i].grads = b->grads + (m->blocks[i].grads_lp - b->grads_lp);
}

static double land_bucket(struct loom_ddp *d, struct loom_ddp_bucket *b)
{
    double t = loom_comm_wait(b->handle);
    b->handle = NULL;
    if (d->reduce16 &&
        !d->dtype) /* float32 accumulation: the arena holds the reduced sum for the step's rounding */
        loom_lp_to_f32(b->grads, b->grads_lp, b->count, (enum loom_dtype)d->model->dtype);
    if (d->dtype) {
        if (!d->reduce16) loom_lp_from_f32(b->grads_lp, b->grads, b->count, d->dtype);
        loom_pool_give(b->grads, b->count);
        b->grads = NULL;
        for (int i = b->first_block; i <= b->last_block; i++) d->model->blocks[i].grads = NULL;
    }
    return t;
}

static void on_grad_ready(void *ctx, int block)
{
    struct loom_ddp *d = ctx;
    if (!d->sync || d->naive || !d->overlap) return;
    if (block == LOOM_GRAD_READY_TIED_HEAD) {
        if (d->early_wte) post_bucket(d, &d->wte);
        return;
    }
    struct loom_ddp_bucket *b = &d->buckets[d->bucket_of[block]];
    if (block == b->first_block) post_bucket(d, b);
}

void loom_ddp_init(struct loom_ddp *d, struct loom_model *m, int dp, double bucket_mb, int overlap, int naive)
{
    d->model = m;
    /* mixed precision reduces float32 bucket buffers into the 16-bit
     * gradients, unless gradients accumulate in a float32 arena: that one is
     * reduced in place, as in float32 training */
    d->dtype = m->grads ? LOOM_DTYPE_F32 : (enum loom_dtype)m->dtype;
    d->dp = dp;
    d->overlap = overlap;
    d->naive = naive;
    d->sync = 0;
    d->wait_s = 0;
    d->buckets = loom_alloc(sizeof *d->buckets * (size_t)m->nblocks, LOOM_MEM_OTHER);
    d->bucket_of = loom_alloc(sizeof *d->bucket_of * (size_t)m->nblocks, LOOM_MEM_OTHER);
    const size_t cap = (size_t)(bucket_mb * 1e6 / sizeof(float));
    d->nbuckets = 0;
    int last = m->nblocks - 1;
    size_t count = 0;
    for (int i = m->nblocks - 1; i >= 0; i--) {
        count += m->blocks[i].numel;
        d->bucket_of[i] = d->nbuckets;
        if (count >= cap || i == 0) {
            struct loom_ddp_bucket *b = &d->buckets[d->nbuckets++];
            b->first_block = i;
            b->last_block = last;
            b->grads = m->grads
                           ? m->grads + (m->blocks[i].grads_lp ? (size_t)(m->blocks[i].grads_lp - m->grads_lp)
                                                               : (size_t)(m->blocks[i].grads - m->grads))
                           : NULL;
            b->grads_lp = m->blocks[i].grads_lp;
            b->count = count;
            b->handle = NULL;
            last = i - 1;
            count = 0;
        }
    }
    struct loom_tied_embedding te;
    /* (not under mixed precision: the deferred scatter would need float32 gradients) */
    d->early_wte = overlap && !naive && !m->dtype && m->ops->tied_embedding && m->ops->tied_embedding(m, &te);
    if (d->early_wte) {
        /* the tied table out of the last bucket, into its own */
        const struct loom_tensor *table = &m->blocks[te.block].tensors[0];
        struct loom_ddp_bucket *tail = &d->buckets[d->nbuckets - 1];
        LOOM_ASSERT(te.block == 0 && tail->first_block == 0 && table->offset == 0 && te.vocab < (1 << 24));
        d->wte = (struct loom_ddp_bucket){.grads = m->blocks[0].grads, .count = table->numel};
        tail->grads += table->numel;
        tail->count -= table->numel;
        d->gathered_dres = loom_alloc(
            loom_mul_size((size_t)dp * te.max_rows, (size_t)te.width * sizeof(float)), LOOM_MEM_COMM);
        d->gathered_tokens =
            loom_alloc(loom_mul_size((size_t)dp * te.max_rows, sizeof(float)), LOOM_MEM_COMM);
        d->my_tokens = loom_alloc(loom_mul_size(te.max_rows, sizeof(float)), LOOM_MEM_COMM);
    }
    m->grad_ready = on_grad_ready;
    m->hook_ctx = d;
}

/* The embedding lookup's share of dwte, for every rank's rows, in rank order. */
static void scatter_all_ranks(struct loom_ddp *d)
{
    struct loom_model *m = d->model;
    struct loom_tied_embedding te;
    m->ops->tied_embedding(m, &te);
    const size_t rows = te.rows, C = (size_t)te.width;
    LOOM_ASSERT(rows == te.max_rows); /* every rank runs full micro-batches */
    for (size_t i = 0; i < rows; i++) d->my_tokens[i] = (float)te.tokens[i];
    struct loom_comm_handle *h1 =
        loom_comm_allgather(LOOM_GROUP_DP, loom_buf_of_const(te.dout, rows * C, LOOM_DTYPE_F32),
                            loom_buf_f32(d->gathered_dres, rows * C * (size_t)d->dp));
    struct loom_comm_handle *h2 = loom_comm_allgather(LOOM_GROUP_DP, loom_buf_f32(d->my_tokens, rows),
                                                      loom_buf_f32(d->gathered_tokens, rows * (size_t)d->dp));
    loom_comm_wait(h1);
    loom_comm_wait(h2);
    int32_t *tokens = loom_alloc(rows * sizeof(int32_t), LOOM_MEM_COMM);
    for (int k = 0; k < d->dp; k++) {
        for (size_t i = 0; i < rows; i++) tokens[i] = (int32_t)d->gathered_tokens[(size_t)k * rows + i];
        loom_embedding_backward(m->blocks[te.block].grads, NULL, d->gathered_dres + (size_t)k * rows * C,
                                tokens, 1, (int)rows, (int)C);
    }
    loom_free(tokens);
}

/* Tells the model whether its backward leaves the table's scatter to us. */
static void set_defer(struct loom_ddp *d, int defer)
{
    struct loom_tied_embedding te;
    if (d->early_wte && d->model->ops->tied_embedding(d->model, &te)) *te.defer = defer;
}

void loom_ddp_reduce_in(struct loom_ddp *d, enum loom_dtype dt)
{
    LOOM_ASSERT(dt == LOOM_DTYPE_F32 || (d->model->dtype && !d->early_wte));
    d->reduce16 = dt == LOOM_DTYPE_F32 ? 0 : dt;
}

void loom_ddp_free(struct loom_ddp *d)
{
    if (d->model) {
        d->model->grad_ready = NULL;
        d->model->hook_ctx = NULL;
    }
    loom_free(d->buckets);
    loom_free(d->bucket_of);
    loom_free(d->gathered_dres);
    loom_free(d->gathered_tokens);
    loom_free(d->my_tokens);
    d->gathered_dres = d->gathered_tokens = d->my_tokens = NULL;
    d->buckets = NULL;
    d->bucket_of = NULL;
}

void loom_ddp_begin_backward(struct loom_ddp *d, int sync)
{
    d->sync = sync;
    set_defer(d, sync);
    if (!d->dtype || !sync) return;
    if (d->naive) {
        d->all = (struct loom_ddp_bucket){.last_block = d->model->nblocks - 1,
                                          .grads_lp = d->model->grads_lp,
                                          .count = d->model->num_params};
        open_bucket(d, &d->all);
    } else {
        for (int i = 0; i < d->nbuckets; i++) open_bucket(d, &d->buckets[i]);
    }
}

void loom_ddp_finish(struct loom_ddp *d)
{
    LOOM_ASSERT(d->sync);
    double t0 = now_s();
    if (d->naive) {
        if (!d->dtype)
            d->all = (struct loom_ddp_bucket){.last_block = d->model->nblocks - 1,
                                              .grads = d->model->grads,
                                              .grads_lp = d->model->grads_lp,
                                              .count = d->model->num_params};
        post_bucket(d, &d->all);
        land_bucket(d, &d->all);
    } else {
        /* buckets not yet posted (no overlap): in backward order, as the hook would */
        for (int i = 0; i < d->nbuckets; i++)
            if (!d->buckets[i].handle) post_bucket(d, &d->buckets[i]);
        for (int i = 0; i < d->nbuckets; i++) land_bucket(d, &d->buckets[i]);
        if (d->early_wte) {
            land_bucket(d, &d->wte);
            scatter_all_ranks(d);
        }
    }
    set_defer(d, 0);
    d->sync = 0;
    d->wait_s = now_s() - t0;
}
