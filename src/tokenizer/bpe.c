/*
 * Byte-level BPE: the tables, encoding (added tokens, pre-tokenization
 * steps, merges by rank with a word cache), decoding, and building a
 * tokenizer from learned merges (see bpe.h). The file formats are in
 * bpe_json.c.
 *
 * Merging a piece is `tokenizers`' algorithm: every adjacent pair that is a
 * merge goes into a min-heap by (rank, position); the lowest is applied if
 * its two symbols are still there, and the new symbol's pairs with its
 * neighbours are pushed. So a piece of n bytes costs O(n log n), even a run
 * of a hundred thousand spaces.
 */
#include "tokenizer/bpe_impl.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <xxhash.h>

#include "base/log.h"
#include "loom/loom.h"

const char *const loom_bpe_pattern_gpt2 =
    "'s|'t|'re|'ve|'m|'ll|'d| ?\\p{L}+| ?\\p{N}+| ?[^\\s\\p{L}\\p{N}]+|\\s+(?!\\S)|\\s+";
const char *const loom_bpe_pattern_llama3 = "(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{"
                                            "N}{1,3}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|"
                                            "\\s+(?!\\S)|\\s+";

void *bpe_xrealloc(void *p, size_t n)
{
    void *q = realloc(p, n ? n : 1);
    if (!q) loom_die("out of memory in the tokenizer (%zu bytes)", n);
    return q;
}
#define xrealloc bpe_xrealloc

void loom_ids_push(struct loom_ids *v, int32_t id)
{
    if (v->n == v->cap) {
        v->cap = v->cap ? 2 * v->cap : 1024;
        v->ids = xrealloc(v->ids, v->cap * sizeof *v->ids);
    }
    v->ids[v->n++] = id;
}

void loom_ids_free(struct loom_ids *v)
{
    free(v->ids);
    *v = (struct loom_ids){0};
}

/* ---- tables ---------------------------------------------------------------------- */

static size_t pow2_at_least(size_t n)
{
    size_t c = 16;
    while (c < n) c *= 2;
    return c;
}

static int32_t pair_rank(const struct bpe_pair_map *m, int32_t a, int32_t b)
{
    const uint64_t key = ((uint64_t)(uint32_t)a << 32 | (uint32_t)b) + 1;
    for (size_t i = (size_t)(key * 0x9E3779B97F4A7C15ULL >> 20) & (m->cap - 1);; i = (i + 1) & (m->cap - 1)) {
        if (m->keys[i] == key) return m->rank[i];
        if (!m->keys[i]) return -1;
    }
}

static void pair_put(struct bpe_pair_map *m, int32_t a, int32_t b, int32_t rank)
{
    const uint64_t key = ((uint64_t)(uint32_t)a << 32 | (uint32_t)b) + 1;
    for (size_t i = (size_t)(key * 0x9E3779B97F4A7C15ULL >> 20) & (m->cap - 1);; i = (i + 1) & (m->cap - 1)) {
        if (m->keys[i] == key) return; /* a repeated merge: the first rank stands, as in `tokenizers` */
        if (!m->keys[i]) {
            m->keys[i] = key;
            m->rank[i] = rank;
            return;
        }
    }
}

int32_t bpe_vocab_find(const struct loom_bpe *t, const char *b, size_t n)
{
    const struct bpe_bytes_map *m = &t->vocab;
    for (size_t i = (size_t)XXH3_64bits(b, n) & (m->cap - 1);; i = (i + 1) & (m->cap - 1)) {
        const int32_t id = m->id[i];
        if (id < 0) return -1;
        if (t->bytes_len[id] == n && memcmp(t->bytes[id], b, n) == 0) return id;
    }
}

