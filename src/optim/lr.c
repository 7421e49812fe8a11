/* Learning-rate schedule: warmup, then constant / linear / cosine decay. */
#include "optim/lr.h"

#include <math.h>

#include "loom/config.h"

double loom_lr_at(const struct loom_lr_schedule *s, int step)
{
    if (s->warmup_iters > 0 && step <= s->warmup_iters)
        return s->max_lr * (double)step / (double)s->warmup_iters;
    if (s->style == LOOM_LR_CONSTANT) return s->max_lr;
    if (step >= s->decay_iters) return s->min_lr;
    double ratio = (double)(step - s->warmup_iters) / (double)(s->decay_iters - s->warmup_iters);
    double coeff = s->style == LOOM_LR_LINEAR ? 1.0 - ratio : 0.5 * (cos(M_PI * ratio) + 1.0);
    return s->min_lr + coeff * (s->max_lr - s->min_lr);
}
