/*
 * Llama's Hugging Face config.json (transformers' LlamaConfig), read
 * strictly (io/hf_config.h: every field honoured, accepted only at the value
 * loom computes, or without effect on the function) and written for
 * exports.
 */
#ifndef LOOM_MODEL_LLAMA_HF_H
#define LOOM_MODEL_LLAMA_HF_H

#include "io/model_shape.h"
#include "model/llama.h"

/* The model config.json at path describes, as the Llama family's shape
 * (LlamaConfig's defaults for absent fields). LOOM_ERR_INPUT with one line
 * naming the file and the field otherwise. */
int loom_llama_hf_read_config(const char *path, struct loom_model_shape *out);
/* config.json and generation_config.json for the model loom computes
 * (cJSON_Print text; free()). */
char *loom_llama_hf_config_json(const struct loom_llama_config *cfg);
char *loom_llama_hf_generation_config_json(const struct loom_llama_config *cfg);

#endif
