/*
 * `loom train` and `loom eval`: a model of the --model preset's family
 * (model/family.h) on token shards, driven through the engine (engine.c:
 * layout, strategies, optimizer, step, checkpoints) as any model would be;
 * here are the data, evaluation, the checkpoint cadence, logging, metrics
 * and the closing summary. Rank 0 alone prints and writes.
 */
#include "loom/train.h"

#include <errno.h>
#include <math.h>
#include <signal.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <unistd.h>

#include "app/layout_auto.h"
#include "app/mfu.h"
#include "app/placement.h"
#include "app/report.h"
#include "app/run_data.h"
#include "app/stop.h"
#include "base/blas_env.h"
#include "base/clock.h"
#include "base/log.h"
#include "base/mem.h"
#include "base/testpoint.h"
#include "base/trace.h"
#include "comm/comm.h"
#include "config/config.h"
#include "engine/engine_impl.h"
#include "engine/footprint.h"
#include "engine/trace_file.h"
#include "io/checkpoint.h"
#include "io/fs.h"
#include "io/sampler.h"
#include "io/synth.h"
#include "kernels/kernels.h"
#include "layers/context.h"
#include "layers/experts.h"
#include "layers/fp8_linear.h"
#include "layers/pp_stages.h"
#include "layers/tp_regions.h"
#include "model/family.h"
#include "optim/batch_rampup.h"
#include "parallel/schedule.h"
#include "parallel/stack.h"
#include "plan/search.h"
#include "tokenizer/tokenizer.h"

struct run {
    struct loom_config *cfg;
    struct loom_engine *engine;
    const struct loom_topology *topo; /* the engine's */
    struct loom_run_data data;        /* what it reads: shards, the built-in corpus or Megatron's streams */
    const struct loom_model_family *family;
    struct loom_model *model;        /* the family's; the engine's under training */
    int nbatches;                    /* the micro-batches the schedule keeps in flight */
    int32_t *inputs, *targets;       /* (nbatches, B, T) */
    struct loom_lm_batch *batches;   /* (nbatches) pointing at them */
    struct loom_placement placement; /* --offload auto's */
    struct loom_layout_auto layout;  /* --layout auto's */
};

/* A shard that changed under the run (loom_data_batch's error): this rank
 * alone may read the rows that show it, so it ends the job at once (exit 1)
 * rather than leave the others waiting in a collective; no checkpoint is
 * being written at a batch's read, so none is damaged. */
static void data_failed(void)
{
    loom_die("%s", loom_error_message());
}

/* Mean loss over eval_iters batches of the global batch size, split across
 * ranks and micro-batches as in training, so every layout sees the same rows. */
static double evaluate(struct run *r, const struct loom_data *data)
{
    const struct loom_config *cfg = r->cfg;
    int B = cfg->micro_batch_size, T = cfg->seq_length, A = cfg->gradient_accumulation_steps;
    double sum = 0;
    for (int i = 0; i < cfg->eval_iters; i++)
        for (int a = 0; a < A; a++) {
            if (loom_data_eval_batch(data, i, cfg->global_batch_size,
                                     loom_engine_micro_batch_rows(r->engine, a), B, T, r->inputs, r->targets))
                data_failed();
            r->batches[0] = (struct loom_lm_batch){r->inputs, r->targets};
            /* loom eval's model is not the engine's: it runs in one process */
            sum += r->topo->pp > 1 ? loom_engine_eval(r->engine, &r->batches[0], B, i * A + a)
                                   : loom_model_eval(r->model, &r->batches[0], B);
        }
    loom_comm_allreduce_sync(LOOM_GROUP_DP, loom_buf_of(&sum, 1, LOOM_DTYPE_F64), LOOM_OP_SUM);
    /* the last stage has the loss */
    if (r->topo->pp > 1)
        loom_comm_allreduce_sync(LOOM_GROUP_PP, loom_buf_of(&sum, 1, LOOM_DTYPE_F64), LOOM_OP_SUM);
    loom_tp_comm_take_s(); /* the evaluation's tensor-, context- and expert-parallel waits are no step's */
    loom_cp_comm_take_s();
    loom_ep_comm_take_s();
    return cfg->eval_iters ? sum / ((double)cfg->eval_iters * A * r->topo->dp) : 0;
}

static int agree(struct run *r, int rc)
{
    return loom_engine_agree(r->engine, rc);
}

/* --save must be usable before the first step, not after hours of training. */
static int check_save_dir(const char *save)
{
    int rc = loom_ckpt_lock(save);
    if (rc == LOOM_OK && access(save, W_OK) != 0)
        rc = loom_error_set(LOOM_ERR_INPUT, "--save %s: not writable: %s", save, strerror(errno));
    if (rc == LOOM_OK) rc = loom_ckpt_check_save(save); /* nothing there a save would fail on */
    return rc;
}

/* A save directory holding a checkpoint past this run's start is another
 * run's, or this run resumes from an earlier point of it (a branch): said
 * once, as this run's saves take the names of the same iterations (the old
 * ones kept aside), latest moves to them, and --keep-last leaves the newer
 * ones alone. Rank 0 looks. */
static void check_save_newer(const struct loom_config *cfg, const struct loom_engine *e)
{
    if (loom_comm_world_rank() != 0) return;
    const int64_t newest = loom_ckpt_newest(cfg->save), start = loom_engine_steps_done(e);
    char parent[sizeof cfg->load];
    loom_fs_dirname(cfg->load, parent, sizeof parent);
    const int continues =
        !cfg->finetune && *cfg->load && (strcmp(cfg->load, cfg->save) == 0 || strcmp(parent, cfg->save) == 0);
    if (newest <= start) return;
    if (continues)
        loom_log_warn(
            "--load %s resumes at step %lld, before iter_%07lld in --save: the checkpoints it saves "
            "take those iterations' names; one of another run (or of this run before a rewind) is kept "
            "aside as iter_N.run-ID",
            cfg->load, (long long)start, (long long)newest);
    else
        loom_log_warn(
            "--save %s holds iter_%07lld, past this run's start (step %lld): another run's "
            "checkpoints; this run's take the names of the iterations it saves (the others kept "
            "aside as iter_N.run-ID), latest will name them, --keep-last leaves the newer ones alone",
            cfg->save, (long long)newest, (long long)start);
}

