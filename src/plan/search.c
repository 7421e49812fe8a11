/* The planner's search (see search.h). */
#include "plan/search.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/log.h"
#include "base/mem.h"
#include "config/config.h"
#include "model/family.h"

void loom_layout_describe(const struct loom_layout *l, char *buf, size_t n)
{
    int k = snprintf(buf, n, "tp %d", l->tp);
    if (l->pp > 1) k += snprintf(buf + k, n - (size_t)k, " x pp %d", l->pp);
    if (l->vpp > 1) k += snprintf(buf + k, n - (size_t)k, " (%d chunks)", l->vpp);
    k += snprintf(buf + k, n - (size_t)k, " x dp %d", l->dp);
    if (l->zero_stage) k += snprintf(buf + k, n - (size_t)k, ", ZeRO-%d", l->zero_stage);
    if (l->sp) k += snprintf(buf + k, n - (size_t)k, ", SP");
    if (l->offload_nvme) snprintf(buf + k, n - (size_t)k, ", NVMe offload");
}

void loom_layout_flags(const struct loom_layout *l, char *buf, size_t n)
{
    int k =
        snprintf(buf, n, "--tensor-model-parallel-size %d --pipeline-model-parallel-size %d", l->tp, l->pp);
    if (l->vpp > 1)
        k += snprintf(buf + k, n - (size_t)k, " --num-layers-per-virtual-pipeline-stage V/%d", l->vpp);
    k += snprintf(buf + k, n - (size_t)k, "%s --zero-stage %d --micro-batch-size %d",
                  l->sp ? " --sequence-parallel" : "", l->zero_stage, l->micro_batch);
    if (l->recompute == LOOM_RECOMPUTE_SELECTIVE)
        snprintf(buf + k, n - (size_t)k, " --recompute-granularity selective");
    else if (l->recompute == LOOM_RECOMPUTE_FULL)
        snprintf(buf + k, n - (size_t)k,
                 " --recompute-granularity full --recompute-method %s --recompute-num-layers %d",
                 l->recompute_block ? "block" : "uniform", l->recompute_layers);
}

/* The layout's settings over base's, resolved for its dp. */
static int configure(struct loom_config *cfg, const struct loom_config *base, const struct loom_layout *l)
{
    *cfg = *base;
    cfg->ndata_paths = cfg->nvalid_paths = 0; /* the copy does not own base's paths */
    cfg->tensor_model_parallel_size = l->tp;
    cfg->pipeline_model_parallel_size = l->pp;
    cfg->num_layers_per_virtual_pipeline_stage = l->vpp > 1 ? cfg->num_layers / (l->pp * l->vpp) : 0;
    cfg->sequence_parallel = l->sp;
    cfg->zero_stage = l->zero_stage;
    cfg->micro_batch_size = l->micro_batch;
    cfg->gradient_accumulation_steps = 0;
    cfg->recompute_granularity = l->recompute;
    /* full recomputation: the user's method and chunk when given, else
     * every layer keeping only its input */
    const int as_given =
        l->recompute == LOOM_RECOMPUTE_FULL && base->recompute_granularity == LOOM_RECOMPUTE_FULL &&
        base->recompute_method != LOOM_RECOMPUTE_METHOD_NONE && base->recompute_num_layers > 0;
    cfg->recompute_method = as_given                              ? base->recompute_method
                            : l->recompute == LOOM_RECOMPUTE_FULL ? LOOM_RECOMPUTE_UNIFORM
                                                                  : LOOM_RECOMPUTE_METHOD_NONE;
    cfg->recompute_num_layers = as_given                              ? base->recompute_num_layers
                                : l->recompute == LOOM_RECOMPUTE_FULL ? 1
                                                                      : 0;
    cfg->recompute_activations = 0;
    cfg->fsdp_sharding_strategy = LOOM_FSDP_NONE;
    cfg->rec.nwarnings = cfg->rec.nwarnings_dropped = 0; /* said once, by the caller */
    return loom_config_resolve(cfg, l->dp);
}

static int cmp_entry(const void *a, const void *b)
{
    const struct loom_plan_entry *x = a, *y = b;
    if (x->fits != y->fits) return y->fits - x->fits;
    if (!x->fits) return 0;
    return x->time.total < y->time.total ? -1 : x->time.total > y->time.total;
}

static void human_gb(char *buf, size_t n, double bytes)
{
    snprintf(buf, n, "%.2f GB", bytes / 1e9);
}

