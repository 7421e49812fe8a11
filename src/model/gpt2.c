/*
 * GPT-2's layer spec (gpt2.h): its tensors' names, its architecture in the
 * decoder's terms, and the check of its shape settings.
 */
#include "model/gpt2.h"

#include "base/log.h"
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

struct loom_decoder_spec loom_gpt2_spec(const struct loom_gpt2_config *cfg)
{
    return (struct loom_decoder_spec){
        .family = &loom_gpt2_family,
        .name = loom_gpt2_family.name,
        .names = &names,
        .num_layers = cfg->num_layers,
        .hidden = cfg->hidden,
        .heads = cfg->heads,
        .kv_heads = cfg->heads,
        .ffn = 4 * cfg->hidden,
        .max_pos = cfg->max_pos,
        .vocab = cfg->vocab,
        .norm = LOOM_NORM_LAYERNORM,
        .norm_eps = cfg->norm_eps,
        .positions = LOOM_POSITION_LEARNED,
        .weights = LOOM_WEIGHTS_IN_OUT,
        .fused_qkv = 1,
        .qkv_bias = 1,
        .o_bias = 1,
        .mlp_bias = 1,
        .mlp = LOOM_MLP_DENSE,
        .activation = cfg->activation == LOOM_ACTIVATION_GELU ? LOOM_MLP_GELU : LOOM_MLP_GELU_TANH,
        .untied = cfg->untied,
        .init_std = 0.02,
        .scaled_init = 1,
    };
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
