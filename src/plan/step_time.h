/*
 * The time model: one training step of a layout on a cluster, by part.
 * Compute is the model's FLOPs (the family's count, with recomputation's
 * extra forward) at the cluster's sustained product rate, plus the
 * memory-bound work (norms, activations, softmax) at its memory bandwidth;
 * the pipeline bubble is the schedule's (P - 1) / (v m); communication is
 * ring collectives and point-to-point messages at the bandwidth of the
 * links a group spans (ranks are placed tp fastest, then dp, then pp), with
 * the data-parallel reduction hidden behind the backward where the layout
 * overlaps it.
 */
#ifndef LOOM_PLAN_STEP_TIME_H
#define LOOM_PLAN_STEP_TIME_H

#include "engine/footprint.h"
#include "loom/config.h"
#include "plan/cluster.h"

struct loom_step_time {
    double compute, memory_bound, bubble, tp_comm, cp_comm, ep_comm, pp_comm, dp_comm, optimizer, offload;
    double total;          /* seconds per step */
    double flops_per_rank; /* model FLOPs of a step per rank (recomputation not counted) */
};

/* cfg resolved for its layout (dp = world / (tp pp)); fp: the footprint of
 * its busiest rank. */
void loom_step_time_predict(const struct loom_cluster *c, const struct loom_config *cfg, int world,
                            const struct loom_footprint *fp, struct loom_step_time *out);

#endif
