/*
 * Loading and saving GPT-2 weights by Hugging Face name (see gpt2_io.h).
 */
#include "model/gpt2_io.h"

#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "base/log.h"
#include "io/fs.h"
#include "io/hf_config.h"
#include "io/safetensors.h"
#include "model/gpt2_hf.h"
#include "model/gpt2_llmc.h"
#include "model/model_io.h"

static const struct loom_st_tensor *find_tensor(const struct loom_st *st, const char *name)
{
    return loom_model_find_tensor(st, "transformer.", name);
}

static const char *unprefixed(const char *name)
{
    return strncmp(name, "transformer.", 12) == 0 ? name + 12 : name;
}

/* HF's attention masks and tied head, and anything outside GPT-2's names
 * (extra tensors another tool keeps beside the model, e.g. llmc.*) */
static int ignorable(const char *name)
{
    const char *n = unprefixed(name);
    if (strcmp(n, "lm_head.weight") == 0) return 1;
    size_t len = strlen(n);
    if ((len > 10 && strcmp(n + len - 10, ".attn.bias") == 0) ||
        (len > 17 && strcmp(n + len - 17, ".attn.masked_bias") == 0))
        return 1;
    static const char *const gpt2_names[] = {"wte.", "wpe.", "h.", "ln_f."};
    for (size_t i = 0; i < sizeof gpt2_names / sizeof gpt2_names[0]; i++)
        if (strncmp(n, gpt2_names[i], strlen(gpt2_names[i])) == 0) return 0;
    return 1;
}

/* An lm_head.weight beside a tied model's wte must equal it (as the
 * model's float32 values: the file may hold another dtype of both). */
static int check_tied_head(struct loom_decoder *m, const char *path, const struct loom_st_tensor *head)
{
    const struct loom_block *emb = &m->base.blocks[m->emb];
    const size_t n = (size_t)m->spec.vocab * (size_t)m->spec.hidden;
    if (head->ndim != 2 || head->shape[0] != m->spec.vocab || head->shape[1] != m->spec.hidden)
        return loom_error_set(LOOM_ERR_INPUT, "%s: lm_head.weight does not have wte.weight's shape", path);
    const struct loom_tensor *wte = &emb->tensors[0]; /* this model's part of it */
    float *w = malloc(n * sizeof(float)), *part = malloc(wte->numel * sizeof(float));
    int rc = w && part ? loom_st_read_f32(head, w, n)
                       : loom_error_set(LOOM_ERR_RUNTIME, "out of memory reading %s", path);
    if (rc == LOOM_OK) loom_tensor_take_part(wte, w, part);
    if (rc == LOOM_OK && memcmp(part, emb->work_params, wte->numel * sizeof(float)) != 0)
        rc =
            loom_error_set(LOOM_ERR_INPUT,
                           "%s: lm_head.weight differs from wte.weight, so the LM head is not tied, but the "
                           "model described for it is (tie_word_embeddings true in its config.json or loom's "
                           "metadata; for a bare file, --untie-embeddings-and-output-weights says otherwise)",
                           path);
    free(part);
    free(w);
    return rc;
}

int loom_gpt2_load(struct loom_decoder *m, const char *path)
{
    struct loom_st st;
    int rc = loom_st_open(&st, path);
    if (rc) return rc;
    if ((rc = loom_model_read_tensors(&m->base, &st, path, "transformer."))) goto fail;
    /* a tied model must not drop an LM head of the file's own: that is
     * another model (tie_word_embeddings false); the stage holding the
     * embedding checks it */
    const struct loom_st_tensor *head =
        m->spec.untied || m->emb < 0 ? NULL : find_tensor(&st, "lm_head.weight");
    if (head && (rc = check_tied_head(m, path, head))) goto fail;
    /* GPT-2 tensors the whole model does not have are refused, not silently
     * dropped; a pipeline stage skips the other stages' (described by the
     * whole model, made the first time a name is not this stage's) */
    struct loom_decoder *whole = NULL;
    for (int i = 0; i < loom_st_count(&st) && rc == LOOM_OK; i++) {
        const char *name = loom_st_at(&st, i)->name;
        if (ignorable(name) || loom_model_find(&m->base, unprefixed(name), NULL)) continue;
        if (!whole) whole = loom_decoder_create_whole(&m->spec, 1, m->T);
        if (!loom_model_find(&whole->base, unprefixed(name), NULL))
            rc = loom_error_set(LOOM_ERR_INPUT, "%s: unexpected tensor %s (the model has %d layers)", path,
                                name, m->spec.num_layers);
    }
    loom_decoder_free(whole);
fail:
    loom_st_close(&st);
    return rc;
}

