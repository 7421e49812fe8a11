/*
 * The engine's state, for the trainer that drives it (engine/train.c reads
 * the strategy's settings and timings for its report). Users see only the
 * opaque loom/engine.h.
 */
#ifndef LOOM_ENGINE_ENGINE_IMPL_H
#define LOOM_ENGINE_ENGINE_IMPL_H

#include "comm/comm.h"
#include "engine/checkpoint.h"
#include "engine/precision.h"
#include "loom/engine.h"
#include "optim/adamw.h"
#include "optim/loss_scaler.h"
#include "optim/lr.h"
#include "parallel/ddp.h"
#include "parallel/zero.h"

struct loom_engine {
    struct loom_config *cfg;
    struct loom_topology topo;
    struct loom_model *model;
    struct loom_zero zero;
    struct loom_ddp ddp;
    struct loom_adamw opt;
    struct loom_lr_schedule sched;
    struct loom_precision prec;     /* mixed precision's working copies (have_prec) */
    struct loom_loss_scaler scaler; /* fp16 (have_scaler) */
    int have_prec, have_scaler;
    int64_t skipped; /* steps skipped for a non-finite gradient */
    int use_ddp;     /* stages 0-1 with dp > 1 (ZeRO-2/3 reduce gradients themselves) */
    int have_zero, have_opt;
    int init_sharded;                  /* ZeRO-3: weights initialised or read shard by shard */
    int resumed;                       /* restored from a checkpoint directory */
    struct loom_ckpt_io_stats load_io; /* of the resume */
    struct loom_ckpt_io_stats save_io; /* of the last save */
    int64_t steps;                     /* optimizer steps done */
    int micro;                         /* micro-batches of the current step so far (forward) */
    int backwards;                     /* of which backward done */
    double loss_sum;                   /* this rank's micro-batch losses of the current step */
};

/* Agrees on a status across all ranks; only the lowest failing rank keeps
 * its message (the one the CLI prints). */
int loom_engine_agree(const struct loom_engine *e, int rc);

#endif
