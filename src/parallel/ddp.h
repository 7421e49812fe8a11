/*
 * Data parallelism (DDP): a full replica of the model on every rank of the
 * dp group; gradients averaged across it.
 *
 * Bucketed (the default): consecutive blocks are grouped, from the last
 * block backwards, into buckets of at least --ddp-bucket-size MB (DDP's
 * bucket_cap_mb). A bucket's all-reduce is posted as soon as the backward
 * of its blocks is done, so it overlaps the backward of earlier blocks; the
 * communication thread advances it. With --no-overlap every bucket is posted
 * after the backward instead. With gradient accumulation only the last
 * micro-batch reduces (DDP's no_sync).
 *
 * Naive (--ddp-impl naive): one all-reduce of all gradients after the
 * backward: the reference the bucketed version is tested against.
 *
 * A tied token embedding (a model's loom_tied_embedding: GPT-2's wte) would
 * otherwise be the last and largest bucket
 * (its gradient is complete only after the embedding's backward). With
 * overlap on, wte gets a bucket of its own, posted right after the LM
 * head's backward, and the embedding lookup's sparse share of its gradient
 * is left out of the backward: afterwards every rank gathers all ranks'
 * (tokens, residual gradient) rows and scatters them in rank order, so all
 * replicas add the same numbers in the same order.
 *
 * The average comes from the loss weight: each rank back-propagates its
 * micro-batch mean times 1/(accumulation x dp), so the sum over ranks is
 * the global mean. Under mixed precision, during the backward that
 * reduces, the blocks accumulate into float32 bucket buffers that start from
 * the 16-bit gradients of earlier micro-batches; they are reduced in float32
 * and rounded once into the 16-bit gradients. Not here: sharding (zero.c).
 */
#ifndef LOOM_PARALLEL_DDP_H
#define LOOM_PARALLEL_DDP_H

#include "base/dtype.h"
#include "comm/comm.h"
#include "loom/model.h"

struct loom_ddp_bucket {
    int first_block, last_block; /* blocks [first, last]; the first finishes last */
    float *grads;                /* contiguous over those blocks (mixed precision: float32 in flight) */
    uint16_t *grads_lp;          /* mixed precision: the blocks' 16-bit gradients */
    size_t count;
    struct loom_comm_handle *handle;
};

struct loom_ddp {
    struct loom_model *model;
    enum loom_dtype dtype; /* the model's */
    int dp, overlap, naive;
    enum loom_dtype reduce16; /* LOOM_DTYPE_BF16/LOOM_DTYPE_F16: gradients summed in 16 bits; 0: in float32 */
    int early_wte;            /* wte reduced from the LM head's backward on */
    struct loom_ddp_bucket wte;
    struct loom_ddp_bucket all;             /* naive: every gradient */
    float *gathered_dres, *gathered_tokens; /* (dp,rows,C), (dp,rows), for the deferred scatter */
    float *my_tokens;                       /* (rows) */
    int nbuckets;
    struct loom_ddp_bucket *buckets;
    int *bucket_of; /* (nblocks) */
    int sync;       /* this backward reduces */
    double wait_s;  /* exposed communication of the last step: all that follows the backward */
};

void loom_ddp_init(struct loom_ddp *d, struct loom_model *m, int dp, double bucket_mb, int overlap,
                   int naive);
void loom_ddp_free(struct loom_ddp *d);
/* Mixed precision: the dtype gradients are summed in across ranks, LOOM_DTYPE_F32
 * (the default) or the model's 16-bit one (--grad-reduce-dtype): each rank's
 * sum is rounded once and the sum over ranks is done in 16 bits, each
 * addition rounded (half the bytes on the wire). */
void loom_ddp_reduce_in(struct loom_ddp *d, enum loom_dtype dt);
/* Before each micro-batch's backward: sync = 1 on the last one. */
void loom_ddp_begin_backward(struct loom_ddp *d, int sync);
/* After the last micro-batch's backward: posts what is left, waits for all. */
void loom_ddp_finish(struct loom_ddp *d);

#endif
