/*
 * A tokenizer, whatever its file: what the trainer, `loom data tokenize`,
 * `loom sample`, the checkpoints and the exports hold. Two engines behind it:
 *
 * - bpe (bpe.h): Hugging Face `tokenizer.json` (byte-level BPE as GPT-2's
 *   and Llama 3's; SentencePiece-style BPE with byte fallback as Llama 2's,
 *   Mistral's and Gemma's converted files) and GPT-2's vocab.json +
 *   merges.txt: ids equal `tokenizers`';
 * - spm (spm.h): a SentencePiece `tokenizer.model` through libsentencepiece:
 *   ids equal `sentencepiece`'s.
 *
 * What a tokenizer adds around a document (the post-processing its files
 * ask for) is its template: tokenizer.json's TemplateProcessing (Llama's
 * <s> before the text), and for a SentencePiece model the beginning of text
 * (as LlamaTokenizer and Meta's own code add it) unless a
 * tokenizer_config.json beside it says add_bos_token false; add_eos_token
 * true there adds the end.
 */
#ifndef LOOM_TOKENIZER_TOKENIZER_H
#define LOOM_TOKENIZER_TOKENIZER_H

#include <stddef.h>
#include <stdint.h>

#include "tokenizer/bpe.h"

struct loom_tokenizer;
struct loom_tokenizer_state;

/* PATH: a tokenizer.json, a tokenizer.model (any name: told by its bytes), a
 * directory holding one of them (tokenizer.json first) or GPT-2's vocab.json
 * and merges.txt; MERGES (Megatron's --merge-file) names GPT-2's merges when
 * PATH is its vocab.json (NULL or "": none). LOOM_ERR_INPUT names the file
 * and what is wrong in one line. */
int loom_tokenizer_load(const char *path, const char *merges, struct loom_tokenizer **out);
void loom_tokenizer_free(struct loom_tokenizer *t);

/* Copies (or converts) the tokenizer at SRC/MERGES into DIR as the file its
 * engine reads: DIR/tokenizer.json, or DIR/tokenizer.model (crash-safely);
 * the file's name into *name (static). */
int loom_tokenizer_export(const char *src, const char *merges, const char *dir, const char **name);
/* The file names a directory's tokenizer may have, in the order they are
 * looked for. */
extern const char *const loom_tokenizer_files[2];

int32_t loom_tokenizer_vocab_size(const struct loom_tokenizer *t);
/* End and beginning of text (see loom_bpe_eot/bos; a SentencePiece model's
 * own eos/bos ids); -1 when none. */
int32_t loom_tokenizer_eot(const struct loom_tokenizer *t);
int32_t loom_tokenizer_bos(const struct loom_tokenizer *t);
/* The padding token: a SentencePiece model's pad id, or the added token
 * <pad>, <|pad|> or [PAD]; -1 when none. */
int32_t loom_tokenizer_pad(const struct loom_tokenizer *t);
/* A special token's text ("<s>"), or NULL. */
const char *loom_tokenizer_special_text(const struct loom_tokenizer *t, int32_t id);
/* "gpt2", "llama3", "sentencepiece-bpe", "sentencepiece", ...: for messages. */
const char *loom_tokenizer_describe(const struct loom_tokenizer *t);
/* 1 when a SentencePiece model (tokenizer.model). */
int loom_tokenizer_is_spm(const struct loom_tokenizer *t);
/* The template: ids put before a document (n_pre) and after it (n_post). */
void loom_tokenizer_template(const struct loom_tokenizer *t, int32_t pre[4], int *n_pre, int32_t post[4],
                             int *n_post);

struct loom_tokenizer_state *loom_tokenizer_state_new(const struct loom_tokenizer *t);
void loom_tokenizer_state_free(struct loom_tokenizer_state *s);
/* Appends the ids of text[0, n): `tokenizers`' encode(text,
 * add_special_tokens=False), or `sentencepiece`'s encode(text). */
void loom_tokenizer_encode(const struct loom_tokenizer *t, struct loom_tokenizer_state *s, const char *text,
                           size_t n, struct loom_ids *out);
/* The text of ids, as loom_bpe_decode. */
size_t loom_tokenizer_decode(const struct loom_tokenizer *t, const int32_t *ids, size_t n, char *out,
                             size_t cap);
/* What id adds to a text printed token by token (NULL outside the vocabulary). */
const char *loom_tokenizer_token_bytes(const struct loom_tokenizer *t, int32_t id, size_t *len);

#endif
