/*
 * Tests of io/safetensors: a round trip of every dtype with metadata, one
 * handcrafted bad file per check the reader makes (each must be
 * LOOM_ERR_INPUT with a message naming the file and the culprit), reading
 * from memory with every truncation of a valid file rejected, the float32
 * conversions, and the writer's failure paths (missing directory, bad
 * arguments, a write error) leaving nothing behind.
 *
 * Not here: interoperability with other implementations
 * (test_safetensors_torch.py does that), and random inputs
 * (tests/fuzz/fuzz_safetensors.c does that).
 */
#include <dirent.h>
#include <errno.h>
#include <math.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <unistd.h>

#include "check.h"
#include "io/safetensors.h"
#include "loom/loom.h"

static char dir[256];

static void path_in(char *buf, size_t cap, const char *name)
{
    snprintf(buf, cap, "%s/%s", dir, name);
}

static int exists(const char *path)
{
    struct stat sb;
    return stat(path, &sb) == 0;
}

/* Number of directory entries whose name contains ".tmp.". */
static int count_temps(void)
{
    int n = 0;
    DIR *d = opendir(dir);
    if (!d) return -1;
    for (struct dirent *e; (e = readdir(d));)
        if (strstr(e->d_name, ".tmp.")) n++;
    closedir(d);
    return n;
}

/* Writes the size field `hsize`, the header text, and `ndata` data bytes. */
static void write_raw_sized(const char *path, uint64_t hsize, const char *header, size_t ndata)
{
    FILE *f = fopen(path, "wb");
    if (!f) {
        perror(path);
        exit(1);
    }
    unsigned char le[8];
    for (int i = 0; i < 8; i++) le[i] = (unsigned char)(hsize >> (8 * i));
    fwrite(le, 1, 8, f);
    fwrite(header, 1, strlen(header), f);
    for (size_t i = 0; i < ndata; i++) fputc((int)(i & 0xff), f);
    fclose(f);
}

static void write_raw(const char *path, const char *header, size_t ndata)
{
    write_raw_sized(path, strlen(header), header, ndata);
}

/* Opening `path` must fail with LOOM_ERR_INPUT, and the message must name the
 * file and contain `a` and `b` (when given). */
static void expect_bad_at(const char *path, const char *a, const char *b, int line)
{
    struct loom_st st;
    int rc = loom_st_open(&st, path);
    const char *msg = loom_error_message();
    int ok = rc == LOOM_ERR_INPUT && strstr(msg, path) && (!a || strstr(msg, a)) && (!b || strstr(msg, b)) &&
             !strchr(msg, '\n') && st.map == NULL && st.ntensors == 0;
    CHECK(ok);
    if (!ok) fprintf(stderr, "  line %d: rc %d, message: %s\n", line, rc, msg);
}
#define expect_bad(path, a, b) expect_bad_at(path, a, b, __LINE__)

/* One header entry as JSON text: E("w", "F32", "[2]", "[0,8]"). */
#define E(name, dtype, shape, offsets)                                                                       \
    "\"" name "\":{\"dtype\":\"" dtype "\",\"shape\":" shape ",\"data_offsets\":" offsets "}"

/* A handcrafted header and data size; the file is expected to be rejected. */
static void bad_header_at(const char *header, size_t ndata, const char *a, const char *b, int line)
{
    char path[512];
    path_in(path, sizeof path, "bad.safetensors");
    write_raw(path, header, ndata);
    expect_bad_at(path, a, b, line);
    unlink(path);
}
#define bad_header(header, ndata, a, b) bad_header_at(header, ndata, a, b, __LINE__)

/* ---- round trip ----------------------------------------------------------- */