int loom_gpt2_save(const struct loom_decoder *m, const char *path)
{
    return loom_gpt2_save_ext(m, path, NULL, 0, NULL, 0);
}

int loom_gpt2_save_ext(const struct loom_decoder *m, const char *path, const struct loom_st_tensor_in *extra,
                       int nextra, const char *const *meta_kv, int nmeta)
{
    int n = nextra;
    for (int bi = 0; bi < m->base.nblocks; bi++) n += m->base.blocks[bi].ntensors;
    struct loom_st_tensor_in *ts = calloc((size_t)n, sizeof *ts);
    /* names, and the metadata's keys and values, each as text */
    char(*names)[LOOM_TENSOR_NAME_MAX + 16] = calloc((size_t)n, sizeof *names);
    struct loom_model_shape shape;
    const struct loom_gpt2_config gc = loom_gpt2_config_of(m);
    loom_gpt2_shape(&gc, &shape);
    const int nown = 2 + shape.n;
    const char **meta = calloc((size_t)(nown + nmeta) * 2, sizeof *meta);
    char(*text)[2][64] = calloc((size_t)shape.n, sizeof *text);
    int rc = LOOM_OK;
    if (!ts || !names || !meta || !text) {
        rc = loom_error_set(LOOM_ERR_RUNTIME, "out of memory writing %s", path);
        goto done;
    }
    int k = 0;
    for (int bi = 0; bi < m->base.nblocks; bi++) {
        const struct loom_block *b = &m->base.blocks[bi];
        for (int ti = 0; ti < b->ntensors; ti++, k++) {
            const struct loom_tensor *t = &b->tensors[ti];
            /* an untied model under GPT2LMHeadModel's own names (transformer.h.0...,
             * lm_head.weight), which transformers needs once a head is beside the body */
            const int prefixed = m->spec.untied && strcmp(t->name, "lm_head.weight") != 0;
            snprintf(names[k], sizeof names[k], "%s%s", prefixed ? "transformer." : "", t->name);
            ts[k].name = names[k];
            ts[k].dtype = LOOM_DTYPE_F32;
            ts[k].ndim = t->ndim;
            ts[k].shape[0] = t->shape[0];
            ts[k].shape[1] = t->shape[1];
            ts[k].data = b->work_params + t->offset;
        }
    }
    for (int i = 0; i < nextra; i++) ts[k++] = extra[i];
    /* the model's shape, each setting as loom.<key> */
    meta[0] = "format", meta[1] = "pt", meta[2] = "loom.model", meta[3] = "gpt2";
    for (int i = 0; i < shape.n; i++) {
        snprintf(text[i][0], sizeof text[i][0], "loom.%s", shape.kv[i].key);
        loom_model_shape_text(&shape.kv[i], text[i][1], sizeof text[i][1]);
        meta[4 + 2 * i] = text[i][0];
        meta[5 + 2 * i] = text[i][1];
    }
    for (int i = 0; i < 2 * nmeta; i++) meta[2 * nown + i] = meta_kv[i];
    rc = loom_st_write(path, ts, n, meta, nown + nmeta);
done:
    free(text);
    free(meta);
    free(names);
    free(ts);
    return rc;
}

int loom_gpt2_read_metadata(const char *path, struct loom_model_shape *out, int *found)
{
    struct loom_st st;
    int rc = loom_st_open(&st, path);
    if (rc) return rc;
    memset(out, 0, sizeof *out);
    const char *model = loom_st_meta(&st, "loom.model");
    *found = model != NULL;
    if (model) {
        snprintf(out->type, sizeof out->type, "%s", model);
        struct loom_model_shape keys; /* the settings a GPT-2 records */
        const struct loom_gpt2_config any = {0};
        loom_gpt2_shape(&any, &keys);
        for (int i = 0; i < keys.n && rc == LOOM_OK; i++) {
            char key[64];
            snprintf(key, sizeof key, "loom.%s", keys.kv[i].key);
            const char *v = loom_st_meta(&st, key);
            if (!v) continue; /* older files: the family knows what its absence means */
            struct loom_shape_setting *kv = &out->kv[out->n];
            if (!loom_model_shape_parse(kv, v))
                rc = loom_error_set(LOOM_ERR_INPUT, "%s: metadata %s is '%s', not a setting's value", path,
                                    key, v);
            snprintf(kv->key, sizeof kv->key, "%s", keys.kv[i].key);
            out->n++;
        }
    }
    loom_st_close(&st);
    return rc;
}

