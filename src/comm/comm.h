/*
 * The communication layer: a thin layer over a transport (MPI today,
 * comm_backend.h and comm_mpi.c; the layer itself is transport-free).
 *
 * - The topology: world = dp x tp x pp, rank order tp fastest, then dp, then
 *   pp (Megatron's order), one transport group (MPI communicator) per group.
 *   With context parallelism the data-parallel group is the data x context
 *   group (Megatron's data-parallel group "with context parallel": the
 *   ranks that hold the same part of the model and sum its gradients): its
 *   rank is data rank x cp + context rank, so the cp ranks of one data rank
 *   are consecutive (Megatron's order tp, cp, dp, pp), and they form the
 *   context group.
 * - Asynchronous collectives (all-reduce, reduce-scatter, all-gather,
 *   broadcast, send/recv) that return handles, and one wait path with a
 *   deadline: a collective not done in time prints rank, group, collective,
 *   bytes and step, then aborts the whole job (exit 1).
 * - Progress: MPI here makes no progress on its own, so one communication
 *   thread drives the transport after start-up. It starts requests in the
 *   order they are posted (the same order on every rank) and tests them,
 *   sleeping a few microseconds between tests so it does not take a core
 *   from compute. Collectives therefore advance while the caller computes.
 *
 * A single process (world 1) or a build without MPI runs every collective
 * as the identity, with no thread. Not here: NCCL, reduce ops other than
 * sum, min and max.
 */
#ifndef LOOM_COMM_COMM_H
#define LOOM_COMM_COMM_H

#include <stddef.h>
#include <stdint.h>

#include "base/buf.h"
#include "base/dtype.h"

enum loom_group {
    LOOM_GROUP_WORLD = 0,
    LOOM_GROUP_DP = 1,
    LOOM_GROUP_TP = 2,
    LOOM_GROUP_PP = 3,
    /* the first and the last pipeline stage of a (dp, tp) position
     * (Megatron's embedding group: a tied embedding and its LM head); one
     * rank alone on the stages between and when pp = 1 */
    LOOM_GROUP_EMBEDDING = 4,
    /* the context-parallel ranks of one (data, tp, pp) position: one
     * sequence's parts */
    LOOM_GROUP_CP = 5,
    /* expert parallelism: the ep consecutive data ranks of one (tp, pp)
     * position whose experts together make a layer's (Megatron's
     * expert-model-parallel group), and the data ranks that hold the same
     * experts (its expert-data-parallel group: dp / ep ranks) */
    LOOM_GROUP_EP = 6,
    LOOM_GROUP_EXPERT_DP = 7,
    LOOM_GROUP_COUNT
};

enum loom_coll {
    LOOM_COLL_ALLREDUCE = 0,
    LOOM_COLL_REDUCE_SCATTER = 1,
    LOOM_COLL_ALLGATHER = 2,
    LOOM_COLL_BROADCAST = 3,
    LOOM_COLL_SEND = 4,
    LOOM_COLL_RECV = 5,
    LOOM_COLL_ALLTOALL = 6,
    LOOM_COLL_ALLTOALL_V = 7,
    LOOM_COLL_COUNT
};

/* Element types are base/dtype.h's: BF16 and F16 are summed with each
 * addition in float32, rounded to the dtype; every dtype moves as its bytes. */

enum loom_op { LOOM_OP_SUM = 0, LOOM_OP_MIN = 1, LOOM_OP_MAX = 2, LOOM_OP_COUNT };

struct loom_topology {
    int world, rank;
    int dp, tp, pp;
    int dp_rank, tp_rank, pp_rank;
    /* context parallelism: cp divides dp (the data x context group), the
     * context rank is dp_rank % cp, the data rank dp_rank / cp */
    int cp, cp_rank;
    /* expert parallelism: ep divides dp (without context parallelism), the
     * expert rank is dp_rank % ep, the expert-data-parallel rank dp_rank / ep */
    int ep, ep_rank;
};

struct loom_comm_handle;

/* Starts MPI (as a singleton when not launched by mpirun). Call once, first. */
void loom_comm_init(int *argc, char ***argv);
/* World size and rank, valid after loom_comm_init. */
int loom_comm_world_size(void);
int loom_comm_world_rank(void);

/* Builds the groups for tp x pp (dp = world / (tp x pp)). LOOM_ERR_INPUT with
 * every number when the world size does not divide. Starts the
 * communication thread when world > 1. */
int loom_comm_setup(struct loom_topology *topo, int tp, int pp);
/* The same with a context group of cp ranks within the data-parallel group
 * (cp must divide it: LOOM_ERR_INPUT with the numbers). */
int loom_comm_setup_cp(struct loom_topology *topo, int tp, int pp, int cp);
/* The same with an expert-parallel group of ep ranks within the
 * data-parallel group (ep must divide it: LOOM_ERR_INPUT with the numbers). */
int loom_comm_setup_layout(struct loom_topology *topo, int tp, int pp, int cp, int ep);
/* Size and rank of group g on this rank (1 and 0 before the setup). */
int loom_comm_group_size(enum loom_group g);
int loom_comm_group_rank(enum loom_group g);
/* The world group alone (loom_comm_setup makes it first): collectives on
 * LOOM_GROUP_WORLD before the layout is known (--layout auto). */
