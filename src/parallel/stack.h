/*
 * The strategy stack's step-level calls (loom/strategy.h): the engine and
 * the schedules call these at step and micro-batch boundaries. In stack
 * order on the way in, in reverse on the way out. Not here: the model's
 * block announcements (loom_model_forward_begin, ...: model/model.c), and
 * which strategies make up a stack (the engine builds it from the config).
 */
#ifndef LOOM_PARALLEL_STACK_H
#define LOOM_PARALLEL_STACK_H

#include <stddef.h>
#include <stdint.h>

#include "loom/model.h"

void loom_stack_begin_step(struct loom_model *m);
void loom_stack_begin_backward(struct loom_model *m, int micro, int last);
void loom_stack_finish_backward(struct loom_model *m);
void loom_stack_after_step(struct loom_model *m);
/* The step's time blocked on the strategies' communication: the sum of
 * what they report, or -1 when none does. */
double loom_stack_comm_wait_s(struct loom_model *m);
/* Where the stored state is: the first strategy's view that answers, or
 * the model's arenas (float32 gradients summed block by block, 16-bit ones
 * in one sweep). */
void loom_stack_view(const struct loom_model *m, struct loom_state_view *v);
/* Whether a strategy counts only some tensors on this rank in the norm
 * (loom/strategy.h counts_tensor), and whether this rank counts t. */
int loom_stack_filters_tensors(const struct loom_model *m);
int loom_stack_counts_tensor(const struct loom_model *m, const struct loom_tensor *t);
/* The stored parameters initialised by the strategy that keeps them
 * (the model has no parameter arena). */
void loom_stack_init_weights(struct loom_model *m, uint64_t seed);
/* The footprint's replay of point `at` (of block `block`, or -1) by every
 * strategy, in its order (loom/strategy.h). */
void loom_stack_replay(struct loom_model *m, enum loom_replay_point at, int block, struct loom_replay *r);
/* "ddp > precision", or "none" for an empty stack. */
void loom_stack_format(const struct loom_model *m, char *buf, size_t n);
/* One line per strategy, each through `line` (the run summary). */
void loom_stack_describe(const struct loom_model *m, void (*line)(void *ctx, const char *text), void *ctx);

#endif
