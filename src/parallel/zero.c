/* ZeRO stages 1-3: shard arithmetic, the stage-2 gradient path, the stage-3
 * parameter gathers with prefetch, and the post-step all-gather (see zero.h). */
#include "parallel/zero.h"

#include <math.h>
#include <stdio.h>
#include <string.h>

#include "base/dtype.h"
#include "base/log.h"
#include "base/mem.h"
#include "comm/comm.h"
#include "kernels/backend.h"
#include "kernels/pool.h"

struct loom_zero_flight {
    struct loom_buf buf;            /* the block's full float32 gradient, transient */
    struct loom_buf recv;           /* this rank's float32 segment of the sum */
    struct loom_buf send16, recv16; /* --grad-reduce-dtype bf16/fp16: the same in 16 bits */
    size_t shard_off;               /* where the segment lands in grad_shard */
    size_t lo;                      /* the segment's first element in the arena */
    struct loom_comm_handle *handle;
};

struct loom_zero_unit {
    int first, last;                 /* blocks */
    size_t lo, hi;                   /* arena range */
    struct loom_buf buf;             /* gathered parameters in the model's dtype, (hi - lo), or absent */
    struct loom_buf seg;             /* with owned runs: this rank's part, put together, while gathering */
    struct loom_comm_handle *handle; /* gather in flight */
};

enum { MAX_LAYERS_IN_FLIGHT = 2 };

void loom_zero_ranks(const struct loom_topology *t, int *dp, int *dp_rank)
{
    const int ep = t->ep > 1 ? t->ep : 1;
    *dp = t->dp / ep;
    *dp_rank = t->dp_rank / ep;
}

size_t loom_zero_arena_multiple(int stage, int dp)
{
    return stage >= 1 ? (size_t)dp : 1;
}

struct loom_partition loom_zero_partition(int sharded, int dp, int dp_rank, const struct loom_model *m)
{
    if (!sharded) return (struct loom_partition){m->num_params, 0, m->num_params};
    LOOM_ASSERT(m->arena_numel % (size_t)dp == 0);
    struct loom_partition p;
    p.shard = m->arena_numel / (size_t)dp;
    p.begin = (size_t)dp_rank * p.shard;
    p.end = p.begin + p.shard < m->num_params ? p.begin + p.shard : m->num_params;
    if (p.end < p.begin) p.end = p.begin; /* a rank whose shard is all padding */
    return p;
}

/* The model's backend: every data buffer here is its memory, touched
 * through its calls only. */
static const struct loom_backend *be(const struct loom_zero *z)
{
    return z->model->backend;
}

/* Transient buffers come from the pool (base/pool.h), counted under comm. */
static struct loom_buf take(size_t n, enum loom_dtype dt, int zeroed)
{
    return loom_pool_take(n, dt, zeroed, LOOM_MEM_COMM);
}

/* counts[r], and displs[r] from lo: the part of [lo, hi) in rank r's shard.
 * Returns the start of this rank's part (lo when it has none). */
static size_t split(struct loom_zero *z, size_t lo, size_t hi)
{
    size_t mine = lo;
    for (int r = 0; r < z->dp; r++) {
        size_t a = (size_t)r * z->part.shard, b = a + z->part.shard;
        if (a < lo) a = lo;
        if (b > hi) b = hi;
        z->counts[r] = b > a ? (int)(b - a) : 0;
        z->displs[r] = b > a ? (int)(a - lo) : 0;
        if (r == z->dp_rank && b > a) mine = a;
    }
    return mine;
}

/* ---- expert parallelism: the dense elements' shares -------------------------- */

/* Calls fn(ctx, a, b, d) for each dense run [a, b) of arena elements
 * [lo, hi) (outside every block's experts), d the place of its first
 * element among them; returns how many there are. */
static size_t dense_runs(const struct loom_model *m, size_t lo, size_t hi,
                         void (*fn)(void *ctx, size_t a, size_t b, size_t d), void *ctx)
{
    size_t d = 0;
    for (int bi = 0; bi < m->nblocks; bi++) {
        const struct loom_block *b = &m->blocks[bi];
        const size_t cut[4] = {b->offset, b->offset + b->expert_lo, b->offset + b->expert_hi,
                               b->offset + b->numel};
        for (int r = 0; r < 2; r++) { /* [cut 0, cut 1) and [cut 2, cut 3) */
            const size_t a = cut[2 * r] > lo ? cut[2 * r] : lo, e = cut[2 * r + 1] < hi ? cut[2 * r + 1] : hi;
            if (a >= e) continue;
            if (fn) fn(ctx, a, e, d);
            d += e - a;
        }
    }
    return d;
}

/* Expert rank r's share of n dense elements: places [*s0, *s1). */
static void dense_share(size_t n, int ep, int r, size_t *s0, size_t *s1)
{
    const size_t per = (n + (size_t)ep - 1) / (size_t)ep;
    *s0 = (size_t)r * per < n ? (size_t)r * per : n;
    *s1 = *s0 + per < n ? *s0 + per : n;
}

static void add_run(struct loom_run *runs, int *n, size_t a, size_t b)
{
    if (a >= b) return;
    if (*n > 0 && runs[*n - 1].hi == a)
        runs[*n - 1].hi = b;
    else
        runs[(*n)++] = (struct loom_run){a, b};
}

int loom_zero_owned_runs(const struct loom_model *m, struct loom_partition p, int ep, int ep_rank,
                         struct loom_run *runs)
{
    int n = 0;
    if (ep <= 1) {
        add_run(runs, &n, p.begin, p.end);
        return n;
    }
    size_t s0, s1, d = 0;
    dense_share(dense_runs(m, p.begin, p.end, NULL, NULL), ep, ep_rank, &s0, &s1);
    for (int bi = 0; bi < m->nblocks; bi++) {
        const struct loom_block *b = &m->blocks[bi];
        const size_t cut[4] = {b->offset, b->offset + b->expert_lo, b->offset + b->expert_hi,
                               b->offset + b->numel};
        for (int r = 0; r < 3; r++) { /* dense, the experts, dense */
            const size_t a = cut[r] > p.begin ? cut[r] : p.begin, e = cut[r + 1] < p.end ? cut[r + 1] : p.end;
            if (a >= e) continue;
            if (r == 1) {
                add_run(runs, &n, a, e);
                continue;
            }
            const size_t x = d > s0 ? d : s0, y = d + (e - a) < s1 ? d + (e - a) : s1;
            if (x < y) add_run(runs, &n, a + (x - d), a + (y - d));
            d += e - a;
        }
    }
    return n;
}

