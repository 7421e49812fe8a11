/*
 * A decoder family's Hugging Face formats and `loom convert` (hf_decoder.h).
 */
#include "model/hf_decoder.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "base/log.h"
#include "base/mem.h"
#include "io/checkpoint.h"
#include "io/fs.h"
#include "io/safetensors.h"
#include "model/family.h"
#include "model/model_io.h"

static int exists(const char *path)
{
    struct stat s;
    return stat(path, &s) == 0 && S_ISREG(s.st_mode);
}

static int ends_with(const char *s, const char *suffix)
{
    size_t n = strlen(s), k = strlen(suffix);
    return n >= k && strcmp(s + n - k, suffix) == 0;
}

const struct loom_decoder_names loom_hf_decoder_names = {
    .embedding = "model.embed_tokens",
    .layer = "model.layers.%d.",
    .norm1 = "input_layernorm",
    .q = "self_attn.q_proj",
    .k = "self_attn.k_proj",
    .v = "self_attn.v_proj",
    .o = "self_attn.o_proj",
    .norm2 = "post_attention_layernorm",
    .gate = "mlp.gate_proj",
    .up = "mlp.up_proj",
    .down = "mlp.down_proj",
    .final_norm = "model.norm",
    .lm_head = "lm_head",
};

/* Fields every decoder family's config has that do not change the function
 * loom computes (weights are loaded), with the values exports write. */
static const struct loom_hf_field shared[] = {
    {"initializer_range", LOOM_HF_NO_EFFECT, "0.02"},
    {"use_cache", LOOM_HF_NO_EFFECT, "true"},
};
#define NSHARED ((int)(sizeof shared / sizeof shared[0]))

int loom_hf_refuse(const char *path, const char *title, const cJSON *v, const char *supported)
{
    char text[80];
    loom_hf_value_text(v, text, sizeof text);
    return loom_error_set(LOOM_ERR_INPUT, "%s: %s is %s; loom's %s supports %s", path, v->string, text, title,
                          supported);
}

/* ---- config.json ------------------------------------------------------------ */

/* One key's value as the shape setting's, transformers' default when absent
 * (integers: or null). */
static int read_key(const char *path, const char *title, const cJSON *j, const struct loom_hf_key *k,
                    double def, double *out)
{
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(j, k->hf);
    char range[64];
    switch (k->kind) {
    case LOOM_HF_INT:
        if (!v || cJSON_IsNull(v)) return *out = def, LOOM_OK;
        if (!cJSON_IsNumber(v) || !(v->valuedouble >= 1 && v->valuedouble <= (1 << 24)) ||
            v->valuedouble != floor(v->valuedouble))
            return loom_hf_refuse(path, title, v, "an integer from 1 to 16777216");
        return *out = v->valuedouble, LOOM_OK;
    case LOOM_HF_REAL:
        if (!v) return *out = def, LOOM_OK;
        if (!cJSON_IsNumber(v) || !(v->valuedouble >= k->lo && v->valuedouble <= k->hi)) {
            snprintf(range, sizeof range, "a number from %g to %g", k->lo, k->hi);
            return loom_hf_refuse(path, title, v, range);
        }
        return *out = v->valuedouble, LOOM_OK;
    case LOOM_HF_UNTIED:
        if (!v) return *out = def, LOOM_OK;
        if (!cJSON_IsBool(v)) return loom_hf_refuse(path, title, v, "true or false");
        return *out = cJSON_IsFalse(v), LOOM_OK;
    case LOOM_HF_WINDOW:
        if (!v) return *out = def, LOOM_OK;
        if (cJSON_IsNull(v)) return *out = 0, LOOM_OK;
        if (!cJSON_IsNumber(v) || !(v->valuedouble >= 1 && v->valuedouble < (1 << 30)) ||
            v->valuedouble != floor(v->valuedouble))
            return loom_hf_refuse(path, title, v, "null or a positive integer");
        return *out = v->valuedouble + 1, LOOM_OK; /* transformers' masks let S + 1 keys in */
    }
    return LOOM_OK;
}

