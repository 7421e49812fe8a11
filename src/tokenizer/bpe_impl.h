/*
 * The insides of a byte-level BPE tokenizer, shared by bpe.c (encoding,
 * decoding, building) and bpe_json.c (the file formats). Nothing outside
 * src/tokenizer/ includes this.
 */
#ifndef LOOM_TOKENIZER_BPE_IMPL_H
#define LOOM_TOKENIZER_BPE_IMPL_H

#define PCRE2_CODE_UNIT_WIDTH 8
#include <pcre2.h>
#include <stddef.h>
#include <stdint.h>

#include "tokenizer/bpe.h"

enum { BPE_MAX_STEPS = 8 };

/* One step of pre-tokenization, applied to every piece in turn. */
struct bpe_step {
    int prefix_space; /* 1: ByteLevel's add_prefix_space (a space before a piece that lacks one) */
    pcre2_code *re;   /* else: split on matches, keeping matches and gaps (Split, Isolated) */
    char *pattern;    /* re's source, for saving */
    int literal;      /* the pattern was a String, not a Regex */
    int byte_level;   /* the step is ByteLevel's own GPT-2 split (use_regex) */
};

/* An added token: found in text before pre-tokenization. */
struct bpe_added {
    char *content; /* its text */
    uint32_t len;
    int32_t id;
    uint8_t special, lstrip, rstrip, normalized, single_word;
};

/* Open addressing, power-of-two capacity. */
struct bpe_pair_map { /* (left id, right id) -> merge rank */
    uint64_t *keys;   /* (cap) left << 32 | right, plus 1; 0: empty */
    int32_t *rank;    /* (cap) */
    size_t cap;
};
struct bpe_bytes_map { /* token bytes -> id */
    int32_t *id;       /* (cap) -1: empty */
    size_t cap;
};

/* A tokenizer.json converted from SentencePiece (Llama 2, Mistral, Gemma):
 * BPE over characters, not bytes; a character outside the vocabulary
 * becomes the <0xXX> tokens of its bytes (byte fallback) or the unknown
 * token; the text is normalized (Prepend, Replace) and may be cut by a
 * Metaspace pre-tokenizer; decoding turns the replacement back into spaces,
 * byte tokens into bytes, and strips leading spaces. */
enum { BPE_MAX_NORMS = 4 };
enum bpe_prepend { BPE_PREPEND_ALWAYS, BPE_PREPEND_FIRST, BPE_PREPEND_NEVER };
struct bpe_norm {
    char *from; /* Replace's pattern; NULL: Prepend */
    char *to;   /* Replace's content, or Prepend's text */
};
struct bpe_sp {
    int char_level;
    int byte_fallback;
    int fuse_unk;
    int32_t unk_id; /* -1: none */
    struct bpe_norm norm[BPE_MAX_NORMS];
    int n_norms;
    int metaspace;               /* a Metaspace pre-tokenizer: */
    char replacement[8];         /*   what a space becomes (UTF-8) */
    enum bpe_prepend prepend;    /*   when a segment gets one in front */
    int split;                   /*   pieces begin at each replacement */
    char dec_from[8], dec_to[8]; /* the decoder's Replace ("" when none) */
    int strip_lead;              /* leading spaces the decoder strips from the text */
    int dec_bytes;               /* the decoder has ByteFallback: <0xXX> tokens decode to their byte */
    int dec_meta_first;          /* Metaspace's decoder: the first token loses all its spaces */
    char **dec;                  /* (n_ids) what an id decodes to (byte tokens: their byte) */
    uint32_t *dec_len;
    uint8_t *is_byte; /* (n_ids) a <0xXX> token */
};

