/*
 * Tensor parallelism (Megatron-LM's): the communication a model's layers
 * use on their local parts, written once as forward/backward pairs over the
 * tensor-parallel group (comm/comm.h's LOOM_GROUP_TP). With one rank in the
 * group every one of them is the identity.
 *
 *   copy    f: identity forward; all-reduce of the gradient backward. Enters
 *           a column-parallel region (QKV, MLP fc, the vocab-parallel LM head):
 *           each rank's input gradient is a partial sum over its columns.
 *   reduce  g: all-reduce forward; identity backward. Leaves a row-parallel
 *           region (the attention and MLP output projections, the
 *           vocab-parallel embedding): each rank's output is a partial sum.
 *
 * The vocab-parallel cross-entropy's statistics (row max, sum of
 * exponentials, target logit) are reduced with loom_tp_allreduce. Which
 * tensors are split, and how, is each tensor's declaration (loom/model.h:
 * tp_split, view); the gradients of replicated tensors need no sync without
 * sequence parallelism, since every tp rank computes them from the same
 * inputs (with sequence parallelism each rank sees its rows only, and the
 * norms' gradients are summed over the group by the model). Not here:
 * pipeline send/recv (parallel/schedule.c).
 */
#ifndef LOOM_LAYERS_TP_REGIONS_H
#define LOOM_LAYERS_TP_REGIONS_H

#include <stddef.h>
#include <stdint.h>

#include "comm/comm.h"

/* Rank r's part [lo, hi) of n entries split over tp ranks (loom/model.h
 * declares it too, for the model's tensor splits). */
void loom_tp_part(int64_t n, int tp, int r, int64_t *lo, int64_t *hi);

/* f's backward: dx (n floats) summed over the tp group, in place. */
void loom_tp_copy_backward(float *dx, size_t n);
/* g's forward: y (n floats) summed over the tp group, in place. */
void loom_tp_reduce_forward(float *y, size_t n);
/* x (n floats) reduced over the tp group with op, in place. */
void loom_tp_allreduce(float *x, size_t n, enum loom_op op);

/* Sequence parallelism (Megatron's SP): between the tensor-parallel regions
 * each tp rank holds its own rows (a 1/tp share of the B*T rows, in rank
 * order). gather: every rank's rows (n_local floats each) into full, in
 * rank order; the forward entering a region, and the backward of
 * reduce_scatter. reduce_scatter: this rank's rows (n_local floats) of the
 * sum over the group of full; the forward leaving a region, and the
 * backward of gather. tp: the group's size. */
void loom_tp_gather(float *full, const float *local, size_t n_local, int tp);
/* Waits for a collective on the tp group, counted with the ones above. */
void loom_tp_wait(struct loom_comm_handle *h);
/* Seconds the collectives above waited since the last call (they block the
 * layers, so all of it is exposed), and the count starts again. */
double loom_tp_comm_take_s(void);
void loom_tp_reduce_scatter(float *local, const float *full, size_t n_local, int tp);

/* A model's entries to and exits from its tensor-parallel regions, written
 * once for every family. A column-parallel product reads every row of its
 * input; a row-parallel one leaves a partial sum over this rank's columns.
 * Without sequence parallelism every rank holds every row: the entry is the
 * identity (f) and the exit an all-reduce (g), both the identity at tp 1.
 * With it a rank holds its rows between the regions (rows_held: N/tp of N),
 * gathered at the entry and reduce-scattered at the exit; the backward does
 * the converse. Rows are `width` floats. The buffers are the model's, needed
 * under sp only: gathered (N rows), out_rows and grad_rows (N/tp rows). */
struct loom_tp_regions {
    int tp, sp, width;
    float *gathered, *out_rows, *grad_rows;
};
/* The rows of N this rank holds between the regions. */
int loom_tp_rows_held(const struct loom_tp_regions *r, int N);
/* The rows a region reads: x itself, or every rank's rows gathered. */
const float *loom_tp_region_input(struct loom_tp_regions *r, const float *x, int N);
/* A region's output from its partial sums (N rows): summed in place, or this
 * rank's rows of the sum in out_rows. Returns the rows this rank holds. */
float *loom_tp_region_output(struct loom_tp_regions *r, float *partial, int N);
/* The gradient at a region's output, every row of it: dres itself, or every
 * rank's rows gathered (the backward of the reduce-scatter). */
const float *loom_tp_region_output_grad(struct loom_tp_regions *r, const float *dres, int N);
/* A region computed whole and alike on every rank (its output, or its
 * input's gradient): the rows tp rank tp_rank holds of x (N rows), in
 * place. */
float *loom_tp_region_rows(const struct loom_tp_regions *r, float *x, int N, int tp_rank);
/* The gradient at a region's input from its partial sums over this rank's
 * columns (N rows): summed in place, or this rank's rows of the sum in
 * grad_rows (the backward of the gather). Returns the rows this rank holds. */
float *loom_tp_region_input_grad(struct loom_tp_regions *r, float *partial, int N);

#endif
