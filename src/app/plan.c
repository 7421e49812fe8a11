/*
 * `loom plan`: which layout for this model on these ranks, and why. The
 * model and batch come as loom train's flags; the planner's own are read
 * here. Any layout flag given (--tensor-model-parallel-size, --zero-stage,
 * --micro-batch-size, ...) is kept; the rest is searched (plan/search.h).
 */
#include "app/plan.h"

#include <cjson/cJSON.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "base/log.h"
#include "base/mem.h"
#include "comm/comm.h"
#include "plan/search.h"

struct plan_args {
    int world, top, json, calibrate, all_rejected;
    unsigned precisions; /* LOOM_PLAN_* (0: as the flags give) */
    double mem_gb;
    const char *cluster, *out;
};

static const char usage[] =
    "usage: loom plan --model M [shape and batch flags of loom train] --global-batch-size G --world N\n"
    "                 [--mem-per-rank GB] [--cluster NAME|FILE] [--precision f32,bf16,fp16] [--top K]\n"
    "                 [--rejected] [--json]\n"
    "       loom plan --calibrate [-o FILE]     this machine's products and memory (one process);\n"
    "       mpirun -np N loom plan --calibrate -o FILE   then adds the links to FILE\n"
    "  Layout flags given (--tensor-model-parallel-size, --pipeline-model-parallel-size, --zero-stage,\n"
    "  --micro-batch-size, --sequence-parallel, --recompute-granularity, ...) are kept; the rest is\n"
    "  searched. Clusters built in: %s; a FILE is JSON with the keys --calibrate writes.\n";

/* --precision f32,bf16,fp16: the precisions searched. */
static int parse_precisions(const char *v, unsigned *out)
{
    static const char *const names[] = {"f32", "bf16", "fp16"};
    *out = 0;
    for (const char *p = v; *p;) {
        size_t n = strcspn(p, ",");
        int found = 0;
        for (int k = 0; k < 3; k++)
            if (strlen(names[k]) == n && strncmp(p, names[k], n) == 0) {
                *out |= 1u << k;
                found = 1;
            }
        if (!found)
            return loom_error_set(LOOM_ERR_INPUT,
                                  "loom plan: --precision %s: expected a list of f32, bf16, fp16", v);
        p += n + (p[n] == ',');
    }
    if (!*out) return loom_error_set(LOOM_ERR_INPUT, "loom plan: --precision needs f32, bf16 or fp16");
    return LOOM_OK;
}

/* Takes the planner's flags out of argv (the rest stays for the config). */
static int take_args(int *argc, char **argv, struct plan_args *a)
{
    *a = (struct plan_args){.world = 1, .top = 5};
    int n = 0;
    for (int i = 0; i < *argc; i++) {
        const char *f = argv[i];
        const int has_value = i + 1 < *argc;
        if (strcmp(f, "--json") == 0) {
            a->json = 1;
        } else if (strcmp(f, "--calibrate") == 0) {
            a->calibrate = 1;
        } else if (strcmp(f, "--rejected") == 0) {
            a->all_rejected = 1;
        } else if (strcmp(f, "--precision") == 0) {
            if (!has_value) return loom_error_set(LOOM_ERR_INPUT, "loom plan: %s needs a value", f);
            int rc = parse_precisions(argv[++i], &a->precisions);
            if (rc) return rc;
        } else if (strcmp(f, "--world") == 0 || strcmp(f, "--top") == 0 || strcmp(f, "--mem-per-rank") == 0 ||
                   strcmp(f, "--cluster") == 0 || strcmp(f, "-o") == 0) {
            if (!has_value) return loom_error_set(LOOM_ERR_INPUT, "loom plan: %s needs a value", f);
            const char *v = argv[++i];
            char *end;
            if (strcmp(f, "--cluster") == 0) {
                a->cluster = v;
            } else if (strcmp(f, "-o") == 0) {
                a->out = v;
            } else if (strcmp(f, "--mem-per-rank") == 0) {
                a->mem_gb = strtod(v, &end);
                if (*end || end == v || !(a->mem_gb > 0))
                    return loom_error_set(LOOM_ERR_INPUT, "loom plan: --mem-per-rank %s: expected GB above 0",
                                          v);
            } else {
                long x = strtol(v, &end, 10);
                if (*end || end == v || x < 1 || x > 1 << 20)
                    return loom_error_set(LOOM_ERR_INPUT, "loom plan: %s %s: expected a whole number from 1",
                                          f, v);
                *(strcmp(f, "--world") == 0 ? &a->world : &a->top) = (int)x;
            }
        } else {
            argv[n++] = argv[i];
        }
    }
    *argc = n;
    return LOOM_OK;
}

