/*
 * DeepSpeed JSON configs (--deepspeed-config FILE) read onto the settings
 * table: each row's JSON path (table.c) says where its value lives, so a
 * key is described once, beside its flag. Around that:
 *   - keys DeepSpeed has that loom accepts without acting on, each said once
 *     with what loom does instead (the table below);
 *   - unknown keys: a warning naming the full path and the nearest known key
 *     in the same object;
 *   - a wrong type or an out-of-range value: an error naming the path;
 *   - "auto" (the Hugging Face Trainer's placeholder) means "not given", so
 *     the value comes from the flags, the preset or the default.
 * Not here: the precedence of flags over the file (parse.c), writing
 * configs, and any DeepSpeed feature loom does not have.
 */
#include <cjson/cJSON.h>
#include <errno.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/stat.h>
#include <unistd.h>

#include "base/log.h"
#include "config/config_impl.h"
#include "io/fs.h"

/* Keys DeepSpeed has that loom accepts and does not act on, with what loom
 * does instead. An object listed here is accepted whole. */
static const struct {
    const char *path, *why;
} ignored_keys[] = {
    {"wall_clock_breakdown", "loom prints its own breakdown: ms per step and exposed communication on every "
                             "log line, tokens/s, MFU and peak memory by category at the end"},
    {"memory_breakdown", "loom reports memory by category on every log line (--metrics) and at the end"},
    {"prescale_gradients", "loom averages gradients in fp32"},
    {"gradient_predivide_factor", "loom averages gradients in fp32"},
    {"zero_allow_untested_optimizer", "loom's optimizer is AdamW"},
    {"dump_state", "loom prints its resolved configuration (--dry-run)"},
    {"flops_profiler", "loom prints MFU on every log line"},
    {"tensorboard", "loom writes TensorBoard event files with --tensorboard-dir DIR"},
    {"wandb", "loom writes --metrics FILE (one JSON line per step)"},
    {"csv_monitor", "loom writes --metrics FILE (one JSON line per step)"},
    {"comms_logger", "loom reports exposed communication per step (comm_wait_ms in --metrics)"},
    /* activation_checkpointing.number_checkpoints is --recompute-num-layers (table.c) */
    {"activation_checkpointing.partition_activations",
     "loom keeps each rank's kept inputs whole; --sequence-parallel splits the activations across "
     "tensor-parallel ranks"},
    {"activation_checkpointing.cpu_checkpointing",
     "on the CPU backend the kept inputs are in host memory already"},
    {"activation_checkpointing.contiguous_memory_optimization",
     "loom allocates every kept input once, at the first forward"},
    {"activation_checkpointing.synchronize_checkpoint_boundary",
     "the CPU backend has no device to synchronize"},
    {"activation_checkpointing.profile", "loom reports ms per step and activation memory (--metrics)"},
    {"aio", "nvme offload streams through io_uring (--offload-buffer-size, --offload-direct-io)"},
    {"optimizer.params.torch_adam", "loom has one AdamW implementation"},
    {"scheduler.params.last_batch_iteration",
     "the schedule starts at step 1 (or at the step a checkpoint resumes)"},
    {"fp16.auto_cast", "the model rounds its own activations to fp16 at every kernel's edge"},
    {"fp16.consecutive_hysteresis",
     "loom's loss scaler keeps DeepSpeed's default (false): hysteresis is refilled when the scale grows"},
    {"zero_optimization.contiguous_gradients", "loom's gradients always live in one flat buffer"},
    {"zero_optimization.reduce_scatter", "stages 2 and 3 always reduce-scatter gradients"},
    {"zero_optimization.allgather_partitions", "ZeRO always all-gathers the updated shards"},
    {"zero_optimization.allgather_bucket_size",
     "ZeRO all-gathers block by block (--zero3-min-params sizes stage 3's units)"},
    {"zero_optimization.round_robin_gradients", "each rank's gradient shard is one contiguous range"},
    {"zero_optimization.stage3_prefetch_bucket_size", "stage 3 prefetches the next gather unit"},
    {"zero_optimization.stage3_param_persistence_threshold",
     "stage 3 gathers every unit (--zero3-min-params sizes the units)"},
    {"zero_optimization.stage3_max_live_parameters", "stage 3 holds the unit in use and the one prefetched"},
    {"zero_optimization.stage3_max_reuse_distance", "stage 3 holds the unit in use and the one prefetched"},
    {"zero_optimization.stage3_gather_16bit_weights_on_model_save", "--save writes the whole fp32 model"},
    {"zero_optimization.stage3_gather_fp16_weights_on_model_save", "--save writes the whole fp32 model"},
    {"zero_optimization.sub_group_size", "the optimizer updates each rank's shard in one pass"},
    {"zero_optimization.elastic_checkpoint", "checkpoints load under any layout"},
    {"zero_optimization.load_from_fp32_weights", "the master weights are fp32"},
    {"zero_optimization.offload_param.pin_memory", "the CPU backend has no device memory to pin for"},
    {"zero_optimization.offload_param.buffer_count",
     "the offloaded shard is paged in by the unit: the one gathered and the one prefetched"},
    {"zero_optimization.offload_param.buffer_size",
     "the offloaded shard is paged in by the unit: the one gathered and the one prefetched"},
    {"zero_optimization.offload_param.max_in_cpu", "what is resident is the units in use, then dropped"},
    {"zero_optimization.offload_optimizer.pin_memory", "the CPU backend has no device memory to pin for"},
    {"zero_optimization.offload_optimizer.buffer_count",
     "nvme offload streams through --offload-buffer-size MB"},
    {"zero_optimization.offload_optimizer.fast_init", "the nvme file is written as the state is initialised"},
    {"zero_optimization.offload_optimizer.ratio", "the whole optimizer state is offloaded"},
};

