/* --offload auto: the least offload that fits the budget (see placement.h). */
#include "app/placement.h"

#include <cblas.h>
#include <glob.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <unistd.h>

#include "app/report.h"
#include "base/log.h"
#include "engine/footprint.h"
#include "io/indexed.h"
#include "io/synth.h"
#include "loom/loom.h"
#include "parallel/kinds.h"

/* What the prediction cannot see (code and library pages a step touches,
 * thread stacks, the allocator's own slack): a share and a constant. */
#define MARGIN 1.05
#define SLACK (8.0 * (1 << 20))

static const char *const level_names[] = {
    "everything in memory", "optimizer state on NVMe",
    "optimizer state and the ZeRO-3 parameter and gradient shards on NVMe"};

/* Bytes resident now. */
static double rss_now(void)
{
    long pages = 0, resident = 0;
    FILE *f = fopen("/proc/self/statm", "r");
    if (f) {
        if (fscanf(f, "%ld %ld", &pages, &resident) != 2) resident = 0;
        fclose(f);
    }
    return (double)resident * (double)sysconf(_SC_PAGESIZE);
}

double loom_peak_rss(void)
{
    struct rusage ru;
    getrusage(RUSAGE_SELF, &ru);
    return (double)ru.ru_maxrss * 1024;
}

/* The bytes of the token shards a run maps (the flags' files, or the
 * built-in corpus). */
static double data_bytes(const struct loom_config *cfg)
{
    if (!cfg->ndata_paths && !cfg->ntrain_paths)
        return 2.0 * LOOM_SYNTH_DEFAULT_TOKENS; /* uint16 tokens, train and validation */
    double total = 0;
    char *const *lists[] = {cfg->data_paths, cfg->valid_data_paths, cfg->train_data_paths,
                            cfg->test_data_paths};
    const int counts[] = {cfg->ndata_paths, cfg->nvalid_paths, cfg->ntrain_paths, cfg->ntest_paths};
    for (int l = 0; l < 4; l++)
        for (int i = 0; i < counts[l]; i++) {
            const char *pattern = lists[l][i];
            char prefix[4200], bin[4300];
            struct stat st;
            if (loom_indexed_exists(pattern, prefix, sizeof prefix)) { /* a Megatron dataset: its tokens */
                snprintf(bin, sizeof bin, "%s.bin", prefix);
                if (stat(bin, &st) == 0) total += (double)st.st_size;
                continue;
            }
            glob_t g;
            if (glob(pattern, 0, NULL, &g) == 0)
                for (size_t k = 0; k < g.gl_pathc; k++)
                    if (stat(g.gl_pathv[k], &st) == 0) total += (double)st.st_size;
            globfree(&g);
        }
    return total;
}

/* Offloaded ZeRO-3 shards are not all gone from memory: what is touched
 * before it is dropped (a gradient-norm piece of 4M elements, the unit
 * being gathered and the one prefetched, the optimizer's chunk of
 * parameters and gradients) stays resident meanwhile. */
static double resident_shards(const struct loom_config *cfg, const struct loom_topology *t,
                              const struct loom_footprint *fp, int level)
{
    if (level < 2) return 0;
    const double es = cfg->bf16 || cfg->fp16 ? 2 : 4, shard = (double)fp->params / t->dp;
    const double piece = shard < (1 << 22) ? shard : (1 << 22);
    const double unit = shard / (cfg->num_layers + 1);
    return es * (piece + 3 * unit) + 2 * cfg->offload_buffer_size * 1e6;
}

static void set_level(struct loom_config *cfg, int level)
{
    cfg->offload_optimizer = level >= 1 ? LOOM_OFFLOAD_NVME : LOOM_OFFLOAD_NONE;
    cfg->offload_param = level >= 2 ? LOOM_OFFLOAD_NVME : LOOM_OFFLOAD_NONE;
    if (level >= 2 && !*cfg->param_nvme_path)
        snprintf(cfg->param_nvme_path, sizeof cfg->param_nvme_path, "%s", cfg->nvme_path);
}

double loom_placement_budget(const struct loom_config *cfg)
{
    const char *local = getenv("OMPI_COMM_WORLD_LOCAL_SIZE");
    const int on_host = local && atoi(local) > 0 ? atoi(local) : 1;
    const double machine = (double)sysconf(_SC_PHYS_PAGES) * (double)sysconf(_SC_PAGESIZE);
    return cfg->mem_per_rank > 0 ? cfg->mem_per_rank * 1e9 : machine / on_host;
}

