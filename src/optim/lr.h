/*
 * Learning-rate schedules. Steps count from 1: loom_lr_at(s, k) is the rate
 * the k-th optimizer step uses.
 *
 * Megatron-LM's shapes (style constant, linear, cosine): linear warmup from
 * 0 to max_lr over warmup_iters (step 1 uses max_lr / warmup_iters, step
 * warmup_iters the peak), then constant, linear or cosine decay to min_lr at
 * decay_iters, min_lr after.
 *
 * DeepSpeed's schedulers (deepspeed/runtime/lr_schedules.py), computed as it
 * computes them, from their parameters:
 *   WarmupLR        warmup_min_lr = min_lr, warmup_max_lr = max_lr,
 *                   warmup_num_steps = warmup_iters, warmup_type
 *   WarmupDecayLR   the same, then linear decay back to min_lr at
 *                   total_num_steps = decay_iters
 *   WarmupCosineLR  ratios of the optimizer's lr (max_lr): warmup from
 *                   warmup_min_ratio, cosine down to cos_min_ratio at
 *                   total_num_steps = decay_iters
 * DeepSpeed uses warmup_num_steps = max(2, given). It sets the rate when the
 * scheduler is built and advances the scheduler after each optimizer step, so
 * its k-th step uses the scheduler at last_batch_iteration k-2, and its first
 * step the value set at construction: warmup_min_lr (WarmupLR,
 * WarmupDecayLR) or 0 (WarmupCosineLR). loom_lr_at reproduces that sequence;
 * loom_lr_deepspeed is the scheduler's own value at an iteration.
 */
#ifndef LOOM_OPTIM_LR_H
#define LOOM_OPTIM_LR_H

#include "loom/config.h"

struct loom_lr_schedule {
    double max_lr, min_lr;
    int warmup_iters, decay_iters;
    int style; /* enum loom_lr_decay_style */
    /* DeepSpeed's schedulers only */
    int warmup_style;                       /* enum loom_lr_warmup_style */
    double warmup_min_ratio, cos_min_ratio; /* WarmupCosineLR */
};

/* The schedule a resolved configuration asks for. */
struct loom_lr_schedule loom_lr_schedule_from_config(const struct loom_config *cfg);

double loom_lr_at(const struct loom_lr_schedule *s, int step);

/* DeepSpeed's get_lr() at last_batch_iteration `it` (>= 0); DeepSpeed styles only. */
double loom_lr_deepspeed(const struct loom_lr_schedule *s, int it);

#endif
