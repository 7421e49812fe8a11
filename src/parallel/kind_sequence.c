/*
 * The sequence-parallel kind (kinds.h): --sequence-parallel splits the rows
 * between the tensor-parallel regions over the tensor-parallel group (the
 * layers' gathers and reduce-scatters, layers/tp_regions.h); its settings'
 * rules, its share of the time model's row work, the planner's switch.
 */
#include <stdio.h>

#include "base/log.h"
#include "config/config.h"
#include "parallel/kinds.h"

#define F(field) offsetof(struct loom_config, field)
#define NAME(field) loom_config_name_of(cfg, F(field))

static int resolve(struct loom_config *cfg)
{
    if (cfg->sequence_parallel && cfg->tensor_model_parallel_size < 2)
        return loom_error_set(LOOM_ERR_INPUT,
                              "%s splits the sequence within a tensor-parallel group: it needs %s 2 or more",
                              NAME(sequence_parallel), NAME(tensor_model_parallel_size));
    if (cfg->sequence_parallel && cfg->seq_length % cfg->tensor_model_parallel_size)
        return loom_error_set(LOOM_ERR_INPUT, "%s: %s %d is not divisible by %s %d", NAME(sequence_parallel),
                              NAME(seq_length), cfg->seq_length, NAME(tensor_model_parallel_size),
                              cfg->tensor_model_parallel_size);
    return LOOM_OK;
}

static void shape(const struct loom_config *cfg, int world, struct loom_layout_shape *s)
{
    (void)world;
    if (cfg->sequence_parallel) s->row_ways = s->tp;
}

/* Off, and on where there is a tensor-parallel group. */
static int plan_choices(const struct loom_plan_space *s, const struct loom_kind_choice *l, int slot, int left,
                        int *out)
{
    (void)slot, (void)left;
    const int fix = loom_plan_space_fixed(s, "--sequence-parallel");
    int n = 0;
    for (int sp = 0; sp <= (l[LOOM_KIND_TENSOR].value > 1); sp++)
        if (!fix || sp == s->base->sequence_parallel) out[n++] = sp;
    return n;
}

static void plan_apply(struct loom_config *cfg, const struct loom_kind_choice *c)
{
    cfg->sequence_parallel = c->value;
}

static void plan_describe(const struct loom_kind_choice *c, char *buf, size_t n)
{
    if (c->value) snprintf(buf, n, ", SP");
}

static void plan_flags(const struct loom_kind_choice *c, char *buf, size_t n)
{
    if (c->value) snprintf(buf, n, " --sequence-parallel");
}

const struct loom_kind loom_kind_sequence = {.name = "sequence",
                                             .group = LOOM_GROUP_TP,
                                             .resolve = resolve,
                                             .shape = shape,
                                             .plan_slots = 1,
                                             .plan_choices = plan_choices,
                                             .plan_apply = plan_apply,
                                             .plan_describe = plan_describe,
                                             .plan_flags = plan_flags};
