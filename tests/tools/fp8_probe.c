/*
 * fp8_probe DIR: quantises the float32 patterns written by
 * tests/test_fp8_torch.py with every scale it lists, in both fp8 formats,
 * and computes the delayed scale of every amax history it lists, writing
 * the results back for the bit-for-bit comparison with PyTorch. On the way
 * it holds the fast encoder against the reference (src/base/fp8.h), and the
 * bf16 arrays (from float32 and from bf16) against the decoded codes, and
 * exits 1 on any difference.
 *
 * Files in DIR, raw little-endian:
 *   in:  f32.bin (uint32 float32 patterns), scales.bin (float32),
 *        histories.bin (float32 rows: scale, margin, algo, format, len,
 *        then HIST entries)
 *   out: code_<fmt>_<k>.bin (uint8, one per pattern, scale k),
 *        bf16_<fmt>_<k>.bin (uint16), scale_update.bin (float32, one per row).
 */
#include <errno.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/fp8.h"

#define HIST 8

static const char *dir;
static int failures;

static void *load(const char *name, size_t *bytes)
{
    char path[4096];
    snprintf(path, sizeof path, "%s/%s", dir, name);
    FILE *f = fopen(path, "rb");
    if (!f) {
        fprintf(stderr, "fp8_probe: open %s: %s\n", path, strerror(errno));
        exit(2);
    }
    fseek(f, 0, SEEK_END);
    *bytes = (size_t)ftell(f);
    fseek(f, 0, SEEK_SET);
    void *p = malloc(*bytes + 1);
    if (!p || fread(p, 1, *bytes, f) != *bytes) {
        fprintf(stderr, "fp8_probe: read %s\n", path);
        exit(2);
    }
    fclose(f);
    return p;
}

static void save(const char *name, const void *p, size_t bytes)
{
    char path[4096];
    snprintf(path, sizeof path, "%s/%s", dir, name);
    FILE *f = fopen(path, "wb");
    if (!f || fwrite(p, 1, bytes, f) != bytes || fclose(f) != 0) {
        fprintf(stderr, "fp8_probe: write %s: %s\n", path, strerror(errno));
        exit(2);
    }
}

static void differ(const char *what, enum loom_fp8_format f, float x, unsigned got, unsigned want)
{
    if (failures++ < 10)
        fprintf(stderr, "fp8_probe: %s %s of %a: 0x%x, reference 0x%x\n", what, loom_fp8_format_name(f), x,
                got, want);
}

int main(int argc, char **argv)
{
    if (argc != 2) {
        fprintf(stderr, "usage: fp8_probe DIR\n");
        return 2;
    }
    dir = argv[1];
    size_t nb, sb, hb;
    const uint32_t *pat = load("f32.bin", &nb);
    const float *scales = load("scales.bin", &sb);
    const float *hist = load("histories.bin", &hb);
    const size_t n = nb / 4, ns = sb / 4, nh = hb / (4 * (5 + HIST));
    float *x = malloc(n * sizeof *x), *xs = malloc(n * sizeof *xs);
    uint16_t *x16 = malloc(n * sizeof *x16), *q16 = malloc(n * sizeof *q16), *r16 = malloc(n * sizeof *r16);
    uint8_t *code = malloc(n);
    memcpy(x, pat, n * sizeof *x);
    for (size_t i = 0; i < n; i++) x16[i] = (uint16_t)(pat[i] >> 16); /* bf16 inputs: the top halves */
    for (int f = 0; f < LOOM_FP8_FORMAT_COUNT; f++)
        for (size_t k = 0; k < ns; k++) {
            char name[64];
            loom_fp8_quantize_bf16(q16, x, n, scales[k], (enum loom_fp8_format)f);
            for (size_t i = 0; i < n; i++) {
                xs[i] = x[i] * scales[k];
                code[i] = loom_fp8_encode(xs[i], (enum loom_fp8_format)f);
                const uint8_t ref = loom_fp8_encode_ref(xs[i], (enum loom_fp8_format)f);
                if (code[i] != ref) differ("encode", (enum loom_fp8_format)f, xs[i], code[i], ref);
                const float v = loom_fp8_decode(code[i], (enum loom_fp8_format)f);
                uint32_t vb;
                memcpy(&vb, &v, sizeof vb);
                const uint16_t want = isnan(v) ? (uint16_t)0x7fc0 : (uint16_t)(vb >> 16);
                if (q16[i] != want) differ("quantize_bf16", (enum loom_fp8_format)f, xs[i], q16[i], want);
            }
            /* from bf16 storage: the same as quantising the bf16 values as float32 */
            float *xr = malloc(n * sizeof *xr);
            for (size_t i = 0; i < n; i++) {
                const uint32_t b = (uint32_t)x16[i] << 16;
                memcpy(&xr[i], &b, sizeof b);
            }
            loom_fp8_quantize_bf16_from16(r16, x16, n, scales[k], (enum loom_fp8_format)f);
            uint16_t *w16 = malloc(n * sizeof *w16);
            loom_fp8_quantize_bf16(w16, xr, n, scales[k], (enum loom_fp8_format)f);
            for (size_t i = 0; i < n; i++)
                if (r16[i] != w16[i])
                    differ("quantize_bf16_from16", (enum loom_fp8_format)f, xr[i], r16[i], w16[i]);
            free(w16);
            free(xr);
            snprintf(name, sizeof name, "code_%s_%zu.bin", loom_fp8_format_name((enum loom_fp8_format)f), k);
            save(name, code, n);
            snprintf(name, sizeof name, "bf16_%s_%zu.bin", loom_fp8_format_name((enum loom_fp8_format)f), k);
            save(name, q16, n * sizeof *q16);
        }
    /* amax against a plain loop */
    float am = 0;
    int nan = 0;
    for (size_t i = 0; i < n; i++) {
        nan |= isnan(x[i]);
        if (fabsf(x[i]) > am) am = fabsf(x[i]);
    }
    const float got = loom_fp8_amax(x, n);
    if (nan ? !isnan(got) : got != am) differ("amax", LOOM_FP8_E4M3, am, 0, 0);
    float *out = malloc((nh + 1) * sizeof *out);
    for (size_t r = 0; r < nh; r++) {
        const float *row = hist + r * (5 + HIST);
        out[r] = loom_fp8_scale_update(row + 5, (int)row[4], (enum loom_fp8_amax_algo)(int)row[2], row[0],
                                       (int)row[1], (enum loom_fp8_format)(int)row[3]);
    }
    save("scale_update.bin", out, nh * sizeof *out);
    printf("fp8_probe: %zu patterns x %zu scales x 2 formats, %zu histories, %d differences from the "
           "reference\n",
           n, ns, nh, failures);
    return failures ? 1 : 0;
}
