/*
 * safetensors reading and writing (format in safetensors.h).
 *
 * The reader trusts nothing in the file: the header size is bounded, the
 * JSON is parsed from a NUL-terminated copy, every number must be an exact
 * non-negative integer, every span must match its shape and lie inside the
 * data area, and no two non-empty spans may share a byte. Gaps between spans
 * are accepted. Integral JSON numbers written as 2.0 or 2e0 are read as 2;
 * numbers above 2^53 are rejected, since they do not survive a double.
 *
 * The writer formats the header with cJSON (string escaping) but emits every
 * integer itself, so sizes never pass through a double on the way out.
 *
 * Not here: byte swapping (a little-endian host is required), protection
 * against the file being truncated while mapped (SIGBUS, as with any mmap),
 * and conversions other than the float ones to float32.
 */
#include "io/safetensors.h"

#include <assert.h>
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cjson/cJSON.h>

#include "base/log.h"
#include "base/mem.h"

static_assert(__BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__,
              "safetensors I/O assumes a little-endian host");

#define MAX_EXACT_INT ((uint64_t)1 << 53) /* largest integer a double holds exactly */

static const char *const dtype_names[] = {
    [LOOM_ST_F32] = "F32", [LOOM_ST_F16] = "F16", [LOOM_ST_BF16] = "BF16", [LOOM_ST_F64] = "F64",
    [LOOM_ST_I32] = "I32", [LOOM_ST_I64] = "I64", [LOOM_ST_U8] = "U8",     [LOOM_ST_I8] = "I8",
    [LOOM_ST_U16] = "U16", [LOOM_ST_I16] = "I16", [LOOM_ST_BOOL] = "BOOL", [LOOM_ST_U32] = "U32",
    [LOOM_ST_U64] = "U64",
};
static_assert(sizeof dtype_names / sizeof dtype_names[0] == LOOM_ST_DTYPE_COUNT,
              "dtype_names must name every loom_st_dtype");

static const unsigned char dtype_sizes[] = {
    [LOOM_ST_F32] = 4,  [LOOM_ST_F16] = 2, [LOOM_ST_BF16] = 2, [LOOM_ST_F64] = 8, [LOOM_ST_I32] = 4,
    [LOOM_ST_I64] = 8,  [LOOM_ST_U8] = 1,  [LOOM_ST_I8] = 1,   [LOOM_ST_U16] = 2, [LOOM_ST_I16] = 2,
    [LOOM_ST_BOOL] = 1, [LOOM_ST_U32] = 4, [LOOM_ST_U64] = 8,
};
static_assert(sizeof dtype_sizes == LOOM_ST_DTYPE_COUNT,
              "dtype_sizes must size every loom_st_dtype");

const char *loom_st_dtype_name(enum loom_st_dtype dtype)
{
    return (unsigned)dtype < LOOM_ST_DTYPE_COUNT ? dtype_names[dtype] : NULL;
}

size_t loom_st_dtype_size(enum loom_st_dtype dtype)
{
    return (unsigned)dtype < LOOM_ST_DTYPE_COUNT ? dtype_sizes[dtype] : 0;
}

int loom_st_dtype_parse(const char *name, enum loom_st_dtype *out)
{
    for (int i = 0; i < LOOM_ST_DTYPE_COUNT; i++) {
        if (strcmp(name, dtype_names[i]) == 0) {
            *out = (enum loom_st_dtype)i;
            return 0;
        }
    }
    return -1;
}

/* ---- reader ----------------------------------------------------------------- */

/* A string fit for a one-line message: control bytes become '?', and a long
 * one is cut with "...". */
static const char *shown(const char *s, char *buf, size_t cap)
{
    size_t i = 0;
    for (; s[i] && i + 4 < cap; i++)
        buf[i] = (unsigned char)s[i] < 0x20 || s[i] == 0x7f ? '?' : s[i];
    if (s[i]) {
        memcpy(buf + i, "...", 3);
        i += 3;
    }
    buf[i] = '\0';
    return buf;
}

