/*
 * GPT-2 weights in and out as safetensors under Hugging Face GPT-2 names.
 * Reading accepts names with or without the `transformer.` prefix, ignores
 * HF's attention-mask buffers (`h.N.attn.bias`, `h.N.attn.masked_bias`), the
 * tied `lm_head.weight` and tensors outside GPT-2's names (anything not under
 * wte., wpe., h. or ln_f., such as llm.c's `llmc.wte_padding`), converts
 * F16/BF16/F64 to float32, and refuses a missing tensor, a wrong shape, or a
 * GPT-2 name the model lacks (a layer past its last). Writing stores the
 * model's shape in the metadata so `loom sample` and `loom eval` can rebuild
 * it. Not here: optimizer state and resumable checkpoints.
 */
#ifndef LOOM_MODEL_GPT2_IO_H
#define LOOM_MODEL_GPT2_IO_H

#include "io/safetensors.h"
#include "model/gpt2.h"

int loom_gpt2_load(struct loom_gpt2 *m, const char *path);
int loom_gpt2_save(const struct loom_gpt2 *m, const char *path);
/* The same with `nextra` more tensors (names outside GPT-2's, so readers
 * ignore them) and `nmeta` more metadata pairs (meta_kv[2*i] a key,
 * meta_kv[2*i+1] its value) written beside the model's. */
int loom_gpt2_save_ext(const struct loom_gpt2 *m, const char *path, const struct loom_st_tensor_in *extra,
                       int nextra, const char *const *meta_kv, int nmeta);

/* Reads the model shape of a weights file: from its metadata when loom wrote
 * it, otherwise from the tensor shapes (heads from the GPT-2 family's
 * hidden-size-to-heads rule; 0 when unknown). */
int loom_gpt2_peek_config(const char *path, struct loom_gpt2_config *cfg);

#endif
