/* DDP: buckets, the grads_ready hook, and the naive reference (see ddp.h). */
#include "parallel/ddp.h"

#include <stdio.h>

#include "base/clock.h"
#include "base/log.h"
#include "base/mem.h"
#include "kernels/backend.h"
#include "kernels/pool.h"

/* With experts apart, the bucket's runs [at, at + n) of one group each, at
 * most `max`: every block's expert tensors over the expert-data-parallel
 * group, the rest over dp. */
static int runs(const struct loom_ddp *d, const struct loom_ddp_bucket *b, size_t *at, size_t *n,
                enum loom_group *g, int max)
{
    const size_t lo = b->base, hi = b->base + b->f32.numel;
    int k = 0;
    size_t from = lo;
    for (int i = b->first_block; i <= b->last_block; i++) {
        const struct loom_block *blk = &d->model->blocks[i];
        if (blk->expert_hi <= blk->expert_lo) continue;
        const size_t x0 = blk->offset + blk->expert_lo, x1 = blk->offset + blk->expert_hi;
        if (x1 <= lo || x0 >= hi) continue;
        const size_t a = x0 > lo ? x0 : lo, z = x1 < hi ? x1 : hi;
        LOOM_ASSERT(k + 2 <= max);
        if (a > from) at[k] = from - lo, n[k] = a - from, g[k++] = LOOM_GROUP_DP;
        at[k] = a - lo, n[k] = z - a, g[k++] = LOOM_GROUP_EXPERT_DP;
        from = z;
    }
    LOOM_ASSERT(k + 1 <= max);
    if (hi > from || k == 0) at[k] = from - lo, n[k] = hi - from, g[k++] = LOOM_GROUP_DP;
    return k;
}

/* ZeRO-1: the ranks' counts of the bucket's n elements (d->counts) by
 * their shards, and this rank's segment of the sum taken (b->recv, landing
 * at b->recv_off). */
static void take_recv(struct loom_ddp *d, struct loom_ddp_bucket *b, enum loom_dtype dt)
{
    const size_t lo = b->base, hi = lo + (b->stored.data ? b->stored.numel : b->f32.numel);
    size_t mine = lo;
    for (int r = 0; r < d->dp; r++) {
        size_t a = (size_t)r * d->shard_numel, e = a + d->shard_numel;
        if (a < lo) a = lo;
        if (e > hi) e = hi;
        d->counts[r] = e > a ? (int)(e - a) : 0;
        if (r == d->dp_rank && e > a) mine = a;
    }
    b->recv_off = mine - lo;
    b->recv = loom_pool_take((size_t)d->counts[d->dp_rank], dt, 0, LOOM_MEM_COMM);
}

static void post_bucket(struct loom_ddp *d, struct loom_ddp_bucket *b)
{
    LOOM_ASSERT(b->handle == NULL && b->f32.data);
    /* this rank's sum rounded once, then summed in 16 bits; or float32 */
    const int lp = d->reduce_dtype != LOOM_DTYPE_F32;
    if (lp) d->model->backend->convert(b->stored, b->f32);
    const struct loom_buf all = lp ? b->stored : b->f32;
    if (d->shard) { /* ZeRO-1: each rank the sum over its shard's part of the bucket */
        if (!b->recv.data) take_recv(d, b, all.dtype);
        b->handle = loom_comm_reduce_scatter_v(LOOM_GROUP_DP, all, b->recv, d->counts);
        return;
    }
    if (!d->experts_apart) { /* one run, over dp */
        b->handle = loom_comm_allreduce(LOOM_GROUP_DP, all, LOOM_OP_SUM);
        return;
    }
    const int max = 2 * (b->last_block - b->first_block + 1) + 1;
    size_t *at = loom_alloc(sizeof(size_t) * 2 * (size_t)max, LOOM_MEM_OTHER), *n = at + max;
    enum loom_group *g = loom_alloc(sizeof *g * (size_t)max, LOOM_MEM_OTHER);
    const int k = runs(d, b, at, n, g, max);
    b->handle = loom_comm_allreduce(g[0], loom_buf_slice(all, at[0], n[0]), LOOM_OP_SUM);
    b->nmore = k - 1;
    if (b->nmore) {
        b->more = loom_alloc(sizeof *b->more * (size_t)b->nmore, LOOM_MEM_OTHER);
        for (int i = 1; i < k; i++)
            b->more[i - 1] = loom_comm_allreduce(g[i], loom_buf_slice(all, at[i], n[i]), LOOM_OP_SUM);
    }
    loom_free(at);
    loom_free(g);
}

