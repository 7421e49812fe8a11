/*
 * Megatron's indexed datasets: PREFIX.bin (the tokens of every sequence,
 * back to back) and PREFIX.idx, the index that Megatron-Core's
 * IndexedDataset reads and its tools/preprocess_data.py writes:
 *
 *   "MMIDIDX\0\0"              9 bytes
 *   version                    uint64, 1
 *   dtype code                 uint8: 1 uint8, 2 int8, 3 int16, 4 int32,
 *                              5 int64, 8 uint16 (6, 7 are floats: refused)
 *   S, the sequence count      uint64
 *   D, the document count + 1  uint64
 *   sequence lengths           int32 (S), in tokens
 *   sequence pointers          int64 (S), byte offsets into the .bin
 *   document indices           int64 (D): 0, then the sequence count after
 *                              each document (an empty document repeats it)
 *   [sequence modes]           int8 (S), multimodal datasets only: ignored
 *
 * All little-endian. Both files are mapped read-only and validated once at
 * open (header, sizes, every pointer and length inside the .bin, the
 * document indices, and, given a vocabulary, every token), so training
 * never meets a bad id or reads past a file. The writer makes what
 * Megatron's preprocessing makes, byte for byte: one sequence a document,
 * uint16 tokens below 65,500 ids, else int32.
 *
 * Not here: which tokens make a sample (megatron_data.h), tokenizing.
 */
#ifndef LOOM_IO_INDEXED_H
#define LOOM_IO_INDEXED_H

#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#include "io/fs.h"

enum {
    LOOM_MMIDIDX_UINT8 = 1,
    LOOM_MMIDIDX_INT8 = 2,
    LOOM_MMIDIDX_INT16 = 3,
    LOOM_MMIDIDX_INT32 = 4,
    LOOM_MMIDIDX_INT64 = 5,
    LOOM_MMIDIDX_UINT16 = 8,
};

struct loom_indexed {
    char *prefix;                                        /* owned copy, for messages */
    int dtype, width;                                    /* the code; bytes per token */
    int64_t nseq, ndoc;                                  /* S sequences; D document indices */
    int64_t longest;                                     /* the longest sequence's tokens */
    const unsigned char *lengths, *pointers, *doc_index; /* int32 (S), int64 (S), int64 (D): in the
                                                          * mapping, unaligned (the header is 34
                                                          * bytes); read through the accessors */
    const unsigned char *bin;                            /* the .bin's bytes (NULL when it is empty) */
    void *idx_map, *bin_map;
    size_t idx_bytes, bin_bytes;
};

/* Whether PREFIX.idx and PREFIX.bin both exist (a Megatron dataset, not a
 * loom/llm.c shard); PREFIX may also name either file, whose suffix is then
 * stripped into `prefix` (of n bytes). */
int loom_indexed_exists(const char *path, char *prefix, size_t n);

/* Maps and validates PREFIX.idx/.bin. With vocab > 0 every token must lie
 * in [0, vocab). LOOM_ERR_INPUT naming the file and what is wrong. */
int loom_indexed_open(struct loom_indexed *d, const char *prefix, int vocab);
void loom_indexed_close(struct loom_indexed *d);

/* Sequence s's length and byte offset; document index i. */
int64_t loom_indexed_length(const struct loom_indexed *d, int64_t s);
int64_t loom_indexed_pointer(const struct loom_indexed *d, int64_t s);
int64_t loom_indexed_doc(const struct loom_indexed *d, int64_t i);

/* Token i of sequence s (both in range). */
int64_t loom_indexed_token(const struct loom_indexed *d, int64_t s, int64_t i);

/* The writer: documents in order, each one sequence; PREFIX.bin is written
 * as it is made and PREFIX.idx at the end, both crash-safely (nothing at
 * either name until finish succeeds). dtype: LOOM_MMIDIDX_UINT16 or _INT32
 * (loom_indexed_dtype_for picks Megatron's choice). */
struct loom_indexed_writer {
    struct loom_fs_atomic bin;
    char idx_path[4200];
    int dtype, width;
    int32_t *lengths;
    int64_t *doc_index;
    int64_t nseq, ndoc, cap_seq, cap_doc;
    void *buf;
    size_t buf_cap;
};
int loom_indexed_dtype_for(int64_t vocab);
int loom_indexed_writer_open(struct loom_indexed_writer *w, const char *prefix, int dtype);
/* A document of n tokens (n = 0: an empty document, no sequence). */
int loom_indexed_writer_add(struct loom_indexed_writer *w, const int32_t *ids, int64_t n);
int loom_indexed_writer_finish(struct loom_indexed_writer *w);
/* After a failure (or instead of finish): removes what was made. */
void loom_indexed_writer_abort(struct loom_indexed_writer *w);

#endif