int loom_gpt2_peek_config(const char *path, struct loom_gpt2_config *cfg)
{
    struct loom_st st;
    int rc = loom_st_open(&st, path);
    if (rc) return rc;
    memset(cfg, 0, sizeof *cfg);
    cfg->norm_eps = LOOM_GPT2_NORM_EPS;
    const struct loom_st_tensor *wte = find_tensor(&st, "wte.weight");
    const struct loom_st_tensor *wpe = find_tensor(&st, "wpe.weight");
    if (!wte || !wpe || wte->ndim != 2 || wpe->ndim != 2) {
        loom_st_close(&st);
        return loom_error_set(LOOM_ERR_INPUT, "%s: not GPT-2 weights (no 2-D wte.weight and wpe.weight)",
                              path);
    }
    /* a size past int is named as such, not as the int it would wrap to */
    const struct loom_st_tensor *const embeddings[] = {wte, wpe};
    for (int i = 0; i < 2; i++)
        for (int d = 0; d < 2; d++)
            if (embeddings[i]->shape[d] > INT_MAX) {
                const struct loom_st_tensor *t = embeddings[i];
                rc = loom_error_set(LOOM_ERR_INPUT,
                                    "%s: %s has shape [%lld, %lld]: dimension %d (%lld) is larger than any "
                                    "model size (at most %d)",
                                    path, t->name, (long long)t->shape[0], (long long)t->shape[1], d,
                                    (long long)t->shape[d], INT_MAX);
                loom_st_close(&st);
                return rc;
            }
    cfg->vocab = (int)wte->shape[0];
    cfg->hidden = (int)wte->shape[1];
    cfg->max_pos = (int)wpe->shape[0];
    char name[64];
    while (snprintf(name, sizeof name, "h.%d.ln_1.weight", cfg->num_layers), find_tensor(&st, name))
        cfg->num_layers++;
    static const int family[][2] = {{768, 12}, {1024, 16}, {1280, 20}, {1600, 25}};
    for (size_t i = 0; i < sizeof family / sizeof family[0]; i++)
        if (family[i][0] == cfg->hidden) cfg->heads = family[i][1];
    /* an LM head of its own: lm_head.weight, unless it only repeats wte */
    const struct loom_st_tensor *head = loom_st_find(&st, "lm_head.weight");
    if (head && head->ndim == 2 && head->shape[0] == wte->shape[0] && head->shape[1] == wte->shape[1]) {
        size_t n = (size_t)cfg->vocab * (size_t)cfg->hidden;
        float *a = malloc(n * sizeof(float)), *b = malloc(n * sizeof(float));
        if (!a || !b)
            rc = loom_error_set(LOOM_ERR_RUNTIME, "out of memory reading %s", path);
        else if ((rc = loom_st_read_f32(wte, a, n)) == LOOM_OK &&
                 (rc = loom_st_read_f32(head, b, n)) == LOOM_OK)
            cfg->untied = memcmp(a, b, n * sizeof(float)) != 0;
        free(a);
        free(b);
    } else if (head) {
        cfg->untied = 1; /* the loader says what is wrong with its shape */
    }
    loom_st_close(&st);
    return rc;
}

/* ---- weights sources: what --load names ---------------------------------- */

static int exists(const char *path)
{
    struct stat sb;
    return stat(path, &sb) == 0;
}

/* llm.c's magic, or a .bin name (whose reader then says what is wrong) */
static int is_llmc(const char *path)
{
    size_t n = strlen(path);
    return !loom_fs_is_dir(path) && (loom_llmc_sniff(path) || (n > 4 && strcmp(path + n - 4, ".bin") == 0));
}

/* dir/name into out. */
static void in_dir(const char *dir, const char *name, char *out, size_t n)
{
    size_t len = strlen(dir);
    snprintf(out, n, "%s%s%s", dir, len && dir[len - 1] == '/' ? "" : "/", name);
}

int loom_gpt2_source_file(const char *path, char *file, size_t n)
{
    if (!loom_fs_is_dir(path)) {
        snprintf(file, n, "%s", path);
        return LOOM_OK;
    }
    in_dir(path, "model.safetensors", file, n);
    if (!exists(file))
        return loom_error_set(
            LOOM_ERR_INPUT,
            "%s: no checkpoint there (no trainer_state.json, latest or iter_NNNNNNN) and no "
            "model.safetensors of a Hugging Face directory (sharded ones are not supported)",
            path);
    return LOOM_OK;
}

/* The config.json that describes path: in the directory, or beside the file. */
static void config_path(const char *path, char *out, size_t n)
{
    char dir[4096];
    if (loom_fs_is_dir(path))
        snprintf(dir, sizeof dir, "%s", path);
    else
        loom_fs_dirname(path, dir, sizeof dir);
    in_dir(dir, "config.json", out, n);
}

