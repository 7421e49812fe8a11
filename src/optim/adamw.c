/* AdamW over a range of the arena: state, gradient norm, clipping, the step. */
#include "optim/adamw.h"

#include <math.h>
#include <string.h>

#include "base/dtype.h"
#include "base/log.h"
#include "base/mem.h"
#include "kernels/backend.h"
#include "optim/offload.h"

#include <unistd.h>

void loom_adamw_init(struct loom_adamw *opt, size_t begin, size_t end, double beta1, double beta2, double eps,
                     double weight_decay)
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
    opt->master = NULL;
    opt->has_master = 0;
    opt->dtype = LOOM_DTYPE_F32;
    opt->chunk = end - begin;
    opt->m = loom_alloc(loom_mul_size(end - begin, sizeof(float)), LOOM_MEM_OPTIMIZER);
    opt->v = loom_alloc(loom_mul_size(end - begin, sizeof(float)), LOOM_MEM_OPTIMIZER);
}

enum {
    LP_CHUNK = 1 << 16
}; /* elements of master weights and gradients handled at once under mixed precision */

int loom_adamw_offload(struct loom_adamw *opt, const char *dir, size_t buffer_bytes)
{
    const size_t n = opt->end - opt->begin;
    /* the file: m, then v, then (mixed precision) the master weights, n each */
    int fd = loom_offload_create(dir, loom_mul_size((opt->has_master ? 3 : 2) * n, sizeof(float)));
    if (fd < 0) return LOOM_ERR_INPUT;
    if (opt->has_master) /* to the file; a buffer of LP_CHUNK stays */
        loom_offload_write(fd, opt->master, n * sizeof(float), 2 * n * sizeof(float));
    loom_adamw_offload_buffers(opt, buffer_bytes);
    opt->fd = fd;
    return LOOM_OK;
}

void loom_adamw_offload_buffers(struct loom_adamw *opt, size_t buffer_bytes)
{
    const size_t n = opt->end - opt->begin;
    size_t chunk = buffer_bytes / (2 * sizeof(float));
    if (chunk < 1) chunk = 1;
    if (chunk > n && n) chunk = n;
    loom_free(opt->m);
    loom_free(opt->v);
    opt->m = loom_alloc(chunk * sizeof(float), LOOM_MEM_OPTIMIZER);
    opt->v = loom_alloc(chunk * sizeof(float), LOOM_MEM_OPTIMIZER);
    opt->chunk = chunk;
    if (opt->has_master) {
        loom_free(opt->master);
        opt->master = loom_alloc(LP_CHUNK * sizeof(float), LOOM_MEM_OPTIMIZER);
    }
}

void loom_adamw_free(struct loom_adamw *opt)
{
    loom_free(opt->m);
    loom_free(opt->v);
    loom_free(opt->master);
    opt->m = opt->v = opt->master = NULL;
    if (opt->fd >= 0) close(opt->fd);
    opt->fd = -1;
}

void loom_adamw_get_state(const struct loom_adamw *opt, size_t k, size_t n, float *m, float *v)
{
    const size_t total = opt->end - opt->begin;
    LOOM_ASSERT(k + n <= total);
    if (opt->fd < 0) {
        memcpy(m, opt->m + k, n * sizeof(float));
        memcpy(v, opt->v + k, n * sizeof(float));
        return;
    }
    loom_offload_read(opt->fd, m, n * sizeof(float), k * sizeof(float));
    loom_offload_read(opt->fd, v, n * sizeof(float), (total + k) * sizeof(float));
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
    loom_offload_write(opt->fd, m, n * sizeof(float), k * sizeof(float));
    loom_offload_write(opt->fd, v, n * sizeof(float), (total + k) * sizeof(float));
}

/* Updates elements [k, k + n) of the range (params and grads point at
 * element k), the moments in memory or streamed from the offload file chunk
 * by chunk. */
