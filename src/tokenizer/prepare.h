/*
 * Data preparation with a BPE tokenizer: documents from `.txt` and `.jsonl`
 * files become llm.c shards (`loom data tokenize --tokenizer`), or the word
 * counts a new tokenizer is learned from (`loom data train-tokenizer`).
 *
 * Documents: a `.jsonl` file gives one per line (the string under the text
 * key); any other file is text, one document per file, or one per block
 * between blank lines. In the shards a document is what the tokenizer's
 * template puts around it (tokenizer.h: Llama's <s> before it, as
 * `tokenizers` and llm.c's Llama 3 preparation write it), or, for a
 * tokenizer without one (GPT-2's), preceded by the end-of-text token as
 * llm.c's GPT-2 scripts write them: a document boundary is marked wherever
 * the reader starts.
 *
 * Not here: the tokenizer itself (tokenizer.h), the shard format (io/shard.h),
 * the byte-level `loom data tokenize` without a tokenizer (io/tokenizer.h).
 */
#ifndef LOOM_TOKENIZER_PREPARE_H
#define LOOM_TOKENIZER_PREPARE_H

#include <stdint.h>

struct loom_prepare_opts {
    const char *text_key;   /* .jsonl: the document's field (default "text") */
    int blank_line_docs;    /* .txt: a document per blank-line-separated block, not per file */
    int64_t shard_size;     /* tokens per shard (default 100,000,000, llm.c's) */
    double val_fraction;    /* that share of the documents goes to val_*.bin (every 1/f-th one) */
    int progress;           /* a progress line on stderr */
    int megatron;           /* write Megatron's indexed dataset, not shards */
    int append_eod;         /* megatron: the end-of-text token after each non-empty document */
    int threads;            /* 0: OpenMP's default (Megatron's --workers) */
    const char *merge_file; /* GPT-2's merges.txt when the tokenizer is its vocab.json (or NULL) */
    int megatron_bos;       /* megatron: the beginning of text before each document (Megatron's
                               Llama2Tokenizer tokenizes so) */
};

/* `loom data tokenize --tokenizer TOK IN... OUT_DIR`: writes
 * OUT_DIR/train_000000.bin, ... and val_000000.bin, ... (llm.c's 16-bit
 * shards, or its 32-bit version 2 where the vocabulary passes 65,536 ids);
 * prints one summary line. LOOM_ERR_INPUT: a bad file (named, with the line
 * for .jsonl), no template and no end-of-text token. */
int loom_prepare_tokenize(const char *tokenizer, const char *const *in, int n_in, const char *outdir,
                          const struct loom_prepare_opts *o);

/* `loom data tokenize --output-format megatron ... OUTPUT_PREFIX`: writes
 * OUTPUT_PREFIX_text_document.bin/.idx as Megatron's
 * tools/preprocess_data.py does (the text key names the files): one
 * sequence a document (its ids as Megatron's tokenizer gives them: no
 * template; megatron_bos puts the beginning of text first), no separator
 * unless append_eod, an empty document
 * kept as an empty entry, uint16 tokens below 65,500 ids, else int32. */
int loom_prepare_tokenize_megatron(const char *tokenizer, const char *const *in, int n_in, const char *prefix,
                                   const struct loom_prepare_opts *o);

/* `loom data train-tokenizer --vocab-size N IN... OUT_DIR`: learns
 * byte-level BPE merges on the documents and writes OUT_DIR/tokenizer.json.
 * pattern: "gpt2" or "llama3" (the pre-tokenization); specials: the special
 * tokens (ids 0, 1, ...; the first is the end-of-text). */
int loom_prepare_train_tokenizer(const char *const *in, int n_in, const char *outdir, int64_t vocab_size,
                                 const char *pattern, const char *const *specials, int n_specials,
                                 int64_t min_frequency, const struct loom_prepare_opts *o);

#endif
