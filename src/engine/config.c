/*
 * The settings table: each setting once, with its flag, type, bounds,
 * default and help. Everything else in this file is driven by the table:
 * parsing `--flag value` / `--flag=value`, presets, the batch invariant,
 * --help, and the printed configuration with each value's origin.
 * Not here yet: DeepSpeed JSON (it will map JSON paths onto the same rows).
 */
#include "engine/config.h"

#include <assert.h>
#include <errno.h>
#include <limits.h>
#include <math.h>
#include <stddef.h>
#include <stdlib.h>
#include <string.h>

#include "base/log.h"
#include "io/sampler.h"

enum setting_type { T_INT = 0, T_INT64 = 1, T_DOUBLE = 2, T_STRING = 3, T_PATHS = 4, T_ENUM = 5, T_BOOL = 6, T_TYPE_COUNT };

enum origin { O_DEFAULT = 0, O_PRESET = 1, O_FLAG = 2, O_DERIVED = 3, O_ORIGIN_COUNT };
static const char *const origin_names[] = {"default", "preset", "flag", "derived"};
static_assert(sizeof origin_names / sizeof origin_names[0] == O_ORIGIN_COUNT, "origin_names");

static const char *const decay_styles[] = {"constant", "linear", "cosine", NULL};
static_assert(sizeof decay_styles / sizeof decay_styles[0] == LOOM_LR_DECAY_STYLE_COUNT + 1, "decay_styles");
static const char *const fsdp_strategies[] = {"none", "FULL_SHARD", "SHARD_GRAD_OP", "NO_SHARD", NULL};
static const char *const offload_devices[] = {"none", "cpu", "nvme", NULL};
static const char *const ddp_impls[] = {"bucketed", "naive", NULL};
static const char *const data_orders[] = {"shuffled", "sequential", NULL};
static_assert(sizeof data_orders / sizeof data_orders[0] == LOOM_DATA_ORDER_COUNT + 1, "data_orders");

struct setting {
    const char *flag;
    const char *group;
    enum setting_type type;
    size_t offset, size; /* size: capacity of a T_STRING field */
    double min, max;
    const char *def; /* default, parsed like a flag value; NULL for none */
    const char *const *choices;
    const char *help;
};

#define F(field) offsetof(struct loom_config, field)
#define INT(flag, group, field, lo, hi, def, help) {flag, group, T_INT, F(field), 0, lo, hi, def, NULL, help}
#define DBL(flag, group, field, lo, hi, def, help) {flag, group, T_DOUBLE, F(field), 0, lo, hi, def, NULL, help}
#define STR(flag, group, field, def, help) {flag, group, T_STRING, F(field), sizeof(((struct loom_config *)0)->field), 0, 0, def, NULL, help}

