/*
 * The trainer state of a checkpoint, trainer_state.json: formatting with its
 * self-checksum, verifying the checksum, and a parser that checks the type
 * and range of every field it reads (the file may be damaged or hostile; it
 * is fuzzed by tests/fuzz/fuzz_trainer_state.c). See checkpoint.h.
 */
#include "io/checkpoint.h"

#include <errno.h>
#include <inttypes.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include <cjson/cJSON.h>
#include <xxhash.h>

#include "base/log.h"
#include "base/mem.h"
#include "io/fs.h"
#include "io/sampler.h"

#define FORMAT_NAME "loom-checkpoint"
#define FORMAT_VERSION 1
#define CHECKSUM_PREFIX "{\"checksum\":\""
#define CHECKSUM_DIGITS 16

static const char *const order_names[] = {"shuffled", "sequential"};
_Static_assert(sizeof order_names / sizeof order_names[0] == LOOM_DATA_ORDER_COUNT, "order_names");

/* XXH3-64 of the file with the checksum digits read as zeros. */
static uint64_t state_hash(const char *buf, size_t len)
{
    const size_t at = sizeof CHECKSUM_PREFIX - 1;
    XXH3_state_t *h = XXH3_createState();
    XXH3_64bits_reset(h);
    XXH3_64bits_update(h, buf, at);
    XXH3_64bits_update(h, "0000000000000000", CHECKSUM_DIGITS);
    XXH3_64bits_update(h, buf + at + CHECKSUM_DIGITS, len - at - CHECKSUM_DIGITS);
    uint64_t v = XXH3_64bits_digest(h);
    XXH3_freeState(h);
    return v;
}

