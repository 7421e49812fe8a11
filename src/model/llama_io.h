/*
 * Llama's weights sources and files (llama_io.c): the shape a source
 * states, loading it into a model, and saving one.
 */
#ifndef LOOM_MODEL_LLAMA_IO_H
#define LOOM_MODEL_LLAMA_IO_H

#include "io/model_shape.h"
#include "model/llama.h"

/* The model a source describes: loom's metadata in the safetensors file, or
 * the config.json in its directory (checked against the tensors). */
int loom_llama_source_shape(const char *path, struct loom_model_shape *out);
/* Its weights into m's float32 parameters; a tensor the model does not
 * have is refused (an LM head of its own beside a tied model included). */
int loom_llama_load(struct loom_decoder *m, const char *path);
/* One safetensors file under Hugging Face's names, with loom's metadata. */
int loom_llama_save(const struct loom_decoder *m, const char *path);
/* The shape of a model's settings, and back (llama_family.c). */
void loom_llama_shape(const struct loom_llama_config *cfg, struct loom_model_shape *out);
int loom_llama_config_of_shape(const struct loom_model_shape *shape, struct loom_llama_config *out);

#endif
