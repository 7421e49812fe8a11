/*
 * st_tool: loom's safetensors reader and writer on the command line, for
 * test_safetensors_torch.py to check them against an independent reader and
 * writer.
 *
 *   st_tool write OUT   writes a fixed set of tensors (every dtype, a scalar,
 *                       an empty tensor) and metadata; the values are the
 *                       formulas below, which the Python test repeats
 *   st_tool dump IN     prints "meta KEY VALUE" per metadata pair, then
 *                       "tensor NAME DTYPE [D0,D1,..] NBYTES FNV SUM" per
 *                       tensor in name order: FNV is the 64-bit FNV-1a hash
 *                       of the raw bytes in hex, SUM the float64 sum in index
 *                       order of the float32 conversion (F32, F16, BF16, F64)
 *                       printed with %.17g, or "-" for other dtypes
 *
 * Exit status: 0, or the loom status of the failure with its message on
 * stderr. Not a general converter.
 */
#include <inttypes.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/mem.h"
#include "io/safetensors.h"
#include "loom/loom.h"

static int write_fixed(const char *out)
{
    float f32[3 * 5];
    for (int i = 0; i < 15; i++) f32[i] = (float)(i - 7) * 0.25f;
    double f64[4];
    for (int i = 0; i < 4; i++) f64[i] = (double)i / 3.0;
    /* 1, -2, 65504, 2^-24, -0, 0.333251953125 */
    uint16_t f16[6] = {0x3c00, 0xc000, 0x7bff, 0x0001, 0x8000, 0x3555};
    /* 1, -3.5, 0.15625, +inf */
    uint16_t bf16[4] = {0x3f80, 0xc060, 0x3e20, 0x7f80};
    int32_t i32[4] = {-1, INT32_MAX, INT32_MIN, 12345};
    int64_t i64[3] = {INT64_MIN, -1, (int64_t)1 << 40};
    uint8_t u8[5];
    for (int i = 0; i < 5; i++) u8[i] = (uint8_t)(i * 60);
    int8_t i8[4] = {-128, -1, 0, 127};
    uint16_t u16[3] = {0, 1000, 65535};
    int16_t i16[3] = {-32768, 5, 32767};
    uint8_t boolv[4] = {1, 0, 0, 1};
    uint32_t u32[2] = {0, UINT32_MAX};
    uint64_t u64[1] = {UINT64_MAX};
    float scalar = 3.5f;
    const struct loom_st_tensor_in t[] = {
        {.name = "f32.weight", .dtype = LOOM_DTYPE_F32, .ndim = 2, .shape = {3, 5}, .data = f32},
        {.name = "f64", .dtype = LOOM_DTYPE_F64, .ndim = 1, .shape = {4}, .data = f64},
        {.name = "f16", .dtype = LOOM_DTYPE_F16, .ndim = 2, .shape = {2, 3}, .data = f16},
        {.name = "bf16", .dtype = LOOM_DTYPE_BF16, .ndim = 1, .shape = {4}, .data = bf16},
        {.name = "i32", .dtype = LOOM_DTYPE_I32, .ndim = 2, .shape = {2, 2}, .data = i32},
        {.name = "i64", .dtype = LOOM_DTYPE_I64, .ndim = 1, .shape = {3}, .data = i64},
        {.name = "u8", .dtype = LOOM_DTYPE_U8, .ndim = 1, .shape = {5}, .data = u8},
        {.name = "i8", .dtype = LOOM_DTYPE_I8, .ndim = 1, .shape = {4}, .data = i8},
        {.name = "u16", .dtype = LOOM_DTYPE_U16, .ndim = 1, .shape = {3}, .data = u16},
        {.name = "i16", .dtype = LOOM_DTYPE_I16, .ndim = 1, .shape = {3}, .data = i16},
        {.name = "bool", .dtype = LOOM_DTYPE_BOOL, .ndim = 2, .shape = {2, 2}, .data = boolv},
        {.name = "u32", .dtype = LOOM_DTYPE_U32, .ndim = 1, .shape = {2}, .data = u32},
        {.name = "u64", .dtype = LOOM_DTYPE_U64, .ndim = 1, .shape = {1}, .data = u64},
        {.name = "scalar", .dtype = LOOM_DTYPE_F32, .ndim = 0, .data = &scalar},
        {.name = "empty", .dtype = LOOM_DTYPE_F32, .ndim = 2, .shape = {0, 4}, .data = NULL},
    };
    const char *meta[] = {"format", "pt", "producer", "loom st_tool", "unicode", "\xc3\xa9 \xe2\x9c\x93"};
    return loom_st_write(out, t, (int)(sizeof t / sizeof t[0]), meta, 3);
}

static uint64_t fnv1a64(const unsigned char *p, size_t n)
{
    uint64_t h = 0xcbf29ce484222325ull;
    for (size_t i = 0; i < n; i++) {
        h ^= p[i];
        h *= 0x100000001b3ull;
    }
    return h;
}

static int dump(const char *in)
{
    struct loom_st st;
    int rc = loom_st_open(&st, in);
    if (rc != LOOM_OK) return rc;
    for (int i = 0; i < loom_st_meta_count(&st); i++) {
        const char *k, *v;
        loom_st_meta_at(&st, i, &k, &v);
        printf("meta %s %s\n", k, v);
    }
    for (int i = 0; i < loom_st_count(&st); i++) {
        const struct loom_st_tensor *t = loom_st_at(&st, i);
        printf("tensor %s %s [", t->name, loom_st_dtype_name(t->dtype));
        for (int d = 0; d < t->ndim; d++) printf(d ? ",%" PRId64 : "%" PRId64, t->shape[d]);
        printf("] %zu %016" PRIx64 " ", t->nbytes, fnv1a64(t->data, t->nbytes));
        if (t->dtype == LOOM_DTYPE_F32 || t->dtype == LOOM_DTYPE_F16 || t->dtype == LOOM_DTYPE_BF16 ||
            t->dtype == LOOM_DTYPE_F64) {
            float *buf = loom_alloc(loom_mul_size((size_t)t->numel + 1, sizeof *buf), LOOM_MEM_OTHER);
            rc = loom_st_read_f32(t, buf, (size_t)t->numel);
            double sum = 0;
            for (uint64_t j = 0; j < t->numel; j++) sum += buf[j];
            loom_free(buf);
            if (rc != LOOM_OK) break;
            printf("%.17g\n", sum);
        } else {
            printf("-\n");
        }
    }
    loom_st_close(&st);
    return rc;
}

int main(int argc, char **argv)
{
    if (argc != 3 || (strcmp(argv[1], "write") != 0 && strcmp(argv[1], "dump") != 0)) {
        fprintf(stderr, "usage: st_tool write OUT | st_tool dump IN\n");
        return LOOM_ERR_INPUT;
    }
    int rc = strcmp(argv[1], "write") == 0 ? write_fixed(argv[2]) : dump(argv[2]);
    if (rc != LOOM_OK) fprintf(stderr, "st_tool: error: %s\n", loom_error_message());
    return rc;
}