/* LOOM_ERR_INPUT with "PATH: message". */
static int bad_file(const char *path, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static int bad_file(const char *path, const char *fmt, ...)
{
    char msg[512];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    return loom_error_set(LOOM_ERR_INPUT, "%s: %s", path, msg);
}

static uint64_t read_le64(const unsigned char *p)
{
    uint64_t v = 0;
    for (int i = 7; i >= 0; i--) v = v << 8 | p[i];
    return v;
}

/* An exact integer in [0, 2^53]; 0 on success. */
static int json_uint(const cJSON *item, uint64_t *out)
{
    if (!cJSON_IsNumber(item)) return -1;
    double d = item->valuedouble;
    if (!(d >= 0) || d > (double)MAX_EXACT_INT || d != floor(d)) return -1;
    *out = (uint64_t)d;
    return 0;
}

static int cmp_tensor_name(const void *a, const void *b)
{
    return strcmp(((const struct loom_st_tensor *)a)->name,
                  ((const struct loom_st_tensor *)b)->name);
}

static int cmp_tensor_span(const void *a, const void *b)
{
    const struct loom_st_tensor *x = *(const struct loom_st_tensor *const *)a;
    const struct loom_st_tensor *y = *(const struct loom_st_tensor *const *)b;
    if (x->offset != y->offset) return x->offset < y->offset ? -1 : 1;
    return x->nbytes < y->nbytes ? -1 : x->nbytes > y->nbytes;
}

/* Compares two (key, value) pairs, or two keys, by key. */
static int cmp_pair_key(const void *a, const void *b)
{
    return strcmp(*(const char *const *)a, *(const char *const *)b);
}

static int parse_meta(struct loom_st *st, const cJSON *m)
{
    char nb[80];
    if (!cJSON_IsObject(m)) return bad_file(st->path, "\"__metadata__\" is not a JSON object");
    int n = 0;
    for (const cJSON *kv = m->child; kv; kv = kv->next) n++;
    st->meta = loom_alloc(((size_t)n * 2 + 1) * sizeof *st->meta, LOOM_MEM_OTHER);
    for (const cJSON *kv = m->child; kv; kv = kv->next) {
        const char *key = kv->string ? kv->string : "";
        if (!cJSON_IsString(kv) || !kv->valuestring)
            return bad_file(st->path, "\"__metadata__\" entry '%s' is not a string",
                            shown(key, nb, sizeof nb));
        st->meta[2 * st->nmeta] = key;
        st->meta[2 * st->nmeta + 1] = kv->valuestring;
        st->nmeta++;
    }
    qsort(st->meta, (size_t)st->nmeta, 2 * sizeof *st->meta, cmp_pair_key);
    for (int i = 1; i < st->nmeta; i++)
        if (strcmp(st->meta[2 * i - 2], st->meta[2 * i]) == 0)
            return bad_file(st->path, "\"__metadata__\" key '%s' appears twice",
                            shown(st->meta[2 * i], nb, sizeof nb));
    return 0;
}

/* One header entry into *t; data_size is the size of the data area. */
static int parse_entry(const struct loom_st *st, const cJSON *e, uint64_t data_size,
                       struct loom_st_tensor *t)
{
    char nb[80], vb[40];
    const char *name = shown(t->name, nb, sizeof nb);
    const char *path = st->path;
    if (!cJSON_IsObject(e)) return bad_file(path, "tensor '%s': entry is not a JSON object", name);

    const cJSON *dtype = NULL, *shape = NULL, *offs = NULL;
    for (const cJSON *f = e->child; f; f = f->next) {
        const char *key = f->string ? f->string : "";
        const cJSON **slot = strcmp(key, "dtype") == 0          ? &dtype
                             : strcmp(key, "shape") == 0        ? &shape
                             : strcmp(key, "data_offsets") == 0 ? &offs
                                                                : NULL;
        if (!slot) continue; /* unknown fields are ignored, as other readers do */
        if (*slot) return bad_file(path, "tensor '%s': field \"%s\" appears twice", name, key);
        *slot = f;
    }
    if (!dtype) return bad_file(path, "tensor '%s': missing \"dtype\"", name);
    if (!shape) return bad_file(path, "tensor '%s': missing \"shape\"", name);
    if (!offs) return bad_file(path, "tensor '%s': missing \"data_offsets\"", name);

    if (!cJSON_IsString(dtype) || !dtype->valuestring)
        return bad_file(path, "tensor '%s': dtype is not a string", name);
    if (loom_st_dtype_parse(dtype->valuestring, &t->dtype) != 0)
        return bad_file(path, "tensor '%s': unknown dtype '%s'", name,
                        shown(dtype->valuestring, vb, sizeof vb));

    if (!cJSON_IsArray(shape)) return bad_file(path, "tensor '%s': shape is not an array", name);
    uint64_t numel = 1;
    t->ndim = 0;
    for (const cJSON *d = shape->child; d; d = d->next) {
        if (t->ndim == LOOM_ST_MAX_DIMS)
            return bad_file(path, "tensor '%s': shape has more than %d dimensions", name,
                            LOOM_ST_MAX_DIMS);
        uint64_t v;
        if (json_uint(d, &v) != 0)
            return bad_file(path, "tensor '%s': shape[%d] is not a non-negative integer", name,
                            t->ndim);
        if (v != 0 && numel > UINT64_MAX / v)
            return bad_file(path, "tensor '%s': shape's element count overflows", name);
        numel *= v;
        t->shape[t->ndim++] = (int64_t)v;
    }
    size_t esize = dtype_sizes[t->dtype];
    if (numel > UINT64_MAX / esize)
        return bad_file(path, "tensor '%s': shape's byte size overflows", name);
    uint64_t need = numel * esize;

    if (!cJSON_IsArray(offs) || cJSON_GetArraySize(offs) != 2)
        return bad_file(path, "tensor '%s': data_offsets is not an array of two integers", name);
    uint64_t begin, end;
    if (json_uint(offs->child, &begin) != 0 || json_uint(offs->child->next, &end) != 0)
        return bad_file(path, "tensor '%s': data_offsets is not two non-negative integers", name);
    if (begin > end)
        return bad_file(path,
                        "tensor '%s': data_offsets [%" PRIu64 ", %" PRIu64 "] begin after end",
                        name, begin, end);
    if (end - begin != need)
        return bad_file(path,
                        "tensor '%s': data_offsets [%" PRIu64 ", %" PRIu64 "] hold %" PRIu64
                        " bytes but shape and dtype %s need %" PRIu64,
                        name, begin, end, end - begin, dtype_names[t->dtype], need);
    if (end > data_size)
        return bad_file(path,
                        "tensor '%s': data_offsets [%" PRIu64 ", %" PRIu64 "] run past the %" PRIu64
                        "-byte data area",
                        name, begin, end, data_size);
    t->numel = numel;
    t->nbytes = (size_t)need; /* need <= data_size <= map size: fits */
    t->offset = begin;
    return 0;
}

/* Names unique, spans disjoint. Leaves st->tensors sorted by name. */
static int check_layout(struct loom_st *st)
{
    char na[80], nb[80];
    int n = st->ntensors, rc = 0;
    qsort(st->tensors, (size_t)n, sizeof *st->tensors, cmp_tensor_name);
    for (int i = 1; i < n; i++)
        if (strcmp(st->tensors[i - 1].name, st->tensors[i].name) == 0)
            return bad_file(st->path, "tensor '%s' appears twice in the header",
                            shown(st->tensors[i].name, na, sizeof na));

    const struct loom_st_tensor **by_span =
        loom_alloc(((size_t)n + 1) * sizeof *by_span, LOOM_MEM_OTHER);
    for (int i = 0; i < n; i++) by_span[i] = &st->tensors[i];
    qsort(by_span, (size_t)n, sizeof *by_span, cmp_tensor_span);
    const struct loom_st_tensor *last = NULL; /* the span reaching furthest so far */
    for (int i = 0; i < n; i++) {
        const struct loom_st_tensor *t = by_span[i];
        if (t->nbytes == 0) continue; /* an empty span holds no byte to share */
        if (last && t->offset < last->offset + last->nbytes) {
            rc = bad_file(st->path,
                          "tensors '%s' [%" PRIu64 ", %" PRIu64 ") and '%s' [%" PRIu64 ", %" PRIu64
                          ") overlap",
                          shown(last->name, na, sizeof na), last->offset,
                          last->offset + (uint64_t)last->nbytes, shown(t->name, nb, sizeof nb),
                          t->offset, t->offset + (uint64_t)t->nbytes);
            goto fail;
        }
        if (!last || t->offset + t->nbytes > last->offset + last->nbytes) last = t;
    }
fail:
    loom_free(by_span);
    return rc;
}

static int parse_header(struct loom_st *st)
{
    int rc = 0;
    char *text = NULL;
    uint64_t size = st->map_size;
    uint64_t hlen = read_le64(st->map);
    if (hlen > LOOM_ST_MAX_HEADER)
        return bad_file(st->path, "header size %" PRIu64 " exceeds the limit of %" PRIu64 " bytes",
                        hlen, LOOM_ST_MAX_HEADER);
    if (hlen > size - 8)
        return bad_file(
            st->path, "header size %" PRIu64 " exceeds the %" PRIu64 " bytes after the size field",
            hlen, size - 8);
    uint64_t data_size = size - 8 - hlen;

    text = loom_alloc((size_t)hlen + 1, LOOM_MEM_OTHER);
    memcpy(text, st->map + 8, (size_t)hlen);
    const char *nul = memchr(text, '\0', (size_t)hlen);
    if (nul) {
        rc = bad_file(st->path, "header holds a NUL byte at offset %zu", (size_t)(nul - text));
        goto fail;
    }
    const char *end = NULL;
    cJSON *root = cJSON_ParseWithLengthOpts(text, (size_t)hlen, &end, 0);
    if (!root) {
        size_t at = end && end >= text && end <= text + hlen ? (size_t)(end - text) : 0;
        rc = bad_file(st->path, "header is not valid JSON (error near byte %zu of %" PRIu64 ")", at,
                      hlen);
        goto fail;
    }
    st->json = root;
    for (const char *p = end; p < text + hlen; p++) {
        if (*p != ' ' && *p != '\t' && *p != '\n' && *p != '\r') {
            rc = bad_file(st->path, "header has bytes after its JSON value, at byte %zu",
                          (size_t)(p - text));
            goto fail;
        }
    }
    if (!cJSON_IsObject(root)) {
        rc = bad_file(st->path, "header is not a JSON object");
        goto fail;
    }

    int n = 0;
    for (const cJSON *e = root->child; e; e = e->next) n++;
    st->tensors = loom_alloc(((size_t)n + 1) * sizeof *st->tensors, LOOM_MEM_OTHER);
    const cJSON *meta = NULL;
    for (const cJSON *e = root->child; e; e = e->next) {
        const char *key = e->string ? e->string : "";
        if (strcmp(key, "__metadata__") == 0) {
            if (meta) {
                rc = bad_file(st->path, "\"__metadata__\" appears twice");
                goto fail;
            }
            meta = e;
            if ((rc = parse_meta(st, e)) != 0) goto fail;
            continue;
        }
        struct loom_st_tensor *t = &st->tensors[st->ntensors];
        t->name = key;
        if ((rc = parse_entry(st, e, data_size, t)) != 0) goto fail;
        t->data = st->map + 8 + hlen + t->offset;
        st->ntensors++;
    }
    rc = check_layout(st);
fail:
    loom_free(text);
    return rc;
}

int loom_st_open(struct loom_st *st, const char *path)
{
    int rc = 0, fd = -1;
    struct stat sb;
    memset(st, 0, sizeof *st);
    size_t plen = strlen(path);
    st->path = loom_alloc(plen + 1, LOOM_MEM_OTHER);
    memcpy(st->path, path, plen + 1);

    fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) {
        rc = loom_error_set(LOOM_ERR_INPUT, "open %s: %s", path, strerror(errno));
        goto fail;
    }
    if (fstat(fd, &sb) != 0) {
        rc = loom_error_set(LOOM_ERR_RUNTIME, "fstat %s: %s", path, strerror(errno));
        goto fail;
    }
    if (!S_ISREG(sb.st_mode)) {
        rc = bad_file(path, "not a regular file");
        goto fail;
    }
    if (sb.st_size < 8) {
        rc = bad_file(path, "file is %lld bytes, too short for the 8-byte header size",
                      (long long)sb.st_size);
        goto fail;
    }
    if ((uint64_t)sb.st_size > SIZE_MAX) {
        rc = bad_file(path, "file of %lld bytes is too large to map", (long long)sb.st_size);
        goto fail;
    }
    void *map = mmap(NULL, (size_t)sb.st_size, PROT_READ, MAP_PRIVATE, fd, 0);
    if (map == MAP_FAILED) {
        rc = loom_error_set(LOOM_ERR_RUNTIME, "mmap %s (%lld bytes): %s", path,
                            (long long)sb.st_size, strerror(errno));
        goto fail;
    }
    st->map = map;
    st->map_size = (size_t)sb.st_size;
    int cfd = fd;
    fd = -1;
    if (close(cfd) != 0) {
        rc = loom_error_set(LOOM_ERR_RUNTIME, "close %s: %s", path, strerror(errno));
        goto fail;
    }
    if ((rc = parse_header(st)) != 0) goto fail;
    return 0;
fail:;
    int saved = errno;
    if (fd >= 0) close(fd);
    loom_st_close(st);
    errno = saved;
    return rc;
}

