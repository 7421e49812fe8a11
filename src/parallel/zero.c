/* ZeRO stages 0-3: shard arithmetic, the stage-2 gradient path, the stage-3
 * parameter gathers with prefetch, and the post-step all-gather (see zero.h). */
#include "parallel/zero.h"

#include <math.h>
#include <string.h>

#include "base/dtype.h"
#include "base/log.h"
#include "base/mem.h"
#include "base/pool.h"
#include "comm/comm.h"
#include "kernels/kernels.h"
#include "optim/adamw.h"

struct loom_zero_flight {
    float *buf;              /* the block's full gradient, (numel), transient */
    float *recv;             /* this rank's segment of the sum, (nrecv) */
    float *send16, *recv16;  /* --grad-reduce-dtype bf16/fp16: the same in 16 bits (pool buffers of floats) */
    size_t nrecv, shard_off; /* where the segment lands in grad_shard */
    struct loom_comm_handle *handle;
};

struct loom_zero_unit {
    int first, last;                 /* blocks */
    size_t lo, hi;                   /* arena range */
    float *buf;                      /* gathered parameters, (hi - lo), or NULL */
    struct loom_comm_handle *handle; /* gather in flight */
};

enum { MAX_LAYERS_IN_FLIGHT = 2 };

/* Transient buffers come from the pool (base/pool.h), counted under comm. */
static float *take(size_t n, int zeroed)
{
    return loom_pool_take(n, zeroed, LOOM_MEM_COMM);
}
static void give(float *b, size_t n)
{
    loom_pool_give(b, n);
}

size_t loom_zero_arena_multiple(int stage, int dp)
{
    return stage >= 1 ? (size_t)dp : 1;
}

/* counts[r], and displs[r] from lo: the part of [lo, hi) in rank r's shard.
 * Returns the start of this rank's part (lo when it has none). */
static size_t split(struct loom_zero *z, size_t lo, size_t hi)
{
    size_t mine = lo;
    for (int r = 0; r < z->dp; r++) {
        size_t a = (size_t)r * z->shard, b = a + z->shard;
        if (a < lo) a = lo;
        if (b > hi) b = hi;
        z->counts[r] = b > a ? (int)(b - a) : 0;
        z->displs[r] = b > a ? (int)(a - lo) : 0;
        if (r == z->dp_rank && b > a) mine = a;
    }
    return mine;
}

/* ---- stage 2: gradients ------------------------------------------------- */

/* Waits for the oldest posted block, adds its segment into the shard, frees it. */
static void land_oldest(struct loom_zero *z)
{
    LOOM_ASSERT(z->norder > 0);
    int block = z->order[0];
    struct loom_zero_flight *f = &z->flights[block];
    z->wait_s += loom_comm_wait(f->handle);
    const size_t n = z->model->blocks[block].numel;
    if (z->reduce16) {
        loom_lp_to_f32(f->recv, (const uint16_t *)f->recv16, f->nrecv, z->dtype);
        give(f->send16, (n + 1) / 2);
        give(f->recv16, f->nrecv / 2 + 1);
    }
    if (z->dtype && !z->grad_shard) {
        loom_lp_accumulate(z->grad_shard_lp + f->shard_off, f->recv, f->nrecv, z->dtype);
    } else {
        float *dst = z->grad_shard + f->shard_off;
        for (size_t i = 0; i < f->nrecv; i++) dst[i] += f->recv[i];
    }
    give(f->buf, n);
    give(f->recv, f->nrecv ? f->nrecv : 1);
    memset(f, 0, sizeof *f);
    z->model->blocks[block].grads = NULL;
    memmove(z->order, z->order + 1, sizeof(int) * (size_t)--z->norder);
}

