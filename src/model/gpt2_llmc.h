/*
 * GPT-2 weights in and out of llm.c's checkpoint format (`gpt2_124M.bin`,
 * as llm.c's train_gpt2.py `write_model` writes it and train_gpt2.c
 * `gpt2_build_from_checkpoint` reads it), and the llm.c facts that a loom
 * model does not hold, carried through a safetensors file so that
 * llm.c -> safetensors -> llm.c gives the same bytes back.
 *
 * Layout: a header of 256 little-endian int32: [0] magic 20240326, [1]
 * version (3: every tensor float32; 5: every tensor bfloat16), [2] maxT,
 * [3] V, [4] L, [5] NH, [6] C, [7] Vp (vocabulary padded, llm.c rounds V up
 * to a multiple of 128), the rest zero. Then the parameters, each kind for
 * all layers before the next kind:
 *   wte (Vp, C), wpe (maxT, C), ln1w (L, C), ln1b (L, C), qkvw (L, 3C, C),
 *   qkvb (L, 3C), attprojw (L, C, C), attprojb (L, C), ln2w (L, C),
 *   ln2b (L, C), fcw (L, 4C, C), fcb (L, 4C), fcprojw (L, C, 4C),
 *   fcprojb (L, C), lnfw (C), lnfb (C).
 * llm.c's matrices are PyTorch Linear's [out, in], the transpose of loom's
 * (and Hugging Face Conv1D's) [in, out]. The Vp - V padding rows of wte are
 * not part of the model; they travel in struct loom_llmc_extra.
 *
 * In a safetensors file the extra travels as metadata `loom.llmc.version`
 * and `loom.llmc.padded_vocab_size`, plus the tensor `llmc.wte_padding`
 * (Vp - V, C) when the padding rows are not all zero (loom's GPT-2 loader
 * ignores it). Not here: llm.c's other files (data shards are io/shard.h;
 * the debug state and tokenizer files), the Llama-3 variant (magic
 * 20240803), optimizer state.
 */
#ifndef LOOM_MODEL_GPT2_LLMC_H
#define LOOM_MODEL_GPT2_LLMC_H

#include "model/gpt2.h"

#define LOOM_LLMC_MAGIC 20240326
#define LOOM_LLMC_HEADER_INTS 256
#define LOOM_LLMC_HEADER_BYTES (LOOM_LLMC_HEADER_INTS * 4)
#define LOOM_LLMC_VERSION_F32 3
#define LOOM_LLMC_VERSION_BF16 5
/* The vocabulary padding llm.c uses when it exports weights. */
#define LOOM_LLMC_VOCAB_MULTIPLE 128

/* What an llm.c checkpoint holds beyond the model. */
struct loom_llmc_extra {
    int version;        /* LOOM_LLMC_VERSION_*; 0 when the weights never were an llm.c file */
    int padded_vocab;   /* Vp >= V; 0 when unknown */
    float *wte_padding; /* (Vp - V, C) wte's padding rows; NULL when they are all zero */
};

/* Whether `path` is a regular file that starts with llm.c's model magic. */
int loom_llmc_sniff(const char *path);

/* Reads an llm.c checkpoint: checks the header (magic, version, sizes that
 * are positive, bounded and consistent) and that the file is exactly the
 * header plus the parameters, then creates the model (parameters only;
 * activations for one token) into *out and fills *extra. LOOM_ERR_INPUT
 * with one line naming the file and what is wrong with it. */
int loom_llmc_read(const char *path, struct loom_decoder **out, struct loom_llmc_extra *extra);

/* The model an llm.c checkpoint holds, from its header alone (checked as
 * loom_llmc_read checks it): the shape, and GPT-2's numerics, the only ones
 * llm.c has. */
int loom_llmc_read_config(const char *path, struct loom_gpt2_config *cfg);

/* Reads an llm.c checkpoint's weights into `m`, whose parameter arena
 * exists: its shape must be the file's (LOOM_ERR_INPUT naming both). */
int loom_llmc_load(struct loom_decoder *m, const char *path);

/* Writes `m` as an llm.c checkpoint of `version` (LOOM_LLMC_VERSION_F32 or
 * _BF16; bfloat16 rounds to nearest even) crash-safely. Vp and the padding
 * rows come from `extra` when it has them; otherwise Vp is V rounded up to
 * LOOM_LLMC_VOCAB_MULTIPLE and the padding rows are zero. */
int loom_llmc_write(const char *path, const struct loom_decoder *m, const struct loom_llmc_extra *extra,
                    int version);

/* Writes `m` as safetensors under Hugging Face GPT-2 names (loom_gpt2_save)
 * with `extra` in the metadata and, when not all zero, the padding rows. */
int loom_llmc_save_safetensors(const char *path, const struct loom_decoder *m,
                               const struct loom_llmc_extra *extra);

/* Reads the extra back from a safetensors file written for model `m`; all
 * zero when the file has none. LOOM_ERR_INPUT when it is inconsistent. */
int loom_llmc_extra_load(const char *path, const struct loom_decoder *m, struct loom_llmc_extra *extra);

void loom_llmc_extra_free(struct loom_llmc_extra *extra);

#endif
