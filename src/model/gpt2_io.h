/*
 * GPT-2 weights in and out as safetensors under Hugging Face GPT-2 names.
 * Reading accepts names with or without the `transformer.` prefix, ignores
 * HF's attention-mask buffers (`h.N.attn.bias`, `h.N.attn.masked_bias`), a
 * tied model's `lm_head.weight` when it equals wte (refused when it differs:
 * that is an untied model) and tensors outside GPT-2's names (anything not
 * under wte., wpe., h. or ln_f., such as llm.c's `llmc.wte_padding`),
 * converts F16/BF16/F64 to float32, and refuses a missing tensor, a wrong
 * shape, or a GPT-2 name the model lacks (a layer past its last). Writing
 * stores the model's shape settings in the metadata (loom.model, then
 * loom.<setting> for each), so every command rebuilds the same model; an
 * untied model is written under GPT2LMHeadModel's names (transformer.h.0...
 * and lm_head.weight), as transformers needs them. Not here: optimizer
 * state and resumable checkpoints.
 */
#ifndef LOOM_MODEL_GPT2_IO_H
#define LOOM_MODEL_GPT2_IO_H

#include "io/safetensors.h"
#include "model/gpt2.h"

int loom_gpt2_load(struct loom_decoder *m, const char *path);
int loom_gpt2_save(const struct loom_decoder *m, const char *path);
/* The same with `nextra` more tensors (names outside GPT-2's, so readers
 * ignore them) and `nmeta` more metadata pairs (meta_kv[2*i] a key,
 * meta_kv[2*i+1] its value) written beside the model's. */
int loom_gpt2_save_ext(const struct loom_decoder *m, const char *path, const struct loom_st_tensor_in *extra,
                       int nextra, const char *const *meta_kv, int nmeta);

/* The shape settings loom's metadata records in a weights file (*found 0,
 * and out empty, when the file has none; settings older files lack are left
 * out). */
int loom_gpt2_read_metadata(const char *path, struct loom_model_shape *out, int *found);

/* The model the tensors of a weights file imply: layers, width, positions,
 * vocabulary, and an untied head (an lm_head.weight that differs from wte);
 * the heads from GPT-2's published widths (768: 12, 1024: 16, 1280: 20,
 * 1600: 25), 0 for any other; the numerics GPT-2's (the tensors cannot say). */
int loom_gpt2_peek_config(const char *path, struct loom_gpt2_config *cfg);

/* Weights sources, what a command's --load (or loom convert's IN) names when
 * it is not a loom checkpoint: a safetensors file, a Hugging Face directory
 * (config.json and model.safetensors) or an llm.c checkpoint.
 *
 * The settings a source states, as the family's shape settings: an llm.c
 * header's; else loom's metadata in the weights file (all settings); else
 * the config.json in the directory or beside the file (all, read strictly:
 * model/gpt2_hf.h); else what the tensors imply (no numerics, and the
 * heads only for GPT-2's published widths). What is not stated is left out
 * of *out. */
int loom_gpt2_source_shape(const char *path, struct loom_model_shape *out);
/* The source's weights into m (parameter arena, float32). */
int loom_gpt2_source_load(struct loom_decoder *m, const char *path);
/* The safetensors file of a source (path, or DIR/model.safetensors). */
int loom_gpt2_source_file(const char *path, char *file, size_t n);

#endif
