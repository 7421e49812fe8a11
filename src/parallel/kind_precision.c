/*
 * The mixed-precision kind (kinds.h): under --bf16 or --fp16 the model's
 * arenas are 16-bit (the engine's state dtype) and the precision strategy
 * (precision.h) gives the blocks their float32 working copies, last on the
 * stack below the invariant tree. Its settings' rules are the run's own
 * (config/resolve.c: the compute dtype, the reduction's, the loss scale);
 * the planner searches precision itself, among its own choices.
 */
#include "base/log.h"
#include "base/mem.h"
#include "parallel/kinds.h"
#include "parallel/precision.h"

static int build(struct loom_kind_build *b, void **state)
{
    if (b->model->dtype == LOOM_DTYPE_F32) return LOOM_OK;
    struct loom_precision *p = loom_alloc(sizeof *p, LOOM_MEM_OTHER);
    *state = p;
    loom_precision_init(p, b->model);
    return LOOM_OK;
}

static void release(void *state)
{
    loom_precision_free(state);
    loom_free(state);
}

const struct loom_kind loom_kind_precision = {
    .name = "precision", .group = LOOM_GROUP_WORLD, .build = build, .release = release};
