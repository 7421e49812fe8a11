/*
 * The layout-invariant kind (kinds.h): --layout-invariant N sums every
 * gradient in one order whatever the layout: the micro-batch tree on top of
 * the stack (invariant.h), the data-parallel sums in the tree
 * (loom_comm_set_tree_sums), the model's exact pieces in N parts over the
 * tensor-parallel ranks (layers/tp_exact.h), the gradient norm in integers.
 * Its settings' rules, and the tensor-parallel sizes the planner may try.
 */
#include <stdio.h>

#include "base/log.h"
#include "base/mem.h"
#include "config/config.h"
#include "parallel/invariant.h"
#include "parallel/kinds.h"

#define F(field) offsetof(struct loom_config, field)
#define NAME(field) loom_config_name_of(cfg, F(field))

static int resolve(struct loom_config *cfg)
{
    if (cfg->layout_invariant && cfg->layout_invariant % cfg->tensor_model_parallel_size)
        return loom_error_set(
            LOOM_ERR_INPUT, "%s %d is not a multiple of %s %d: each tensor-parallel rank takes whole pieces",
            NAME(layout_invariant), cfg->layout_invariant, NAME(tensor_model_parallel_size),
            cfg->tensor_model_parallel_size);
    if (cfg->layout_invariant && cfg->grad_reduce_dtype != LOOM_REDUCE_FP32)
        return loom_error_set(LOOM_ERR_INPUT, "%s sums the gradients in float32: %s must be fp32",
                              NAME(layout_invariant), NAME(grad_reduce_dtype));
    if (cfg->layout_invariant && cfg->fp8_format != LOOM_FP8_OFF)
        return loom_error_set(LOOM_ERR_INPUT, "%s does not take fp8 yet (%s)", NAME(layout_invariant),
                              NAME(fp8_format));
    return LOOM_OK;
}

static void shape(const struct loom_config *cfg, int world, struct loom_layout_shape *s)
{
    (void)world;
    s->exact_sums = cfg->layout_invariant > 0;
}

/* On top of the stack: each micro-batch's own gradient, summed in the tree. */
static int build(struct loom_kind_build *b, void **state)
{
    const struct loom_config *cfg = b->cfg;
    if (!cfg->layout_invariant) return LOOM_OK;
    struct loom_invariant *x = loom_alloc(sizeof *x, LOOM_MEM_OTHER);
    *state = x;
    loom_invariant_init(x, b->model, cfg->gradient_accumulation_steps, cfg->layout_invariant);
    return LOOM_OK;
}

static void release(void *state)
{
    loom_invariant_free(state);
    loom_free(state);
}

/* N takes tensor-parallel sizes dividing it. */
static int plan_accepts(const struct loom_plan_space *s, const struct loom_kind_choice *l)
{
    const int n = s->base->layout_invariant;
    return !n || n % l[LOOM_KIND_TENSOR].value == 0;
}

const struct loom_kind loom_kind_invariant = {.name = "invariant",
                                              .group = LOOM_GROUP_WORLD,
                                              .resolve = resolve,
                                              .shape = shape,
                                              .build = build,
                                              .release = release,
                                              .plan_accepts = plan_accepts};
