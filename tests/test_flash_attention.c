/*
 * Unit test of the fused attention kernels (kernels.h, "fused causal
 * attention"), through every registered backend's float32 table, the
 * reference table, and, in a process of its own per units path (they are
 * chosen once per process), the bf16 table:
 *   - forward (out, lse) and backward (dq, dk, dv) against the `_ref`
 *     loops: T from 1 to 700, sizes off the 64-token tiles, B > 1, head
 *     sizes 8 to 80 (not only multiples of 16), grouped-query attention
 *     (NH 8 with G 2 and G 1), windows, packed documents with boundaries
 *     off the tile edges, documents and a window together, q, k, v as
 *     separate tensors and as one packed qkv (B,T,3C); block-sparse layouts
 *     of blocks 16 (four a tile), 32 and 128 (two tiles a block), per head
 *     and shared, on a slice of the heads (h0 > 0), with documents and
 *     windows on top;
 *   - the reference with a layout against block-sparse attention's own
 *     reference (which keeps (T,T));
 *   - multi-head causal attention against the dense kernels
 *     (attention_forward/backward of the same table, which store (T,T)) up
 *     to T = 2100, and the CPU table's at T = 4096 (one head);
 *   - the backward of the reference against central finite differences.
 * Tolerances: float32, 1e-5 of each tensor's scale (the sums have at most
 * a few thousand terms, which err by about u sqrt(K) ~ 4e-6 at worst);
 * bf16, BF16_TOL (below). Deliberately not: timing (bench/attention.py),
 * PyTorch (tests/test_attention_torch.py).
 */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/log.h"
#include "check.h"
#include "kernels/backend.h"
#include "kernels/dropout_mask.h"
#include "kernels/kernels.h"
#include "kernels/sparse_layout.h"

#define F32_TOL 1e-5
/* bf16 operands carry 8 bits: each product's inputs are rounded by up to
 * 2^-9 relative, so scores, probabilities and the sums built on them move
 * by a few 2^-9 of their scale, not by float32's 2^-24; 2e-2 of the scale
 * is a few such roundings through a softmax and a product. A wrong term
 * (a mask off by a key, a missing head) errs by 0.1 or more. */
#define BF16_TOL 2e-2

/* ---- one case ------------------------------------------------------------------ */

struct fcase {
    int B, T, NH, G, hs, window;
    int docs;   /* documents per row (their boundaries drawn at random), 0: one */
    int packed; /* q, k, v in one (B,T,(NH+2G) hs) tensor */
    /* a block-sparse layout for NHall heads, these the heads [h0, h0 + NH); NULL: none */
    const struct loom_sparse_config *sparse;
    int NHall, h0;
    double drop; /* attention dropout's p (0: none), rows from sequence 3 of 2 NH heads */
};

/* The inputs of a case: q, k, v pointers into one buffer, dout, doc_start. */
struct finputs {
    struct loom_flash_attn a;
    float *x, *dx; /* the q | k | v buffer (packed or three tensors back to back), and its gradient */
    const float *q, *k, *v;
    float *dout;
    int32_t *doc;
    struct loom_sparse_layout layout;
    struct loom_dropout drop;
    size_t nx, nout, nlse;
};

