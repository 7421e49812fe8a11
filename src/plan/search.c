/* The planner's search (see search.h). */
#include "plan/search.h"

#include <stdint.h>
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
    if (l->precision) k += snprintf(buf + k, n - (size_t)k, ", %s", l->precision == 1 ? "bf16" : "fp16");
    if (l->offload_nvme) snprintf(buf + k, n - (size_t)k, ", NVMe offload");
}

void loom_layout_flags(const struct loom_layout *l, char *buf, size_t n)
{
    int k =
        snprintf(buf, n, "--tensor-model-parallel-size %d --pipeline-model-parallel-size %d", l->tp, l->pp);
    if (l->vpp > 1)
        k += snprintf(buf + k, n - (size_t)k, " --num-layers-per-virtual-pipeline-stage V/%d", l->vpp);
    k += snprintf(buf + k, n - (size_t)k, "%s --zero-stage %d --micro-batch-size %d%s%s",
                  l->sp ? " --sequence-parallel" : "", l->zero_stage, l->micro_batch,
                  l->precision == 1   ? " --bf16"
                  : l->precision == 2 ? " --fp16"
                                      : "",
                  l->offload_nvme ? " --offload-optimizer nvme" : "");
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
    loom_layout_apply(cfg, l);
    cfg->rec.nwarnings = cfg->rec.nwarnings_dropped = 0; /* said once, by the caller */
    return loom_config_resolve(cfg, l->dp);
}

void loom_layout_apply(struct loom_config *cfg, const struct loom_layout *l)
{
    const struct loom_config had = *cfg, *base = &had;
    cfg->tensor_model_parallel_size = l->tp;
    cfg->pipeline_model_parallel_size = l->pp;
    cfg->num_layers_per_virtual_pipeline_stage = l->vpp > 1 ? cfg->num_layers / (l->pp * l->vpp) : 0;
    cfg->sequence_parallel = l->sp;
    cfg->bf16 = l->precision == 1;
    cfg->fp16 = l->precision == 2;
    if (l->offload_nvme)
        cfg->offload_optimizer = LOOM_OFFLOAD_NVME;
    else if (cfg->offload_optimizer == LOOM_OFFLOAD_NVME)
        cfg->offload_optimizer = LOOM_OFFLOAD_NONE;
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
}

/* Fitting first; fastest first, then the least memory, then the order of
 * the search (the simpler setting first: no SP, ZeRO, recomputation). */
