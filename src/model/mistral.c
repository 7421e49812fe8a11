/*
 * Mistral (Hugging Face's MistralForCausalLM) as a decoder family
 * (model/decoder_def.h): Llama's layers with sliding-window attention. Its
 * presets (a tiny one for the built-in corpus, Mistral 7B v0.1), its shape
 * settings (Llama's and the window) and its config.json (MistralConfig).
 *
 * The window: transformers 4.39's masks (eager, and flash-attention's
 * window_size) let query i see keys i - S .. i for sliding_window S, S + 1
 * keys, which is loom's --attention-window S + 1 (i - W < j <= i); null is
 * none, and a window at least the sequence is dense. (4.39's sdpa path
 * ignores sliding_window: compare against eager.)
 */
#include "base/log.h"
#include "model/hf_decoder.h"

/* clang-format off */
#define MISTRAL_ARCH {"--normalization", "RMSNorm"}, {"--position-embedding-type", "rope"}, {"--swiglu", "1"}, \
                     {"--disable-bias-linear", "1"}, {"--group-query-attention", "1"}
static const struct loom_model_preset presets[] = {
    {.name = "mistral-tiny", .summary = "Mistral shape, 4 layers x 128 channels, window 32 + 1 of 64 tokens, bytes",
     .settings = {MISTRAL_ARCH, {"--num-layers", "4"}, {"--hidden-size", "128"}, {"--num-attention-heads", "4"},
                  {"--num-query-groups", "2"}, {"--ffn-hidden-size", "384"}, {"--seq-length", "64"},
                  {"--max-position-embeddings", "64"}, {"--vocab-size", "256"}, {"--norm-epsilon", "1e-5"},
                  {"--attention-window", "33"}, {"--untie-embeddings-and-output-weights", "1"},
                  LOOM_TINY_TRAINING}},
    {.name = "mistral-7b", .summary = "Mistral 7B v0.1 (32 layers, 4096 channels, 8 key/value heads, window 4096)",
     .settings = {MISTRAL_ARCH, {"--num-layers", "32"}, {"--hidden-size", "4096"}, {"--num-attention-heads", "32"},
                  {"--num-query-groups", "8"}, {"--ffn-hidden-size", "14336"}, {"--seq-length", "8192"},
                  {"--max-position-embeddings", "32768"}, {"--vocab-size", "32000"}, {"--norm-epsilon", "1e-5"},
                  {"--attention-window", "4097"}, {"--untie-embeddings-and-output-weights", "1"},
                  LOOM_REAL_TRAINING("3e-4")}},
};
/* clang-format on */

static const struct loom_decoder_spec arch = {LOOM_HF_LLAMA_ARCH};

static const struct loom_shape_key keys[] = {
    LOOM_DECODER_SHAPE_KEYS,
    LOOM_SHAPE_KEY("attention_window", attention_window, window, LOOM_SHAPE_INT, 0, INT_MAX),
};

/* transformers' MistralConfig (4.39) */
static const struct loom_hf_key hf_keys[] = {
    LOOM_HF_LLAMA_KEYS(32, 4096, 32, LOOM_HF_KEY("num_key_value_heads", "num_query_groups", LOOM_HF_INT, 8),
                       14336, 4096 * 32, 32000, 1e-6, 1),
    LOOM_HF_KEY("sliding_window", "attention_window", LOOM_HF_WINDOW, 4096 + 1),
};

static const struct loom_hf_field hf_fields[] = {
    {"hidden_act", LOOM_HF_ONLY, "\"silu\""},
};

static const char *const architectures[] = {"MistralForCausalLM", "MistralModel", NULL};
static const struct loom_hf_map hf = {
    .model_type = "mistral",
    .architectures = architectures,
    .keys = hf_keys,
    .nkeys = (int)(sizeof hf_keys / sizeof hf_keys[0]),
    .fields = hf_fields,
    .nfields = (int)(sizeof hf_fields / sizeof hf_fields[0]),
    .bos_token_id = 1,
    .eos_token_id = 2,
};

static const struct loom_decoder_def def = {
    .family = &loom_mistral_family,
    .arch = &arch,
    .keys = keys,
    .nkeys = (int)(sizeof keys / sizeof keys[0]),
    .hf = &hf,
};

LOOM_HF_DECODER_FAMILY(loom_mistral_family, def, "mistral", "Mistral", presets);
