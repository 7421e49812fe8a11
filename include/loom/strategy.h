/*
 * Strategies: what runs around a model's blocks and its step (data
 * parallelism, ZeRO's sharding, mixed precision's working copies, tensor
 * parallelism's count of replicated gradients and its waits, the pipeline's
 * waits, fp8's scales, the embedding group's exchange of a tied table,
 * sequence parallelism's sums of the norms' gradients). A model
 * announces each block as it uses it (loom/model.h); the announcement walks
 * the model's strategy stack:
 *
 *   on the way in   (begin_step, begin_backward, pre_forward, pre_backward):
 *                   in stack order, first to last;
 *   on the way out  (post_forward, grads_ready, finish_backward, after_step):
 *                   in reverse, last to first.
 *
 * The stack is ordered from storage to kernels: a sharding strategy first
 * (it gathers the stored parameters before anyone reads them, and reduces
 * the gradients after everyone wrote them), mixed precision last (its
 * float32 working copies exist only inside the others' pre/post pairs).
 *
 * Every member is optional (NULL: nothing to do at that point). Block
 * indices are the model's; LOOM_GRAD_READY_TIED_HEAD (loom/model.h) is the
 * extra grads_ready event of a tied embedding. Besides the hooks, a
 * strategy answers the step's questions: where the stored state is (view),
 * which tensors this rank counts in the gradient norm (counts_tensor). Not
 * here: who builds the stack (the engine, from the parallelism kinds).
 */
#ifndef LOOM_STRATEGY_H
#define LOOM_STRATEGY_H

#include <stddef.h>
#include <stdint.h>

#include "loom/types.h"

struct loom_tensor;
struct loom_offload_map;

/* Where the footprint's replay (src/engine/footprint.h) is in a step, as
 * the hooks it mirrors are called: the step-level points (block -1) and a
 * block's passage. */
enum loom_replay_point {
    LOOM_REPLAY_BEGIN_STEP = 0,
    LOOM_REPLAY_PRE_FORWARD = 1,
    LOOM_REPLAY_POST_FORWARD = 2,
    LOOM_REPLAY_BEGIN_BACKWARD = 3, /* before a micro-batch's backward */
    LOOM_REPLAY_PRE_BACKWARD = 4,
    LOOM_REPLAY_GRADS_READY = 5,
    LOOM_REPLAY_FINISH = 6, /* the step's end: finish_backward and after_step */
    LOOM_REPLAY_POINT_COUNT
};

/* The replay's place in the step, shared by the stack's members. */
struct loom_replay {
    int micro, last; /* micro-batch micro; last: the step's last */
    /* set at BEGIN_BACKWARD by a strategy that provides the blocks' float32
     * gradient buffers in this micro-batch's backward */
    int grads_provided;
};

/* Where the model's stored state is on this rank, for the optimizer, the
 * gradient norm, the non-finite check and checkpoints: the model's arenas,
 * or the shards of the strategy that keeps them instead (its view). */
struct loom_state_view {
    struct loom_buf params; /* the stored parameters: elements [params_lo, params_hi) of the arena */
    size_t params_lo, params_hi;
    /* params holds only these runs of [params_lo, params_hi), as grads_runs
     * below (ZeRO-3 under expert parallelism); NULL: all of it */
    const struct loom_run *params_runs;
    int params_nruns;
    struct loom_buf grads; /* the reduced gradients: elements [grads_lo, grads_hi) */
    size_t grads_lo, grads_hi;
    int grads_split; /* the data-parallel ranks hold disjoint ranges (sums over them are added) */
    /* grads holds only these runs of [grads_lo, grads_hi), their elements
     * one after another (ZeRO under expert parallelism: the rank's experts
     * and its share of the dense elements, each owned by one data rank);
     * NULL: all of it */
    const struct loom_run *grads_runs;
    int grads_nruns;
    /* the gradients' sums of squares go in pieces of this many elements
     * (the grouping fixes the norm's bits), or block by block (0) */
    size_t piece;
    /* offloaded to files (optim/offload.h): a piece is dropped once read;
     * NULL: in memory */
    struct loom_offload_map *param_map, *grad_map;
};

struct loom_strategy {
    const char *name; /* "ddp", "zero-3", "precision": printed in the run summary */
    /* The first micro-batch of a step is about to run. */
    void (*begin_step)(void *ctx);
    /* Micro-batch `micro` of the step is about to run its backward; `last`
     * says it is the step's last (DDP reduces only then). */
    void (*begin_backward)(void *ctx, int micro, int last);
    /* Around a block's forward use of its parameters. */
    void (*pre_forward)(void *ctx, int block);
    void (*post_forward)(void *ctx, int block);
    /* Before the backward first touches a block's parameters or gradients;
     * a strategy may provide the block's gradient buffer here
     * (loom_block_provide_grads). */
    void (*pre_backward)(void *ctx, int block);
    /* The block's gradient for this micro-batch is complete. */
    void (*grads_ready)(void *ctx, int block);
    /* After the step's last backward: land every reduction. */
    void (*finish_backward)(void *ctx);
    /* After the optimizer's update (or a skipped one). */
    void (*after_step)(void *ctx);
    /* Seconds this step was blocked on this strategy's communication (after
     * the backward, or inside the layers where they block); the stack's is
     * the sum. Default: none (-1). */
    double (*comm_wait_s)(void *ctx);
    /* One line for the run summary ("ZeRO-3: 14 gather units"); default: the name. */
    void (*describe)(void *ctx, char *buf, size_t n);
    /* The footprint's replay, under the allocator's counting mode: at point
     * `at` (of block `block`; -1 at the step-level points) the transient
     * buffers the hook there takes and gives back, without communicating or
     * touching them; beside the hooks it mirrors (change both together).
     * Called in stack order, in reverse at POST_FORWARD and GRADS_READY.
     * Default: the strategy takes none. */
    void (*replay)(void *ctx, enum loom_replay_point at, int block, struct loom_replay *r);
    /* A strategy that keeps the stored state in place of the model's
     * arenas: fills *v and returns 1. The first in stack order that does
     * answers; default: the model's arenas. */
    int (*view)(void *ctx, struct loom_state_view *v);
    /* Whether this rank counts tensor t's gradient in the norm (each
     * parameter counts once over the ranks: a tensor that ranks hold copies
     * of, on one of them). With such a strategy on the stack the norm sums
     * tensor by tensor. Default: every tensor. */
    int (*counts_tensor)(void *ctx, const struct loom_tensor *t);
    /* The strategy that keeps the stored parameters in place of an arena
     * the model was never given initialises them (the initialisation draws
     * from (seed, block), loom/model.h). */
    void (*init_weights)(void *ctx, uint64_t seed);
};

/* The engine's kinds put at most 7 on a stack (tp, pp, fp8, ddp, zero-1,
 * precision, invariant); the rest is room for a user's. */
#define LOOM_STRATEGY_MAX 12

/* A model's stack: strategies and their contexts, in stack order. */
struct loom_strategy_stack {
    int n;
    const struct loom_strategy *s[LOOM_STRATEGY_MAX];
    void *ctx[LOOM_STRATEGY_MAX];
};

#endif
