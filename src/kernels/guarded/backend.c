/*
 * The guarded backend: the CPU backend's kernels on memory that only the
 * backend's own calls can reach, so that host code reading or writing one
 * of its buffers directly faults, as it would on a GPU. It proves that
 * every buffer of the model, the strategies and the optimizer goes through
 * the backend (`--backend guarded`).
 *
 * Memory is one large reservation of addresses, PROT_NONE but while one of
 * the backend's calls runs: each memory member and each kernel of its
 * tables opens the region's used part (read and write) around the CPU
 * backend's call and closes it after. Allocations are whole pages of the
 * region, first fit; freed pages are given back to the kernel
 * (MADV_DONTNEED), so they read as zero when reused. A fault inside the
 * region prints one line and a backtrace and exits 1; other faults go to
 * the handler that was there before. loom_devmem (base/mem.h) tells the
 * comm layer which pointers are the backend's and copies them to and from
 * host memory.
 *
 * Deliberately not: a bounds checker (a kernel that runs past a buffer
 * into the next one's pages is not caught), isolation between threads
 * (while any call runs, every buffer is open to every thread), speed
 * (two mprotect calls per kernel).
 */
#include <assert.h>
#include <errno.h>
#include <execinfo.h>
#include <pthread.h>
#include <signal.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "base/log.h"
#include "kernels/backend.h"
#include "kernels/guarded/members.h"

/* ---- the region ------------------------------------------------------------- */

/* A live allocation: pages [off, off + len) of the region, `bytes` asked for. */
struct block {
    size_t off, len, bytes;
    int tag;
};

/* Free pages below the top, for reuse. */
struct span {
    size_t off, len;
};

static struct {
    char *base;
    size_t size; /* addresses reserved */
    size_t page;
    size_t top;           /* pages [0, top) have been handed out: what open() opens */
    int depth;            /* calls running (nested or on other threads) */
    struct block *blocks; /* sorted by off */
    size_t nblocks, capblocks;
    struct span *spans; /* sorted by off, never adjacent */
    size_t nspans, capspans;
} region;

/* Guards everything in `region` (calls come from the main thread, the comm
 * layer's copies from its progress thread). */
static pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER;

static void protect(size_t off, size_t len, int prot)
{
    if (len && mprotect(region.base + off, len, prot) != 0)
        loom_die("mprotect of %zu bytes of the guarded backend's memory to %s: %s", len,
                 prot == PROT_NONE ? "no access" : "read and write", strerror(errno));
}

/* The backend's calls run between these two: the used part of the region
 * is readable and writable while any call runs. */
static void guard_open(void)
{
    pthread_mutex_lock(&lock);
    if (region.depth++ == 0) protect(0, region.top, PROT_READ | PROT_WRITE);
    pthread_mutex_unlock(&lock);
}

static void guard_close(void)
{
    pthread_mutex_lock(&lock);
    LOOM_ASSERT(region.depth > 0);
    if (--region.depth == 0) protect(0, region.top, PROT_NONE);
    pthread_mutex_unlock(&lock);
}

/* ---- faults ------------------------------------------------------------------- */

static struct sigaction prev_segv, prev_bus;

static void put(const char *s)
{
    size_t n = strlen(s);
    while (n > 0) {
        const ssize_t w = write(STDERR_FILENO, s, n);
        if (w <= 0) return;
        s += w, n -= (size_t)w;
    }
}

/* Async-signal-safe: write(2), backtrace (loaded at install), _exit. */
static void on_fault(int sig, siginfo_t *si, void *ctx)
{
    (void)ctx;
    const char *a = si->si_addr;
    if (region.base && a >= region.base && a < region.base + region.size) {
        char hex[2 + 2 * sizeof(uintptr_t) + 1];
        uintptr_t v = (uintptr_t)a;
        int n = 1; /* hex digits */
        while (n < (int)(2 * sizeof v) && v >> (4 * n)) n++;
        hex[0] = '0', hex[1] = 'x', hex[2 + n] = 0;
        for (int i = 0; i < n; i++) hex[2 + n - 1 - i] = "0123456789abcdef"[(v >> (4 * i)) & 15];
        put("loom: error: host code touched the guarded backend's memory at ");
        put(hex);
        put(" (its buffers are reached through the backend's calls only)\n");
        void *frames[64];
        backtrace_symbols_fd(frames, backtrace(frames, 64), STDERR_FILENO);
        _exit(1);
    }
    /* not ours: the disposition from before, and the fault happens again under it */
    sigaction(sig, sig == SIGBUS ? &prev_bus : &prev_segv, NULL);
}

