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
/* The same for a data buffer that code only reads and writes through
 * kernels (the pool's): counted in the counting mode below even under
 * LOOM_MEM_OTHER. */
void *loom_alloc_data(size_t bytes, enum loom_mem_tag tag);
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

/* Called once, before the exit, when an allocation fails (the trainer
 * explains its memory there); NULL for none. */
void loom_mem_on_failure(void (*fn)(size_t bytes, enum loom_mem_tag tag));

/* n * size, exiting with a clear message on overflow (Lua's luaM_checksize). */
size_t loom_mul_size(size_t n, size_t size);

const char *loom_mem_tag_name(enum loom_mem_tag tag);
void loom_mem_get_stats(struct loom_mem_stats *out);
/* Starts a new peak window (e.g. per training step): peaks := current. */
void loom_mem_reset_peak(void);

/* Counting instead of allocating: the footprint of a layout without its
 * memory (engine/footprint.h, loom plan, --dry-run). Between begin and end,
 * loom_alloc of any tag but LOOM_MEM_OTHER (the small bookkeeping, which is
 * written) takes no memory: it returns a distinct address that faults when
 * touched and counts the bytes in the counting window's own current and
 * peak, apart from the real counters. loom_free of such an address (in the
 * window or after it) uncounts it; loom_realloc and loom_mem_retag work on
 * it as on a real block. Not thread-safe: one thread, nothing else
 * allocating. end gives the window's counters. */
void loom_mem_count_begin(void);
/* Whether the counting window is open (a footprint being counted). */
int loom_mem_counting(void);
/* A new peak window in the counting (peaks := current), as loom_mem_reset_peak. */
void loom_mem_count_reset_peak(void);
void loom_mem_count_end(struct loom_mem_stats *out);
/* The window's counters so far, the window left open. */
void loom_mem_count_peek(struct loom_mem_stats *out);
/* Whether p is a counted address (it must not be touched). */
int loom_mem_is_counted(const void *p);

/* Device memory that host code cannot touch. A backend whose buffers are
 * not host memory (kernels/backend.h) sets how to tell them and copy them
 * to and from host memory, so the layers below the kernels (comm) stage
 * them through host copies as a transport without device support must;
 * NULL (the CPU's): every buffer is host memory. */
struct loom_devmem {
    int (*owns)(const void *p); /* p lies in one of the device's buffers */
    void (*download)(void *host, const void *dev, size_t bytes);
    void (*upload)(void *dev, const void *host, size_t bytes);
};
void loom_devmem_set(const struct loom_devmem *d);
const struct loom_devmem *loom_devmem(void);
/* bytes (> 0: taken, < 0: given back) of a backend's own memory counted
 * under tag, as loom_alloc counts its blocks */
void loom_mem_count_device(enum loom_mem_tag tag, int64_t bytes);

#endif