/* --dry-run under pipeline parallelism: which layers each stage holds, on
 * which ranks. */
static void print_stage_map(const struct loom_config *cfg, const struct loom_topology *t)
{
    if (t->pp == 1) return;
    const int chunks = loom_pp_chunks(cfg), per = t->tp * t->dp;
    printf("pipeline: %d stages, schedule %s, %d micro-batches per step%s\n", t->pp,
           loom_schedule_name(cfg->pipeline_schedule, t->pp), cfg->gradient_accumulation_steps,
           chunks > 1 ? ", model chunks per stage (virtual stages)" : "");
    for (int s = 0; s < t->pp; s++) {
        char line[1024];
        int n = snprintf(line, sizeof line, "  stage %d (ranks %d-%d):%s", s, s * per, (s + 1) * per - 1,
                         s == 0 ? " embedding," : "");
        for (int c = 0; c < chunks && n < (int)sizeof line; c++) {
            int lo, hi;
            loom_pp_layers(cfg, s, c, &lo, &hi);
            n += snprintf(line + n, sizeof line - (size_t)n, "%s layers %d-%d", c ? ";" : "", lo, hi);
        }
        printf("%s%s\n", line, s == t->pp - 1 ? ", final norm, LM head and loss" : "");
    }
}

/* --dry-run: the memory each pipeline stage's ranks will hold at a step's
 * peak, counted by the trainer's own set-up code (engine/footprint.h). */
static int print_footprint(struct loom_config *cfg, const struct loom_topology *t)
{
    printf("memory per rank at a step's peak (counted by the set-up code, as --metrics reports it):\n");
    for (int s = 0; s < t->pp; s++) {
        struct loom_topology at = *t;
        at.pp_rank = s;
        at.tp_rank = 0;
        at.dp_rank = 0;
        struct loom_footprint fp;
        int rc = loom_engine_footprint(cfg, &at, &fp);
        if (rc) return rc;
        if (t->pp > 1) printf("  stage %d:\n", s);
        char b[32];
        for (int i = 0; i <= LOOM_MEM_COUNT; i++)
            printf("%s%-12s %10s\n", t->pp > 1 ? "    " : "  ",
                   i < LOOM_MEM_COUNT ? loom_mem_tag_name((enum loom_mem_tag)i) : "total",
                   loom_fmt_bytes(b, sizeof b, (double)(i < LOOM_MEM_COUNT ? fp.peak[i] : fp.total)));
    }
    return LOOM_OK;
}

/* An allocation that fails while training explains itself: this rank's
 * memory at the moment, what the layout needs by the footprint's count, and
 * the fastest layout `loom plan` finds within what this rank held. */
static struct {
    struct loom_config *cfg;
    struct loom_topology topo;
} failing;

static void explain_alloc_failure(size_t bytes, enum loom_mem_tag tag)
{
    struct loom_mem_stats now;
    loom_mem_get_stats(&now);
    char b[32];
    fprintf(stderr, "loom: note: rank %d held", failing.topo.rank);
    for (int i = 0; i < LOOM_MEM_COUNT; i++) {
        loom_fmt_bytes(b, sizeof b, (double)now.current[i]);
        fprintf(stderr, " %s %s,", loom_mem_tag_name((enum loom_mem_tag)i), b);
    }
    loom_fmt_bytes(b, sizeof b, (double)now.current_total);
    fprintf(stderr, " total %s, and asked for %zu bytes more (%s)\n", b, bytes, loom_mem_tag_name(tag));
    struct loom_footprint fp;
    if (loom_engine_footprint(failing.cfg, &failing.topo, &fp) == LOOM_OK) {
        loom_fmt_bytes(b, sizeof b, (double)fp.total);
        fprintf(stderr, "loom: note: this layout needs %s a rank at a step's peak:", b);
        for (int i = 0; i < LOOM_MEM_COUNT; i++) {
            loom_fmt_bytes(b, sizeof b, (double)fp.peak[i]);
            fprintf(stderr, " %s %s%s", loom_mem_tag_name((enum loom_mem_tag)i), b,
                    i < LOOM_MEM_COUNT - 1 ? "," : "\n");
        }
    }
    struct loom_cluster c = {.ranks_per_node = 1 << 20,
                             .peak_f32 = 1e11,
                             .peak_bf16 = 1e11,
                             .matmul_efficiency = 1,
                             .mem_bytes = 1e18,
                             .mem_bw = 1e10,
                             .intra_bw = 1e9,
                             .intra_latency = 1e-5,
                             .inter_bw = 1e9,
                             .inter_latency = 1e-5};
    snprintf(c.name, sizeof c.name, "this machine");
    struct loom_plan p; /* the model, batch and precision as given; the layout searched */
    const double limit = (double)now.current_total;
    loom_fmt_bytes(b, sizeof b, limit);
    if (loom_plan_search(failing.cfg, failing.topo.world, &c, limit, &(struct loom_plan_options){0}, &p) ==
            LOOM_OK &&
        p.nfit > 0) {
        char flags[512];
        loom_layout_flags(&p.entries[0].layout, flags, sizeof flags);
        fprintf(stderr, "loom: note: loom plan: within %s a rank, run with %s\n", b, flags);
    } else { /* the leanest there is */
        const struct loom_plan_entry *lean = NULL;
        for (int i = 0; i < p.n; i++)
            if (p.entries[i].mem.total > 0 && (!lean || p.entries[i].mem.total < lean->mem.total))
                lean = &p.entries[i];
        fprintf(stderr, "loom: note: loom plan: no layout of %d ranks fits in the %s this rank held",
                failing.topo.world, b);
        if (lean) {
            char flags[512], need[32];
            loom_layout_flags(&lean->layout, flags, sizeof flags);
            loom_fmt_bytes(need, sizeof need, (double)lean->mem.total);
            fprintf(stderr, "; the leanest needs %s: %s", need, flags);
        }
        fprintf(stderr, "\n");
    }
    loom_plan_free(&p);
}

