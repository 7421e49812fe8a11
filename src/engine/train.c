/*
 * The single-process training loop: data, model, optimizer, schedule,
 * evaluation, logging and the closing summary. Data-parallel strategies will
 * hook in around the blocks (grad-ready hook) and the step; this file stays
 * the one loop.
 */
#include "loom/train.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "base/log.h"
#include "base/mem.h"
#include "engine/config.h"
#include "engine/mfu.h"
#include "engine/report.h"
#include "io/sampler.h"
#include "io/synth.h"
#include "kernels/kernels.h"
#include "model/gpt2.h"
#include "model/gpt2_io.h"
#include "optim/adamw.h"
#include "optim/lr.h"

struct run {
    struct loom_config *cfg;
    struct loom_data train, valid;
    int have_valid;
    double floor_nats; /* entropy rate of the built-in corpus, 0 otherwise */
    struct loom_gpt2 *model;
    int32_t *inputs, *targets; /* (B,T) */
};

static int mkdir_p(const char *path)
{
    char buf[512];
    snprintf(buf, sizeof buf, "%s", path);
    for (char *p = buf + 1; *p; p++) {
        if (*p != '/') continue;
        *p = 0;
        if (mkdir(buf, 0755) && errno != EEXIST)
            return loom_error_set(LOOM_ERR_INPUT, "cannot create directory %s: %s", buf, strerror(errno));
        *p = '/';
    }
    if (mkdir(buf, 0755) && errno != EEXIST)
        return loom_error_set(LOOM_ERR_INPUT, "cannot create directory %s: %s", buf, strerror(errno));
    return LOOM_OK;
}

/* With no --data-path: the built-in corpus, generated into the cache once. */
static int builtin_corpus(struct run *r, char *train_path, char *valid_path, size_t n)
{
    struct loom_config *cfg = r->cfg;
    char dir[600];
    if (*cfg->data_cache) snprintf(dir, sizeof dir, "%s", cfg->data_cache);
    else if (getenv("XDG_CACHE_HOME")) snprintf(dir, sizeof dir, "%s/loom/synth", getenv("XDG_CACHE_HOME"));
    else snprintf(dir, sizeof dir, "%s/.cache/loom/synth", getenv("HOME") ? getenv("HOME") : ".");
    snprintf(train_path, n, "%s/train.bin", dir);
    snprintf(valid_path, n, "%s/val.bin", dir);
    int rc;
    struct stat st;
    if (stat(train_path, &st) == 0 && stat(valid_path, &st) == 0) {
        if ((rc = loom_synth_read_floor(dir, &r->floor_nats))) return rc;
        return LOOM_OK;
    }
    if ((rc = mkdir_p(dir))) return rc;
    loom_log_info("generating the built-in corpus in %s\n", dir);
    return loom_data_synth(dir, LOOM_SYNTH_DEFAULT_TOKENS, LOOM_SYNTH_DEFAULT_SEED, &r->floor_nats);
}

static int open_data(struct run *r)
{
    struct loom_config *cfg = r->cfg;
    int rc;
    if (cfg->ndata_paths == 0) {
        char train_path[700], valid_path[700];
        if ((rc = builtin_corpus(r, train_path, valid_path, sizeof train_path))) return rc;
        const char *tp = train_path, *vp = valid_path;
        if ((rc = loom_data_open(&r->train, &tp, 1, cfg->vocab_size))) return rc;
        if (cfg->nvalid_paths == 0) {
            if ((rc = loom_data_open(&r->valid, &vp, 1, cfg->vocab_size))) return rc;
            r->have_valid = 1;
        }
    } else if ((rc = loom_data_open(&r->train, (const char *const *)cfg->data_paths, cfg->ndata_paths,
                                    cfg->vocab_size))) {
        return rc;
    }
    if ((rc = loom_data_check(&r->train, (enum loom_data_order)cfg->data_order, cfg->global_batch_size,
                              cfg->seq_length)))
        return rc;
    if (cfg->nvalid_paths) {
        if ((rc = loom_data_open(&r->valid, (const char *const *)cfg->valid_data_paths, cfg->nvalid_paths,
                                 cfg->vocab_size)))
            return rc;
        r->have_valid = 1;
    }
    if (r->have_valid && cfg->eval_iters > 0 &&
        (rc = loom_data_check(&r->valid, LOOM_DATA_SHUFFLED, cfg->micro_batch_size, cfg->seq_length)))
        return rc;
    return LOOM_OK;
}

