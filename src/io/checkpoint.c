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
#include <sys/mman.h>
#include <unistd.h>

#include <cjson/cJSON.h>
#include <xxhash.h>

#include "base/log.h"
#include "base/mem.h"
#include "base/testpoint.h"
#include "io/safetensors.h"

#define MAX_EXACT ((double)(1ull << 53)) /* JSON numbers above this are not exact integers */

/* ---- slices ------------------------------------------------------------- */

#define NUMEL_MAX ((uint64_t)1 << 53) /* elements a tensor with a view may hold (exact JSON numbers) */

/* Elements of a shape, or UINT64_MAX when more than NUMEL_MAX. */
static uint64_t shape_numel(int ndim, const int64_t *shape)
{
    for (int d = 0; d < ndim; d++)
        if (shape[d] == 0) return 0;
    uint64_t n = 1;
    for (int d = 0; d < ndim; d++) {
        if ((uint64_t)shape[d] > NUMEL_MAX / n) return UINT64_MAX;
        n *= (uint64_t)shape[d];
    }
    return n;
}

static int same_dims(int an, const int64_t *a, int bn, const int64_t *b)
{
    if (an != bn) return 0;
    for (int d = 0; d < an; d++)
        if (a[d] != b[d]) return 0;
    return 1;
}

/* Whether the box is cut in a view other than the tensor's shape. */
static int has_view(const struct loom_ckpt_slice *s)
{
    return !same_dims(s->ndim, s->shape, s->tndim, s->tshape);
}

/* A slice that holds together: sizes, a view of the tensor's elements, a
 * box inside the view, a range inside the box. */
static void assert_slice(const struct loom_ckpt_slice *s)
{
    LOOM_ASSERT(s->ndim >= 0 && s->ndim <= LOOM_CKPT_MAX_DIMS && s->tndim >= 0 &&
                s->tndim <= LOOM_CKPT_MAX_DIMS);
    for (int d = 0; d < s->tndim; d++) LOOM_ASSERT(s->tshape[d] >= 0);
    for (int d = 0; d < s->ndim; d++)
        LOOM_ASSERT(s->start[d] >= 0 && s->start[d] <= s->stop[d] && s->stop[d] <= s->shape[d]);
    if (has_view(s)) {
        uint64_t n = shape_numel(s->tndim, s->tshape);
        LOOM_ASSERT(n != UINT64_MAX && n == shape_numel(s->ndim, s->shape));
    }
    LOOM_ASSERT(s->lo <= s->hi && s->hi <= loom_ckpt_slice_box_numel(s));
}