static void install_handler(void)
{
    void *frame;
    backtrace(&frame, 1); /* loads what backtrace needs now, not in the handler */
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_sigaction = on_fault;
    sa.sa_flags = SA_SIGINFO;
    sigemptyset(&sa.sa_mask);
    if (sigaction(SIGSEGV, &sa, &prev_segv) != 0 || sigaction(SIGBUS, &sa, &prev_bus) != 0)
        loom_die("sigaction for the guarded backend's faults: %s", strerror(errno));
}

/* ---- what the comm layer sees (base/mem.h) ------------------------------------------ */

/* The index of the last block starting at or below off, or -1. Under lock. */
static ptrdiff_t block_at_or_below(size_t off)
{
    size_t lo = 0, hi = region.nblocks;
    while (lo < hi) {
        const size_t mid = lo + (hi - lo) / 2;
        if (region.blocks[mid].off <= off)
            lo = mid + 1;
        else
            hi = mid;
    }
    return (ptrdiff_t)lo - 1;
}

static int devmem_owns(const void *p)
{
    const char *c = p;
    if (!region.base || c < region.base || c >= region.base + region.size) return 0;
    const size_t off = (size_t)(c - region.base);
    pthread_mutex_lock(&lock);
    const ptrdiff_t i = block_at_or_below(off);
    const int owns = i >= 0 && off < region.blocks[i].off + region.blocks[i].len;
    pthread_mutex_unlock(&lock);
    return owns;
}

static void devmem_download(void *host, const void *dev, size_t bytes)
{
    guard_open();
    if (bytes) memcpy(host, dev, bytes);
    guard_close();
}

static void devmem_upload(void *dev, const void *host, size_t bytes)
{
    guard_open();
    if (bytes) memcpy(dev, host, bytes);
    guard_close();
}

static const struct loom_devmem guarded_devmem = {
    .owns = devmem_owns,
    .download = devmem_download,
    .upload = devmem_upload,
};

