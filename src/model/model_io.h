/*
 * A model's weights from a safetensors file, by tensor name, whatever the
 * family: each tensor's whole shape is checked against the file's, and a
 * tensor-parallel part is cut from the whole tensor (loom_tensor_take_part).
 * Families add their own rules around it (names, what else a file may hold):
 * GPT-2's in gpt2_io.c, the decoder families' in hf_decoder.c.
 */
#ifndef LOOM_MODEL_MODEL_IO_H
#define LOOM_MODEL_MODEL_IO_H

#include "io/safetensors.h"
#include "loom/model.h"

/* The file's tensor for a model tensor's name, or NULL. */
typedef const struct loom_st_tensor *(*loom_tensor_finder)(const struct loom_st *st, const char *name);

/* Every tensor of m into its float32 parameters (work_params), from st
 * opened from path, found by find (NULL: loom_st_find). LOOM_ERR_INPUT
 * naming path and the tensor when one is missing or of another shape. */
int loom_model_read_tensors(struct loom_model *m, const struct loom_st *st, const char *path,
                            loom_tensor_finder find);

#endif
