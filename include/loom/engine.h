/*
 * The engine: one model trained under the layout a config asks for (one
 * process, DDP, ZeRO-1/2/3, mixed precision, optimizer offload: a stack of
 * strategies around the model's blocks, loom/strategy.h), with AdamW, the
 * learning-rate schedule, gradient clipping and checkpoints. The shape is
 * DeepSpeed's engine: forward, backward and step per micro-batch, or one
 * train_batch call per global batch, which runs the layout's schedule of
 * micro-batches. Changing the layout is changing the config; the model and
 * the loop stay.
 *
 *     loom_init(&argc, &argv);
 *     loom_config_parse(&cfg, argc - 1, argv + 1, &help);   // flags and --deepspeed-config
 *     loom_engine_init(&e, &cfg);                  // ranks, batch sizes resolved
 *     build the model (loom/model.h) for micro-batches of cfg.micro_batch_size
 *     loom_engine_initialize(e, &model);           // weights, strategy, optimizer, resume
 *     while (loom_engine_steps_done(e) < cfg.train_iters) {
 *         for (int a = 0; a < loom_engine_accumulation(e); a++) {
 *             int first = loom_engine_micro_batch_rows(e, a);  // rows [first, first + B) of the global batch
 *             loom_engine_forward(e, &batch, B);
 *             loom_engine_backward(e);
 *         }
 *         loom_engine_step(e, &result);
 *     }
 *     loom_engine_free(e);
 *
 * Every call is collective over the ranks of the job. Errors are statuses
 * every rank agrees on (the lowest failing rank holds the message).
 */
#ifndef LOOM_ENGINE_H
#define LOOM_ENGINE_H

#include <stdint.h>

#include "loom/config.h"
#include "loom/model.h"

struct loom_engine;

/* What a step did. */
/* The first sample of the next step: the samples the steps before it took
 * (steps x --global-batch-size, or under --rampup-batch-size the ramp's);
 * the step's batch itself: loom_engine_step_batch. */
int64_t loom_engine_first_sample(struct loom_engine *e);
/* Sequences in the next step (the ramp's, or --global-batch-size). */
int loom_engine_step_batch(struct loom_engine *e);

struct loom_step_result {
    int64_t step;       /* 1-based number of the step just taken */
    double loss;        /* mean loss over the global batch */
    double lr;          /* learning rate used */
    double grad_norm;   /* global gradient norm, before clipping */
    double comm_wait_s; /* time blocked on gradient communication after the backward */
    double loss_scale;  /* fp16: the scale this step's backward used; 0 otherwise */
    int skipped; /* the update was skipped: a non-finite gradient (fp16 overflow, or --on-nonfinite skip) */
    int64_t skipped_total; /* steps skipped so far */
    int global_batch;      /* sequences in the step (--rampup-batch-size: the ramp's, else the setting) */
};

/* Sets up ranks and groups (world = dp x tp x pp), resolves the batch sizes
 * with the data-parallel size, and checks that every rank runs the same
 * settings. LOOM_ERR_INPUT for a bad combination. */
int loom_engine_init(struct loom_engine **e, struct loom_config *cfg);
/* Takes the model (described, arenas not allocated): allocates what the
 * layout keeps on this rank, initialises the weights from the seed (or
 * loads --load: a checkpoint resumes exactly), sets up the strategy, the
 * optimizer and the schedule. The engine does not own the model, but
 * its strategies hold views into it: free the engine before the model.
 * After a failed call the engine can only be freed. What the layout asks of
 * the model is checked first, on every rank: a model built for this rank of
 * the tp group under tensor parallelism (m->tp, m->tp_rank); under pipeline
 * parallelism ops->boundary_numel, ops->set_slots when the stage keeps more
 * than one micro-batch in flight, and the stage's own blocks only.
 * LOOM_ERR_INPUT naming the flag and what is missing otherwise. */
int loom_engine_initialize(struct loom_engine *e, struct loom_model *model);
void loom_engine_free(struct loom_engine *e);

/* The layout. The data-parallel rank and size count the ranks that hold
 * the same part of the model and sum its gradients: with context
 * parallelism the data x context group, whose context ranks read the same
 * rows (loom_engine_micro_batch_rows gives a rank its rows). */
int loom_engine_dp_rank(const struct loom_engine *e);
int loom_engine_dp_size(const struct loom_engine *e);
int loom_engine_accumulation(const struct loom_engine *e); /* micro-batches per step on each rank */
int64_t loom_engine_steps_done(const struct loom_engine *e);
/* The first row, in the global batch of cfg.global_batch_size rows, of this
 * rank's micro-batch `micro` (micro-batch rows each): every layout covers the
 * same global batch. */
int loom_engine_micro_batch_rows(const struct loom_engine *e, int micro);

/* One micro-batch: forward (returns its mean loss), then backward. The
 * gradient is averaged over the global batch by the engine. Without
 * pipeline parallelism only: a pipeline schedule interleaves micro-batches
 * across stages, so a pipelined run trains through train_batch alone (as
 * DeepSpeed's pipeline engine does). */
float loom_engine_forward(struct loom_engine *e, const void *batch, int rows);
void loom_engine_backward(struct loom_engine *e);
/* After accumulation() forward/backward pairs: reduce, clip, update. A
 * non-finite loss or gradient skips the update under fp16 (the loss scaler
 * halves the scale) or with --on-nonfinite skip; otherwise it is
 * LOOM_ERR_RUNTIME naming the step and the first block (in backward order)
 * whose gradient went non-finite. */
int loom_engine_step(struct loom_engine *e, struct loom_step_result *out);

/* The same for a whole step, through the layout's schedule
 * (src/parallel/schedule.c): get(ctx, e, micro, &batch, &rows) gives each
 * micro-batch when the schedule needs it. */
typedef int (*loom_batch_fn)(void *ctx, struct loom_engine *e, int micro, const void **batch, int *rows);
int loom_engine_train_batch(struct loom_engine *e, loom_batch_fn get, void *ctx,
                            struct loom_step_result *out);
/* How many micro-batches the schedule keeps in flight: a batch `get` gives
 * for micro-batch k must stay valid until k + this many have been asked for
 * (1 without pipelining). */
int loom_engine_batches_in_flight(const struct loom_engine *e);
/* The last step's schedule on this rank: seconds in forward and backward
 * passes, blocked on the neighbouring pipeline stages, and in all. */
void loom_engine_schedule_times(const struct loom_engine *e, double *compute_s, double *wait_s,
                                double *total_s);
/* The mean loss of one micro-batch of validation data, outside any step,
 * through every pipeline stage of the engine's model (every rank calls it;
 * ranks without the model's head get 0). index: the batch's place in this evaluation (the
 * first is 0). */
float loom_engine_eval(struct loom_engine *e, const void *batch, int rows, int index);

/* A checkpoint of the state after steps_done() steps in cfg.save (every
 * rank). LOOM_ERR_RUNTIME when it cannot be written; earlier ones stay. */
int loom_engine_save(struct loom_engine *e);

#endif
