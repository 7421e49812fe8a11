/* The registry of parallelism kinds (see kinds.h). */
#include "parallel/kinds.h"

#include <assert.h>
#include <string.h>

#include "base/log.h"
#include "config/config.h"

static const struct loom_kind *const kinds[] = {
    [LOOM_KIND_TENSOR] = &loom_kind_tensor,       [LOOM_KIND_PIPELINE] = &loom_kind_pipeline,
    [LOOM_KIND_SEQUENCE] = &loom_kind_sequence,   [LOOM_KIND_CONTEXT] = &loom_kind_context,
    [LOOM_KIND_EXPERT] = &loom_kind_expert,       [LOOM_KIND_FP8] = &loom_kind_fp8,
    [LOOM_KIND_DATA] = &loom_kind_data,           [LOOM_KIND_ZERO] = &loom_kind_zero,
    [LOOM_KIND_PRECISION] = &loom_kind_precision, [LOOM_KIND_INVARIANT] = &loom_kind_invariant,
};
static_assert(sizeof kinds / sizeof kinds[0] == LOOM_KIND_COUNT, "a kind without its table line");

/* The layout's description lists the sizes first, then what is sharded,
 * then the rest: its own order of the kinds. */
static const enum loom_kind_id described[] = {
    LOOM_KIND_TENSOR, LOOM_KIND_PIPELINE, LOOM_KIND_CONTEXT,   LOOM_KIND_DATA, LOOM_KIND_EXPERT,
    LOOM_KIND_ZERO,   LOOM_KIND_SEQUENCE, LOOM_KIND_PRECISION, LOOM_KIND_FP8,  LOOM_KIND_INVARIANT};
static_assert(sizeof described / sizeof described[0] == LOOM_KIND_COUNT,
              "a kind left out of the description");

const struct loom_kind *loom_kind_at(enum loom_kind_id id)
{
    LOOM_ASSERT(id >= 0 && id < LOOM_KIND_COUNT);
    return kinds[id];
}

int loom_kinds_resolve(struct loom_config *cfg, int dp)
{
    int rc = loom_config_resolve(cfg, dp);
    for (int k = 0; k < LOOM_KIND_COUNT && rc == LOOM_OK; k++)
        if (kinds[k]->resolve) rc = kinds[k]->resolve(cfg);
    return rc;
}

void loom_kinds_shape(const struct loom_config *cfg, int world, struct loom_layout_shape *s)
{
    *s = (struct loom_layout_shape){
        .tp = 1, .pp = 1, .dp = 1, .cp = 1, .ep = 1, .chunks = 1, .row_ways = 1, .arena_multiple = 1};
    for (int k = 0; k < LOOM_KIND_COUNT; k++)
        if (kinds[k]->shape) kinds[k]->shape(cfg, world, s);
}

int loom_kinds_check_model(const struct loom_config *cfg, const struct loom_topology *t,
                           const struct loom_model *m)
{
    int rc = LOOM_OK;
    for (int k = 0; k < LOOM_KIND_COUNT; k++)
        if (kinds[k]->check_model) rc = kinds[k]->check_model(cfg, t, m, rc);
    return rc;
}

int loom_kinds_build(struct loom_kind_build *b, void *state[LOOM_KIND_STATES])
{
    b->boundary = 0;
    for (int k = 0; k < LOOM_KIND_STATES; k++) state[k] = NULL;
    for (int k = 0; k < LOOM_KIND_COUNT; k++) {
        if (!kinds[k]->build) continue;
        const int rc = kinds[k]->build(b, &state[k]);
        if (rc) return rc;
    }
    for (int k = 0; k < LOOM_KIND_COUNT; k++) {
        if (!kinds[k]->build_inner) continue;
        const int rc = kinds[k]->build_inner(b, &state[LOOM_KIND_COUNT + k]);
        if (rc) return rc;
    }
    return LOOM_OK;
}

