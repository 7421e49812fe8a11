/* AdamW over runs of the arena: state, gradient norm, clipping, the step. */
#include "optim/adamw.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "base/dtype.h"
#include "base/log.h"
#include "base/mem.h"
#include "kernels/backend.h"
#include "optim/offload.h"

enum {
    LP_CHUNK = 1 << 16 /* elements of master weights and gradients handled at once under mixed precision */
};

/* Offload's buffer sets: file I/O reads into the host set SET_IN and
 * writes from the host set SET_OUT (their numbers are also the offload
 * file's slots), and the chunk being updated is on the backend: three sets
 * in all. */
enum { SET_IN = 0, SET_OUT = 1, HOST_SETS = 2, SETS = HOST_SETS + 1 };

void loom_adamw_init(struct loom_adamw *opt, const struct loom_backend *b, size_t begin, size_t end,
                     const struct loom_run *runs, int nruns, double beta1, double beta2, double eps,
                     double weight_decay, int streamed)
{
    LOOM_ASSERT(begin <= end);
    const struct loom_run whole = {begin, end};
    if (!runs) runs = &whole, nruns = begin < end;
    opt->runs = loom_alloc(sizeof *opt->runs * (size_t)(nruns > 0 ? nruns : 1), LOOM_MEM_OTHER);
    opt->nruns = nruns;
    opt->n = 0;
    for (int i = 0; i < nruns; i++) {
        LOOM_ASSERT(runs[i].lo < runs[i].hi && runs[i].lo >= (i ? runs[i - 1].hi : begin) &&
                    runs[i].hi <= end);
        opt->runs[i] = runs[i];
        opt->n += runs[i].hi - runs[i].lo;
    }
    opt->backend = b;
    opt->beta1 = beta1;
    opt->beta2 = beta2;
    opt->eps = eps;
    opt->weight_decay = weight_decay;
    opt->begin = begin;
    opt->end = end;
    opt->t = 0;
    opt->fd = -1;
    opt->io = NULL;
    opt->sets = opt->dev = NULL;
    opt->dev_m = opt->dev_v = opt->dev_master = NULL;
    opt->param_map = opt->grad_map = NULL;
    opt->master = NULL;
    opt->has_master = 0;
    opt->dtype = LOOM_DTYPE_F32;
    opt->chunk = opt->n;
    opt->streamed = streamed;
    opt->grads_by_state = opt->params_by_state = 0;
    opt->m = opt->v = NULL;
    if (streamed) return;
    opt->m = b->alloc(loom_mul_size(opt->n, sizeof(float)), LOOM_MEM_OPTIMIZER);
    opt->v = b->alloc(loom_mul_size(opt->n, sizeof(float)), LOOM_MEM_OPTIMIZER);
}

size_t loom_run_index(const struct loom_run *runs, int n, size_t x)
{
    size_t k = 0;
    for (int i = 0; i < n; k += runs[i].hi - runs[i].lo, i++)
        if (x >= runs[i].lo && x < runs[i].hi) return k + (x - runs[i].lo);
    LOOM_ASSERT(!"an element outside the runs");
    return 0;
}

size_t loom_adamw_state_at(const struct loom_adamw *opt, size_t x)
{
    return loom_run_index(opt->runs, opt->nruns, x);
}

/* The arena element of state element k, from begin. */
static size_t arena_at(const struct loom_adamw *opt, size_t k)
{
    for (int i = 0; i < opt->nruns; i++) {
        const size_t n = opt->runs[i].hi - opt->runs[i].lo;
        if (k < n) return opt->runs[i].lo + k - opt->begin;
        k -= n;
    }
    LOOM_ASSERT(!"a state element past the runs");
    return 0;
}

/* The master weights on the backend into the offload file from byte
 * offset off, through host memory a piece at a time. */
