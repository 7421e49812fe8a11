/*
 * A decoder family's weights sources (source.h): which file a path names,
 * and the shape it states.
 */
#include "model/source.h"

#include <limits.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>

#include "base/log.h"
#include "base/mem.h"
#include "io/fs.h"
#include "io/hf_config.h"
#include "io/safetensors.h"
#include "io/st_index.h"
#include "model/decoder_def.h"
#include "model/hf_decoder.h"
#include "model/llmc.h"
#include "model/model_io.h"

/* Anything there (a FIFO too: its reader refuses it, rather than the path
 * being taken as absent). */
static int exists(const char *path)
{
    struct stat sb;
    return stat(path, &sb) == 0;
}

int loom_source_is_llmc(const char *path)
{
    const size_t n = strlen(path);
    return !loom_fs_is_dir(path) && (loom_llmc_sniff(path) || (n > 4 && strcmp(path + n - 4, ".bin") == 0));
}

/* dir/name into out. */
static void in_dir(const char *dir, const char *name, char *out, size_t n)
{
    const size_t len = strlen(dir);
    snprintf(out, n, "%s%s%s", dir, len && dir[len - 1] == '/' ? "" : "/", name);
}

int loom_source_file(const char *path, char *file, size_t n)
{
    if (!loom_fs_is_dir(path)) {
        snprintf(file, n, "%s", path);
        return LOOM_OK;
    }
    in_dir(path, "model.safetensors", file, n);
    if (exists(file)) return LOOM_OK;
    in_dir(path, "model.safetensors.index.json", file, n); /* a sharded one (io/st_index.h) */
    if (!exists(file))
        return loom_error_set(
            LOOM_ERR_INPUT,
            "%s: no checkpoint there (no trainer_state.json, latest or iter_NNNNNNN) and no "
            "model.safetensors or model.safetensors.index.json of a Hugging Face directory",
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

/* loom's metadata: the settings loom.<key> (*found 0 without loom.model).
 * Keys under another module's name (loom.llmc.*, loom.xxh3.*) are its own. */
static int read_metadata(const char *file, struct loom_model_shape *out, int *found)
{
    struct loom_st st;
    struct loom_st_index x;
    int rc = loom_st_is_index(file) ? loom_st_index_read(file, &x) : LOOM_OK;
    if (rc) return rc;
    if (loom_st_is_index(file)) { /* a sharded checkpoint: its first shard's */
        rc = loom_st_open(&st, x.files[0]);
        loom_st_index_free(&x);
    } else {
        rc = loom_st_open(&st, file);
    }
    if (rc) return rc;
    const char *type = loom_st_meta(&st, "loom.model");
    *found = type != NULL;
    memset(out, 0, sizeof *out);
    if (type) snprintf(out->type, sizeof out->type, "%s", type);
    for (int i = 0; type && i < loom_st_meta_count(&st) && rc == LOOM_OK; i++) {
        const char *key, *value;
        loom_st_meta_at(&st, i, &key, &value);
        if (strncmp(key, "loom.", 5) != 0 || strchr(key + 5, '.') || strcmp(key, "loom.model") == 0) continue;
        if (out->n == LOOM_MODEL_SHAPE_MAX) {
            rc = loom_error_set(LOOM_ERR_INPUT, "%s: too many loom.* settings", file);
            break;
        }
        struct loom_shape_setting *kv = &out->kv[out->n];
        memset(kv, 0, sizeof *kv);
        if (strlen(key + 5) >= sizeof kv->key || !loom_model_shape_parse(kv, value)) {
            rc = loom_error_set(LOOM_ERR_INPUT, "%s: metadata %s is '%s', not a setting's value", file, key,
                                value);
            break;
        }
        snprintf(kv->key, sizeof kv->key, "%s", key + 5);
        out->n++;
    }
    loom_st_close(&st);
    return rc;
}

/* The sizes the tensors give: layers (counted by the layer's first norm),
 * width and vocabulary (the embedding), positions (the position table; 0
 * without one), and with `head` whether an LM head differs from the
 * embedding. */
struct tensor_sizes {
    int64_t layers, hidden, positions, vocab;
    int untied;
};

/* Whether an LM head differs from the embedding e (in float32). */
static int head_differs(const struct loom_st_tensor *e, const struct loom_st_tensor *head, int *out)
{
    if (head->ndim != 2 || head->shape[0] != e->shape[0] || head->shape[1] != e->shape[1])
        return *out = 1, LOOM_OK; /* the loader says what is wrong with its shape */
    const size_t n = (size_t)e->numel;
    float *a = loom_alloc(loom_mul_size(n, sizeof(float)), LOOM_MEM_OTHER),
          *b = loom_alloc(loom_mul_size(n, sizeof(float)), LOOM_MEM_OTHER);
    int rc = loom_st_read_f32(e, a, n);
    if (rc == LOOM_OK) rc = loom_st_read_f32(head, b, n);
    if (rc == LOOM_OK) *out = memcmp(a, b, n * sizeof(float)) != 0;
    loom_free(a);
    loom_free(b);
    return rc;
}

/* Of a sharded checkpoint's index, the shard that holds name (its first
 * when none does: the tensor is then missing there too). */
static const char *shard_of(const struct loom_st_index *x, const char *prefix, const char *name)
{
    const int f = loom_st_index_find(x, prefix, name);
    return x->files[f >= 0 ? f : 0];
}

static int tensor_sizes(const struct loom_decoder_def *d, const char *file, int head,
                        struct tensor_sizes *out)
{
    const struct loom_decoder_names *nm = d->arch->names;
    const char *prefix = d->hf->prefix;
    char emb_name[LOOM_TENSOR_NAME_MAX], pos_name[LOOM_TENSOR_NAME_MAX], name[2 * LOOM_TENSOR_NAME_MAX];
    snprintf(emb_name, sizeof emb_name, "%s.weight", nm->embedding);
    snprintf(pos_name, sizeof pos_name, "%s.weight", nm->positions ? nm->positions : "");
    /* a sharded checkpoint: the shards holding the tables, the layers from the index's names */
    const int sharded = loom_st_is_index(file);
    struct loom_st_index x;
    struct loom_st st, st2;
    int rc = sharded ? loom_st_index_read(file, &x) : LOOM_OK;
    if (rc) return rc;
    const char *efile = sharded ? shard_of(&x, prefix, emb_name) : file,
               *pfile = sharded && nm->positions ? shard_of(&x, prefix, pos_name) : efile;
    if ((rc = loom_st_open(&st, efile))) {
        if (sharded) loom_st_index_free(&x);
        return rc;
    }
    const int two = strcmp(pfile, efile) != 0;
    if (two && (rc = loom_st_open(&st2, pfile))) {
        loom_st_close(&st);
        loom_st_index_free(&x);
        return rc;
    }
    memset(out, 0, sizeof *out);
    const struct loom_st_tensor *e = loom_model_find_tensor(&st, prefix, emb_name),
                                *p = nm->positions
                                         ? loom_model_find_tensor(two ? &st2 : &st, prefix, pos_name)
                                         : NULL;
    if (!e || e->ndim != 2 || (nm->positions && (!p || p->ndim != 2))) {
        rc = loom_error_set(LOOM_ERR_INPUT, "%s: not %s weights (no 2-D %s%s%s)", file, d->family->title,
                            emb_name, nm->positions ? " and " : "", nm->positions ? pos_name : "");
        goto done;
    }
    /* a size past int is named as such, not as the int it would wrap to */
    const struct loom_st_tensor *const tables[] = {e, p};
    for (int i = 0; i < 2 && tables[i]; i++)
        for (int k = 0; k < 2; k++)
            if (tables[i]->shape[k] > INT_MAX) {
                const struct loom_st_tensor *t = tables[i];
                rc = loom_error_set(LOOM_ERR_INPUT,
                                    "%s: %s has shape [%lld, %lld]: dimension %d (%lld) is larger than any "
                                    "model size (at most %d)",
                                    file, t->name, (long long)t->shape[0], (long long)t->shape[1], k,
                                    (long long)t->shape[k], INT_MAX);
                goto done;
            }
    out->vocab = e->shape[0];
    out->hidden = e->shape[1];
    out->positions = p ? p->shape[0] : 0;
    for (;; out->layers++) {
        char layer[LOOM_TENSOR_NAME_MAX];
        snprintf(layer, sizeof layer, nm->layer, (int)out->layers);
        snprintf(name, sizeof name, "%s%s.weight", layer, nm->norm1);
        if (sharded ? loom_st_index_find(&x, prefix, name) < 0 : !loom_model_find_tensor(&st, prefix, name))
            break;
    }
    snprintf(name, sizeof name, "%s.weight", nm->lm_head);
    const struct loom_st_tensor *own = head && !sharded ? loom_model_find_tensor(&st, prefix, name) : NULL;
    if (own) rc = head_differs(e, own, &out->untied);
done:
    loom_st_close(&st);
    if (two) loom_st_close(&st2);
    if (sharded) loom_st_index_free(&x);
    return rc;
}

/* The sizes config.json gives (its config's defaults where a field is
 * absent) against those of the tensors beside it. */
static int check_config_tensors(const struct loom_decoder_def *d, const char *config,
                                const struct loom_model_shape *shape, const char *file,
                                const struct tensor_sizes *t)
{
    const struct loom_decoder_names *nm = d->arch->names;
    char layers[LOOM_TENSOR_NAME_MAX + 16] = "layers (", cols[LOOM_TENSOR_NAME_MAX],
                                       rows[LOOM_TENSOR_NAME_MAX], pos[LOOM_TENSOR_NAME_MAX], owner[64];
    size_t l = strlen(layers);
    for (const char *c = nm->layer; *c && l + 3 < sizeof layers; c++) { /* "h.%d." as "h.N.*" */
        const int index = c[0] == '%' && c[1] == 'd';
        layers[l++] = index ? 'N' : *c;
        c += index;
    }
    snprintf(layers + l, sizeof layers - l, "*)");
    snprintf(cols, sizeof cols, "columns of %s.weight", nm->embedding);
    snprintf(rows, sizeof rows, "rows of %s.weight", nm->embedding);
    snprintf(pos, sizeof pos, "rows of %s.weight", nm->positions ? nm->positions : "");
    snprintf(owner, sizeof owner, "%s%s", d->hf->config_class ? d->hf->config_class : "transformers",
             d->hf->config_class ? "'s" : "'");
    const struct {
        const char *key;
        int64_t have;
        const char *tensors;
        int held; /* the tensors hold it */
    } sizes[] = {{"num_layers", t->layers, layers, 1},
                 {"hidden_size", t->hidden, cols, 1},
                 {"max_position_embeddings", t->positions, pos, nm->positions != NULL},
                 {"vocab_size", t->vocab, rows, 1}};
    for (size_t i = 0; i < sizeof sizes / sizeof sizes[0]; i++) {
        const struct loom_shape_setting *kv = loom_model_shape_find(shape, sizes[i].key);
        if (!sizes[i].held || !kv || kv->value == sizes[i].have) continue;
        const struct loom_hf_key *k = loom_hf_key_of(d->hf, sizes[i].key);
        const char *field = k ? k->hf : sizes[i].key;
        if (loom_hf_config_gives(config, field)) /* the value given, not the default */
            return loom_error_set(LOOM_ERR_INPUT, "%s gives %s %lld, but %s has %lld %s", config, field,
                                  (long long)kv->value, file, (long long)sizes[i].have, sizes[i].tensors);
        return loom_error_set(LOOM_ERR_INPUT,
                              "%s leaves out %s, so %s default %lld holds, but %s has %lld %s", config, field,
                              owner, (long long)kv->value, file, (long long)sizes[i].have, sizes[i].tensors);
    }
    return LOOM_OK;
}

/* loom's metadata: every setting (an older file's absent ones the family's
 * defaults), which a config.json beside the file must agree with, but for
 * the training defaults config.json gives (the balancing loss: its form and
 * weight as transformers trains, which Megatron's per-layer loss has no
 * config.json form for); there the metadata's, the run's own, hold. */
static int metadata_shape(const struct loom_decoder_def *d, const char *file, const char *config,
                          struct loom_model_shape *out)
{
    if (strcmp(out->type, d->family->name) != 0)
        return loom_error_set(LOOM_ERR_INPUT, "%s holds a %s model, not %s", file, out->type,
                              d->family->title);
    struct loom_config cfg;
    memset(&cfg, 0, sizeof cfg);
    int rc = loom_decoder_def_apply_shape(d, out, &cfg);
    if (rc) {
        char why[300];
        snprintf(why, sizeof why, "%s", loom_error_message());
        return loom_error_set(rc, "%s: %s", file, why);
    }
    loom_decoder_def_shape_of(d, &cfg, out);
    struct loom_model_shape described;
    if (!exists(config)) return LOOM_OK;
    if ((rc = loom_hf_read_config(d, config, &described))) return rc;
    for (int i = 0; i < out->n; i++) {
        const struct loom_shape_setting *said = loom_model_shape_find(&described, out->kv[i].key);
        char a[48], b[48];
        if (!said || loom_decoder_def_flag_wins(d, out->kv[i].key)) continue;
        loom_model_shape_text(&out->kv[i], a, sizeof a);
        loom_model_shape_text(said, b, sizeof b);
        if (strcmp(a, b) != 0)
            return loom_error_set(LOOM_ERR_INPUT, "%s records %s %s, but %s beside it says %s", file,
                                  out->kv[i].key, a, config, b);
    }
    return LOOM_OK;
}

int loom_source_shape(const struct loom_decoder_def *d, const char *path, struct loom_model_shape *out)
{
    memset(out, 0, sizeof *out);
    if (loom_source_is_llmc(path)) return loom_llmc_read_shape(d, path, out);
    char file[4200], config[4200];
    int rc, found;
    if ((rc = loom_source_file(path, file, sizeof file)) || (rc = read_metadata(file, out, &found)))
        return rc;
    config_path(path, config, sizeof config);
    if (found) return metadata_shape(d, file, config, out);
    struct tensor_sizes t;
    if (exists(config)) {
        if ((rc = tensor_sizes(d, file, 0, &t)) || (rc = loom_hf_read_config(d, config, out))) return rc;
        return check_config_tensors(d, config, out, file, &t);
    }
    if (!d->hf->widths || loom_st_is_index(file))
        return loom_error_set(
            LOOM_ERR_INPUT,
            "%s: a %s safetensors file needs its config.json beside it (%s): the tensors do "
            "not say the heads, the key/value heads, the rotary base or the eps",
            path, d->family->title, config);
    /* the tensors alone: no numerics, and the heads of a published width only */
    if ((rc = tensor_sizes(d, file, 1, &t))) return rc;
    snprintf(out->type, sizeof out->type, "%s", d->family->name);
    loom_model_shape_add_int(out, "num_layers", t.layers);
    loom_model_shape_add_int(out, "hidden_size", t.hidden);
    for (const struct loom_hf_width *w = d->hf->widths; w->hidden; w++)
        if (w->hidden == t.hidden) loom_model_shape_add_int(out, "num_attention_heads", w->heads);
    if (t.positions) loom_model_shape_add_int(out, "max_position_embeddings", t.positions);
    loom_model_shape_add_int(out, "vocab_size", t.vocab);
    loom_model_shape_add_int(out, "untie_embeddings_and_output_weights", t.untied);
    return LOOM_OK;
}

int loom_source_read_shape(const struct loom_decoder_def *d, const char *path, const struct loom_config *cfg,
                           struct loom_model_shape *out)
{
    int rc = loom_source_shape(d, path, out);
    if (rc == LOOM_OK && !loom_model_shape_find(out, "num_attention_heads") &&
        !loom_config_given(cfg, "--num-attention-heads")) {
        const struct loom_shape_setting *C = loom_model_shape_find(out, "hidden_size");
        rc = loom_error_set(LOOM_ERR_INPUT,
                            "%s does not say how many attention heads the model has (hidden size %lld, no "
                            "config.json beside it): give --num-attention-heads",
                            path, C ? (long long)C->value : 0LL);
    }
    return rc;
}

int loom_source_load(struct loom_model *m, const char *path)
{
    if (loom_source_is_llmc(path)) return loom_llmc_load(loom_decoder_of(m), path);
    char file[4200];
    int rc = loom_source_file(path, file, sizeof file);
    return rc ? rc : loom_hf_load(m, file);
}
