/* The transient buffer pool (see pool.h). */
#include "base/pool.h"

#include <string.h>

enum { POOL = 32 };

struct pooled {
    float *buf;
    size_t n;
};
static struct pooled pool[POOL];

float *loom_pool_take(size_t n, int zeroed, enum loom_mem_tag tag)
{
    for (int i = 0; i < POOL; i++)
        if (pool[i].buf && pool[i].n == n) {
            float *b = pool[i].buf;
            pool[i].buf = NULL;
            if (zeroed) memset(b, 0, n * sizeof(float));
            return b;
        }
    return loom_alloc(loom_mul_size(n, sizeof(float)), tag);
}

void loom_pool_give(float *b, size_t n)
{
    for (int i = 0; i < POOL; i++)
        if (!pool[i].buf) {
            pool[i] = (struct pooled){b, n};
            return;
        }
    loom_free(b);
}

void loom_pool_drain(void)
{
    for (int i = 0; i < POOL; i++) {
        loom_free(pool[i].buf);
        pool[i].buf = NULL;
    }
}
