/*
 * Llama as a model family (model/family.h): its presets (a tiny one for the
 * built-in corpus and the published shapes of TinyLlama 1.1B, Llama 2 7B
 * and Llama 3 8B), the check of its settings (Megatron's names: RMSNorm,
 * rope, SwiGLU, no biases, grouped-query attention), a model built from
 * the configuration, its FLOPs, and its shape as checkpoints record it. Not
 * here: the model (llama.c), its weights sources (llama_io.c) and
 * config.json (llama_hf.c), `loom convert` (llama_convert.c). Not yet:
 * sequence parallelism.
 */
#include <limits.h>
#include <stdio.h>
#include <string.h>

#include "base/log.h"
#include "base/mem.h"
#include "kernels/backend.h"
#include "model/convert.h"
#include "model/decoder_family.h"
#include "model/family.h"
#include "model/llama.h"
#include "model/llama_io.h"
#include "model/sparsity.h"

/* clang-format off */
#define LLAMA_ARCH {"--normalization", "RMSNorm"}, {"--position-embedding-type", "rope"}, {"--swiglu", "1"}, \
                   {"--disable-bias-linear", "1"}, {"--group-query-attention", "1"}
static const struct loom_model_preset presets[] = {
    {.name = "llama-tiny", .summary = "Llama shape, 4 layers x 128 channels, 4 heads, 2 key/value heads, bytes",
     .settings = {LLAMA_ARCH, {"--num-layers", "4"}, {"--hidden-size", "128"}, {"--num-attention-heads", "4"},
                  {"--num-query-groups", "2"}, {"--ffn-hidden-size", "352"}, {"--seq-length", "64"},
                  {"--max-position-embeddings", "64"}, {"--vocab-size", "256"}, {"--norm-epsilon", "1e-5"},
                  {"--train-iters", "1200"}, {"--lr-warmup-iters", "100"}, {"--eval-interval", "200"},
                  {"--log-interval", "100"}, {"--lr", "3e-3"}, {"--micro-batch-size", "16"}}},
    {.name = "tinyllama-1.1b", .summary = "TinyLlama 1.1B (22 layers, 2048 channels, 4 key/value heads)",
     .settings = {LLAMA_ARCH, {"--num-layers", "22"}, {"--hidden-size", "2048"}, {"--num-attention-heads", "32"},
                  {"--num-query-groups", "4"}, {"--ffn-hidden-size", "5632"}, {"--seq-length", "2048"},
                  {"--max-position-embeddings", "2048"}, {"--vocab-size", "32000"}, {"--norm-epsilon", "1e-5"},
                  {"--untie-embeddings-and-output-weights", "1"}, {"--train-iters", "1000"},
                  {"--lr-warmup-iters", "100"}, {"--eval-interval", "250"}, {"--log-interval", "1"},
                  {"--lr", "4e-4"}, {"--micro-batch-size", "1"}}},
    {.name = "llama2-7b", .summary = "Llama 2 7B (32 layers, 4096 channels)",
     .settings = {LLAMA_ARCH, {"--num-layers", "32"}, {"--hidden-size", "4096"}, {"--num-attention-heads", "32"},
                  {"--num-query-groups", "32"}, {"--ffn-hidden-size", "11008"}, {"--seq-length", "4096"},
                  {"--max-position-embeddings", "4096"}, {"--vocab-size", "32000"}, {"--norm-epsilon", "1e-5"},
                  {"--untie-embeddings-and-output-weights", "1"}, {"--train-iters", "1000"},
                  {"--lr-warmup-iters", "100"}, {"--eval-interval", "250"}, {"--log-interval", "1"},
                  {"--lr", "3e-4"}, {"--micro-batch-size", "1"}}},
    {.name = "llama3-8b", .summary = "Llama 3 8B (32 layers, 4096 channels, 8 key/value heads, theta 500000)",
     .settings = {LLAMA_ARCH, {"--num-layers", "32"}, {"--hidden-size", "4096"}, {"--num-attention-heads", "32"},
                  {"--num-query-groups", "8"}, {"--ffn-hidden-size", "14336"}, {"--seq-length", "8192"},
                  {"--max-position-embeddings", "8192"}, {"--vocab-size", "128256"}, {"--norm-epsilon", "1e-5"},
                  {"--rotary-base", "500000"}, {"--untie-embeddings-and-output-weights", "1"},
                  {"--train-iters", "1000"}, {"--lr-warmup-iters", "100"}, {"--eval-interval", "250"},
                  {"--log-interval", "1"}, {"--lr", "3e-4"}, {"--micro-batch-size", "1"}}},
};
/* clang-format on */