/* The sizes config.json gives (GPT2Config's defaults where a field is
 * absent) against those of the tensors beside it. */
static int check_config_tensors(const char *config, const struct loom_model_shape *shape, const char *file,
                                const struct loom_gpt2_config *t)
{
    static const struct {
        const char *key, *field, *tensors;
    } sizes[] = {{"num_layers", "n_layer", "layers (h.N.*)"},
                 {"hidden_size", "n_embd", "columns of wte.weight"},
                 {"max_position_embeddings", "n_positions", "rows of wpe.weight"},
                 {"vocab_size", "vocab_size", "rows of wte.weight"}};
    const int have[] = {t->num_layers, t->hidden, t->max_pos, t->vocab};
    for (int i = 0; i < 4; i++) {
        const struct loom_shape_setting *kv = loom_model_shape_find(shape, sizes[i].key);
        if (!kv || kv->value == have[i]) continue;
        if (loom_hf_config_gives(config, sizes[i].field)) /* the value given, not the default */
            return loom_error_set(LOOM_ERR_INPUT, "%s gives %s %lld, but %s has %d %s", config,
                                  sizes[i].field, (long long)kv->value, file, have[i], sizes[i].tensors);
        return loom_error_set(LOOM_ERR_INPUT,
                              "%s leaves out %s, so GPT2Config's default %lld holds, but %s has %d %s",
                              config, sizes[i].field, (long long)kv->value, file, have[i], sizes[i].tensors);
    }
    return LOOM_OK;
}

int loom_gpt2_source_shape(const char *path, struct loom_model_shape *out)
{
    memset(out, 0, sizeof *out);
    struct loom_gpt2_config c;
    int rc;
    if (is_llmc(path)) { /* llm.c: the header holds it all */
        if ((rc = loom_llmc_read_config(path, &c))) return rc;
        loom_gpt2_shape(&c, out);
        return LOOM_OK;
    }
    char file[4200], config[4200];
    if ((rc = loom_gpt2_source_file(path, file, sizeof file))) return rc;
    int found;
    if ((rc = loom_gpt2_read_metadata(file, out, &found))) return rc;
    config_path(path, config, sizeof config);
    const int have_config = exists(config);
    if (found) { /* loom wrote it: every setting, older files' absent ones GPT-2's */
        if (strcmp(out->type, "gpt2") != 0)
            return loom_error_set(LOOM_ERR_INPUT, "%s holds a %s model, not GPT-2", file, out->type);
        if ((rc = loom_gpt2_config_of_shape(out, &c))) {
            char why[300];
            snprintf(why, sizeof why, "%s", loom_error_message());
            return loom_error_set(rc, "%s: %s", file, why);
        }
        loom_gpt2_shape(&c, out);
        /* a config.json beside it describes the same model, or one of them is wrong */
        struct loom_model_shape described;
        if (have_config && (rc = loom_gpt2_hf_read_config(config, &described))) return rc;
        for (int i = 0; have_config && i < out->n; i++) {
            char a[48], b[48];
            loom_model_shape_text(&out->kv[i], a, sizeof a);
            loom_model_shape_text(loom_model_shape_find(&described, out->kv[i].key), b, sizeof b);
            if (strcmp(a, b) != 0)
                return loom_error_set(LOOM_ERR_INPUT, "%s records %s %s, but %s beside it says %s", file,
                                      out->kv[i].key, a, config, b);
        }
        return LOOM_OK;
    }
    if ((rc = loom_gpt2_peek_config(file, &c))) return rc;
    if (have_config) {
        if ((rc = loom_gpt2_hf_read_config(config, out))) return rc;
        return check_config_tensors(config, out, file, &c);
    }
    /* the tensors alone: no numerics, and the heads only from GPT-2's widths */
    memset(out, 0, sizeof *out);
    snprintf(out->type, sizeof out->type, "gpt2");
    loom_model_shape_add_int(out, "num_layers", c.num_layers);
    loom_model_shape_add_int(out, "hidden_size", c.hidden);
    if (c.heads) loom_model_shape_add_int(out, "num_attention_heads", c.heads);
    loom_model_shape_add_int(out, "max_position_embeddings", c.max_pos);
    loom_model_shape_add_int(out, "vocab_size", c.vocab);
    loom_model_shape_add_int(out, "untie_embeddings_and_output_weights", c.untied);
    return LOOM_OK;
}

int loom_gpt2_source_load(struct loom_decoder *m, const char *path)
{
    if (is_llmc(path)) return loom_llmc_load(m, path);
    char file[4200];
    int rc = loom_gpt2_source_file(path, file, sizeof file);
    return rc ? rc : loom_gpt2_load(m, file);
}