static int check_architectures(const char *path, const char *title, const cJSON *j,
                               const char *const *accepted)
{
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(j, "architectures"), *a;
    if (!v || cJSON_IsNull(v)) return LOOM_OK;
    int ok = cJSON_IsArray(v);
    cJSON_ArrayForEach(a, v)
    {
        int known = 0;
        for (int i = 0; accepted[i] && cJSON_IsString(a); i++)
            known |= strcmp(a->valuestring, accepted[i]) == 0;
        ok = ok && known;
    }
    if (ok) return LOOM_OK;
    char want[256] = "";
    for (int i = 0; accepted[i]; i++)
        snprintf(want + strlen(want), sizeof want - strlen(want), "%s[\"%s\"]", i ? " and " : "",
                 accepted[i]);
    snprintf(want + strlen(want), sizeof want - strlen(want), " (a language model)");
    return loom_hf_refuse(path, title, v, want);
}

int loom_hf_read_config(const struct loom_decoder_def *d, const char *path, struct loom_model_shape *out)
{
    const struct loom_hf_map *h = d->hf;
    const char *title = d->family->title;
    /* the family's fields, its keys, and the two every family has */
    struct loom_hf_field *fields =
        loom_alloc(sizeof *fields * (size_t)(h->nfields + h->nkeys + 2 + NSHARED), LOOM_MEM_OTHER);
    char type[64];
    snprintf(type, sizeof type, "\"%s\"", h->model_type);
    int n = 0;
    for (int i = 0; i < h->nkeys; i++)
        fields[n++] = (struct loom_hf_field){h->keys[i].hf, LOOM_HF_READ, NULL};
    fields[n++] = (struct loom_hf_field){"architectures", LOOM_HF_READ, NULL};
    fields[n++] = (struct loom_hf_field){"model_type", LOOM_HF_ONLY, type};
    for (int i = 0; i < h->nfields; i++) fields[n++] = h->fields[i];
    for (int i = 0; i < NSHARED; i++) fields[n++] = shared[i];
    cJSON *j = NULL;
    int rc = loom_hf_config_read(path, fields, n, title, &j);
    loom_free(fields);
    if (rc) return rc;
    double value[LOOM_MODEL_SHAPE_MAX];
    memset(out, 0, sizeof *out);
    snprintf(out->type, sizeof out->type, "%s", d->family->name);
    for (int i = 0; i < h->nkeys && rc == LOOM_OK; i++) {
        const struct loom_hf_key *k = &h->keys[i];
        double def = k->def;
        for (int e = 0; k->def_key && e < i; e++)
            if (strcmp(h->keys[e].hf, k->def_key) == 0) def = value[e];
        if ((rc = read_key(path, title, j, k, def, &value[i]))) break;
        if (k->kind == LOOM_HF_REAL)
            loom_model_shape_add_real(out, k->setting, value[i]);
        else
            loom_model_shape_add_int(out, k->setting, (int64_t)value[i]);
    }
    if (rc == LOOM_OK && h->read) rc = h->read(path, j, out);
    if (rc == LOOM_OK) rc = check_architectures(path, title, j, h->architectures);
    cJSON_Delete(j);
    return rc;
}

/* A double exactly (cJSON's printing may round). */
static void add_real(cJSON *j, const char *key, double x)
{
    char text[40];
    loom_real_text(x, text, sizeof text);
    cJSON_AddRawToObject(j, key, text);
}

static int by_name(const void *a, const void *b)
{
    return strcmp((*(cJSON *const *)a)->string, (*(cJSON *const *)b)->string);
}

/* j's members in name order, as transformers writes them; then printed. */
static char *print_sorted(cJSON *j)
{
    const int n = cJSON_GetArraySize(j);
    cJSON **items = loom_alloc(sizeof *items * (size_t)(n ? n : 1), LOOM_MEM_OTHER);
    for (int i = 0; i < n; i++) items[i] = cJSON_DetachItemFromArray(j, 0);
    qsort(items, (size_t)n, sizeof *items, by_name);
    for (int i = 0; i < n; i++) cJSON_AddItemToArray(j, items[i]);
    loom_free(items);
    char *text = cJSON_Print(j);
    cJSON_Delete(j);
    return text;
}

