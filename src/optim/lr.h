/*
 * Learning-rate schedule, as Megatron-LM shapes it: linear warmup to the
 * peak over warmup_iters, then constant, linear or cosine decay to min_lr at
 * decay_iters, min_lr after. Steps count from 1 (the first optimizer step
 * uses lr * 1/warmup_iters, the warmup_iters-th the peak).
 */
#ifndef LOOM_OPTIM_LR_H
#define LOOM_OPTIM_LR_H

struct loom_lr_schedule {
    double max_lr, min_lr;
    int warmup_iters, decay_iters;
    int style; /* enum loom_lr_decay_style */
};

double loom_lr_at(const struct loom_lr_schedule *s, int step);

#endif