static void master_to_file(const struct loom_adamw *opt, struct loom_offload_file *io, size_t off)
{
    const size_t n = opt->n;
    float *piece = loom_alloc(LP_CHUNK * sizeof(float), LOOM_MEM_OTHER);
    for (size_t k = 0; k < n; k += LP_CHUNK) {
        const size_t c = n - k < LP_CHUNK ? n - k : LP_CHUNK;
        opt->backend->download(piece, opt->master + k, c * sizeof(float));
        loom_offload_write(io, piece, c * sizeof(float), off + k * sizeof(float));
    }
    loom_free(piece);
}

int loom_adamw_offload(struct loom_adamw *opt, const char *dir, size_t buffer_bytes, int direct)
{
    const size_t n = opt->n;
    /* the file: m, then v, then (mixed precision) the master weights, each
     * from an aligned offset */
    const size_t region = loom_offload_round(n * sizeof(float)) / sizeof(float);
    struct loom_offload_file *io = loom_alloc(sizeof *io, LOOM_MEM_OTHER);
    int rc = loom_offload_open(io, dir, loom_mul_size((opt->has_master ? 3 : 2) * region, sizeof(float)),
                               "optimizer state", direct);
    if (rc) {
        loom_free(io);
        return rc;
    }
    if (opt->has_master && opt->master) /* to the file; the buffer sets stay */
        master_to_file(opt, io, 2 * region * sizeof(float));
    loom_adamw_offload_buffers(opt, buffer_bytes);
    opt->io = io;
    opt->region = region;
    opt->fd = io->fd_buffered;
    return LOOM_OK;
}

void loom_adamw_offload_buffers(struct loom_adamw *opt, size_t buffer_bytes)
{
    const struct loom_backend *b = opt->backend;
    const size_t n = opt->n, arrays = opt->has_master ? 3 : 2, align = LOOM_OFFLOAD_ALIGN / sizeof(float);
    /* chunks of whole aligned blocks: buffer_bytes (less the alignment's slack)
     * over the sets and arrays, one block each at least */
    const size_t usable = buffer_bytes > LOOM_OFFLOAD_ALIGN ? buffer_bytes - LOOM_OFFLOAD_ALIGN : 0;
    size_t chunk = usable / (SETS * arrays * sizeof(float)) / align * align;
    if (chunk < align) chunk = align;
    /* the sets together need not hold more than the state once */
    const size_t most = loom_offload_round(((n ? n : 1) + SETS - 1) / SETS * sizeof(float)) / sizeof(float);
    if (chunk > most) chunk = most;
    b->free(opt->m);
    b->free(opt->v);
    b->free(opt->master);
    opt->m = opt->v = opt->master = NULL;
    loom_free(opt->sets);
    b->free(opt->dev);
    /* the host sets, aligned for direct I/O */
    char *raw = loom_alloc(loom_mul_size(HOST_SETS * arrays, chunk * sizeof(float)) + LOOM_OFFLOAD_ALIGN,
                           LOOM_MEM_OPTIMIZER);
    float *p = (float *)(((size_t)raw + LOOM_OFFLOAD_ALIGN - 1) / LOOM_OFFLOAD_ALIGN * LOOM_OFFLOAD_ALIGN);
    for (int k = 0; k < HOST_SETS; k++) {
        opt->set_m[k] = p, p += chunk;
        opt->set_v[k] = p, p += chunk;
        opt->set_master[k] = opt->has_master ? p : NULL;
        if (opt->has_master) p += chunk;
    }
    opt->sets = raw;
    /* the backend's set */
    float *d = b->alloc(loom_mul_size(arrays, chunk * sizeof(float)), LOOM_MEM_OPTIMIZER);
    opt->dev = d;
    opt->dev_m = d;
    opt->dev_v = d + chunk;
    opt->dev_master = opt->has_master ? d + 2 * chunk : NULL;
    opt->chunk = chunk;
}

void loom_adamw_free(struct loom_adamw *opt)
{
    const struct loom_backend *b = opt->backend;
    b->free(opt->m);
    b->free(opt->v);
    b->free(opt->master);
    b->free(opt->dev);
    loom_free(opt->sets);
    loom_free(opt->runs);
    opt->runs = NULL;
    opt->nruns = 0;
    opt->m = opt->v = opt->master = NULL;
    opt->dev = opt->sets = NULL;
    opt->dev_m = opt->dev_v = opt->dev_master = NULL;
    if (opt->io) {
        loom_offload_close(opt->io);
        loom_free(opt->io);
    }
    opt->io = NULL;
    opt->fd = -1;
}

