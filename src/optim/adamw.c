/* AdamW over a range of the arena: state, gradient norm, clipping, the step. */
#include "optim/adamw.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "base/dtype.h"
#include "base/log.h"
#include "base/mem.h"
#include "kernels/backend.h"
#include "optim/offload.h"

#include <unistd.h>

void loom_adamw_init(struct loom_adamw *opt, size_t begin, size_t end, double beta1, double beta2, double eps,
                     double weight_decay, int streamed)
{
    LOOM_ASSERT(begin <= end);
    opt->beta1 = beta1;
    opt->beta2 = beta2;
    opt->eps = eps;
    opt->weight_decay = weight_decay;
    opt->begin = begin;
    opt->end = end;
    opt->t = 0;
    opt->fd = -1;
    opt->io = NULL;
    opt->sets = NULL;
    opt->param_map = opt->grad_map = NULL;
    opt->master = NULL;
    opt->has_master = 0;
    opt->dtype = LOOM_DTYPE_F32;
    opt->chunk = end - begin;
    opt->streamed = streamed;
    opt->m = opt->v = NULL;
    if (streamed) return;
    opt->m = loom_alloc(loom_mul_size(end - begin, sizeof(float)), LOOM_MEM_OPTIMIZER);
    opt->v = loom_alloc(loom_mul_size(end - begin, sizeof(float)), LOOM_MEM_OPTIMIZER);
}

enum {
    LP_CHUNK = 1 << 16
}; /* elements of master weights and gradients handled at once under mixed precision */

int loom_adamw_offload(struct loom_adamw *opt, const char *dir, size_t buffer_bytes, int direct)
{
    const size_t n = opt->end - opt->begin;
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
        loom_offload_write(io, opt->master, n * sizeof(float), 2 * region * sizeof(float));
    loom_adamw_offload_buffers(opt, buffer_bytes);
    opt->io = io;
    opt->region = region;
    opt->fd = io->fd_buffered;
    return LOOM_OK;
}

void loom_adamw_offload_buffers(struct loom_adamw *opt, size_t buffer_bytes)
{
    const size_t n = opt->end - opt->begin, arrays = opt->has_master ? 3 : 2,
                 align = LOOM_OFFLOAD_ALIGN / sizeof(float);
    /* chunks of whole aligned blocks: buffer_bytes (less the alignment's slack)
     * over the sets and arrays, one block each at least */
    const size_t usable = buffer_bytes > LOOM_OFFLOAD_ALIGN ? buffer_bytes - LOOM_OFFLOAD_ALIGN : 0;
    size_t chunk = usable / (LOOM_OFFLOAD_SLOTS * arrays * sizeof(float)) / align * align;
    if (chunk < align) chunk = align;
    /* the sets together need not hold more than the state once */
    const size_t most =
        loom_offload_round(((n ? n : 1) + LOOM_OFFLOAD_SLOTS - 1) / LOOM_OFFLOAD_SLOTS * sizeof(float)) /
        sizeof(float);
    if (chunk > most) chunk = most;
    loom_free(opt->m);
    loom_free(opt->v);
    loom_free(opt->master);
    opt->m = opt->v = opt->master = NULL;
    char *raw =
        loom_alloc(loom_mul_size(LOOM_OFFLOAD_SLOTS * arrays, chunk * sizeof(float)) + LOOM_OFFLOAD_ALIGN,
                   LOOM_MEM_OPTIMIZER);
    float *p = (float *)(((size_t)raw + LOOM_OFFLOAD_ALIGN - 1) / LOOM_OFFLOAD_ALIGN * LOOM_OFFLOAD_ALIGN);
    for (int k = 0; k < LOOM_OFFLOAD_SLOTS; k++) {
        opt->set_m[k] = p, p += chunk;
        opt->set_v[k] = p, p += chunk;
        opt->set_master[k] = opt->has_master ? p : NULL;
        if (opt->has_master) p += chunk;
    }
    opt->sets = raw;
    opt->chunk = chunk;
}

void loom_adamw_free(struct loom_adamw *opt)
{
    loom_free(opt->m);
    loom_free(opt->v);
    loom_free(opt->master);
    loom_free(opt->sets);
    opt->m = opt->v = opt->master = NULL;
    opt->sets = NULL;
    if (opt->io) {
        loom_offload_close(opt->io);
        loom_free(opt->io);
    }
    opt->io = NULL;
    opt->fd = -1;
}