void loom_kinds_release(void *state[LOOM_KIND_STATES])
{
    for (int k = LOOM_KIND_COUNT - 1; k >= 0; k--) {
        if (state[LOOM_KIND_COUNT + k] && kinds[k]->release_inner)
            kinds[k]->release_inner(state[LOOM_KIND_COUNT + k]);
        state[LOOM_KIND_COUNT + k] = NULL;
    }
    for (int k = LOOM_KIND_COUNT - 1; k >= 0; k--) {
        if (state[k] && kinds[k]->release) kinds[k]->release(state[k]);
        state[k] = NULL;
    }
}

double loom_ring_allreduce_s(double bytes, int n, double bw, double latency)
{
    return n <= 1 ? 0 : 2.0 * (n - 1) / n * bytes / bw + 2.0 * (n - 1) * latency;
}

double loom_ring_half_s(double bytes, int n, double bw, double latency)
{
    return n <= 1 ? 0 : (double)(n - 1) / n * bytes / bw + (n - 1) * latency;
}

void loom_time_link(const struct loom_time_in *in, int span, double *bw, double *latency)
{
    const int inter = span > in->ranks_per_node;
    *bw = inter ? in->inter_bw : in->intra_bw;
    *latency = inter ? in->inter_latency : in->intra_latency;
}

void loom_kinds_time(const struct loom_time_in *in, double *bubble, double comm[LOOM_GROUP_COUNT])
{
    *bubble = 0;
    for (int g = 0; g < LOOM_GROUP_COUNT; g++) comm[g] = 0;
    for (int k = 0; k < LOOM_KIND_COUNT; k++)
        if (kinds[k]->time) {
            const struct loom_time_terms t = kinds[k]->time(in);
            *bubble += t.bubble;
            comm[kinds[k]->group] += t.comm;
        }
}

/* ---- the planner ----------------------------------------------------------------- */

int loom_plan_space_fixed(const struct loom_plan_space *s, const char *flag)
{
    return s->keep && loom_config_given(s->base, flag);
}

int loom_kinds_plan_accepts(const struct loom_plan_space *s, const struct loom_kind_choice *l)
{
    for (int k = 0; k < LOOM_KIND_COUNT; k++)
        if (kinds[k]->plan_accepts && !kinds[k]->plan_accepts(s, l)) return 0;
    return 1;
}

void loom_kinds_plan_apply(struct loom_config *cfg, const struct loom_kind_choice *l)
{
    for (int k = 0; k < LOOM_KIND_COUNT; k++)
        if (kinds[k]->plan_apply) kinds[k]->plan_apply(cfg, &l[k]);
}

void loom_kinds_plan_describe(const struct loom_kind_choice *l, char *buf, size_t n)
{
    LOOM_ASSERT(n > 0);
    buf[0] = 0;
    for (int i = 0; i < LOOM_KIND_COUNT; i++) {
        const struct loom_kind *kd = kinds[described[i]];
        const size_t at = strlen(buf);
        if (kd->plan_describe) kd->plan_describe(&l[described[i]], buf + at, n - at);
    }
}

void loom_kinds_plan_flags(const struct loom_kind_choice *l, char *buf, size_t n)
{
    LOOM_ASSERT(n > 0);
    buf[0] = 0;
    for (int k = 0; k < LOOM_KIND_COUNT; k++) {
        const size_t at = strlen(buf);
        if (kinds[k]->plan_flags) kinds[k]->plan_flags(&l[k], buf + at, n - at);
    }
    if (buf[0] == ' ') memmove(buf, buf + 1, strlen(buf)); /* each flag comes with its space before it */
}

void loom_kinds_plan_topology(const struct loom_kind_choice *l, int world, const int probe[LOOM_KIND_COUNT],
                              struct loom_topology *t, int nprobes[LOOM_KIND_COUNT])
{
    *t = (struct loom_topology){.world = world, .dp = 1, .tp = 1, .pp = 1, .cp = 1, .ep = 1};
    for (int k = 0; k < LOOM_KIND_COUNT; k++)
        nprobes[k] = kinds[k]->plan_probes ? kinds[k]->plan_probes(&l[k], t, probe[k]) : 1;
    /* the data-parallel group is the data x context one (comm/comm.h) */
    t->dp_rank = t->dp_rank * t->cp + t->cp_rank;
    t->dp *= t->cp;
}
