/* ZeRO stage 1: shard arithmetic and the parameter all-gather (see zero.h). */
#include "parallel/zero.h"

#include "base/log.h"
#include "comm/comm.h"

size_t loom_zero_arena_multiple(int stage, int dp) { return stage >= 1 ? (size_t)dp : 1; }

void loom_zero_init(struct loom_zero *z, int stage, int dp, int dp_rank, const struct loom_gpt2 *m)
{
    LOOM_ASSERT(stage >= 0 && stage <= 1 && dp >= 1 && dp_rank >= 0 && dp_rank < dp);
    z->stage = stage;
    z->dp = dp;
    z->dp_rank = dp_rank;
    if (stage == 0) {
        z->shard = m->num_params;
        z->begin = 0;
        z->end = m->num_params;
        return;
    }
    LOOM_ASSERT(m->arena_numel % (size_t)dp == 0);
    z->shard = m->arena_numel / (size_t)dp;
    z->begin = (size_t)dp_rank * z->shard;
    z->end = z->begin + z->shard < m->num_params ? z->begin + z->shard : m->num_params;
    if (z->end < z->begin) z->end = z->begin; /* a rank whose shard is all padding */
}

void loom_zero_gather_params(const struct loom_zero *z, struct loom_gpt2 *m)
{
    if (z->stage == 0 || z->dp == 1) return;
    loom_comm_wait(loom_comm_allgather(LOOM_GROUP_DP, NULL, m->params, z->shard, LOOM_F32));
}