int bpe_index_vocab(struct loom_bpe *t)
{
    t->bytes = xrealloc(NULL, (size_t)t->n_ids * sizeof *t->bytes);
    t->bytes_len = xrealloc(NULL, (size_t)t->n_ids * sizeof *t->bytes_len);
    t->vocab.cap = pow2_at_least(2 * (size_t)t->n_ids);
    t->vocab.id = xrealloc(NULL, t->vocab.cap * sizeof *t->vocab.id);
    memset(t->vocab.id, 0xFF, t->vocab.cap * sizeof *t->vocab.id);
    for (int b = 0; b < 256; b++) t->byte_id[b] = -1;
    for (int32_t id = 0; id < t->n_ids; id++) {
        if (t->sp.char_level && t->name[id]) { /* the name's own UTF-8 */
            t->bytes[id] = strdup(t->name[id]);
            t->bytes_len[id] = (uint32_t)strlen(t->name[id]);
        } else {
            t->bytes[id] = t->name[id] ? bpe_name_bytes(t->name[id], &t->bytes_len[id]) : NULL;
        }
        if (!t->bytes[id]) t->bytes_len[id] = 0;
        if (!t->bytes[id] || t->is_added[id]) continue;
        if (t->bytes_len[id] == 1 && !t->sp.char_level && t->byte_id[(uint8_t)t->bytes[id][0]] < 0)
            t->byte_id[(uint8_t)t->bytes[id][0]] = id;
        if (bpe_vocab_find(t, t->bytes[id], t->bytes_len[id]) >= 0) continue;
        size_t i = (size_t)XXH3_64bits(t->bytes[id], t->bytes_len[id]) & (t->vocab.cap - 1);
        while (t->vocab.id[i] >= 0) i = (i + 1) & (t->vocab.cap - 1);
        t->vocab.id[i] = id;
    }
    if (t->sp.char_level) {
        bpe_sp_index(t);
        return LOOM_OK;
    }
    for (int b = 0; b < 256; b++)
        if (t->byte_id[b] < 0)
            return loom_error_set(
                LOOM_ERR_INPUT,
                "the vocabulary has no token for byte 0x%02X: not a byte-level BPE vocabulary", b);
    return LOOM_OK;
}

void bpe_index_merges(struct loom_bpe *t)
{
    t->pairs.cap = pow2_at_least(2 * (size_t)t->n_merges + 2);
    t->pairs.keys = xrealloc(NULL, t->pairs.cap * sizeof *t->pairs.keys);
    t->pairs.rank = xrealloc(NULL, t->pairs.cap * sizeof *t->pairs.rank);
    memset(t->pairs.keys, 0, t->pairs.cap * sizeof *t->pairs.keys);
    for (int64_t r = 0; r < t->n_merges; r++) pair_put(&t->pairs, t->merge[r][0], t->merge[r][1], (int32_t)r);
}

int bpe_step_split(struct bpe_step *st, const char *pattern, int literal, const char *where)
{
    int err;
    PCRE2_SIZE off;
    st->re = pcre2_compile((PCRE2_SPTR)pattern, PCRE2_ZERO_TERMINATED,
                           PCRE2_UTF | PCRE2_UCP | (literal ? PCRE2_LITERAL : 0), &err, &off, NULL);
    if (!st->re) {
        PCRE2_UCHAR msg[160];
        pcre2_get_error_message(err, msg, sizeof msg);
        return loom_error_set(LOOM_ERR_INPUT, "%s: the split pattern does not compile at offset %zu: %s",
                              where, (size_t)off, (const char *)msg);
    }
    pcre2_jit_compile(st->re, PCRE2_JIT_COMPLETE); /* without JIT (an old CPU), the interpreter */
    st->pattern = strdup(pattern);
    st->literal = literal;
    return LOOM_OK;
}

int32_t loom_bpe_vocab_size(const struct loom_bpe *t)
{
    return t->n_ids;
}

/* The first of names (n) among the added tokens: its id, or -1. */
static int32_t added_named(const struct loom_bpe *t, const char *const *names, size_t n)
{
    for (size_t k = 0; k < n; k++)
        for (int i = 0; i < t->n_added; i++)
            if (strcmp(t->added[i].content, names[k]) == 0) return t->added[i].id;
    return -1;
}

int32_t loom_bpe_eot(const struct loom_bpe *t)
{
    static const char *const names[] = {"<|endoftext|>", "<|end_of_text|>", "</s>", "<eos>"};
    return added_named(t, names, sizeof names / sizeof names[0]);
}

int32_t loom_bpe_bos(const struct loom_bpe *t)
{
    static const char *const names[] = {"<|begin_of_text|>", "<s>", "<bos>"};
    return added_named(t, names, sizeof names / sizeof names[0]);
}

int32_t loom_bpe_pad(const struct loom_bpe *t)
{
    static const char *const names[] = {"<pad>", "<|pad|>", "[PAD]"};
    return added_named(t, names, sizeof names / sizeof names[0]);
}

