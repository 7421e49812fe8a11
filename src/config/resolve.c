/*
 * Resolving a parsed configuration once the data-parallel size is known:
 * the batch invariant (global = micro x accumulation x dp, any two give the
 * third), the learning-rate schedule's derived steps, Megatron's
 * recomputation rules, and the invariants between settings, each checked
 * with every number in the message. Derived values get the origin
 * "derived". Not here: parsing (parse.c), the checks a model family makes
 * of its shape (model/family.h), the parallelism kinds' settings (each
 * kind's resolve, parallel/kinds.h, after these: loom_kinds_resolve).
 */
#include <assert.h>
#include <limits.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "base/dtype.h"
#include "base/log.h"
#include "config/config.h"
#include "config/config_impl.h"
#include "optim/batch_rampup.h"

static_assert(LOOM_REDUCE_FP32 == (int)LOOM_DTYPE_F32 && LOOM_REDUCE_BF16 == (int)LOOM_DTYPE_BF16 &&
                  LOOM_REDUCE_FP16 == (int)LOOM_DTYPE_F16,
              "enum loom_reduce_dtype takes enum loom_dtype's values");

#define F(field) offsetof(struct loom_config, field)

/* A row's choice name, its origin, and how messages name it. */
static const char *choice(size_t offset, int value)
{
    return loom_settings[loom_setting_index(offset)].choices[value];
}
static int origin_of(const struct loom_config *cfg, size_t offset)
{
    return cfg->rec.origin[loom_setting_index(offset)];
}
static void set_derived(struct loom_config *cfg, size_t offset)
{
    cfg->rec.origin[loom_setting_index(offset)] = LOOM_ORIGIN_DERIVED;
}
/* Given by the user, in the JSON file or as a flag. */
static int given(const struct loom_config *cfg, size_t offset)
{
    return origin_of(cfg, offset) == LOOM_ORIGIN_JSON || origin_of(cfg, offset) == LOOM_ORIGIN_FLAG;
}
#define NAME(field) loom_setting_name(cfg, loom_setting_index(F(field)))

const char *loom_config_name_of(const struct loom_config *cfg, size_t offset)
{
    return loom_setting_name(cfg, loom_setting_index(offset));
}
int loom_config_given_at(const struct loom_config *cfg, size_t offset)
{
    return given(cfg, offset);
}
void loom_config_set_derived(struct loom_config *cfg, size_t offset)
{
    set_derived(cfg, offset);
}
const char *loom_config_choice_of(size_t offset, int value)
{
    return choice(offset, value);
}

static int is_deepspeed_schedule(enum loom_lr_decay_style style)
{
    return style == LOOM_LR_WARMUP_LR || style == LOOM_LR_WARMUP_DECAY_LR ||
           style == LOOM_LR_WARMUP_COSINE_LR;
}

/* global = micro x accumulation x dp: two given, the third derived */
static int resolve_batch(struct loom_config *cfg, int dp)
{
    int *mb = &cfg->micro_batch_size, *gb = &cfg->global_batch_size, *ga = &cfg->gradient_accumulation_steps;
    const char *n_mb = NAME(micro_batch_size), *n_gb = NAME(global_batch_size),
               *n_ga = NAME(gradient_accumulation_steps);
    if (*mb == 0) {
        if (*gb && *ga) {
            if (*gb % (*ga * dp))
                return loom_error_set(LOOM_ERR_INPUT,
                                      "%s %d is not divisible by %s %d x data-parallel size %d", n_gb, *gb,
                                      n_ga, *ga, dp);
            *mb = *gb / (*ga * dp);
        } else if (*gb) {
            *ga = 1;
            set_derived(cfg, F(gradient_accumulation_steps));
            if (*gb % dp)
                return loom_error_set(LOOM_ERR_INPUT, "%s %d is not divisible by data-parallel size %d", n_gb,
                                      *gb, dp);
            *mb = *gb / dp;
        } else {
            *mb = 1;
        }
        set_derived(cfg, F(micro_batch_size));
    }
    if (*ga == 0) {
        if (*gb == 0)
            *ga = 1;
        else if (*gb % (*mb * dp))
            return loom_error_set(LOOM_ERR_INPUT, "%s %d is not divisible by %s %d x data-parallel size %d",
                                  n_gb, *gb, n_mb, *mb, dp);
        else
            *ga = *gb / (*mb * dp);
        set_derived(cfg, F(gradient_accumulation_steps));
    }
    if (*gb == 0) {
        *gb = *mb * *ga * dp;
        set_derived(cfg, F(global_batch_size));
    }
    if ((long long)*mb * *ga * dp != *gb)
        return loom_error_set(LOOM_ERR_INPUT,
                              "batch sizes disagree: %s %d != %s %d x %s %d x data-parallel size %d", n_gb,
                              *gb, n_mb, *mb, n_ga, *ga, dp);
    return LOOM_OK;
}