char *loom_ckpt_state_format(const struct loom_ckpt_state *st, const char *config_json)
{
    cJSON *o = cJSON_CreateObject();
    char seed[32];
    snprintf(seed, sizeof seed, "%" PRId64, st->seed);
    cJSON_AddStringToObject(o, "format", FORMAT_NAME);
    cJSON_AddNumberToObject(o, "version", FORMAT_VERSION);
    cJSON_AddNumberToObject(o, "iteration", (double)st->iteration);
    cJSON_AddNumberToObject(o, "consumed_samples", (double)st->consumed_samples);
    cJSON_AddNumberToObject(o, "skipped_steps", (double)st->skipped_steps);
    cJSON *opt = cJSON_AddObjectToObject(o, "optimizer");
    cJSON_AddStringToObject(opt, "type", "AdamW");
    cJSON_AddNumberToObject(opt, "step", (double)st->optimizer_step);
    /* every random choice loom makes derives from the seed and the step */
    cJSON *rng = cJSON_AddObjectToObject(o, "rng");
    cJSON_AddStringToObject(rng, "seed", seed);
    cJSON *data = cJSON_AddObjectToObject(o, "data");
    cJSON_AddStringToObject(data, "order", order_names[st->data_order]);
    cJSON_AddNumberToObject(data, "global_batch_size", (double)st->global_batch_size);
    cJSON_AddNumberToObject(data, "next_step", (double)st->iteration + 1);
    if (st->has_loss_scaler) {
        cJSON *ls = cJSON_AddObjectToObject(o, "loss_scaler");
        char scale[40]; /* exactly: cJSON's printing may round */
        loom_real_text(st->loss_scale, scale, sizeof scale);
        cJSON_AddRawToObject(ls, "scale", scale);
        cJSON_AddNumberToObject(ls, "good_steps", (double)st->loss_scale_good_steps);
        cJSON_AddNumberToObject(ls, "hysteresis", (double)st->loss_scale_hysteresis);
    } else {
        cJSON_AddNullToObject(o, "loss_scaler");
    }
    cJSON *model = cJSON_AddObjectToObject(o, "model");
    cJSON_AddStringToObject(model, "type", st->model.type);
    for (int i = 0; i < st->model.n; i++) {
        const struct loom_shape_setting *kv = &st->model.kv[i];
        if (kv->kind == LOOM_SHAPE_WORD) {
            cJSON_AddStringToObject(model, kv->key, kv->word);
        } else if (kv->kind == LOOM_SHAPE_INT) {
            cJSON_AddNumberToObject(model, kv->key, (double)kv->value);
        } else { /* the shortest text that reads back to the same double (cJSON's printing may round) */
            char text[40];
            loom_model_shape_text(kv, text, sizeof text);
            cJSON_AddRawToObject(model, kv->key, text);
        }
    }
    cJSON *layout = cJSON_AddObjectToObject(o, "layout");
    cJSON_AddNumberToObject(layout, "world_size", st->world_size);
    cJSON_AddNumberToObject(layout, "data_parallel_size", st->dp);
    cJSON_AddNumberToObject(layout, "tensor_model_parallel_size", st->tp);
    cJSON_AddNumberToObject(layout, "pipeline_model_parallel_size", st->pp);
    cJSON_AddNumberToObject(layout, "zero_stage", st->zero_stage);
    if (st->run[0]) cJSON_AddStringToObject(o, "run", st->run);
    if (st->tokenizer == LOOM_CKPT_TOKENIZER_NONE) {
        cJSON_AddNullToObject(o, "tokenizer");
    } else if (st->tokenizer == LOOM_CKPT_TOKENIZER_SAVED) {
        char sum[CHECKSUM_DIGITS + 1];
        snprintf(sum, sizeof sum, "%016" PRIx64, st->tokenizer_xxh3);
        cJSON *t = cJSON_AddObjectToObject(o, "tokenizer");
        cJSON_AddStringToObject(
            t, "name", st->tokenizer_is_model ? LOOM_CKPT_TOKENIZER_MODEL : LOOM_CKPT_TOKENIZER_FILE);
        cJSON_AddNumberToObject(t, "bytes", (double)st->tokenizer_bytes);
        cJSON_AddStringToObject(t, "xxh3", sum);
    }
    cJSON *files = cJSON_AddArrayToObject(o, "files");
    for (int i = 0; i < st->nfiles; i++) {
        if (st->files[i].bytes < 0) { /* as a state without sizes lists it */
            cJSON_AddItemToArray(files, cJSON_CreateString(st->files[i].name));
            continue;
        }
        cJSON *f = cJSON_CreateObject();
        cJSON_AddStringToObject(f, "name", st->files[i].name);
        cJSON_AddNumberToObject(f, "bytes", (double)st->files[i].bytes);
        cJSON_AddItemToArray(files, f);
    }
    if (config_json) {
        cJSON *cfg = cJSON_Parse(config_json);
        if (cfg) cJSON_AddItemToObject(o, "config", cfg);
    }
    char *body = cJSON_Print(o);
    cJSON_Delete(o);
    if (!body) return NULL;
    /* {"checksum":"<16 digits>", then the body without its opening brace */
    size_t blen = strlen(body);
    size_t len = sizeof CHECKSUM_PREFIX - 1 + CHECKSUM_DIGITS + 3 + (blen - 1) + 1;
    char *out = loom_alloc(len + 1, LOOM_MEM_OTHER);
    snprintf(out, len + 1, "%s%s\",\n%s\n", CHECKSUM_PREFIX, "0000000000000000",
             body + 1 + (body[1] == '\n'));
    len = strlen(out);
    char digits[CHECKSUM_DIGITS + 1];
    snprintf(digits, sizeof digits, "%016" PRIx64, state_hash(out, len));
    memcpy(out + sizeof CHECKSUM_PREFIX - 1, digits, CHECKSUM_DIGITS);
    cJSON_free(body);
    return out;
}