/* dense_runs' fn that packs a range's dense elements (or unpacks them):
 * the places [w0, w1) among them between the arena's elements (from lo)
 * and packed + off, one after another. */
struct dense_moves {
    const struct loom_backend *be;
    char *arena, *packed;
    size_t lo, es;      /* es: bytes an element */
    size_t w0, w1, off; /* every place: 0, SIZE_MAX, 0 */
    int pack;           /* 1: into packed; 0: back into the arena */
};

static void move_dense(void *ctx, size_t a, size_t b, size_t d)
{
    const struct dense_moves *c = ctx;
    const size_t x = d > c->w0 ? d : c->w0, y = d + (b - a) < c->w1 ? d + (b - a) : c->w1;
    if (x >= y) return;
    char *p = c->arena + (a + (x - d) - c->lo) * c->es, *q = c->packed + (c->off + x - c->w0) * c->es;
    c->be->copy(c->pack ? q : p, c->pack ? p : q, (y - x) * c->es);
}

/* The dense shares' gather a piece at a time: each rank's share in pieces
 * of this many elements at most (the buffer holds ep of them). */
static size_t share_piece(const struct loom_zero *z)
{
    const size_t per = (z->dense_n + (size_t)z->ep - 1) / (size_t)z->ep,
                 most = ((size_t)1 << 22) / (size_t)z->ep;
    return per < most ? per : most;
}

/* After the step (stages 1-2): each expert rank updated its share of the
 * shard's dense elements (loom_zero_owned_runs); every rank of the expert
 * group takes the others' shares, all-gathered packed, piece k of every
 * share at a time. */
static void gather_dense_shares(struct loom_zero *z)
{
    const struct loom_model *m = z->model;
    if (z->dense_n == 0) return;
    const size_t P = (size_t)z->ep, per = (z->dense_n + P - 1) / P, C = share_piece(z);
    struct loom_buf all = take(C * P, m->dtype, 0);
    const struct loom_buf params = loom_zero_params(z);
    struct dense_moves c = {be(z), params.data, all.data, z->part.begin, loom_dtype_size(m->dtype), 0,
                            0,     0,           1};
    for (size_t k = 0; k < per; k += C) {
        size_t s0, s1;
        c.pack = 1; /* this rank's piece in place */
        dense_share(z->dense_n, z->ep, z->ep_rank, &s0, &s1);
        c.w0 = s0 + k, c.w1 = s0 + k + C < s1 ? s0 + k + C : s1, c.off = (size_t)z->ep_rank * C;
        dense_runs(m, z->part.begin, z->part.end, move_dense, &c);
        z->wait_s += loom_comm_wait(loom_comm_allgather(LOOM_GROUP_EP, loom_buf_of(NULL, 0, m->dtype), all));
        c.pack = 0; /* every rank's piece back */
        for (int r = 0; r < z->ep; r++) {
            dense_share(z->dense_n, z->ep, r, &s0, &s1);
            c.w0 = s0 + k, c.w1 = s0 + k + C < s1 ? s0 + k + C : s1, c.off = (size_t)r * C;
            dense_runs(m, z->part.begin, z->part.end, move_dense, &c);
        }
    }
    loom_pool_give(&all);
}

/* A segment [lo, hi) of the shard: its nd dense elements and how many of
 * them each expert rank owns (z->ep_counts; *mine: where this rank's start
 * among them). */
static size_t dense_split(struct loom_zero *z, size_t lo, size_t hi, size_t *mine)
{
    const size_t nd = dense_runs(z->model, lo, hi, NULL, NULL);
    const size_t d0 = nd ? dense_runs(z->model, z->part.begin, lo, NULL, NULL) : 0;
    *mine = 0;
    for (int r = 0; r < z->ep; r++) {
        size_t s0, s1;
        dense_share(z->dense_n, z->ep, r, &s0, &s1);
        const size_t a = s0 > d0 ? s0 : d0, e = s1 < d0 + nd ? s1 : d0 + nd;
        z->ep_counts[r] = e > a ? (int)(e - a) : 0;
        if (r == z->ep_rank && e > a) *mine = a - d0;
    }
    return nd;
}

/* Calls fn(ctx, x, y, s) for each part [x, y) of arena elements [a, e) in
 * the owned runs, s its place among their elements. */
static void owned_parts(const struct loom_zero *z, size_t a, size_t e,
                        void (*fn)(void *ctx, size_t x, size_t y, size_t s), void *ctx)
{
    size_t s = 0;
    for (int r = 0; r < z->nruns; s += z->runs[r].hi - z->runs[r].lo, r++) {
        const size_t x = z->runs[r].lo > a ? z->runs[r].lo : a, y = z->runs[r].hi < e ? z->runs[r].hi : e;
        if (x < y) fn(ctx, x, y, s + (x - z->runs[r].lo));
    }
}

/* Expert parallelism: a landed segment's dense elements summed over the
 * expert group, whose ranks hold the same elements there, onto the rank
 * that owns each (a reduce-scatter of them packed): the owner's sums back
 * in the segment (the rest stay this rank's own, and land nowhere). */
static void dense_to_owners(struct loom_zero *z, const struct loom_zero_flight *f)
{
    size_t mine;
    const size_t nd = dense_split(z, f->lo, f->lo + f->recv.numel, &mine);
    if (nd == 0) return;
    struct loom_buf packed = take(nd, LOOM_DTYPE_F32, 0),
                    own = take((size_t)z->ep_counts[z->ep_rank], LOOM_DTYPE_F32, 0);
    struct dense_moves c = {be(z), f->recv.data, packed.data, f->lo, sizeof(float), 0, SIZE_MAX, 0, 1};
    dense_runs(z->model, f->lo, f->lo + f->recv.numel, move_dense, &c);
    z->wait_s += loom_comm_wait(loom_comm_reduce_scatter_v(LOOM_GROUP_EP, packed, own, z->ep_counts));
    be(z)->copy((float *)packed.data + mine, own.data, loom_buf_bytes(own));
    c.pack = 0;
    dense_runs(z->model, f->lo, f->lo + f->recv.numel, move_dense, &c);
    loom_pool_give(&own);
    loom_pool_give(&packed);
}