static void test_round_trip(void)
{
    float f32[2][3] = {{1.5f, -2.25f, 3.0f}, {0.0f, 1e-3f, -7.0f}};
    double f64[3] = {1.0 / 3.0, -2.5, 1e300};
    uint16_t f16[4] = {0x3c00, 0xc000, 0x7bff, 0x0001}; /* 1, -2, 65504, 2^-24 */
    uint16_t bf16[3] = {0x3f80, 0xc0a0, 0x0000};        /* 1, -5, 0 */
    int32_t i32[5] = {1, -2, 2147483647, -2147483647 - 1, 0};
    int64_t i64[2] = {INT64_MAX, -5};
    uint8_t u8[7] = {0, 1, 2, 3, 250, 255, 9};
    int8_t i8[3] = {-128, 0, 127};
    uint16_t u16[2] = {65535, 7};
    int16_t i16[2] = {-32768, 32767};
    uint8_t boolv[3] = {1, 0, 1};
    float scalar = 42.0f;
    struct loom_st_tensor_in in[] = {
        {.name = "h.0.attn.c_proj", .dtype = LOOM_DTYPE_F32, .ndim = 2, .shape = {2, 3}, .data = f32},
        {.name = "f64", .dtype = LOOM_DTYPE_F64, .ndim = 1, .shape = {3}, .data = f64},
        {.name = "f16", .dtype = LOOM_DTYPE_F16, .ndim = 2, .shape = {2, 2}, .data = f16},
        {.name = "bf16", .dtype = LOOM_DTYPE_BF16, .ndim = 1, .shape = {3}, .data = bf16},
        {.name = "i32", .dtype = LOOM_DTYPE_I32, .ndim = 1, .shape = {5}, .data = i32},
        {.name = "i64", .dtype = LOOM_DTYPE_I64, .ndim = 1, .shape = {2}, .data = i64},
        {.name = "u8", .dtype = LOOM_DTYPE_U8, .ndim = 1, .shape = {7}, .data = u8},
        {.name = "i8", .dtype = LOOM_DTYPE_I8, .ndim = 1, .shape = {3}, .data = i8},
        {.name = "u16", .dtype = LOOM_DTYPE_U16, .ndim = 1, .shape = {2}, .data = u16},
        {.name = "i16", .dtype = LOOM_DTYPE_I16, .ndim = 1, .shape = {2}, .data = i16},
        {.name = "bool", .dtype = LOOM_DTYPE_BOOL, .ndim = 1, .shape = {3}, .data = boolv},
        {.name = "scalar", .dtype = LOOM_DTYPE_F32, .ndim = 0, .data = &scalar},
        {.name = "empty", .dtype = LOOM_DTYPE_F32, .ndim = 3, .shape = {4, 0, 2}, .data = NULL},
        {.name = "quote\"and\\slash\n", .dtype = LOOM_DTYPE_U8, .ndim = 1, .shape = {1}, .data = u8},
    };
    int n = (int)(sizeof in / sizeof in[0]);
    const char *meta[] = {"format", "pt", "step", "120", "note", "tab\there \"quoted\" \xc3\xa9"};
    char path[512];
    path_in(path, sizeof path, "model.safetensors");

    CHECK(loom_st_write(path, in, n, meta, 3) == LOOM_OK);
    CHECK(count_temps() == 0);

    /* The header is padded with spaces to a multiple of 8. */
    FILE *f = fopen(path, "rb");
    CHECK(f != NULL);
    if (f) {
        unsigned char le[8];
        CHECK(fread(le, 1, 8, f) == 8);
        uint64_t hsize = 0;
        for (int i = 7; i >= 0; i--) hsize = hsize << 8 | le[i];
        CHECK(hsize % 8 == 0);
        char *h = malloc(hsize + 1);
        CHECK(fread(h, 1, hsize, f) == hsize);
        h[hsize] = 0;
        CHECK(h[0] == '{');
        size_t end = strlen(h);
        while (end > 0 && h[end - 1] == ' ') end--;
        CHECK(end > 0 && h[end - 1] == '}' && hsize - end < 8);
        free(h);
        fclose(f);
    }

    struct loom_st st;
    int rc = loom_st_open(&st, path);
    CHECK(rc == LOOM_OK);
    if (rc != LOOM_OK) {
        fprintf(stderr, "  open: %s\n", loom_error_message());
        return;
    }
    CHECK(loom_st_count(&st) == n);
    for (int i = 0; i < n; i++) {
        const struct loom_st_tensor *t = loom_st_find(&st, in[i].name);
        CHECK(t != NULL);
        if (!t) continue;
        CHECK(strcmp(t->name, in[i].name) == 0);
        CHECK(t->dtype == in[i].dtype);
        CHECK(t->ndim == in[i].ndim);
        uint64_t numel = 1;
        for (int d = 0; d < t->ndim; d++) {
            CHECK(t->shape[d] == in[i].shape[d]);
            numel *= (uint64_t)in[i].shape[d];
        }
        CHECK(t->numel == numel);
        CHECK(t->nbytes == numel * loom_st_dtype_size(t->dtype));
        CHECK(t->nbytes == 0 || memcmp(t->data, in[i].data, t->nbytes) == 0);
        /* loom's writer aligns every tensor to its element size */
        CHECK((uintptr_t)t->data % loom_st_dtype_size(t->dtype) == 0);
    }
    for (int i = 1; i < loom_st_count(&st); i++)
        CHECK(strcmp(loom_st_at(&st, i - 1)->name, loom_st_at(&st, i)->name) < 0);
    CHECK(loom_st_find(&st, "missing") == NULL);
    CHECK(loom_st_find(&st, "__metadata__") == NULL);

    CHECK(loom_st_meta_count(&st) == 3);
    CHECK(loom_st_meta(&st, "format") && strcmp(loom_st_meta(&st, "format"), "pt") == 0);
    CHECK(loom_st_meta(&st, "step") && strcmp(loom_st_meta(&st, "step"), "120") == 0);
    CHECK(loom_st_meta(&st, "note") && strcmp(loom_st_meta(&st, "note"), meta[5]) == 0);
    CHECK(loom_st_meta(&st, "absent") == NULL);
    const char *k, *v;
    loom_st_meta_at(&st, 0, &k, &v);
    CHECK(strcmp(k, "format") == 0 && strcmp(v, "pt") == 0);

    /* float32 views */
    float buf[8];
    const struct loom_st_tensor *t = loom_st_find(&st, "h.0.attn.c_proj");
    CHECK(t && loom_st_read_f32(t, buf, 6) == LOOM_OK && memcmp(buf, f32, sizeof f32) == 0);
    t = loom_st_find(&st, "f64");
    CHECK(t && loom_st_read_f32(t, buf, 3) == LOOM_OK);
    CHECK(buf[0] == (float)(1.0 / 3.0) && buf[1] == -2.5f && isinf(buf[2]));
    t = loom_st_find(&st, "f16");
    CHECK(t && loom_st_read_f32(t, buf, 4) == LOOM_OK);
    CHECK(buf[0] == 1.0f && buf[1] == -2.0f && buf[2] == 65504.0f && buf[3] == ldexpf(1.0f, -24));
    t = loom_st_find(&st, "bf16");
    CHECK(t && loom_st_read_f32(t, buf, 3) == LOOM_OK);
    CHECK(buf[0] == 1.0f && buf[1] == -5.0f && buf[2] == 0.0f);
    t = loom_st_find(&st, "scalar");
    CHECK(t && t->ndim == 0 && t->numel == 1 && loom_st_read_f32(t, buf, 1) == LOOM_OK && buf[0] == 42.0f);
    t = loom_st_find(&st, "empty");
    CHECK(t && t->numel == 0 && loom_st_read_f32(t, buf, 0) == LOOM_OK);
    t = loom_st_find(&st, "i32");
    CHECK(t && loom_st_read_f32(t, buf, 5) == LOOM_ERR_INPUT && strstr(loom_error_message(), "I32"));
    t = loom_st_find(&st, "f64");
    CHECK(t && loom_st_read_f32(t, buf, 4) == LOOM_ERR_INPUT && strstr(loom_error_message(), "f64"));
    loom_st_close(&st);
    CHECK(st.map == NULL);
    loom_st_close(&st); /* closing twice is harmless */

    /* Rewriting the same path replaces the file. */
    CHECK(loom_st_write(path, in, 1, NULL, 0) == LOOM_OK);
    CHECK(loom_st_open(&st, path) == LOOM_OK && loom_st_count(&st) == 1 && loom_st_meta_count(&st) == 0);
    loom_st_close(&st);

    /* No tensors at all is a valid file. */
    CHECK(loom_st_write(path, NULL, 0, NULL, 0) == LOOM_OK);
    CHECK(loom_st_open(&st, path) == LOOM_OK && loom_st_count(&st) == 0);
    loom_st_close(&st);
    unlink(path);
}

