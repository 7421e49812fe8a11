/*
 * Mixtral (Hugging Face's MixtralForCausalLM) as a decoder family
 * (model/decoder_def.h): Mistral's layers whose MLP is a mixture of experts
 * (decoder.h's experts; decoder_moe.c): a router (block_sparse_moe.gate)
 * picks num_experts_per_tok of num_local_experts SwiGLU experts
 * (block_sparse_moe.experts.E.w1, w3, w2: gate, up, down) for each token,
 * weighted by the softmax of the chosen logits (transformers' softmax, top
 * k, renormalised), in every layer. Its presets (a tiny one for the
 * built-in corpus, Mixtral 8x7B's shape), its shape settings and its
 * config.json (MixtralConfig, transformers 4.39).
 *
 * config.json's output_router_logits and router_aux_loss_coef are the
 * balancing loss's defaults: false (transformers' default) trains without
 * one, as transformers does (weight 0); true with Hugging Face's form over
 * all layers (--moe-router-load-balancing-type hf_aux_loss) and that
 * weight. Flags override both.
 */
#include <limits.h>
#include <string.h>

#include "base/log.h"
#include "model/hf_decoder.h"

/* clang-format off */
#define MIXTRAL_ARCH {"--normalization", "RMSNorm"}, {"--position-embedding-type", "rope"}, {"--swiglu", "1"}, \
                     {"--disable-bias-linear", "1"}, {"--group-query-attention", "1"}
static const struct loom_model_preset presets[] = {
    {.name = "mixtral-tiny", .summary = "Mixtral shape, 4 layers x 128 channels, top 2 of 8 experts of 256, bytes",
     .settings = {MIXTRAL_ARCH, {"--num-layers", "4"}, {"--hidden-size", "128"}, {"--num-attention-heads", "4"},
                  {"--num-query-groups", "2"}, {"--ffn-hidden-size", "256"}, {"--num-experts", "8"},
                  {"--moe-router-topk", "2"}, {"--seq-length", "64"}, {"--max-position-embeddings", "64"},
                  {"--vocab-size", "256"}, {"--norm-epsilon", "1e-5"}, {"--rotary-base", "1000000"},
                  {"--untie-embeddings-and-output-weights", "1"}, LOOM_TINY_TRAINING}},
    {.name = "mixtral-8x7b", .summary = "Mixtral 8x7B (32 layers, 4096 channels, top 2 of 8 experts of 14336)",
     .settings = {MIXTRAL_ARCH, {"--num-layers", "32"}, {"--hidden-size", "4096"}, {"--num-attention-heads", "32"},
                  {"--num-query-groups", "8"}, {"--ffn-hidden-size", "14336"}, {"--num-experts", "8"},
                  {"--moe-router-topk", "2"}, {"--seq-length", "4096"}, {"--max-position-embeddings", "32768"},
                  {"--vocab-size", "32000"}, {"--norm-epsilon", "1e-5"}, {"--rotary-base", "1000000"},
                  {"--untie-embeddings-and-output-weights", "1"}, LOOM_REAL_TRAINING("3e-4")}},
};
/* clang-format on */

static const struct loom_decoder_names names = {
    LOOM_HF_LLAMA_NAMES,
    .router = "block_sparse_moe.gate",
    .expert = "block_sparse_moe.experts.%d.",
    .expert_gate = "w1",
    .expert_up = "w3",
    .expert_down = "w2",
};

static const struct loom_decoder_spec arch = {
    .names = &names,
    .norm = LOOM_NORM_RMSNORM,
    .positions = LOOM_POSITION_ROPE,
    .weights = LOOM_WEIGHTS_OUT_IN,
    .mlp = LOOM_MLP_GATED,
    .activation = LOOM_MLP_SILU,
    .init_std = 0.02,
};

static const struct loom_shape_key keys[] = {
    LOOM_DECODER_SHAPE_KEYS,
    LOOM_SHAPE_KEY("attention_window", attention_window, window, LOOM_SHAPE_INT, 0, INT_MAX),
};

/* transformers' MixtralConfig (4.39): LlamaConfig's keys with rope_theta
 * 1e6, Mistral's window, the experts; intermediate_size is each expert's
 * width (--ffn-hidden-size, which --moe-ffn-hidden-size defaults to) */