struct landing {
    struct loom_zero *z;
    const struct loom_zero_flight *f;
};

/* An owned part [x, y) of a landed segment added into the gradient shard,
 * which holds the owned runs one after another (s: the part's place). */
static void land_part(void *ctx, size_t x, size_t y, size_t s)
{
    const struct landing *c = ctx;
    struct loom_zero *z = c->z;
    const int f32 = z->model->dtype == LOOM_DTYPE_F32;
    const struct loom_buf acc = f32 ? z->grad_shard : z->grad_acc;
    const float *src = (const float *)c->f->recv.data + (x - c->f->lo);
    if (acc.data) {
        float *dst = (float *)acc.data + s;
        be(z)->k->accumulate(dst, src, y - x);
        loom_offload_drop(f32 ? &z->grad_map : &z->acc_map, dst, (y - x) * sizeof(float));
    } else {
        const struct loom_buf seg = loom_buf_slice(z->grad_shard, s, y - x);
        be(z)->k->lp_accumulate(seg.data, src, seg.numel, seg.dtype);
        loom_offload_drop(&z->grad_map, seg.data, loom_buf_bytes(seg));
    }
}

struct shard_fill {
    struct loom_zero *z;
    struct loom_buf src; /* elements from lo */
    size_t lo;
};

/* An owned part [x, y) of src into the parameter shard (s: its place). */
static void fill_part(void *ctx, size_t x, size_t y, size_t s)
{
    const struct shard_fill *c = ctx;
    const struct loom_buf dst = loom_buf_slice(c->z->param_shard, s, y - x);
    be(c->z)->convert(dst, loom_buf_slice(c->src, x - c->lo, y - x));
    loom_offload_drop(&c->z->param_map, dst.data, loom_buf_bytes(dst));
}

/* ---- stage 2: gradients ------------------------------------------------- */

/* The same before the reduction, over the whole block's dense runs in buf
 * (--layout-invariant: the expert group's ranks are consecutive data
 * ranks, so their sum first and the shards' next add the data ranks in the
 * pairwise tree over them, as the data-parallel group's tree sums do). */
static void dense_over_experts_first(struct loom_zero *z, int block, struct loom_buf buf)
{
    const struct loom_block *b = &z->model->blocks[block];
    const size_t runs[2][2] = {{0, b->expert_lo}, {b->expert_hi, b->numel}};
    for (int r = 0; r < 2; r++)
        if (runs[r][1] > runs[r][0])
            loom_comm_allreduce_sync(LOOM_GROUP_EP, loom_buf_slice(buf, runs[r][0], runs[r][1] - runs[r][0]),
                                     LOOM_OP_SUM);
}

/* Waits for the oldest posted block, adds its segment into the shard, frees it. */
static void land_oldest(struct loom_zero *z)
{
    LOOM_ASSERT(z->norder > 0);
    int block = z->order[0];
    struct loom_zero_flight *f = &z->flights[block];
    z->wait_s += loom_comm_wait(f->handle);
    if (f->send16.data) {
        be(z)->convert(f->recv, loom_buf_slice(f->recv16, 0, f->recv.numel));
        loom_pool_give(&f->send16);
        loom_pool_give(&f->recv16);
    }
    if (z->experts_apart && !z->dense_first) dense_to_owners(z, f);
    const struct loom_buf acc = z->model->dtype == LOOM_DTYPE_F32 ? z->grad_shard : z->grad_acc;
    if (z->runs) {
        struct landing c = {z, f};
        owned_parts(z, f->lo, f->lo + f->recv.numel, land_part, &c);
    } else if (acc.data) {
        float *dst = (float *)acc.data + f->shard_off;
        be(z)->k->accumulate(dst, f->recv.data, f->recv.numel);
        loom_offload_drop(z->model->dtype == LOOM_DTYPE_F32 ? &z->grad_map : &z->acc_map, dst,
                          f->recv.numel * sizeof(float));
    } else {
        const struct loom_buf seg = loom_buf_slice(z->grad_shard, f->shard_off, f->recv.numel);
        be(z)->k->lp_accumulate(seg.data, f->recv.data, seg.numel, seg.dtype);
        loom_offload_drop(&z->grad_map, seg.data, loom_buf_bytes(seg));
    }
    loom_pool_give(&f->buf);
    loom_pool_give(&f->recv);
    memset(f, 0, sizeof *f);
    loom_block_provide_grads(z->model, block, NULL, LOOM_GRADS_NONE);
    memmove(z->order, z->order + 1, sizeof(int) * (size_t)--z->norder);
}

static void grad_buffer(struct loom_zero *z, int block)
{
    struct loom_model *m = z->model;
    struct loom_zero_flight *f = &z->flights[block];
    /* bound the memory in flight (the blocks posted before this one), and
     * land this block's reduction from an earlier micro-batch */
    while (z->norder >= MAX_LAYERS_IN_FLIGHT || (f->buf.data && z->norder > 0)) land_oldest(z);
    LOOM_ASSERT(f->buf.data == NULL);
    f->buf = take(m->blocks[block].numel, LOOM_DTYPE_F32, 1);
    loom_block_provide_grads(m, block, f->buf.data, z->index);
}

