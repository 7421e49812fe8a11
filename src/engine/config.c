/*
 * The settings table: each setting once, with its flag, its JSON path, type,
 * bounds, default and help. Everything else in this file is driven by the
 * table: parsing `--flag value` / `--flag=value`, presets, the batch
 * invariant, --help, and the printed configuration with each value's origin
 * (default, preset, json, flag, derived). Reading DeepSpeed JSON onto the
 * same rows lives in config_json.c.
 */
#include "engine/config.h"

#include <assert.h>
#include <errno.h>
#include <limits.h>
#include <math.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdlib.h>
#include <string.h>

#include "base/log.h"
#include "engine/config_impl.h"
#include "io/sampler.h"
#include "model/gpt2.h"

static const char *const origin_names[] = {"default", "preset", "json", "flag", "derived"};
static_assert(sizeof origin_names / sizeof origin_names[0] == O_ORIGIN_COUNT, "origin_names");

static const char *const decay_styles[] = {"constant",      "linear",         "cosine", "WarmupLR",
                                           "WarmupDecayLR", "WarmupCosineLR", NULL};
static_assert(sizeof decay_styles / sizeof decay_styles[0] == LOOM_LR_DECAY_STYLE_COUNT + 1, "decay_styles");
static const char *const warmup_styles[] = {"linear", "log", NULL};
static_assert(sizeof warmup_styles / sizeof warmup_styles[0] == LOOM_LR_WARMUP_STYLE_COUNT + 1,
              "warmup_styles");
static const char *const optimizers[] = {"adamw", "adam", NULL};
static_assert(sizeof optimizers / sizeof optimizers[0] == LOOM_OPTIMIZER_COUNT + 1, "optimizers");
static const char *const fsdp_strategies[] = {"none", "FULL_SHARD", "SHARD_GRAD_OP", "NO_SHARD", NULL};
static const char *const offload_devices[] = {"none", "cpu", "nvme", NULL};
static const char *const nonfinite_actions[] = {"abort", "skip", NULL};
static const char *const reduce_dtypes[] = {"fp32", "bf16", "fp16", NULL}; /* the order of enum loom_dtype */
static const char *const ddp_impls[] = {"bucketed", "naive", NULL};
static const char *const data_orders[] = {"shuffled", "sequential", NULL};
static_assert(sizeof data_orders / sizeof data_orders[0] == LOOM_DATA_ORDER_COUNT + 1, "data_orders");
/* in the order of enum loom_recompute and enum loom_recompute_method (model/gpt2.h) */
static const char *const recompute_granularities[] = {"none", "selective", "full", NULL};
static_assert(sizeof recompute_granularities / sizeof recompute_granularities[0] == LOOM_RECOMPUTE_COUNT + 1,
              "recompute_granularities");
static const char *const recompute_methods[] = {"none", "uniform", "block", NULL};
static_assert(sizeof recompute_methods / sizeof recompute_methods[0] == LOOM_RECOMPUTE_METHOD_COUNT + 1,
              "recompute_methods");

#define F(field) offsetof(struct loom_config, field)
#define SIZE(field) sizeof(((struct loom_config *)0)->field)
/* row(flag, json path, group, field, ..., help[, .conv = ..., .json_alt = ...]) */
#define ROW(flag_, json_, group_, type_, field, lo, hi, def_, choices_, help_, ...)                          \
    {                                                                                                        \
        .flag = flag_, .json = json_, .group = group_, .type = type_, .offset = F(field), .min = lo,         \
        .max = hi, .def = def_, .choices = choices_, .help = help_, __VA_ARGS__                              \
    }
#define INT(flag, json, group, field, lo, hi, def, help, ...)                                                \
    ROW(flag, json, group, T_INT, field, lo, hi, def, NULL, help, __VA_ARGS__)
#define I64(flag, json, group, field, lo, hi, def, help, ...)                                                \
    ROW(flag, json, group, T_INT64, field, lo, hi, def, NULL, help, __VA_ARGS__)
#define DBL(flag, json, group, field, lo, hi, def, help, ...)                                                \
    ROW(flag, json, group, T_DOUBLE, field, lo, hi, def, NULL, help, __VA_ARGS__)
#define STR(flag, json, group, field, def, help, ...)                                                        \
    ROW(flag, json, group, T_STRING, field, 0, 0, def, NULL, help, .size = SIZE(field), __VA_ARGS__)
#define BOOL(flag, json, group, field, def, help, ...)                                                       \
    ROW(flag, json, group, T_BOOL, field, 0, 1, def, NULL, help, __VA_ARGS__)
#define ENUM(flag, json, group, field, choices, def, help, ...)                                              \
    ROW(flag, json, group, T_ENUM, field, 0, 0, def, choices, help, __VA_ARGS__)
#define PATHS(flag, json, group, field, help) ROW(flag, json, group, T_PATHS, field, 0, 0, NULL, NULL, help)