/* The engine, the data and the model. Training hands the model to the
 * engine (which allocates, initialises or resumes it); eval loads weights
 * only. */
/* --tokenizer: it loads, and its ids fit the model's vocabulary. */
/* Megatron's vocabulary when --vocab-size is not given: the tokenizer's,
 * padded to --make-vocab-size-divisible-by x TP. First in the set-up: the
 * planner, the placement and --dry-run count the model with it. A
 * tokenizer that does not load is check_tokenizer's to report. */
static void derive_vocab(struct loom_config *cfg)
{
    const enum loom_origin o = loom_config_origin(cfg, "--vocab-size");
    /* the settings are not resolved yet: Megatron's tokenizer flags name it as resolve.c will */
    const char *path = *cfg->tokenizer         ? cfg->tokenizer
                       : *cfg->tokenizer_model ? cfg->tokenizer_model
                                               : cfg->vocab_file;
    const char *merges = *cfg->tokenizer_model && !*cfg->tokenizer ? NULL : cfg->merge_file;
    struct loom_tokenizer *t;
    if (!*path || (o != LOOM_ORIGIN_DEFAULT && o != LOOM_ORIGIN_PRESET)) return;
    if (loom_tokenizer_load(path, merges, &t) != LOOM_OK) {
        loom_error_clear();
        return;
    }
    const int64_t n = loom_tokenizer_vocab_size(t),
                  multiple = (int64_t)cfg->make_vocab_size_divisible_by * cfg->tensor_model_parallel_size;
    loom_tokenizer_free(t);
    cfg->vocab_size = (int)((n + multiple - 1) / multiple * multiple);
    loom_config_set_derived(cfg, offsetof(struct loom_config, vocab_size));
}

static int check_tokenizer(const struct loom_config *cfg)
{
    struct loom_tokenizer *t;
    int rc = loom_tokenizer_load(cfg->tokenizer, cfg->merge_file, &t);
    if (rc) {
        char why[600];
        snprintf(why, sizeof why, "%s", loom_error_message());
        return loom_error_set(LOOM_ERR_INPUT, "--tokenizer: %s", why);
    }
    const int32_t n = loom_tokenizer_vocab_size(t);
    loom_tokenizer_free(t);
    if (n > cfg->vocab_size)
        return loom_error_set(LOOM_ERR_INPUT,
                              "--tokenizer %s has %d token ids, more than the model's vocabulary of %d "
                              "(--vocab-size): the model could not represent ids %d and up",
                              cfg->tokenizer, n, cfg->vocab_size, cfg->vocab_size);
    return LOOM_OK;
}

/* --offload auto, after the first step: the measured peak against the
 * prediction and the budget (the highest rank's). */
static void check_placement(const struct run *r)
{
    double peak = loom_peak_rss();
    loom_comm_allreduce_sync(LOOM_GROUP_WORLD, loom_buf_of(&peak, 1, LOOM_DTYPE_F64), LOOM_OP_MAX);
    if (r->topo->rank != 0) return;
    char a[32], b[32], c[32];
    loom_fmt_bytes(a, sizeof a, peak);
    loom_fmt_bytes(b, sizeof b, r->placement.predicted);
    loom_fmt_bytes(c, sizeof c, r->placement.budget);
    if (peak <= r->placement.budget)
        printf("offload auto: peak RSS after the first step %s (predicted %s), within the budget %s\n", a, b,
               c);
    else
        loom_log_warn("offload auto: peak RSS after the first step %s (predicted %s) is over the budget %s",
                      a, b, c);
}

static int setup(struct run *r, struct loom_config *cfg, int training)
{
    memset(r, 0, sizeof *r);
    r->cfg = cfg;
    int rc;
    derive_vocab(cfg);
    cfg->evaluating = !training;
    /* --layout auto: the planner's fastest layout that fits, before the groups are built */
    if (training && cfg->layout_auto && (rc = loom_layout_auto_choose(cfg, &r->layout))) return rc;
    rc = loom_engine_init(&r->engine, cfg);
    if (r->engine) r->engine->app_reports = 1; /* the run's record is this file's (app/report.h) */
    r->topo = &r->engine->topo;
    if (rc) return rc;
    /* --offload auto: what goes to NVMe, from the budget and the layout's count */
    if (training && cfg->offload_auto && (rc = agree(r, loom_placement_choose(cfg, r->topo, &r->placement))))
        return rc;
    if (training && cfg->offload_auto) cfg->decided |= LOOM_DECIDED_OFFLOAD;
    if (cfg->dry_run) { /* --dry-run: the configuration resolved on every rank; open and build nothing */
        if (r->topo->rank == 0) {
            loom_config_print(stdout, cfg, 1);
            print_stage_map(cfg, r->topo);
            rc = print_footprint(cfg, r->topo);
        }
        return agree(r, rc);
    }
    r->family = loom_model_family_of_preset(cfg->model, NULL);
    rc = r->family
             ? r->family->check(cfg, cfg->seq_length)
             : loom_error_set(LOOM_ERR_INPUT, "--model %s: no model family has this preset", cfg->model);
    if (rc == LOOM_OK && *cfg->tokenizer) rc = check_tokenizer(cfg);
    if (rc == LOOM_OK) rc = loom_run_data_open(&r->data, cfg, training);
    if (rc == LOOM_OK && training && *cfg->save && r->topo->rank == 0) rc = check_save_dir(cfg->save);
    if ((rc = agree(r, rc))) return rc;
    r->model = r->family->create(cfg, cfg->micro_batch_size, cfg->seq_length, training, r->topo->tp_rank,
                                 r->topo->pp_rank);
    if (training) {
        failing.cfg = cfg;
        failing.topo = *r->topo;
        loom_mem_on_failure(explain_alloc_failure);
        rc = loom_engine_initialize(r->engine, r->model);
    } else {
        loom_model_alloc_arenas(r->model, 1, LOOM_MODEL_PARAM_ARENA);
        rc = agree(r, *cfg->load ? loom_checkpoint_load_weights(r->model, cfg->load)
                                 : loom_error_set(LOOM_ERR_INPUT, "loom eval needs --load"));
    }
    if (rc == LOOM_OK && training && *cfg->save) check_save_newer(cfg, r->engine);
    if (rc) return rc;
    r->nbatches = training ? loom_engine_batches_in_flight(r->engine) : 1;
    size_t n = (size_t)cfg->micro_batch_size * cfg->seq_length * (size_t)r->nbatches;
    r->inputs = loom_alloc(n * sizeof(int32_t), LOOM_MEM_OTHER);
    r->targets = loom_alloc(n * sizeof(int32_t), LOOM_MEM_OTHER);
    r->batches = loom_alloc(sizeof *r->batches * (size_t)r->nbatches, LOOM_MEM_OTHER);
    return LOOM_OK;
}