static void post_grads(struct loom_zero *z, int block)
{
    struct loom_zero_flight *f = &z->flights[block];
    const struct loom_block *b = &z->model->blocks[block];
    const size_t lo = b->offset, hi = lo + b->numel;
    size_t mine = split(z, lo, hi);
    const size_t nrecv = (size_t)z->counts[z->dp_rank];
    f->shard_off = nrecv ? mine - z->part.begin : 0;
    f->lo = mine;
    f->recv = take(nrecv, LOOM_DTYPE_F32, 0);
    if (z->experts_apart && z->dense_first) dense_over_experts_first(z, block, f->buf);
    if (z->reduce_dtype != LOOM_DTYPE_F32) { /* this rank's gradient rounded once, summed in 16 bits */
        f->send16 = take(hi - lo, z->reduce_dtype, 0);
        f->recv16 = take(nrecv, z->reduce_dtype, 0);
        be(z)->convert(f->send16, f->buf);
        f->handle = loom_comm_reduce_scatter_v(z->group, f->send16, f->recv16, z->counts);
    } else {
        f->handle = loom_comm_reduce_scatter_v(z->group, f->buf, f->recv, z->counts);
    }
    z->order[z->norder++] = block;
}

/* ---- stage 3: parameters -------------------------------------------------- */

static void point_blocks(struct loom_zero *z, const struct loom_zero_unit *x)
{
    for (int b = x->first; b <= x->last; b++) {
        const struct loom_block *blk = &z->model->blocks[b];
        loom_block_hold_params(
            z->model, b, x->buf.data ? loom_buf_slice(x->buf, blk->offset - x->lo, blk->numel).data : NULL);
    }
}

struct shard_part {
    struct loom_zero *z;
    char *seg; /* elements from lo */
    size_t lo, es;
};

/* An owned run's part of the parameter shard into the part put together
 * (offloaded: read in, then let go). */
static void copy_owned(void *ctx, size_t x, size_t y, size_t s)
{
    const struct shard_part *c = ctx;
    struct loom_zero *z = c->z;
    const char *src = (const char *)z->param_shard.data + s * c->es;
    loom_offload_prefetch(&z->param_map, src, (y - x) * c->es);
    be(z)->copy(c->seg + (x - c->lo) * c->es, src, (y - x) * c->es);
    loom_offload_drop(&z->param_map, src, (y - x) * c->es);
}

/* Stage 3 with owned runs: this rank's part [lo, lo + n) of a unit's shard
 * put together in a transient buffer: its experts' elements and its dense
 * share from the parameter shard, the other expert ranks' dense shares
 * all-gathered over LOOM_GROUP_EP (packed), as every rank of the expert
 * group holds the same part. */
static struct loom_buf assemble_part(struct loom_zero *z, size_t lo, size_t n)
{
    const enum loom_dtype dt = z->model->dtype;
    const size_t es = loom_dtype_size(dt);
    struct loom_buf seg = take(n, dt, 0);
    struct shard_part c = {z, seg.data, lo, es};
    owned_parts(z, lo, lo + n, copy_owned, &c);
    size_t at;
    const size_t nd = dense_split(z, lo, lo + n, &at);
    if (nd == 0) return seg;
    struct loom_buf packed = take(nd, dt, 0), own = take((size_t)z->ep_counts[z->ep_rank], dt, 0);
    struct dense_moves d = {be(z), seg.data, packed.data, lo, es, 0, SIZE_MAX, 0, 1};
    dense_runs(z->model, lo, lo + n, move_dense, &d);
    be(z)->copy(own.data, (char *)packed.data + at * es, loom_buf_bytes(own));
    for (int r = 0, o = 0; r < z->ep; o += z->ep_counts[r++])
        z->ep_counts[z->ep + r] = o; /* the displacements */
    z->wait_s +=
        loom_comm_wait(loom_comm_allgather_v(LOOM_GROUP_EP, own, packed, z->ep_counts, z->ep_counts + z->ep));
    d.pack = 0;
    dense_runs(z->model, lo, lo + n, move_dense, &d);
    loom_pool_give(&own);
    loom_pool_give(&packed);
    return seg;
}

/* This rank's part of unit u in its parameter shard. */
static struct loom_buf own_part(struct loom_zero *z, int u)
{
    const struct loom_zero_unit *x = &z->units[u];
    size_t mine = split(z, x->lo, x->hi), at = z->counts[z->dp_rank] ? mine - z->part.begin : 0;
    return loom_buf_slice(z->param_shard, at, (size_t)z->counts[z->dp_rank]);
}

static void post_gather(struct loom_zero *z, int u)
{
    struct loom_zero_unit *x = &z->units[u];
    if (x->buf.data) return; /* gathered or on its way */
    x->buf = take(x->hi - x->lo, z->model->dtype, 0);
    if (z->runs) { /* the part put together first (split's counts stay for the gather) */
        const size_t mine = split(z, x->lo, x->hi), n = (size_t)z->counts[z->dp_rank];
        x->seg = assemble_part(z, n ? mine : x->lo, n);
        x->handle = loom_comm_allgather_v(z->group, x->seg, x->buf, z->counts, z->displs);
        return;
    }
    const struct loom_buf own = own_part(z, u);
    loom_offload_prefetch(&z->param_map, own.data, loom_buf_bytes(own)); /* offloaded: read ahead */
    x->handle = loom_comm_allgather_v(z->group, own, x->buf, z->counts, z->displs);
}

/* A gather done: the offloaded shard's part of it is not needed in memory. */
static void gathered(struct loom_zero *z, int u)
{
    loom_pool_give(&z->units[u].seg); /* with owned runs: its pages were let go as it was put together */
    if (!z->param_map.data || z->runs) return;
    const struct loom_buf own = own_part(z, u);
    loom_offload_drop(&z->param_map, own.data, loom_buf_bytes(own));
}

static void ensure_gathered(struct loom_zero *z, int u)
{
    struct loom_zero_unit *x = &z->units[u];
    post_gather(z, u);
    if (x->handle) {
        z->wait_s += loom_comm_wait(x->handle);
        x->handle = NULL;
        gathered(z, u);
        point_blocks(z, x);
    }
}

static void release(struct loom_zero *z, int u)
{
    struct loom_zero_unit *x = &z->units[u];
    if (!x->buf.data) return;
    if (x->handle) {
        loom_comm_wait(x->handle);
        x->handle = NULL;
        gathered(z, u);
    }
    loom_pool_give(&x->buf);
    loom_pool_give(&x->seg); /* the footprint's replay holds it until here */
    point_blocks(z, x);
}

