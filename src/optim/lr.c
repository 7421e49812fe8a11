/*
 * Learning-rate schedules: Megatron's warmup then constant / linear / cosine
 * decay, and DeepSpeed's WarmupLR, WarmupDecayLR and WarmupCosineLR. The
 * DeepSpeed formulas keep DeepSpeed's order of floating-point operations and
 * never fuse a multiply-add (Python does not), so the rates agree with
 * DeepSpeed's to the last bit.
 */
#include "optim/lr.h"

#include <math.h>

#include "base/log.h"

struct loom_lr_schedule loom_lr_schedule_from_config(const struct loom_config *cfg)
{
    struct loom_lr_schedule s = {
        .max_lr = cfg->lr,
        .min_lr = cfg->min_lr,
        .warmup_iters = cfg->lr_warmup_iters,
        .decay_iters = cfg->lr_decay_iters,
        .style = cfg->lr_decay_style,
        .warmup_style = cfg->lr_warmup_style,
        .warmup_min_ratio = cfg->lr_warmup_min_ratio,
        .cos_min_ratio = cfg->lr_cos_min_ratio,
    };
    return s;
}

/* a + b * c with the product rounded on its own, as Python computes it: the
 * volatile keeps the compiler from contracting it into a fused multiply-add. */
static double add_product(double a, double b, double c)
{
    volatile double p = b * c;
    return a + p;
}

static int is_deepspeed(int style)
{
    return style == LOOM_LR_WARMUP_LR || style == LOOM_LR_WARMUP_DECAY_LR ||
           style == LOOM_LR_WARMUP_COSINE_LR;
}

/* The warmup's rising fraction at iteration it < warmup (0 at it = 0). */
static double warmup_gamma(const struct loom_lr_schedule *s, int it, int warmup)
{
    if (s->warmup_style == LOOM_LR_WARMUP_LOG) {
        double inverse_log_warm_up = 1.0 / log((double)warmup);
        return inverse_log_warm_up * log((double)it + 1);
    }
    return (double)it / (double)warmup;
}

double loom_lr_deepspeed(const struct loom_lr_schedule *s, int it)
{
    LOOM_ASSERT(is_deepspeed(s->style) && it >= 0);
    const int warmup = s->warmup_iters > 2 ? s->warmup_iters : 2;
    const int total = s->decay_iters;
    if (s->style == LOOM_LR_WARMUP_COSINE_LR) {
        double ratio;
        if (it < warmup) {
            ratio = warmup_gamma(s, it, warmup);
            double ratio_delta = 1. - s->warmup_min_ratio;
            ratio = add_product(s->warmup_min_ratio, ratio, ratio_delta);
        } else {
            int real_last_step = it - warmup + 1, real_total_steps = total - warmup;
            if (real_total_steps <= 0) return s->max_lr * s->cos_min_ratio; /* DeepSpeed divides by zero */
            double ratio_delta = 1. - s->cos_min_ratio;
            ratio = (1 + cos(M_PI * real_last_step / real_total_steps)) / 2;
            ratio = fmax(0.0, add_product(s->cos_min_ratio, ratio_delta, ratio));
        }
        return s->max_lr * ratio;
    }
    double gamma;
    if (it < warmup)
        gamma = warmup_gamma(s, it, warmup);
    else if (s->style == LOOM_LR_WARMUP_LR)
        gamma = 1.0;
    else
        gamma = fmax(0.0, (double)(total - it) / fmax(1.0, (double)(total - warmup)));
    double delta_lr = s->max_lr - s->min_lr;
    return add_product(s->min_lr, delta_lr, gamma);
}

double loom_lr_at(const struct loom_lr_schedule *s, int step)
{
    if (is_deepspeed(s->style)) {
        if (step >= 2) return loom_lr_deepspeed(s, step - 2);
        return s->style == LOOM_LR_WARMUP_COSINE_LR ? 0.0 : s->min_lr; /* set at construction */
    }
    if (s->warmup_iters > 0 && step <= s->warmup_iters)
        return s->max_lr * (double)step / (double)s->warmup_iters;
    if (s->style == LOOM_LR_CONSTANT) return s->max_lr;
    if (step >= s->decay_iters) return s->min_lr;
    double ratio = (double)(step - s->warmup_iters) / (double)(s->decay_iters - s->warmup_iters);
    double coeff = s->style == LOOM_LR_LINEAR ? 1.0 - ratio : 0.5 * (cos(M_PI * ratio) + 1.0);
    return s->min_lr + coeff * (s->max_lr - s->min_lr);
}