void loom_adamw_get(const struct loom_adamw *opt, enum loom_adamw_part part, size_t k, size_t n, float *dst)
{
    LOOM_ASSERT(k + n <= opt->n && (part != LOOM_ADAMW_MASTER || opt->has_master));
    if (opt->io) {
        loom_offload_read(opt->io, dst, n * sizeof(float), ((size_t)part * opt->region + k) * sizeof(float));
        return;
    }
    const float *src = part == LOOM_ADAMW_EXP_AVG      ? opt->m
                       : part == LOOM_ADAMW_EXP_AVG_SQ ? opt->v
                                                       : opt->master;
    opt->backend->download(dst, src + k, n * sizeof(float));
}

void loom_adamw_set_state(struct loom_adamw *opt, size_t k, size_t n, const float *m, const float *v)
{
    LOOM_ASSERT(k + n <= opt->n);
    if (opt->fd < 0) {
        opt->backend->upload(opt->m + k, m, n * sizeof(float));
        opt->backend->upload(opt->v + k, v, n * sizeof(float));
        return;
    }
    loom_offload_write(opt->io, m, n * sizeof(float), k * sizeof(float));
    loom_offload_write(opt->io, v, n * sizeof(float), (opt->region + k) * sizeof(float));
}

/* Updates elements [k, k + n) of the range (params and grads point at
 * element k; m and v too), all on the backend. */
static void update_range(const struct loom_adamw *opt, const struct loom_kernels *kern, float *params,
                         const float *grads, float *m, float *v, size_t n, float lr, float wd,
                         float grad_scale)
{
    kern->adamw_update(params, m, v, grads, n, lr, (float)opt->beta1, (float)opt->beta2, (float)opt->eps, wd,
                       grad_scale, opt->t);
}

double loom_grad_norm(const struct loom_backend *b, const struct loom_block *blocks, int nblocks)
{
    double ss = 0;
    for (int i = 0; i < nblocks; i++) ss += b->k->sum_squares(blocks[i].work_grads, blocks[i].numel);
    return sqrt(ss);
}

float loom_clip_coef(double norm, double max_norm)
{
    if (max_norm <= 0) return 1.0f;
    double c = max_norm / (norm + 1e-6);
    return c < 1.0 ? (float)c : 1.0f;
}

/* Calls fn for every tensor's part inside each run, with its decay: its
 * arena elements [k, k + n) from begin, state elements [s, s + n). */
static void for_each_range(struct loom_adamw *opt, const struct loom_model *m,
                           void (*fn)(struct loom_adamw *opt, void *ctx, size_t k, size_t s, size_t n,
                                      float wd),
                           void *ctx)
{
    size_t s = 0;
    for (int r = 0; r < opt->nruns; s += opt->runs[r].hi - opt->runs[r].lo, r++) {
        const struct loom_run run = opt->runs[r];
        for (int i = 0; i < m->nblocks; i++) {
            const struct loom_block *b = &m->blocks[i];
            if (b->offset >= run.hi || b->offset + b->numel <= run.lo) continue;
            for (int j = 0; j < b->ntensors; j++) {
                const struct loom_tensor *t = &b->tensors[j];
                /* the part of this tensor inside the run */
                size_t lo = b->offset + t->offset, hi = lo + t->numel;
                if (lo < run.lo) lo = run.lo;
                if (hi > run.hi) hi = run.hi;
                if (lo >= hi) continue;
                fn(opt, ctx, lo - opt->begin, s + (lo - run.lo), hi - lo,
                   t->decay ? (float)opt->weight_decay : 0.0f);
            }
        }
    }
}

struct step_args {
    struct loom_buf params, grads; /* the range's (end - begin) on the backend: float32, or 16-bit */
    float lr, grad_scale;
    float *scratch;                  /* (LP_CHUNK) float32 gradients on the backend */
    const struct loom_kernels *kern; /* the backend's */
};