void loom_adamw_get(const struct loom_adamw *opt, enum loom_adamw_part part, size_t k, size_t n, float *dst)
{
    LOOM_ASSERT(k + n <= opt->end - opt->begin && (part != LOOM_ADAMW_MASTER || opt->has_master));
    if (opt->io) {
        loom_offload_read(opt->io, dst, n * sizeof(float), ((size_t)part * opt->region + k) * sizeof(float));
        return;
    }
    const float *src = part == LOOM_ADAMW_EXP_AVG      ? opt->m
                       : part == LOOM_ADAMW_EXP_AVG_SQ ? opt->v
                                                       : opt->master;
    memcpy(dst, src + k, n * sizeof(float));
}

void loom_adamw_set_state(struct loom_adamw *opt, size_t k, size_t n, const float *m, const float *v)
{
    const size_t total = opt->end - opt->begin;
    LOOM_ASSERT(k + n <= total);
    if (opt->fd < 0) {
        memcpy(opt->m + k, m, n * sizeof(float));
        memcpy(opt->v + k, v, n * sizeof(float));
        return;
    }
    (void)total;
    loom_offload_write(opt->io, m, n * sizeof(float), k * sizeof(float));
    loom_offload_write(opt->io, v, n * sizeof(float), (opt->region + k) * sizeof(float));
}

/* Updates elements [k, k + n) of the range (params and grads point at
 * element k; m and v too). */
static void update_range(const struct loom_adamw *opt, const struct loom_kernels *kern, float *params,
                         const float *grads, float *m, float *v, size_t n, float lr, float wd,
                         float grad_scale)
{
    kern->adamw_update(params, m, v, grads, n, lr, (float)opt->beta1, (float)opt->beta2, (float)opt->eps, wd,
                       grad_scale, opt->t);
}

double loom_grad_norm(const struct loom_block *blocks, int nblocks)
{
    double ss = 0;
    for (int i = 0; i < nblocks; i++)
        ss += loom_backend_cpu()->k->sum_squares(blocks[i].work_grads, blocks[i].numel);
    return sqrt(ss);
}

float loom_clip_coef(double norm, double max_norm)
{
    if (max_norm <= 0) return 1.0f;
    double c = max_norm / (norm + 1e-6);
    return c < 1.0 ? (float)c : 1.0f;
}

/* Calls fn for every tensor's part inside [begin, end), with its decay. */
static void for_each_range(struct loom_adamw *opt, const struct loom_model *m,
                           void (*fn)(struct loom_adamw *opt, void *ctx, size_t k, size_t n, float wd),
                           void *ctx)
{
    for (int i = 0; i < m->nblocks; i++) {
        const struct loom_block *b = &m->blocks[i];
        const size_t base = b->offset;
        for (int j = 0; j < b->ntensors; j++) {
            const struct loom_tensor *t = &b->tensors[j];
            /* the part of this tensor inside [begin, end) */
            size_t lo = base + t->offset, hi = lo + t->numel;
            if (lo < opt->begin) lo = opt->begin;
            if (hi > opt->end) hi = opt->end;
            if (lo >= hi) continue;
            fn(opt, ctx, lo - opt->begin, hi - lo, t->decay ? (float)opt->weight_decay : 0.0f);
        }
    }
}

struct step_args {
    float *params;
    const float *grads;
    uint16_t *params_lp;
    const uint16_t *grads_lp;
    float lr, grad_scale;
    float *scratch;                  /* (LP_CHUNK) float32 gradients */
    const struct loom_kernels *kern; /* the model's backend's */
};

static void step_f32(struct loom_adamw *opt, void *ctx, size_t k, size_t n, float wd)
{
    struct step_args *a = ctx;
    update_range(opt, a->kern, a->params + k, a->grads + k, opt->m + k, opt->v + k, n, a->lr, wd,
                 a->grad_scale);
}

/* Mixed precision: gradients from 16-bit, the update on the float32 master
 * weights, the new 16-bit parameters rounded from them. */
static void step_lp(struct loom_adamw *opt, void *ctx, size_t k, size_t n, float wd)
{
    struct step_args *a = ctx;
    for (size_t done = 0; done < n;) {
        size_t c = n - done < LP_CHUNK ? n - done : LP_CHUNK, at = k + done;
        loom_lp_to_f32(a->scratch, a->grads_lp + at, c, opt->dtype);
        update_range(opt, a->kern, opt->master + at, a->scratch, opt->m + at, opt->v + at, c, a->lr, wd,
                     a->grad_scale);
        loom_lp_from_f32(a->params_lp + at, opt->master + at, c, opt->dtype);
        done += c;
    }
}