const struct setting loom_settings[] = {
    STR("--deepspeed-config", NULL, "config", deepspeed_config, "",
        "DeepSpeed JSON config FILE (alias --deepspeed_config); its keys are the json: paths below, flags "
        "override them"),
    BOOL("--dry-run", NULL, "config", dry_run, "0",
         "resolve and print the configuration, then exit (loom train, loom eval)"),
    STR("--model", "model", "model", model, "gpt2-tiny",
        "preset: gpt2-tiny, gpt2 (124M), gpt2-medium, gpt2-large, gpt2-xl"),
    INT("--num-layers", "num_layers", "model", num_layers, 1, 1024, NULL, "transformer layers (L)"),
    INT("--hidden-size", "hidden_size", "model", hidden_size, 1, 65536, NULL, "channels (C)"),
    INT("--num-attention-heads", "num_attention_heads", "model", num_attention_heads, 1, 1024, NULL,
        "attention heads (NH)"),
    INT("--seq-length", "seq_length", "model", seq_length, 1, 1 << 20, NULL, "tokens per sequence (T)"),
    INT("--max-position-embeddings", "max_position_embeddings", "model", max_position_embeddings, 1, 1 << 20,
        NULL, "rows of the position embedding"),
    INT("--vocab-size", "vocab_size", "model", vocab_size, 2, 1 << 24, NULL, "vocabulary size (V)"),
    INT("--micro-batch-size", "train_micro_batch_size_per_gpu", "batch", micro_batch_size, 0, 1 << 20, "0",
        "sequences per micro-batch per rank (0: derived)"),
    INT("--global-batch-size", "train_batch_size", "batch", global_batch_size, 0, 1 << 24, "0",
        "sequences per step, all ranks (0: derived)"),
    INT("--gradient-accumulation-steps", "gradient_accumulation_steps", "batch", gradient_accumulation_steps,
        0, 1 << 20, "0", "micro-batches per step per rank (0: derived)"),
    INT("--train-iters", "train_iters", "training", train_iters, 1, INT_MAX, NULL, "optimizer steps"),
    ENUM("--optimizer", "optimizer.type", "training", optimizer, optimizers, "adamw",
         "adamw or adam, both the decoupled AdamW update (DeepSpeed's Adam and Megatron's adam are AdamW)"),
    BOOL("--adam-w-mode", "optimizer.params.adam_w_mode", "training", adam_w_mode, "1",
         "DeepSpeed's switch for adam: =false asks for L2-coupled weight decay (torch.optim.Adam), not "
         "implemented, so accepted only with --weight-decay 0"),
    DBL("--lr", "optimizer.params.lr", "training", lr, 0, 10, NULL,
        "peak learning rate (WarmupLR, WarmupDecayLR: warmup_max_lr wins over optimizer.params.lr, as in "
        "DeepSpeed)",
        .json_alt = "scheduler.params.warmup_max_lr"),
    DBL("--min-lr", "scheduler.params.warmup_min_lr", "training", min_lr, 0, 10, "0",
        "learning rate at the end of decay; WarmupLR and WarmupDecayLR also start their warmup there"),
    INT("--lr-warmup-iters", "scheduler.params.warmup_num_steps", "training", lr_warmup_iters, 0, INT_MAX,
        NULL, "warmup steps (DeepSpeed's schedulers: at least 2)"),
    INT("--lr-decay-iters", "scheduler.params.total_num_steps", "training", lr_decay_iters, 0, INT_MAX, "0",
        "step where decay reaches its floor (0: --train-iters)"),
    ENUM("--lr-decay-style", "scheduler.type", "training", lr_decay_style, decay_styles, "cosine",
         "Megatron's constant, linear or cosine after a linear warmup from 0; or DeepSpeed's WarmupLR, "
         "WarmupDecayLR, WarmupCosineLR"),
    ENUM("--lr-warmup-style", "scheduler.params.warmup_type", "training", lr_warmup_style, warmup_styles,
         "linear", "linear or log (DeepSpeed's schedulers only; log unless given, as in DeepSpeed)"),
    DBL("--lr-warmup-min-ratio", "scheduler.params.warmup_min_ratio", "training", lr_warmup_min_ratio, 0, 1,
        "0", "WarmupCosineLR: warmup starts at this fraction of --lr"),
    DBL("--lr-cos-min-ratio", "scheduler.params.cos_min_ratio", "training", lr_cos_min_ratio, 0, 1, "0.0001",
        "WarmupCosineLR: cosine ends at this fraction of --lr"),
    DBL("--weight-decay", "optimizer.params.weight_decay", "training", weight_decay, 0, 10, "0.1",
        "decoupled weight decay (2-D tensors only)"),
    DBL("--adam-beta1", "optimizer.params.betas[0]", "training", adam_beta1, 0, 0.999999, "0.9",
        "AdamW beta1"),
    DBL("--adam-beta2", "optimizer.params.betas[1]", "training", adam_beta2, 0, 0.999999999, "0.95",
        "AdamW beta2"),
    DBL("--adam-eps", "optimizer.params.eps", "training", adam_eps, 0, 1, "1e-8", "AdamW epsilon"),
    DBL("--clip-grad", "gradient_clipping", "training", clip_grad, 0, 1e9, "1.0",
        "global gradient-norm clip (0: off)"),
    I64("--seed", "seed", "training", seed, 0, 9.2e18, "1234", "seed of initialisation and data order"),
    BOOL("--fp16", "fp16.enabled", "precision", fp16, "0",
         "fp16 mixed precision: fp16 parameters, gradients and activations, fp32 master weights and "
         "optimizer state, dynamic loss scaling"),
    BOOL("--bf16", "bf16.enabled", "precision", bf16, "0",
         "bf16 mixed precision: bf16 parameters, gradients and activations, fp32 master weights and "
         "optimizer state",
         .json_alt = "bfloat16.enabled"),
    ENUM("--grad-reduce-dtype", "communication_data_type", "precision", grad_reduce_dtype, reduce_dtypes,
         "fp32",
         "dtype of the gradient reduction across ranks: fp32, or the compute dtype of --bf16/--fp16 (each "
         "addition in fp32, rounded: half the bytes)"),
    ENUM("--on-nonfinite", "on_nonfinite", "precision", on_nonfinite, nonfinite_actions, "abort",
         "a non-finite loss or gradient (bf16, fp32): abort the run, or skip the step (fp16: the loss scaler "
         "skips)"),
    DBL("--loss-scale", "fp16.loss_scale", "precision", loss_scale, 0, 1e38, "0",
        "static loss scale (0: dynamic)"),
    DBL("--initial-loss-scale", "fp16.initial_scale_power", "precision", initial_loss_scale, 1, 0x1p127,
        "4294967296", "initial dynamic loss scale (json: the power P of 2^P)", .conv = J_POW2),
    DBL("--min-loss-scale", "fp16.min_loss_scale", "precision", min_loss_scale, 0, 1e38, "1",
        "dynamic loss scale floor"),
    INT("--loss-scale-window", "fp16.loss_scale_window", "precision", loss_scale_window, 1, INT_MAX, "1000",
        "steps without overflow before the loss scale grows"),
    INT("--hysteresis", "fp16.hysteresis", "precision", hysteresis, 1, INT_MAX, "2",
        "overflows tolerated before the loss scale shrinks"),
    PATHS("--data-path", "data_path", "data", data_paths,
          "training token shards: files or globs (default: the built-in corpus)"),
    PATHS("--valid-data-path", "valid_data_path", "data", valid_data_paths, "validation token shards"),
    ENUM("--data-order", "data_order", "data", data_order, data_orders, "shuffled",
         "shuffled (from seed and step) or sequential (llm.c order)"),
    STR("--data-cache", "data_cache", "data", data_cache, "",
        "where the built-in corpus is generated (default ~/.cache/loom)"),
    INT("--log-interval", "steps_per_print", "logging", log_interval, 1, INT_MAX, NULL,
        "steps between log lines"),
    INT("--eval-interval", "eval_interval", "logging", eval_interval, 0, INT_MAX, NULL,
        "steps between evaluations (0: only at the end)"),
    INT("--eval-iters", "eval_iters", "logging", eval_iters, 0, INT_MAX, "10", "batches per evaluation"),
    STR("--metrics", "metrics", "logging", metrics, "", "append one JSON line per logged step to FILE"),
    STR("--load", "load", "checkpoint", load, "",
        "resume from checkpoint DIR (its latest, or an iter_NNNNNNN), or start from weights in "
        "FILE.safetensors"),
    BOOL("--finetune", "finetune", "checkpoint", finetune, "0",
         "with --load: take the weights only; step 0, fresh optimizer state"),
    STR("--save", "save", "checkpoint", save, "",
        "write checkpoints to DIR/iter_NNNNNNN (at --save-interval and at the end)"),
    INT("--save-interval", "save_interval", "checkpoint", save_interval, 0, INT_MAX, "0",
        "steps between checkpoints (0: only at the end)"),
    INT("--keep-last", "keep_last", "checkpoint", keep_last, 0, INT_MAX, "0",
        "keep only the K newest checkpoints (0: all)"),
    STR("--prompt", "prompt", "sampling", prompt, "", "text to continue (loom sample)"),
    INT("--max-new-tokens", "max_new_tokens", "sampling", max_new_tokens, 0, 1 << 20, "64",
        "tokens to generate (loom sample)"),
    DBL("--temperature", "temperature", "sampling", temperature, 0, 100, "1.0",
        "softmax temperature, 0 for greedy (loom sample)"),
    INT("--top-k", "top_k", "sampling", top_k, 0, 1 << 24, "0",
        "sample among the k most likely tokens (0: all)"),
    INT("--tensor-model-parallel-size", "tensor_model_parallel_size", "parallelism",
        tensor_model_parallel_size, 1, 4096, "1", "tensor-parallel group size"),
    INT("--pipeline-model-parallel-size", "pipeline_model_parallel_size", "parallelism",
        pipeline_model_parallel_size, 1, 4096, "1", "pipeline stages"),
    DBL("--ddp-bucket-size", "zero_optimization.reduce_bucket_size", "parallelism", ddp_bucket_size, 0.001,
        1e6, "25",
        "MB of gradients per DDP all-reduce bucket (json: reduce_bucket_size counts fp32 elements, 4 bytes "
        "each: 25 MB = 6.25e6)",
        .conv = J_ELEMENTS_MB),
    BOOL("--no-overlap", "zero_optimization.overlap_comm", "parallelism", no_overlap, "0",
         "reduce gradients after the backward, not during it (json: overlap_comm is the inverse)",
         .conv = J_NOT),
    ENUM("--ddp-impl", "ddp_impl", "parallelism", ddp_impl, ddp_impls, "bucketed",
         "bucketed (overlapped) or naive (one all-reduce, the reference)"),
    INT("--zero-stage", "zero_optimization.stage", "parallelism", zero_stage, 0, 3, "0",
        "ZeRO stage: 0 DDP, 1 shard optimizer state, 2 and gradients, 3 and parameters"),
    ENUM("--fsdp-sharding-strategy", "fsdp_sharding_strategy", "parallelism", fsdp_sharding_strategy,
         fsdp_strategies, "none", "FSDP's names: FULL_SHARD (stage 3), SHARD_GRAD_OP (2), NO_SHARD (0)"),
    I64("--zero3-min-params", "zero3_min_params", "parallelism", zero3_min_params, 0, 9e15, "0",
        "stage 3 gathers consecutive blocks until they hold N parameters (0: one block)"),
    ENUM("--offload-optimizer", "zero_optimization.offload_optimizer.device", "parallelism",
         offload_optimizer, offload_devices, "none",
         "where the optimizer state lives: none, cpu (no-op on the CPU backend), nvme"),
    STR("--nvme-path", "zero_optimization.offload_optimizer.nvme_path", "parallelism", nvme_path, "",
        "directory for --offload-optimizer nvme"),
    DBL("--offload-buffer-size", "offload_buffer_size", "parallelism", offload_buffer_size, 0.001, 1e6, "64",
        "MB of optimizer state resident while streaming from nvme"),
    DBL("--comm-timeout", "comm_timeout", "parallelism", comm_timeout, 0.1, 1e7, "600",
        "seconds before a stuck collective aborts the job"),
    BOOL("--recompute-activations", "recompute_activations", "recompute", recompute_activations, "0",
         "recompute attention's probabilities in the backward instead of keeping them: the same as "
         "--recompute-granularity selective"),
    ENUM("--recompute-granularity", "recompute_granularity", "recompute", recompute_granularity,
         recompute_granularities, "none",
         "selective: no layer keeps its attention probabilities (B,NH,T,T), each layer's backward recomputes "
         "them from qkv; full: a recomputed layer keeps only its input and reruns its forward before its "
         "backward (needs --recompute-method and --recompute-num-layers)"),
    ENUM("--recompute-method", "recompute_method", "recompute", recompute_method, recompute_methods, "none",
         "which layers full recomputation covers: uniform, every layer, in chunks of --recompute-num-layers "
         "(the last one shorter when it does not divide --num-layers) that keep only the chunk's input; "
         "block, the first --recompute-num-layers layers, the others keep everything"),
    INT("--recompute-num-layers", "activation_checkpointing.number_checkpoints", "recompute",
        recompute_num_layers, 0, 1 << 20, "0",
        "layers per chunk (uniform) or layers recomputed (block); 0: not given. json: DeepSpeed's "
        "number_checkpoints, which alone means --recompute-granularity full --recompute-method block; the "
        "block's other keys (partition_activations, cpu_checkpointing, contiguous_memory_optimization, "
        "synchronize_checkpoint_boundary, profile) are accepted and not used"),
    INT("--threads", "threads", "machine", threads, 0, 4096, "0",
        "threads for kernels and BLAS (0: all cores)"),
    DBL("--peak-tflops", "peak_tflops", "machine", peak_tflops, 0, 1e6, "0",
        "peak FLOP/s for MFU, in TFLOP/s (0: calibrate)"),
};
#define NSETTINGS ((int)(sizeof loom_settings / sizeof loom_settings[0]))
const int loom_nsettings = NSETTINGS;
static const struct setting *const settings = loom_settings;

