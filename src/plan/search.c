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
    loom_kinds_plan_describe(l->kind, buf, n);
    size_t k = strlen(buf);
    if (l->precision) k += (size_t)snprintf(buf + k, n - k, ", %s", l->precision == 1 ? "bf16" : "fp16");
    if (l->offload_nvme) snprintf(buf + k, n - k, ", NVMe offload");
}

void loom_layout_flags(const struct loom_layout *l, char *buf, size_t n)
{
    loom_kinds_plan_flags(l->kind, buf, n);
    size_t k = strlen(buf);
    k += (size_t)snprintf(buf + k, n - k, " --micro-batch-size %d%s%s", l->micro_batch,
                          l->precision == 1   ? " --bf16"
                          : l->precision == 2 ? " --fp16"
                                              : "",
                          l->offload_nvme ? " --offload-optimizer nvme" : "");
    if (l->recompute == LOOM_RECOMPUTE_SELECTIVE)
        snprintf(buf + k, n - k, " --recompute-granularity selective");
    else if (l->recompute == LOOM_RECOMPUTE_FULL)
        snprintf(buf + k, n - k,
                 " --recompute-granularity full --recompute-method %s --recompute-num-layers %d",
                 l->recompute_block ? "block" : "uniform", l->recompute_layers);
}

/* The layout's settings over base's, resolved for its dp. */
static int configure(struct loom_config *cfg, const struct loom_config *base, const struct loom_layout *l)
{
    *cfg = *base;
    cfg->ndata_paths = cfg->nvalid_paths = cfg->ntrain_paths = cfg->ntest_paths =
        0; /* the copy does not own base's paths */
    loom_layout_apply(cfg, l);
    cfg->rec.nwarnings = cfg->rec.nwarnings_dropped = 0; /* said once, by the caller */
    return loom_kinds_resolve(cfg, l->kind[LOOM_KIND_DATA].value);
}