static void step_f32(struct loom_adamw *opt, void *ctx, size_t k, size_t s, size_t n, float wd)
{
    struct step_args *a = ctx;
    update_range(opt, a->kern, loom_buf_f32_data(a->params) + (opt->params_by_state ? s : k),
                 loom_buf_f32_data(a->grads) + (opt->grads_by_state ? s : k), opt->m + s, opt->v + s, n,
                 a->lr, wd, a->grad_scale);
}

/* Mixed precision on elements from element k of a->params (from begin,
 * or by state), their gradients from element g of a->grads (master, m and
 * v point at their state): the 16-bit gradients converted to
 * float32 a piece at a time, the update on the float32 master weights, the new 16-bit parameters rounded from
 * them; every conversion the backend's. */
static void update_lp(const struct loom_adamw *opt, const struct step_args *a, size_t k, size_t g, size_t n,
                      float *master, float *m, float *v, float wd)
{
    const struct loom_backend *b = opt->backend;
    for (size_t d = 0; d < n;) {
        const size_t c = n - d < LP_CHUNK ? n - d : LP_CHUNK;
        b->convert(loom_buf_f32(a->scratch, c), loom_buf_slice(a->grads, g + d, c));
        update_range(opt, a->kern, master + d, a->scratch, m + d, v + d, c, a->lr, wd, a->grad_scale);
        b->convert(loom_buf_slice(a->params, k + d, c), loom_buf_f32(master + d, c));
        d += c;
    }
}

static void step_lp(struct loom_adamw *opt, void *ctx, size_t k, size_t s, size_t n, float wd)
{
    update_lp(opt, ctx, opt->params_by_state ? s : k, opt->grads_by_state ? s : k, n, opt->master + s,
              opt->m + s, opt->v + s, wd);
}

/* ---- offloaded: chunks through the buffer sets ------------------------------------ */

struct segment {
    size_t k, s, n; /* arena elements [k, k + n) from begin, state elements [s, s + n) */
    float wd;
};
struct segments {
    struct segment *s;
    size_t n, cap;
};

static void add_segment(struct loom_adamw *opt, void *ctx, size_t k, size_t s, size_t n, float wd)
{
    (void)opt;
    struct segments *l = ctx;
    if (l->n == l->cap) {
        l->cap = l->cap ? 2 * l->cap : 256;
        l->s = loom_realloc(l->s, l->cap * sizeof *l->s, LOOM_MEM_OTHER);
    }
    l->s[l->n++] = (struct segment){k, s, n, wd};
}

static int by_start(const void *a, const void *b)
{
    const size_t x = ((const struct segment *)a)->s, y = ((const struct segment *)b)->s;
    return x < y ? -1 : x > y;
}

/* Chunk i's reads into SET_IN, or writes from SET_OUT: m, v and the master
 * weights, whole aligned blocks (past the range's end, the region's padding
 * takes what the set holds there: no state). */
static void chunk_io(struct loom_adamw *opt, size_t i, int write)
{
    const int set = write ? SET_OUT : SET_IN;
    const size_t total = opt->n, at = i * opt->chunk;
    const size_t c = total - at < opt->chunk ? total - at : opt->chunk;
    const size_t bytes = loom_offload_round(c * sizeof(float));
    float *bufs[3] = {opt->set_m[set], opt->set_v[set], opt->set_master[set]};
    for (int r = 0; r < (opt->has_master ? 3 : 2); r++) {
        const size_t off = ((size_t)r * opt->region + at) * sizeof(float);
        if (write)
            loom_offload_write_async(opt->io, set, bufs[r], bytes, off);
        else
            loom_offload_read_async(opt->io, set, bufs[r], bytes, off);
    }
}

/* c elements of each array between host set `set` and the backend's set:
 * uploaded, or downloaded. */