static char *config_json(const struct loom_decoder_def *d, const struct loom_model_shape *shape)
{
    const struct loom_hf_map *h = d->hf;
    cJSON *j = cJSON_CreateObject();
    cJSON_AddItemToObject(j, "architectures", cJSON_CreateStringArray(h->architectures, 1));
    cJSON_AddStringToObject(j, "model_type", h->model_type);
    cJSON_AddNumberToObject(j, "bos_token_id", h->bos_token_id);
    cJSON_AddNumberToObject(j, "eos_token_id", h->eos_token_id);
    cJSON_AddStringToObject(j, "torch_dtype", "float32");
    for (int i = 0; i < h->nkeys; i++) {
        const struct loom_hf_key *k = &h->keys[i];
        const struct loom_shape_setting *kv = loom_model_shape_find(shape, k->setting);
        LOOM_ASSERT(kv);
        if (k->kind == LOOM_HF_REAL)
            add_real(j, k->hf, kv->real);
        else if (k->kind == LOOM_HF_UNTIED)
            cJSON_AddBoolToObject(j, k->hf, !kv->value);
        else if (k->kind == LOOM_HF_WINDOW && !kv->value)
            cJSON_AddNullToObject(j, k->hf);
        else
            cJSON_AddNumberToObject(j, k->hf, (double)(kv->value - (k->kind == LOOM_HF_WINDOW)));
    }
    for (int i = 0; i < h->nfields + NSHARED; i++) {
        const struct loom_hf_field *f = i < h->nfields ? &h->fields[i] : &shared[i - h->nfields];
        if (f->rule != LOOM_HF_READ && f->only) cJSON_AddItemToObject(j, f->name, cJSON_Parse(f->only));
    }
    if (h->write) h->write(j, shape);
    return print_sorted(j);
}

static char *generation_config_json(const struct loom_hf_map *h)
{
    cJSON *j = cJSON_CreateObject();
    cJSON_AddTrueToObject(j, "_from_model_config");
    cJSON_AddNumberToObject(j, "bos_token_id", h->bos_token_id);
    cJSON_AddNumberToObject(j, "eos_token_id", h->eos_token_id);
    return print_sorted(j);
}

/* ---- weights sources ---------------------------------------------------------- */

/* The weights file of a source, and the config.json in its directory. */
static int source_paths(const char *path, char *file, char *config, size_t n)
{
    char dir[4000];
    if (loom_fs_is_dir(path)) {
        snprintf(file, n, "%s/model.safetensors", path);
        snprintf(dir, sizeof dir, "%s", path);
        if (!exists(file))
            return loom_error_set(LOOM_ERR_INPUT,
                                  "%s: no model.safetensors in it (sharded checkpoints "
                                  "and pytorch_model.bin are not read)",
                                  path);
    } else {
        snprintf(file, n, "%s", path);
        loom_fs_dirname(path, dir, sizeof dir);
    }
    snprintf(config, n, "%s/config.json", dir);
    return LOOM_OK;
}

/* loom's own metadata: *found 0 when the file has none. */
static int read_metadata(const char *file, struct loom_model_shape *out, int *found)
{
    struct loom_st st;
    int rc = loom_st_open(&st, file);
    if (rc) return rc;
    *found = 0;
    const char *type = loom_st_meta(&st, "loom.model");
    if (type) {
        *found = 1;
        memset(out, 0, sizeof *out);
        snprintf(out->type, sizeof out->type, "%s", type);
        for (int i = 0; i < loom_st_meta_count(&st) && rc == LOOM_OK; i++) {
            const char *key, *value;
            loom_st_meta_at(&st, i, &key, &value);
            if (strncmp(key, "loom.", 5) != 0 || strcmp(key, "loom.model") == 0 ||
                strncmp(key, "loom.xxh3.", 10) == 0)
                continue;
            if (out->n == LOOM_MODEL_SHAPE_MAX) {
                rc = loom_error_set(LOOM_ERR_INPUT, "%s: too many loom.* settings", file);
                break;
            }
            struct loom_shape_setting *kv = &out->kv[out->n];
            memset(kv, 0, sizeof *kv);
            if (strlen(key + 5) >= sizeof kv->key || !loom_model_shape_parse(kv, value)) {
                rc = loom_error_set(LOOM_ERR_INPUT, "%s: metadata %s: bad value", file, key);
                break;
            }
            snprintf(kv->key, sizeof kv->key, "%s", key + 5);
            out->n++;
        }
    }
    loom_st_close(&st);
    return rc;
}

