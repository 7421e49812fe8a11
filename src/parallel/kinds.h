/*
 * Parallelism kinds: the registry of what a layout is made of, as
 * model/family.h is the registry of models. A kind is one way a layout
 * spreads or changes a step's work: tensor, pipeline, sequence, context and
 * expert parallelism, data parallelism (DDP), ZeRO's sharding, mixed precision,
 * fp8's scaling, the layout-invariant sums. Each gives, every part optional:
 *
 *   - its name, and the process group it takes its ranks into;
 *   - its settings' checks and derived values (resolve);
 *   - its share of the layout's shape: the groups' sizes, what a rank's
 *     work is split by, what it keeps sharded (shape);
 *   - what it asks of a model (check_model);
 *   - the strategies it puts on the model's stack (build, release); they
 *     carry its part of the footprint (the stack members' replay,
 *     loom/strategy.h);
 *   - its terms of the step-time model (time);
 *   - the planner's choices of its settings (plan_*).
 *
 * The resolution (loom_kinds_resolve), the engine's set-up, the footprint
 * and the planner walk the registry in its order instead of naming a
 * strategy. The order is the stack's, from storage to kernels
 * (loom/strategy.h), and the planner's order of search.
 *
 * Adding a kind: a kind_<name>.c with one `const struct loom_kind`, its
 * enum value below, and its line in kinds.c's table. Not here: the
 * strategies themselves (ddp.c, zero.c, ...), the layers models are built
 * of (src/layers/).
 */
#ifndef LOOM_PARALLEL_KINDS_H
#define LOOM_PARALLEL_KINDS_H

#include <stddef.h>

#include "comm/comm.h"
#include "loom/config.h"
#include "loom/model.h"
#include "parallel/schedule.h"

/* In registry order; the values are the kinds' places in the table. The
 * stack is built in this order: the kinds whose strategies hold no block
 * hooks first (their after_step and finish_backward run last, once every
 * other is done), then the ones that own the stored state, mixed
 * precision's working copies, the invariant tree on top. */
enum loom_kind_id {
    LOOM_KIND_TENSOR = 0,
    LOOM_KIND_PIPELINE = 1,
    LOOM_KIND_SEQUENCE = 2,
    LOOM_KIND_CONTEXT = 3,
    LOOM_KIND_EXPERT = 4,
    LOOM_KIND_FP8 = 5,
    LOOM_KIND_DATA = 6,
    LOOM_KIND_ZERO = 7,
    LOOM_KIND_PRECISION = 8,
    LOOM_KIND_INVARIANT = 9,
    LOOM_KIND_COUNT
};

/* What a layout is on a rank, from its settings: each kind fills its part
 * (loom_kinds_shape). */
struct loom_layout_shape {
    int tp, pp, dp; /* the tensor, pipeline and data-parallel groups' sizes (dp: the data x context group) */
    int cp;         /* the context group's: each sequence split over cp ranks */
    int ep;         /* the expert-parallel group's: each MoE layer's experts split over ep data ranks */
    int chunks;     /* model chunks a pipeline stage holds */
    int row_ways;   /* the rows between the tensor-parallel regions are split this many ways */
    int exact_sums; /* every sum in one order whatever the layout (--layout-invariant) */
    /* held as this rank's shard of the data-parallel group (else whole on every rank) */
    int shard_optimizer, shard_grads, shard_params;
    size_t arena_multiple; /* the arenas' padding: a multiple of it, for equal shards */
};

/* What a kind's build gets, and gives back. */
struct loom_kind_build {
    const struct loom_config *cfg;
    const struct loom_topology *topo;
    const struct loom_layout_shape *shape;
    struct loom_model *model;
    const struct loom_schedule_times *schedule; /* the schedule's times of the last step */
    size_t boundary; /* out: floats of the activation sent between pipeline stages (0: none) */
};