/* Which of DeepSpeed's schedulers take each scheduler.params key (DeepSpeed
 * rejects the others: they are not constructor arguments). */
#define WL (1u << LOOM_LR_WARMUP_LR)
#define WD (1u << LOOM_LR_WARMUP_DECAY_LR)
#define WC (1u << LOOM_LR_WARMUP_COSINE_LR)
static const struct {
    const char *path;
    unsigned styles;
} scheduler_params[] = {
    {"scheduler.params.warmup_min_lr", WL | WD},
    {"scheduler.params.warmup_max_lr", WL | WD},
    {"scheduler.params.warmup_num_steps", WL | WD | WC},
    {"scheduler.params.warmup_type", WL | WD | WC},
    {"scheduler.params.total_num_steps", WD | WC},
    {"scheduler.params.warmup_min_ratio", WC},
    {"scheduler.params.cos_min_ratio", WC},
};

struct reader {
    struct loom_config *cfg; /* where values and warnings go */
    const char *file;
    const cJSON *root;
    int scheduler; /* the file's scheduler.type when it is one of DeepSpeed's, else -1 */
    const char *scheduler_name;
};

enum kind { K_UNKNOWN, K_SETTING, K_IGNORED, K_OBJECT, K_ARRAY };

static int is_auto(const cJSON *c)
{
    return cJSON_IsString(c) && strcmp(c->valuestring, "auto") == 0;
}

/* The JSON paths loom knows, one at a time: every row's path(s), then the ignored keys. */
static const char *known_path(int k)
{
    if (k < 2 * loom_nsettings) return k % 2 ? loom_settings[k / 2].json_alt : loom_settings[k / 2].json;
    k -= 2 * loom_nsettings;
    return k < (int)(sizeof ignored_keys / sizeof ignored_keys[0]) ? ignored_keys[k].path : NULL;
}
#define NKNOWN (2 * loom_nsettings + (int)(sizeof ignored_keys / sizeof ignored_keys[0]))

