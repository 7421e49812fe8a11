/*
 * A decoder family's Hugging Face formats (hf_decoder.h): config.json read
 * and written through the family's map, weights read and saved by the
 * spec's names.
 */
#include "model/hf_decoder.h"

#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "base/log.h"
#include "base/mem.h"
#include "io/fs.h"
#include "io/safetensors.h"
#include "io/st_index.h"
#include "model/family.h"
#include "model/model_io.h"

static int ends_with(const char *s, const char *suffix)
{
    size_t n = strlen(s), k = strlen(suffix);
    return n >= k && strcmp(s + n - k, suffix) == 0;
}

const struct loom_decoder_names loom_hf_decoder_names = {
    LOOM_HF_LLAMA_NAMES,
    .gate = "mlp.gate_proj",
    .up = "mlp.up_proj",
    .down = "mlp.down_proj",
    /* a mixture of experts (Qwen2-MoE's and DeepSeek's names) */
    .router = "mlp.gate",
    .expert = "mlp.experts.%d.",
    .expert_gate = "gate_proj",
    .expert_up = "up_proj",
    .expert_down = "down_proj",
    .shared = "mlp.shared_experts.",
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

/* A word key's value: the index of its spelling in k->words. */
static int read_word(const char *path, const char *title, const cJSON *v, const struct loom_hf_key *k,
                     double *out)
{
    for (int i = 0; k->words[i].hf; i++)
        if (cJSON_IsString(v) && strcmp(v->valuestring, k->words[i].hf) == 0) return *out = i, LOOM_OK;
    char names[160] = "";
    for (int i = 0; k->words[i].hf; i++)
        snprintf(names + strlen(names), sizeof names - strlen(names), "%s\"%s\"",
                 !i                   ? ""
                 : k->words[i + 1].hf ? ", "
                                      : " or ",
                 k->words[i].hf);
    return loom_hf_refuse(path, title, v, names);
}

/* One key's value as the shape setting's, transformers' default when absent
 * (integers: or null). */
static int read_key(const char *path, const char *title, const cJSON *j, const struct loom_hf_key *k,
                    double def, double *out)
{
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(j, k->hf);
    char range[64];
    switch (k->kind) {
    case LOOM_HF_WORD:
        if (!v) return *out = def, LOOM_OK;
        return read_word(path, title, v, k, out);
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
        else if (k->kind == LOOM_HF_WORD)
            loom_model_shape_add_word(out, k->setting, k->words[(int)value[i]].setting);
        else
            loom_model_shape_add_int(out, k->setting, (int64_t)value[i]);
    }
    if (rc == LOOM_OK && h->read) rc = h->read(path, j, out);
    if (rc == LOOM_OK) rc = check_architectures(path, title, j, h->architectures);
    cJSON_Delete(j);
    return rc;
}

const struct loom_hf_key *loom_hf_key_of(const struct loom_hf_map *h, const char *setting)
{
    for (int i = 0; i < h->nkeys; i++)
        if (strcmp(h->keys[i].setting, setting) == 0) return &h->keys[i];
    return NULL;
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

/* The beginning and end of a sequence: the map's ids, or the vocabulary's last. */
static void token_ids(const struct loom_hf_map *h, const struct loom_model_shape *shape, int *bos, int *eos)
{
    const int last = (int)loom_model_shape_find(shape, "vocab_size")->value - 1;
    *bos = h->end_of_text_last ? last : h->bos_token_id;
    *eos = h->end_of_text_last ? last : h->eos_token_id;
}

/* A word setting's first spelling. */
static const char *spelling(const struct loom_hf_key *k, const char *word)
{
    for (int i = 0; k->words[i].hf; i++)
        if (strcmp(k->words[i].setting, word) == 0) return k->words[i].hf;
    LOOM_ASSERT(0);
    return NULL;
}

static char *config_json(const struct loom_decoder_def *d, const struct loom_model_shape *shape)
{
    const struct loom_hf_map *h = d->hf;
    int bos, eos;
    token_ids(h, shape, &bos, &eos);
    cJSON *j = cJSON_CreateObject();
    cJSON_AddItemToObject(j, "architectures", cJSON_CreateStringArray(h->architectures, 1));
    cJSON_AddStringToObject(j, "model_type", h->model_type);
    cJSON_AddNumberToObject(j, "bos_token_id", bos);
    cJSON_AddNumberToObject(j, "eos_token_id", eos);
    cJSON_AddStringToObject(j, "torch_dtype", "float32");
    for (int i = 0; i < h->nkeys; i++) {
        const struct loom_hf_key *k = &h->keys[i];
        const struct loom_shape_setting *kv = loom_model_shape_find(shape, k->setting);
        LOOM_ASSERT(kv);
        if (k->kind == LOOM_HF_REAL)
            add_real(j, k->hf, kv->real);
        else if (k->kind == LOOM_HF_WORD)
            cJSON_AddStringToObject(j, k->hf, spelling(k, kv->word));
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

static char *generation_config_json(const struct loom_hf_map *h, const struct loom_model_shape *shape)
{
    int bos, eos;
    token_ids(h, shape, &bos, &eos);
    cJSON *j = cJSON_CreateObject();
    cJSON_AddTrueToObject(j, "_from_model_config");
    cJSON_AddNumberToObject(j, "bos_token_id", bos);
    cJSON_AddNumberToObject(j, "eos_token_id", eos);
    return print_sorted(j);
}

/* ---- weights ------------------------------------------------------------------ */

/* The name without the map's prefix. */
static const char *unprefixed(const struct loom_hf_map *h, const char *name)
{
    const size_t n = h->prefix ? strlen(h->prefix) : 0;
    return n && strncmp(name, h->prefix, n) == 0 ? name + n : name;
}

/* Tensors a file may hold beside the model's, none of them weights:
 * transformers' buffers in older exports (GPT-2's attention masks, the
 * rotary frequencies), and loom's other formats' tensors (llm.c's padding
 * rows, `llmc.*`). */
static int ignorable(const char *name)
{
    static const char *const buffers[] = {".attn.bias", ".attn.masked_bias", "rotary_emb.inv_freq"};
    if (strncmp(name, "llmc.", 5) == 0) return 1;
    for (size_t i = 0; i < sizeof buffers / sizeof buffers[0]; i++)
        if (ends_with(name, buffers[i])) return 1;
    return 0;
}

/* An LM head beside a tied model's embedding must equal it (as the model's
 * float32 values: the file may hold another dtype of both). */
static int check_tied_head(struct loom_decoder *m, const char *file, const struct loom_st_tensor *head)
{
    const struct loom_decoder_names *nm = m->spec.names;
    char emb_name[LOOM_TENSOR_NAME_MAX];
    snprintf(emb_name, sizeof emb_name, "%s.weight", nm->embedding);
    int bi;
    const struct loom_tensor *emb = loom_model_find(&m->base, emb_name, &bi); /* this model's part of it */
    LOOM_ASSERT(emb);
    if (head->ndim != 2 || head->shape[0] != m->spec.vocab || head->shape[1] != m->spec.hidden)
        return loom_error_set(LOOM_ERR_INPUT, "%s: %s.weight does not have %s's shape", file, nm->lm_head,
                              emb_name);
    const size_t n = (size_t)m->spec.vocab * (size_t)m->spec.hidden;
    float *w = loom_alloc(loom_mul_size(n, sizeof(float)), LOOM_MEM_OTHER),
          *part = loom_alloc(loom_mul_size(emb->numel, sizeof(float)), LOOM_MEM_OTHER);
    int rc = loom_st_read_f32(head, w, n);
    if (rc == LOOM_OK) loom_tensor_take_part(emb, w, part);
    if (rc == LOOM_OK &&
        memcmp(part, m->base.blocks[bi].work_params + emb->offset, emb->numel * sizeof(float)) != 0)
        rc =
            loom_error_set(LOOM_ERR_INPUT,
                           "%s: %s.weight differs from %s, so the LM head is not tied, but the model "
                           "described for it is (tie_word_embeddings true in its config.json or loom's "
                           "metadata; for a bare file, --untie-embeddings-and-output-weights says otherwise)",
                           file, nm->lm_head, emb_name);
    loom_free(part);
    loom_free(w);
    return rc;
}

/* The tensors of st (opened from file) the whole model does not have are
 * refused, not dropped; a pipeline stage skips the other stages' (the whole
 * model, *whole, is made the first time a name is not this stage's). */
static int check_unexpected(struct loom_decoder *m, const struct loom_hf_map *h, const struct loom_st *st,
                            const char *file, struct loom_decoder **whole)
{
    char head[LOOM_TENSOR_NAME_MAX];
    snprintf(head, sizeof head, "%s.weight", m->spec.names->lm_head);
    for (int i = 0; i < loom_st_count(st); i++) {
        const char *name = unprefixed(h, loom_st_at(st, i)->name);
        if (loom_model_find(&m->base, name, NULL) || ignorable(name) ||
            (!m->spec.untied && strcmp(name, head) == 0))
            continue;
        if (!*whole) *whole = loom_decoder_create_whole(&m->spec, 1, m->T);
        if (!loom_model_find(&(*whole)->base, name, NULL))
            return loom_error_set(LOOM_ERR_INPUT, "%s: unexpected tensor %s (the model has %d layers)", file,
                                  loom_st_at(st, i)->name, m->spec.num_layers);
    }
    return LOOM_OK;
}

/* A tied model must not drop an LM head of the file's own (another
 * model): checked by the stage holding the embedding, once it is read. */
static int check_own_head(struct loom_decoder *m, const struct loom_hf_map *h, const struct loom_st *st,
                          const char *file)
{
    char head[LOOM_TENSOR_NAME_MAX];
    snprintf(head, sizeof head, "%s.weight", m->spec.names->lm_head);
    const struct loom_st_tensor *own =
        m->spec.untied || m->emb < 0 ? NULL : loom_model_find_tensor(st, h->prefix, head);
    return own ? check_tied_head(m, file, own) : LOOM_OK;
}

/* A sharded checkpoint (st_index.h), one shard open at a time: each
 * shard's tensors read and its strangers refused; then every tensor of the
 * model must have come from some shard, and an LM head of the tied model's
 * own (in whatever shard) must be the embedding. */
static int load_shards(struct loom_decoder *m, const struct loom_hf_map *h, const char *index)
{
    struct loom_st_index x;
    int rc = loom_st_index_read(index, &x);
    if (rc) return rc;
    int n = 0;
    for (int bi = 0; bi < m->base.nblocks; bi++) n += m->base.blocks[bi].ntensors;
    unsigned char *seen = loom_alloc((size_t)n + 1, LOOM_MEM_OTHER);
    memset(seen, 0, (size_t)n + 1);
    struct loom_decoder *whole = NULL;
    for (int f = 0; f < x.nfiles && rc == LOOM_OK; f++) {
        struct loom_st st;
        if ((rc = loom_st_open(&st, x.files[f]))) break;
        rc = loom_model_read_present(&m->base, &st, x.files[f], h->prefix, seen);
        if (rc == LOOM_OK) rc = check_unexpected(m, h, &st, x.files[f], &whole);
        loom_st_close(&st);
    }
    loom_decoder_free(whole);
    for (int bi = 0, k = 0; bi < m->base.nblocks && rc == LOOM_OK; bi++)
        for (int ti = 0; ti < m->base.blocks[bi].ntensors && rc == LOOM_OK; ti++, k++)
            if (!seen[k])
                rc = loom_error_set(LOOM_ERR_INPUT, "%s: missing tensor %s (no shard holds it)", index,
                                    m->base.blocks[bi].tensors[ti].name);
    char head[LOOM_TENSOR_NAME_MAX];
    snprintf(head, sizeof head, "%s.weight", m->spec.names->lm_head);
    const int at = rc == LOOM_OK ? loom_st_index_find(&x, h->prefix, head) : -1;
    if (at >= 0) {
        struct loom_st st;
        if ((rc = loom_st_open(&st, x.files[at])) == LOOM_OK) {
            rc = check_own_head(m, h, &st, x.files[at]);
            loom_st_close(&st);
        }
    }
    loom_free(seen);
    loom_st_index_free(&x);
    return rc;
}

int loom_hf_load(struct loom_model *model, const char *file)
{
    struct loom_decoder *m = loom_decoder_of(model);
    const struct loom_hf_map *h = loom_decoder_def_of(model)->hf;
    if (loom_st_is_index(file)) return load_shards(m, h, file);
    struct loom_st st;
    int rc = loom_st_open(&st, file);
    if (rc) return rc;
    struct loom_decoder *whole = NULL;
    if ((rc = loom_model_read_tensors(&m->base, &st, file, h->prefix)) == LOOM_OK &&
        (rc = check_own_head(m, h, &st, file)) == LOOM_OK)
        rc = check_unexpected(m, h, &st, file, &whole);
    loom_decoder_free(whole);
    loom_st_close(&st);
    return rc;
}

static int64_t tensor_bytes(const struct loom_st_tensor_in *t)
{
    int64_t n = (int64_t)loom_dtype_size(t->dtype);
    for (int d = 0; d < t->ndim; d++) n *= t->shape[d];
    return n;
}

/* The tensors in shards of at most max bytes (a larger tensor alone), in
 * order, beside path (model.safetensors, which a stale copy of is removed:
 * a loader takes it before an index), with each shard's metadata meta and
 * the index transformers writes. */
static int write_shards(const char *path, const struct loom_st_tensor_in *ts, int n, const char *const *meta,
                        int nmeta, int64_t max, int64_t total)
{
    char dir[4096], file[4400];
    loom_fs_dirname(path, dir, sizeof dir);
    int nshards = 0;
    for (int i = 0; i < n; nshards++) {
        int64_t bytes = tensor_bytes(&ts[i++]);
        while (i < n && bytes + tensor_bytes(&ts[i]) <= max) bytes += tensor_bytes(&ts[i++]);
    }
    cJSON *index = cJSON_CreateObject(), *md = cJSON_AddObjectToObject(index, "metadata"),
          *map = cJSON_AddObjectToObject(index, "weight_map");
    cJSON_AddNumberToObject(md, "total_size", (double)total);
    int rc = LOOM_OK;
    for (int i = 0, s = 1; i < n && rc == LOOM_OK; s++) {
        const int first = i;
        int64_t bytes = tensor_bytes(&ts[i++]);
        while (i < n && bytes + tensor_bytes(&ts[i]) <= max) bytes += tensor_bytes(&ts[i++]);
        char name[64];
        snprintf(name, sizeof name, "model-%05d-of-%05d.safetensors", s, nshards);
        snprintf(file, sizeof file, "%s/%s", dir, name);
        rc = loom_st_write(file, ts + first, i - first, meta, nmeta);
        for (int k = first; k < i; k++) cJSON_AddStringToObject(map, ts[k].name, name);
    }
    if (rc == LOOM_OK) rc = loom_hf_write_json(dir, "model.safetensors.index.json", cJSON_Print(index));
    cJSON_Delete(index);
    if (rc == LOOM_OK && unlink(path) != 0 && errno != ENOENT)
        rc = loom_error_set(LOOM_ERR_RUNTIME, "remove %s (a single-file copy beside the shards): %s", path,
                            strerror(errno));
    return rc;
}

int loom_hf_save_ext(struct loom_model *model, const char *path, const struct loom_hf_extra *extra)
{
    const struct loom_decoder *m = loom_decoder_of(model);
    const struct loom_decoder_def *d = loom_decoder_def_of(model);
    const struct loom_hf_extra none = {0}, *x = extra ? extra : &none;
    int n = x->ntensors;
    for (int bi = 0; bi < m->base.nblocks; bi++) n += m->base.blocks[bi].ntensors;
    struct loom_model_shape shape;
    loom_decoder_def_model_shape(d, m, &shape);
    const int nown = 2 + shape.n;
    struct loom_st_tensor_in *ts = loom_alloc(sizeof *ts * (size_t)n, LOOM_MEM_OTHER);
    char(*names)[LOOM_TENSOR_NAME_MAX + 64] = loom_alloc(sizeof *names * (size_t)n, LOOM_MEM_OTHER);
    const char **meta = loom_alloc(sizeof *meta * (size_t)(nown + x->nmeta) * 2, LOOM_MEM_OTHER);
    char(*text)[2][64] = loom_alloc(sizeof *text * (size_t)(shape.n ? shape.n : 1), LOOM_MEM_OTHER);
    /* an untied model's body under the LM head model's prefix, which
     * transformers needs once a head is beside it */
    const char *prefix = m->spec.untied && d->hf->prefix ? d->hf->prefix : "";
    char head[LOOM_TENSOR_NAME_MAX];
    snprintf(head, sizeof head, "%s.weight", m->spec.names->lm_head);
    int k = 0;
    for (int bi = 0; bi < m->base.nblocks; bi++) {
        const struct loom_block *b = &m->base.blocks[bi];
        for (int ti = 0; ti < b->ntensors; ti++, k++) {
            const struct loom_tensor *t = &b->tensors[ti];
            snprintf(names[k], sizeof names[k], "%s%s", strcmp(t->name, head) == 0 ? "" : prefix, t->name);
            ts[k] = (struct loom_st_tensor_in){.name = names[k],
                                               .dtype = LOOM_DTYPE_F32,
                                               .ndim = t->ndim,
                                               .shape = {t->shape[0], t->shape[1]},
                                               .data = b->work_params + t->offset};
        }
    }
    for (int i = 0; i < x->ntensors; i++) ts[k++] = x->tensors[i];
    /* the model's shape, each setting as loom.<key> */
    meta[0] = "format", meta[1] = "pt", meta[2] = "loom.model", meta[3] = m->spec.name;
    for (int i = 0; i < shape.n; i++) {
        snprintf(text[i][0], sizeof text[i][0], "loom.%s", shape.kv[i].key);
        loom_model_shape_text(&shape.kv[i], text[i][1], sizeof text[i][1]);
        meta[4 + 2 * i] = text[i][0];
        meta[5 + 2 * i] = text[i][1];
    }
    for (int i = 0; i < 2 * x->nmeta; i++) meta[2 * nown + i] = x->meta[i];
    int64_t total = 0;
    for (int i = 0; i < n; i++) total += tensor_bytes(&ts[i]);
    const int rc = x->max_shard_bytes > 0 && total > x->max_shard_bytes
                       ? write_shards(path, ts, n, meta, nown + x->nmeta, x->max_shard_bytes, total)
                       : loom_st_write(path, ts, n, meta, nown + x->nmeta);
    loom_free(text);
    loom_free(meta);
    loom_free(names);
    loom_free(ts);
    return rc;
}

int loom_hf_save(struct loom_model *model, const char *path)
{
    return loom_hf_save_ext(model, path, NULL);
}

/* A JSON text written crash-safely, with a final newline; consumes text. */
int loom_hf_write_json(const char *dir, const char *name, char *text)
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

int loom_hf_save_dir(struct loom_model *model, const char *dir, const struct loom_hf_extra *extra)
{
    const struct loom_decoder_def *d = loom_decoder_def_of(model);
    const struct loom_decoder_spec *s = &loom_decoder_of(model)->spec;
    if (s->experts && !loom_hf_key_of(d->hf, "num_experts"))
        return loom_error_set(
            LOOM_ERR_INPUT,
            "%s: transformers' %s has no experts; a %s model with --num-experts is saved in "
            "loom's formats only",
            dir, d->hf->architectures[0], d->family->title);
    if (s->experts && (s->moe_layers.freq != 1 || s->pre_softmax || s->shared_ffn))
        return loom_error_set(LOOM_ERR_INPUT,
                              "%s: transformers' %s routes every layer by the softmax of the top k, without "
                              "shared experts; this model's --moe-layer-freq, --moe-router-pre-softmax or "
                              "--moe-shared-expert-intermediate-size has no form there",
                              dir, d->hf->architectures[0]);
    int rc = loom_fs_mkdir_p(dir);
    if (rc) return rc;
    char weights[4200];
    snprintf(weights, sizeof weights, "%s%smodel.safetensors", dir, ends_with(dir, "/") ? "" : "/");
    struct loom_model_shape shape;
    loom_decoder_def_model_shape(d, loom_decoder_of(model), &shape);
    if ((rc = loom_hf_save_ext(model, weights, extra)) == LOOM_OK &&
        (rc = loom_hf_write_json(dir, "config.json", config_json(d, &shape))) == LOOM_OK)
        rc = loom_hf_write_json(dir, "generation_config.json", generation_config_json(d->hf, &shape));
    return rc;
}
