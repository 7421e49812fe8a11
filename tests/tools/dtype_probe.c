/*
 * dtype_probe [--exhaustive] DIR: converts the bit patterns written by
 * tests/test_dtype_torch.py and writes the results back, for the bit-for-bit
 * comparison with PyTorch; on the way it holds the fast conversions against
 * the references (src/base/dtype.h) and exits 1 on any difference.
 *
 * Files in DIR, raw little-endian, the element count taken from the size:
 *   in:  f32.bin (uint32 float32 patterns), bf16.bin, f16.bin (uint16)
 *   out: f32_to_bf16.bin, f32_to_f16.bin (uint16, one per f32.bin entry),
 *        bf16_to_f32.bin, f16_to_f32.bin (uint32), and the round trips
 *        f32_bf16_f32.bin, f32_f16_f32.bin (uint32, one per f32.bin entry).
 *
 * Checked here, fast against reference, bit for bit: the scalar functions,
 * the array functions over the whole input (parallel) and in pieces of 1 to
 * 67 elements (the vector loops' remainders), the in-place round trip, and
 * f32 -> bf16/fp16 over every 61st float32 pattern (every pattern with
 * --exhaustive: 2^32, some seconds per core). Deliberately not: comparing
 * with anything but the references (the Python side does that).
 */
#include <errno.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/dtype.h"

static const char *dir;
static int failures;

static void die(const char *what, const char *path)
{
    fprintf(stderr, "dtype_probe: %s %s: %s\n", what, path, errno ? strerror(errno) : "");
    exit(2);
}

static void path_of(char *buf, size_t cap, const char *name)
{
    int len = snprintf(buf, cap, "%s/%s", dir, name);
    if (len < 0 || (size_t)len >= cap) {
        fprintf(stderr, "dtype_probe: path too long: %s/%s\n", dir, name);
        exit(2);
    }
}

static void *xmalloc(size_t bytes)
{
    void *p = malloc(bytes ? bytes : 1);
    if (!p) {
        fprintf(stderr, "dtype_probe: out of memory (%zu bytes)\n", bytes);
        exit(2);
    }
    return p;
}

/* The whole file, which must hold a whole number of elements of `size`. */
static void *read_all(const char *name, size_t size, size_t *n)
{
    char path[4096];
    path_of(path, sizeof path, name);
    errno = 0;
    FILE *f = fopen(path, "rb");
    if (!f) die("cannot open", path);
    if (fseek(f, 0, SEEK_END) != 0) die("cannot seek", path);
    long bytes = ftell(f);
    if (bytes < 0 || fseek(f, 0, SEEK_SET) != 0) die("cannot seek", path);
    if ((size_t)bytes % size != 0) {
        fprintf(stderr, "dtype_probe: %s: %ld bytes, not a multiple of %zu\n", path, bytes, size);
        exit(2);
    }
    void *buf = xmalloc((size_t)bytes);
    if (fread(buf, 1, (size_t)bytes, f) != (size_t)bytes) die("cannot read", path);
    fclose(f);
    *n = (size_t)bytes / size;
    return buf;
}

static void write_all(const char *name, const void *data, size_t size, size_t n)
{
    char path[4096];
    path_of(path, sizeof path, name);
    errno = 0;
    FILE *f = fopen(path, "wb");
    if (!f) die("cannot create", path);
    if (fwrite(data, size, n, f) != n) die("cannot write", path);
    if (fclose(f) != 0) die("cannot close", path);
}

static uint32_t bits_of(float x)
{
    uint32_t u;
    memcpy(&u, &x, sizeof u);
    return u;
}

static float float_of(uint32_t u)
{
    float x;
    memcpy(&x, &u, sizeof x);
    return x;
}

/* Counts a difference between two results for one input; prints the first
 * few of each check. */
static void report(const char *what, size_t *bad, uint32_t input, uint32_t got, uint32_t want)
{
    if (++*bad <= 5) fprintf(stderr, "  %s: input 0x%08x: got 0x%08x want 0x%08x\n", what, input, got, want);
}