static int calibrate(const struct plan_args *a)
{
    struct loom_cluster c;
    /* under mpirun with a file measured in one process: keep its products
     * and memory, add the links */
    const int links_only = loom_comm_world_size() > 1 && a->out && access(a->out, R_OK) == 0 &&
                           loom_cluster_read(a->out, &c) == LOOM_OK;
    loom_error_clear();
    int rc = loom_cluster_calibrate(&c, links_only);
    if (rc || loom_comm_world_rank() != 0) return rc;
    if (links_only) printf("kept the products and memory %s holds; measured the links\n", a->out);
    if (a->out) {
        if ((rc = loom_cluster_write(a->out, &c))) return rc;
        printf("wrote %s\n", a->out);
    }
    printf("%s: %d ranks a node; float32 %.0f GFLOP/s, bf16 %.0f GFLOP/s (the node's products); memory %.1f "
           "GB at "
           "%.1f GB/s; links %.2f GB/s, %.1f us\n",
           c.name, c.ranks_per_node, c.peak_f32 / 1e9, c.peak_bf16 / 1e9, c.mem_bytes / 1e9, c.mem_bw / 1e9,
           c.intra_bw / 1e9, c.intra_latency * 1e6);
    return LOOM_OK;
}

static int cluster_of(const struct plan_args *a, struct loom_cluster *c)
{
    if (a->cluster && strcmp(a->cluster, "local") != 0) {
        const struct loom_cluster *b = loom_cluster_builtin(a->cluster);
        if (b) {
            *c = *b;
            return LOOM_OK;
        }
        if (!strchr(a->cluster, '/') && !strchr(a->cluster, '.'))
            return loom_error_set(LOOM_ERR_INPUT, "--cluster %s: not a built-in cluster (%s) nor a file",
                                  a->cluster, loom_cluster_builtin_names());
        return loom_cluster_read(a->cluster, c);
    }
    return loom_cluster_calibrate(c, 0); /* this machine, measured now */
}

static const char *const rec_names[] = {"none", "selective", "full"};
static const char *const short_tags[] = {"params", "grads", "optim", "activ", "comm", "other"};

static void print_text(const struct loom_plan *p, const struct loom_config *cfg, const struct loom_cluster *c,
                       const struct plan_args *a)
{
    const struct loom_plan_entry *best = p->nfit ? &p->entries[0] : NULL;
    printf("loom plan: %s, T=%d, global batch %d, %s, on %d ranks of %s (%.1f GB a rank)\n", cfg->model,
           cfg->seq_length, cfg->global_batch_size,
           cfg->bf16   ? "bf16"
           : cfg->fp16 ? "fp16"
                       : "float32",
           a->world, c->name, p->mem_limit / 1e9);
    printf("%d layouts considered, %d fit\n\n", p->n, p->nfit);
    if (p->nfit) {
        printf("%-3s %-36s %5s %5s %-9s %9s %10s %8s  %s\n", "#", "layout", "micro", "accum", "recompute",
               "step (s)", "tokens/s", "TFLOP/s",
               "memory a rank (GB): total = params + grads + optim + activ + comm + other");
        for (int i = 0; i < p->nfit && i < a->top; i++) {
            const struct loom_plan_entry *e = &p->entries[i];
            char desc[128];
            loom_layout_describe(&e->layout, desc, sizeof desc);
            const double tps = (double)cfg->global_batch_size * cfg->seq_length / e->time.total;
            printf("%-3d %-36s %5d %5d %-9s %9.3f %10.0f %8.2f  %.3f =", i + 1, desc, e->layout.micro_batch,
                   e->layout.accumulation, rec_names[e->layout.recompute], e->time.total, tps,
                   e->time.flops_per_rank / e->time.total / 1e12, (double)e->mem.total / 1e9);
            for (int k = 0; k < LOOM_MEM_COUNT; k++)
                printf("%s %.3f %s", k ? " +" : "", (double)e->mem.peak[k] / 1e9, short_tags[k]);
            printf("\n");
        }
        const struct loom_step_time *t = &best->time;
        char flags[512];
        loom_layout_flags(&best->layout, flags, sizeof flags);
        printf("\nrecommended: %s\n  why: %s\n", flags, p->why);
        printf(
            "  its step: compute %.3f s, memory-bound %.3f, bubble %.3f, tp comm %.3f, cp comm %.3f, ep comm "
            "%.3f, pp comm %.3f, dp comm %.3f (exposed), optimizer %.3f%s\n",
            t->compute, t->memory_bound, t->bubble, t->tp_comm, t->cp_comm, t->ep_comm, t->pp_comm,
            t->dp_comm, t->optimizer, t->offload > 0 ? ", offload" : "");
    } else {
        printf("no layout fits in %.2f GB a rank\n", p->mem_limit / 1e9);
    }
    const int nrej = p->n - p->nfit;
    if (nrej) {
        printf("\nrejected: %d layouts%s\n", nrej,
               a->all_rejected ? "" : " (the first of each reason; --rejected lists all)");
        for (int i = p->nfit; i < p->n; i++) {
            const struct loom_plan_entry *e = &p->entries[i];
            int seen = 0;
            for (int j = p->nfit; j < i && !a->all_rejected && !seen; j++)
                seen = strncmp(p->entries[j].reason, e->reason, 24) == 0;
            if (seen) continue;
            char desc[128];
            loom_layout_describe(&e->layout, desc, sizeof desc);
            printf("  %s, micro %d, recompute %s: %s\n", desc, e->layout.micro_batch,
                   rec_names[e->layout.recompute], e->reason);
        }
    }
}

