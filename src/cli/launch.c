/*
 * `loom launch`: the convenience launcher, like torchrun or the deepspeed
 * launcher. It builds an mpirun command line and runs it as its child:
 *
 *   loom launch --nproc-per-node N [--hostfile FILE] [--] train ARGS...
 *   loom launch --nproc_per_node=N ./program ARGS...
 *
 * torchrun's and DeepSpeed's spellings name the same (launch_usage); a
 * program that is not loom's train or eval runs as it is (a user's
 * engine-API binary).
 *
 * It allows running as root, oversubscribes when there are more ranks than
 * cores, binds each single-threaded rank to a core (no binding otherwise),
 * and gives each rank cores/ranks threads unless ARGS set --threads. With a
 * hostfile, N ranks go on each host listed.
 *
 * The train arguments' --save (as the ranks read it: --save DIR,
 * --save=DIR, a DeepSpeed JSON's "save") is where a run resumes from: when
 * it holds a checkpoint, the job gets --load DIR after ARGS (over any
 * --load in them), so the same command resumes a stopped job.
 *
 * Signals: the first SIGTERM or SIGINT stops the job gracefully. mpirun
 * answers a SIGTERM of its own by killing the ranks (and exits 1 even when
 * they saved), so the launcher sends it SIGURG instead, which mpirun is
 * told to forward to every rank (ignored by default, it cannot kill a rank
 * that is still starting; it is sent again every second until the job ends);
 * the ranks stop at the next step boundary, save and exit 0 (app/stop.h),
 * and so does mpirun, and so the launcher. A second signal
 * ends the job at once (SIGTERM to mpirun). A job stopped on a signal is
 * never restarted.
 *
 * With --max-restarts K, when the job fails (a rank killed, a host gone, a
 * hang aborted: any status but 0 and 2, bad input, which would fail again)
 * it runs it again from the newest intact checkpoint of --save, at most K
 * times, saying why each time; the job sees LOOM_RESTART_COUNT. Not here:
 * Slurm (srun --mpi=pmix starts the ranks as mpirun does; tests/test_slurm.py),
 * changing the world size between
 * restarts.
 */
#include "cli/launch.h"

#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include "base/log.h"
#include "base/mem.h"
#include "config/config.h"
#include "io/checkpoint.h"
#include "io/fs.h"
#include "loom/loom.h"