static void teardown(struct run *r)
{
    loom_engine_free(r->engine);
    if (r->model) r->family->destroy(r->model);
    loom_free(r->inputs);
    loom_free(r->targets);
    loom_free(r->batches);
    loom_run_data_close(&r->data);
}

static void print_memory(struct loom_report *rep)
{
    struct loom_mem_stats mem;
    loom_mem_get_stats(&mem);
    char line[512] = "", b[32];
    for (int i = 0; i < LOOM_MEM_COUNT; i++) {
        size_t l = strlen(line);
        snprintf(line + l, sizeof line - l, "%s %s, ", loom_mem_tag_name((enum loom_mem_tag)i),
                 loom_fmt_bytes(b, sizeof b, (double)mem.peak[i]));
    }
    loom_report_line(rep, "  peak memory: %stotal %s\n", line,
                     loom_fmt_bytes(b, sizeof b, (double)mem.peak_total));
}

/* Peak memory of every rank, gathered for rank 0's metrics: (world, COUNT+1). */
static int64_t *gather_memory(const struct run *r, const struct loom_mem_stats *mem)
{
    if (r->topo->world == 1) return NULL;
    const size_t k = LOOM_MEM_COUNT + 1;
    uint64_t mine[LOOM_MEM_COUNT + 1];
    for (int i = 0; i < LOOM_MEM_COUNT; i++) mine[i] = (uint64_t)mem->peak[i];
    mine[LOOM_MEM_COUNT] = (uint64_t)mem->peak_total;
    int64_t *all = loom_alloc(sizeof(int64_t) * k * (size_t)r->topo->world, LOOM_MEM_OTHER);
    loom_comm_wait(loom_comm_allgather(LOOM_GROUP_WORLD, loom_buf_of(mine, k, LOOM_DTYPE_U64),
                                       loom_buf_of(all, k * (size_t)r->topo->world, LOOM_DTYPE_U64)));
    return all;
}

/* Each pipeline stage's schedule times (ms) and peak activation bytes, as
 * its first rank saw them: (pp, 4) for rank 0's metrics, or NULL. */
/* A mixture of experts' statistics summed over the ranks (model/family.h's
 * moe_stats, n values, E experts) as the step line reports them
 * (report.h's moe). */
static void moe_summarise(const double *v, int n, int E, double *out)
{
    out[0] = v[2] > 0 ? v[0] / v[2] : 0;
    out[1] = v[2] > 0 ? v[1] / v[2] : 0;
    out[2] = v[4] > 0 ? v[3] / v[4] : 0;
    double lo = 0, hi = 0, cv = 0;
    int layers = 0;
    const int nmoe = E > 0 ? (n - LOOM_MOE_STATS) / (E + 3) : 0;
    for (int i = 0; i < nmoe; i++) {
        const double *t = v + LOOM_MOE_STATS + (size_t)i * E;
        double sum = 0, sq = 0, mn = t[0], mx = t[0];
        for (int e = 0; e < E; e++) sum += t[e], mn = t[e] < mn ? t[e] : mn, mx = t[e] > mx ? t[e] : mx;
        if (sum <= 0) continue; /* a layer this step did not run */
        const double mean = sum / E;
        for (int e = 0; e < E; e++) sq += (t[e] - mean) * (t[e] - mean);
        lo = layers && lo < mn / mean ? lo : mn / mean;
        hi = layers && hi > mx / mean ? hi : mx / mean;
        cv += sqrt(sq / E) / mean;
        layers++;
    }
    out[3] = lo, out[4] = hi, out[5] = layers ? cv / layers : 0;
}

/* --moe-per-layer-logging: each MoE layer's (its index among all layers,
 * balancing loss, z-loss, tokens per expert's coefficient of variation)
 * from the same statistics, into out (nmoe x 4); the layers that ran. */
static int moe_per_layer(const double *v, int n, int E, const char *freq, int num_layers, double *out)
{
    struct loom_moe_layers ml; /* the i-th MoE layer's index among all layers */
    if (loom_moe_layers_parse(freq, &ml)) ml = (struct loom_moe_layers){.freq = 1};
    int layer = -1;
    const int nmoe = E > 0 ? (n - LOOM_MOE_STATS) / (E + 3) : 0;
    int k = 0;
    for (int i = 0; i < nmoe; i++) {
        const double *t = v + LOOM_MOE_STATS + (size_t)i * E,
                     *sums = v + LOOM_MOE_STATS + (size_t)nmoe * E + 3 * i;
        double sum = 0, sq = 0;
        for (int e = 0; e < E; e++) sum += t[e];
        while (++layer < num_layers && !loom_moe_layers_is(&ml, layer)) continue;
        if (sums[2] <= 0 || sum <= 0) continue; /* on another stage, or not run */
        const double mean = sum / E;
        for (int e = 0; e < E; e++) sq += (t[e] - mean) * (t[e] - mean);
        double *o = out + 4 * (size_t)k++;
        o[0] = layer, o[1] = sums[0] / sums[2], o[2] = sums[1] / sums[2], o[3] = sqrt(sq / E) / mean;
    }
    return k;
}

