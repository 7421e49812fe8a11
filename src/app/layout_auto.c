/* --layout auto (see layout_auto.h). */
#include "app/layout_auto.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "app/placement.h"
#include "app/report.h"
#include "base/buf.h"
#include "base/log.h"
#include "comm/comm.h"
#include "config/config.h"
#include "kernels/backend.h"
#include "plan/cluster.h"

/* What rank 0 sends: the layout (as its bytes: every rank runs the same
 * build) and the prediction. */
enum { M_MEM, M_STEP, M_LIMIT, M_NFIT, M_N, M_COUNT };
struct choice {
    struct loom_layout layout;
    double v[M_COUNT];
};

/* This node, measured by every rank at once on its own threads, as training
 * will share it: the products' rates and the memory bandwidth summed. */
static int measure(const struct loom_config *cfg, int world, struct loom_cluster *c)
{
    const struct loom_backend *b = loom_backend_cpu(); /* the planner's rates are the CPU's */
    int rc = b->setup(cfg->threads, cfg->bf16 ? LOOM_DTYPE_BF16 : LOOM_DTYPE_F32, getenv("LOOM_BF16_UNITS")),
        first;
    if (rc == LOOM_OK) rc = loom_cluster_measure_node(c, world);
    if ((rc = loom_comm_agree(rc, &first))) return rc;
    double rates[3] = {c->peak_f32, c->peak_bf16, c->mem_bw};
    if (world > 1) {
        loom_comm_allreduce_sync(LOOM_GROUP_WORLD, loom_buf_of(rates, 3, LOOM_DTYPE_F64), LOOM_OP_SUM);
        c->peak_f32 = rates[0], c->peak_bf16 = rates[1], c->mem_bw = rates[2];
    }
    return LOOM_OK;
}

static int plan_on_root(struct loom_config *cfg, int world, const struct loom_cluster *node,
                        struct choice *msg)
{
    const double limit = loom_placement_budget(cfg);
    struct loom_plan p;
    int rc = loom_plan_search(cfg, world, node, limit,
                              &(struct loom_plan_options){.keep_given = 1, .precisions = 0}, &p);
    if (rc == LOOM_OK && p.nfit == 0) {
        double least = 0;
        for (int i = 0; i < p.n; i++)
            if (p.entries[i].mem.total > 0 && (least == 0 || p.entries[i].mem.total < least))
                least = (double)p.entries[i].mem.total;
        char a[32], b[32];
        rc = loom_error_set(
            LOOM_ERR_INPUT,
            "--layout auto: none of the %d layouts of %d ranks fits in %s a rank (the least needs "
            "%s): raise --mem-per-rank, give --nvme-path for offload, or start more ranks",
            p.n, world, loom_fmt_bytes(a, sizeof a, limit), loom_fmt_bytes(b, sizeof b, least));
    }
    if (rc == LOOM_OK) {
        const struct loom_plan_entry *e = &p.entries[0];
        msg->layout = e->layout;
        msg->v[M_MEM] = (double)e->mem.total;
        msg->v[M_STEP] = e->time.total;
        msg->v[M_LIMIT] = limit;
        msg->v[M_NFIT] = p.nfit;
        msg->v[M_N] = p.n;
    }
    loom_plan_free(&p);
    return rc;
}

int loom_layout_auto_choose(struct loom_config *cfg, struct loom_layout_auto *out)
{
    memset(out, 0, sizeof *out);
    if (!loom_config_given(cfg, "--global-batch-size"))
        return loom_error_set(LOOM_ERR_INPUT,
                              "--layout auto needs --global-batch-size G (sequences per step): the "
                              "layouts it compares train the same batch");
    loom_comm_setup_world();
    const int world = loom_comm_world_size(), rank = loom_comm_world_rank();
    struct choice msg;
    memset(&msg, 0, sizeof msg);
    struct loom_cluster node;
    int rc = measure(cfg, world, &node), first;
    if (rc) {
        if (rank != 0) loom_error_clear();
        return rc;
    }
    rc = rank == 0 ? plan_on_root(cfg, world, &node, &msg) : LOOM_OK;
    if ((rc = loom_comm_agree(rc, &first))) {
        if (first != rank) loom_error_clear();
        return rc;
    }
    loom_comm_wait(loom_comm_broadcast(LOOM_GROUP_WORLD, loom_buf_of(&msg, sizeof msg, LOOM_DTYPE_U8), 0));
    struct loom_layout *l = &out->layout;
    *l = msg.layout;
    out->on = 1;
    cfg->decided |= LOOM_DECIDED_LAYOUT;
    out->predicted_mem = msg.v[M_MEM];
    out->predicted_step = msg.v[M_STEP];
    out->mem_limit = msg.v[M_LIMIT];
    out->nfit = (int)msg.v[M_NFIT];
    out->n = (int)msg.v[M_N];
    /* the settings it changes take the origin "layout auto" */
    const int n = loom_config_count();
    const char *name;
    char(*before)[128] = malloc(sizeof *before * (size_t)n);
    LOOM_ASSERT(before != NULL);
    for (int i = 0; i < n; i++) loom_config_setting(cfg, i, &name, before[i], sizeof before[i]);
    loom_layout_apply(cfg, l);
    for (int i = 0; i < n; i++) {
        char now[128];
        loom_config_setting(cfg, i, &name, now, sizeof now);
        const enum loom_origin had = (enum loom_origin)cfg->rec.origin[i];
        if (strcmp(now, before[i]) != 0 && had != LOOM_ORIGIN_FLAG && had != LOOM_ORIGIN_JSON)
            cfg->rec.origin[i] = LOOM_ORIGIN_AUTO;
    }
    free(before);
    if (rank == 0) {
        char what[160], a[32], b[32];
        loom_layout_describe(l, what, sizeof what);
        printf(
            "layout auto: %s, micro-batch %d x %d accumulation%s%s: predicted %s a rank (of %s) and %.3f s a "
            "step, the recommended of %d layouts that fit (of %d: the simplest within 10%% of the fastest)\n",
            what, l->micro_batch, l->accumulation,
            l->recompute == LOOM_RECOMPUTE_SELECTIVE ? ", selective recomputation"
            : l->recompute == LOOM_RECOMPUTE_FULL    ? ", full recomputation"
                                                     : "",
            l->offload_nvme ? ", optimizer on NVMe" : "", loom_fmt_bytes(a, sizeof a, out->predicted_mem),
            loom_fmt_bytes(b, sizeof b, out->mem_limit), out->predicted_step, out->nfit, out->n);
        fflush(stdout);
    }
    return LOOM_OK;
}
