/*
 * A decoder family as data (struct loom_decoder_def): the architecture (a
 * layer spec without its sizes), the shape settings as a table that ties
 * each to its configuration field and its spec field, and the check of
 * Megatron's architecture settings. From it, shared by every decoder family
 * (decoder_def.c): the spec of a configuration, the shape settings checked
 * (sizes, tensor-parallel splits, --layout-invariant pieces, sparsity), the
 * shape as files record it (model/family.h's shape_of and apply_shape), a
 * model's shape, and the one-line description.
 *
 * Megatron's settings that choose the architecture (--normalization,
 * --position-embedding-type, --swiglu, --disable-bias-linear,
 * --add-qkv-bias, --group-query-attention) are checked against it and, when
 * a file's shape is applied, set from it; --kv-channels is a family's only
 * where its table has it.
 *
 * A family's own file then holds its architecture, its table, its presets
 * and its Hugging Face mapping (model/hf_decoder.h), and wraps these calls in
 * its registry entry. Not here: the model (decoder.h), weights formats
 * (hf_decoder.h).
 */
#ifndef LOOM_MODEL_DECODER_DEF_H
#define LOOM_MODEL_DECODER_DEF_H

#include <limits.h>
#include <stddef.h>

#include "io/model_shape.h"
#include "loom/config.h"
#include "model/decoder.h"

struct loom_hf_map;

/* A shape setting: its key in files (its flag's name with '_'), the
 * configuration field and the spec field it is (int for INT, double for
 * REAL, an enum for WORD: words[value] its name in files, the same value in
 * both fields), its bounds, and the value of a file without it (an older
 * one; NULL: required). */
struct loom_shape_key {
    const char *key;
    size_t cfg, spec;
    enum loom_shape_kind kind;
    double lo, hi;
    const char *const *words; /* WORD: the names, NULL-ended */
    const char *absent;
    int quiet; /* unsaid in files of a dense model (the MoE settings); 2: also a default only, which a
                * flag overrides (the balancing loss); 3: said in every file, a default only (dropout) */
};
#define LOOM_SHAPE_KEY(key, cfg_field, spec_field, kind, lo, hi)                                             \
    LOOM_SHAPE_KEY_OR(key, cfg_field, spec_field, kind, lo, hi, NULL)
#define LOOM_SHAPE_KEY_OR(key, cfg_field, spec_field, kind, lo, hi, absent)                                  \
    {                                                                                                        \
        key, offsetof(struct loom_config, cfg_field), offsetof(struct loom_decoder_spec, spec_field), kind,  \
            lo, hi, NULL, absent, 0                                                                          \
    }
#define LOOM_SHAPE_KEY_QUIET(key, cfg_field, spec_field, lo, hi, absent)                                     \
    {                                                                                                        \
        key, offsetof(struct loom_config, cfg_field), offsetof(struct loom_decoder_spec, spec_field),        \
            LOOM_SHAPE_INT, lo, hi, NULL, absent, 1                                                          \
    }
/* A real setting every file records but only as a default, which a flag
 * overrides (dropout's p). */
#define LOOM_SHAPE_KEY_DEFAULT(key, cfg_field, spec_field, lo, hi, absent)                                   \
    {                                                                                                        \
        key, offsetof(struct loom_config, cfg_field), offsetof(struct loom_decoder_spec, spec_field),        \
            LOOM_SHAPE_REAL, lo, hi, NULL, absent, 3                                                         \
    }
#define LOOM_SHAPE_KEY_WORD(key, cfg_field, spec_field, words, absent)                                       \
    {                                                                                                        \
        key, offsetof(struct loom_config, cfg_field), offsetof(struct loom_decoder_spec, spec_field),        \
            LOOM_SHAPE_WORD, 0, 0, words, absent, 0                                                          \
    }

