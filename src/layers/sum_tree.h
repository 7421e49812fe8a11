/*
 * A binary counter of partial sums: the order --layout-invariant adds a
 * step's micro-batch gradients in, whatever the layout.
 *
 * Leaves a = 0, 1, ... arrive in order, each a sum s of n floats: s joins
 * the partial sum at level k while bit k of a is set (a carry), and is
 * then kept at the first level whose bit is clear; so 2^p leaves make the
 * perfect pairwise tree over them, and the leaves of one rank (consecutive
 * in the step) a subtree of one process's. At the last leaf the levels
 * still held are added too, lowest first, and s is the total.
 *
 * The parallel strategy of the flag (parallel/invariant.c) keeps a counter
 * a block; a mixture of experts under expert parallelism one a source rank
 * (model/decoder_moe.c).
 */
#ifndef LOOM_LAYERS_SUM_TREE_H
#define LOOM_LAYERS_SUM_TREE_H

#include <stddef.h>

struct loom_backend;

/* The levels a counter of A leaves needs: the bits of A - 1. */
int loom_sum_tree_levels(int leaves);

/* Leaf a (s, n floats on the backend's memory, added into) of a counter
 * of levels levels (loom_sum_tree_levels of its leaves) whose level k is
 * level[k * stride] (NULL until used: allocated then, on the backend,
 * tagged as gradients). last: s becomes the total. */
void loom_sum_tree_add(const struct loom_backend *be, float **level, size_t stride, int levels, float *s,
                       size_t n, unsigned a, int last);

#endif