/* ---- the reader's checks ---------------------------------------------------- */

static void test_bad_files(void)
{
    char path[512];
    path_in(path, sizeof path, "bad.safetensors");

    /* missing file, directory, truncated file */
    expect_bad(path, "open", NULL);
    expect_bad(dir, "regular", NULL);
    FILE *f = fopen(path, "wb");
    fwrite("\x10\0\0\0\0", 1, 5, f);
    fclose(f);
    expect_bad(path, "5 bytes", NULL);
    f = fopen(path, "wb");
    fclose(f);
    expect_bad(path, "0 bytes", NULL);
    unlink(path);

    /* header size: over the limit, past the end of the file */
    write_raw_sized(path, (uint64_t)200 * 1000 * 1000, "{}", 0);
    expect_bad(path, "header size 200000000", "limit");
    write_raw_sized(path, 1000, "{}", 8);
    expect_bad(path, "header size 1000", "after the size field");
    write_raw_sized(path, UINT64_MAX, "{}", 8);
    expect_bad(path, "header size", NULL);
    unlink(path);

    /* JSON */
    bad_header("{\"a\": {", 0, "not valid JSON", NULL);
    bad_header("", 0, "not valid JSON", NULL);
    bad_header("[1, 2]", 0, "not a JSON object", NULL);
    bad_header("\"str\"", 0, "not a JSON object", NULL);
    bad_header("{} x", 0, "after its JSON", NULL);
    /* a control byte where a value starts: cJSON would skip it as space, the
     * scan of the members would not (they must agree, or the header is bad) */
    bad_header("{\"__metadata__\":{\"k\": \x02\"v\"e\"}, \"a\": {}}", 0, "not valid JSON", NULL);
    bad_header("{\"__metadata__\":{\"k\": 12abc}}", 0, "not valid JSON", NULL);
    write_raw_sized(path, 4, "{}", 0); /* a 4-byte header: "{}", a NUL, a space */
    f = fopen(path, "ab");
    fwrite("\0 ", 1, 2, f);
    fclose(f);
    expect_bad(path, "NUL", NULL);
    unlink(path);

    /* the header's bytes: strict UTF-8, no raw control byte or \u0000 in a string */
    bad_header("{\"w\xff\":{}}", 0, "not UTF-8", "0xff");
    bad_header("{\"w\xc0\xaf\":{}}", 0, "not UTF-8", NULL);         /* overlong '/' */
    bad_header("{\"w\xed\xa0\x80\":{}}", 0, "not UTF-8", NULL);     /* a surrogate */
    bad_header("{\"w\xf4\x90\x80\x80\":{}}", 0, "not UTF-8", NULL); /* past U+10FFFF */
    bad_header("{\"w\":{}}\xc3", 0, "not UTF-8", NULL);             /* cut at the end */
    bad_header("{" E("a\tb", "U8", "[1]", "[0,1]") "}", 1, "control byte 0x09", NULL);
    bad_header("{" E("a\\u0000b", "U8", "[1]", "[0,1]") "}", 1, "u0000", NULL);
    bad_header("{\"__metadata__\":{\"k\":\"v\\u0000w\"}}", 0, "u0000", NULL);

    /* dtype */
    bad_header("{" E("w", "F33", "[1]", "[0,4]") "}", 4, "'w'", "F33");
    bad_header("{" E("w", "f32", "[1]", "[0,4]") "}", 4, "'w'", "f32");
    bad_header("{\"w\":{\"dtype\":7,\"shape\":[1],\"data_offsets\":[0,4]}}", 4, "'w'", "dtype");
    bad_header("{\"w\":{\"shape\":[1],\"data_offsets\":[0,4]}}", 4, "'w'", "missing \"dtype\"");
    bad_header("{\"w\":{\"dtype\":\"F32\",\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,4]}}", 4, "'w'",
               "twice");
    bad_header("{\"w\":[1]}", 4, "'w'", "not a JSON object");

    /* shape */
    bad_header("{" E("w", "F32", "[-1]", "[0,4]") "}", 4, "'w'", "shape[0]");
    bad_header("{" E("w", "F32", "[1,2.5]", "[0,4]") "}", 4, "'w'", "shape[1]");
    bad_header("{" E("w", "F32", "[\"1\"]", "[0,4]") "}", 4, "'w'", "shape[0]");
    bad_header("{" E("w", "F32", "[1e300]", "[0,4]") "}", 4, "'w'", "shape[0]");
    bad_header("{\"w\":{\"dtype\":\"F32\",\"shape\":1,\"data_offsets\":[0,4]}}", 4, "'w'", "shape");
    bad_header("{" E("w", "F32", "[1,1,1,1,1,1,1,1,1]", "[0,4]") "}", 4, "'w'", "dimensions");
    bad_header("{" E("w", "F32", "[4294967296,4294967296,4294967296]", "[0,4]") "}", 4, "'w'", "overflow");
    bad_header("{" E("w", "F64", "[4294967296,1073741824]", "[0,4]") "}", 4, "'w'", "overflow");
    /* an empty tensor whose other dimensions would overflow a stride */
    bad_header("{" E("w", "F32", "[0,4294967296,4294967296]", "[0,0]") "}", 0, "'w'", "overflow");
    bad_header("{" E("w", "F64", "[0,2147483648,2147483648]", "[0,0]") "}", 0, "'w'", "overflow");
    /* 2^53 and above do not survive a double: 2^53 + 1 would read as 2^53 */
    bad_header("{" E("w", "F32", "[0,9007199254740992]", "[0,0]") "}", 0, "'w'", "shape[1]");

    /* data_offsets */
    bad_header("{" E("w", "F32", "[2]", "[0,4]") "}", 8, "'w'", "data_offsets");
    bad_header("{" E("w", "F32", "[1]", "[4,0]") "}", 8, "'w'", "begin after end");
    bad_header("{" E("w", "F32", "[1]", "[0]") "}", 8, "'w'", "data_offsets");
    bad_header("{" E("w", "F32", "[1]", "[0,4,8]") "}", 8, "'w'", "data_offsets");
    bad_header("{" E("w", "F32", "[1]", "[-4,0]") "}", 8, "'w'", "data_offsets");
    bad_header("{" E("w", "F32", "[1]", "[0.5,4.5]") "}", 8, "'w'", "data_offsets");
    bad_header("{\"w\":{\"dtype\":\"F32\",\"shape\":[1]}}", 8, "'w'", "missing \"data_offsets\"");
    bad_header("{" E("w", "F32", "[1]", "[\"0\",4]") "}", 8, "'w'", "data_offsets");
    bad_header("{" E("w", "F32", "[1]", "{\"0\":0,\"1\":4}") "}", 8, "'w'", "data_offsets");
    bad_header("{" E("w", "U8", "[0]", "[9007199254740993,9007199254740993]") "}", 8, "'w'", "data_offsets");

    /* spans outside the data area */
    bad_header("{" E("w", "F32", "[4]", "[0,16]") "}", 8, "'w'", "run past");
    bad_header("{" E("w", "U8", "[1]", "[8,9]") "}", 8, "'w'", "run past");
    bad_header("{" E("w", "U8", "[4]", "[18446744073709551612,18446744073709551616]") "}", 8, "'w'",
               "data_offsets");

    /* overlapping spans, including one inside another */
    bad_header("{" E("a", "F32", "[2]", "[0,8]") "," E("b", "F32", "[2]", "[4,12]") "}", 12, "'a'", "'b'");
#define INSIDE E("in1", "U8", "[2]", "[2,4]") "," E("in2", "U8", "[2]", "[10,12]")
    const char *inside = "{" E("big", "U8", "[16]", "[0,16]") "," INSIDE "}";
#undef INSIDE
    bad_header(inside, 16, "'big'", "overlap");
    bad_header("{" E("a", "F32", "[2]", "[0,8]") "," E("b", "I32", "[2]", "[0,8]") "}", 8, "overlap", NULL);

    /* duplicate names (cJSON keeps both) */
    bad_header("{" E("w", "F32", "[1]", "[0,4]") "," E("w", "F32", "[1]", "[4,8]") "}", 8, "'w'", "twice");

    /* metadata */
    bad_header("{\"__metadata__\":{\"k\":1}}", 0, "'k'", "not a string");
    bad_header("{\"__metadata__\":{\"k\":null}}", 0, "'k'", "not a string");
    bad_header("{\"__metadata__\":{\"ok\":\"x\",\"nested\":{\"a\":\"b\"}}}", 0, "'nested'", "not a string");
    bad_header("{\"__metadata__\":[\"a\"]}", 0, "__metadata__", "not a JSON object");
    bad_header("{\"__metadata__\":{\"k\":\"a\",\"k\":\"b\"}}", 0, "'k'", "twice");
    bad_header("{\"__metadata__\":{},\"__metadata__\":{}}", 0, "__metadata__", "twice");

    /* control characters in a name stay out of the one-line message */
    bad_header("{" E("bad\\nname", "X", "[]", "[0,0]") "}", 0, "bad?name", NULL);

    /* accepted: spaces padding, gaps, zero-size tensors, unknown fields */
    write_raw(path,
              "{\"a\":{\"dtype\":\"U8\",\"shape\":[2],\"data_offsets\":[4,6],\"extra\":1}," E(
                  "z", "F32", "[0,3]", "[5,5]") "," E("s", "U8", "[]", "[6,7]") "}       ",
              8);
    struct loom_st st;
    CHECK(loom_st_open(&st, path) == LOOM_OK);
    const struct loom_st_tensor *t = loom_st_find(&st, "a");
    CHECK(t && t->nbytes == 2 && ((const uint8_t *)t->data)[0] == 4 && ((const uint8_t *)t->data)[1] == 5);
    t = loom_st_find(&st, "s");
    CHECK(t && t->ndim == 0 && t->numel == 1 && ((const uint8_t *)t->data)[0] == 6);
    loom_st_close(&st);

    /* accepted: UTF-8 names, an escaped backslash before "u0000", a large
     * dimension beside a zero one */
    write_raw(path,
              "{" E("caf\xc3\xa9 \xf0\x9f\x98\x80", "U8", "[1]", "[0,1]") "," E(
                  "a\\\\u0000", "U8", "[1]", "[1,2]") "," E("e", "F64", "[0,1099511627776]", "[2,2]") "}",
              2);
    CHECK(loom_st_open(&st, path) == LOOM_OK);
    CHECK(loom_st_find(&st, "caf\xc3\xa9 \xf0\x9f\x98\x80") && loom_st_find(&st, "a\\u0000"));
    t = loom_st_find(&st, "e");
    CHECK(t && t->numel == 0 && t->shape[1] == 1099511627776);
    loom_st_close(&st);
    unlink(path);
}

