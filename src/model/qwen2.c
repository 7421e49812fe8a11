/*
 * Qwen2 (Hugging Face's Qwen2ForCausalLM) as a decoder family
 * (model/decoder_def.h): Llama's layers with biases on the query, key and
 * value projections (Megatron's --add-qkv-bias), a large rotary base and a
 * tied or untied head. Its presets (a tiny one for the built-in corpus,
 * Qwen2 0.5B), its shape settings and its config.json (Qwen2Config).
 *
 * Qwen2's sliding window is off in every published model
 * (use_sliding_window false: the function is dense attention, which sdpa
 * and flash-attention compute); true is refused. 4.39's eager path applies
 * sliding_window regardless, so it agrees while sequences are within it.
 */
#include "base/log.h"
#include "model/hf_decoder.h"

/* clang-format off */
#define QWEN2_ARCH {"--normalization", "RMSNorm"}, {"--position-embedding-type", "rope"}, {"--swiglu", "1"}, \
                   {"--disable-bias-linear", "1"}, {"--add-qkv-bias", "1"}, {"--group-query-attention", "1"}
static const struct loom_model_preset presets[] = {
    {.name = "qwen2-tiny", .summary = "Qwen2 shape, 4 layers x 128 channels, q/k/v biases, untied head, bytes",
     .settings = {QWEN2_ARCH, {"--num-layers", "4"}, {"--hidden-size", "128"}, {"--num-attention-heads", "4"},
                  {"--num-query-groups", "2"}, {"--ffn-hidden-size", "320"}, {"--seq-length", "64"},
                  {"--max-position-embeddings", "64"}, {"--vocab-size", "256"}, {"--norm-epsilon", "1e-6"},
                  {"--rotary-base", "1000000"}, {"--untie-embeddings-and-output-weights", "1"},
                  LOOM_TINY_TRAINING}},
    {.name = "qwen2-0.5b", .summary = "Qwen2 0.5B (24 layers, 896 channels, 14 heads, 2 key/value heads, tied)",
     .settings = {QWEN2_ARCH, {"--num-layers", "24"}, {"--hidden-size", "896"}, {"--num-attention-heads", "14"},
                  {"--num-query-groups", "2"}, {"--ffn-hidden-size", "4864"}, {"--seq-length", "4096"},
                  {"--max-position-embeddings", "131072"}, {"--vocab-size", "151936"},
                  {"--norm-epsilon", "1e-6"}, {"--rotary-base", "1000000"}, LOOM_REAL_TRAINING("3e-4")}},
};
/* clang-format on */

static const struct loom_decoder_spec arch = {LOOM_HF_LLAMA_ARCH, .qkv_bias = 1};

static const struct loom_shape_key keys[] = {LOOM_DECODER_SHAPE_KEYS};

/* transformers' Qwen2Config (4.39) */
static const struct loom_hf_key hf_keys[] = {
    LOOM_HF_LLAMA_KEYS(32, 4096, 32, LOOM_HF_KEY("num_key_value_heads", "num_query_groups", LOOM_HF_INT, 32),
                       22016, 32768, 151936, 1e-6, 1),
};

static const struct loom_hf_field hf_fields[] = {
    {"hidden_act", LOOM_HF_ONLY, "\"silu\""},
    {"use_sliding_window", LOOM_HF_ONLY, "false"},
    /* without effect while use_sliding_window is false (written null: 4.39's eager path, which applies
     * it regardless, then computes the same dense attention) */
    {"sliding_window", LOOM_HF_NO_EFFECT, "null"},
    {"max_window_layers", LOOM_HF_NO_EFFECT, NULL},
};

static const char *const architectures[] = {"Qwen2ForCausalLM", "Qwen2Model", NULL};
static const struct loom_hf_map hf = {
    .model_type = "qwen2",
    .architectures = architectures,
    .keys = hf_keys,
    .nkeys = (int)(sizeof hf_keys / sizeof hf_keys[0]),
    .fields = hf_fields,
    .nfields = (int)(sizeof hf_fields / sizeof hf_fields[0]),
    .bos_token_id = 151643,
    .eos_token_id = 151643,
};

static const struct loom_decoder_def def = {
    .family = &loom_qwen2_family,
    .arch = &arch,
    .keys = keys,
    .nkeys = (int)(sizeof keys / sizeof keys[0]),
    .hf = &hf,
};

LOOM_HF_DECODER_FAMILY(loom_qwen2_family, def, "qwen2", "Qwen2", presets);
