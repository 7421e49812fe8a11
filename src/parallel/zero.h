/*
 * ZeRO (sharded data parallelism), stages 1-3. The parameter arena is padded
 * to equal shards; rank r of dp owns elements [r*S, (r+1)*S).
 *
 * - stage 0: DDP (ddp.c averages the gradients); one optimizer over all
 *   (no ZeRO strategy on the stack; the partition is the whole arena).
 * - stage 1: DDP for the gradients; the AdamW state covers this rank's shard
 *   only, each rank updates its shard and the parameters are all-gathered
 *   in place after the step.
 * - stage 2: gradients too. There is no full gradient arena: before a
 *   block's backward a transient buffer (counted under comm) receives its
 *   gradient, and as soon as the block is done the buffer is reduce-scattered
 *   into the owners' shards and freed (at most two layers in flight besides
 *   the embedding block, which the tied LM head keeps busy from the first
 *   backward kernel to the last). Every micro-batch reduces; the shard
 *   accumulates. The gradient norm sums the shards' squares (the strategy's
 *   view of the state, loom/strategy.h).
 *
 * - stage 3: parameters too. Each rank keeps only its shard of the
 *   parameters; the blocks are grouped into gather units (one block each, or
 *   consecutive blocks holding at least --zero3-min-params parameters, FSDP's
 *   size-based wrap), and a unit is all-gathered into a transient buffer
 *   before its forward and again before its backward, then freed. The next
 *   unit's gather is posted as soon as the current one starts computing
 *   (FSDP's forward and backward prefetch), so it arrives during compute.
 *   The unit holding the embedding stays gathered from the forward's start
 *   to the optimizer step: the tied LM head needs wte at both ends. Without
 *   --load, no rank ever holds the whole model: weights are initialised
 *   unit by unit.
 *
 * With expert parallelism the shards are over the ranks that hold the same
 * experts (LOOM_GROUP_EXPERT_DP, of dp / ep ranks): a rank's arena holds
 * its experts, and every expert rank's arena the same dense tensors at the
 * same places, so their shards are the same elements; a landed gradient
 * segment's dense runs are summed over the expert group (LOOM_GROUP_EP)
 * too, so a dense gradient is every data rank's. A shard's dense elements
 * are split again over the expert group: each of its ep ranks owns an even
 * share of them (loom_zero_owned_runs). Its optimizer steps them, and after
 * the step the group all-gathers the shares; at stages 2-3 a landed
 * segment's dense sums are reduce-scattered over LOOM_GROUP_EP onto their
 * owners, and the gradient shard holds the owned runs only; at stage 3 so
 * does the parameter shard, and a unit's gather first puts this rank's
 * part together (its runs, and the other expert ranks' dense shares
 * all-gathered over LOOM_GROUP_EP), then all-gathers over the shard group.
 * So the dense optimizer state, gradients and parameters are sharded over
 * all dp ranks, as Megatron's distributed optimizer and DeepSpeed-MoE
 * shard them, and the experts' over dp / ep.
 *
 * Mixed precision: the stored parameters (arena or shard, gathered units) and
 * the reduced gradient shard are 16-bit; gradients travel in float32 (or the
 * --grad-reduce-dtype) and are rounded once as they land in the shard.
 *
 * The strategy sits first on the stack (below mixed precision): it gathers
 * before anyone reads the parameters and provides the blocks' float32
 * gradient buffers (loom_block_provide_grads) at stages 2-3.
 */
#ifndef LOOM_PARALLEL_ZERO_H
#define LOOM_PARALLEL_ZERO_H

#include <stddef.h>
#include <stdint.h>

#include "base/buf.h"
#include "comm/comm.h"
#include "loom/model.h"
#include "optim/adamw.h"
#include "optim/offload.h"
#include "parallel/stack.h"

/* This rank's part of the arena, for the optimizer: elements [begin, end)
 * (end clipped to the parameters; begin == end for a rank whose shard is
 * all padding), in shards of `shard` elements. Without sharding (stage 0)
 * it is the whole model. */
struct loom_partition {
    size_t shard, begin, end;
};

/* The ranks a layout's shards are over: the data-parallel group, or with
 * expert parallelism the ranks that hold the same experts (its size and
 * this rank's place). */
void loom_zero_ranks(const struct loom_topology *t, int *dp, int *dp_rank);

/* The arena multiple a model must be created with for this layout. */
size_t loom_zero_arena_multiple(int stage, int dp);
/* sharded: the optimizer state is (stages 1-3); else the whole model. */
struct loom_partition loom_zero_partition(int sharded, int dp, int dp_rank, const struct loom_model *m);

struct loom_zero_flight; /* a block's gradient on its way to the shards */
struct loom_zero_unit;   /* stage 3: blocks gathered together */