static void prefetch(struct loom_zero *z, int u)
{
    if (u >= 0 && u < z->nunits && u != z->pinned) post_gather(z, u);
}

/* ---- the strategy's members ------------------------------------------------ */

static void begin_step(void *ctx)
{
    struct loom_zero *z = ctx;
    z->wait_s = 0;
    if (z->grad_map.data)
        loom_offload_zero(&z->grad_map);
    else if (z->grad_shard.data)
        be(z)->memset(z->grad_shard.data, 0, loom_buf_bytes(z->grad_shard));
    if (z->acc_map.data)
        loom_offload_zero(&z->acc_map);
    else if (z->grad_acc.data)
        be(z)->memset(z->grad_acc.data, 0, loom_buf_bytes(z->grad_acc));
}

static void pre_forward(void *ctx, int block)
{
    struct loom_zero *z = ctx;
    if (z->stage < 3) return;
    int u = z->unit_of[block];
    ensure_gathered(z, u);
    if (block == z->units[u].first) prefetch(z, u + 1);
}

static void post_forward(void *ctx, int block)
{
    struct loom_zero *z = ctx;
    if (z->stage < 3) return;
    int u = z->unit_of[block];
    if (block == z->units[u].last && u != z->pinned) release(z, u);
}

static void pre_backward(void *ctx, int block)
{
    struct loom_zero *z = ctx;
    if (z->stage == 3) {
        int u = z->unit_of[block];
        ensure_gathered(z, u);
        if (block == z->units[u].last) prefetch(z, u - 1);
    }
    grad_buffer(z, block);
}

static void grads_ready(void *ctx, int block)
{
    struct loom_zero *z = ctx;
    if (block < 0) return; /* the tied-embedding event: its block is posted when it is done */
    post_grads(z, block);
    if (z->stage == 3) {
        int u = z->unit_of[block];
        if (block == z->units[u].first && u != z->pinned) release(z, u);
    }
}

static void finish_backward(void *ctx)
{
    struct loom_zero *z = ctx;
    while (z->norder > 0) land_oldest(z);
    if (z->grad_acc.data) {
        be(z)->convert(z->grad_shard, z->grad_acc); /* accumulated in float32: rounded once */
        loom_offload_drop(&z->acc_map, z->grad_acc.data, loom_buf_bytes(z->grad_acc));
        loom_offload_drop(&z->grad_map, z->grad_shard.data, loom_buf_bytes(z->grad_shard));
    }
}

/* After the optimizer step: stages 1-2 all-gather the new parameters; stage
 * 3 lets go of the pinned unit (it is gathered afresh next time). */
static void after_step(void *ctx)
{
    struct loom_zero *z = ctx;
    if (z->ep > 1 && z->stage < 3) gather_dense_shares(z); /* stage 3: put together at each gather */
    if (z->stage == 3) {
        if (z->pinned >= 0) release(z, z->pinned);
        return;
    }
    if (z->dp == 1) return;
    struct loom_model *m = z->model;
    loom_comm_wait(loom_comm_allgather(z->group, loom_buf_of(NULL, 0, m->dtype),
                                       loom_buf_slice(m->params, 0, z->part.shard * (size_t)z->dp)));
}

static double comm_wait_s(void *ctx)
{
    const struct loom_zero *z = ctx;
    return z->stage >= 2 ? z->wait_s : -1;
}

static void describe(void *ctx, char *buf, size_t n)
{
    const struct loom_zero *z = ctx;
    char ep[160] = "";
    if (z->ep > 1)
        snprintf(ep, sizeof ep,
                 "; the dense elements' shares split again over the %d expert ranks (%d data ranks in all)",
                 z->ep, z->dp * z->ep);
    if (z->stage == 3)
        snprintf(buf, n,
                 "ZeRO-3: parameters, gradients and optimizer state sharded over %d ranks; %d gather units%s",
                 z->dp, z->nunits, ep);
    else
        snprintf(buf, n, "ZeRO-%d: %s sharded over %d ranks%s%s", z->stage,
                 z->stage == 2 ? "gradients and optimizer state" : "optimizer state", z->dp,
                 z->scattered
                     ? "; the gradients reduce-scattered onto the shards, the parameters all-gathered"
                     : "",
                 ep);
}

static void replay(void *ctx, enum loom_replay_point at, int b, struct loom_replay *r);

/* Stages 2-3: the gradient shard (and at stage 3 the parameter shard) in
 * place of the arenas; its norm in pieces of a fixed size, in memory or
 * offloaded alike (the same sums in the same order). */
static int view(void *ctx, struct loom_state_view *v)
{
    struct loom_zero *z = ctx;
    const struct loom_model *m = z->model;
    const size_t n = z->part.end - z->part.begin;
    enum { PIECE = 1 << 22 };
    *v = (struct loom_state_view){.params = m->params,
                                  .params_hi = m->num_params,
                                  .grads = loom_buf_slice(z->grad_shard, 0, z->runs ? z->owned : n),
                                  .grads_lo = z->part.begin,
                                  .grads_hi = z->part.end,
                                  .grads_split = 1,
                                  .piece = PIECE,
                                  .param_map = z->param_map.data ? &z->param_map : NULL,
                                  .grad_map = z->grad_map.data ? &z->grad_map : NULL};
    if (z->stage == 3) {
        v->params = loom_buf_slice(z->param_shard, 0, z->runs ? z->owned : n);
        v->params_lo = z->part.begin;
        v->params_hi = z->part.end;
        v->params_runs = z->runs;
        v->params_nruns = z->nruns;
    }
    if (z->runs) { /* expert parallelism: the owned runs' gradients only */
        v->grads_runs = z->runs;
        v->grads_nruns = z->nruns;
    }
    return 1;
}

static void init_weights(void *ctx, uint64_t seed)
{
    loom_zero_init_weights(ctx, seed);
}

/* Stage 1 with its gradients reduce-scattered: the arena's gradients,
 * valid over this rank's shard (the norm sums the shards'). */