static const struct setting settings[] = {
    STR("--model", "model", model, "gpt2-tiny", "preset: gpt2-tiny, gpt2 (124M), gpt2-medium, gpt2-large, gpt2-xl"),
    INT("--num-layers", "model", num_layers, 1, 1024, NULL, "transformer layers (L)"),
    INT("--hidden-size", "model", hidden_size, 1, 65536, NULL, "channels (C)"),
    INT("--num-attention-heads", "model", num_attention_heads, 1, 1024, NULL, "attention heads (NH)"),
    INT("--seq-length", "model", seq_length, 1, 1 << 20, NULL, "tokens per sequence (T)"),
    INT("--max-position-embeddings", "model", max_position_embeddings, 1, 1 << 20, NULL, "rows of the position embedding"),
    INT("--vocab-size", "model", vocab_size, 2, 1 << 24, NULL, "vocabulary size (V)"),
    INT("--micro-batch-size", "batch", micro_batch_size, 0, 1 << 20, "0", "sequences per micro-batch per rank (0: derived)"),
    INT("--global-batch-size", "batch", global_batch_size, 0, 1 << 24, "0", "sequences per step, all ranks (0: derived)"),
    INT("--gradient-accumulation-steps", "batch", gradient_accumulation_steps, 0, 1 << 20, "0", "micro-batches per step per rank (0: derived)"),
    INT("--train-iters", "training", train_iters, 1, INT_MAX, NULL, "optimizer steps"),
    DBL("--lr", "training", lr, 0, 10, NULL, "peak learning rate"),
    DBL("--min-lr", "training", min_lr, 0, 10, "0", "learning rate at the end of decay"),
    INT("--lr-warmup-iters", "training", lr_warmup_iters, 0, INT_MAX, NULL, "linear warmup steps"),
    INT("--lr-decay-iters", "training", lr_decay_iters, 0, INT_MAX, "0", "step where decay reaches --min-lr (0: --train-iters)"),
    {"--lr-decay-style", "training", T_ENUM, F(lr_decay_style), 0, 0, 0, "cosine", decay_styles, "constant, linear or cosine"},
    DBL("--weight-decay", "training", weight_decay, 0, 10, "0.1", "decoupled weight decay (2-D tensors only)"),
    DBL("--adam-beta1", "training", adam_beta1, 0, 0.999999, "0.9", "AdamW beta1"),
    DBL("--adam-beta2", "training", adam_beta2, 0, 0.999999999, "0.95", "AdamW beta2"),
    DBL("--adam-eps", "training", adam_eps, 0, 1, "1e-8", "AdamW epsilon"),
    DBL("--clip-grad", "training", clip_grad, 0, 1e9, "1.0", "global gradient-norm clip (0: off)"),
    {"--seed", "training", T_INT64, F(seed), 0, 0, 9.2e18, "1234", NULL, "seed of initialisation and data order"},
    {"--data-path", "data", T_PATHS, F(data_paths), 0, 0, 0, NULL, NULL, "training token shards: files or globs (default: the built-in corpus)"},
    {"--valid-data-path", "data", T_PATHS, F(valid_data_paths), 0, 0, 0, NULL, NULL, "validation token shards"},
    {"--data-order", "data", T_ENUM, F(data_order), 0, 0, 0, "shuffled", data_orders, "shuffled (from seed and step) or sequential (llm.c order)"},
    STR("--data-cache", "data", data_cache, "", "where the built-in corpus is generated (default ~/.cache/loom)"),
    INT("--log-interval", "logging", log_interval, 1, INT_MAX, NULL, "steps between log lines"),
    INT("--eval-interval", "logging", eval_interval, 0, INT_MAX, NULL, "steps between evaluations (0: only at the end)"),
    INT("--eval-iters", "logging", eval_iters, 0, INT_MAX, "10", "batches per evaluation"),
    STR("--metrics", "logging", metrics, "", "append one JSON line per logged step to FILE"),
    STR("--load", "checkpoint", load, "", "resume from checkpoint DIR (its latest, or an iter_NNNNNNN), or start from weights in FILE.safetensors"),
    {"--finetune", "checkpoint", T_BOOL, F(finetune), 0, 0, 1, "0", NULL, "with --load: take the weights only; step 0, fresh optimizer state"},
    STR("--save", "checkpoint", save, "", "write checkpoints to DIR/iter_NNNNNNN (at --save-interval and at the end)"),
    INT("--save-interval", "checkpoint", save_interval, 0, INT_MAX, "0", "steps between checkpoints (0: only at the end)"),
    INT("--keep-last", "checkpoint", keep_last, 0, INT_MAX, "0", "keep only the K newest checkpoints (0: all)"),
    STR("--prompt", "sampling", prompt, "", "text to continue (loom sample)"),
    INT("--max-new-tokens", "sampling", max_new_tokens, 0, 1 << 20, "64", "tokens to generate (loom sample)"),
    DBL("--temperature", "sampling", temperature, 0, 100, "1.0", "softmax temperature, 0 for greedy (loom sample)"),
    INT("--top-k", "sampling", top_k, 0, 1 << 24, "0", "sample among the k most likely tokens (0: all)"),
    INT("--tensor-model-parallel-size", "parallelism", tensor_model_parallel_size, 1, 4096, "1", "tensor-parallel group size"),
    INT("--pipeline-model-parallel-size", "parallelism", pipeline_model_parallel_size, 1, 4096, "1", "pipeline stages"),
    DBL("--ddp-bucket-size", "parallelism", ddp_bucket_size, 0.001, 1e6, "25", "MB of gradients per DDP all-reduce bucket"),
    {"--no-overlap", "parallelism", T_BOOL, F(no_overlap), 0, 0, 1, "0", NULL, "reduce gradients after the backward, not during it"},
    {"--ddp-impl", "parallelism", T_ENUM, F(ddp_impl), 0, 0, 0, "bucketed", ddp_impls, "bucketed (overlapped) or naive (one all-reduce, the reference)"},
    INT("--zero-stage", "parallelism", zero_stage, 0, 3, "0", "ZeRO stage: 0 DDP, 1 shard optimizer state, 2 and gradients, 3 and parameters"),
    {"--fsdp-sharding-strategy", "parallelism", T_ENUM, F(fsdp_sharding_strategy), 0, 0, 0, "none", fsdp_strategies, "FSDP's names: FULL_SHARD (stage 3), SHARD_GRAD_OP (2), NO_SHARD (0)"},
    {"--zero3-min-params", "parallelism", T_INT64, F(zero3_min_params), 0, 0, 9e15, "0", NULL, "stage 3 gathers consecutive blocks until they hold N parameters (0: one block)"},
    {"--offload-optimizer", "parallelism", T_ENUM, F(offload_optimizer), 0, 0, 0, "none", offload_devices, "where the optimizer state lives: none, cpu (no-op on the CPU backend), nvme"},
    STR("--nvme-path", "parallelism", nvme_path, "", "directory for --offload-optimizer nvme"),
    DBL("--offload-buffer-size", "parallelism", offload_buffer_size, 0.001, 1e6, "64", "MB of optimizer state resident while streaming from nvme"),
    DBL("--comm-timeout", "parallelism", comm_timeout, 0.1, 1e7, "600", "seconds before a stuck collective aborts the job"),
    INT("--threads", "machine", threads, 0, 4096, "0", "threads for kernels and BLAS (0: all cores)"),
    DBL("--peak-tflops", "machine", peak_tflops, 0, 1e6, "0", "peak FLOP/s for MFU, in TFLOP/s (0: calibrate)"),
};
#define NSETTINGS ((int)(sizeof settings / sizeof settings[0]))

