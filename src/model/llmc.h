/*
 * A decoder family's weights in and out of llm.c's checkpoint format
 * (`gpt2_124M.bin`, as llm.c's train_gpt2.py `write_model` writes it and
 * train_gpt2.c `gpt2_build_from_checkpoint` reads it), for a family whose
 * architecture llm.c's layout holds (GPT-2's): learned positions,
 * LayerNorm with biases, one fused q | k | v product with its bias, an
 * output projection and a dense MLP of 4 x C, all with biases. The tensors
 * are the spec's, by its names and in its weight orientation; llm.c's own
 * numerics (LayerNorm eps 1e-5, tanh GELU, a tied head) are the only ones
 * it records. The llm.c facts that a loom model does not hold travel
 * through a safetensors file, so that llm.c -> safetensors -> llm.c gives
 * the same bytes back.
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
 * llm.c's matrices are PyTorch Linear's [out, in]: a spec that stores
 * [in, out] (GPT-2's Conv1D) has them transposed. The Vp - V padding rows
 * of wte are not part of the model; they travel in struct loom_llmc_extra.
 *
 * Not here: the extra carried through a safetensors file (llmc_extra.h),
 * llm.c's other files (data shards are io/shard.h; the debug state and
 * tokenizer files), the Llama-3 variant (magic 20240803), optimizer state.
 */
#ifndef LOOM_MODEL_LLMC_H
#define LOOM_MODEL_LLMC_H

#include "io/model_shape.h"
#include "model/decoder.h"

struct loom_decoder_def;

#define LOOM_LLMC_MAGIC 20240326
#define LOOM_LLMC_HEADER_INTS 256
#define LOOM_LLMC_HEADER_BYTES (LOOM_LLMC_HEADER_INTS * 4)
#define LOOM_LLMC_VERSION_F32 3
#define LOOM_LLMC_VERSION_BF16 5
/* The vocabulary padding llm.c uses when it exports weights. */
#define LOOM_LLMC_VOCAB_MULTIPLE 128
/* The largest (padded) vocabulary read or written. */
#define LOOM_LLMC_MAX_VOCAB (1 << 24)

/* What an llm.c checkpoint holds beyond the model. */
struct loom_llmc_extra {
    int version;        /* LOOM_LLMC_VERSION_*; 0 when the weights never were an llm.c file */
    int padded_vocab;   /* Vp >= V; 0 when unknown */
    float *wte_padding; /* (Vp - V, C) wte's padding rows; NULL when they are all zero */
};

/* Whether `path` is a regular file that starts with llm.c's model magic. */
int loom_llmc_sniff(const char *path);

/* Whether llm.c's layout holds the family's models (s: its spec, or its
 * architecture alone when the sizes are 0); LOOM_ERR_INPUT with one line
 * naming path, the family and what it has that llm.c's does not. */
int loom_llmc_holds(const struct loom_decoder_def *d, const struct loom_decoder_spec *s, const char *path);

/* Reads an llm.c checkpoint as a model of family d: checks the header
 * (magic, version, sizes that are positive, bounded and consistent) and
 * that the file is exactly the header plus the parameters, then creates the
 * model (parameters only; activations for one token) into *out and fills
 * *extra. LOOM_ERR_INPUT with one line naming the file and what is wrong
 * with it. */
int loom_llmc_read(const struct loom_decoder_def *d, const char *path, struct loom_decoder **out,
                   struct loom_llmc_extra *extra);

/* The model an llm.c checkpoint holds, from its header alone (checked as
 * loom_llmc_read checks it), as family d's shape: the sizes, and llm.c's
 * numerics where d's table has them. */
int loom_llmc_read_shape(const struct loom_decoder_def *d, const char *path, struct loom_model_shape *out);

/* Reads an llm.c checkpoint's weights into `m`, whose parameter arena
 * exists: its shape must be the file's (LOOM_ERR_INPUT naming both). */
int loom_llmc_load(struct loom_decoder *m, const char *path);

/* Writes `m` as an llm.c checkpoint of `version` (LOOM_LLMC_VERSION_F32 or
 * _BF16; bfloat16 rounds to nearest even) crash-safely. Vp and the padding
 * rows come from `extra` when it has them; otherwise Vp is V rounded up to
 * LOOM_LLMC_VOCAB_MULTIPLE and the padding rows are zero. */
int loom_llmc_write(const char *path, const struct loom_decoder *m, const struct loom_llmc_extra *extra,
                    int version);

/* Frees the padding rows. */
void loom_llmc_extra_free(struct loom_llmc_extra *extra);

#endif