/* Points the bucket's blocks' gradient views into its float32 buffer. */
static void provide(struct loom_ddp *d, struct loom_ddp_bucket *b, int give)
{
    struct loom_model *m = d->model;
    const size_t base = m->blocks[b->first_block].offset;
    for (int i = b->first_block; i <= b->last_block; i++)
        loom_block_provide_grads(m, i, give ? (float *)b->f32.data + (m->blocks[i].offset - base) : NULL,
                                 give ? d->index : LOOM_GRADS_NONE);
}

/* Mixed precision: during the backward that reduces, a bucket's blocks
 * accumulate into a float32 buffer that starts from their 16-bit gradients
 * so far; it is reduced in float32 and rounded once into the 16-bit
 * gradients, so every layout rounds the same sum. */
static void open_bucket(struct loom_ddp *d, struct loom_ddp_bucket *b)
{
    b->f32 = loom_pool_take(b->stored.numel, LOOM_DTYPE_F32, 0, LOOM_MEM_COMM);
    d->model->backend->convert(b->f32, b->stored);
    provide(d, b, 1);
}

static double land_bucket(struct loom_ddp *d, struct loom_ddp_bucket *b)
{
    double t = loom_comm_wait(b->handle);
    b->handle = NULL;
    for (int i = 0; i < b->nmore; i++) t += loom_comm_wait(b->more[i]);
    if (b->recv.data) { /* ZeRO-1: this rank's segment of the sum into its place */
        const struct loom_buf all = d->reduce_dtype != LOOM_DTYPE_F32 ? b->stored : b->f32;
        d->model->backend->convert(loom_buf_slice(all, b->recv_off, b->recv.numel), b->recv);
        loom_pool_give(&b->recv);
    }
    loom_free(b->more);
    b->more = NULL;
    b->nmore = 0;
    if (d->reduce_dtype != LOOM_DTYPE_F32 && !d->pooled) /* the float32 accumulator holds the reduced sum */
        d->model->backend->convert(b->f32, b->stored);
    if (d->pooled) {
        if (d->reduce_dtype == LOOM_DTYPE_F32) d->model->backend->convert(b->stored, b->f32);
        provide(d, b, 0);
        loom_pool_give(&b->f32);
    }
    return t;
}

static void grads_ready(void *ctx, int block)
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

/* The float32 gradients DDP reduces in place: the arena in float32
 * training, the accumulator of mixed precision with accumulation, or none
 * (buckets are pooled buffers while in flight). */
static struct loom_buf accumulator(const struct loom_model *m)
{
    return m->dtype == LOOM_DTYPE_F32 ? m->grads : m->grad_acc;
}

static struct loom_ddp_bucket bucket(const struct loom_model *m, int first, int last, size_t count)
{
    const struct loom_buf acc = accumulator(m);
    const size_t off = m->blocks[first].offset;
    struct loom_ddp_bucket b = {.first_block = first, .last_block = last, .base = off};
    b.f32 = acc.data ? loom_buf_slice(acc, off, count) : loom_buf_of(NULL, count, LOOM_DTYPE_F32);
    if (m->dtype != LOOM_DTYPE_F32) b.stored = loom_buf_slice(m->grads, off, count);
    return b;
}

/* The embedding lookup's share of the tied table's gradient, for every
 * rank's rows, in rank order. */
static void scatter_all_ranks(struct loom_ddp *d)
{
    struct loom_model *m = d->model;
    struct loom_tied_embedding te;
    m->ops->tied_embedding(m, &te);
    const size_t rows = te.rows, C = (size_t)te.width;
    LOOM_ASSERT(rows == te.max_rows); /* every rank runs full micro-batches */
    struct loom_comm_handle *h1 =
        loom_comm_allgather(LOOM_GROUP_DP, loom_buf_of_const(te.dout, rows * C, LOOM_DTYPE_F32),
                            loom_buf_f32(d->gathered_dres, rows * C * (size_t)d->dp));
    struct loom_comm_handle *h2 =
        loom_comm_allgather(LOOM_GROUP_DP, loom_buf_of_const(te.tokens, rows, LOOM_DTYPE_I32),
                            loom_buf_of(d->gathered_tokens, rows * (size_t)d->dp, LOOM_DTYPE_I32));
    loom_comm_wait(h1);
    loom_comm_wait(h2);
    for (int k = 0; k < d->dp; k++)
        m->backend->k->embedding_backward(m->blocks[te.block].work_grads, NULL,
                                          d->gathered_dres + (size_t)k * rows * C,
                                          d->gathered_tokens + (size_t)k * rows, 1, (int)rows, (int)C);
}

