/*
 * --offload auto (ColossalAI's Gemini, decided once): of the placements
 * "all in memory", "optimizer state on NVMe" and (ZeRO-3) "optimizer state
 * and the parameter and gradient shards on NVMe", the first whose predicted
 * peak fits the rank's budget (--mem-per-rank, or the machine's memory over
 * the ranks on it). The prediction is the trainer's own memory count for
 * the layout (engine/footprint.h) plus what the process holds before the
 * model (libraries, MPI, the thread pools: measured) and the token shards it
 * maps (a step touches them); the ranks agree on the
 * most offload any of them needs. After the first step the measured peak
 * RSS is printed against the prediction and the budget.
 *
 * Not here: moving state between memory and the file during a run.
 */
#ifndef LOOM_APP_PLACEMENT_H
#define LOOM_APP_PLACEMENT_H

#include "comm/comm.h"
#include "loom/config.h"

struct loom_placement {
    double budget;    /* bytes a rank may hold */
    double predicted; /* the chosen placement's peak, bytes */
    int level;        /* 0 memory, 1 optimizer offloaded, 2 and the ZeRO-3 shards */
};

/* The bytes a rank may hold: --mem-per-rank, or the machine's memory over
 * the ranks started on it (--offload auto's and --layout auto's budget). */
double loom_placement_budget(const struct loom_config *cfg);

/* Sets cfg's offload settings for --offload auto and prints the choice on
 * rank 0. LOOM_ERR_INPUT when nothing fits, naming the budget and the least
 * any placement needs. */
int loom_placement_choose(struct loom_config *cfg, const struct loom_topology *t, struct loom_placement *out);
/* This process's peak resident set so far, bytes. */
double loom_peak_rss(void);

#endif
