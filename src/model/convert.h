/*
 * `loom convert`: a model family's weights from one of its file formats to
 * another. A family points at its converter (struct
 * loom_model_family.converter; every decoder family's: model/convert.c);
 * the command line dispatches to it and lists every converter's formats in
 * its help. Reading a loom checkpoint takes the engine, which the model
 * layer does not reach: the caller lends that through struct
 * loom_convert_env.
 *
 * Adding one: a `const struct loom_model_converter` beside the family's
 * weights code, named by the family's entry. Not here: the checkpoint
 * format (io/checkpoint.h), training.
 */
#ifndef LOOM_MODEL_CONVERT_H
#define LOOM_MODEL_CONVERT_H

#include <stdio.h>

#include "loom/model.h"

struct loom_model_family;

struct loom_convert_env {
    /* The family whose weights are converted (the one the input names). */
    const struct loom_model_family *family;
    /* A new model of the family a loom checkpoint records (a save
     * directory, its latest, or one iter_NNNNNNN, any layout), its
     * parameter arena holding the weights in float32: *out, freed with the
     * family's destroy. */
    int (*read_checkpoint)(const char *path, struct loom_model **out);
};

struct loom_model_converter {
    /* The usage lines, flags and formats, for `loom convert --help`. */
    void (*usage)(FILE *f);
    /* argv: the arguments after `convert`; returns a loom status. */
    int (*run)(int argc, char **argv, const struct loom_convert_env *env);
};

/* A decoder family's (model/decoder_def.h): llm.c checkpoints,
 * safetensors files and Hugging Face directories (model/convert.c). */
extern const struct loom_model_converter loom_decoder_converter;

#endif