static void inputs_make(struct finputs *in, const struct fcase *c)
{
    const int B = c->B, T = c->T, NH = c->NH, G = c->G, hs = c->hs;
    struct loom_flash_attn *a = &in->a;
    memset(in, 0, sizeof *in);
    a->B = B, a->T = T, a->NH = NH, a->G = G, a->hs = hs, a->window = c->window;
    const size_t N = (size_t)B * T;
    in->nx = N * (size_t)(NH + 2 * G) * hs;
    in->x = check_rand(in->nx, 2.0f);
    if (c->packed) {
        a->ld_q = a->ld_k = a->ld_v = (NH + 2 * G) * hs;
        in->q = in->x, in->k = in->x + (size_t)NH * hs, in->v = in->k + (size_t)G * hs;
    } else {
        a->ld_q = NH * hs, a->ld_k = a->ld_v = G * hs;
        in->q = in->x, in->k = in->x + N * NH * hs, in->v = in->k + N * G * hs;
    }
    in->nout = N * NH * hs;
    in->nlse = (size_t)B * NH * T;
    in->dout = check_rand(in->nout, 1.0f);
    if (c->docs > 1) {
        in->doc = malloc(N * sizeof(int32_t));
        for (int b = 0; b < B; b++) {
            int start = 0;
            for (int t = 0; t < T; t++) {
                /* about docs documents per row, boundaries anywhere */
                if (t > 0 && (int)(check_rng_next() % (uint64_t)T) < c->docs - 1) start = t;
                in->doc[(size_t)b * T + t] = start;
            }
        }
        a->doc_start = in->doc;
    }
    if (c->sparse) {
        const int rc = loom_sparse_layout_build(c->sparse, c->NHall, T, &in->layout);
        if (rc) fprintf(stderr, "  layout: %s\n", loom_error_message());
        CHECK(rc == LOOM_OK);
        a->layout = &in->layout, a->h0 = c->h0;
    }
    if (c->drop > 0) {
        in->drop = loom_dropout_of(c->drop, 1234, 7, 1, LOOM_DROPOUT_ATTENTION);
        a->drop = &in->drop, a->seq0 = 3, a->NHg = 2 * NH + c->h0;
    }
}

static void inputs_free(struct finputs *in)
{
    free(in->x), free(in->dout), free(in->doc);
    if (in->a.layout) loom_sparse_layout_free(&in->layout);
}

/* dq, dk, dv of the case into one buffer laid out as x */
static void backward_into(const struct loom_kernels *t, float *dx, const struct finputs *in, const float *out,
                          const float *lse)
{
    const float *x = in->x;
    t->flash_attention_backward(dx + (in->q - x), dx + (in->k - x), dx + (in->v - x), in->dout, out, lse,
                                in->q, in->k, in->v, &in->a);
}

static void describe(char *s, size_t n, const char *table, const struct fcase *c)
{
    snprintf(s, n, "%s B=%d T=%d NH=%d G=%d hs=%d W=%d docs=%d %s%s%s h0=%d dropout=%g", table, c->B, c->T,
             c->NH, c->G, c->hs, c->window, c->docs, c->packed ? "packed" : "separate",
             c->sparse ? " layout " : "", c->sparse ? loom_sparse_mode_name(c->sparse->mode) : "", c->h0,
             c->drop);
}

/* The tables under test, against the reference computed once per case. */
static const struct loom_kernels *tables[8];
static const char *table_names[8];
static int ntables;
static double table_tol = F32_TOL;

static void test_case(const struct fcase *c)
{
    struct finputs in;
    inputs_make(&in, c);
    const struct loom_kernels *ref = loom_kernels_ref();
    float *out_r = check_const(in.nout, NAN), *lse_r = check_const(in.nlse, NAN),
          *dx_r = check_const(in.nx, NAN);
    ref->flash_attention_forward(out_r, lse_r, in.q, in.k, in.v, &in.a);
    backward_into(ref, dx_r, &in, out_r, lse_r);
    for (int i = 0; i < ntables; i++) {
        char what[160], name[200];
        describe(what, sizeof what, table_names[i], c);
        float *out = check_const(in.nout, NAN), *lse = check_const(in.nlse, NAN),
              *dx = check_const(in.nx, NAN);
        tables[i]->flash_attention_forward(out, lse, in.q, in.k, in.v, &in.a);
        backward_into(tables[i], dx, &in, out, lse);
        snprintf(name, sizeof name, "out (%s)", what);
        check_scaled(name, out, out_r, in.nout, table_tol);
        snprintf(name, sizeof name, "lse (%s)", what);
        check_scaled(name, lse, lse_r, in.nlse, table_tol);
        /* dq | dk | dv in x's layout; a packed buffer has no gaps, so every
         * element is a gradient */
        snprintf(name, sizeof name, "dq dk dv (%s)", what);
        check_scaled(name, dx, dx_r, in.nx, table_tol);
        free(out), free(lse), free(dx);
    }
    free(out_r), free(lse_r), free(dx_r);
    inputs_free(&in);
}