/* Other spellings of a flag. */
static const struct {
    const char *alias, *flag;
} flag_aliases[] = {
    {"--deepspeed_config", "--deepspeed-config"},
};

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
static const char *json_path[NSETTINGS]; /* the JSON key a value came from */
static char json_had[NSETTINGS][128];    /* the JSON value a differing flag replaced */

/* start-up warnings, printed by loom_config_resolve */
#define MAX_WARNINGS 64
static char warnings[MAX_WARNINGS][320];
static int nwarnings, nwarnings_dropped;

void loom_config_warn(const char *fmt, ...)
{
    if (nwarnings == MAX_WARNINGS) {
        nwarnings_dropped++;
        return;
    }
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(warnings[nwarnings++], sizeof warnings[0], fmt, ap);
    va_end(ap);
}

const char *loom_config_warning(int i)
{
    return i >= 0 && i < nwarnings ? warnings[i] : NULL;
}

void loom_setting_from_json(int i, const char *path)
{
    origins[i] = O_JSON;
    json_path[i] = path;
}

static int index_of(size_t offset)
{
    for (int i = 0; i < NSETTINGS; i++)
        if (settings[i].offset == offset) return i;
    LOOM_ASSERT(0);
    return -1;
}

static int origin_of(size_t offset)
{
    return origins[index_of(offset)];
}
static void set_origin(size_t offset, enum origin o)
{
    origins[index_of(offset)] = (unsigned char)o;
}
/* Given by the user, in the JSON file or as a flag. */
static int given(size_t offset)
{
    return origin_of(offset) == O_JSON || origin_of(offset) == O_FLAG;
}

