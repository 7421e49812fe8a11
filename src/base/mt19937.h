/*
 * The Mersenne Twister as NumPy's legacy `numpy.random.RandomState(seed)`
 * draws it, and that generator's in-place shuffle: the two things
 * Megatron-Core's GPT dataset takes from NumPy to order documents and
 * samples. Reproducing them draw for draw is what lets loom read a
 * Megatron dataset in the order a Megatron run reads it.
 *
 *   seeding   init_genrand: state[0] = seed, state[i] = 1812433253 *
 *             (state[i-1] ^ state[i-1] >> 30) + i (a 32-bit seed).
 *   shuffle   Fisher-Yates from the end: for i = n-1 .. 1, swap element i
 *             with j drawn uniformly from [0, i] by masked rejection (the
 *             mask of i's bits; 32-bit draws while i < 2^32, else 64-bit
 *             draws made of two 32-bit ones, high word first).
 *
 * Not here: any other distribution of NumPy's, its newer Generator API,
 * loom's own generator (rng.h).
 */
#ifndef LOOM_BASE_MT19937_H
#define LOOM_BASE_MT19937_H

#include <stdint.h>

#define LOOM_MT19937_N 624

struct loom_mt19937 {
    uint32_t state[LOOM_MT19937_N];
    int pos;
};

void loom_mt19937_seed(struct loom_mt19937 *g, uint32_t seed);
uint32_t loom_mt19937_next32(struct loom_mt19937 *g);
/* Uniform in [0, max] as NumPy's legacy random_interval draws it. */
uint64_t loom_mt19937_interval(struct loom_mt19937 *g, uint64_t max);

/* RandomState.shuffle of a 1-D array of n elements of `width` bytes (the
 * draws depend on n alone, not on the element type). */
void loom_mt19937_shuffle(struct loom_mt19937 *g, void *a, int64_t n, int width);

#endif
