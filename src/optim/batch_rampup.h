/*
 * Megatron's batch-size rampup (--rampup-batch-size START INCREMENT
 * SAMPLES): the global batch starts at START sequences and grows by
 * INCREMENT each time SAMPLES / ((G - START) / INCREMENT) more samples are
 * consumed, reaching --global-batch-size G once SAMPLES are; after that it
 * stays G. A step's batch is a function of the samples consumed before it,
 * so a resume knows it from the step alone. Every batch is whole
 * micro-batches on every data-parallel rank (START and INCREMENT multiples
 * of micro-batch x data-parallel ranks); the run is samples-based
 * (--train-samples), as Megatron requires.
 */
#ifndef LOOM_OPTIM_BATCH_RAMPUP_H
#define LOOM_OPTIM_BATCH_RAMPUP_H

#include <stdint.h>

#include "loom/config.h"

/* Whether cfg ramps its batch size up. */
int loom_rampup_on(const struct loom_config *cfg);
/* The global batch of a step that starts with `consumed` samples taken. */
int loom_rampup_batch(const struct loom_config *cfg, int64_t consumed);
/* The samples consumed by the first `steps` steps. */
int64_t loom_rampup_consumed(const struct loom_config *cfg, int64_t steps);
/* The steps --train-samples makes: the ramp's steps while it lasts (its
 * last one may pass SAMPLES), then whole global batches of what is left
 * (Megatron's update_train_iters). */
int64_t loom_rampup_iters(const struct loom_config *cfg);

#endif
