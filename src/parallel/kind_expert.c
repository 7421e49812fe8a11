/*
 * The expert-parallel kind (kinds.h): --expert-model-parallel-size E splits
 * each MoE layer's experts over E consecutive data-parallel ranks
 * (layers/experts.h), whose tokens meet their experts through
 * --moe-token-dispatcher-type's moves. Its ranks are carved from the
 * data-parallel group, as Megatron carves them: every rank still reads its
 * own rows of the batch; the dense tensors' gradients are summed over the
 * data-parallel group and the experts' over their expert-data-parallel
 * group (dp / E ranks that hold the same experts: ddp.c's runs; ZeRO's
 * shards are over that group, zero.h), and the gradient norm adds the
 * expert ranks' experts (engine.c). Here: its
 * settings' rules, its share of the shape, its strategy's waits and
 * description, its moves in the time model, the planner's (the user's
 * size, or every size dividing the experts and the data-parallel ranks).
 */
#include <stdio.h>

#include "base/log.h"
#include "config/config.h"
#include "layers/experts.h"
#include "parallel/kinds.h"

/* The token moves block the layer: all of their time is exposed. */
static double comm_wait_s(void *ctx)
{
    (void)ctx;
    return loom_ep_comm_take_s();
}

static void describe(void *ctx, char *buf, size_t n)
{
    const struct loom_config *cfg = ctx;
    const int ep = cfg->expert_model_parallel_size, local = cfg->num_experts / ep;
    const int rank = loom_ep_group_rank();
    snprintf(buf, n,
             "expert parallelism: rank %d of %d holds experts %d-%d of each MoE layer's %d, tokens moved by "
             "%s; the experts' gradients summed over the ranks that hold them",
             rank, ep, rank * local, (rank + 1) * local - 1, cfg->num_experts,
             cfg->moe_token_dispatcher_type == LOOM_MOE_DISPATCH_ALLGATHER
                 ? "all-gather, the outputs reduce-scattered"
                 : "all-to-all");
}

static const struct loom_strategy ep_strategy = {
    .name = "ep", .comm_wait_s = comm_wait_s, .describe = describe};

static int build(struct loom_kind_build *b, void **state)
{
    (void)state;
    if (b->topo->ep > 1) loom_model_push_strategy(b->model, &ep_strategy, (void *)b->cfg);
    return LOOM_OK;
}

#define F(field) offsetof(struct loom_config, field)
#define NAME(field) loom_config_name_of(cfg, F(field))

static int resolve(struct loom_config *cfg)
{
    const int ep = cfg->expert_model_parallel_size;
    if (ep <= 1) return LOOM_OK;
    if (cfg->num_experts <= 0)
        return loom_error_set(LOOM_ERR_INPUT, "%s %d splits experts, and the model has none (%s 0)",
                              NAME(expert_model_parallel_size), ep, NAME(num_experts));
    if (cfg->num_experts % ep)
        return loom_error_set(LOOM_ERR_INPUT, "%s %d does not divide %s %d: every rank holds as many experts",
                              NAME(expert_model_parallel_size), ep, NAME(num_experts), cfg->num_experts);
    return LOOM_OK;
}

static void shape(const struct loom_config *cfg, int world, struct loom_layout_shape *s)
{
    (void)world;
    s->ep = cfg->expert_model_parallel_size > 1 ? cfg->expert_model_parallel_size : 1;
}

/* Each MoE layer moves a rank's dispatched rows (k choices of each of its
 * B T rows, an activation's worth each) out and back in the forward, and
 * their gradients in the backward: four all-to-alls of (ep - 1) / ep of
 * k activations; full recomputation repeats the forward's. None of it
 * hidden. */
static struct loom_time_terms time_terms(const struct loom_time_in *in)
{
    const struct loom_layout_shape *s = in->shape;
    const struct loom_config *cfg = in->cfg;
    const int ep = s->ep;
    if (ep <= 1 || cfg->num_experts <= 0) return (struct loom_time_terms){0, 0};
    double bw, lat;
    loom_time_link(in, s->tp * ep, &bw, &lat);
    struct loom_moe_layers ml;
    if (loom_moe_layers_parse(cfg->moe_layer_freq, &ml)) ml = (struct loom_moe_layers){.freq = 1};
    const double layers = (double)loom_moe_layers_count(&ml, cfg->num_layers) / s->pp,
                 passes = in->full ? 6 : 4, share = (double)(ep - 1) / ep;
    const double t = passes * (in->act * cfg->moe_router_topk * share / bw + (ep - 1) * lat);
    return (struct loom_time_terms){0, layers * cfg->gradient_accumulation_steps * t};
}

/* The user's size, where it divides the data-parallel ranks the kinds
 * before it leave; not given, every size dividing both those ranks and
 * the experts (1 for a model without experts). */
static int plan_choices(const struct loom_plan_space *s, const struct loom_kind_choice *l, int slot, int left,
                        int *out)
{
    (void)l, (void)slot;
    const struct loom_config *b = s->base;
    const int fix = loom_plan_space_fixed(s, "--expert-model-parallel-size"),
              given = b->expert_model_parallel_size > 1 ? b->expert_model_parallel_size : 1;
    int n = 0;
    for (int ep = 1; ep <= left; ep++) {
        if (left % ep || (fix || b->num_experts <= 0 ? ep != given : b->num_experts % ep)) continue;
        LOOM_ASSERT(n < LOOM_KIND_MAX_CHOICES);
        out[n++] = ep;
    }
    return n;
}

static void plan_apply(struct loom_config *cfg, const struct loom_kind_choice *c)
{
    cfg->expert_model_parallel_size = c->value;
}

static void plan_describe(const struct loom_kind_choice *c, char *buf, size_t n)
{
    if (c->value > 1) snprintf(buf, n, ", EP %d", c->value);
}

static void plan_flags(const struct loom_kind_choice *c, char *buf, size_t n)
{
    if (c->value > 1) snprintf(buf, n, " --expert-model-parallel-size %d", c->value);
}

/* Its rank 0: every expert rank holds as many experts. */
static int plan_probes(const struct loom_kind_choice *c, struct loom_topology *t, int probe)
{
    (void)probe;
    t->ep = c->value;
    t->ep_rank = 0;
    return 1;
}

const struct loom_kind loom_kind_expert = {.name = "expert",
                                           .group = LOOM_GROUP_EP,
                                           .resolve = resolve,
                                           .shape = shape,
                                           .build = build,
                                           .time = time_terms,
                                           .plan_slots = 1,
                                           .plan_choices = plan_choices,
                                           .plan_apply = plan_apply,
                                           .plan_describe = plan_describe,
                                           .plan_flags = plan_flags,
                                           .plan_probes = plan_probes};
