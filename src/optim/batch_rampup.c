/* Megatron's batch-size rampup (batch_rampup.h). */
#include "optim/batch_rampup.h"

#include "base/log.h"

int loom_rampup_on(const struct loom_config *cfg)
{
    return cfg->rampup_start > 0;
}

int loom_rampup_batch(const struct loom_config *cfg, int64_t consumed)
{
    if (!loom_rampup_on(cfg) || consumed > cfg->rampup_samples) return cfg->global_batch_size;
    const int64_t increments = (cfg->global_batch_size - cfg->rampup_start) / cfg->rampup_increment;
    if (increments <= 0) return cfg->global_batch_size;
    /* Megatron: int(consumed / (samples / increments)), in double as it divides */
    const double per = (double)cfg->rampup_samples / (double)increments;
    const int64_t steps = per > 0 ? (int64_t)((double)consumed / per) : increments;
    const int64_t g = cfg->rampup_start + steps * cfg->rampup_increment;
    LOOM_ASSERT(g > 0);
    return g < cfg->global_batch_size ? (int)g : cfg->global_batch_size;
}

int64_t loom_rampup_consumed(const struct loom_config *cfg, int64_t steps)
{
    if (!loom_rampup_on(cfg)) return steps * cfg->global_batch_size;
    int64_t consumed = 0, k = 0;
    for (; k < steps && consumed <= cfg->rampup_samples; k++) consumed += loom_rampup_batch(cfg, consumed);
    return consumed + (steps - k) * cfg->global_batch_size;
}

int64_t loom_rampup_iters(const struct loom_config *cfg)
{
    int64_t consumed = 0, iters = 0;
    /* Megatron's loop: the ramp's steps, its last one past the ramp included */
    while (consumed <= cfg->rampup_samples && consumed <= cfg->train_samples) {
        consumed += loom_rampup_batch(cfg, consumed);
        iters++;
    }
    /* then whole batches of what is left, divided as Python's // (rounded down) */
    const int64_t left = cfg->train_samples - consumed, G = cfg->global_batch_size;
    return iters + (left >= 0 ? left / G : -((-left + G - 1) / G));
}