/* ---- reading from memory ------------------------------------------------------ */

static void test_open_memory(void)
{
    uint8_t u8[3] = {7, 8, 9};
    uint16_t bf16[2] = {0x3f80, 0xc0a0};
    struct loom_st_tensor_in in[] = {
        {.name = "b", .dtype = LOOM_DTYPE_BF16, .ndim = 1, .shape = {2}, .data = bf16},
        {.name = "u", .dtype = LOOM_DTYPE_U8, .ndim = 2, .shape = {1, 3}, .data = u8},
    };
    const char *meta[] = {"format", "pt"};
    char path[512];
    path_in(path, sizeof path, "mem.safetensors");
    CHECK(loom_st_write(path, in, 2, meta, 1) == LOOM_OK);
    FILE *f = fopen(path, "rb");
    CHECK(f != NULL);
    if (!f) return;
    unsigned char file[1024];
    size_t size = fread(file, 1, sizeof file, f);
    fclose(f);
    unlink(path);
    CHECK(size > 8 && size < sizeof file);

    /* the content read back from an exact-size copy, which stays the caller's */
    unsigned char *buf = malloc(size);
    memcpy(buf, file, size);
    struct loom_st st;
    CHECK(loom_st_open_memory(&st, "mem", buf, size) == LOOM_OK);
    const struct loom_st_tensor *t = loom_st_find(&st, "u");
    CHECK(t && t->nbytes == 3 && memcmp(t->data, u8, 3) == 0 && t->shape[1] == 3);
    float got[2];
    t = loom_st_find(&st, "b");
    CHECK(t && loom_st_read_f32(t, got, 2) == LOOM_OK && got[0] == 1.0f && got[1] == -5.0f);
    CHECK(loom_st_meta(&st, "format") && strcmp(loom_st_meta(&st, "format"), "pt") == 0);
    loom_st_close(&st);
    CHECK(buf[0] == file[0]);
    free(buf);

    /* every truncation is rejected with a message naming the buffer */
    int bad = 0;
    for (size_t n = 0; n < size; n++) {
        buf = malloc(n ? n : 1);
        memcpy(buf, file, n);
        int rc = loom_st_open_memory(&st, "cut", buf, n);
        if ((rc != LOOM_ERR_INPUT || !strstr(loom_error_message(), "cut") || st.map) && bad++ < 3)
            fprintf(stderr, "  %zu of %zu bytes: rc %d, %s\n", n, size, rc, loom_error_message());
        free(buf);
    }
    CHECK(bad == 0);

    /* zero elements convert with no buffer at all */
    struct loom_st_tensor empty = {.name = "e", .dtype = LOOM_DTYPE_F32, .ndim = 1};
    CHECK(loom_st_read_f32(&empty, NULL, 0) == LOOM_OK);
}

