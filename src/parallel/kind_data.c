/*
 * The data-parallel kind (kinds.h): the ranks the other kinds leave, each
 * with its share of the batch; DDP's gradient reduction (ddp.h) unless a
 * kind reduces the gradients into shards itself (under ZeRO-1 DDP's
 * buckets are reduce-scattered over its shards); the data-parallel
 * group's communication in the time model, by what the layout shards.
 */
#include <stdio.h>

#include "base/log.h"
#include "base/mem.h"
#include "parallel/ddp.h"
#include "parallel/kinds.h"
#include "parallel/zero.h"

/* What tensor and pipeline parallelism leave. */
static void shape(const struct loom_config *cfg, int world, struct loom_layout_shape *s)
{
    (void)cfg;
    s->dp = world / (s->tp * s->pp);
}

static int build(struct loom_kind_build *b, void **state)
{
    const struct loom_config *cfg = b->cfg;
    if (b->topo->dp == 1 || b->shape->shard_grads) return LOOM_OK;
    struct loom_ddp *d = loom_alloc(sizeof *d, LOOM_MEM_OTHER);
    *state = d;
    /* checked with the config: F32, or the compute dtype */
    loom_ddp_init(d, b->model, b->topo->dp, cfg->ddp_bucket_size, !cfg->no_overlap,
                  cfg->ddp_impl == LOOM_DDP_NAIVE, (enum loom_dtype)cfg->grad_reduce_dtype,
                  b->topo->tp == 1 && !b->shape->exact_sums);
    if (b->topo->ep > 1) loom_ddp_experts_apart(d);
    if (loom_zero1_scatters(cfg->zero_stage, b->topo))
        loom_ddp_shard(d, b->topo->dp_rank,
                       loom_zero_partition(1, b->topo->dp, b->topo->dp_rank, b->model).shard);
    return LOOM_OK;
}

static void release(void *state)
{
    loom_ddp_free(state);
    loom_free(state);
}

/* The gradients all-reduced, reduce-scattered once a step onto ZeRO-1's
 * shards, or every micro-batch into ZeRO-2/3's; the parameters all-gathered after the step when the optimizer
 * state is sharded, or before each forward and backward when they are;
 * hidden behind the backward (two thirds of the work) when it overlaps,
 * without pipelining, but for the last bucket or unit. */
static struct loom_time_terms time_terms(const struct loom_time_in *in)
{
    const struct loom_layout_shape *s = in->shape;
    const struct loom_config *cfg = in->cfg;
    const int dp = s->dp, m = cfg->gradient_accumulation_steps;
    if (dp <= 1) return (struct loom_time_terms){0, 0};
    double bw, lat;
    loom_time_link(in, s->tp * dp, &bw, &lat);
    const double grad_bytes = in->params * (cfg->grad_reduce_dtype ? 2 : 4),
                 param_bytes = in->params * (in->lp ? 2 : 4);
    /* ZeRO-2/3 reduce-scatter every micro-batch; ZeRO-1 once a step (the
     * expert runs of a mixture apart: all-reduced); DDP all-reduces */
    const int scatter_once = s->shard_optimizer && !s->shard_grads && s->ep <= 1;
    const double t = (s->shard_grads ? loom_ring_half_s(grad_bytes, dp, bw, lat) * m
                      : scatter_once ? loom_ring_half_s(grad_bytes, dp, bw, lat)
                                     : loom_ring_allreduce_s(grad_bytes, dp, bw, lat)) +
                     (s->shard_params      ? 2.0 * m * loom_ring_half_s(param_bytes, dp, bw, lat)
                      : s->shard_optimizer ? loom_ring_half_s(param_bytes, dp, bw, lat)
                                           : 0);
    const double hide = s->pp == 1 && !cfg->no_overlap ? in->work * 2.0 / 3.0 : 0;
    const double tail = 0.1 * t;
    return (struct loom_time_terms){0, t - hide > tail ? t - hide : tail};
}

/* The one size the others leave. */
static int plan_choices(const struct loom_plan_space *s, const struct loom_kind_choice *l, int slot, int left,
                        int *out)
{
    (void)s, (void)l, (void)slot;
    out[0] = left;
    return 1;
}

static int plan_ranks(const struct loom_kind_choice *c)
{
    return c->value;
}

static void plan_describe(const struct loom_kind_choice *c, char *buf, size_t n)
{
    snprintf(buf, n, " x dp %d", c->value);
}

/* Its first and last rank (ZeRO's padding and block boundaries make the
 * last shard differ). */
static int plan_probes(const struct loom_kind_choice *c, struct loom_topology *t, int probe)
{
    t->dp = c->value;
    t->dp_rank = probe ? c->value - 1 : 0;
    return c->value > 1 ? 2 : 1;
}

const struct loom_kind loom_kind_data = {.name = "data",
                                         .group = LOOM_GROUP_DP,
                                         .shape = shape,
                                         .build = build,
                                         .release = release,
                                         .time = time_terms,
                                         .plan_slots = 1,
                                         .plan_choices = plan_choices,
                                         .plan_ranks = plan_ranks,
                                         .plan_describe = plan_describe,
                                         .plan_probes = plan_probes};
