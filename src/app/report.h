/*
 * What a training run shows: log lines, the progress bar with ETA on a
 * terminal (plain lines otherwise), the metrics JSONL of DESIGN.md, the
 * same figures as TensorBoard scalars (--tensorboard-dir), and the closing
 * summary. Rank 0 alone prints and writes.
 */
#ifndef LOOM_APP_REPORT_H
#define LOOM_APP_REPORT_H

#include <stdio.h>

#include <stdint.h>

#include "base/mem.h"
#include "io/tensorboard.h"

struct loom_step_stats {
    int step, total;
    double loss, lr, grad_norm, tokens_per_s, mfu, ms_per_step;
    double comm_wait_ms; /* exposed communication after the backward; < 0: none */
    double loss_scale;   /* fp16's loss scale of the step; 0: none */
    int skipped;         /* the update was skipped (non-finite gradient) */
    int64_t skipped_total;
    /* pipeline parallelism: pp stages, and for each (its first rank) the
     * step's schedule in ms computing, idle (blocked on the neighbouring
     * stages) and in all, and its peak activation bytes; NULL: none */
    int pp;
    const double *pipeline; /* (pp, 4) */
    /* a mixture of experts over all ranks (NULL: none): the balancing loss
     * and the z-loss (unweighted, Megatron's load_balancing_loss and
     * z_loss: means over MoE layers and micro-batches), the share of choices
     * a capacity dropped, and the choices per expert relative to their
     * layer's mean: the smallest, the largest, and the coefficient of
     * variation (the layers' mean) */
    const double *moe; /* (LOOM_REPORT_MOE) */
    /* --moe-per-layer-logging: each MoE layer that ran, (moe_layers, 4):
     * its index among the model's layers, its balancing loss, z-loss and
     * tokens per expert's coefficient of variation (NULL: none) */
    int moe_layers;
    const double *moe_layer;
    int ramp_batch; /* --rampup-batch-size: the step's global batch (0: no ramp) */
};
#define LOOM_REPORT_MOE 6

struct loom_report {
    int tty;           /* stdout is a terminal: draw the bar */
    int bar_shown;     /* a bar line is on screen */
    FILE *metrics;     /* NULL when --metrics is not given */
    struct loom_tb tb; /* --tensorboard-dir's event file (closed when not given) */
    char layout[64];   /* "TP(2)-DP(2)-PP(1)", and "+SP", for the metrics rows; empty: none */
    double t_start;    /* seconds, monotonic */
    char metrics_path[512];
    int metrics_errno; /* the first failed write of the metrics file (0: none) */
    int tb_interval;   /* --tensorboard-log-interval: the scalars every N steps (0: with the log lines) */
    int tb_timers;     /* --log-timers-to-tensorboard */
};

/* Opens the metrics file for appending and a TensorBoard event file in
 * tensorboard_dir (each NULL or empty: none); LOOM_ERR_INPUT naming the one
 * that failed. */
int loom_report_open(struct loom_report *r, const char *metrics_path, const char *tensorboard_dir);
void loom_report_close(struct loom_report *r);
/* LOOM_ERR_RUNTIME naming the metrics file or the TensorBoard event file
 * (the first that failed) when a write to it failed (a full disk), else
 * LOOM_OK: the training loop saves and stops on it. */
int loom_report_status(const struct loom_report *r);

/* mem_by_rank: (world, LOOM_MEM_COUNT+1) peaks with the total last, or NULL. */
void loom_report_step(struct loom_report *r, const struct loom_step_stats *s,
                      const struct loom_mem_stats *mem, const int64_t *mem_by_rank, int world);
void loom_report_eval(struct loom_report *r, int step, double val_loss, double floor_nats);
/* The step's TensorBoard scalars alone (a --tensorboard-log-interval step
 * that is not a log step; loom_report_step writes them on the others). */
void loom_report_tb(struct loom_report *r, const struct loom_step_stats *s, const struct loom_mem_stats *mem);
/* The metrics' first row: {"config":{"flag":"value",...}}, every setting as
 * the table prints it (loom report shows it). */
struct loom_config;
void loom_report_config(struct loom_report *r, const struct loom_config *cfg);
/* The evaluation's metrics line alone ({"step":N,"val_loss":F}; null when
 * not finite). */
void loom_report_eval_row(struct loom_report *r, int step, double val_loss);
/* Redraws the progress bar (terminal only). */
void loom_report_progress(struct loom_report *r, int step, int total, double loss);
/* Prints a line, keeping the bar below it on a terminal. */
void loom_report_line(struct loom_report *r, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

/* The median of v's finite values as the closing summary takes it: every
 * value given (no warm-up left out), the upper of the two middle ones for
 * an even count; NaN when none. v is left as it is. */
double loom_report_median(const double *v, int n);

/* "1.5 GB" style sizes and "1m05s" durations, into buf. */
const char *loom_fmt_bytes(char *buf, size_t n, double bytes);
const char *loom_fmt_duration(char *buf, size_t n, double seconds);

#endif