static double *gather_pipeline(const struct run *r, const int64_t *mem_by_rank)
{
    const struct loom_topology *t = r->topo;
    if (t->pp == 1) return NULL;
    double mine[3], *all = loom_alloc(sizeof(double) * 3 * (size_t)t->world, LOOM_MEM_OTHER);
    loom_engine_schedule_times(r->engine, &mine[0], &mine[1], &mine[2]);
    loom_comm_wait(loom_comm_allgather(LOOM_GROUP_WORLD, loom_buf_of(mine, 3, LOOM_DTYPE_F64),
                                       loom_buf_of(all, 3 * (size_t)t->world, LOOM_DTYPE_F64)));
    double *out = loom_alloc(sizeof(double) * 4 * (size_t)t->pp, LOOM_MEM_OTHER);
    for (int s = 0; s < t->pp; s++) {
        const int rank = s * t->tp * t->dp; /* rank order: tp fastest, then dp, then pp */
        for (int i = 0; i < 3; i++) out[4 * s + i] = all[3 * rank + i] * 1e3;
        out[4 * s + 3] = (double)mem_by_rank[(size_t)rank * (LOOM_MEM_COUNT + 1) + LOOM_MEM_ACTIVATIONS];
    }
    loom_free(all);
    return out;
}

/* Peak resident set of every rank (the process as the OS sees it). */
static void print_rss(const struct run *r, struct loom_report *rep)
{
    struct rusage ru;
    getrusage(RUSAGE_SELF, &ru);
    uint64_t mine = (uint64_t)ru.ru_maxrss * 1024;
    uint64_t *all = loom_alloc(sizeof(uint64_t) * (size_t)r->topo->world, LOOM_MEM_OTHER);
    loom_comm_wait(loom_comm_allgather(LOOM_GROUP_WORLD, loom_buf_of(&mine, 1, LOOM_DTYPE_U64),
                                       loom_buf_of(all, (size_t)r->topo->world, LOOM_DTYPE_U64)));
    char line[1024] = "", b[32];
    for (int k = 0; k < r->topo->world && strlen(line) < sizeof line - 40; k++) {
        size_t l = strlen(line);
        snprintf(line + l, sizeof line - l, "%s%s", k ? ", " : "",
                 loom_fmt_bytes(b, sizeof b, (double)all[k]));
    }
    loom_report_line(rep, "  peak RSS by rank: %s\n", line);
    loom_free(all);
}

/* Collective: --layout auto's prediction against the run: the largest
 * rank's accounting peak and the median step. */
static void report_auto_layout(const struct run *r, struct loom_report *rep, double median_tps)
{
    struct loom_mem_stats mem;
    loom_mem_get_stats(&mem);
    /* the categories the planner counts: all but the bookkeeping (other) */
    double peak = 0;
    for (int i = 0; i < LOOM_MEM_COUNT; i++)
        if (i != LOOM_MEM_OTHER) peak += (double)mem.peak[i];
    loom_comm_allreduce_sync(LOOM_GROUP_WORLD, loom_buf_of(&peak, 1, LOOM_DTYPE_F64), LOOM_OP_MAX);
    const double step =
        median_tps > 0 ? (double)r->cfg->global_batch_size * r->cfg->seq_length / median_tps : 0;
    const struct loom_layout_auto *a = &r->layout;
    char p[32], m[32];
    loom_report_line(
        rep,
        "  layout auto: predicted %s a rank and %.3f s a step; measured %s (loom's accounting of the last "
        "step, every category but other, the largest rank: %+.1f%%) and %.3f s a step (median: "
        "%+.0f%%)\n",
        loom_fmt_bytes(p, sizeof p, a->predicted_mem), a->predicted_step, loom_fmt_bytes(m, sizeof m, peak),
        100 * (peak / a->predicted_mem - 1), step, step > 0 ? 100 * (step / a->predicted_step - 1) : 0.0);
}

/* Collective: a checkpoint after the steps done, reported by rank 0. */
static int save(struct run *r, struct loom_report *rep)
{
    int rc = loom_engine_save(r->engine);
    const struct loom_ckpt_io_stats *io = &r->engine->save_io;
    char b[32];
    if (rc == LOOM_OK)
        loom_report_line(rep, "saved checkpoint %s: rank 0 wrote %s in %.2f s (%.0f MB/s)\n", io->dir,
                         loom_fmt_bytes(b, sizeof b, (double)io->bytes), io->seconds,
                         io->bytes / 1e6 / (io->seconds + 1e-9));
    return rc;
}

/* One strategy of the stack, indented under the layout line. */
static void report_strategy(void *ctx, const char *text)
{
    loom_report_line(ctx, "  %s\n", text);
}

