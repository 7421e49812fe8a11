/* Schedules of one step's micro-batches (see schedule.h). */
#include "parallel/schedule.h"

#include "base/log.h"

int loom_schedule_no_pipelining(const struct loom_schedule_ops *ops, void *ctx, int micro_batches)
{
    for (int a = 0; a < micro_batches; a++) {
        const void *batch;
        int rows;
        int rc = ops->get_batch(ctx, a, &batch, &rows);
        if (rc) return rc;
        ops->forward(ctx, a, 0, batch, rows);
        ops->backward(ctx, a, 0);
    }
    return LOOM_OK;
}

loom_schedule_fn loom_schedule_for(int pp)
{
    LOOM_ASSERT(pp == 1); /* pipeline schedules: not in this version (the engine refuses pp > 1) */
    return loom_schedule_no_pipelining;
}

int loom_schedule_slots(int pp, int micro_batches)
{
    (void)micro_batches;
    LOOM_ASSERT(pp == 1);
    return 1;
}

const char *loom_schedule_name(int pp)
{
    return pp == 1 ? "no pipelining" : "?";
}