/* What `path` is: a setting, an ignored key, an object or array holding
 * known keys (*n: an array's length), or unknown. */
static enum kind classify(const char *path, int *n)
{
    size_t len = strlen(path);
    int object = 0;
    *n = 0;
    for (int k = 0; k < NKNOWN; k++) {
        const char *q = known_path(k);
        if (!q || strncmp(q, path, len) != 0) continue;
        if (q[len] == 0) return k < 2 * loom_nsettings ? K_SETTING : K_IGNORED;
        if (q[len] == '.') object = 1;
        if (q[len] == '[') (*n)++;
    }
    return *n ? K_ARRAY : object ? K_OBJECT : K_UNKNOWN;
}

static const char *ignored_reason(const char *path)
{
    for (size_t i = 0; i < sizeof ignored_keys / sizeof ignored_keys[0]; i++)
        if (strcmp(ignored_keys[i].path, path) == 0) return ignored_keys[i].why;
    return "";
}

/* The known key in object `parent` ("" at the top) nearest to `name`. */
static void nearest_key(const char *parent, const char *name, char *out, size_t n)
{
    size_t plen = strlen(parent);
    int best = 1 << 30;
    out[0] = 0;
    for (int k = 0; k < NKNOWN; k++) {
        const char *q = known_path(k);
        if (!q) continue;
        if (plen) {
            if (strncmp(q, parent, plen) != 0 || q[plen] != '.') continue;
            q += plen + 1;
        }
        char comp[128];
        snprintf(comp, sizeof comp, "%.*s", (int)strcspn(q, ".["), q);
        int d = loom_edit_distance(name, comp);
        if (d < best) {
            best = d;
            snprintf(out, n, "%s%s%s", parent, plen ? "." : "", comp);
        }
    }
}

/* A JSON value in a message: 4, 'two', true, null, an object, an array. */
/* Control characters (a "\n" inside a JSON string) shown as '?', so a
 * message about the file stays one line. */
static char *printable(char *s)
{
    for (char *p = s; *p; p++)
        if ((unsigned char)*p < 0x20 || *p == 0x7f) *p = '?';
    return s;
}

static const char *describe(const cJSON *c, char *buf, size_t n)
{
    if (cJSON_IsNumber(c))
        snprintf(buf, n, "%.15g", c->valuedouble);
    else if (cJSON_IsString(c)) {
        snprintf(buf, n, "'%.60s'", c->valuestring);
        printable(buf);
    } else if (cJSON_IsBool(c))
        snprintf(buf, n, "%s", cJSON_IsTrue(c) ? "true" : "false");
    else if (cJSON_IsNull(c))
        snprintf(buf, n, "null");
    else if (cJSON_IsArray(c))
        snprintf(buf, n, "an array of %d", cJSON_GetArraySize(c));
    else
        snprintf(buf, n, "an object");
    return buf;
}

static int check_object(struct reader *r, const cJSON *obj, const char *parent)
{
    char d[96];
    for (const cJSON *c = obj->child; c; c = c->next) {
        char path[256];
        snprintf(path, sizeof path, "%s%s%s", parent, *parent ? "." : "", c->string);
        printable(path);
        int n, rc;
        switch (classify(path, &n)) {
        case K_SETTING: /* its value is checked where it is applied */
            break;
        case K_IGNORED:
            loom_config_warn(r->cfg, "%s: %s is accepted, not used: %s", r->file, path, ignored_reason(path));
            break;
        case K_ARRAY:
            if (!is_auto(c) && !(cJSON_IsArray(c) && cJSON_GetArraySize(c) == n))
                return loom_error_set(LOOM_ERR_INPUT, "%s: %s: expected an array of %d numbers, got %s",
                                      r->file, path, n, describe(c, d, sizeof d));
            break;
        case K_OBJECT:
            if (is_auto(c) || (strcmp(path, "zero_optimization") == 0 && cJSON_IsBool(c))) break;
            if (!cJSON_IsObject(c))
                return loom_error_set(LOOM_ERR_INPUT, "%s: %s: expected an object, got %s", r->file, path,
                                      describe(c, d, sizeof d));
            if ((rc = check_object(r, c, path))) return rc;
            break;
        case K_UNKNOWN: {
            if (r->cfg->rec.nwarnings ==
                LOOM_CONFIG_MAX_WARNINGS) { /* only counted: no nearest key to seek */
                loom_config_warn(r->cfg, "%s", "");
                break;
            }
            char near[256];
            nearest_key(parent, c->string, near, sizeof near);
            loom_config_warn(r->cfg, "%s: unknown key %s (nearest known key: %s); ignored", r->file, path,
                             near);
            break;
        }
        }
    }
    return LOOM_OK;
}

