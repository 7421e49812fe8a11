/*
 * Llama (Hugging Face's LlamaForCausalLM) as a decoder family
 * (model/decoder_def.h): the embedding block (model.embed_tokens), L layers
 * (RMSNorm, grouped-query attention with rotary position embedding,
 * RMSNorm, SwiGLU MLP; no biases; projections [out, in] as nn.Linear keeps
 * them), the head block (model.norm, and lm_head when untied). Its
 * presets (a tiny one for the built-in corpus and the published shapes of
 * TinyLlama 1.1B, Llama 2 7B and Llama 3 8B), its shape settings and its
 * config.json (LlamaConfig). The
 * model, its weights formats and `loom convert` are generic (decoder.h,
 * hf_decoder.h).
 */
#include <limits.h>

#include "base/log.h"
#include "model/hf_decoder.h"

/* clang-format off */
#define LLAMA_ARCH {"--normalization", "RMSNorm"}, {"--position-embedding-type", "rope"}, {"--swiglu", "1"}, \
                   {"--disable-bias-linear", "1"}, {"--group-query-attention", "1"}
static const struct loom_model_preset presets[] = {
    {.name = "llama-tiny", .summary = "Llama shape, 4 layers x 128 channels, 4 heads, 2 key/value heads, bytes",
     .settings = {LLAMA_ARCH, {"--num-layers", "4"}, {"--hidden-size", "128"}, {"--num-attention-heads", "4"},
                  {"--num-query-groups", "2"}, {"--ffn-hidden-size", "352"}, {"--seq-length", "64"},
                  {"--max-position-embeddings", "64"}, {"--vocab-size", "256"}, {"--norm-epsilon", "1e-5"},
                  LOOM_TINY_TRAINING}},
    {.name = "tinyllama-1.1b", .summary = "TinyLlama 1.1B (22 layers, 2048 channels, 4 key/value heads)",
     .settings = {LLAMA_ARCH, {"--num-layers", "22"}, {"--hidden-size", "2048"}, {"--num-attention-heads", "32"},
                  {"--num-query-groups", "4"}, {"--ffn-hidden-size", "5632"}, {"--seq-length", "2048"},
                  {"--max-position-embeddings", "2048"}, {"--vocab-size", "32000"}, {"--norm-epsilon", "1e-5"},
                  {"--untie-embeddings-and-output-weights", "1"}, LOOM_REAL_TRAINING("4e-4")}},
    {.name = "llama2-7b", .summary = "Llama 2 7B (32 layers, 4096 channels)",
     .settings = {LLAMA_ARCH, {"--num-layers", "32"}, {"--hidden-size", "4096"}, {"--num-attention-heads", "32"},
                  {"--num-query-groups", "32"}, {"--ffn-hidden-size", "11008"}, {"--seq-length", "4096"},
                  {"--max-position-embeddings", "4096"}, {"--vocab-size", "32000"}, {"--norm-epsilon", "1e-5"},
                  {"--untie-embeddings-and-output-weights", "1"}, LOOM_REAL_TRAINING("3e-4")}},
    {.name = "llama3-8b", .summary = "Llama 3 8B (32 layers, 4096 channels, 8 key/value heads, theta 500000)",
     .settings = {LLAMA_ARCH, {"--num-layers", "32"}, {"--hidden-size", "4096"}, {"--num-attention-heads", "32"},
                  {"--num-query-groups", "8"}, {"--ffn-hidden-size", "14336"}, {"--seq-length", "8192"},
                  {"--max-position-embeddings", "8192"}, {"--vocab-size", "128256"}, {"--norm-epsilon", "1e-5"},
                  {"--rotary-base", "500000"}, {"--untie-embeddings-and-output-weights", "1"},
                  LOOM_REAL_TRAINING("3e-4")}},
};
/* clang-format on */

static const struct loom_decoder_spec arch = {LOOM_HF_LLAMA_ARCH};

/* The shape as checkpoints record it: every setting that changes the function. */
static const struct loom_shape_key keys[] = {LOOM_DECODER_SHAPE_KEYS};

/* ---- config.json: transformers' LlamaConfig (4.39 and later) ---- */

static const struct loom_hf_key hf_keys[] = {
    LOOM_HF_LLAMA_KEYS(32, 4096, 32,
                       LOOM_HF_KEY_OF("num_key_value_heads", "num_query_groups", "num_attention_heads"),
                       11008, 2048, 32000, 1e-6, 1),
};

static const struct loom_hf_field hf_fields[] = {
    {"head_dim", LOOM_HF_READ, NULL},
    /* what changes the function: Llama's value only */
    {"hidden_act", LOOM_HF_ONLY, "\"silu\""},
    {"attention_bias", LOOM_HF_ONLY, "false"},
    {"mlp_bias", LOOM_HF_ONLY, "false"},
    {"rope_scaling", LOOM_HF_ONLY, "null"},
    {"pretraining_tp", LOOM_HF_ONLY, "1"},
};

/* head_dim, where given, is the one the heads make. */
static int hf_read(const char *path, const cJSON *j, struct loom_model_shape *shape)
{
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(j, "head_dim");
    const int C = (int)loom_model_shape_find(shape, "hidden_size")->value,
              NH = (int)loom_model_shape_find(shape, "num_attention_heads")->value;
    if (!v || cJSON_IsNull(v) || (cJSON_IsNumber(v) && v->valuedouble * NH == C)) return LOOM_OK;
    char want[64];
    snprintf(want, sizeof want, "hidden_size / num_attention_heads = %d", C / NH);
    return loom_hf_refuse(path, "Llama", v, want);
}

static const char *const architectures[] = {"LlamaForCausalLM", "LlamaModel", NULL};
static const struct loom_hf_map hf = {
    .model_type = "llama",
    .architectures = architectures,
    .keys = hf_keys,
    .nkeys = (int)(sizeof hf_keys / sizeof hf_keys[0]),
    .fields = hf_fields,
    .nfields = (int)(sizeof hf_fields / sizeof hf_fields[0]),
    .bos_token_id = 1,
    .eos_token_id = 2,
    .read = hf_read,
};

static const struct loom_decoder_def def = {
    .family = &loom_llama_family,
    .arch = &arch,
    .keys = keys,
    .nkeys = (int)(sizeof keys / sizeof keys[0]),
    .hf = &hf,
};

LOOM_HF_DECODER_FAMILY(loom_llama_family, def, "llama", "Llama", presets);