/* Reserves the region, at the first allocation. Under lock. */
static void region_create(void)
{
    const long page = sysconf(_SC_PAGESIZE);
    region.page = page > 0 ? (size_t)page : 4096;
    for (size_t size = (size_t)1 << 40; !region.base && size >= (size_t)1 << 30; size >>= 1) {
        void *r = mmap(NULL, size, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
        if (r != MAP_FAILED) region.base = r, region.size = size;
    }
    if (!region.base)
        loom_die("out of memory: cannot reserve addresses for the guarded backend's memory: %s",
                 strerror(errno));
    install_handler();
    loom_devmem_set(&guarded_devmem);
}

/* ---- allocation ------------------------------------------------------------------- */

static void *grow(void *p, size_t *cap, size_t n, size_t size)
{
    if (n < *cap) return p;
    *cap = *cap ? 2 * *cap : 64;
    p = realloc(p, loom_mul_size(*cap, size));
    if (!p) loom_die("out of memory: the guarded backend's table of allocations");
    return p;
}

/* len bytes (whole pages) of free addresses, first fit, else from the top;
 * SIZE_MAX when the region is full. Under lock. */
static size_t take(size_t len)
{
    for (size_t i = 0; i < region.nspans; i++) {
        struct span *s = &region.spans[i];
        if (s->len < len) continue;
        const size_t off = s->off;
        s->off += len, s->len -= len;
        if (s->len == 0) {
            memmove(s, s + 1, (region.nspans - i - 1) * sizeof *s);
            region.nspans--;
        }
        return off;
    }
    if (region.size - region.top < len) return SIZE_MAX;
    const size_t off = region.top;
    region.top += len;
    /* new pages open only through guard_open; one is open now if a call runs */
    if (region.depth > 0) protect(off, len, PROT_READ | PROT_WRITE);
    return off;
}

/* Pages [off, off + len) free again, merged with their neighbours. Under lock. */
static void give_back(size_t off, size_t len)
{
    size_t i = 0;
    while (i < region.nspans && region.spans[i].off < off) i++;
    struct span *prev = i > 0 ? &region.spans[i - 1] : NULL;
    struct span *next = i < region.nspans ? &region.spans[i] : NULL;
    const int with_prev = prev && prev->off + prev->len == off;
    const int with_next = next && off + len == next->off;
    if (with_prev && with_next) {
        prev->len += len + next->len;
        memmove(next, next + 1, (region.nspans - i - 1) * sizeof *next);
        region.nspans--;
    } else if (with_prev) {
        prev->len += len;
    } else if (with_next) {
        next->off = off, next->len += len;
    } else {
        region.spans = grow(region.spans, &region.capspans, region.nspans, sizeof *region.spans);
        memmove(region.spans + i + 1, region.spans + i, (region.nspans - i) * sizeof *region.spans);
        region.spans[i] = (struct span){off, len};
        region.nspans++;
    }
}

/* The index of the block starting at p (from alloc). Under lock. */
static size_t block_of(const void *p)
{
    const char *c = p;
    LOOM_ASSERT(region.base && c >= region.base && c < region.base + region.top);
    const ptrdiff_t i = block_at_or_below((size_t)(c - region.base));
    LOOM_ASSERT(i >= 0 && region.base + region.blocks[i].off == c);
    return (size_t)i;
}

/* Zero-filled: the pages are fresh, or were given back to the kernel. */
static void *guarded_alloc(size_t bytes, enum loom_mem_tag tag)
{
    LOOM_ASSERT(tag >= 0 && tag < LOOM_MEM_COUNT);
    if (loom_mem_counting()) return loom_alloc_data(bytes, tag);
    pthread_mutex_lock(&lock);
    if (!region.base) region_create();
    size_t off = SIZE_MAX, len = 0;
    if (bytes <= region.size) {
        len = bytes ? (bytes + region.page - 1) / region.page * region.page : region.page;
        off = take(len);
    }
    if (off == SIZE_MAX) {
        const size_t size = region.size, top = region.top;
        pthread_mutex_unlock(&lock);
        loom_die("out of memory: cannot allocate %zu bytes for %s (the guarded backend's %zu bytes of "
                 "addresses, %zu of them handed out)",
                 bytes, loom_mem_tag_name(tag), size, top);
    }
    region.blocks = grow(region.blocks, &region.capblocks, region.nblocks, sizeof *region.blocks);
    const size_t i = (size_t)(block_at_or_below(off) + 1);
    memmove(region.blocks + i + 1, region.blocks + i, (region.nblocks - i) * sizeof *region.blocks);
    region.blocks[i] = (struct block){off, len, bytes, (int)tag};
    region.nblocks++;
    pthread_mutex_unlock(&lock);
    loom_mem_count_device(tag, (int64_t)bytes);
    return region.base + off;
}

static void guarded_free(void *p)
{
    if (!p) return;
    if (loom_mem_is_counted(p)) {
        loom_free(p);
        return;
    }
    pthread_mutex_lock(&lock);
    const size_t i = block_of(p);
    const struct block b = region.blocks[i];
    memmove(region.blocks + i, region.blocks + i + 1, (region.nblocks - i - 1) * sizeof *region.blocks);
    region.nblocks--;
    if (madvise(region.base + b.off, b.len, MADV_DONTNEED) != 0)
        loom_die("madvise of %zu bytes of the guarded backend's memory: %s", b.len, strerror(errno));
    give_back(b.off, b.len);
    pthread_mutex_unlock(&lock);
    loom_mem_count_device((enum loom_mem_tag)b.tag, -(int64_t)b.bytes);
}

static void guarded_retag(void *p, enum loom_mem_tag tag)
{
    LOOM_ASSERT(tag >= 0 && tag < LOOM_MEM_COUNT);
    if (loom_mem_is_counted(p)) {
        loom_mem_retag(p, tag);
        return;
    }
    pthread_mutex_lock(&lock);
    struct block *b = &region.blocks[block_of(p)];
    const enum loom_mem_tag old = (enum loom_mem_tag)b->tag;
    const size_t bytes = b->bytes;
    b->tag = (int)tag;
    pthread_mutex_unlock(&lock);
    if (old == tag) return;
    loom_mem_count_device(old, -(int64_t)bytes);
    loom_mem_count_device(tag, (int64_t)bytes);
}

/* ---- the memory members: the CPU's, with the region open ---------------------------- */

static void guarded_memset(void *p, int value, size_t bytes)
{
    guard_open();
    loom_backend_cpu()->memset(p, value, bytes);
    guard_close();
}

static void guarded_copy(void *dst, const void *src, size_t bytes)
{
    guard_open();
    loom_backend_cpu()->copy(dst, src, bytes);
    guard_close();
}

static void guarded_upload(void *dst, const void *src, size_t bytes)
{
    guard_open();
    loom_backend_cpu()->upload(dst, src, bytes);
    guard_close();
}

static void guarded_download(void *dst, const void *src, size_t bytes)
{
    guard_open();
    loom_backend_cpu()->download(dst, src, bytes);
    guard_close();
}

static void guarded_convert(struct loom_buf dst, struct loom_buf src)
{
    guard_open();
    loom_backend_cpu()->convert(dst, src);
    guard_close();
}

/* ---- the kernel tables ---------------------------------------------------------------- */

/* Every member of struct loom_kernels is in members.h's list. */
#define COUNT_VOID(name, params, args) +1
#define COUNT_RET(type, name, params, args) +1
#define COUNT_PASS(name) +1
static_assert(sizeof(struct loom_kernels) ==
                  (0 LOOM_KERNELS_MEMBERS(COUNT_VOID, COUNT_RET, COUNT_PASS)) * sizeof(void (*)(void)),
              "a member of struct loom_kernels is missing from kernels/guarded/members.h");

/* One wrapped table per distinct table of the CPU backend (its float32 one
 * and its bf16 one): slot S wraps inner[S], each kernel a function
 * guardedS_<name> that opens the region around inner[S]'s. */
#define NSLOTS 2
static const struct loom_kernels *inner[NSLOTS];
static struct loom_kernels wrapped[NSLOTS];

#define WRAP_VOID(S, name, params, args)                                                                     \
    static void guarded##S##_##name params                                                                   \
    {                                                                                                        \
        guard_open();                                                                                        \
        inner[S]->name args;                                                                                 \
        guard_close();                                                                                       \
    }
#define WRAP_RET(S, type, name, params, args)                                                                \
    static type guarded##S##_##name params                                                                   \
    {                                                                                                        \
        guard_open();                                                                                        \
        const type ret_ = inner[S]->name args;                                                               \
        guard_close();                                                                                       \
        return ret_;                                                                                         \
    }
#define SET(S, name) w->name = in->name ? guarded##S##_##name : NULL;
#define SET_PASS(name) w->name = in->name;
#define NO_PASS(name)

/* (clang-format would read a list's expansion as the start of the next declaration) */
// clang-format off
#define WRAP_VOID0(name, params, args) WRAP_VOID(0, name, params, args)
#define WRAP_RET0(type, name, params, args) WRAP_RET(0, type, name, params, args)
#define SET_VOID0(name, params, args) SET(0, name)
#define SET_RET0(type, name, params, args) SET(0, name)
LOOM_KERNELS_MEMBERS(WRAP_VOID0, WRAP_RET0, NO_PASS)
static void wrap0(struct loom_kernels *w, const struct loom_kernels *in)
{
    LOOM_KERNELS_MEMBERS(SET_VOID0, SET_RET0, SET_PASS)
}

#define WRAP_VOID1(name, params, args) WRAP_VOID(1, name, params, args)
#define WRAP_RET1(type, name, params, args) WRAP_RET(1, type, name, params, args)
#define SET_VOID1(name, params, args) SET(1, name)
#define SET_RET1(type, name, params, args) SET(1, name)
LOOM_KERNELS_MEMBERS(WRAP_VOID1, WRAP_RET1, NO_PASS)
static void wrap1(struct loom_kernels *w, const struct loom_kernels *in)
{
    LOOM_KERNELS_MEMBERS(SET_VOID1, SET_RET1, SET_PASS)
}
// clang-format on

static void (*const wrappers[NSLOTS])(struct loom_kernels *, const struct loom_kernels *) = {wrap0, wrap1};

/* The wrapped table of the CPU table in, made at its first use. */
static const struct loom_kernels *wrap(const struct loom_kernels *in)
{
    pthread_mutex_lock(&lock);
    int s = 0;
    while (s < NSLOTS && inner[s] && inner[s] != in) s++;
    LOOM_ASSERT(s < NSLOTS); /* the CPU backend has more tables than NSLOTS */
    if (!inner[s]) {
        wrappers[s](&wrapped[s], in);
        inner[s] = in;
    }
    pthread_mutex_unlock(&lock);
    return &wrapped[s];
}

static const struct loom_kernels *guarded_kernels_for(enum loom_dtype compute)
{
    return wrap(loom_backend_kernels(loom_backend_cpu(), compute));
}

static struct loom_backend guarded_backend = {
    .name = "guarded",
    .device = LOOM_DEVICE_CPU,
    .k = NULL, /* the CPU's float32 table wrapped, at the first call below */
    .alloc = guarded_alloc,
    .free = guarded_free,
    .retag = guarded_retag,
    .memset = guarded_memset,
    .copy = guarded_copy,
    .upload = guarded_upload,
    .download = guarded_download,
    .convert = guarded_convert,
    .synchronize = NULL,
    .setup = NULL, /* set in loom_backend_guarded: the CPU's */
    .kernels_for = guarded_kernels_for,
};

const struct loom_backend *loom_backend_guarded(void)
{
    if (!guarded_backend.k) {
        guarded_backend.k = wrap(loom_backend_cpu()->k);
        guarded_backend.setup = loom_backend_cpu()->setup; /* its kernels are the CPU's */
    }
    return &guarded_backend;
}