/* The node at `path` ("a.b", "a.b[1]"), or NULL when absent or "auto" on the way. */
static const cJSON *lookup(const cJSON *root, const char *path)
{
    const cJSON *node = root;
    const char *p = path;
    while (*p) {
        char comp[128];
        size_t len = strcspn(p, ".[");
        snprintf(comp, sizeof comp, "%.*s", (int)len, p);
        if (!cJSON_IsObject(node) || !(node = cJSON_GetObjectItemCaseSensitive(node, comp))) return NULL;
        p += len;
        if (*p == '[') {
            if (!cJSON_IsArray(node)) return NULL;
            node = cJSON_GetArrayItem(node, atoi(p + 1));
            p = strchr(p, ']') + 1;
        }
        if (!node || is_auto(node)) return NULL;
        if (*p == '.') p++;
    }
    return node;
}

/* A setting's bound in the JSON's units, for messages. */
static double json_units(const struct setting *s, double bound)
{
    if (s->conv == J_ELEMENTS_MB) return bound * 1e6 / 4;
    if (s->conv == J_POW2) return floor(log2(bound));
    return bound;
}

static int bad(const struct reader *r, const char *path, const char *expected, const cJSON *c)
{
    char d[96];
    return loom_error_set(LOOM_ERR_INPUT, "%s: %s: expected %s, got %s", r->file, path, expected,
                          describe(c, d, sizeof d));
}

