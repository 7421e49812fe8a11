/*
 * The embedding group (Megatron's, comm.h's LOOM_GROUP_EMBEDDING): a tied
 * token embedding whose LM head is on another pipeline stage
 * (loom/model.h's struct loom_tied_stages). The embedding's stage trains
 * the table; the head's stage keeps a copy that it does not train.
 *
 * The strategy "tied", next to the kernels on both stages' stacks:
 *   - the table: the embedding's stage sends it (float32, as its kernels
 *     read it) at its first forward of every step and of every evaluation;
 *     the head's stage receives it before its first forward there;
 *   - the gradient: the head's stage sends the copy's gradient, summed over
 *     the step's micro-batches, after the head's last backward; the
 *     embedding's stage adds it to the table's gradient when the
 *     embedding's last backward completes it, before any strategy reduces
 *     it. So the table is trained once, by the stage that owns it, and the
 *     optimizer, checkpoints and the gradient norm see it once;
 *   - under --layout-invariant every micro-batch's share goes on its own
 *     (from a copy of its own) and is added before that micro-batch's
 *     lookup, as one process sums the table's gradient.
 * The sends do not block; loom_tied_stages_flush waits for them (the
 * pipeline's strategy at the step's end, the engine after an evaluation).
 * Not here: where the copy lives (the model's), the stages' schedules.
 */
#ifndef LOOM_PARALLEL_TIED_STAGES_H
#define LOOM_PARALLEL_TIED_STAGES_H

#include "parallel/kinds.h"

/* Pushes the strategy when the model holds an end of a tied table across
 * stages; *state what loom_tied_stages_release frees. */
int loom_tied_stages_build(struct loom_kind_build *b, void **state);
void loom_tied_stages_release(void *state);
/* Waits for the sends in flight; the seconds it waited. */
double loom_tied_stages_flush(void);

#endif