void loom_st_close(struct loom_st *st)
{
    if (st->map) munmap((void *)st->map, st->map_size);
    if (st->json) cJSON_Delete(st->json);
    loom_free(st->tensors);
    loom_free(st->meta);
    loom_free(st->path);
    memset(st, 0, sizeof *st);
}

const struct loom_st_tensor *loom_st_find(const struct loom_st *st, const char *name)
{
    struct loom_st_tensor key = {.name = name};
    if (st->ntensors == 0) return NULL;
    return bsearch(&key, st->tensors, (size_t)st->ntensors, sizeof key, cmp_tensor_name);
}

int loom_st_count(const struct loom_st *st) { return st->ntensors; }

const struct loom_st_tensor *loom_st_at(const struct loom_st *st, int i)
{
    LOOM_ASSERT(i >= 0 && i < st->ntensors);
    return &st->tensors[i];
}

const char *loom_st_meta(const struct loom_st *st, const char *key)
{
    if (st->nmeta == 0) return NULL;
    const char **kv =
        bsearch(&key, st->meta, (size_t)st->nmeta, 2 * sizeof *st->meta, cmp_pair_key);
    return kv ? kv[1] : NULL;
}

int loom_st_meta_count(const struct loom_st *st) { return st->nmeta; }

void loom_st_meta_at(const struct loom_st *st, int i, const char **key, const char **value)
{
    LOOM_ASSERT(i >= 0 && i < st->nmeta);
    *key = st->meta[2 * i];
    *value = st->meta[2 * i + 1];
}

