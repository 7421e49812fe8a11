/*
 * Llama's weights sources (what --load names, and eval and sample): a
 * Hugging Face directory (config.json + model.safetensors) or a safetensors
 * file under Hugging Face's names, with loom's own metadata (loom.model
 * "llama", loom.<setting>) or a config.json beside it. The tensors alone do
 * not say the heads, the key/value heads, the rotary base or the eps, so
 * one of the two is required. Saving writes the metadata, so a file loom
 * wrote loads on its own.
 */
#include "model/llama_io.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "base/log.h"
#include "io/fs.h"
#include "io/safetensors.h"
#include "model/family.h"
#include "model/llama_hf.h"
#include "model/model_io.h"

static int exists(const char *path)
{
    struct stat s;
    return stat(path, &s) == 0 && S_ISREG(s.st_mode);
}

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

/* The vocabulary and width config.json gives against model.embed_tokens. */
static int check_tensors(const char *config, const char *file, const struct loom_model_shape *shape)
{
    struct loom_st st;
    int rc = loom_st_open(&st, file);
    if (rc) return rc;
    const struct loom_st_tensor *e = loom_st_find(&st, "model.embed_tokens.weight");
    const struct loom_shape_setting *V = loom_model_shape_find(shape, "vocab_size"),
                                    *C = loom_model_shape_find(shape, "hidden_size");
    if (!e || e->ndim != 2)
        rc = loom_error_set(LOOM_ERR_INPUT, "%s: not Llama weights (no 2-D model.embed_tokens.weight)", file);
    else if (e->shape[0] != V->value || e->shape[1] != C->value)
        rc = loom_error_set(
            LOOM_ERR_INPUT,
            "%s says vocab_size %lld and hidden_size %lld, but %s has model.embed_tokens.weight "
            "[%lld, %lld]",
            config, (long long)V->value, (long long)C->value, file, (long long)e->shape[0],
            (long long)e->shape[1]);
    loom_st_close(&st);
    return rc;
}

int loom_llama_source_shape(const char *path, struct loom_model_shape *out)
{
    char file[4200], config[4200];
    int rc = source_paths(path, file, config, sizeof file), found = 0;
    if (rc || (rc = read_metadata(file, out, &found))) return rc;
    if (found) {
        if (strcmp(out->type, "llama") != 0)
            return loom_error_set(LOOM_ERR_INPUT, "%s holds a %s model, not Llama", file, out->type);
        return LOOM_OK;
    }
    if (!exists(config))
        return loom_error_set(
            LOOM_ERR_INPUT,
            "%s: a Llama safetensors file needs its config.json beside it (%s): the tensors do "
            "not say the heads, the key/value heads, the rotary base or the eps",
            path, config);
    if ((rc = loom_llama_hf_read_config(config, out))) return rc;
    return check_tensors(config, file, out);
}

/* Tensors a Llama file may hold beside the model's: older exports' rotary
 * frequencies (derived, not weights). */
static int ignorable(const char *name)
{
    const char *s = strstr(name, "rotary_emb.inv_freq");
    return s && s[strlen("rotary_emb.inv_freq")] == '\0';
}

int loom_llama_load(struct loom_decoder *m, const char *path)
{
    char file[4200], config[4200];
    int rc = source_paths(path, file, config, sizeof file);
    if (rc) return rc;
    struct loom_st st;
    if ((rc = loom_st_open(&st, file))) return rc;
    if ((rc = loom_model_read_tensors(&m->base, &st, file, NULL))) goto done;
    /* a pipeline stage skips the other stages' tensors (described by the
     * whole model, made the first time a name is not this stage's) */
    struct loom_decoder *whole = NULL;
    for (int i = 0; i < loom_st_count(&st) && rc == LOOM_OK; i++) {
        const char *name = loom_st_at(&st, i)->name;
        if (ignorable(name) || loom_model_find(&m->base, name, NULL)) continue;
        if (!whole) whole = loom_decoder_create_whole(&m->spec, 1, m->T);
        if (loom_model_find(&whole->base, name, NULL)) continue;
        if (strcmp(name, "lm_head.weight") == 0) /* a tied model must not drop a head of the file's own */
            rc = loom_error_set(LOOM_ERR_INPUT,
                                "%s: has lm_head.weight, but the model ties its LM head to "
                                "model.embed_tokens.weight (tie_word_embeddings false, or "
                                "--untie-embeddings-and-output-weights, describes this file)",
                                file);
        else
            rc = loom_error_set(LOOM_ERR_INPUT, "%s: unexpected tensor %s (the model has %d layers)", file,
                                name, m->spec.num_layers);
    }
    loom_decoder_free(whole);
done:
    loom_st_close(&st);
    return rc;
}

int loom_llama_save(const struct loom_decoder *m, const char *path)
{
    int n = 0;
    for (int bi = 0; bi < m->base.nblocks; bi++) n += m->base.blocks[bi].ntensors;
    struct loom_st_tensor_in *ts = calloc((size_t)n, sizeof *ts);
    struct loom_model_shape shape;
    const struct loom_llama_config c = loom_llama_config_of(m);
    loom_llama_shape(&c, &shape);
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
    meta[0] = "format", meta[1] = "pt", meta[2] = "loom.model", meta[3] = "llama";
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