/* --rampup-batch-size START INCREMENT SAMPLES read and held to Megatron's
 * rules: a samples-based run, the increments reaching --global-batch-size,
 * every batch whole micro-batches on every data rank (and, interleaved,
 * a multiple of the stages of micro-batches); not with the orders and sums
 * that assume one batch size (sequential blocks, --layout-invariant's
 * tree). */
static int resolve_rampup(struct loom_config *cfg, int dp)
{
    if (!cfg->nrampup_batch_size) return LOOM_OK;
    const char *name = NAME(rampup_batch_size);
    int64_t v[3];
    for (int i = 0; i < 3 && i < cfg->nrampup_batch_size; i++) {
        char *end;
        const long long x = strtoll(cfg->rampup_batch_size[i], &end, 10);
        if (end == cfg->rampup_batch_size[i] || *end || x < (i < 2 ? 1 : 0))
            return loom_error_set(LOOM_ERR_INPUT, "%s: '%s' is not a %s integer (START INCREMENT SAMPLES)",
                                  name, cfg->rampup_batch_size[i], i < 2 ? "positive" : "non-negative");
        v[i] = x;
    }
    if (cfg->nrampup_batch_size != 3)
        return loom_error_set(LOOM_ERR_INPUT, "%s takes 3 values, START INCREMENT SAMPLES; %d given", name,
                              cfg->nrampup_batch_size);
    const int G = cfg->global_batch_size, interleaved = cfg->num_layers_per_virtual_pipeline_stage > 0,
              pp = cfg->pipeline_model_parallel_size > 1 ? cfg->pipeline_model_parallel_size : 1;
    const int64_t unit = (int64_t)cfg->micro_batch_size * dp * (interleaved ? pp : 1);
    if (cfg->train_samples > INT_MAX || cfg->lr_decay_samples > INT_MAX || cfg->lr_warmup_samples > INT_MAX)
        return loom_error_set(LOOM_ERR_INPUT, "%s: the schedule counts samples below 2^31; %s %lld is more",
                              name, NAME(train_samples), (long long)cfg->train_samples);
    if (!cfg->train_samples || given(cfg, F(train_iters)))
        return loom_error_set(LOOM_ERR_INPUT,
                              "%s needs a samples-based run: give %s, not %s (Megatron's rule: a rampup "
                              "changes how many steps the samples take)",
                              name, NAME(train_samples), NAME(train_iters));
    if (given(cfg, F(lr_decay_iters)) || given(cfg, F(lr_warmup_iters)))
        return loom_error_set(
            LOOM_ERR_INPUT,
            "%s: the run is samples-based, so is its schedule: give %s and %s (or %s), not %s", name,
            NAME(lr_decay_samples), NAME(lr_warmup_samples), NAME(lr_warmup_fraction),
            given(cfg, F(lr_decay_iters)) ? NAME(lr_decay_iters) : NAME(lr_warmup_iters));
    if (v[0] > G || (G - v[0]) % v[1])
        return loom_error_set(LOOM_ERR_INPUT,
                              "%s %lld %lld %lld: from START %lld, steps of %lld must reach %s %d", name,
                              (long long)v[0], (long long)v[1], (long long)v[2], (long long)v[0],
                              (long long)v[1], NAME(global_batch_size), G);
    if (v[0] % unit || v[1] % unit)
        return loom_error_set(
            LOOM_ERR_INPUT,
            "%s %lld %lld %lld: every batch is whole micro-batches on every rank: START and "
            "INCREMENT must be multiples of %s %d x data-parallel size %d%s (%lld)",
            name, (long long)v[0], (long long)v[1], (long long)v[2], NAME(micro_batch_size),
            cfg->micro_batch_size, dp, interleaved ? " x the interleaved schedule's stages" : "",
            (long long)unit);
    if (cfg->data_order == LOOM_DATA_SEQUENTIAL)
        return loom_error_set(LOOM_ERR_INPUT,
                              "%s with %s sequential: that order reads blocks of one global batch; use %s "
                              "shuffled or Megatron's datasets",
                              name, NAME(data_order), NAME(data_order));
    if (cfg->layout_invariant)
        return loom_error_set(LOOM_ERR_INPUT,
                              "%s with %s: its micro-batch tree is of one batch size; drop one of them", name,
                              NAME(layout_invariant));
    cfg->rampup_start = v[0], cfg->rampup_increment = v[1], cfg->rampup_samples = v[2];
    return LOOM_OK;
}

