/*
 * The safetensors writer: checks its arguments, lays tensors out by element
 * size (largest first) then name, pads the JSON header with spaces to a
 * multiple of 8, and writes crash-safely through loom_fs_atomic (temporary
 * name, fsync, rename, directory fsync), tensors given by a fill callback
 * through one staging buffer. The header is formatted with cJSON (string escaping) but
 * every integer is emitted here, so sizes never pass through a double. The
 * reader is safetensors.c; see safetensors.h.
 */
#include "io/safetensors.h"
#include "io/safetensors_impl.h"

#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cjson/cJSON.h>

#include "base/log.h"
#include "base/mem.h"
#include "io/fs.h"

/* ---- writer ---------------------------------------------------------------- */

struct out_tensor {
    const struct loom_st_tensor_in *in;
    size_t esize;
    uint64_t nbytes, offset;
};

static int cmp_out_name(const void *a, const void *b)
{
    return strcmp(((const struct out_tensor *)a)->in->name, ((const struct out_tensor *)b)->in->name);
}

/* Data order: larger elements first, so each tensor stays aligned to its
 * element size once the header is padded to a multiple of 8; then by name. */
static int cmp_out_layout(const void *a, const void *b)
{
    const struct out_tensor *x = a, *y = b;
    if (x->esize != y->esize) return x->esize > y->esize ? -1 : 1;
    return cmp_out_name(a, b);
}

/* Strict UTF-8 (no overlong forms, surrogates or values past U+10FFFF), as
 * other readers decode the header before parsing it. */
static int valid_utf8(const char *str)
{
    const unsigned char *s = (const unsigned char *)str;
    while (*s) {
        unsigned c = *s++;
        if (c < 0x80) continue;
        int more = c >= 0xc2 && c <= 0xdf ? 1 : c >= 0xe0 && c <= 0xef ? 2 : c >= 0xf0 && c <= 0xf4 ? 3 : -1;
        if (more < 0) return 0;
        unsigned cp = c & (0x3fu >> more);
        for (int k = 0; k < more; k++, s++) {
            if ((*s & 0xc0) != 0x80) return 0;
            cp = cp << 6 | (*s & 0x3fu);
        }
        if ((more == 2 && (cp < 0x800 || (cp >= 0xd800 && cp <= 0xdfff))) ||
            (more == 3 && (cp < 0x10000 || cp > 0x10ffff)))
            return 0;
    }
    return 1;
}

