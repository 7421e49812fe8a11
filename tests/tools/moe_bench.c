/*
 * moe_bench [--C 1024] [--F 1024] [--E 8] [--k 2] [--N 2048] [--repeats 5]
 * times one MoE MLP layer's forward and backward (decoder_moe.c: the
 * router, the dispatch, the experts' products, the combine, and their
 * backward) on N rows of C channels, E SwiGLU experts of F columns, top k,
 * against a dense SwiGLU MLP of k F columns (the same active products) run
 * as the decoder runs its MLP (the parallel linear layer's gate and up,
 * SwiGLU, down; their backward). Both are Llama layers of one-layer
 * models with random weights; the rows and the output gradients are
 * random. The two alternate, forward + backward each time; the first
 * repeat of each is a warm-up, not counted. OpenMP threads:
 * OMP_NUM_THREADS.
 *
 * Prints, for bench/moe_layer.py to read:
 *   rep <i> moe_ms <f> dense_ms <f>   (one per counted repeat)
 *   moe median_ms <f> fwd_ms <f> bwd_ms <f>
 *   dense median_ms <f> fwd_ms <f> bwd_ms <f>
 *   rows <min> <max>                  (the experts' rows at the last repeat)
 * Deliberately not: a check of the numbers (tests/test_moe.py).
 */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/blas_env.h"
#include "base/clock.h"
#include "base/log.h"
#include "kernels/kernels.h"
#include "layers/linear.h"
#include "median.h"
#include "model/decoder.h"
#include "model/decoder_impl.h"
#include "model/family.h"

static void fill(float *x, size_t n, uint64_t seed)
{
    for (size_t i = 0; i < n; i++) {
        seed = seed * 6364136223846793005ULL + 1442695040888963407ULL;
        x[i] = (float)((double)(seed >> 40) / (double)(1ULL << 24) * 2.0 - 1.0);
    }
}

/* A one-layer Llama of C channels on N rows, with E experts of F (E 0:
 * a dense MLP of F), its weights drawn and one step run (its buffers). */
static struct loom_decoder *model(int C, int F, int E, int k, int N)
{
    char sC[16], sH[16], sF[16], sE[16], sk[16], sN[16];
    snprintf(sC, sizeof sC, "%d", C);
    snprintf(sH, sizeof sH, "%d", C / 64);
    snprintf(sF, sizeof sF, "%d", F);
    snprintf(sE, sizeof sE, "%d", E);
    snprintf(sk, sizeof sk, "%d", k);
    snprintf(sN, sizeof sN, "%d", N);
    char *argv[] = {"--model",
                    "llama-tiny",
                    "--num-layers",
                    "1",
                    "--hidden-size",
                    sC,
                    "--num-attention-heads",
                    sH,
                    "--num-query-groups",
                    sH,
                    "--ffn-hidden-size",
                    sF,
                    "--seq-length",
                    sN,
                    "--max-position-embeddings",
                    sN,
                    "--num-experts",
                    sE,
                    "--moe-router-topk",
                    sk};
    const int argc = E ? 20 : 16;
    struct loom_config cfg;
    int help = 0;
    if (loom_config_parse(&cfg, argc, argv, &help) || loom_llama_family.check(&cfg, N)) {
        fprintf(stderr, "moe_bench: %s\n", loom_error_message());
        exit(2);
    }
    struct loom_model *base = loom_llama_family.create(&cfg, 1, N, 1, 0, 0);
    loom_model_alloc_arenas(base, 1, LOOM_MODEL_PARAM_ARENA | LOOM_MODEL_GRAD_ARENA);
    loom_model_init_weights(base, 7);
    struct loom_decoder *m = loom_decoder_of(base);
    int32_t *tok = malloc(sizeof(int32_t) * (size_t)N);
    for (int i = 0; i < N; i++) tok[i] = (i * 7 + 3) % m->spec.vocab;
    loom_model_zero_grad(base);
    loom_decoder_forward(m, tok, tok, 1);
    loom_decoder_backward(m, 1.0f);
    free(tok);
    return m;
}

static struct loom_linear lin(struct loom_block *b, int w, int in, int out)
{
    return (struct loom_linear){.b = b, .w = w, .bias = -1, .in = in, .out = out};
}

