/*
 * The accounting allocator: a 64-byte header in front of each block keeps
 * its size and tag; counters are updated atomically so kernels may allocate
 * from OpenMP threads. Not a pool: blocks go straight to the C library.
 */
#include "base/mem.h"

#include <assert.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>

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
static void (*on_failure)(size_t bytes, enum loom_mem_tag tag);

static void reserve_counting(void);

void loom_mem_on_failure(void (*fn)(size_t bytes, enum loom_mem_tag tag))
{
    on_failure = fn;
    /* the handler counts a footprint when memory has run out: its addresses
     * are taken now, while there are some */
    if (fn) reserve_counting();
}
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

/* ---- counting mode: addresses in a reserved region nobody may touch ----------- */

/* A counted block is slot k of the region: address base + 64 k. */
#define COUNT_SLOTS (1u << 22)

struct counted {
    size_t bytes;
    int tag; /* -1: freed */
};

static struct {
    int on;
    char *base;             /* COUNT_SLOTS x 64 bytes, PROT_NONE */
    struct counted *blocks; /* the slots handed out, in order */
    size_t n, cap;
    struct loom_mem_stats st;
} counting;

int loom_mem_is_counted(const void *p)
{
    const char *c = p;
    return counting.base && c >= counting.base && c < counting.base + (size_t)COUNT_SLOTS * 64;
}

static struct counted *counted_of(const void *p)
{
    const size_t k = (size_t)((const char *)p - counting.base) / 64;
    LOOM_ASSERT(k < counting.n && counting.blocks[k].tag >= 0);
    return &counting.blocks[k];
}

static void count_add(int tag, int64_t bytes)
{
    struct loom_mem_stats *st = &counting.st;
    st->current[tag] += bytes;
    st->current_total += bytes;
    if (st->current[tag] > st->peak[tag]) st->peak[tag] = st->current[tag];
    if (st->current_total > st->peak_total) st->peak_total = st->current_total;
}

static void *count_alloc(size_t bytes, int tag)
{
    if (counting.n == counting.cap) {
        LOOM_ASSERT(counting.cap < COUNT_SLOTS);
        counting.cap = counting.cap ? 2 * counting.cap : 4096;
        counting.blocks = realloc(counting.blocks, counting.cap * sizeof *counting.blocks);
        if (!counting.blocks) loom_die("out of memory: cannot count allocations");
    }
    counting.blocks[counting.n] = (struct counted){bytes, tag};
    count_add(tag, (int64_t)bytes);
    return counting.base + 64 * counting.n++;
}

static void count_free(const void *p)
{
    struct counted *c = counted_of(p);
    if (counting.on) count_add(c->tag, -(int64_t)c->bytes);
    c->tag = -1;
    /* the slots past the last one held are free again */
    while (counting.n > 0 && counting.blocks[counting.n - 1].tag < 0) counting.n--;
}

/* The counting window's addresses, reserved once. */
static void reserve_counting(void)
{
    if (counting.base) return;
    void *r =
        mmap(NULL, (size_t)COUNT_SLOTS * 64, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    if (r == MAP_FAILED) loom_die("out of memory: cannot reserve addresses to count allocations");
    counting.base = r;
}

void loom_mem_count_begin(void)
{
    LOOM_ASSERT(!counting.on);
    reserve_counting();
    memset(&counting.st, 0, sizeof counting.st);
    counting.on = 1;
}

int loom_mem_counting(void)
{
    return counting.on;
}

void loom_mem_count_reset_peak(void)
{
    struct loom_mem_stats *st = &counting.st;
    for (int i = 0; i < LOOM_MEM_COUNT; i++) st->peak[i] = st->current[i];
    st->peak_total = st->current_total;
}

void loom_mem_count_peek(struct loom_mem_stats *out)
{
    LOOM_ASSERT(counting.on);
    *out = counting.st;
}

void loom_mem_count_end(struct loom_mem_stats *out)
{
    LOOM_ASSERT(counting.on);
    counting.on = 0;
    if (out) *out = counting.st;
}

void *loom_alloc_data(size_t bytes, enum loom_mem_tag tag)
{
    LOOM_ASSERT(tag >= 0 && tag < LOOM_MEM_COUNT);
    return counting.on ? count_alloc(bytes, tag) : loom_alloc(bytes, tag);
}

void *loom_alloc(size_t bytes, enum loom_mem_tag tag)
{
    LOOM_ASSERT(tag >= 0 && tag < LOOM_MEM_COUNT);
    if (counting.on && tag != LOOM_MEM_OTHER) return count_alloc(bytes, tag);
    if (bytes > SIZE_MAX - 2 * HEADER) loom_die("size overflow allocating %s", tag_names[tag]);
    size_t total = (bytes + HEADER + 63) & ~(size_t)63;
    char *base = aligned_alloc(64, total);
    if (!base) {
        void (*fn)(size_t, enum loom_mem_tag) = on_failure;
        on_failure = NULL; /* once: what it allocates may fail too */
        if (fn) fn(bytes, tag);
        loom_die("out of memory: cannot allocate %zu bytes for %s", bytes, tag_names[tag]);
    }
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
    if (loom_mem_is_counted(p)) {
        struct counted *c = counted_of(p);
        if (counting.on) {
            count_add(c->tag, -(int64_t)c->bytes);
            count_add(tag, (int64_t)c->bytes);
        }
        c->tag = tag;
        return;
    }
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
    if (loom_mem_is_counted(p)) {
        count_free(p);
        return;
    }
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
    if (loom_mem_is_counted(p)) {
        const struct counted c = *counted_of(p);
        loom_free(p);
        return loom_alloc(bytes, (enum loom_mem_tag)c.tag);
    }
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

static const struct loom_devmem *devmem;

void loom_devmem_set(const struct loom_devmem *d)
{
    devmem = d;
}

const struct loom_devmem *loom_devmem(void)
{
    return devmem;
}

void loom_mem_count_device(enum loom_mem_tag tag, int64_t bytes)
{
    LOOM_ASSERT(tag >= 0 && tag < LOOM_MEM_COUNT);
    int64_t c = __atomic_add_fetch(&current[tag], bytes, __ATOMIC_RELAXED);
    if (bytes > 0) raise_peak(&peak[tag], c);
    int64_t t = __atomic_add_fetch(&current_total, bytes, __ATOMIC_RELAXED);
    if (bytes > 0) raise_peak(&peak_total, t);
}
