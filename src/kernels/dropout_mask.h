/*
 * Dropout's masks from a counter: whether element (row, col) of a site is
 * kept is a hash of (the site's key, row, col), so any rank, layout,
 * thread or recomputation draws the same mask for the same element with no
 * state to carry, as Philox-style generators let FlashAttention and
 * PyTorch do. A site's key mixes the run's seed, the step, the layer and
 * the site (loom_dropout_key); a row is a global index the caller gives
 * (a token's: sequence of the step x T + position; an attention row's:
 * (sequence x heads + head) x T + query position), a column a feature or
 * a key position.
 *
 *   rowkey = mix64(key ^ mix64(row))
 *   u      = mix32(lo32(rowkey) + col * 0x9E3779B9) ^ hi32(rowkey)
 *   kept   = u >= threshold (round(p 2^32)), then scaled by 1 / (1 - p)
 *
 * mix64 is SplitMix64's finalizer, mix32 MurmurHash3's; tests/pyref/
 * dropout.py computes the same masks in numpy.
 */
#ifndef LOOM_KERNELS_DROPOUT_MASK_H
#define LOOM_KERNELS_DROPOUT_MASK_H

#include <stdint.h>

#include "kernels/kernels.h"

static inline uint64_t loom_dropout_mix64(uint64_t z)
{
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}

static inline uint32_t loom_dropout_mix32(uint32_t h)
{
    h ^= h >> 16;
    h *= 0x85EBCA6Bu;
    h ^= h >> 13;
    h *= 0xC2B2AE35u;
    return h ^ (h >> 16);
}

static inline uint64_t loom_dropout_row_key(const struct loom_dropout *d, uint64_t row)
{
    return loom_dropout_mix64(d->key ^ loom_dropout_mix64(row));
}

/* The sites a decoder layer drops at (the embedding's is layer -1's). */
enum loom_dropout_site {
    LOOM_DROPOUT_EMBEDDING = 0, /* the embedding's output */
    LOOM_DROPOUT_ATTENTION = 1, /* attention's probabilities */
    LOOM_DROPOUT_ATTN_OUT = 2,  /* attention's output projection, before the residual */
    LOOM_DROPOUT_MLP_OUT = 3,   /* the MLP's output, before the residual */
};

/* Dropout p (0 <= p < 1) at a site of a layer in a step of a run seeded seed. */
static inline struct loom_dropout loom_dropout_of(double p, uint64_t seed, int64_t step, int layer,
                                                  enum loom_dropout_site site)
{
    const uint64_t where = ((uint64_t)(layer + 1) << 2) | (uint64_t)site;
    const double t = p * 4294967296.0 + 0.5;
    return (struct loom_dropout){
        .key = loom_dropout_mix64(seed ^ loom_dropout_mix64((uint64_t)step ^ loom_dropout_mix64(where))),
        .threshold = t >= 4294967295.0 ? 4294967295u : (uint32_t)t,
        .scale = (float)(1.0 / (1.0 - p))};
}

/* m[c] (n) = the mask's value (0 or d->scale) at columns col0 + c of the row rowkey */
static inline void loom_dropout_mask_row(float *m, const struct loom_dropout *d, uint64_t rowkey,
                                         int64_t col0, int n)
{
    const uint32_t lo = (uint32_t)rowkey, hi = (uint32_t)(rowkey >> 32), thr = d->threshold;
    const float s = d->scale;
#pragma omp simd
    for (int c = 0; c < n; c++) {
        const uint32_t u = loom_dropout_mix32(lo + (uint32_t)(col0 + c) * 0x9E3779B9u) ^ hi;
        m[c] = u >= thr ? s : 0.0f;
    }
}

#endif
