/*
 * flash_probe DIR [bf16]: runs the CPU backend's fused attention
 * (flash_attention_forward, then _backward) on inputs written by
 * tests/test_attention_torch.py and writes the results back, for the
 * comparison with PyTorch. With bf16, the table for bf16 compute (the bf16
 * forms on the units the CPU has), whose units it prints.
 *
 * File convention, all in DIR:
 *   dims.txt   one line: B T NH G hs window docs (ints; docs 1: doc.bin
 *              holds each token's document start);
 *   q.bin (B,T,NH,hs), k.bin and v.bin (B,T,G,hs), dout.bin (B,T,NH,hs):
 *              raw little-endian float32, row-major; doc.bin (B,T) int32;
 *   written: out.bin (B,T,NH,hs), lse.bin (B,NH,T), dq.bin, dk.bin, dv.bin.
 * Outputs start as NaN, so an element the kernels fail to write shows up.
 * Deliberately not: a general tensor format, or timing (flash_bench).
 */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/log.h"
#include "kernels/backend.h"
#include "kernels/kernels.h"

static const char *dir;

static void *read_file(const char *name, size_t bytes)
{
    char path[4096];
    snprintf(path, sizeof path, "%s/%s", dir, name);
    FILE *f = fopen(path, "rb");
    if (!f) loom_die("flash_probe: cannot open %s", path);
    void *p = malloc(bytes ? bytes : 1);
    if (!p || fread(p, 1, bytes, f) != bytes || fgetc(f) != EOF)
        loom_die("flash_probe: %s: not %zu bytes", path, bytes);
    fclose(f);
    return p;
}

static void write_file(const char *name, const void *p, size_t bytes)
{
    char path[4096];
    snprintf(path, sizeof path, "%s/%s", dir, name);
    FILE *f = fopen(path, "wb");
    if (!f || fwrite(p, 1, bytes, f) != bytes || fclose(f) != 0)
        loom_die("flash_probe: cannot write %s", path);
}

static float *nans(size_t n)
{
    float *x = malloc(n * sizeof(float));
    if (!x) loom_die("flash_probe: out of memory");
    for (size_t i = 0; i < n; i++) x[i] = NAN;
    return x;
}

int main(int argc, char **argv)
{
    if (argc < 2 || argc > 3 || (argc == 3 && strcmp(argv[2], "bf16") != 0)) {
        fprintf(stderr, "usage: flash_probe DIR [bf16]\n");
        return 2;
    }
    dir = argv[1];
    const struct loom_kernels *K = loom_backend_cpu()->k;
    if (argc == 3) {
        if (loom_bf16_units_select(getenv("LOOM_BF16_UNITS")) != LOOM_OK)
            loom_die("flash_probe: %s", loom_error_message());
        K = loom_backend_kernels(loom_backend_cpu(), LOOM_DTYPE_BF16);
        printf("units %s\n", loom_bf16_units_name(loom_bf16_units()));
    }
    char path[4096];
    snprintf(path, sizeof path, "%s/dims.txt", dir);
    FILE *f = fopen(path, "r");
    int B, T, NH, G, hs, window, docs;
    if (!f || fscanf(f, "%d %d %d %d %d %d %d", &B, &T, &NH, &G, &hs, &window, &docs) != 7)
        loom_die("flash_probe: %s: expected B T NH G hs window docs", path);
    fclose(f);
    if (B < 1 || T < 1 || NH < 1 || G < 1 || hs < 1 || NH % G || window < 0)
        loom_die("flash_probe: bad sizes B=%d T=%d NH=%d G=%d hs=%d window=%d", B, T, NH, G, hs, window);
    const size_t N = (size_t)B * T, nq = N * NH * hs, nk = N * G * hs;
    float *q = read_file("q.bin", nq * sizeof(float)), *k = read_file("k.bin", nk * sizeof(float));
    float *v = read_file("v.bin", nk * sizeof(float)), *dout = read_file("dout.bin", nq * sizeof(float));
    int32_t *doc = docs ? read_file("doc.bin", N * sizeof(int32_t)) : NULL;
    const struct loom_flash_attn a = {.B = B,
                                      .T = T,
                                      .NH = NH,
                                      .G = G,
                                      .hs = hs,
                                      .ld_q = NH * hs,
                                      .ld_k = G * hs,
                                      .ld_v = G * hs,
                                      .window = window,
                                      .doc_start = doc};
    float *out = nans(nq), *lse = nans((size_t)B * NH * T), *dq = nans(nq), *dk = nans(nk), *dv = nans(nk);
    K->flash_attention_forward(out, lse, q, k, v, &a);
    K->flash_attention_backward(dq, dk, dv, dout, out, lse, q, k, v, &a);
    write_file("out.bin", out, nq * sizeof(float));
    write_file("lse.bin", lse, (size_t)B * NH * T * sizeof(float));
    write_file("dq.bin", dq, nq * sizeof(float));
    write_file("dk.bin", dk, nk * sizeof(float));
    write_file("dv.bin", dv, nk * sizeof(float));
    free(q), free(k), free(v), free(dout), free(doc), free(out), free(lse), free(dq), free(dk), free(dv);
    return 0;
}
