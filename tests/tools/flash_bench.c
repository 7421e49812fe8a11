/*
 * flash_bench [--B 1] [--T 4096] [--NH 12] [--hs 64] [--repeats 5]
 *             [--dtype f32|bf16] [--dense 0|1]
 * times one forward and one backward of the fused causal attention kernels
 * (loom_flash_attention_forward/backward, or their bf16 forms on the units
 * the CPU has) on the decoder's packed qkv (B,T,3C), and with --dense 1 the
 * dense kernels that store (B,NH,T,T) (loom_attention_forward/backward)
 * alternating with them. The first repeat is a warm-up, not counted.
 * OpenMP threads: OMP_NUM_THREADS.
 *
 * Prints, for bench/attention.py to read:
 *   rep <i> fused_ms <f> [dense_ms <f>]   (one per counted repeat; forward
 *                                          + backward)
 *   fused median_ms <f> fwd_ms <f> bwd_ms <f> units <name>
 *   dense median_ms <f>                   (with --dense 1)
 *   peak_gflops <f>                       (loom's calibration: a 1024^3
 *                                          product of the dtype, all threads)
 * Deliberately not: a check of the numbers (tests/test_flash_attention.c).
 */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "app/mfu.h"
#include "base/blas_env.h"
#include "base/clock.h"
#include "base/log.h"
#include "kernels/kernels.h"
#include "median.h"

int main(int argc, char **argv)
{
    loom_blas_select_core(argc, argv);
    int B = 1, T = 4096, NH = 12, hs = 64, repeats = 5, dense = 0, bf16 = 0;
    for (int i = 1; i + 1 < argc; i += 2) {
        const char *f = argv[i], *v = argv[i + 1];
        if (!strcmp(f, "--B"))
            B = atoi(v);
        else if (!strcmp(f, "--T"))
            T = atoi(v);
        else if (!strcmp(f, "--NH"))
            NH = atoi(v);
        else if (!strcmp(f, "--hs"))
            hs = atoi(v);
        else if (!strcmp(f, "--repeats"))
            repeats = atoi(v);
        else if (!strcmp(f, "--dense"))
            dense = atoi(v);
        else if (!strcmp(f, "--dtype"))
            bf16 = !strcmp(v, "bf16");
        else {
            fprintf(stderr, "flash_bench: unknown flag %s\n", f);
            return 2;
        }
    }
    if (B < 1 || T < 1 || NH < 1 || hs < 1 || repeats < 1) {
        fprintf(stderr, "flash_bench: sizes and repeats must be >= 1\n");
        return 2;
    }
    const int C = NH * hs;
    const size_t nqkv = (size_t)B * T * 3 * C, nout = (size_t)B * T * C;
    float *qkv = malloc(nqkv * sizeof(float)), *dqkv = malloc(nqkv * sizeof(float));
    float *out = malloc(nout * sizeof(float)), *dout = malloc(nout * sizeof(float));
    float *lse = malloc((size_t)B * NH * T * sizeof(float));
    if (!qkv || !dqkv || !out || !dout || !lse) loom_die("flash_bench: out of memory");
    uint64_t s = 88172645463325252ull;
    for (size_t i = 0; i < nqkv; i++) { /* xorshift, uniform in [-1, 1) */
        s ^= s << 13, s ^= s >> 7, s ^= s << 17;
        qkv[i] = (float)((double)(s >> 11) / 4503599627370496.0 - 1.0);
        if (bf16) qkv[i] = loom_bf16_to_f32(loom_f32_to_bf16(qkv[i]));
    }
    for (size_t i = 0; i < nout; i++) dout[i] = qkv[i * 3 % nqkv];
    float *att = NULL, *datt = NULL;
    if (dense) {
        att = malloc((size_t)B * NH * T * T * sizeof(float));
        datt = malloc((size_t)B * NH * T * T * sizeof(float));
        if (!att || !datt) loom_die("flash_bench: out of memory for the dense (T,T) buffers");
    }
    if (bf16 && loom_bf16_units_select("auto") != LOOM_OK) loom_die("flash_bench: %s", loom_error_message());
    void (*fwd)(float *, float *, const float *, const float *, const float *,
                const struct loom_flash_attn *) =
        bf16 ? loom_flash_attention_forward_bf16 : loom_flash_attention_forward;
    void (*bwd)(float *, float *, float *, const float *, const float *, const float *, const float *,
                const float *, const float *, const struct loom_flash_attn *) =
        bf16 ? loom_flash_attention_backward_bf16 : loom_flash_attention_backward;
    const struct loom_flash_attn a = {
        .B = B, .T = T, .NH = NH, .G = NH, .hs = hs, .ld_q = 3 * C, .ld_k = 3 * C, .ld_v = 3 * C};
    double *tf = malloc((size_t)repeats * sizeof(double)), *tfw = malloc((size_t)repeats * sizeof(double));
    double *tbw = malloc((size_t)repeats * sizeof(double)), *td = malloc((size_t)repeats * sizeof(double));
    for (int r = 0; r <= repeats; r++) {
        double t0 = loom_now();
        fwd(out, lse, qkv, qkv + C, qkv + 2 * C, &a);
        double t1 = loom_now();
        bwd(dqkv, dqkv + C, dqkv + 2 * C, dout, out, lse, qkv, qkv + C, qkv + 2 * C, &a);
        double t2 = loom_now();
        double dms = 0.0;
        if (dense) {
            const double t3 = loom_now();
            loom_attention_forward(out, att, qkv, B, T, C, NH);
            loom_attention_backward(dqkv, datt, dout, att, qkv, B, T, C, NH);
            dms = (loom_now() - t3) * 1e3;
        }
        if (r == 0) continue;
        tf[r - 1] = (t2 - t0) * 1e3, tfw[r - 1] = (t1 - t0) * 1e3, tbw[r - 1] = (t2 - t1) * 1e3;
        td[r - 1] = dms;
        if (dense)
            printf("rep %d fused_ms %.3f dense_ms %.3f\n", r, tf[r - 1], dms);
        else
            printf("rep %d fused_ms %.3f\n", r, tf[r - 1]);
    }
    printf("fused median_ms %.3f fwd_ms %.3f bwd_ms %.3f units %s\n", median(tf, repeats),
           median(tfw, repeats), median(tbw, repeats),
           bf16 ? loom_bf16_units_name(loom_bf16_units()) : "f32");
    if (dense) printf("dense median_ms %.3f\n", median(td, repeats));
    printf("peak_gflops %.1f\n", loom_calibrate_peak_flops(bf16 ? LOOM_DTYPE_BF16 : LOOM_DTYPE_F32) / 1e9);
    free(qkv), free(dqkv), free(out), free(dout), free(lse), free(att), free(datt);
    free(tf), free(tfw), free(tbw), free(td);
    return 0;
}
