/* Cluster descriptions: built in, from JSON, measured (see cluster.h). */
#include "plan/cluster.h"

#include <cjson/cJSON.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

#include "base/clock.h"
#include "base/log.h"
#include "base/mem.h"
#include "comm/comm.h"
#include "io/fs.h"
#include "kernels/kernels.h"
#include <cblas.h>

/* The GPU nodes most runs use. Peaks are the dense bf16 (and TF32 for
 * float32) tensor-core figures NVIDIA publishes; matmul_efficiency is the
 * fraction of it large transformer products sustain (cuBLAS, about 70% on
 * A100 and 65% on H100 at these shapes); the bus bandwidths are what NCCL's
 * ring all-reduce reaches (NVLink within a node; one 200 Gb/s HDR or 400
 * Gb/s NDR InfiniBand port per GPU across nodes). */
static const struct loom_cluster builtins[] = {
    {.name = "a100-80gb",
     .ranks_per_node = 8,
     .peak_f32 = 156e12,
     .peak_bf16 = 312e12,
     .matmul_efficiency = 0.70,
     .mem_bytes = 80e9,
     .mem_bw = 2.039e12,
     .intra_bw = 150e9,
     .intra_latency = 10e-6,
     .inter_bw = 23e9,
     .inter_latency = 15e-6,
     .disk_bw = 6e9},
    {.name = "h100-80gb",
     .ranks_per_node = 8,
     .peak_f32 = 495e12,
     .peak_bf16 = 989e12,
     .matmul_efficiency = 0.65,
     .mem_bytes = 80e9,
     .mem_bw = 3.35e12,
     .intra_bw = 360e9,
     .intra_latency = 8e-6,
     .inter_bw = 46e9,
     .inter_latency = 12e-6,
     .disk_bw = 12e9},
};

const struct loom_cluster *loom_cluster_builtin(const char *name)
{
    for (size_t i = 0; i < sizeof builtins / sizeof builtins[0]; i++)
        if (strcmp(builtins[i].name, name) == 0) return &builtins[i];
    return NULL;
}

const char *loom_cluster_builtin_names(void)
{
    return "a100-80gb, h100-80gb, local";
}

/* ---- JSON --------------------------------------------------------------------- */

#define INT_KEYS(X) X(ranks_per_node) X(shared_node)
#define NUM_KEYS(X)                                                                                          \
    X(peak_f32)                                                                                              \
    X(peak_bf16)                                                                                             \
    X(matmul_efficiency)                                                                                     \
    X(mem_bytes) X(mem_bw) X(intra_bw) X(intra_latency) X(inter_bw) X(inter_latency) X(disk_bw)