static int apply_value(const struct reader *r, struct loom_config *cfg, const struct setting *s,
                       const cJSON *c, const char *path)
{
    char *p = (char *)cfg + s->offset, range[96];
    snprintf(range, sizeof range, "%.15g-%.15g", json_units(s, s->min), json_units(s, s->max));
    switch (s->type) {
    case T_BOOL:
        if (!cJSON_IsBool(c)) return bad(r, path, "true or false", c);
        *(int *)p = s->conv == J_NOT ? !cJSON_IsTrue(c) : cJSON_IsTrue(c);
        return LOOM_OK;
    case T_INT:
    case T_INT64: {
        if (!cJSON_IsNumber(c) || c->valuedouble != floor(c->valuedouble))
            return bad(r, path, "an integer", c);
        double x = c->valuedouble;
        if (x < s->min || x > s->max) return bad(r, path, range, c);
        if (s->type == T_INT)
            *(int *)p = (int)x;
        else
            *(int64_t *)p = (int64_t)x;
        return LOOM_OK;
    }
    case T_DOUBLE: {
        if (!cJSON_IsNumber(c)) return bad(r, path, "a number", c);
        double x = c->valuedouble;
        if (s->conv == J_ELEMENTS_MB) x = x * 4 / 1e6;
        if (s->conv == J_POW2) {
            if (x != floor(x) || fabs(x) > 1024) return bad(r, path, range, c);
            x = ldexp(1.0, (int)x);
        }
        if (!(x >= s->min && x <= s->max)) return bad(r, path, range, c);
        *(double *)p = x;
        return LOOM_OK;
    }
    case T_STRING:
    case T_PRESET:
        if (s->conv == J_INT_LIST) {
            size_t k = 0;
            *p = 0;
            if (cJSON_IsNull(c)) return LOOM_OK;
            if (!cJSON_IsArray(c)) return bad(r, path, "an array of integers", c);
            for (const cJSON *e = c->child; e; e = e->next) {
                if (!cJSON_IsNumber(e) || e->valuedouble != floor(e->valuedouble) ||
                    fabs(e->valuedouble) > 1e9)
                    return bad(r, path, "an array of integers", e);
                k += (size_t)snprintf(p + k, k < s->size ? s->size - k : 0, "%s%.0f", k ? "," : "",
                                      e->valuedouble);
                if (k >= s->size)
                    return loom_error_set(LOOM_ERR_INPUT, "%s: %s: more entries than fit", r->file, path);
            }
            return LOOM_OK;
        }
        if (s->conv == J_INT_TEXT && cJSON_IsNumber(c)) {
            if (c->valuedouble != floor(c->valuedouble) || fabs(c->valuedouble) > 1e9)
                return bad(r, path, "an integer or a string", c);
            snprintf(p, s->size, "%.0f", c->valuedouble);
            return LOOM_OK;
        }
        if (!cJSON_IsString(c))
            return bad(r, path, s->conv == J_INT_TEXT ? "an integer or a string" : "a string", c);
        if (strlen(c->valuestring) >= s->size)
            return loom_error_set(LOOM_ERR_INPUT, "%s: %s: longer than %zu characters", r->file, path,
                                  s->size - 1);
        strcpy(p, c->valuestring);
        return LOOM_OK;
    case T_ENUM: {
        char expected[160] = "one of ";
        for (int i = 0; s->choices[i]; i++) {
            if (cJSON_IsString(c) && strcasecmp(s->choices[i], c->valuestring) == 0) {
                *(int *)p = i;
                return LOOM_OK;
            }
            size_t l = strlen(expected);
            snprintf(expected + l, sizeof expected - l, "%s%s", i ? ", " : "", s->choices[i]);
        }
        return bad(r, path, expected, c);
    }
    case T_PATHS: {
        int many = cJSON_IsArray(c);
        if (!cJSON_IsString(c) && !many) return bad(r, path, "a path or an array of paths", c);
        for (const cJSON *e = many ? c->child : c; e; e = many ? e->next : NULL)
            if (!cJSON_IsString(e)) return bad(r, path, "a path or an array of paths", e);
        loom_setting_clear_paths(cfg, s);
        for (const cJSON *e = many ? c->child : c; e; e = many ? e->next : NULL) {
            int rc = loom_setting_add_path(cfg, s, e->valuestring);
            if (rc) return rc;
        }
        return LOOM_OK;
    }
    default:
        LOOM_ASSERT(0);
    }
    return LOOM_OK;
}

/* Whether a scheduler.params key belongs to the file's scheduler; says so once when not. */
static int scheduler_takes(struct reader *r, const char *path)
{
    if (r->scheduler < 0) return 1;
    for (size_t i = 0; i < sizeof scheduler_params / sizeof scheduler_params[0]; i++)
        if (strcmp(scheduler_params[i].path, path) == 0 &&
            !(scheduler_params[i].styles & (1u << r->scheduler))) {
            loom_config_warn(r->cfg, "%s: %s is not a parameter of %s (DeepSpeed would reject it); ignored",
                             r->file, path, r->scheduler_name);
            return 0;
        }
    return 1;
}