/* How messages name a setting: by the JSON key its value came from, else by its flag. */
static const char *name_of(size_t offset)
{
    int i = index_of(offset);
    return origins[i] == O_JSON && json_path[i] ? json_path[i] : settings[i].flag;
}

static const struct setting *find_setting(const char *flag, size_t len)
{
    for (size_t a = 0; a < sizeof flag_aliases / sizeof flag_aliases[0]; a++)
        if (strlen(flag_aliases[a].alias) == len && strncmp(flag_aliases[a].alias, flag, len) == 0) {
            flag = flag_aliases[a].flag;
            len = strlen(flag);
        }
    for (int i = 0; i < NSETTINGS; i++)
        if (strlen(settings[i].flag) == len && strncmp(settings[i].flag, flag, len) == 0) return &settings[i];
    return NULL;
}

int loom_edit_distance(const char *a, const char *b)
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
        int d = loom_edit_distance(flag, settings[i].flag);
        if (d < best_d) best_d = d, best = settings[i].flag;
    }
    return best_d <= 4 || (best && strstr(best, flag + 2)) ? best : NULL;
}

static int *path_count(struct loom_config *cfg, const struct setting *s)
{
    return s->offset == F(data_paths) ? &cfg->ndata_paths : &cfg->nvalid_paths;
}

void loom_setting_clear_paths(struct loom_config *cfg, const struct setting *s)
{
    char **paths = (char **)((char *)cfg + s->offset);
    int *n = path_count(cfg, s);
    for (int i = 0; i < *n; i++) free(paths[i]);
    *n = 0;
}

