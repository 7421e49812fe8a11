/*
 * --layout auto: with the ranks started known, the fastest layout the
 * planner (plan/search.h) finds that fits the rank's memory (--mem-per-rank,
 * or the machine's memory over its ranks): tensor, pipeline (and virtual)
 * and data-parallel sizes, ZeRO stage, NVMe offload where --nvme-path is
 * given, micro-batch and accumulation for the global batch, recomputation
 * and sequence parallelism; the precision and every layout setting the
 * user gave stay as given. Every rank measures its products and memory
 * bandwidth at once, as training shares the node (plan/cluster.h), rank 0
 * plans with their sum, and every rank takes its choice. The
 * settings it set show the origin "layout auto"; the run reports the
 * prediction against what it measured.
 *
 * Not here: the search and the models of memory and time (src/plan/).
 */
#ifndef LOOM_APP_LAYOUT_AUTO_H
#define LOOM_APP_LAYOUT_AUTO_H

#include "loom/config.h"
#include "plan/search.h"

struct loom_layout_auto {
    int on;
    struct loom_layout layout;
    double mem_limit;      /* bytes a rank */
    double predicted_mem;  /* the busiest rank's accounting peak, bytes */
    double predicted_step; /* seconds */
    int nfit, n;           /* layouts that fit, and considered */
};

/* Collective over the world, before the engine's set-up (which builds the
 * groups of the chosen layout): sets cfg's layout settings and prints the
 * choice on rank 0. LOOM_ERR_INPUT when nothing fits (naming the budget and
 * the least any layout needs), or without --global-batch-size. (A --plugin
 * that sets the layout beside it is refused by the settings' parsing.) */
int loom_layout_auto_choose(struct loom_config *cfg, struct loom_layout_auto *out);

#endif