static void chunk_move(const struct loom_adamw *opt, int set, size_t c, int up)
{
    const struct loom_backend *b = opt->backend;
    float *host[3] = {opt->set_m[set], opt->set_v[set], opt->set_master[set]};
    float *dev[3] = {opt->dev_m, opt->dev_v, opt->dev_master};
    for (int r = 0; r < (opt->has_master ? 3 : 2); r++)
        if (up)
            b->upload(dev[r], host[r], c * sizeof(float));
        else
            b->download(host[r], dev[r], c * sizeof(float));
}

/* Offloaded parameters and gradients of state elements [lo, hi) (the span
 * of arena elements they are in): read ahead, or dropped once updated. */
static void shard_pages(const struct loom_adamw *opt, const struct step_args *a, size_t lo, size_t hi,
                        int ahead)
{
    if (lo >= hi || (!opt->param_map && !opt->grad_map)) return;
    const size_t es = loom_dtype_size(a->params.dtype);
    const size_t xlo = arena_at(opt, lo), xhi = arena_at(opt, hi - 1) + 1; /* the span they are in */
    const size_t plo = opt->params_by_state ? lo : xlo, phi = opt->params_by_state ? hi : xhi;
    const size_t glo = opt->grads_by_state ? lo : xlo, ghi = opt->grads_by_state ? hi : xhi;
    const char *p = (const char *)a->params.data + plo * es, *g = (const char *)a->grads.data + glo * es;
    void (*fn)(const struct loom_offload_map *, const void *, size_t) =
        ahead ? loom_offload_prefetch : loom_offload_drop;
    if (opt->param_map) fn(opt->param_map, p, (phi - plo) * es);
    if (opt->grad_map) fn(opt->grad_map, g, (ghi - glo) * es);
}

/* The step with the state in the file: chunk i, read into the in set, is
 * uploaded to the backend's set, and chunk i + 1 is read into the in set
 * while chunk i is updated there; once chunk i - 1's write from the out set
 * is done, chunk i is downloaded into it and written back while the next
 * ones compute. Each element gets the same update as in memory. */
static void step_offloaded(struct loom_adamw *opt, const struct loom_model *m, struct step_args *a)
{
    struct segments l = {0};
    for_each_range(opt, m, add_segment, &l);
    if (l.n > 1) qsort(l.s, l.n, sizeof *l.s, by_start);
    const size_t total = opt->n, nchunks = (total + opt->chunk - 1) / opt->chunk;
    if (nchunks) chunk_io(opt, 0, 0);
    size_t seg = 0;
    for (size_t i = 0; i < nchunks; i++) {
        const size_t lo = i * opt->chunk, hi = lo + opt->chunk < total ? lo + opt->chunk : total;
        loom_offload_wait(opt->io, SET_IN); /* chunk i is in */
        chunk_move(opt, SET_IN, hi - lo, 1);
        if (i + 1 < nchunks) { /* the in set is free again: the next chunk */
            chunk_io(opt, i + 1, 0);
            const size_t nlo = hi;
            shard_pages(opt, a, nlo, nlo + opt->chunk < total ? nlo + opt->chunk : total, 1);
        }
        while (seg < l.n && l.s[seg].s + l.s[seg].n <= lo) seg++;
        for (size_t j = seg; j < l.n && l.s[j].s < hi; j++) {
            const size_t a0 = l.s[j].s > lo ? l.s[j].s : lo,
                         a1 = l.s[j].s + l.s[j].n < hi ? l.s[j].s + l.s[j].n : hi,
                         x = l.s[j].k + (a0 - l.s[j].s), k = opt->params_by_state ? a0 : x,
                         g = opt->grads_by_state ? a0 : x;
            float *mm = opt->dev_m + (a0 - lo), *vv = opt->dev_v + (a0 - lo);
            if (opt->has_master)
                update_lp(opt, a, k, g, a1 - a0, opt->dev_master + (a0 - lo), mm, vv, l.s[j].wd);
            else
                update_range(opt, a->kern, loom_buf_f32_data(a->params) + k, loom_buf_f32_data(a->grads) + g,
                             mm, vv, a1 - a0, a->lr, l.s[j].wd, a->grad_scale);
        }
        loom_offload_wait(opt->io, SET_OUT); /* chunk i - 1 is written */
        chunk_move(opt, SET_OUT, hi - lo, 0);
        chunk_io(opt, i, 1);
        shard_pages(opt, a, lo, hi, 0);
    }
    loom_offload_wait(opt->io, -1);
    loom_free(l.s);
}

