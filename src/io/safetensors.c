/*
 * safetensors reading, dtype names and conversion to float32 (format in
 * safetensors.h; the writer is safetensors_write.c).
 *
 * The reader trusts nothing in the file: the header size is bounded; the
 * header's bytes must be strict UTF-8 without NUL, raw control bytes in
 * strings or \u0000 escapes; the JSON is read in place, one key or member
 * at a time (memory a few times the header, never a tree of all of it; a
 * tensor entry of more than 1 MiB is refused); every number must be an exact non-negative integer below 2^53;
 * a shape's product, even with a zero dimension, must fit int64 in bytes; every span must match its shape and
 * lie inside the data area; and no two non-empty spans may share a byte. Gaps between spans and bytes after
 * the last span are accepted. Numbers pass through a double: 2.0 or 2e0 read as 2, and so does a literal
 * like 2.00000000000000001 that rounds to it; 2^53 and above are rejected, since 2^53 + 1 would read as 2^53.
 *
 * Not here: byte swapping (a little-endian host is required), protection
 * against the file being truncated while mapped (SIGBUS, as with any mmap),
 * and conversions other than the float ones to float32.
 */
#include "io/safetensors.h"
#include "io/safetensors_impl.h"

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

#include "base/dtype.h"
#include "base/log.h"
#include "base/mem.h"
#include "io/json_span.h"

static_assert(__BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__, "safetensors I/O assumes a little-endian host");

static const char *const dtype_names[] = {
    [LOOM_DTYPE_F32] = "F32", [LOOM_DTYPE_F16] = "F16", [LOOM_DTYPE_BF16] = "BF16", [LOOM_DTYPE_F64] = "F64",
    [LOOM_DTYPE_I32] = "I32", [LOOM_DTYPE_I64] = "I64", [LOOM_DTYPE_U8] = "U8",     [LOOM_DTYPE_I8] = "I8",
    [LOOM_DTYPE_U16] = "U16", [LOOM_DTYPE_I16] = "I16", [LOOM_DTYPE_BOOL] = "BOOL", [LOOM_DTYPE_U32] = "U32",
    [LOOM_DTYPE_U64] = "U64",
};
static_assert(sizeof dtype_names / sizeof dtype_names[0] == LOOM_DTYPE_COUNT,
              "dtype_names must name every loom_st_dtype");

static const unsigned char dtype_sizes[] = {
    [LOOM_DTYPE_F32] = 4, [LOOM_DTYPE_F16] = 2, [LOOM_DTYPE_BF16] = 2, [LOOM_DTYPE_F64] = 8,
    [LOOM_DTYPE_I32] = 4, [LOOM_DTYPE_I64] = 8, [LOOM_DTYPE_U8] = 1,   [LOOM_DTYPE_I8] = 1,
    [LOOM_DTYPE_U16] = 2, [LOOM_DTYPE_I16] = 2, [LOOM_DTYPE_BOOL] = 1, [LOOM_DTYPE_U32] = 4,
    [LOOM_DTYPE_U64] = 8,
};
static_assert(sizeof dtype_sizes == LOOM_DTYPE_COUNT, "dtype_sizes must size every loom_st_dtype");

const char *loom_st_dtype_name(enum loom_dtype dtype)
{
    return (unsigned)dtype < LOOM_DTYPE_COUNT ? dtype_names[dtype] : NULL;
}

size_t loom_st_dtype_size(enum loom_dtype dtype)
{
    return (unsigned)dtype < LOOM_DTYPE_COUNT ? dtype_sizes[dtype] : 0;
}

int loom_st_dtype_parse(const char *name, enum loom_dtype *out)
{
    for (int i = 0; i < LOOM_DTYPE_COUNT; i++) {
        if (strcmp(name, dtype_names[i]) == 0) {
            *out = (enum loom_dtype)i;
            return 0;
        }
    }
    return -1;
}

/* ---- reader ----------------------------------------------------------------- */

/* A string fit for a one-line message: control bytes become '?', and a long
 * one is cut with "...". */
