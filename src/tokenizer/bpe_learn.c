/*
 * Byte-level BPE merge learning (see bpe_learn.h), the classic incremental
 * algorithm: every word is kept as its current token sequence; the count of
 * every adjacent pair lives in a hash table keyed by (first << 32 | second),
 * with the list of words the pair was seen in; a max-heap of (count, pair)
 * with lazy invalidation gives the next merge (a popped entry whose count is
 * stale is pushed again with the current one). A merge rewrites only the
 * words on the pair's list and adjusts the counts of the pairs around each
 * occurrence, so its cost follows the number of occurrences, not the corpus.
 *
 * Every token is made by one merge, so a pair gains occurrences only while
 * the merge that made its newer token runs (or at the start, for two bytes):
 * the pairs a merge adds all hold its new token and are new to the table.
 * They are pushed once that merge is done; after that a pair's count only
 * falls, so a heap entry never understates its pair. For the same reason a
 * word list never holds a word twice (it is filled while the words go by
 * once), though it may hold words that lost the pair since.
 *
 * Not here: pre-tokenization, threads (one core), the accounting allocator
 * (plain malloc), and learning from anything but byte-level words.
 */
#include "tokenizer/bpe_learn.h"

#include <stdbool.h>
#include <stdlib.h>
#include <string.h>

#define BYTE_TOKENS 256
#define NO_WORD UINT32_MAX /* a pair's last_word before any word is listed */
#define NO_PAIR UINT32_MAX /* an empty hash slot */

/* One distinct pair of adjacent tokens. */
struct pair {
    uint64_t key;       /* first << 32 | second */
    int64_t count;      /* occurrences over the corpus, times the words' counts */
    uint32_t *words;    /* words the pair was seen in (some may have lost it since) */
    uint32_t n_words;   /* entries used in words */
    uint32_t cap_words; /* entries allocated in words */
    uint32_t last_word; /* the word appended last (a pair twice in a word is listed once) */
};

/* One word as it is being merged. */
struct word {
    size_t offset; /* its tokens in learner.tokens */
    uint32_t len;  /* tokens now (shrinks with every merge) */
    int64_t count; /* occurrences in the corpus */
};

/* One heap entry: a pair with its count when pushed. */
struct entry {
    int64_t count;
    uint64_t key;
    uint32_t pair; /* index into learner.pairs */
};

struct learner {
    uint32_t *tokens; /* every word's tokens, back to back */
    struct word *words;
    uint32_t n_words;

    struct pair *pairs;
    uint32_t n_pairs, cap_pairs;
    uint32_t *slots; /* hash table: pair index or NO_PAIR, open addressing with linear probing */
    uint32_t slot_bits;

    struct entry *heap;
    size_t n_heap, cap_heap;
};

/* ---- growth helpers ----------------------------------------------------- */

/* Makes room for one more element in *array (capacity *cap, used n), doubling;
 * false when memory runs out or the capacity would pass max. */
static bool grow(void **array, size_t *cap, size_t n, size_t elem, size_t max)
{
    if (n < *cap) return true;
    if (*cap >= max) return false;
    size_t new_cap = *cap ? *cap * 2 : 16;
    if (new_cap > max || new_cap < *cap) new_cap = max;
    if (new_cap > SIZE_MAX / elem) return false;
    void *p = realloc(*array, new_cap * elem);
    if (!p) return false;
    *array = p;
    *cap = new_cap;
    return true;
}

static bool grow_u32(void **array, uint32_t *cap, uint32_t n, size_t elem)
{
    size_t c = *cap;
    if (!grow(array, &c, n, elem, UINT32_MAX - 1)) return false;
    *cap = (uint32_t)c;
    return true;
}

/* ---- pair table --------------------------------------------------------- */

static uint64_t pair_key(uint32_t first, uint32_t second)
{
    return (uint64_t)first << 32 | second;
}

static size_t slot_of(uint64_t key, uint32_t bits)
{
    return (size_t)((key * 0x9E3779B97F4A7C15ull) >> (64 - bits));
}

/* Doubles the hash table and re-inserts every pair. */
static bool rehash(struct learner *l)
{
    uint32_t bits = l->slot_bits + 1;
    if (bits > 33) return false; /* more slots than pair indices */
    size_t n_slots = (size_t)1 << bits;
    uint32_t *slots = malloc(n_slots * sizeof *slots);
    if (!slots) return false;
    memset(slots, 0xff, n_slots * sizeof *slots);
    for (uint32_t i = 0; i < l->n_pairs; i++) {
        size_t s = slot_of(l->pairs[i].key, bits);
        while (slots[s] != NO_PAIR) s = (s + 1) & (n_slots - 1);
        slots[s] = i;
    }
    free(l->slots);
    l->slots = slots;
    l->slot_bits = bits;
    return true;
}

/* The pair's index, or NO_PAIR when it was never seen. */
static uint32_t pair_find(const struct learner *l, uint64_t key)
{
    size_t mask = ((size_t)1 << l->slot_bits) - 1;
    for (size_t s = slot_of(key, l->slot_bits);; s = (s + 1) & mask) {
        uint32_t i = l->slots[s];
        if (i == NO_PAIR || l->pairs[i].key == key) return i;
    }
}