static int count_hosts(const char *path, int *hosts)
{
    int rc;
    FILE *f = loom_fs_fopen_input(path, "--hostfile", &rc); /* a FIFO: refused, not waited on */
    if (!f) return rc;
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

/* The job under the launcher: mpirun's pid while it runs (0 otherwise), and
 * the first stop signal the launcher was sent, with how many came. */
static volatile pid_t job;
static volatile sig_atomic_t stop_sig, stop_count;

static void say(const char *s)
{
    ssize_t r = write(STDERR_FILENO, s, strlen(s));
    (void)r;
}

/* SIGTERM, SIGINT: the first asks the job to stop (SIGURG, which mpirun
 * forwards to every rank; they save and exit 0); a second ends it (SIGTERM
 * to mpirun, which kills the ranks). */
static void on_stop(int sig)
{
    if (!stop_sig) stop_sig = sig;
    if (++stop_count == 1) {
        say(sig == SIGINT ? "loom launch: SIGINT: stopping the job at the next step boundary (a second "
                            "signal ends it at once)\n"
                          : "loom launch: SIGTERM: stopping the job at the next step boundary (a second "
                            "signal ends it at once)\n");
        if (job > 0) kill(job, SIGURG);
        alarm(1);
    } else if (job > 0) {
        say("loom launch: a second signal: ending the job now\n");
        kill(job, SIGTERM);
    }
}

/* Every second after the first stop signal: SIGURG again, for ranks that were
 * not running yet when it came (a rank takes it any number of times). */
static void on_alarm(int sig)
{
    (void)sig;
    if (job > 0 && stop_count == 1) kill(job, SIGURG);
    alarm(1);
}

static void catch_stops(void)
{
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sigemptyset(&sa.sa_mask);
    sa.sa_flags = SA_RESTART; /* the reads of the job's stderr go on */
    sa.sa_handler = on_stop;
    sigaction(SIGTERM, &sa, NULL);
    sigaction(SIGINT, &sa, NULL);
    sa.sa_handler = on_alarm;
    sigaction(SIGALRM, &sa, NULL);
}

/* Runs args (mpirun ...) as a child, its stderr passed through and its
 * last `loom: error:` line kept in why; returns its exit status (128 + the
 * signal that ended it). mpirun runs in a process group of its own, so that
 * a terminal's Ctrl-C reaches the launcher alone (mpirun answers SIGINT by
 * killing the ranks), reading no terminal; and it is asked to stop as on a
 * signal when the launcher dies. */
static int run_job(const char **args, char *why, size_t nwhy)
{
    int fds[2];
    why[0] = 0;
    if (pipe(fds) != 0) return loom_error_set(LOOM_ERR_RUNTIME, "loom launch: cannot make a pipe");
    const pid_t launcher = getpid();
    pid_t pid = fork();
    if (pid < 0) return loom_error_set(LOOM_ERR_RUNTIME, "loom launch: cannot fork");
    if (pid == 0) {
        setpgid(0, 0);
        prctl(PR_SET_PDEATHSIG, SIGURG);
        if (getppid() != launcher) _exit(LOOM_ERR_RUNTIME); /* gone already */
        int null = open("/dev/null", O_RDONLY);
        if (null >= 0) dup2(null, STDIN_FILENO);
        dup2(fds[1], STDERR_FILENO);
        close(fds[0]);
        close(fds[1]);
        execvp("mpirun", (char *const *)args);
        fprintf(stderr, "loom: error: cannot run mpirun (is openmpi-bin installed?)\n");
        _exit(LOOM_ERR_INPUT);
    }
    job = pid;
    if (stop_sig) kill(pid, SIGURG); /* a signal in between */
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
    while (waitpid(pid, &status, 0) < 0 && errno == EINTR) {
    }
    job = 0;
    return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
}

/* The job ended after the launcher was sent a stop signal: never restarted;
 * exit 0 when every rank stopped cleanly (mpirun's status is theirs, as
 * SIGURG is forwarded, not an abort). */
static int stopped(int st, const char *why, const char *save)
{
    alarm(0);
    const char *name = stop_sig == SIGINT ? "SIGINT" : "SIGTERM";
    if (st == 0) {
        fprintf(stderr, "loom launch: the job stopped on %s%s%s\n", name,
                *save ? "; resume it from --save " : "", save);
        return LOOM_OK;
    }
    return loom_error_set(LOOM_ERR_RUNTIME,
                          "the job did not stop cleanly on %s (exit status %d%s%s): not restarted", name, st,
                          *why ? ": " : "", why);
}

/* mpirun, again and again from the newest checkpoint of save (when there
 * is one, on the first run too: the same command resumes a stopped job), at
 * most max_restarts more times. */
static int supervise(const char **args, int n, const char *save, const char *load, int max_restarts)
{
    char why[512], count[16];
    int resumed = 0; /* --load SAVE appended */
    for (int restart = 0;; restart++) {
        if (*save && !resumed && loom_ckpt_is_checkpoint(save)) { /* after the train arguments: it wins */
            args[n++] = "--load";
            args[n++] = save;
            args[n] = NULL;
            resumed = 1;
            if (restart == 0)
                fprintf(stderr, "loom launch: resuming from the newest intact checkpoint of --save %s%s%s\n",
                        save, *load && strcmp(load, save) != 0 ? ", not --load " : "",
                        *load && strcmp(load, save) != 0 ? load : "");
        }
        if (stop_sig) { /* between runs, or before the first: nothing to stop, nothing started */
            alarm(0);
            fprintf(stderr, "loom launch: %s before the job started: not started\n",
                    stop_sig == SIGINT ? "SIGINT" : "SIGTERM");
            return LOOM_OK;
        }
        snprintf(count, sizeof count, "%d", restart);
        setenv("LOOM_RESTART_COUNT", count, 1); /* exported to every rank (-x) */
        int st = run_job(args, why, sizeof why);
        if (stop_sig) return stopped(st, why, save);
        if (st == 0) return LOOM_OK;
        if (max_restarts == 0) return st; /* the ranks said why */
        if (st == LOOM_ERR_INPUT)         /* bad input fails the same way again */
            return loom_error_set(LOOM_ERR_INPUT, "the job refused its input (%s): not restarted", why);
        char ended[600];
        snprintf(ended, sizeof ended, "the job exited with status %d%s%s", st, *why ? ": " : "", why);
        if (restart == max_restarts) {
            fprintf(stderr, "loom launch: %s; --max-restarts %d used up\n", ended, max_restarts);
            return loom_error_set(LOOM_ERR_RUNTIME, "the job failed %d times (%s)", restart + 1, ended);
        }
        fprintf(stderr, "loom launch: restart %d of %d: %s; %s\n", restart + 1, max_restarts, ended,
                loom_ckpt_is_checkpoint(save) ? "resuming from the newest intact checkpoint of --save"
                                              : "no checkpoint yet: from the start");
    }
}

static const char launch_usage[] =
    "usage: loom launch --nproc-per-node N [--hostfile FILE] [--max-restarts K] [--] PROGRAM ARGS...\n"
    "Runs PROGRAM on N ranks a host through mpirun: `train ARGS` (or eval) is loom's own command, anything\n"
    "else a program of yours (one built on the engine API, say) started as it is. torchrun's and\n"
    "DeepSpeed's spellings are taken: --nproc_per_node=N, --num_gpus N, --nnodes M and --num_nodes M\n"
    "(with a hostfile of M hosts), --node_rank 0, --master_addr/--master_port (mpirun needs neither),\n"
    "--standalone, --max_restarts K; `--x=v` and `--x v` alike.\n"
    "\n"
    "  --nproc-per-node N    ranks a host (torchrun's --nproc_per_node, DeepSpeed's --num_gpus)\n"
    "  --hostfile FILE       the hosts: one a line, `host` or `host slots=K` (DeepSpeed's and Open MPI's\n"
    "                        form), # comments; N ranks go on each host (mpirun --npernode). Under Slurm,\n"
    "                        use srun -n M (loom starts as an MPI job under PMIx) instead of loom launch.\n"
    "  --max-restarts K      run the job again from the newest intact checkpoint of train's --save when\n"
    "                        it fails (not on bad input, exit 2), at most K times\n"
    "Each rank gets cores/N threads unless ARGS set --threads; a first SIGTERM or SIGINT stops the job\n"
    "at a step boundary with a checkpoint, a second at once.\n";

/* A flag of the launcher in any of its spellings (--a-b, --a_b, =value or
 * the next argument): the value, or NULL when argv[*i] is not this flag.
 * *i moves past what was read. */
static const char *flag_value(char **argv, int argc, int *i, const char *name, int *rc)
{
    const char *a = argv[*i];
    if (strncmp(a, "--", 2) != 0) return NULL;
    size_t k = 0;
    for (; name[k] && a[k + 2]; k++) {
        const char x = a[k + 2] == '_' ? '-' : a[k + 2];
        if (x != name[k]) return NULL;
    }
    if (name[k]) return NULL;
    if (a[k + 2] == '=') return a + k + 3;
    if (a[k + 2]) return NULL;
    if (*i + 1 >= argc) {
        *rc = loom_error_set(LOOM_ERR_INPUT, "%s needs a value", a);
        return NULL;
    }
    return argv[++*i];
}

static int parse_count(const char *flag, const char *v, long lo, long hi, int *out)
{
    char *end;
    long n = strtol(v, &end, 10);
    if (!*v || *end || n < lo || n > hi)
        return loom_error_set(LOOM_ERR_INPUT, "--%s: expected an integer in [%ld, %ld], got '%s'", flag, lo,
                              hi, v);
    *out = (int)n;
    return LOOM_OK;
}

/* Whether name is an executable in a directory of $PATH (as mpirun finds it). */
static int in_path(const char *name)
{
    const char *path = getenv("PATH");
    char dir[4096], file[4400];
    for (const char *p = path; p && *p;) {
        const char *colon = strchr(p, ':');
        const size_t len = colon ? (size_t)(colon - p) : strlen(p);
        snprintf(dir, sizeof dir, "%.*s", (int)len, p);
        snprintf(file, sizeof file, "%s/%s", *dir ? dir : ".", name);
        if (access(file, X_OK) == 0) return 1;
        p = colon ? colon + 1 : NULL;
    }
    return 0;
}

int loom_launch(int argc, char **argv)
{
    int nproc = 0, i, max_restarts = 0, nnodes = 0, node_rank = 0, rc = LOOM_OK;
    catch_stops(); /* first: a signal from here on stops the job, or keeps it from starting */
    const char *hostfile = NULL, *v;
    for (i = 0; i < argc && strcmp(argv[i], "--") != 0 && strncmp(argv[i], "-", 1) == 0; i++) {
        if (strcmp(argv[i], "--help") == 0 || strcmp(argv[i], "-h") == 0) {
            fputs(launch_usage, stdout);
            return LOOM_OK;
        }
        if ((v = flag_value(argv, argc, &i, "nproc-per-node", &rc)) ||
            (v = flag_value(argv, argc, &i, "num-gpus", &rc)))
            rc = parse_count("nproc-per-node", v, 1, 4096, &nproc);
        else if (!rc && (v = flag_value(argv, argc, &i, "hostfile", &rc)))
            hostfile = v;
        else if (!rc && (v = flag_value(argv, argc, &i, "max-restarts", &rc)))
            rc = parse_count("max-restarts", v, 0, 1000, &max_restarts);
        else if (!rc && ((v = flag_value(argv, argc, &i, "nnodes", &rc)) ||
                         (v = flag_value(argv, argc, &i, "num-nodes", &rc))))
            rc = parse_count("nnodes", v, 1, 100000, &nnodes);
        else if (!rc && (v = flag_value(argv, argc, &i, "node-rank", &rc)))
            rc = parse_count("node-rank", v, 0, 100000, &node_rank);
        else if (!rc && ((v = flag_value(argv, argc, &i, "master-addr", &rc)) ||
                         (v = flag_value(argv, argc, &i, "master-port", &rc))))
            continue; /* mpirun finds the ranks itself */
        else if (!rc && strcmp(argv[i], "--standalone") == 0)
            continue;
        else if (!rc)
            rc = loom_error_set(
                LOOM_ERR_INPUT,
                "unknown launch flag %s (--nproc-per-node, --hostfile, --max-restarts, --nnodes, "
                "--node-rank, --master-addr, --master-port, --standalone; loom launch --help)",
                argv[i]);
        if (rc) return rc;
    }
    if (nproc == 0) return loom_error_set(LOOM_ERR_INPUT, "loom launch needs --nproc-per-node N");
    if (node_rank != 0)
        return loom_error_set(
            LOOM_ERR_INPUT,
            "--node-rank %d: loom launch runs once, on the first node, and starts every node's "
            "ranks through mpirun over --hostfile: run it only where --node-rank is 0",
            node_rank);
    if (i < argc && strcmp(argv[i], "--") == 0) i++;
    if (i >= argc)
        return loom_error_set(LOOM_ERR_INPUT,
                              "loom launch needs the program to run: train ARGS..., or a program");
    char **cmd = argv + i;
    int ncmd = argc - i;
    const int own = strcmp(cmd[0], "train") == 0 || strcmp(cmd[0], "eval") == 0; /* loom's own commands */
    if (!own && !strchr(cmd[0], '/') && !in_path(cmd[0]))
        return loom_error_set(
            LOOM_ERR_INPUT,
            "loom launch: '%s' is neither loom's train nor a program on PATH (./%s if it is "
            "one here)",
            cmd[0], cmd[0]);
    /* --save and --load as the ranks will read them (--save=DIR, a DeepSpeed JSON's "save") */
    char save[4096] = "", load[4096] = "";
    if (own) {
        struct loom_config cfg;
        int help;
        rc = loom_config_parse(&cfg, ncmd - 1, cmd + 1, &help);
        snprintf(save, sizeof save, "%s", rc ? "" : cfg.save);
        snprintf(load, sizeof load, "%s", rc ? "" : cfg.load);
        loom_config_free(&cfg);
        if (rc) return rc;
    }
    if (max_restarts > 0 && !*save)
        return loom_error_set(
            LOOM_ERR_INPUT, "--max-restarts needs --save DIR in the train arguments: a restart resumes from "
                            "its newest checkpoint");
    int hosts = 1;
    if (hostfile && (rc = count_hosts(hostfile, &hosts))) return rc;
    if (nnodes > 1 && !hostfile)
        return loom_error_set(
            LOOM_ERR_INPUT,
            "--nnodes %d needs --hostfile FILE listing the %d hosts (loom launch starts them all "
            "through mpirun)",
            nnodes, nnodes);
    if (nnodes && hostfile && nnodes != hosts)
        return loom_error_set(LOOM_ERR_INPUT, "--nnodes %d, but --hostfile %s lists %d host%s", nnodes,
                              hostfile, hosts, hosts == 1 ? "" : "s");
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
    args[n++] = "-x";
    args[n++] = "LOOM_RESTART_COUNT";
    args[n++] = "--mca"; /* the launcher's stop, forwarded to every rank */
    args[n++] = "ess_base_forward_signals";
    args[n++] = "SIGURG";
    if (own) args[n++] = exe; /* a program of the user's runs as it is */
    for (int k = 0; k < ncmd; k++) args[n++] = cmd[k];
    if (own && !threads_given) {
        args[n++] = "--threads";
        args[n++] = thr;
    }
    args[n] = NULL;
    fprintf(stderr, "loom launch:");
    for (int k = 0; k < n; k++) fprintf(stderr, " %s", args[k]);
    fputc('\n', stderr);
    rc = supervise(args, n, save, load, max_restarts);
    loom_free(args);
    return rc;
}