int loom_ckpt_state_verify(const char *buf, size_t len, const char *path)
{
    const size_t at = sizeof CHECKSUM_PREFIX - 1;
    if (len < at + CHECKSUM_DIGITS + 2 || memcmp(buf, CHECKSUM_PREFIX, at) != 0)
        return loom_error_set(LOOM_ERR_INPUT,
                              "%s: does not start with its checksum: not a loom trainer state", path);
    char digits[CHECKSUM_DIGITS + 1];
    memcpy(digits, buf + at, CHECKSUM_DIGITS);
    digits[CHECKSUM_DIGITS] = 0;
    for (int i = 0; i < CHECKSUM_DIGITS; i++)
        if (!strchr("0123456789abcdef", digits[i]) || !digits[i])
            return loom_error_set(LOOM_ERR_INPUT,
                                  "%s: its checksum is not 16 hex digits: the file is damaged", path);
    uint64_t stored = strtoull(digits, NULL, 16), computed = state_hash(buf, len);
    if (stored != computed)
        return loom_error_set(LOOM_ERR_INPUT,
                              "%s: fails its checksum (stored %s, computed %016" PRIx64
                              "): the file is damaged",
                              path, digits, computed);
    return LOOM_OK;
}

/* ---- parsing ------------------------------------------------------------ */

static const cJSON *member(const cJSON *o, const char *key)
{
    return cJSON_GetObjectItemCaseSensitive(o, key);
}

/* v, the member `key` of the object at `path`, as an integer in [lo, hi]. */
static int int_of(const cJSON *v, const char *path, const char *key, int64_t lo, int64_t hi, int64_t *out)
{
    if (!cJSON_IsNumber(v) || !(v->valuedouble >= (double)lo && v->valuedouble <= (double)hi) ||
        v->valuedouble != (double)(int64_t)v->valuedouble)
        return loom_error_set(LOOM_ERR_INPUT, "%s%s: expected an integer in [%" PRId64 ", %" PRId64 "]", path,
                              key, lo, hi);
    *out = (int64_t)v->valuedouble;
    return LOOM_OK;
}

static int get_int(const cJSON *o, const char *path, const char *key, int64_t lo, int64_t hi, int64_t *out)
{
    return int_of(member(o, key), path, key, lo, hi, out);
}

static int get_int32(const cJSON *o, const char *path, const char *key, int lo, int hi, int *out)
{
    int64_t v = 0;
    int rc = get_int(o, path, key, lo, hi, &v);
    if (rc == LOOM_OK) *out = (int)v;
    return rc;
}

static const cJSON *get_object(const cJSON *o, const char *key, int *rc)
{
    const cJSON *v = member(o, key);
    if (!cJSON_IsObject(v) && *rc == LOOM_OK)
        *rc = loom_error_set(LOOM_ERR_INPUT, "%s: expected an object", key);
    return cJSON_IsObject(v) ? v : NULL;
}

static int printable(const char *s)
{
    for (; *s; s++)
        if ((unsigned char)*s < 0x20 || (unsigned char)*s > 0x7e) return 0;
    return 1;
}

/* A plain file name: no directory part, no "..", not hidden, printable. */
static int safe_file_name(const char *s)
{
    size_t n = strlen(s);
    if (n == 0 || n >= sizeof(((struct loom_ckpt_file *)0)->name) || s[0] == '.') return 0;
    for (size_t i = 0; i < n; i++)
        if (s[i] == '/' || s[i] == '\\' || (unsigned char)s[i] < 0x20 || (unsigned char)s[i] > 0x7e) return 0;
    return 1;
}

/* "model": {"type": NAME, KEY: VALUE, ...}: the type, then the family's
 * shape settings in the file's order (unique keys, at most
 * LOOM_MODEL_SHAPE_MAX): an integer within LOOM_CKPT_INT_MAX, another finite
 * number, or a word; which keys a family needs is the family's to check. */
