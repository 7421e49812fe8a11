/* DDP: buckets, the grad-ready hook, and the naive reference (see ddp.h). */
#include "parallel/ddp.h"

#include "base/log.h"
#include "base/mem.h"

static void post_bucket(struct loom_ddp *d, struct loom_ddp_bucket *b)
{
    LOOM_ASSERT(b->handle == NULL);
    b->handle = loom_comm_allreduce(LOOM_GROUP_DP, b->grads, b->count, LOOM_F32, LOOM_OP_SUM);
    (void)d;
}

static void on_grad_ready(void *ctx, int block)
{
    struct loom_ddp *d = ctx;
    if (!d->sync || d->naive || !d->overlap) return;
    struct loom_ddp_bucket *b = &d->buckets[d->bucket_of[block]];
    if (block == b->first_block) post_bucket(d, b);
}

void loom_ddp_init(struct loom_ddp *d, struct loom_gpt2 *m, int dp, double bucket_mb, int overlap, int naive)
{
    d->model = m;
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
            b->grads = m->blocks[i].grads;
            b->count = count;
            b->handle = NULL;
            last = i - 1;
            count = 0;
        }
    }
    m->grad_ready = on_grad_ready;
    m->grad_ready_ctx = d;
}

void loom_ddp_free(struct loom_ddp *d)
{
    if (d->model) {
        d->model->grad_ready = NULL;
        d->model->grad_ready_ctx = NULL;
    }
    loom_free(d->buckets);
    loom_free(d->bucket_of);
    d->buckets = NULL;
    d->bucket_of = NULL;
}

void loom_ddp_begin_backward(struct loom_ddp *d, int sync) { d->sync = sync; }

void loom_ddp_finish(struct loom_ddp *d)
{
    LOOM_ASSERT(d->sync);
    d->wait_s = 0;
    if (d->naive) {
        d->wait_s = loom_comm_wait(
            loom_comm_allreduce(LOOM_GROUP_DP, d->model->grads, d->model->num_params, LOOM_F32, LOOM_OP_SUM));
        return;
    }
    /* buckets not yet posted (no overlap): in backward order, as the hook would */
    for (int i = 0; i < d->nbuckets; i++)
        if (!d->buckets[i].handle) post_bucket(d, &d->buckets[i]);
    for (int i = 0; i < d->nbuckets; i++) {
        d->wait_s += loom_comm_wait(d->buckets[i].handle);
        d->buckets[i].handle = NULL;
    }
    d->sync = 0;
}