static void test_cases(void)
{
    static const struct fcase cases[] = {
        {1, 1, 1, 1, 16, 0, 0, 0, NULL, 0, 0, 0},
        {2, 7, 3, 3, 12, 0, 0, 1, NULL, 0, 0, 0},
        {1, 64, 2, 2, 32, 0, 0, 0, NULL, 0, 0, 0},
        {2, 65, 2, 1, 16, 0, 0, 1, NULL, 0, 0, 0},
        {1, 130, 8, 2, 8, 0, 0, 0, NULL, 0, 0, 0},
        {1, 200, 8, 1, 16, 0, 0, 1, NULL, 0, 0, 0},
        {3, 150, 2, 2, 64, 37, 0, 1, NULL, 0, 0, 0},
        {1, 300, 2, 1, 24, 100, 0, 0, NULL, 0, 0, 0},
        {2, 250, 4, 2, 16, 0, 5, 0, NULL, 0, 0, 0},
        {1, 333, 2, 2, 16, 70, 4, 1, NULL, 0, 0, 0},
        {2, 97, 8, 2, 80, 0, 3, 1, NULL, 0, 0, 0},
        {1, 700, 2, 1, 16, 0, 6, 0, NULL, 0, 0, 0},
        {1, 129, 2, 2, 64, 1, 0, 0, NULL, 0, 0, 0},
        {1, 96, 2, 2, 16, 500, 2, 1, NULL, 0, 0, 0},
        /* attention dropout: GQA, windows, documents, tile edges */
        {2, 7, 3, 3, 12, 0, 0, 1, NULL, 0, 0, 0.1},
        {2, 150, 4, 2, 16, 37, 0, 1, NULL, 0, 0, 0.1},
        {1, 250, 2, 1, 64, 0, 5, 0, NULL, 0, 0, 0.5},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) test_case(&cases[i]);
}

/* ---- parts of the sequence (context parallelism) ---------------------------------- */

/* Rows [r0, r0 + n) of each of B sequences of T rows (pitch ld, w floats
 * a row) into a compact (B, n, w). */
static float *rows_of(const float *x, int B, int T, size_t ld, size_t w, int r0, int n)
{
    float *out = malloc((size_t)B * n * w * sizeof(float));
    for (int b = 0; b < B; b++)
        for (int r = 0; r < n; r++)
            memcpy(out + ((size_t)b * n + r) * w, x + ((size_t)b * T + r0 + r) * ld, w * sizeof(float));
    return out;
}

/* The case's queries cut at s into two parts and its keys at u into two
 * blocks. Each (part, block) call of every table against the reference's
 * same call, forward and backward (the backward given the whole
 * sequence's out and lse rows, as context parallelism gives it); and the
 * calls put together: out and lse merged over the blocks by their
 * log-sum-exps, dq summed over the blocks, dk and dv over the parts,
 * against the whole sequence's. */
