/*
 * Checkpoint pieces: slice descriptions, writing one rank's file with its
 * slices and checksums, and assembling any flat range of a full tensor from
 * the pieces of every file (see checkpoint.h). The trainer state is
 * checkpoint_state.c, the save directory checkpoint_dir.c.
 */
#include "io/checkpoint.h"

#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cjson/cJSON.h>
#include <xxhash.h>

#include "base/log.h"
#include "base/mem.h"
#include "base/testpoint.h"
#include "io/safetensors.h"

#define MAX_EXACT ((double)(1ull << 53)) /* JSON numbers above this are not exact integers */

/* ---- slices ------------------------------------------------------------- */

void loom_ckpt_slice_whole(struct loom_ckpt_slice *s, int ndim, const int64_t *shape)
{
    LOOM_ASSERT(ndim >= 0 && ndim <= LOOM_CKPT_MAX_DIMS);
    memset(s, 0, sizeof *s);
    s->ndim = ndim;
    for (int d = 0; d < ndim; d++) s->shape[d] = s->stop[d] = shape[d];
    s->hi = loom_ckpt_slice_box_numel(s);
}

void loom_ckpt_slice_range(struct loom_ckpt_slice *s, int ndim, const int64_t *shape, uint64_t lo,
                           uint64_t hi)
{
    loom_ckpt_slice_whole(s, ndim, shape);
    LOOM_ASSERT(lo <= hi && hi <= s->hi);
    s->lo = lo;
    s->hi = hi;
}

uint64_t loom_ckpt_slice_box_numel(const struct loom_ckpt_slice *s)
{
    uint64_t n = 1;
    for (int d = 0; d < s->ndim; d++) n *= (uint64_t)(s->stop[d] - s->start[d]);
    return n;
}

static int box_is_whole(const struct loom_ckpt_slice *s)
{
    for (int d = 0; d < s->ndim; d++)
        if (s->start[d] != 0 || s->stop[d] != s->shape[d]) return 0;
    return 1;
}

int loom_ckpt_slice_is_whole(const struct loom_ckpt_slice *s)
{
    return box_is_whole(s) && s->lo == 0 && s->hi == loom_ckpt_slice_box_numel(s);
}

int loom_ckpt_slice_format(const struct loom_ckpt_slice *s, char *buf, size_t n)
{
    size_t k = 0;
#define PUT(...) (k += (size_t)snprintf(buf + (k < n ? k : n), k < n ? n - k : 0, __VA_ARGS__))
    PUT("{\"shape\":[");
    for (int d = 0; d < s->ndim; d++) PUT("%s%" PRId64, d ? "," : "", s->shape[d]);
    PUT("],\"box\":[");
    for (int d = 0; d < s->ndim; d++)
        PUT("%s[%" PRId64 ",%" PRId64 "]", d ? "," : "", s->start[d], s->stop[d]);
    PUT("],\"range\":[%" PRIu64 ",%" PRIu64 "]}", s->lo, s->hi);
#undef PUT
    return k < n ? LOOM_OK : loom_error_set(LOOM_ERR_RUNTIME, "slice description longer than %zu bytes", n);
}

/* A JSON number that is an exact non-negative integer. */
static int get_uint(const cJSON *v, uint64_t *out)
{
    if (!cJSON_IsNumber(v)) return -1;
    double x = v->valuedouble;
    if (!(x >= 0 && x <= MAX_EXACT) || x != (double)(uint64_t)x) return -1;
    *out = (uint64_t)x;
    return 0;
}