/* Megatron's rule for a SwiGLU MLP without --ffn-hidden-size: 2/3 of 4C,
 * down to a multiple of 64. */
static int ffn_of(const struct loom_config *cfg)
{
    return cfg->ffn_hidden_size ? cfg->ffn_hidden_size : (int)(4.0 * cfg->hidden_size * 2 / 3 / 64) * 64;
}

static struct loom_llama_config shape_of_config(const struct loom_config *cfg)
{
    return (struct loom_llama_config){.num_layers = cfg->num_layers,
                                      .hidden = cfg->hidden_size,
                                      .heads = cfg->num_attention_heads,
                                      .kv_heads = cfg->group_query_attention && cfg->num_query_groups
                                                      ? cfg->num_query_groups
                                                      : cfg->num_attention_heads,
                                      .ffn = ffn_of(cfg),
                                      .max_pos = cfg->max_position_embeddings,
                                      .vocab = cfg->vocab_size,
                                      .norm_eps = cfg->norm_epsilon,
                                      .rope_theta = cfg->rotary_base,
                                      .untied = cfg->untie_embeddings_and_output_weights};
}

/* The Llama architecture is Megatron's settings for it; another value is
 * another model. */
static int check_architecture(const struct loom_config *cfg)
{
    if (cfg->kv_channels && cfg->kv_channels * cfg->num_attention_heads != cfg->hidden_size)
        return loom_error_set(LOOM_ERR_INPUT,
                              "--kv-channels %d: a Llama head is --hidden-size / --num-attention-heads wide",
                              cfg->kv_channels);
    if (cfg->normalization != LOOM_NORM_RMSNORM)
        return loom_error_set(LOOM_ERR_INPUT, "--normalization LayerNorm: Llama models use RMSNorm");
    if (cfg->position_embedding_type != LOOM_POSITION_ROPE)
        return loom_error_set(LOOM_ERR_INPUT,
                              "--position-embedding-type learned_absolute: Llama models use rope");
    if (!cfg->swiglu) return loom_error_set(LOOM_ERR_INPUT, "--swiglu off: Llama models use a SwiGLU MLP");
    if (!cfg->disable_bias_linear)
        return loom_error_set(LOOM_ERR_INPUT, "--disable-bias-linear off: Llama models have no biases");
    if (cfg->num_query_groups && !cfg->group_query_attention)
        return loom_error_set(LOOM_ERR_INPUT, "--num-query-groups %d needs --group-query-attention",
                              cfg->num_query_groups);
    if (cfg->activation_function != LOOM_ACTIVATION_GELU_NEW &&
        loom_config_given(cfg, "--activation-function"))
        return loom_error_set(LOOM_ERR_INPUT, "--activation-function is GPT-2's: Llama's MLP is SwiGLU");
    return LOOM_OK;
}

/* The tensor-parallel splits Llama's shape must allow, refused in one line. */
static int check_layout(const struct loom_config *cfg)
{
    const struct loom_llama_config mc = shape_of_config(cfg);
    const int tp = cfg->tensor_model_parallel_size;
    if (mc.kv_heads % tp)
        return loom_error_set(
            LOOM_ERR_INPUT,
            "--num-query-groups %d is not divisible by --tensor-model-parallel-size %d: each "
            "tensor-parallel rank computes whole key/value groups",
            mc.kv_heads, tp);
    if (mc.ffn % tp)
        return loom_error_set(LOOM_ERR_INPUT,
                              "--ffn-hidden-size %d is not divisible by --tensor-model-parallel-size %d",
                              mc.ffn, tp);
    const int n = cfg->layout_invariant;
    if (n && (mc.heads % n || mc.kv_heads % n || mc.ffn % n))
        return loom_error_set(
            LOOM_ERR_INPUT,
            "--layout-invariant %d must divide --num-attention-heads %d, the key/value groups "
            "%d and --ffn-hidden-size %d: each piece is whole heads, groups and columns",
            n, mc.heads, mc.kv_heads, mc.ffn);
    return LOOM_OK;
}

