/*
 * ZeRO (sharded data parallelism). Stage 1 is here: the optimizer state is
 * split across the dp group, each rank updating only its shard of the
 * parameter arena (padded to equal shards), then the updated parameters are
 * all-gathered in place. Gradients are averaged by DDP (ddp.c), so every
 * rank sees the full gradient and the gradient norm needs no extra
 * reduction. Stage 0 is plain DDP: one shard holding everything.
 *
 * Not yet: stage 2 (gradients reduce-scattered into shards), stage 3
 * (parameters gathered per block with prefetch), offload.
 */
#ifndef LOOM_PARALLEL_ZERO_H
#define LOOM_PARALLEL_ZERO_H

#include <stddef.h>

#include "model/gpt2.h"

struct loom_zero {
    int stage, dp, dp_rank;
    size_t shard;      /* elements per rank (the padded arena / dp) */
    size_t begin, end; /* this rank's elements of the arena, end clipped to the parameters */
};

/* The arena multiple a model must be created with for this layout. */
size_t loom_zero_arena_multiple(int stage, int dp);
void loom_zero_init(struct loom_zero *z, int stage, int dp, int dp_rank, const struct loom_gpt2 *m);
/* After the optimizer step: every rank gets every shard's new parameters. */
void loom_zero_gather_params(const struct loom_zero *z, struct loom_gpt2 *m);

#endif