/* ---- conversion to float32 ------------------------------------------------- */

static float f16_to_f32(uint16_t h)
{
    uint32_t sign = (uint32_t)(h & 0x8000u) << 16, exp = (h >> 10) & 0x1fu, mant = h & 0x3ffu, bits;
    if (exp == 0) {
        float v = ldexpf((float)mant, -24); /* zero or subnormal: mant * 2^-24, exact */
        return sign ? -v : v;
    }
    if (exp == 31)
        bits = sign | 0x7f800000u | mant << 13; /* inf, nan */
    else
        bits = sign | (exp + 112) << 23 | mant << 13; /* rebias 15 -> 127 */
    float f;
    memcpy(&f, &bits, sizeof f);
    return f;
}

int loom_st_read_f32(const struct loom_st_tensor *t, float *dst, size_t n)
{
    char nb[80];
    if (n != t->numel)
        return loom_error_set(LOOM_ERR_INPUT, "tensor '%s': %" PRIu64 " elements, not %zu",
                              shown(t->name, nb, sizeof nb), t->numel, n);
    const unsigned char *p = t->data;
    switch (t->dtype) {
    case LOOM_ST_F32:
        memcpy(dst, p, n * sizeof(float));
        return 0;
    case LOOM_ST_F64:
        for (size_t i = 0; i < n; i++) {
            double d;
            memcpy(&d, p + 8 * i, sizeof d);
            dst[i] = (float)d;
        }
        return 0;
    case LOOM_ST_F16:
        for (size_t i = 0; i < n; i++) {
            uint16_t h;
            memcpy(&h, p + 2 * i, sizeof h);
            dst[i] = f16_to_f32(h);
        }
        return 0;
    case LOOM_ST_BF16:
        for (size_t i = 0; i < n; i++) {
            uint16_t h;
            memcpy(&h, p + 2 * i, sizeof h);
            uint32_t bits = (uint32_t)h << 16;
            memcpy(&dst[i], &bits, sizeof bits);
        }
        return 0;
    default:
        return loom_error_set(LOOM_ERR_INPUT, "tensor '%s': dtype %s does not convert to float32",
                              shown(t->name, nb, sizeof nb), loom_st_dtype_name(t->dtype));
    }
}