const char *loom_bpe_added_text(const struct loom_bpe *t, int32_t id)
{
    for (int i = 0; i < t->n_added; i++)
        if (t->added[i].id == id) return t->added[i].content;
    return NULL;
}

const char *loom_bpe_token_bytes(const struct loom_bpe *t, int32_t id, size_t *len)
{
    if (id < 0 || id >= t->n_ids || !t->bytes[id]) return NULL;
    if (t->sp.char_level) {
        *len = t->sp.dec_len[id];
        return t->sp.dec[id];
    }
    *len = t->bytes_len[id];
    return t->bytes[id];
}

void loom_bpe_template(const struct loom_bpe *t, int32_t pre[4], int *n_pre, int32_t post[4], int *n_post)
{
    *n_pre = t->n_post_prefix, *n_post = t->n_post_suffix;
    memcpy(pre, t->post_prefix, sizeof t->post_prefix);
    memcpy(post, t->post_suffix, sizeof t->post_suffix);
}

const char *loom_bpe_describe(const struct loom_bpe *t)
{
    return t->describe;
}

void loom_bpe_free(struct loom_bpe *t)
{
    if (!t) return;
    for (int32_t id = 0; id < t->n_ids; id++) {
        free(t->name[id]);
        if (t->bytes) free(t->bytes[id]);
    }
    free(t->name);
    free(t->bytes);
    free(t->bytes_len);
    free(t->is_added);
    free(t->merge);
    free(t->pairs.keys);
    free(t->pairs.rank);
    free(t->vocab.id);
    for (int i = 0; i < t->n_added; i++) free(t->added[i].content);
    free(t->added);
    for (int i = 0; i < t->n_steps; i++) {
        pcre2_code_free(t->step[i].re);
        free(t->step[i].pattern);
    }
    bpe_sp_free(t);
    free(t);
}

/* ---- one thread's state: the word cache --------------------------------------- */

struct cache_entry {
    uint64_t hash;           /* 0: empty */
    uint32_t word, word_len; /* into words */
    uint32_t ids, n_ids;     /* into ids */
};

struct loom_bpe_state {
    pcre2_match_data *md[BPE_MAX_STEPS];
    pcre2_match_context *mctx;
    pcre2_jit_stack *jit_stack;
    struct cache_entry *table; /* (cap) */
    size_t cap, used;
    char *words;
    size_t words_n, words_cap;
    int32_t *ids;
    size_t ids_n, ids_cap;
    /* merging scratch, (n) for a piece of n bytes */
    int32_t *sym, *prev, *next;
    struct heap_item *heap;
    size_t scratch_cap;
    void (*piece_fn)(void *ctx, const char *piece, size_t len); /* loom_bpe_pieces: pieces, not ids */
    void *piece_ctx;
    const char *text_begin; /* the text being encoded (Metaspace's "first" segment starts it) */
};

enum { CACHE_MAX_WORD = 256, CACHE_MAX_BYTES = 64 << 20 };

struct heap_item {
    int32_t rank, pos;
};

struct loom_bpe_state *loom_bpe_state_new(const struct loom_bpe *t)
{
    struct loom_bpe_state *s = xrealloc(NULL, sizeof *s);
    memset(s, 0, sizeof *s);
    for (int i = 0; i < t->n_steps; i++)
        if (t->step[i].re) s->md[i] = pcre2_match_data_create_from_pattern(t->step[i].re, NULL);
    s->mctx = pcre2_match_context_create(NULL);
    s->jit_stack = pcre2_jit_stack_create(32 << 10, 4 << 20, NULL);
    if (s->mctx && s->jit_stack) pcre2_jit_stack_assign(s->mctx, NULL, s->jit_stack);
    s->cap = 1 << 16;
    s->table = xrealloc(NULL, s->cap * sizeof *s->table);
    memset(s->table, 0, s->cap * sizeof *s->table);
    return s;
}

void loom_bpe_state_free(struct loom_bpe_state *s)
{
    if (!s) return;
    for (int i = 0; i < BPE_MAX_STEPS; i++) pcre2_match_data_free(s->md[i]);
    pcre2_match_context_free(s->mctx);
    pcre2_jit_stack_free(s->jit_stack);
    free(s->table);
    free(s->words);
    free(s->ids);
    free(s->sym);
    free(s->prev);
    free(s->next);
    free(s->heap);
    free(s);
}

