/*
 * Random numbers: a small seeded generator (SplitMix64 stream) with uniform
 * and normal draws, and a stateless hash for counter-based draws (the data
 * sampler picks windows from (seed, step, index) alone, the same on every
 * rank). Not cryptographic; not PyTorch's generator (tests that compare with
 * PyTorch share weights through files, not through the RNG).
 */
#ifndef LOOM_BASE_RNG_H
#define LOOM_BASE_RNG_H

#include <stdint.h>

struct loom_rng {
    uint64_t state;
};

void loom_rng_seed(struct loom_rng *rng, uint64_t seed);
uint64_t loom_rng_u64(struct loom_rng *rng);
/* Uniform in [0, 1), 24 random bits. */
float loom_rng_uniform(struct loom_rng *rng);
/* Uniform integer in [0, n), n > 0, without modulo bias. */
uint64_t loom_rng_below(struct loom_rng *rng, uint64_t n);
/* Standard normal (Box-Muller, double precision inside). */
double loom_rng_normal(struct loom_rng *rng);

/* Stateless mix of three words: the counter-based draw. */
uint64_t loom_hash3(uint64_t a, uint64_t b, uint64_t c);

#endif