/* Megatron's samples-based schedule onto steps of the global batch, rounded
 * down as Megatron's update_train_iters does (a step is the whole batch),
 * and its warmup fraction. */
static int resolve_samples(struct loom_config *cfg)
{
    static const struct {
        size_t samples, iters;
    } pairs[] = {{F(train_samples), F(train_iters)},
                 {F(lr_decay_samples), F(lr_decay_iters)},
                 {F(lr_warmup_samples), F(lr_warmup_iters)}};
    for (size_t k = 0; k < sizeof pairs / sizeof pairs[0]; k++) {
        const int64_t samples = *(const int64_t *)((const char *)cfg + pairs[k].samples);
        if (!samples) continue;
        if (given(cfg, pairs[k].iters))
            return loom_error_set(LOOM_ERR_INPUT, "%s and %s name the same length: give one",
                                  loom_config_name_of(cfg, pairs[k].samples),
                                  loom_config_name_of(cfg, pairs[k].iters));
        const int64_t G = cfg->global_batch_size,
                      n = k == 0 && loom_rampup_on(cfg) ? loom_rampup_iters(cfg) : samples / G;
        if (n > INT_MAX || (k == 0 && n < 1))
            return loom_error_set(LOOM_ERR_INPUT, "%s %lld: %s steps of %lld samples",
                                  loom_config_name_of(cfg, pairs[k].samples), (long long)samples,
                                  n < 1 ? "no" : "more than 2^31", (long long)G);
        *(int *)((char *)cfg + pairs[k].iters) = (int)n;
        set_derived(cfg, pairs[k].iters);
    }
    if (cfg->lr_warmup_fraction > 0) {
        if (given(cfg, F(lr_warmup_iters)) || cfg->lr_warmup_samples)
            return loom_error_set(LOOM_ERR_INPUT, "%s and %s name the same warmup: give one",
                                  NAME(lr_warmup_fraction),
                                  cfg->lr_warmup_samples ? NAME(lr_warmup_samples) : NAME(lr_warmup_iters));
        const int decay = cfg->lr_decay_iters ? cfg->lr_decay_iters : cfg->train_iters;
        cfg->lr_warmup_iters = (int)(cfg->lr_warmup_fraction * decay); /* as Megatron: truncated */
        set_derived(cfg, F(lr_warmup_iters));
    }
    return LOOM_OK;
}