static void grad_buffer(struct loom_zero *z, int block)
{
    struct loom_model *m = z->model;
    struct loom_zero_flight *f = &z->flights[block];
    /* bound the memory in flight (the blocks posted before this one), and
     * land this block's reduction from an earlier micro-batch */
    while (z->norder >= MAX_LAYERS_IN_FLIGHT || (f->buf && z->norder > 0)) land_oldest(z);
    LOOM_ASSERT(f->buf == NULL);
    f->buf = take(m->blocks[block].numel, 1);
    m->blocks[block].grads = f->buf;
}

static void post_grads(struct loom_zero *z, int block)
{
    struct loom_zero_flight *f = &z->flights[block];
    const size_t lo = z->block_lo[block], hi = lo + z->model->blocks[block].numel;
    size_t mine = split(z, lo, hi);
    f->shard_off = mine - z->begin;
    f->nrecv = (size_t)z->counts[z->dp_rank];
    if (!f->nrecv) f->shard_off = 0;
    f->recv = take(f->nrecv ? f->nrecv : 1, 0);
    if (z->reduce16) { /* this rank's gradient rounded once, summed in 16 bits */
        const size_t n = hi - lo;
        f->send16 = take((n + 1) / 2, 0);
        f->recv16 = take(f->nrecv / 2 + 1, 0);
        loom_lp_from_f32((uint16_t *)f->send16, f->buf, n, z->dtype);
        f->handle = loom_comm_reduce_scatter_v(LOOM_GROUP_DP, loom_buf_of(f->send16, n, z->reduce16),
                                               loom_buf_of(f->recv16, f->nrecv, z->reduce16), z->counts);
    } else {
        f->handle = loom_comm_reduce_scatter_v(LOOM_GROUP_DP, loom_buf_f32(f->buf, hi - lo),
                                               loom_buf_f32(f->recv, f->nrecv), z->counts);
    }
    z->order[z->norder++] = block;
}

/* ---- stage 3: parameters -------------------------------------------------- */

/* Unit buffers hold the unit's stored parameters: float32, or 16-bit under
 * mixed precision (from the same pool, as half as many floats). */
static size_t unit_floats(const struct loom_zero *z, const struct loom_zero_unit *x)
{
    size_t n = x->hi - x->lo;
    return z->dtype ? (n + 1) / 2 : n;
}

static void point_blocks(struct loom_zero *z, const struct loom_zero_unit *x)
{
    for (int b = x->first; b <= x->last; b++) {
        struct loom_block *blk = &z->model->blocks[b];
        size_t off = z->block_lo[b] - x->lo;
        /* under mixed precision params is the precision layer's float32 copy */
        if (z->dtype)
            blk->params_lp = x->buf ? (uint16_t *)x->buf + off : NULL;
        else
            blk->params = x->buf ? x->buf + off : NULL;
    }
}

static void post_gather(struct loom_zero *z, int u)
{
    struct loom_zero_unit *x = &z->units[u];
    if (x->buf) return; /* gathered or on its way */
    x->buf = take(unit_floats(z, x), 0);
    size_t mine = split(z, x->lo, x->hi), at = z->counts[z->dp_rank] ? mine - z->begin : 0;
    if (z->dtype)
        x->handle = loom_comm_allgather_v(
            LOOM_GROUP_DP, loom_buf_of(z->param_shard_lp + at, (size_t)z->counts[z->dp_rank], LOOM_DTYPE_U16),
            loom_buf_of(x->buf, x->hi - x->lo, LOOM_DTYPE_U16), z->counts, z->displs);
    else
        x->handle = loom_comm_allgather_v(LOOM_GROUP_DP,
                                          loom_buf_f32(z->param_shard + at, (size_t)z->counts[z->dp_rank]),
                                          loom_buf_f32(x->buf, x->hi - x->lo), z->counts, z->displs);
}

static void ensure_gathered(struct loom_zero *z, int u)
{
    struct loom_zero_unit *x = &z->units[u];
    post_gather(z, u);
    if (x->handle) {
        z->wait_s += loom_comm_wait(x->handle);
        x->handle = NULL;
        point_blocks(z, x);
    }
}