int loom_ckpt_slice_parse(const char *json, struct loom_ckpt_slice *s)
{
    memset(s, 0, sizeof *s);
    cJSON *root = cJSON_Parse(json);
    int rc = LOOM_OK;
    if (!cJSON_IsObject(root)) {
        rc = loom_error_set(LOOM_ERR_INPUT, "slice is not a JSON object");
        goto done;
    }
    const cJSON *shape = cJSON_GetObjectItemCaseSensitive(root, "shape");
    const cJSON *box = cJSON_GetObjectItemCaseSensitive(root, "box");
    const cJSON *range = cJSON_GetObjectItemCaseSensitive(root, "range");
    int nd = cJSON_GetArraySize(shape);
    if (!cJSON_IsArray(shape) || nd > LOOM_CKPT_MAX_DIMS) {
        rc = loom_error_set(LOOM_ERR_INPUT, "slice shape is not an array of at most %d sizes",
                            LOOM_CKPT_MAX_DIMS);
        goto done;
    }
    if (!cJSON_IsArray(box) || cJSON_GetArraySize(box) != nd) {
        rc = loom_error_set(LOOM_ERR_INPUT, "slice box is not an array of %d [start, stop] pairs", nd);
        goto done;
    }
    s->ndim = nd;
    uint64_t numel = 1;
    for (int d = 0; d < nd; d++) {
        uint64_t dim, a, b;
        const cJSON *pair = cJSON_GetArrayItem(box, d);
        if (get_uint(cJSON_GetArrayItem(shape, d), &dim) || dim > (1ull << 40)) {
            rc = loom_error_set(LOOM_ERR_INPUT, "slice shape[%d] is not a size", d);
            goto done;
        }
        if (!cJSON_IsArray(pair) || cJSON_GetArraySize(pair) != 2 ||
            get_uint(cJSON_GetArrayItem(pair, 0), &a) || get_uint(cJSON_GetArrayItem(pair, 1), &b) || a > b ||
            b > dim) {
            rc = loom_error_set(LOOM_ERR_INPUT, "slice box[%d] is not a [start, stop] inside 0..%" PRIu64, d,
                                dim);
            goto done;
        }
        s->shape[d] = (int64_t)dim;
        s->start[d] = (int64_t)a;
        s->stop[d] = (int64_t)b;
        if (b - a && numel > (1ull << 53) / (b - a)) {
            rc = loom_error_set(LOOM_ERR_INPUT, "slice box holds more than 2^53 elements");
            goto done;
        }
        numel *= b - a;
    }
    if (!cJSON_IsArray(range) || cJSON_GetArraySize(range) != 2 ||
        get_uint(cJSON_GetArrayItem(range, 0), &s->lo) || get_uint(cJSON_GetArrayItem(range, 1), &s->hi) ||
        s->lo > s->hi || s->hi > numel) {
        rc = loom_error_set(LOOM_ERR_INPUT,
                            "slice range is not a [lo, hi] inside the box's %" PRIu64 " elements", numel);
        goto done;
    }
done:
    cJSON_Delete(root);
    return rc;
}

/* ---- writing ------------------------------------------------------------ */

int loom_ckpt_write_file(const char *path, const struct loom_ckpt_piece *pieces, int n,
                         const char *const *extra_kv, int nextra)
{
    enum { KEY = 96, VAL = 640 };
    struct loom_st_tensor_in *ts = loom_alloc(loom_mul_size((size_t)n + 1, sizeof *ts), LOOM_MEM_OTHER);
    const char **kv =
        loom_alloc(loom_mul_size(2 * (2 * (size_t)n + (size_t)nextra) + 1, sizeof *kv), LOOM_MEM_OTHER);
    char *text = loom_alloc(loom_mul_size(2 * (size_t)n + 1, KEY + VAL), LOOM_MEM_OTHER);
    uint64_t *sums = loom_alloc(loom_mul_size((size_t)n + 1, sizeof *sums), LOOM_MEM_OTHER);
    int rc = LOOM_OK, nt = 0, nm = 0;
    /* the checksums, pieces spread over the threads */
#pragma omp parallel for schedule(dynamic, 1)
    for (int i = 0; i < n; i++)
        sums[i] = XXH3_64bits(pieces[i].data, (pieces[i].slice.hi - pieces[i].slice.lo) * sizeof(float));
    for (int i = 0; i < n; i++) {
        const struct loom_ckpt_piece *p = &pieces[i];
        const struct loom_ckpt_slice *s = &p->slice;
        uint64_t count = s->hi - s->lo;
        if (count == 0) continue;
        struct loom_st_tensor_in *t = &ts[nt++];
        t->name = p->name;
        t->dtype = LOOM_DTYPE_F32;
        t->data = p->data;
        if (s->lo == 0 && s->hi == loom_ckpt_slice_box_numel(s)) { /* the whole box */
            t->ndim = s->ndim;
            for (int d = 0; d < s->ndim; d++) t->shape[d] = s->stop[d] - s->start[d];
        } else {
            t->ndim = 1;
            t->shape[0] = (int64_t)count;
        }
        char *key = text + (size_t)(2 * i) * (KEY + VAL), *val = key + KEY;
        snprintf(key, KEY, "loom.xxh3.%s", p->name);
        snprintf(val, VAL, "%016" PRIx64, sums[i]);
        kv[2 * nm] = key, kv[2 * nm + 1] = val, nm++;
        if (!loom_ckpt_slice_is_whole(s)) {
            key = text + (size_t)(2 * i + 1) * (KEY + VAL), val = key + KEY;
            snprintf(key, KEY, "loom.slice.%s", p->name);
            if ((rc = loom_ckpt_slice_format(s, val, VAL))) goto done;
            kv[2 * nm] = key, kv[2 * nm + 1] = val, nm++;
        }
    }
    for (int i = 0; i < nextra; i++, nm++) kv[2 * nm] = extra_kv[2 * i], kv[2 * nm + 1] = extra_kv[2 * i + 1];
    rc = loom_st_write(path, ts, nt, kv, nm);
    if (rc == LOOM_OK) loom_test_point("after-rank-file");
done:
    loom_free(sums);
    loom_free(ts);
    loom_free(kv);
    loom_free(text);
    return rc;
}