int loom_setting_add_path(struct loom_config *cfg, const struct setting *s, const char *path)
{
    char **paths = (char **)((char *)cfg + s->offset);
    int *n = path_count(cfg, s);
    if (*n >= LOOM_MAX_DATA_PATHS)
        return loom_error_set(LOOM_ERR_INPUT, "%s: more than %d paths", s->flag, LOOM_MAX_DATA_PATHS);
    paths[(*n)++] = strdup(path);
    return LOOM_OK;
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
        if (s->type == T_INT)
            *(int *)p = (int)x;
        else
            *(int64_t *)p = x;
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
            return loom_error_set(LOOM_ERR_INPUT, "%s: value longer than %zu characters", s->flag,
                                  s->size - 1);
        strcpy(p, v);
        return LOOM_OK;
    case T_BOOL:
        if (strcmp(v, "1") == 0 || strcmp(v, "true") == 0)
            *(int *)p = 1;
        else if (strcmp(v, "0") == 0 || strcmp(v, "false") == 0)
            *(int *)p = 0;
        else
            return loom_error_set(LOOM_ERR_INPUT, "%s: expected true or false, got '%s'", s->flag, v);
        return LOOM_OK;
    case T_ENUM:
        for (int i = 0; s->choices[i]; i++)
            if (strcmp(s->choices[i], v) == 0) {
                *(int *)p = i;
                return LOOM_OK;
            }
        return loom_error_set(LOOM_ERR_INPUT, "%s: unknown value '%s'", s->flag, v);
    case T_PATHS:
        return loom_setting_add_path(cfg, s, v);
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
    struct {
        size_t off;
        int is_double;
        double v;
    } rows[] = {
        {F(num_layers), 0, p->L},
        {F(hidden_size), 0, p->C},
        {F(num_attention_heads), 0, p->NH},
        {F(seq_length), 0, p->T},
        {F(max_position_embeddings), 0, p->maxT},
        {F(vocab_size), 0, p->V},
        {F(train_iters), 0, p->iters},
        {F(lr_warmup_iters), 0, p->warmup},
        {F(eval_interval), 0, p->eval_interval},
        {F(log_interval), 0, p->log_interval},
        {F(lr), 1, p->lr},
    };
    for (size_t r = 0; r < sizeof rows / sizeof rows[0]; r++) {
        int i = index_of(rows[r].off);
        if (origins[i] != O_DEFAULT) continue;
        char *field = (char *)cfg + rows[r].off;
        if (rows[r].is_double)
            *(double *)field = rows[r].v;
        else
            *(int *)field = (int)rows[r].v;
        origins[i] = O_PRESET;
    }
}

/* The JSON file named by the last --deepspeed-config in argv, or NULL. */
static const char *find_json_file(int argc, char **argv)
{
    const char *file = NULL;
    for (int i = 0; i < argc; i++) {
        const char *a = argv[i], *eq = strchr(a, '=');
        size_t len = eq ? (size_t)(eq - a) : strlen(a);
        const struct setting *s = strncmp(a, "--", 2) == 0 ? find_setting(a, len) : NULL;
        if (!s || s->offset != F(deepspeed_config)) continue;
        if (eq)
            file = eq + 1;
        else if (i + 1 < argc && strncmp(argv[i + 1], "--", 2) != 0)
            file = argv[++i];
    }
    return file;
}