static int cmp_entry(const void *a, const void *b)
{
    const struct loom_plan_entry *x = a, *y = b;
    if (x->fits != y->fits) return y->fits - x->fits;
    if (x->fits && x->time.total != y->time.total) return x->time.total < y->time.total ? -1 : 1;
    if (x->fits && x->mem.total != y->mem.total) return x->mem.total < y->mem.total ? -1 : 1;
    return (x->order > y->order) - (x->order < y->order);
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

/* The search's state: what stays as given, and the candidates so far. */
struct search {
    const struct loom_config *base;
    int world, keep;
    unsigned precisions; /* LOOM_PLAN_* bits */
    int offloads;        /* 1: as given; 2: without and with NVMe offload */
    const struct loom_cluster *c;
    double mem_limit;
    struct loom_plan *out;
    size_t cap;
};

/* Whether a setting is the user's to keep. */
static int fixed(const struct search *s, const char *flag)
{
    return s->keep && loom_config_given(s->base, flag);
}

/* A new entry for layout l, its order the search's. */
static struct loom_plan_entry *new_entry(struct search *s, const struct loom_layout *l)
{
    struct loom_plan *out = s->out;
    if ((size_t)out->n == s->cap) {
        s->cap *= 2;
        out->entries = loom_realloc(out->entries, s->cap * sizeof *out->entries, LOOM_MEM_OTHER);
    }
    struct loom_plan_entry *e = &out->entries[out->n++];
    memset(e, 0, sizeof *e);
    e->layout = *l;
    e->order = out->n - 1;
    return e;
}

/* Every recomputation, precision and offload choice of one split. Returns
 * whether one of them might fit with a larger micro-batch: all but those
 * whose activations alone pass the limit (they only grow with it). */
static int add_candidates(struct search *s, struct loom_layout l)
{
    const int fix_rec = fixed(s, "--recompute-granularity") || fixed(s, "--recompute-activations");
    int larger = 0;
    for (int r = 0; r <= 2; r++) {
        if (fix_rec && r != (int)s->base->recompute_granularity) continue;
        for (int prec = 0; prec < 3; prec++) {
            if (!(s->precisions & (1u << prec))) continue;
            for (int off = 0; off < s->offloads; off++) {
                struct loom_plan_entry *e = new_entry(s, &l);
                e->layout.recompute = (enum loom_recompute)r;
                e->layout.precision = prec;
                e->layout.offload_nvme =
                    s->offloads == 2 ? off : s->base->offload_optimizer == LOOM_OFFLOAD_NVME;
                evaluate(s->base, s->world, s->c, s->mem_limit, e);
                s->out->nfit += e->fits;
                larger |= !((double)e->mem.peak[LOOM_MEM_ACTIVATIONS] > s->mem_limit);
            }
        }
    }
    return larger;
}

/* A layout the search does not evaluate, with the reason. */
static void add_unevaluated(struct search *s, struct loom_layout l, const char *fmt, int64_t a, int64_t b)
{
    struct loom_plan_entry *e = new_entry(s, &l);
    e->layout.recompute = s->base->recompute_granularity;
    e->layout.precision = s->base->bf16 ? 1 : s->base->fp16 ? 2 : 0;
    snprintf(e->reason, sizeof e->reason, fmt, (long long)a, (long long)b);
}

/* The candidates of micro-batch mb; whether a larger one might fit (see
 * add_candidates). The bounds keep the search's work bounded: a step's
 * micro-batches are replayed and scheduled one by one. */
static int add_micro_batch(struct search *s, struct loom_layout l, int64_t mb)
{
    const int64_t G = s->base->global_batch_size, tokens = mb * s->base->seq_length, acc = G / (mb * l.dp);
    l.micro_batch = (int)mb;
    if (tokens > INT32_MAX) {
        add_unevaluated(s, l, "a micro-batch of %lld tokens (micro-batch x --seq-length) is above %lld",
                        tokens, INT32_MAX);
        return 0;
    }
    if (G % (mb * l.dp) == 0 && acc > LOOM_PLAN_MAX_ACCUMULATION) {
        add_unevaluated(s, l, "%lld micro-batches a step: the planner tries up to %lld", acc,
                        LOOM_PLAN_MAX_ACCUMULATION);
        return 1;
    }
    return add_candidates(s, l);
}

/* The data-parallel choices of a tp x pp split: ZeRO stage, micro-batch.
 * Micro-batches run in powers of two up to what --micro-batch-size takes,
 * and stop past one whose activations alone need more than a rank has. */
static void add_dp_choices(struct search *s, struct loom_layout l)
{
    const struct loom_config *b = s->base;
    const int64_t G = b->global_batch_size, given_mb = b->micro_batch_size;
    const int fix_z = fixed(s, "--zero-stage"), fix_mb = fixed(s, "--micro-batch-size") && given_mb > 0;
    for (int z = 0; z <= (l.dp > 1 ? 3 : 0); z++) {
        if (fix_z && z != b->zero_stage) continue;
        l.zero_stage = z;
        if (fix_mb) {
            add_micro_batch(s, l, given_mb);
            continue;
        }
        for (int64_t mb = 1; mb <= G && mb <= LOOM_PLAN_MAX_MICRO_BATCH; mb *= 2)
            if (G % (mb * l.dp) == 0 && !add_micro_batch(s, l, mb)) break;
    }
}

int loom_plan_search(const struct loom_config *base, int world, const struct loom_cluster *c,
                     double mem_limit, const struct loom_plan_options *opt, struct loom_plan *out)
{
    memset(out, 0, sizeof *out);
    out->mem_limit = mem_limit;
    const struct loom_model_family *family = loom_model_family_of_preset(base->model, NULL);
    if (!family)
        return loom_error_set(LOOM_ERR_INPUT, "--model %s: no model family has this preset", base->model);
    int rc = family->check(base, base->seq_length);
    if (rc) return rc;
    if (base->global_batch_size < 1)
        return loom_error_set(LOOM_ERR_INPUT, "loom plan needs --global-batch-size G (sequences per step)");
    struct search s = {.base = base,
                       .world = world,
                       .keep = opt->keep_given,
                       .c = c,
                       .mem_limit = mem_limit,
                       .out = out,
                       .cap = 256};
    const unsigned given = base->bf16 ? LOOM_PLAN_BF16 : base->fp16 ? LOOM_PLAN_FP16 : LOOM_PLAN_F32;
    s.precisions = opt->precisions ? opt->precisions : given;
    /* NVMe offload is searched when a path is given and the choice is not */
    s.offloads = *base->nvme_path && !fixed(&s, "--offload-optimizer") ? 2 : 1;
    out->entries = loom_alloc(s.cap * sizeof *out->entries, LOOM_MEM_OTHER);
    const int L = base->num_layers, fix_tp = fixed(&s, "--tensor-model-parallel-size"),
              fix_pp = fixed(&s, "--pipeline-model-parallel-size"), fix_sp = fixed(&s, "--sequence-parallel"),
              fix_v = fixed(&s, "--num-layers-per-virtual-pipeline-stage");
    const int want_v =
        base->num_layers_per_virtual_pipeline_stage > 0 && base->pipeline_model_parallel_size > 0
            ? L / (base->pipeline_model_parallel_size * base->num_layers_per_virtual_pipeline_stage)
            : 1;
    for (int tp = 1; tp <= world; tp++) {
        /* --layout-invariant N takes tensor-parallel sizes dividing N */
        if (world % tp || (base->layout_invariant && base->layout_invariant % tp) ||
            (fix_tp ? tp != base->tensor_model_parallel_size
                    : tp > c->ranks_per_node || base->num_attention_heads % tp))
            continue;
        for (int pp = 1; pp <= world / tp; pp++) {
            if ((world / tp) % pp || (fix_pp ? pp != base->pipeline_model_parallel_size : L % pp)) continue;
            for (int v = 1; v <= (pp > 1 ? 2 : 1); v++) {
                if ((fix_v && v != want_v) || (v > 1 && L % (pp * v))) continue;
                for (int sp = 0; sp <= (tp > 1); sp++) {
                    if (fix_sp && sp != base->sequence_parallel) continue;
                    add_dp_choices(&s, (struct loom_layout){
                                           .tp = tp, .pp = pp, .dp = world / (tp * pp), .vpp = v, .sp = sp});
                }
            }
        }
    }
    if (out->n == 0)
        return loom_error_set(LOOM_ERR_INPUT, "no layout of %d ranks is possible with the settings given",
                              world);
    /* a batch in tokens where sequences are meant: say so */
    const int64_t G = base->global_batch_size, T = base->seq_length;
    if (G * T > LOOM_PLAN_TOKENS_HINT && G % T == 0)
        loom_log_warn(
            "--global-batch-size %lld counts sequences of --seq-length %lld: %lld tokens a step; for "
            "%lld tokens a step give --global-batch-size %lld",
            (long long)G, (long long)T, (long long)(G * T), (long long)G, (long long)(G / T));
    qsort(out->entries, (size_t)out->n, sizeof *out->entries, cmp_entry);
    return LOOM_OK;
}

void loom_plan_free(struct loom_plan *p)
{
    loom_free(p->entries);
    memset(p, 0, sizeof *p);
}