/* ---- f16 conversion, all 65536 values ----------------------------------------- */

static void test_f16_exhaustive(void)
{
    static uint16_t h[65536];
    static float got[65536];
    for (int i = 0; i < 65536; i++) h[i] = (uint16_t)i;
    struct loom_st_tensor t = {.name = "all",
                               .dtype = LOOM_DTYPE_F16,
                               .ndim = 1,
                               .shape = {65536},
                               .numel = 65536,
                               .data = h,
                               .nbytes = sizeof h};
    CHECK(loom_st_read_f32(&t, got, 65536) == LOOM_OK);
    int bad = 0;
    for (int i = 0; i < 65536; i++) {
        int sign = i >> 15, exp = (i >> 10) & 31, mant = i & 1023;
        double want;
        if (exp == 31)
            want = mant ? NAN : INFINITY;
        else if (exp == 0)
            want = ldexp(mant, -24);
        else
            want = ldexp(1024 + mant, exp - 25);
        if (sign) want = -want;
        int ok = isnan(want) ? isnan(got[i]) : (double)got[i] == want && !!signbit(got[i]) == sign;
        if (!ok && bad++ < 5) fprintf(stderr, "  f16 0x%04x: got %.9g want %.9g\n", i, got[i], want);
    }
    CHECK(bad == 0);
}