struct loom_bpe {
    int32_t n_ids;        /* largest id + 1 */
    char **name;          /* (n_ids) the id's string in the file (byte-level characters); NULL: no such id */
    char **bytes;         /* (n_ids) what the id decodes to */
    uint32_t *bytes_len;  /* (n_ids) */
    uint8_t *is_added;    /* (n_ids) */
    int32_t byte_id[256]; /* the id of each single byte */
    int32_t (*merge)[3];  /* (n_merges) left, right, result, by rank */
    int64_t n_merges;
    struct bpe_pair_map pairs;
    struct bpe_bytes_map vocab; /* the model's vocabulary (not the added tokens) */
    struct bpe_added *added;
    int n_added;
    struct bpe_step step[BPE_MAX_STEPS];
    int n_steps;
    int ignore_merges; /* a piece that is itself a token is not merged (Llama 3's files) */
    char describe[64];
    struct bpe_sp sp;                       /* SentencePiece-style files (char_level): their own steps */
    int32_t post_prefix[4], post_suffix[4]; /* the post-processor's special tokens around a text */
    int n_post_prefix, n_post_suffix;
};

/* realloc, or exit 1 naming the tokenizer when memory runs out. */
void *bpe_xrealloc(void *p, size_t n);

/* The byte <-> character mapping of byte-level BPE (GPT-2's bytes_to_unicode). */
uint32_t bpe_byte_char(uint8_t b);
/* The byte of character c, or -1 when c is not one of the 256. */
int bpe_char_byte(uint32_t c);

/* Tables from t's names (bytes, byte_id, vocab): merges are looked up in
 * them, so they come first; LOOM_ERR_INPUT when a byte has no token. Then
 * the merges' pair table, from t->merge. */
int bpe_index_vocab(struct loom_bpe *t);
void bpe_index_merges(struct loom_bpe *t);
/* A compiled split step; LOOM_ERR_INPUT naming the pattern when it does not compile. */
int bpe_step_split(struct bpe_step *st, const char *pattern, int literal, const char *where);
int32_t bpe_vocab_find(const struct loom_bpe *t, const char *b, size_t n);
/* Length of the valid UTF-8 sequence at s[0, n) (its code point in *cp),
 * or 0 when it is not one. */
size_t bpe_utf8_valid_len(const unsigned char *s, size_t n, uint32_t *cp);
/* The ids of one piece (after pre-tokenization), appended to out. */
void bpe_merge_piece(const struct loom_bpe *t, struct loom_bpe_state *s, const char *w, size_t n,
                     struct loom_ids *out);

/* ---- SentencePiece-style files (sp_bpe.c) ---- */
/* Whether a tokenizer.json is one: byte fallback, a normalizer, or a
 * Metaspace pre-tokenizer. */
int bpe_sp_detect(const void *root_json, const void *model_json);
/* Its normalizer, pre-tokenizer, decoder and unknown-token settings into
 * t->sp (refusing, naming the key, what loom does not run as `tokenizers`
 * would); the names must be read. */
int bpe_sp_read(struct loom_bpe *t, const void *root_json, const void *model_json, const char *file);
/* Its tables from the names: vocabulary keys are the names' own UTF-8, the
 * byte tokens, what each id decodes to, the unknown token's id. */
void bpe_sp_index(struct loom_bpe *t);
/* A segment between added tokens (first: it starts the text): normalized,
 * cut by Metaspace, each piece merged. */
void bpe_sp_segment(const struct loom_bpe *t, struct loom_bpe_state *s, const char *p, size_t n, int first,
                    struct loom_ids *out);
/* The initial symbols of a piece: its characters' ids, byte fallback or
 * the unknown token for the others; their count. sym holds n. */
size_t bpe_sp_symbols(const struct loom_bpe *t, const char *w, size_t n, int32_t *sym);
/* Decoding as the file's decoder: see loom_bpe_decode. */
size_t bpe_sp_decode(const struct loom_bpe *t, const int32_t *ids, size_t n, char *out, size_t cap);
void bpe_sp_free(struct loom_bpe *t);

/* The bytes of a file string (byte-level characters, or raw UTF-8 when one
 * is not byte-level, as `tokenizers` decodes), malloc'ed, length in *n. */
char *bpe_name_bytes(const char *name, uint32_t *n);
/* The file string (byte-level characters) of bytes, malloc'ed. */
char *bpe_bytes_name(const char *b, size_t n);

#endif