static void cache_clear(struct loom_bpe_state *s)
{
    memset(s->table, 0, s->cap * sizeof *s->table);
    s->used = s->words_n = s->ids_n = 0;
}

static const struct cache_entry *cache_find(const struct loom_bpe_state *s, const char *w, size_t n,
                                            uint64_t h)
{
    for (size_t i = (size_t)h & (s->cap - 1);; i = (i + 1) & (s->cap - 1)) {
        const struct cache_entry *e = &s->table[i];
        if (!e->hash) return NULL;
        if (e->hash == h && e->word_len == n && memcmp(s->words + e->word, w, n) == 0) return e;
    }
}

static void cache_put(struct loom_bpe_state *s, const char *w, size_t n, uint64_t h, const int32_t *ids,
                      size_t n_ids)
{
    if (s->words_n + n > CACHE_MAX_BYTES || s->ids_n + n_ids > CACHE_MAX_BYTES / 4) cache_clear(s);
    if (2 * (s->used + 1) > s->cap) { /* grow: rehash */
        struct cache_entry *old = s->table;
        const size_t old_cap = s->cap;
        s->cap *= 2;
        s->table = xrealloc(NULL, s->cap * sizeof *s->table);
        memset(s->table, 0, s->cap * sizeof *s->table);
        for (size_t i = 0; i < old_cap; i++)
            if (old[i].hash) {
                size_t j = (size_t)old[i].hash & (s->cap - 1);
                while (s->table[j].hash) j = (j + 1) & (s->cap - 1);
                s->table[j] = old[i];
            }
        free(old);
    }
    if (s->words_n + n > s->words_cap) {
        s->words_cap = 2 * (s->words_n + n) + 4096;
        s->words = xrealloc(s->words, s->words_cap);
    }
    if (s->ids_n + n_ids > s->ids_cap) {
        s->ids_cap = 2 * (s->ids_n + n_ids) + 1024;
        s->ids = xrealloc(s->ids, s->ids_cap * sizeof *s->ids);
    }
    size_t i = (size_t)h & (s->cap - 1);
    while (s->table[i].hash) i = (i + 1) & (s->cap - 1);
    s->table[i] =
        (struct cache_entry){h, (uint32_t)s->words_n, (uint32_t)n, (uint32_t)s->ids_n, (uint32_t)n_ids};
    memcpy(s->words + s->words_n, w, n);
    memcpy(s->ids + s->ids_n, ids, n_ids * sizeof *ids);
    s->words_n += n;
    s->ids_n += n_ids;
    s->used++;
}

/* ---- merging one piece ----------------------------------------------------------- */

static int heap_less(struct heap_item a, struct heap_item b)
{
    return a.rank < b.rank || (a.rank == b.rank && a.pos < b.pos);
}

static void heap_push(struct heap_item *h, size_t *n, struct heap_item x)
{
    size_t i = (*n)++;
    while (i && heap_less(x, h[(i - 1) / 2])) {
        h[i] = h[(i - 1) / 2];
        i = (i - 1) / 2;
    }
    h[i] = x;
}

static struct heap_item heap_pop(struct heap_item *h, size_t *n)
{
    const struct heap_item top = h[0], x = h[--(*n)];
    size_t i = 0;
    for (;;) {
        size_t c = 2 * i + 1;
        if (c >= *n) break;
        if (c + 1 < *n && heap_less(h[c + 1], h[c])) c++;
        if (!heap_less(h[c], x)) break;
        h[i] = h[c];
        i = c;
    }
    if (*n) h[i] = x;
    return top;
}

