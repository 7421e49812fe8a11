/*
 * What a run reads: the flags' data opened as the sampler's datasets.
 *
 *   token shards      --data-path (or --train-data-path) and
 *                     --valid-data-path: llm.c's files or globs;
 *   the built-in      without --data-path (loom train), or with --mock-data
 *   corpus            (loom eval): generated into the cache once;
 *   Megatron's        paths naming PREFIX.bin + PREFIX.idx, or a weighted
 *   datasets          blend: --data-path cut by --split, or a blend a split
 *                     (--train/valid/test-data-path), sized as Megatron
 *                     sizes them (io/megatron_data.h): train iters x global
 *                     batch; (iters / eval interval + 1) x eval iters x
 *                     global batch; eval iters x global batch.
 *
 * Not here: which rows a step reads (io/sampler.h), the formats.
 */
#ifndef LOOM_APP_RUN_DATA_H
#define LOOM_APP_RUN_DATA_H

#include "io/megatron_data.h"
#include "io/sampler.h"
#include "loom/config.h"

struct loom_run_data {
    struct loom_data train, valid, test;
    int have_valid, have_test;          /* test: Megatron's test split, scored after training */
    double floor_nats;                  /* entropy rate of the built-in corpus, 0 otherwise */
    struct loom_megatron_data megatron; /* Megatron datasets' streams, when the paths name them */
};

/* The training data (when training) and the validation (and test) data:
 * the flags' files, else the built-in corpus (loom eval's only with
 * --mock-data). LOOM_ERR_INPUT naming the flag or file that is wrong. */
int loom_run_data_open(struct loom_run_data *d, const struct loom_config *cfg, int training);
void loom_run_data_close(struct loom_run_data *d);

#endif
