/*
 * Weights sources of a decoder family (model/decoder_def.h): what `--load`
 * (and loom convert's IN) names when it is not a loom checkpoint. An llm.c
 * checkpoint (model/llmc.h) for a family it can hold; a safetensors file;
 * or a Hugging Face directory (its model.safetensors and config.json).
 *
 * The shape a source states, as the family's shape settings: an llm.c
 * header's; else loom's metadata in the weights file (every setting, an
 * older file's absent ones the family's defaults), which a config.json
 * beside it must agree with; else the config.json in the directory or
 * beside the file (model/hf_decoder.h), whose layers, width, positions
 * and vocabulary must be the tensors'; else, for a family whose map has
 * its published widths, what the tensors imply: layers, width, positions,
 * vocabulary, an untied head (an LM head that differs from the embedding),
 * the heads of a published width. What a source does not state is left
 * out. Not here: the formats themselves, checkpoints (engine/checkpoint.h).
 */
#ifndef LOOM_MODEL_SOURCE_H
#define LOOM_MODEL_SOURCE_H

#include <stddef.h>

#include "io/model_shape.h"
#include "loom/config.h"
#include "loom/model.h"

struct loom_decoder_def;

/* Whether path names an llm.c checkpoint: its magic, or a .bin name (whose
 * reader then says what is wrong). */
int loom_source_is_llmc(const char *path);
/* The safetensors file of a source: path, or DIR/model.safetensors. */
int loom_source_file(const char *path, char *file, size_t n);
/* The shape the source at path states (what it does not is left out). */
int loom_source_shape(const struct loom_decoder_def *d, const char *path, struct loom_model_shape *out);
/* model/family.h's read_shape: the same, and the heads required of cfg
 * (--num-attention-heads) when the source does not state them. */
int loom_source_read_shape(const struct loom_decoder_def *d, const char *path, const struct loom_config *cfg,
                           struct loom_model_shape *out);
/* model/family.h's load_weights: the source's weights into m's float32
 * parameters. */
int loom_source_load(struct loom_model *m, const char *path);

#endif