static double evaluate(struct run *r)
{
    const struct loom_config *cfg = r->cfg;
    int B = cfg->micro_batch_size, T = cfg->seq_length;
    double sum = 0;
    for (int i = 0; i < cfg->eval_iters; i++) {
        loom_data_eval_batch(&r->valid, i, B, 0, B, T, r->inputs, r->targets);
        sum += loom_gpt2_forward(r->model, r->inputs, r->targets, B);
    }
    return cfg->eval_iters ? sum / cfg->eval_iters : 0;
}

static int cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

static int setup(struct run *r, struct loom_config *cfg)
{
    memset(r, 0, sizeof *r);
    r->cfg = cfg;
    int rc;
    if (cfg->threads > 0) loom_threads_set(cfg->threads);
    struct loom_gpt2_config mc = {cfg->num_layers, cfg->hidden_size, cfg->num_attention_heads,
                                  cfg->max_position_embeddings, cfg->vocab_size};
    if ((rc = loom_gpt2_config_check(&mc, cfg->seq_length))) return rc;
    if ((rc = open_data(r))) return rc;
    r->model = loom_gpt2_create(&mc, cfg->micro_batch_size, cfg->seq_length);
    if (*cfg->load) {
        if ((rc = loom_gpt2_load(r->model, cfg->load))) return rc;
    } else {
        loom_gpt2_init_weights(r->model, (uint64_t)cfg->seed);
    }
    size_t n = (size_t)cfg->micro_batch_size * cfg->seq_length;
    r->inputs = loom_alloc(n * sizeof(int32_t), LOOM_MEM_OTHER);
    r->targets = loom_alloc(n * sizeof(int32_t), LOOM_MEM_OTHER);
    return LOOM_OK;
}

static void teardown(struct run *r)
{
    loom_gpt2_free(r->model);
    loom_free(r->inputs);
    loom_free(r->targets);
    loom_data_close(&r->train);
    if (r->have_valid) loom_data_close(&r->valid);
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
    loom_report_line(rep, "  peak memory: %stotal %s\n", line, loom_fmt_bytes(b, sizeof b, (double)mem.peak_total));
}

