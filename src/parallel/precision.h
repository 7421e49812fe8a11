/*
 * Mixed precision as a strategy (FSDP's MixedPrecision, DeepSpeed's
 * bf16/fp16, Megatron's --bf16/--fp16), on a backend whose kernels compute
 * in float32: the stored parameters and gradients are 16-bit (the model's
 * arenas, or a ZeRO shard), and a block gets float32 working views only
 * while it is in use. It sits last on the stack, next to the kernels:
 *
 * - pre_forward: its parameters converted into a pooled float32 buffer
 *   (after the strategies before it, e.g. ZeRO-3's gather of the 16-bit
 *   unit); post_forward: the buffer goes back. The block holding a tied
 *   embedding (used again by the LM head and its backward) keeps its copy
 *   from the forward to the end of the step.
 * - pre_backward: the parameters again, and a float32 gradient buffer
 *   unless a strategy before it provided one (ZeRO-2/3 always; DDP in the
 *   backward that reduces when there is no accumulation, so the sum is
 *   rounded once in every layout): a slice of the model's float32
 *   accumulator (grad_acc) with gradient accumulation, else a zeroed pooled
 *   buffer. The owner is recorded on the block (loom_block_provide_grads).
 * - grads_ready: a gradient buffer of its own is added into the 16-bit
 *   gradients (rounded); with gradient accumulation (the model's float32
 *   grad_acc) the block accumulates there instead, rounded once per step.
 *   A strategy's buffer is reduced in float32 by that strategy.
 *
 * So parameters and gradients cost 2 bytes each, as the ZeRO paper counts;
 * the optimizer keeps float32 master weights (optim/adamw.c). Not here:
 * activations (the model rounds its own, e.g. GPT-2's act_dtype), loss
 * scaling (engine.c, optim/loss_scaler.c).
 */
#ifndef LOOM_PARALLEL_PRECISION_H
#define LOOM_PARALLEL_PRECISION_H

#include "base/dtype.h"
#include "loom/model.h"
#include "parallel/stack.h"

struct loom_precision {
    struct loom_model *model;
    enum loom_dtype dtype;
    int pinned;                            /* the tied embedding's block (kept for the step), or -1 */
    int index;                             /* this strategy's place on the stack */
    float **replay_params, **replay_grads; /* (nblocks) the footprint's replay: copies held */
};

/* Pushes the strategy on m's stack (last: next to the kernels). */
void loom_precision_init(struct loom_precision *p, struct loom_model *m);
void loom_precision_free(struct loom_precision *p);

#endif
