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
/* The bytes of a file string (byte-level characters, or raw UTF-8 when one
 * is not byte-level, as `tokenizers` decodes), malloc'ed, length in *n. */
char *bpe_name_bytes(const char *name, uint32_t *n);
/* The file string (byte-level characters) of bytes, malloc'ed. */
char *bpe_bytes_name(const char *b, size_t n);

#endif
