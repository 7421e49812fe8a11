/*
 * Byte-level BPE, as Hugging Face `tokenizers` runs it for GPT-2 and Llama 3:
 * text is split on added (special) tokens, cut into pieces by the
 * pre-tokenization patterns (PCRE2, Unicode classes), and every piece's bytes
 * are merged by rank into vocabulary ids; decoding joins the ids' bytes and
 * replaces what is not valid UTF-8 with U+FFFD, as `tokenizers` does.
 *
 * Input text that is not valid UTF-8 is read as Python's
 * `bytes.decode("utf-8", errors="replace")` reads it: each maximal invalid
 * subsequence becomes U+FFFD, so loom's ids equal those `tokenizers` gives
 * for the text a Python user would have.
 *
 * Encoding is what `tokenizers` calls encode(text, add_special_tokens=False):
 * no post-processor template (the data preparation inserts end-of-text
 * itself). Loading and saving (`tokenizer.json`, GPT-2's `vocab.json` +
 * `merges.txt`) are in bpe_json.c; learning merges in bpe_learn.c.
 *
 * Not here: normalizers (NFC and the like: refused at load), BPE dropout,
 * byte fallback, WordPiece/Unigram models.
 */
#ifndef LOOM_TOKENIZER_BPE_H
#define LOOM_TOKENIZER_BPE_H

#include <stddef.h>
#include <stdint.h>

struct loom_bpe;
/* One thread's scratch: the word cache and the pattern match data. */
struct loom_bpe_state;

/* A growing list of token ids. */
struct loom_ids {
    int32_t *ids;
    size_t n, cap;
};
void loom_ids_push(struct loom_ids *v, int32_t id);
void loom_ids_free(struct loom_ids *v);

/* Loads PATH: a `tokenizer.json`, or a directory holding one, or a directory
 * holding GPT-2's `vocab.json` and `merges.txt`. LOOM_ERR_INPUT names the
 * file and what is wrong with it (or unsupported). */
int loom_bpe_load(const char *path, struct loom_bpe **out);
/* The same with MERGES naming GPT-2's merges file (Megatron's --merge-file)
 * when PATH is its vocabulary file (--vocab-file); MERGES NULL or "" is
 * loom_bpe_load. */
int loom_bpe_load_pair(const char *path, const char *merges, struct loom_bpe **out);
/* Writes DIR/tokenizer.json (created crash-safely; DIR must exist), which
 * `tokenizers` loads: the same vocabulary, merges, added tokens and
 * pre-tokenization. */
int loom_bpe_save(const struct loom_bpe *t, const char *dir);
void loom_bpe_free(struct loom_bpe *t);
/* DIR/tokenizer.json from the tokenizer at SRC (as loom_bpe_load names it):
 * the file's own bytes, or GPT-2's vocab.json + merges.txt converted. */
int loom_bpe_export(const char *src, const char *dir);
/* The same for loom_bpe_load_pair's names. */
int loom_bpe_export_pair(const char *src, const char *merges, const char *dir);
/* The bytes token id decodes to (before UTF-8 repair), and their count in
 * *len; NULL for an id outside the vocabulary. */
const char *loom_bpe_token_bytes(const struct loom_bpe *t, int32_t id, size_t *len);

/* Largest id + 1 (the vocabulary a model needs). */
int32_t loom_bpe_vocab_size(const struct loom_bpe *t);
/* The end-of-text token: the added token `<|endoftext|>` (GPT-2),
 * `<|end_of_text|>` (Llama 3), `</s>` or `<eos>`, first found; -1 if none. */
int32_t loom_bpe_eot(const struct loom_bpe *t);
/* The beginning-of-text token: `<|begin_of_text|>` (Llama 3), `<s>` or
 * `<bos>`, first found; -1 if none. */
int32_t loom_bpe_bos(const struct loom_bpe *t);
/* The padding token: the added token <pad>, <|pad|> or [PAD]; -1 if none. */
int32_t loom_bpe_pad(const struct loom_bpe *t);
/* An added token's text (id's), or NULL. */
const char *loom_bpe_added_text(const struct loom_bpe *t, int32_t id);
/* The special tokens the file's post-processor puts around a text
 * (TemplateProcessing's single template: Llama's <s> before, for one):
 * counts in *n_pre and *n_post (up to 4 each), ids into pre and post. */
void loom_bpe_template(const struct loom_bpe *t, int32_t pre[4], int *n_pre, int32_t post[4], int *n_post);
/* The pre-tokenization patterns, for messages ("gpt2" when it is GPT-2's,
 * "sentencepiece-bpe" for a file converted from SentencePiece). */
const char *loom_bpe_describe(const struct loom_bpe *t);

struct loom_bpe_state *loom_bpe_state_new(const struct loom_bpe *t);
void loom_bpe_state_free(struct loom_bpe_state *s);

/* Appends the ids of text[0, n) to out. */
void loom_bpe_encode(const struct loom_bpe *t, struct loom_bpe_state *s, const char *text, size_t n,
                     struct loom_ids *out);
/* Calls fn(ctx, piece, length) for every piece pre-tokenization cuts
 * text[0, n) into, in order (added tokens are not pieces): the words a
 * trainer counts. */
void loom_bpe_pieces(const struct loom_bpe *t, struct loom_bpe_state *s, const char *text, size_t n,
                     void (*fn)(void *ctx, const char *piece, size_t len), void *ctx);
/* The text of ids, valid UTF-8 (invalid sequences become U+FFFD), into out
 * (capacity cap, NUL-terminated when cap > 0); returns the length the whole
 * text needs, like snprintf. Ids outside the vocabulary are written "<id>". */
size_t loom_bpe_decode(const struct loom_bpe *t, const int32_t *ids, size_t n, char *out, size_t cap);

/* text[0, n) with every maximal invalid UTF-8 subsequence replaced by
 * U+FFFD (malloc'ed, NUL-terminated, length in *out_n); NULL when text is
 * already valid (nothing to replace). */
char *loom_utf8_repair(const char *text, size_t n, size_t *out_n);

/* ---- building one (the trainer, bpe_json.c) ---------------------------------- */

/* The GPT-2 pre-tokenization pattern, and Llama 3's (cl100k-style). */
extern const char *const loom_bpe_pattern_gpt2;
extern const char *const loom_bpe_pattern_llama3;

/* A tokenizer from parts: ids 0..n_special-1 are the special tokens
 * (added, special), then the 256 bytes, then one id per merge (merges[k]
 * joins two earlier ids into id n_special + 256 + k). pattern: the split
 * pattern (loom_bpe_pattern_gpt2 gives GPT-2's ByteLevel layout, any other
 * Llama 3's Split + ByteLevel layout). LOOM_ERR_INPUT for a bad pattern. */
int loom_bpe_build(const char *const *specials, int n_special, const char *pattern,
                   const int32_t (*merges)[2], int64_t n_merges, struct loom_bpe **out);

#endif