/* One candidate: its configuration's verdict, memory and time. */
static void evaluate(const struct loom_config *base, int world, const struct loom_cluster *c,
                     double mem_limit, struct loom_plan_entry *e)
{
    struct loom_config cfg;
    int rc = configure(&cfg, base, &e->layout);
    if (rc) {
        snprintf(e->reason, sizeof e->reason, "%s", loom_error_message());
        loom_error_clear();
        return;
    }
    e->layout.accumulation = cfg.gradient_accumulation_steps;
    e->layout.recompute_layers = cfg.recompute_num_layers;
    e->layout.recompute_block = cfg.recompute_method == LOOM_RECOMPUTE_BLOCK;
    /* the first and last stages hold the most (in-flight activations, the
     * embedding, the head), and the first and last data-parallel ranks the
     * most of a shard (ZeRO's padding and block boundaries): each category
     * at its largest over them, the total of the busiest */
    const int stages[2] = {0, e->layout.pp - 1}, dps[2] = {0, e->layout.dp - 1};
    for (int i = 0; i < (e->layout.pp > 1 ? 2 : 1); i++)
        for (int j = 0; j < (e->layout.dp > 1 ? 2 : 1); j++) {
            struct loom_topology t = {.world = world,
                                      .dp = e->layout.dp,
                                      .tp = e->layout.tp,
                                      .pp = e->layout.pp,
                                      .pp_rank = stages[i],
                                      .dp_rank = dps[j]};
            struct loom_footprint fp;
            if ((rc = loom_engine_footprint(&cfg, &t, &fp))) {
                snprintf(e->reason, sizeof e->reason, "%s", loom_error_message());
                loom_error_clear();
                return;
            }
            if ((i == 0 && j == 0) || fp.total > e->mem.total) {
                e->busiest_stage = stages[i];
                e->mem.total = fp.total;
                e->mem.params = fp.params;
                e->mem.flops_per_token = fp.flops_per_token;
            }
            for (int k = 0; k < LOOM_MEM_COUNT; k++)
                if (fp.peak[k] > e->mem.peak[k]) e->mem.peak[k] = fp.peak[k];
        }
    loom_step_time_predict(c, &cfg, world, &e->mem, &e->time);
    if ((double)e->mem.total > mem_limit) {
        char need[32], have[32];
        human_gb(need, sizeof need, (double)e->mem.total);
        human_gb(have, sizeof have, mem_limit);
        snprintf(e->reason, sizeof e->reason, "needs %s a rank (stage %d), above %s", need, e->busiest_stage,
                 have);
        return;
    }
    e->fits = 1;
}

/* Whether a search setting is the user's to keep. */
static int keep;

static int fixed(const struct loom_config *cfg, const char *flag)
{
    return keep && loom_config_given(cfg, flag);
}

int loom_plan_search(const struct loom_config *base, int world, const struct loom_cluster *c,
                     double mem_limit, int keep_given, struct loom_plan *out)
{
    memset(out, 0, sizeof *out);
    out->mem_limit = mem_limit;
    keep = keep_given;
    const struct loom_model_family *family = loom_model_family_of_preset(base->model, NULL);
    if (!family)
        return loom_error_set(LOOM_ERR_INPUT, "--model %s: no model family has this preset", base->model);
    int rc = family->check(base, base->seq_length);
    if (rc) return rc;
    if (base->global_batch_size < 1)
        return loom_error_set(LOOM_ERR_INPUT, "loom plan needs --global-batch-size G (sequences per step)");
    const int L = base->num_layers, G = base->global_batch_size;
    const int fix_tp = fixed(base, "--tensor-model-parallel-size"),
              fix_pp = fixed(base, "--pipeline-model-parallel-size"),
              fix_mb = fixed(base, "--micro-batch-size"), fix_z = fixed(base, "--zero-stage"),
              fix_sp = fixed(base, "--sequence-parallel"),
              fix_v = fixed(base, "--num-layers-per-virtual-pipeline-stage"),
              fix_rec = fixed(base, "--recompute-granularity") || fixed(base, "--recompute-activations");
    const int nvme = base->offload_optimizer == LOOM_OFFLOAD_NVME;
    size_t cap = 256;
    out->entries = loom_alloc(cap * sizeof *out->entries, LOOM_MEM_OTHER);
    for (int tp = 1; tp <= world; tp++) {
        if (world % tp || (fix_tp && tp != base->tensor_model_parallel_size)) continue;
        if (!fix_tp && (tp > c->ranks_per_node || base->num_attention_heads % tp)) continue;
        for (int pp = 1; pp <= world / tp; pp++) {
            if ((world / tp) % pp || (fix_pp && pp != base->pipeline_model_parallel_size)) continue;
            if (!fix_pp && L % pp) continue;
            const int dp = world / (tp * pp);
            for (int v = 1; v <= (pp > 1 ? 2 : 1); v++) {
                if (fix_v && v != (base->num_layers_per_virtual_pipeline_stage > 0
                                       ? L / (pp * base->num_layers_per_virtual_pipeline_stage)
                                       : 1))
                    continue;
                if (v > 1 && L % (pp * v)) continue;
                for (int sp = 0; sp <= (tp > 1); sp++) {
                    if (fix_sp && sp != base->sequence_parallel) continue;
                    for (int z = 0; z <= (dp > 1 ? 3 : 0); z++) {
                        if (fix_z && z != base->zero_stage) continue;
                        for (int mb = 1; mb <= G; mb *= 2) {
                            if (fix_mb && mb != base->micro_batch_size) continue;
                            if (!fix_mb && G % (mb * dp)) continue;
                            for (int r = 0; r <= 2; r++) {
                                if (fix_rec && r != (int)base->recompute_granularity) continue;
                                if ((size_t)out->n == cap) {
                                    cap *= 2;
                                    out->entries = loom_realloc(out->entries, cap * sizeof *out->entries,
                                                                LOOM_MEM_OTHER);
                                }
                                struct loom_plan_entry *e = &out->entries[out->n++];
                                memset(e, 0, sizeof *e);
                                e->layout = (struct loom_layout){.tp = tp,
                                                                 .pp = pp,
                                                                 .dp = dp,
                                                                 .vpp = v,
                                                                 .sp = sp,
                                                                 .zero_stage = z,
                                                                 .micro_batch = mb,
                                                                 .recompute = (enum loom_recompute)r,
                                                                 .offload_nvme = nvme};
                                evaluate(base, world, c, mem_limit, e);
                                out->nfit += e->fits;
                            }
                        }
                    }
                }
            }
        }
    }
    if (out->n == 0)
        return loom_error_set(LOOM_ERR_INPUT, "no layout of %d ranks is possible with the settings given",
                              world);
    qsort(out->entries, (size_t)out->n, sizeof *out->entries, cmp_entry);
    return LOOM_OK;
}

void loom_plan_free(struct loom_plan *p)
{
    loom_free(p->entries);
    memset(p, 0, sizeof *p);
}