/* The pair's index, adding it with count 0 when new; NO_PAIR when memory runs out. */
static uint32_t pair_get(struct learner *l, uint64_t key)
{
    size_t mask = ((size_t)1 << l->slot_bits) - 1;
    size_t s = slot_of(key, l->slot_bits);
    for (;; s = (s + 1) & mask) {
        uint32_t i = l->slots[s];
        if (i == NO_PAIR) break;
        if (l->pairs[i].key == key) return i;
    }
    if (!grow_u32((void **)&l->pairs, &l->cap_pairs, l->n_pairs, sizeof *l->pairs)) return NO_PAIR;
    uint32_t i = l->n_pairs++;
    l->pairs[i] = (struct pair){.key = key, .last_word = NO_WORD};
    l->slots[s] = i;
    if ((size_t)l->n_pairs * 2 > mask + 1 && !rehash(l)) {
        l->n_pairs--; /* undo, so that the table and the array agree */
        l->slots[s] = NO_PAIR;
        return NO_PAIR;
    }
    return i;
}

/* Notes that pair i occurs in word w. */
static bool pair_add_word(struct pair *p, uint32_t w)
{
    if (p->last_word == w) return true;
    if (!grow_u32((void **)&p->words, &p->cap_words, p->n_words, sizeof *p->words)) return false;
    p->words[p->n_words++] = w;
    p->last_word = w;
    return true;
}

/* Subtracts c from the count of a pair known to occur. */
static void pair_sub(struct learner *l, uint32_t first, uint32_t second, int64_t c)
{
    uint32_t i = pair_find(l, pair_key(first, second));
    l->pairs[i].count -= c;
}

/* Adds c to the count of (first, second), which occurs in word w. */
static bool pair_add(struct learner *l, uint32_t first, uint32_t second, int64_t c, uint32_t w)
{
    uint32_t i = pair_get(l, pair_key(first, second));
    if (i == NO_PAIR) return false;
    struct pair *p = &l->pairs[i];
    if (__builtin_add_overflow(p->count, c, &p->count)) return false;
    return pair_add_word(p, w);
}

/* ---- heap --------------------------------------------------------------- */

/* a comes out before b: higher count, then smaller pair. */
static bool entry_before(const struct entry *a, const struct entry *b)
{
    return a->count > b->count || (a->count == b->count && a->key < b->key);
}

static void sift_down(struct entry *h, size_t n, size_t i)
{
    struct entry e = h[i];
    for (;;) {
        size_t child = 2 * i + 1;
        if (child >= n) break;
        if (child + 1 < n && entry_before(&h[child + 1], &h[child])) child++;
        if (!entry_before(&h[child], &e)) break;
        h[i] = h[child];
        i = child;
    }
    h[i] = e;
}

static bool heap_push(struct learner *l, uint32_t pair)
{
    if (!grow((void **)&l->heap, &l->cap_heap, l->n_heap, sizeof *l->heap, SIZE_MAX)) return false;
    struct entry e = {.count = l->pairs[pair].count, .key = l->pairs[pair].key, .pair = pair};
    size_t i = l->n_heap++;
    while (i > 0) {
        size_t parent = (i - 1) / 2;
        if (!entry_before(&e, &l->heap[parent])) break;
        l->heap[i] = l->heap[parent];
        i = parent;
    }
    l->heap[i] = e;
    return true;
}

static struct entry heap_pop(struct learner *l)
{
    struct entry top = l->heap[0];
    l->heap[0] = l->heap[--l->n_heap];
    if (l->n_heap) sift_down(l->heap, l->n_heap, 0);
    return top;
}

/* ---- learning ----------------------------------------------------------- */

static void learner_free(struct learner *l)
{
    for (uint32_t i = 0; i < l->n_pairs; i++) free(l->pairs[i].words);
    free(l->pairs);
    free(l->slots);
    free(l->heap);
    free(l->words);
    free(l->tokens);
}