void bpe_merge_piece(const struct loom_bpe *t, struct loom_bpe_state *s, const char *w, size_t n,
                     struct loom_ids *out)
{
    if (!n) return;
    if (t->ignore_merges && !t->sp.char_level) {
        const int32_t id = bpe_vocab_find(t, w, n);
        if (id >= 0) {
            loom_ids_push(out, id);
            return;
        }
    }
    if (n == 1 && !t->sp.char_level) {
        loom_ids_push(out, t->byte_id[(uint8_t)w[0]]);
        return;
    }
    const uint64_t h = (XXH3_64bits(w, n) | 1);
    if (n <= CACHE_MAX_WORD) {
        const struct cache_entry *e = cache_find(s, w, n, h);
        if (e) {
            for (uint32_t i = 0; i < e->n_ids; i++) loom_ids_push(out, s->ids[e->ids + i]);
            return;
        }
    }
    if (n > s->scratch_cap) {
        s->scratch_cap = 2 * n;
        s->sym = xrealloc(s->sym, s->scratch_cap * sizeof *s->sym);
        s->prev = xrealloc(s->prev, s->scratch_cap * sizeof *s->prev);
        s->next = xrealloc(s->next, s->scratch_cap * sizeof *s->next);
        s->heap = xrealloc(s->heap, 2 * s->scratch_cap * sizeof *s->heap);
    }
    int32_t *sym = s->sym, *prev = s->prev, *next = s->next;
    size_t nh = 0, m = n; /* m symbols: the bytes, or (char_level) the characters' */
    if (t->sp.char_level)
        m = bpe_sp_symbols(t, w, n, sym);
    else
        for (size_t i = 0; i < n; i++) sym[i] = t->byte_id[(uint8_t)w[i]];
    for (size_t i = 0; i < m; i++) {
        prev[i] = (int32_t)i - 1;
        next[i] = i + 1 < m ? (int32_t)i + 1 : -1;
    }
    const size_t first = out->n;
    if (!m) goto done;
    for (size_t i = 0; i + 1 < m; i++) {
        const int32_t r = pair_rank(&t->pairs, sym[i], sym[i + 1]);
        if (r >= 0) heap_push(s->heap, &nh, (struct heap_item){r, (int32_t)i});
    }
    while (nh) {
        const struct heap_item top = heap_pop(s->heap, &nh);
        const int32_t i = top.pos, j = next[i];
        /* stale: the left symbol merged away, or the pair is no longer this merge */
        if (sym[i] < 0 || j < 0 || sym[i] != t->merge[top.rank][0] || sym[j] != t->merge[top.rank][1])
            continue;
        sym[i] = t->merge[top.rank][2];
        sym[j] = -1;
        next[i] = next[j];
        if (next[j] >= 0) prev[next[j]] = i;
        if (prev[i] >= 0) {
            const int32_t r = pair_rank(&t->pairs, sym[prev[i]], sym[i]);
            if (r >= 0) heap_push(s->heap, &nh, (struct heap_item){r, prev[i]});
        }
        if (next[i] >= 0) {
            const int32_t r = pair_rank(&t->pairs, sym[i], sym[next[i]]);
            if (r >= 0) heap_push(s->heap, &nh, (struct heap_item){r, i});
        }
    }
    for (int32_t i = 0; i >= 0; i = next[i]) loom_ids_push(out, sym[i]);
done:
    if (n <= CACHE_MAX_WORD) cache_put(s, w, n, h, out->ids + first, out->n - first);
}

/* ---- pre-tokenization and added tokens ------------------------------------------ */

static void run_steps(const struct loom_bpe *t, struct loom_bpe_state *s, int k, const char *p, size_t n,
                      struct loom_ids *out)
{
    if (!n) return;
    if (t->sp.char_level) { /* its own normalization and pre-tokenization */
        bpe_sp_segment(t, s, p, n, p == s->text_begin, out);
        return;
    }
    if (k == t->n_steps) {
        if (s->piece_fn)
            s->piece_fn(s->piece_ctx, p, n);
        else
            bpe_merge_piece(t, s, p, n, out);
        return;
    }
    const struct bpe_step *st = &t->step[k];
    if (st->prefix_space) {
        if (p[0] == ' ') {
            run_steps(t, s, k + 1, p, n, out);
            return;
        }
        /* the next steps may reuse the buffer: a copy of its own */
        char *buf = xrealloc(NULL, n + 1);
        buf[0] = ' ';
        memcpy(buf + 1, p, n);
        run_steps(t, s, k + 1, buf, n + 1, out);
        free(buf);
        return;
    }
    size_t at = 0;
    while (at < n) {
        int rc = pcre2_match(st->re, (PCRE2_SPTR)p, n, at, PCRE2_NO_UTF_CHECK, s->md[k], s->mctx);
        if (rc < 0) break; /* no more matches (or a match error): the rest is one gap */
        const PCRE2_SIZE *ov = pcre2_get_ovector_pointer(s->md[k]);
        size_t b = ov[0], e = ov[1];
        if (e == b) { /* an empty match: not a piece; step over one character */
            if (b >= n) break;
            size_t l = 1;
            while (b + l < n && ((unsigned char)p[b + l] & 0xC0) == 0x80) l++;
            if (b > at) run_steps(t, s, k + 1, p + at, b - at, out);
            run_steps(t, s, k + 1, p + b, l, out);
            at = b + l;
            continue;
        }
        if (b > at) run_steps(t, s, k + 1, p + at, b - at, out);
        run_steps(t, s, k + 1, p + b, e - b, out);
        at = e;
    }
    if (at < n) run_steps(t, s, k + 1, p + at, n - at, out);
}

