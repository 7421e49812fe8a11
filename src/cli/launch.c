/*
 * `loom launch`: the convenience launcher, like torchrun or the deepspeed
 * launcher. It builds an mpirun command line and execs it:
 *
 *   loom launch --nproc-per-node N [--hostfile FILE] -- train ARGS...
 *
 * It allows running as root, oversubscribes when there are more ranks than
 * cores, binds each single-threaded rank to a core (no binding otherwise),
 * and gives each rank cores/ranks threads unless ARGS set --threads. With a
 * hostfile, N ranks go on each host listed.
 *
 * With --max-restarts K it runs mpirun as a child instead, and when the job
 * fails (a rank killed, a host gone, a hang aborted: any status but 0 and
 * 2, bad input, which would fail again) it
 * runs it again from the newest intact checkpoint of the train arguments'
 * --save directory (adding --load DIR), at most K times, saying why each
 * time; the job sees LOOM_RESTART_COUNT. Not here: Slurm (srun works as
 * mpirun does), changing the world size between restarts.
 */
#include "cli/launch.h"

#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "base/log.h"
#include "base/mem.h"
#include "io/checkpoint.h"
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

/* Runs args (mpirun ...) as a child, its stderr passed through and its
 * last `loom: error:` line kept in why; returns its exit status (128 + the
 * signal that ended it). */
static int run_job(const char **args, char *why, size_t nwhy)
{
    int fds[2];
    why[0] = 0;
    if (pipe(fds) != 0) return loom_error_set(LOOM_ERR_RUNTIME, "loom launch: cannot make a pipe");
    pid_t pid = fork();
    if (pid < 0) return loom_error_set(LOOM_ERR_RUNTIME, "loom launch: cannot fork");
    if (pid == 0) {
        dup2(fds[1], STDERR_FILENO);
        close(fds[0]);
        close(fds[1]);
        execvp("mpirun", (char *const *)args);
        fprintf(stderr, "loom: error: cannot run mpirun (is openmpi-bin installed?)\n");
        _exit(LOOM_ERR_INPUT);
    }
    close(fds[1]);
    FILE *err = fdopen(fds[0], "r");
    char line[4096];
    while (err && fgets(line, sizeof line, err)) {
        fputs(line, stderr);
        fflush(stderr);
        line[strcspn(line, "\n")] = 0;
        if (strncmp(line, "loom: error:", 12) == 0)
            snprintf(why, nwhy, "%.400s", line + 13);
        else if (!*why && strncmp(line, "mpirun noticed that ", 20) == 0) /* a rank killed */
            snprintf(why, nwhy, "%.400s", line + 20);
    }
    if (err) fclose(err);
    int status;
    while (waitpid(pid, &status, 0) < 0) {
    }
    return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
}

/* The value of flag in the train arguments, or NULL. */
static const char *train_flag(char **cmd, int ncmd, const char *flag)
{
    const char *v = NULL;
    for (int k = 0; k + 1 < ncmd; k++)
        if (strcmp(cmd[k], flag) == 0) v = cmd[k + 1];
    return v;
}

/* mpirun again and again from the newest checkpoint, at most max_restarts times. */
static int run_with_restarts(const char **args, int n, char **cmd, int ncmd, int max_restarts)
{
    const char *save = train_flag(cmd, ncmd, "--save");
    const int loads = train_flag(cmd, ncmd, "--load") != NULL;
    char why[512], count[16];
    for (int restart = 0;; restart++) {
        snprintf(count, sizeof count, "%d", restart);
        setenv("LOOM_RESTART_COUNT", count, 1); /* exported to every rank (-x) */
        int st = run_job(args, why, sizeof why);
        if (st == 0) return LOOM_OK;
        if (st == LOOM_ERR_INPUT) /* bad input fails the same way again */
            return loom_error_set(LOOM_ERR_INPUT, "the job refused its input (%s): not restarted", why);
        char ended[600];
        snprintf(ended, sizeof ended, "the job exited with status %d%s%s", st, *why ? ": " : "", why);
        if (restart == max_restarts) {
            fprintf(stderr, "loom launch: %s; --max-restarts %d used up\n", ended, max_restarts);
            return loom_error_set(LOOM_ERR_RUNTIME, "the job failed %d times (%s)", restart + 1, ended);
        }
        const int from_ckpt = loom_ckpt_is_checkpoint(save);
        fprintf(stderr, "loom launch: restart %d of %d: %s; %s\n", restart + 1, max_restarts, ended,
                from_ckpt ? "resuming from the newest intact checkpoint of --save"
                          : "no checkpoint yet: from the start");
        if (from_ckpt && !loads) { /* --load SAVE, once, before the mpirun line's end */
            args[n++] = "--load";
            args[n++] = save;
            args[n] = NULL;
        }
    }
}

int loom_launch(int argc, char **argv)
{
    int nproc = 0, i, max_restarts = 0;
    const char *hostfile = NULL;
    for (i = 0; i < argc && strcmp(argv[i], "--") != 0; i++) {
        if (strcmp(argv[i], "--help") == 0) {
            printf("usage: loom launch --nproc-per-node N [--hostfile FILE] [--max-restarts K] -- train "
                   "ARGS...\n");
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
        } else if (strcmp(argv[i], "--max-restarts") == 0) {
            char *end;
            long n = strtol(argv[++i], &end, 10);
            if (*end || n < 0 || n > 1000)
                return loom_error_set(LOOM_ERR_INPUT,
                                      "--max-restarts: expected an integer in [0, 1000], got '%s'", argv[i]);
            max_restarts = (int)n;
        } else {
            return loom_error_set(LOOM_ERR_INPUT,
                                  "unknown launch flag %s (--nproc-per-node, --hostfile, --max-restarts)",
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
    if (max_restarts > 0 && !train_flag(cmd, ncmd, "--save"))
        return loom_error_set(
            LOOM_ERR_INPUT, "--max-restarts needs --save DIR in the train arguments: a restart resumes from "
                            "its newest checkpoint");
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
    const char **args = loom_alloc(loom_mul_size((size_t)ncmd + 34, sizeof *args), LOOM_MEM_OTHER);
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
    if (max_restarts > 0) {
        args[n++] = "-x";
        args[n++] = "LOOM_RESTART_COUNT";
    }
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
    if (max_restarts > 0) {
        rc = run_with_restarts(args, n, cmd, ncmd, max_restarts);
        loom_free(args);
        return rc;
    }
    execvp("mpirun", (char *const *)args);
    loom_free(args);
    return loom_error_set(LOOM_ERR_INPUT, "cannot run mpirun (is openmpi-bin installed?)");
}
