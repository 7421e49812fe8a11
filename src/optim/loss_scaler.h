/*
 * The loss scaler of fp16 training, with DeepSpeed's knobs (the "fp16"
 * section of its config) and the rules of its DynamicLossScaler
 * (deepspeed/runtime/fp16/loss_scaler.py, the scaler of ZeRO stages 1-3):
 *
 *   - Dynamic (loss_scale == 0): the scale starts at 2^initial_scale_power.
 *   - An overflow (inf or NaN in any gradient on any rank; the caller
 *     passes the flag already agreed across ranks) skips the step. If
 *     hysteresis is left (more than 1), it uses one up and the scale stays;
 *     otherwise the scale halves, never below min_loss_scale. Hysteresis is
 *     not refilled by the halving: once used up, every further overflow
 *     halves again.
 *   - Hysteresis is refilled to its configured value when the scale grows,
 *     and with consecutive_hysteresis also on every clean step (then only an
 *     unbroken run of overflows can halve the scale).
 *   - Growth: counting the clean steps since the last overflow (or the
 *     start), the scale doubles on a clean step that has a positive multiple
 *     of loss_scale_window clean steps before it: the first doubling comes on
 *     the (window + 1)-th clean step, the next ones every window clean steps.
 *     Any overflow, absorbed by hysteresis or not, restarts the count. There
 *     is no upper bound.
 *   - At the floor: an overflow with no hysteresis left while the scale
 *     already equals min_loss_scale is, with raise_error_at_min_scale (on in
 *     DeepSpeed), the end of the run (DeepSpeed raises); the update reports
 *     it and changes nothing. Without, the scale stays at the floor.
 *   - Static (loss_scale > 0): the scale never changes; an overflow still
 *     skips the step.
 *
 * The update runs once per optimizer step, after the overflow check (the
 * kernel table's has_nonfinite); the scale it leaves is the one for the
 * next step's backward. Not here: the overflow check itself, the
 * trainer's use of the scale (scaling the loss, unscaling the gradients in
 * double), bf16 (no scaling), the fused FP16_Optimizer of DeepSpeed's
 * ZeRO-0 path, which ignores hysteresis.
 */
#ifndef LOOM_OPTIM_LOSS_SCALER_H
#define LOOM_OPTIM_LOSS_SCALER_H

#include <stddef.h>
#include <stdint.h>

/* DeepSpeed's "fp16" keys, defaults in parentheses (loom_loss_scaler_defaults). */
struct loom_loss_scaler_config {
    double loss_scale;            /* static scale if > 0; 0 = dynamic (0) */
    int initial_scale_power;      /* the dynamic scale starts at 2^this (16) */
    int64_t loss_scale_window;    /* clean steps between doublings (1000) */
    int hysteresis;               /* the n-th overflow halves the scale; 1: each one (2) */
    int consecutive_hysteresis;   /* refill hysteresis on every clean step (0) */
    double min_loss_scale;        /* the floor of the dynamic scale (1) */
    int raise_error_at_min_scale; /* an overflow at the floor ends the run (1) */
};

/* Everything that changes, which a checkpoint stores and restores. */
struct loom_loss_scaler_state {
    double scale;          /* the scale for the next backward */
    int64_t clean_steps;   /* clean steps since the last overflow or the start */
    int hysteresis;        /* overflows until a halving, counting it; 1: the next */
    int64_t steps;         /* updates so far */
    int64_t skipped_steps; /* of which skipped for an overflow */
};

struct loom_loss_scaler {
    struct loom_loss_scaler_config cfg;
    struct loom_loss_scaler_state st;
};

/* The update's verdict on the step; non-zero means skip it. */
enum loom_scaler_verdict {
    LOOM_SCALER_STEP = 0,        /* no overflow: apply the optimizer step */
    LOOM_SCALER_SKIP = 1,        /* overflow: skip the step */
    LOOM_SCALER_SKIP_AT_MIN = 2, /* overflow at min_loss_scale (raise_error_at_min_scale): end the run */
    LOOM_SCALER_VERDICT_COUNT
};

void loom_loss_scaler_defaults(struct loom_loss_scaler_config *cfg);

/* Starts a scaler from cfg. LOOM_ERR_INPUT naming the key and its value
 * when a knob is out of range. */
int loom_loss_scaler_init(struct loom_loss_scaler *s, const struct loom_loss_scaler_config *cfg);

/* One optimizer step's update; overflow is the agreed flag of all ranks. */
enum loom_scaler_verdict loom_loss_scaler_update(struct loom_loss_scaler *s, int overflow);

/* Resumes from a checkpoint's state (the configuration is this run's; a
 * static scaler keeps its configured scale and takes only the counts).
 * LOOM_ERR_INPUT naming the field when the state cannot be one. */
int loom_loss_scaler_restore(struct loom_loss_scaler *s, const struct loom_loss_scaler_state *st);

#endif
