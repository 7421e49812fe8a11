/*
 * safetensors files: a safe reader and a crash-safe writer.
 *
 * Layout: an 8-byte little-endian u64 N, N bytes of JSON header, then the
 * data. The header maps each tensor name to {"dtype", "shape",
 * "data_offsets": [begin, end]} (offsets relative to the first data byte)
 * and may hold "__metadata__", an object of string values.
 *
 * The reader maps the file read-only and checks everything before handing
 * out a pointer: sizes, the header's bytes (UTF-8, no NUL) and JSON, dtypes,
 * shapes, offsets, overlaps, duplicate names. Any violation is
 * LOOM_ERR_INPUT with one line naming the file and the tensor or field.
 * Reading interprets nothing but this layout. Tensor views point into the
 * mapping; they stay valid until loom_st_close and may be unaligned in files
 * from other writers.
 *
 * The writer puts tensors in the data area by element size (largest first),
 * then by name, with the header padded by spaces to a multiple of 8 bytes,
 * so every tensor in a file written here is aligned to its element size. It
 * writes to PATH.tmp.<pid>, fsyncs, renames and fsyncs the directory.
 *
 * Not here: byte swapping (little-endian hosts only), the 8-bit float
 * dtypes, streaming reads without mmap, and checkpoint layout (io/ckpt).
 */
#ifndef LOOM_IO_SAFETENSORS_H
#define LOOM_IO_SAFETENSORS_H

#include <stddef.h>
#include <stdint.h>

#include "base/dtype.h"

#define LOOM_ST_MAX_DIMS 8
#define LOOM_ST_MAX_HEADER ((uint64_t)100 * 1000 * 1000) /* bytes of JSON */

/* Values grow only at the end. Names are the format's dtype strings. */
/* Tensor dtypes are base/dtype.h's enum loom_dtype. */

/* "F32", "BF16", ...; NULL for a value out of range. */
const char *loom_st_dtype_name(enum loom_dtype dtype);
/* Bytes per element; 0 for a value out of range. */
size_t loom_st_dtype_size(enum loom_dtype dtype);
/* Parses a dtype string; returns 0 and sets *out, or -1 when unknown. */
int loom_st_dtype_parse(const char *name, enum loom_dtype *out);

/* A tensor in an open file. */
struct loom_st_tensor {
    const char *name;
    enum loom_dtype dtype;
    int ndim;                        /* 0 (a scalar) .. LOOM_ST_MAX_DIMS */
    int64_t shape[LOOM_ST_MAX_DIMS]; /* entries past ndim are 0 */
    uint64_t numel;                  /* product of shape (1 for a scalar) */
    const void *data;                /* into the mapping; maybe unaligned */
    size_t nbytes;                   /* numel * dtype size */
    uint64_t offset;                 /* data_offsets[0], from the data area */
};

/* An open file. Fields are read-only for callers. */
struct loom_st {
    char *path;
    const unsigned char *map; /* the whole file, PROT_READ */
    size_t map_size;
    int mapped;                     /* map is our mmap: loom_st_close unmaps it */
    char *strings;                  /* owns the names and metadata strings */
    struct loom_st_tensor *tensors; /* sorted by name */
    int ntensors;
    const char **meta; /* key, value pairs sorted by key */
    int nmeta;
};

/* Maps and validates `path`. On failure *st is left closed (safe to close
 * again). LOOM_ERR_INPUT for a missing or malformed file, LOOM_ERR_RUNTIME
 * when mapping fails. */
int loom_st_open(struct loom_st *st, const char *path);
/* Validates `size` bytes at `buf` as the content of a file named `name` (for
 * messages), with the same checks as loom_st_open. The tensors point into
 * buf, which must outlive st; loom_st_close leaves buf alone. For tests and
 * fuzzing, where an exact-size buffer lets the sanitizer see any read past
 * the end that a page-rounded mapping would hide. */
int loom_st_open_memory(struct loom_st *st, const char *name, const void *buf, size_t size);
void loom_st_close(struct loom_st *st);

/* The tensor named `name`, or NULL. */
const struct loom_st_tensor *loom_st_find(const struct loom_st *st, const char *name);
/* Iteration in name order: for (i = 0; i < loom_st_count(st); i++) loom_st_at(st, i). */
int loom_st_count(const struct loom_st *st);
const struct loom_st_tensor *loom_st_at(const struct loom_st *st, int i);

/* The metadata value for `key`, or NULL. */
const char *loom_st_meta(const struct loom_st *st, const char *key);
/* Iteration over metadata in key order. */
int loom_st_meta_count(const struct loom_st *st);
void loom_st_meta_at(const struct loom_st *st, int i, const char **key, const char **value);

/* Converts a F32, F16, BF16 or F64 tensor to float32 into dst, which holds
 * n == t->numel floats (F16 and BF16 convert exactly; F64 rounds to
 * nearest). LOOM_ERR_INPUT for another dtype or a wrong n. */
int loom_st_read_f32(const struct loom_st_tensor *t, float *dst, size_t n);

/* A tensor to write: `data` holds numel(shape) * dtype size bytes; or,
 * with data NULL, `fill` makes them as they are written (a tensor that is
 * not in memory whole), called in order for [at, at + n) of the tensor's
 * bytes, n at most LOOM_ST_FILL_BYTES; a status other than LOOM_OK stops
 * the write with it. */
#define LOOM_ST_FILL_BYTES ((size_t)16 << 20)
struct loom_st_tensor_in {
    const char *name;
    enum loom_dtype dtype;
    int ndim;
    int64_t shape[LOOM_ST_MAX_DIMS];
    const void *data;
    int (*fill)(void *ctx, uint64_t at, void *dst, size_t n);
    void *fill_ctx;
};

/* Writes `n` tensors and `nmeta` metadata pairs (meta_kv[2*i] is a key,
 * meta_kv[2*i+1] its value) to `path`, crash-safely. LOOM_ERR_INPUT for bad
 * arguments (duplicate or reserved names, bad dtype or shape), and
 * LOOM_ERR_RUNTIME for a system call that fails, naming the operation and
 * the file with strerror. A failure before the rename removes the temporary
 * file and leaves whatever was at `path` untouched; only the final directory
 * fsync can fail after `path` holds the new, complete file. Two writers of
 * one path in one process at once are not supported (same temporary name). */
int loom_st_write(const char *path, const struct loom_st_tensor_in *tensors, int n,
                  const char *const *meta_kv, int nmeta);
/* The same, for metadata that describes the data as it is written (its
 * checksums): once every tensor is written, restamp(ctx) may change the
 * values meta_kv points to, keeping their lengths, and the header is
 * written again. LOOM_ERR_RUNTIME when a length changed. */
int loom_st_write_restamped(const char *path, const struct loom_st_tensor_in *tensors, int n,
                            const char *const *meta_kv, int nmeta, void (*restamp)(void *ctx), void *ctx);

#endif
