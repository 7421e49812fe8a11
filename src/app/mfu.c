/* The machine's peak FLOP/s for MFU: calibrated, and kept per machine (see mfu.h). */
#include "app/mfu.h"

#include <cJSON.h>
#include <cblas.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "base/clock.h"
#include "base/log.h"
#include "base/mem.h"
#include "io/fs.h"
#include "kernels/kernels.h"
#include "loom/loom.h"

enum { FIRST_RUNS = 8, LATER_RUNS = 2 };

/* The machine's cores (distinct physical id and core id pairs of
 * /proc/cpuinfo); the logical CPUs when it does not say. */
static int physical_cores(void)
{
    char line[256];
    int ids[4096][2], n = 0, phys = 0;
    FILE *f = fopen("/proc/cpuinfo", "r");
    while (f && fgets(line, sizeof line, f)) {
        const char *v = strchr(line, ':');
        if (!v) continue;
        if (strncmp(line, "physical id", 11) == 0) phys = atoi(v + 1);
        if (strncmp(line, "core id", 7) != 0) continue;
        const int core = atoi(v + 1);
        int seen = 0;
        for (int i = 0; i < n && !seen; i++) seen = ids[i][0] == phys && ids[i][1] == core;
        if (!seen && n < 4096) ids[n][0] = phys, ids[n][1] = core, n++;
    }
    if (f) fclose(f);
    const long cpus = sysconf(_SC_NPROCESSORS_ONLN);
    return n > 0 ? n : cpus > 0 ? (int)cpus : 1;
}

/* The best rate of `runs` 1024^3 products on one thread, by the thread's
 * own CPU time (the first run warms up), times the threads: a core's
 * speed while it runs, which other processes' load does not change (a
 * wall-clock rate on all threads falls with every process that shares the
 * cores, and a thread waiting on a descheduled sibling spins). */
static double calibrate(enum loom_dtype compute, int runs)
{
    const int n = 1024, threads = loom_threads_get();
    const int bf16 = compute == LOOM_DTYPE_BF16 && loom_bf16_units() != LOOM_BF16_UNITS_F32;
    size_t bytes = sizeof(float) * (size_t)n * n;
    float *a = loom_alloc(bytes, LOOM_MEM_OTHER), *b = loom_alloc(bytes, LOOM_MEM_OTHER),
          *c = loom_alloc(bytes, LOOM_MEM_OTHER);
    for (size_t i = 0; i < (size_t)n * n; i++) {
        a[i] = (float)(i % 13) * 0.01f;
        b[i] = (float)(i % 7) * 0.01f;
    }
    loom_threads_set(1);
    double best = 0;
    for (int r = 0; r < runs + 1; r++) {
        struct timespec t0, t1;
        clock_gettime(CLOCK_THREAD_CPUTIME_ID, &t0);
        if (bf16) /* the bf16 product as training calls it, operands converted */
            loom_lm_head_forward_bf16(c, a, b, n, n, n);
        else
            cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, n, n, n, 1.0f, a, n, b, n, 0.0f, c, n);
        clock_gettime(CLOCK_THREAD_CPUTIME_ID, &t1);
        const double dt = (double)(t1.tv_sec - t0.tv_sec) + 1e-9 * (double)(t1.tv_nsec - t0.tv_nsec);
        const double flops = 2.0 * n * n * n / dt;
        if (r > 0 && flops > best) best = flops; /* the first run warms up */
    }
    loom_threads_set(threads);
    loom_free(a);
    loom_free(b);
    loom_free(c);
    const int cores = physical_cores(); /* two hardware threads of a core share its arithmetic units */
    return best * (threads < cores ? threads : cores);
}

double loom_calibrate_peak_flops(enum loom_dtype compute)
{
    return calibrate(compute, LATER_RUNS);
}

