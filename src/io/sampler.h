/*
 * A dataset (one or more token shards) and the samplers that turn a step
 * into the rows of its global batch.
 *
 * Every batch is a pure function of (data, order, seed, step, global row
 * index): a rank or micro-batch asks for its range of global rows and gets
 * exactly the rows the single-process run would have used there, so the
 * global batch is the same for every layout, and resuming needs only the
 * step. Two orders:
 *
 *   shuffled (default)  global row r of step s is the window of T+1 tokens
 *                       starting at a position drawn from loom_hash3(seed,
 *                       s, r), uniform over every window start of every shard
 *                       (W = sum over shards of max(0, n_i - T)); a window
 *                       never crosses a shard boundary.
 *   sequential          llm.c's loader: shard i holds
 *                       nb_i = floor((n_i - 1) / (B*T)) blocks of B*T+1
 *                       tokens starting at multiples of B*T; blocks are
 *                       numbered shard by shard, step s reads block
 *                       s mod sum(nb_i), and row b of it is tokens
 *                       [b*T, b*T+T] of the block.
 *
 * A Megatron dataset (megatron_data.h) has its own order, the one a
 * Megatron run reads: global row r of step s is sample s*B + r of the
 * split's stream (evaluation batch i: sample i*B + r of the validation
 * stream), whatever `order` says.
 *
 * B is the global batch (rows per step over all micro-batches and ranks).
 * Row t of the inputs is the window's tokens 0..T-1, of the targets 1..T.
 *
 * Not here: the file format (shard.h), prefetching or caching (the shards
 * are mapped; the page cache is the cache).
 */
#ifndef LOOM_IO_SAMPLER_H
#define LOOM_IO_SAMPLER_H

#include <stdint.h>

#include "io/megatron_data.h"
#include "io/shard.h"
#include "loom/config.h" /* enum loom_data_order */

/* "shuffled", "sequential". */
const char *loom_data_order_name(enum loom_data_order order);
/* LOOM_ERR_INPUT naming the value and the choices when `name` is unknown. */
int loom_data_order_parse(const char *name, enum loom_data_order *out);

/* Evaluation batches come from the shuffled order under this fixed seed,
 * whatever the training seed: the same windows at every evaluation and in
 * every run, starting at uniformly random positions (so a corpus with a
 * period that divides T is not always cut at the same phase). */
#define LOOM_DATA_EVAL_SEED 0x6576616c5f736565ull

struct loom_data {
    struct loom_shard *shards; /* (nshards), in the order given, globs sorted */
    int nshards;
    int vocab;                              /* every token id is < vocab (checked at open) */
    int64_t tokens;                         /* sum of the shards' token counts */
    const struct loom_split_stream *stream; /* a Megatron dataset's split instead of shards (not owned) */
};

/* The data as a Megatron split's stream (no shards). */
void loom_data_from_stream(struct loom_data *d, const struct loom_split_stream *s, int vocab);

/* Opens every shard named by `paths` (each a file or a glob(3) pattern,
 * expanded in sorted order; a pattern matching nothing is an error naming
 * it) and checks every token id against `vocab`. LOOM_ERR_INPUT with the
 * culprit named on any bad path, shard or token. */
int loom_data_open(struct loom_data *d, const char *const *paths, int npaths, int vocab);
void loom_data_close(struct loom_data *d);

/* Whether `order` can feed batches of `global_rows` rows of T tokens from
 * this data: LOOM_ERR_INPUT with every number in the message when it cannot
 * (sequential: no shard holds global_rows*T+1 tokens; shuffled: no shard
 * holds T+1). Call it once at start-up; loom_data_batch asserts it. */
int loom_data_check(const struct loom_data *d, enum loom_data_order order, int global_rows, int T);

/* Token count of the largest shard (for messages). */
int64_t loom_data_largest_shard(const struct loom_data *d);

/* Number of batches one pass over the data holds in `order` (sequential:
 * sum of nb_i; shuffled: W / global_rows, the windows of one epoch). */
int64_t loom_data_batches(const struct loom_data *d, enum loom_data_order order, int global_rows, int T);

/* Global rows [row_begin, row_begin + rows) of step `step`'s batch of
 * `global_rows` rows: inputs and targets, each (rows, T) int32.
 * `seed` is used by the shuffled order only. LOOM_ERR_RUNTIME naming the
 * shard and the position when its file changed under the run (truncated:
 * the read is caught; rewritten: a token outside the vocabulary). */
int loom_data_batch(const struct loom_data *d, enum loom_data_order order, uint64_t seed, int64_t step,
                    int global_rows, int row_begin, int rows, int T, int32_t *inputs, int32_t *targets);
/* The same for a step whose first sample is `first` (a batch-size rampup:
 * the samples of the steps before it; loom_data_batch's is step x
 * global_rows): a Megatron stream reads samples first + row; the shuffled
 * order keys rows by step as before; the sequential order's blocks are of
 * one global batch (first must be step x global_rows). */
int loom_data_batch_from(const struct loom_data *d, enum loom_data_order order, uint64_t seed, int64_t step,
                         int64_t first, int global_rows, int row_begin, int rows, int T, int32_t *inputs,
                         int32_t *targets);

/* Evaluation batch `index`: loom_data_batch in the shuffled order under
 * LOOM_DATA_EVAL_SEED. */
int loom_data_eval_batch(const struct loom_data *d, int64_t index, int global_rows, int row_begin, int rows,
                         int T, int32_t *inputs, int32_t *targets);

#endif
