/*
 * NumPy's legacy Mersenne Twister and shuffle (see mt19937.h).
 */
#include "base/mt19937.h"

#include <string.h>

enum { M = 397 };

void loom_mt19937_seed(struct loom_mt19937 *g, uint32_t seed)
{
    g->state[0] = seed;
    for (int i = 1; i < LOOM_MT19937_N; i++)
        g->state[i] = 1812433253u * (g->state[i - 1] ^ (g->state[i - 1] >> 30)) + (uint32_t)i;
    g->pos = LOOM_MT19937_N;
}

/* The next 624 words of the state (the "twist"). */
static void regenerate(struct loom_mt19937 *g)
{
    uint32_t *s = g->state;
    for (int i = 0; i < LOOM_MT19937_N; i++) {
        const uint32_t y = (s[i] & 0x80000000u) | (s[(i + 1) % LOOM_MT19937_N] & 0x7fffffffu);
        s[i] = s[(i + M) % LOOM_MT19937_N] ^ (y >> 1) ^ ((y & 1u) ? 0x9908b0dfu : 0u);
    }
    g->pos = 0;
}

uint32_t loom_mt19937_next32(struct loom_mt19937 *g)
{
    if (g->pos == LOOM_MT19937_N) regenerate(g);
    uint32_t y = g->state[g->pos++];
    y ^= y >> 11;
    y ^= (y << 7) & 0x9d2c5680u;
    y ^= (y << 15) & 0xefc60000u;
    y ^= y >> 18;
    return y;
}

uint64_t loom_mt19937_interval(struct loom_mt19937 *g, uint64_t max)
{
    if (max == 0) return 0;
    uint64_t mask = max;
    mask |= mask >> 1;
    mask |= mask >> 2;
    mask |= mask >> 4;
    mask |= mask >> 8;
    mask |= mask >> 16;
    mask |= mask >> 32;
    uint64_t v;
    if (max <= 0xffffffffu) {
        do v = loom_mt19937_next32(g) & mask;
        while (v > max);
    } else {
        do {
            const uint64_t hi = loom_mt19937_next32(g);
            v = ((hi << 32) | loom_mt19937_next32(g)) & mask;
        } while (v > max);
    }
    return v;
}

void loom_mt19937_shuffle(struct loom_mt19937 *g, void *a, int64_t n, int width)
{
    unsigned char *p = a, tmp[16];
    for (int64_t i = n - 1; i >= 1; i--) {
        const int64_t j = (int64_t)loom_mt19937_interval(g, (uint64_t)i);
        memcpy(tmp, p + i * width, (size_t)width);
        memcpy(p + i * width, p + j * width, (size_t)width);
        memcpy(p + j * width, tmp, (size_t)width);
    }
}