static int parse_model(const cJSON *model, struct loom_model_shape *out)
{
    const cJSON *type = member(model, "type");
    if (!cJSON_IsString(type) || !*type->valuestring || strlen(type->valuestring) >= sizeof out->type ||
        !printable(type->valuestring))
        return loom_error_set(LOOM_ERR_INPUT, "model.type: expected a model name");
    snprintf(out->type, sizeof out->type, "%s", type->valuestring);
    const int64_t big = LOOM_CKPT_INT_MAX;
    const cJSON *v;
    cJSON_ArrayForEach(v, model)
    {
        if (v == type) continue;
        const char *key = v->string;
        if (!key || !*key || strlen(key) >= sizeof out->kv[0].key || !printable(key))
            return loom_error_set(LOOM_ERR_INPUT, "model: a key is empty, too long or not printable");
        if (strcmp(key, "type") == 0) return loom_error_set(LOOM_ERR_INPUT, "model.type: given twice");
        for (int i = 0; i < out->n; i++)
            if (strcmp(out->kv[i].key, key) == 0)
                return loom_error_set(LOOM_ERR_INPUT, "model.%s: given twice", key);
        if (out->n == LOOM_MODEL_SHAPE_MAX)
            return loom_error_set(LOOM_ERR_INPUT, "model: more than %d shape settings", LOOM_MODEL_SHAPE_MAX);
        struct loom_shape_setting *kv = &out->kv[out->n];
        memset(kv, 0, sizeof *kv);
        if (cJSON_IsString(v)) {
            if (!loom_model_shape_parse(kv, v->valuestring) || kv->kind != LOOM_SHAPE_WORD)
                return loom_error_set(LOOM_ERR_INPUT, "model.%s: expected a number or a word", key);
        } else if (cJSON_IsNumber(v) && isfinite(v->valuedouble) && v->valuedouble != floor(v->valuedouble)) {
            kv->kind = LOOM_SHAPE_REAL;
            kv->real = v->valuedouble;
        } else {
            int rc = int_of(v, "model.", key, -big, big, &kv->value);
            if (rc) return rc;
            kv->kind = LOOM_SHAPE_INT;
            kv->real = (double)kv->value;
        }
        snprintf(kv->key, sizeof kv->key, "%s", key);
        out->n++;
    }
    return LOOM_OK;
}

/* "tokenizer": absent (a state before the record), null, or
 * {"name": "tokenizer.json", "bytes": N, "xxh3": "<16 hex>"}. */
static int parse_tokenizer(const cJSON *t, struct loom_ckpt_state *st)
{
    st->tokenizer = !t ? LOOM_CKPT_TOKENIZER_UNRECORDED : LOOM_CKPT_TOKENIZER_NONE;
    if (!t || cJSON_IsNull(t)) return LOOM_OK;
    const cJSON *name = cJSON_IsObject(t) ? member(t, "name") : NULL, *sum = member(t, "xxh3");
    if (!cJSON_IsString(name) || (strcmp(name->valuestring, LOOM_CKPT_TOKENIZER_FILE) != 0 &&
                                  strcmp(name->valuestring, LOOM_CKPT_TOKENIZER_MODEL) != 0))
        return loom_error_set(LOOM_ERR_INPUT, "tokenizer: expected null or {\"name\": \"%s\" or \"%s\", ...}",
                              LOOM_CKPT_TOKENIZER_FILE, LOOM_CKPT_TOKENIZER_MODEL);
    st->tokenizer_is_model = strcmp(name->valuestring, LOOM_CKPT_TOKENIZER_MODEL) == 0;
    int rc =
        get_int(t, "tokenizer.", "bytes", 0, (int64_t)LOOM_CKPT_TOKENIZER_MAX_BYTES, &st->tokenizer_bytes);
    if (rc) return rc;
    int hex = cJSON_IsString(sum) && strlen(sum->valuestring) == CHECKSUM_DIGITS;
    for (int i = 0; hex && i < CHECKSUM_DIGITS; i++)
        hex = strchr("0123456789abcdef", sum->valuestring[i]) != NULL;
    if (!hex)
        return loom_error_set(LOOM_ERR_INPUT, "tokenizer.xxh3: expected %d lowercase hex digits",
                              CHECKSUM_DIGITS);
    st->tokenizer_xxh3 = strtoull(sum->valuestring, NULL, 16);
    st->tokenizer = LOOM_CKPT_TOKENIZER_SAVED;
    return LOOM_OK;
}