static void test_parts(const struct fcase *c, int s, int u)
{
    struct finputs in;
    inputs_make(&in, c);
    const struct loom_kernels *ref = loom_kernels_ref();
    const int B = c->B, T = c->T, NH = c->NH, G = c->G, hs = c->hs;
    const size_t wq = (size_t)NH * hs, wk = (size_t)G * hs;
    float *out_w = check_const(in.nout, NAN), *lse_w = check_const(in.nlse, NAN),
          *dx_w = check_const(in.nx, NAN);
    ref->flash_attention_forward(out_w, lse_w, in.q, in.k, in.v, &in.a);
    backward_into(ref, dx_w, &in, out_w, lse_w);
    const float *dq_w = dx_w + (in.q - in.x), *dk_w = dx_w + (in.k - in.x), *dv_w = dx_w + (in.v - in.x);
    const int qcut[3] = {0, s, T}, kcut[3] = {0, u, T};
    for (int ti = -1; ti < ntables; ti++) { /* -1: the reference itself, put together */
        const struct loom_kernels *t = ti < 0 ? ref : tables[ti];
        char what[160], name[240];
        describe(what, sizeof what, ti < 0 ? "ref" : table_names[ti], c);
        float *mo = check_const(in.nout, 0.0f), *ml = check_const(in.nlse, -INFINITY);
        float *dq = check_const((size_t)B * T * wq, 0.0f), *dk = check_const((size_t)B * T * wk, 0.0f),
              *dv = check_const((size_t)B * T * wk, 0.0f);
        for (int pi = 0; pi < 2; pi++)
            for (int ki = 0; ki < 2; ki++) {
                const int q0 = qcut[pi], Tq = qcut[pi + 1] - q0, k0 = kcut[ki], Tk = kcut[ki + 1] - k0;
                if (Tq < 1 || Tk < 1) continue;
                struct loom_flash_attn a = in.a;
                a.q0 = q0, a.Tq = Tq, a.k0 = k0, a.Tk = Tk, a.ld_q = (int)wq, a.ld_k = a.ld_v = (int)wk;
                float *q = rows_of(in.q, B, T, (size_t)in.a.ld_q, wq, q0, Tq);
                float *k = rows_of(in.k, B, T, (size_t)in.a.ld_k, wk, k0, Tk);
                float *v = rows_of(in.v, B, T, (size_t)in.a.ld_v, wk, k0, Tk);
                float *dout = rows_of(in.dout, B, T, wq, wq, q0, Tq),
                      *ow = rows_of(out_w, B, T, wq, wq, q0, Tq);
                const size_t no = (size_t)B * Tq * wq, nl = (size_t)B * NH * Tq, nk = (size_t)B * Tk * wk;
                float *o = check_const(no, NAN), *l = check_const(nl, NAN), *o_r = check_const(no, NAN),
                      *l_r = check_const(nl, NAN);
                t->flash_attention_forward(o, l, q, k, v, &a);
                ref->flash_attention_forward(o_r, l_r, q, k, v, &a);
                snprintf(name, sizeof name, "part q %d+%d k %d+%d out (%s)", q0, Tq, k0, Tk, what);
                check_scaled(name, o, o_r, no, table_tol);
                /* lse: -inf where a row sees no key of the block, on both sides */
                int same_inf = 1;
                for (size_t i = 0; i < nl; i++) {
                    same_inf &= isinf(l[i]) == isinf(l_r[i]);
                    if (isinf(l[i])) l[i] = l_r[i] = 0.0f;
                }
                snprintf(name, sizeof name, "part q %d+%d k %d+%d lse (%s)", q0, Tq, k0, Tk, what);
                CHECK(same_inf);
                check_scaled(name, l, l_r, nl, table_tol);
                t->flash_attention_forward(o, l, q, k, v, &a); /* again: the -inf rows were zeroed */
                /* merged into the whole rows by the table's merge (lse rows of pitch T from q0) */
                for (int b = 0; b < B; b++)
                    t->flash_attention_merge(mo + ((size_t)b * T + q0) * wq, ml + (size_t)b * NH * T + q0,
                                             o + (size_t)b * Tq * wq, l + (size_t)b * NH * Tq, Tq, NH, hs, T);
                /* the backward of the block, given the whole rows' out and lse (pitch T) */
                struct loom_flash_attn ab = a;
                ab.ld_lse = T;
                float *dqp = check_const(no, NAN), *dkp = check_const(nk, NAN), *dvp = check_const(nk, NAN);
                float *dqr = check_const(no, NAN), *dkr = check_const(nk, NAN), *dvr = check_const(nk, NAN);
                float *lw = malloc((size_t)B * NH * T * sizeof(float));
                for (int b = 0; b < B; b++) /* lse rows from q0: the call reads (b, h) rows of pitch T */
                    for (int h = 0; h < NH; h++)
                        memcpy(lw + ((size_t)b * NH + h) * T, lse_w + ((size_t)b * NH + h) * T + q0,
                               (size_t)Tq * sizeof(float));
                t->flash_attention_backward(dqp, dkp, dvp, dout, ow, lw, q, k, v, &ab);
                ref->flash_attention_backward(dqr, dkr, dvr, dout, ow, lw, q, k, v, &ab);
                snprintf(name, sizeof name, "part q %d+%d k %d+%d dq dk dv (%s)", q0, Tq, k0, Tk, what);
                check_scaled(name, dqp, dqr, no, table_tol);
                check_scaled(name, dkp, dkr, nk, table_tol);
                check_scaled(name, dvp, dvr, nk, table_tol);
                for (int b = 0; b < B; b++) {
                    for (size_t i = 0; i < (size_t)Tq * wq; i++)
                        dq[((size_t)b * T + q0) * wq + i] += dqp[(size_t)b * Tq * wq + i];
                    for (size_t i = 0; i < (size_t)Tk * wk; i++) {
                        dk[((size_t)b * T + k0) * wk + i] += dkp[(size_t)b * Tk * wk + i];
                        dv[((size_t)b * T + k0) * wk + i] += dvp[(size_t)b * Tk * wk + i];
                    }
                }
                free(q), free(k), free(v), free(dout), free(ow), free(o), free(l), free(o_r), free(l_r);
                free(dqp), free(dkp), free(dvp), free(dqr), free(dkr), free(dvr), free(lw);
            }
        float *dqw = rows_of(dq_w, B, T, (size_t)in.a.ld_q, wq, 0, T),
              *dkw = rows_of(dk_w, B, T, (size_t)in.a.ld_k, wk, 0, T),
              *dvw = rows_of(dv_w, B, T, (size_t)in.a.ld_v, wk, 0, T);
        snprintf(name, sizeof name, "parts q cut %d k cut %d, merged out lse, summed dq dk dv (%s)", s, u,
                 what);
        check_scaled(name, mo, out_w, in.nout, table_tol);
        check_scaled(name, ml, lse_w, in.nlse, table_tol);
        check_scaled(name, dq, dqw, (size_t)B * T * wq, table_tol);
        check_scaled(name, dk, dkw, (size_t)B * T * wk, table_tol);
        check_scaled(name, dv, dvw, (size_t)B * T * wk, table_tol);
        free(mo), free(ml), free(dq), free(dk), free(dv), free(dqw), free(dkw), free(dvw);
    }
    free(out_w), free(lse_w), free(dx_w);
    inputs_free(&in);
}