/* The vocabulary and width config.json gives against the token table. */
static int check_tensors(const struct loom_decoder_def *d, const char *config, const char *file,
                         const struct loom_model_shape *shape)
{
    struct loom_st st;
    int rc = loom_st_open(&st, file);
    if (rc) return rc;
    char name[128];
    snprintf(name, sizeof name, "%s.weight", d->arch->names->embedding);
    const struct loom_st_tensor *e = loom_st_find(&st, name);
    const struct loom_shape_setting *V = loom_model_shape_find(shape, "vocab_size"),
                                    *C = loom_model_shape_find(shape, "hidden_size");
    if (!e || e->ndim != 2)
        rc = loom_error_set(LOOM_ERR_INPUT, "%s: not %s weights (no 2-D %s)", file, d->family->title, name);
    else if (e->shape[0] != V->value || e->shape[1] != C->value)
        rc = loom_error_set(LOOM_ERR_INPUT,
                            "%s says vocab_size %lld and hidden_size %lld, but %s has %s [%lld, %lld]",
                            config, (long long)V->value, (long long)C->value, file, name,
                            (long long)e->shape[0], (long long)e->shape[1]);
    loom_st_close(&st);
    return rc;
}

int loom_hf_source_shape(const struct loom_decoder_def *d, const char *path, struct loom_model_shape *out)
{
    char file[4200], config[4200];
    int rc = source_paths(path, file, config, sizeof file), found = 0;
    if (rc || (rc = read_metadata(file, out, &found))) return rc;
    if (found) {
        if (strcmp(out->type, d->family->name) != 0)
            return loom_error_set(LOOM_ERR_INPUT, "%s holds a %s model, not %s", file, out->type,
                                  d->family->title);
        return LOOM_OK;
    }
    if (!exists(config))
        return loom_error_set(
            LOOM_ERR_INPUT,
            "%s: a %s safetensors file needs its config.json beside it (%s): the tensors do "
            "not say the heads, the key/value heads, the rotary base or the eps",
            path, d->family->title, config);
    if ((rc = loom_hf_read_config(d, config, out))) return rc;
    return check_tensors(d, config, file, out);
}

/* Tensors a file may hold beside the model's: older exports' rotary
 * frequencies (derived, not weights). */
static int ignorable(const char *name)
{
    const char *s = strstr(name, "rotary_emb.inv_freq");
    return s && s[strlen("rotary_emb.inv_freq")] == '\0';
}

int loom_hf_load(struct loom_model *model, const char *path)
{
    struct loom_decoder *m = loom_decoder_of(model);
    char file[4200], config[4200];
    int rc = source_paths(path, file, config, sizeof file);
    if (rc) return rc;
    struct loom_st st;
    if ((rc = loom_st_open(&st, file))) return rc;
    if ((rc = loom_model_read_tensors(&m->base, &st, file, NULL))) goto done;
    /* a pipeline stage skips the other stages' tensors (described by the
     * whole model, made the first time a name is not this stage's) */
    struct loom_decoder *whole = NULL;
    char head[128];
    snprintf(head, sizeof head, "%s.weight", m->spec.names->lm_head);
    for (int i = 0; i < loom_st_count(&st) && rc == LOOM_OK; i++) {
        const char *name = loom_st_at(&st, i)->name;
        if (ignorable(name) || loom_model_find(&m->base, name, NULL)) continue;
        if (!whole) whole = loom_decoder_create_whole(&m->spec, 1, m->T);
        if (loom_model_find(&whole->base, name, NULL)) continue;
        if (strcmp(name, head) == 0) /* a tied model must not drop a head of the file's own */
            rc =
                loom_error_set(LOOM_ERR_INPUT,
                               "%s: has %s, but the model ties its LM head to %s.weight (tie_word_embeddings "
                               "false, or --untie-embeddings-and-output-weights, describes this file)",
                               file, head, m->spec.names->embedding);
        else
            rc = loom_error_set(LOOM_ERR_INPUT, "%s: unexpected tensor %s (the model has %d layers)", file,
                                name, m->spec.num_layers);
    }
    loom_decoder_free(whole);
done:
    loom_st_close(&st);
    return rc;
}