/* ---- reading ------------------------------------------------------------ */

struct piece {
    const char *name;
    int file;
    const struct loom_st_tensor *t;
    struct loom_ckpt_slice s;
    uint64_t xxh;
    int verified;
};

struct loom_ckpt_reader {
    int nfiles;
    struct loom_st *files;
    struct piece *pieces; /* sorted by name, then file */
    int npieces;
};

static int cmp_piece(const void *a, const void *b)
{
    const struct piece *x = a, *y = b;
    int c = strcmp(x->name, y->name);
    return c ? c : (x->file > y->file) - (x->file < y->file);
}

static int same_shape(const struct loom_ckpt_slice *a, int ndim, const int64_t *shape)
{
    if (a->ndim != ndim) return 0;
    for (int d = 0; d < ndim; d++)
        if (a->shape[d] != shape[d]) return 0;
    return 1;
}

static void shape_text(char *buf, size_t n, int ndim, const int64_t *shape)
{
    size_t k = (size_t)snprintf(buf, n, "[");
    for (int d = 0; d < ndim && k < n; d++)
        k += (size_t)snprintf(buf + k, n - k, "%s%" PRId64, d ? ", " : "", shape[d]);
    if (k < n) snprintf(buf + k, n - k, "]");
}

/* Boxes that intersect without being equal, or equal boxes with ranges that
 * intersect: two pieces claiming the same element. */
static int pieces_overlap(const struct loom_ckpt_slice *a, const struct loom_ckpt_slice *b)
{
    int same_box = 1;
    for (int d = 0; d < a->ndim; d++) {
        if (a->stop[d] <= b->start[d] || b->stop[d] <= a->start[d]) return 0;
        same_box &= a->start[d] == b->start[d] && a->stop[d] == b->stop[d];
    }
    if (!same_box) return 1;
    return a->lo < b->hi && b->lo < a->hi;
}

static int index_file(struct loom_ckpt_reader *r, int f)
{
    const struct loom_st *st = &r->files[f];
    for (int i = 0; i < loom_st_count(st); i++) {
        const struct loom_st_tensor *t = loom_st_at(st, i);
        struct piece *p = &r->pieces[r->npieces++];
        p->name = t->name;
        p->file = f;
        p->t = t;
        char key[160];
        for (const char *c = t->name; *c; c++)
            if ((unsigned char)*c < 0x20 || *c == 0x7f)
                return loom_error_set(LOOM_ERR_INPUT, "%s: a tensor name holds control characters", st->path);
        if (t->dtype != LOOM_DTYPE_F32)
            return loom_error_set(LOOM_ERR_INPUT, "%s: tensor %s is %s; checkpoints hold F32", st->path,
                                  t->name, loom_st_dtype_name(t->dtype));
        snprintf(key, sizeof key, "loom.xxh3.%s", t->name);
        const char *sum = loom_st_meta(st, key);
        char *end;
        if (!sum || strlen(sum) != 16 || (p->xxh = strtoull(sum, &end, 16), *end))
            return loom_error_set(LOOM_ERR_INPUT, "%s: tensor %s has no checksum (metadata %s)", st->path,
                                  t->name, key);
        snprintf(key, sizeof key, "loom.slice.%s", t->name);
        const char *slice = loom_st_meta(st, key);
        if (slice) {
            if (loom_ckpt_slice_parse(slice, &p->s)) {
                char why[256];
                snprintf(why, sizeof why, "%s", loom_error_message());
                return loom_error_set(LOOM_ERR_INPUT, "%s: tensor %s: %s", st->path, t->name, why);
            }
        } else {
            loom_ckpt_slice_whole(&p->s, t->ndim, t->shape);
        }
        if (p->s.hi - p->s.lo != t->numel)
            return loom_error_set(LOOM_ERR_INPUT,
                                  "%s: tensor %s holds %" PRIu64 " elements but its slice names %" PRIu64,
                                  st->path, t->name, t->numel, p->s.hi - p->s.lo);
    }
    return LOOM_OK;
}