static int is_space(unsigned char c)
{
    return c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == '\v' || c == '\f';
}

/* Leftmost-longest match of the added tokens of one kind (special or not)
 * in p[0, n) at or after `from`: its [begin, end) with lstrip/rstrip
 * applied, and the token; -1 when none. */
static int find_added(const struct loom_bpe *t, int special, const char *p, size_t n, size_t from,
                      size_t *begin, size_t *end)
{
    for (size_t i = from; i < n; i++) {
        int best = -1;
        for (int a = 0; a < t->n_added; a++) {
            const struct bpe_added *x = &t->added[a];
            if (x->special != special || x->len > n - i || x->content[0] != p[i]) continue;
            if (memcmp(p + i, x->content, x->len) != 0) continue;
            if (best < 0 || x->len > t->added[best].len) best = a;
        }
        if (best < 0) continue;
        size_t b = i, e = i + t->added[best].len;
        if (t->added[best].lstrip)
            while (b > from && is_space((unsigned char)p[b - 1])) b--;
        if (t->added[best].rstrip)
            while (e < n && is_space((unsigned char)p[e])) e++;
        *begin = b, *end = e;
        return best;
    }
    return -1;
}

static void encode_added(const struct loom_bpe *t, struct loom_bpe_state *s, int special, const char *p,
                         size_t n, struct loom_ids *out)
{
    size_t at = 0, b, e;
    int a;
    while (at < n && (a = find_added(t, special, p, n, at, &b, &e)) >= 0) {
        if (special)
            encode_added(t, s, 0, p + at, b - at, out);
        else
            run_steps(t, s, 0, p + at, b - at, out);
        loom_ids_push(out, t->added[a].id);
        at = e;
    }
    if (special)
        encode_added(t, s, 0, p + at, n - at, out);
    else
        run_steps(t, s, 0, p + at, n - at, out);
}

void loom_bpe_encode(const struct loom_bpe *t, struct loom_bpe_state *s, const char *text, size_t n,
                     struct loom_ids *out)
{
    size_t fixed_n;
    char *fixed = loom_utf8_repair(text, n, &fixed_n);
    if (fixed) text = fixed, n = fixed_n;
    s->text_begin = text;
    encode_added(t, s, 1, text, n, out);
    free(fixed);
}

void loom_bpe_pieces(const struct loom_bpe *t, struct loom_bpe_state *s, const char *text, size_t n,
                     void (*fn)(void *ctx, const char *piece, size_t len), void *ctx)
{
    struct loom_ids added = {0};
    s->piece_fn = fn;
    s->piece_ctx = ctx;
    loom_bpe_encode(t, s, text, n, &added);
    s->piece_fn = NULL;
    loom_ids_free(&added);
}

/* ---- decoding -------------------------------------------------------------------- */

size_t loom_bpe_decode(const struct loom_bpe *t, const int32_t *ids, size_t n, char *out, size_t cap)
{
    if (t->sp.char_level) return bpe_sp_decode(t, ids, n, out, cap);
    size_t raw_n = 0;
    for (size_t i = 0; i < n; i++)
        raw_n += ids[i] >= 0 && ids[i] < t->n_ids && t->bytes[ids[i]] ? t->bytes_len[ids[i]] : 16;
    char *raw = xrealloc(NULL, raw_n + 1);
    size_t k = 0;
    for (size_t i = 0; i < n; i++) {
        if (ids[i] >= 0 && ids[i] < t->n_ids && t->bytes[ids[i]]) {
            memcpy(raw + k, t->bytes[ids[i]], t->bytes_len[ids[i]]);
            k += t->bytes_len[ids[i]];
        } else {
            k += (size_t)snprintf(raw + k, 16, "<%d>", ids[i]);
        }
    }
    size_t text_n;
    char *text = loom_utf8_repair(raw, k, &text_n);
    const char *src = text ? text : raw;
    const size_t len = text ? text_n : k;
    if (cap) {
        const size_t m = len < cap - 1 ? len : cap - 1;
        memcpy(out, src, m);
        out[m] = 0;
    }
    free(text);
    free(raw);
    return len;
}