static void release(struct loom_zero *z, int u)
{
    struct loom_zero_unit *x = &z->units[u];
    if (!x->buf) return;
    if (x->handle) {
        loom_comm_wait(x->handle);
        x->handle = NULL;
    }
    give(x->buf, unit_floats(z, x));
    x->buf = NULL;
    point_blocks(z, x);
}

static void prefetch(struct loom_zero *z, int u)
{
    if (u >= 0 && u < z->nunits && u != z->pinned) post_gather(z, u);
}

/* ---- hooks ------------------------------------------------------------------ */

static void pre_forward(void *ctx, int block)
{
    struct loom_zero *z = ctx;
    int u = z->unit_of[block];
    ensure_gathered(z, u);
    if (block == z->units[u].first) prefetch(z, u + 1);
}

static void post_forward(void *ctx, int block)
{
    struct loom_zero *z = ctx;
    int u = z->unit_of[block];
    if (block == z->units[u].last && u != z->pinned) release(z, u);
}

static void pre_backward(void *ctx, int block)
{
    struct loom_zero *z = ctx;
    if (z->stage == 3) {
        int u = z->unit_of[block];
        ensure_gathered(z, u);
        if (block == z->units[u].last && block != 0) prefetch(z, u - 1);
    }
    grad_buffer(z, block);
}

static void grad_ready(void *ctx, int block)
{
    struct loom_zero *z = ctx;
    if (block < 0) return; /* the tied-embedding event: block 0 is posted when it is done */
    post_grads(z, block);
    if (z->stage == 3) {
        int u = z->unit_of[block];
        if (block == z->units[u].first && u != z->pinned) release(z, u);
    }
}

/* ---- set-up and steps ---------------------------------------------------------- */

static void make_units(struct loom_zero *z, int64_t min_params)
{
    struct loom_model *m = z->model;
    z->units = loom_alloc(sizeof *z->units * (size_t)m->nblocks, LOOM_MEM_OTHER);
    z->unit_of = loom_alloc(sizeof(int) * (size_t)m->nblocks, LOOM_MEM_OTHER);
    z->nunits = 0;
    int64_t held = 0;
    for (int b = 0; b < m->nblocks; b++) {
        if (held == 0) {
            z->units[z->nunits] = (struct loom_zero_unit){b, b, z->block_lo[b], z->block_lo[b], NULL, NULL};
            z->nunits++;
        }
        struct loom_zero_unit *x = &z->units[z->nunits - 1];
        x->last = b;
        x->hi = z->block_lo[b] + m->blocks[b].numel;
        z->unit_of[b] = z->nunits - 1;
        held += (int64_t)m->blocks[b].numel;
        if (held >= min_params) held = 0;
    }
    z->pinned = z->unit_of[0];
}

