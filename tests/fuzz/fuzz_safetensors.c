/*
 * libFuzzer target for the safetensors reader: each input is a whole file.
 * It is opened from memory (an exact-size copy, so the sanitizer sees any
 * read past the end that a page-rounded mapping would hide). When the
 * reader accepts it, every promise safetensors.h makes is checked: names
 * sorted and unique and found by loom_st_find, shape, element count and byte
 * size consistent, every span inside the data area and no two non-empty
 * spans sharing a byte; every tensor's bytes are read and the float ones
 * converted to float32; every metadata pair is read back. When the reader
 * rejects it, the error must be LOOM_ERR_INPUT on one line naming the input.
 * A broken promise aborts, which libFuzzer reports with the input.
 *
 * Not here: the mmap path of loom_st_open (the unit tests cover it).
 *
 * fuzz-sources: src/io/safetensors.c src/io/json_span.c src/base/dtype.c src/base/log.c src/base/mem.c
 * fuzz-libs: -lcjson
 */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "io/safetensors.h"
#include "loom/loom.h"

#define NAME "fuzz-input"

#define REQUIRE(cond)                                                                                        \
    do {                                                                                                     \
        if (!(cond)) {                                                                                       \
            fprintf(stderr, "fuzz_safetensors: broken promise at line %d: %s\n", __LINE__, #cond);           \
            abort();                                                                                         \
        }                                                                                                    \
    } while (0)

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static volatile unsigned sink; /* keeps the reads of tensor bytes and strings */

static int cmp_by_offset(const void *a, const void *b)
{
    const struct loom_st_tensor *x = *(const struct loom_st_tensor *const *)a;
    const struct loom_st_tensor *y = *(const struct loom_st_tensor *const *)b;
    return x->offset < y->offset ? -1 : x->offset > y->offset;
}

/* Every tensor of an accepted file: its fields, its bytes, its conversion. */
static void check_tensors(const struct loom_st *st, const uint8_t *buf, size_t size)
{
    uint64_t hlen = 0;
    for (int i = 7; i >= 0; i--) hlen = hlen << 8 | buf[i];
    const uint8_t *area = buf + 8 + hlen;
    uint64_t area_size = size - 8 - hlen; /* the reader checked hlen <= size - 8 */
    int n = loom_st_count(st);
    const struct loom_st_tensor **by_offset = malloc(((size_t)n + 1) * sizeof *by_offset);
    REQUIRE(by_offset);
    unsigned sum = 0;
    for (int i = 0; i < n; i++) {
        const struct loom_st_tensor *t = loom_st_at(st, i);
        by_offset[i] = t;
        REQUIRE(t->name && strcmp(t->name, "__metadata__") != 0);
        REQUIRE(i == 0 || strcmp(loom_st_at(st, i - 1)->name, t->name) < 0);
        REQUIRE(loom_st_find(st, t->name) == t);
        REQUIRE((unsigned)t->dtype < LOOM_DTYPE_COUNT);
        REQUIRE(t->ndim >= 0 && t->ndim <= LOOM_ST_MAX_DIMS);
        uint64_t numel = 1;
        for (int d = 0; d < LOOM_ST_MAX_DIMS; d++) {
            REQUIRE(d < t->ndim ? t->shape[d] >= 0 : t->shape[d] == 0);
            if (d < t->ndim) numel *= (uint64_t)t->shape[d]; /* the reader bounded it */
        }
        REQUIRE(numel == t->numel);
        REQUIRE(t->nbytes == numel * loom_st_dtype_size(t->dtype));
        REQUIRE(t->offset <= area_size && t->nbytes <= area_size - t->offset);
        REQUIRE((const uint8_t *)t->data == area + t->offset);
        for (size_t k = 0; k < t->nbytes; k++) sum += ((const uint8_t *)t->data)[k];

        int is_float = t->dtype == LOOM_DTYPE_F32 || t->dtype == LOOM_DTYPE_F16 ||
                       t->dtype == LOOM_DTYPE_BF16 || t->dtype == LOOM_DTYPE_F64;
        float *dst = malloc(((size_t)t->numel + 1) * sizeof *dst);
        REQUIRE(dst);
        int rc = loom_st_read_f32(t, dst, (size_t)t->numel);
        REQUIRE(is_float ? rc == LOOM_OK : rc == LOOM_ERR_INPUT);
        REQUIRE(loom_st_read_f32(t, dst, (size_t)t->numel + 1) == LOOM_ERR_INPUT);
        free(dst);
    }
    qsort(by_offset, (size_t)n, sizeof *by_offset, cmp_by_offset);
    uint64_t reach = 0; /* the end of the non-empty spans so far */
    for (int i = 0; i < n; i++) {
        const struct loom_st_tensor *t = by_offset[i];
        if (t->nbytes == 0) continue;
        REQUIRE(t->offset >= reach);
        reach = t->offset + t->nbytes;
    }
    free(by_offset);
    sink += sum;
}

static void check_meta(const struct loom_st *st)
{
    int n = loom_st_meta_count(st);
    const char *prev = NULL;
    for (int i = 0; i < n; i++) {
        const char *k, *v;
        loom_st_meta_at(st, i, &k, &v);
        REQUIRE(k && v);
        REQUIRE(!prev || strcmp(prev, k) < 0);
        REQUIRE(loom_st_meta(st, k) == v);
        sink += (unsigned)strlen(k) + (unsigned)strlen(v);
        prev = k;
    }
    REQUIRE(n > 0 || loom_st_meta(st, "format") == NULL);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    uint8_t *buf = malloc(size ? size : 1);
    REQUIRE(buf);
    memcpy(buf, data, size);
    struct loom_st st;
    int rc = loom_st_open_memory(&st, NAME, buf, size);
    if (rc == LOOM_OK) {
        REQUIRE(st.map == buf && st.map_size == size);
        check_tensors(&st, buf, size);
        check_meta(&st);
        loom_st_close(&st);
    } else {
        const char *msg = loom_error_message();
        REQUIRE(rc == LOOM_ERR_INPUT);
        REQUIRE(strncmp(msg, NAME ": ", strlen(NAME) + 2) == 0 && msg[strlen(NAME) + 2] != '\0');
        REQUIRE(!strchr(msg, '\n'));
        REQUIRE(st.map == NULL && st.ntensors == 0 && st.strings == NULL);
    }
    free(buf);
    return 0;
}
