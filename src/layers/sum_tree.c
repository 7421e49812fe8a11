/* A binary counter of partial sums (sum_tree.h). */
#include "layers/sum_tree.h"

#include "base/log.h"
#include "base/mem.h"
#include "kernels/backend.h"

int loom_sum_tree_levels(int leaves)
{
    int levels = 0;
    for (unsigned a = leaves > 0 ? (unsigned)leaves - 1 : 0; a; a >>= 1) levels++;
    return levels;
}

void loom_sum_tree_add(const struct loom_backend *be, float **level, size_t stride, int levels, float *s,
                       size_t n, unsigned a, int last)
{
    LOOM_ASSERT(levels < 31 && (a >> levels) == 0); /* a leaf of the counter's count, at most 2^levels */
    unsigned t = a;
    size_t k = 0;
    for (; t & 1; t >>= 1, k++)
        be->k->accumulate(s, level[k * stride], n); /* the carries: k held a sibling */
    if (!last) {                                    /* level k is free (bit k of a is 0) */
        float **l = &level[k * stride];
        if (!*l) *l = be->alloc(n * sizeof(float), LOOM_MEM_GRADS);
        be->copy(*l, s, n * sizeof(float));
        return;
    }
    for (t >>= 1, k++; t; t >>= 1, k++) /* a count not a power of two: the levels still held, lowest first */
        if (t & 1) be->k->accumulate(s, level[k * stride], n);
}