void loom_zero_init(struct loom_zero *z, int stage, int dp, int dp_rank, struct loom_model *m,
                    int64_t min_params)
{
    LOOM_ASSERT(stage >= 0 && stage <= 3 && dp >= 1 && dp_rank >= 0 && dp_rank < dp);
    memset(z, 0, sizeof *z);
    z->dtype = (enum loom_dtype)m->dtype;
    z->stage = stage;
    z->dp = dp;
    z->dp_rank = dp_rank;
    z->model = m;
    z->block_lo = loom_alloc(sizeof(size_t) * (size_t)m->nblocks, LOOM_MEM_OTHER);
    for (size_t b = 0, off = 0; b < (size_t)m->nblocks; off += m->blocks[b].numel, b++) z->block_lo[b] = off;
    if (stage == 0) {
        z->shard = m->num_params;
        z->end = m->num_params;
        return;
    }
    LOOM_ASSERT(m->arena_numel % (size_t)dp == 0);
    z->shard = m->arena_numel / (size_t)dp;
    z->begin = (size_t)dp_rank * z->shard;
    z->end = z->begin + z->shard < m->num_params ? z->begin + z->shard : m->num_params;
    if (z->end < z->begin) z->end = z->begin; /* a rank whose shard is all padding */
    if (stage < 2) return;
    LOOM_ASSERT(m->grads == NULL && m->grads_lp == NULL && z->shard <= 0x7fffffff);
    if (z->dtype)
        z->grad_shard_lp = loom_alloc(loom_mul_size(z->shard, sizeof(uint16_t)), LOOM_MEM_GRADS);
    else
        z->grad_shard = loom_alloc(loom_mul_size(z->shard, sizeof(float)), LOOM_MEM_GRADS);
    z->flights = loom_alloc(sizeof *z->flights * (size_t)m->nblocks, LOOM_MEM_OTHER);
    z->order = loom_alloc(sizeof(int) * (size_t)m->nblocks, LOOM_MEM_OTHER);
    z->counts = loom_alloc(sizeof(int) * (size_t)dp, LOOM_MEM_OTHER);
    z->displs = loom_alloc(sizeof(int) * (size_t)dp, LOOM_MEM_OTHER);
    m->pre_backward = pre_backward;
    m->grad_ready = grad_ready;
    m->hook_ctx = z;
    if (stage < 3) return;
    /* keep this rank's shard of the parameters, let go of the arena (a model
     * without one is initialised shard by shard: loom_zero_init_weights) */
    if (z->dtype) {
        z->param_shard_lp = loom_alloc(loom_mul_size(z->shard, sizeof(uint16_t)), LOOM_MEM_PARAMS);
        if (m->params_lp) {
            memcpy(z->param_shard_lp, m->params_lp + z->begin, (z->end - z->begin) * sizeof(uint16_t));
            loom_free(m->params_lp);
            m->params_lp = NULL;
        }
    } else {
        z->param_shard = loom_alloc(loom_mul_size(z->shard, sizeof(float)), LOOM_MEM_PARAMS);
        if (m->params) {
            memcpy(z->param_shard, m->params + z->begin, (z->end - z->begin) * sizeof(float));
            loom_free(m->params);
            m->params = NULL;
        }
    }
    for (int b = 0; b < m->nblocks; b++) m->blocks[b].params = NULL, m->blocks[b].params_lp = NULL;
    make_units(z, min_params);
    m->pre_forward = pre_forward;
    m->post_forward = post_forward;
}

void loom_zero_init_weights(struct loom_zero *z, uint64_t seed)
{
    LOOM_ASSERT(z->stage == 3);
    struct loom_model *m = z->model;
    for (int u = 0; u < z->nunits; u++) {
        struct loom_zero_unit *x = &z->units[u];
        float *buf = take(x->hi - x->lo, 0);
        for (int b = x->first; b <= x->last; b++) {
            m->blocks[b].params = buf + (z->block_lo[b] - x->lo);
            m->ops->init_block(m, b, seed);
            m->blocks[b].params = NULL;
        }
        size_t a = x->lo > z->begin ? x->lo : z->begin, e = x->hi < z->end ? x->hi : z->end;
        if (a < e && z->dtype)
            loom_lp_from_f32(z->param_shard_lp + (a - z->begin), buf + (a - x->lo), e - a, z->dtype);
        else if (a < e)
            memcpy(z->param_shard + (a - z->begin), buf + (a - x->lo), (e - a) * sizeof(float));
        give(buf, x->hi - x->lo);
    }
}

void loom_zero_free(struct loom_zero *z)
{
    struct loom_model *m = z->model;
    for (int u = 0; u < z->nunits; u++) release(z, u);
    if (z->stage >= 2) {
        m->pre_backward = m->grad_ready = m->pre_forward = m->post_forward = NULL;
        m->hook_ctx = NULL;
    }
    loom_pool_drain();
    loom_free(z->grad_shard);
    loom_free(z->grad_shard_lp);
    loom_free(z->param_shard_lp);
    loom_free(z->flights);
    loom_free(z->order);
    loom_free(z->counts);
    loom_free(z->displs);
    loom_free(z->block_lo);
    loom_free(z->param_shard);
    loom_free(z->units);
    loom_free(z->unit_of);
    memset(z, 0, sizeof *z);
}