/* Checks the arguments and fills out[] in data order with offsets. */
static int plan_tensors(const char *path, const struct loom_st_tensor_in *in, int n,
                        const char *const *meta_kv, int nmeta, struct out_tensor *out)
{
    char nb[80];
    for (int i = 0; i < n; i++) {
        const struct loom_st_tensor_in *t = &in[i];
        if (!t->name) return loom_st_bad_file(path, "tensor %d has no name", i);
        const char *name = loom_st_shown(t->name, nb, sizeof nb);
        if (strcmp(t->name, "__metadata__") == 0)
            return loom_st_bad_file(path, "tensor name \"__metadata__\" is reserved");
        if (!valid_utf8(t->name)) return loom_st_bad_file(path, "tensor '%s': name is not UTF-8", name);
        if ((unsigned)t->dtype >= LOOM_DTYPE_COUNT)
            return loom_st_bad_file(path, "tensor '%s': dtype value %d is out of range", name, (int)t->dtype);
        if (t->ndim < 0 || t->ndim > LOOM_ST_MAX_DIMS)
            return loom_st_bad_file(path, "tensor '%s': ndim %d is outside 0..%d", name, t->ndim,
                                    LOOM_ST_MAX_DIMS);
        uint64_t numel = 1;
        for (int d = 0; d < t->ndim; d++) {
            if (t->shape[d] < 0 || (uint64_t)t->shape[d] > LOOM_ST_MAX_EXACT_INT)
                return loom_st_bad_file(path, "tensor '%s': shape[%d] = %" PRId64 " is out of range", name, d,
                                        t->shape[d]);
            uint64_t v = (uint64_t)t->shape[d];
            if (v != 0 && numel > UINT64_MAX / v)
                return loom_st_bad_file(path, "tensor '%s': element count overflows", name);
            numel *= v;
        }
        out[i].in = t;
        out[i].esize = loom_st_dtype_size(t->dtype);
        if (numel > LOOM_ST_MAX_EXACT_INT / out[i].esize)
            return loom_st_bad_file(path, "tensor '%s': byte size overflows", name);
        out[i].nbytes = numel * out[i].esize;
        if (out[i].nbytes > 0 && !t->data && !t->fill)
            return loom_st_bad_file(path, "tensor '%s': data is NULL", name);
    }
    qsort(out, (size_t)n, sizeof *out, cmp_out_name);
    for (int i = 1; i < n; i++)
        if (strcmp(out[i - 1].in->name, out[i].in->name) == 0)
            return loom_st_bad_file(path, "tensor '%s' is given twice",
                                    loom_st_shown(out[i].in->name, nb, sizeof nb));
    qsort(out, (size_t)n, sizeof *out, cmp_out_layout);
    uint64_t offset = 0;
    for (int i = 0; i < n; i++) {
        out[i].offset = offset;
        if (out[i].nbytes > LOOM_ST_MAX_EXACT_INT - offset)
            return loom_st_bad_file(path, "total data size overflows");
        offset += out[i].nbytes;
    }

    for (int i = 0; i < 2 * nmeta; i++) {
        if (!meta_kv[i])
            return loom_st_bad_file(path, "metadata %s %d is NULL", i % 2 ? "value" : "key", i / 2);
        if (!valid_utf8(meta_kv[i]))
            return loom_st_bad_file(path, "metadata %s '%s' is not UTF-8", i % 2 ? "value" : "key",
                                    loom_st_shown(meta_kv[i], nb, sizeof nb));
    }
    int rc = 0;
    const char **keys = loom_alloc(((size_t)nmeta + 1) * sizeof *keys, LOOM_MEM_OTHER);
    for (int i = 0; i < nmeta; i++) keys[i] = meta_kv[2 * i];
    qsort(keys, (size_t)nmeta, sizeof *keys, loom_st_cmp_pair_key);
    for (int i = 1; i < nmeta; i++) {
        if (strcmp(keys[i - 1], keys[i]) == 0) {
            rc = loom_st_bad_file(path, "metadata key '%s' is given twice",
                                  loom_st_shown(keys[i], nb, sizeof nb));
            break;
        }
    }
    loom_free(keys);
    return rc;
}

/* Adds an integer to a cJSON array as raw text (never through a double). */
static int add_uint(cJSON *arr, uint64_t v)
{
    char num[24];
    snprintf(num, sizeof num, "%" PRIu64, v);
    cJSON *item = cJSON_CreateRaw(num);
    return item && cJSON_AddItemToArray(arr, item) ? 0 : -1;
}

/* The header JSON (cJSON-allocated), or NULL when out of memory. */
static char *format_header(const struct out_tensor *out, int n, const char *const *meta_kv, int nmeta)
{
    char *text = NULL;
    cJSON *root = cJSON_CreateObject();
    if (!root) return NULL;
    if (nmeta > 0) {
        cJSON *m = cJSON_AddObjectToObject(root, "__metadata__");
        if (!m) goto fail;
        for (int i = 0; i < nmeta; i++)
            if (!cJSON_AddStringToObject(m, meta_kv[2 * i], meta_kv[2 * i + 1])) goto fail;
    }
    for (int i = 0; i < n; i++) {
        const struct loom_st_tensor_in *t = out[i].in;
        cJSON *e = cJSON_AddObjectToObject(root, t->name);
        if (!e || !cJSON_AddStringToObject(e, "dtype", loom_st_dtype_name(t->dtype))) goto fail;
        cJSON *shape = cJSON_AddArrayToObject(e, "shape");
        if (!shape) goto fail;
        for (int d = 0; d < t->ndim; d++)
            if (add_uint(shape, (uint64_t)t->shape[d]) != 0) goto fail;
        cJSON *offs = cJSON_AddArrayToObject(e, "data_offsets");
        if (!offs || add_uint(offs, out[i].offset) != 0 || add_uint(offs, out[i].offset + out[i].nbytes) != 0)
            goto fail;
    }
    text = cJSON_PrintUnformatted(root);
fail:
    cJSON_Delete(root);
    return text;
}

