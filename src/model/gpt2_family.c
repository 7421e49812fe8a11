/*
 * GPT-2 as a model family (model/family.h): its presets, the check of its
 * shape settings, a model built from the configuration (recomputation and,
 * when training, the activation dtype), its FLOPs, and its shape as files
 * record it (checkpoints: num_layers, hidden_size, num_attention_heads,
 * max_position_embeddings, vocab_size; weights: gpt2_io.h). Not here: the
 * model itself (gpt2.c) and its weights formats (gpt2_io.c, gpt2_llmc.c).
 */
#include <limits.h>
#include <stdio.h>
#include <string.h>

#include "base/log.h"
#include "base/mem.h"
#include "kernels/backend.h"
#include "model/convert.h"
#include "model/decoder_def.h"
#include "model/decoder_family.h"
#include "model/family.h"
#include "model/gpt2.h"
#include "model/gpt2_io.h"
#include "model/sparsity.h"

/* Presets: the shape and the training defaults that go with it. A preset's
 * micro-batch applies only while no batch setting is given (config/parse.c). */
/* clang-format off */
static const struct loom_model_preset presets[] = {
    {.name = "gpt2-tiny", .summary = "GPT-2 shape, 4 layers x 128 channels, bytes: a run in seconds",
     .settings = {{"--num-layers", "4"}, {"--hidden-size", "128"}, {"--num-attention-heads", "4"},
                  {"--seq-length", "64"}, {"--max-position-embeddings", "64"}, {"--vocab-size", "256"},
                  {"--train-iters", "1200"}, {"--lr-warmup-iters", "100"}, {"--eval-interval", "200"},
                  {"--log-interval", "100"}, {"--lr", "3e-3"}, {"--micro-batch-size", "16"}}},
    {.name = "gpt2", .summary = "GPT-2 124M",
     .settings = {{"--num-layers", "12"}, {"--hidden-size", "768"}, {"--num-attention-heads", "12"},
                  {"--seq-length", "1024"}, {"--max-position-embeddings", "1024"}, {"--vocab-size", "50257"},
                  {"--train-iters", "1000"}, {"--lr-warmup-iters", "100"}, {"--eval-interval", "250"},
                  {"--log-interval", "10"}, {"--lr", "6e-4"}, {"--micro-batch-size", "4"}}},
    {.name = "gpt2-medium", .summary = "GPT-2 350M",
     .settings = {{"--num-layers", "24"}, {"--hidden-size", "1024"}, {"--num-attention-heads", "16"},
                  {"--seq-length", "1024"}, {"--max-position-embeddings", "1024"}, {"--vocab-size", "50257"},
                  {"--train-iters", "1000"}, {"--lr-warmup-iters", "100"}, {"--eval-interval", "250"},
                  {"--log-interval", "10"}, {"--lr", "3e-4"}, {"--micro-batch-size", "4"}}},
    {.name = "gpt2-large", .summary = "GPT-2 774M",
     .settings = {{"--num-layers", "36"}, {"--hidden-size", "1280"}, {"--num-attention-heads", "20"},
                  {"--seq-length", "1024"}, {"--max-position-embeddings", "1024"}, {"--vocab-size", "50257"},
                  {"--train-iters", "1000"}, {"--lr-warmup-iters", "100"}, {"--eval-interval", "250"},
                  {"--log-interval", "10"}, {"--lr", "2.5e-4"}, {"--micro-batch-size", "4"}}},
    {.name = "gpt2-xl", .summary = "GPT-2 1.5B",
     .settings = {{"--num-layers", "48"}, {"--hidden-size", "1600"}, {"--num-attention-heads", "25"},
                  {"--seq-length", "1024"}, {"--max-position-embeddings", "1024"}, {"--vocab-size", "50257"},
                  {"--train-iters", "1000"}, {"--lr-warmup-iters", "100"}, {"--eval-interval", "250"},
                  {"--log-interval", "10"}, {"--lr", "2e-4"}, {"--micro-batch-size", "4"}}},
};
/* clang-format on */

static struct loom_gpt2_config shape_of_config(const struct loom_config *cfg)
{
    return (struct loom_gpt2_config){.num_layers = cfg->num_layers,
                                     .hidden = cfg->hidden_size,
                                     .heads = cfg->num_attention_heads,
                                     .max_pos = cfg->max_position_embeddings,
                                     .vocab = cfg->vocab_size,
                                     .norm_eps = cfg->norm_epsilon,
                                     .activation = cfg->activation_function,
                                     .untied = cfg->untie_embeddings_and_output_weights};
}