static int view1(void *ctx, struct loom_state_view *v)
{
    struct loom_zero *z = ctx;
    if (!z->scattered) return 0;
    const struct loom_model *m = z->model;
    enum { PIECE = 1 << 22 };
    *v = (struct loom_state_view){.params = m->params,
                                  .params_hi = m->num_params,
                                  .grads =
                                      loom_buf_slice(m->grads, z->part.begin, z->part.end - z->part.begin),
                                  .grads_lo = z->part.begin,
                                  .grads_hi = z->part.end,
                                  .grads_split = 1,
                                  .piece = PIECE};
    return 1;
}

int loom_zero1_scatters(int stage, const struct loom_topology *t)
{
    return stage == 1 && t->dp > 1 && t->ep <= 1;
}

static void replay1(void *ctx, enum loom_replay_point at, int b, struct loom_replay *r);
static const struct loom_strategy zero1_strategy = {
    .name = "zero-1", .after_step = after_step, .describe = describe, .view = view1, .replay = replay1};
static const struct loom_strategy zero2_strategy = {.name = "zero-2",
                                                    .begin_step = begin_step,
                                                    .pre_backward = pre_backward,
                                                    .grads_ready = grads_ready,
                                                    .finish_backward = finish_backward,
                                                    .after_step = after_step,
                                                    .comm_wait_s = comm_wait_s,
                                                    .describe = describe,
                                                    .replay = replay,
                                                    .view = view};
static const struct loom_strategy zero3_strategy = {.name = "zero-3",
                                                    .begin_step = begin_step,
                                                    .pre_forward = pre_forward,
                                                    .post_forward = post_forward,
                                                    .pre_backward = pre_backward,
                                                    .grads_ready = grads_ready,
                                                    .finish_backward = finish_backward,
                                                    .after_step = after_step,
                                                    .comm_wait_s = comm_wait_s,
                                                    .describe = describe,
                                                    .replay = replay,
                                                    .view = view,
                                                    .init_weights = init_weights};

/* ---- set-up ---------------------------------------------------------------- */

static void make_units(struct loom_zero *z, int64_t min_params)
{
    struct loom_model *m = z->model;
    z->units = loom_alloc(sizeof *z->units * (size_t)m->nblocks, LOOM_MEM_OTHER);
    z->unit_of = loom_alloc(sizeof(int) * (size_t)m->nblocks, LOOM_MEM_OTHER);
    z->nunits = 0;
    int64_t held = 0;
    for (int b = 0; b < m->nblocks; b++) {
        const size_t lo = m->blocks[b].offset;
        if (held == 0)
            z->units[z->nunits++] = (struct loom_zero_unit){.first = b, .last = b, .lo = lo, .hi = lo};
        struct loom_zero_unit *x = &z->units[z->nunits - 1];
        x->last = b;
        x->hi = lo + m->blocks[b].numel;
        z->unit_of[b] = z->nunits - 1;
        held += (int64_t)m->blocks[b].numel;
        if (held >= min_params) held = 0;
    }
    /* the unit holding a tied embedding stays gathered for the step (the
     * LM head reads it at both ends); without one, no unit is pinned */
    struct loom_tied_embedding te;
    z->pinned = m->ops->tied_embedding && m->ops->tied_embedding(m, &te) ? z->unit_of[te.block] : -1;
}

/* A shard of n elements: the backend's memory, or (offload_dir, outside
 * the counting mode) a mapping of a new file there. */
static int shard_alloc(const struct loom_zero *z, struct loom_buf *b, struct loom_offload_map *mp, size_t n,
                       enum loom_dtype dt, enum loom_mem_tag tag, const char *dir, const char *what)
{
    if (!dir) {
        *b = loom_backend_buf(be(z), n, dt, tag);
        return LOOM_OK;
    }
    if (loom_mem_counting()) { /* a footprint: it will be a file, not memory (an address, no bytes) */
        *b = loom_buf_of(loom_alloc_data(1, tag), n, dt);
        return LOOM_OK;
    }
    int rc = loom_offload_map(mp, dir, loom_mul_size(n, loom_dtype_size(dt)), what);
    if (rc == LOOM_OK) *b = loom_buf_of(mp->data, n, dt);
    return rc;
}