/* The strategy and layout, once, before the first step. */
static void report_layout(const struct run *r, struct loom_report *rep, double peak, const char *peak_src)
{
    const struct loom_engine *e = r->engine;
    const struct loom_model *m = r->model;
    const size_t n = m->num_params;
    char b[32], topo[96], shape[256], part[96] = "";
    loom_topology_format(r->topo, topo, sizeof topo);
    r->family->describe(m, shape, sizeof shape);
    if (r->topo->cp > 1)
        snprintf(rep->layout, sizeof rep->layout, "TP(%d)-CP(%d)-DP(%d)-PP(%d)%s", r->topo->tp, r->topo->cp,
                 r->topo->dp / r->topo->cp, r->topo->pp, r->cfg->sequence_parallel ? "+SP" : "");
    else if (r->topo->ep > 1)
        snprintf(rep->layout, sizeof rep->layout, "TP(%d)-EP(%d)-DP(%d)-PP(%d)%s", r->topo->tp, r->topo->ep,
                 r->topo->dp, r->topo->pp, r->cfg->sequence_parallel ? "+SP" : "");
    else
        snprintf(rep->layout, sizeof rep->layout, "TP(%d)-DP(%d)-PP(%d)%s", r->topo->tp, r->topo->dp,
                 r->topo->pp, r->cfg->sequence_parallel ? "+SP" : "");
    if (m->tp > 1)
        snprintf(part, sizeof part, " of %.0f, this tensor-parallel rank's part", loom_model_full_params(m));
    if (r->topo->ep > 1) { /* every expert-parallel rank holds as many experts */
        double whole = loom_model_full_params(m);
        for (int i = 0; i < m->nblocks; i++)
            whole += (double)(m->blocks[i].expert_hi - m->blocks[i].expert_lo) * (r->topo->ep - 1);
        snprintf(part, sizeof part, " of %.0f, this expert-parallel rank's experts", whole);
    }
    loom_report_line(rep, "model: %s, %s: %zu parameters%s (%s)\n", r->family->title, shape, n, part,
                     loom_fmt_bytes(b, sizeof b, 4.0 * n));
    loom_report_line(
        rep, "ranks: %d (%s%s), threads per rank: %d, BLAS: OpenBLAS core %s, peak %.1f GFLOP/s (%s)\n",
        r->topo->world, topo, r->cfg->sequence_parallel ? ", sequence parallel" : "", loom_threads_get(),
        loom_blas_core_name(), peak / 1e9, peak_src);
    if (r->cfg->bf16) /* the units the matrix products run on */
        loom_report_line(rep, "bf16: %s (%s)\n", loom_bf16_units_name(loom_bf16_units()),
                         loom_bf16_units_kernel());
    else if (r->cfg->fp16)
        loom_report_line(rep, "fp16: f32 (OpenBLAS sgemm on the fp16 values)\n");
    if (m->fp8) {
        const struct loom_fp8_recipe *f = &m->fp8->recipe;
        loom_report_line(
            rep,
            "fp8: %s (%s forward, %s gradients) in %d linear layers, delayed scaling: amax history "
            "%d, %s, margin %d; the products on the bf16 units (every fp8 value is a bf16 value)\n",
            r->cfg->fp8_format == LOOM_FP8_MODE_HYBRID ? "hybrid" : "e4m3", loom_fp8_format_name(f->fwd),
            loom_fp8_format_name(f->bwd), m->fp8->n, f->history_len,
            f->algo == LOOM_FP8_AMAX_MAX ? "max" : "most_recent", f->margin);
    }
    char stack[128];
    loom_stack_format(r->engine->model, stack, sizeof stack);
    loom_report_line(rep, "strategies: %s; schedule: %s; optimizer state for %zu of %zu parameters\n", stack,
                     loom_schedule_name(r->cfg->pipeline_schedule, r->topo->pp), e->opt.n, n);
    loom_stack_describe(r->engine->model, report_strategy, rep);
    if (e->resumed) {
        const struct loom_ckpt_io_stats *io = &e->load_io;
        loom_report_line(rep, "resumed at step %lld from %s: rank 0 read %s in %.2f s (%.0f MB/s)\n",
                         (long long)e->steps + 1, io->dir, loom_fmt_bytes(b, sizeof b, (double)io->bytes),
                         io->seconds, io->bytes / 1e6 / (io->seconds + 1e-9));
    }
}

/* The engine's batch source: this rank's rows of the global batch of the step. */
static int next_batch(void *ctx, struct loom_engine *e, int micro, const void **batch, int *rows)
{
    struct run *r = ctx;
    const struct loom_config *cfg = r->cfg;
    /* the micro-batches in flight are consecutive: micro % nbatches is free */
    const int k = micro % r->nbatches;
    const size_t n = (size_t)cfg->micro_batch_size * cfg->seq_length;
    loom_trace_push("data");
    int32_t *inputs = r->inputs + (size_t)k * n, *targets = r->targets + (size_t)k * n;
    if (loom_data_batch_from(&r->data.train, (enum loom_data_order)cfg->data_order, (uint64_t)cfg->seed,
                             loom_engine_steps_done(e), loom_engine_first_sample(e),
                             loom_engine_step_batch(e), loom_engine_micro_batch_rows(e, micro),
                             cfg->micro_batch_size, cfg->seq_length, inputs, targets))
        data_failed();
    r->batches[k] = (struct loom_lm_batch){inputs, targets};
    *batch = &r->batches[k];
    loom_trace_pop("data");
    *rows = cfg->micro_batch_size;
    return LOOM_OK;
}

/* Why the run stops early, agreed by every rank at a step boundary: the
 * largest reason any rank has (one rank's SIGTERM stops them all; rank 0's
 * failed write of --metrics or --tensorboard-dir outranks every signal). */
enum {
    STOP_NONE,
    STOP_INTERVAL,
    STOP_DURATION,
    STOP_LAUNCH,
    STOP_SIGUSR2,
    STOP_SIGINT,
    STOP_SIGTERM,
    STOP_WRITER
};
static const char *const stop_names[] = {
    "",       "--exit-interval", "--exit-duration-in-mins", "SIGURG (loom launch's stop)", "SIGUSR2",
    "SIGINT", "SIGTERM"};

static int stop_reason(const struct loom_config *cfg, int step, double t_train, int write_failed)
{
    const int sig = loom_stop_signal();
    int32_t why = write_failed     ? STOP_WRITER
                  : sig == SIGTERM ? STOP_SIGTERM
                  : sig == SIGINT  ? STOP_SIGINT
                  : sig == SIGUSR2 ? STOP_SIGUSR2
                  : sig == SIGURG  ? STOP_LAUNCH
                  : cfg->exit_duration_in_mins > 0 && loom_now() - t_train >= cfg->exit_duration_in_mins * 60
                      ? STOP_DURATION
                  : cfg->exit_interval > 0 && step % cfg->exit_interval == 0 ? STOP_INTERVAL
                                                                             : STOP_NONE;
    loom_comm_allreduce_sync(LOOM_GROUP_WORLD, loom_buf_of(&why, 1, LOOM_DTYPE_I32), LOOM_OP_MAX);
    return why;
}

