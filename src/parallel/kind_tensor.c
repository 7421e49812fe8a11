/*
 * The tensor-parallel kind (kinds.h): --tensor-model-parallel-size ranks,
 * each holding its part of the split tensors (the model's, built for its
 * place in the group: layers/tp_regions.h). Its strategy, "tp", counts a
 * replicated tensor's gradient in the norm on tp rank 0 only (every tp rank
 * holds the same gradient for it) and reports the layers' blocking
 * collectives as its wait; the layers' collectives in the time model; the
 * sizes the planner tries.
 */
#include <stdio.h>

#include "base/log.h"
#include "base/mem.h"
#include "layers/tp_regions.h"
#include "parallel/kinds.h"

static void shape(const struct loom_config *cfg, int world, struct loom_layout_shape *s)
{
    (void)world;
    s->tp = cfg->tensor_model_parallel_size;
}

static int check_model(const struct loom_config *cfg, const struct loom_topology *t,
                       const struct loom_model *m, int rc)
{
    (void)cfg;
    if (rc == LOOM_OK && t->tp > 1 && (m->tp != t->tp || m->tp_rank != t->tp_rank))
        rc =
            loom_error_set(LOOM_ERR_INPUT,
                           "--tensor-model-parallel-size %d: the model %s is built for tp rank %d of %d, not "
                           "%d of %d (tensor parallelism needs a model whose tensors are split over the "
                           "group with loom_block_add_tensor_split)",
                           t->tp, m->name, m->tp_rank, m->tp, t->tp_rank, t->tp);
    return rc;
}

static int counts_tensor(void *ctx, const struct loom_tensor *t)
{
    const struct loom_model *m = ctx;
    return t->tp_split != LOOM_TP_REPLICATED || m->tp_rank == 0;
}

/* The layers' collectives block them: all of their time is exposed. */
static double comm_wait_s(void *ctx)
{
    (void)ctx;
    return loom_tp_comm_take_s();
}

static void describe(void *ctx, char *buf, size_t n)
{
    const struct loom_model *m = ctx;
    snprintf(buf, n,
             "tensor parallelism: rank %d of %d; a replicated tensor's gradient counted once in the norm "
             "(on rank 0)",
             m->tp_rank, m->tp);
}

static const struct loom_strategy tp_strategy = {
    .name = "tp", .comm_wait_s = comm_wait_s, .describe = describe, .counts_tensor = counts_tensor};

static int build(struct loom_kind_build *b, void **state)
{
    (void)state;
    if (b->topo->tp > 1) loom_model_push_strategy(b->model, &tp_strategy, b->model);
    return LOOM_OK;
}

/* Two all-reduces (or reduce-scatter + all-gather) per layer each way, per
 * micro-batch; full recomputation's second forward two more. */
static struct loom_time_terms time_terms(const struct loom_time_in *in)
{
    const struct loom_layout_shape *s = in->shape;
    if (s->tp <= 1) return (struct loom_time_terms){0, 0};
    double bw, lat;
    loom_time_link(in, s->tp, &bw, &lat);
    const int per_layer = 4 + (in->full ? 2 : 0);
    return (struct loom_time_terms){0, (double)per_layer * ((double)in->cfg->num_layers / s->pp) *
                                           in->cfg->gradient_accumulation_steps *
                                           loom_ring_allreduce_s(in->act, s->tp, bw, lat)};
}

/* Sizes dividing the world: within a node and dividing the heads, unless
 * the user gave one. */
static int plan_choices(const struct loom_plan_space *s, const struct loom_kind_choice *l, int slot, int left,
                        int *out)
{
    (void)l, (void)slot;
    const struct loom_config *b = s->base;
    const int fix = loom_plan_space_fixed(s, "--tensor-model-parallel-size");
    int n = 0;
    for (int tp = 1; tp <= left; tp++) {
        if (left % tp || (fix ? tp != b->tensor_model_parallel_size
                              : tp > s->ranks_per_node || b->num_attention_heads % tp))
            continue;
        LOOM_ASSERT(n < LOOM_KIND_MAX_CHOICES);
        out[n++] = tp;
    }
    return n;
}

static int plan_ranks(const struct loom_kind_choice *c)
{
    return c->value;
}

static void plan_apply(struct loom_config *cfg, const struct loom_kind_choice *c)
{
    cfg->tensor_model_parallel_size = c->value;
}

static void plan_describe(const struct loom_kind_choice *c, char *buf, size_t n)
{
    snprintf(buf, n, "tp %d", c->value);
}

static void plan_flags(const struct loom_kind_choice *c, char *buf, size_t n)
{
    snprintf(buf, n, " --tensor-model-parallel-size %d", c->value);
}

/* Its rank 0 (the planner counts the first part of an uneven split). */
static int plan_probes(const struct loom_kind_choice *c, struct loom_topology *t, int probe)
{
    (void)probe;
    t->tp = c->value;
    t->tp_rank = 0;
    return 1;
}

const struct loom_kind loom_kind_tensor = {.name = "tensor",
                                           .group = LOOM_GROUP_TP,
                                           .shape = shape,
                                           .check_model = check_model,
                                           .build = build,
                                           .time = time_terms,
                                           .plan_slots = 1,
                                           .plan_choices = plan_choices,
                                           .plan_ranks = plan_ranks,
                                           .plan_apply = plan_apply,
                                           .plan_describe = plan_describe,
                                           .plan_flags = plan_flags,
                                           .plan_probes = plan_probes};