/* ---- writer ---------------------------------------------------------------- */

struct out_tensor {
    const struct loom_st_tensor_in *in;
    size_t esize;
    uint64_t nbytes, offset;
};

static int cmp_out_name(const void *a, const void *b)
{
    return strcmp(((const struct out_tensor *)a)->in->name,
                  ((const struct out_tensor *)b)->in->name);
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
        int more = c >= 0xc2 && c <= 0xdf   ? 1
                   : c >= 0xe0 && c <= 0xef ? 2
                   : c >= 0xf0 && c <= 0xf4 ? 3
                                            : -1;
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
        if (!t->name) return bad_file(path, "tensor %d has no name", i);
        const char *name = shown(t->name, nb, sizeof nb);
        if (strcmp(t->name, "__metadata__") == 0)
            return bad_file(path, "tensor name \"__metadata__\" is reserved");
        if (!valid_utf8(t->name)) return bad_file(path, "tensor '%s': name is not UTF-8", name);
        if ((unsigned)t->dtype >= LOOM_ST_DTYPE_COUNT)
            return bad_file(path, "tensor '%s': dtype value %d is out of range", name,
                            (int)t->dtype);
        if (t->ndim < 0 || t->ndim > LOOM_ST_MAX_DIMS)
            return bad_file(path, "tensor '%s': ndim %d is outside 0..%d", name, t->ndim,
                            LOOM_ST_MAX_DIMS);
        uint64_t numel = 1;
        for (int d = 0; d < t->ndim; d++) {
            if (t->shape[d] < 0 || (uint64_t)t->shape[d] > MAX_EXACT_INT)
                return bad_file(path, "tensor '%s': shape[%d] = %" PRId64 " is out of range", name,
                                d, t->shape[d]);
            uint64_t v = (uint64_t)t->shape[d];
            if (v != 0 && numel > UINT64_MAX / v)
                return bad_file(path, "tensor '%s': element count overflows", name);
            numel *= v;
        }
        out[i].in = t;
        out[i].esize = dtype_sizes[t->dtype];
        if (numel > MAX_EXACT_INT / out[i].esize)
            return bad_file(path, "tensor '%s': byte size overflows", name);
        out[i].nbytes = numel * out[i].esize;
        if (out[i].nbytes > 0 && !t->data) return bad_file(path, "tensor '%s': data is NULL", name);
    }
    qsort(out, (size_t)n, sizeof *out, cmp_out_name);
    for (int i = 1; i < n; i++)
        if (strcmp(out[i - 1].in->name, out[i].in->name) == 0)
            return bad_file(path, "tensor '%s' is given twice",
                            shown(out[i].in->name, nb, sizeof nb));
    qsort(out, (size_t)n, sizeof *out, cmp_out_layout);
    uint64_t offset = 0;
    for (int i = 0; i < n; i++) {
        out[i].offset = offset;
        if (out[i].nbytes > MAX_EXACT_INT - offset)
            return bad_file(path, "total data size overflows");
        offset += out[i].nbytes;
    }

    for (int i = 0; i < 2 * nmeta; i++) {
        if (!meta_kv[i])
            return bad_file(path, "metadata %s %d is NULL", i % 2 ? "value" : "key", i / 2);
        if (!valid_utf8(meta_kv[i]))
            return bad_file(path, "metadata %s '%s' is not UTF-8", i % 2 ? "value" : "key",
                            shown(meta_kv[i], nb, sizeof nb));
    }
    int rc = 0;
    const char **keys = loom_alloc(((size_t)nmeta + 1) * sizeof *keys, LOOM_MEM_OTHER);
    for (int i = 0; i < nmeta; i++) keys[i] = meta_kv[2 * i];
    qsort(keys, (size_t)nmeta, sizeof *keys, cmp_pair_key);
    for (int i = 1; i < nmeta; i++) {
        if (strcmp(keys[i - 1], keys[i]) == 0) {
            rc = bad_file(path, "metadata key '%s' is given twice", shown(keys[i], nb, sizeof nb));
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
static char *format_header(const struct out_tensor *out, int n, const char *const *meta_kv,
                           int nmeta)
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
        if (!e || !cJSON_AddStringToObject(e, "dtype", dtype_names[t->dtype])) goto fail;
        cJSON *shape = cJSON_AddArrayToObject(e, "shape");
        if (!shape) goto fail;
        for (int d = 0; d < t->ndim; d++)
            if (add_uint(shape, (uint64_t)t->shape[d]) != 0) goto fail;
        cJSON *offs = cJSON_AddArrayToObject(e, "data_offsets");
        if (!offs || add_uint(offs, out[i].offset) != 0 ||
            add_uint(offs, out[i].offset + out[i].nbytes) != 0)
            goto fail;
    }
    text = cJSON_PrintUnformatted(root);
fail:
    cJSON_Delete(root);
    return text;
}