/* presets: model shape and the defaults that go with it */
struct preset {
    const char *name;
    int L, C, NH, T, maxT, V, micro, iters, warmup, eval_interval, log_interval;
    double lr;
};
static const struct preset presets[] = {
    {"gpt2-tiny", 4, 128, 4, 64, 64, 256, 16, 1200, 100, 200, 100, 3e-3},
    {"gpt2", 12, 768, 12, 1024, 1024, 50257, 4, 1000, 100, 250, 10, 6e-4},
    {"gpt2-medium", 24, 1024, 16, 1024, 1024, 50257, 4, 1000, 100, 250, 10, 3e-4},
    {"gpt2-large", 36, 1280, 20, 1024, 1024, 50257, 4, 1000, 100, 250, 10, 2.5e-4},
    {"gpt2-xl", 48, 1600, 25, 1024, 1024, 50257, 4, 1000, 100, 250, 10, 2e-4},
};

static unsigned char origins[NSETTINGS];

static const struct setting *find_setting(const char *flag, size_t len)
{
    for (int i = 0; i < NSETTINGS; i++)
        if (strlen(settings[i].flag) == len && strncmp(settings[i].flag, flag, len) == 0) return &settings[i];
    return NULL;
}

static int edit_distance(const char *a, const char *b)
{
    size_t la = strlen(a), lb = strlen(b);
    if (la > 63 || lb > 63) return 99;
    int d[64][64];
    for (size_t i = 0; i <= la; i++) d[i][0] = (int)i;
    for (size_t j = 0; j <= lb; j++) d[0][j] = (int)j;
    for (size_t i = 1; i <= la; i++)
        for (size_t j = 1; j <= lb; j++) {
            int c = d[i - 1][j - 1] + (a[i - 1] != b[j - 1]);
            if (d[i - 1][j] + 1 < c) c = d[i - 1][j] + 1;
            if (d[i][j - 1] + 1 < c) c = d[i][j - 1] + 1;
            d[i][j] = c;
        }
    return d[la][lb];
}