static int resolve_schedule(struct loom_config *cfg)
{
    const int ds = is_deepspeed_schedule(cfg->lr_decay_style);
    if (cfg->lr_decay_iters == 0) {
        cfg->lr_decay_iters = cfg->train_iters;
        set_derived(cfg, F(lr_decay_iters));
    }
    const int warmup_asked =
        given(cfg, F(lr_warmup_iters)) || cfg->lr_warmup_samples || cfg->lr_warmup_fraction > 0;
    if (cfg->lr_warmup_iters > cfg->lr_decay_iters && !warmup_asked) {
        cfg->lr_warmup_iters = cfg->lr_decay_iters / 10; /* a preset's warmup scales to a short run */
        set_derived(cfg, F(lr_warmup_iters));
    }
    /* WarmupLR never decays: a warmup longer than the run is legal there */
    if (cfg->lr_decay_style != LOOM_LR_WARMUP_LR && cfg->lr_warmup_iters > cfg->lr_decay_iters)
        return loom_error_set(LOOM_ERR_INPUT, "%s %d exceeds %s %d", NAME(lr_warmup_iters),
                              cfg->lr_warmup_iters, NAME(lr_decay_iters), cfg->lr_decay_iters);
    if (cfg->lr_decay_style == LOOM_LR_WARMUP_COSINE_LR) {
        int warmup = cfg->lr_warmup_iters > 2 ? cfg->lr_warmup_iters : 2;
        if (cfg->lr_decay_iters <= warmup)
            return loom_error_set(LOOM_ERR_INPUT, "WarmupCosineLR needs %s %d > %s %d (at least 2)",
                                  NAME(lr_decay_iters), cfg->lr_decay_iters, NAME(lr_warmup_iters), warmup);
        if (cfg->train_iters > cfg->lr_decay_iters)
            loom_log_warn("WarmupCosineLR: %s %d < %s %d: past it the cosine rises again, as in DeepSpeed",
                          NAME(lr_decay_iters), cfg->lr_decay_iters, NAME(train_iters), cfg->train_iters);
    }
    if (ds && !given(cfg, F(lr_warmup_style))) {
        cfg->lr_warmup_style = LOOM_LR_WARMUP_LOG; /* DeepSpeed's default */
        set_derived(cfg, F(lr_warmup_style));
    }
    if (!ds && cfg->lr_warmup_style != LOOM_LR_WARMUP_LINEAR)
        return loom_error_set(LOOM_ERR_INPUT,
                              "%s %s is for DeepSpeed's schedulers (WarmupLR, WarmupDecayLR, "
                              "WarmupCosineLR); %s %s warms up linearly",
                              NAME(lr_warmup_style), choice(F(lr_warmup_style), cfg->lr_warmup_style),
                              NAME(lr_decay_style), choice(F(lr_decay_style), cfg->lr_decay_style));
    if (cfg->min_lr > cfg->lr)
        return loom_error_set(LOOM_ERR_INPUT, "%s %g exceeds %s %g", NAME(min_lr), cfg->min_lr, NAME(lr),
                              cfg->lr);
    return LOOM_OK;
}

/* Megatron's rules (its arguments.py and TransformerConfig): full needs a
 * method and a layer count of at most the layers, selective takes neither.
 * Megatron ignores a method or count without a granularity; that is an
 * error here. */