int loom_hf_save(struct loom_model *model, const char *path)
{
    const struct loom_decoder *m = loom_decoder_of(model);
    int n = 0;
    for (int bi = 0; bi < m->base.nblocks; bi++) n += m->base.blocks[bi].ntensors;
    struct loom_st_tensor_in *ts = calloc((size_t)n, sizeof *ts);
    struct loom_model_shape shape;
    loom_decoder_def_model_shape(loom_decoder_def_of(model), m, &shape);
    const char **meta = calloc((size_t)(2 + shape.n) * 2, sizeof *meta);
    char(*text)[2][64] = calloc((size_t)shape.n, sizeof *text);
    int rc = LOOM_OK, k = 0;
    if (!ts || !meta || !text) {
        rc = loom_error_set(LOOM_ERR_RUNTIME, "out of memory writing %s", path);
        goto done;
    }
    for (int bi = 0; bi < m->base.nblocks; bi++) {
        const struct loom_block *b = &m->base.blocks[bi];
        for (int ti = 0; ti < b->ntensors; ti++, k++) {
            const struct loom_tensor *t = &b->tensors[ti];
            ts[k] = (struct loom_st_tensor_in){.name = t->name,
                                               .dtype = LOOM_DTYPE_F32,
                                               .ndim = t->ndim,
                                               .shape = {t->shape[0], t->shape[1]},
                                               .data = b->work_params + t->offset};
        }
    }
    meta[0] = "format", meta[1] = "pt", meta[2] = "loom.model", meta[3] = m->spec.name;
    for (int i = 0; i < shape.n; i++) {
        snprintf(text[i][0], sizeof text[i][0], "loom.%s", shape.kv[i].key);
        loom_model_shape_text(&shape.kv[i], text[i][1], sizeof text[i][1]);
        meta[4 + 2 * i] = text[i][0];
        meta[5 + 2 * i] = text[i][1];
    }
    rc = loom_st_write(path, ts, n, meta, 2 + shape.n);
done:
    free(text);
    free(meta);
    free(ts);
    return rc;
}

/* A JSON text written crash-safely, with a final newline; consumes text. */
static int write_json(const char *dir, const char *name, char *text)
{
    char path[4200];
    snprintf(path, sizeof path, "%s%s%s", dir, ends_with(dir, "/") ? "" : "/", name);
    if (!text) return loom_error_set(LOOM_ERR_RUNTIME, "out of memory formatting %s", path);
    const void *parts[] = {text, "\n"};
    const size_t sizes[] = {strlen(text), 1};
    int rc = loom_fs_write_atomic(path, parts, sizes, 2);
    cJSON_free(text);
    return rc;
}

int loom_hf_save_dir(struct loom_model *model, const char *dir)
{
    const struct loom_decoder_def *d = loom_decoder_def_of(model);
    int rc = loom_fs_mkdir_p(dir);
    if (rc) return rc;
    char weights[4200];
    snprintf(weights, sizeof weights, "%s%smodel.safetensors", dir, ends_with(dir, "/") ? "" : "/");
    struct loom_model_shape shape;
    loom_decoder_def_model_shape(d, loom_decoder_of(model), &shape);
    if ((rc = loom_hf_save(model, weights)) == LOOM_OK &&
        (rc = write_json(dir, "config.json", config_json(d, &shape))) == LOOM_OK)
        rc = write_json(dir, "generation_config.json", generation_config_json(d->hf));
    return rc;
}

/* ---- loom convert ------------------------------------------------------------- */

static void usage(FILE *f)
{
    fprintf(f, "usage: loom convert IN OUT [--to safetensors|hf]\n\n"
               "IN is a Hugging Face directory (model.safetensors, config.json), a safetensors file with\n"
               "loom's metadata or a config.json beside it, or a loom checkpoint (any parallel layout).\n"
               "OUT's kind comes from --to, else its name:\n"
               "  NAME.safetensors  one safetensors file (with loom's metadata)\n"
               "  DIR               Hugging Face directory: model.safetensors + config.json +\n"
               "                    generation_config.json\n");
}

