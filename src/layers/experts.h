/*
 * Expert parallelism (Megatron's --expert-model-parallel-size): an MoE
 * layer's E experts are split over the expert-parallel group's ep ranks
 * (comm/comm.h's LOOM_GROUP_EP), rank p holding experts [p L, (p + 1) L)
 * of L = E / ep, and each rank's tokens travel to their experts and back
 * (Megatron's all-to-all token dispatcher, or its allgather one, below).
 *
 * A rank's dispatched rows (its "source layout") are expert-major, rows
 * in token order within an expert, as one process lays them out: counts[e]
 * rows for expert e. Rank q's share is the rows of its L experts, one
 * contiguous run. The exchange:
 *   - the counts: each rank learns recv[s L + j], the rows rank s sends to
 *     its local expert j (an all-to-all of L counts a rank);
 *   - the rows: an all-to-all-v of rows of C floats into the received
 *     layout, source-major ([s][j]), and back;
 *   - the regroup between the received layout and the expert-major one
 *     ([j][s]) the local experts' products run on.
 * With one rank in the group nothing moves. Not here: the routing and the
 * experts' products (model/decoder_moe.c), the gradient sums over the
 * expert-data-parallel group (the data-parallel strategies'), the
 * settings' checks (parallel/kind_expert.c).
 */
#ifndef LOOM_LAYERS_EXPERTS_H
#define LOOM_LAYERS_EXPERTS_H

#include "kernels/backend.h"

struct loom_ep {
    int ep, rank; /* the group's size and this rank's place in it (1, 0: no expert parallelism) */
    int local;    /* experts a rank holds: E / ep */
    int first;    /* the first of them: rank x local */
};

/* This rank's place in the expert-parallel group (0 before it is made). */
int loom_ep_group_rank(void);

/* The split of E experts over ep ranks, for this rank. */
struct loom_ep loom_ep_of(int experts, int ep, int rank);

/* recv (ep x local): the rows each rank sends to each local expert, from
 * every rank's counts (E). Host memory. */
void loom_ep_exchange_counts(const struct loom_ep *p, const int *counts, int *recv);

/* Rows received in all: the sum of recv. */
int loom_ep_rows(const struct loom_ep *p, const int *recv);

/* The rows out: dst (the received layout) from every rank's src (its
 * source layout, counts (E) rows of C floats). back: the converse, dst
 * (this rank's source layout) from src (the received layout) on every
 * rank. */
void loom_ep_dispatch(const struct loom_ep *p, float *dst, const int *recv, const float *src,
                      const int *counts, int C);
/* The same with work(ctx) run while the rows are on their way (the shared
 * experts, as Megatron's --moe-shared-expert-overlap); work must post no
 * collective. */
void loom_ep_dispatch_while(const struct loom_ep *p, float *dst, const int *recv, const float *src,
                            const int *counts, int C, void (*work)(void *ctx), void *ctx);
void loom_ep_combine(const struct loom_ep *p, float *dst, const int *counts, const float *src,
                     const int *recv, int C);

/* Between the received layout ([s][j] blocks of recv[s local + j] rows)
 * and the expert-major one ([j][s]): to_experts, or back. */
void loom_ep_regroup(const struct loom_ep *p, const struct loom_backend *b, float *dst, const float *src,
                     const int *recv, int C, int to_experts);

/* The allgather dispatcher's moves (Megatron's): every rank's tokens
 * gathered to every rank of the group, each rank's experts computing the
 * rows routed to them, and the outputs' partial sums reduce-scattered back.
 * gather: dst (ep x n values of dtype dt) from every rank's src (n). */
void loom_ep_gather(const struct loom_ep *p, void *dst, const void *src, size_t n, enum loom_dtype dt);
/* dst (n) = this rank's part of the sum of every rank's src (ep x n). */
void loom_ep_reduce_scatter(const struct loom_ep *p, float *dst, const float *src, size_t n);
/* From every rank's counts (all: ep x E): recv (ep x local), as
 * loom_ep_exchange_counts gives it. */
void loom_ep_recv_of(const struct loom_ep *p, const int *all, int E, int *recv);
/* Every rank's Nk choices (gathered: ep x Nk experts idx and places pos in
 * their rank's dispatched rows, -1: dropped) as places among this rank's
 * experts' rows in the expert-major layout (out, ep x Nk; -1: another
 * rank's expert, or dropped). Host memory. */
void loom_ep_local_places(const struct loom_ep *p, int32_t *out, const int32_t *idx, const int32_t *pos,
                          const int *all, const int *recv, int E, int Nk);

/* Seconds waited for the exchanges since the last call. */
double loom_ep_comm_take_s(void);

#endif