const char *loom_st_shown(const char *s, char *buf, size_t cap)
{
    size_t i = 0;
    for (; s[i] && i + 4 < cap; i++) buf[i] = (unsigned char)s[i] < 0x20 || s[i] == 0x7f ? '?' : s[i];
    if (s[i]) {
        memcpy(buf + i, "...", 3);
        i += 3;
    }
    buf[i] = '\0';
    return buf;
}

/* LOOM_ERR_INPUT with "PATH: message". */
int loom_st_bad_file(const char *path, const char *fmt, ...)
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

/* An exact integer in [0, 2^53); 0 on success. */
static int json_uint(const cJSON *item, uint64_t *out)
{
    if (!cJSON_IsNumber(item)) return -1;
    double d = item->valuedouble;
    if (!(d >= 0) || d >= (double)LOOM_ST_MAX_EXACT_INT || d != floor(d)) return -1;
    *out = (uint64_t)d;
    return 0;
}

/* Length of the strict UTF-8 sequence (no overlong forms, surrogates or
 * values past U+10FFFF) starting at s, within n bytes; 0 when there is none. */
static size_t utf8_seq(const unsigned char *s, size_t n)
{
    unsigned c = s[0];
    size_t more = c >= 0xc2 && c <= 0xdf ? 1 : c >= 0xe0 && c <= 0xef ? 2 : c >= 0xf0 && c <= 0xf4 ? 3 : 0;
    if (more == 0 || more >= n) return 0;
    unsigned cp = c & (0x3fu >> more);
    for (size_t k = 1; k <= more; k++) {
        if ((s[k] & 0xc0) != 0x80) return 0;
        cp = cp << 6 | (s[k] & 0x3fu);
    }
    if ((more == 2 && (cp < 0x800 || (cp >= 0xd800 && cp <= 0xdfff))) ||
        (more == 3 && (cp < 0x10000 || cp > 0x10ffff)))
        return 0;
    return more + 1;
}

/* The header's bytes, before cJSON sees them: no NUL, strict UTF-8, and
 * inside strings no raw control byte and no \u0000 escape (cJSON would end
 * the decoded string there, so a name "a\u0000b" would read as "a"). The
 * string tracking is exact for valid JSON; invalid JSON fails to parse
 * anyway. */
static int check_header_bytes(const struct loom_st *st, const unsigned char *h, size_t n)
{
    int in_string = 0;
    for (size_t i = 0; i < n; i++) {
        unsigned c = h[i];
        if (c == 0) return loom_st_bad_file(st->path, "header holds a NUL byte at offset %zu", i);
        if (c >= 0x80) {
            size_t len = utf8_seq(h + i, n - i);
            if (len == 0)
                return loom_st_bad_file(st->path, "header is not UTF-8: byte 0x%02x at offset %zu", c, i);
            i += len - 1;
        } else if (!in_string) {
            in_string = c == '"';
        } else if (c < 0x20) {
            return loom_st_bad_file(st->path, "header has control byte 0x%02x in a string at offset %zu", c,
                                    i);
        } else if (c == '"') {
            in_string = 0;
        } else if (c == '\\' && i + 1 < n) {
            if (n - i >= 6 && memcmp(h + i + 1, "u0000", 5) == 0)
                return loom_st_bad_file(st->path, "header has a \\u0000 escape in a string at offset %zu", i);
            if (h[i + 1] == '"' || h[i + 1] == '\\') i++; /* an escaped quote or backslash */
        }
    }
    return 0;
}

static int cmp_tensor_name(const void *a, const void *b)
{
    return strcmp(((const struct loom_st_tensor *)a)->name, ((const struct loom_st_tensor *)b)->name);
}

static int cmp_tensor_span(const void *a, const void *b)
{
    const struct loom_st_tensor *x = *(const struct loom_st_tensor *const *)a;
    const struct loom_st_tensor *y = *(const struct loom_st_tensor *const *)b;
    if (x->offset != y->offset) return x->offset < y->offset ? -1 : 1;
    return x->nbytes < y->nbytes ? -1 : x->nbytes > y->nbytes;
}

