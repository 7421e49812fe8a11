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
 * A tied token embedding (a model's loom_tied_embedding) would otherwise be
 * the last and largest bucket
 * (its gradient is complete only after the embedding's backward). With
 * overlap on, wte gets a bucket of its own, posted right after the LM
 * head's backward, and the embedding lookup's sparse share of its gradient
 * is left out of the backward: afterwards every rank gathers all ranks'
 * (tokens, residual gradient) rows and scatters them in rank order, so all
 * replicas add the same numbers in the same order.
 *
 * The average comes from the loss weight: each rank back-propagates its
 * micro-batch mean times 1/(accumulation x dp), so the sum over ranks is
 * the global mean. Under mixed precision without gradient accumulation,
 * during the backward that reduces, the blocks accumulate into float32
 * bucket buffers that start from the 16-bit gradients (DDP provides the
 * blocks' gradient views, loom_block_provide_grads); they are reduced in
 * float32 (or the --grad-reduce-dtype) and rounded once into the 16-bit
 * gradients. With accumulation the model's float32 accumulator (grad_acc,
 * whose slices mixed precision provides) is reduced in place instead, and
 * the engine rounds it once per step.
 * With expert parallelism a block's expert tensors hold another rank's
 * experts than the dense ones' replicas: a bucket's runs of them are
 * all-reduced over the ranks that hold the same experts
 * (LOOM_GROUP_EXPERT_DP), the rest over dp.
 * The strategy sits first on the stack. Not here: sharding (zero.c).
 */
#ifndef LOOM_PARALLEL_DDP_H
#define LOOM_PARALLEL_DDP_H

#include "base/buf.h"
#include "comm/comm.h"
#include "loom/model.h"

struct loom_ddp_bucket {
    int first_block, last_block; /* blocks [first, last]; the first finishes last */
    size_t base;                 /* the arena offset of its first element */
    struct loom_buf f32; /* float32 over those blocks: the arena, or (mixed precision) a buffer in flight */
    struct loom_buf stored; /* mixed precision: the blocks' 16-bit gradients */
    struct loom_comm_handle *handle;
    /* with expert parallelism, the all-reduces of its runs after the first
     * (the experts' over their group, the dense ones' over dp) */
    struct loom_comm_handle **more;
    int nmore;
    /* ZeRO-1 (loom_ddp_shard): this rank's segment of the sum in flight,
     * landing at recv_off of the bucket */
    struct loom_buf recv;
    size_t recv_off;
};

struct loom_ddp {
    struct loom_model *model;
    int dp, overlap, naive;
    double bucket_mb;             /* --ddp-bucket-size */
    int index;                    /* this strategy's place on the stack */
    int experts_apart;            /* expert parallelism: experts' runs summed over LOOM_GROUP_EXPERT_DP */
    int pooled;                   /* mixed precision without a float32 accumulator: buckets in flight */
    enum loom_dtype reduce_dtype; /* F32, or the 16-bit dtype gradients are summed in (--grad-reduce-dtype) */
    int early_wte;                /* the tied table reduced from the LM head's backward on */
    struct loom_ddp_bucket wte;
    struct loom_ddp_bucket all; /* naive: every gradient */
    float *gathered_dres;       /* (dp,rows,C) for the deferred scatter */
    int32_t *gathered_tokens;   /* (dp,rows) */
    int nbuckets;
    struct loom_ddp_bucket *buckets;
    int *bucket_of; /* (nblocks) */
    int sync;       /* this backward reduces */
    double wait_s;  /* exposed communication of the last step: all that follows the backward */
    /* ZeRO-1: each bucket reduce-scattered over the shards of part (a
     * rank's sum valid in its shard only), not all-reduced */
    int shard, dp_rank;
    size_t shard_numel;
    int *counts; /* (dp) scratch */
};

/* Builds the buckets and pushes the strategy on m's stack. reduce_dtype:
 * F32, or under mixed precision the model's 16-bit dtype (--grad-reduce-dtype:
 * each rank's sum is rounded once and the sum over ranks is done in 16
 * bits, each addition rounded: half the bytes on the wire). early_table:
 * the tied table may go in a bucket of its own, reduced as soon as the
 * head's share is in, its lookup's rows scattered after the reduction (a
 * whole vocabulary, and no --layout-invariant: that reorders the sum). */
void loom_ddp_init(struct loom_ddp *d, struct loom_model *m, int dp, double bucket_mb, int overlap, int naive,
                   enum loom_dtype reduce_dtype, int early_table);
/* With expert parallelism (before the first step): each block's expert
 * tensors (loom_block's expert_lo/hi) are summed over the
 * expert-data-parallel group, the rest over dp as before. */
void loom_ddp_experts_apart(struct loom_ddp *d);
/* ZeRO-1 (Megatron's distributed optimizer): every bucket is
 * reduce-scattered, rank r receiving the sum over its shard of
 * shard_numel elements from r x shard_numel (loom_zero_partition), half an
 * all-reduce's bytes; the rest of a rank's gradients stay its own. Not
 * with experts apart (their runs are all-reduced over two groups). */
void loom_ddp_shard(struct loom_ddp *d, int dp_rank, size_t shard_numel);
void loom_ddp_free(struct loom_ddp *d);

#endif