int loom_ckpt_reader_open(struct loom_ckpt_reader **out, const char *dir, const char *const *files,
                          int nfiles)
{
    struct loom_ckpt_reader *r = loom_alloc(sizeof *r, LOOM_MEM_OTHER);
    *out = r;
    r->files = loom_alloc(loom_mul_size((size_t)nfiles + 1, sizeof *r->files), LOOM_MEM_OTHER);
    int rc, total = 0;
    for (int f = 0; f < nfiles; f++) {
        char path[4200];
        snprintf(path, sizeof path, "%s/%s", dir, files[f]);
        if ((rc = loom_st_open(&r->files[f], path))) return rc;
        r->nfiles = f + 1;
        total += loom_st_count(&r->files[f]);
    }
    r->pieces = loom_alloc(loom_mul_size((size_t)total + 1, sizeof *r->pieces), LOOM_MEM_OTHER);
    for (int f = 0; f < nfiles; f++)
        if ((rc = index_file(r, f))) return rc;
    qsort(r->pieces, (size_t)r->npieces, sizeof *r->pieces, cmp_piece);
    /* pieces of one tensor agree on its shape and never claim an element twice */
    for (int i = 0; i < r->npieces;) {
        int j = i + 1;
        while (j < r->npieces && strcmp(r->pieces[j].name, r->pieces[i].name) == 0) j++;
        for (int a = i; a < j; a++)
            for (int b = a + 1; b < j; b++) {
                const struct piece *x = &r->pieces[a], *y = &r->pieces[b];
                if (!same_shape(&x->s, y->s.ndim, y->s.shape))
                    return loom_error_set(
                        LOOM_ERR_INPUT,
                        "checkpoint %s: pieces of tensor %s in %s and %s disagree on its shape", dir, x->name,
                        r->files[x->file].path, r->files[y->file].path);
                if (pieces_overlap(&x->s, &y->s))
                    return loom_error_set(LOOM_ERR_INPUT,
                                          "checkpoint %s: pieces of tensor %s in %s and %s overlap", dir,
                                          x->name, r->files[x->file].path, r->files[y->file].path);
            }
        i = j;
    }
    return LOOM_OK;
}

void loom_ckpt_reader_close(struct loom_ckpt_reader *r)
{
    if (!r) return;
    for (int f = 0; f < r->nfiles; f++) loom_st_close(&r->files[f]);
    loom_free(r->files);
    loom_free(r->pieces);
    loom_free(r);
}

/* The first piece named `name`, or -1. */
static int first_piece(const struct loom_ckpt_reader *r, const char *name)
{
    int lo = 0, hi = r->npieces;
    while (lo < hi) {
        int mid = (lo + hi) / 2;
        if (strcmp(r->pieces[mid].name, name) < 0)
            lo = mid + 1;
        else
            hi = mid;
    }
    return lo < r->npieces && strcmp(r->pieces[lo].name, name) == 0 ? lo : -1;
}

int loom_ckpt_has(const struct loom_ckpt_reader *r, const char *name)
{
    return first_piece(r, name) >= 0;
}

/* Copies the elements of piece p that fall in [lo, hi) of the full tensor;
 * returns how many. A box is walked row by row (its last dimension is
 * contiguous in the full tensor); a whole-tensor box is one row. */
