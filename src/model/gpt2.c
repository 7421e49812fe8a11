/*
 * GPT-2 as a decoder family (model/decoder_def.h, model/family.h): the
 * embedding block (wte, wpe), L layers (LayerNorm, fused c_attn with
 * biases, c_proj, LayerNorm, c_fc, GELU, c_proj), the head block (ln_f;
 * the LM head tied to wte, or lm_head of its own), under Hugging Face
 * GPT-2's names and Conv1D's [in, out] weights. Its architecture, shape
 * settings and presets; its checks, spec and shape as files record it are
 * the generic definition's (decoder_def.c). Not here: its weights formats
 * (gpt2_io.c, gpt2_hf.c, gpt2_llmc.c, gpt2_convert.c).
 */
#include "model/gpt2.h"

#include <limits.h>
#include <stdio.h>
#include <string.h>

#include "base/log.h"
#include "model/convert.h"
#include "model/decoder_def.h"
#include "model/decoder_family.h"
#include "model/family.h"
#include "model/gpt2_io.h"
#include "model/sparsity.h"

static const struct loom_decoder_names names = {
    .embedding = "wte",
    .positions = "wpe",
    .layer = "h.%d.",
    .norm1 = "ln_1",
    .qkv = "attn.c_attn",
    .o = "attn.c_proj",
    .norm2 = "ln_2",
    .up = "mlp.c_fc",
    .down = "mlp.c_proj",
    .final_norm = "ln_f",
    .lm_head = "lm_head", /* Hugging Face's name for GPT2LMHeadModel's own head */
};

static const struct loom_decoder_spec arch = {
    .names = &names,
    .norm = LOOM_NORM_LAYERNORM,
    .positions = LOOM_POSITION_LEARNED,
    .weights = LOOM_WEIGHTS_IN_OUT,
    .fused_qkv = 1,
    .qkv_bias = 1,
    .o_bias = 1,
    .mlp_bias = 1,
    .mlp = LOOM_MLP_DENSE,
    .init_std = 0.02,
    .scaled_init = 1,
};

/* every head its own key/value head; the MLP 4 x C */
static void finish(struct loom_decoder_spec *s)
{
    s->kv_heads = s->heads;
    s->ffn = 4 * s->hidden;
}

/* The shape settings as files record them: the keys checkpoints' trainer
 * state has always written, then the numerics (absent from older files,
 * which were all GPT-2's defaults). The activation's names are the
 * spec's values (gelu_new: the tanh form). */
static const struct loom_shape_key keys[] = {
    LOOM_SHAPE_KEY("num_layers", num_layers, num_layers, LOOM_SHAPE_INT, 1, INT_MAX),
    LOOM_SHAPE_KEY("hidden_size", hidden_size, hidden, LOOM_SHAPE_INT, 1, INT_MAX),
    LOOM_SHAPE_KEY("num_attention_heads", num_attention_heads, heads, LOOM_SHAPE_INT, 1, INT_MAX),
    LOOM_SHAPE_KEY("max_position_embeddings", max_position_embeddings, max_pos, LOOM_SHAPE_INT, 1, INT_MAX),
    LOOM_SHAPE_KEY("vocab_size", vocab_size, vocab, LOOM_SHAPE_INT, 1, INT_MAX),
    LOOM_SHAPE_KEY_OR("norm_epsilon", norm_epsilon, norm_eps, LOOM_SHAPE_REAL, 0, 1, "1e-5"),
    LOOM_SHAPE_KEY_WORD("activation_function", activation_function, activation, loom_activation_names,
                        "gelu_new"),
    LOOM_SHAPE_KEY_OR("untie_embeddings_and_output_weights", untie_embeddings_and_output_weights, untied,
                      LOOM_SHAPE_INT, 0, 1, "0"),
};
_Static_assert((int)LOOM_ACTIVATION_GELU_NEW == (int)LOOM_MLP_GELU_TANH &&
                   (int)LOOM_ACTIVATION_GELU == (int)LOOM_MLP_GELU,
               "the activation setting's values are the spec's");

const struct loom_decoder_def loom_gpt2_def = {
    .family = &loom_gpt2_family,
    .arch = &arch,
    .keys = keys,
    .nkeys = (int)(sizeof keys / sizeof keys[0]),
    .finish = finish,
};

/* A GPT-2 shape as the configuration's settings, and back. */
static struct loom_config config_of(const struct loom_gpt2_config *g)
{
    struct loom_config c;
    memset(&c, 0, sizeof c);
    c.num_layers = g->num_layers;
    c.hidden_size = g->hidden;
    c.num_attention_heads = g->heads;
    c.max_position_embeddings = g->max_pos;
    c.vocab_size = g->vocab;
    c.norm_epsilon = g->norm_eps;
    c.activation_function = g->activation;
    c.untie_embeddings_and_output_weights = g->untied;
    return c;
}

static struct loom_gpt2_config gpt2_config(const struct loom_config *cfg)
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

int loom_gpt2_config_check(const struct loom_gpt2_config *cfg, int T)
{
    const struct loom_config c = config_of(cfg);
    return loom_decoder_def_check_sizes(&loom_gpt2_def, &c, T);
}

struct loom_decoder_spec loom_gpt2_spec(const struct loom_gpt2_config *cfg)
{
    const struct loom_config c = config_of(cfg);
    return loom_decoder_def_spec(&loom_gpt2_def, &c);
}

struct loom_gpt2_config loom_gpt2_config_of(const struct loom_decoder *m)
{
    const struct loom_decoder_spec *s = &m->spec;
    return (struct loom_gpt2_config){.num_layers = s->num_layers,
                                     .hidden = s->hidden,
                                     .heads = s->heads,
                                     .max_pos = s->max_pos,
                                     .vocab = s->vocab,
                                     .norm_eps = s->norm_eps,
                                     .activation = (enum loom_activation)s->activation,
                                     .untied = s->untied};
}

struct loom_decoder *loom_gpt2_create_tp(const struct loom_gpt2_config *cfg, int B, int T, int tp,
                                         int tp_rank)
{
    const struct loom_decoder_spec s = loom_gpt2_spec(cfg);
    const int lo = 0, hi = cfg->num_layers - 1;
    return loom_decoder_create(&s, B, T, tp, tp_rank, 1, &lo, &hi, 1, 1);
}

struct loom_decoder *loom_gpt2_create(const struct loom_gpt2_config *cfg, int B, int T)
{
    return loom_gpt2_create_tp(cfg, B, T, 1, 0);
}

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
    const struct loom_config cfg = config_of(c);
    shape_of(&cfg, out);
}

int loom_gpt2_config_of_shape(const struct loom_model_shape *shape, struct loom_gpt2_config *out)
{
    struct loom_config cfg;
    memset(&cfg, 0, sizeof cfg);
    int rc = apply_shape(shape, &cfg);
    if (rc == LOOM_OK) *out = gpt2_config(&cfg);
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
    .describe = loom_decoder_def_describe,
    .shape_of = shape_of,
    .apply_shape = apply_shape,
    .read_shape = read_shape,
    .load_weights = load_weights,
    .save_weights = save_weights,
    .converter = &loom_gpt2_converter,
    .decoder = &loom_gpt2_def,
};