/* The run stopped on a failed write (STOP_WRITER), after its save: rank 0's
 * one line names the file, the cause and what was saved; every rank
 * returns the failure (exit 1). */
static int write_stopped(struct run *r, const struct loom_report *rep)
{
    int rc = loom_report_status(rep);
    if (rc) {
        char why[1024];
        snprintf(why, sizeof why, "%s", loom_error_message());
        const char *dir = r->engine->save_io.dir, *slash = strrchr(dir, '/');
        if (*r->cfg->save)
            loom_error_set(LOOM_ERR_RUNTIME, "%s; saved %s, stopping", why, slash ? slash + 1 : dir);
        else
            loom_error_set(LOOM_ERR_RUNTIME, "%s; no --save: nothing saved, stopping", why);
    }
    return agree(r, rc);
}

int loom_train(struct loom_config *cfg)
{
    struct run r;
    int rc = setup(&r, cfg, 1);
    if (rc || cfg->dry_run) {
        teardown(&r);
        return rc;
    }
    struct loom_report rep;
    if ((rc = agree(&r, loom_report_open(&rep, cfg->metrics, cfg->tensorboard_dir))) ||
        (rc = loom_trace_file_begin(cfg, r.topo, loom_engine_steps_done(r.engine)))) {
        loom_report_close(&rep);
        teardown(&r);
        return rc;
    }
    rep.tb_interval = cfg->tensorboard_log_interval; /* after the open, which clears rep */
    rep.tb_timers = cfg->log_timers_to_tensorboard;
    loom_report_config(&rep, cfg);
    /* the first rows' writes (the config row, the event file's header): a
     * full disk stops the run before it trains */
    if ((rc = agree(&r, loom_report_status(&rep)))) {
        loom_report_close(&rep);
        teardown(&r);
        return rc;
    }
    struct loom_engine *e = r.engine;
    /* peak FLOP/s of the whole job: the sum over ranks */
    double peak = cfg->peak_tflops * 1e12;
    char peak_src[4400] = "given by --peak-tflops";
    if (peak <= 0) /* this machine's, kept across start-ups: a shared machine's load does not swing it */
        peak =
            loom_machine_peak_flops(cfg->bf16 ? LOOM_DTYPE_BF16 : LOOM_DTYPE_F32, peak_src, sizeof peak_src);
    loom_comm_allreduce_sync(LOOM_GROUP_WORLD, loom_buf_of(&peak, 1, LOOM_DTYPE_F64), LOOM_OP_SUM);
    if (loom_log_rank() == 0) loom_config_print(stdout, cfg, cfg->print_config);
    report_layout(&r, &rep, peak, peak_src);

    const int T = cfg->seq_length;
    const double flops_per_token = r.family->flops_per_token(r.model);
    double *step_tps = loom_alloc(sizeof(double) * (size_t)cfg->train_iters, LOOM_MEM_OTHER);
    double t_train = loom_now(), last_loss = 0, last_val = -1;
    const int64_t done = loom_engine_steps_done(e);
    if (done >= cfg->train_iters)
        loom_report_line(&rep, "the checkpoint has taken %lld steps, --train-iters is %d: nothing to train\n",
                         (long long)done, cfg->train_iters);
    int ran = 0; /* steps completed in this run */
    const int nmoe = r.family->moe_stats ? r.family->moe_stats(r.model, NULL) : 0;
    double *moe = nmoe ? loom_alloc(sizeof(double) * (size_t)nmoe, LOOM_MEM_OTHER) : NULL;
    double *moe_layers = /* --moe-per-layer-logging's (layer, 4) */
        nmoe && cfg->moe_per_layer_logging ? loom_alloc(sizeof(double) * 4 * (size_t)nmoe, LOOM_MEM_OTHER)
                                           : NULL;
    int stop = STOP_NONE;
    while (loom_engine_steps_done(e) < cfg->train_iters && rc == LOOM_OK) {
        const int step = (int)loom_engine_steps_done(e) + 1;
        char point[32];
        snprintf(point, sizeof point, "step %d", step);
        loom_test_point(point); /* LOOM_TEST_STALL (base/testpoint.h) */
        loom_mem_reset_peak();
        loom_trace_step_begin(step);
        double t0 = loom_now();
        struct loom_step_result res;
        if (moe) r.family->moe_stats(r.model, moe); /* an evaluation's: not the step's */
        if ((rc = loom_engine_train_batch(e, next_batch, &r, &res))) break;
        if (moe) r.family->moe_stats(r.model, moe);
        double dt = loom_now() - t0;
        loom_trace_step_end(step, t0, t0 + dt);
        double tps = (double)res.global_batch * T / dt;
        step_tps[ran++] = tps;
        if (ran == 1 && cfg->offload_auto) check_placement(&r);
        last_loss = res.loss;
        const int log = step % cfg->log_interval == 0 || step == cfg->train_iters || res.skipped;
        const int tb_only =
            !log && cfg->tensorboard_log_interval && step % cfg->tensorboard_log_interval == 0;
        if (log || tb_only) { /* every rank: the gathers below are collective */
            struct loom_step_stats s = {step,
                                        cfg->train_iters,
                                        res.loss,
                                        res.lr,
                                        res.grad_norm,
                                        tps,
                                        tps * flops_per_token / peak,
                                        dt * 1e3,
                                        res.comm_wait_s >= 0 ? res.comm_wait_s * 1e3 : -1,
                                        res.loss_scale,
                                        res.skipped,
                                        res.skipped_total,
                                        r.topo->pp,
                                        NULL,
                                        NULL,
                                        0,
                                        NULL,
                                        loom_rampup_on(cfg) ? res.global_batch : 0};
            struct loom_mem_stats mem;
            loom_mem_get_stats(&mem);
            int64_t *by_rank = gather_memory(&r, &mem);
            double *pipeline = gather_pipeline(&r, by_rank);
            s.pipeline = pipeline;
            double moe_summary[LOOM_REPORT_MOE];
            if (moe && log) {
                loom_comm_allreduce_sync(LOOM_GROUP_WORLD, loom_buf_of(moe, (size_t)nmoe, LOOM_DTYPE_F64),
                                         LOOM_OP_SUM);
                s.moe = moe_summary;
                moe_summarise(moe, nmoe, cfg->num_experts, moe_summary);
                if (moe_layers)
                    s.moe_layers = moe_per_layer(moe, nmoe, cfg->num_experts, cfg->moe_layer_freq,
                                                 cfg->num_layers, moe_layers);
                s.moe_layer = moe_layers;
            }
            if (log)
                loom_report_step(&rep, &s, &mem, by_rank, r.topo->world);
            else
                loom_report_tb(&rep, &s, &mem);
            loom_free(by_rank);
            loom_free(pipeline);
        }
        if (r.data.have_valid && cfg->eval_iters > 0 &&
            (step % cfg->eval_interval == 0 || step == cfg->train_iters)) {
            last_val = evaluate(&r, &r.data.valid);
            loom_report_eval(&rep, step, last_val, r.data.floor_nats);
        }
        loom_report_progress(&rep, step, cfg->train_iters, res.loss);
        const int saving = *cfg->save && ((cfg->save_interval && step % cfg->save_interval == 0) ||
                                          step == cfg->train_iters);
        if (saving) rc = save(&r, &rep);
        /* a failed write (a full disk under --metrics or --tensorboard-dir)
         * stops the run as a signal does, saving first, but fails it */
        if (rc == LOOM_OK) stop = stop_reason(cfg, step, t_train, loom_report_status(&rep) != LOOM_OK);
        if (stop == STOP_WRITER) {
            if (*cfg->save && !saving) rc = save(&r, &rep);
            if (rc == LOOM_OK) rc = write_stopped(&r, &rep);
            break;
        }
        if (stop && step < cfg->train_iters) {
            if (*cfg->save && !saving) rc = save(&r, &rep);
            loom_report_line(&rep, "stopped after step %d of %d: %s%s\n", step, cfg->train_iters,
                             stop_names[stop], *cfg->save ? "" : " (no --save: nothing saved)");
            break;
        }
    }
    if (rc == LOOM_OK) rc = loom_trace_file_write(cfg, r.topo);
    /* Megatron's test split: scored once when training is complete */
    double test_loss = -1;
    if (rc == LOOM_OK && r.data.have_test && ran > 0 && loom_engine_steps_done(e) >= cfg->train_iters)
        test_loss = evaluate(&r, &r.data.test);
    double elapsed = loom_now() - t_train;
    double median_tps = ran ? loom_report_median(step_tps, ran) : 0;
    char dur[32];
    loom_report_line(&rep, "done: %d steps in %s\n", ran, loom_fmt_duration(dur, sizeof dur, elapsed));
    if (last_val >= 0 && r.data.floor_nats > 0)
        loom_report_line(
            &rep,
            "  final train loss %.4f | val loss %.4f | corpus floor %.4f nats/token (val - floor = %+.4f)\n",
            last_loss, last_val, r.data.floor_nats, last_val - r.data.floor_nats);
    else if (last_val >= 0)
        loom_report_line(&rep, "  final train loss %.4f | val loss %.4f\n", last_loss, last_val);
    else
        loom_report_line(&rep, "  final train loss %.4f\n", last_loss);
    if (test_loss >= 0)
        loom_report_line(&rep, "  test loss %.4f | test ppl %.2f over %d batches\n", test_loss,
                         exp(test_loss), cfg->eval_iters);
    char mfu[48];
    loom_mfu_text(mfu, sizeof mfu, median_tps * flops_per_token / peak);
    loom_report_line(&rep, "  median %.0f tokens/s | mfu %s of %.1f GFLOP/s peak (%s)\n", median_tps, mfu,
                     peak / 1e9, peak_src);
    print_memory(&rep);
    print_rss(&r, &rep);
    if (r.layout.on) report_auto_layout(&r, &rep, median_tps);
    loom_free(step_tps);
    loom_free(moe);
    loom_free(moe_layers);
    loom_report_close(&rep);
    if (rc == LOOM_OK) rc = loom_report_status(&rep); /* the last rows' write */
    teardown(&r);
    return rc;
}

