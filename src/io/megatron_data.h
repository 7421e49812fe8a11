/*
 * Megatron-Core's dataset rules over indexed datasets (indexed.h): which
 * tokens sample i of the training, validation or test stream holds, exactly
 * as Megatron's BlendedMegatronDatasetBuilder, GPTDataset and BlendedDataset
 * define them, so a loom run reads the samples a Megatron run with the same
 * data, split, seed, sequence length and sizes would read.
 *
 *   blend        --data-path A B (prefixes), or 0.3 A 0.7 B (weights and
 *                prefixes; weights normalised); one blend cut by --split,
 *                or one blend a split (--train/valid/test-data-path).
 *   split        "969,30,1": weights normalised; split k takes sequences
 *                [round(a_k N), round(b_k N)) of every dataset, a_k, b_k the
 *                running sums (Python's round: half to even).
 *   sizes        samples a split must hold: train iters x global batch;
 *                (iters / eval interval + 1) x eval iters x global batch;
 *                eval iters x global batch. A weighted blend asks dataset d
 *                for ceil(ceil(size w_d) x 1.005) and blends sum_d
 *                ceil(size w_d) samples; an unweighted one of several
 *                prefixes takes one epoch of each, weighted by length.
 *   GPTDataset   epochs: as many as size x T + 1 tokens need; the document
 *                (sequence) order: NumPy's RandomState(seed) shuffle of the
 *                epochs' documents (the last epoch shuffled apart when it
 *                is used for less than 80%); samples of T + 1 tokens laid
 *                across document boundaries, consecutive samples sharing
 *                one token; the sample order: a second shuffle (the same
 *                generator), the last epoch's samples apart as above.
 *   Blended      sample i comes from the dataset with the largest deficit
 *                w_d max(i, 1) - taken_d (the first on ties).
 *
 * Everything is built at open, the same on every rank (no
 * communication), from the files and the numbers alone. With a cache
 * directory (--data-cache-path, as Megatron's) each dataset's indices are
 * kept there as .npy files named by a hash of what they are built from
 * (HASH-GPTDataset-train-document_index.npy, ..., and a description.txt),
 * and a later open, on any rank, maps them instead of building them: the
 * ranks of a node share one copy through the page cache.
 *
 * Not here: the file format (indexed.h), which step reads which sample
 * (sampler.h: sample = step x global batch + row).
 */
#ifndef LOOM_IO_MEGATRON_DATA_H
#define LOOM_IO_MEGATRON_DATA_H

#include <stdint.h>

#include "io/indexed.h"

enum { LOOM_SPLIT_TRAIN, LOOM_SPLIT_VALID, LOOM_SPLIT_TEST, LOOM_NSPLITS };

/* One of Megatron's GPTDatasets: a dataset's documents of one split. */
struct loom_gpt_dataset {
    const struct loom_indexed *ix;
    int32_t *doc_order; /* (ndocs) sequence ids, epochs shuffled */
    int64_t ndocs;
    void *samples;    /* (nsamples + 1, 2): position in doc_order, offset; int32 or int64 */
    int samples_wide; /* int64 entries */
    void *shuffle;    /* (nsamples): uint32 or int64 */
    int shuffle_wide;
    int64_t nsamples;
    char key[17]; /* the hash naming its cache files */
    void *map[3]; /* the cache files mapped (read-only; the arrays above point into them), or NULL */
    size_t map_bytes[3];
};

/* A split's stream: one GPTDataset, or a BlendedDataset of several. */
struct loom_split_stream {
    int n;                       /* datasets; 0: no such split */
    struct loom_gpt_dataset *ds; /* (n) */
    int16_t *which;              /* (size) the dataset of sample i; NULL when n == 1 unblended */
    int64_t *which_sample;       /* (size) its sample there */
    int64_t size;                /* samples in the stream */
    void *map[2];                /* which, which_sample from the cache (read-only), or NULL */
    size_t map_bytes[2];
};

struct loom_megatron_data {
    int nix;
    struct loom_indexed *ix; /* (nix) every prefix, opened once */
    struct loom_split_stream split[LOOM_NSPLITS];
};

struct loom_megatron_opts {
    const char *const *blend[LOOM_NSPLITS]; /* --data-path's words (blend[0] only, with split), or
                                             * each split's own (split NULL); NULL: none */
    int nblend[LOOM_NSPLITS];
    const char *split;           /* "969,30,1" with one blend; NULL with per-split blends */
    int64_t sizes[LOOM_NSPLITS]; /* samples each split must hold (0: not built, as
                                  * each split's order is its own) */
    int T;                       /* sequence length */
    uint64_t seed;               /* < 2^32 (NumPy's RandomState) */
    int vocab;                   /* every token below it */
    const char *cache;           /* --data-cache-path: NULL or "" none */
};

/* Opens and indexes the data: LOOM_ERR_INPUT naming the flag, the file or
 * the number that is wrong (a blend with a negative weight, a split with
 * no documents, a bad index). */
int loom_megatron_open(struct loom_megatron_data *m, const struct loom_megatron_opts *o);
void loom_megatron_close(struct loom_megatron_data *m);

/* Tokens of sample i of a stream (i < size): T + 1 int32 into out. */
void loom_megatron_sample(const struct loom_split_stream *s, int64_t i, int T, int32_t *out);

/* The prefix of the dataset sample i of a stream comes from (for messages). */
const char *loom_megatron_sample_source(const struct loom_split_stream *s, int64_t i);

/* Megatron's words for a split ("train", "valid", "test"). */
const char *loom_split_name(int split);

#endif
