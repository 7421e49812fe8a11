/*
 * Context parallelism (Megatron's --context-parallel-size): each sequence
 * of a micro-batch is split over the context group's cp ranks
 * (comm/comm.h's LOOM_GROUP_CP). The sequence of T tokens is cut into 2 cp
 * chunks of c = T / (2 cp) and rank r holds chunks r and 2 cp - 1 - r, in
 * that order (Megatron's get_batch_on_this_cp_rank): under the causal mask
 * every rank then has the same attention work. Everything but attention
 * works on a rank's Tl = T / cp rows as it would on a shorter sequence; the
 * positions are each token's place in the whole sequence.
 *
 * Here, written once for every family: the rank's rows of a micro-batch's
 * tokens, the token positions, and the moves attention needs: DeepSpeed-
 * Ulysses' all-to-alls between a rank's rows of every head and every row of
 * its share of the heads (heads), and the gathers of whole rows and sums
 * back into a rank's rows (all_gather). With one rank in the group none of
 * them moves anything. Not here: the attention kernels, the gradient sum
 * over the data x context group (the data-parallel strategies'),
 * the settings' checks (parallel/kind_context.c).
 */
#ifndef LOOM_LAYERS_CONTEXT_H
#define LOOM_LAYERS_CONTEXT_H

#include <stddef.h>
#include <stdint.h>

#include "kernels/backend.h"

struct loom_cp {
    int cp, rank; /* the group's size and this rank's place in it (1, 0: no context parallelism) */
    int T, Tl, c; /* the whole sequence, this rank's rows of it (T / cp), a chunk (T / 2 cp) */
};

/* This rank's place in the context group (0 before it is made). */
int loom_cp_group_rank(void);

/* The split of sequences of T tokens over cp ranks, for this rank. */
struct loom_cp loom_cp_of(int cp, int rank, int T);

/* The place in the sequence of this rank's row t (0 <= t < Tl), and of
 * row t of rank r. */
int loom_cp_position(const struct loom_cp *p, int t);
int loom_cp_position_of(const struct loom_cp *p, int r, int t);

/* This rank's rows of B sequences: dst (B, Tl) from src (B, T), host
 * memory. */
void loom_cp_take_rows(const struct loom_cp *p, int32_t *dst, const int32_t *src, int B);

/* The sum of x over the context group (a micro-batch's loss from its
 * parts). */
double loom_cp_sum(const struct loom_cp *p, double x);
/* b summed over the context group, in place (a mixture of experts'
 * counts and sums over the whole micro-batch). */
void loom_cp_sum_all(const struct loom_cp *p, struct loom_buf b);

/* Ulysses. Rows of nseg column segments of widths seg[i] (each divisible by
 * cp): a rank's rows (B Tl, w = sum of seg) hold every column, a head part
 * (B, T, w / cp) the columns [j seg[i] / cp, (j + 1) seg[i] / cp) of each
 * segment for rank j, every row of the sequence in order. to_heads: this
 * rank's head part from every rank's rows; to_rows: the converse. send and
 * recv: scratch of B Tl w floats each; dst and src (which may be one
 * buffer) must not be either. */
void loom_cp_to_heads(const struct loom_cp *p, const struct loom_kernels *k, float *dst, const float *src,
                      int B, const int *seg, int nseg, float *send, float *recv);
void loom_cp_to_rows(const struct loom_cp *p, const struct loom_kernels *k, float *dst, const float *src,
                     int B, const int *seg, int nseg, float *send, float *recv);

/* Every rank's host rows gathered into the whole sequences', on the host:
 * whole (B, T) elements of dtype dt from each rank's rows (B Tl) of mine;
 * all: scratch of B T elements. Exact copies (ids, losses). */
void loom_cp_gather_host(const struct loom_cp *p, void *whole, const void *mine, void *all, int B,
                         enum loom_dtype dt);

/* All-gather. whole (B, T, w): every rank's rows (B Tl, w) of rows, in the
 * sequence's order; recv: scratch of B T w floats. sum_rows: this rank's
 * rows (B Tl, w) of the sum over the group of whole (B, T, w); send:
 * scratch of B T w floats. */
void loom_cp_gather_rows(const struct loom_cp *p, const struct loom_kernels *k, float *whole,
                         const float *rows, int B, int w, float *recv);
void loom_cp_sum_rows(const struct loom_cp *p, const struct loom_kernels *k, float *rows, const float *whole,
                      int B, int w, float *send);

/* p2p's ring: send (n floats) to the next rank of the group and recv (n)
 * from the previous one, started (tag: one kind of message); wait ends
 * both. */
struct loom_cp_ring {
    struct loom_comm_handle *send, *recv;
};
void loom_cp_ring_start(const struct loom_cp *p, struct loom_cp_ring *r, const float *send, float *recv,
                        size_t n, int tag);
void loom_cp_ring_wait(struct loom_cp_ring *r);

/* Seconds the collectives above waited since the last call. */
double loom_cp_comm_take_s(void);

#endif
