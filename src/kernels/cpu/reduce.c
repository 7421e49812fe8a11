/*
 * Sum of squares in double precision (the gradient norm for clipping), and
 * the check for an inf or a NaN (the loss scaler's overflow, the engine's
 * --on-nonfinite).
 *
 * The input is cut into a fixed number of chunks, each summed on its own
 * and the chunk sums added in order, so the result is the same bits for any
 * thread count. Deliberately not: a norm across ranks (the optimizer
 * all-reduces these partial sums).
 */
#include "kernels/kernels.h"

#include <math.h>
#include <string.h>

#define CHUNKS 64
#define CHUNK_MIN 16384 /* elements per chunk below which fewer chunks are used */
#define PAR_MIN 65536   /* below this many elements a parallel check costs more than it saves */

double loom_sum_squares(const float *x, size_t n)
{
    size_t nchunks = n / CHUNK_MIN;
    if (nchunks < 1) nchunks = 1;
    if (nchunks > CHUNKS) nchunks = CHUNKS;
    double part[CHUNKS];
#pragma omp parallel for schedule(static) if (nchunks > 1)
    for (size_t c = 0; c < nchunks; c++) {
        size_t lo = n * c / nchunks, hi = n * (c + 1) / nchunks;
        double s = 0.0;
#pragma omp simd reduction(+ : s)
        for (size_t i = lo; i < hi; i++) s += (double)x[i] * x[i];
        part[c] = s;
    }
    double total = 0.0;
    for (size_t c = 0; c < nchunks; c++) total += part[c];
    return total;
}

int loom_has_nonfinite(const float *x, size_t n)
{
    unsigned found = 0;
#pragma omp parallel for simd schedule(static) reduction(| : found) if (n >= PAR_MIN)
    for (size_t i = 0; i < n; i++) {
        uint32_t u;
        memcpy(&u, &x[i], sizeof u);
        found |= (u & 0x7f800000u) == 0x7f800000u; /* exponent all ones: inf or NaN */
    }
    return found != 0;
}

int loom_has_nonfinite_ref(const float *x, size_t n)
{
    for (size_t i = 0; i < n; i++)
        if (isinf(x[i]) || isnan(x[i])) return 1;
    return 0;
}
