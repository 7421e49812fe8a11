/*
 * Choosing OpenBLAS's kernels. Some OpenBLAS builds (Debian bookworm's
 * 0.3.21 among them) do not recognise recent x86 processors and fall back to
 * their slowest generic kernels (Prescott), a 5x loss for sgemm. The core
 * type can only be chosen before the library initialises, through
 * OPENBLAS_CORETYPE: when the user has not set it and OpenBLAS fell back to a
 * core older than the processor supports, this re-executes the program once
 * with the matching core type. The user's own OPENBLAS_CORETYPE always wins.
 */
#ifndef LOOM_BASE_BLAS_ENV_H
#define LOOM_BASE_BLAS_ENV_H

void loom_blas_select_core(int argc, char **argv);
/* OpenBLAS's name of the kernels in use, e.g. "SkylakeX". */
const char *loom_blas_core_name(void);

#endif
