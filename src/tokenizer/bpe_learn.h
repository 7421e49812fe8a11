/*
 * Byte-level BPE merge learning: from the distinct words of a corpus and
 * their counts, the list of merges a BPE tokenizer applies (the algorithm of
 * Hugging Face tokenizers' BpeTrainer over byte-level words: repeatedly join
 * the most frequent adjacent pair of tokens into a new token).
 *
 * Not here: splitting text into words (pre-tokenization), mapping bytes to
 * printable characters, special tokens, an initial alphabet other than the
 * 256 bytes, and encoding text with the learned merges.
 */
#ifndef LOOM_TOKENIZER_BPE_LEARN_H
#define LOOM_TOKENIZER_BPE_LEARN_H

#include <stddef.h>
#include <stdint.h>

/* One distinct word of the corpus: its bytes and how often it occurs. */
struct loom_bpe_word {
    const uint8_t *bytes;
    uint32_t len;
    int64_t count;
};

/* Learns byte-level BPE merges from word counts. Token ids 0..255 are the
 * single bytes; merge k (0-based) joins tokens merges[k][0] and merges[k][1]
 * (in that order) into the new token 256 + k. Learns at most max_merges
 * merges, stopping early when the most frequent adjacent pair occurs fewer
 * than min_frequency times (counted with multiplicity: a pair occurring twice
 * in a word of count 5 counts 10) or no pair is left. Ties between pairs of
 * equal frequency go to the pair whose (first id, second id) is smallest.
 * Merges never cross word boundaries. Returns the number of merges written
 * into merges (capacity max_merges), or -1 when memory runs out.
 *
 * Within a word a merge replaces the pair's occurrences left to right without
 * overlap ("aaa" with (a, a) becomes [aa, a]). Words with count <= 0 are
 * ignored; a word listed twice counts as one word with the summed count.
 * max_merges above INT32_MAX - 256 is taken as INT32_MAX - 256 (the ids are
 * int32). Also -1: more than UINT32_MAX - 1 words of two or more bytes with
 * a positive count, or a pair count beyond INT64_MAX. */
int64_t loom_bpe_learn(const struct loom_bpe_word *words, size_t n_words, int64_t max_merges,
                       int64_t min_frequency, int32_t (*merges)[2]);

#endif