int loom_ckpt_state_parse(const char *buf, size_t len, struct loom_ckpt_state *st)
{
    memset(st, 0, sizeof *st);
    cJSON *root = cJSON_ParseWithLength(buf, len);
    int rc = LOOM_OK;
    if (!cJSON_IsObject(root)) {
        rc = loom_error_set(LOOM_ERR_INPUT, "not a JSON object");
        goto done;
    }
    const cJSON *fmt = member(root, "format");
    int64_t version = 0;
    if (!cJSON_IsString(fmt) || strcmp(fmt->valuestring, FORMAT_NAME) != 0) {
        rc = loom_error_set(LOOM_ERR_INPUT, "format: expected \"%s\"", FORMAT_NAME);
        goto done;
    }
    if ((rc = get_int(root, "", "version", 1, 1000000, &version))) goto done;
    if (version != FORMAT_VERSION) {
        rc = loom_error_set(LOOM_ERR_INPUT, "version %" PRId64 " is not one this loom reads (%d)", version,
                            FORMAT_VERSION);
        goto done;
    }
    const int64_t big = LOOM_CKPT_INT_MAX;
    if ((rc = get_int(root, "", "iteration", 0, big, &st->iteration)) ||
        (rc = get_int(root, "", "consumed_samples", 0, big, &st->consumed_samples)))
        goto done;
    const cJSON *opt = get_object(root, "optimizer", &rc), *rng = get_object(root, "rng", &rc);
    const cJSON *data = get_object(root, "data", &rc), *model = get_object(root, "model", &rc);
    const cJSON *layout = get_object(root, "layout", &rc);
    if (rc) goto done;
    if ((rc = get_int(opt, "optimizer.", "step", 0, st->iteration < INT32_MAX ? st->iteration : INT32_MAX,
                      &st->optimizer_step)))
        goto done;
    if (member(root, "skipped_steps") &&
        (rc = get_int(root, "", "skipped_steps", 0, st->iteration, &st->skipped_steps)))
        goto done;
    const cJSON *seed = member(rng, "seed");
    char *end;
    if (!cJSON_IsString(seed) || !*seed->valuestring ||
        (st->seed = strtoll(seed->valuestring, &end, 10), *end) || st->seed < 0) {
        rc = loom_error_set(LOOM_ERR_INPUT, "rng.seed: expected a non-negative integer as a string");
        goto done;
    }
    const cJSON *order = member(data, "order");
    st->data_order = -1;
    for (int i = 0; cJSON_IsString(order) && i < LOOM_DATA_ORDER_COUNT; i++)
        if (strcmp(order->valuestring, order_names[i]) == 0) st->data_order = i;
    if (st->data_order < 0) {
        rc = loom_error_set(LOOM_ERR_INPUT, "data.order: expected \"shuffled\" or \"sequential\"");
        goto done;
    }
    if ((rc = get_int(data, "data.", "global_batch_size", 1, 1 << 30, &st->global_batch_size))) goto done;
    const cJSON *ls = member(root, "loss_scaler");
    if (cJSON_IsObject(ls)) {
        const cJSON *scale = member(ls, "scale");
        if (!cJSON_IsNumber(scale) || !(scale->valuedouble > 0 && scale->valuedouble < 1e300)) {
            rc = loom_error_set(LOOM_ERR_INPUT, "loss_scaler.scale: expected a positive number");
            goto done;
        }
        st->has_loss_scaler = 1;
        st->loss_scale = scale->valuedouble;
        if ((rc = get_int(ls, "loss_scaler.", "good_steps", 0, big, &st->loss_scale_good_steps)) ||
            (rc = get_int(ls, "loss_scaler.", "hysteresis", 1, INT32_MAX, &st->loss_scale_hysteresis)))
            goto done;
    } else if (ls && !cJSON_IsNull(ls)) {
        rc = loom_error_set(LOOM_ERR_INPUT, "loss_scaler: expected an object or null");
        goto done;
    }
    if ((rc = parse_model(model, &st->model))) goto done;
    if ((rc = get_int32(layout, "layout.", "world_size", 1, 1 << 24, &st->world_size)) ||
        (rc = get_int32(layout, "layout.", "data_parallel_size", 1, 1 << 24, &st->dp)) ||
        (rc = get_int32(layout, "layout.", "tensor_model_parallel_size", 1, 1 << 24, &st->tp)) ||
        (rc = get_int32(layout, "layout.", "pipeline_model_parallel_size", 1, 1 << 24, &st->pp)) ||
        (rc = get_int32(layout, "layout.", "zero_stage", 0, 3, &st->zero_stage)))
        goto done;
    const cJSON *run = member(root, "run");
    if (run) {
        size_t k = cJSON_IsString(run) ? strlen(run->valuestring) : 0;
        int hex = k == LOOM_CKPT_RUN_LEN;
        for (size_t i = 0; hex && i < k; i++) hex = strchr("0123456789abcdef", run->valuestring[i]) != NULL;
        if (!hex) {
            rc = loom_error_set(LOOM_ERR_INPUT, "run: expected %d lowercase hex digits", LOOM_CKPT_RUN_LEN);
            goto done;
        }
        snprintf(st->run, sizeof st->run, "%s", run->valuestring);
    }
    if ((rc = parse_tokenizer(member(root, "tokenizer"), st))) goto done;
    const cJSON *files = member(root, "files");
    int n = cJSON_GetArraySize(files);
    if (!cJSON_IsArray(files) || n < 1 || n > LOOM_CKPT_MAX_FILES) {
        rc = loom_error_set(LOOM_ERR_INPUT, "files: expected an array of 1 to %d file names",
                            LOOM_CKPT_MAX_FILES);
        goto done;
    }
    st->files = loom_alloc(loom_mul_size((size_t)n, sizeof *st->files), LOOM_MEM_OTHER);
    const cJSON *f;
    cJSON_ArrayForEach(f, files)
    {
        /* a name, or {"name": ..., "bytes": ...} */
        const cJSON *name = cJSON_IsObject(f) ? member(f, "name") : f;
        int64_t bytes = -1;
        char field[32];
        snprintf(field, sizeof field, "files[%d].", st->nfiles);
        if (!cJSON_IsString(name) || !safe_file_name(name->valuestring)) {
            rc = loom_error_set(LOOM_ERR_INPUT, "files[%d]: expected a plain file name", st->nfiles);
            goto done;
        }
        if (cJSON_IsObject(f) && (rc = get_int(f, field, "bytes", 0, big, &bytes))) goto done;
        for (int k = 0; k < st->nfiles; k++)
            if (strcmp(st->files[k].name, name->valuestring) == 0) {
                rc = loom_error_set(LOOM_ERR_INPUT, "files[%d]: %s is listed twice", st->nfiles,
                                    name->valuestring);
                goto done;
            }
        snprintf(st->files[st->nfiles].name, sizeof st->files[0].name, "%s", name->valuestring);
        st->files[st->nfiles++].bytes = bytes;
    }
    if (st->nfiles != st->world_size) /* one file a rank of the layout that wrote it */
        rc = loom_error_set(LOOM_ERR_INPUT, "files: %d listed, for a layout of %d ranks", st->nfiles,
                            st->world_size);
done:
    cJSON_Delete(root);
    if (rc) loom_ckpt_state_free(st);
    return rc;
}

