/*
 * What a run of an engine-API program writes (a user's loop over
 * loom/engine.h): --metrics rows, --tensorboard-dir scalars and --trace, as
 * loom train writes them, so the flags do what they say in any program.
 * loom train writes its own, richer record (app/report.h: tokens/s, MFU,
 * memory by rank, evaluations) and turns this one off
 * (loom_engine_impl's app_reports). Rank 0 writes the rows and scalars; the
 * trace is every rank's.
 *
 * Metrics rows: {"step","loss","lr","grad_norm","ms_per_step","mem"} (mem:
 * rank 0's peak bytes by category and total), and under fp16 "loss_scale",
 * "skipped", "skipped_total": the trainer's keys; TensorBoard: its tags for
 * the same figures.
 */
#ifndef LOOM_ENGINE_RUN_LOG_H
#define LOOM_ENGINE_RUN_LOG_H

#include <stdio.h>

#include "io/tensorboard.h"
#include "loom/engine.h"

struct loom_run_log {
    int on;            /* opened (the program is not loom train) */
    FILE *metrics;     /* rank 0, --metrics */
    struct loom_tb tb; /* rank 0, --tensorboard-dir */
    double t0;         /* the current step's start */
};

/* At the end of loom_engine_initialize: opens the files and starts the
 * trace. Collective; LOOM_ERR_INPUT naming the file that cannot be made. */
int loom_run_log_open(struct loom_engine *e);
/* The first forward of a step. */
void loom_run_log_step_begin(struct loom_engine *e);
/* The step done: its row and scalars; a failed write is LOOM_ERR_RUNTIME. */
int loom_run_log_step(struct loom_engine *e, const struct loom_step_result *r);
/* In loom_engine_free: writes the trace (collective) and closes the files. */
void loom_run_log_close(struct loom_engine *e);

#endif
