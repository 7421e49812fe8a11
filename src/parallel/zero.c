/* ZeRO stages 0-2: shard arithmetic, the stage-2 gradient path and the
 * parameter all-gather (see zero.h). */
#include "parallel/zero.h"

#include <math.h>
#include <string.h>

#include "base/log.h"
#include "base/mem.h"
#include "comm/comm.h"
#include "kernels/kernels.h"
#include "optim/adamw.h"

struct loom_zero_flight {
    float *buf;   /* the block's full gradient, (numel), transient */
    float *recv;  /* this rank's segment of the sum, (nrecv) */
    size_t nrecv, shard_off; /* where the segment lands in grad_shard */
    struct loom_comm_handle *handle;
};

enum { MAX_LAYERS_IN_FLIGHT = 2 };

size_t loom_zero_arena_multiple(int stage, int dp) { return stage >= 1 ? (size_t)dp : 1; }

static size_t block_offset(const struct loom_gpt2 *m, int block) { return (size_t)(m->blocks[block].params - m->params); }

/* Waits for the oldest posted block, adds its segment into the shard, frees it. */
static void land_oldest(struct loom_zero *z)
{
    LOOM_ASSERT(z->norder > 0);
    int block = z->order[0];
    struct loom_zero_flight *f = &z->flights[block];
    loom_comm_wait(f->handle);
    float *dst = z->grad_shard + f->shard_off;
    for (size_t i = 0; i < f->nrecv; i++) dst[i] += f->recv[i];
    loom_free(f->buf);
    loom_free(f->recv);
    memset(f, 0, sizeof *f);
    z->model->blocks[block].grads = NULL;
    memmove(z->order, z->order + 1, sizeof(int) * (size_t)--z->norder);
}

static void pre_backward(void *ctx, int block)
{
    struct loom_zero *z = ctx;
    struct loom_gpt2 *m = z->model;
    struct loom_zero_flight *f = &z->flights[block];
    /* bound the memory in flight (the blocks posted before this one), and
     * land this block's reduction from an earlier micro-batch */
    while (z->norder >= MAX_LAYERS_IN_FLIGHT || (f->buf && z->norder > 0)) land_oldest(z);
    LOOM_ASSERT(f->buf == NULL);
    f->buf = loom_alloc(loom_mul_size(m->blocks[block].numel, sizeof(float)), LOOM_MEM_COMM);
    m->blocks[block].grads = f->buf;
}

static void grad_ready(void *ctx, int block)
{
    struct loom_zero *z = ctx;
    if (block < 0) return; /* the tied-embedding event: block 0 is posted when it is done */
    struct loom_gpt2 *m = z->model;
    struct loom_zero_flight *f = &z->flights[block];
    const size_t lo = block_offset(m, block), hi = lo + m->blocks[block].numel;
    for (int r = 0; r < z->dp; r++) {
        size_t a = (size_t)r * z->shard, b = a + z->shard;
        if (a < lo) a = lo;
        if (b > hi) b = hi;
        z->counts[r] = b > a ? (int)(b - a) : 0;
        if (r == z->dp_rank) f->shard_off = b > a ? a - (size_t)r * z->shard : 0;
    }
    f->nrecv = (size_t)z->counts[z->dp_rank];
    f->recv = loom_alloc((f->nrecv ? f->nrecv : 1) * sizeof(float), LOOM_MEM_COMM);
    f->handle = loom_comm_reduce_scatter_v(LOOM_GROUP_DP, f->buf, f->recv, z->counts, LOOM_F32);
    z->order[z->norder++] = block;
}

void loom_zero_init(struct loom_zero *z, int stage, int dp, int dp_rank, struct loom_gpt2 *m)
{
    LOOM_ASSERT(stage >= 0 && stage <= 2 && dp >= 1 && dp_rank >= 0 && dp_rank < dp);
    memset(z, 0, sizeof *z);
    z->stage = stage;
    z->dp = dp;
    z->dp_rank = dp_rank;
    z->model = m;
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
    if (stage == 2) {
        LOOM_ASSERT(m->grads == NULL && z->shard <= 0x7fffffff);
        z->grad_shard = loom_alloc(loom_mul_size(z->shard, sizeof(float)), LOOM_MEM_GRADS);
        z->flights = loom_alloc(sizeof *z->flights * (size_t)m->nblocks, LOOM_MEM_OTHER);
        z->order = loom_alloc(sizeof(int) * (size_t)m->nblocks, LOOM_MEM_OTHER);
        z->counts = loom_alloc(sizeof(int) * (size_t)dp, LOOM_MEM_OTHER);
        m->pre_backward = pre_backward;
        m->grad_ready = grad_ready;
        m->grad_ready_ctx = z;
    }
}

void loom_zero_free(struct loom_zero *z)
{
    if (z->stage != 2) return;
    z->model->pre_backward = NULL;
    z->model->grad_ready = NULL;
    z->model->grad_ready_ctx = NULL;
    loom_free(z->grad_shard);
    loom_free(z->flights);
    loom_free(z->order);
    loom_free(z->counts);
}

void loom_zero_begin_step(struct loom_zero *z)
{
    if (z->stage == 2) memset(z->grad_shard, 0, z->shard * sizeof(float));
}

void loom_zero_finish_backward(struct loom_zero *z)
{
    while (z->stage == 2 && z->norder > 0) land_oldest(z);
}

double loom_zero_grad_norm(const struct loom_zero *z)
{
    if (z->stage < 2) return loom_grad_norm(z->model->blocks, z->model->nblocks);
    double ss = loom_sum_squares(z->grad_shard, z->end - z->begin);
    loom_comm_allreduce_sync(LOOM_GROUP_DP, &ss, 1, LOOM_F64, LOOM_OP_SUM);
    return sqrt(ss);
}

const float *loom_zero_grads(const struct loom_zero *z)
{
    return z->stage == 2 ? z->grad_shard : z->model->grads + z->begin;
}

void loom_zero_gather_params(const struct loom_zero *z, struct loom_gpt2 *m)
{
    if (z->stage == 0 || z->dp == 1) return;
    loom_comm_wait(loom_comm_allgather(LOOM_GROUP_DP, NULL, m->params, z->shard, LOOM_F32));
}