struct file_id {
    uint64_t dev, ino;
    int index;
};

static int cmp_file_id(const void *a, const void *b)
{
    const struct file_id *x = a, *y = b;
    if (x->dev != y->dev) return x->dev < y->dev ? -1 : 1;
    if (x->ino != y->ino) return x->ino < y->ino ? -1 : 1;
    return x->index - y->index;
}

/* dir is what st describes: its name's iteration (iter_N), its files'
 * sizes, each file distinct. */
static int check_dir(const char *dir, const struct loom_ckpt_state *st)
{
    const char *base = strrchr(dir, '/');
    base = base ? base + 1 : dir;
    char *end;
    if (strncmp(base, "iter_", 5) == 0) {
        long long it = strtoll(base + 5, &end, 10);
        if (!*end && end != base + 5 && it != st->iteration)
            return loom_error_set(LOOM_ERR_INPUT, "%s: its trainer state is of iteration %lld, not %lld", dir,
                                  (long long)st->iteration, it);
    }
    /* each file its own: links to one file listed under many names would
     * map it again and again (a state is not trusted to be honest) */
    struct file_id *ids = loom_alloc(loom_mul_size((size_t)st->nfiles + 1, sizeof *ids), LOOM_MEM_OTHER);
    int rc = LOOM_OK;
    for (int i = 0; rc == LOOM_OK && i < st->nfiles; i++) {
        char path[4300];
        struct stat sb;
        snprintf(path, sizeof path, "%s/%s", dir, st->files[i].name);
        if (stat(path, &sb) != 0)
            rc = loom_error_set(LOOM_ERR_INPUT, "%s: %s", path, strerror(errno));
        else if (st->files[i].bytes >= 0 && (int64_t)sb.st_size != st->files[i].bytes)
            rc = loom_error_set(LOOM_ERR_INPUT, "%s: %lld bytes, the trainer state records %lld", path,
                                (long long)sb.st_size, (long long)st->files[i].bytes);
        ids[i] = (struct file_id){(uint64_t)sb.st_dev, (uint64_t)sb.st_ino, i};
    }
    if (rc == LOOM_OK) {
        qsort(ids, (size_t)st->nfiles, sizeof *ids, cmp_file_id);
        for (int i = 1; rc == LOOM_OK && i < st->nfiles; i++)
            if (ids[i].dev == ids[i - 1].dev && ids[i].ino == ids[i - 1].ino)
                rc = loom_error_set(LOOM_ERR_INPUT, "%s: %s and %s are one file (links)", dir,
                                    st->files[ids[i - 1].index].name, st->files[ids[i].index].name);
    }
    loom_free(ids);
    return rc;
}

