/*
 * Schedules: the order in which one step's micro-batches run forward and
 * backward through this rank's blocks. A schedule calls back into the
 * engine for each micro-batch (its batch, its forward into a slot, its
 * backward from that slot); the engine does the stack's step-level calls
 * and the loss weighting. Today: no pipelining (pp = 1), the whole model
 * per micro-batch in one slot. Pipeline schedules (GPipe, 1F1B,
 * interleaved) go here, each a named function with its warmup, steady
 * state and cooldown phases marked, and p2p helpers that do nothing at the
 * first and last stage. Not here: the step itself (reduce, clip, update).
 */
#ifndef LOOM_PARALLEL_SCHEDULE_H
#define LOOM_PARALLEL_SCHEDULE_H

/* What a schedule drives, provided by the engine. Statuses are LOOM_OK or
 * an error every rank agrees on. */
struct loom_schedule_ops {
    /* Micro-batch `micro` (0-based in the step): its batch and rows. */
    int (*get_batch)(void *ctx, int micro, const void **batch, int *rows);
    /* Forward of the micro-batch just fetched into activation slot `slot`. */
    void (*forward)(void *ctx, int micro, int slot, const void *batch, int rows);
    /* Backward of micro-batch `micro`, whose activations are in `slot`. */
    void (*backward)(void *ctx, int micro, int slot);
};

typedef int (*loom_schedule_fn)(const struct loom_schedule_ops *ops, void *ctx, int micro_batches);

/* pp = 1: every micro-batch forward then backward, in slot 0 (Megatron's
 * forward_backward_no_pipelining). */
int loom_schedule_no_pipelining(const struct loom_schedule_ops *ops, void *ctx, int micro_batches);

/* The schedule for a layout (Megatron's get_forward_backward_func), and the
 * activation slots it keeps in flight. */
loom_schedule_fn loom_schedule_for(int pp);
int loom_schedule_slots(int pp, int micro_batches);
/* "no pipelining" */
const char *loom_schedule_name(int pp);

#endif