/* ---- the writer's failures ----------------------------------------------------- */

static void test_write_failures(void)
{
    float x[4] = {1, 2, 3, 4};
    char path[512];
    struct loom_st_tensor_in in[2] = {
        {.name = "x", .dtype = LOOM_DTYPE_F32, .ndim = 1, .shape = {4}, .data = x},
        {.name = "x", .dtype = LOOM_DTYPE_F16, .ndim = 1, .shape = {2}, .data = x},
    };

    /* a directory that does not exist */
    path_in(path, sizeof path, "no/such/dir/m.safetensors");
    CHECK(loom_st_write(path, in, 1, NULL, 0) == LOOM_ERR_RUNTIME);
    CHECK(strstr(loom_error_message(), "open") && strstr(loom_error_message(), path) &&
          strstr(loom_error_message(), strerror(ENOENT)));

    /* bad arguments: nothing is created */
    path_in(path, sizeof path, "args.safetensors");
    CHECK(loom_st_write(path, in, 2, NULL, 0) == LOOM_ERR_INPUT && strstr(loom_error_message(), "'x'"));
    struct loom_st_tensor_in odd = {
        .name = "__metadata__", .dtype = LOOM_DTYPE_F32, .ndim = 1, .shape = {4}, .data = x};
    CHECK(loom_st_write(path, &odd, 1, NULL, 0) == LOOM_ERR_INPUT);
    odd = (struct loom_st_tensor_in){
        .name = "y", .dtype = LOOM_DTYPE_COUNT, .ndim = 1, .shape = {4}, .data = x};
    CHECK(loom_st_write(path, &odd, 1, NULL, 0) == LOOM_ERR_INPUT && strstr(loom_error_message(), "'y'"));
    odd =
        (struct loom_st_tensor_in){.name = "y", .dtype = LOOM_DTYPE_F32, .ndim = 1, .shape = {-4}, .data = x};
    CHECK(loom_st_write(path, &odd, 1, NULL, 0) == LOOM_ERR_INPUT);
    odd = (struct loom_st_tensor_in){.name = "y", .dtype = LOOM_DTYPE_F32, .ndim = 9, .data = x};
    CHECK(loom_st_write(path, &odd, 1, NULL, 0) == LOOM_ERR_INPUT);
    odd = (struct loom_st_tensor_in){
        .name = "y", .dtype = LOOM_DTYPE_F32, .ndim = 1, .shape = {4}, .data = NULL};
    CHECK(loom_st_write(path, &odd, 1, NULL, 0) == LOOM_ERR_INPUT);
    odd = (struct loom_st_tensor_in){.name = "bad\xff", .dtype = LOOM_DTYPE_F32, .data = x};
    CHECK(loom_st_write(path, &odd, 1, NULL, 0) == LOOM_ERR_INPUT && strstr(loom_error_message(), "UTF-8"));
    const char *bad_meta[] = {"k", "\xed\xa0\x80"}; /* an encoded surrogate */
    CHECK(loom_st_write(path, in, 1, bad_meta, 1) == LOOM_ERR_INPUT && strstr(loom_error_message(), "UTF-8"));
    const char *dup_meta[] = {"k", "1", "k", "2"};
    CHECK(loom_st_write(path, in, 1, dup_meta, 2) == LOOM_ERR_INPUT && strstr(loom_error_message(), "'k'"));
    CHECK(!exists(path) && count_temps() == 0);

    /* A write error (the file size limit stands in for a full disk): the
     * previous file survives, no temporary is left. */
    path_in(path, sizeof path, "full.safetensors");
    CHECK(loom_st_write(path, in, 1, NULL, 0) == LOOM_OK);
    static float big[64 * 1024];
    struct loom_st_tensor_in large = {
        .name = "big", .dtype = LOOM_DTYPE_F32, .ndim = 1, .shape = {64 * 1024}, .data = big};
    struct rlimit old, lim;
    CHECK(getrlimit(RLIMIT_FSIZE, &old) == 0);
    lim = old;
    lim.rlim_cur = 4096;
    void (*prev)(int) = signal(SIGXFSZ, SIG_IGN);
    CHECK(setrlimit(RLIMIT_FSIZE, &lim) == 0);
    int rc = loom_st_write(path, &large, 1, NULL, 0);
    CHECK(setrlimit(RLIMIT_FSIZE, &old) == 0);
    signal(SIGXFSZ, prev);
    CHECK(rc == LOOM_ERR_RUNTIME);
    CHECK(strstr(loom_error_message(), "write") && strstr(loom_error_message(), ".tmp.") &&
          strstr(loom_error_message(), strerror(EFBIG)));
    CHECK(count_temps() == 0);
    struct loom_st st;
    CHECK(loom_st_open(&st, path) == LOOM_OK && loom_st_find(&st, "x") && !loom_st_find(&st, "big"));
    loom_st_close(&st);
    unlink(path);
}