static const struct loom_hf_key hf_keys[] = {
    LOOM_HF_KEY("num_hidden_layers", "num_layers", LOOM_HF_INT, 32),
    LOOM_HF_KEY("hidden_size", "hidden_size", LOOM_HF_INT, 4096),
    LOOM_HF_KEY("num_attention_heads", "num_attention_heads", LOOM_HF_INT, 32),
    LOOM_HF_KEY("num_key_value_heads", "num_query_groups", LOOM_HF_INT, 8),
    LOOM_HF_KEY("intermediate_size", "ffn_hidden_size", LOOM_HF_INT, 14336),
    LOOM_HF_KEY("max_position_embeddings", "max_position_embeddings", LOOM_HF_INT, 4096 * 32),
    LOOM_HF_KEY("vocab_size", "vocab_size", LOOM_HF_INT, 32000),
    LOOM_HF_KEY_REAL("rms_norm_eps", "norm_epsilon", 1e-5, 0, 1),
    LOOM_HF_KEY_REAL("rope_theta", "rotary_base", 1e6, 1, 1e12),
    LOOM_HF_KEY_REAL("attention_dropout", "attention_dropout", 0.0, 0, 1),
    LOOM_HF_KEY("tie_word_embeddings", "untie_embeddings_and_output_weights", LOOM_HF_UNTIED, 1),
    LOOM_HF_KEY("sliding_window", "attention_window", LOOM_HF_WINDOW, 0),
    LOOM_HF_KEY("num_local_experts", "num_experts", LOOM_HF_INT, 8),
    LOOM_HF_KEY("num_experts_per_tok", "moe_router_topk", LOOM_HF_INT, 2),
    LOOM_HF_KEY_REAL("router_aux_loss_coef", "moe_aux_loss_coeff", 0.001, 0, 1e6),
};

static const struct loom_hf_field hf_fields[] = {
    {"hidden_act", LOOM_HF_ONLY, "\"silu\""},
    {"output_router_logits", LOOM_HF_READ, NULL}, /* true: transformers' loss adds the balancing loss */
};

/* output_router_logits: true (transformers' loss adds router_aux_loss_coef
 * times its balancing loss over all layers) is --moe-router-load-balancing-type
 * hf_aux_loss with that weight; false or absent (its default: no balancing
 * loss) is Megatron's aux_loss at weight 0, so --moe-aux-loss-coeff alone
 * adds Megatron's. Defaults only: flags override them. */
static int hf_read(const char *path, const cJSON *j, struct loom_model_shape *shape)
{
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(j, "output_router_logits");
    if (v && !cJSON_IsBool(v)) return loom_hf_refuse(path, "Mixtral", v, "true or false");
    const int hf = cJSON_IsTrue(v);
    loom_model_shape_add_word(shape, "moe_router_load_balancing_type", hf ? "hf_aux_loss" : "aux_loss");
    for (int i = 0; !hf && i < shape->n; i++)
        if (strcmp(shape->kv[i].key, "moe_aux_loss_coeff") == 0) shape->kv[i].real = 0;
    return LOOM_OK;
}

static void hf_write(cJSON *j, const struct loom_model_shape *shape)
{
    const struct loom_shape_setting *t = loom_model_shape_find(shape, "moe_router_load_balancing_type");
    cJSON_AddBoolToObject(j, "output_router_logits", t && strcmp(t->word, "hf_aux_loss") == 0);
}

static const char *const architectures[] = {"MixtralForCausalLM", "MixtralModel", NULL};
static const struct loom_hf_map hf = {
    .model_type = "mixtral",
    .architectures = architectures,
    .keys = hf_keys,
    .nkeys = (int)(sizeof hf_keys / sizeof hf_keys[0]),
    .fields = hf_fields,
    .nfields = (int)(sizeof hf_fields / sizeof hf_fields[0]),
    .bos_token_id = 1,
    .eos_token_id = 2,
    .read = hf_read,
    .write = hf_write,
};

static const struct loom_decoder_def def = {
    .family = &loom_mixtral_family,
    .arch = &arch,
    .keys = keys,
    .nkeys = (int)(sizeof keys / sizeof keys[0]),
    .hf = &hf,
};

LOOM_HF_DECODER_FAMILY(loom_mixtral_family, def, "mixtral", "Mixtral", presets);
