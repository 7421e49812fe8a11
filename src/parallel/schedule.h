/*
 * Schedules: the order in which one step's micro-batches run forward and
 * backward through this rank's blocks, and the running of that order.
 *
 * A schedule is a named function that writes this pipeline stage's plan
 * for a step: a list of passes (forward or backward of micro-batch k
 * through model chunk c of this stage), each marked with its phase
 * (warmup, steady state, cooldown), as DeepSpeed's pipeline engine
 * describes a step by instructions. loom_schedule_run executes a plan: it
 * fetches each micro-batch before its first forward, receives the
 * activation from the previous stage before a forward and sends the output
 * to the next after it, receives the output's gradient before a backward
 * and sends the input's gradient back after it. These point-to-point
 * helpers do nothing at the first and last stage of the model (so pp = 1
 * runs the same code with no communication). Sends do not block: a send
 * buffer is waited for only before it is written again, so the transfer
 * overlaps the next pass's compute.
 *
 * Micro-batches start their first forward in order and finish their last
 * backward in order, so the ones in flight on a stage are always
 * consecutive; a plan's `slots` is the most in flight at once, and
 * micro-batch k uses activation slot k % slots.
 *
 * | schedule | in flight on stage s of P, m micro-batches | idle (bubble) |
 * | --- | --- | --- |
 * | no pipelining (P = 1) | 1 | none |
 * | gpipe: all forwards, then all backwards | m | (P-1)/(m+P-1) |
 * | 1f1b: P-s-1 warmup forwards, then one forward one backward | min(P-s, m) | (P-1)/(m+P-1) |
 * | interleaved: 1f1b over v chunks per stage (Megatron's virtual stages) | counted from the plan | (P-1)/(v
 * m+P-1) |
 *
 * Not here: the step itself (reduce, clip, update); which layers a chunk
 * holds (layers/pp_stages.h).
 */
#ifndef LOOM_PARALLEL_SCHEDULE_H
#define LOOM_PARALLEL_SCHEDULE_H

#include <stddef.h>

enum loom_pass { LOOM_PASS_FORWARD = 0, LOOM_PASS_BACKWARD = 1 };
enum loom_phase { LOOM_PHASE_WARMUP = 0, LOOM_PHASE_STEADY = 1, LOOM_PHASE_COOLDOWN = 2 };

/* One pass of a plan: micro-batch `micro` through this stage's chunk `chunk`
 * (0 unless interleaved). */
struct loom_pipe_pass {
    enum loom_pass pass;
    enum loom_phase phase;
    int micro, chunk;
};

/* This stage's passes for one step, in order. */
struct loom_pipe_plan {
    int pp, stage, chunks, micro_batches;
    int n;                         /* 2 x chunks x micro_batches */
    struct loom_pipe_pass *passes; /* (n), owned */
    int slots;                     /* micro-batches in flight at most */
};

/* The schedules, by name; each fills *out for stage `stage` of pp stages with
 * `chunks` model chunks each (1 unless interleaved) and m micro-batches.
 * The caller has checked the counts (config/resolve.c, resolve_pipeline). */
void loom_schedule_no_pipelining(struct loom_pipe_plan *out, int m);
void loom_schedule_gpipe(struct loom_pipe_plan *out, int pp, int stage, int m);
void loom_schedule_1f1b(struct loom_pipe_plan *out, int pp, int stage, int m);
void loom_schedule_interleaved(struct loom_pipe_plan *out, int pp, int stage, int chunks, int m);
void loom_schedule_plan_free(struct loom_pipe_plan *p);

/* Which schedule a layout runs (schedule: LOOM_PIPELINE_SCHEDULE_*, see
 * loom/config.h; pp = 1 is no pipelining whatever it says). */
void loom_schedule_plan(struct loom_pipe_plan *out, int schedule, int pp, int stage, int chunks, int m);
/* "no pipelining", "gpipe", "1f1b", "interleaved 1f1b" */
const char *loom_schedule_name(int schedule, int pp);

/* What a plan drives, provided by the engine. Statuses are LOOM_OK or an
 * error every rank of the data-parallel group agrees on. */
struct loom_schedule_ops {
    /* Micro-batch `micro` (0-based in the step), before its first forward:
     * its batch and rows, valid until its last backward. */
    int (*get_batch)(void *ctx, int micro, const void **batch, int *rows);
    /* The forward of micro-batch `micro` through chunk `chunk`, its
     * activations in slot `slot`: from `in` (the previous stage's output;
     * NULL at the model's first chunk) to `out` (NULL at the last). */
    void (*forward)(void *ctx, int micro, int chunk, int slot, const void *batch, int rows, const float *in,
                    float *out);
    /* Its backward: from `dout` (the next stage's input gradient; NULL at the
     * model's last chunk) to `din` (NULL at the first). */
    void (*backward)(void *ctx, int micro, int chunk, int slot, const float *dout, float *din);
};

/* Time a run spent computing and waiting for the neighbouring stages. */
struct loom_schedule_times {
    double compute_s; /* in forward and backward passes */
    double wait_s;    /* blocked receiving activations or gradients, or on a send's buffer */
    double total_s;   /* the whole run */
};

/* Runs the plan. boundary: floats of the activation between two stages for
 * one micro-batch of full rows (the model's boundary_numel). */
int loom_schedule_run(const struct loom_pipe_plan *plan, const struct loom_schedule_ops *ops, void *ctx,
                      size_t boundary, struct loom_schedule_times *times);
/* The buffers loom_schedule_run holds for a plan, allocated and freed: the
 * footprint's count of them (engine/footprint.h). */
void loom_schedule_replay(const struct loom_pipe_plan *plan, size_t boundary);

#endif