/* ---- building from learned merges ---------------------------------------------- */

int loom_bpe_build(const char *const *specials, int n_special, const char *pattern,
                   const int32_t (*merges)[2], int64_t n_merges, struct loom_bpe **out)
{
    struct loom_bpe *t = xrealloc(NULL, sizeof *t);
    memset(t, 0, sizeof *t);
    t->n_ids = (int32_t)(n_special + 256 + n_merges);
    t->name = xrealloc(NULL, (size_t)t->n_ids * sizeof *t->name);
    t->is_added = xrealloc(NULL, (size_t)t->n_ids);
    memset(t->is_added, 0, (size_t)t->n_ids);
    t->added = xrealloc(NULL, (size_t)(n_special ? n_special : 1) * sizeof *t->added);
    for (int i = 0; i < n_special; i++) {
        t->name[i] = strdup(specials[i]);
        t->is_added[i] = 1;
        t->added[t->n_added++] = (struct bpe_added){
            .content = strdup(specials[i]), .len = (uint32_t)strlen(specials[i]), .id = i, .special = 1};
    }
    for (int b = 0; b < 256; b++) {
        const char c = (char)b;
        t->name[n_special + b] = bpe_bytes_name(&c, 1);
    }
    /* merge k joins learner ids (bytes 0..255, then 256 + k); a merge whose
     * result is already a token (two ways to the same bytes) reuses its id */
    int32_t *final = xrealloc(NULL, (size_t)(256 + n_merges) * sizeof *final);
    for (int b = 0; b < 256; b++) final[b] = n_special + b;
    size_t cap = pow2_at_least(2 * (size_t)t->n_ids);
    int32_t *seen = xrealloc(NULL, cap * sizeof *seen);
    memset(seen, 0xFF, cap * sizeof *seen);
    t->merge = xrealloc(NULL, (size_t)(n_merges ? n_merges : 1) * sizeof *t->merge);
    t->n_merges = n_merges;
    int32_t next_id = n_special + 256;
    for (int64_t k = 0; k < n_merges; k++) {
        const int32_t a = final[merges[k][0]], b = final[merges[k][1]];
        const size_t la = strlen(t->name[a]), lb = strlen(t->name[b]);
        char *name = xrealloc(NULL, la + lb + 1);
        memcpy(name, t->name[a], la);
        memcpy(name + la, t->name[b], lb + 1);
        size_t i = (size_t)XXH3_64bits(name, la + lb) & (cap - 1);
        while (seen[i] >= 0 && strcmp(t->name[seen[i]], name) != 0) i = (i + 1) & (cap - 1);
        if (seen[i] >= 0) {
            final[256 + k] = seen[i];
            free(name);
        } else {
            final[256 + k] = seen[i] = next_id;
            t->name[next_id++] = name;
        }
        t->merge[k][0] = a, t->merge[k][1] = b, t->merge[k][2] = final[256 + k];
    }
    t->n_ids = next_id;
    free(final);
    free(seen);
    int rc;
    if (strcmp(pattern, loom_bpe_pattern_gpt2) == 0) {
        t->n_steps = 1;
        t->step[0].byte_level = 1;
        rc = bpe_step_split(&t->step[0], pattern, 0, "the GPT-2 pattern");
        snprintf(t->describe, sizeof t->describe, "gpt2");
    } else {
        t->n_steps = 1;
        rc = bpe_step_split(&t->step[0], pattern, 0, "--pattern");
        snprintf(t->describe, sizeof t->describe, "%s",
                 strcmp(pattern, loom_bpe_pattern_llama3) == 0 ? "llama3" : "custom");
    }
    if (!rc) rc = bpe_index_vocab(t);
    if (!rc) bpe_index_merges(t);
    if (rc) {
        loom_bpe_free(t);
        return rc;
    }
    *out = t;
    return LOOM_OK;
}