static const char *nearest_flag(const char *flag)
{
    const char *best = NULL;
    int best_d = 1 << 30;
    for (int i = 0; i < NSETTINGS; i++) {
        int d = edit_distance(flag, settings[i].flag);
        if (d < best_d) best_d = d, best = settings[i].flag;
    }
    return best_d <= 4 || (best && strstr(best, flag + 2)) ? best : NULL;
}

static int set_value(struct loom_config *cfg, const struct setting *s, const char *v)
{
    char *p = (char *)cfg + s->offset;
    char *end;
    errno = 0;
    switch (s->type) {
    case T_INT:
    case T_INT64: {
        long long x = strtoll(v, &end, 10);
        if (errno || end == v || *end || x < s->min || x > s->max)
            return loom_error_set(LOOM_ERR_INPUT, "%s: expected an integer in [%.0f, %.0f], got '%s'",
                                  s->flag, s->min, s->max, v);
        if (s->type == T_INT) *(int *)p = (int)x;
        else *(int64_t *)p = x;
        return LOOM_OK;
    }
    case T_DOUBLE: {
        double x = strtod(v, &end);
        if (errno || end == v || *end || !isfinite(x) || x < s->min || x > s->max)
            return loom_error_set(LOOM_ERR_INPUT, "%s: expected a number in [%g, %g], got '%s'", s->flag,
                                  s->min, s->max, v);
        *(double *)p = x;
        return LOOM_OK;
    }
    case T_STRING:
        if (strlen(v) >= s->size)
            return loom_error_set(LOOM_ERR_INPUT, "%s: value longer than %zu characters", s->flag, s->size - 1);
        strcpy(p, v);
        return LOOM_OK;
    case T_BOOL:
        if (strcmp(v, "1") == 0 || strcmp(v, "true") == 0) *(int *)p = 1;
        else if (strcmp(v, "0") == 0 || strcmp(v, "false") == 0) *(int *)p = 0;
        else return loom_error_set(LOOM_ERR_INPUT, "%s: expected true or false, got '%s'", s->flag, v);
        return LOOM_OK;
    case T_ENUM:
        for (int i = 0; s->choices[i]; i++)
            if (strcmp(s->choices[i], v) == 0) {
                *(int *)p = i;
                return LOOM_OK;
            }
        return loom_error_set(LOOM_ERR_INPUT, "%s: unknown value '%s'", s->flag, v);
    case T_PATHS: {
        char **paths = (char **)p;
        int *n = s->offset == F(data_paths) ? &cfg->ndata_paths : &cfg->nvalid_paths;
        if (*n >= LOOM_MAX_DATA_PATHS)
            return loom_error_set(LOOM_ERR_INPUT, "%s: more than %d paths", s->flag, LOOM_MAX_DATA_PATHS);
        paths[(*n)++] = strdup(v);
        return LOOM_OK;
    }
    default:
        LOOM_ASSERT(0);
    }
    return LOOM_OK;
}

static const struct preset *find_preset(const char *name)
{
    for (size_t i = 0; i < sizeof presets / sizeof presets[0]; i++)
        if (strcmp(presets[i].name, name) == 0) return &presets[i];
    return NULL;
}

static void apply_preset(struct loom_config *cfg, const struct preset *p)
{
    struct { size_t off; int is_double; double v; } rows[] = {
        {F(num_layers), 0, p->L},      {F(hidden_size), 0, p->C},
        {F(num_attention_heads), 0, p->NH}, {F(seq_length), 0, p->T},
        {F(max_position_embeddings), 0, p->maxT}, {F(vocab_size), 0, p->V},
        {F(train_iters), 0, p->iters}, {F(lr_warmup_iters), 0, p->warmup},
        {F(eval_interval), 0, p->eval_interval}, {F(log_interval), 0, p->log_interval},
        {F(lr), 1, p->lr},
    };
    for (size_t r = 0; r < sizeof rows / sizeof rows[0]; r++)
        for (int i = 0; i < NSETTINGS; i++)
            if (settings[i].offset == rows[r].off && origins[i] == O_DEFAULT) {
                char *field = (char *)cfg + rows[r].off;
                if (rows[r].is_double) *(double *)field = rows[r].v;
                else *(int *)field = (int)rows[r].v;
                origins[i] = O_PRESET;
            }
}