/* The shape settings every decoder family records (a family adds its own). */
#define LOOM_DECODER_SHAPE_KEYS                                                                              \
    LOOM_SHAPE_KEY("num_layers", num_layers, num_layers, LOOM_SHAPE_INT, 1, INT_MAX),                        \
        LOOM_SHAPE_KEY("hidden_size", hidden_size, hidden, LOOM_SHAPE_INT, 1, INT_MAX),                      \
        LOOM_SHAPE_KEY("num_attention_heads", num_attention_heads, heads, LOOM_SHAPE_INT, 1, INT_MAX),       \
        LOOM_SHAPE_KEY("num_query_groups", num_query_groups, kv_heads, LOOM_SHAPE_INT, 1, INT_MAX),          \
        LOOM_SHAPE_KEY("ffn_hidden_size", ffn_hidden_size, ffn, LOOM_SHAPE_INT, 1, INT_MAX),                 \
        LOOM_SHAPE_KEY("max_position_embeddings", max_position_embeddings, max_pos, LOOM_SHAPE_INT, 1,       \
                       INT_MAX),                                                                             \
        LOOM_SHAPE_KEY("vocab_size", vocab_size, vocab, LOOM_SHAPE_INT, 2, INT_MAX),                         \
        LOOM_SHAPE_KEY("norm_epsilon", norm_epsilon, norm_eps, LOOM_SHAPE_REAL, 0, 1),                       \
        LOOM_SHAPE_KEY("rotary_base", rotary_base, rope_theta, LOOM_SHAPE_REAL, 1, 1e12),                    \
        LOOM_SHAPE_KEY("untie_embeddings_and_output_weights", untie_embeddings_and_output_weights, untied,   \
                       LOOM_SHAPE_INT, 0, 1),                                                                \
        LOOM_DECODER_MOE_KEYS, LOOM_DECODER_DROPOUT_KEYS

/* Dropout's p as files record them (Hugging Face's configs do): a
 * training setting more than a shape, so a flag overrides a file's. */
#define LOOM_DECODER_DROPOUT_KEYS                                                                            \
    LOOM_SHAPE_KEY_DEFAULT("hidden_dropout", hidden_dropout, hidden_dropout, 0, 1, "0"),                     \
        LOOM_SHAPE_KEY_DEFAULT("attention_dropout", attention_dropout, attention_dropout, 0, 1, "0"),        \
        LOOM_SHAPE_KEY_DEFAULT("embedding_dropout", embedding_dropout, embedding_dropout, 0, 1, "0")

/* The mixture of experts' shape settings (every decoder family records them
 * for a model with experts). */
#define LOOM_DECODER_MOE_KEYS                                                                                \
    LOOM_SHAPE_KEY_QUIET("num_experts", num_experts, experts, 0, 1 << 16, "0"),                              \
        LOOM_SHAPE_KEY_QUIET("moe_router_topk", moe_router_topk, topk, 1, 1 << 16, "2"),                     \
        LOOM_SHAPE_KEY_QUIET("moe_ffn_hidden_size", moe_ffn_hidden_size, moe_ffn, 0, INT_MAX, "0"),          \
        LOOM_SHAPE_KEY_QUIET("moe_shared_expert_intermediate_size", moe_shared_expert_intermediate_size,     \
                             shared_ffn, 0, INT_MAX, "0"),                                                   \
        {"moe_layer_freq",                                                                                   \
         offsetof(struct loom_config, moe_layer_freq),                                                       \
         offsetof(struct loom_decoder_spec, moe_layers),                                                     \
         LOOM_SHAPE_LAYERS,                                                                                  \
         0,                                                                                                  \
         0,                                                                                                  \
         NULL,                                                                                               \
         "1",                                                                                                \
         1},                                                                                                 \
        LOOM_SHAPE_KEY_QUIET("moe_router_pre_softmax", moe_router_pre_softmax, pre_softmax, 0, 1, "0"),      \
        {"moe_router_load_balancing_type",                                                                   \
         offsetof(struct loom_config, moe_router_load_balancing_type),                                       \
         offsetof(struct loom_decoder_spec, balance),                                                        \
         LOOM_SHAPE_WORD,                                                                                    \
         0,                                                                                                  \
         0,                                                                                                  \
         loom_moe_balance_names,                                                                             \
         "aux_loss",                                                                                         \
         2},                                                                                                 \
    {                                                                                                        \
        "moe_aux_loss_coeff", offsetof(struct loom_config, moe_aux_loss_coeff),                              \
            offsetof(struct loom_decoder_spec, aux_coeff), LOOM_SHAPE_REAL, 0, 1e6, NULL, "0", 2             \
    }