static uint64_t copy_piece(const struct piece *p, uint64_t lo, uint64_t hi, float *dst)
{
    const struct loom_ckpt_slice *s = &p->s;
    const float *src =
        p->t->data; /* aligned in files loom writes; others are refused by dtype or copied bytewise */
    uint64_t copied = 0;
    if (box_is_whole(s)) {
        uint64_t a = s->lo > lo ? s->lo : lo, b = s->hi < hi ? s->hi : hi;
        if (a < b)
            memcpy(dst + (a - lo), (const char *)src + (a - s->lo) * sizeof(float), (b - a) * sizeof(float));
        return a < b ? b - a : 0;
    }
    const int nd = s->ndim;
    const uint64_t inner = (uint64_t)(s->stop[nd - 1] - s->start[nd - 1]);
    if (inner == 0) return 0;
    int64_t stride[LOOM_CKPT_MAX_DIMS];
    stride[nd - 1] = 1;
    for (int d = nd - 2; d >= 0; d--) stride[d] = stride[d + 1] * s->shape[d + 1];
    for (uint64_t row = s->lo / inner; row * inner < s->hi; row++) {
        uint64_t x0 = row * inner > s->lo ? row * inner : s->lo;
        uint64_t x1 = (row + 1) * inner < s->hi ? (row + 1) * inner : s->hi;
        /* the row's first element in the full tensor */
        uint64_t rest = row, full = (uint64_t)s->start[nd - 1];
        for (int d = nd - 2; d >= 0; d--) {
            uint64_t ext = (uint64_t)(s->stop[d] - s->start[d]);
            full += ((uint64_t)s->start[d] + rest % ext) * (uint64_t)stride[d];
            rest /= ext;
        }
        uint64_t f0 = full + (x0 - row * inner), f1 = f0 + (x1 - x0);
        uint64_t a = f0 > lo ? f0 : lo, b = f1 < hi ? f1 : hi;
        if (a < b) {
            memcpy(dst + (a - lo), (const char *)src + (x0 - s->lo + (a - f0)) * sizeof(float),
                   (b - a) * sizeof(float));
            copied += b - a;
        }
    }
    return copied;
}

/* The full tensor's flat index of element k (row-major) of slice s's box. */
static uint64_t box_to_full(const struct loom_ckpt_slice *s, uint64_t k)
{
    uint64_t full = 0, stride = 1;
    for (int d = s->ndim - 1; d >= 0; d--) {
        uint64_t ext = (uint64_t)(s->stop[d] - s->start[d]);
        full += ((uint64_t)s->start[d] + k % ext) * stride;
        k /= ext;
        stride *= (uint64_t)s->shape[d];
    }
    return full;
}

/* Whether piece p may hold an element of [lo, hi): its elements lie between
 * the full indices of its first and last (copy_piece is exact). */
static int may_touch(const struct piece *p, uint64_t lo, uint64_t hi)
{
    const struct loom_ckpt_slice *s = &p->s;
    if (s->hi == s->lo) return 0;
    return box_to_full(s, s->lo) < hi && lo <= box_to_full(s, s->hi - 1);
}

int loom_ckpt_read(struct loom_ckpt_reader *r, const char *name, int ndim, const int64_t *shape, uint64_t lo,
                   uint64_t hi, float *dst)
{
    int i = first_piece(r, name);
    if (i < 0) return loom_error_set(LOOM_ERR_INPUT, "checkpoint has no tensor %s", name);
    if (!same_shape(&r->pieces[i].s, ndim, shape)) {
        char have[128], want[128];
        shape_text(have, sizeof have, r->pieces[i].s.ndim, r->pieces[i].s.shape);
        shape_text(want, sizeof want, ndim, shape);
        return loom_error_set(LOOM_ERR_INPUT, "%s: tensor %s has shape %s, the model needs %s",
                              r->files[r->pieces[i].file].path, name, have, want);
    }
    uint64_t copied = 0;
    for (; i < r->npieces && strcmp(r->pieces[i].name, name) == 0; i++) {
        struct piece *p = &r->pieces[i];
        if (!may_touch(p, lo, hi)) continue;
        if (!p->verified) {
            uint64_t h = XXH3_64bits(p->t->data, p->t->nbytes);
            if (h != p->xxh)
                return loom_error_set(LOOM_ERR_INPUT,
                                      "%s: tensor %s fails its checksum (stored %016" PRIx64
                                      ", computed %016" PRIx64 "): the file is damaged",
                                      r->files[p->file].path, name, p->xxh, h);
            p->verified = 1;
        }
        copied += copy_piece(p, lo, hi, dst);
    }
    if (copied != hi - lo)
        return loom_error_set(LOOM_ERR_INPUT,
                              "checkpoint holds %" PRIu64 " of elements [%" PRIu64 ", %" PRIu64
                              ") of tensor %s",
                              copied, lo, hi, name);
    return LOOM_OK;
}
