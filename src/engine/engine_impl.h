/*
 * The engine's state, for the applications that drive it (app/train.c reads
 * the layout and timings for its report). Users see only the opaque
 * loom/engine.h.
 */
#ifndef LOOM_ENGINE_ENGINE_IMPL_H
#define LOOM_ENGINE_ENGINE_IMPL_H

#include "comm/comm.h"
#include "engine/checkpoint.h"
#include "engine/run_log.h"
#include "io/checkpoint.h"
#include "loom/engine.h"
#include "optim/adamw.h"
#include "optim/loss_scaler.h"
#include "optim/lr.h"
#include "parallel/kinds.h"
#include "parallel/schedule.h"
#include "parallel/zero.h"

struct loom_engine {
    struct loom_config *cfg;
    struct loom_topology topo;
    struct loom_model *model;
    struct loom_layout_shape shape; /* what the layout's kinds make of this rank (parallel/kinds.h) */
    struct loom_partition part;     /* this rank's part of the arena: the optimizer's range */
    /* each kind's strategies on the model's stack (build_stack), NULL when it built none */
    void *state[LOOM_KIND_STATES];
    size_t boundary; /* floats of the activation between pipeline stages (0 without pipelining) */
    struct loom_adamw opt;
    int have_opt;
    struct loom_lr_schedule sched;
    struct loom_loss_scaler *scaler;   /* fp16's, or NULL */
    int64_t skipped;                   /* steps skipped for a non-finite gradient */
    int init_sharded;                  /* ZeRO-3: weights initialised or read shard by shard */
    int resumed;                       /* restored from a checkpoint directory */
    struct loom_ckpt_io_stats load_io; /* of the resume */
    struct loom_ckpt_io_stats save_io; /* of the last save */
    int64_t steps;                     /* optimizer steps done */
    /* --rampup-batch-size (optim/batch_rampup.h): the samples consumed by the first consumed_steps
     * steps, the setting's (final) micro-batches a step, which a step of the ramp lowers in cfg for
     * its duration, the plan's, the step's batch, and the learning rate's schedule over samples */
    int64_t consumed, consumed_steps;
    int final_micros, step_micros, step_batch;
    int max_slots; /* the setting's plan's activation slots: what the model and mbs are sized for */
    struct loom_lr_schedule sched_samples;
    char run[LOOM_CKPT_RUN_LEN + 1]; /* this run's identifier in its checkpoints (io/checkpoint.h) */
    int micro;                       /* micro-batches of the current step so far (forward) */
    int backwards;                   /* of which backward done */
    struct loom_micro mb;            /* the last forward's micro-batch (no pipelining) */
    double loss_sum;                 /* this rank's micro-batch losses of the current step */
    /* the schedule (parallel/schedule.h): this stage's plan of a step, a
     * micro-batch per activation slot, the block range of each model chunk */
    struct loom_pipe_plan plan;
    struct loom_micro *mbs;                /* (plan.slots) */
    int *chunk_first, *chunk_last;         /* (plan.chunks) */
    struct loom_schedule_times pipe_times; /* of the last step */
    /* --metrics, --tensorboard-dir and --trace: the engine's own record for a program of the
     * user's (run_log.h); loom train sets app_reports before loom_engine_initialize and writes
     * its own */
    int app_reports;
    struct loom_run_log log;
};

/* Agrees on a status across all ranks; only the lowest failing rank keeps
 * its message (the one the CLI prints). */
int loom_engine_agree(const struct loom_engine *e, int rc);

/* The steps of loom_engine_initialize that size and allocate this rank's
 * state, in its order; the footprint (engine/footprint.h) runs the same
 * ones under the allocator's counting mode. */
enum loom_dtype loom_engine_state_dtype(const struct loom_config *cfg); /* the arenas' dtype */
void loom_engine_alloc_arenas(struct loom_engine *e);   /* the model's arenas the layout keeps */
void loom_engine_alloc_grad_acc(struct loom_engine *e); /* mixed precision's float32 accumulator */
int loom_engine_build_stack(struct loom_engine *e);     /* every kind's strategies; LOOM_ERR_INPUT: offload */
void loom_engine_alloc_optimizer(struct loom_engine *e); /* AdamW's state (and master weights) */
void loom_engine_plan_schedule(struct loom_engine *e);   /* the schedule's plan and activation slots */
/* Floats of an activation between pipeline stages (0 without pipelining). */
size_t loom_engine_boundary(const struct loom_engine *e);
/* Frees what those made (loom_engine_free, less the engine itself). */
void loom_engine_release_state(struct loom_engine *e);

#endif
