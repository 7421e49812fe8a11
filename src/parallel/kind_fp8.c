/*
 * The fp8 kind (kinds.h): --fp8-format's linear layers (layers/fp8_linear.h,
 * built into the model by its family). Its strategy, "fp8", steps their
 * delayed scaling after each update: every rank's amaxes reduced, the
 * histories pushed, the next step's scales. Its settings' rules are the
 * run's own (config/resolve.c: fp8 needs bf16).
 */
#include <stdio.h>

#include "base/log.h"
#include "layers/fp8_linear.h"
#include "parallel/kinds.h"

static void after_step(void *ctx)
{
    loom_fp8_step_end(ctx);
}

static void describe(void *ctx, char *buf, size_t n)
{
    const struct loom_fp8 *f = ctx;
    snprintf(buf, n, "fp8: the scales of %d linear layers from every rank's amaxes, after each step", f->n);
}

static const struct loom_strategy fp8_strategy = {
    .name = "fp8", .after_step = after_step, .describe = describe};

static int build(struct loom_kind_build *b, void **state)
{
    (void)state;
    if (b->model->fp8) loom_model_push_strategy(b->model, &fp8_strategy, b->model->fp8);
    return LOOM_OK;
}

const struct loom_kind loom_kind_fp8 = {.name = "fp8", .group = LOOM_GROUP_WORLD, .build = build};
