/* AdamW over a range of the arena: state, gradient norm, clipping, the step. */
#include "optim/adamw.h"

#include <math.h>

#include "base/log.h"
#include "base/mem.h"
#include "kernels/kernels.h"

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
    opt->m = loom_alloc(loom_mul_size(end - begin, sizeof(float)), LOOM_MEM_OPTIMIZER);
    opt->v = loom_alloc(loom_mul_size(end - begin, sizeof(float)), LOOM_MEM_OPTIMIZER);
}

void loom_adamw_free(struct loom_adamw *opt)
{
    loom_free(opt->m);
    loom_free(opt->v);
    opt->m = opt->v = NULL;
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

void loom_adamw_step(struct loom_adamw *opt, const struct loom_gpt2 *m, float *params, const float *grads,
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
            const size_t k = lo - opt->begin;
            loom_adamw_update(params + k, opt->m + k, opt->v + k, grads + k, hi - lo, (float)lr, (float)opt->beta1,
                              (float)opt->beta2, (float)opt->eps, t->decay ? (float)opt->weight_decay : 0.0f,
                              grad_scale, opt->t);
        }
    }
}