static void test_parts_cases(void)
{
    static struct loom_sparse_config fixed;
    loom_sparse_config_default(&fixed, LOOM_SPARSE_FIXED);
    const struct {
        struct fcase c;
        int s, u;
    } cases[] = {
        {{1, 200, 2, 2, 16, 0, 0, 0, NULL, 0, 0, 0}, 100, 100},  /* all_gather's halves */
        {{2, 150, 4, 2, 16, 0, 0, 1, NULL, 0, 0, 0}, 37, 113},   /* GQA, off the tiles */
        {{1, 300, 2, 1, 24, 70, 0, 0, NULL, 0, 0, 0}, 150, 90},  /* a window */
        {{2, 250, 2, 2, 16, 0, 5, 0, NULL, 0, 0, 0}, 130, 64},   /* documents: blocks before a row's start */
        {{1, 256, 4, 4, 16, 0, 3, 1, &fixed, 8, 4, 0}, 96, 160}, /* a block-sparse layout, h0 4 */
        {{1, 65, 2, 2, 8, 0, 0, 0, NULL, 0, 0, 0}, 5, 64},       /* a part of 5 queries, a block of 1 key */
        {{2, 150, 4, 2, 16, 0, 0, 1, NULL, 0, 0, 0.2}, 37, 113}, /* attention dropout, merged over parts */
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++)
        test_parts(&cases[i].c, cases[i].s, cases[i].u);
}

