/* A model's weights from a safetensors file, by name (see model_io.h). */
#include "model/model_io.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/log.h"

/* "[a, b]" of up to ndim sizes. */
static void shape_text(char *buf, size_t n, int ndim, const int64_t *shape)
{
    size_t l = 0;
    l += (size_t)snprintf(buf, n, "[");
    for (int d = 0; d < ndim && l < n; d++)
        l += (size_t)snprintf(buf + l, n - l, "%s%lld", d ? ", " : "", (long long)shape[d]);
    if (l < n) snprintf(buf + l, n - l, "]");
}

const struct loom_st_tensor *loom_model_find_tensor(const struct loom_st *st, const char *prefix,
                                                    const char *name)
{
    const struct loom_st_tensor *t = loom_st_find(st, name);
    if (t || !prefix) return t;
    char prefixed[LOOM_TENSOR_NAME_MAX + 64];
    snprintf(prefixed, sizeof prefixed, "%s%s", prefix, name);
    return loom_st_find(st, prefixed);
}

/* Tensor t of block b from the file's s. */
static int read_one(struct loom_block *b, const struct loom_tensor *t, const struct loom_st_tensor *s,
                    const char *path)
{
    int ok = s->ndim == t->ndim; /* the whole tensor's shape, whatever part this model holds */
    for (int d = 0; ok && d < t->ndim; d++) ok = s->shape[d] == t->full[d];
    if (!ok) {
        char want[96], got[96];
        shape_text(want, sizeof want, t->ndim, t->full);
        shape_text(got, sizeof got, s->ndim, s->shape);
        return loom_error_set(LOOM_ERR_INPUT, "%s: tensor %s has shape %s, expected %s", path, s->name, got,
                              want);
    }
    if (t->tp_split == LOOM_TP_REPLICATED) return loom_st_read_f32(s, b->work_params + t->offset, t->numel);
    /* a tensor-parallel part: the whole tensor, then this rank's box of it */
    size_t n = 1;
    for (int d = 0; d < t->ndim; d++) n *= (size_t)t->full[d];
    float *whole = malloc(n * sizeof(float));
    if (!whole) return loom_error_set(LOOM_ERR_RUNTIME, "out of memory reading %s", path);
    int rc = loom_st_read_f32(s, whole, n);
    if (rc == LOOM_OK) loom_tensor_take_part(t, whole, b->work_params + t->offset);
    free(whole);
    return rc;
}

/* Every tensor (seen NULL: each must be there), or those st holds. */
static int read_tensors(struct loom_model *m, const struct loom_st *st, const char *path, const char *prefix,
                        unsigned char *seen)
{
    int k = 0;
    for (int bi = 0; bi < m->nblocks; bi++) {
        struct loom_block *b = &m->blocks[bi];
        for (int ti = 0; ti < b->ntensors; ti++, k++) {
            const struct loom_tensor *t = &b->tensors[ti];
            const struct loom_st_tensor *s = loom_model_find_tensor(st, prefix, t->name);
            if (!s && seen) continue;
            if (!s) return loom_error_set(LOOM_ERR_INPUT, "%s: missing tensor %s", path, t->name);
            int rc = read_one(b, t, s, path);
            if (rc) return rc;
            if (seen) seen[k] = 1;
        }
    }
    return LOOM_OK;
}

int loom_model_read_tensors(struct loom_model *m, const struct loom_st *st, const char *path,
                            const char *prefix)
{
    return read_tensors(m, st, path, prefix, NULL);
}

int loom_model_read_present(struct loom_model *m, const struct loom_st *st, const char *path,
                            const char *prefix, unsigned char *seen)
{
    return read_tensors(m, st, path, prefix, seen);
}
