/*
 * A model's weights from a safetensors file, by tensor name, whatever the
 * family: each tensor's whole shape is checked against the file's, and a
 * tensor-parallel part is cut from the whole tensor (loom_tensor_take_part).
 * A name may stand under a prefix (GPT-2's `transformer.`). Families add
 * their own rules around it (what else a file may hold): the decoder
 * families' in hf_decoder.c.
 */
#ifndef LOOM_MODEL_MODEL_IO_H
#define LOOM_MODEL_MODEL_IO_H

#include "io/safetensors.h"
#include "loom/model.h"

/* The file's tensor of a model tensor's name: the name, or prefix and the
 * name (prefix NULL: the name alone); NULL when neither is there. */
const struct loom_st_tensor *loom_model_find_tensor(const struct loom_st *st, const char *prefix,
                                                    const char *name);

/* Every tensor of m into its float32 parameters (work_params), from st
 * opened from path, found by loom_model_find_tensor. LOOM_ERR_INPUT naming
 * path and the tensor when one is missing or of another shape. */
int loom_model_read_tensors(struct loom_model *m, const struct loom_st *st, const char *path,
                            const char *prefix);
/* The same for one shard of a sharded checkpoint: the tensors st holds
 * are read and marked in seen (one flag a tensor, in block order), the
 * others left for the other shards. */
int loom_model_read_present(struct loom_model *m, const struct loom_st *st, const char *path,
                            const char *prefix, unsigned char *seen);

#endif
