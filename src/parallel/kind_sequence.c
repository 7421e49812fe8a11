/*
 * The sequence-parallel kind (kinds.h): --sequence-parallel splits the rows
 * between the tensor-parallel regions over the tensor-parallel group (the
 * layers' gathers and reduce-scatters, layers/tp_regions.h); its settings'
 * rules, its share of the time model's row work, the planner's switch.
 *
 * Its strategy, "sp", next to the kernels: a tensor every tp rank holds
 * whole but whose gradient each computes from its own rows (the norms) has
 * that gradient in parts (loom/model.h's partial_grads); at each block's
 * grads_ready the parts are summed over the group and added, float32 ones
 * by float addition, --layout-invariant's float64 ones exactly and rounded
 * once, before any strategy reads the block's gradient (Megatron's
 * layernorm all-reduce in finalize_model_grads, here per micro-batch so a
 * step sums as it always did).
 */
#include <stdio.h>

#include "base/log.h"
#include "comm/comm.h"
#include "config/config.h"
#include "kernels/backend.h"
#include "layers/tp_regions.h"
#include "parallel/kinds.h"

static void grads_ready(void *ctx, int block)
{
    struct loom_model *m = ctx;
    if (block < 0) return; /* the tied head's event: no block's end */
    const struct loom_partial_grad *p;
    const int n = m->ops->partial_grads(m, &p);
    const struct loom_kernels *k = m->backend->k;
    for (int i = 0; i < n; i++) {
        if (p[i].dtype == LOOM_DTYPE_F32) {
            loom_tp_allreduce(p[i].part, p[i].n, LOOM_OP_SUM);
            k->accumulate(p[i].grad, p[i].part, p[i].n);
        } else {
            LOOM_ASSERT(p[i].dtype == LOOM_DTYPE_F64);
            loom_tp_wait(loom_comm_allreduce(LOOM_GROUP_TP, loom_buf_of(p[i].part, p[i].n, LOOM_DTYPE_F64),
                                             LOOM_OP_SUM));
            k->acc_add_rounded(p[i].grad, p[i].part, p[i].n);
        }
    }
}

static void describe(void *ctx, char *buf, size_t n)
{
    const struct loom_model *m = ctx;
    snprintf(buf, n,
             "sequence parallelism: the norms' gradients from each rank's rows, summed over the %d tp "
             "ranks as each block's backward ends",
             m->tp);
}

const struct loom_strategy loom_sequence_strategy = {
    .name = "sp", .grads_ready = grads_ready, .describe = describe};

static int build_inner(struct loom_kind_build *b, void **state)
{
    (void)state;
    if (b->cfg->sequence_parallel && b->model->ops->partial_grads)
        loom_model_push_strategy(b->model, &loom_sequence_strategy, b->model);
    return LOOM_OK;
}

#define F(field) offsetof(struct loom_config, field)
#define NAME(field) loom_config_name_of(cfg, F(field))

static int resolve(struct loom_config *cfg)
{
    if (cfg->sequence_parallel && cfg->tensor_model_parallel_size < 2) {
        if (!loom_config_given_at(cfg, F(sequence_parallel)))
            return loom_error_set(
                LOOM_ERR_INPUT,
                "%s splits the sequence within a tensor-parallel group: it needs %s 2 or more",
                NAME(sequence_parallel), NAME(tensor_model_parallel_size));
        /* as Megatron: a script's --sequence-parallel on one tensor-parallel rank is switched off */
        loom_log_warn(
            "%s has no tensor-parallel group to split the sequence in (%s %d): off, as Megatron turns "
            "it off",
            NAME(sequence_parallel), NAME(tensor_model_parallel_size), cfg->tensor_model_parallel_size);
        cfg->sequence_parallel = 0;
        loom_config_set_derived(cfg, F(sequence_parallel));
    }
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
                                             .build_inner = build_inner,
                                             .plan_slots = 1,
                                             .plan_choices = plan_choices,
                                             .plan_apply = plan_apply,
                                             .plan_describe = plan_describe,
                                             .plan_flags = plan_flags};
