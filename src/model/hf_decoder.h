/*
 * Hugging Face formats of a decoder family, generic over the family
 * (model/decoder_def.h): config.json read and written through the
 * family's table (struct loom_hf_map), a safetensors file's weights read by
 * the spec's tensor names, and the model saved as one safetensors file or a
 * directory transformers loads (model.safetensors, config.json,
 * generation_config.json).
 *
 * config.json is read strictly (io/hf_config.h): its model_type and
 * architectures, each key that is a shape setting with transformers'
 * default, the keys held at the one value loom computes, and those without
 * effect on the function. The same table writes it.
 *
 * A weights file may name the body under the LM head model's prefix (the
 * map's `prefix`, GPT-2's `transformer.`), hold transformers' buffers
 * (attention masks, rotary frequencies), tensors of loom's other formats
 * (`llmc.*`) and, beside a tied model's embedding, an LM head equal to it:
 * all accepted; any other tensor is refused. Not here: which file a source
 * names and what it states (model/source.h), llm.c's format (model/llmc.h),
 * `loom convert` (model/convert.h).
 */
#ifndef LOOM_MODEL_HF_DECODER_H
#define LOOM_MODEL_HF_DECODER_H

#include <cjson/cJSON.h>

#include "io/hf_config.h"
#include "io/model_shape.h"
#include "io/safetensors.h"
#include "model/convert.h"
#include "model/decoder.h"
#include "model/decoder_def.h"
#include "model/decoder_family.h"
#include "model/family.h"
#include "model/source.h"

/* How a config.json key gives a shape setting. */
enum loom_hf_key_kind {
    LOOM_HF_INT = 0,    /* an integer from 1 to 2^24 */
    LOOM_HF_REAL = 1,   /* a number in [lo, hi] */
    LOOM_HF_UNTIED = 2, /* tie_word_embeddings: true or false, the setting its negation */
    LOOM_HF_WINDOW = 3, /* sliding_window S: null (none) or an integer; the setting is loom's window S + 1 */
    LOOM_HF_WORD = 4,   /* a string among the key's words; the setting is the word it spells */
};

/* A config.json spelling of a word setting's value ("gelu_pytorch_tanh"
 * spells "gelu_new"); a setting's first spelling is the one written. */
struct loom_hf_word {
    const char *hf, *setting;
};

struct loom_hf_key {
    const char *hf;      /* "num_hidden_layers" */
    const char *setting; /* "num_layers" */
    enum loom_hf_key_kind kind;
    double def;          /* transformers' default when absent (LOOM_HF_WINDOW: 0 for null; LOOM_HF_WORD:
                          * the index of its spelling) */
    const char *def_key; /* or the value of this earlier key ("num_attention_heads"); NULL: def */
    double lo, hi;       /* LOOM_HF_REAL */
    const struct loom_hf_word *words; /* LOOM_HF_WORD: the spellings, NULL-ended */
};

#define LOOM_HF_KEY(hf, setting, kind, def)                                                                  \
    {                                                                                                        \
        hf, setting, kind, def, NULL, 0, 0, NULL                                                             \
    }
#define LOOM_HF_KEY_OF(hf, setting, def_key)                                                                 \
    {                                                                                                        \
        hf, setting, LOOM_HF_INT, 0, def_key, 0, 0, NULL                                                     \
    }
#define LOOM_HF_KEY_REAL(hf, setting, def, lo, hi)                                                           \
    {                                                                                                        \
        hf, setting, LOOM_HF_REAL, def, NULL, lo, hi, NULL                                                   \
    }
#define LOOM_HF_KEY_WORD(hf, setting, words, def)                                                            \
    {                                                                                                        \
        hf, setting, LOOM_HF_WORD, def, NULL, 0, 0, words                                                    \
    }

/* A published width and its heads ({768, 12}: GPT-2 124M). */
struct loom_hf_width {
    int hidden, heads;
};