static int origin_of(size_t offset)
{
    for (int i = 0; i < NSETTINGS; i++)
        if (settings[i].offset == offset) return origins[i];
    return O_DEFAULT;
}

static void set_origin(size_t offset, enum origin o)
{
    for (int i = 0; i < NSETTINGS; i++)
        if (settings[i].offset == offset) origins[i] = o;
}

int loom_config_parse(struct loom_config *cfg, int argc, char **argv, int *help)
{
    memset(cfg, 0, sizeof *cfg);
    memset(origins, O_DEFAULT, sizeof origins);
    *help = 0;
    int rc;
    for (int i = 0; i < NSETTINGS; i++)
        if (settings[i].def && (rc = set_value(cfg, &settings[i], settings[i].def))) return rc;
    /* flags, in order; a path list flag takes every value up to the next flag */
    for (int i = 0; i < argc; i++) {
        const char *a = argv[i];
        if (strcmp(a, "--help") == 0 || strcmp(a, "-h") == 0) {
            *help = 1;
            return LOOM_OK;
        }
        if (strncmp(a, "--", 2) != 0)
            return loom_error_set(LOOM_ERR_INPUT, "unexpected argument '%s' (flags start with --)", a);
        const char *eq = strchr(a, '=');
        size_t len = eq ? (size_t)(eq - a) : strlen(a);
        const struct setting *s = find_setting(a, len);
        if (!s) {
            char flag[128];
            snprintf(flag, sizeof flag, "%.*s", (int)len, a);
            const char *near = nearest_flag(flag);
            if (near) return loom_error_set(LOOM_ERR_INPUT, "unknown flag %s (did you mean %s?)", flag, near);
            return loom_error_set(LOOM_ERR_INPUT, "unknown flag %s (see loom train --help)", flag);
        }
        int idx = (int)(s - settings);
        if (s->type == T_PATHS && origins[idx] != O_FLAG) {
            /* a repeated flag adds to the list; the first one replaces the default */
            int *n = s->offset == F(data_paths) ? &cfg->ndata_paths : &cfg->nvalid_paths;
            *n = 0;
        }
        if (eq) {
            if ((rc = set_value(cfg, s, eq + 1))) return rc;
        } else if (s->type == T_BOOL) {
            *(int *)((char *)cfg + s->offset) = 1;
        } else {
            if (i + 1 >= argc || (strncmp(argv[i + 1], "--", 2) == 0))
                return loom_error_set(LOOM_ERR_INPUT, "%s needs a value", s->flag);
            if ((rc = set_value(cfg, s, argv[++i]))) return rc;
            while (s->type == T_PATHS && i + 1 < argc && strncmp(argv[i + 1], "--", 2) != 0)
                if ((rc = set_value(cfg, s, argv[++i]))) return rc;
        }
        origins[idx] = O_FLAG;
    }
    const struct preset *p = find_preset(cfg->model);
    if (!p)
        return loom_error_set(LOOM_ERR_INPUT,
                              "--model: unknown preset '%s' (gpt2-tiny, gpt2, gpt2-medium, gpt2-large, gpt2-xl)",
                              cfg->model);
    apply_preset(cfg, p);
    /* presets that follow from other settings */
    if (origin_of(F(micro_batch_size)) == O_DEFAULT && origin_of(F(global_batch_size)) == O_DEFAULT &&
        origin_of(F(gradient_accumulation_steps)) == O_DEFAULT) {
        cfg->micro_batch_size = p->micro;
        set_origin(F(micro_batch_size), O_PRESET);
    }
    if (origin_of(F(max_position_embeddings)) == O_PRESET && cfg->seq_length > cfg->max_position_embeddings &&
        origin_of(F(seq_length)) == O_FLAG)
        cfg->max_position_embeddings = cfg->seq_length;
    return LOOM_OK;
}

