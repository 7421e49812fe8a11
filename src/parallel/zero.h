/*
 * ZeRO (sharded data parallelism), stages 0-2. The parameter arena is padded
 * to equal shards; rank r of dp owns elements [r*S, (r+1)*S).
 *
 * - stage 0: DDP (ddp.c averages the gradients); one optimizer over all.
 * - stage 1: DDP for the gradients; the AdamW state covers this rank's shard
 *   only, each rank updates its shard and the parameters are all-gathered
 *   in place after the step.
 * - stage 2: gradients too. There is no full gradient arena: before a
 *   block's backward a transient buffer (counted under comm) receives its
 *   gradient, and as soon as the block is done the buffer is reduce-scattered
 *   into the owners' shards and freed (at most two layers in flight besides
 *   the embedding block, which the tied LM head keeps busy from the first
 *   backward kernel to the last). Every micro-batch reduces; the shard
 *   accumulates. The gradient norm is the all-reduced sum of the shards'.
 *
 * - stage 3: parameters too. Each rank keeps only its shard of the
 *   parameters; the blocks are grouped into gather units (one block each, or
 *   consecutive blocks holding at least --zero3-min-params parameters, FSDP's
 *   size-based wrap), and a unit is all-gathered into a transient buffer
 *   before its forward and again before its backward, then freed. The next
 *   unit's gather is posted as soon as the current one starts computing
 *   (FSDP's forward and backward prefetch), so it arrives during compute.
 *   The unit holding the embedding stays gathered from the forward's start
 *   to the optimizer step: the tied LM head needs wte at both ends. Without
 *   --load, no rank ever holds the whole model: weights are initialised
 *   unit by unit.
 *
 * Mixed precision: the stored parameters (arena or shard, gathered units) and
 * the reduced gradient shard are 16-bit; gradients travel in float32 (the
 * reduce dtype) and are rounded once as they land in the shard.
 */
#ifndef LOOM_PARALLEL_ZERO_H
#define LOOM_PARALLEL_ZERO_H

#include <stddef.h>
#include <stdint.h>

#include "base/dtype.h"
#include "comm/comm.h"
#include "loom/model.h"

struct loom_zero_flight; /* a block's gradient on its way to the shards */
struct loom_zero_unit;   /* stage 3: blocks gathered together */

struct loom_zero {
    int stage, dp, dp_rank;
    enum loom_dtype dtype; /* the model's: float32, or the 16-bit dtype of mixed precision */
    enum loom_dtype
        reduce16; /* stages 2-3: LOOM_DTYPE_BF16/LOOM_DTYPE_F16 to reduce-scatter in 16 bits; 0: float32 */
    size_t shard; /* elements per rank (the padded arena / dp) */
    size_t begin, end; /* this rank's elements of the arena, end clipped to the parameters */
    struct loom_model *model;
    /* stage 2 */
    float *grad_shard; /* (shard) this rank's reduced gradients (mixed precision: the float32 accumulator, or
                          NULL) */
    uint16_t *grad_shard_lp;          /* (shard) the same under mixed precision */
    struct loom_zero_flight *flights; /* (nblocks) */
    int *order, norder;               /* blocks posted, oldest first */
    int *counts, *displs;             /* (dp) scratch */
    size_t *block_lo;                 /* (nblocks) each block's offset in the (unsharded) arena */
    /* stage 3 */
    float *param_shard;       /* (shard) this rank's parameters */
    uint16_t *param_shard_lp; /* (shard) the same under mixed precision */
    struct loom_zero_unit *units;
    int nunits, pinned; /* the unit holding block 0 */
    int *unit_of;       /* (nblocks) */
    double wait_s;      /* this step's time blocked on gathers and reductions (stages 2-3) */
};

/* The arena multiple a model must be created with for this layout. */
size_t loom_zero_arena_multiple(int stage, int dp);
/* At stage 3 the model's parameter arena (initialised or loaded, identical on
 * every rank) is split: this rank keeps its shard and the arena is freed.
 * min_params: the stage-3 gather unit size (0: one block per unit). */
void loom_zero_init(struct loom_zero *z, int stage, int dp, int dp_rank, struct loom_model *m,
                    int64_t min_params);
/* Stage 3 on a model created without a parameter arena: each rank builds
 * one gather unit at a time (the initialisation draws per tensor, so every
 * rank computes the same values) and keeps its shard of it. */
void loom_zero_init_weights(struct loom_zero *z, uint64_t seed);
void loom_zero_free(struct loom_zero *z);

/* Step boundaries: zero the shard's gradients; after the last micro-batch's
 * backward, wait for every reduction. */
void loom_zero_begin_step(struct loom_zero *z);
void loom_zero_finish_backward(struct loom_zero *z);
/* Mixed precision with gradient accumulation, stages 2-3: the micro-batches'
 * reduced gradients accumulate in a float32 shard, rounded into the 16-bit
 * shard once after the last (as DeepSpeed's bf16 optimizer accumulates in
 * float32), so layouts that split the batch differently round the same sum. */
void loom_zero_accumulate_f32(struct loom_zero *z);
/* Stages 2-3 under mixed precision: reduce-scatter the gradients in the
 * 16-bit dtype (--grad-reduce-dtype), each rank's block gradient rounded once. */
void loom_zero_reduce_in(struct loom_zero *z, enum loom_dtype dt);
/* Global gradient norm (over shards at stage 2). */
double loom_zero_grad_norm(const struct loom_zero *z);
/* Parameters and gradients of this rank's elements [begin, end), for the
 * optimizer: float32, or (the _lp pair) the 16-bit ones of mixed precision. */
float *loom_zero_params(const struct loom_zero *z);
const float *loom_zero_grads(const struct loom_zero *z);
uint16_t *loom_zero_params_lp(const struct loom_zero *z);
const uint16_t *loom_zero_grads_lp(const struct loom_zero *z);
/* After the optimizer step: stages 1-2 all-gather the new parameters; stage 3
 * lets go of the pinned unit (it is gathered afresh next time). */
void loom_zero_after_step(struct loom_zero *z);
#endif
