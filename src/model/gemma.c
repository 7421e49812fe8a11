/*
 * Gemma (Hugging Face's GemmaForCausalLM) as a decoder family
 * (model/decoder_def.h): RMSNorm applied as (1 + w) (its weights start at
 * zero), the embedding's output scaled by sqrt(C) (rounded to float32, as
 * transformers computes it), a GeGLU MLP (gelu_pytorch_tanh), a head width
 * of its own (--kv-channels: Gemma 7B's 16 heads of 256 on 3072 channels),
 * multi-query attention in 2B, a tied head. Its presets (a tiny one for the
 * built-in corpus, Gemma 2B), its shape settings (Llama's and the head
 * width) and its config.json (GemmaConfig).
 */
#include <math.h>
#include <string.h>

#include "base/log.h"
#include "model/hf_decoder.h"

/* clang-format off */
#define GEMMA_ARCH {"--normalization", "RMSNorm"}, {"--position-embedding-type", "rope"}, \
                   {"--disable-bias-linear", "1"}, {"--group-query-attention", "1"}
static const struct loom_model_preset presets[] = {
    {.name = "gemma-tiny", .summary = "Gemma shape, 4 layers x 128 channels, 4 heads of 48, GeGLU, bytes",
     .settings = {GEMMA_ARCH, {"--num-layers", "4"}, {"--hidden-size", "128"}, {"--num-attention-heads", "4"},
                  {"--num-query-groups", "2"}, {"--kv-channels", "48"}, {"--ffn-hidden-size", "512"},
                  {"--seq-length", "64"}, {"--max-position-embeddings", "64"}, {"--vocab-size", "256"},
                  {"--norm-epsilon", "1e-6"}, LOOM_TINY_TRAINING}},
    {.name = "gemma-2b", .summary = "Gemma 2B (18 layers, 2048 channels, 8 heads of 256, 1 key/value head)",
     .settings = {GEMMA_ARCH, {"--num-layers", "18"}, {"--hidden-size", "2048"}, {"--num-attention-heads", "8"},
                  {"--num-query-groups", "1"}, {"--kv-channels", "256"}, {"--ffn-hidden-size", "16384"},
                  {"--seq-length", "8192"}, {"--max-position-embeddings", "8192"}, {"--vocab-size", "256000"},
                  {"--norm-epsilon", "1e-6"}, LOOM_REAL_TRAINING("3e-4")}},
};
/* clang-format on */

/* Llama's, with RMSNorm's weight as (1 + w) and GeGLU */
static const struct loom_decoder_spec arch = {
    .names = &loom_hf_decoder_names,
    .norm = LOOM_NORM_RMSNORM,
    .norm_offset = 1.0,
    .positions = LOOM_POSITION_ROPE,
    .weights = LOOM_WEIGHTS_OUT_IN,
    .mlp = LOOM_MLP_GATED,
    .activation = LOOM_MLP_GELU_TANH,
    .init_std = 0.02,
};

/* transformers' normalizer: hidden_size ** 0.5 as a float32 tensor */
static void finish(struct loom_decoder_spec *s)
{
    s->embed_scale = (float)sqrt((double)s->hidden);
}

static const struct loom_shape_key keys[] = {
    LOOM_DECODER_SHAPE_KEYS,
    LOOM_SHAPE_KEY("kv_channels", kv_channels, head_dim, LOOM_SHAPE_INT, 1, INT_MAX),
};

/* transformers' GemmaConfig (4.39) */
static const struct loom_hf_key hf_keys[] = {
    LOOM_HF_LLAMA_KEYS(28, 3072, 16, LOOM_HF_KEY("num_key_value_heads", "num_query_groups", LOOM_HF_INT, 16),
                       24576, 8192, 256000, 1e-6, 0),
    LOOM_HF_KEY("head_dim", "kv_channels", LOOM_HF_INT, 256),
};

static const struct loom_hf_field hf_fields[] = {
    {"hidden_act", LOOM_HF_READ, NULL},
    {"hidden_activation", LOOM_HF_READ, NULL},
    {"attention_bias", LOOM_HF_ONLY, "false"},
};

/* 4.39 computes gelu_pytorch_tanh unless hidden_activation names another;
 * hidden_act is then a legacy name ("gelu" in the first Gemma configs). */
static int hf_read(const char *path, const cJSON *j, struct loom_model_shape *shape)
{
    (void)shape;
    const cJSON *act = cJSON_GetObjectItemCaseSensitive(j, "hidden_activation"),
                *legacy = cJSON_GetObjectItemCaseSensitive(j, "hidden_act");
    if (act && !cJSON_IsNull(act) &&
        !(cJSON_IsString(act) && strcmp(act->valuestring, "gelu_pytorch_tanh") == 0))
        return loom_hf_refuse(path, "Gemma", act, "null or \"gelu_pytorch_tanh\"");
    if (legacy && !(cJSON_IsString(legacy) && (strcmp(legacy->valuestring, "gelu") == 0 ||
                                               strcmp(legacy->valuestring, "gelu_pytorch_tanh") == 0)))
        return loom_hf_refuse(path, "Gemma", legacy, "\"gelu\" or \"gelu_pytorch_tanh\"");
    return LOOM_OK;
}

static void hf_write(cJSON *j, const struct loom_model_shape *shape)
{
    (void)shape;
    cJSON_AddStringToObject(j, "hidden_act", "gelu_pytorch_tanh");
    cJSON_AddStringToObject(j, "hidden_activation", "gelu_pytorch_tanh");
}

static const char *const architectures[] = {"GemmaForCausalLM", "GemmaModel", NULL};
static const struct loom_hf_map hf = {
    .model_type = "gemma",
    .architectures = architectures,
    .keys = hf_keys,
    .nkeys = (int)(sizeof hf_keys / sizeof hf_keys[0]),
    .fields = hf_fields,
    .nfields = (int)(sizeof hf_fields / sizeof hf_fields[0]),
    .bos_token_id = 2,
    .eos_token_id = 1,
    .read = hf_read,
    .write = hf_write,
};

static const struct loom_decoder_def def = {
    .family = &loom_gemma_family,
    .arch = &arch,
    .keys = keys,
    .nkeys = (int)(sizeof keys / sizeof keys[0]),
    .finish = finish,
    .hf = &hf,
};

LOOM_HF_DECODER_FAMILY(loom_gemma_family, def, "gemma", "Gemma", presets);
