/*
 * GPT-2 weights in and out as safetensors under Hugging Face GPT-2 names.
 * Reading accepts names with or without the `transformer.` prefix, ignores
 * HF's attention-mask buffers (`h.N.attn.bias`, `h.N.attn.masked_bias`) and
 * the tied `lm_head.weight`, converts F16/BF16/F64 to float32, and refuses a
 * missing tensor or a wrong shape. Writing stores the model's shape in the
 * metadata so `loom sample` and `loom eval` can rebuild it. Not here:
 * optimizer state and resumable checkpoints.
 */
#ifndef LOOM_MODEL_GPT2_IO_H
#define LOOM_MODEL_GPT2_IO_H

#include "model/gpt2.h"

int loom_gpt2_load(struct loom_gpt2 *m, const char *path);
int loom_gpt2_save(const struct loom_gpt2 *m, const char *path);

/* Reads the model shape of a weights file: from its metadata when loom wrote
 * it, otherwise from the tensor shapes (heads from the GPT-2 family's
 * hidden-size-to-heads rule; 0 when unknown). */
int loom_gpt2_peek_config(const char *path, struct loom_gpt2_config *cfg);

#endif
