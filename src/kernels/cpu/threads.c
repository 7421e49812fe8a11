/*
 * The kernels' thread count: one setting for OpenMP and for the BLAS.
 *
 * OpenBLAS's OpenMP build shares the OpenMP pool (and runs single-threaded
 * when called inside a parallel region, which attention relies on); the
 * pthread build keeps its own pool, set here to the same size.
 * Deliberately not: pinning, or choosing the count (the CLI's --threads).
 */
#include "kernels/kernels.h"

#include <cblas.h>

#ifdef _OPENMP
#include <omp.h>
#endif

#include "base/log.h"

/* Older cblas.h files do not declare it; the library always has it. */
void openblas_set_num_threads(int num_threads);

void loom_threads_set(int n)
{
    LOOM_ASSERT(n >= 1);
#ifdef _OPENMP
    omp_set_num_threads(n);
#endif
    openblas_set_num_threads(n);
}

int loom_threads_get(void)
{
#ifdef _OPENMP
    return omp_get_max_threads();
#else
    return 1;
#endif
}
