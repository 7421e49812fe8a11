/* A layout's memory on one rank, counted by the trainer's own set-up code (see footprint.h). */
#include "engine/footprint.h"

#include <stdint.h>
#include <string.h>

#include "base/log.h"
#include "engine/engine_impl.h"
#include "kernels/pool.h"
#include "model/family.h"
#include "parallel/stack.h"

/* One step's transient buffers: each strategy's replay (loom/strategy.h)
 * at each point of the step, in the order the stack's calls make them (the
 * strategies in stack order on the way in, in reverse on the way out), for
 * the step's micro-batches one after another. */
/* The micro-batch replayed after k of A. The others repeat what these do:
 * the strategies' state is per block and settles in the first micro-batch;
 * the layout-invariant tree opens a level at each micro-batch 2^j - 1; the
 * last two differ (the last reduces). So a step of any length replays in
 * O(log A) micro-batches to the same peak. */
static int next_micro(int k, int A)
{
    if (k < 3 || k >= A - 3) return k + 1;
    int64_t level = 2; /* the next micro-batch 2^j - 1 after k */
    while (level - 1 <= k) level *= 2;
    return level - 1 < A - 2 ? (int)(level - 1) : A - 2;
}

static void replay_step(struct loom_engine *e)
{
    struct loom_model *m = e->model;
    const int A = e->cfg->gradient_accumulation_steps, n = m->nblocks;
    struct loom_replay r = {0};
    loom_stack_replay(m, LOOM_REPLAY_BEGIN_STEP, -1, &r);
    /* a tied embedding's gradients open with the head's backward (its
     * first), and close with its own */
    struct loom_tied_embedding te;
    const int tied = m->ops->tied_embedding && m->ops->tied_embedding(m, &te) ? te.block : -1;
    for (int k = 0; k < A; k = next_micro(k, A)) {
        r = (struct loom_replay){.micro = k, .last = k == A - 1};
        for (int b = 0; b < n; b++) {
            loom_stack_replay(m, LOOM_REPLAY_PRE_FORWARD, b, &r);
            loom_stack_replay(m, LOOM_REPLAY_POST_FORWARD, b, &r);
        }
        loom_stack_replay(m, LOOM_REPLAY_BEGIN_BACKWARD, -1, &r);
        for (int i = -1; i < n; i++) {
            const int b = i < 0 ? tied : n - 1 - i;
            if (b < 0) continue;
            if (b != tied || i < 0) loom_stack_replay(m, LOOM_REPLAY_PRE_BACKWARD, b, &r);
            if (i >= 0) loom_stack_replay(m, LOOM_REPLAY_GRADS_READY, b, &r);
        }
    }
    loom_stack_replay(m, LOOM_REPLAY_FINISH, -1, &r);
}

int loom_engine_footprint(struct loom_config *cfg, const struct loom_topology *topo,
                          struct loom_footprint *out)
{
    memset(out, 0, sizeof *out);
    const struct loom_model_family *family = loom_model_family_of_preset(cfg->model, NULL);
    if (!family)
        return loom_error_set(LOOM_ERR_INPUT, "--model %s: no model family has this preset", cfg->model);
    int rc = family->check(cfg, cfg->seq_length);
    if (rc) return rc;
    struct loom_engine e = {.cfg = cfg, .topo = *topo};
    loom_pool_drain(); /* the pool may hand only counted buffers out in the window */
    loom_mem_count_begin();
    struct loom_model *m =
        family->create(cfg, cfg->micro_batch_size, cfg->seq_length, 1, topo->tp_rank, topo->pp_rank);
    e.model = m;
    m->dtype = loom_engine_state_dtype(cfg);
    loom_kinds_shape(cfg, topo->world, &e.shape);
    /* a step's peak: a layout that shards the parameters keeps its shard
     * only (the whole arena it may start from is gone before the first step) */
    e.init_sharded = e.shape.shard_params;
    loom_engine_alloc_arenas(&e);
    loom_engine_alloc_grad_acc(&e);
    int zdp, zrank;
    loom_zero_ranks(topo, &zdp, &zrank);
    e.part = loom_zero_partition(e.shape.shard_optimizer, zdp, zrank, m);
    loom_engine_build_stack(&e); /* offload files are not made while counting */
    loom_engine_alloc_optimizer(&e);
    if (cfg->offload_optimizer == LOOM_OFFLOAD_NVME)
        loom_adamw_offload_buffers(&e.opt, (size_t)(cfg->offload_buffer_size * 1e6));
    loom_engine_plan_schedule(&e);
    /* the model's reserve takes and gives back what its own passes take
     * within a step (the 16-bit head's staging) on top of every activation:
     * that peak is a step's too */
    loom_mem_count_reset_peak();
    if (m->ops->reserve) m->ops->reserve(m);
    struct loom_mem_stats reserved;
    loom_mem_count_peek(&reserved);
    /* the first step fills the pool; the trainer reports steps after it,
     * with the pool's buffers counted under their last holder's tag */
    replay_step(&e);
    loom_mem_count_reset_peak();
    loom_schedule_replay(&e.plan, loom_engine_boundary(&e));
    replay_step(&e);
    loom_pool_drain();
    struct loom_mem_stats st;
    loom_mem_count_end(&st);
    for (int i = 0; i < LOOM_MEM_COUNT; i++)
        out->peak[i] = st.peak[i] > reserved.peak[i] ? st.peak[i] : reserved.peak[i];
    out->total = st.peak_total > reserved.peak_total ? st.peak_total : reserved.peak_total;
    out->params = (int64_t)m->num_params;
    out->flops_per_token = family->flops_per_token(m);
    loom_engine_release_state(&e);
    family->destroy(m);
    return LOOM_OK;
}
