/* AdamW over blocks: state allocation, gradient norm, clipping, the step. */
#include "optim/adamw.h"

#include "base/log.h"
#include "base/mem.h"
#include "kernels/kernels.h"

#include <math.h>

void loom_adamw_init(struct loom_adamw *opt, const struct loom_block *blocks, int nblocks, double beta1,
                     double beta2, double eps, double weight_decay)
{
    opt->beta1 = beta1;
    opt->beta2 = beta2;
    opt->eps = eps;
    opt->weight_decay = weight_decay;
    opt->nblocks = nblocks;
    opt->t = 0;
    opt->m = loom_alloc(sizeof(float *) * (size_t)nblocks, LOOM_MEM_OTHER);
    opt->v = loom_alloc(sizeof(float *) * (size_t)nblocks, LOOM_MEM_OTHER);
    for (int i = 0; i < nblocks; i++) {
        opt->m[i] = loom_alloc(loom_mul_size(blocks[i].numel, sizeof(float)), LOOM_MEM_OPTIMIZER);
        opt->v[i] = loom_alloc(loom_mul_size(blocks[i].numel, sizeof(float)), LOOM_MEM_OPTIMIZER);
    }
}

void loom_adamw_free(struct loom_adamw *opt)
{
    for (int i = 0; i < opt->nblocks; i++) {
        loom_free(opt->m[i]);
        loom_free(opt->v[i]);
    }
    loom_free(opt->m);
    loom_free(opt->v);
    opt->nblocks = 0;
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

void loom_adamw_step(struct loom_adamw *opt, struct loom_block *blocks, double lr, float grad_scale)
{
    opt->t++;
    for (int i = 0; i < opt->nblocks; i++) {
        struct loom_block *b = &blocks[i];
        for (int j = 0; j < b->ntensors; j++) {
            const struct loom_tensor *t = &b->tensors[j];
            loom_adamw_update(b->params + t->offset, opt->m[i] + t->offset, opt->v[i] + t->offset,
                              b->grads + t->offset, t->numel, (float)lr, (float)opt->beta1,
                              (float)opt->beta2, (float)opt->eps,
                              t->decay ? (float)opt->weight_decay : 0.0f, grad_scale, opt->t);
        }
    }
}