/* The tensors' bytes in data order; those made by fill pass through one
 * staging buffer. */
static int write_data(struct loom_fs_atomic *w, const struct out_tensor *out, int n)
{
    int rc = LOOM_OK;
    void *stage = NULL;
    for (int i = 0; rc == LOOM_OK && i < n; i++) {
        const struct loom_st_tensor_in *t = out[i].in;
        if (t->data) {
            rc = loom_fs_atomic_write(w, t->data, (size_t)out[i].nbytes);
            continue;
        }
        if (!stage && out[i].nbytes) stage = loom_alloc(LOOM_ST_FILL_BYTES, LOOM_MEM_OTHER);
        for (uint64_t at = 0; rc == LOOM_OK && at < out[i].nbytes; at += LOOM_ST_FILL_BYTES) {
            size_t k =
                out[i].nbytes - at < LOOM_ST_FILL_BYTES ? (size_t)(out[i].nbytes - at) : LOOM_ST_FILL_BYTES;
            if ((rc = t->fill(t->fill_ctx, at, stage, k)) == LOOM_OK) rc = loom_fs_atomic_write(w, stage, k);
        }
    }
    loom_free(stage);
    return rc;
}

int loom_st_write_restamped(const char *path, const struct loom_st_tensor_in *tensors, int n,
                            const char *const *meta_kv, int nmeta, void (*restamp)(void *ctx), void *ctx)
{
    int rc = 0;
    char *header = NULL;
    struct out_tensor *out = NULL;
    struct loom_fs_atomic w;
    w.fd = -1;
    LOOM_ASSERT(path != NULL);
    if (n < 0 || nmeta < 0 || (n > 0 && !tensors) || (nmeta > 0 && !meta_kv))
        return loom_st_bad_file(path, "bad arguments: %d tensors, %d metadata pairs", n, nmeta);

    out = loom_alloc(((size_t)n + 1) * sizeof *out, LOOM_MEM_OTHER);
    if ((rc = plan_tensors(path, tensors, n, meta_kv, nmeta, out)) != 0) goto fail;
    header = format_header(out, n, meta_kv, nmeta);
    if (!header) {
        rc = loom_error_set(LOOM_ERR_RUNTIME, "%s: out of memory formatting the header", path);
        goto fail;
    }
    size_t hlen = strlen(header), padded = (hlen + 7) / 8 * 8;
    if (padded > LOOM_ST_MAX_HEADER) {
        rc = loom_st_bad_file(path, "header of %zu bytes is over the readers' limit of %" PRIu64, padded,
                              LOOM_ST_MAX_HEADER);
        goto fail;
    }
    unsigned char size_le[8];
    for (int i = 0; i < 8; i++) size_le[i] = (unsigned char)((uint64_t)padded >> (8 * i));
    char spaces[8];
    memset(spaces, ' ', sizeof spaces);
    if ((rc = loom_fs_atomic_open(&w, path)) || (rc = loom_fs_atomic_write(&w, size_le, sizeof size_le)) ||
        (rc = loom_fs_atomic_write(&w, header, hlen)) ||
        (rc = loom_fs_atomic_write(&w, spaces, padded - hlen)) || (rc = write_data(&w, out, n)))
        goto fail;
    if (restamp) {
        restamp(ctx);
        cJSON_free(header);
        header = format_header(out, n, meta_kv, nmeta);
        if (!header || strlen(header) != hlen) {
            rc = loom_error_set(LOOM_ERR_RUNTIME, "%s: the header changed length when completed", path);
            goto fail;
        }
        if ((rc = loom_fs_atomic_rewrite(&w, header, hlen, sizeof size_le))) goto fail;
    }
    rc = loom_fs_atomic_commit(&w);
    w.fd = -1;
fail:
    if (w.fd >= 0) loom_fs_atomic_abort(&w);
    cJSON_free(header);
    loom_free(out);
    return rc;
}

int loom_st_write(const char *path, const struct loom_st_tensor_in *tensors, int n,
                  const char *const *meta_kv, int nmeta)
{
    return loom_st_write_restamped(path, tensors, n, meta_kv, nmeta, NULL, NULL);
}
