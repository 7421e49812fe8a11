/*
 * The accounting allocator. Every large allocation is tagged with what it
 * holds, so memory can be reported per category (params, grads, optimizer,
 * activations, comm, other), current and peak. Allocations are 64-byte
 * aligned and zero-filled. Out of memory is a runtime failure (exit 1) that
 * names the tag and the size.
 */
#ifndef LOOM_BASE_MEM_H
#define LOOM_BASE_MEM_H

#include <stddef.h>
#include <stdint.h>

enum loom_mem_tag {
    LOOM_MEM_PARAMS = 0,
    LOOM_MEM_GRADS = 1,
    LOOM_MEM_OPTIMIZER = 2,
    LOOM_MEM_ACTIVATIONS = 3,
    LOOM_MEM_COMM = 4,
    LOOM_MEM_OTHER = 5,
    LOOM_MEM_COUNT
};

struct loom_mem_stats {
    int64_t current[LOOM_MEM_COUNT];
    int64_t peak[LOOM_MEM_COUNT];
    int64_t current_total;
    int64_t peak_total;
};

/* Zero-filled, 64-byte aligned; exits 1 naming tag and size when it fails. */
void *loom_alloc(size_t bytes, enum loom_mem_tag tag);
void loom_free(void *p);
/* The allocation p counts under tag from now on (a reused buffer changes hands). */
void loom_mem_retag(void *p, enum loom_mem_tag tag);
/* p (from loom_alloc, or NULL) resized to `bytes` under its tag (tag when p
 * is NULL): the contents up to the smaller size are kept, the rest is zero.
 * Exits 1 like loom_alloc. */
void *loom_realloc(void *p, size_t bytes, enum loom_mem_tag tag);
/* A copy of s through loom_alloc (LOOM_MEM_OTHER; loom_free it). Exits 1
 * like loom_alloc. */
char *loom_xstrdup(const char *s);

/* n * size, exiting with a clear message on overflow (Lua's luaM_checksize). */
size_t loom_mul_size(size_t n, size_t size);

const char *loom_mem_tag_name(enum loom_mem_tag tag);
void loom_mem_get_stats(struct loom_mem_stats *out);
/* Starts a new peak window (e.g. per training step): peaks := current. */
void loom_mem_reset_peak(void);

#endif