static void summary(const char *what, size_t bad, size_t n)
{
    if (bad) {
        failures++;
        fprintf(stderr, "FAIL %s: %zu of %zu differ\n", what, bad, n);
    } else {
        printf("ok   %-44s %zu patterns\n", what, n);
    }
}

/* One float32 -> 16-bit conversion: reference, scalar, array (whole and in
 * pieces) agree on every input; returns the array's results. */
static uint16_t *check_down(const char *what, const uint32_t *in, size_t n, uint16_t (*ref)(float),
                            uint16_t (*fast)(float), void (*array)(uint16_t *, const float *, size_t))
{
    const float *x = (const float *)(const void *)in;
    uint16_t *whole = xmalloc(n * sizeof *whole), *pieces = xmalloc(n * sizeof *pieces);
    array(whole, x, n);
    for (size_t i = 0, len = 1; i < n; i += len, len = len % 67 + 1)
        array(pieces + i, x + i, i + len <= n ? len : n - i);
    size_t bad = 0;
    for (size_t i = 0; i < n; i++) {
        uint16_t want = ref(x[i]);
        if (fast(x[i]) != want) report("scalar", &bad, in[i], fast(x[i]), want);
        if (whole[i] != want) report("array", &bad, in[i], whole[i], want);
        if (pieces[i] != want) report("array in pieces", &bad, in[i], pieces[i], want);
    }
    summary(what, bad, n);
    free(pieces);
    return whole;
}

/* One 16-bit -> float32 conversion, likewise; returns the array's results
 * as bit patterns. */
static uint32_t *check_up(const char *what, const uint16_t *in, size_t n, float (*ref)(uint16_t),
                          float (*fast)(uint16_t), void (*array)(float *, const uint16_t *, size_t))
{
    float *whole = xmalloc(n * sizeof *whole), *pieces = xmalloc(n * sizeof *pieces);
    array(whole, in, n);
    for (size_t i = 0, len = 1; i < n; i += len, len = len % 67 + 1)
        array(pieces + i, in + i, i + len <= n ? len : n - i);
    size_t bad = 0;
    for (size_t i = 0; i < n; i++) {
        uint32_t want = bits_of(ref(in[i]));
        if (bits_of(fast(in[i])) != want) report("scalar", &bad, in[i], bits_of(fast(in[i])), want);
        if (bits_of(whole[i]) != want) report("array", &bad, in[i], bits_of(whole[i]), want);
        if (bits_of(pieces[i]) != want) report("array in pieces", &bad, in[i], bits_of(pieces[i]), want);
    }
    summary(what, bad, n);
    free(pieces);
    return (uint32_t *)(void *)whole;
}

/* The in-place round trip equals down then up through the references. */
static uint32_t *check_round_trip(const char *what, const uint32_t *in, size_t n, enum loom_dtype dt)
{
    float *x = xmalloc(n * sizeof *x);
    memcpy(x, in, n * sizeof *x);
    loom_dtype_round_trip(x, n, dt);
    size_t bad = 0;
    for (size_t i = 0; i < n; i++) {
        float v = float_of(in[i]);
        float want = dt == LOOM_DTYPE_BF16 ? loom_bf16_to_f32_ref(loom_f32_to_bf16_ref(v))
                                           : loom_f16_to_f32_ref(loom_f32_to_f16_ref(v));
        if (bits_of(x[i]) != bits_of(want)) report("round trip", &bad, in[i], bits_of(x[i]), bits_of(want));
    }
    summary(what, bad, n);
    return (uint32_t *)(void *)x;
}