/* ---- block-sparse layouts ------------------------------------------------------ */

static void test_layouts(void)
{
    struct loom_sparse_config fixed, bigbird, window, per_head, dense;
    loom_sparse_config_default(&fixed, LOOM_SPARSE_FIXED); /* block 16: four blocks a tile */
    loom_sparse_config_default(&bigbird, LOOM_SPARSE_BIGBIRD);
    bigbird.block = 32;
    loom_sparse_config_default(&window, LOOM_SPARSE_WINDOW);
    window.block = 128, window.window = 150; /* a block holds two tiles */
    loom_sparse_config_default(&per_head, LOOM_SPARSE_VARIABLE);
    per_head.block = 16, per_head.num_random_blocks = 2, per_head.different_layout_per_head = 1;
    loom_sparse_config_default(&dense, LOOM_SPARSE_DENSE);
    const struct fcase cases[] = {
        {2, 192, 2, 2, 16, 0, 0, 1, &fixed, 2, 0, 0},    {1, 320, 4, 2, 16, 0, 0, 0, &bigbird, 4, 0, 0},
        {1, 384, 2, 1, 32, 0, 3, 1, &window, 2, 0, 0},   {1, 256, 2, 2, 16, 40, 0, 0, &per_head, 4, 2, 0},
        {2, 160, 2, 2, 16, 0, 0, 0, &per_head, 2, 0, 0}, {1, 128, 2, 2, 8, 0, 2, 1, &dense, 2, 0, 0},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) test_case(&cases[i]);
}

/* The reference with a layout against block-sparse attention's own
 * (loom_sparse_attention_*_ref, dense att) on the packed qkv. */
static void test_layout_ref_vs_sparse_ref(void)
{
    struct loom_sparse_config cfg;
    loom_sparse_config_default(&cfg, LOOM_SPARSE_BIGBIRD);
    const int B = 2, T = 96, NH = 2, hs = 8, C = NH * hs, h0 = 1;
    struct loom_sparse_layout l;
    CHECK(loom_sparse_layout_build(&cfg, 3, T, &l) == LOOM_OK);
    const size_t nqkv = (size_t)B * T * 3 * C, nout = (size_t)B * T * C, natt = (size_t)B * NH * T * T;
    float *qkv = check_rand(nqkv, 2.0f), *dout = check_rand(nout, 1.0f);
    float *out_s = check_const(nout, NAN), *att = check_const(natt, NAN), *datt = check_const(natt, NAN);
    float *dqkv_s = check_const(nqkv, NAN);
    loom_sparse_attention_forward_ref(out_s, att, qkv, B, T, C, NH, h0, &l);
    loom_sparse_attention_backward_ref(dqkv_s, datt, dout, att, qkv, B, T, C, NH, h0, &l);
    const struct loom_flash_attn a = {.B = B,
                                      .T = T,
                                      .NH = NH,
                                      .G = NH,
                                      .hs = hs,
                                      .ld_q = 3 * C,
                                      .ld_k = 3 * C,
                                      .ld_v = 3 * C,
                                      .layout = &l,
                                      .h0 = h0};
    float *out = check_const(nout, NAN), *lse = check_const((size_t)B * NH * T, NAN),
          *dqkv = check_const(nqkv, NAN);
    loom_flash_attention_forward_ref(out, lse, qkv, qkv + C, qkv + 2 * C, &a);
    loom_flash_attention_backward_ref(dqkv, dqkv + C, dqkv + 2 * C, dout, out, lse, qkv, qkv + C, qkv + 2 * C,
                                      &a);
    check_scaled("ref out with a layout vs the sparse ref", out, out_s, nout, F32_TOL);
    check_scaled("ref dqkv with a layout vs the sparse ref", dqkv, dqkv_s, nqkv, F32_TOL);
    free(qkv), free(dout), free(out_s), free(att), free(datt), free(dqkv_s), free(out), free(lse), free(dqkv);
    loom_sparse_layout_free(&l);
}

