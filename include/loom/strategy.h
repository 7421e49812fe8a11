/*
 * Strategies: what runs around a model's blocks (data parallelism, ZeRO's
 * sharding, mixed precision's working copies, later the tensor-parallel and
 * embedding-group gradient syncs). A model announces each block as it uses
 * it (loom/model.h); the announcement walks the model's strategy stack:
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
 * extra grads_ready event of a tied embedding. Not here: who builds the
 * stack (the engine, from the configuration).
 */
#ifndef LOOM_STRATEGY_H
#define LOOM_STRATEGY_H

#include <stddef.h>

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
    /* Seconds this step spent blocked on this strategy's communication
     * after the backward; default: none (-1). */
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
};

#define LOOM_STRATEGY_MAX 8

/* A model's stack: strategies and their contexts, in stack order. */
struct loom_strategy_stack {
    int n;
    const struct loom_strategy *s[LOOM_STRATEGY_MAX];
    void *ctx[LOOM_STRATEGY_MAX];
};

#endif
