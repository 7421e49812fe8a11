/*
 * Loading and saving GPT-2 weights by Hugging Face name (see gpt2_io.h).
 */
#include "model/gpt2_io.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/log.h"
#include "io/safetensors.h"

static const struct loom_st_tensor *find_tensor(const struct loom_st *st, const char *name)
{
    const struct loom_st_tensor *t = loom_st_find(st, name);
    if (t) return t;
    char prefixed[128];
    snprintf(prefixed, sizeof prefixed, "transformer.%s", name);
    return loom_st_find(st, prefixed);
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

int loom_gpt2_load(struct loom_gpt2 *m, const char *path)
{
    struct loom_st st;
    int rc = loom_st_open(&st, path);
    if (rc) return rc;
    for (int bi = 0; bi < m->base.nblocks; bi++) {
        struct loom_block *b = &m->base.blocks[bi];
        for (int ti = 0; ti < b->ntensors; ti++) {
            const struct loom_tensor *t = &b->tensors[ti];
            const struct loom_st_tensor *s = find_tensor(&st, t->name);
            if (!s) {
                rc = loom_error_set(LOOM_ERR_INPUT, "%s: missing tensor %s", path, t->name);
                goto fail;
            }
            int ok = s->ndim == t->ndim;
            for (int d = 0; ok && d < t->ndim; d++) ok = s->shape[d] == t->shape[d];
            if (!ok) {
                char want[64], got[96] = "";
                if (t->ndim == 2)
                    snprintf(want, sizeof want, "[%lld, %lld]", (long long)t->shape[0],
                             (long long)t->shape[1]);
                else
                    snprintf(want, sizeof want, "[%lld]", (long long)t->shape[0]);
                for (int d = 0; d < s->ndim; d++) {
                    size_t l = strlen(got);
                    snprintf(got + l, sizeof got - l, "%s%lld", d ? ", " : "", (long long)s->shape[d]);
                }
                rc = loom_error_set(LOOM_ERR_INPUT, "%s: tensor %s has shape [%s], expected %s", path,
                                    s->name, got, want);
                goto fail;
            }
            if ((rc = loom_st_read_f32(s, b->work_params + t->offset, t->numel))) goto fail;
        }
    }
    /* GPT-2 tensors the model does not have are refused, not silently dropped */
    for (int i = 0; i < loom_st_count(&st); i++) {
        const char *name = loom_st_at(&st, i)->name;
        if (!ignorable(name) && !loom_model_find(&m->base, unprefixed(name), NULL)) {
            rc = loom_error_set(LOOM_ERR_INPUT, "%s: unexpected tensor %s (the model has %d layers)", path,
                                name, m->cfg.num_layers);
            goto fail;
        }
    }
    loom_st_close(&st);
    return LOOM_OK;
fail:
    loom_st_close(&st);
    return rc;
}

int loom_gpt2_save(const struct loom_gpt2 *m, const char *path)
{
    return loom_gpt2_save_ext(m, path, NULL, 0, NULL, 0);
}

int loom_gpt2_save_ext(const struct loom_gpt2 *m, const char *path, const struct loom_st_tensor_in *extra,
                       int nextra, const char *const *meta_kv, int nmeta)
{
    int n = nextra;
    for (int bi = 0; bi < m->base.nblocks; bi++) n += m->base.blocks[bi].ntensors;
    struct loom_st_tensor_in *ts = calloc((size_t)n, sizeof *ts);
    if (!ts) return loom_error_set(LOOM_ERR_RUNTIME, "out of memory writing %s", path);
    int k = 0;
    for (int bi = 0; bi < m->base.nblocks; bi++) {
        const struct loom_block *b = &m->base.blocks[bi];
        for (int ti = 0; ti < b->ntensors; ti++, k++) {
            const struct loom_tensor *t = &b->tensors[ti];
            ts[k].name = t->name;
            ts[k].dtype = LOOM_DTYPE_F32;
            ts[k].ndim = t->ndim;
            ts[k].shape[0] = t->shape[0];
            ts[k].shape[1] = t->shape[1];
            ts[k].data = b->work_params + t->offset;
        }
    }
    for (int i = 0; i < nextra; i++) ts[k++] = extra[i];
    char L[16], C[16], NH[16], P[16], V[16];
    snprintf(L, sizeof L, "%d", m->cfg.num_layers);
    snprintf(C, sizeof C, "%d", m->cfg.hidden);
    snprintf(NH, sizeof NH, "%d", m->cfg.heads);
    snprintf(P, sizeof P, "%d", m->cfg.max_pos);
    snprintf(V, sizeof V, "%d", m->cfg.vocab);
    const char *own[] = {"format",
                         "pt",
                         "loom.model",
                         "gpt2",
                         "loom.num_layers",
                         L,
                         "loom.hidden_size",
                         C,
                         "loom.num_attention_heads",
                         NH,
                         "loom.max_position_embeddings",
                         P,
                         "loom.vocab_size",
                         V};
    const int nown = (int)(sizeof own / sizeof own[0] / 2);
    const char **meta = calloc((size_t)(nown + nmeta) * 2, sizeof *meta);
    if (!meta) {
        free(ts);
        return loom_error_set(LOOM_ERR_RUNTIME, "out of memory writing %s", path);
    }
    memcpy(meta, own, sizeof own);
    for (int i = 0; i < 2 * nmeta; i++) meta[2 * nown + i] = meta_kv[i];
    int rc = loom_st_write(path, ts, n, meta, nown + nmeta);
    free(meta);
    free(ts);
    return rc;
}

static int meta_int(const struct loom_st *st, const char *key, int *out)
{
    const char *v = loom_st_meta(st, key);
    if (!v) return 0;
    char *end;
    long x = strtol(v, &end, 10);
    if (*end || x <= 0 || x > (1 << 24)) return 0;
    *out = (int)x;
    return 1;
}

int loom_gpt2_peek_config(const char *path, struct loom_gpt2_config *cfg)
{
    struct loom_st st;
    int rc = loom_st_open(&st, path);
    if (rc) return rc;
    memset(cfg, 0, sizeof *cfg);
    const struct loom_st_tensor *wte = find_tensor(&st, "wte.weight");
    const struct loom_st_tensor *wpe = find_tensor(&st, "wpe.weight");
    if (!wte || !wpe || wte->ndim != 2 || wpe->ndim != 2) {
        loom_st_close(&st);
        return loom_error_set(LOOM_ERR_INPUT, "%s: not GPT-2 weights (no 2-D wte.weight and wpe.weight)",
                              path);
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
    meta_int(&st, "loom.num_attention_heads", &cfg->heads);
    loom_st_close(&st);
    return LOOM_OK;
}