static int check(const struct loom_config *cfg, int T)
{
    const struct loom_llama_config mc = shape_of_config(cfg);
    int rc = check_architecture(cfg);
    if (rc == LOOM_OK) rc = loom_llama_config_check(&mc, T);
    if (rc == LOOM_OK) rc = check_layout(cfg);
    if (rc == LOOM_OK) rc = loom_model_sparsity_check(cfg, mc.heads, T);
    return rc;
}

static struct loom_model *create(const struct loom_config *cfg, int B, int T, int training, int tp_rank,
                                 int pp_rank)
{
    const struct loom_llama_config mc = shape_of_config(cfg);
    const struct loom_decoder_spec spec = loom_llama_spec(&mc);
    return loom_decoder_build(cfg, &spec, B, T, training, tp_rank, pp_rank);
}

static void describe(const struct loom_model *m, char *buf, size_t n)
{
    const struct loom_decoder *d = loom_decoder_of((struct loom_model *)m);
    const struct loom_llama_config c = loom_llama_config_of(d);
    snprintf(buf, n,
             "%d layers, %d channels, %d heads (%d key/value), MLP %d, T=%d, V=%d, rope %g, RMSNorm eps %g%s",
             c.num_layers, c.hidden, c.heads, c.kv_heads, c.ffn, d->T, c.vocab, c.rope_theta, c.norm_eps,
             c.untied ? ", untied LM head" : "");
    loom_model_sparsity_describe(d->sparse, buf, n);
}

/* The shape as checkpoints record it: every setting that changes the
 * function, each key its flag's name with '_'. */
#define F(field) offsetof(struct loom_config, field)
static const struct {
    const char *key;
    size_t offset;
    enum loom_shape_kind kind; /* INT: an int; REAL: a double */
    int64_t lo, hi;
} shape_keys[] = {
    {"num_layers", F(num_layers), LOOM_SHAPE_INT, 1, INT_MAX},
    {"hidden_size", F(hidden_size), LOOM_SHAPE_INT, 1, INT_MAX},
    {"num_attention_heads", F(num_attention_heads), LOOM_SHAPE_INT, 1, INT_MAX},
    {"num_query_groups", F(num_query_groups), LOOM_SHAPE_INT, 1, INT_MAX},
    {"ffn_hidden_size", F(ffn_hidden_size), LOOM_SHAPE_INT, 1, INT_MAX},
    {"max_position_embeddings", F(max_position_embeddings), LOOM_SHAPE_INT, 1, INT_MAX},
    {"vocab_size", F(vocab_size), LOOM_SHAPE_INT, 2, INT_MAX},
    {"norm_epsilon", F(norm_epsilon), LOOM_SHAPE_REAL, 0, 1},
    {"rotary_base", F(rotary_base), LOOM_SHAPE_REAL, 1, 1000000000000LL},
    {"untie_embeddings_and_output_weights", F(untie_embeddings_and_output_weights), LOOM_SHAPE_INT, 0, 1},
};
#define NKEYS ((int)(sizeof shape_keys / sizeof shape_keys[0]))

static void shape_of(const struct loom_config *cfg, struct loom_model_shape *out)
{
    const struct loom_llama_config mc = shape_of_config(cfg);
    struct loom_config c = *cfg; /* the derived values, as the model has them */
    c.num_query_groups = mc.kv_heads;
    c.ffn_hidden_size = mc.ffn;
    memset(out, 0, sizeof *out);
    snprintf(out->type, sizeof out->type, "%s", "llama");
    for (int k = 0; k < NKEYS; k++) {
        const void *field = (const char *)&c + shape_keys[k].offset;
        if (shape_keys[k].kind == LOOM_SHAPE_INT)
            loom_model_shape_add_int(out, shape_keys[k].key, *(const int *)field);
        else
            loom_model_shape_add_real(out, shape_keys[k].key, *(const double *)field);
    }
}