/* ---- offloaded: chunks through the buffer sets ------------------------------------ */

struct segment {
    size_t k, n; /* elements [k, k + n) of the range */
    float wd;
};
struct segments {
    struct segment *s;
    size_t n, cap;
};

static void add_segment(struct loom_adamw *opt, void *ctx, size_t k, size_t n, float wd)
{
    (void)opt;
    struct segments *l = ctx;
    if (l->n == l->cap) {
        l->cap = l->cap ? 2 * l->cap : 256;
        l->s = loom_realloc(l->s, l->cap * sizeof *l->s, LOOM_MEM_OTHER);
    }
    l->s[l->n++] = (struct segment){k, n, wd};
}

static int by_start(const void *a, const void *b)
{
    const size_t x = ((const struct segment *)a)->k, y = ((const struct segment *)b)->k;
    return x < y ? -1 : x > y;
}

/* Chunk i's reads (or writes) on slot: m, v and the master weights. */
static void chunk_io(struct loom_adamw *opt, size_t i, int slot, int write)
{
    const size_t total = opt->end - opt->begin, at = i * opt->chunk;
    const size_t c = total - at < opt->chunk ? total - at : opt->chunk;
    const size_t bytes = loom_offload_round(c * sizeof(float));
    float *bufs[3] = {opt->set_m[slot], opt->set_v[slot], opt->set_master[slot]};
    for (int r = 0; r < (opt->has_master ? 3 : 2); r++) {
        const size_t off = ((size_t)r * opt->region + at) * sizeof(float);
        if (write)
            loom_offload_write_async(opt->io, slot, bufs[r], bytes, off);
        else
            loom_offload_read_async(opt->io, slot, bufs[r], bytes, off);
    }
}

/* The step with the state in the file: chunk i is read into slot i mod S
 * while chunk i - 1 is updated; its update is written back from that slot
 * while the next ones compute, and the slot is reused once that write is
 * done. Each element gets the same update as in memory. */
/* Offloaded parameters and gradients of elements [lo, hi): read ahead, or
 * dropped once updated. */
static void shard_pages(const struct loom_adamw *opt, const struct step_args *a, size_t lo, size_t hi,
                        int ahead)
{
    const size_t es = a->params ? sizeof(float) : sizeof(uint16_t);
    const void *p = a->params ? (const void *)(a->params + lo) : (const void *)(a->params_lp + lo);
    const void *g = a->grads ? (const void *)(a->grads + lo) : (const void *)(a->grads_lp + lo);
    void (*fn)(const struct loom_offload_map *, const void *, size_t) =
        ahead ? loom_offload_prefetch : loom_offload_drop;
    if (opt->param_map) fn(opt->param_map, p, (hi - lo) * es);
    if (opt->grad_map) fn(opt->grad_map, g, (hi - lo) * es);
}