int loom_placement_choose(struct loom_config *cfg, const struct loom_topology *t, struct loom_placement *out)
{
    out->budget = loom_placement_budget(cfg);
    /* what the process holds before the model, once the BLAS and thread
     * pools a step starts are started (a product on every thread) */
    enum { WARM = 512 };
    float *w = calloc(3 * WARM * WARM, sizeof *w);
    if (w)
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, WARM, WARM, WARM, 1.0f, w, WARM,
                    w + WARM * WARM, WARM, 0.0f, w + 2 * WARM * WARM, WARM);
    free(w);
    const double base = rss_now() + data_bytes(cfg); /* the shards are mapped: a step touches them */
    struct loom_layout_shape shape;
    loom_kinds_shape(cfg, t->world, &shape);
    /* the parameters' shards offloaded too; nothing without --nvme-path */
    const int most = !*cfg->nvme_path ? 0 : shape.shard_params ? 2 : 1;
    double predicted[3] = {0, 0, 0};
    int level = -1;
    const double buffer = cfg->offload_buffer_size;
    for (int l = 0; l <= most && level < 0; l++) {
        set_level(cfg, l);
        /* offloaded: the streaming buffers as given, else smaller (down to 1 MB) when that fits */
        for (double mb = buffer; level < 0; mb /= 4) {
            cfg->offload_buffer_size = mb;
            struct loom_footprint fp;
            int rc = loom_engine_footprint(cfg, t, &fp);
            if (rc) return rc;
            predicted[l] = MARGIN * (base + (double)fp.total + resident_shards(cfg, t, &fp, l)) + SLACK;
            if (predicted[l] <= out->budget) level = l;
            if (l == 0 || mb <= 1) break;
        }
    }
    /* the ranks take the most offload any of them needs (pipeline stages differ) */
    uint64_t mine = (uint64_t)(level < 0 ? most + 1 : level);
    loom_comm_allreduce_sync(LOOM_GROUP_WORLD, loom_buf_of(&mine, 1, LOOM_DTYPE_U64), LOOM_OP_MAX);
    char b1[32], b2[32], b3[32];
    if (mine > (uint64_t)most && !*cfg->nvme_path) { /* Gemini's way: memory first, NVMe when needed */
        set_level(cfg, 0);
        return loom_error_set(
            LOOM_ERR_INPUT,
            "--offload auto: the model state does not fit --mem-per-rank %s in memory (a rank "
            "needs %s): give --nvme-path DIR for what must go to NVMe",
            loom_fmt_bytes(b1, sizeof b1, out->budget), loom_fmt_bytes(b2, sizeof b2, predicted[0]));
    }
    if (mine > (uint64_t)most) {
        set_level(cfg, 0);
        return loom_error_set(
            LOOM_ERR_INPUT, "--offload auto: nothing fits --mem-per-rank %s: with %s a rank needs %s%s",
            loom_fmt_bytes(b1, sizeof b1, out->budget), level_names[most],
            loom_fmt_bytes(b2, sizeof b2, predicted[most] > 0 ? predicted[most] : predicted[0]),
            most < 2 ? " (--zero-stage 3 also offloads the parameter and gradient shards)" : "");
    }
    set_level(cfg, (int)mine);
    if (level != (int)mine) { /* this rank stopped earlier: its count for the agreed level */
        cfg->offload_buffer_size = buffer;
        struct loom_footprint fp;
        int rc = loom_engine_footprint(cfg, t, &fp);
        if (rc) return rc;
        predicted[mine] =
            MARGIN * (base + (double)fp.total + resident_shards(cfg, t, &fp, (int)mine)) + SLACK;
    }
    out->level = (int)mine;
    out->predicted = predicted[mine];
    if (t->rank == 0) {
        printf("offload auto: budget %s a rank; the process holds %s before the model;",
               loom_fmt_bytes(b1, sizeof b1, out->budget), loom_fmt_bytes(b2, sizeof b2, base));
        for (int l = 0; l <= (int)mine; l++)
            printf(" %s: %s%s", level_names[l],
                   predicted[l] > 0 ? loom_fmt_bytes(b3, sizeof b3, predicted[l]) : "-",
                   l < (int)mine ? " (over)," : "");
        printf("; chosen: %s", level_names[mine]);
        if (mine > 0) printf(" (--offload-buffer-size %g MB)", cfg->offload_buffer_size);
        printf("\n");
    }
    return LOOM_OK;
}