static void update_range(struct loom_adamw *opt, const struct loom_kernels *kern, float *params,
                         const float *grads, size_t k, size_t n, float lr, float wd, float grad_scale)
{
    const size_t total = opt->end - opt->begin;
    for (size_t done = 0; done < n;) {
        size_t c = opt->fd >= 0 ? (n - done < opt->chunk ? n - done : opt->chunk) : n;
        size_t at = k + done;
        float *m = opt->m, *v = opt->v;
        if (opt->fd >= 0) {
            loom_offload_read(opt->fd, m, c * sizeof(float), at * sizeof(float));
            loom_offload_read(opt->fd, v, c * sizeof(float), (total + at) * sizeof(float));
        } else {
            m += at, v += at;
        }
        kern->adamw_update(params + done, m, v, grads + done, c, lr, (float)opt->beta1, (float)opt->beta2,
                           (float)opt->eps, wd, grad_scale, opt->t);
        if (opt->fd >= 0) {
            loom_offload_write(opt->fd, m, c * sizeof(float), at * sizeof(float));
            loom_offload_write(opt->fd, v, c * sizeof(float), (total + at) * sizeof(float));
        }
        done += c;
    }
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
    update_range(opt, a->kern, a->params + k, a->grads + k, k, n, a->lr, wd, a->grad_scale);
}

/* Mixed precision: gradients from 16-bit, the update on the float32 master
 * weights, the new 16-bit parameters rounded from them. */
static void step_lp(struct loom_adamw *opt, void *ctx, size_t k, size_t n, float wd)
{
    struct step_args *a = ctx;
    const size_t total = opt->end - opt->begin;
    for (size_t done = 0; done < n;) {
        size_t c = n - done < LP_CHUNK ? n - done : LP_CHUNK, at = k + done;
        float *master = opt->fd >= 0 ? opt->master : opt->master + at;
        if (opt->fd >= 0)
            loom_offload_read(opt->fd, master, c * sizeof(float), (2 * total + at) * sizeof(float));
        loom_lp_to_f32(a->scratch, a->grads_lp + at, c, opt->dtype);
        update_range(opt, a->kern, master, a->scratch, at, c, a->lr, wd, a->grad_scale);
        loom_lp_from_f32(a->params_lp + at, master, c, opt->dtype);
        if (opt->fd >= 0)
            loom_offload_write(opt->fd, master, c * sizeof(float), (2 * total + at) * sizeof(float));
        done += c;
    }
}

void loom_adamw_alloc_master(struct loom_adamw *opt)
{
    opt->has_master = 1;
    if (!opt->master)
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
    for (size_t k = 0; k < n;) { /* in pieces the offload buffer holds */
        size_t c = opt->fd >= 0 ? (n - k < LP_CHUNK ? n - k : LP_CHUNK) : n;
        loom_lp_to_f32(opt->fd >= 0 ? opt->master : opt->master + k, params_lp + k, c, dtype);
        if (opt->fd >= 0) loom_adamw_set_master_range(opt, k, c, opt->master);
        k += c;
    }
}

void loom_adamw_get_master(const struct loom_adamw *opt, size_t k, size_t n, float *dst)
{
    const size_t total = opt->end - opt->begin;
    LOOM_ASSERT(opt->has_master && k + n <= total);
    if (opt->fd < 0)
        memcpy(dst, opt->master + k, n * sizeof(float));
    else
        loom_offload_read(opt->fd, dst, n * sizeof(float), (2 * total + k) * sizeof(float));
}

void loom_adamw_set_master_range(struct loom_adamw *opt, size_t k, size_t n, const float *src)
{
    const size_t total = opt->end - opt->begin;
    LOOM_ASSERT(opt->has_master && k + n <= total);
    if (opt->fd < 0)
        memcpy(opt->master + k, src, n * sizeof(float));
    else
        loom_offload_write(opt->fd, src, n * sizeof(float), (2 * total + k) * sizeof(float));
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
        for_each_range(opt, m, step_f32, &a);
        return;
    }
    LOOM_ASSERT(opt->has_master && params.dtype == opt->dtype);
    float *scratch = loom_alloc(LP_CHUNK * sizeof(float), LOOM_MEM_OTHER);
    struct step_args a = {NULL, NULL, params.data, grads.data, (float)lr, grad_scale, scratch, m->backend->k};
    for_each_range(opt, m, step_lp, &a);
    loom_free(scratch);
}