static int apply_settings(struct reader *r)
{
    struct loom_config *cfg = r->cfg;
    int rc;
    for (int i = 0; i < loom_nsettings; i++) {
        const struct setting *s = &loom_settings[i];
        const char *paths[2] = {s->json, s->json_alt};
        const char *first = NULL;
        char first_value[128] = "", value[128];
        for (int k = 0; k < 2; k++) {
            const cJSON *c = paths[k] ? lookup(r->root, paths[k]) : NULL;
            if (!c || !scheduler_takes(r, paths[k])) continue;
            if ((rc = apply_value(r, cfg, s, c, paths[k]))) return rc;
            loom_setting_format(value, sizeof value, cfg, s);
            if (first && strcmp(value, first_value) != 0)
                loom_config_warn(cfg, "%s: %s %s and %s %s differ; %s is used, as in DeepSpeed", r->file,
                                 first, first_value, paths[k], value, paths[k]);
            first = paths[k];
            memcpy(first_value, value, sizeof value);
            loom_setting_from_json(cfg, i, paths[k]);
        }
    }
    /* DeepSpeed's old spelling: "zero_optimization": true is stage 1 */
    const cJSON *z = cJSON_GetObjectItemCaseSensitive(r->root, "zero_optimization");
    if (cJSON_IsBool(z)) {
        cfg->zero_stage = cJSON_IsTrue(z);
        loom_setting_from_json(cfg, loom_setting_index(offsetof(struct loom_config, zero_stage)),
                               "zero_optimization");
        loom_config_warn(cfg, "%s: zero_optimization: %s is DeepSpeed's old spelling of {\"stage\": %d}",
                         r->file, cJSON_IsTrue(z) ? "true" : "false", cJSON_IsTrue(z));
    }
    return LOOM_OK;
}

/* The file's scheduler.type, when it names one of DeepSpeed's schedulers. */
static void find_scheduler(struct reader *r)
{
    r->scheduler = -1;
    const struct setting *s =
        &loom_settings[loom_setting_index(offsetof(struct loom_config, lr_decay_style))];
    const cJSON *t = lookup(r->root, s->json);
    if (!cJSON_IsString(t)) return;
    for (int k = 0; s->choices[k]; k++)
        if (strcasecmp(s->choices[k], t->valuestring) == 0 &&
            (k == LOOM_LR_WARMUP_LR || k == LOOM_LR_WARMUP_DECAY_LR || k == LOOM_LR_WARMUP_COSINE_LR)) {
            r->scheduler = k;
            r->scheduler_name = s->choices[k];
        }
}

static int read_file(const char *file, char **text, size_t *n)
{
    struct stat st;
    int fd, rc = loom_fs_open_input(file, "--deepspeed-config", &fd, &st); /* a FIFO: refused */
    *text = NULL;
    if (rc) return rc;
    if (st.st_size > (16 << 20)) {
        rc = loom_error_set(LOOM_ERR_INPUT,
                            "--deepspeed-config %s: %lld bytes is too large for a config (16 MB at most)",
                            file, (long long)st.st_size);
        goto fail;
    }
    *text = malloc((size_t)st.st_size + 1);
    LOOM_ASSERT(*text);
    *n = 0;
    while (*n < (size_t)st.st_size) {
        const ssize_t r = read(fd, *text + *n, (size_t)st.st_size - *n);
        if (r < 0 && errno == EINTR) continue;
        if (r < 0) {
            rc = loom_error_set(LOOM_ERR_INPUT, "--deepspeed-config %s: cannot read: %s", file,
                                strerror(errno));
            goto fail;
        }
        if (r == 0) break; /* shrank: parse what is there */
        *n += (size_t)r;
    }
    (*text)[*n] = 0;
    close(fd);
    return LOOM_OK;
fail:
    free(*text);
    *text = NULL;
    close(fd);
    return rc;
}

struct named {
    const char *name;
    int64_t at; /* the member's place in its object */
};

static int cmp_named(const void *a, const void *b)
{
    const struct named *x = a, *y = b;
    const int c = strcmp(x->name, y->name);
    return c ? c : (x->at > y->at) - (x->at < y->at);
}

/* The place of the first member of object o whose key appears again later
 * in o, or -1: the keys sorted (O(n log n); each pair compared once was
 * O(n^2), 20 s for 80,000 keys). */