/* ---- against the dense kernels ---------------------------------------------------- */

/* Multi-head causal attention on the decoder's packed qkv (B,T,3C) against
 * the table's attention_forward/backward (which keep (B,NH,T,T)). */
static void test_vs_dense(const struct loom_kernels *t, const char *table, int B, int T, int NH, int hs)
{
    const int C = NH * hs;
    const size_t nqkv = (size_t)B * T * 3 * C, nout = (size_t)B * T * C, natt = (size_t)B * NH * T * T;
    float *qkv = check_rand(nqkv, 2.0f), *dout = check_rand(nout, 1.0f);
    float *out_d = check_const(nout, NAN), *att = check_const(natt, NAN), *datt = check_const(natt, NAN);
    float *dqkv_d = check_const(nqkv, NAN);
    t->attention_forward(out_d, att, qkv, B, T, C, NH);
    t->attention_backward(dqkv_d, datt, dout, att, qkv, B, T, C, NH);
    free(att), free(datt);
    const struct loom_flash_attn a = {
        .B = B, .T = T, .NH = NH, .G = NH, .hs = hs, .ld_q = 3 * C, .ld_k = 3 * C, .ld_v = 3 * C};
    float *out = check_const(nout, NAN), *lse = check_const((size_t)B * NH * T, NAN),
          *dqkv = check_const(nqkv, NAN);
    t->flash_attention_forward(out, lse, qkv, qkv + C, qkv + 2 * C, &a);
    t->flash_attention_backward(dqkv, dqkv + C, dqkv + 2 * C, dout, out, lse, qkv, qkv + C, qkv + 2 * C, &a);
    char name[160];
    snprintf(name, sizeof name, "out vs dense (%s B=%d T=%d NH=%d hs=%d)", table, B, T, NH, hs);
    check_scaled(name, out, out_d, nout, table_tol);
    snprintf(name, sizeof name, "dqkv vs dense (%s B=%d T=%d NH=%d hs=%d)", table, B, T, NH, hs);
    check_scaled(name, dqkv, dqkv_d, nqkv, table_tol);
    free(qkv), free(dout), free(out_d), free(dqkv_d), free(out), free(lse), free(dqkv);
}

/* ---- the reference against finite differences ------------------------------------- */

struct fd_ctx {
    struct finputs in;
    float *out, *lse, *w;
};

/* sum(out * w) in double */
static double fd_obj(struct fd_ctx *c)
{
    loom_kernels_ref()->flash_attention_forward(c->out, c->lse, c->in.q, c->in.k, c->in.v, &c->in.a);
    double s = 0.0;
    for (size_t i = 0; i < c->in.nout; i++) s += (double)c->out[i] * c->w[i];
    return s;
}

/* The reference's backward against finite differences of its forward
 * (with dropout: the same mask at every evaluation, a function of q, k, v). */
static void test_fd(double drop)
{
    const struct fcase c = {2, 9, 4, 2, 4, 4, 3, 1, NULL, 0, 0, drop};
    struct fd_ctx x;
    inputs_make(&x.in, &c);
    x.out = check_const(x.in.nout, 0.0f), x.lse = check_const(x.in.nlse, 0.0f), x.w = x.in.dout;
    fd_obj(&x);
    float *dx = check_const(x.in.nx, NAN), *fd = check_const(x.in.nx, NAN);
    backward_into(loom_kernels_ref(), dx, &x.in, x.out, x.lse);
    const float h = 0x1p-6f;
    for (size_t i = 0; i < x.in.nx; i++) { /* Richardson-extrapolated central differences */
        const float x0 = x.in.x[i];
        double d[2];
        for (int s = 0; s < 2; s++) {
            const float hh = s ? h / 2 : h;
            x.in.x[i] = x0 + hh;
            const double fp = fd_obj(&x);
            x.in.x[i] = x0 - hh;
            d[s] = (fp - fd_obj(&x)) / (2.0 * hh);
        }
        x.in.x[i] = x0;
        fd[i] = (float)((4.0 * d[1] - d[0]) / 3.0);
    }
    check_scaled(c.drop > 0 ? "ref dq dk dv vs finite differences, dropout 0.3"
                            : "ref dq dk dv vs finite differences",
                 dx, fd, x.in.nx, 2e-4);
    free(dx), free(fd), free(x.out), free(x.lse);
    inputs_free(&x.in);
}

