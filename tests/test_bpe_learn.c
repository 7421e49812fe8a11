/*
 * Unit tests of byte-level BPE merge learning (src/tokenizer/bpe_learn.c):
 * small cases worked by hand (runs of one byte such as "aaa" and "aaaaa",
 * ties, counts with multiplicity, the early stop by min_frequency, ignored
 * words), the merges of random corpora against a naive learner written here
 * (all pairs recounted from scratch for every merge), and a corpus of 50k
 * random words for 2000 merges checked for valid, distinct merges.
 *
 * Not here: timing (the size case only has to finish), and running out of
 * memory (the learner uses plain malloc, which the test cannot make fail).
 */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "check.h"
#include "tokenizer/bpe_learn.h"

/* ---- helpers --------------------------------------------------------------- */

static uint64_t rng_state;

static uint64_t rng_next(void)
{
    uint64_t z = (rng_state += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}

static uint32_t rng_below(uint32_t n)
{
    return (uint32_t)(rng_next() % n);
}

/* A word of the corpus from a C string. */
static struct loom_bpe_word word_of(const char *s, int64_t count)
{
    return (struct loom_bpe_word){.bytes = (const uint8_t *)s, .len = (uint32_t)strlen(s), .count = count};
}

/* Learns and compares with the expected merges (n_want of them). */
static int learns(const struct loom_bpe_word *words, size_t n_words, int64_t max_merges,
                  int64_t min_frequency, const int32_t (*want)[2], int64_t n_want)
{
    int32_t(*got)[2] = calloc(max_merges > 0 ? (size_t)max_merges : 1, sizeof *got);
    int64_t n = loom_bpe_learn(words, n_words, max_merges, min_frequency, got);
    int ok = n == n_want;
    for (int64_t k = 0; ok && k < n; k++) ok = got[k][0] == want[k][0] && got[k][1] == want[k][1];
    if (!ok) {
        fprintf(stderr, "  got %lld merges:", (long long)n);
        for (int64_t k = 0; k < n; k++) fprintf(stderr, " (%d,%d)", got[k][0], got[k][1]);
        fprintf(stderr, "\n  want %lld:", (long long)n_want);
        for (int64_t k = 0; k < n_want; k++) fprintf(stderr, " (%d,%d)", want[k][0], want[k][1]);
        fprintf(stderr, "\n");
    }
    free(got);
    return ok;
}

/* ---- the naive learner ----------------------------------------------------- */

struct ref_pair {
    uint64_t key; /* first << 32 | second */
    int64_t count;
};

static int ref_pair_cmp(const void *a, const void *b)
{
    uint64_t x = ((const struct ref_pair *)a)->key, y = ((const struct ref_pair *)b)->key;
    return x < y ? -1 : x > y;
}

static int u64_cmp(const void *a, const void *b)
{
    uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;
    return x < y ? -1 : x > y;
}

/* Recounts every pair of every word for every merge: the list of all
 * occurrences, sorted by pair and summed. */
static int64_t ref_learn(const struct loom_bpe_word *words, size_t n_words, int64_t max_merges,
                         int64_t min_frequency, int32_t (*merges)[2])
{
    int32_t **tok = calloc(n_words ? n_words : 1, sizeof *tok);
    uint32_t *len = calloc(n_words ? n_words : 1, sizeof *len);
    size_t total = 0;
    for (size_t w = 0; w < n_words; w++) {
        len[w] = words[w].len;
        tok[w] = malloc((len[w] ? len[w] : 1) * sizeof **tok);
        for (uint32_t i = 0; i < len[w]; i++) tok[w][i] = words[w].bytes[i];
        total += len[w];
    }
    struct ref_pair *occ = malloc((total ? total : 1) * sizeof *occ);
    int64_t k = 0;
    for (; k < max_merges; k++) {
        size_t n_occ = 0;
        for (size_t w = 0; w < n_words; w++) {
            if (words[w].count <= 0) continue;
            for (uint32_t i = 0; i + 1 < len[w]; i++)
                occ[n_occ++] =
                    (struct ref_pair){(uint64_t)tok[w][i] << 32 | (uint32_t)tok[w][i + 1], words[w].count};
        }
        qsort(occ, n_occ, sizeof *occ, ref_pair_cmp);
        uint64_t best_key = 0;
        int64_t best_count = 0;
        for (size_t i = 0; i < n_occ;) {
            size_t j = i;
            int64_t c = 0;
            while (j < n_occ && occ[j].key == occ[i].key) c += occ[j++].count;
            if (c > best_count) { /* ascending keys: the first of equal counts is the smallest */
                best_count = c;
                best_key = occ[i].key;
            }
            i = j;
        }
        if (best_count == 0 || best_count < min_frequency) break;
        int32_t a = (int32_t)(best_key >> 32), b = (int32_t)(uint32_t)best_key, id = (int32_t)(256 + k);
        merges[k][0] = a;
        merges[k][1] = b;
        for (size_t w = 0; w < n_words; w++) {
            uint32_t out = 0;
            for (uint32_t i = 0; i < len[w];) {
                if (i + 1 < len[w] && tok[w][i] == a && tok[w][i + 1] == b) {
                    tok[w][out++] = id;
                    i += 2;
                } else {
                    tok[w][out++] = tok[w][i++];
                }
            }
            len[w] = out;
        }
    }
    for (size_t w = 0; w < n_words; w++) free(tok[w]);
    free(tok);
    free(len);
    free(occ);
    return k;
}

/* ---- cases by hand --------------------------------------------------------- */

static void test_runs(void)
{
    /* "aaa": [aa, a], then (aa, a) */
    struct loom_bpe_word aaa[] = {word_of("aaa", 1)};
    const int32_t aaa_want[][2] = {{'a', 'a'}, {256, 'a'}};
    CHECK(learns(aaa, 1, 10, 0, aaa_want, 2));

    /* "aaaa": [aa, aa], then (aa, aa) */
    struct loom_bpe_word aaaa[] = {word_of("aaaa", 3)};
    const int32_t aaaa_want[][2] = {{'a', 'a'}, {256, 256}};
    CHECK(learns(aaaa, 1, 10, 0, aaaa_want, 2));

    /* "aaaaa": [aa, aa, a]; (aa, aa) and (aa, a) tie at 1 and (256, 97) is
     * smaller: [aa, aaa]; then (aa, aaa) */
    struct loom_bpe_word a5[] = {word_of("aaaaa", 1)};
    const int32_t a5_want[][2] = {{'a', 'a'}, {256, 'a'}, {256, 257}};
    CHECK(learns(a5, 1, 10, 0, a5_want, 3));

    /* max_merges cuts the list */
    CHECK(learns(a5, 1, 2, 0, a5_want, 2));
    CHECK(learns(a5, 1, 0, 0, a5_want, 0));
}

static void test_ties_and_counts(void)
{
    /* equal counts: (a, b) before (b, a) before (b, c) */
    struct loom_bpe_word tie[] = {word_of("bc", 1), word_of("ba", 1), word_of("ab", 1)};
    const int32_t tie_want[][2] = {{'a', 'b'}, {'b', 'a'}, {'b', 'c'}};
    CHECK(learns(tie, 3, 10, 0, tie_want, 3));

    /* "abab" x 5: (a, b) counts 10, (b, a) 5; then [ab, ab] gives (ab, ab) 5,
     * beating "ba" x 4 */
    struct loom_bpe_word mult[] = {word_of("abab", 5), word_of("ba", 4)};
    const int32_t mult_want[][2] = {{'a', 'b'}, {256, 256}, {'b', 'a'}};
    CHECK(learns(mult, 2, 10, 0, mult_want, 3));

    /* merges never cross words: "ab" and "ba" never make "aba" */
    struct loom_bpe_word apart[] = {word_of("ab", 2), word_of("a", 7), word_of("ba", 1)};
    const int32_t apart_want[][2] = {{'a', 'b'}, {'b', 'a'}};
    CHECK(learns(apart, 3, 10, 0, apart_want, 2));

    /* words with count <= 0 are ignored; a word listed twice adds up */
    struct loom_bpe_word ignored[] = {word_of("xy", 0), word_of("xy", -3), word_of("cd", 2),
                                      word_of("ef", 1), word_of("ef", 2),  word_of("", 9)};
    const int32_t ignored_want[][2] = {{'e', 'f'}, {'c', 'd'}};
    CHECK(learns(ignored, 6, 10, 0, ignored_want, 2));

    /* the extreme bytes */
    static const uint8_t hi[] = {255, 0, 255, 0};
    struct loom_bpe_word bytes[] = {{.bytes = hi, .len = 4, .count = 1}};
    const int32_t bytes_want[][2] = {{255, 0}, {256, 256}};
    CHECK(learns(bytes, 1, 10, 0, bytes_want, 2));

    /* nothing to learn */
    CHECK(learns(NULL, 0, 10, 0, NULL, 0));
    struct loom_bpe_word single[] = {word_of("a", 100), word_of("b", 100)};
    CHECK(learns(single, 2, 10, 0, NULL, 0));
}

static void test_min_frequency(void)
{
    struct loom_bpe_word words[] = {word_of("ab", 5), word_of("cd", 3), word_of("ef", 1)};
    const int32_t want[][2] = {{'a', 'b'}, {'c', 'd'}, {'e', 'f'}};
    CHECK(learns(words, 3, 10, 0, want, 3));
    CHECK(learns(words, 3, 10, 1, want, 3));
    CHECK(learns(words, 3, 10, 2, want, 2));
    CHECK(learns(words, 3, 10, 3, want, 2)); /* a count equal to min_frequency is merged */
    CHECK(learns(words, 3, 10, 4, want, 1));
    CHECK(learns(words, 3, 10, 6, want, 0));

    /* with multiplicity: (a, b) counts 10 in "abab" x 5, then (ab, ab) 5 */
    struct loom_bpe_word abab[] = {word_of("abab", 5)};
    const int32_t abab_want[][2] = {{'a', 'b'}, {256, 256}};
    CHECK(learns(abab, 1, 10, 10, abab_want, 1));
    CHECK(learns(abab, 1, 10, 5, abab_want, 2));
    CHECK(learns(abab, 1, 10, 11, abab_want, 0));
}

/* ---- random corpora against the naive learner ------------------------------ */

/* Random words over a small alphabet (runs and ties are common), some
 * repeated, some with count 0 or less; every learner's merges must match. */
static void test_random_vs_reference(void)
{
    static const uint8_t alphabets[][4] = {{'a', 'b', 'c', 'd'}, {0, 255, 'a', 1}};
    int mismatches = 0;
    for (int trial = 0; trial < 400; trial++) {
        rng_state = 1000 + (uint64_t)trial;
        const uint8_t *alphabet = alphabets[trial % 2];
        uint32_t n_letters = 1 + rng_below(4);
        size_t n_words = 1 + rng_below(40);
        uint32_t max_len = 2 + rng_below(14);
        uint8_t *bytes = malloc(n_words * max_len);
        struct loom_bpe_word *words = malloc(n_words * sizeof *words);
        for (size_t w = 0; w < n_words; w++) {
            if (w > 0 && rng_below(8) == 0) { /* a repeat */
                words[w] = words[rng_below((uint32_t)w)];
                continue;
            }
            uint8_t *b = bytes + w * max_len;
            uint32_t len = rng_below(max_len + 1);
            for (uint32_t i = 0; i < len; i++) b[i] = alphabet[rng_below(n_letters)];
            int64_t count = 1 + rng_below(rng_below(2) ? 3 : 50);
            if (rng_below(20) == 0) count = -(int64_t)rng_below(3);
            words[w] = (struct loom_bpe_word){.bytes = b, .len = len, .count = count};
        }
        int64_t max_merges = 1 + rng_below(80);
        static const int64_t min_freqs[] = {0, 1, 2, 3, 10, 40};
        int64_t min_frequency = min_freqs[rng_below(6)];

        int32_t(*want)[2] = calloc((size_t)max_merges, sizeof *want);
        int64_t n_want = ref_learn(words, n_words, max_merges, min_frequency, want);
        if (!learns(words, n_words, max_merges, min_frequency, (const int32_t(*)[2])want, n_want)) {
            fprintf(stderr, "  trial %d: %zu words, max_merges %lld, min_frequency %lld\n", trial, n_words,
                    (long long)max_merges, (long long)min_frequency);
            mismatches++;
        }
        free(want);
        free(words);
        free(bytes);
    }
    CHECK(mismatches == 0);
}

/* Longer corpora over 26 letters with skewed letter frequencies: many
 * merges of merged tokens, compared with the naive learner. */
static void test_medium_vs_reference(void)
{
    for (int trial = 0; trial < 3; trial++) {
        rng_state = 77 + (uint64_t)trial;
        size_t n_words = 1500;
        uint32_t max_len = 12;
        uint8_t *bytes = malloc(n_words * max_len);
        struct loom_bpe_word *words = malloc(n_words * sizeof *words);
        for (size_t w = 0; w < n_words; w++) {
            uint8_t *b = bytes + w * max_len;
            uint32_t len = 1 + rng_below(max_len);
            for (uint32_t i = 0; i < len; i++) b[i] = (uint8_t)('a' + rng_below(1 + rng_below(26)));
            words[w] = (struct loom_bpe_word){.bytes = b, .len = len, .count = 1 + 1000 / (1 + (int64_t)w)};
        }
        int64_t max_merges = 400;
        int32_t(*want)[2] = calloc((size_t)max_merges, sizeof *want);
        int64_t n_want = ref_learn(words, n_words, max_merges, trial, want);
        CHECK(n_want == max_merges);
        CHECK(learns(words, n_words, max_merges, trial, (const int32_t(*)[2])want, n_want));
        free(want);
        free(words);
        free(bytes);
    }
}

/* ---- size ------------------------------------------------------------------ */

/* 50k random words for 2000 merges: it finishes, every merge joins tokens
 * that exist by then, and no pair is merged twice. */
static void test_size(void)
{
    rng_state = 12345;
    size_t n_words = 50000;
    uint32_t max_len = 14;
    uint8_t *bytes = malloc(n_words * max_len);
    struct loom_bpe_word *words = malloc(n_words * sizeof *words);
    for (size_t w = 0; w < n_words; w++) {
        uint8_t *b = bytes + w * max_len;
        uint32_t len = 1 + rng_below(max_len);
        for (uint32_t i = 0; i < len; i++) b[i] = (uint8_t)('a' + rng_below(1 + rng_below(26)));
        words[w] = (struct loom_bpe_word){.bytes = b, .len = len, .count = 1 + 100000 / (1 + (int64_t)w)};
    }
    int64_t max_merges = 2000;
    int32_t(*merges)[2] = calloc((size_t)max_merges, sizeof *merges);
    int64_t n = loom_bpe_learn(words, n_words, max_merges, 2, merges);
    CHECK(n == max_merges);
    int bad_ids = 0, repeats = 0;
    uint64_t *keys = malloc((size_t)max_merges * sizeof *keys);
    for (int64_t k = 0; k < n; k++) {
        for (int s = 0; s < 2; s++)
            if (merges[k][s] < 0 || merges[k][s] >= 256 + k) bad_ids++;
        keys[k] = (uint64_t)(uint32_t)merges[k][0] << 32 | (uint32_t)merges[k][1];
    }
    qsort(keys, (size_t)(n > 0 ? n : 0), sizeof *keys, u64_cmp);
    for (int64_t k = 1; k < n; k++) repeats += keys[k] == keys[k - 1];
    CHECK(bad_ids == 0);
    CHECK(repeats == 0);
    free(keys);
    free(merges);
    free(words);
    free(bytes);
}

int main(void)
{
    test_runs();
    test_ties_and_counts();
    test_min_frequency();
    test_random_vs_reference();
    test_medium_vs_reference();
    test_size();
    return check_summary("test_bpe_learn");
}