int loom_zero_init(struct loom_zero *z, int stage, int dp, int dp_rank, struct loom_model *m,
                   int64_t min_params, enum loom_dtype reduce_dtype, int accumulate_f32,
                   const char *offload_dir, int ep, int ep_rank)
{
    LOOM_ASSERT(stage >= 1 && stage <= 3 && dp >= 1 && dp_rank >= 0 && dp_rank < dp);
    LOOM_ASSERT(reduce_dtype == LOOM_DTYPE_F32 || (reduce_dtype == m->dtype && stage >= 2));
    LOOM_ASSERT(!offload_dir || stage == 3);
    memset(z, 0, sizeof *z);
    z->stage = stage;
    z->group = LOOM_GROUP_DP;
    z->dp = dp;
    z->dp_rank = dp_rank;
    z->model = m;
    z->reduce_dtype = reduce_dtype;
    z->part = loom_zero_partition(stage, dp, dp_rank, m);
    z->index = m->stack.n;
    z->param_map.fd = z->grad_map.fd = z->acc_map.fd = -1;
    const size_t shard = z->part.shard;
    if (ep > 1) { /* the dense elements' shares (loom_zero_owned_runs) */
        z->ep = ep;
        z->ep_rank = ep_rank;
        z->dense_n = dense_runs(m, z->part.begin, z->part.end, NULL, NULL);
        z->ep_counts = loom_alloc(sizeof(int) * 2 * (size_t)ep, LOOM_MEM_OTHER); /* counts, displacements */
        if (stage >= 2) { /* the gradient shard holds the owned runs only */
            z->runs = loom_alloc(sizeof *z->runs * (3 * (size_t)m->nblocks + 1), LOOM_MEM_OTHER);
            z->nruns = loom_zero_owned_runs(m, z->part, ep, ep_rank, z->runs);
            for (int r = 0; r < z->nruns; r++) z->owned += z->runs[r].hi - z->runs[r].lo;
        }
    }
    const size_t grad_n = z->runs ? z->owned : shard;
    if (shard > 0x7fffffff && (stage >= 2 || dp > 1)) /* a collective's count is an int (stage 1: DDP's) */
        return loom_error_set(LOOM_ERR_INPUT,
                              "--zero-stage %d: a rank's shard of %zu elements exceeds 2^31 - 1; use more "
                              "data-parallel ranks or pipeline stages",
                              stage, shard);
    if (stage == 1) {
        z->scattered = dp > 1; /* DDP reduce-scatters (loom_zero1_scatters), unless experts_apart says */
        loom_model_push_strategy(m, &zero1_strategy, z);
        return LOOM_OK;
    }
    LOOM_ASSERT(m->grads.data == NULL);
    int rc = shard_alloc(z, &z->grad_shard, &z->grad_map, grad_n, m->dtype, LOOM_MEM_GRADS, offload_dir,
                         "gradient shard");
    if (rc == LOOM_OK && accumulate_f32) {
        LOOM_ASSERT(m->dtype != LOOM_DTYPE_F32);
        rc = shard_alloc(z, &z->grad_acc, &z->acc_map, grad_n, LOOM_DTYPE_F32, LOOM_MEM_GRADS, offload_dir,
                         "float32 gradient accumulator");
    }
    /* keep this rank's shard of the parameters, let go of the arena (a model
     * without one is initialised shard by shard: loom_zero_init_weights) */
    if (rc == LOOM_OK && stage == 3)
        rc = shard_alloc(z, &z->param_shard, &z->param_map, grad_n, m->dtype, LOOM_MEM_PARAMS, offload_dir,
                         "parameter shard");
    if (rc) return rc;
    z->flights = loom_alloc(sizeof *z->flights * (size_t)m->nblocks, LOOM_MEM_OTHER);
    z->order = loom_alloc(sizeof(int) * (size_t)m->nblocks, LOOM_MEM_OTHER);
    z->counts = loom_alloc(sizeof(int) * (size_t)dp, LOOM_MEM_OTHER);
    z->displs = loom_alloc(sizeof(int) * (size_t)dp, LOOM_MEM_OTHER);
    if (stage == 2) {
        loom_model_push_strategy(m, &zero2_strategy, z);
        return LOOM_OK;
    }
    if (m->params.data && z->runs) {
        struct shard_fill c = {z, m->params, 0};
        owned_parts(z, z->part.begin, z->part.end, fill_part, &c);
        loom_backend_buf_free(m->backend, &m->params);
    } else if (m->params.data) {
        const struct loom_buf own = loom_buf_slice(z->param_shard, 0, z->part.end - z->part.begin);
        be(z)->convert(own, loom_buf_slice(m->params, z->part.begin, z->part.end - z->part.begin));
        loom_offload_drop(&z->param_map, own.data, loom_buf_bytes(own));
        loom_backend_buf_free(m->backend, &m->params);
    }
    for (int b = 0; b < m->nblocks; b++) loom_block_hold_params(m, b, NULL);
    make_units(z, min_params);
    loom_model_push_strategy(m, &zero3_strategy, z);
    return LOOM_OK;
}

void loom_zero_init_weights(struct loom_zero *z, uint64_t seed)
{
    LOOM_ASSERT(z->stage == 3);
    struct loom_model *m = z->model;
    const size_t begin = z->part.begin, end = z->part.end;
    for (int u = 0; u < z->nunits; u++) {
        struct loom_zero_unit *x = &z->units[u];
        struct loom_buf buf = take(x->hi - x->lo, LOOM_DTYPE_F32, 0);
        for (int b = x->first; b <= x->last; b++) /* drawn on the host, uploaded into buf */
            loom_model_init_block(m, b, seed, (float *)buf.data + (m->blocks[b].offset - x->lo));
        size_t a = x->lo > begin ? x->lo : begin, e = x->hi < end ? x->hi : end;
        if (z->runs) { /* the owned runs' parts */
            struct shard_fill c = {z, buf, x->lo};
            owned_parts(z, x->lo, x->hi, fill_part, &c);
        } else if (a < e) {
            const struct loom_buf dst = loom_buf_slice(z->param_shard, a - begin, e - a);
            be(z)->convert(dst, loom_buf_slice(buf, a - x->lo, e - a));
            loom_offload_drop(&z->param_map, dst.data, loom_buf_bytes(dst));
        }
        loom_pool_give(&buf);
    }
}

/* ---- the footprint's replay ---------------------------------------------------- */

static void replay_land_oldest(struct loom_zero *z)
{
    struct loom_zero_flight *f = &z->flights[z->order[0]];
    loom_pool_give(&f->send16);
    loom_pool_give(&f->recv16);
    size_t mine, nd;
    if (z->experts_apart && !z->dense_first && (nd = dense_split(z, f->lo, f->lo + f->recv.numel, &mine))) {
        struct loom_buf packed = take(nd, LOOM_DTYPE_F32, 0),
                        own = take((size_t)z->ep_counts[z->ep_rank], LOOM_DTYPE_F32, 0);
        loom_pool_give(&own);
        loom_pool_give(&packed);
    }
    loom_pool_give(&f->buf);
    loom_pool_give(&f->recv);
    memset(f, 0, sizeof *f);
    memmove(z->order, z->order + 1, sizeof(int) * (size_t)--z->norder);
}

/* A unit gathered (ensure: waited for) or posted: its buffer, and with
 * owned runs the part put together (held until the wait) and the dense
 * shares' gather in passing. */
static struct loom_buf *replay_gather(struct loom_zero *z, int u, int ensure)
{
    struct loom_zero_unit *x = &z->units[u];
    if (!x->buf.data) {
        x->buf = take(x->hi - x->lo, z->model->dtype, 0);
        if (z->runs) {
            const size_t mine = split(z, x->lo, x->hi), n = (size_t)z->counts[z->dp_rank];
            size_t at;
            const size_t nd = dense_split(z, n ? mine : x->lo, (n ? mine : x->lo) + n, &at);
            x->seg = take(n, z->model->dtype, 0);
            struct loom_buf packed = take(nd, z->model->dtype, 0),
                            own = take((size_t)z->ep_counts[z->ep_rank], z->model->dtype, 0);
            loom_pool_give(&own);
            loom_pool_give(&packed);
        }
    }
    if (ensure) loom_pool_give(&x->seg);
    return &x->buf;
}

