/*
 * Mixed precision around a model's blocks (FSDP's MixedPrecision,
 * DeepSpeed's bf16/fp16, Megatron's --bf16/--fp16), on a CPU backend whose
 * kernels compute in float32: the stored parameters and gradients are 16-bit
 * (the model's params_lp/grads_lp, or a ZeRO shard), and a block gets
 * float32 working copies only while it is in use:
 *
 * - forward begin: its parameters converted into a pooled float32 buffer
 *   (after the strategy's hook, which under ZeRO-3 gathers the 16-bit unit);
 *   forward end: the buffer goes back. The block holding a tied embedding
 *   (GPT-2's wte, used again by the LM head and its backward) keeps its copy
 *   from the forward to the end of the step.
 * - backward begin: the parameters again, and a zeroed float32 gradient
 *   buffer unless the strategy provides one (ZeRO-2/3 always; DDP in the
 *   backward that reduces, so the sum is rounded once in every layout).
 * - grads ready: if the float32 gradient buffer is ours, the block's
 *   gradient is added into the 16-bit gradients
 *   (rounded); a strategy's buffer is reduced in float32 by the strategy.
 *   With gradient accumulation (the model has a float32 gradient arena as
 *   well), the block accumulates there instead, rounded once per step.
 *
 * So parameters and gradients cost 2 bytes each, as the ZeRO paper counts;
 * the optimizer keeps float32 master weights (optim/adamw.c). The strategies'
 * hooks are called from these. Not here: activations (the model rounds its
 * own, e.g. GPT-2's act_dtype), loss scaling (engine.c, optim/loss_scaler.c).
 */
#ifndef LOOM_ENGINE_PRECISION_H
#define LOOM_ENGINE_PRECISION_H

#include "base/dtype.h"
#include "loom/model.h"

struct loom_precision {
    struct loom_model *model;
    enum loom_dtype dtype;
    int pinned;     /* the tied embedding's block (kept for the step), or -1 */
    int *own_grads; /* (nblocks) the block's float32 gradient buffer is ours (else a strategy's) */
    loom_block_hook pre_forward, post_forward, pre_backward, grad_ready; /* the strategy's */
    void *ctx;
};

/* Installs the layer in front of the hooks the strategy installed. */
void loom_precision_init(struct loom_precision *p, struct loom_model *m);
/* After the optimizer step: lets go of the pinned block. */
void loom_precision_end_step(struct loom_precision *p);
void loom_precision_free(struct loom_precision *p);

#endif
