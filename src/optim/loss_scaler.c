/*
 * The loss scaler (rules in loss_scaler.h).
 *
 * DeepSpeed counts iterations and remembers the last overflowing one; the
 * clean steps between them (its "stable interval") are what the rules use,
 * so that count is the state here, and it is what a checkpoint stores.
 */
#include "optim/loss_scaler.h"

#include <math.h>

#include "base/log.h"
#include "loom/loom.h"

void loom_loss_scaler_defaults(struct loom_loss_scaler_config *cfg)
{
    *cfg = (struct loom_loss_scaler_config){
        .loss_scale = 0,
        .initial_scale_power = 16,
        .loss_scale_window = 1000,
        .hysteresis = 2,
        .consecutive_hysteresis = 0,
        .min_loss_scale = 1,
        .raise_error_at_min_scale = 1,
    };
}

int loom_loss_scaler_init(struct loom_loss_scaler *s, const struct loom_loss_scaler_config *cfg)
{
    if (!(isfinite(cfg->loss_scale) && cfg->loss_scale >= 0))
        return loom_error_set(LOOM_ERR_INPUT, "fp16.loss_scale: %g, must be 0 (dynamic) or a positive number",
                              cfg->loss_scale);
    if (cfg->initial_scale_power < -126 || cfg->initial_scale_power > 127)
        return loom_error_set(LOOM_ERR_INPUT,
                              "fp16.initial_scale_power: %d, must be in [-126, 127] (a float32 scale)",
                              cfg->initial_scale_power);
    if (cfg->loss_scale_window < 1)
        return loom_error_set(LOOM_ERR_INPUT, "fp16.loss_scale_window: %lld, must be at least 1",
                              (long long)cfg->loss_scale_window);
    if (cfg->hysteresis < 1)
        return loom_error_set(LOOM_ERR_INPUT, "fp16.hysteresis: %d, must be at least 1", cfg->hysteresis);
    if (!(isfinite(cfg->min_loss_scale) && cfg->min_loss_scale > 0))
        return loom_error_set(LOOM_ERR_INPUT, "fp16.min_loss_scale: %g, must be a positive number",
                              cfg->min_loss_scale);
    s->cfg = *cfg;
    s->st = (struct loom_loss_scaler_state){
        .scale = cfg->loss_scale > 0 ? cfg->loss_scale : ldexp(1.0, cfg->initial_scale_power),
        .clean_steps = 0,
        .hysteresis = cfg->hysteresis,
        .steps = 0,
        .skipped_steps = 0,
    };
    return LOOM_OK;
}

enum loom_scaler_verdict loom_loss_scaler_update(struct loom_loss_scaler *s, int overflow)
{
    const struct loom_loss_scaler_config *cfg = &s->cfg;
    struct loom_loss_scaler_state *st = &s->st;
    int dynamic = cfg->loss_scale == 0;

    if (overflow) {
        if (dynamic) {
            int halve = cfg->hysteresis == 1 || st->hysteresis <= 1;
            if (halve && st->scale == cfg->min_loss_scale && cfg->raise_error_at_min_scale)
                return LOOM_SCALER_SKIP_AT_MIN; /* DeepSpeed raises before changing anything */
            if (halve)
                st->scale = fmax(st->scale / 2, cfg->min_loss_scale); /* hysteresis stays used up */
            else
                st->hysteresis--;
            st->clean_steps = 0;
        }
        st->steps++;
        st->skipped_steps++;
        return LOOM_SCALER_SKIP;
    }

    if (dynamic) {
        if (cfg->consecutive_hysteresis) st->hysteresis = cfg->hysteresis;
        if (st->clean_steps > 0 && st->clean_steps % cfg->loss_scale_window == 0) {
            st->scale *= 2;
            st->hysteresis = cfg->hysteresis;
        }
        st->clean_steps++;
    }
    st->steps++;
    return LOOM_SCALER_STEP;
}

int loom_loss_scaler_restore(struct loom_loss_scaler *s, const struct loom_loss_scaler_state *st)
{
    if (!(isfinite(st->scale) && st->scale > 0))
        return loom_error_set(LOOM_ERR_INPUT, "loss scaler state: scale %g, must be a positive number",
                              st->scale);
    if (st->hysteresis < 1)
        return loom_error_set(LOOM_ERR_INPUT, "loss scaler state: hysteresis %d, must be at least 1",
                              st->hysteresis);
    if (st->clean_steps < 0 || st->steps < 0 || st->skipped_steps < 0 || st->skipped_steps > st->steps ||
        st->clean_steps > st->steps - st->skipped_steps)
        return loom_error_set(LOOM_ERR_INPUT,
                              "loss scaler state: counts do not fit (steps %lld, skipped %lld, clean %lld)",
                              (long long)st->steps, (long long)st->skipped_steps, (long long)st->clean_steps);
    double scale = s->cfg.loss_scale > 0 ? s->cfg.loss_scale : st->scale;
    s->st = *st;
    s->st.scale = scale;
    return LOOM_OK;
}