/* Compares two (key, value) pairs, or two keys, by key. */
int loom_st_cmp_pair_key(const void *a, const void *b)
{
    return strcmp(*(const char *const *)a, *(const char *const *)b);
}

/* One header entry into *t; data_size is the size of the data area. */
static int parse_entry(const struct loom_st *st, const cJSON *e, uint64_t data_size, struct loom_st_tensor *t)
{
    char nb[80], vb[40];
    const char *name = loom_st_shown(t->name, nb, sizeof nb);
    const char *path = st->path;
    if (!cJSON_IsObject(e)) return loom_st_bad_file(path, "tensor '%s': entry is not a JSON object", name);

    const cJSON *dtype = NULL, *shape = NULL, *offs = NULL;
    for (const cJSON *f = e->child; f; f = f->next) {
        const char *key = f->string ? f->string : "";
        const cJSON **slot = strcmp(key, "dtype") == 0          ? &dtype
                             : strcmp(key, "shape") == 0        ? &shape
                             : strcmp(key, "data_offsets") == 0 ? &offs
                                                                : NULL;
        if (!slot) continue; /* unknown fields are ignored, as other readers do */
        if (*slot) return loom_st_bad_file(path, "tensor '%s': field \"%s\" appears twice", name, key);
        *slot = f;
    }
    if (!dtype) return loom_st_bad_file(path, "tensor '%s': missing \"dtype\"", name);
    if (!shape) return loom_st_bad_file(path, "tensor '%s': missing \"shape\"", name);
    if (!offs) return loom_st_bad_file(path, "tensor '%s': missing \"data_offsets\"", name);

    if (!cJSON_IsString(dtype) || !dtype->valuestring)
        return loom_st_bad_file(path, "tensor '%s': dtype is not a string", name);
    if (loom_st_dtype_parse(dtype->valuestring, &t->dtype) != 0)
        return loom_st_bad_file(path, "tensor '%s': unknown dtype '%s'", name,
                                loom_st_shown(dtype->valuestring, vb, sizeof vb));

    if (!cJSON_IsArray(shape)) return loom_st_bad_file(path, "tensor '%s': shape is not an array", name);
    /* extent, the product of the non-zero dimensions, is bounded too, so the
     * strides of an empty tensor ([0, 2^40, 2^40]) cannot overflow either */
    uint64_t numel = 1, extent = 1;
    t->ndim = 0;
    for (const cJSON *d = shape->child; d; d = d->next) {
        if (t->ndim == LOOM_ST_MAX_DIMS)
            return loom_st_bad_file(path, "tensor '%s': shape has more than %d dimensions", name,
                                    LOOM_ST_MAX_DIMS);
        uint64_t v;
        if (json_uint(d, &v) != 0)
            return loom_st_bad_file(path, "tensor '%s': shape[%d] is not an integer in [0, 2^53)", name,
                                    t->ndim);
        if (v != 0 && extent > (uint64_t)INT64_MAX / v)
            return loom_st_bad_file(path, "tensor '%s': shape's element count overflows", name);
        if (v != 0) extent *= v;
        numel *= v; /* 0 or extent */
        t->shape[t->ndim++] = (int64_t)v;
    }
    size_t esize = dtype_sizes[t->dtype];
    if (extent > (uint64_t)INT64_MAX / esize)
        return loom_st_bad_file(path, "tensor '%s': shape's byte size overflows", name);
    uint64_t need = numel * esize;

    if (!cJSON_IsArray(offs) || cJSON_GetArraySize(offs) != 2)
        return loom_st_bad_file(path, "tensor '%s': data_offsets is not an array of two integers", name);
    uint64_t begin, end;
    if (json_uint(offs->child, &begin) != 0 || json_uint(offs->child->next, &end) != 0)
        return loom_st_bad_file(path, "tensor '%s': data_offsets is not two integers in [0, 2^53)", name);
    if (begin > end)
        return loom_st_bad_file(path, "tensor '%s': data_offsets [%" PRIu64 ", %" PRIu64 "] begin after end",
                                name, begin, end);
    if (end - begin != need)
        return loom_st_bad_file(path,
                                "tensor '%s': data_offsets [%" PRIu64 ", %" PRIu64 "] hold %" PRIu64
                                " bytes but shape and dtype %s need %" PRIu64,
                                name, begin, end, end - begin, dtype_names[t->dtype], need);
    if (end > data_size)
        return loom_st_bad_file(path,
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
            return loom_st_bad_file(st->path, "tensor '%s' appears twice in the header",
                                    loom_st_shown(st->tensors[i].name, na, sizeof na));

    const struct loom_st_tensor **by_span = loom_alloc(((size_t)n + 1) * sizeof *by_span, LOOM_MEM_OTHER);
    for (int i = 0; i < n; i++) by_span[i] = &st->tensors[i];
    qsort(by_span, (size_t)n, sizeof *by_span, cmp_tensor_span);
    const struct loom_st_tensor *last = NULL; /* the span reaching furthest so far */
    for (int i = 0; i < n; i++) {
        const struct loom_st_tensor *t = by_span[i];
        if (t->nbytes == 0) continue; /* an empty span holds no byte to share */
        if (last && t->offset < last->offset + last->nbytes) {
            rc = loom_st_bad_file(
                st->path,
                "tensors '%s' [%" PRIu64 ", %" PRIu64 ") and '%s' [%" PRIu64 ", %" PRIu64 ") overlap",
                loom_st_shown(last->name, na, sizeof na), last->offset, last->offset + (uint64_t)last->nbytes,
                loom_st_shown(t->name, nb, sizeof nb), t->offset, t->offset + (uint64_t)t->nbytes);
            goto fail;
        }
        if (!last || t->offset + t->nbytes > last->offset + last->nbytes) last = t;
    }
fail:
    loom_free(by_span);
    return rc;
}

/* ---- the header's two outer levels, scanned in place ----------------------------
 *
 * The header is not parsed whole: a tree of it costs tens of times its
 * bytes (a 47.5 MB header of small entries took 745 MB, one of a long
 * array 1.9 GB). The outer object and __metadata__ are scanned here, and
 * cJSON parses one key or one member's value at a time, each tree freed
 * before the next; names and metadata strings are copied into one arena
 * of at most the header's size. Memory stays a small multiple of the
 * header: the tensor table, the arena, and the largest single member. */

struct scan {
    struct loom_st *st;
    const char *h, *e; /* the header */
    char *arena;       /* where decoded strings go */
    size_t used;
};

static int invalid_at(const struct scan *sc, const char *at)
{
    return loom_st_bad_file(sc->st->path, "header is not valid JSON (error near byte %zu of %zu)",
                            (size_t)(at - sc->h), (size_t)(sc->e - sc->h));
}

/* One JSON value of [p, q) parsed alone; NULL with the error set. */
static cJSON *parse_span(const struct scan *sc, const char *p, const char *q)
{
    const char *end = NULL;
    cJSON *c = cJSON_ParseWithLengthOpts(p, (size_t)(q - p), &end, 0);
    if (!c) {
        invalid_at(sc, end && end >= p && end <= q ? end : p);
        return NULL;
    }
    if (end != q) { /* cJSON stopped early (it skips control bytes as space): not one value */
        cJSON_Delete(c);
        invalid_at(sc, end && end >= p && end <= q ? end : p);
        return NULL;
    }
    return c;
}

/* A decoded string copied into the arena (there is room: decoding never
 * lengthens a string, and each raw string is counted once). */
static const char *keep(struct scan *sc, const char *s)
{
    const size_t n = strlen(s) + 1;
    LOOM_ASSERT(sc->used + n <= (size_t)(sc->e - sc->h) + 1);
    char *out = memcpy(sc->arena + sc->used, s, n);
    sc->used += n;
    return out;
}

/* The next member of an object at *p (just past '{' or a ','): its key
 * (decoded into the arena when key is not NULL) and its value's span, *p
 * left past the ',' or at the '}'. Returns 1 for a member, 0 at the end
 * of the object (*p past the '}'), -1 with the error set. */
static int next_member(struct scan *sc, const char **p, const char **key, const char **v, const char **ve)
{
    const char *q = loom_json_space(*p, sc->e);
    if (q < sc->e && *q == '}') {
        *p = q + 1;
        return 0;
    }
    const char *ke = q < sc->e && *q == '"' ? loom_json_string_end(q, sc->e) : NULL;
    if (!ke) return invalid_at(sc, q), -1;
    if (key) {
        cJSON *k = parse_span(sc, q, ke);
        if (!k) return -1;
        *key = keep(sc, k->valuestring);
        cJSON_Delete(k);
    }
    q = loom_json_space(ke, sc->e);
    if (q == sc->e || *q != ':') return invalid_at(sc, q), -1;
    *v = loom_json_space(q + 1, sc->e);
    if (!(*ve = loom_json_value_end(*v, sc->e))) return invalid_at(sc, *v), -1;
    q = loom_json_space(*ve, sc->e);
    if (q < sc->e && *q == ',') {
        const char *n = loom_json_space(q + 1, sc->e);
        if (n == sc->e || *n != '"') return invalid_at(sc, n), -1; /* a trailing comma */
        *p = q + 1;
    } else if (q < sc->e && *q == '}') {
        *p = q;
    } else {
        return invalid_at(sc, q), -1;
    }
    return 1;
}

/* The members of the object at p ('{'); -1 when malformed. */
static int64_t count_members(struct scan *sc, const char *p)
{
    int64_t n = 0;
    const char *v, *ve;
    int r;
    for (p++; (r = next_member(sc, &p, NULL, &v, &ve)) == 1;) n++;
    return r < 0 ? -1 : n;
}

/* Largest single tensor entry: a real one is about a hundred bytes; a
 * bigger one holds unknown fields whose tree alone would cost memory. */
#define MAX_ENTRY_BYTES ((size_t)1 << 20)

static int scan_meta(struct scan *sc, const char *v, const char *ve)
{
    struct loom_st *st = sc->st;
    char nb[80];
    if (*v != '{') return loom_st_bad_file(st->path, "\"__metadata__\" is not a JSON object");
    const int64_t n = count_members(sc, v);
    if (n < 0) return LOOM_ERR_INPUT;
    st->meta = loom_alloc(((size_t)n * 2 + 1) * sizeof *st->meta, LOOM_MEM_OTHER);
    const char *p = v + 1, *key, *kv, *kve;
    int r;
    while ((r = next_member(sc, &p, &key, &kv, &kve)) == 1) {
        cJSON *c = parse_span(sc, kv, kve);
        if (!c) return LOOM_ERR_INPUT;
        if (!cJSON_IsString(c) || !c->valuestring) {
            cJSON_Delete(c);
            return loom_st_bad_file(st->path, "\"__metadata__\" entry '%s' is not a string",
                                    loom_st_shown(key, nb, sizeof nb));
        }
        st->meta[2 * st->nmeta] = key;
        st->meta[2 * st->nmeta + 1] = keep(sc, c->valuestring);
        st->nmeta++;
        cJSON_Delete(c);
    }
    if (r < 0) return LOOM_ERR_INPUT;
    if (p != ve) return invalid_at(sc, p); /* the members ended before the brackets did */
    qsort(st->meta, (size_t)st->nmeta, 2 * sizeof *st->meta, loom_st_cmp_pair_key);
    for (int i = 1; i < st->nmeta; i++)
        if (strcmp(st->meta[2 * i - 2], st->meta[2 * i]) == 0)
            return loom_st_bad_file(st->path, "\"__metadata__\" key '%s' appears twice",
                                    loom_st_shown(st->meta[2 * i], nb, sizeof nb));
    return 0;
}

static int parse_header(struct loom_st *st)
{
    int rc = 0;
    uint64_t size = st->map_size;
    if (size < 8)
        return loom_st_bad_file(st->path, "file is %" PRIu64 " bytes, too short for the 8-byte header size",
                                size);
    uint64_t hlen = read_le64(st->map);
    if (hlen > LOOM_ST_MAX_HEADER)
        return loom_st_bad_file(st->path, "header size %" PRIu64 " exceeds the limit of %" PRIu64 " bytes",
                                hlen, LOOM_ST_MAX_HEADER);
    if (hlen > size - 8)
        return loom_st_bad_file(st->path,
                                "header size %" PRIu64 " exceeds the %" PRIu64 " bytes after the size field",
                                hlen, size - 8);
    uint64_t data_size = size - 8 - hlen;

    if ((rc = check_header_bytes(st, st->map + 8, (size_t)hlen)) != 0) return rc;
    struct scan sc = {st, (const char *)st->map + 8, (const char *)st->map + 8 + hlen, NULL, 0};
    const char *p = loom_json_space(sc.h, sc.e);
    if (p == sc.e) return invalid_at(&sc, p);
    if (*p != '{') {
        const char *ve = loom_json_value_end(p, sc.e);
        return ve ? loom_st_bad_file(st->path, "header is not a JSON object") : invalid_at(&sc, p);
    }
    const char *root_end = loom_json_value_end(p, sc.e);
    if (!root_end) return invalid_at(&sc, sc.e);
    for (const char *q = root_end; q < sc.e; q++)
        if (*q != ' ' && *q != '\t' && *q != '\n' && *q != '\r')
            return loom_st_bad_file(st->path, "header has bytes after its JSON value, at byte %zu",
                                    (size_t)(q - sc.h));
    const int64_t n = count_members(&sc, p);
    if (n < 0) return LOOM_ERR_INPUT;
    if (n > INT32_MAX - 1) return loom_st_bad_file(st->path, "header has %" PRId64 " entries", n);
    st->strings = sc.arena = loom_alloc((size_t)hlen + 1, LOOM_MEM_OTHER);
    st->tensors = loom_alloc(((size_t)n + 1) * sizeof *st->tensors, LOOM_MEM_OTHER);
    int meta = 0, r;
    const char *key, *v, *ve;
    char nb[80];
    for (p++; (r = next_member(&sc, &p, &key, &v, &ve)) == 1;) {
        if (strcmp(key, "__metadata__") == 0) {
            if (meta++) return loom_st_bad_file(st->path, "\"__metadata__\" appears twice");
            if ((rc = scan_meta(&sc, v, ve)) != 0) return rc;
            continue;
        }
        if ((size_t)(ve - v) > MAX_ENTRY_BYTES)
            return loom_st_bad_file(st->path, "tensor '%s': entry of %zu bytes (at most %zu)",
                                    loom_st_shown(key, nb, sizeof nb), (size_t)(ve - v), MAX_ENTRY_BYTES);
        cJSON *e = parse_span(&sc, v, ve);
        if (!e) return LOOM_ERR_INPUT;
        struct loom_st_tensor *t = &st->tensors[st->ntensors];
        t->name = key;
        rc = parse_entry(st, e, data_size, t);
        cJSON_Delete(e);
        if (rc) return rc;
        t->data = st->map + 8 + hlen + t->offset;
        st->ntensors++;
    }
    if (r < 0) return LOOM_ERR_INPUT;
    return check_layout(st);
}

int loom_st_open(struct loom_st *st, const char *path)
{
    int rc = 0, fd = -1;
    struct stat sb;
    memset(st, 0, sizeof *st);
    size_t plen = strlen(path);
    st->path = loom_alloc(plen + 1, LOOM_MEM_OTHER);
    memcpy(st->path, path, plen + 1);

    fd = open(path, O_RDONLY | O_CLOEXEC | O_NONBLOCK); /* a FIFO is refused, not waited on */
    if (fd < 0) {
        rc = loom_error_set(LOOM_ERR_INPUT, "open %s: %s", path, strerror(errno));
        goto fail;
    }
    if (fstat(fd, &sb) != 0) {
        rc = loom_error_set(LOOM_ERR_RUNTIME, "fstat %s: %s", path, strerror(errno));
        goto fail;
    }
    if (!S_ISREG(sb.st_mode)) {
        rc = loom_st_bad_file(path, "not a regular file");
        goto fail;
    }
    if ((uint64_t)sb.st_size > SIZE_MAX) {
        rc = loom_st_bad_file(path, "file of %lld bytes is too large to map", (long long)sb.st_size);
        goto fail;
    }
    if (sb.st_size > 0) { /* an empty file cannot be mapped; parse_header rejects it */
        void *map = mmap(NULL, (size_t)sb.st_size, PROT_READ, MAP_PRIVATE, fd, 0);
        if (map == MAP_FAILED) {
            rc = loom_error_set(LOOM_ERR_RUNTIME, "mmap %s (%lld bytes): %s", path, (long long)sb.st_size,
                                strerror(errno));
            goto fail;
        }
        st->map = map;
        st->map_size = (size_t)sb.st_size;
        st->mapped = 1;
    }
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

int loom_st_open_memory(struct loom_st *st, const char *name, const void *buf, size_t size)
{
    memset(st, 0, sizeof *st);
    size_t nlen = strlen(name);
    st->path = loom_alloc(nlen + 1, LOOM_MEM_OTHER);
    memcpy(st->path, name, nlen + 1);
    st->map = buf;
    st->map_size = size;
    int rc = parse_header(st);
    if (rc != 0) loom_st_close(st);
    return rc;
}

void loom_st_close(struct loom_st *st)
{
    if (st->mapped) munmap((void *)st->map, st->map_size);
    loom_free(st->strings);
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

int loom_st_count(const struct loom_st *st)
{
    return st->ntensors;
}

const struct loom_st_tensor *loom_st_at(const struct loom_st *st, int i)
{
    LOOM_ASSERT(i >= 0 && i < st->ntensors);
    return &st->tensors[i];
}

const char *loom_st_meta(const struct loom_st *st, const char *key)
{
    if (st->nmeta == 0) return NULL;
    const char **kv = bsearch(&key, st->meta, (size_t)st->nmeta, 2 * sizeof *st->meta, loom_st_cmp_pair_key);
    return kv ? kv[1] : NULL;
}

int loom_st_meta_count(const struct loom_st *st)
{
    return st->nmeta;
}

void loom_st_meta_at(const struct loom_st *st, int i, const char **key, const char **value)
{
    LOOM_ASSERT(i >= 0 && i < st->nmeta);
    *key = st->meta[2 * i];
    *value = st->meta[2 * i + 1];
}

/* ---- conversion to float32 ------------------------------------------------- */

int loom_st_read_f32(const struct loom_st_tensor *t, float *dst, size_t n)
{
    char nb[80];
    if (n != t->numel)
        return loom_error_set(LOOM_ERR_INPUT, "tensor '%s': %" PRIu64 " elements, not %zu",
                              loom_st_shown(t->name, nb, sizeof nb), t->numel, n);
    const unsigned char *p = t->data;
    switch (t->dtype) {
    case LOOM_DTYPE_F32:
        if (n > 0) memcpy(dst, p, n * sizeof(float)); /* dst may be NULL when n is 0 */
        return 0;
    case LOOM_DTYPE_F64:
        for (size_t i = 0; i < n; i++) {
            double d;
            memcpy(&d, p + 8 * i, sizeof d);
            dst[i] = (float)d;
        }
        return 0;
    case LOOM_DTYPE_F16:
        for (size_t i = 0; i < n; i++) {
            uint16_t h;
            memcpy(&h, p + 2 * i, sizeof h);
            dst[i] = loom_f16_to_f32(h);
        }
        return 0;
    case LOOM_DTYPE_BF16:
        for (size_t i = 0; i < n; i++) {
            uint16_t h;
            memcpy(&h, p + 2 * i, sizeof h);
            dst[i] = loom_bf16_to_f32(h);
        }
        return 0;
    default:
        return loom_error_set(LOOM_ERR_INPUT, "tensor '%s': dtype %s does not convert to float32",
                              loom_st_shown(t->name, nb, sizeof nb), loom_st_dtype_name(t->dtype));
    }
}