void loom_comm_setup_world(void);
/* "TP(1)-DP(2)-PP(1)-Rank(0)"; with context parallelism
 * "TP(1)-CP(2)-DP(2)-PP(1)-Rank(0)", DP the data ranks; with expert
 * parallelism "TP(1)-EP(2)-DP(4)-PP(1)-Rank(0)" */
void loom_topology_format(const struct loom_topology *t, char *buf, size_t n);

void loom_comm_set_timeout(double seconds);
/* The training step, named in timeout messages. */
void loom_comm_set_step(int64_t step);

/* Collectives take typed buffers (base/buf.h): the element count is the
 * buffer's numel, the MPI type and the 16-bit sum op come from its dtype
 * (F32, F64, I32, U64, U16, BF16, F16; send and recv of one call share a
 * dtype). Buffers stay the caller's and must not be touched until the handle
 * is waited for. Counts below are in elements; "group size" is the size of g.
 *
 * In-place all-reduce of b (numel). */
struct loom_comm_handle *loom_comm_allreduce(enum loom_group g, struct loom_buf b, enum loom_op op);
/* recv (n) = this rank's slice of the sum of send (n x group size). */
struct loom_comm_handle *loom_comm_reduce_scatter(enum loom_group g, struct loom_buf send,
                                                  struct loom_buf recv);
/* The uneven form: send (sum of counts) holds the group's segments in rank
 * order, counts[r] elements for rank r; recv (counts[rank]) gets this rank's
 * segment of the sum. counts is copied. */
struct loom_comm_handle *loom_comm_reduce_scatter_v(enum loom_group g, struct loom_buf send,
                                                    struct loom_buf recv, const int *counts);
/* recv (n x group size) = every rank's send (n), in rank order; n is
 * recv.numel / group size. send.data NULL: in place, this rank's part
 * already at recv + rank x n (send's numel and dtype are then not read). */
struct loom_comm_handle *loom_comm_allgather(enum loom_group g, struct loom_buf send, struct loom_buf recv);
/* The uneven form: rank r contributes counts[r] elements (send, numel
 * counts[rank]), placed at recv + displs[r]; recv holds every segment.
 * counts and displs are copied. */
struct loom_comm_handle *loom_comm_allgather_v(enum loom_group g, struct loom_buf send, struct loom_buf recv,
                                               const int *counts, const int *displs);
/* recv (n x group size) = block r of every rank's send, in rank order:
 * send and recv hold group size blocks of n = send.numel / group size
 * elements, send's block r going to rank r (MPI_Alltoall). */
struct loom_comm_handle *loom_comm_alltoall(enum loom_group g, struct loom_buf send, struct loom_buf recv);
/* The uneven form (MPI_Alltoallv): scounts[r] elements from send +
 * sdispls[r] go to rank r, and rcounts[r] from rank r land at recv +
 * rdispls[r]. The four arrays are copied. */
struct loom_comm_handle *loom_comm_alltoall_v(enum loom_group g, struct loom_buf send, const int *scounts,
                                              const int *sdispls, struct loom_buf recv, const int *rcounts,
                                              const int *rdispls);
/* b (numel) on every rank = b on rank root (of the group). */
struct loom_comm_handle *loom_comm_broadcast(enum loom_group g, struct loom_buf b, int root);
/* b (numel) to / from group rank peer, matched by tag. */
struct loom_comm_handle *loom_comm_send(enum loom_group g, struct loom_buf b, int peer, int tag);
struct loom_comm_handle *loom_comm_recv(enum loom_group g, struct loom_buf b, int peer, int tag);

/* Sums of float32 and float64 over group g (all-reduce, reduce-scatter)
 * in one order whatever the transport: every rank's values gathered and
 * added in the pairwise tree over the ranks in rank order (ranks r and
 * r + 1, then pairs of those, ...), at the wait. Group sizes one and two
 * need nothing (a sum of two is one addition). g times the bytes of a
 * sum; for --layout-invariant. */
void loom_comm_set_tree_sums(enum loom_group g, int on);

/* Waits for the handle until the deadline (then aborts the job) and frees it.
 * Returns the seconds spent waiting. */
double loom_comm_wait(struct loom_comm_handle *h);
/* Blocking all-reduce: post and wait. */
void loom_comm_allreduce_sync(enum loom_group g, struct loom_buf b, enum loom_op op);

/* Every rank learns the worst status of all: returns the largest rc of any
 * rank, and in *first_rank the lowest rank that had it (the one that prints). */
int loom_comm_agree(int rc, int *first_rank);
/* The same over the ranks of group g (first_rank is a world rank). */
int loom_comm_agree_in(enum loom_group g, int rc, int *first_rank);
/* The same, and every rank then holds the error message of that first rank
 * (so rank 0 can report what another rank saw). */
int loom_comm_agree_shared(int rc);

/* Async-signal-safe: a stop signal arrived. A wait still blocked 0.2 s
 * later prints the hang report (members asked for 0.4 s), once. */
void loom_comm_note_stop(void);

/* Ends the whole job now with `code` (MPI_Abort when world > 1). */
void loom_comm_abort(int code) __attribute__((noreturn));
void loom_comm_finalize(void);

#endif
