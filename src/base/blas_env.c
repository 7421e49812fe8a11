/* OpenBLAS core-type selection (see blas_env.h). */
#include "base/blas_env.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

char *openblas_get_corename(void);

const char *loom_blas_core_name(void)
{
    return openblas_get_corename();
}

static int is_generic(const char *core)
{
    static const char *const generic[] = {"Prescott",  "Core2",  "Penryn", "Dunnington",
                                          "Nehalem",   "Atom",   "Katmai", "Coppermine",
                                          "Northwood", "Banias", NULL};
    for (int i = 0; generic[i]; i++)
        if (strcmp(core, generic[i]) == 0) return 1;
    return 0;
}

void loom_blas_select_core(int argc, char **argv)
{
    (void)argc;
    if (getenv("OPENBLAS_CORETYPE") || getenv("LOOM_BLAS_REEXEC")) return;
    const char *core = openblas_get_corename();
    if (!core || !is_generic(core)) return;
    const char *want = NULL;
    __builtin_cpu_init();
    if (__builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
        __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512dq"))
        want = "SkylakeX";
    else if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma"))
        want = "Haswell";
    if (!want) return;
    setenv("OPENBLAS_CORETYPE", want, 1);
    setenv("LOOM_BLAS_REEXEC", "1", 1); /* never loop */
    execv("/proc/self/exe", argv);
    /* exec failed: carry on with the generic kernels */
}