static cJSON *entry_json(const struct loom_plan_entry *e, const struct loom_config *cfg)
{
    cJSON *o = cJSON_CreateObject();
    const struct loom_layout *l = &e->layout;
    cJSON *lay = cJSON_AddObjectToObject(o, "layout");
    const struct loom_kind_choice *kind = l->kind;
    cJSON_AddNumberToObject(lay, "tp", kind[LOOM_KIND_TENSOR].value);
    cJSON_AddNumberToObject(lay, "pp", kind[LOOM_KIND_PIPELINE].value);
    cJSON_AddNumberToObject(lay, "cp", kind[LOOM_KIND_CONTEXT].value);
    cJSON_AddNumberToObject(lay, "dp", kind[LOOM_KIND_DATA].value);
    cJSON_AddNumberToObject(lay, "ep", kind[LOOM_KIND_EXPERT].value);
    cJSON_AddNumberToObject(lay, "virtual_stages", kind[LOOM_KIND_PIPELINE].sub);
    cJSON_AddBoolToObject(lay, "sequence_parallel", kind[LOOM_KIND_SEQUENCE].value);
    cJSON_AddNumberToObject(lay, "zero_stage", kind[LOOM_KIND_ZERO].value);
    cJSON_AddNumberToObject(lay, "micro_batch", l->micro_batch);
    cJSON_AddNumberToObject(lay, "accumulation", l->accumulation);
    cJSON_AddStringToObject(lay, "recompute", rec_names[l->recompute]);
    static const char *const precisions[] = {"f32", "bf16", "fp16"};
    cJSON_AddStringToObject(lay, "precision", precisions[l->precision]);
    cJSON_AddBoolToObject(lay, "offload_nvme", l->offload_nvme);
    char flags[512];
    loom_layout_flags(l, flags, sizeof flags);
    cJSON_AddStringToObject(lay, "flags", flags);
    cJSON_AddBoolToObject(o, "fits", e->fits);
    if (!e->fits) cJSON_AddStringToObject(o, "reason", e->reason);
    if (e->mem.total > 0) {
        cJSON *m = cJSON_AddObjectToObject(o, "memory");
        for (int k = 0; k < LOOM_MEM_COUNT; k++)
            cJSON_AddNumberToObject(m, loom_mem_tag_name((enum loom_mem_tag)k), (double)e->mem.peak[k]);
        cJSON_AddNumberToObject(m, "total", (double)e->mem.total);
        cJSON_AddNumberToObject(m, "stage", e->busiest_stage);
        cJSON_AddNumberToObject(m, "rank_params", (double)e->mem.params);
        const struct loom_step_time *t = &e->time;
        cJSON *s = cJSON_AddObjectToObject(o, "time");
        cJSON_AddNumberToObject(s, "compute", t->compute);
        cJSON_AddNumberToObject(s, "memory_bound", t->memory_bound);
        cJSON_AddNumberToObject(s, "bubble", t->bubble);
        cJSON_AddNumberToObject(s, "tp_comm", t->tp_comm);
        cJSON_AddNumberToObject(s, "cp_comm", t->cp_comm);
        cJSON_AddNumberToObject(s, "ep_comm", t->ep_comm);
        cJSON_AddNumberToObject(s, "pp_comm", t->pp_comm);
        cJSON_AddNumberToObject(s, "dp_comm", t->dp_comm);
        cJSON_AddNumberToObject(s, "optimizer", t->optimizer);
        cJSON_AddNumberToObject(s, "offload", t->offload);
        cJSON_AddNumberToObject(s, "step", t->total);
        cJSON_AddNumberToObject(o, "tokens_per_s",
                                (double)cfg->global_batch_size * cfg->seq_length / t->total);
        cJSON_AddNumberToObject(o, "tflops_per_rank", t->flops_per_rank / t->total / 1e12);
    }
    return o;
}