static int64_t first_repeated(const cJSON *o)
{
    int64_t n = 0;
    for (const cJSON *c = o->child; c; c = c->next) n++;
    if (n < 2) return -1;
    struct named *v = malloc((size_t)n * sizeof *v);
    LOOM_ASSERT(v);
    int64_t k = 0;
    for (const cJSON *c = o->child; c; c = c->next, k++) v[k] = (struct named){c->string ? c->string : "", k};
    qsort(v, (size_t)n, sizeof *v, cmp_named);
    int64_t first = -1;
    for (int64_t i = 1; i < n; i++)
        if (strcmp(v[i - 1].name, v[i].name) == 0 && (first < 0 || v[i - 1].at < first)) first = v[i - 1].at;
    free(v);
    return first;
}

/* The first key of an object (at any depth) that appears twice in it, as
 * "outer.key", or 0: cJSON keeps both and a lookup takes the first, so a
 * second value would be ignored without a word. Members are visited in
 * order, each object's own repeat before what nests deeper after it. */
static int duplicate_key(const cJSON *o, const char *path, char *out, size_t n)
{
    const int64_t repeated = cJSON_IsObject(o) ? first_repeated(o) : -1;
    int64_t k = 0;
    for (const cJSON *a = o ? o->child : NULL; a; a = a->next, k++) {
        char sub[256];
        snprintf(sub, sizeof sub, "%s%s%s", path, *path ? "." : "", a->string ? a->string : "[]");
        printable(sub);
        if (k == repeated) {
            snprintf(out, n, "%s", sub);
            return 1;
        }
        if ((cJSON_IsObject(a) || cJSON_IsArray(a)) && duplicate_key(a, sub, out, n)) return 1;
    }
    return 0;
}

int loom_config_read_json(struct loom_config *cfg, const char *file)
{
    char *text;
    size_t n = 0;
    int rc = read_file(file, &text, &n);
    if (rc) return rc;
    const char *end = NULL;
    cJSON *root = cJSON_ParseWithLengthOpts(text, n + 1, &end, 1); /* + 1: the terminating NUL */
    if (!root) {
        size_t blank = strspn(text, " \t\r\n");
        if (blank == n) {
            rc = loom_error_set(LOOM_ERR_INPUT, "--deepspeed-config %s: the file is empty, not a JSON object",
                                file);
        } else {
            /* cJSON points at (or just past) the first character it could not take */
            if (!end || end < text || end > text + n) end = text + n;
            int line = 1, col = 1;
            const char *line_start = text;
            for (const char *c = text; c < end; c++, col++)
                if (*c == '\n') line++, col = 0, line_start = c + 1;
            const char *from = end - line_start > 24 ? end - 24 : line_start;
            char near[48];
            snprintf(near, sizeof near, "%.*s", (int)strcspn(from, "\n\r"), from);
            rc = loom_error_set(LOOM_ERR_INPUT,
                                "--deepspeed-config %s: not valid JSON at line %d, column %d (near '%s')",
                                file, line, col, near);
        }
        free(text);
        return rc;
    }
    struct reader r = {cfg, file, root, -1, NULL};
    char d[96];
    if (!cJSON_IsObject(root))
        rc = loom_error_set(LOOM_ERR_INPUT,
                            "--deepspeed-config %s: expected a JSON object at the top level, got %s", file,
                            describe(root, d, sizeof d));
    char dup[256];
    if (rc == LOOM_OK && duplicate_key(root, "", dup, sizeof dup))
        rc = loom_error_set(LOOM_ERR_INPUT, "--deepspeed-config %s: key \"%s\" is given twice", file, dup);
    if (rc == LOOM_OK) find_scheduler(&r);
    if (rc == LOOM_OK) rc = check_object(&r, root, "");
    if (rc == LOOM_OK) rc = apply_settings(&r);
    cJSON_Delete(root);
    free(text);
    return rc;
}
