/*
 * The planner's search: every layout of a model on `world` ranks (each
 * parallelism kind's choices, parallel/kinds.h: tensor, pipeline and data
 * parallel sizes, virtual stages, sequence parallelism, ZeRO stage; then
 * its own: micro-batch, recomputation, precision, offload), each checked by
 * the configuration's and the kinds' rules (loom_kinds_resolve), its
 * memory counted by the trainer's set-up code (engine/footprint.h) on its
 * busiest ranks, and its step timed by the time model (plan/step_time.h).
 * Settings the user gave stay as given; the rest are searched.
 */
#ifndef LOOM_PLAN_SEARCH_H
#define LOOM_PLAN_SEARCH_H

#include "engine/footprint.h"
#include "loom/config.h"
#include "parallel/kinds.h"
#include "plan/cluster.h"
#include "plan/step_time.h"

/* A layout: each parallelism kind's choice (parallel/kinds.h: the tensor,
 * pipeline and data-parallel sizes, the pipeline's chunks a stage, SP, the
 * ZeRO stage), and the planner's own. */
struct loom_layout {
    struct loom_kind_choice kind[LOOM_KIND_COUNT]; /* by enum loom_kind_id */
    int micro_batch, accumulation;
    enum loom_recompute recompute;
    int recompute_layers, recompute_block; /* full: --recompute-num-layers, and method block (else uniform) */
    int precision;                         /* 0 float32, 1 bf16, 2 fp16 */
    int offload_nvme;
};

struct loom_plan_entry {
    struct loom_layout layout;
    struct loom_footprint mem; /* the busiest stage's rank (largest total) */
    int busiest_stage;
    struct loom_step_time time;
    int fits;
    int order;        /* in the search */
    char reason[256]; /* why it was rejected ("" when it fits) */
};

/* A simpler layout is preferred unless a more complex one is predicted
 * faster by more than this share of the step (the time model's own
 * error, measured at 2-8% on Megatron's runs, stays well inside it). */
#define LOOM_PLAN_SIMPLER_MARGIN 0.10

struct loom_plan {
    /* fitting ones first: the recommended one (the simplest within the margin of the fastest), then
     * the rest fastest first; then the rejected */
    struct loom_plan_entry *entries;
    int n, nfit;
    double mem_limit; /* bytes per rank */
    /* why the first is recommended: "the fastest", or the faster layout it is preferred to and by how
     * much (empty when none fits) */
    char why[768];
};
/* How much machinery a layout brings, for the preference: ZeRO's stage
 * (DDP < ZeRO-1 < ZeRO-2 < ZeRO-3), tensor, pipeline, context and expert
 * parallelism, recomputation, offload. */
int loom_layout_complexity(const struct loom_layout *l);

/* What to search beyond the layout settings. */
enum { LOOM_PLAN_F32 = 1, LOOM_PLAN_BF16 = 2, LOOM_PLAN_FP16 = 4 };
/* The search's bounds: micro-batches up to --micro-batch-size's largest,
 * and steps of up to this many micro-batches (a layout past it is listed
 * as rejected, not evaluated). */
#define LOOM_PLAN_MAX_MICRO_BATCH (1LL << 20)
#define LOOM_PLAN_MAX_ACCUMULATION (1LL << 16)
/* Above this many tokens a step, a global batch divisible by the sequence
 * length is likely tokens given where sequences are meant (the largest
 * published batches are about 16M tokens). */
#define LOOM_PLAN_TOKENS_HINT (1LL << 28)
struct loom_plan_options {
    int keep_given;      /* the layout settings the user gave stay (else all are searched) */
    unsigned precisions; /* LOOM_PLAN_* bits searched; 0: the one base gives */
};

/* Plans base on world ranks of cluster c with mem_limit bytes a rank.
 * NVMe offload is searched when base names an --nvme-path and not the
 * choice. LOOM_ERR_INPUT when the model itself is wrong, or nothing can be
 * tried. */
int loom_plan_search(const struct loom_config *base, int world, const struct loom_cluster *c,
                     double mem_limit, const struct loom_plan_options *opt, struct loom_plan *out);
void loom_plan_free(struct loom_plan *p);
/* "tp 2 x pp 4 (2 chunks) x dp 8, ZeRO-1, SP" */
void loom_layout_describe(const struct loom_layout *l, char *buf, size_t n);
/* The layout's settings set in cfg (not resolved). */
void loom_layout_apply(struct loom_config *cfg, const struct loom_layout *l);
/* The flags that give the layout to loom train. */
void loom_layout_flags(const struct loom_layout *l, char *buf, size_t n);

#endif