static void print_json(const struct loom_plan *p, const struct loom_config *cfg, const struct loom_cluster *c,
                       const struct plan_args *a)
{
    cJSON *doc = cJSON_CreateObject();
    cJSON_AddStringToObject(doc, "model", cfg->model);
    cJSON_AddNumberToObject(doc, "seq_length", cfg->seq_length);
    cJSON_AddNumberToObject(doc, "global_batch_size", cfg->global_batch_size);
    cJSON_AddNumberToObject(doc, "world", a->world);
    cJSON_AddNumberToObject(doc, "mem_per_rank", p->mem_limit);
    cJSON *cl = cJSON_AddObjectToObject(doc, "cluster");
    cJSON_AddStringToObject(cl, "name", c->name);
    cJSON_AddNumberToObject(cl, "ranks_per_node", c->ranks_per_node);
    cJSON_AddNumberToObject(cl, "peak_f32", c->peak_f32);
    cJSON_AddNumberToObject(cl, "peak_bf16", c->peak_bf16);
    cJSON_AddNumberToObject(cl, "matmul_efficiency", c->matmul_efficiency);
    cJSON_AddStringToObject(doc, "why", p->why); /* why layouts[0] is recommended */
    cJSON *fit = cJSON_AddArrayToObject(doc, "layouts"), *rej = cJSON_AddArrayToObject(doc, "rejected");
    for (int i = 0; i < p->n; i++)
        cJSON_AddItemToArray(p->entries[i].fits ? fit : rej, entry_json(&p->entries[i], cfg));
    char *text = cJSON_Print(doc);
    puts(text);
    cJSON_free(text);
    cJSON_Delete(doc);
}

int loom_plan_main(int argc, char **argv)
{
    struct plan_args a;
    int rc = take_args(&argc, argv, &a);
    if (rc) return rc;
    for (int i = 0; i < argc; i++)
        if (strcmp(argv[i], "--help") == 0 || strcmp(argv[i], "-h") == 0) {
            printf(usage, loom_cluster_builtin_names());
            return LOOM_OK;
        }
    if (a.calibrate) return calibrate(&a);
    struct loom_config cfg;
    int help;
    if ((rc = loom_config_parse(&cfg, argc, argv, &help))) return rc;
    struct loom_cluster c;
    if ((rc = cluster_of(&a, &c)) == LOOM_OK) {
        const int on_node = c.ranks_per_node < a.world ? c.ranks_per_node : a.world;
        const double limit = a.mem_gb > 0 ? a.mem_gb * 1e9 : c.mem_bytes / (c.shared_node ? on_node : 1);
        struct loom_plan p;
        if ((rc = loom_plan_search(&cfg, a.world, &c, limit,
                                   &(struct loom_plan_options){.keep_given = 1, .precisions = a.precisions},
                                   &p)) == LOOM_OK) {
            if (a.json)
                print_json(&p, &cfg, &c, &a);
            else
                print_text(&p, &cfg, &c, &a);
        }
        loom_plan_free(&p);
    }
    loom_config_free(&cfg);
    return rc;
}