int loom_ckpt_state_read(const char *dir, struct loom_ckpt_state *st)
{
    memset(st, 0, sizeof *st);
    char path[4200], *buf;
    size_t len;
    snprintf(path, sizeof path, "%s/%s", dir, LOOM_CKPT_STATE_FILE);
    int rc = loom_fs_read_small(path, LOOM_CKPT_STATE_MAX_BYTES, &buf, &len);
    if (rc) return rc;
    if ((rc = loom_ckpt_state_verify(buf, len, path)) == LOOM_OK &&
        (rc = loom_ckpt_state_parse(buf, len, st))) {
        char why[512];
        snprintf(why, sizeof why, "%s", loom_error_message());
        rc = loom_error_set(LOOM_ERR_INPUT, "%s: %s", path, why);
    }
    loom_free(buf);
    if (rc == LOOM_OK) rc = check_dir(dir, st);
    if (rc) loom_ckpt_state_free(st);
    return rc;
}

void loom_ckpt_state_free(struct loom_ckpt_state *st)
{
    loom_free(st->files);
    st->files = NULL;
    st->nfiles = 0;
}

int loom_ckpt_file_sum(const char *path, int64_t *bytes, uint64_t *xxh3)
{
    char *buf;
    size_t len;
    int rc = loom_fs_read_small(path, LOOM_CKPT_TOKENIZER_MAX_BYTES, &buf, &len);
    if (rc) return rc;
    *bytes = (int64_t)len;
    *xxh3 = XXH3_64bits(buf, len);
    loom_free(buf);
    return LOOM_OK;
}
