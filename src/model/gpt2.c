/*
 * GPT-2's layer spec (gpt2.h): its tensors' names, its architecture in the
 * decoder's terms, and the check of its shape settings.
 */
#include "model/gpt2.h"

#include <limits.h>
#include <string.h>

#include "base/log.h"
#include "model/decoder_def.h"
#include "model/family.h"

int loom_gpt2_config_check(const struct loom_gpt2_config *cfg, int T)
{
    if (cfg->num_layers < 1)
        return loom_error_set(LOOM_ERR_INPUT, "--num-layers must be >= 1, got %d", cfg->num_layers);
    if (cfg->hidden < 1)
        return loom_error_set(LOOM_ERR_INPUT, "--hidden-size must be >= 1, got %d", cfg->hidden);
    if (cfg->heads < 1)
        return loom_error_set(LOOM_ERR_INPUT, "--num-attention-heads must be >= 1, got %d", cfg->heads);
    if (cfg->hidden % cfg->heads != 0)
        return loom_error_set(LOOM_ERR_INPUT, "--hidden-size %d is not divisible by --num-attention-heads %d",
                              cfg->hidden, cfg->heads);
    if (T > cfg->max_pos)
        return loom_error_set(LOOM_ERR_INPUT, "--seq-length %d exceeds --max-position-embeddings %d", T,
                              cfg->max_pos);
    if (cfg->vocab < 2)
        return loom_error_set(LOOM_ERR_INPUT, "--vocab-size must be >= 2, got %d", cfg->vocab);
    return LOOM_OK;
}

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

struct loom_decoder_spec loom_gpt2_spec(const struct loom_gpt2_config *cfg)
{
    struct loom_config c;
    memset(&c, 0, sizeof c);
    c.num_layers = cfg->num_layers;
    c.hidden_size = cfg->hidden;
    c.num_attention_heads = cfg->heads;
    c.max_position_embeddings = cfg->max_pos;
    c.vocab_size = cfg->vocab;
    c.norm_epsilon = cfg->norm_eps;
    c.activation_function = cfg->activation;
    c.untie_embeddings_and_output_weights = cfg->untied;
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
                                     .activation = s->activation == LOOM_MLP_GELU ? LOOM_ACTIVATION_GELU
                                                                                  : LOOM_ACTIVATION_GELU_NEW,
                                     .untied = s->untied};
}

struct loom_decoder *loom_gpt2_create_stage(const struct loom_gpt2_config *cfg, int B, int T, int tp,
                                            int tp_rank, int chunks, const int *lo, const int *hi,
                                            int embedding, int head)
{
    const struct loom_decoder_spec s = loom_gpt2_spec(cfg);
    return loom_decoder_create(&s, B, T, tp, tp_rank, chunks, lo, hi, embedding, head);
}

struct loom_decoder *loom_gpt2_create_tp(const struct loom_gpt2_config *cfg, int B, int T, int tp,
                                         int tp_rank)
{
    const int lo = 0, hi = cfg->num_layers - 1;
    return loom_gpt2_create_stage(cfg, B, T, tp, tp_rank, 1, &lo, &hi, 1, 1);
}

struct loom_decoder *loom_gpt2_create(const struct loom_gpt2_config *cfg, int B, int T)
{
    return loom_gpt2_create_tp(cfg, B, T, 1, 0);
}

double loom_gpt2_num_params(const struct loom_gpt2_config *cfg)
{
    const struct loom_decoder_spec s = loom_gpt2_spec(cfg);
    return loom_decoder_num_params(&s);
}