struct loom_hf_map {
    const char *model_type;           /* "llama" */
    const char *const *architectures; /* those accepted, NULL-ended; the first is written */
    const struct loom_hf_key *keys;
    int nkeys;
    /* Every other field the family's config has: LOOM_HF_ONLY at its one
     * value (written with it), LOOM_HF_NO_EFFECT (written with `only` when
     * given), LOOM_HF_READ (read by `read`). */
    const struct loom_hf_field *fields;
    int nfields;
    int bos_token_id, eos_token_id; /* written in both JSON files */
    int end_of_text_last;           /* or both the vocabulary's last id (GPT-2's <|endoftext|>) */
    const char *config_class;       /* "GPT2Config", in messages; NULL: transformers' config */
    /* Optional: the prefix of the body's names under the LM head model
     * ("transformer."): read with or without it; written with it when the
     * head is untied (transformers then needs it). */
    const char *prefix;
    /* Optional: the heads of the family's published widths, {0, 0}-ended. A
     * safetensors file without config.json or loom's metadata is then read
     * by its tensors alone (model/source.h). */
    const struct loom_hf_width *widths;
    /* Optional: what the family reads beyond the keys (LOOM_ERR_INPUT through
     * loom_hf_refuse), and writes. */
    int (*read)(const char *path, const cJSON *j, struct loom_model_shape *shape);
    void (*write)(cJSON *j, const struct loom_model_shape *shape);
};

/* LlamaForCausalLM's architecture, which Mistral and Qwen2 keep (a spec's
 * initializer fields): RMSNorm, rotary positions, projections [out, in] as
 * nn.Linear keeps them, a SwiGLU MLP, weights normal(0, 0.02) (transformers'
 * initializer_range). A family adds its own fields after it. */
#define LOOM_HF_LLAMA_ARCH                                                                                   \
    .names = &loom_hf_decoder_names, .norm = LOOM_NORM_RMSNORM, .positions = LOOM_POSITION_ROPE,             \
    .weights = LOOM_WEIGHTS_OUT_IN, .mlp = LOOM_MLP_GATED, .activation = LOOM_MLP_SILU, .init_std = 0.02

/* LlamaConfig's shape keys, which Mistral, Qwen2 and Gemma keep, with a
 * family's transformers defaults: layers L, width C, heads NH, the key/value
 * heads' line KV (a LOOM_HF_KEY or LOOM_HF_KEY_OF), the MLP's width F,
 * positions P, vocabulary V, RMSNorm's eps, tie_word_embeddings' default
 * (UNTIED 1: false); rope_theta's default is 10000 in each. */
#define LOOM_HF_LLAMA_KEYS(L, C, NH, KV, F, P, V, EPS, UNTIED)                                               \
    LOOM_HF_KEY("num_hidden_layers", "num_layers", LOOM_HF_INT, L),                                          \
        LOOM_HF_KEY("hidden_size", "hidden_size", LOOM_HF_INT, C),                                           \
        LOOM_HF_KEY("num_attention_heads", "num_attention_heads", LOOM_HF_INT, NH), KV,                      \
        LOOM_HF_KEY("intermediate_size", "ffn_hidden_size", LOOM_HF_INT, F),                                 \
        LOOM_HF_KEY("max_position_embeddings", "max_position_embeddings", LOOM_HF_INT, P),                   \
        LOOM_HF_KEY("vocab_size", "vocab_size", LOOM_HF_INT, V),                                             \
        LOOM_HF_KEY_REAL("rms_norm_eps", "norm_epsilon", EPS, 0, 1),                                         \
        LOOM_HF_KEY_REAL("rope_theta", "rotary_base", 10000.0, 1, 1e12),                                     \
        LOOM_HF_KEY_REAL("attention_dropout", "attention_dropout", 0.0, 0, 1),                               \
        LOOM_HF_KEY("tie_word_embeddings", "untie_embeddings_and_output_weights", LOOM_HF_UNTIED, UNTIED)

/* LlamaForCausalLM's tensor names but the MLP's (a names initializer's
 * fields), which Mixtral keeps too. */
#define LOOM_HF_LLAMA_NAMES                                                                                  \
    .embedding = "model.embed_tokens", .layer = "model.layers.%d.", .norm1 = "input_layernorm",              \
    .q = "self_attn.q_proj", .k = "self_attn.k_proj", .v = "self_attn.v_proj", .o = "self_attn.o_proj",      \
    .norm2 = "post_attention_layernorm", .final_norm = "model.norm", .lm_head = "lm_head"

/* The tensor names of LlamaForCausalLM, which Mistral, Qwen2 and Gemma keep. */
extern const struct loom_decoder_names loom_hf_decoder_names;

/* One line refusing config.json's member v: "PATH: NAME is VALUE; loom's
 * TITLE supports SUPPORTED". */
int loom_hf_refuse(const char *path, const char *title, const cJSON *v, const char *supported);

