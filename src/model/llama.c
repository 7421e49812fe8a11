/*
 * Llama's layer spec (llama.h): its tensors' names, its architecture in the
 * decoder's terms, and the check of its shape settings.
 */
#include "model/llama.h"

#include "base/log.h"
#include "model/family.h"

int loom_llama_config_check(const struct loom_llama_config *cfg, int T)
{
    if (cfg->num_layers < 1)
        return loom_error_set(LOOM_ERR_INPUT, "--num-layers must be >= 1, got %d", cfg->num_layers);
    if (cfg->heads < 1 || cfg->hidden < 1 || cfg->hidden % cfg->heads)
        return loom_error_set(LOOM_ERR_INPUT, "--hidden-size %d is not divisible by --num-attention-heads %d",
                              cfg->hidden, cfg->heads);
    if ((cfg->hidden / cfg->heads) % 2)
        return loom_error_set(
            LOOM_ERR_INPUT,
            "the head size (--hidden-size %d / --num-attention-heads %d) must be even for the "
            "rotary embedding",
            cfg->hidden, cfg->heads);
    if (cfg->kv_heads < 1 || cfg->heads % cfg->kv_heads)
        return loom_error_set(LOOM_ERR_INPUT,
                              "--num-query-groups %d does not divide --num-attention-heads %d", cfg->kv_heads,
                              cfg->heads);
    if (cfg->ffn < 1)
        return loom_error_set(LOOM_ERR_INPUT, "--ffn-hidden-size must be >= 1, got %d", cfg->ffn);
    if (cfg->vocab < 2)
        return loom_error_set(LOOM_ERR_INPUT, "--vocab-size must be >= 2, got %d", cfg->vocab);
    if (T > cfg->max_pos)
        return loom_error_set(LOOM_ERR_INPUT, "--seq-length %d exceeds --max-position-embeddings %d", T,
                              cfg->max_pos);
    if (!(cfg->rope_theta > 0))
        return loom_error_set(LOOM_ERR_INPUT, "--rotary-base must be positive, got %g", cfg->rope_theta);
    return LOOM_OK;
}

static const struct loom_decoder_names names = {
    .embedding = "model.embed_tokens",
    .layer = "model.layers.%d.",
    .norm1 = "input_layernorm",
    .q = "self_attn.q_proj",
    .k = "self_attn.k_proj",
    .v = "self_attn.v_proj",
    .o = "self_attn.o_proj",
    .norm2 = "post_attention_layernorm",
    .gate = "mlp.gate_proj",
    .up = "mlp.up_proj",
    .down = "mlp.down_proj",
    .final_norm = "model.norm",
    .lm_head = "lm_head",
};

struct loom_decoder_spec loom_llama_spec(const struct loom_llama_config *cfg)
{
    return (struct loom_decoder_spec){
        .family = &loom_llama_family,
        .name = loom_llama_family.name,
        .names = &names,
        .num_layers = cfg->num_layers,
        .hidden = cfg->hidden,
        .heads = cfg->heads,
        .kv_heads = cfg->kv_heads,
        .ffn = cfg->ffn,
        .max_pos = cfg->max_pos,
        .vocab = cfg->vocab,
        .norm = LOOM_NORM_RMSNORM,
        .norm_eps = cfg->norm_eps,
        .positions = LOOM_POSITION_ROPE,
        .rope_theta = cfg->rope_theta,
        .weights = LOOM_WEIGHTS_OUT_IN,
        .mlp = LOOM_MLP_GATED,
        .activation = LOOM_MLP_SILU,
        .untied = cfg->untied,
        .init_std = 0.02, /* Hugging Face's initializer_range */
    };
}

struct loom_llama_config loom_llama_config_of(const struct loom_decoder *m)
{
    const struct loom_decoder_spec *s = &m->spec;
    return (struct loom_llama_config){.num_layers = s->num_layers,
                                      .hidden = s->hidden,
                                      .heads = s->heads,
                                      .kv_heads = s->kv_heads,
                                      .ffn = s->ffn,
                                      .max_pos = s->max_pos,
                                      .vocab = s->vocab,
                                      .norm_eps = s->norm_eps,
                                      .rope_theta = s->rope_theta,
                                      .untied = s->untied};
}

struct loom_decoder *loom_llama_create_stage(const struct loom_llama_config *cfg, int B, int T, int tp,
                                             int tp_rank, int chunks, const int *lo, const int *hi,
                                             int embedding, int head)
{
    LOOM_ASSERT(loom_llama_config_check(cfg, T) == LOOM_OK);
    const struct loom_decoder_spec s = loom_llama_spec(cfg);
    return loom_decoder_create(&s, B, T, tp, tp_rank, chunks, lo, hi, embedding, head);
}

struct loom_decoder *loom_llama_create(const struct loom_llama_config *cfg, int B, int T)
{
    const int lo = 0, hi = cfg->num_layers - 1;
    return loom_llama_create_stage(cfg, B, T, 1, 0, 1, &lo, &hi, 1, 1);
}

double loom_llama_num_params(const struct loom_llama_config *cfg)
{
    const struct loom_decoder_spec s = loom_llama_spec(cfg);
    return loom_decoder_num_params(&s);
}