void loom_layout_apply(struct loom_config *cfg, const struct loom_layout *l)
{
    const struct loom_config had = *cfg, *base = &had;
    loom_kinds_plan_apply(cfg, l->kind);
    cfg->bf16 = l->precision == 1;
    cfg->fp16 = l->precision == 2;
    if (l->offload_nvme)
        cfg->offload_optimizer = LOOM_OFFLOAD_NVME;
    else if (cfg->offload_optimizer == LOOM_OFFLOAD_NVME)
        cfg->offload_optimizer = LOOM_OFFLOAD_NONE;
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

int loom_layout_complexity(const struct loom_layout *l)
{
    const struct loom_kind_choice *k = l->kind;
    return k[LOOM_KIND_ZERO].value + 4 * (k[LOOM_KIND_TENSOR].value > 1) +
           4 * (k[LOOM_KIND_PIPELINE].value > 1) + 4 * (k[LOOM_KIND_CONTEXT].value > 1) +
           4 * (k[LOOM_KIND_EXPERT].value > 1) + 2 * (int)l->recompute + 6 * l->offload_nvme;
}

/* The recommendation: the simplest fitting layout predicted within the
 * margin of the fastest (the faster among equally simple ones) goes first,
 * and why. */
static void prefer_simpler(struct loom_plan *p)
{
    if (!p->nfit) return;
    const struct loom_plan_entry *fastest = &p->entries[0];
    int pick = 0;
    for (int i = 1; i < p->nfit; i++)
        if (p->entries[i].time.total <= fastest->time.total * (1 + LOOM_PLAN_SIMPLER_MARGIN) &&
            loom_layout_complexity(&p->entries[i].layout) < loom_layout_complexity(&p->entries[pick].layout))
            pick = i;
    if (pick == 0) {
        snprintf(p->why, sizeof p->why,
                 "the fastest, and no simpler layout is predicted within %.0f%% of its step",
                 100 * LOOM_PLAN_SIMPLER_MARGIN);
        return;
    }
    char desc[128];
    loom_layout_describe(&fastest->layout, desc, sizeof desc);
    snprintf(p->why, sizeof p->why,
             "simpler than the fastest (%s, micro-batch %d), predicted only %.1f%% faster: within the %.0f%% "
             "margin a simpler layout is kept for (DDP < ZeRO-1 < ZeRO-2 < ZeRO-3; no tensor, pipeline, "
             "context or expert parallelism, recomputation or offload unless they pay)",
             desc, fastest->layout.micro_batch, 100 * (p->entries[pick].time.total / fastest->time.total - 1),
             100 * LOOM_PLAN_SIMPLER_MARGIN);
    const struct loom_plan_entry chosen = p->entries[pick];
    memmove(p->entries + 1, p->entries, sizeof *p->entries * (size_t)pick);
    p->entries[0] = chosen;
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
    /* the busiest rank: each category at its largest over the ranks the
     * kinds name (the first and last stage, the first and last
     * data-parallel rank), the total of the busiest */
    int probe[LOOM_KIND_COUNT] = {0}, nprobes[LOOM_KIND_COUNT];
    for (int first = 1;; first = 0) {
        struct loom_topology t;
        loom_kinds_plan_topology(e->layout.kind, world, probe, &t, nprobes);
        struct loom_footprint fp;
        if ((rc = loom_engine_footprint(&cfg, &t, &fp))) {
            snprintf(e->reason, sizeof e->reason, "%s", loom_error_message());
            loom_error_clear();
            return;
        }
        if (first || fp.total > e->mem.total) {
            e->busiest_stage = t.pp_rank;
            e->mem.total = fp.total;
            e->mem.params = fp.params;
            e->mem.flops_per_token = fp.flops_per_token;
        }
        for (int k = 0; k < LOOM_MEM_COUNT; k++)
            if (fp.peak[k] > e->mem.peak[k]) e->mem.peak[k] = fp.peak[k];
        int k = LOOM_KIND_COUNT - 1; /* the next probe: the last kind's the fastest */
        while (k >= 0 && ++probe[k] >= nprobes[k]) probe[k--] = 0;
        if (k < 0) break;
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
    struct loom_plan_space space; /* as the kinds see it */
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
    const int64_t G = s->base->global_batch_size, tokens = mb * s->base->seq_length,
                  acc = G / (mb * l.kind[LOOM_KIND_DATA].value);
    l.micro_batch = (int)mb;
    if (tokens > INT32_MAX) {
        add_unevaluated(s, l, "a micro-batch of %lld tokens (micro-batch x --seq-length) is above %lld",
                        tokens, INT32_MAX);
        return 0;
    }
    if (G % (mb * l.kind[LOOM_KIND_DATA].value) == 0 && acc > LOOM_PLAN_MAX_ACCUMULATION) {
        add_unevaluated(s, l, "%lld micro-batches a step: the planner tries up to %lld", acc,
                        LOOM_PLAN_MAX_ACCUMULATION);
        return 1;
    }
    return add_candidates(s, l);
}

/* The micro-batches of a layout of the kinds' choices. They run in powers
 * of two up to what --micro-batch-size takes, and stop past one whose
 * activations alone need more than a rank has. */
static void add_micro_batches(struct search *s, struct loom_layout l)
{
    const struct loom_config *b = s->base;
    const int64_t G = b->global_batch_size, given_mb = b->micro_batch_size, dp = l.kind[LOOM_KIND_DATA].value;
    if (fixed(s, "--micro-batch-size") && given_mb > 0) {
        add_micro_batch(s, l, given_mb);
        return;
    }
    for (int64_t mb = 1; mb <= G && mb <= LOOM_PLAN_MAX_MICRO_BATCH; mb *= 2)
        if (G % (mb * dp) == 0 && !add_micro_batch(s, l, mb)) break;
}

/* Every kind's choices, slot by slot in registry order (the tensor and
 * pipeline sizes, the pipeline's chunks, SP, the data-parallel size, the
 * ZeRO stage), `left` the ranks the kinds before kind k leave; then the
 * micro-batches and the planner's own choices of each layout the kinds
 * accept. */
static void add_kind_choices(struct search *s, struct loom_layout *l, int k, int slot, int left)
{
    if (k == LOOM_KIND_COUNT) {
        if (loom_kinds_plan_accepts(&s->space, l->kind)) add_micro_batches(s, *l);
        return;
    }
    const struct loom_kind *kind = loom_kind_at((enum loom_kind_id)k);
    if (slot == kind->plan_slots) {
        add_kind_choices(s, l, k + 1, 0, kind->plan_ranks ? left / kind->plan_ranks(&l->kind[k]) : left);
        return;
    }
    int *v = loom_alloc(sizeof(int) * LOOM_KIND_MAX_CHOICES, LOOM_MEM_OTHER);
    const int n = kind->plan_choices(&s->space, l->kind, slot, left, v);
    for (int i = 0; i < n; i++) {
        *(slot ? &l->kind[k].sub : &l->kind[k].value) = v[i];
        add_kind_choices(s, l, k, slot + 1, left);
    }
    loom_free(v);
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
    s.space = (struct loom_plan_space){
        .base = base, .world = world, .ranks_per_node = c->ranks_per_node, .keep = opt->keep_given};
    struct loom_layout l = {0};
    add_kind_choices(&s, &l, 0, 0, world);
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
    prefer_simpler(out);
    return LOOM_OK;
}

void loom_plan_free(struct loom_plan *p)
{
    loom_free(p->entries);
    memset(p, 0, sizeof *p);
}