static int resolve_recompute(struct loom_config *cfg)
{
    enum loom_recompute *g = &cfg->recompute_granularity;
    enum loom_recompute_method *method = &cfg->recompute_method;
    const int n = cfg->recompute_num_layers;
    const char *n_g = NAME(recompute_granularity), *n_m = NAME(recompute_method),
               *n_n = NAME(recompute_num_layers), *n_l = NAME(num_layers);
    if (cfg->recompute_activations) {
        if (given(cfg, F(recompute_granularity)) && *g != LOOM_RECOMPUTE_SELECTIVE)
            return loom_error_set(LOOM_ERR_INPUT,
                                  "%s means --recompute-granularity selective, but %s %s is given",
                                  NAME(recompute_activations), n_g, choice(F(recompute_granularity), *g));
        *g = LOOM_RECOMPUTE_SELECTIVE;
        if (!given(cfg, F(recompute_granularity))) set_derived(cfg, F(recompute_granularity));
    }
    /* DeepSpeed's number_checkpoints alone: that many layers, each keeping its input */
    if (origin_of(cfg, F(recompute_num_layers)) == LOOM_ORIGIN_JSON && n > 0 &&
        !given(cfg, F(recompute_granularity)) && !cfg->recompute_activations &&
        !given(cfg, F(recompute_method))) {
        *g = LOOM_RECOMPUTE_FULL;
        *method = LOOM_RECOMPUTE_BLOCK;
        set_derived(cfg, F(recompute_granularity));
        set_derived(cfg, F(recompute_method));
    }
    if (*g != LOOM_RECOMPUTE_FULL) {
        if (*method != LOOM_RECOMPUTE_METHOD_NONE)
            return loom_error_set(LOOM_ERR_INPUT, "%s %s needs --recompute-granularity full (it is %s)", n_m,
                                  choice(F(recompute_method), *method), choice(F(recompute_granularity), *g));
        if (n)
            return loom_error_set(LOOM_ERR_INPUT, "%s %d needs --recompute-granularity full (it is %s)", n_n,
                                  n, choice(F(recompute_granularity), *g));
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

/* Attention: one sparsity, causal. */
/* Dropout's p are below 1 (1 would scale by infinity); the embedding's
 * unset takes the hidden's, as Megatron's embedding dropout is its hidden
 * dropout. */
static int resolve_dropout(struct loom_config *cfg)
{
    const size_t ps[] = {F(hidden_dropout), F(attention_dropout), F(embedding_dropout)};
    for (size_t i = 0; i < sizeof ps / sizeof ps[0]; i++) {
        const double p = *(const double *)((const char *)cfg + ps[i]);
        if (p >= 1 || (p < 0 && given(cfg, ps[i])))
            return loom_error_set(LOOM_ERR_INPUT, "%s %g: dropout's p must be at least 0 and below 1",
                                  loom_config_name_of(cfg, ps[i]), p);
    }
    if (cfg->embedding_dropout < 0) {
        cfg->embedding_dropout = cfg->hidden_dropout;
        set_derived(cfg, F(embedding_dropout));
    }
    return LOOM_OK;
}

static int resolve_attention(struct loom_config *cfg)
{
    if (cfg->attention_window && cfg->sparse_mode != LOOM_SPARSE_ATTN_NONE)
        return loom_error_set(LOOM_ERR_INPUT,
                              "%s %d and %s %s: a sliding window is a sparsity mode of its own; "
                              "choose one",
                              NAME(attention_window), cfg->attention_window, NAME(sparse_mode),
                              choice(F(sparse_mode), cfg->sparse_mode));
    if (cfg->reset_attention_mask && (cfg->attention_backend == LOOM_ATTN_BACKEND_UNFUSED ||
                                      cfg->attention_backend == LOOM_ATTN_BACKEND_LOCAL))
        return loom_error_set(LOOM_ERR_INPUT,
                              "%s needs the fused attention (documents are its variable-length segments); "
                              "%s %s has none",
                              NAME(reset_attention_mask), NAME(attention_backend),
                              choice(F(attention_backend), cfg->attention_backend));
    if (cfg->use_flash_attn && (cfg->attention_backend == LOOM_ATTN_BACKEND_UNFUSED ||
                                cfg->attention_backend == LOOM_ATTN_BACKEND_LOCAL))
        return loom_error_set(LOOM_ERR_INPUT, "%s and %s %s: the flash kernel or the unfused one; choose one",
                              NAME(use_flash_attn), NAME(attention_backend),
                              choice(F(attention_backend), cfg->attention_backend));
    if (cfg->attention_dropout > 0 && !cfg->evaluating &&
        (cfg->attention_backend == LOOM_ATTN_BACKEND_UNFUSED ||
         cfg->attention_backend == LOOM_ATTN_BACKEND_LOCAL))
        return loom_error_set(LOOM_ERR_INPUT,
                              "%s %g runs inside the fused attention kernel; %s %s has no dropout: drop "
                              "one",
                              NAME(attention_dropout), cfg->attention_dropout, NAME(attention_backend),
                              choice(F(attention_backend), cfg->attention_backend));
    if (cfg->sparse_mode != LOOM_SPARSE_ATTN_NONE && cfg->sparse_attention == LOOM_ATTN_BIDIRECTIONAL)
        return loom_error_set(LOOM_ERR_INPUT,
                              "%s bidirectional: loom's models are causal language models "
                              "(unidirectional)",
                              NAME(sparse_attention));
    return LOOM_OK;
}

/* Mixed precision: one compute dtype, a gradient reduction in fp32 or in it. */
static int resolve_precision(struct loom_config *cfg)
{
    if (cfg->fp16 && cfg->bf16)
        return loom_error_set(LOOM_ERR_INPUT, "%s and %s are both on: choose one", NAME(fp16), NAME(bf16));
    const enum loom_reduce_dtype compute = cfg->bf16   ? LOOM_REDUCE_BF16
                                           : cfg->fp16 ? LOOM_REDUCE_FP16
                                                       : LOOM_REDUCE_FP32;
    if (cfg->grad_reduce_dtype != LOOM_REDUCE_FP32 && cfg->grad_reduce_dtype != compute)
        return loom_error_set(LOOM_ERR_INPUT,
                              "%s %s: a 16-bit gradient reduction needs the same compute dtype (%s)",
                              NAME(grad_reduce_dtype), choice(F(grad_reduce_dtype), cfg->grad_reduce_dtype),
                              cfg->grad_reduce_dtype == LOOM_REDUCE_BF16 ? "--bf16" : "--fp16");
    if (cfg->fp8_format != LOOM_FP8_OFF && !cfg->bf16)
        return loom_error_set(LOOM_ERR_INPUT,
                              "%s %s needs %s: the fp8 products quantise bf16 parameters and activations",
                              NAME(fp8_format), choice(F(fp8_format), cfg->fp8_format), NAME(bf16));
    if (cfg->fp16 && cfg->loss_scale == 0) {
        int e;
        if (frexp(cfg->initial_loss_scale, &e) != 0.5)
            return loom_error_set(LOOM_ERR_INPUT, "%s %g: the dynamic loss scale must start at a power of 2",
                                  NAME(initial_loss_scale), cfg->initial_loss_scale);
    }
    return LOOM_OK;
}

/* --trace-steps A:B, 1 <= A <= B; empty: 0 0 (the run's first ten). */
static int resolve_trace(struct loom_config *cfg)
{
    cfg->trace_first = cfg->trace_last = 0;
    if (!*cfg->trace_steps) return LOOM_OK;
    int a, b, end = 0;
    if (sscanf(cfg->trace_steps, "%d:%d%n", &a, &b, &end) != 2 || cfg->trace_steps[end] || a < 1 || b < a)
        return loom_error_set(LOOM_ERR_INPUT, "%s %s: expected A:B with 1 <= A <= B (steps, inclusive)",
                              NAME(trace_steps), cfg->trace_steps);
    if (!*cfg->trace)
        return loom_error_set(LOOM_ERR_INPUT, "%s needs %s FILE", NAME(trace_steps), NAME(trace));
    cfg->trace_first = a;
    cfg->trace_last = b;
    return LOOM_OK;
}

/* Megatron's tokenizer flags onto --tokenizer (and the merges file). */
static int resolve_tokenizer(struct loom_config *cfg)
{
    const char *type = cfg->tokenizer_type;
    /* HuggingFaceTokenizer and the SentencePiece names all take --tokenizer-model: a
     * tokenizer.json, a tokenizer.model, or a directory (tokenizer/tokenizer.h) */
    const int gpt2 = strcmp(type, "GPT2BPETokenizer") == 0,
              hf = strcmp(type, "HuggingFaceTokenizer") == 0 || strcmp(type, "Llama2Tokenizer") == 0 ||
                   strcmp(type, "SentencePieceTokenizer") == 0 ||
                   strcmp(type, "GPTSentencePieceTokenizer") == 0;
    if (!*type && *cfg->vocab_file && *cfg->merge_file) { /* Megatron takes GPT-2's two files so */
        snprintf(cfg->tokenizer_type, sizeof cfg->tokenizer_type, "GPT2BPETokenizer");
        loom_config_set_derived(cfg, F(tokenizer_type));
        return resolve_tokenizer(cfg);
    }
    if (!*type) {
        if (*cfg->vocab_file || *cfg->merge_file || *cfg->tokenizer_model)
            return loom_error_set(LOOM_ERR_INPUT, "%s needs %s (GPT2BPETokenizer or HuggingFaceTokenizer)",
                                  *cfg->tokenizer_model ? NAME(tokenizer_model)
                                  : *cfg->vocab_file    ? NAME(vocab_file)
                                                        : NAME(merge_file),
                                  NAME(tokenizer_type));
        return LOOM_OK;
    }
    if (strcmp(type, "NullTokenizer") == 0) return LOOM_OK; /* ids as they are: no tokenizer */
    if (!gpt2 && !hf)
        return loom_error_set(
            LOOM_ERR_INPUT,
            "%s %s: expected GPT2BPETokenizer, HuggingFaceTokenizer, Llama2Tokenizer, "
            "SentencePieceTokenizer, GPTSentencePieceTokenizer or NullTokenizer (of Megatron's "
            "names, those loom reads)",
            NAME(tokenizer_type), type);
    if (*cfg->tokenizer)
        return loom_error_set(LOOM_ERR_INPUT, "%s and %s name the tokenizer twice: give one", NAME(tokenizer),
                              NAME(tokenizer_type));
    if (gpt2 && (!*cfg->vocab_file || !*cfg->merge_file))
        return loom_error_set(LOOM_ERR_INPUT, "%s GPT2BPETokenizer needs %s and %s", NAME(tokenizer_type),
                              NAME(vocab_file), NAME(merge_file));
    if (hf && !*cfg->tokenizer_model)
        return loom_error_set(LOOM_ERR_INPUT,
                              "%s %s needs %s (a tokenizer.json, a tokenizer.model or a directory "
                              "holding one; models are not downloaded)",
                              NAME(tokenizer_type), type, NAME(tokenizer_model));
    snprintf(cfg->tokenizer, sizeof cfg->tokenizer, "%s", gpt2 ? cfg->vocab_file : cfg->tokenizer_model);
    if (!gpt2) cfg->merge_file[0] = 0;
    return LOOM_OK;
}

int loom_config_resolve(struct loom_config *cfg, int dp)
{
    struct loom_config_record *r = &cfg->rec;
    for (int i = 0; i < r->nwarnings; i++) loom_log_warn("%s", r->warnings[i]);
    if (r->nwarnings_dropped)
        loom_log_warn("and %d more warnings about the configuration", r->nwarnings_dropped);
    r->nwarnings = r->nwarnings_dropped = 0;
    int rc;
    if ((rc = resolve_precision(cfg))) return rc;
    if ((rc = resolve_dropout(cfg))) return rc;
    if ((rc = resolve_attention(cfg))) return rc;
    if ((rc = resolve_tokenizer(cfg))) return rc;
    if (cfg->optimizer == LOOM_OPTIMIZER_ADAM && !cfg->adam_w_mode && cfg->weight_decay > 0)
        return loom_error_set(LOOM_ERR_INPUT,
                              "%s false asks for Adam with L2-coupled weight decay, which loom does not "
                              "implement (it implements AdamW's decoupled decay); use %s adamw, or %s 0",
                              NAME(adam_w_mode), NAME(optimizer), NAME(weight_decay));
    if ((rc = resolve_batch(cfg, dp))) return rc;
    if (cfg->offload_optimizer == LOOM_OFFLOAD_NVME && !*cfg->nvme_path)
        return loom_error_set(LOOM_ERR_INPUT, "%s nvme needs %s DIR", NAME(offload_optimizer),
                              NAME(nvme_path));
    if (cfg->offload_auto) { /* without --nvme-path: in memory when it fits (app/placement.c says otherwise)
                              */
        if (cfg->offload_optimizer == LOOM_OFFLOAD_NVME || cfg->offload_param == LOOM_OFFLOAD_NVME)
            return loom_error_set(LOOM_ERR_INPUT,
                                  "%s auto decides %s and %s itself: give them or it, not both",
                                  NAME(offload_auto), NAME(offload_optimizer), NAME(offload_param));
    }
    if ((rc = resolve_rampup(cfg, dp))) return rc;
    if ((rc = resolve_samples(cfg))) return rc;
    if ((rc = resolve_schedule(cfg))) return rc;
    if (cfg->seq_length > cfg->max_position_embeddings)
        return loom_error_set(LOOM_ERR_INPUT, "%s %d exceeds %s %d", NAME(seq_length), cfg->seq_length,
                              NAME(max_position_embeddings), cfg->max_position_embeddings);
    if (cfg->hidden_size % cfg->num_attention_heads)
        return loom_error_set(LOOM_ERR_INPUT, "%s %d is not divisible by %s %d", NAME(hidden_size),
                              cfg->hidden_size, NAME(num_attention_heads), cfg->num_attention_heads);
    if ((rc = resolve_recompute(cfg))) return rc;
    if ((rc = resolve_trace(cfg))) return rc;
    if (cfg->eval_interval == 0) cfg->eval_interval = cfg->train_iters;
    return LOOM_OK;
}