static void test_dtype_table(void)
{
    for (int i = 0; i < LOOM_DTYPE_COUNT; i++) {
        enum loom_dtype d;
        CHECK(loom_st_dtype_name((enum loom_dtype)i) != NULL);
        CHECK(loom_st_dtype_parse(loom_st_dtype_name((enum loom_dtype)i), &d) == 0 && (int)d == i);
        CHECK(loom_st_dtype_size((enum loom_dtype)i) > 0);
    }
    CHECK(loom_st_dtype_name(LOOM_DTYPE_COUNT) == NULL);
    CHECK(loom_st_dtype_size(LOOM_DTYPE_BF16) == 2 && loom_st_dtype_size(LOOM_DTYPE_I64) == 8);
}

int main(void)
{
    const char *tmp = getenv("TMPDIR");
    snprintf(dir, sizeof dir, "%s/loom_st_XXXXXX", tmp && *tmp ? tmp : "/tmp");
    if (!mkdtemp(dir)) {
        perror("mkdtemp");
        return 1;
    }
    test_dtype_table();
    test_round_trip();
    test_bad_files();
    test_open_memory();
    test_f16_exhaustive();
    test_write_failures();
    CHECK(count_temps() == 0);
    CHECK(rmdir(dir) == 0); /* every test removed its files */
    if (exists(dir)) fprintf(stderr, "  left files in %s\n", dir);
    return check_summary("test_safetensors");
}
