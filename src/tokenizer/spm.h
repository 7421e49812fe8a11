/*
 * SentencePiece models (`tokenizer.model`: Llama 2, Mistral, Gemma, T5)
 * through Debian's libsentencepiece: encoding and decoding are the
 * library's own, so loom's ids are `sentencepiece`'s. Built without the
 * library, loading one is refused in one line.
 */
#ifndef LOOM_TOKENIZER_SPM_H
#define LOOM_TOKENIZER_SPM_H

#include <stddef.h>
#include <stdint.h>

#include "tokenizer/bpe.h"

struct loom_spm;

/* PATH: a serialized ModelProto. LOOM_ERR_INPUT names it and what is wrong. */
int loom_spm_load(const char *path, struct loom_spm **out);
void loom_spm_free(struct loom_spm *m);
int32_t loom_spm_vocab_size(const struct loom_spm *m);
/* The model's beginning- and end-of-text ids; -1 when it has none. */
int32_t loom_spm_bos(const struct loom_spm *m);
int32_t loom_spm_eos(const struct loom_spm *m);
int32_t loom_spm_pad(const struct loom_spm *m);
/* A piece's own text (U+2581 for spaces; "<s>" for a control token), NUL-terminated; NULL outside the
 * vocabulary. */
const char *loom_spm_piece(const struct loom_spm *m, int32_t id);
/* Appends the ids of text[0, n) (no BOS or EOS). Thread-safe. */
void loom_spm_encode(const struct loom_spm *m, const char *text, size_t n, struct loom_ids *out);
/* As loom_bpe_decode: the library's decoding (the leading space the model
 * adds removed, control tokens dropped). */
size_t loom_spm_decode(const struct loom_spm *m, const int32_t *ids, size_t n, char *out, size_t cap);
/* What one id adds to a text streamed token by token: its piece with
 * spaces for U+2581, a byte token's byte, nothing for a control token. */
const char *loom_spm_token_bytes(const struct loom_spm *m, int32_t id, size_t *len);

#endif