int loom_eval(struct loom_config *cfg)
{
    struct run r;
    int rc = setup(&r, cfg, 0);
    if (cfg->dry_run) {
        teardown(&r);
        return rc;
    }
    if (rc == LOOM_OK && r.topo->world > 1) {
        rc = loom_error_set(LOOM_ERR_INPUT, "loom eval runs in one process (got %d ranks)", r.topo->world);
        if (r.topo->rank != 0) loom_error_clear(); /* rank 0 says it */
    }
    if (rc == LOOM_OK && !r.data.have_valid)
        rc = loom_error_set(LOOM_ERR_INPUT,
                            "loom eval needs --valid-data-path FILE (token shards to score), or "
                            "--mock-data to score the built-in corpus");
    struct loom_report rep = {0};
    if (rc == LOOM_OK && (rc = loom_report_open(&rep, cfg->metrics, NULL)) == LOOM_OK) {
        double val = evaluate(&r, &r.data.valid);
        if (r.data.floor_nats > 0)
            loom_log_info("val loss %.4f over %d batches (corpus floor %.4f)\n", val, cfg->eval_iters,
                          r.data.floor_nats);
        else
            loom_log_info("val loss %.4f over %d batches\n", val, cfg->eval_iters);
        loom_report_eval_row(&rep, 0, val); /* --metrics: the value in full */
        loom_report_close(&rep);
        rc = loom_report_status(&rep); /* a full disk: the row is not there */
    }
    teardown(&r);
    return rc;
}