static int write_all(int fd, const void *buf, size_t len, const char *file)
{
    const char *p = buf;
    while (len > 0) {
        size_t chunk = len < ((size_t)1 << 30) ? len : ((size_t)1 << 30);
        ssize_t w = write(fd, p, chunk);
        if (w < 0 && errno == EINTR) continue;
        if (w <= 0) {
            if (w == 0) errno = EIO;
            return loom_error_set(LOOM_ERR_RUNTIME, "write %s: %s", file, strerror(errno));
        }
        p += w;
        len -= (size_t)w;
    }
    return 0;
}

/* fsync of the directory holding `path`, so the rename itself is durable. */
static int sync_parent_dir(const char *path)
{
    int rc = 0, fd = -1;
    const char *slash = strrchr(path, '/');
    size_t len = !slash ? 1 : slash == path ? 1 : (size_t)(slash - path);
    char *dir = loom_alloc(len + 1, LOOM_MEM_OTHER);
    memcpy(dir, slash ? path : ".", len);
    fd = open(dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (fd < 0) {
        rc = loom_error_set(LOOM_ERR_RUNTIME, "open directory %s: %s", dir, strerror(errno));
        goto fail;
    }
    /* Some file systems cannot fsync a directory and say so with EINVAL. */
    if (fsync(fd) != 0 && errno != EINVAL) {
        rc = loom_error_set(LOOM_ERR_RUNTIME, "fsync directory %s: %s", dir, strerror(errno));
        goto fail;
    }
fail:;
    int saved = errno;
    if (fd >= 0) close(fd);
    loom_free(dir);
    errno = saved;
    return rc;
}

int loom_st_write(const char *path, const struct loom_st_tensor_in *tensors, int n,
                  const char *const *meta_kv, int nmeta)
{
    int rc = 0, fd = -1, tmp_made = 0;
    char *header = NULL, *tmp = NULL;
    struct out_tensor *out = NULL;
    LOOM_ASSERT(path != NULL);
    if (n < 0 || nmeta < 0 || (n > 0 && !tensors) || (nmeta > 0 && !meta_kv))
        return bad_file(path, "bad arguments: %d tensors, %d metadata pairs", n, nmeta);

    out = loom_alloc(((size_t)n + 1) * sizeof *out, LOOM_MEM_OTHER);
    if ((rc = plan_tensors(path, tensors, n, meta_kv, nmeta, out)) != 0) goto fail;
    header = format_header(out, n, meta_kv, nmeta);
    if (!header) {
        rc = loom_error_set(LOOM_ERR_RUNTIME, "%s: out of memory formatting the header", path);
        goto fail;
    }
    size_t hlen = strlen(header), padded = (hlen + 7) / 8 * 8;
    if (padded > LOOM_ST_MAX_HEADER) {
        rc = bad_file(path, "header of %zu bytes is over the readers' limit of %" PRIu64, padded,
                      LOOM_ST_MAX_HEADER);
        goto fail;
    }
    unsigned char size_le[8];
    for (int i = 0; i < 8; i++) size_le[i] = (unsigned char)((uint64_t)padded >> (8 * i));

    size_t tlen = strlen(path) + 32;
    tmp = loom_alloc(tlen, LOOM_MEM_OTHER);
    snprintf(tmp, tlen, "%s.tmp.%ld", path, (long)getpid());
    fd = open(tmp, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC | O_NOFOLLOW, 0644);
    if (fd < 0) {
        rc = loom_error_set(LOOM_ERR_RUNTIME, "open %s: %s", tmp, strerror(errno));
        goto fail;
    }
    tmp_made = 1;
    char spaces[8];
    memset(spaces, ' ', sizeof spaces);
    if ((rc = write_all(fd, size_le, sizeof size_le, tmp)) != 0) goto fail;
    if ((rc = write_all(fd, header, hlen, tmp)) != 0) goto fail;
    if ((rc = write_all(fd, spaces, padded - hlen, tmp)) != 0) goto fail;
    for (int i = 0; i < n; i++)
        if ((rc = write_all(fd, out[i].in->data, (size_t)out[i].nbytes, tmp)) != 0) goto fail;
    if (fsync(fd) != 0) {
        rc = loom_error_set(LOOM_ERR_RUNTIME, "fsync %s: %s", tmp, strerror(errno));
        goto fail;
    }
    int cfd = fd;
    fd = -1;
    if (close(cfd) != 0) {
        rc = loom_error_set(LOOM_ERR_RUNTIME, "close %s: %s", tmp, strerror(errno));
        goto fail;
    }
    if (rename(tmp, path) != 0) {
        rc = loom_error_set(LOOM_ERR_RUNTIME, "rename %s to %s: %s", tmp, path, strerror(errno));
        goto fail;
    }
    tmp_made = 0;
    rc = sync_parent_dir(path);
fail:;
    int saved = errno;
    if (fd >= 0) close(fd);
    if (tmp_made) unlink(tmp);
    loom_free(tmp);
    cJSON_free(header);
    loom_free(out);
    errno = saved;
    return rc;
}
