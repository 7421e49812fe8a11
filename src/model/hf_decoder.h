/*
 * Hugging Face formats of a decoder family, generic over the family
 * (model/decoder_def.h): a weights source (a directory with
 * model.safetensors and config.json, or a safetensors file with loom's
 * metadata or a config.json beside it) read by the spec's tensor names,
 * saved as one safetensors file or a directory transformers loads
 * (model.safetensors, config.json, generation_config.json), and `loom
 * convert` between them and loom checkpoints (model/convert.h).
 *
 * config.json is read strictly (io/hf_config.h) through the family's table
 * (struct loom_hf_map): its model_type and architectures, each key that is
 * a shape setting with transformers' default, the keys held at the one
 * value loom computes, and those without effect on the function. The same
 * table writes it. Not here: GPT-2's own formats (Conv1D's layout, llm.c
 * checkpoints: gpt2_io.c, gpt2_llmc.c).
 */
#ifndef LOOM_MODEL_HF_DECODER_H
#define LOOM_MODEL_HF_DECODER_H

#include <cjson/cJSON.h>

#include "io/hf_config.h"
#include "io/model_shape.h"
#include "model/convert.h"
#include "model/decoder.h"
#include "model/decoder_def.h"
#include "model/decoder_family.h"
#include "model/family.h"

/* How a config.json key gives a shape setting. */
enum loom_hf_key_kind {
    LOOM_HF_INT = 0,    /* an integer from 1 to 2^24 */
    LOOM_HF_REAL = 1,   /* a number in [lo, hi] */
    LOOM_HF_UNTIED = 2, /* tie_word_embeddings: true or false, the setting its negation */
    LOOM_HF_WINDOW = 3, /* sliding_window S: null (none) or an integer; the setting is loom's window S + 1 */
};

struct loom_hf_key {
    const char *hf;      /* "num_hidden_layers" */
    const char *setting; /* "num_layers" */
    enum loom_hf_key_kind kind;
    double def;          /* transformers' default when absent (LOOM_HF_WINDOW: 0 for null) */
    const char *def_key; /* or the value of this earlier key ("num_attention_heads"); NULL: def */
    double lo, hi;       /* LOOM_HF_REAL */
};

#define LOOM_HF_KEY(hf, setting, kind, def)                                                                  \
    {                                                                                                        \
        hf, setting, kind, def, NULL, 0, 0                                                                   \
    }
#define LOOM_HF_KEY_OF(hf, setting, def_key)                                                                 \
    {                                                                                                        \
        hf, setting, LOOM_HF_INT, 0, def_key, 0, 0                                                           \
    }
#define LOOM_HF_KEY_REAL(hf, setting, def, lo, hi)                                                           \
    {                                                                                                        \
        hf, setting, LOOM_HF_REAL, def, NULL, lo, hi                                                         \
    }

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
    /* Optional: what the family reads beyond the keys (LOOM_ERR_INPUT through
     * loom_hf_refuse), and writes. */
    int (*read)(const char *path, const cJSON *j, struct loom_model_shape *shape);
    void (*write)(cJSON *j, const struct loom_model_shape *shape);
};

/* The tensor names of LlamaForCausalLM, which Mistral, Qwen2 and Gemma keep. */
extern const struct loom_decoder_names loom_hf_decoder_names;

/* One line refusing config.json's member v: "PATH: NAME is VALUE; loom's
 * TITLE supports SUPPORTED". */
int loom_hf_refuse(const char *path, const char *title, const cJSON *v, const char *supported);

/* The shape a source states: loom's metadata in the safetensors file, or
 * the config.json in its directory (checked against the token table). */
int loom_hf_source_shape(const struct loom_decoder_def *d, const char *path, struct loom_model_shape *out);
/* config.json at path as the family's shape. */
int loom_hf_read_config(const struct loom_decoder_def *d, const char *path, struct loom_model_shape *out);
/* A source's weights into m's float32 parameters. A pipeline stage skips the
 * other stages' tensors; a tensor of no layer of the whole model is refused
 * (an LM head of its own beside a tied model included). */
int loom_hf_load(struct loom_model *m, const char *path);
/* One safetensors file under the spec's names, with loom's metadata. */
int loom_hf_save(struct loom_model *m, const char *path);
/* A directory transformers loads. */
int loom_hf_save_dir(struct loom_model *m, const char *dir);

/* `loom convert` of a decoder family's weights (env->family's). */
extern const struct loom_model_converter loom_hf_converter;

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
        (void)cfg;                                                                                           \
        return loom_hf_source_shape(&DEF, path, out);                                                        \
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
        .describe = loom_decoder_def_describe,                                                               \
        .shape_of = VAR##_shape_of,                                                                          \
        .apply_shape = VAR##_apply_shape,                                                                    \
        .read_shape = VAR##_read_shape,                                                                      \
        .load_weights = loom_hf_load,                                                                        \
        .save_weights = loom_hf_save,                                                                        \
        .converter = &loom_hf_converter,                                                                     \
        .decoder = &DEF,                                                                                     \
    }

#endif