int loom_config_resolve(struct loom_config *cfg, int dp)
{
    int *mb = &cfg->micro_batch_size, *gb = &cfg->global_batch_size, *ga = &cfg->gradient_accumulation_steps;
    if (*mb == 0) {
        if (*gb && *ga) {
            if (*gb % (*ga * dp))
                return loom_error_set(LOOM_ERR_INPUT,
                                      "--global-batch-size %d is not divisible by --gradient-accumulation-steps %d x data-parallel size %d",
                                      *gb, *ga, dp);
            *mb = *gb / (*ga * dp);
        } else if (*gb) {
            *ga = 1;
            set_origin(F(gradient_accumulation_steps), O_DERIVED);
            if (*gb % dp)
                return loom_error_set(LOOM_ERR_INPUT, "--global-batch-size %d is not divisible by data-parallel size %d", *gb, dp);
            *mb = *gb / dp;
        } else {
            *mb = 1;
        }
        set_origin(F(micro_batch_size), O_DERIVED);
    }
    if (*ga == 0) {
        if (*gb == 0) *ga = 1;
        else if (*gb % (*mb * dp))
            return loom_error_set(LOOM_ERR_INPUT,
                                  "--global-batch-size %d is not divisible by --micro-batch-size %d x data-parallel size %d",
                                  *gb, *mb, dp);
        else *ga = *gb / (*mb * dp);
        set_origin(F(gradient_accumulation_steps), O_DERIVED);
    }
    if (*gb == 0) {
        *gb = *mb * *ga * dp;
        set_origin(F(global_batch_size), O_DERIVED);
    }
    if ((long long)*mb * *ga * dp != *gb)
        return loom_error_set(LOOM_ERR_INPUT,
                              "batch sizes disagree: --global-batch-size %d != --micro-batch-size %d x --gradient-accumulation-steps %d x data-parallel size %d",
                              *gb, *mb, *ga, dp);
    if (cfg->fsdp_sharding_strategy) {
        static const int stage_of[] = {0, 3, 2, 0};
        int want = stage_of[cfg->fsdp_sharding_strategy];
        if (origin_of(F(zero_stage)) == O_FLAG && cfg->zero_stage != want)
            return loom_error_set(LOOM_ERR_INPUT, "--fsdp-sharding-strategy %s means --zero-stage %d, but --zero-stage %d is given",
                                  fsdp_strategies[cfg->fsdp_sharding_strategy], want, cfg->zero_stage);
        cfg->zero_stage = want;
        set_origin(F(zero_stage), O_DERIVED);
    }
    if (cfg->offload_optimizer == 2 && !*cfg->nvme_path)
        return loom_error_set(LOOM_ERR_INPUT, "--offload-optimizer nvme needs --nvme-path DIR");
    if (cfg->lr_decay_iters == 0) {
        cfg->lr_decay_iters = cfg->train_iters;
        set_origin(F(lr_decay_iters), O_DERIVED);
    }
    if (cfg->lr_warmup_iters > cfg->lr_decay_iters && origin_of(F(lr_warmup_iters)) != O_FLAG) {
        cfg->lr_warmup_iters = cfg->lr_decay_iters / 10; /* a preset's warmup scales to a short run */
        set_origin(F(lr_warmup_iters), O_DERIVED);
    }
    if (cfg->lr_warmup_iters > cfg->lr_decay_iters)
        return loom_error_set(LOOM_ERR_INPUT, "--lr-warmup-iters %d exceeds --lr-decay-iters %d",
                              cfg->lr_warmup_iters, cfg->lr_decay_iters);
    if (cfg->min_lr > cfg->lr)
        return loom_error_set(LOOM_ERR_INPUT, "--min-lr %g exceeds --lr %g", cfg->min_lr, cfg->lr);
    if (cfg->seq_length > cfg->max_position_embeddings)
        return loom_error_set(LOOM_ERR_INPUT, "--seq-length %d exceeds --max-position-embeddings %d",
                              cfg->seq_length, cfg->max_position_embeddings);
    if (cfg->hidden_size % cfg->num_attention_heads)
        return loom_error_set(LOOM_ERR_INPUT, "--hidden-size %d is not divisible by --num-attention-heads %d",
                              cfg->hidden_size, cfg->num_attention_heads);
    if (cfg->eval_interval == 0) cfg->eval_interval = cfg->train_iters;
    return LOOM_OK;
}