/* config.json at path as the family's shape. */
int loom_hf_read_config(const struct loom_decoder_def *d, const char *path, struct loom_model_shape *out);
/* The hf key that gives a shape setting, or NULL. */
const struct loom_hf_key *loom_hf_key_of(const struct loom_hf_map *h, const char *setting);

/* A safetensors file's weights into m's float32 parameters. A pipeline
 * stage skips the other stages' tensors; a tensor of no layer of the whole
 * model is refused, and so is an LM head beside a tied model's embedding
 * that differs from it. */
int loom_hf_load(struct loom_model *m, const char *file);

/* Tensors and metadata another format keeps beside the model's (llm.c's
 * padding rows, model/llmc.h): meta[2 i] a key, meta[2 i + 1] its value. */
struct loom_hf_extra {
    const struct loom_st_tensor_in *tensors;
    int ntensors;
    const char *const *meta;
    int nmeta;
    /* a directory's weights above this many bytes go in shards of at most
     * it (one tensor larger alone), as save_pretrained's max_shard_size:
     * model-0000i-of-0000N.safetensors and model.safetensors.index.json;
     * 0: one file */
    int64_t max_shard_bytes;
};
/* One safetensors file under the spec's names, with loom's metadata (the
 * model's shape) and extra (NULL: none). */
int loom_hf_save_ext(struct loom_model *m, const char *path, const struct loom_hf_extra *extra);
int loom_hf_save(struct loom_model *m, const char *path);
/* A directory transformers loads. */
int loom_hf_save_dir(struct loom_model *m, const char *dir, const struct loom_hf_extra *extra);
/* dir/name written atomically: text (cJSON's print, freed here; NULL:
 * out of memory) and a line feed. */
int loom_hf_write_json(const char *dir, const char *name, char *text);

/* A decoder family's registry entry (model/family.h), `const struct
 * loom_model_family VAR`, from its definition DEF (with Hugging Face
 * formats), name, title and presets: every member generic. */
#define LOOM_HF_DECODER_FAMILY(VAR, DEF, NAME, TITLE, PRESETS)                                               \
    static int VAR##_check(const struct loom_config *cfg, int T)                                             \
    {                                                                                                        \
        return loom_decoder_def_check(&DEF, cfg, T);                                                         \
    }                                                                                                        \
    static struct loom_model *VAR##_create(const struct loom_config *cfg, int B, int T, int training,        \
                                           int tp_rank, int pp_rank)                                         \
    {                                                                                                        \
        return loom_decoder_def_create(&DEF, cfg, B, T, training, tp_rank, pp_rank);                         \
    }                                                                                                        \
    static void VAR##_shape_of(const struct loom_config *cfg, struct loom_model_shape *out)                  \
    {                                                                                                        \
        loom_decoder_def_shape_of(&DEF, cfg, out);                                                           \
    }                                                                                                        \
    static int VAR##_apply_shape(const struct loom_model_shape *shape, struct loom_config *cfg)              \
    {                                                                                                        \
        return loom_decoder_def_apply_shape(&DEF, shape, cfg);                                               \
    }                                                                                                        \
    static int VAR##_read_shape(const char *path, const struct loom_config *cfg,                             \
                                struct loom_model_shape *out)                                                \
    {                                                                                                        \
        return loom_source_read_shape(&DEF, path, cfg, out);                                                 \
    }                                                                                                        \
    const struct loom_model_family VAR = {                                                                   \
        .name = NAME,                                                                                        \
        .title = TITLE,                                                                                      \
        .presets = PRESETS,                                                                                  \
        .npresets = (int)(sizeof PRESETS / sizeof PRESETS[0]),                                               \
        .check = VAR##_check,                                                                                \
        .create = VAR##_create,                                                                              \
        .destroy = loom_decoder_destroy,                                                                     \
        .flops_per_token = loom_decoder_model_flops,                                                         \
        .moe_stats = loom_decoder_model_moe_stats,                                                           \
        .describe = loom_decoder_def_describe,                                                               \
        .shape_of = VAR##_shape_of,                                                                          \
        .apply_shape = VAR##_apply_shape,                                                                    \
        .read_shape = VAR##_read_shape,                                                                      \
        .load_weights = loom_source_load,                                                                    \
        .save_weights = loom_hf_save,                                                                        \
        .converter = &loom_decoder_converter,                                                                \
        .decoder = &DEF,                                                                                     \
    }

#endif