static const struct loom_decoder *gpt2_of(const struct loom_model *m)
{
    return loom_decoder_of((struct loom_model *)m);
}

static int check(const struct loom_config *cfg, int T)
{
    return loom_decoder_def_check(&loom_gpt2_def, cfg, T);
}

static struct loom_model *create(const struct loom_config *cfg, int B, int T, int training, int tp_rank,
                                 int pp_rank)
{
    const struct loom_decoder_spec spec = loom_decoder_def_spec(&loom_gpt2_def, cfg);
    return loom_decoder_build(cfg, &spec, B, T, training, tp_rank, pp_rank);
}

static void describe(const struct loom_model *m, char *buf, size_t n)
{
    const struct loom_decoder *d = gpt2_of(m);
    const struct loom_gpt2_config c = loom_gpt2_config_of(d), *g_cfg = &c;
    int len = snprintf(buf, n, "%d layers, %d channels, %d heads, T=%d, V=%d", g_cfg->num_layers,
                       g_cfg->hidden, g_cfg->heads, d->T, g_cfg->vocab);
    /* the numerics only where they are not GPT-2's */
    if (len > 0 && (size_t)len < n && g_cfg->norm_eps != LOOM_GPT2_NORM_EPS)
        len += snprintf(buf + len, n - (size_t)len, ", LayerNorm eps %g", g_cfg->norm_eps);
    if (len > 0 && (size_t)len < n && g_cfg->activation != LOOM_ACTIVATION_GELU_NEW)
        len += snprintf(buf + len, n - (size_t)len, ", %s", loom_activation_names[g_cfg->activation]);
    if (len > 0 && (size_t)len < n && g_cfg->untied)
        len += snprintf(buf + len, n - (size_t)len, ", untied LM head");
    if (len > 0 && (size_t)len < n) loom_model_sparsity_describe(d->sparse, buf, n);
}

static void shape_of(const struct loom_config *cfg, struct loom_model_shape *out)
{
    loom_decoder_def_shape_of(&loom_gpt2_def, cfg, out);
}

static int apply_shape(const struct loom_model_shape *shape, struct loom_config *cfg)
{
    return loom_decoder_def_apply_shape(&loom_gpt2_def, shape, cfg);
}

void loom_gpt2_shape(const struct loom_gpt2_config *c, struct loom_model_shape *out)
{
    struct loom_config cfg;
    memset(&cfg, 0, sizeof cfg);
    cfg.num_layers = c->num_layers;
    cfg.hidden_size = c->hidden;
    cfg.num_attention_heads = c->heads;
    cfg.max_position_embeddings = c->max_pos;
    cfg.vocab_size = c->vocab;
    cfg.norm_epsilon = c->norm_eps;
    cfg.activation_function = c->activation;
    cfg.untie_embeddings_and_output_weights = c->untied;
    shape_of(&cfg, out);
}

int loom_gpt2_config_of_shape(const struct loom_model_shape *shape, struct loom_gpt2_config *out)
{
    struct loom_config cfg;
    memset(&cfg, 0, sizeof cfg);
    int rc = apply_shape(shape, &cfg);
    if (rc == LOOM_OK) *out = shape_of_config(&cfg);
    return rc;
}

/* What a weights source states (model/gpt2_io.h). The heads are the one
 * setting no default can stand for: a source that does not state them
 * needs --num-attention-heads. */
static int read_shape(const char *path, const struct loom_config *cfg, struct loom_model_shape *out)
{
    int rc = loom_gpt2_source_shape(path, out);
    if (rc == LOOM_OK && !loom_model_shape_find(out, "num_attention_heads") &&
        !loom_config_given(cfg, "--num-attention-heads")) {
        const struct loom_shape_setting *C = loom_model_shape_find(out, "hidden_size");
        rc = loom_error_set(LOOM_ERR_INPUT,
                            "%s does not say how many attention heads the model has (hidden size %lld, no "
                            "config.json beside it): give --num-attention-heads",
                            path, C ? (long long)C->value : 0LL);
    }
    return rc;
}

static int load_weights(struct loom_model *m, const char *path)
{
    return loom_gpt2_source_load(loom_decoder_of(m), path);
}

static int save_weights(struct loom_model *m, const char *path)
{
    return loom_gpt2_save(loom_decoder_of(m), path);
}

const struct loom_model_family loom_gpt2_family = {
    .name = "gpt2",
    .title = "GPT-2",
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
    .converter = &loom_gpt2_converter,
    .decoder = &loom_gpt2_def,
};