void loom_ckpt_slice_whole(struct loom_ckpt_slice *s, int ndim, const int64_t *shape)
{
    LOOM_ASSERT(ndim >= 0 && ndim <= LOOM_CKPT_MAX_DIMS);
    memset(s, 0, sizeof *s);
    s->ndim = s->tndim = ndim;
    for (int d = 0; d < ndim; d++) s->shape[d] = s->stop[d] = s->tshape[d] = shape[d];
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

void loom_ckpt_slice_view(struct loom_ckpt_slice *s, int tndim, const int64_t *tshape, int vndim,
                          const int64_t *view, const int64_t *start, const int64_t *stop, uint64_t lo,
                          uint64_t hi)
{
    LOOM_ASSERT(tndim >= 0 && tndim <= LOOM_CKPT_MAX_DIMS && vndim >= 0 && vndim <= LOOM_CKPT_MAX_DIMS);
    memset(s, 0, sizeof *s);
    s->tndim = tndim;
    for (int d = 0; d < tndim; d++) s->tshape[d] = tshape[d];
    s->ndim = vndim;
    for (int d = 0; d < vndim; d++) s->shape[d] = view[d], s->start[d] = start[d], s->stop[d] = stop[d];
    s->lo = lo;
    s->hi = hi;
    assert_slice(s);
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
    for (int d = 0; d < s->tndim; d++) PUT("%s%" PRId64, d ? "," : "", s->tshape[d]);
    PUT("]");
    if (has_view(s)) {
        PUT(",\"view\":[");
        for (int d = 0; d < s->ndim; d++) PUT("%s%" PRId64, d ? "," : "", s->shape[d]);
        PUT("]");
    }
    PUT(",\"box\":[");
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

/* The slice's array `what` of at most LOOM_CKPT_MAX_DIMS sizes, into dims:
 * its length, or -1 with the error set. */
static int get_dims(const cJSON *a, const char *what, int64_t *dims)
{
    int nd = cJSON_GetArraySize(a);
    if (!cJSON_IsArray(a) || nd > LOOM_CKPT_MAX_DIMS) {
        loom_error_set(LOOM_ERR_INPUT, "slice %s is not an array of at most %d sizes", what,
                       LOOM_CKPT_MAX_DIMS);
        return -1;
    }
    for (int d = 0; d < nd; d++) {
        uint64_t dim;
        if (get_uint(cJSON_GetArrayItem(a, d), &dim) || dim > (1ull << 40)) {
            loom_error_set(LOOM_ERR_INPUT, "slice %s[%d] is not a size", what, d);
            return -1;
        }
        dims[d] = (int64_t)dim;
    }
    return nd;
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
    const cJSON *view = cJSON_GetObjectItemCaseSensitive(root, "view");
    const cJSON *box = cJSON_GetObjectItemCaseSensitive(root, "box");
    const cJSON *range = cJSON_GetObjectItemCaseSensitive(root, "range");
    const int nt = get_dims(shape, "shape", s->tshape);
    if (nt < 0) {
        rc = LOOM_ERR_INPUT;
        goto done;
    }
    s->tndim = nt;
    if (!view) { /* the box is cut in the tensor's shape */
        s->ndim = nt;
        memcpy(s->shape, s->tshape, sizeof s->shape);
    } else {
        const int nv = get_dims(view, "view", s->shape);
        if (nv < 0) {
            rc = LOOM_ERR_INPUT;
            goto done;
        }
        s->ndim = nv;
        uint64_t tn = shape_numel(s->tndim, s->tshape), vn = shape_numel(s->ndim, s->shape);
        if (tn == UINT64_MAX || vn == UINT64_MAX) {
            rc = loom_error_set(LOOM_ERR_INPUT, "slice shape or view holds more than 2^53 elements");
            goto done;
        }
        if (tn != vn) {
            rc = loom_error_set(LOOM_ERR_INPUT,
                                "slice view holds %" PRIu64 " elements, its shape %" PRIu64
                                ": not a view of the tensor",
                                vn, tn);
            goto done;
        }
    }
    const int nd = s->ndim;
    if (!cJSON_IsArray(box) || cJSON_GetArraySize(box) != nd) {
        rc = loom_error_set(LOOM_ERR_INPUT, "slice box is not an array of %d [start, stop] pairs", nd);
        goto done;
    }
    uint64_t numel = 1;
    for (int d = 0; d < nd; d++) {
        uint64_t a, b, dim = (uint64_t)s->shape[d];
        const cJSON *pair = cJSON_GetArrayItem(box, d);
        if (!cJSON_IsArray(pair) || cJSON_GetArraySize(pair) != 2 ||
            get_uint(cJSON_GetArrayItem(pair, 0), &a) || get_uint(cJSON_GetArrayItem(pair, 1), &b) || a > b ||
            b > dim) {
            rc = loom_error_set(LOOM_ERR_INPUT, "slice box[%d] is not a [start, stop] inside 0..%" PRIu64, d,
                                dim);
            goto done;
        }
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

/* A piece made as it is written: its checksum is taken on the way. */
struct filled {
    const struct loom_ckpt_piece *p;
    XXH3_state_t *hash;
    char *val; /* its checksum's metadata value, stamped when written */
};

static int fill_piece(void *ctx, uint64_t at, void *dst, size_t n)
{
    struct filled *f = ctx;
    LOOM_ASSERT(at % sizeof(float) == 0 && n % sizeof(float) == 0);
    int rc = f->p->fill(f->p->fill_ctx, at / sizeof(float), dst, n / sizeof(float));
    if (rc == LOOM_OK) XXH3_64bits_update(f->hash, dst, n);
    return rc;
}

struct restamp_ctx {
    struct filled *f;
    int n;
    size_t val_size;
};

static void restamp_sums(void *ctx)
{
    struct restamp_ctx *r = ctx;
    for (int i = 0; i < r->n; i++)
        if (r->f[i].hash) snprintf(r->f[i].val, r->val_size, "%016" PRIx64, XXH3_64bits_digest(r->f[i].hash));
}

int loom_ckpt_write_file(const char *path, const struct loom_ckpt_piece *pieces, int n,
                         const char *const *extra_kv, int nextra)
{
    enum { KEY = 96, VAL = 640 };
    struct loom_st_tensor_in *ts = loom_alloc(loom_mul_size((size_t)n + 1, sizeof *ts), LOOM_MEM_OTHER);
    const char **kv =
        loom_alloc(loom_mul_size(2 * (2 * (size_t)n + (size_t)nextra) + 1, sizeof *kv), LOOM_MEM_OTHER);
    char *text = loom_alloc(loom_mul_size(2 * (size_t)n + 1, KEY + VAL), LOOM_MEM_OTHER);
    uint64_t *sums = loom_alloc(loom_mul_size((size_t)n + 1, sizeof *sums), LOOM_MEM_OTHER);
    struct filled *filled = loom_alloc(loom_mul_size((size_t)n + 1, sizeof *filled), LOOM_MEM_OTHER);
    memset(ts, 0, ((size_t)n + 1) * sizeof *ts);
    memset(filled, 0, ((size_t)n + 1) * sizeof *filled);
    int rc = LOOM_OK, nt = 0, nm = 0;
    /* the checksums of the pieces in memory, spread over the threads; the
     * others' are taken as they are written */
#pragma omp parallel for schedule(dynamic, 1)
    for (int i = 0; i < n; i++)
        if (pieces[i].data)
            sums[i] = XXH3_64bits(pieces[i].data, (pieces[i].slice.hi - pieces[i].slice.lo) * sizeof(float));
    for (int i = 0; i < n; i++) {
        const struct loom_ckpt_piece *p = &pieces[i];
        const struct loom_ckpt_slice *s = &p->slice;
        assert_slice(s);
        LOOM_ASSERT(p->data || p->fill);
        uint64_t count = s->hi - s->lo;
        if (count == 0) continue;
        struct loom_st_tensor_in *t = &ts[nt++];
        t->name = p->name;
        t->dtype = LOOM_DTYPE_F32;
        t->data = p->data;
        if (!p->data) {
            filled[i].p = p;
            filled[i].hash = XXH3_createState();
            LOOM_ASSERT(filled[i].hash != NULL);
            XXH3_64bits_reset(filled[i].hash);
            t->fill = fill_piece, t->fill_ctx = &filled[i];
            sums[i] = 0; /* a placeholder of the same width */
        }
        if (loom_ckpt_slice_is_whole(s)) { /* the tensor's shape, whatever the view */
            t->ndim = s->tndim;
            for (int d = 0; d < s->tndim; d++) t->shape[d] = s->tshape[d];
        } else if (s->lo == 0 && s->hi == loom_ckpt_slice_box_numel(s)) { /* the whole box */
            t->ndim = s->ndim;
            for (int d = 0; d < s->ndim; d++) t->shape[d] = s->stop[d] - s->start[d];
        } else {
            t->ndim = 1;
            t->shape[0] = (int64_t)count;
        }
        char *key = text + (size_t)(2 * i) * (KEY + VAL), *val = key + KEY;
        snprintf(key, KEY, "loom.xxh3.%s", p->name);
        snprintf(val, VAL, "%016" PRIx64, sums[i]);
        filled[i].val = val;
        kv[2 * nm] = key, kv[2 * nm + 1] = val, nm++;
        if (!loom_ckpt_slice_is_whole(s)) {
            key = text + (size_t)(2 * i + 1) * (KEY + VAL), val = key + KEY;
            snprintf(key, KEY, "loom.slice.%s", p->name);
            if ((rc = loom_ckpt_slice_format(s, val, VAL))) goto done;
            kv[2 * nm] = key, kv[2 * nm + 1] = val, nm++;
        }
    }
    for (int i = 0; i < nextra; i++, nm++) kv[2 * nm] = extra_kv[2 * i], kv[2 * nm + 1] = extra_kv[2 * i + 1];
    struct restamp_ctx r = {filled, n, VAL};
    int streamed = 0;
    for (int i = 0; i < n; i++) streamed |= filled[i].hash != NULL;
    rc = loom_st_write_restamped(path, ts, nt, kv, nm, streamed ? restamp_sums : NULL, &r);
    if (rc == LOOM_OK) loom_test_point("after-rank-file");
done:
    for (int i = 0; i < n; i++)
        if (filled[i].hash) XXH3_freeState(filled[i].hash);
    loom_free(filled);
    loom_free(sums);
    loom_free(ts);
    loom_free(kv);
    loom_free(text);
    return rc;
}

static void dims_text(char *buf, size_t n, int ndim, const int64_t *shape)
{
    size_t k = (size_t)snprintf(buf, n, "[");
    for (int d = 0; d < ndim && k < n; d++)
        k += (size_t)snprintf(buf + k, n - k, "%s%" PRId64, d ? ", " : "", shape[d]);
    if (k < n) snprintf(buf + k, n - k, "]");
}

/* "[start:stop, ..]", then " of view [dims]" when the box is cut in one. */
static void box_text(char *buf, size_t n, const struct loom_ckpt_slice *s)
{
    size_t k = (size_t)snprintf(buf, n, "[");
    for (int d = 0; d < s->ndim && k < n; d++)
        k += (size_t)snprintf(buf + k, n - k, "%s%" PRId64 ":%" PRId64, d ? ", " : "", s->start[d],
                              s->stop[d]);
    if (k < n) k += (size_t)snprintf(buf + k, n - k, "]");
    if (k < n && has_view(s)) {
        k += (size_t)snprintf(buf + k, n - k, " of view ");
        if (k < n) dims_text(buf + k, n - k, s->ndim, s->shape);
    }
}

/* ---- runs: a slice's elements as stretches of the tensor's flat order ---- */

/* The full tensor's flat index of element k (row-major) of slice s's box.
 * The view's flat indices are the tensor's (a row-major reshape). */
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

/* Elements in a row of s's box: the last dimension of the view the box does
 * not span whole, with every dimension after it, is one stretch of the
 * tensor's flat order, so the box is rows of this many elements, each
 * contiguous, in increasing flat order (a box of the whole view is one row).
 * At least 1 when the box holds an element. */
static uint64_t row_len(const struct loom_ckpt_slice *s)
{
    int cut = s->ndim - 1;
    while (cut >= 0 && s->start[cut] == 0 && s->stop[cut] == s->shape[cut]) cut--;
    if (cut < 0) return loom_ckpt_slice_box_numel(s);
    uint64_t n = (uint64_t)(s->stop[cut] - s->start[cut]);
    for (int d = cut + 1; d < s->ndim; d++) n *= (uint64_t)s->shape[d];
    return n;
}

/* A run: n elements of a slice from flat index x of its box, contiguous in
 * the tensor from flat index f. */
struct run {
    uint64_t x, f, n;
};

/* Walks the runs of a slice's range (the parts of its rows in [lo, hi)). */
struct runs {
    const struct loom_ckpt_slice *s;
    uint64_t inner; /* row_len */
    uint64_t next;  /* the box's flat index where the next run starts */
};

static void runs_init(struct runs *w, const struct loom_ckpt_slice *s, uint64_t from)
{
    w->s = s;
    w->inner = row_len(s);
    w->next = from > s->lo ? from : s->lo;
}

static int runs_next(struct runs *w, struct run *u)
{
    const struct loom_ckpt_slice *s = w->s;
    if (w->next >= s->hi) return 0; /* so the box is not empty and inner > 0 */
    uint64_t end = (w->next / w->inner + 1) * w->inner;
    if (end > s->hi) end = s->hi;
    u->x = w->next;
    u->f = box_to_full(s, w->next);
    u->n = end - w->next;
    w->next = end;
    return 1;
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

const char *loom_ckpt_reader_meta(const struct loom_ckpt_reader *r, int file, const char *key)
{
    LOOM_ASSERT(file >= 0 && file < r->nfiles);
    return loom_st_meta(&r->files[file], key);
}

static int cmp_piece(const void *a, const void *b)
{
    const struct piece *x = a, *y = b;
    int c = strcmp(x->name, y->name);
    return c ? c : (x->file > y->file) - (x->file < y->file);
}

/* Whether two pieces of one tensor claim the same element. Boxes in one
 * view: boxes that intersect without being equal, or equal boxes with
 * ranges that intersect. Boxes in different views: their runs meet in the
 * tensor's flat order. */
static int pieces_overlap(const struct loom_ckpt_slice *a, const struct loom_ckpt_slice *b)
{
    if (same_dims(a->ndim, a->shape, b->ndim, b->shape)) {
        int same_box = 1;
        for (int d = 0; d < a->ndim; d++) {
            if (a->stop[d] <= b->start[d] || b->stop[d] <= a->start[d]) return 0;
            same_box &= a->start[d] == b->start[d] && a->stop[d] == b->stop[d];
        }
        if (!same_box) return 1;
        return a->lo < b->hi && b->lo < a->hi;
    }
    if (a->lo == a->hi || b->lo == b->hi) return 0;
    if (box_to_full(a, a->hi - 1) < box_to_full(b, b->lo) ||
        box_to_full(b, b->hi - 1) < box_to_full(a, a->lo))
        return 0;
    struct runs wa, wb;
    struct run u, v;
    runs_init(&wa, a, 0);
    runs_init(&wb, b, 0);
    int more = runs_next(&wa, &u) && runs_next(&wb, &v);
    while (more) {
        if (u.f < v.f + v.n && v.f < u.f + u.n) return 1;
        more = u.f + u.n <= v.f + v.n ? runs_next(&wa, &u) : runs_next(&wb, &v);
    }
    return 0;
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
    /* pieces of one tensor agree on its shape (not their views) and never
     * claim an element twice */
    for (int i = 0; i < r->npieces;) {
        int j = i + 1;
        while (j < r->npieces && strcmp(r->pieces[j].name, r->pieces[i].name) == 0) j++;
        for (int a = i; a < j; a++)
            for (int b = a + 1; b < j; b++) {
                const struct piece *x = &r->pieces[a], *y = &r->pieces[b];
                if (!same_dims(x->s.tndim, x->s.tshape, y->s.tndim, y->s.tshape))
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

/* Whether piece p may hold an element of [lo, hi): its elements lie between
 * the full indices of its first and last (a cheap test before seek_runs). */
static int may_touch(const struct piece *p, uint64_t lo, uint64_t hi)
{
    const struct loom_ckpt_slice *s = &p->s;
    if (s->hi == s->lo) return 0;
    return box_to_full(s, s->lo) < hi && lo <= box_to_full(s, s->hi - 1);
}

/* Starts w at the first run of slice s that ends past lo, in u: its rows
 * lie in increasing flat order, so a binary search finds it. Whether s
 * holds an element of [lo, hi) (that run starts before hi). */
static int seek_runs(const struct loom_ckpt_slice *s, uint64_t lo, uint64_t hi, struct runs *w, struct run *u)
{
    if (s->lo >= s->hi) return 0;
    const uint64_t inner = row_len(s);
    uint64_t a = s->lo / inner, b = (s->hi - 1) / inner; /* the rows the range touches */
    while (a < b) {
        uint64_t mid = a + (b - a) / 2; /* its last element is held: (mid + 1) * inner <= b * inner < hi */
        if (box_to_full(s, (mid + 1) * inner - 1) < lo)
            a = mid + 1;
        else
            b = mid;
    }
    runs_init(w, s, a * inner);
    return runs_next(w, u) && u->f < hi && lo < u->f + u->n;
}

/* The whole pages of the mapped file inside [p, p + n) stop being resident
 * (they stay in the page cache): a checkpoint larger than memory is read
 * through its mapping without the process holding what it has read. */
static void drop_pages(const void *p, size_t n)
{
    const uintptr_t page = (uintptr_t)sysconf(_SC_PAGESIZE), a = ((uintptr_t)p + page - 1) / page * page,
                    b = ((uintptr_t)p + n) / page * page;
    if (a < b) madvise((void *)a, b - a, MADV_DONTNEED); /* a hint: the pages come back on a touch */
}

/* Copies the elements of piece p that fall in [lo, hi) of the full tensor
 * from run u on (seek_runs); returns how many. The pages read are dropped. */
static uint64_t copy_piece(const struct piece *p, struct runs *w, struct run u, uint64_t lo, uint64_t hi,
                           float *dst)
{
    /* aligned in files loom writes; others are refused by dtype or copied bytewise */
    const char *src = (const char *)p->t->data;
    uint64_t copied = 0, first = UINT64_MAX, last = 0;
    do {
        if (u.f >= hi) break;
        uint64_t f0 = u.f > lo ? u.f : lo, f1 = u.f + u.n < hi ? u.f + u.n : hi;
        if (f0 < f1) {
            const uint64_t at = u.x - p->s.lo + (f0 - u.f);
            memcpy(dst + (f0 - lo), src + at * sizeof(float), (f1 - f0) * sizeof(float));
            copied += f1 - f0;
            first = at < first ? at : first;
            last = at + (f1 - f0) > last ? at + (f1 - f0) : last;
        }
    } while (runs_next(w, &u));
    if (first < last) drop_pages(src + first * sizeof(float), (last - first) * sizeof(float));
    return copied;
}

/* LOOM_ERR_INPUT unless the tensor whose first piece is i has this shape. */
static int check_shape(const struct loom_ckpt_reader *r, int i, int ndim, const int64_t *shape)
{
    const struct piece *p = &r->pieces[i];
    if (same_dims(p->s.tndim, p->s.tshape, ndim, shape)) return LOOM_OK;
    char have[128], want[128];
    dims_text(have, sizeof have, p->s.tndim, p->s.tshape);
    dims_text(want, sizeof want, ndim, shape);
    return loom_error_set(LOOM_ERR_INPUT, "%s: tensor %s has shape %s, the model needs %s",
                          r->files[p->file].path, p->name, have, want);
}

/* Copies elements [lo, hi) of the flattened tensor whose first piece is i
 * into dst from every piece that holds some, each verified against its
 * checksum the first time it is used; *copied: how many were found. */
static int read_flat(struct loom_ckpt_reader *r, int i, uint64_t lo, uint64_t hi, float *dst,
                     uint64_t *copied)
{
    const char *name = r->pieces[i].name;
    *copied = 0;
    for (; i < r->npieces && strcmp(r->pieces[i].name, name) == 0; i++) {
        struct piece *p = &r->pieces[i];
        struct runs w;
        struct run u;
        if (!may_touch(p, lo, hi) || !seek_runs(&p->s, lo, hi, &w, &u)) continue;
        if (!p->verified) {
            uint64_t h = XXH3_64bits(p->t->data, p->t->nbytes);
            if (h != p->xxh)
                return loom_error_set(LOOM_ERR_INPUT,
                                      "%s: tensor %s fails its checksum (stored %016" PRIx64
                                      ", computed %016" PRIx64 "): the file is damaged",
                                      r->files[p->file].path, name, p->xxh, h);
            p->verified = 1;
            drop_pages(p->t->data, p->t->nbytes);
        }
        *copied += copy_piece(p, &w, u, lo, hi, dst);
    }
    return LOOM_OK;
}

int loom_ckpt_read(struct loom_ckpt_reader *r, const char *name, int ndim, const int64_t *shape, uint64_t lo,
                   uint64_t hi, float *dst)
{
    int i = first_piece(r, name), rc;
    if (i < 0) return loom_error_set(LOOM_ERR_INPUT, "checkpoint has no tensor %s", name);
    if ((rc = check_shape(r, i, ndim, shape))) return rc;
    uint64_t copied;
    if ((rc = read_flat(r, i, lo, hi, dst, &copied))) return rc;
    if (copied != hi - lo)
        return loom_error_set(LOOM_ERR_INPUT,
                              "checkpoint holds %" PRIu64 " of elements [%" PRIu64 ", %" PRIu64
                              ") of tensor %s",
                              copied, lo, hi, name);
    return LOOM_OK;
}

int loom_ckpt_read_slice(struct loom_ckpt_reader *r, const char *name, const struct loom_ckpt_slice *want,
                         float *dst)
{
    assert_slice(want);
    int i = first_piece(r, name), rc;
    if (i < 0) return loom_error_set(LOOM_ERR_INPUT, "checkpoint has no tensor %s", name);
    if ((rc = check_shape(r, i, want->tndim, want->tshape))) return rc;
    /* the box's runs, those that continue one another in the tensor read as one */
    struct runs w;
    struct run u, v = {0, 0, 0};
    uint64_t copied = 0;
    runs_init(&w, want, 0);
    int more = runs_next(&w, &u);
    while (more) {
        while ((more = runs_next(&w, &v)) && v.f == u.f + u.n) u.n += v.n;
        uint64_t got;
        if ((rc = read_flat(r, i, u.f, u.f + u.n, dst + (u.x - want->lo), &got))) return rc;
        copied += got;
        u = v;
    }
    if (copied != want->hi - want->lo) {
        char box[512];
        box_text(box, sizeof box, want);
        return loom_error_set(LOOM_ERR_INPUT,
                              "checkpoint holds %" PRIu64 " of elements [%" PRIu64 ", %" PRIu64
                              ") of box %s of tensor %s",
                              copied, want->lo, want->hi, box, name);
    }
    return LOOM_OK;
}
