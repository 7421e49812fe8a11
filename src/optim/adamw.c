/* AdamW over a range of the arena: state, gradient norm, clipping, the step. */
#include "optim/adamw.h"

#include <math.h>
#include <string.h>

#include "base/log.h"
#include "base/mem.h"
#include "kernels/kernels.h"
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
    opt->chunk = end - begin;
    opt->m = loom_alloc(loom_mul_size(end - begin, sizeof(float)), LOOM_MEM_OPTIMIZER);
    opt->v = loom_alloc(loom_mul_size(end - begin, sizeof(float)), LOOM_MEM_OPTIMIZER);
}

int loom_adamw_offload(struct loom_adamw *opt, const char *dir, size_t buffer_bytes)
{
    const size_t n = opt->end - opt->begin;
    int fd = loom_offload_create(dir, loom_mul_size(2 * n, sizeof(float)));
    if (fd < 0) return LOOM_ERR_INPUT;
    size_t chunk = buffer_bytes / (2 * sizeof(float));
    if (chunk < 1) chunk = 1;
    if (chunk > n && n) chunk = n;
    loom_free(opt->m);
    loom_free(opt->v);
    opt->m = loom_alloc(chunk * sizeof(float), LOOM_MEM_OPTIMIZER);
    opt->v = loom_alloc(chunk * sizeof(float), LOOM_MEM_OPTIMIZER);
    opt->chunk = chunk;
    opt->fd = fd;
    return LOOM_OK;
}

void loom_adamw_free(struct loom_adamw *opt)
{
    loom_free(opt->m);
    loom_free(opt->v);
    opt->m = opt->v = NULL;
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

/* Updates elements [k, k + n) of the range, the moments in memory or
 * streamed from the offload file chunk by chunk. */
static void update_range(struct loom_adamw *opt, float *params, const float *grads, size_t k, size_t n, float lr,
                         float wd, float grad_scale)
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
        loom_adamw_update(params + at, m, v, grads + at, c, lr, (float)opt->beta1, (float)opt->beta2, (float)opt->eps,
                          wd, grad_scale, opt->t);
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
    for (int i = 0; i < nblocks; i++) ss += loom_sum_squares(blocks[i].grads, blocks[i].numel);
    return sqrt(ss);
}

float loom_clip_coef(double norm, double max_norm)
{
    if (max_norm <= 0) return 1.0f;
    double c = max_norm / (norm + 1e-6);
    return c < 1.0 ? (float)c : 1.0f;
}

void loom_adamw_step(struct loom_adamw *opt, const struct loom_model *m, float *params, const float *grads,
                     double lr, float grad_scale)
{
    opt->t++;
    size_t base = 0; /* the block's offset in the arena: blocks are consecutive */
    for (int i = 0; i < m->nblocks; base += m->blocks[i].numel, i++) {
        const struct loom_block *b = &m->blocks[i];
        for (int j = 0; j < b->ntensors; j++) {
            const struct loom_tensor *t = &b->tensors[j];
            /* the part of this tensor inside [begin, end) */
            size_t lo = base + t->offset, hi = lo + t->numel;
            if (lo < opt->begin) lo = opt->begin;
            if (hi > opt->end) hi = opt->end;
            if (lo >= hi) continue;
            update_range(opt, params, grads, lo - opt->begin, hi - lo, (float)lr,
                         t->decay ? (float)opt->weight_decay : 0.0f, grad_scale);
        }
    }
}
