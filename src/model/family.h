/*
 * Model families: the registry the trainer, the configuration, checkpoints
 * and the CLI consult instead of naming a model. A family (GPT-2, Llama, ...) gives its presets, checks its
 * shape settings, builds a model for a micro-batch shape, counts its FLOPs, and reads and writes the shape a
 * weights file or a checkpoint records. Everything else (blocks, tensors, forward and backward over a range
 * of blocks) is the model interface, loom/model.h.
 *
 * Adding a decoder family: one `src/model/<name>.c` holding its definition
 * (model/decoder_def.h: architecture, shape settings, presets, Hugging Face
 * mapping) and its `const struct loom_model_family`, a line in family.c's
 * table and its extern below. Not here: the model interface itself, weights
 * formats (model/hf_decoder.h, model/source.h, model/llmc.h).
 */
#ifndef LOOM_MODEL_FAMILY_H
#define LOOM_MODEL_FAMILY_H

#include <stddef.h>
#include <stdint.h>

#include "io/model_shape.h"
#include "loom/config.h"
#include "loom/model.h"

struct loom_model_converter;
struct loom_decoder_def;

#define LOOM_PRESET_MAX_SETTINGS 32

/* A preset (--model NAME): settings applied with the origin "preset", below
 * the JSON config and the flags, each as the flag and its value as text. */
struct loom_model_preset {
    const char *name;    /* "gpt2-tiny" */
    const char *summary; /* one line for --help: "GPT-2 124M" */
    struct {
        const char *flag, *value; /* "--num-layers", "12" */
    } settings[LOOM_PRESET_MAX_SETTINGS];
};

struct loom_model_family {
    const char *name;  /* "gpt2": the model_type in checkpoints and config.json */
    const char *title; /* "GPT-2", for reports */
    const struct loom_model_preset *presets;
    int npresets;
    /* The shape settings (cfg's model fields) make a model of this family
     * for sequences of T: LOOM_ERR_INPUT naming the flag otherwise. */
    int (*check)(const struct loom_config *cfg, int T);
    /* A model for micro-batches of up to B sequences of T tokens, described
     * (blocks and tensors) without arenas; recomputation and the activation
     * dtype from cfg; rank tp_rank's part when cfg's tensor-parallel size is
     * above 1, and only pipeline stage pp_rank's blocks when its
     * pipeline-parallel size is (layers/pp_stages.h). Freed with destroy. */
    struct loom_model *(*create)(const struct loom_config *cfg, int B, int T, int training, int tp_rank,
                                 int pp_rank);
    void (*destroy)(struct loom_model *m);
    /* FLOPs of one training step (forward + backward) per token. */
    double (*flops_per_token)(const struct loom_model *m);
    /* One line: "12 layers, 768 channels, 12 heads, T=1024, V=50257". */
    void (*describe)(const struct loom_model *m, char *buf, size_t n);
    /* The model's shape as recorded in files, and back into cfg's fields. */
    void (*shape_of)(const struct loom_config *cfg, struct loom_model_shape *out);
    int (*apply_shape)(const struct loom_model_shape *shape, struct loom_config *cfg);
    /* Optional (NULL: models of this family load from loom checkpoints
     * only). A weights source in the family's own formats, what --load
     * names when it is not a loom checkpoint (GPT-2: a safetensors file, a
     * Hugging Face directory, an llm.c checkpoint). read_shape: the shape
     * settings the source states (what it cannot tell is left out, and cfg's
     * values stand; LOOM_ERR_INPUT when cfg does not give one the family
     * cannot do without); load_weights: its weights into a model whose
     * parameter arena exists (float32). */
    int (*read_shape)(const char *path, const struct loom_config *cfg, struct loom_model_shape *out);
    int (*load_weights)(struct loom_model *m, const char *path);
    int (*save_weights)(struct loom_model *m, const char *path);
    /* Optional (NULL: none): `loom convert` between its weights formats
     * (model/convert.h). */
    const struct loom_model_converter *converter;
    /* Optional (NULL: none): a mixture of experts' statistics of this rank
     * since the last call, then reset: out[0..LOOM_MOE_STATS) the balancing
     * loss and the z-loss (unweighted) summed over (MoE layer, micro-batch),
     * those pairs, the choices dropped by a capacity and all choices; then
     * each (MoE layer of the whole model, expert)'s choices; then each MoE
     * layer's balancing loss and z-loss summed over its forwards, and
     * those forwards. Returns the length (0: the model has no experts);
     * out NULL: the length only. */
    int (*moe_stats)(struct loom_model *m, double *out);
    /* Optional (NULL: none): a decoder family's definition
     * (model/decoder_def.h), which its generic formats read. */
    const struct loom_decoder_def *decoder;
};

#define LOOM_MOE_STATS 5 /* model families' moe_stats: the sums before the per-expert counts */

/* The families, in registry order; NULL past the end. */
const struct loom_model_family *loom_model_family_at(int i);
/* By family name ("gpt2"), or NULL. */
const struct loom_model_family *loom_model_family_find(const char *name);
/* The family and preset of a preset name ("gpt2-medium"), or NULL. */
const struct loom_model_family *loom_model_family_of_preset(const char *preset,
                                                            const struct loom_model_preset **out);
/* The family that built a model (its family pointer), or NULL for a user's model. */
const struct loom_model_family *loom_model_family_of(const struct loom_model *m);

/* The registered families. */
extern const struct loom_model_family loom_gpt2_family;
extern const struct loom_model_family loom_llama_family;
extern const struct loom_model_family loom_mistral_family;
extern const struct loom_model_family loom_mixtral_family;
extern const struct loom_model_family loom_qwen2_family;
extern const struct loom_model_family loom_gemma_family;

#endif
