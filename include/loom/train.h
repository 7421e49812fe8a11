/*
 * The applications over the engine, from a resolved configuration: the
 * whole of `loom train` and `loom eval` (src/app/train.c), for a model of
 * the --model preset's family. The finer API, a step or a micro-batch at a
 * time for any model, is loom/engine.h.
 */
#ifndef LOOM_TRAIN_H
#define LOOM_TRAIN_H

#include "loom/config.h"

/* Trains as cfg says; returns a loom_status (message in loom_error_message). */
int loom_train(struct loom_config *cfg);

/* Mean loss of weights cfg->load over cfg->eval_iters batches of the
 * validation data (`loom eval`). */
int loom_eval(struct loom_config *cfg);

#endif