struct loom_zero {
    int stage, dp, dp_rank;
    /* the shards' group: LOOM_GROUP_DP, or with expert parallelism
     * LOOM_GROUP_EXPERT_DP, the dense runs of a landed gradient segment
     * then summed over LOOM_GROUP_EP too (loom_zero_experts_apart) */
    enum loom_group group;
    int experts_apart;
    int dense_first; /* --layout-invariant: the dense runs summed over LOOM_GROUP_EP before the shards' sum */
    int ep, ep_rank; /* expert parallelism (ep > 1): the group the dense elements' shares are over */
    size_t dense_n;  /* the shard's dense elements (outside every block's experts) */
    int *ep_counts;  /* (ep) scratch */
    /* stages 2-3 with expert parallelism: the runs this rank owns
     * (loom_zero_owned_runs), whose gradients alone grad_shard and grad_acc
     * hold, one after another (owned elements); at stage 3 param_shard too */
    struct loom_run *runs;
    int nruns;
    size_t owned;
    int scattered; /* stage 1: the gradients reduce-scattered onto the shards (loom_zero1_scatters) */
    int index;     /* this strategy's place on the stack */
    struct loom_partition part;
    struct loom_model *model;
    enum loom_dtype
        reduce_dtype; /* stages 2-3: F32, or the 16-bit dtype the gradients are reduce-scattered in */
    /* stage 2 */
    struct loom_buf grad_shard; /* (shard) this rank's reduced gradients, in the model's dtype */
    struct loom_buf grad_acc;   /* (shard) mixed precision with accumulation: their float32 sum, or absent */
    struct loom_zero_flight *flights; /* (nblocks) */
    int *order, norder;               /* blocks posted, oldest first */
    int *counts, *displs;             /* (dp) scratch */
    /* stage 3 */
    struct loom_buf param_shard; /* (shard) this rank's parameters, in the model's dtype */
    struct loom_zero_unit *units;
    int nunits, pinned; /* the unit holding the tied embedding's block (kept for the step), or -1 */
    int *unit_of;       /* (nblocks) */
    double wait_s;      /* this step's time blocked on gathers and reductions (stages 2-3) */
    /* --offload-param nvme: param_shard, grad_shard and grad_acc are these
     * mappings of files (data NULL: in memory), each range dropped once used */
    struct loom_offload_map param_map, grad_map, acc_map;
};

/* Pushes the strategy on m's stack. At stage 3 the model's parameter arena
 * (initialised or loaded, identical on every rank) is split: this rank keeps
 * its shard and the arena is freed. min_params: the stage-3 gather unit
 * size (0: one block per unit). reduce_dtype: F32, or under mixed precision
 * the model's 16-bit dtype (--grad-reduce-dtype, stages 2-3), each rank's
 * block gradient rounded once. Mixed precision with gradient accumulation
 * (accumulate_f32) keeps the micro-batches' reduced gradients in a float32
 * shard, rounded into the 16-bit shard once after the last, as DeepSpeed's
 * bf16 optimizer accumulates in float32, so layouts that split the batch
 * differently round the same sum. */
/* offload_dir (stage 3, --offload-param nvme; NULL: none): the parameter
 * and gradient shards are mappings of files there (ZeRO-Infinity's
 * parameter offload): the gather unit in use and the one prefetched are
 * paged in, each dropped once gathered; gradients are dropped as they land
 * (the counting mode of the allocator counts them in memory instead).
 * LOOM_ERR_INPUT naming the directory (and the bytes needed) when it
 * cannot; the strategy is then not pushed and loom_zero_free cleans up.
 * ep > 1: expert parallelism over ep ranks (ep_rank this one's; dp and
 * dp_rank loom_zero_ranks'), loom_zero_experts_apart to follow: at stages
 * 2-3 the gradient shard (at 3 the parameter shard too) holds the owned
 * runs only. */
int loom_zero_init(struct loom_zero *z, int stage, int dp, int dp_rank, struct loom_model *m,
                   int64_t min_params, enum loom_dtype reduce_dtype, int accumulate_f32,
                   const char *offload_dir, int ep, int ep_rank);
/* Stage 3 on a model created without a parameter arena: each rank builds
 * one gather unit at a time (the initialisation draws per tensor, so every
 * rank computes the same values) and keeps its shard of it. */
void loom_zero_init_weights(struct loom_zero *z, uint64_t seed);
/* Expert parallelism, right after loom_zero_init with ep > 1: the shards'
 * collectives over LOOM_GROUP_EXPERT_DP, the dense elements of each landed
 * gradient segment reduce-scattered over LOOM_GROUP_EP onto their owners
 * (loom_zero_owned_runs), and after the step the expert ranks' shares of
 * the shard's dense elements (each updated by its owner's optimizer)
 * all-gathered over LOOM_GROUP_EP; dense_first (--layout-invariant, stages
 * 2-3): each block's dense runs all-reduced over LOOM_GROUP_EP before its
 * reduction instead, so the data ranks add in the pairwise tree over them
 * (each rank then keeps its share). */
void loom_zero_experts_apart(struct loom_zero *z, int dense_first);
/* The runs of partition p this rank's optimizer owns: all of it, or with
 * expert parallelism over ep ranks (ep_rank this one) the experts'
 * elements and this rank's even share of the dense ones (the places
 * [r x ceil(D / ep), (r + 1) x ceil(D / ep)) among the D dense elements,
 * in arena order). runs holds 3 x m->nblocks + 1; returns their count. */
int loom_zero_owned_runs(const struct loom_model *m, struct loom_partition p, int ep, int ep_rank,
                         struct loom_run *runs);
/* Whether ZeRO-1's gradients are reduce-scattered over its shards (DDP's
 * buckets, loom_ddp_shard: each rank's sum valid over its shard, the norm
 * taken over the shards), as Megatron's distributed optimizer does: stage
 * 1 on two or more data-parallel ranks without expert parallelism (whose
 * expert runs are all-reduced over their own group). */
int loom_zero1_scatters(int stage, const struct loom_topology *t);
void loom_zero_free(struct loom_zero *z);

/* This rank's parameters and gradients [begin, end) for the optimizer, in
 * the model's dtype: the stage-3 shard or a slice of the arena; the stage-2
 * shard or a slice of the gradient arena. */
struct loom_buf loom_zero_params(const struct loom_zero *z);
struct loom_buf loom_zero_grads(const struct loom_zero *z);

#endif
