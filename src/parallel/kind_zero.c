/*
 * The ZeRO kind (kinds.h): --zero-stage, FSDP's and Megatron's names for
 * its stages, what each stage shards over the data-parallel group, the
 * zero-N strategy (zero.h), and the stage the planner chooses. The only
 * reader of the stage besides the settings themselves.
 */
#include <assert.h>
#include <stdio.h>

#include "base/log.h"
#include "base/mem.h"
#include "config/config.h"
#include "parallel/kinds.h"
#include "parallel/zero.h"

#define F(field) offsetof(struct loom_config, field)
#define NAME(field) loom_config_name_of(cfg, F(field))

/* FSDP's names (each means one stage); Megatron's distributed optimizer
 * (ZeRO-1); ZeRO-Infinity's parameter offload (stage 3). */
static int resolve(struct loom_config *cfg)
{
    static const int stage_of[] = {
        [LOOM_FSDP_NONE] = 0,
        [LOOM_FSDP_FULL_SHARD] = 3,
        [LOOM_FSDP_SHARD_GRAD_OP] = 2,
        [LOOM_FSDP_NO_SHARD] = 0,
    };
    static_assert(sizeof stage_of / sizeof stage_of[0] == LOOM_FSDP_STRATEGY_COUNT, "stage_of");
    if (cfg->fsdp_sharding_strategy != LOOM_FSDP_NONE) {
        const int want = stage_of[cfg->fsdp_sharding_strategy];
        if (loom_config_given_at(cfg, F(zero_stage)) && cfg->zero_stage != want)
            return loom_error_set(
                LOOM_ERR_INPUT, "--fsdp-sharding-strategy %s means --zero-stage %d, but %s %d is given",
                loom_config_choice_of(F(fsdp_sharding_strategy), cfg->fsdp_sharding_strategy), want,
                NAME(zero_stage), cfg->zero_stage);
        cfg->zero_stage = want;
        loom_config_set_derived(cfg, F(zero_stage));
    }
    if (cfg->use_distributed_optimizer) {
        if (loom_config_given_at(cfg, F(zero_stage)) && cfg->zero_stage != 1)
            return loom_error_set(
                LOOM_ERR_INPUT,
                "%s is ZeRO-1 (the optimizer state sharded over the data-parallel group), but "
                "%s %d is given",
                NAME(use_distributed_optimizer), NAME(zero_stage), cfg->zero_stage);
        cfg->zero_stage = 1;
        if (!loom_config_given_at(cfg, F(zero_stage))) loom_config_set_derived(cfg, F(zero_stage));
    }
    if (cfg->offload_param == LOOM_OFFLOAD_NVME) {
        if (cfg->zero_stage != 3)
            return loom_error_set(LOOM_ERR_INPUT,
                                  "%s nvme needs %s 3 (the parameters are sharded there), not %d",
                                  NAME(offload_param), NAME(zero_stage), cfg->zero_stage);
        if (cfg->offload_optimizer != LOOM_OFFLOAD_NVME)
            return loom_error_set(
                LOOM_ERR_INPUT,
                "%s nvme needs %s nvme: a shard offloaded is updated by an optimizer streaming "
                "its state",
                NAME(offload_param), NAME(offload_optimizer));
        if (!*cfg->param_nvme_path)
            snprintf(cfg->param_nvme_path, sizeof cfg->param_nvme_path, "%s", cfg->nvme_path);
    }
    return LOOM_OK;
}

/* Stage 1 the optimizer state, 2 the gradients too, 3 the parameters too. */
static void shape(const struct loom_config *cfg, int world, struct loom_layout_shape *s)
{
    (void)world;
    const int stage = cfg->zero_stage;
    s->shard_optimizer = stage >= 1;
    s->shard_grads = stage >= 2;
    s->shard_params = stage == 3;
    s->arena_multiple = loom_zero_arena_multiple(stage, s->dp);
}

/* zero-N, above DDP (which reduces the gradients below stage 2). */
static int build(struct loom_kind_build *b, void **state)
{
    const struct loom_config *cfg = b->cfg;
    struct loom_model *m = b->model;
    const int stage = cfg->zero_stage;
    if (stage < 1) return LOOM_OK;
    /* checked with the config: F32, or the compute dtype */
    const enum loom_dtype reduce = (enum loom_dtype)cfg->grad_reduce_dtype;
    const int accumulate_f32 = m->dtype != LOOM_DTYPE_F32 && cfg->gradient_accumulation_steps > 1;
    struct loom_zero *z = loom_alloc(sizeof *z, LOOM_MEM_OTHER);
    *state = z;
    int dp, dp_rank; /* over the ranks that hold the same experts, with expert parallelism */
    loom_zero_ranks(b->topo, &dp, &dp_rank);
    const int rc = loom_zero_init(z, stage, dp, dp_rank, m, cfg->zero3_min_params,
                                  stage >= 2 ? reduce : LOOM_DTYPE_F32, stage >= 2 && accumulate_f32,
                                  cfg->offload_param == LOOM_OFFLOAD_NVME ? cfg->param_nvme_path : NULL,
                                  b->topo->ep, b->topo->ep_rank);
    if (rc == LOOM_OK && b->topo->ep > 1) loom_zero_experts_apart(z, b->shape->exact_sums);
    return rc;
}

static void release(void *state)
{
    loom_zero_free(state);
    loom_free(state);
}

/* Stages 0-3 once the data-parallel group has two ranks. */
static int plan_choices(const struct loom_plan_space *s, const struct loom_kind_choice *l, int slot, int left,
                        int *out)
{
    (void)slot, (void)left;
    const int fix = loom_plan_space_fixed(s, "--zero-stage"), dp = l[LOOM_KIND_DATA].value;
    int n = 0;
    for (int z = 0; z <= (dp > 1 ? 3 : 0); z++)
        if (!fix || z == s->base->zero_stage) out[n++] = z;
    return n;
}

static void plan_apply(struct loom_config *cfg, const struct loom_kind_choice *c)
{
    cfg->zero_stage = c->value;
    cfg->fsdp_sharding_strategy = LOOM_FSDP_NONE;
}

static void plan_describe(const struct loom_kind_choice *c, char *buf, size_t n)
{
    if (c->value) snprintf(buf, n, ", ZeRO-%d", c->value);
}

static void plan_flags(const struct loom_kind_choice *c, char *buf, size_t n)
{
    snprintf(buf, n, " --zero-stage %d", c->value);
}

const struct loom_kind loom_kind_zero = {.name = "zero",
                                         .group = LOOM_GROUP_DP,
                                         .resolve = resolve,
                                         .shape = shape,
                                         .build = build,
                                         .release = release,
                                         .plan_slots = 1,
                                         .plan_choices = plan_choices,
                                         .plan_apply = plan_apply,
                                         .plan_describe = plan_describe,
                                         .plan_flags = plan_flags};
