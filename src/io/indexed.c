/*
 * Megatron's indexed datasets (see indexed.h): open and validate, read a
 * token, write. Little-endian hosts only, as the shards (io/shard.c).
 */
#include "io/indexed.h"

#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "base/log.h"
#include "base/mem.h"

static const char MAGIC[9] = {'M', 'M', 'I', 'D', 'I', 'D', 'X', 0, 0};
enum { HEADER = 9 + 8 + 1 + 8 + 8 };

static int dtype_width(int code)
{
    switch (code) {
    case LOOM_MMIDIDX_UINT8:
    case LOOM_MMIDIDX_INT8:
        return 1;
    case LOOM_MMIDIDX_INT16:
    case LOOM_MMIDIDX_UINT16:
        return 2;
    case LOOM_MMIDIDX_INT32:
        return 4;
    case LOOM_MMIDIDX_INT64:
        return 8;
    default:
        return 0;
    }
}

static int exists(const char *path)
{
    struct stat st;
    return stat(path, &st) == 0;
}

static int ends_with(const char *s, const char *suffix)
{
    size_t n = strlen(s), m = strlen(suffix);
    return n >= m && strcmp(s + n - m, suffix) == 0;
}

int loom_indexed_exists(const char *path, char *prefix, size_t n)
{
    char idx[4200], bin[4200];
    snprintf(prefix, n, "%s", path);
    if (ends_with(path, ".idx") || ends_with(path, ".bin")) {
        snprintf(idx, sizeof idx, "%.*s.idx", (int)(strlen(path) - 4), path);
        snprintf(bin, sizeof bin, "%.*s.bin", (int)(strlen(path) - 4), path);
        if (exists(idx) && exists(bin)) {
            snprintf(prefix, n, "%.*s", (int)(strlen(path) - 4), path);
            return 1;
        }
    }
    snprintf(idx, sizeof idx, "%s.idx", path);
    snprintf(bin, sizeof bin, "%s.bin", path);
    return exists(idx) && exists(bin);
}

/* Maps a whole regular file read-only (*map NULL for an empty one). */
static int map_file(const char *path, void **map, size_t *bytes)
{
    int fd;
    struct stat st;
    int rc = loom_fs_open_input(path, "Megatron dataset", &fd, &st);
    if (rc) return rc;
    *bytes = (size_t)st.st_size;
    *map = NULL;
    if (*bytes) {
        void *m = mmap(NULL, *bytes, PROT_READ, MAP_PRIVATE, fd, 0);
        if (m == MAP_FAILED) {
            const int e = errno;
            close(fd);
            return loom_error_set(LOOM_ERR_RUNTIME, "mmap '%s' (%zu bytes): %s", path, *bytes, strerror(e));
        }
        *map = m;
    }
    close(fd);
    return LOOM_OK;
}

int64_t loom_indexed_length(const struct loom_indexed *d, int64_t s)
{
    int32_t v;
    memcpy(&v, d->lengths + 4 * s, 4);
    return v;
}

int64_t loom_indexed_pointer(const struct loom_indexed *d, int64_t s)
{
    int64_t v;
    memcpy(&v, d->pointers + 8 * s, 8);
    return v;
}

int64_t loom_indexed_doc(const struct loom_indexed *d, int64_t i)
{
    int64_t v;
    memcpy(&v, d->doc_index + 8 * i, 8);
    return v;
}

int64_t loom_indexed_token(const struct loom_indexed *d, int64_t s, int64_t i)
{
    const unsigned char *p = d->bin + loom_indexed_pointer(d, s) + i * d->width;
    switch (d->dtype) {
    case LOOM_MMIDIDX_UINT8:
        return *p;
    case LOOM_MMIDIDX_INT8:
        return (int8_t)*p;
    case LOOM_MMIDIDX_INT16: {
        int16_t v;
        memcpy(&v, p, 2);
        return v;
    }
    case LOOM_MMIDIDX_UINT16: {
        uint16_t v;
        memcpy(&v, p, 2);
        return v;
    }
    case LOOM_MMIDIDX_INT32: {
        int32_t v;
        memcpy(&v, p, 4);
        return v;
    }
    default: {
        int64_t v;
        memcpy(&v, p, 8);
        return v;
    }
    }
}