/* "AMD EPYC 9R14 96-Core Processor|cpus 2|threads 2|float32|avx2": the cache's key. */
static void machine_key(enum loom_dtype compute, int threads, char *key, size_t n)
{
    char model[256] = "unknown CPU", line[512];
    FILE *f = fopen("/proc/cpuinfo", "r");
    while (f && fgets(line, sizeof line, f))
        if (strncmp(line, "model name", 10) == 0) {
            const char *v = strchr(line, ':');
            if (v) snprintf(model, sizeof model, "%s", v + 1 + strspn(v + 1, " \t"));
            model[strcspn(model, "\n")] = 0;
            break;
        }
    if (f) fclose(f);
    const long cpus = sysconf(_SC_NPROCESSORS_ONLN);
    snprintf(key, n, "%s|cpus %ld|threads %d|%s|%s", model, cpus, threads, loom_dtype_name(compute),
             compute == LOOM_DTYPE_BF16 ? loom_bf16_units_name(loom_bf16_units()) : "sgemm");
}

static void cache_path(char *path, size_t n)
{
    const char *x = getenv("XDG_CACHE_HOME");
    if (x && *x)
        snprintf(path, n, "%s/loom/peak.json", x);
    else
        snprintf(path, n, "%s/.cache/loom/peak.json", getenv("HOME") ? getenv("HOME") : ".");
}

/* The cache's object (an empty one when it is missing or not JSON). */
static cJSON *cache_read(const char *path)
{
    char *text;
    size_t len;
    cJSON *j = NULL;
    if (access(path, F_OK) == 0 && loom_fs_read_small(path, 1 << 20, &text, &len) == LOOM_OK) {
        j = cJSON_ParseWithLength(text, len);
        loom_free(text);
    }
    loom_error_clear();
    if (!cJSON_IsObject(j)) {
        cJSON_Delete(j);
        j = cJSON_CreateObject();
    }
    return j;
}

void loom_mfu_text(char *buf, size_t n, double mfu)
{
    if (mfu > 1)
        snprintf(buf, n, ">100%% (peak too low)");
    else
        snprintf(buf, n, "%.1f%%", 100 * mfu);
}

double loom_machine_peak_flops(enum loom_dtype compute, char *source, size_t n)
{
    char key[512], path[4200], dir[4200];
    machine_key(compute, loom_threads_get(), key, sizeof key);
    cache_path(path, sizeof path);
    cJSON *cache = cache_read(path), *e = cJSON_GetObjectItemCaseSensitive(cache, key);
    const cJSON *f = cJSON_GetObjectItemCaseSensitive(e, "flops"),
                *k = cJSON_GetObjectItemCaseSensitive(e, "runs");
    const double cached = cJSON_IsNumber(f) && f->valuedouble > 0 ? f->valuedouble : 0;
    const int starts = cJSON_IsNumber(k) ? k->valueint : 0;
    const double now = calibrate(compute, cached > 0 ? LATER_RUNS : FIRST_RUNS);
    const double best = now > cached ? now : cached;
    cJSON_DeleteItemFromObjectCaseSensitive(cache, key);
    e = cJSON_AddObjectToObject(cache, key);
    cJSON_AddNumberToObject(e, "flops", best);
    cJSON_AddNumberToObject(e, "runs", starts + 1);
    char *text = cJSON_Print(cache);
    loom_fs_dirname(path, dir, sizeof dir);
    int saved = 0;
    if (text && loom_fs_mkdir_p(dir) == LOOM_OK) {
        const void *parts[] = {text};
        const size_t sizes[] = {strlen(text)};
        saved = loom_fs_write_atomic(path, parts, sizes, 1) == LOOM_OK;
    }
    loom_error_clear(); /* a cache that cannot be written: this start-up's figure stands */
    free(text);
    cJSON_Delete(cache);
    if (saved)
        snprintf(source, n, "the best calibration of %d start-up%s on this machine, cached in %s", starts + 1,
                 starts ? "s" : "", path);
    else
        snprintf(source, n, "calibrated at start-up (the cache %s cannot be written)", path);
    return best;
}
