/*
 * Layout-invariant accumulation (--layout-invariant): a step's micro-batch
 * gradients summed in one binary tree whatever the layout, as a strategy on
 * top of the stack.
 *
 * One process accumulating A micro-batches adds each into the running sum
 * (((g0 + g1) + g2) + g3), while two data-parallel ranks of two each add
 * their own and then each other's ((g0 + g1) + (g2 + g3)): the same numbers
 * in float32 in another order. Here every micro-batch's gradient is
 * computed on its own (into a zeroed buffer: pre_backward gives the kernels
 * one) and added into a binary counter of partial sums (grads_ready):
 * micro-batch a's sum joins the one at level k while bit k of a is set, so
 * A = 2^n micro-batches make the perfect tree over them. A rank holds
 * consecutive micro-batches of the step (loom_engine_micro_batch_rows), so
 * its tree is a subtree of one process's, and the data-parallel sum of two
 * ranks is the one addition above them. The root reaches the block's
 * gradient view (the strategies below: DDP's bucket, the mixed-precision
 * accumulator, a ZeRO flight, the arena) at the last micro-batch only;
 * before it they get zeros, which change nothing they add.
 *
 * Costs: one float32 copy of the gradients per level (log2 A levels), and
 * each micro-batch's gradient added once per level it climbs. With one
 * micro-batch it does nothing. Exact across layouts for A and the
 * data-parallel size powers of two (a sum over more than two data-parallel
 * ranks takes the same tree: loom_comm_set_tree_sums).
 */
#ifndef LOOM_PARALLEL_INVARIANT_H
#define LOOM_PARALLEL_INVARIANT_H

#include "loom/model.h"
#include "parallel/stack.h"

struct loom_invariant {
    struct loom_model *model;
    int index;  /* this strategy's place on the stack */
    int micros; /* A, the micro-batches of a step on this rank */
    int pieces; /* --layout-invariant N (the model's tensor-parallel pieces), for the summary */
    int micro, last;
    int levels;      /* the counter's levels: bits of A - 1 */
    float **level;   /* (levels x nblocks): block b's partial sum at level k, allocated on first use */
    float **own;     /* (nblocks): the micro-batch's own gradient, while the block is open */
    float **dest;    /* (nblocks): the view the strategies below provided */
    int *dest_owner; /* (nblocks) */
};

/* Pushes the strategy (last: on top of the stack) for A micro-batches a
 * step (one: it does nothing but describe the run). */
void loom_invariant_init(struct loom_invariant *x, struct loom_model *m, int micros, int pieces);
void loom_invariant_free(struct loom_invariant *x);

#endif
