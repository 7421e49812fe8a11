/*
 * `loom launch`: the convenience launcher, like torchrun or the deepspeed
 * launcher. It builds an mpirun command line and execs it:
 *
 *   loom launch --nproc-per-node N [--hostfile FILE] -- train ARGS...
 *
 * It allows running as root, oversubscribes when there are more ranks than
 * cores, binds each single-threaded rank to a core (no binding otherwise),
 * and gives each rank cores/ranks threads unless ARGS set --threads. With a
 * hostfile, N ranks go on each host listed. Not here: Slurm (srun works as
 * mpirun does), elastic restarts.
 */
#include "cli/launch.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "base/log.h"
#include "base/mem.h"
#include "loom/loom.h"

static int count_hosts(const char *path, int *hosts)
{
    FILE *f = fopen(path, "r");
    if (!f) return loom_error_set(LOOM_ERR_INPUT, "--hostfile: cannot open %s", path);
    char line[1024];
    *hosts = 0;
    while (fgets(line, sizeof line, f)) {
        char *p = line;
        while (*p == ' ' || *p == '\t') p++;
        if (*p && *p != '#' && *p != '\n') (*hosts)++;
    }
    fclose(f);
    if (*hosts == 0) return loom_error_set(LOOM_ERR_INPUT, "--hostfile: %s lists no host", path);
    return LOOM_OK;
}

int loom_launch(int argc, char **argv)
{
    int nproc = 0, i;
    const char *hostfile = NULL;
    for (i = 0; i < argc && strcmp(argv[i], "--") != 0; i++) {
        if (strcmp(argv[i], "--help") == 0) {
            printf("usage: loom launch --nproc-per-node N [--hostfile FILE] -- train ARGS...\n");
            return LOOM_OK;
        }
        if (i + 1 >= argc) return loom_error_set(LOOM_ERR_INPUT, "%s needs a value", argv[i]);
        if (strcmp(argv[i], "--nproc-per-node") == 0 || strcmp(argv[i], "--nproc_per_node") == 0) {
            char *end;
            long n = strtol(argv[++i], &end, 10);
            if (*end || n < 1 || n > 4096)
                return loom_error_set(
                    LOOM_ERR_INPUT, "--nproc-per-node: expected an integer in [1, 4096], got '%s'", argv[i]);
            nproc = (int)n;
        } else if (strcmp(argv[i], "--hostfile") == 0) {
            hostfile = argv[++i];
        } else {
            return loom_error_set(LOOM_ERR_INPUT, "unknown launch flag %s (--nproc-per-node, --hostfile)",
                                  argv[i]);
        }
    }
    if (nproc == 0) return loom_error_set(LOOM_ERR_INPUT, "loom launch needs --nproc-per-node N");
    if (i >= argc - 1)
        return loom_error_set(LOOM_ERR_INPUT, "loom launch needs '-- train ARGS...' after its own flags");
    char **cmd = argv + i + 1;
    int ncmd = argc - i - 1;
    if (strcmp(cmd[0], "train") != 0)
        return loom_error_set(LOOM_ERR_INPUT, "loom launch runs 'train', got '%s'", cmd[0]);
    int hosts = 1, rc;
    if (hostfile && (rc = count_hosts(hostfile, &hosts))) return rc;
    long cores = sysconf(_SC_NPROCESSORS_ONLN);
    if (cores < 1) cores = 1;
    int threads_given = 0;
    for (int k = 0; k < ncmd; k++) threads_given |= strncmp(cmd[k], "--threads", 9) == 0;
    int threads = (int)(cores / nproc) > 0 ? (int)(cores / nproc) : 1;

    char exe[4096];
    ssize_t len = readlink("/proc/self/exe", exe, sizeof exe - 1);
    if (len <= 0) return loom_error_set(LOOM_ERR_RUNTIME, "cannot find the loom executable (/proc/self/exe)");
    exe[len] = 0;

    char np[32], npn[32], thr[32], omp[48];
    snprintf(np, sizeof np, "%d", nproc * hosts);
    snprintf(npn, sizeof npn, "%d", nproc);
    snprintf(thr, sizeof thr, "%d", threads);
    snprintf(omp, sizeof omp, "OMP_NUM_THREADS=%d", threads_given ? 1 : threads);
    const char **args = loom_alloc(loom_mul_size((size_t)ncmd + 32, sizeof *args), LOOM_MEM_OTHER);
    int n = 0;
    args[n++] = "mpirun";
    if (geteuid() == 0) args[n++] = "--allow-run-as-root";
    args[n++] = "-np";
    args[n++] = np;
    if (hostfile) {
        args[n++] = "--hostfile";
        args[n++] = hostfile;
        args[n++] = "--npernode";
        args[n++] = npn;
    }
    if (!hostfile && nproc > cores) args[n++] = "--oversubscribe";
    args[n++] = "--bind-to";
    args[n++] = !threads_given && threads == 1 && nproc <= cores ? "core" : "none";
    args[n++] = "-x";
    args[n++] = omp;
    args[n++] = exe;
    for (int k = 0; k < ncmd; k++) args[n++] = cmd[k];
    if (!threads_given) {
        args[n++] = "--threads";
        args[n++] = thr;
    }
    args[n] = NULL;
    fprintf(stderr, "loom launch:");
    for (int k = 0; k < n; k++) fprintf(stderr, " %s", args[k]);
    fputc('\n', stderr);
    execvp("mpirun", (char *const *)args);
    loom_free(args);
    return loom_error_set(LOOM_ERR_INPUT, "cannot run mpirun (is openmpi-bin installed?)");
}