/* Presets' training settings: a tiny model on the built-in corpus, and a
 * real size (its peak learning rate). */
#define LOOM_TINY_TRAINING                                                                                   \
    {"--train-iters", "1200"}, {"--lr-warmup-iters", "100"}, {"--eval-interval", "200"},                     \
        {"--log-interval", "100"}, {"--lr", "3e-3"},                                                         \
    {                                                                                                        \
        "--micro-batch-size", "16"                                                                           \
    }
#define LOOM_REAL_TRAINING(lr)                                                                               \
    {"--train-iters", "1000"}, {"--lr-warmup-iters", "100"}, {"--eval-interval", "250"},                     \
        {"--log-interval", "1"}, {"--lr", lr},                                                               \
    {                                                                                                        \
        "--micro-batch-size", "1"                                                                            \
    }

struct loom_decoder_def {
    const struct loom_model_family *family;
    /* Every spec field the shape settings do not give (norm, positions,
     * MLP, biases, names, initialisation). */
    const struct loom_decoder_spec *arch;
    const struct loom_shape_key *keys;
    int nkeys;
    /* Optional: the spec's fields that follow from its sizes (Gemma's
     * embedding scale, sqrt(C)). */
    void (*finish)(struct loom_decoder_spec *s);
    /* config.json (hf_decoder.h); NULL: no Hugging Face formats */
    const struct loom_hf_map *hf;
};

/* cfg with the values the family derives filled in: the key/value heads
 * (the heads unless --group-query-attention gives groups) and the MLP's
 * width (Megatron's rule when not given: 4 C, gated 2/3 of it down to a
 * multiple of 64). */
struct loom_config loom_decoder_def_resolve(const struct loom_decoder_def *d, const struct loom_config *cfg);
/* The layer spec of cfg. */
struct loom_decoder_spec loom_decoder_def_spec(const struct loom_decoder_def *d,
                                               const struct loom_config *cfg);
/* model/family.h's check: the architecture, the sizes, the splits of
 * --tensor-model-parallel-size and --layout-invariant, sparsity. */
int loom_decoder_def_check(const struct loom_decoder_def *d, const struct loom_config *cfg, int T);
/* The sizes alone: the spec of cfg can be built for sequences of T (a
 * weights file's shape, without the run's settings). */
int loom_decoder_def_check_sizes(const struct loom_decoder_def *d, const struct loom_config *cfg, int T);
/* model/family.h's create and describe. */
struct loom_model *loom_decoder_def_create(const struct loom_decoder_def *d, const struct loom_config *cfg,
                                           int B, int T, int training, int tp_rank, int pp_rank);
void loom_decoder_def_describe(const struct loom_model *m, char *buf, size_t n);
/* The shape as files record it (model/family.h's shape_of, apply_shape),
 * and a model's. */
void loom_decoder_def_shape_of(const struct loom_decoder_def *d, const struct loom_config *cfg,
                               struct loom_model_shape *out);
int loom_decoder_def_apply_shape(const struct loom_decoder_def *d, const struct loom_model_shape *shape,
                                 struct loom_config *cfg);
void loom_decoder_def_model_shape(const struct loom_decoder_def *d, const struct loom_decoder *m,
                                  struct loom_model_shape *out);
/* Whether the file's value of shape setting `key` is a default only, which
 * a flag given overrides (the balancing loss's form and weight). */
int loom_decoder_def_flag_wins(const struct loom_decoder_def *d, const char *key);
/* The definition behind a model a decoder family built, or NULL. */
const struct loom_decoder_def *loom_decoder_def_of(const struct loom_model *m);

#endif