/* Copies the words that can hold a pair and counts their pairs. */
static bool learner_init(struct learner *l, const struct loom_bpe_word *words, size_t n_words)
{
    size_t n_kept = 0, n_tokens = 0;
    for (size_t i = 0; i < n_words; i++) {
        if (words[i].count <= 0 || words[i].len < 2) continue;
        if (n_kept == UINT32_MAX - 1) return false;
        n_kept++;
        if (__builtin_add_overflow(n_tokens, words[i].len, &n_tokens)) return false;
    }
    if (n_tokens > SIZE_MAX / sizeof *l->tokens) return false;
    l->tokens = malloc(n_tokens ? n_tokens * sizeof *l->tokens : 1);
    l->words = malloc(n_kept ? n_kept * sizeof *l->words : 1);
    l->slot_bits = 10;
    l->slots = malloc(((size_t)1 << l->slot_bits) * sizeof *l->slots);
    if (!l->tokens || !l->words || !l->slots) return false;
    memset(l->slots, 0xff, ((size_t)1 << l->slot_bits) * sizeof *l->slots);

    size_t offset = 0;
    for (size_t i = 0; i < n_words; i++) {
        const struct loom_bpe_word *src = &words[i];
        if (src->count <= 0 || src->len < 2) continue;
        uint32_t w = l->n_words++;
        l->words[w] = (struct word){.offset = offset, .len = src->len, .count = src->count};
        uint32_t *t = l->tokens + offset;
        for (uint32_t j = 0; j < src->len; j++) t[j] = src->bytes[j];
        offset += src->len;
        for (uint32_t j = 0; j + 1 < src->len; j++) {
            uint32_t p = pair_get(l, pair_key(t[j], t[j + 1]));
            if (p == NO_PAIR) return false;
            if (__builtin_add_overflow(l->pairs[p].count, src->count, &l->pairs[p].count)) return false;
            if (!pair_add_word(&l->pairs[p], w)) return false;
        }
    }

    l->cap_heap = l->n_pairs ? l->n_pairs : 1;
    l->heap = malloc(l->cap_heap * sizeof *l->heap);
    if (!l->heap) return false;
    for (uint32_t i = 0; i < l->n_pairs; i++)
        l->heap[i] = (struct entry){.count = l->pairs[i].count, .key = l->pairs[i].key, .pair = i};
    l->n_heap = l->n_pairs;
    for (size_t i = l->n_heap / 2; i-- > 0;) sift_down(l->heap, l->n_heap, i);
    return true;
}

/* Replaces (a, b) by id in word w, left to right without overlap, moving the
 * counts of the pairs around each occurrence from the old tokens to id. */
static bool merge_word(struct learner *l, uint32_t w, uint32_t a, uint32_t b, uint32_t id, uint32_t merged)
{
    struct word *word = &l->words[w];
    uint32_t *t = l->tokens + word->offset;
    uint32_t n = word->len, out = 0;
    int64_t c = word->count;
    for (uint32_t i = 0; i < n;) {
        if (i + 1 < n && t[i] == a && t[i + 1] == b) {
            /* t[out - 1] is already rewritten: after an occurrence right
             * before this one it is id, and the pair (id, a) it made there
             * moves on to (id, id). */
            if (out > 0) {
                pair_sub(l, t[out - 1], a, c);
                if (!pair_add(l, t[out - 1], id, c, w)) return false;
            }
            if (i + 2 < n) {
                pair_sub(l, b, t[i + 2], c);
                if (!pair_add(l, id, t[i + 2], c, w)) return false;
            }
            l->pairs[merged].count -= c;
            t[out++] = id;
            i += 2;
        } else {
            t[out++] = t[i++];
        }
    }
    word->len = out;
    return true;
}

/* The pair to merge next (its entry popped), or false when none is left. */
static bool next_pair(struct learner *l, struct entry *best, bool *failed)
{
    while (l->n_heap) {
        struct entry e = heap_pop(l);
        int64_t now = l->pairs[e.pair].count;
        if (now == e.count) {
            *best = e;
            return true;
        }
        if (now > 0 && !heap_push(l, e.pair)) {
            *failed = true;
            return false;
        }
    }
    return false;
}

int64_t loom_bpe_learn(const struct loom_bpe_word *words, size_t n_words, int64_t max_merges,
                       int64_t min_frequency, int32_t (*merges)[2])
{
    if (max_merges <= 0) return 0;
    if (max_merges > INT32_MAX - BYTE_TOKENS) max_merges = INT32_MAX - BYTE_TOKENS;
    struct learner l = {0};
    int64_t done = -1;
    if (!learner_init(&l, words, n_words)) goto out;

    int64_t k = 0;
    for (; k < max_merges; k++) {
        struct entry best;
        bool failed = false;
        if (!next_pair(&l, &best, &failed)) {
            if (failed) goto out;
            break;
        }
        if (best.count <= 0 || best.count < min_frequency) break;
        uint32_t a = (uint32_t)(best.key >> 32), b = (uint32_t)best.key;
        uint32_t id = (uint32_t)(BYTE_TOKENS + k);
        merges[k][0] = (int32_t)a;
        merges[k][1] = (int32_t)b;

        /* Take the word list: no pair added below is (a, b), as all hold id. */
        struct pair *p = &l.pairs[best.pair];
        uint32_t *list = p->words, n_list = p->n_words;
        p->words = NULL;
        p->n_words = p->cap_words = 0;
        p->last_word = NO_WORD;
        uint32_t first_new = l.n_pairs;
        bool ok = true;
        for (uint32_t i = 0; i < n_list && ok; i++) ok = merge_word(&l, list[i], a, b, id, best.pair);
        free(list);
        if (!ok) goto out;

        /* The pairs this merge made; those it made and unmade again (the
         * (id, a) before a second occurrence) drop their word lists. */
        for (uint32_t i = first_new; i < l.n_pairs; i++) {
            struct pair *q = &l.pairs[i];
            if (q->count > 0) {
                if (!heap_push(&l, i)) goto out;
            } else {
                free(q->words);
                q->words = NULL;
                q->n_words = q->cap_words = 0;
            }
        }
    }
    done = k;
out:
    learner_free(&l);
    return done;
}