/* Every input read into one model of the family in memory, whole. */
static int read_input(const struct loom_model_family *f, const char *path, const struct loom_convert_env *env,
                      struct loom_model **out)
{
    if (loom_ckpt_is_checkpoint(path)) {
        int rc = env->read_checkpoint(path, out);
        if (rc) return rc;
        if (loom_model_family_of(*out) != f) {
            rc = loom_error_set(LOOM_ERR_INPUT, "%s holds a %s model, not %s", path, (*out)->name, f->title);
            loom_model_family_of(*out)->destroy(*out);
        }
        return rc;
    }
    struct loom_model_shape shape;
    struct loom_config cfg;
    memset(&cfg, 0, sizeof cfg);
    int rc = loom_hf_source_shape(f->decoder, path, &shape);
    if (rc == LOOM_OK && (rc = f->apply_shape(&shape, &cfg)) == LOOM_OK) rc = f->check(&cfg, 1);
    if (rc) return rc;
    const struct loom_decoder_spec s = loom_decoder_def_spec(f->decoder, &cfg);
    struct loom_decoder *m = loom_decoder_create_whole(&s, 1, 1);
    loom_model_alloc_arenas(&m->base, 1, LOOM_MODEL_PARAM_ARENA);
    if ((rc = loom_hf_load(&m->base, path))) {
        loom_decoder_free(m);
        return rc;
    }
    *out = &m->base;
    return LOOM_OK;
}

static int run(int argc, char **argv, const struct loom_convert_env *env)
{
    const struct loom_model_family *f = env->family;
    const char *in = NULL, *out = NULL, *to = NULL;
    for (int i = 0; i < argc; i++) {
        if (strcmp(argv[i], "--help") == 0 || strcmp(argv[i], "-h") == 0) {
            usage(stdout);
            return LOOM_OK;
        }
        if (strcmp(argv[i], "--to") == 0 && i + 1 < argc) {
            to = argv[++i];
            if (strcmp(to, "safetensors") != 0 && strcmp(to, "hf") != 0)
                return loom_error_set(LOOM_ERR_INPUT, "--to: %s converts to safetensors or hf, got '%s'",
                                      f->title, to);
        } else if (strncmp(argv[i], "--", 2) == 0) {
            return loom_error_set(LOOM_ERR_INPUT, "unknown flag %s for loom convert of %s weights (--to)",
                                  argv[i], f->title);
        } else if (!in) {
            in = argv[i];
        } else if (!out) {
            out = argv[i];
        } else {
            return loom_error_set(LOOM_ERR_INPUT, "loom convert takes IN and OUT; extra argument '%s'",
                                  argv[i]);
        }
    }
    if (!in || !out) return loom_error_set(LOOM_ERR_INPUT, "usage: loom convert IN OUT [flags] (see --help)");
    const int to_file = to ? strcmp(to, "safetensors") == 0 : ends_with(out, ".safetensors");
    if (!to && !to_file && ends_with(out, ".bin"))
        return loom_error_set(LOOM_ERR_INPUT,
                              "%s: llm.c checkpoints hold GPT-2 models only; give a .safetensors "
                              "file or a directory",
                              out);
    struct loom_model *m = NULL;
    int rc = read_input(f, in, env, &m);
    if (rc) return rc;
    rc = to_file ? loom_hf_save(m, out) : loom_hf_save_dir(m, out);
    const struct loom_decoder_spec *s = &loom_decoder_of(m)->spec;
    if (rc == LOOM_OK)
        printf("converted %s\n       to %s (%s, L=%d C=%d NH=%d G=%d F=%d V=%d)\n", in, out,
               to_file ? "safetensors" : "Hugging Face directory", s->num_layers, s->hidden, s->heads,
               s->kv_heads, s->ffn, s->vocab);
    f->destroy(m);
    return rc;
}

const struct loom_model_converter loom_hf_converter = {
    .usage = usage,
    .run = run,
};