/* Tells the model whether its backward leaves the table's scatter to us. */
static void set_defer(struct loom_ddp *d, int defer)
{
    struct loom_tied_embedding te;
    if (d->early_wte && d->model->ops->tied_embedding(d->model, &te)) *te.defer = defer;
}

static void begin_backward(void *ctx, int micro, int last)
{
    (void)micro;
    struct loom_ddp *d = ctx;
    d->sync = last;
    set_defer(d, last);
    if (!d->pooled || !last) return;
    if (d->naive) {
        d->all = bucket(d->model, 0, d->model->nblocks - 1, d->model->num_params);
        open_bucket(d, &d->all);
    } else {
        for (int i = 0; i < d->nbuckets; i++) open_bucket(d, &d->buckets[i]);
    }
}

static void finish_backward(void *ctx)
{
    struct loom_ddp *d = ctx;
    LOOM_ASSERT(d->sync);
    double t0 = loom_now();
    if (d->naive) {
        if (!d->pooled) d->all = bucket(d->model, 0, d->model->nblocks - 1, d->model->num_params);
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
    d->wait_s = loom_now() - t0;
}

static double comm_wait_s(void *ctx)
{
    return ((struct loom_ddp *)ctx)->wait_s;
}

static void describe(void *ctx, char *buf, size_t n)
{
    const struct loom_ddp *d = ctx;
    if (d->naive)
        snprintf(buf, n, "DDP (naive): one all-reduce of all gradients after the backward, in %s",
                 loom_dtype_name(d->reduce_dtype));
    else
        snprintf(buf, n, "DDP: %d bucket%s of >= %g MB%s%s, %s in %s", d->nbuckets,
                 d->nbuckets == 1 ? "" : "s", d->bucket_mb,
                 d->overlap ? ", overlapped with the backward" : ", after the backward",
                 d->early_wte ? ", the tied embedding in its own early bucket" : "",
                 d->shard ? "reduce-scattered over ZeRO-1's shards" : "all-reduced",
                 loom_dtype_name(d->reduce_dtype));
}

/* ZeRO-1's replay: every bucket's segment of the sum in flight at the end
 * of the backward that reduces. */
static void replay_shard(struct loom_ddp *d, enum loom_replay_point at, const struct loom_replay *r)
{
    struct loom_ddp_bucket *one[2] = {d->naive ? &d->all : NULL, d->early_wte ? &d->wte : NULL};
    if (at == LOOM_REPLAY_BEGIN_BACKWARD && r->last) {
        if (d->naive && !d->pooled) d->all = bucket(d->model, 0, d->model->nblocks - 1, d->model->num_params);
        for (int i = 0; i < 2; i++)
            if (one[i]) take_recv(d, one[i], d->reduce_dtype);
        for (int i = 0; i < d->nbuckets && !d->naive; i++) take_recv(d, &d->buckets[i], d->reduce_dtype);
    } else if (at == LOOM_REPLAY_FINISH) {
        for (int i = 0; i < 2; i++)
            if (one[i]) loom_pool_give(&one[i]->recv);
        for (int i = 0; i < d->nbuckets && !d->naive; i++) loom_pool_give(&d->buckets[i].recv);
    }
}

/* The footprint's replay: mixed precision's float32 bucket sums (pooled),
 * taken before the backward that reduces (they are the blocks' gradient
 * buffers there) and landed at the step's end; ZeRO-1's segments. */
static void replay(void *ctx, enum loom_replay_point at, int block, struct loom_replay *r)
{
    (void)block;
    struct loom_ddp *d = ctx;
    if (d->pooled && at == LOOM_REPLAY_BEGIN_BACKWARD && r->last) {
        r->grads_provided = 1;
        if (d->naive) {
            d->all = bucket(d->model, 0, d->model->nblocks - 1, d->model->num_params);
            d->all.f32 = loom_pool_take(d->all.stored.numel, LOOM_DTYPE_F32, 0, LOOM_MEM_COMM);
        } else {
            for (int i = 0; i < d->nbuckets; i++)
                d->buckets[i].f32 =
                    loom_pool_take(d->buckets[i].stored.numel, LOOM_DTYPE_F32, 0, LOOM_MEM_COMM);
        }
    }
    if (d->shard) replay_shard(d, at, r);
    if (d->pooled && at == LOOM_REPLAY_FINISH) {
        if (d->naive) loom_pool_give(&d->all.f32);
        for (int i = 0; i < d->nbuckets && !d->naive; i++) loom_pool_give(&d->buckets[i].f32);
    }
}

static const struct loom_strategy ddp_strategy = {.name = "ddp",
                                                  .begin_backward = begin_backward,
                                                  .grads_ready = grads_ready,
                                                  .finish_backward = finish_backward,
                                                  .comm_wait_s = comm_wait_s,
                                                  .describe = describe,
                                                  .replay = replay};

void loom_ddp_init(struct loom_ddp *d, struct loom_model *m, int dp, double bucket_mb, int overlap, int naive,
                   enum loom_dtype reduce_dtype, int early_table)
{
    LOOM_ASSERT(reduce_dtype == LOOM_DTYPE_F32 || reduce_dtype == m->dtype);
    *d = (struct loom_ddp){.model = m, .dp = dp, .overlap = overlap, .naive = naive, .bucket_mb = bucket_mb};
    d->reduce_dtype = reduce_dtype;
    d->pooled = m->dtype != LOOM_DTYPE_F32 && !m->grad_acc.data;
    d->buckets = loom_alloc(sizeof *d->buckets * (size_t)m->nblocks, LOOM_MEM_OTHER);
    d->bucket_of = loom_alloc(sizeof *d->bucket_of * (size_t)m->nblocks, LOOM_MEM_OTHER);
    const size_t cap = (size_t)(bucket_mb * 1e6 / sizeof(float));
    int last = m->nblocks - 1;
    size_t count = 0;
    for (int i = m->nblocks - 1; i >= 0; i--) {
        count += m->blocks[i].numel;
        d->bucket_of[i] = d->nbuckets;
        if (count >= cap || i == 0) {
            d->buckets[d->nbuckets++] = bucket(m, i, last, count);
            last = i - 1;
            count = 0;
        }
    }
    struct loom_tied_embedding te;
    /* (not under mixed precision: the deferred scatter would need float32 gradients) */
    d->early_wte = overlap && !naive && m->dtype == LOOM_DTYPE_F32 && early_table && m->ops->tied_embedding &&
                   m->ops->tied_embedding(m, &te) && te.block == d->buckets[d->nbuckets - 1].first_block &&
                   m->blocks[te.block].tensors[0].offset == 0;
    if (d->early_wte) {
        /* the tied table out of the last bucket, into its own */
        const struct loom_tensor *table = &m->blocks[te.block].tensors[0];
        struct loom_ddp_bucket *tail = &d->buckets[d->nbuckets - 1];
        d->wte = (struct loom_ddp_bucket){.f32 = loom_buf_slice(tail->f32, 0, table->numel),
                                          .first_block = te.block,
                                          .last_block = te.block,
                                          .base = tail->base};
        tail->f32 = loom_buf_slice(tail->f32, table->numel, tail->f32.numel - table->numel);
        tail->base += table->numel;
        /* the embedding backward reads them: the backend's memory */
        const struct loom_backend *b = m->backend;
        d->gathered_dres = b->alloc(loom_mul_size((size_t)dp * te.max_rows, (size_t)te.width * sizeof(float)),
                                    LOOM_MEM_COMM);
        d->gathered_tokens =
            b->alloc(loom_mul_size((size_t)dp * te.max_rows, sizeof(int32_t)), LOOM_MEM_COMM);
    }
    d->index = m->stack.n;
    loom_model_push_strategy(m, &ddp_strategy, d);
}

void loom_ddp_experts_apart(struct loom_ddp *d)
{
    LOOM_ASSERT(!d->shard);
    d->experts_apart = 1;
}

void loom_ddp_shard(struct loom_ddp *d, int dp_rank, size_t shard_numel)
{
    LOOM_ASSERT(!d->experts_apart && dp_rank >= 0 && dp_rank < d->dp && shard_numel > 0);
    d->shard = 1, d->dp_rank = dp_rank, d->shard_numel = shard_numel;
    d->counts = loom_alloc(sizeof(int) * (size_t)d->dp, LOOM_MEM_OTHER);
}

void loom_ddp_free(struct loom_ddp *d)
{
    loom_free(d->buckets);
    loom_free(d->bucket_of);
    loom_free(d->counts);
    if (d->model) {
        d->model->backend->free(d->gathered_dres);
        d->model->backend->free(d->gathered_tokens);
    }
    *d = (struct loom_ddp){0};
}
