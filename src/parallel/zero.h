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
 * Not yet: stage 3 (parameters gathered per block with prefetch), offload.
 */
#ifndef LOOM_PARALLEL_ZERO_H
#define LOOM_PARALLEL_ZERO_H

#include <stddef.h>

#include "model/gpt2.h"

struct loom_zero_flight; /* a block's gradient on its way to the shards */

struct loom_zero {
    int stage, dp, dp_rank;
    size_t shard;      /* elements per rank (the padded arena / dp) */
    size_t begin, end; /* this rank's elements of the arena, end clipped to the parameters */
    struct loom_gpt2 *model;
    /* stage 2 */
    float *grad_shard; /* (shard) this rank's reduced gradients */
    struct loom_zero_flight *flights; /* (nblocks) */
    int *order, norder; /* blocks posted, oldest first */
    int *counts;        /* (dp) scratch */
};

/* The arena multiple a model must be created with for this layout. */
size_t loom_zero_arena_multiple(int stage, int dp);
void loom_zero_init(struct loom_zero *z, int stage, int dp, int dp_rank, struct loom_gpt2 *m);
void loom_zero_free(struct loom_zero *z);

/* Step boundaries: zero the shard's gradients; after the last micro-batch's
 * backward, wait for every reduction. */
void loom_zero_begin_step(struct loom_zero *z);
void loom_zero_finish_backward(struct loom_zero *z);
/* Global gradient norm (over shards at stage 2). */
double loom_zero_grad_norm(const struct loom_zero *z);
/* Gradients of this rank's elements [begin, end), for the optimizer. */
const float *loom_zero_grads(const struct loom_zero *z);
/* After the optimizer step: every rank gets every shard's new parameters. */
void loom_zero_gather_params(const struct loom_zero *z, struct loom_gpt2 *m);

#endif