void loom_zero_begin_step(struct loom_zero *z)
{
    z->wait_s = 0;
    if (z->stage >= 2 && z->dtype) memset(z->grad_shard_lp, 0, z->shard * sizeof(uint16_t));
    if (z->stage >= 2 && z->grad_shard) memset(z->grad_shard, 0, z->shard * sizeof(float));
}

void loom_zero_finish_backward(struct loom_zero *z)
{
    while (z->stage >= 2 && z->norder > 0) land_oldest(z);
    if (z->stage >= 2 && z->dtype && z->grad_shard) /* accumulated in float32: rounded once */
        loom_lp_from_f32(z->grad_shard_lp, z->grad_shard, z->shard, z->dtype);
}

void loom_zero_reduce_in(struct loom_zero *z, enum loom_dtype dt)
{
    LOOM_ASSERT(dt == LOOM_DTYPE_F32 || (z->dtype && z->stage >= 2));
    z->reduce16 = dt == LOOM_DTYPE_F32 ? 0 : dt;
}

void loom_zero_accumulate_f32(struct loom_zero *z)
{
    LOOM_ASSERT(z->dtype && z->stage >= 2 && !z->grad_shard);
    z->grad_shard = loom_alloc(loom_mul_size(z->shard, sizeof(float)), LOOM_MEM_GRADS);
}

double loom_zero_grad_norm(const struct loom_zero *z)
{
    const struct loom_model *m = z->model;
    double ss;
    if (z->stage < 2 && z->dtype)
        ss = loom_lp_sum_squares(m->grads_lp, m->num_params, z->dtype);
    else if (z->stage < 2)
        return loom_grad_norm(m->blocks, m->nblocks);
    else if (z->dtype)
        ss = loom_lp_sum_squares(z->grad_shard_lp, z->end - z->begin, z->dtype);
    else
        ss = loom_sum_squares(z->grad_shard, z->end - z->begin);
    if (z->stage >= 2)
        loom_comm_allreduce_sync(LOOM_GROUP_DP, loom_buf_of(&ss, 1, LOOM_DTYPE_F64), LOOM_OP_SUM);
    return sqrt(ss);
}

float *loom_zero_params(const struct loom_zero *z)
{
    LOOM_ASSERT(!z->dtype);
    return z->stage == 3 ? z->param_shard : z->model->params + z->begin;
}

const float *loom_zero_grads(const struct loom_zero *z)
{
    LOOM_ASSERT(!z->dtype);
    return z->stage >= 2 ? z->grad_shard : z->model->grads + z->begin;
}

uint16_t *loom_zero_params_lp(const struct loom_zero *z)
{
    LOOM_ASSERT(z->dtype);
    return z->stage == 3 ? z->param_shard_lp : z->model->params_lp + z->begin;
}

const uint16_t *loom_zero_grads_lp(const struct loom_zero *z)
{
    LOOM_ASSERT(z->dtype);
    return z->stage >= 2 ? z->grad_shard_lp : z->model->grads_lp + z->begin;
}

void loom_zero_after_step(struct loom_zero *z)
{
    if (z->stage == 3) {
        release(z, z->pinned);
        return;
    }
    if (z->stage == 0 || z->dp == 1) return;
    if (z->dtype)
        loom_comm_wait(
            loom_comm_allgather(LOOM_GROUP_DP, loom_buf_of(NULL, 0, LOOM_DTYPE_U16),
                                loom_buf_of(z->model->params_lp, z->shard * (size_t)z->dp, LOOM_DTYPE_U16)));
    else
        loom_comm_wait(loom_comm_allgather(LOOM_GROUP_DP, loom_buf_f32(NULL, 0),
                                           loom_buf_f32(z->model->params, z->shard * (size_t)z->dp)));
}