static int apply_shape(const struct loom_model_shape *shape, struct loom_config *cfg)
{
    if (strcmp(shape->type, "llama") != 0)
        return loom_error_set(LOOM_ERR_INPUT, "the file holds a %s model, not Llama", shape->type);
    for (int i = 0; i < shape->n; i++) {
        int k = 0;
        while (k < NKEYS && strcmp(shape->kv[i].key, shape_keys[k].key) != 0) k++;
        if (k == NKEYS)
            return loom_error_set(LOOM_ERR_INPUT, "model.%s: not a Llama shape setting", shape->kv[i].key);
    }
    struct loom_config out = *cfg; /* all or nothing */
    for (int k = 0; k < NKEYS; k++) {
        const struct loom_shape_setting *kv = loom_model_shape_find(shape, shape_keys[k].key);
        if (!kv) return loom_error_set(LOOM_ERR_INPUT, "model.%s: missing", shape_keys[k].key);
        void *field = (char *)&out + shape_keys[k].offset;
        if (shape_keys[k].kind == LOOM_SHAPE_INT) {
            if (kv->kind != LOOM_SHAPE_INT || kv->value < shape_keys[k].lo || kv->value > shape_keys[k].hi)
                return loom_error_set(LOOM_ERR_INPUT, "model.%s: expected an integer in [%lld, %lld]",
                                      shape_keys[k].key, (long long)shape_keys[k].lo,
                                      (long long)shape_keys[k].hi);
            *(int *)field = (int)kv->value;
        } else {
            if (kv->kind == LOOM_SHAPE_WORD ||
                !(kv->real >= shape_keys[k].lo && kv->real <= shape_keys[k].hi))
                return loom_error_set(LOOM_ERR_INPUT, "model.%s: expected a number in [%lld, %lld]",
                                      shape_keys[k].key, (long long)shape_keys[k].lo,
                                      (long long)shape_keys[k].hi);
            *(double *)field = kv->real;
        }
    }
    /* the architecture the file's model has */
    out.normalization = LOOM_NORM_RMSNORM;
    out.position_embedding_type = LOOM_POSITION_ROPE;
    out.swiglu = out.disable_bias_linear = out.group_query_attention = 1;
    *cfg = out;
    return LOOM_OK;
}

void loom_llama_shape(const struct loom_llama_config *c, struct loom_model_shape *out)
{
    struct loom_config cfg;
    memset(&cfg, 0, sizeof cfg);
    cfg.num_layers = c->num_layers;
    cfg.hidden_size = c->hidden;
    cfg.num_attention_heads = c->heads;
    cfg.group_query_attention = 1;
    cfg.num_query_groups = c->kv_heads;
    cfg.ffn_hidden_size = c->ffn;
    cfg.max_position_embeddings = c->max_pos;
    cfg.vocab_size = c->vocab;
    cfg.norm_epsilon = c->norm_eps;
    cfg.rotary_base = c->rope_theta;
    cfg.untie_embeddings_and_output_weights = c->untied;
    shape_of(&cfg, out);
}

int loom_llama_config_of_shape(const struct loom_model_shape *shape, struct loom_llama_config *out)
{
    struct loom_config cfg;
    memset(&cfg, 0, sizeof cfg);
    int rc = apply_shape(shape, &cfg);
    if (rc == LOOM_OK) *out = shape_of_config(&cfg);
    return rc;
}

/* What a weights source states: all of the shape (llama_io.c). */
static int read_shape(const char *path, const struct loom_config *cfg, struct loom_model_shape *out)
{
    (void)cfg;
    return loom_llama_source_shape(path, out);
}

static int load_weights(struct loom_model *m, const char *path)
{
    return loom_llama_load(loom_decoder_of(m), path);
}

static int save_weights(struct loom_model *m, const char *path)
{
    return loom_llama_save(loom_decoder_of(m), path);
}

const struct loom_model_family loom_llama_family = {
    .name = "llama",
    .title = "Llama",
    .presets = presets,
    .npresets = (int)(sizeof presets / sizeof presets[0]),
    .check = check,
    .create = create,
    .destroy = loom_decoder_destroy,
    .flops_per_token = loom_decoder_model_flops,
    .describe = describe,
    .shape_of = shape_of,
    .apply_shape = apply_shape,
    .read_shape = read_shape,
    .load_weights = load_weights,
    .save_weights = save_weights,
    .converter = &loom_llama_converter,
};
