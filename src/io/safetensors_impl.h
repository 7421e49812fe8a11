/*
 * Helpers the safetensors reader and writer share (not public).
 */
#ifndef LOOM_IO_SAFETENSORS_IMPL_H
#define LOOM_IO_SAFETENSORS_IMPL_H

#include <stddef.h>
#include <stdint.h>

/* The largest integer a JSON number (a double) holds exactly. */
#define LOOM_ST_MAX_EXACT_INT ((uint64_t)1 << 53)

/* A string fit for a one-line message: control bytes become '?', a long one
 * is cut with "...". */
const char *loom_st_shown(const char *s, char *buf, size_t cap);
/* LOOM_ERR_INPUT with "PATH: message". */
int loom_st_bad_file(const char *path, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
/* Compares two (key, value) pairs, or two keys, by key. */
int loom_st_cmp_pair_key(const void *a, const void *b);

#endif