/* Every stride-th float32 pattern through the arrays against the references. */
static void sweep(uint64_t stride)
{
    enum { BLOCK = 1 << 20 };
    uint32_t *in = xmalloc(BLOCK * sizeof *in);
    uint16_t *bf = xmalloc(BLOCK * sizeof *bf), *hf = xmalloc(BLOCK * sizeof *hf);
    size_t bad_bf = 0, bad_hf = 0, n = 0;
    for (uint64_t start = 0; start < (1ull << 32); start += (uint64_t)BLOCK * stride) {
        size_t m = 0;
        for (uint64_t p = start; p < (1ull << 32) && m < BLOCK; p += stride) in[m++] = (uint32_t)p;
        const float *x = (const float *)(const void *)in;
        loom_f32_to_bf16_array(bf, x, m);
        loom_f32_to_f16_array(hf, x, m);
        for (size_t i = 0; i < m; i++) {
            uint16_t want_bf = loom_f32_to_bf16_ref(x[i]), want_hf = loom_f32_to_f16_ref(x[i]);
            if (bf[i] != want_bf) report("f32->bf16 sweep", &bad_bf, in[i], bf[i], want_bf);
            if (hf[i] != want_hf) report("f32->fp16 sweep", &bad_hf, in[i], hf[i], want_hf);
        }
        n += m;
    }
    char what[64];
    snprintf(what, sizeof what, "f32->bf16 fast vs ref, f32 patterns k*%llu", (unsigned long long)stride);
    summary(what, bad_bf, n);
    snprintf(what, sizeof what, "f32->fp16 fast vs ref, f32 patterns k*%llu", (unsigned long long)stride);
    summary(what, bad_hf, n);
    free(in);
    free(bf);
    free(hf);
}

int main(int argc, char **argv)
{
    int exhaustive = argc == 3 && strcmp(argv[1], "--exhaustive") == 0;
    if (argc != 2 + exhaustive) {
        fprintf(stderr, "usage: dtype_probe [--exhaustive] DIR\n");
        return 2;
    }
    dir = argv[1 + exhaustive];
    size_t n32, nbf, nhf;
    uint32_t *f32 = read_all("f32.bin", 4, &n32);
    uint16_t *bf16 = read_all("bf16.bin", 2, &nbf);
    uint16_t *f16 = read_all("f16.bin", 2, &nhf);

    uint16_t *to_bf = check_down("f32->bf16 fast vs ref", f32, n32, loom_f32_to_bf16_ref, loom_f32_to_bf16,
                                 loom_f32_to_bf16_array);
    uint16_t *to_hf = check_down("f32->fp16 fast vs ref", f32, n32, loom_f32_to_f16_ref, loom_f32_to_f16,
                                 loom_f32_to_f16_array);
    uint32_t *from_bf = check_up("bf16->f32 fast vs ref", bf16, nbf, loom_bf16_to_f32_ref, loom_bf16_to_f32,
                                 loom_bf16_to_f32_array);
    uint32_t *from_hf = check_up("fp16->f32 fast vs ref", f16, nhf, loom_f16_to_f32_ref, loom_f16_to_f32,
                                 loom_f16_to_f32_array);
    uint32_t *rt_bf = check_round_trip("f32->bf16->f32 in place vs ref", f32, n32, LOOM_DTYPE_BF16);
    uint32_t *rt_hf = check_round_trip("f32->fp16->f32 in place vs ref", f32, n32, LOOM_DTYPE_F16);
    sweep(exhaustive ? 1 : 61);

    write_all("f32_to_bf16.bin", to_bf, 2, n32);
    write_all("f32_to_f16.bin", to_hf, 2, n32);
    write_all("bf16_to_f32.bin", from_bf, 4, nbf);
    write_all("f16_to_f32.bin", from_hf, 4, nhf);
    write_all("f32_bf16_f32.bin", rt_bf, 4, n32);
    write_all("f32_f16_f32.bin", rt_hf, 4, n32);
    void *owned[] = {f32, bf16, f16, to_bf, to_hf, from_bf, from_hf, rt_bf, rt_hf};
    for (size_t i = 0; i < sizeof owned / sizeof owned[0]; i++) free(owned[i]);
    return failures ? 1 : 0;
}