void loom_adamw_alloc_master(struct loom_adamw *opt)
{
    opt->has_master = 1;
    if (!opt->master && !opt->io && !opt->streamed)
        opt->master = opt->backend->alloc(loom_mul_size(opt->n + 1, sizeof(float)), LOOM_MEM_OPTIMIZER);
}

void loom_adamw_set_master(struct loom_adamw *opt, struct loom_buf params)
{
    const enum loom_dtype dtype = params.dtype;
    LOOM_ASSERT(dtype == LOOM_DTYPE_BF16 || dtype == LOOM_DTYPE_F16);
    LOOM_ASSERT(params.numel >= (opt->params_by_state ? opt->n : opt->end - opt->begin));
    opt->dtype = dtype;
    loom_adamw_alloc_master(opt);
    /* run by run; with offload in pieces through host memory, into the file */
    uint16_t *piece16 = opt->io ? loom_alloc(LP_CHUNK * sizeof(uint16_t), LOOM_MEM_OTHER) : NULL;
    float *piece = opt->io ? loom_alloc(LP_CHUNK * sizeof(float), LOOM_MEM_OTHER) : NULL;
    size_t s = 0;
    for (int r = 0; r < opt->nruns; r++) {
        const size_t at = opt->params_by_state ? s : opt->runs[r].lo - opt->begin,
                     n = opt->runs[r].hi - opt->runs[r].lo;
        if (!opt->io) opt->backend->convert(loom_buf_f32(opt->master + s, n), loom_buf_slice(params, at, n));
        for (size_t k = 0; opt->io && k < n;) {
            const size_t c = n - k < LP_CHUNK ? n - k : LP_CHUNK;
            opt->backend->download(piece16, (const uint16_t *)params.data + at + k, c * sizeof(uint16_t));
            loom_lp_to_f32(piece, piece16, c, dtype);
            loom_adamw_set_master_range(opt, s + k, c, piece);
            k += c;
        }
        s += n;
    }
    loom_free(piece);
    loom_free(piece16);
}

void loom_adamw_set_master_range(struct loom_adamw *opt, size_t k, size_t n, const float *src)
{
    LOOM_ASSERT(opt->has_master && k + n <= opt->n);
    if (!opt->io)
        opt->backend->upload(opt->master + k, src, n * sizeof(float));
    else
        loom_offload_write(opt->io, src, n * sizeof(float), (2 * opt->region + k) * sizeof(float));
}

void loom_adamw_step(struct loom_adamw *opt, const struct loom_model *m, struct loom_buf params,
                     struct loom_buf grads, double lr, float grad_scale)
{
    const size_t n = opt->end - opt->begin, ng = opt->grads_by_state ? opt->n : n,
                 np = opt->params_by_state ? opt->n : n;
    LOOM_ASSERT(params.dtype == grads.dtype && params.numel >= np && grads.numel >= ng);
    LOOM_ASSERT(m->backend == opt->backend);
    const struct loom_backend *b = opt->backend;
    opt->t++;
    struct step_args a = {
        loom_buf_slice(params, 0, np), loom_buf_slice(grads, 0, ng), (float)lr, grad_scale, NULL, b->k};
    if (params.dtype == LOOM_DTYPE_F32) {
        LOOM_ASSERT(!opt->has_master);
        if (opt->io)
            step_offloaded(opt, m, &a);
        else
            for_each_range(opt, m, step_f32, &a);
        return;
    }
    LOOM_ASSERT(opt->has_master && params.dtype == opt->dtype);
    a.scratch = b->alloc(LP_CHUNK * sizeof(float), LOOM_MEM_OTHER);
    if (opt->io)
        step_offloaded(opt, m, &a);
    else
        for_each_range(opt, m, step_lp, &a);
    b->free(a.scratch);
}