static int parse_flags(struct loom_config *cfg, int argc, char **argv)
{
    int rc;
    /* a path list flag takes every value up to the next flag */
    for (int i = 0; i < argc; i++) {
        const char *a = argv[i];
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
        /* a repeated path flag adds to the list; the first one replaces the default or the JSON's */
        if (s->type == T_PATHS && origins[idx] != O_FLAG) loom_setting_clear_paths(cfg, s);
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
    return LOOM_OK;
}

int loom_config_parse(struct loom_config *cfg, int argc, char **argv, int *help)
{
    memset(cfg, 0, sizeof *cfg);
    memset(origins, O_DEFAULT, sizeof origins);
    memset(json_path, 0, sizeof json_path);
    memset(json_had, 0, sizeof json_had);
    nwarnings = nwarnings_dropped = 0;
    *help = 0;
    int rc;
    for (int i = 0; i < NSETTINGS; i++)
        if (settings[i].def && (rc = set_value(cfg, &settings[i], settings[i].def))) return rc;
    for (int i = 0; i < argc; i++)
        if (strcmp(argv[i], "--help") == 0 || strcmp(argv[i], "-h") == 0) {
            *help = 1;
            return LOOM_OK;
        }
    /* the JSON file first, then every flag over it */
    const char *file = find_json_file(argc, argv);
    if (file && (rc = loom_config_read_json(cfg, file))) return rc;
    static char from_json[NSETTINGS][128];
    for (int i = 0; i < NSETTINGS; i++)
        if (origins[i] == O_JSON) loom_setting_format(from_json[i], sizeof from_json[i], cfg, &settings[i]);
    if ((rc = parse_flags(cfg, argc, argv))) return rc;
    for (int i = 0; i < NSETTINGS; i++) {
        if (origins[i] != O_FLAG || !json_path[i]) continue;
        char now[128];
        loom_setting_format(now, sizeof now, cfg, &settings[i]);
        if (strcmp(now, from_json[i]) == 0) continue;
        snprintf(json_had[i], sizeof json_had[i], "%s", from_json[i]);
        loom_config_warn("%s %s overrides %s %s from %s", settings[i].flag, now, json_path[i], from_json[i],
                         file);
    }
    const struct preset *p = find_preset(cfg->model);
    if (!p)
        return loom_error_set(LOOM_ERR_INPUT,
                              "%s: unknown preset '%s' (gpt2-tiny, gpt2, gpt2-medium, gpt2-large, gpt2-xl)",
                              name_of(F(model)), cfg->model);
    apply_preset(cfg, p);
    /* presets that follow from other settings */
    if (origin_of(F(micro_batch_size)) == O_DEFAULT && origin_of(F(global_batch_size)) == O_DEFAULT &&
        origin_of(F(gradient_accumulation_steps)) == O_DEFAULT) {
        cfg->micro_batch_size = p->micro;
        set_origin(F(micro_batch_size), O_PRESET);
    }
    if (origin_of(F(max_position_embeddings)) == O_PRESET && cfg->seq_length > cfg->max_position_embeddings &&
        given(F(seq_length)))
        cfg->max_position_embeddings = cfg->seq_length;
    return LOOM_OK;
}

static int is_deepspeed_schedule(int style)
{
    return style == LOOM_LR_WARMUP_LR || style == LOOM_LR_WARMUP_DECAY_LR ||
           style == LOOM_LR_WARMUP_COSINE_LR;
}

/* global = micro x accumulation x dp: two given, the third derived */
static int resolve_batch(struct loom_config *cfg, int dp)
{
    int *mb = &cfg->micro_batch_size, *gb = &cfg->global_batch_size, *ga = &cfg->gradient_accumulation_steps;
    const char *n_mb = name_of(F(micro_batch_size)), *n_gb = name_of(F(global_batch_size)),
               *n_ga = name_of(F(gradient_accumulation_steps));
    if (*mb == 0) {
        if (*gb && *ga) {
            if (*gb % (*ga * dp))
                return loom_error_set(LOOM_ERR_INPUT,
                                      "%s %d is not divisible by %s %d x data-parallel size %d", n_gb, *gb,
                                      n_ga, *ga, dp);
            *mb = *gb / (*ga * dp);
        } else if (*gb) {
            *ga = 1;
            set_origin(F(gradient_accumulation_steps), O_DERIVED);
            if (*gb % dp)
                return loom_error_set(LOOM_ERR_INPUT, "%s %d is not divisible by data-parallel size %d", n_gb,
                                      *gb, dp);
            *mb = *gb / dp;
        } else {
            *mb = 1;
        }
        set_origin(F(micro_batch_size), O_DERIVED);
    }
    if (*ga == 0) {
        if (*gb == 0)
            *ga = 1;
        else if (*gb % (*mb * dp))
            return loom_error_set(LOOM_ERR_INPUT, "%s %d is not divisible by %s %d x data-parallel size %d",
                                  n_gb, *gb, n_mb, *mb, dp);
        else
            *ga = *gb / (*mb * dp);
        set_origin(F(gradient_accumulation_steps), O_DERIVED);
    }
    if (*gb == 0) {
        *gb = *mb * *ga * dp;
        set_origin(F(global_batch_size), O_DERIVED);
    }
    if ((long long)*mb * *ga * dp != *gb)
        return loom_error_set(LOOM_ERR_INPUT,
                              "batch sizes disagree: %s %d != %s %d x %s %d x data-parallel size %d", n_gb,
                              *gb, n_mb, *mb, n_ga, *ga, dp);
    return LOOM_OK;
}

static int resolve_schedule(struct loom_config *cfg)
{
    const int ds = is_deepspeed_schedule(cfg->lr_decay_style);
    if (cfg->lr_decay_iters == 0) {
        cfg->lr_decay_iters = cfg->train_iters;
        set_origin(F(lr_decay_iters), O_DERIVED);
    }
    if (cfg->lr_warmup_iters > cfg->lr_decay_iters && !given(F(lr_warmup_iters))) {
        cfg->lr_warmup_iters = cfg->lr_decay_iters / 10; /* a preset's warmup scales to a short run */
        set_origin(F(lr_warmup_iters), O_DERIVED);
    }
    /* WarmupLR never decays: a warmup longer than the run is legal there */
    if (cfg->lr_decay_style != LOOM_LR_WARMUP_LR && cfg->lr_warmup_iters > cfg->lr_decay_iters)
        return loom_error_set(LOOM_ERR_INPUT, "%s %d exceeds %s %d", name_of(F(lr_warmup_iters)),
                              cfg->lr_warmup_iters, name_of(F(lr_decay_iters)), cfg->lr_decay_iters);
    if (cfg->lr_decay_style == LOOM_LR_WARMUP_COSINE_LR) {
        int warmup = cfg->lr_warmup_iters > 2 ? cfg->lr_warmup_iters : 2;
        if (cfg->lr_decay_iters <= warmup)
            return loom_error_set(LOOM_ERR_INPUT, "WarmupCosineLR needs %s %d > %s %d (at least 2)",
                                  name_of(F(lr_decay_iters)), cfg->lr_decay_iters,
                                  name_of(F(lr_warmup_iters)), warmup);
        if (cfg->train_iters > cfg->lr_decay_iters)
            loom_log_warn("WarmupCosineLR: %s %d < %s %d: past it the cosine rises again, as in DeepSpeed",
                          name_of(F(lr_decay_iters)), cfg->lr_decay_iters, name_of(F(train_iters)),
                          cfg->train_iters);
    }
    if (ds && !given(F(lr_warmup_style))) {
        cfg->lr_warmup_style = LOOM_LR_WARMUP_LOG; /* DeepSpeed's default */
        set_origin(F(lr_warmup_style), O_DERIVED);
    }
    if (!ds && cfg->lr_warmup_style != LOOM_LR_WARMUP_LINEAR)
        return loom_error_set(LOOM_ERR_INPUT,
                              "%s %s is for DeepSpeed's schedulers (WarmupLR, WarmupDecayLR, "
                              "WarmupCosineLR); %s %s warms up linearly",
                              name_of(F(lr_warmup_style)), warmup_styles[cfg->lr_warmup_style],
                              name_of(F(lr_decay_style)), decay_styles[cfg->lr_decay_style]);
    if (cfg->min_lr > cfg->lr)
        return loom_error_set(LOOM_ERR_INPUT, "%s %g exceeds %s %g", name_of(F(min_lr)), cfg->min_lr,
                              name_of(F(lr)), cfg->lr);
    return LOOM_OK;
}

/* Megatron's rules (its arguments.py and TransformerConfig): full needs a
 * method and a layer count of at most the layers, selective takes neither.
 * Megatron ignores a method or count without a granularity; that is an
 * error here. */
static int resolve_recompute(struct loom_config *cfg)
{
    int *g = &cfg->recompute_granularity, *method = &cfg->recompute_method, n = cfg->recompute_num_layers;
    const char *n_g = name_of(F(recompute_granularity)), *n_m = name_of(F(recompute_method)),
               *n_n = name_of(F(recompute_num_layers)), *n_l = name_of(F(num_layers));
    if (cfg->recompute_activations) {
        if (given(F(recompute_granularity)) && *g != LOOM_RECOMPUTE_SELECTIVE)
            return loom_error_set(LOOM_ERR_INPUT,
                                  "%s means --recompute-granularity selective, but %s %s is given",
                                  name_of(F(recompute_activations)), n_g, recompute_granularities[*g]);
        *g = LOOM_RECOMPUTE_SELECTIVE;
        if (!given(F(recompute_granularity))) set_origin(F(recompute_granularity), O_DERIVED);
    }
    /* DeepSpeed's number_checkpoints alone: that many layers, each keeping its input */
    if (origin_of(F(recompute_num_layers)) == O_JSON && n > 0 && !given(F(recompute_granularity)) &&
        !cfg->recompute_activations && !given(F(recompute_method))) {
        *g = LOOM_RECOMPUTE_FULL;
        *method = LOOM_RECOMPUTE_BLOCK;
        set_origin(F(recompute_granularity), O_DERIVED);
        set_origin(F(recompute_method), O_DERIVED);
    }
    if (*g != LOOM_RECOMPUTE_FULL) {
        if (*method != LOOM_RECOMPUTE_METHOD_NONE)
            return loom_error_set(LOOM_ERR_INPUT, "%s %s needs --recompute-granularity full (it is %s)", n_m,
                                  recompute_methods[*method], recompute_granularities[*g]);
        if (n)
            return loom_error_set(LOOM_ERR_INPUT, "%s %d needs --recompute-granularity full (it is %s)", n_n,
                                  n, recompute_granularities[*g]);
        return LOOM_OK;
    }
    if (*method == LOOM_RECOMPUTE_METHOD_NONE)
        return loom_error_set(LOOM_ERR_INPUT, "%s full needs --recompute-method uniform or block", n_g);
    if (n == 0)
        return loom_error_set(LOOM_ERR_INPUT, "%s full needs --recompute-num-layers N (1 to %s %d)", n_g, n_l,
                              cfg->num_layers);
    if (n > cfg->num_layers)
        return loom_error_set(LOOM_ERR_INPUT, "%s %d exceeds %s %d", n_n, n, n_l, cfg->num_layers);
    return LOOM_OK;
}

int loom_config_resolve(struct loom_config *cfg, int dp)
{
    for (int i = 0; i < nwarnings; i++) loom_log_warn("%s", warnings[i]);
    if (nwarnings_dropped) loom_log_warn("and %d more warnings about the configuration", nwarnings_dropped);
    nwarnings = nwarnings_dropped = 0;
    int rc;
    if (cfg->fp16 && cfg->bf16)
        return loom_error_set(LOOM_ERR_INPUT, "%s and %s are both on: choose one", name_of(F(fp16)),
                              name_of(F(bf16)));
    if (cfg->grad_reduce_dtype && cfg->grad_reduce_dtype != (cfg->bf16 ? 1 : cfg->fp16 ? 2 : 0))
        return loom_error_set(LOOM_ERR_INPUT,
                              "%s %s: a 16-bit gradient reduction needs the same compute dtype (%s)",
                              name_of(F(grad_reduce_dtype)), reduce_dtypes[cfg->grad_reduce_dtype],
                              cfg->grad_reduce_dtype == 1 ? "--bf16" : "--fp16");
    if (cfg->fp16 && cfg->loss_scale == 0) {
        int e;
        if (frexp(cfg->initial_loss_scale, &e) != 0.5)
            return loom_error_set(LOOM_ERR_INPUT, "%s %g: the dynamic loss scale must start at a power of 2",
                                  name_of(F(initial_loss_scale)), cfg->initial_loss_scale);
    }
    if (cfg->optimizer == LOOM_OPTIMIZER_ADAM && !cfg->adam_w_mode && cfg->weight_decay > 0)
        return loom_error_set(LOOM_ERR_INPUT,
                              "%s false asks for Adam with L2-coupled weight decay, which loom does not "
                              "implement (it implements AdamW's decoupled decay); use %s adamw, or %s 0",
                              name_of(F(adam_w_mode)), name_of(F(optimizer)), name_of(F(weight_decay)));
    if ((rc = resolve_batch(cfg, dp))) return rc;
    if (cfg->fsdp_sharding_strategy) {
        static const int stage_of[] = {0, 3, 2, 0};
        int want = stage_of[cfg->fsdp_sharding_strategy];
        if (given(F(zero_stage)) && cfg->zero_stage != want)
            return loom_error_set(
                LOOM_ERR_INPUT, "--fsdp-sharding-strategy %s means --zero-stage %d, but %s %d is given",
                fsdp_strategies[cfg->fsdp_sharding_strategy], want, name_of(F(zero_stage)), cfg->zero_stage);
        cfg->zero_stage = want;
        set_origin(F(zero_stage), O_DERIVED);
    }
    if (cfg->offload_optimizer == 2 && !*cfg->nvme_path)
        return loom_error_set(LOOM_ERR_INPUT, "%s nvme needs %s DIR", name_of(F(offload_optimizer)),
                              name_of(F(nvme_path)));
    if ((rc = resolve_schedule(cfg))) return rc;
    if (cfg->seq_length > cfg->max_position_embeddings)
        return loom_error_set(LOOM_ERR_INPUT, "%s %d exceeds %s %d", name_of(F(seq_length)), cfg->seq_length,
                              name_of(F(max_position_embeddings)), cfg->max_position_embeddings);
    if (cfg->hidden_size % cfg->num_attention_heads)
        return loom_error_set(LOOM_ERR_INPUT, "%s %d is not divisible by %s %d", name_of(F(hidden_size)),
                              cfg->hidden_size, name_of(F(num_attention_heads)), cfg->num_attention_heads);
    if ((rc = resolve_recompute(cfg))) return rc;
    if (cfg->eval_interval == 0) cfg->eval_interval = cfg->train_iters;
    return LOOM_OK;
}

void loom_setting_format(char *buf, size_t n, const struct loom_config *cfg, const struct setting *s)
{
    const char *p = (const char *)cfg + s->offset;
    switch (s->type) {
    case T_INT:
        snprintf(buf, n, "%d", *(const int *)p);
        break;
    case T_INT64:
        snprintf(buf, n, "%lld", (long long)*(const int64_t *)p);
        break;
    case T_DOUBLE:
        snprintf(buf, n, "%.15g", *(const double *)p);
        break;
    case T_STRING:
        snprintf(buf, n, "%s", *p ? p : "-");
        break;
    case T_ENUM:
        snprintf(buf, n, "%s", s->choices[*(const int *)p]);
        break;
    case T_BOOL:
        snprintf(buf, n, "%s", *(const int *)p ? "true" : "false");
        break;
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
    default:
        LOOM_ASSERT(0);
    }
}

/* A setting's default as the table prints values. */
static void format_default(char *buf, size_t n, const struct setting *s)
{
    if (!s->def) {
        snprintf(buf, n, "%s", s->type == T_PATHS ? "none" : "set by --model");
        return;
    }
    if (s->type == T_STRING) {
        snprintf(buf, n, "%s", *s->def ? s->def : "none");
        return;
    }
    struct loom_config scratch;
    memset(&scratch, 0, sizeof scratch);
    LOOM_ASSERT(set_value(&scratch, s, s->def) == LOOM_OK);
    loom_setting_format(buf, n, &scratch, s);
}

void loom_config_print_help(FILE *f, const char *command)
{
    fprintf(f,
            "usage: loom %s [flags]\n"
            "Precedence: defaults < --model preset < --deepspeed-config FILE < flags. Each flag's\n"
            "DeepSpeed JSON key follows it (json: PATH; \"auto\" in the file means not given).\n",
            command);
    const char *group = "";
    for (int i = 0; i < NSETTINGS; i++) {
        const struct setting *s = &settings[i];
        if (strcmp(group, s->group) != 0) fprintf(f, "\n%s:\n", group = s->group);
        char arg[96], def[64];
        snprintf(arg, sizeof arg, "%s %s", s->flag,
                 s->type == T_INT || s->type == T_INT64 ? "N"
                 : s->type == T_DOUBLE                  ? "X"
                 : s->type == T_PATHS                   ? "PATH..."
                 : s->type == T_ENUM                    ? "CHOICE"
                 : s->type == T_BOOL                    ? ""
                                                        : "VALUE");
        format_default(def, sizeof def, s);
        fprintf(f, "  %-36s %s\n  %-36s [default: %s]", arg, s->help, "", def);
        if (s->json)
            fprintf(f, "  json: %s%s%s", s->json, s->json_alt ? ", " : "", s->json_alt ? s->json_alt : "");
        fputc('\n', f);
    }
}

void loom_config_print(FILE *f, const struct loom_config *cfg)
{
    fprintf(f, "configuration:\n");
    for (int i = 0; i < NSETTINGS; i++) {
        char v[1024], origin[sizeof json_had[0] + 32];
        loom_setting_format(v, sizeof v, cfg, &settings[i]);
        if (origins[i] == O_FLAG && json_had[i][0])
            snprintf(origin, sizeof origin, "flag (json had %.*s)", (int)sizeof json_had[i] - 1, json_had[i]);
        else
            snprintf(origin, sizeof origin, "%s", origin_names[origins[i]]);
        fprintf(f, "  %-30s %-24s (%s)\n", settings[i].flag + 2, v, origin);
    }
}

void loom_config_free(struct loom_config *cfg)
{
    for (int i = 0; i < cfg->ndata_paths; i++) free(cfg->data_paths[i]);
    for (int i = 0; i < cfg->nvalid_paths; i++) free(cfg->valid_data_paths[i]);
    cfg->ndata_paths = cfg->nvalid_paths = 0;
}

int loom_config_count(void)
{
    return NSETTINGS;
}

uint64_t loom_config_hash(const struct loom_config *cfg, int i, const char **flag)
{
    LOOM_ASSERT(i >= 0 && i < NSETTINGS);
    char v[4096];
    loom_setting_format(v, sizeof v, cfg, &settings[i]);
    uint64_t h = 1469598103934665603ull; /* FNV-1a */
    for (const char *c = v; *c; c++) h = (h ^ (unsigned char)*c) * 1099511628211ull;
    if (flag) *flag = settings[i].flag;
    return h;
}
