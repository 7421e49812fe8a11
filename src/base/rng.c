/*
 * SplitMix64 (Steele, Lea, Flood 2014): one 64-bit word of state, good
 * statistical quality for initialisation, sampling and data order.
 */
#include "base/rng.h"

#include <math.h>

static uint64_t mix64(uint64_t z)
{
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

void loom_rng_seed(struct loom_rng *rng, uint64_t seed)
{
    rng->state = mix64(seed ^ 0x6c6f6f6dull);
}

uint64_t loom_rng_u64(struct loom_rng *rng)
{
    rng->state += 0x9e3779b97f4a7c15ull;
    return mix64(rng->state);
}

float loom_rng_uniform(struct loom_rng *rng)
{
    return (float)(loom_rng_u64(rng) >> 40) * 0x1.0p-24f;
}

uint64_t loom_rng_below(struct loom_rng *rng, uint64_t n)
{
    uint64_t limit = UINT64_MAX - UINT64_MAX % n;
    uint64_t x;
    do x = loom_rng_u64(rng);
    while (x >= limit);
    return x % n;
}

double loom_rng_normal(struct loom_rng *rng)
{
    double u1 = ((double)(loom_rng_u64(rng) >> 11) + 1.0) * 0x1.0p-53; /* (0, 1] */
    double u2 = (double)(loom_rng_u64(rng) >> 11) * 0x1.0p-53;
    return sqrt(-2.0 * log(u1)) * cos(6.283185307179586 * u2);
}

uint64_t loom_hash3(uint64_t a, uint64_t b, uint64_t c)
{
    return mix64(mix64(mix64(a + 0x9e3779b97f4a7c15ull) ^ b) ^ c);
}