/* What the step-time model (plan/step_time.c) gives a kind's terms. */
struct loom_time_in {
    const struct loom_config *cfg; /* resolved for the layout */
    const struct loom_layout_shape *shape;
    double work;   /* a step's compute and memory-bound seconds on a rank */
    double act;    /* bytes of one micro-batch's activation (B T h) */
    int act_bytes; /* 2 or 4 */
    int lp;        /* 16-bit parameters */
    int full;      /* full recomputation: every forward twice */
    double params; /* parameters the busiest rank holds */
    int ranks_per_node;
    double intra_bw, intra_latency, inter_bw, inter_latency; /* bytes/s and s, within and across nodes */
};
/* A kind's share of a step's time, seconds: pipeline idle time, and time
 * on its group's links. */
struct loom_time_terms {
    double bubble, comm;
};

/* The ring collectives of `bytes` over n ranks: all-reduce, and
 * reduce-scatter or all-gather alone (half of it). */
double loom_ring_allreduce_s(double bytes, int n, double bw, double latency);
double loom_ring_half_s(double bytes, int n, double bw, double latency);
/* The links a group whose ranks span `span` consecutive ranks crosses:
 * within a node or across nodes. */
void loom_time_link(const struct loom_time_in *in, int span, double *bw, double *latency);

/* A kind's choice in a layout the planner considers (plan/search.h): its
 * size, stage or switch, and a second value where it has one (the
 * pipeline's chunks a stage). */
struct loom_kind_choice {
    int value, sub;
};
/* The planner's search as a kind sees it. */
struct loom_plan_space {
    const struct loom_config *base; /* the settings searched over */
    int world, ranks_per_node;
    int keep; /* the settings the user gave stay */
};
/* Whether the setting of flag stays as the user gave it. */
int loom_plan_space_fixed(const struct loom_plan_space *s, const char *flag);
/* The most values a kind's choice of one slot can have (a size divides a
 * world of at most 2^31 ranks). */
#define LOOM_KIND_MAX_CHOICES 2048

struct loom_kind {
    const char *name;
    enum loom_group group; /* the group its ranks are in, or LOOM_GROUP_WORLD (none of its own) */
    /* Checks and derives its settings, once the run's own are resolved
     * (loom_config_resolve): LOOM_ERR_INPUT naming the setting. */
    int (*resolve)(struct loom_config *cfg);
    /* Its part of the shape; world: the ranks of the layout. */
    void (*shape)(const struct loom_config *cfg, int world, struct loom_layout_shape *s);
    /* What it asks of the model of this rank, before anything is
     * allocated: rc, or when rc is LOOM_OK its own complaint
     * (LOOM_ERR_INPUT). Every rank calls it (it may communicate), after an
     * earlier kind's complaint too. */
    int (*check_model)(const struct loom_config *cfg, const struct loom_topology *t,
                       const struct loom_model *m, int rc);
    /* Pushes its strategies on b->model's stack when the layout has them;
     * *state: what release frees (NULL: none). LOOM_ERR_INPUT (an offload
     * file) leaves *state for release. */
    int (*build)(struct loom_kind_build *b, void **state);
    void (*release)(void *state);
    /* Optional: its strategies next to the kernels, pushed after every
     * kind's build (in registry order): the syncs of gradients the model
     * computes in parts (Megatron's finalize_model_grads: the tied table
     * across stages, sequence parallelism's norms). Innermost, they see the
     * float32 gradients the others provide and complete a block's before
     * anyone converts, reduces or shards it. Freed with release_inner. */
    int (*build_inner)(struct loom_kind_build *b, void **state);
    void (*release_inner)(void *state);
    /* Its step-time terms. */
    struct loom_time_terms (*time)(const struct loom_time_in *in);
    /* The planner. plan_slots: the values of its choice searched (0: not
     * searched; 1: value; 2: value, then sub). plan_choices: the values of
     * slot `slot` given the choices so far (all kinds', indexed by id) and
     * the `left` ranks the kinds before it leave; at most
     * LOOM_KIND_MAX_CHOICES, in the order tried. */
    int plan_slots;
    int (*plan_choices)(const struct loom_plan_space *s, const struct loom_kind_choice *l, int slot, int left,
                        int *out);
    /* Whether a layout of every kind's choices is one to try (NULL: yes). */
    int (*plan_accepts)(const struct loom_plan_space *s, const struct loom_kind_choice *l);
    /* The ranks its choice takes from the world (NULL: none). */
    int (*plan_ranks)(const struct loom_kind_choice *c);
    /* Its settings for its choice, in cfg (not resolved). */
    void (*plan_apply)(struct loom_config *cfg, const struct loom_kind_choice *c);
    /* Its part of the layout's description and of its flags (appended). */
    void (*plan_describe)(const struct loom_kind_choice *c, char *buf, size_t n);
    void (*plan_flags)(const struct loom_kind_choice *c, char *buf, size_t n);
    /* The footprint is counted on a few ranks of its group (the busiest):
     * sets its group's size and the rank of probe `probe` in t; returns the
     * number of probes (NULL: its rank 0 only). */
    int (*plan_probes)(const struct loom_kind_choice *c, struct loom_topology *t, int probe);
};