/* The structure of the index against the .bin: every check named. */
static int validate(struct loom_indexed *d, const char *idx, const char *bin, int vocab)
{
    const unsigned char *m = d->idx_map;
    if (d->idx_bytes < HEADER || memcmp(m, MAGIC, 9) != 0)
        return loom_error_set(LOOM_ERR_INPUT, "%s: not a Megatron index (no MMIDIDX header%s)", idx,
                              d->idx_bytes < HEADER ? ": the file is shorter than one" : "");
    uint64_t version, nseq, ndoc;
    memcpy(&version, m + 9, 8);
    const int code = m[17];
    memcpy(&nseq, m + 18, 8);
    memcpy(&ndoc, m + 26, 8);
    if (version != 1)
        return loom_error_set(LOOM_ERR_INPUT, "%s: index version %llu, expected 1", idx,
                              (unsigned long long)version);
    if (!(d->width = dtype_width(code)))
        return loom_error_set(LOOM_ERR_INPUT,
                              "%s: token dtype code %d is not an integer type this reader knows (1 uint8, 2 "
                              "int8, 3 int16, 4 int32, 5 int64, 8 uint16)",
                              idx, code);
    d->dtype = code;
    /* sizes in uint64 before any product can overflow */
    const uint64_t body = (uint64_t)HEADER + nseq * 12 + ndoc * 8;
    if (nseq > (uint64_t)INT64_MAX / 16 || ndoc > (uint64_t)INT64_MAX / 16 ||
        (d->idx_bytes != body && d->idx_bytes != body + nseq))
        return loom_error_set(LOOM_ERR_INPUT,
                              "%s: %zu bytes, but its header's %llu sequences and %llu document indices "
                              "need %llu (truncated or not an index)",
                              idx, d->idx_bytes, (unsigned long long)nseq, (unsigned long long)ndoc,
                              (unsigned long long)body);
    d->nseq = (int64_t)nseq;
    d->ndoc = (int64_t)ndoc;
    d->lengths = m + HEADER;
    d->pointers = m + HEADER + nseq * 4;
    d->doc_index = m + HEADER + nseq * 12;
    for (int64_t s = 0; s < d->nseq; s++) {
        const int64_t p = loom_indexed_pointer(d, s), len = loom_indexed_length(d, s);
        if (len < 0 || p < 0 || p % d->width || (uint64_t)p > d->bin_bytes ||
            (uint64_t)len * (uint64_t)d->width > d->bin_bytes - (uint64_t)p)
            return loom_error_set(LOOM_ERR_INPUT,
                                  "%s: sequence %lld (%lld tokens at byte %lld) lies outside %s (%zu bytes)",
                                  idx, (long long)s, (long long)len, (long long)p, bin, d->bin_bytes);
        d->longest = len > d->longest ? len : d->longest;
    }
    if (d->ndoc < 1 || loom_indexed_doc(d, 0) != 0 || loom_indexed_doc(d, d->ndoc - 1) != d->nseq)
        return loom_error_set(LOOM_ERR_INPUT,
                              "%s: document indices must run from 0 to the sequence count %lld (found %lld "
                              "entries%s)",
                              idx, (long long)d->nseq, (long long)d->ndoc, d->ndoc ? ", ends wrong" : "");
    for (int64_t i = 1; i < d->ndoc; i++)
        if (loom_indexed_doc(d, i) < loom_indexed_doc(d, i - 1))
            return loom_error_set(LOOM_ERR_INPUT, "%s: document index %lld (%lld) is below the one before",
                                  idx, (long long)i, (long long)loom_indexed_doc(d, i));
    if (vocab > 0)
        for (int64_t s = 0; s < d->nseq; s++)
            for (int64_t i = 0, n = loom_indexed_length(d, s); i < n; i++) {
                const int64_t t = loom_indexed_token(d, s, i);
                if (t < 0 || t >= vocab)
                    return loom_error_set(LOOM_ERR_INPUT,
                                          "%s: token %lld of sequence %lld is %lld, outside the model's "
                                          "vocabulary of %d",
                                          bin, (long long)i, (long long)s, (long long)t, vocab);
            }
    return LOOM_OK;
}

int loom_indexed_open(struct loom_indexed *d, const char *prefix, int vocab)
{
    memset(d, 0, sizeof *d);
    char idx[4200], bin[4200];
    snprintf(idx, sizeof idx, "%s.idx", prefix);
    snprintf(bin, sizeof bin, "%s.bin", prefix);
    int rc;
    if ((rc = map_file(idx, &d->idx_map, &d->idx_bytes)) ||
        (rc = map_file(bin, &d->bin_map, &d->bin_bytes)) ||
        (rc = (d->bin = d->bin_map, validate(d, idx, bin, vocab)))) {
        loom_indexed_close(d);
        return rc;
    }
    const size_t n = strlen(prefix) + 1;
    d->prefix = loom_alloc(n, LOOM_MEM_OTHER);
    memcpy(d->prefix, prefix, n);
    return LOOM_OK;
}

void loom_indexed_close(struct loom_indexed *d)
{
    if (d->idx_map) munmap(d->idx_map, d->idx_bytes);
    if (d->bin_map) munmap(d->bin_map, d->bin_bytes);
    loom_free(d->prefix);
    memset(d, 0, sizeof *d);
}

/* ---- writing ------------------------------------------------------------------- */