int loom_cluster_read(const char *path, struct loom_cluster *out)
{
    memset(out, 0, sizeof *out);
    char *text;
    size_t len;
    int rc = loom_fs_read_small(path, 1 << 20, &text, &len);
    if (rc) return loom_error_set(LOOM_ERR_INPUT, "--cluster %s: cannot read it", path);
    cJSON *doc = cJSON_Parse(text);
    loom_free(text);
    if (!cJSON_IsObject(doc)) {
        cJSON_Delete(doc);
        return loom_error_set(LOOM_ERR_INPUT, "--cluster %s: not a JSON object", path);
    }
    const cJSON *name = cJSON_GetObjectItemCaseSensitive(doc, "name");
    snprintf(out->name, sizeof out->name, "%s", cJSON_IsString(name) ? name->valuestring : path);
#define READ(key, min)                                                                                       \
    do {                                                                                                     \
        const cJSON *v = cJSON_GetObjectItemCaseSensitive(doc, #key);                                        \
        if (!cJSON_IsNumber(v) || v->valuedouble < (min)) {                                                  \
            rc = loom_error_set(LOOM_ERR_INPUT, "--cluster %s: \"%s\" %s", path, #key,                       \
                                v ? "must be a number of at least " #min : "is missing");                    \
            goto done;                                                                                       \
        }                                                                                                    \
        out->key = (__typeof__(out->key))v->valuedouble;                                                     \
    } while (0);
#define READ_INT(key) READ(key, 0)
#define READ_NUM(key) READ(key, 0)
    INT_KEYS(READ_INT)
    NUM_KEYS(READ_NUM)
    if (out->ranks_per_node < 1 || out->peak_f32 <= 0 || out->peak_bf16 <= 0 || out->matmul_efficiency <= 0 ||
        out->matmul_efficiency > 1 || out->mem_bytes <= 0 || out->mem_bw <= 0 || out->intra_bw <= 0 ||
        out->inter_bw <= 0)
        rc = loom_error_set(LOOM_ERR_INPUT,
                            "--cluster %s: ranks_per_node, the peaks, mem_bytes, mem_bw and the bandwidths "
                            "must be above 0, matmul_efficiency in (0, 1]",
                            path);
done:
    cJSON_Delete(doc);
    return rc;
}

int loom_cluster_write(const char *path, const struct loom_cluster *c)
{
    cJSON *doc = cJSON_CreateObject();
    cJSON_AddStringToObject(doc, "name", c->name);
#define WRITE(key) cJSON_AddNumberToObject(doc, #key, (double)c->key);
    INT_KEYS(WRITE)
    NUM_KEYS(WRITE)
    char *text = cJSON_Print(doc);
    cJSON_Delete(doc);
    const void *parts[] = {text, "\n"};
    const size_t sizes[] = {strlen(text), 1};
    int rc = loom_fs_write_atomic(path, parts, sizes, 2);
    cJSON_free(text);
    return rc;
}

/* ---- measured ------------------------------------------------------------------ */

/* Best FLOP/s of out (M, N) = a (M, K) b (N, K)^T in float32 or on the bf16
 * units, as training calls them. */
static double product_rate(int M, int K, int N, int bf16)
{
    float *a = loom_alloc(sizeof(float) * (size_t)M * K, LOOM_MEM_OTHER),
          *b = loom_alloc(sizeof(float) * (size_t)N * K, LOOM_MEM_OTHER),
          *c = loom_alloc(sizeof(float) * (size_t)M * N, LOOM_MEM_OTHER);
    for (size_t i = 0; i < (size_t)M * K; i++) a[i] = (float)(i % 13) * 0.01f;
    for (size_t i = 0; i < (size_t)N * K; i++) b[i] = (float)(i % 7) * 0.01f;
    double best = 0;
    for (int r = 0; r < 5; r++) {
        const double t0 = loom_now();
        if (bf16)
            loom_lm_head_forward_bf16(c, a, b, M, K, N);
        else
            cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, M, N, K, 1.0f, a, K, b, K, 0.0f, c, N);
        const double rate = 2.0 * M * N * K / (loom_now() - t0);
        if (r > 0 && rate > best) best = rate; /* the first run warms up */
    }
    loom_free(a);
    loom_free(b);
    loom_free(c);
    return best;
}

/* What a transformer layer's products sustain: the MLP's two shapes at
 * 1024 rows and 768 channels (GPT-2 small's), their mean time. */
static double layer_rate(int bf16)
{
    const double f = 2.0 * 1024 * 768 * 3072;
    return 2 * f / (f / product_rate(1024, 768, 3072, bf16) + f / product_rate(1024, 3072, 768, bf16));
}

/* Best bytes/s of copying 256 MB (read and write counted), on all threads. */
static double measure_mem_bw(void)
{
    const size_t n = (size_t)64 << 20; /* floats */
    float *a = loom_alloc(n * sizeof *a, LOOM_MEM_OTHER), *b = loom_alloc(n * sizeof *b, LOOM_MEM_OTHER);
    double best = 0;
    for (int rep = 0; rep < 4; rep++) {
        const double t0 = loom_now();
#pragma omp parallel for schedule(static)
        for (size_t i = 0; i < n; i++) b[i] = a[i] + 1.0f;
        const double bw = 2.0 * n * sizeof *a / (loom_now() - t0);
        if (bw > best) best = bw;
    }
    loom_free(a);
    loom_free(b);
    return best;
}

/* Ring all-reduce bus bandwidth and latency over the world (world > 1). */
static void measure_comm(double *bw, double *latency)
{
    const int world = loom_comm_world_size();
    const size_t n = (size_t)16 << 20; /* floats: 64 MB */
    float *x = loom_alloc(n * sizeof *x, LOOM_MEM_OTHER);
    double best = 1e30, best_small = 1e30;
    for (int rep = 0; rep < 4; rep++) {
        double t0 = loom_now();
        loom_comm_allreduce_sync(LOOM_GROUP_WORLD, loom_buf_of(x, n, LOOM_DTYPE_F32), LOOM_OP_SUM);
        double t = loom_now() - t0;
        if (t < best) best = t;
        t0 = loom_now();
        loom_comm_allreduce_sync(LOOM_GROUP_WORLD, loom_buf_of(x, 1, LOOM_DTYPE_F32), LOOM_OP_SUM);
        t = loom_now() - t0;
        if (t < best_small) best_small = t;
    }
    loom_free(x);
    /* a ring moves 2 (w - 1) / w of the buffer through each rank */
    *bw = 2.0 * (world - 1) / world * (double)(n * sizeof *x) / best;
    *latency = best_small;
    double both[2] = {*bw, *latency};
    loom_comm_allreduce_sync(LOOM_GROUP_WORLD, loom_buf_of(both, 2, LOOM_DTYPE_F64), LOOM_OP_MIN);
    *bw = both[0];
    *latency = both[1];
}

/* The figures no measurement gives; ranks_per_node the world (or the
 * cores in one process). */
static void local_defaults(struct loom_cluster *c, int world)
{
    memset(c, 0, sizeof *c);
    snprintf(c->name, sizeof c->name, "local");
    c->ranks_per_node = world > 1 ? world : (int)sysconf(_SC_NPROCESSORS_ONLN);
    c->shared_node = 1;
    c->matmul_efficiency = 1.0; /* the peaks are what the layer's products sustain */
    c->mem_bytes = (double)sysconf(_SC_PHYS_PAGES) * (double)sysconf(_SC_PAGESIZE);
    c->intra_bw = 5e9; /* shared memory, when not measured */
    c->intra_latency = 5e-6;
    c->inter_bw = c->intra_bw;
    c->inter_latency = c->intra_latency;
    c->disk_bw = 1e9;
}

int loom_cluster_measure_node(struct loom_cluster *c, int world)
{
    local_defaults(c, world);
    c->peak_f32 = layer_rate(0);
    c->peak_bf16 = loom_bf16_units() == LOOM_BF16_UNITS_F32 ? c->peak_f32 : layer_rate(1);
    c->mem_bw = measure_mem_bw();
    return LOOM_OK;
}

int loom_cluster_calibrate(struct loom_cluster *c, int links_only)
{
    const int world = loom_comm_world_size();
    if (links_only && world > 1) {
        struct loom_topology t;
        int rc = loom_comm_setup(&t, 1, 1);
        if (rc == LOOM_OK) {
            c->ranks_per_node = world;
            measure_comm(&c->intra_bw, &c->intra_latency);
            c->inter_bw = c->intra_bw;
            c->inter_latency = c->intra_latency;
        }
        return rc;
    }
    int rc;
    if (world > 1) {
        struct loom_topology t;
        if ((rc = loom_comm_setup(&t, 1, 1))) return rc;
    }
    if ((rc = loom_bf16_units_select(NULL))) return rc;
    local_defaults(c, world);
    /* the node's figures, measured by rank 0 on all threads while the
     * others wait (their progress threads take a share of the cores: one
     * process measures them better, see cluster.h) */
    double node[3] = {0, 0, 0};
    if (loom_comm_world_rank() == 0) {
        node[0] = layer_rate(0);
        node[1] = loom_bf16_units() == LOOM_BF16_UNITS_F32 ? node[0] : layer_rate(1);
        node[2] = measure_mem_bw();
    }
    if (world > 1)
        loom_comm_allreduce_sync(LOOM_GROUP_WORLD, loom_buf_of(node, 3, LOOM_DTYPE_F64), LOOM_OP_SUM);
    c->peak_f32 = node[0];
    c->peak_bf16 = node[1];
    c->mem_bw = node[2];
    c->matmul_efficiency = 1.0; /* the peaks are what the layer's products sustain */
    c->mem_bytes = (double)sysconf(_SC_PHYS_PAGES) * (double)sysconf(_SC_PAGESIZE);
    c->intra_bw = 5e9; /* shared memory, when not measured */
    c->intra_latency = 5e-6;
    if (world > 1) measure_comm(&c->intra_bw, &c->intra_latency);
    c->inter_bw = c->intra_bw;
    c->inter_latency = c->intra_latency;
    c->disk_bw = 1e9;
    return LOOM_OK;
}