/* after_step's transient: with expert parallelism at stages 1-2, the
 * dense shares' gather. */
static void replay_after_step(struct loom_zero *z)
{
    if (z->ep <= 1 || !z->dense_n || z->stage == 3) return;
    struct loom_buf all = take(share_piece(z) * (size_t)z->ep, z->model->dtype, 0);
    loom_pool_give(&all);
}

/* Stage 1's: the step's end (with expert parallelism, after_step's gather). */
static void replay1(void *ctx, enum loom_replay_point at, int b, struct loom_replay *r)
{
    (void)b, (void)r;
    if (at == LOOM_REPLAY_FINISH) replay_after_step(ctx);
}

/* Stages 2-3: the step's end lands what is in flight, and lets go of the
 * pinned unit. */
static void replay_finish(struct loom_zero *z)
{
    while (z->norder > 0) replay_land_oldest(z); /* finish_backward */
    replay_after_step(z);
    if (z->stage == 3 && z->pinned >= 0) loom_pool_give(&z->units[z->pinned].buf); /* after_step */
}

static void replay(void *ctx, enum loom_replay_point at, int b, struct loom_replay *r)
{
    struct loom_zero *z = ctx;
    const struct loom_model *m = z->model;
    if (at == LOOM_REPLAY_BEGIN_BACKWARD) r->grads_provided = 1; /* every block's, in every backward */
    if (at == LOOM_REPLAY_FINISH) replay_finish(z);
    if (b < 0) return;
    const int u = z->stage == 3 ? z->unit_of[b] : -1;
    const struct loom_zero_unit *x = u >= 0 ? &z->units[u] : NULL;
    switch (at) {
    case LOOM_REPLAY_PRE_FORWARD: /* pre_forward: gathered, the next prefetched */
        if (!x) return;
        replay_gather(z, u, 1);
        if (b == x->first && u + 1 < z->nunits && u + 1 != z->pinned) replay_gather(z, u + 1, 0);
        return;
    case LOOM_REPLAY_POST_FORWARD: /* post_forward: released after its last block */
        if (x && b == x->last && u != z->pinned) loom_pool_give(&z->units[u].buf);
        return;
    case LOOM_REPLAY_PRE_BACKWARD: { /* pre_backward: gathered, the previous prefetched; grad_buffer */
        if (x) {
            replay_gather(z, u, 1);
            if (b == x->last && u > 0 && u - 1 != z->pinned) replay_gather(z, u - 1, 0);
        }
        struct loom_zero_flight *f = &z->flights[b];
        while (z->norder >= MAX_LAYERS_IN_FLIGHT || (f->buf.data && z->norder > 0)) replay_land_oldest(z);
        f->buf = take(m->blocks[b].numel, LOOM_DTYPE_F32, 1);
        return;
    }
    case LOOM_REPLAY_GRADS_READY: { /* grads_ready: post_grads; released after its first block */
        struct loom_zero_flight *f = &z->flights[b];
        const size_t lo = m->blocks[b].offset, hi = lo + m->blocks[b].numel;
        /* this rank's count of split(): its shard within [lo, hi), found
         * without walking every rank's */
        size_t a = (size_t)z->dp_rank * z->part.shard, e = a + z->part.shard;
        if (a < lo) a = lo;
        if (e > hi) e = hi;
        const size_t nrecv = e > a ? e - a : 0;
        f->recv = take(nrecv, LOOM_DTYPE_F32, 0);
        f->lo = nrecv ? a : lo;
        if (z->reduce_dtype != LOOM_DTYPE_F32) {
            f->send16 = take(hi - lo, z->reduce_dtype, 0);
            f->recv16 = take(nrecv, z->reduce_dtype, 0);
        }
        z->order[z->norder++] = b;
        if (x && b == x->first && u != z->pinned) loom_pool_give(&z->units[u].buf);
        return;
    }
    default:
        return;
    }
}

void loom_zero_experts_apart(struct loom_zero *z, int dense_first)
{
    LOOM_ASSERT(z->ep > 1);
    z->dense_first = dense_first;
    z->group = LOOM_GROUP_EXPERT_DP;
    z->experts_apart = 1;
    z->scattered = 0; /* stage 1: DDP all-reduces the expert and dense runs */
}

void loom_zero_free(struct loom_zero *z)
{
    while (z->norder > 0) land_oldest(z); /* a step that failed may leave reductions in flight */
    for (int u = 0; u < z->nunits; u++) release(z, u);
    struct {
        struct loom_buf *buf;
        struct loom_offload_map *map;
    } shards[] = {
        {&z->grad_shard, &z->grad_map}, {&z->grad_acc, &z->acc_map}, {&z->param_shard, &z->param_map}};
    for (size_t i = 0; i < sizeof shards / sizeof shards[0]; i++) {
        if (shards[i].map->data) {
            loom_offload_unmap(shards[i].map);
            *shards[i].buf = (struct loom_buf){0};
        } else if (shards[i].buf->data) {
            loom_backend_buf_free(be(z), shards[i].buf);
        }
    }
    loom_free(z->flights);
    loom_free(z->order);
    loom_free(z->counts);
    loom_free(z->displs);
    loom_free(z->units);
    loom_free(z->unit_of);
    loom_free(z->runs);
    loom_free(z->ep_counts);
    memset(z, 0, sizeof *z);
}

struct loom_buf loom_zero_params(const struct loom_zero *z)
{
    const size_t n = z->stage == 3 && z->runs ? z->owned : z->part.end - z->part.begin;
    return z->stage == 3 ? loom_buf_slice(z->param_shard, 0, n)
                         : loom_buf_slice(z->model->params, z->part.begin, n);
}

struct loom_buf loom_zero_grads(const struct loom_zero *z)
{
    const size_t n = z->runs ? z->owned : z->part.end - z->part.begin;
    return z->stage >= 2 ? loom_buf_slice(z->grad_shard, 0, n)
                         : loom_buf_slice(z->model->grads, z->part.begin, n);
}