/* ---- the bf16 tables ------------------------------------------------------------- */

static void test_bf16_tables(void)
{
    /* every product path the CPU has: AMX tiles, vdpbf16ps, the widened float32 (a forced path above
     * the CPU's runs on the best it has) */
    static const char *const units[] = {"auto", "amx", "avx512_bf16", "avx512"};
    for (size_t i = 0; i < sizeof units / sizeof units[0]; i++) {
        char *argv[] = {"test_flash_attention", "--bf16-units", (char *)units[i], NULL};
        check_run_self(argv);
    }
}

static int bf16_table_main(const char *units)
{
#ifndef LOOM_HAVE_DNNL
    printf("bf16 units %s: no oneDNN in this build, no bf16 table\n", units);
    return check_summary("test_flash_attention, bf16 table");
#endif
    CHECK(loom_bf16_units_select(units) == LOOM_OK);
    const struct loom_kernels *t = loom_backend_kernels(loom_backend_cpu(), LOOM_DTYPE_BF16);
    if (t == loom_backend_cpu()->k) {
        printf("bf16 units %s: the bf16 table is the float32 one\n", units);
        return check_summary("test_flash_attention, bf16 table");
    }
    CHECK(t->flash_attention_forward == loom_flash_attention_forward_bf16);
    static char name[96];
    const char *products = loom_flash_attention_bf16_products();
    snprintf(name, sizeof name, "bf16 (%s: %s, products %s)", units, loom_bf16_units_name(loom_bf16_units()),
             products);
    /* the forced units' own products where the CPU has them */
    if (!strcmp(units, "avx512")) CHECK(!strcmp(products, "widened"));
    if (!strcmp(units, "avx512_bf16") && __builtin_cpu_supports("avx512bf16"))
        CHECK(!strcmp(products, "avx512_bf16"));
    if (!strcmp(units, "amx") && __builtin_cpu_supports("amx-bf16")) CHECK(!strcmp(products, "amx"));
    printf("%s\n", name);
    tables[0] = t, table_names[0] = name, ntables = 1;
    table_tol = BF16_TOL;
    test_cases();
    test_layouts();
    test_parts_cases();
    test_vs_dense(t, name, 1, 300, 2, 64);
    return check_summary("test_flash_attention, bf16 table");
}

int main(int argc, char **argv)
{
    *check_rng() = 0x853c49e6748fea9bull;
    if (argc == 3 && strcmp(argv[1], "--bf16-units") == 0) return bf16_table_main(argv[2]);
    for (int i = 0; i < loom_backend_count() && ntables < 7; i++) {
        tables[ntables] = loom_backend_at(i)->k;
        table_names[ntables++] = loom_backend_at(i)->name;
    }
    test_cases();
    test_layouts();
    test_parts_cases();
    test_layout_ref_vs_sparse_ref();
    for (int i = 0; i < ntables; i++) {
        test_vs_dense(tables[i], table_names[i], 2, 100, 3, 16);
        test_vs_dense(tables[i], table_names[i], 1, 2100, 2, 64);
    }
    test_vs_dense(tables[0], table_names[0], 1, 4096, 1, 64); /* the longest the must-hold names */
    test_fd(0);
    test_fd(0.3);
    test_bf16_tables();
    return check_summary("test_flash_attention");
}