int loom_indexed_dtype_for(int64_t vocab)
{
    return vocab < 65500 ? LOOM_MMIDIDX_UINT16 : LOOM_MMIDIDX_INT32; /* Megatron's optimal_dtype */
}

int loom_indexed_writer_open(struct loom_indexed_writer *w, const char *prefix, int dtype)
{
    memset(w, 0, sizeof *w);
    w->bin.fd = -1;
    w->dtype = dtype;
    w->width = dtype_width(dtype);
    LOOM_ASSERT(dtype == LOOM_MMIDIDX_UINT16 || dtype == LOOM_MMIDIDX_INT32);
    char bin[4200];
    snprintf(bin, sizeof bin, "%s.bin", prefix);
    snprintf(w->idx_path, sizeof w->idx_path, "%s.idx", prefix);
    int rc;
    if ((rc = loom_fs_check_output(bin, "output")) || (rc = loom_fs_check_output(w->idx_path, "output")))
        return rc;
    w->doc_index = loom_alloc(sizeof *w->doc_index * 1024, LOOM_MEM_OTHER);
    w->cap_doc = 1024;
    w->doc_index[w->ndoc++] = 0;
    return loom_fs_atomic_open(&w->bin, bin);
}

static void *grow(void *p, int64_t *cap, int64_t need, size_t elem)
{
    if (need <= *cap) return p;
    int64_t c = *cap ? *cap : 1024;
    while (c < need) c *= 2;
    void *q = loom_alloc(loom_mul_size((size_t)c, elem), LOOM_MEM_OTHER);
    if (p) memcpy(q, p, (size_t)*cap * elem);
    loom_free(p);
    *cap = c;
    return q;
}

int loom_indexed_writer_add(struct loom_indexed_writer *w, const int32_t *ids, int64_t n)
{
    if (n > INT32_MAX)
        return loom_error_set(LOOM_ERR_INPUT, "a document of %lld tokens: Megatron's index holds at most %d",
                              (long long)n, INT32_MAX);
    if (n > 0) {
        const size_t bytes = (size_t)n * (size_t)w->width;
        if (bytes > w->buf_cap) {
            loom_free(w->buf);
            w->buf_cap = bytes * 2;
            w->buf = loom_alloc(w->buf_cap, LOOM_MEM_OTHER);
        }
        for (int64_t i = 0; i < n; i++) {
            if (w->dtype == LOOM_MMIDIDX_UINT16)
                ((uint16_t *)w->buf)[i] = (uint16_t)ids[i];
            else
                ((int32_t *)w->buf)[i] = ids[i];
        }
        int rc = loom_fs_atomic_write(&w->bin, w->buf, bytes);
        if (rc) return rc;
        w->lengths = grow(w->lengths, &w->cap_seq, w->nseq + 1, sizeof *w->lengths);
        w->lengths[w->nseq++] = (int32_t)n;
    }
    w->doc_index = grow(w->doc_index, &w->cap_doc, w->ndoc + 1, sizeof *w->doc_index);
    w->doc_index[w->ndoc++] = w->nseq;
    return LOOM_OK;
}

static void writer_free(struct loom_indexed_writer *w)
{
    loom_free(w->lengths);
    loom_free(w->doc_index);
    loom_free(w->buf);
    w->lengths = NULL;
    w->doc_index = NULL;
    w->buf = NULL;
}

int loom_indexed_writer_finish(struct loom_indexed_writer *w)
{
    int64_t *ptr = loom_alloc(loom_mul_size((size_t)(w->nseq ? w->nseq : 1), 8), LOOM_MEM_OTHER);
    int64_t at = 0;
    for (int64_t s = 0; s < w->nseq; s++) {
        ptr[s] = at;
        at += (int64_t)w->lengths[s] * w->width;
    }
    const uint64_t version = 1, nseq = (uint64_t)w->nseq, ndoc = (uint64_t)w->ndoc;
    const unsigned char code = (unsigned char)w->dtype;
    const void *parts[] = {MAGIC, &version, &code, &nseq, &ndoc, w->lengths, ptr, w->doc_index};
    const size_t sizes[] = {9, 8, 1, 8, 8, (size_t)w->nseq * 4, (size_t)w->nseq * 8, (size_t)w->ndoc * 8};
    int rc = loom_fs_atomic_commit(&w->bin);
    if (!rc) rc = loom_fs_write_atomic(w->idx_path, parts, sizes, 8);
    if (rc && w->bin.fd < 0) unlink(w->bin.path); /* the .bin was committed: an index never came */
    loom_free(ptr);
    writer_free(w);
    return rc;
}

void loom_indexed_writer_abort(struct loom_indexed_writer *w)
{
    if (w->bin.fd >= 0) loom_fs_atomic_abort(&w->bin);
    writer_free(w);
}
