/*
 * The transport interface under the comm layer: what comm.c needs from a
 * library that moves bytes between processes. MPI (comm_mpi.c) is the
 * first implementation; NCCL would be the next, behind the same handles,
 * FIFO progress thread and deadline (which stay in comm.c).
 *
 * comm.c calls init and create_group from the main thread, start and test
 * only from its communication thread, in posting order, and finalize after
 * that thread has stopped; a transport must allow the two threads to call
 * it at once (MPI: MPI_THREAD_MULTIPLE). A transport reports its own
 * failures: it prints one line naming the operation and the rank and ends
 * the job (exit code LOOM_ERR_RUNTIME).
 *
 * Not here: the topology arithmetic, identity on one rank, timeouts,
 * agreement (comm.c), or a transport chosen at run time.
 */
#ifndef LOOM_COMM_COMM_BACKEND_H
#define LOOM_COMM_COMM_BACKEND_H

#include <stddef.h>

#include "comm/comm.h"

/* One collective or point-to-point operation, as posted. Counts are in
 * elements of dt. */
struct loom_comm_op {
    enum loom_coll coll;
    enum loom_group group;
    enum loom_dtype dt;
    enum loom_op op;  /* all-reduce; reduce-scatter always sums */
    const void *send; /* reduce-scatter, all-gather (NULL: in place), send */
    void *recv;       /* all-reduce and broadcast (in place), reduce-scatter, all-gather, recv */
    /* all-reduce, broadcast, send, recv: the buffer's count; reduce-scatter:
     * the count each rank receives; all-gather: the count each rank sends;
     * the uneven forms: the sum of counts */
    size_t count;
    int peer;          /* broadcast: the root; send, recv: the other rank (group ranks) */
    int tag;           /* send, recv */
    const int *counts; /* (group size) the uneven forms: elements per rank; else NULL */
    const int *displs; /* (group size) uneven all-gather: where each rank's part lands; else NULL */
    /* all-to-all-v: counts and displs are the send side's, these the receive side's */
    const int *rcounts, *rdispls;
};

struct loom_comm_backend {
    const char *name; /* "mpi" */
    /* Starts the transport (once, before anything else) and gives this
     * process's world size and rank. Where world size > 1 it must allow
     * calls from two threads at once. */
    void (*init)(int *argc, char ***argv, int *world_size, int *world_rank);
    /* Makes group g: the processes that pass the same color, ordered by
     * key (their group ranks). Every process of the world calls it, for
     * the same g, in the same order; each g is made at most once. */
    void (*create_group)(enum loom_group g, int color, int key);
    /* Starts op without waiting and returns the transport's request for
     * it. op's buffers stay valid until test reports it complete. */
    void *(*start)(const struct loom_comm_op *op);
    /* 1 when the request has completed (it is then released), 0 when not
     * yet; does not block. */
    int (*test)(void *request);
    /* Optional (NULL: no hang reports name other ranks). The side channel
     * for progress queries, apart from the groups' traffic: a receive of
     * `bytes` from world rank `from` (-1: any) with tag, a send to world
     * rank `to`; side_test is test's, also giving a receive's source. Both
     * threads may use it. */
    void *(*side_recv)(void *buf, size_t bytes, int from, int tag);
    void *(*side_send)(const void *buf, size_t bytes, int to, int tag);
    int (*side_test)(void *request, int *source);
    void (*side_cancel)(void *request); /* a receive never matched, at the end */
    /* Ends every process of the job now with code; does not return. */
    void (*abort)(int code);
    /* Releases the groups and shuts the transport down. */
    void (*finalize)(void);
};

/* The MPI transport; NULL in a build without MPI, where the comm layer is
 * a single process. */
const struct loom_comm_backend *loom_comm_backend_mpi(void);

#endif
