/*
 * The accounting allocator: a 64-byte header in front of each block keeps
 * its size and tag; counters are updated atomically so kernels may allocate
 * from OpenMP threads. Not a pool: blocks go straight to the C library.
 */
#include "base/mem.h"

#include <assert.h>
#include <stdlib.h>
#include <string.h>

#include "base/log.h"

#define HEADER 64

struct header {
    size_t bytes;
    int tag;
    uint32_t magic;
};
#define MAGIC 0x6c6f6f6du

static const char *const tag_names[] = {"params", "grads", "optimizer", "activations", "comm", "other"};
static_assert(sizeof tag_names / sizeof tag_names[0] == LOOM_MEM_COUNT, "tag_names");

static int64_t current[LOOM_MEM_COUNT], peak[LOOM_MEM_COUNT];
static int64_t current_total, peak_total;

static void raise_peak(int64_t *p, int64_t v)
{
    int64_t old = __atomic_load_n(p, __ATOMIC_RELAXED);
    while (v > old && !__atomic_compare_exchange_n(p, &old, v, 1, __ATOMIC_RELAXED, __ATOMIC_RELAXED))
        ;
}

size_t loom_mul_size(size_t n, size_t size)
{
    if (size != 0 && n > SIZE_MAX / size) loom_die("size overflow: %zu x %zu bytes", n, size);
    return n * size;
}

void *loom_alloc(size_t bytes, enum loom_mem_tag tag)
{
    LOOM_ASSERT(tag >= 0 && tag < LOOM_MEM_COUNT);
    if (bytes > SIZE_MAX - 2 * HEADER) loom_die("size overflow allocating %s", tag_names[tag]);
    size_t total = (bytes + HEADER + 63) & ~(size_t)63;
    char *base = aligned_alloc(64, total);
    if (!base) loom_die("out of memory: cannot allocate %zu bytes for %s", bytes, tag_names[tag]);
    memset(base + HEADER, 0, bytes);
    struct header *h = (struct header *)base;
    h->bytes = bytes;
    h->tag = tag;
    h->magic = MAGIC;
    int64_t c = __atomic_add_fetch(&current[tag], (int64_t)bytes, __ATOMIC_RELAXED);
    raise_peak(&peak[tag], c);
    int64_t t = __atomic_add_fetch(&current_total, (int64_t)bytes, __ATOMIC_RELAXED);
    raise_peak(&peak_total, t);
    return base + HEADER;
}

void loom_mem_retag(void *p, enum loom_mem_tag tag)
{
    struct header *h = (struct header *)((char *)p - HEADER);
    LOOM_ASSERT(h->magic == MAGIC && tag >= 0 && tag < LOOM_MEM_COUNT);
    if (h->tag == (int)tag) return;
    __atomic_sub_fetch(&current[h->tag], (int64_t)h->bytes, __ATOMIC_RELAXED);
    raise_peak(&peak[tag], __atomic_add_fetch(&current[tag], (int64_t)h->bytes, __ATOMIC_RELAXED));
    h->tag = tag;
}

void loom_free(void *p)
{
    if (!p) return;
    struct header *h = (struct header *)((char *)p - HEADER);
    LOOM_ASSERT(h->magic == MAGIC);
    h->magic = 0;
    __atomic_sub_fetch(&current[h->tag], (int64_t)h->bytes, __ATOMIC_RELAXED);
    __atomic_sub_fetch(&current_total, (int64_t)h->bytes, __ATOMIC_RELAXED);
    free(h);
}

void *loom_realloc(void *p, size_t bytes, enum loom_mem_tag tag)
{
    if (!p) return loom_alloc(bytes, tag);
    const struct header *h = (const struct header *)((char *)p - HEADER);
    LOOM_ASSERT(h->magic == MAGIC);
    void *q = loom_alloc(bytes, (enum loom_mem_tag)h->tag);
    memcpy(q, p, h->bytes < bytes ? h->bytes : bytes);
    loom_free(p);
    return q;
}

char *loom_xstrdup(const char *s)
{
    size_t n = strlen(s) + 1;
    char *d = loom_alloc(n, LOOM_MEM_OTHER);
    memcpy(d, s, n);
    return d;
}

const char *loom_mem_tag_name(enum loom_mem_tag tag)
{
    LOOM_ASSERT(tag >= 0 && tag < LOOM_MEM_COUNT);
    return tag_names[tag];
}

void loom_mem_get_stats(struct loom_mem_stats *out)
{
    for (int i = 0; i < LOOM_MEM_COUNT; i++) {
        out->current[i] = __atomic_load_n(&current[i], __ATOMIC_RELAXED);
        out->peak[i] = __atomic_load_n(&peak[i], __ATOMIC_RELAXED);
    }
    out->current_total = __atomic_load_n(&current_total, __ATOMIC_RELAXED);
    out->peak_total = __atomic_load_n(&peak_total, __ATOMIC_RELAXED);
}

void loom_mem_reset_peak(void)
{
    for (int i = 0; i < LOOM_MEM_COUNT; i++)
        __atomic_store_n(&peak[i], __atomic_load_n(&current[i], __ATOMIC_RELAXED), __ATOMIC_RELAXED);
    __atomic_store_n(&peak_total, __atomic_load_n(&current_total, __ATOMIC_RELAXED), __ATOMIC_RELAXED);
}