static void format_value(char *buf, size_t n, const struct loom_config *cfg, const struct setting *s)
{
    const char *p = (const char *)cfg + s->offset;
    switch (s->type) {
    case T_INT: snprintf(buf, n, "%d", *(const int *)p); break;
    case T_INT64: snprintf(buf, n, "%lld", (long long)*(const int64_t *)p); break;
    case T_DOUBLE: snprintf(buf, n, "%g", *(const double *)p); break;
    case T_STRING: snprintf(buf, n, "%s", *p ? p : "-"); break;
    case T_ENUM: snprintf(buf, n, "%s", s->choices[*(const int *)p]); break;
    case T_BOOL: snprintf(buf, n, "%s", *(const int *)p ? "true" : "false"); break;
    case T_PATHS: {
        char *const *paths = (char *const *)p;
        int cnt = s->offset == F(data_paths) ? cfg->ndata_paths : cfg->nvalid_paths;
        buf[0] = 0;
        for (int i = 0; i < cnt; i++) {
            size_t l = strlen(buf);
            snprintf(buf + l, n - l, "%s%s", i ? " " : "", paths[i]);
        }
        if (!cnt) snprintf(buf, n, "-");
        break;
    }
    default: LOOM_ASSERT(0);
    }
}

void loom_config_print_help(FILE *f, const char *command)
{
    fprintf(f, "usage: loom %s [flags]\n", command);
    const char *group = "";
    for (int i = 0; i < NSETTINGS; i++) {
        const struct setting *s = &settings[i];
        if (strcmp(group, s->group) != 0) fprintf(f, "\n%s:\n", group = s->group);
        char arg[96];
        snprintf(arg, sizeof arg, "%s %s", s->flag,
                 s->type == T_INT || s->type == T_INT64 ? "N"
                 : s->type == T_DOUBLE                  ? "X"
                 : s->type == T_PATHS                   ? "PATH..."
                 : s->type == T_ENUM                    ? "CHOICE"
                 : s->type == T_BOOL                    ? ""
                                                        : "VALUE");
        fprintf(f, "  %-36s %s", arg, s->help);
        if (s->def && strcmp(s->def, "0") && *s->def) fprintf(f, " [%s]", s->def);
        fputc('\n', f);
    }
}

void loom_config_print(FILE *f, const struct loom_config *cfg)
{
    fprintf(f, "configuration:\n");
    for (int i = 0; i < NSETTINGS; i++) {
        char v[1024];
        format_value(v, sizeof v, cfg, &settings[i]);
        fprintf(f, "  %-30s %-24s (%s)\n", settings[i].flag + 2, v, origin_names[origins[i]]);
    }
}

void loom_config_free(struct loom_config *cfg)
{
    for (int i = 0; i < cfg->ndata_paths; i++) free(cfg->data_paths[i]);
    for (int i = 0; i < cfg->nvalid_paths; i++) free(cfg->valid_data_paths[i]);
    cfg->ndata_paths = cfg->nvalid_paths = 0;
}

int loom_config_count(void) { return NSETTINGS; }

uint64_t loom_config_hash(const struct loom_config *cfg, int i, const char **flag)
{
    LOOM_ASSERT(i >= 0 && i < NSETTINGS);
    char v[4096];
    format_value(v, sizeof v, cfg, &settings[i]);
    uint64_t h = 1469598103934665603ull; /* FNV-1a */
    for (const char *c = v; *c; c++) h = (h ^ (unsigned char)*c) * 1099511628211ull;
    if (flag) *flag = settings[i].flag;
    return h;
}
