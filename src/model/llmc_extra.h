/*
 * What an llm.c checkpoint holds beyond the model (struct loom_llmc_extra,
 * model/llmc.h: its version, padded vocabulary and padding rows) carried
 * through a safetensors file, so that llm.c -> safetensors -> llm.c gives
 * the same bytes back: metadata `loom.llmc.version` and
 * `loom.llmc.padded_vocab_size`, plus the tensor `llmc.wte_padding`
 * (Vp - V, C) when the padding rows are not all zero (the weights reader
 * ignores `llmc.*` tensors). Not here: llm.c's format itself (llmc.h).
 */
#ifndef LOOM_MODEL_LLMC_EXTRA_H
#define LOOM_MODEL_LLMC_EXTRA_H

#include "model/llmc.h"

/* Writes `m` in a Hugging Face format (model/hf_decoder.h: one safetensors
 * file, or with `dir` a directory, its weights in shards of at most
 * max_shard_bytes, 0: one file) with `extra` in the metadata and, when
 * not all zero, the padding rows. */
int loom_llmc_extra_save(const char *path, struct loom_model *m, const struct loom_llmc_extra *extra, int dir,
                         int64_t max_shard_bytes);

/* Reads the extra back from a safetensors file written for model `m`; all
 * zero when the file has none. LOOM_ERR_INPUT when it is inconsistent. */
int loom_llmc_extra_load(const char *path, const struct loom_decoder *m, struct loom_llmc_extra *extra);

#endif