static void step_offloaded(struct loom_adamw *opt, const struct loom_model *m, struct step_args *a)
{
    struct segments l = {0};
    for_each_range(opt, m, add_segment, &l);
    if (l.n > 1) qsort(l.s, l.n, sizeof *l.s, by_start);
    const size_t total = opt->end - opt->begin, nchunks = (total + opt->chunk - 1) / opt->chunk;
    if (nchunks) chunk_io(opt, 0, 0, 0);
    size_t seg = 0;
    for (size_t i = 0; i < nchunks; i++) {
        const int slot = (int)(i % LOOM_OFFLOAD_SLOTS);
        if (i + 1 < nchunks) { /* the next chunk's slot: free once its last write is done */
            const int next = (int)((i + 1) % LOOM_OFFLOAD_SLOTS);
            loom_offload_wait(opt->io, next);
            chunk_io(opt, i + 1, next, 0);
            const size_t nlo = (i + 1) * opt->chunk;
            shard_pages(opt, a, nlo, nlo + opt->chunk < total ? nlo + opt->chunk : total, 1);
        }
        loom_offload_wait(opt->io, slot); /* chunk i is in */
        const size_t lo = i * opt->chunk, hi = lo + opt->chunk < total ? lo + opt->chunk : total;
        while (seg < l.n && l.s[seg].k + l.s[seg].n <= lo) seg++;
        for (size_t j = seg; j < l.n && l.s[j].k < hi; j++) {
            const size_t a0 = l.s[j].k > lo ? l.s[j].k : lo,
                         a1 = l.s[j].k + l.s[j].n < hi ? l.s[j].k + l.s[j].n : hi;
            float *mm = opt->set_m[slot] + (a0 - lo), *vv = opt->set_v[slot] + (a0 - lo);
            if (!opt->has_master) {
                update_range(opt, a->kern, a->params + a0, a->grads + a0, mm, vv, a1 - a0, a->lr, l.s[j].wd,
                             a->grad_scale);
                continue;
            }
            float *master = opt->set_master[slot] + (a0 - lo);
            for (size_t d = a0; d < a1;) { /* through the float32 gradient scratch */
                const size_t c = a1 - d < LP_CHUNK ? a1 - d : LP_CHUNK;
                loom_lp_to_f32(a->scratch, a->grads_lp + d, c, opt->dtype);
                update_range(opt, a->kern, master + (d - a0), a->scratch, mm + (d - a0), vv + (d - a0), c,
                             a->lr, l.s[j].wd, a->grad_scale);
                loom_lp_from_f32(a->params_lp + d, master + (d - a0), c, opt->dtype);
                d += c;
            }
        }
        chunk_io(opt, i, slot, 1);
        shard_pages(opt, a, lo, hi, 0);
    }
    loom_offload_wait(opt->io, -1);
    loom_free(l.s);
}

void loom_adamw_alloc_master(struct loom_adamw *opt)
{
    opt->has_master = 1;
    if (!opt->master && !opt->io && !opt->streamed)
        opt->master = loom_alloc(loom_mul_size(opt->end - opt->begin + 1, sizeof(float)), LOOM_MEM_OPTIMIZER);
}

void loom_adamw_set_master(struct loom_adamw *opt, struct loom_buf params)
{
    const uint16_t *params_lp = params.data;
    const enum loom_dtype dtype = params.dtype;
    LOOM_ASSERT(dtype == LOOM_DTYPE_BF16 || dtype == LOOM_DTYPE_F16);
    const size_t n = opt->end - opt->begin;
    opt->dtype = dtype;
    loom_adamw_alloc_master(opt);
    if (!opt->io) {
        loom_lp_to_f32(opt->master, params_lp, n, dtype);
        return;
    }
    float *piece = loom_alloc(LP_CHUNK * sizeof(float), LOOM_MEM_OTHER);
    for (size_t k = 0; k < n;) { /* in pieces, into the file */
        const size_t c = n - k < LP_CHUNK ? n - k : LP_CHUNK;
        loom_lp_to_f32(piece, params_lp + k, c, dtype);
        loom_adamw_set_master_range(opt, k, c, piece);
        k += c;
    }
    loom_free(piece);
}

void loom_adamw_set_master_range(struct loom_adamw *opt, size_t k, size_t n, const float *src)
{
    LOOM_ASSERT(opt->has_master && k + n <= opt->end - opt->begin);
    if (!opt->io)
        memcpy(opt->master + k, src, n * sizeof(float));
    else
        loom_offload_write(opt->io, src, n * sizeof(float), (2 * opt->region + k) * sizeof(float));
}

void loom_adamw_step(struct loom_adamw *opt, const struct loom_model *m, struct loom_buf params,
                     struct loom_buf grads, double lr, float grad_scale)
{
    LOOM_ASSERT(params.dtype == grads.dtype && params.numel >= opt->end - opt->begin &&
                grads.numel >= opt->end - opt->begin);
    opt->t++;
    if (params.dtype == LOOM_DTYPE_F32) {
        LOOM_ASSERT(!opt->has_master);
        struct step_args a = {params.data, grads.data, NULL, NULL,
                              (float)lr,   grad_scale, NULL, m->backend->k};
        if (opt->io)
            step_offloaded(opt, m, &a);
        else
            for_each_range(opt, m, step_f32, &a);
        return;
    }
    LOOM_ASSERT(opt->has_master && params.dtype == opt->dtype);
    float *scratch = loom_alloc(LP_CHUNK * sizeof(float), LOOM_MEM_OTHER);
    struct step_args a = {NULL, NULL, params.data, grads.data, (float)lr, grad_scale, scratch, m->backend->k};
    if (opt->io)
        step_offloaded(opt, m, &a);
    else
        for_each_range(opt, m, step_lp, &a);
    loom_free(scratch);
}