int loom_train(struct loom_config *cfg)
{
    struct run r;
    int rc = setup(&r, cfg);
    if (rc) {
        teardown(&r);
        return rc;
    }
    struct loom_report rep;
    if ((rc = loom_report_open(&rep, cfg->metrics))) {
        teardown(&r);
        return rc;
    }
    struct loom_gpt2 *m = r.model;
    struct loom_adamw opt;
    loom_adamw_init(&opt, m->blocks, m->nblocks, cfg->adam_beta1, cfg->adam_beta2, cfg->adam_eps, cfg->weight_decay);
    struct loom_lr_schedule sched = {cfg->lr, cfg->min_lr, cfg->lr_warmup_iters, cfg->lr_decay_iters, cfg->lr_decay_style};

    double peak = cfg->peak_tflops * 1e12;
    const char *peak_src = "given by --peak-tflops";
    if (peak <= 0) {
        peak = loom_calibrate_peak_flops();
        peak_src = "calibrated by sgemm at start-up";
    }
    if (loom_log_rank() == 0) loom_config_print(stdout, cfg);
    char b[32];
    loom_report_line(&rep, "model: GPT-2, %d layers, %d channels, %d heads, T=%d, V=%d: %zu parameters (%s)\n",
                     cfg->num_layers, cfg->hidden_size, cfg->num_attention_heads, cfg->seq_length,
                     cfg->vocab_size, m->num_params, loom_fmt_bytes(b, sizeof b, 4.0 * m->num_params));
    loom_report_line(&rep, "threads: %d, peak %.1f GFLOP/s (%s)\n", loom_threads_get(), peak / 1e9, peak_src);

    const int B = cfg->micro_batch_size, T = cfg->seq_length, A = cfg->gradient_accumulation_steps;
    const int G = cfg->global_batch_size;
    const double flops_per_token = loom_gpt2_flops_per_token(m);
    double *step_tps = loom_alloc(sizeof(double) * (size_t)cfg->train_iters, LOOM_MEM_OTHER);
    double t_train = loom_now(), last_loss = 0, last_val = -1;
    for (int step = 1; step <= cfg->train_iters; step++) {
        loom_mem_reset_peak();
        double t0 = loom_now();
        loom_gpt2_zero_grad(m);
        double loss = 0;
        for (int a = 0; a < A; a++) {
            loom_data_batch(&r.train, (enum loom_data_order)cfg->data_order, (uint64_t)cfg->seed, step - 1, G,
                            a * B, B, T, r.inputs, r.targets);
            loss += loom_gpt2_forward(m, r.inputs, r.targets, B);
            loom_gpt2_backward(m, 1.0f / (float)A);
        }
        loss /= A;
        double norm = loom_grad_norm(m->blocks, m->nblocks);
        double lr = loom_lr_at(&sched, step);
        loom_adamw_step(&opt, m->blocks, lr, loom_clip_coef(norm, cfg->clip_grad));
        double dt = loom_now() - t0;
        double tps = (double)G * T / dt;
        step_tps[step - 1] = tps;
        last_loss = loss;
        if (step % cfg->log_interval == 0 || step == cfg->train_iters) {
            struct loom_step_stats s = {step, cfg->train_iters, loss, lr, norm, tps,
                                        tps * flops_per_token / peak, dt * 1e3};
            struct loom_mem_stats mem;
            loom_mem_get_stats(&mem);
            loom_report_step(&rep, &s, &mem);
        }
        if (r.have_valid && cfg->eval_iters > 0 && (step % cfg->eval_interval == 0 || step == cfg->train_iters)) {
            last_val = evaluate(&r);
            loom_report_eval(&rep, step, last_val, r.floor_nats);
        }
        loom_report_progress(&rep, step, cfg->train_iters, loss);
    }
    double elapsed = loom_now() - t_train;
    qsort(step_tps, (size_t)cfg->train_iters, sizeof(double), cmp_double);
    double median_tps = step_tps[cfg->train_iters / 2];
    char dur[32];
    loom_report_line(&rep, "done: %d steps in %s\n", cfg->train_iters, loom_fmt_duration(dur, sizeof dur, elapsed));
    if (last_val >= 0 && r.floor_nats > 0)
        loom_report_line(&rep, "  final train loss %.4f | val loss %.4f | corpus floor %.4f nats/token (val - floor = %+.4f)\n",
                         last_loss, last_val, r.floor_nats, last_val - r.floor_nats);
    else if (last_val >= 0)
        loom_report_line(&rep, "  final train loss %.4f | val loss %.4f\n", last_loss, last_val);
    else
        loom_report_line(&rep, "  final train loss %.4f\n", last_loss);
    loom_report_line(&rep, "  median %.0f tokens/s | mfu %.1f%% of %.1f GFLOP/s peak (%s)\n", median_tps,
                     100 * median_tps * flops_per_token / peak, peak / 1e9, peak_src);
    print_memory(&rep);
    if (*cfg->save) {
        char path[700];
        if ((rc = mkdir_p(cfg->save)) == LOOM_OK) {
            snprintf(path, sizeof path, "%s/model.safetensors", cfg->save);
            rc = loom_gpt2_save(m, path);
            if (rc == LOOM_OK) loom_report_line(&rep, "  saved weights to %s\n", path);
        }
    }
    loom_free(step_tps);
    loom_report_close(&rep);
    loom_adamw_free(&opt);
    teardown(&r);
    return rc;
}

int loom_eval(struct loom_config *cfg)
{
    struct run r;
    int rc = setup(&r, cfg);
    if (rc == LOOM_OK && !r.have_valid)
        rc = loom_error_set(LOOM_ERR_INPUT, "loom eval needs --valid-data-path (or no --data-path, for the built-in corpus)");
    if (rc == LOOM_OK) {
        double val = evaluate(&r);
        if (r.floor_nats > 0)
            loom_log_info("val loss %.4f over %d batches (corpus floor %.4f)\n", val, cfg->eval_iters, r.floor_nats);
        else
            loom_log_info("val loss %.4f over %d batches\n", val, cfg->eval_iters);
    }
    teardown(&r);
    return rc;
}
