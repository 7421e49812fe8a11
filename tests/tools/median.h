/*
 * The bench tools' median of n timings (sorts x in place).
 */
#ifndef LOOM_TESTS_TOOLS_MEDIAN_H
#define LOOM_TESTS_TOOLS_MEDIAN_H

#include <stdlib.h>

static int median_cmp(const void *a, const void *b)
{
    const double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

static inline double median(double *x, int n)
{
    qsort(x, (size_t)n, sizeof *x, median_cmp);
    return n % 2 ? x[n / 2] : 0.5 * (x[n / 2 - 1] + x[n / 2]);
}

#endif