/* The dense SwiGLU MLP of layer 0: forward (y) then backward (dx). */
static void dense(struct loom_decoder *m, const float *x, const float *dy, float *y, float *dx, double *fwd,
                  double *bwd)
{
    const int C = m->spec.hidden, F = m->Fl, N = m->T;
    struct loom_block *b = &m->base.blocks[m->stage.block[0]];
    struct loom_decoder_layer_acts *a = &m->slots[0].layers[0];
    const struct loom_linear_group g = {
        .lin = {lin(b, m->t.gate_w, C, F), lin(b, m->t.up_w, C, F)}, .n = 2, .fused = 0};
    const struct loom_linear down = lin(b, m->t.down_w, F, C);
    float *gate = a->fc, *up = a->up, *h = a->h, *const *dF = m->dbufF;
    const size_t NF = (size_t)N * F;
    double t0 = loom_now();
    float *const outs[2] = {gate, up};
    loom_linear_column_forward(&m->lc, &g, outs, x, NULL, N);
    m->k->swiglu_forward(h, gate, up, NF);
    loom_linear_row_forward(&m->lc, &down, h, NULL, y, N);
    double t1 = loom_now();
    loom_linear_row_backward(&m->lc, &down, dF[0], dy, h, NULL, N);
    m->k->swiglu_backward(dF[1], dF[2], dF[0], gate, up, NF);
    float *const dys[2] = {dF[1], dF[2]};
    loom_linear_column_backward(&m->lc, &g, dys, x, NULL, dx, N);
    *fwd = (t1 - t0) * 1e3, *bwd = (loom_now() - t1) * 1e3;
}

/* The MoE layer 0: forward then backward. */
static void moe(struct loom_decoder *m, const float *x, const float *dy, float *y, float *dx, double *fwd,
                double *bwd)
{
    struct loom_block *b = &m->base.blocks[m->stage.block[0]];
    struct loom_decoder_layer_acts *a = &m->slots[0].layers[0];
    m->moe_loss_weight = 1.0f;
    double t0 = loom_now();
    loom_decoder_moe_forward(m, a, b, x, y, m->T, 0, NULL);
    double t1 = loom_now();
    loom_decoder_moe_backward(m, a, b, x, dy, dx, m->T, 0);
    *fwd = (t1 - t0) * 1e3, *bwd = (loom_now() - t1) * 1e3;
}

int main(int argc, char **argv)
{
    loom_blas_select_core(argc, argv);
    int C = 1024, F = 1024, E = 8, k = 2, N = 2048, repeats = 5;
    for (int i = 1; i + 1 < argc; i += 2) {
        const char *f = argv[i];
        const int v = atoi(argv[i + 1]);
        if (!strcmp(f, "--C"))
            C = v;
        else if (!strcmp(f, "--F"))
            F = v;
        else if (!strcmp(f, "--E"))
            E = v;
        else if (!strcmp(f, "--k"))
            k = v;
        else if (!strcmp(f, "--N"))
            N = v;
        else if (!strcmp(f, "--repeats"))
            repeats = v;
    }
    if (C < 64 || C % 64 || F < 1 || E < 1 || k < 1 || k > E || N < 1 || repeats < 2) {
        fprintf(stderr, "moe_bench: C a multiple of 64, F, E >= k >= 1, N >= 1, repeats >= 2\n");
        return 2;
    }
    struct loom_decoder *me = model(C, F, E, k, N), *md = model(C, k * F, 0, k, N);
    const size_t NC = (size_t)N * C;
    float *x = malloc(sizeof(float) * NC), *dy = malloc(sizeof(float) * NC), *y = malloc(sizeof(float) * NC),
          *dx = malloc(sizeof(float) * NC);
    fill(x, NC, 1);
    fill(dy, NC, 2);
    double *tm = malloc(sizeof(double) * 6 * (size_t)repeats), *td = tm + repeats, *fm = td + repeats,
           *bm = fm + repeats, *fd = bm + repeats, *bd = fd + repeats;
    for (int r = 0; r <= repeats; r++) {
        double f1, b1, f2, b2;
        dense(md, x, dy, y, dx, &f2, &b2);
        moe(me, x, dy, y, dx, &f1, &b1);
        if (!r) continue; /* the warm-up */
        const int i = r - 1;
        fm[i] = f1, bm[i] = b1, tm[i] = f1 + b1, fd[i] = f2, bd[i] = b2, td[i] = f2 + b2;
        printf("rep %d moe_ms %.3f dense_ms %.3f\n", i, tm[i], td[i]);
    }
    int lo = N * k, hi = 0;
    for (int e = 0; e < E; e++) {
        const int n = me->slots[0].layers[0].counts[e];
        lo = n < lo ? n : lo, hi = n > hi ? n : hi;
    }
    printf("moe median_ms %.3f fwd_ms %.3f bwd_ms %.3f\n", median(tm, repeats), median(fm, repeats),
           median(bm, repeats));
    printf("dense median_ms %.3f fwd_ms %.3f bwd_ms %.3f\n", median(td, repeats), median(fd, repeats),
           median(bd, repeats));
    printf("rows %d %d\n", lo, hi);
    return 0;
}
