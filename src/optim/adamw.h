/*
 * AdamW over a model's blocks: first and second moments in flat buffers
 * matching each block's parameter buffer, weight decay on tensors of two or
 * more dimensions only, and global-norm gradient clipping. The update
 * itself is the loom_adamw_update kernel. Not here: sharding (ZeRO) and
 * master weights for mixed precision.
 */
#ifndef LOOM_OPTIM_ADAMW_H
#define LOOM_OPTIM_ADAMW_H

#include "model/gpt2.h"

struct loom_adamw {
    double beta1, beta2, eps, weight_decay;
    int nblocks;
    float **m, **v; /* per block, (block numel) each */
    int t;          /* optimizer steps taken */
};

void loom_adamw_init(struct loom_adamw *opt, const struct loom_block *blocks, int nblocks, double beta1,
                     double beta2, double eps, double weight_decay);
void loom_adamw_free(struct loom_adamw *opt);

/* L2 norm of all gradients of the blocks (double accumulation). */
double loom_grad_norm(const struct loom_block *blocks, int nblocks);

/* Clip coefficient as torch.nn.utils.clip_grad_norm_: min(1, max/(norm+1e-6)),
 * 1 when max_norm is 0 (clipping off). */
float loom_clip_coef(double norm, double max_norm);

/* One step at learning rate lr, gradients multiplied by grad_scale first. */
void loom_adamw_step(struct loom_adamw *opt, struct loom_block *blocks, double lr, float grad_scale);

#endif