extern const struct loom_kind loom_kind_tensor, loom_kind_pipeline, loom_kind_sequence, loom_kind_context,
    loom_kind_expert, loom_kind_data, loom_kind_zero, loom_kind_precision, loom_kind_fp8, loom_kind_invariant;
/* Sequence parallelism's strategy (its context the model), for a model run
 * outside the engine. */
extern const struct loom_strategy loom_sequence_strategy;

/* The kind with this id. */
const struct loom_kind *loom_kind_at(enum loom_kind_id id);

/* loom_config_resolve, then every kind's settings in registry order. */
int loom_kinds_resolve(struct loom_config *cfg, int dp);
/* The shape of cfg's layout on world ranks. */
void loom_kinds_shape(const struct loom_config *cfg, int world, struct loom_layout_shape *s);
/* The first kind's complaint about the model (LOOM_ERR_INPUT), or LOOM_OK. */
int loom_kinds_check_model(const struct loom_config *cfg, const struct loom_topology *t,
                           const struct loom_model *m);
/* What the kinds' strategies hold: state[id] each kind's build's,
 * state[LOOM_KIND_COUNT + id] its build_inner's. */
#define LOOM_KIND_STATES (2 * LOOM_KIND_COUNT)
/* Every kind's strategies, in registry order (the stack's), then every
 * kind's inner ones. Stops at the first failure. */
int loom_kinds_build(struct loom_kind_build *b, void *state[LOOM_KIND_STATES]);
/* Releases them, in reverse, and clears state. */
void loom_kinds_release(void *state[LOOM_KIND_STATES]);
/* Every kind's terms, summed: the bubble, and time on each group's links. */
void loom_kinds_time(const struct loom_time_in *in, double *bubble, double comm[LOOM_GROUP_COUNT]);

/* The planner's walk over a layout's choices (every kind's, by id). */
int loom_kinds_plan_accepts(const struct loom_plan_space *s, const struct loom_kind_choice *l);
void loom_kinds_plan_apply(struct loom_config *cfg, const struct loom_kind_choice *l);
/* "tp 2 x pp 4 (2 chunks) x dp 8, ZeRO-1, SP": the kinds' parts, in the
 * description's order. */
void loom_kinds_plan_describe(const struct loom_kind_choice *l, char *buf, size_t n);
/* "--tensor-model-parallel-size 2 --pipeline-model-parallel-size 4 ...". */
void loom_kinds_plan_flags(const struct loom_kind_choice *l, char *buf, size_t n);
/* The topology of probe[id] of each kind on world ranks; nprobes[id]: each
 * kind's probes. */
void loom_kinds_plan_topology(const struct loom_kind_choice *l, int world, const int probe[LOOM_KIND_COUNT],
                              struct loom_topology *t, int nprobes[LOOM_KIND_COUNT]);

#endif
