/*
 * Unit test of the kernels, self-contained, run for every registered
 * backend (kernels/backend.h; today "cpu" and "guarded", whose kernels
 * take host buffers too) through its table:
 *   - every table complete, the registry finds "cpu";
 *   - the backend vs the reference table (the `_ref` loops) for matmul, the
 *     LM head and attention, at odd sizes and across attention's row blocks;
 *   - every backward against central finite differences of the objective
 *     L = sum(out * w), w random, in double, Richardson-extrapolated from
 *     steps h and h/2 (error O(h^4)), so the estimate is good to ~1e-5 of
 *     the gradient's scale and the tolerance can be tight;
 *   - the gradient rule: parameter gradients and layernorm/residual dinp
 *     accumulate onto what was there, written gradients ignore it (they are
 *     pre-filled with NaN, so reading them fails the check);
 *   - GELU, the cross-entropy's log-sum-exp, and Llama's RMSNorm, rotary
 *     embedding (Hugging Face's rotate_half angles) and SwiGLU gate against
 *     double formulas;
 *     AdamW against a double scalar loop; sum of squares and the embedding
 *     backward give the same bits at 1 and 2 threads;
 *   - the vocabulary-parallel embedding and cross-entropy, the vocabulary
 *     split 1, 2 and 3 ways (uneven shards, tokens and targets at every
 *     shard border) and recombined, against the unsplit kernels: exact for
 *     the embedding and for dlogits given the same lse, 1e-6 for lse, loss
 *     and dlogits from the recombined lse.
 *   - the linear layer (weight [out, in]) of the backend's table, the
 *     reference table and, in a process of its own per units path (they
 *     are chosen once per process), the bf16 table: against double sums,
 *     and bit for bit the same table's LM head without bias, the product
 *     plus the bias with it, and the same with the operands handed over
 *     in bf16; GeGLU's gate against double formulas, finite differences
 *     and, bit for bit, GELU's kernels;
 *   - the non-finite checks (float32, bf16, fp16) at every position and
 *     the 16-bit sum of squares against an exact double sum; adding
 *     float32 into 16 bits against a scalar loop at 1 and 2 threads. The sparse
 *     attention members are tests/test_sparse_attention.c's, the fused
 *     attention's tests/test_flash_attention.c's.
 * The PyTorch comparison is tests/test_kernels_torch.py.
 */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/log.h"
#include "base/sumsq_exact.h"
#include "check.h"
#include "kernels/backend.h"
#include "kernels/kernels.h"

/* ---- the backend under test ---------------------------------------------- */

/* Every test calls the kernels of K, the backend being tested, and holds
 * them against REF (loom_kernels_ref), against double formulas and against
 * finite differences. */
static const struct loom_kernels *K, *REF;

/* The backend's thread count; a backend without one runs both "thread
 * counts" at its own, so the same-bits checks still compare two runs. */
static void set_threads(int n)
{
    if (K->set_threads) K->set_threads(n);
}

static int get_threads(void)
{
    return K->get_threads ? K->get_threads() : 1;
}

/* ---- helpers -------------------------------------------------------------- */

static uint64_t rng_state = 0x9e3779b97f4a7c15ull;

static uint64_t rng_next(void)
{
    uint64_t z = (rng_state += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

/* Uniform in [-scale, scale), quantised to multiples of 2^-12 so that x +- h
 * (h a power of two >= 2^-12) is exact in float. */
static void fill(float *x, size_t n, float scale)
{
    for (size_t i = 0; i < n; i++) {
        double u = (double)(rng_next() >> 11) / 9007199254740992.0; /* [0,1) */
        x[i] = (float)(nearbyint((2.0 * u - 1.0) * scale * 4096.0) / 4096.0);
    }
}

static float *new_rand(size_t n, float scale)
{
    float *x = malloc(n * sizeof(float));
    fill(x, n, scale);
    return x;
}

static float *new_const(size_t n, float v)
{
    float *x = malloc(n * sizeof(float));
    for (size_t i = 0; i < n; i++) x[i] = v;
    return x;
}

static float *new_copy(const float *src, size_t n)
{
    float *x = malloc(n * sizeof(float));
    memcpy(x, src, n * sizeof(float));
    return x;
}

static float max_abs(const float *x, size_t n)
{
    float m = 0.0f;
    for (size_t i = 0; i < n; i++) m = fabsf(x[i]) > m ? fabsf(x[i]) : m;
    return m;
}

/* The tolerance, against the tensor's scale (check_scaled), of a kernel
 * whose outputs are float32 sums of K terms held against the reference's
 * double sums rounded once: 4 u sqrt(K), u = 2^-24, and at least 1e-6. The
 * error depends on the order the backend sums in, which a BLAS chooses by
 * its core (kernel width, K blocking) and thread count, so the bound is the
 * one of the worst usual order: a sequential float32 sum of K products of
 * random sign errs by about u sqrt(K) of the output's scale (measured, max
 * over a tensor: 0.47 to 0.61 u sqrt(K) for K = 12 to 30000), blocked and
 * pairwise orders by less; 4x leaves 6x over it. This machine's OpenBLAS
 * measures 4.3e-7 at K = 130 (the sequential order's 4.2e-7) and 3.7e-7 at
 * K = 30000 (the sequential order's 5.8e-6 would fail a fixed 1e-6). The
 * 1e-6 floor is 17 u, a few roundings of a short sum. A wrong or missing
 * term errs by 1e-2 of the scale or more. */
static double sum_tol(int n_terms)
{
    const double t = 4.0 * sqrt((double)n_terms) * 0x1p-24;
    return t > 1e-6 ? t : 1e-6;
}

/* got - base, the part a kernel accumulated. */
static void sub(float *out, const float *got, const float *base, size_t n)
{
    for (size_t i = 0; i < n; i++) out[i] = got[i] - base[i];
}

static double dot(const float *a, const float *w, size_t n)
{
    double s = 0.0;
    for (size_t i = 0; i < n; i++) s += (double)a[i] * w[i];
    return s;
}

/* ---- finite differences ---------------------------------------------------- */

typedef double (*objective_fn)(void *ctx);

#define FD_H 0x1p-6f
/* Tolerance of analytic vs finite-difference gradients, relative to the
 * gradient's max. The estimate's truncation error is O(h^4) ~ 1e-7 and its
 * rounding noise about sqrt(#outputs) * 6e-8 * |out| / h ~ 1e-5 at these
 * sizes (measured up to 4.7e-5, crossentropy's, whose gradient is small
 * against its loss; 2.9e-5 layernorm's, under 2e-5 the rest: the same at 1
 * and 2 threads and on every OpenBLAS core, the objectives' sums being the
 * kernels' own fixed-order loops); a wrong term in a backward shows up at
 * 1e-2 or more. */
#define FD_TOL 2e-4

/* d objective / d x[i] for every i, Richardson-extrapolated central
 * differences with steps h and h/2; x is restored exactly. */
static void fd_grad(float *fd, float *x, size_t n, objective_fn f, void *ctx)
{
    for (size_t i = 0; i < n; i++) {
        const float x0 = x[i];
        double d[2];
        for (int k = 0; k < 2; k++) {
            const float h = k == 0 ? FD_H : FD_H / 2;
            x[i] = x0 + h;
            const double fp = f(ctx);
            x[i] = x0 - h;
            const double fm = f(ctx);
            d[k] = (fp - fm) / (2.0 * h);
        }
        x[i] = x0;
        fd[i] = (float)((4.0 * d[1] - d[0]) / 3.0);
    }
}

/* Checks an analytic gradient of x against finite differences. */
static void fd_check(const char *name, const float *grad, float *x, size_t n, objective_fn f, void *ctx)
{
    float *fd = malloc(n * sizeof(float));
    fd_grad(fd, x, n, f, ctx);
    check_scaled(name, grad, fd, n, FD_TOL);
    free(fd);
}

/* ---- matmul and LM head ------------------------------------------------------ */

static void test_matmul_vs_ref(int N, int C, int OC, int with_bias)
{
    float *inp = new_rand((size_t)N * C, 1.0f), *w = new_rand((size_t)C * OC, 1.0f);
    float *bias = with_bias ? new_rand(OC, 1.0f) : NULL;
    float *out = new_const((size_t)N * OC, NAN), *out_ref = new_const((size_t)N * OC, NAN);
    K->matmul_forward(out, inp, w, bias, N, C, OC);
    REF->matmul_forward(out_ref, inp, w, bias, N, C, OC);
    check_scaled("matmul fwd vs ref", out, out_ref, (size_t)N * OC, sum_tol(C + 1));

    float *dout = new_rand((size_t)N * OC, 1.0f);
    float *dinp = new_const((size_t)N * C, NAN), *dinp_ref = new_const((size_t)N * C, NAN);
    float *dw0 = new_rand((size_t)C * OC, 1.0f), *db0 = new_rand(OC, 1.0f);
    float *dw = new_copy(dw0, (size_t)C * OC), *dw_ref = new_copy(dw0, (size_t)C * OC);
    float *db = new_copy(db0, OC), *db_ref = new_copy(db0, OC);
    K->matmul_backward(dinp, dw, with_bias ? db : NULL, dout, inp, w, N, C, OC);
    REF->matmul_backward(dinp_ref, dw_ref, with_bias ? db_ref : NULL, dout, inp, w, N, C, OC);
    check_scaled("matmul dinp vs ref", dinp, dinp_ref, (size_t)N * C, sum_tol(OC));
    check_scaled("matmul dweight vs ref", dw, dw_ref, (size_t)C * OC, sum_tol(N + 1)); /* onto dw0 */
    check_scaled("matmul dbias vs ref", db, db_ref, OC, sum_tol(N + 1));
    if (!with_bias) CHECK(memcmp(db, db0, OC * sizeof(float)) == 0); /* NULL bias: untouched */

    /* dinp NULL: skipped, dweight still accumulates */
    float *dw2 = new_copy(dw0, (size_t)C * OC);
    K->matmul_backward(NULL, dw2, NULL, dout, inp, w, N, C, OC);
    check_scaled("matmul dweight (dinp NULL)", dw2, dw_ref, (size_t)C * OC, sum_tol(N + 1));

    free(inp), free(w), free(bias), free(out), free(out_ref), free(dout), free(dinp);
    free(dinp_ref), free(dw0), free(db0), free(dw), free(dw_ref), free(db), free(db_ref), free(dw2);
}

/* The LM head's backward with the logits' gradient held in 16 bits (bf16,
 * fp16): the same as the float32 kernel on the same (16-bit valued)
 * numbers, up to the order of the float32 additions; V large enough for
 * several column blocks at this N. And GELU's backward may write over its
 * output gradient (the 16-bit activation path does). */
static void test_lm_head_lp(int N, int C, int V)
{
    const enum loom_dtype dts[2] = {LOOM_DTYPE_BF16, LOOM_DTYPE_F16};
    for (int k = 0; k < 2; k++) {
        float *inp = new_rand((size_t)N * C, 1.0f), *wte = new_rand((size_t)V * C, 1.0f);
        float *dl = new_rand((size_t)N * V, 1.0f);
        uint16_t *dl16 = malloc((size_t)N * V * sizeof *dl16);
        loom_lp_from_f32(dl16, dl, (size_t)N * V, dts[k]);
        loom_lp_to_f32(dl, dl16, (size_t)N * V, dts[k]);
        float *dwte0 = new_rand((size_t)V * C, 1.0f), *dwte = new_copy(dwte0, (size_t)V * C);
        float *dwte_ref = new_copy(dwte0, (size_t)V * C);
        float *dinp = new_const((size_t)N * C, NAN), *dinp_ref = new_const((size_t)N * C, NAN);
        /* the logits: the float32 sums rounded to 16 bits, the reference's not: at most half a
         * 16-bit step (2^-8 of the value for bf16, 2^-11 for fp16, so of the scale) plus the
         * float32 sums' own difference (sum_tol); measured 2.4e-3 (bf16) and 3.0e-4 (fp16): the
         * bound is the rounding's own limit, a wrong product errs by far more */
        uint16_t *l16 = malloc((size_t)N * V * sizeof *l16);
        float *l = new_const((size_t)N * V, NAN), *l_ref = new_const((size_t)N * V, NAN);
        K->lm_head_forward_lp(l16, dts[k], inp, wte, NULL, N, C, V);
        loom_lp_to_f32(l, l16, (size_t)N * V, dts[k]);
        REF->lm_head_forward(l_ref, inp, wte, N, C, V);
        check_scaled(k ? "lm_head_lp fp16 logits vs ref" : "lm_head_lp bf16 logits vs ref", l, l_ref,
                     (size_t)N * V, (k ? 1.0 / 2048 : 1.0 / 256) + sum_tol(C));
        free(l16), free(l), free(l_ref);
        K->lm_head_backward_lp(dinp, dwte, dl16, dts[k], inp, wte, NULL, N, C, V);
        REF->lm_head_backward(dinp_ref, dwte_ref, dl, inp, wte, N, C, V);
        check_scaled(k ? "lm_head_lp fp16 dinp vs ref" : "lm_head_lp bf16 dinp vs ref", dinp, dinp_ref,
                     (size_t)N * C, sum_tol(V));
        check_scaled(k ? "lm_head_lp fp16 dwte vs ref" : "lm_head_lp bf16 dwte vs ref", dwte, dwte_ref,
                     (size_t)V * C, sum_tol(N + 1));
        free(inp), free(wte), free(dl), free(dl16), free(dwte0), free(dwte), free(dwte_ref), free(dinp);
        free(dinp_ref);
    }
    const size_t n = 1000;
    float *x = new_rand(n, 3.0f), *d = new_rand(n, 1.0f), *want = malloc(n * sizeof(float));
    K->gelu_backward(want, d, x, n);
    K->gelu_backward(d, d, x, n);
    CHECK(memcmp(want, d, n * sizeof(float)) == 0);
    free(x), free(d), free(want);
}

static void test_lm_head_vs_ref(int N, int C, int V)
{
    float *inp = new_rand((size_t)N * C, 1.0f), *wte = new_rand((size_t)V * C, 1.0f);
    float *wT = malloc((size_t)C * V * sizeof(float)); /* (C,V) for matmul_ref */
    for (int v = 0; v < V; v++)
        for (int c = 0; c < C; c++) wT[(size_t)c * V + v] = wte[(size_t)v * C + c];
    float *logits = new_const((size_t)N * V, NAN), *logits_ref = new_const((size_t)N * V, NAN);
    K->lm_head_forward(logits, inp, wte, N, C, V);
    REF->matmul_forward(logits_ref, inp, wT, NULL, N, C, V);
    check_scaled("lm_head fwd vs ref", logits, logits_ref, (size_t)N * V, sum_tol(C));

    float *dlogits = new_rand((size_t)N * V, 1.0f);
    float *dinp = new_const((size_t)N * C, NAN), *dinp_ref = new_const((size_t)N * C, NAN);
    float *dwte0 = new_rand((size_t)V * C, 1.0f), *dwte = new_copy(dwte0, (size_t)V * C);
    float *dwT = calloc((size_t)C * V, sizeof(float));
    K->lm_head_backward(dinp, dwte, dlogits, inp, wte, N, C, V);
    REF->matmul_backward(dinp_ref, dwT, NULL, dlogits, inp, wT, N, C, V);
    float *dwte_ref = malloc((size_t)V * C * sizeof(float));
    for (int v = 0; v < V; v++)
        for (int c = 0; c < C; c++)
            dwte_ref[(size_t)v * C + c] = dwte0[(size_t)v * C + c] + dwT[(size_t)c * V + v];
    check_scaled("lm_head dinp vs ref", dinp, dinp_ref, (size_t)N * C, sum_tol(V));
    check_scaled("lm_head dwte vs ref", dwte, dwte_ref, (size_t)V * C, sum_tol(N + 1));
    /* and against the reference table's own LM head (wte as stored) */
    float *hl = new_const((size_t)N * V, NAN), *hdinp = new_const((size_t)N * C, NAN);
    float *hdwte = new_copy(dwte0, (size_t)V * C);
    REF->lm_head_forward(hl, inp, wte, N, C, V);
    REF->lm_head_backward(hdinp, hdwte, dlogits, inp, wte, N, C, V);
    check_scaled("lm_head fwd vs ref lm_head", logits, hl, (size_t)N * V, sum_tol(C));
    check_scaled("lm_head dinp vs ref lm_head", dinp, hdinp, (size_t)N * C, sum_tol(V));
    check_scaled("lm_head dwte vs ref lm_head", dwte, hdwte, (size_t)V * C, sum_tol(N + 1));
    free(hl), free(hdinp), free(hdwte);
    free(inp), free(wte), free(wT), free(logits), free(logits_ref), free(dlogits), free(dinp);
    free(dinp_ref), free(dwte0), free(dwte), free(dwT), free(dwte_ref);
}

struct matmul_ctx {
    float *inp, *w, *bias, *out, *wout;
    int N, C, OC;
};

static double matmul_obj(void *p)
{
    struct matmul_ctx *c = p;
    K->matmul_forward(c->out, c->inp, c->w, c->bias, c->N, c->C, c->OC);
    return dot(c->out, c->wout, (size_t)c->N * c->OC);
}

static void test_matmul_fd(void)
{
    const int N = 5, C = 7, OC = 6;
    struct matmul_ctx c = {new_rand(N * C, 1.0f),
                           new_rand(C * OC, 1.0f),
                           new_rand(OC, 1.0f),
                           new_const(N * OC, 0.0f),
                           new_rand(N * OC, 1.0f),
                           N,
                           C,
                           OC};
    float *dinp = new_const(N * C, NAN), *dw = new_const(C * OC, 0.0f), *db = new_const(OC, 0.0f);
    K->matmul_backward(dinp, dw, db, c.wout, c.inp, c.w, N, C, OC);
    fd_check("matmul dinp vs fd", dinp, c.inp, N * C, matmul_obj, &c);
    fd_check("matmul dweight vs fd", dw, c.w, C * OC, matmul_obj, &c);
    fd_check("matmul dbias vs fd", db, c.bias, OC, matmul_obj, &c);
    free(c.inp), free(c.w), free(c.bias), free(c.out), free(c.wout), free(dinp), free(dw), free(db);
}

struct lm_head_ctx {
    float *inp, *wte, *logits, *wout;
    int N, C, V;
};

static double lm_head_obj(void *p)
{
    struct lm_head_ctx *c = p;
    K->lm_head_forward(c->logits, c->inp, c->wte, c->N, c->C, c->V);
    return dot(c->logits, c->wout, (size_t)c->N * c->V);
}

static void test_lm_head_fd(void)
{
    const int N = 5, C = 8, V = 11;
    struct lm_head_ctx c = {
        new_rand(N * C, 1.0f), new_rand(V * C, 1.0f), new_const(N * V, 0.0f), new_rand(N * V, 1.0f), N, C, V};
    float *dinp = new_const(N * C, NAN), *dwte = new_const(V * C, 0.0f);
    K->lm_head_backward(dinp, dwte, c.wout, c.inp, c.wte, N, C, V);
    fd_check("lm_head dinp vs fd", dinp, c.inp, N * C, lm_head_obj, &c);
    fd_check("lm_head dwte vs fd", dwte, c.wte, V * C, lm_head_obj, &c);
    free(c.inp), free(c.wte), free(c.logits), free(c.wout), free(dinp), free(dwte);
}

/* ---- linear layer ------------------------------------------------------------------ */

/* Table t's linear layer, weight (OC,C) in torch.nn.Linear's layout, on
 * bf16-valued inp, weight and dout, so that every table (the bf16 one
 * included) computes on the same numbers and the products are exact in
 * float32:
 *   - against double sums rounded once, with the bounds of the products
 *     above: C products and the bias (sum_tol(C + 1)), OC terms for dinp,
 *     N onto dweight's prior contents (sum_tol(N + 1));
 *   - dbias exactly the prior plus each column's double sum rounded once
 *     (every dout is a multiple of 2^-12 below 1, so the double sum is
 *     exact in any order);
 *   - bit for bit: without bias, the same table's lm_head_forward and
 *     lm_head_backward; with it, the product plus the bias; the operands
 *     handed over in bf16 (inp, weight or both, the float32 pointer NULL),
 *     the same bits as in float32; dinp NULL leaves dweight and dbias as
 *     they are with it, dweight NULL dinp. dinp is written (NaN before). */
static void test_linear(const struct loom_kernels *t, const char *table, int N, int C, int OC)
{
    char name[112];
    const size_t nx = (size_t)N * C, nw = (size_t)OC * C, ny = (size_t)N * OC;
    float *x = new_rand(nx, 1.0f), *w = new_rand(nw, 1.0f), *dy = new_rand(ny, 1.0f);
    uint16_t *x16 = malloc(nx * sizeof *x16), *w16 = malloc(nw * sizeof *w16);
    loom_lp_round_store(x16, x, nx, LOOM_DTYPE_BF16); /* x rounded, and its bf16 bits */
    loom_lp_round_store(w16, w, nw, LOOM_DTYPE_BF16);
    loom_dtype_round_trip(dy, ny, LOOM_DTYPE_BF16);
    float *bias = new_rand(OC, 1.0f), *dw0 = new_rand(nw, 1.0f), *db0 = new_rand(OC, 1.0f);

    float *out = new_const(ny, NAN), *nob = new_const(ny, NAN), *lm = new_const(ny, NAN);
    float *want = malloc(ny * sizeof(float)), *alt = malloc(ny * sizeof(float));
    t->linear_forward(out, x, NULL, w, NULL, bias, N, C, OC);
    for (int i = 0; i < N; i++)
        for (int o = 0; o < OC; o++) {
            double s = bias[o];
            for (int c = 0; c < C; c++) s += (double)x[(size_t)i * C + c] * w[(size_t)o * C + c];
            want[(size_t)i * OC + o] = (float)s;
        }
    snprintf(name, sizeof name, "%s linear out vs double (N=%d C=%d OC=%d)", table, N, C, OC);
    check_scaled(name, out, want, ny, sum_tol(C + 1));
    t->linear_forward(nob, x, NULL, w, NULL, NULL, N, C, OC);
    t->lm_head_forward(lm, x, w, N, C, OC);
    CHECK(memcmp(nob, lm, ny * sizeof(float)) == 0);
    for (size_t i = 0; i < ny; i++) want[i] = nob[i] + bias[i % OC];
    CHECK(memcmp(out, want, ny * sizeof(float)) == 0);
    for (int m = 1; m <= 3; m++) { /* inp, weight, both in bf16 */
        for (size_t i = 0; i < ny; i++) alt[i] = NAN;
        t->linear_forward(alt, m & 1 ? NULL : x, m & 1 ? x16 : NULL, m & 2 ? NULL : w, m & 2 ? w16 : NULL,
                          bias, N, C, OC);
        CHECK(memcmp(alt, out, ny * sizeof(float)) == 0);
    }

    float *dx = new_const(nx, NAN), *dw = new_copy(dw0, nw), *db = new_copy(db0, OC);
    t->linear_backward(dx, dw, db, dy, x, NULL, w, NULL, N, C, OC);
    float *dx_want = malloc(nx * sizeof(float)), *dw_want = malloc(nw * sizeof(float));
    float *db_want = malloc(OC * sizeof(float));
    for (int i = 0; i < N; i++)
        for (int c = 0; c < C; c++) {
            double s = 0.0;
            for (int o = 0; o < OC; o++) s += (double)dy[(size_t)i * OC + o] * w[(size_t)o * C + c];
            dx_want[(size_t)i * C + c] = (float)s;
        }
    for (int o = 0; o < OC; o++) {
        for (int c = 0; c < C; c++) {
            double s = dw0[(size_t)o * C + c];
            for (int i = 0; i < N; i++) s += (double)dy[(size_t)i * OC + o] * x[(size_t)i * C + c];
            dw_want[(size_t)o * C + c] = (float)s;
        }
        double s = 0.0;
        for (int i = 0; i < N; i++) s += dy[(size_t)i * OC + o];
        db_want[o] = db0[o] + (float)s;
    }
    snprintf(name, sizeof name, "%s linear dinp vs double (N=%d C=%d OC=%d)", table, N, C, OC);
    check_scaled(name, dx, dx_want, nx, sum_tol(OC));
    snprintf(name, sizeof name, "%s linear dweight vs double (N=%d C=%d OC=%d)", table, N, C, OC);
    check_scaled(name, dw, dw_want, nw, sum_tol(N + 1));
    CHECK(memcmp(db, db_want, OC * sizeof(float)) == 0);
    float *db3 = new_copy(db0, OC); /* the table's bias gradient: the same sums */
    t->bias_backward(db3, dy, N, OC);
    CHECK(memcmp(db3, db, OC * sizeof(float)) == 0);
    free(db3);

    float *dx2 = new_const(nx, NAN), *dw2 = new_copy(dw0, nw), *db2 = new_copy(db0, OC);
    float *dx3 = new_const(nx, NAN), *dw3 = new_copy(dw0, nw);
    t->linear_backward(dx2, dw2, NULL, dy, x, NULL, w, NULL, N, C, OC);
    t->lm_head_backward(dx3, dw3, dy, x, w, N, C, OC);
    CHECK(memcmp(dx2, dx3, nx * sizeof(float)) == 0 && memcmp(dw2, dw3, nw * sizeof(float)) == 0);
    CHECK(memcmp(dx2, dx, nx * sizeof(float)) == 0 && memcmp(dw2, dw, nw * sizeof(float)) == 0);
    memcpy(dw2, dw0, nw * sizeof(float));
    t->linear_backward(NULL, dw2, db2, dy, x, NULL, w, NULL, N, C, OC);
    CHECK(memcmp(dw2, dw, nw * sizeof(float)) == 0 && memcmp(db2, db, OC * sizeof(float)) == 0);
    for (size_t i = 0; i < nx; i++) dx2[i] = NAN;
    t->linear_backward(dx2, NULL, NULL, dy, x, NULL, w, NULL, N, C, OC);
    CHECK(memcmp(dx2, dx, nx * sizeof(float)) == 0);
    for (int m = 1; m <= 3; m++) {
        for (size_t i = 0; i < nx; i++) dx2[i] = NAN;
        memcpy(dw2, dw0, nw * sizeof(float));
        memcpy(db2, db0, OC * sizeof(float));
        t->linear_backward(dx2, dw2, db2, dy, m & 1 ? NULL : x, m & 1 ? x16 : NULL, m & 2 ? NULL : w,
                           m & 2 ? w16 : NULL, N, C, OC);
        CHECK(memcmp(dx2, dx, nx * sizeof(float)) == 0 && memcmp(dw2, dw, nw * sizeof(float)) == 0 &&
              memcmp(db2, db, OC * sizeof(float)) == 0);
    }
    free(x), free(w), free(dy), free(x16), free(w16), free(bias), free(dw0), free(db0), free(out), free(nob);
    free(lm), free(want), free(alt), free(dx), free(dw), free(db), free(dx_want), free(dw_want);
    free(db_want), free(dx2), free(dw2), free(db2), free(dx3), free(dw3);
}

/* The linear layer's sizes: odd ones, and one whose bias passes take the
 * parallel path (N * OC >= 32768). */
/* ---- grouped products ---------------------------------------------------------- */

/* Table t's one product of group g's shape on n rows, as the grouped
 * product promises to take it: linear's for [out, in], matmul's (its b16
 * form where the table has one and w16 is given) for [in, out]. */
static void single_forward(const struct loom_kernels *t, int out_in, float *out, const float *x,
                           const float *w, const uint16_t *w16, const float *bias, int n, int C, int OC)
{
    if (out_in)
        t->linear_forward(out, x, NULL, w, w16, bias, n, C, OC);
    else if (w16 && t->matmul_forward_b16)
        t->matmul_forward_b16(out, x, NULL, w, w16, bias, n, C, OC);
    else
        t->matmul_forward(out, x, w, bias, n, C, OC);
}
static void single_backward(const struct loom_kernels *t, int out_in, float *dx, float *dw, float *db,
                            const float *dy, const float *x, const float *w, const uint16_t *w16, int n,
                            int C, int OC)
{
    if (out_in)
        t->linear_backward(dx, dw, db, dy, x, NULL, w, w16, n, C, OC);
    else if (w16 && t->matmul_backward_b16)
        t->matmul_backward_b16(dx, dw, db, dy, x, NULL, w, w16, n, C, OC);
    else
        t->matmul_backward(dx, dw, db, dy, x, w, n, C, OC);
}

/* Table t's grouped product over G groups of rows[g] rows (empty groups
 * and one group without a bias among them), weights in either
 * orientation, with and without their bf16 copies, on bf16-valued
 * operands (as test_linear, so every table computes on the same numbers):
 *   - against the reference table's loops (double sums rounded once):
 *     outputs within sum_tol(C + 1), input gradients sum_tol(OC), the
 *     weights' and biases' gradients onto their prior contents
 *     sum_tol(rows + 1);
 *   - bit for bit each group's one product of the same table on its rows
 *     (single_forward, single_backward), with dinp NULL the same weight
 *     and bias gradients; dinp is written (NaN before). */
static void test_grouped(const struct loom_kernels *t, const char *table, int G, const int *rows,
                         const size_t *first, int C, int OC)
{
    const struct loom_kernels *ref = loom_kernels_ref();
    char name[160];
    int R = 0, most = 0;
    for (int g = 0; g < G; g++) R += rows[g], most = rows[g] > most ? rows[g] : most;
    size_t at[8]; /* where each group's rows start */
    for (int g = 0, o = 0; g < G; o += rows[g++]) at[g] = first ? first[g] : (size_t)o;
    const size_t nx = (size_t)R * C, ny = (size_t)R * OC, nw = (size_t)C * OC;
    float *x = new_rand(nx, 1.0f), *dy = new_rand(ny, 1.0f);
    loom_dtype_round_trip(x, nx, LOOM_DTYPE_BF16);
    loom_dtype_round_trip(dy, ny, LOOM_DTYPE_BF16);
    float *w[8], *bias[8], *dw0[8], *db0[8], *dw[8], *db[8], *dw_ref[8], *db_ref[8], *dw_one[8], *db_one[8];
    uint16_t *w16[8];
    for (int g = 0; g < G; g++) {
        w[g] = new_rand(nw, 1.0f);
        w16[g] = malloc(nw * sizeof(uint16_t));
        loom_lp_round_store(w16[g], w[g], nw, LOOM_DTYPE_BF16);
        bias[g] = g == 1 ? NULL : new_rand(OC, 1.0f);
        dw0[g] = new_rand(nw, 1.0f), db0[g] = new_rand(OC, 1.0f);
        dw[g] = malloc(nw * sizeof(float)), db[g] = malloc(OC * sizeof(float));
        dw_ref[g] = malloc(nw * sizeof(float)), db_ref[g] = malloc(OC * sizeof(float));
        dw_one[g] = malloc(nw * sizeof(float)), db_one[g] = malloc(OC * sizeof(float));
    }
    float *dbp[8], *dbp_ref[8], *dbp_one[8]; /* the bias gradients, NULL where there is no bias */
    for (int g = 0; g < G; g++)
        dbp[g] = bias[g] ? db[g] : NULL, dbp_ref[g] = bias[g] ? db_ref[g] : NULL,
        dbp_one[g] = bias[g] ? db_one[g] : NULL;
    float *out = new_const(ny, NAN), *want = new_const(ny, NAN), *one = new_const(ny, NAN);
    float *dx = new_const(nx, NAN), *dx_ref = new_const(nx, NAN), *dx_one = new_const(nx, NAN);
    for (int out_in = 0; out_in <= 1; out_in++)
        for (int with16 = 0; with16 <= 1; with16++) {
            struct loom_grouped gr = {.G = G,
                                      .rows = rows,
                                      .first = first,
                                      .out_in = out_in,
                                      .w = (const float *const *)w,
                                      .w16 = with16 ? (const uint16_t *const *)w16 : NULL,
                                      .bias = (const float *const *)bias,
                                      .dw = dw,
                                      .dbias = dbp};
            struct loom_grouped gref = gr;
            gref.dw = dw_ref, gref.dbias = dbp_ref;
            snprintf(name, sizeof name, "%s grouped (G=%d R=%d C=%d OC=%d, %s, bf16 copies %s, %s)", table, G,
                     R, C, OC, out_in ? "[out, in]" : "[in, out]", with16 ? "given" : "none",
                     first ? "placed" : "in order");
            printf("%s\n", name);
            t->grouped_forward(out, x, &gr, C, OC);
            ref->grouped_forward(want, x, &gref, C, OC);
            check_scaled(name, out, want, ny, sum_tol(C + 1));
            for (int g = 0; g < G; g++)
                if (rows[g])
                    single_forward(t, out_in, one + at[g] * OC, x + at[g] * C, w[g], with16 ? w16[g] : NULL,
                                   bias[g], rows[g], C, OC);
            CHECK(memcmp(out, one, ny * sizeof(float)) == 0);

            for (int g = 0; g < G; g++) {
                memcpy(dw[g], dw0[g], nw * sizeof(float)), memcpy(dw_ref[g], dw0[g], nw * sizeof(float));
                memcpy(dw_one[g], dw0[g], nw * sizeof(float));
                memcpy(db[g], db0[g], OC * sizeof(float)), memcpy(db_ref[g], db0[g], OC * sizeof(float));
                memcpy(db_one[g], db0[g], OC * sizeof(float));
            }
            for (size_t i = 0; i < nx; i++) dx[i] = NAN;
            t->grouped_backward(dx, dy, x, &gr, C, OC);
            ref->grouped_backward(dx_ref, dy, x, &gref, C, OC);
            check_scaled(name, dx, dx_ref, nx, sum_tol(OC));
            for (int g = 0; g < G; g++) {
                check_scaled(name, dw[g], dw_ref[g], nw, sum_tol(most + 1));
                if (bias[g]) check_scaled(name, db[g], db_ref[g], OC, sum_tol(most + 1));
                if (rows[g])
                    single_backward(t, out_in, dx_one + at[g] * C, dw_one[g], bias[g] ? db_one[g] : NULL,
                                    dy + at[g] * OC, x + at[g] * C, w[g], with16 ? w16[g] : NULL, rows[g], C,
                                    OC);
                CHECK(memcmp(dw[g], dw_one[g], nw * sizeof(float)) == 0 &&
                      memcmp(db[g], db_one[g], OC * sizeof(float)) == 0);
            }
            CHECK(memcmp(dx, dx_one, nx * sizeof(float)) == 0);
            for (int g = 0; g < G; g++) { /* without dinp: the same weight and bias gradients */
                memcpy(dw_one[g], dw0[g], nw * sizeof(float));
                memcpy(db_one[g], db0[g], OC * sizeof(float));
            }
            gr.dw = dw_one, gr.dbias = dbp_one;
            t->grouped_backward(NULL, dy, x, &gr, C, OC);
            for (int g = 0; g < G; g++)
                CHECK(memcmp(dw[g], dw_one[g], nw * sizeof(float)) == 0 &&
                      memcmp(db[g], db_one[g], OC * sizeof(float)) == 0);
        }
    for (int g = 0; g < G; g++) {
        free(w[g]), free(w16[g]), free(bias[g]), free(dw0[g]), free(db0[g]), free(dw[g]), free(db[g]);
        free(dw_ref[g]), free(db_ref[g]), free(dw_one[g]), free(db_one[g]);
    }
    free(x), free(dy), free(out), free(want), free(one), free(dx), free(dx_ref), free(dx_one);
}

static void test_linear_sizes(const struct loom_kernels *t, const char *table)
{
    printf("linear, %s table\n", table);
    test_linear(t, table, 7, 12, 5);
    test_linear(t, table, 33, 48, 20);
    test_linear(t, table, 128, 40, 300);
    static const int rows_small[] = {3, 0, 17, 1, 9}, rows_large[] = {70, 130, 0, 33};
    static const size_t backwards[] = {27, 27, 10, 9, 0}; /* rows_small's blocks from the last to the first */
    test_grouped(t, table, 5, rows_small, NULL, 12, 20);
    test_grouped(t, table, 5, rows_small, backwards, 12, 20);
    test_grouped(t, table, 4, rows_large, NULL, 48, 130);
}

/* The bf16 table (kernels_for(BF16)): the units are chosen once per
 * process, so each path runs in a process of its own, this program again
 * with the path named (bf16_table_main): the best the CPU has (AMX or
 * AVX512-BF16; none: no bf16 table to test) and oneDNN's emulation on
 * plain AVX512 (which runs on the best the CPU has where it lacks AVX512). */
static void test_bf16_tables(void)
{
    static const char *const units[] = {"auto", "avx512"};
    for (size_t i = 0; i < sizeof units / sizeof units[0]; i++) {
        char *argv[] = {"test_kernels", "--bf16-units", (char *)units[i], NULL};
        check_run_self(argv);
    }
}

static int bf16_table_main(const char *units)
{
#ifdef LOOM_HAVE_DNNL
    CHECK(loom_bf16_units_select(units) == LOOM_OK);
    const struct loom_kernels *t = loom_backend_kernels(loom_backend_cpu(), LOOM_DTYPE_BF16);
    if (loom_bf16_units() == LOOM_BF16_UNITS_F32) {
        printf("bf16 units %s: the CPU has none, the bf16 table is the float32 one\n", units);
        CHECK(t == loom_backend_cpu()->k);
    } else {
        CHECK(t != loom_backend_cpu()->k);
        char table[96];
        snprintf(table, sizeof table, "bf16 (%s: %s, %s)", units, loom_bf16_units_name(loom_bf16_units()),
                 loom_bf16_units_kernel());
        test_linear_sizes(t, table);
    }
#else
    printf("bf16 units %s: no oneDNN in this build, no bf16 table\n", units);
#endif
    return check_summary("test_kernels, bf16 table");
}

/* ---- attention --------------------------------------------------------------- */

static void test_attention_vs_ref(int B, int T, int C, int NH)
{
    const size_t nqkv = (size_t)B * T * 3 * C, nout = (size_t)B * T * C, natt = (size_t)B * NH * T * T;
    float *qkv = new_rand(nqkv, 2.0f);
    float *out = new_const(nout, NAN), *out_ref = new_const(nout, NAN);
    float *att = new_const(natt, NAN), *att_ref = new_const(natt, NAN);
    K->attention_forward(out, att, qkv, B, T, C, NH);
    REF->attention_forward(out_ref, att_ref, qkv, B, T, C, NH);
    char name[96];
    /* sums over up to T keys and over a head's C / NH channels (sum_tol of the longer) */
    const double tol = sum_tol(T > C / NH ? T : C / NH);
    snprintf(name, sizeof name, "attention out vs ref (B=%d T=%d C=%d NH=%d)", B, T, C, NH);
    check_scaled(name, out, out_ref, nout, tol);
    snprintf(name, sizeof name, "attention att vs ref (B=%d T=%d C=%d NH=%d)", B, T, C, NH);
    check_scaled(name, att, att_ref, natt, tol);
    /* probabilities: exact zeros above the diagonal, rows sum to 1 */
    int zeros_ok = 1, sums_ok = 1;
    for (size_t bh = 0; bh < (size_t)B * NH; bh++)
        for (int i = 0; i < T; i++) {
            const float *row = att + (bh * T + i) * T;
            double s = 0.0;
            for (int j = 0; j < T; j++) {
                if (j > i && row[j] != 0.0f) zeros_ok = 0;
                s += row[j];
            }
            if (fabs(s - 1.0) > 1e-5) sums_ok = 0; /* T <= 150 float32 terms: ~T u = 9e-6 worst */
        }
    CHECK(zeros_ok);
    CHECK(sums_ok);

    float *dout = new_rand(nout, 1.0f);
    float *dqkv = new_const(nqkv, NAN), *dqkv_ref = new_const(nqkv, NAN);
    float *datt = new_const(natt, NAN), *datt_ref = new_const(natt, NAN);
    K->attention_backward(dqkv, datt, dout, att, qkv, B, T, C, NH);
    REF->attention_backward(dqkv_ref, datt_ref, dout, att_ref, qkv, B, T, C, NH);
    snprintf(name, sizeof name, "attention dqkv vs ref (B=%d T=%d C=%d NH=%d)", B, T, C, NH);
    check_scaled(name, dqkv, dqkv_ref, nqkv, tol);
    free(qkv), free(out), free(out_ref), free(att), free(att_ref), free(dout), free(dqkv);
    free(dqkv_ref), free(datt), free(datt_ref);
}

struct attention_ctx {
    float *qkv, *out, *att, *wout;
    int B, T, C, NH;
};

static double attention_obj(void *p)
{
    struct attention_ctx *c = p;
    K->attention_forward(c->out, c->att, c->qkv, c->B, c->T, c->C, c->NH);
    return dot(c->out, c->wout, (size_t)c->B * c->T * c->C);
}

static void test_attention_fd(void)
{
    const int B = 2, T = 7, C = 12, NH = 3;
    struct attention_ctx c = {new_rand(B * T * 3 * C, 1.0f),
                              new_const(B * T * C, 0.0f),
                              new_const(B * NH * T * T, 0.0f),
                              new_rand(B * T * C, 1.0f),
                              B,
                              T,
                              C,
                              NH};
    attention_obj(&c);
    float *dqkv = new_const(B * T * 3 * C, NAN), *datt = new_const(B * NH * T * T, NAN);
    float *att = new_copy(c.att, B * NH * T * T);
    K->attention_backward(dqkv, datt, c.wout, att, c.qkv, B, T, C, NH);
    fd_check("attention dqkv vs fd", dqkv, c.qkv, B * T * 3 * C, attention_obj, &c);
    free(c.qkv), free(c.out), free(c.att), free(c.wout), free(dqkv), free(datt), free(att);
}

/* ---- layernorm --------------------------------------------------------------- */

struct layernorm_ctx {
    float *inp, *w, *b, *out, *mean, *rstd, *wout;
    int N, C;
    float eps;
};

static double layernorm_obj(void *p)
{
    struct layernorm_ctx *c = p;
    K->layernorm_forward(c->out, c->mean, c->rstd, c->inp, c->w, c->b, c->N, c->C, c->eps);
    return dot(c->out, c->wout, (size_t)c->N * c->C);
}

/* eps: GPT-2's 1e-5, and a large one whose effect the checks would see */
static void test_layernorm(float eps)
{
    printf("layernorm, eps %g\n", eps);
    const int N = 6, C = 10;
    struct layernorm_ctx c = {new_rand(N * C, 2.0f),
                              new_rand(C, 1.0f),
                              new_rand(C, 1.0f),
                              new_const(N * C, 0.0f),
                              new_const(N, 0.0f),
                              new_const(N, 0.0f),
                              new_rand(N * C, 1.0f),
                              N,
                              C,
                              eps};
    layernorm_obj(&c);
    /* forward against a double computation */
    float *want = malloc(N * C * sizeof(float)), *want_mean = malloc(N * sizeof(float)),
          *want_rstd = malloc(N * sizeof(float));
    for (int i = 0; i < N; i++) {
        const float *x = c.inp + i * C;
        double m = 0.0, v = 0.0;
        for (int j = 0; j < C; j++) m += x[j];
        m /= C;
        for (int j = 0; j < C; j++) v += (x[j] - m) * (x[j] - m);
        const double rs = 1.0 / sqrt(v / C + (double)eps);
        for (int j = 0; j < C; j++) want[i * C + j] = (float)((x[j] - m) * rs * c.w[j] + c.b[j]);
        want_mean[i] = (float)m;
        want_rstd[i] = (float)rs;
    }
    /* C-term mean and variance in float, then elementwise: a few roundings
     * at these C (<= 64; 1e-6 = 17 u of the scale); measured 9.9e-8 */
    check_scaled("layernorm out vs double", c.out, want, N * C, 1e-6);
    check_scaled("layernorm mean vs double", c.mean, want_mean, N, 1e-6);
    check_scaled("layernorm rstd vs double", c.rstd, want_rstd, N, 1e-6);

    /* backward: everything accumulates onto random prior contents */
    float *dinp0 = new_rand(N * C, 1.0f), *dw0 = new_rand(C, 1.0f), *db0 = new_rand(C, 1.0f);
    float *dinp = new_copy(dinp0, N * C), *dw = new_copy(dw0, C), *db = new_copy(db0, C);
    K->layernorm_backward(dinp, dw, db, c.wout, c.inp, c.w, c.mean, c.rstd, N, C);
    sub(dinp, dinp, dinp0, N * C), sub(dw, dw, dw0, C), sub(db, db, db0, C);
    fd_check("layernorm dinp vs fd", dinp, c.inp, N * C, layernorm_obj, &c);
    fd_check("layernorm dweight vs fd", dw, c.w, C, layernorm_obj, &c);
    fd_check("layernorm dbias vs fd", db, c.b, C, layernorm_obj, &c);
    free(c.inp), free(c.w), free(c.b), free(c.out), free(c.mean), free(c.rstd), free(c.wout);
    free(want), free(want_mean), free(want_rstd), free(dinp0), free(dw0), free(db0), free(dinp);
    free(dw), free(db);
}

/* The reduction over rows at 1 and 2 threads and at a size that takes the
 * parallel path: same values up to the summation order. */
static void test_layernorm_threads(void)
{
    const int N = 300, C = 200;
    float *inp = new_rand((size_t)N * C, 2.0f), *w = new_rand(C, 1.0f), *b = new_rand(C, 1.0f);
    float *out = new_const((size_t)N * C, 0.0f), *mean = new_const(N, 0), *rstd = new_const(N, 0);
    float *dout = new_rand((size_t)N * C, 1.0f);
    K->layernorm_forward(out, mean, rstd, inp, w, b, N, C, 1e-5f);
    float *res[2][3];
    const int saved = get_threads();
    for (int k = 0; k < 2; k++) {
        set_threads(k + 1);
        res[k][0] = new_const((size_t)N * C, 0.0f);
        res[k][1] = new_const(C, 0.0f);
        res[k][2] = new_const(C, 0.0f);
        K->layernorm_backward(res[k][0], res[k][1], res[k][2], dout, inp, w, mean, rstd, N, C);
    }
    set_threads(saved);
    CHECK(memcmp(res[0][0], res[1][0], (size_t)N * C * sizeof(float)) == 0); /* per row */
    /* sums over N rows split at another place: sum_tol(N) (measured 0: the
     * reduction's order is fixed) */
    check_scaled("layernorm dweight 1 vs 2 threads", res[1][1], res[0][1], C, sum_tol(N));
    check_scaled("layernorm dbias 1 vs 2 threads", res[1][2], res[0][2], C, sum_tol(N));
    free(inp), free(w), free(b), free(out), free(mean), free(rstd), free(dout);
    for (int k = 0; k < 2; k++)
        for (int j = 0; j < 3; j++) free(res[k][j]);
}

/* ---- embedding --------------------------------------------------------------- */

struct embedding_ctx {
    int32_t *tokens;
    float *wte, *wpe, *out, *wout;
    int B, T, C;
};

static double embedding_obj(void *p)
{
    struct embedding_ctx *c = p;
    K->embedding_forward(c->out, c->tokens, c->wte, c->wpe, c->B, c->T, c->C);
    return dot(c->out, c->wout, (size_t)c->B * c->T * c->C);
}

static void test_embedding(void)
{
    const int B = 3, T = 5, C = 7, V = 6, maxT = 8; /* 15 tokens over 6 ids: repeats */
    int32_t tokens[3 * 5];
    for (int i = 0; i < B * T; i++) tokens[i] = (int32_t)(rng_next() % V);
    tokens[0] = tokens[1] = tokens[7] = 2;
    struct embedding_ctx c = {tokens,
                              new_rand(V * C, 1.0f),
                              new_rand(maxT * C, 1.0f),
                              new_const(B * T * C, 0.0f),
                              new_rand(B * T * C, 1.0f),
                              B,
                              T,
                              C};
    embedding_obj(&c);
    int fwd_ok = 1;
    for (int b = 0; b < B; b++)
        for (int t = 0; t < T; t++)
            for (int j = 0; j < C; j++)
                if (c.out[(b * T + t) * C + j] != c.wte[tokens[b * T + t] * C + j] + c.wpe[t * C + j])
                    fwd_ok = 0;
    CHECK(fwd_ok);
    float *dwte0 = new_rand(V * C, 1.0f), *dwpe0 = new_rand(maxT * C, 1.0f);
    float *dwte = new_copy(dwte0, V * C), *dwpe = new_copy(dwpe0, maxT * C);
    K->embedding_backward(dwte, dwpe, c.wout, tokens, B, T, C);
    sub(dwte, dwte, dwte0, V * C), sub(dwpe, dwpe, dwpe0, maxT * C);
    fd_check("embedding dwte vs fd", dwte, c.wte, V * C, embedding_obj, &c);
    fd_check("embedding dwpe vs fd", dwpe, c.wpe, maxT * C, embedding_obj, &c);
    free(c.wte), free(c.wpe), free(c.out), free(c.wout), free(dwte0), free(dwpe0), free(dwte);
    free(dwpe);
}

/* Column bands: the same bits at any thread count, at a size that takes
 * the parallel path. */
static void test_embedding_threads(void)
{
    const int B = 4, T = 64, C = 200, V = 50;
    int32_t *tokens = malloc((size_t)B * T * sizeof(int32_t));
    for (int i = 0; i < B * T; i++) tokens[i] = (int32_t)(rng_next() % V);
    float *dout = new_rand((size_t)B * T * C, 1.0f);
    float *dwte[2], *dwpe[2];
    const int saved = get_threads();
    for (int k = 0; k < 2; k++) {
        set_threads(k + 1);
        dwte[k] = new_const((size_t)V * C, 0.0f);
        dwpe[k] = new_const((size_t)T * C, 0.0f);
        K->embedding_backward(dwte[k], dwpe[k], dout, tokens, B, T, C);
    }
    set_threads(saved);
    CHECK(memcmp(dwte[0], dwte[1], (size_t)V * C * sizeof(float)) == 0);
    CHECK(memcmp(dwpe[0], dwpe[1], (size_t)T * C * sizeof(float)) == 0);
    free(tokens), free(dout), free(dwte[0]), free(dwte[1]), free(dwpe[0]), free(dwpe[1]);
}

/* ---- vocabulary-parallel embedding and cross-entropy ---------------------------- */

/* Shard r of S of a vocabulary of V: rows [v0, v0 + Vl), v0 = r*V/S, so
 * the shards are uneven when S does not divide V. */
static void shard_of(int r, int S, int V, int *v0, int *Vl)
{
    *v0 = (int)((int64_t)r * V / S);
    *Vl = (int)((int64_t)(r + 1) * V / S) - *v0;
}

/* The ids at the borders of every shard of the 2- and 3-way splits (v0-1,
 * v0, v0+Vl-1, v0+Vl, within [0, V)) into ids; returns how many (20). */
static int border_ids(int32_t *ids, int V)
{
    int n = 0;
    for (int S = 2; S <= 3; S++)
        for (int r = 0; r < S; r++) {
            int v0, Vl;
            shard_of(r, S, V, &v0, &Vl);
            const int b[4] = {v0 - 1, v0, v0 + Vl - 1, v0 + Vl};
            for (int k = 0; k < 4; k++) ids[n++] = b[k] < 0 ? 0 : b[k] >= V ? V - 1 : b[k];
        }
    return n;
}

/* Split S ways, the embedding summed over the shards (wpe on shard 0 only)
 * is the unsplit one, exactly; the shards' dwte concatenated are the
 * unsplit dwte and every shard's dwpe is the unsplit dwpe, exactly, onto
 * random prior contents. S = 1 is the unsplit kernel itself, bit for bit. */
static void test_embedding_vp(int B, int T, int C)
{
    const int V = 97, maxT = T + 3, n = B * T;
    const size_t nout = (size_t)n * C;
    int32_t *tokens = malloc(n * sizeof(int32_t));
    for (int i = 0; i < n; i++) tokens[i] = (int32_t)(rng_next() % V);
    int32_t borders[20];
    const int nb = border_ids(borders, V);
    for (int i = 0; i < nb && i < n; i++) tokens[(size_t)i * n / nb] = borders[i]; /* spread over (b,t) */
    float *wte = new_rand((size_t)V * C, 1.0f), *wpe = new_rand((size_t)maxT * C, 1.0f);
    float *dout = new_rand(nout, 1.0f);
    float *dwte0 = new_rand((size_t)V * C, 1.0f), *dwpe0 = new_rand((size_t)maxT * C, 1.0f);
    float *out = new_const(nout, NAN), *dwte = new_copy(dwte0, (size_t)V * C);
    float *dwpe = new_copy(dwpe0, (size_t)maxT * C);
    K->embedding_forward(out, tokens, wte, wpe, B, T, C);
    K->embedding_backward(dwte, dwpe, dout, tokens, B, T, C);

    float *sum = malloc(nout * sizeof(float)), *part = malloc(nout * sizeof(float));
    float *cat = malloc((size_t)V * C * sizeof(float)), *dwpe_r = malloc((size_t)maxT * C * sizeof(float));
    for (int S = 1; S <= 3; S++) {
        int fwd_ok = 1, zero_ok = 1, dwpe_ok = 1, skip_ok = 1;
        for (size_t i = 0; i < nout; i++) sum[i] = 0.0f;
        for (int r = 0; r < S; r++) {
            int v0, Vl;
            shard_of(r, S, V, &v0, &Vl);
            const float *wte_r = wte + (size_t)v0 * C;
            float *dwte_r = cat + (size_t)v0 * C;
            for (size_t i = 0; i < nout; i++) part[i] = NAN;
            K->embedding_vp_forward(part, tokens, wte_r, r == 0 ? wpe : NULL, v0, Vl, B, T, C);
            for (size_t i = 0; i < nout; i++) sum[i] += part[i];
            /* without wpe, the rows of the other shards' tokens are zeros */
            for (int i = 0; r > 0 && i < n; i++)
                for (int c = 0; c < C; c++) {
                    const int mine = tokens[i] >= v0 && tokens[i] < v0 + Vl;
                    const float want = mine ? wte[(size_t)tokens[i] * C + c] : 0.0f;
                    if (part[(size_t)i * C + c] != want) zero_ok = 0;
                }
            memcpy(dwte_r, dwte0 + (size_t)v0 * C, (size_t)Vl * C * sizeof(float));
            memcpy(dwpe_r, dwpe0, (size_t)maxT * C * sizeof(float));
            K->embedding_vp_backward(dwte_r, dwpe_r, dout, tokens, v0, Vl, B, T, C);
            if (memcmp(dwpe_r, dwpe, (size_t)maxT * C * sizeof(float)) != 0) dwpe_ok = 0;
            /* NULL skips: dwte alone, dwpe alone */
            float *a = new_copy(dwte0 + (size_t)v0 * C, (size_t)Vl * C),
                  *b = new_copy(dwpe0, (size_t)maxT * C);
            K->embedding_vp_backward(a, NULL, dout, tokens, v0, Vl, B, T, C);
            K->embedding_vp_backward(NULL, b, dout, tokens, v0, Vl, B, T, C);
            if (memcmp(a, dwte_r, (size_t)Vl * C * sizeof(float)) != 0) skip_ok = 0;
            if (memcmp(b, dwpe, (size_t)maxT * C * sizeof(float)) != 0) skip_ok = 0;
            free(a), free(b);
        }
        for (size_t i = 0; i < nout; i++)
            if (sum[i] != out[i] || (S == 1 && memcmp(&sum[i], &out[i], sizeof(float)) != 0)) fwd_ok = 0;
        printf("embedding, vocabulary split %d ways (B=%d T=%d C=%d V=%d)\n", S, B, T, C, V);
        CHECK(fwd_ok);
        CHECK(zero_ok);
        CHECK(memcmp(cat, dwte, (size_t)V * C * sizeof(float)) == 0);
        CHECK(dwpe_ok);
        CHECK(skip_ok);
    }
    /* one rank without wpe: the token rows alone */
    float *bare = new_const(nout, NAN);
    K->embedding_vp_forward(bare, tokens, wte, NULL, 0, V, B, T, C);
    int bare_ok = 1;
    for (int i = 0; i < n; i++)
        if (memcmp(bare + (size_t)i * C, wte + (size_t)tokens[i] * C, C * sizeof(float)) != 0) bare_ok = 0;
    CHECK(bare_ok);
    free(tokens), free(wte), free(wpe), free(dout), free(dwte0), free(dwpe0), free(out), free(dwte);
    free(dwpe), free(sum), free(part), free(cat), free(dwpe_r), free(bare);
}

/* ---- Llama's kernels: RMSNorm, rotary embedding, SwiGLU -------------------- */

struct rmsnorm_ctx {
    float *inp, *w, *out, *rstd, *wout;
    int N, C;
    float eps;
};

static double rmsnorm_obj(void *p)
{
    struct rmsnorm_ctx *c = p;
    K->rmsnorm_forward(c->out, c->rstd, c->inp, c->w, c->N, c->C, c->eps);
    return dot(c->out, c->wout, (size_t)c->N * c->C);
}

static void test_rmsnorm(void)
{
    printf("rmsnorm\n");
    const int N = 6, C = 10;
    struct rmsnorm_ctx c = {new_rand(N * C, 2.0f),
                            new_rand(C, 1.0f),
                            new_const(N * C, 0.0f),
                            new_const(N, 0.0f),
                            new_rand(N * C, 1.0f),
                            N,
                            C,
                            1e-5f};
    rmsnorm_obj(&c);
    float *want = malloc(N * C * sizeof(float));
    for (int i = 0; i < N; i++) { /* forward against a double computation */
        const float *x = c.inp + i * C;
        double ss = 0;
        for (int j = 0; j < C; j++) ss += (double)x[j] * x[j];
        const double r = 1.0 / sqrt(ss / C + 1e-5);
        for (int j = 0; j < C; j++) want[i * C + j] = (float)(x[j] * r * c.w[j]);
    }
    check_scaled("rmsnorm out vs double", c.out, want, N * C, 1e-6); /* as layernorm's: measured 8.6e-8 */
    /* backward: accumulates onto random prior contents */
    float *dinp0 = new_rand(N * C, 1.0f), *dw0 = new_rand(C, 1.0f);
    float *dinp = new_copy(dinp0, N * C), *dw = new_copy(dw0, C);
    K->rmsnorm_backward(dinp, dw, c.wout, c.inp, c.w, c.rstd, N, C);
    sub(dinp, dinp, dinp0, N * C), sub(dw, dw, dw0, C);
    fd_check("rmsnorm dinp vs fd", dinp, c.inp, N * C, rmsnorm_obj, &c);
    fd_check("rmsnorm dweight vs fd", dw, c.w, C, rmsnorm_obj, &c);
    free(c.inp), free(c.w), free(c.out), free(c.rstd), free(c.wout), free(want), free(dinp0), free(dw0);
    free(dinp), free(dw);
}

struct rope_ctx {
    float *inp, *out, *wout;
    int B, T, H, D;
    float theta;
};

static double rope_obj(void *p)
{
    struct rope_ctx *c = p;
    const size_t n = (size_t)c->B * c->T * c->H * c->D;
    memcpy(c->out, c->inp, n * sizeof(float));
    K->rope_forward(c->out, c->B, c->T, c->H, c->D, c->theta);
    return dot(c->out, c->wout, n);
}

static void test_rope(void)
{
    printf("rope\n");
    const int B = 2, T = 5, H = 3, D = 8;
    const size_t n = (size_t)B * T * H * D;
    struct rope_ctx c = {new_rand(n, 1.0f), new_const(n, 0.0f), new_rand(n, 1.0f), B, T, H, D, 10000.0f};
    rope_obj(&c);
    /* forward against Hugging Face's formula in double: rotate_half, angle t / theta^(2j/D) */
    float *want = malloc(n * sizeof(float));
    for (int b = 0; b < B; b++)
        for (int t = 0; t < T; t++)
            for (int h = 0; h < H; h++) {
                const float *x = c.inp + (((size_t)b * T + t) * H + h) * D;
                float *y = want + (((size_t)b * T + t) * H + h) * D;
                for (int j = 0; j < D; j++) {
                    const int k = j % (D / 2);
                    const double a = t / pow(10000.0, 2.0 * k / D);
                    const double rot = j < D / 2 ? -x[j + D / 2] : x[j - D / 2];
                    y[j] = (float)(x[j] * cos(a) + rot * sin(a));
                }
            }
    /* float cos / sin of angles up to T: the angle's rounding (u t) moves
     * the result by up to u T of the scale; measured 1.0e-7 */
    check_scaled("rope out vs double", c.out, want, n, 1e-5);
    /* position 0 is the identity */
    CHECK(memcmp(c.out, c.inp, (size_t)H * D * sizeof(float)) == 0);
    /* backward: the gradient rotated back, against finite differences */
    float *grad = new_copy(c.wout, n);
    K->rope_backward(grad, B, T, H, D, c.theta);
    fd_check("rope dinp vs fd", grad, c.inp, n, rope_obj, &c);
    /* at given positions: rows of sequence 1 placed out of order (as a
     * context-parallel rank holds them) give the bits of their place */
    rope_obj(&c);
    float *at = new_copy(c.inp + (size_t)T * H * D, (size_t)T * H * D),
          *dat = new_copy(at, (size_t)T * H * D);
    int32_t pos[5] = {3, 4, 0, 1, 2};
    for (int t = 0; t < T; t++)
        memcpy(at + (size_t)t * H * D, c.inp + ((size_t)T + pos[t]) * H * D, (size_t)H * D * sizeof(float));
    memcpy(dat, at, (size_t)T * H * D * sizeof(float));
    K->rope_forward_at(at, pos, T, H, D, c.theta);
    float *bwd = new_copy(c.wout, n);
    K->rope_backward(bwd, B, T, H, D, c.theta);
    for (int t = 0; t < T; t++)
        memcpy(dat + (size_t)t * H * D, c.wout + ((size_t)T + pos[t]) * H * D, (size_t)H * D * sizeof(float));
    K->rope_backward_at(dat, pos, T, H, D, c.theta);
    int same = 1;
    for (int t = 0; t < T; t++)
        same &= memcmp(at + (size_t)t * H * D, c.out + ((size_t)T + pos[t]) * H * D,
                       (size_t)H * D * sizeof(float)) == 0 &&
                memcmp(dat + (size_t)t * H * D, bwd + ((size_t)T + pos[t]) * H * D,
                       (size_t)H * D * sizeof(float)) == 0;
    CHECK(same);
    free(at), free(dat), free(bwd);
    free(c.inp), free(c.out), free(c.wout), free(want), free(grad);
}

/* A mixture of experts' router against the _ref (double, from the logits
 * alone), with and without pre-softmax, the balancing loss's and the
 * z-loss's gradients; logits spaced so no top k ties (the choice is then
 * the same in both). The permutation and its backward against plain loops.
 * float32 sums over E <= 8 terms: within 1e-6 relative to the largest. */
static void test_moe_router(int N, int E, int k, int pre)
{
    printf("moe router N=%d E=%d k=%d pre_softmax=%d\n", N, E, k, pre);
    float *logits = new_rand((size_t)N * E, 2.0f);
    for (size_t i = 0; i < (size_t)N * E; i++) logits[i] += (float)(i % (size_t)E) * 1e-3f; /* no ties */
    float *p = new_const((size_t)N * k, NAN), *p_ref = new_const((size_t)N * k, NAN);
    int32_t *ix = malloc(sizeof(int32_t) * (size_t)N * k), *ix_ref = malloc(sizeof(int32_t) * (size_t)N * k);
    float *lse = new_const((size_t)N, NAN), *lse_ref = new_const((size_t)N, NAN);
    float *sum = new_const((size_t)E, NAN), *sum_ref = new_const((size_t)E, NAN);
    K->moe_router_forward(p, ix, lse, sum, logits, N, E, k, pre);
    loom_moe_router_forward_ref(p_ref, ix_ref, lse_ref, sum_ref, logits, N, E, k, pre);
    CHECK(memcmp(ix, ix_ref, sizeof(int32_t) * (size_t)N * k) == 0);
    check_scaled("routing weights", p, p_ref, (size_t)N * k, 1e-6);
    check_scaled("lse", lse, lse_ref, (size_t)N, 1e-6);
    check_scaled("softmax sums", sum, sum_ref, (size_t)E, 1e-6);
    float *dp = new_rand((size_t)N * k, 1.0f), *aux = new_rand((size_t)E, 0.5f);
    float *dl = new_const((size_t)N * E, NAN), *dl_ref = new_const((size_t)N * E, NAN);
    K->moe_router_backward(dl, dp, p, ix, lse, logits, aux, 0.25f, N, E, k, pre);
    loom_moe_router_backward_ref(dl_ref, dp, p, ix, lse, logits, aux, 0.25f, N, E, k, pre);
    check_scaled("router logits' gradient", dl, dl_ref, (size_t)N * E, 1e-6);
    K->moe_router_backward(dl, dp, p, ix, lse, logits, NULL, 0.0f, N, E, k, pre);
    loom_moe_router_backward_ref(dl_ref, dp, p, ix, lse, logits, NULL, 0.0f, N, E, k, pre);
    check_scaled("... without the balancing losses", dl, dl_ref, (size_t)N * E, 1e-6);
    /* the permutation: places expert-major, a dropped choice (-1) skipped */
    const int C = 5;
    int32_t *pos = malloc(sizeof(int32_t) * (size_t)N * k);
    int M = 0;
    for (int e = 0; e < E; e++)
        for (int i = 0; i < N * k; i++)
            if (ix[i] == e) pos[i] = i % 7 == 3 ? -1 : M++;
    float *x = new_rand((size_t)N * C, 1.0f), *xp = new_const((size_t)M * C, NAN),
          *out = new_const((size_t)N * C, NAN);
    float *want = new_const((size_t)N * C, 0.0f);
    K->moe_permute_forward(xp, x, pos, N, k, C);
    K->moe_unpermute_forward(out, xp, p, pos, N, k, C);
    for (int n = 0; n < N; n++)
        for (int j = 0; j < k; j++)
            for (int c = 0; c < C; c++)
                if (pos[n * k + j] >= 0) want[n * C + c] += p[n * k + j] * x[n * C + c];
    check_scaled("dispatch then combine: each row times its kept weights", out, want, (size_t)N * C, 1e-6);
    float *dout = new_rand((size_t)N * C, 1.0f), *dy = new_const((size_t)M * C, NAN),
          *dpr = new_const((size_t)N * k, NAN);
    float *dx = new_const((size_t)N * C, NAN), *dpr_want = new_const((size_t)N * k, 0.0f),
          *dx_want = new_const((size_t)N * C, 0.0f);
    K->moe_unpermute_backward(dy, dpr, dout, xp, p, pos, N, k, C);
    K->moe_permute_backward(dx, dy, pos, N, k, C);
    for (int n = 0; n < N; n++)
        for (int j = 0; j < k; j++)
            for (int c = 0; c < C; c++)
                if (pos[n * k + j] >= 0) {
                    dpr_want[n * k + j] += dout[n * C + c] * x[n * C + c];
                    dx_want[n * C + c] += p[n * k + j] * dout[n * C + c];
                }
    check_scaled("combine's backward: the routing weights' gradient", dpr, dpr_want, (size_t)N * k, 1e-6);
    check_scaled("dispatch's backward: each row's gradient", dx, dx_want, (size_t)N * C, 1e-6);
    free(logits), free(p), free(p_ref), free(ix), free(ix_ref), free(lse), free(lse_ref), free(sum),
        free(sum_ref);
    free(dp), free(aux), free(dl), free(dl_ref), free(pos), free(x), free(xp), free(out), free(want),
        free(dout);
    free(dy), free(dpr), free(dx), free(dpr_want), free(dx_want);
}

struct swiglu_ctx {
    float *gate, *up, *out, *wout;
    size_t n;
};

static double swiglu_obj(void *p)
{
    struct swiglu_ctx *c = p;
    K->swiglu_forward(c->out, c->gate, c->up, c->n);
    return dot(c->out, c->wout, c->n);
}

static void test_swiglu(void)
{
    printf("swiglu\n");
    const size_t n = 40;
    struct swiglu_ctx c = {new_rand(n, 4.0f), new_rand(n, 2.0f), new_const(n, 0.0f), new_rand(n, 1.0f), n};
    swiglu_obj(&c);
    float *want = malloc(n * sizeof(float));
    for (size_t i = 0; i < n; i++) want[i] = (float)(c.gate[i] / (1.0 + exp(-(double)c.gate[i])) * c.up[i]);
    check_scaled("swiglu out vs double", c.out, want, n, 1e-6); /* elementwise: measured 3.4e-8 */
    float *dg = new_const(n, NAN), *du = new_const(n, NAN);     /* written, not accumulated */
    K->swiglu_backward(dg, du, c.wout, c.gate, c.up, n);
    fd_check("swiglu dgate vs fd", dg, c.gate, n, swiglu_obj, &c);
    fd_check("swiglu dup vs fd", du, c.up, n, swiglu_obj, &c);
    free(c.gate), free(c.up), free(c.out), free(c.wout), free(want), free(dg), free(du);
}

/* ---- GELU, residual ------------------------------------------------------------ */

/* 0.5 x (1 + tanh(u)) as x / (1 + exp(-2u)): the same function, without
 * 1 + tanh's cancellation in double for x < -4 */
static double gelu_double(double x)
{
    return x / (1.0 + exp(-2.0 * sqrt(2.0 / M_PI) * (x + 0.044715 * x * x * x)));
}

/* A float GELU's error at x against the double formula (want, derivative
 * dwant), in units of what its rounding allows there: u = 2^-24 times
 * |want| times (1 + the condition number |x gelu'(x) / gelu(x)|). The
 * kernels compute an argument (t = -2 sqrt(2/pi) (x + 0.044715 x^3), or
 * x / sqrt 2) in a few float roundings and take exp or erfc of it: a
 * relative error d in the argument becomes about cond x d in the result
 * (cond reaches 13 at x = -3.2, where gelu = -1e-3, and 170 at x = -9),
 * and exp / erfc add an ulp or two. So the error is a few of these units
 * whatever the libm, the vector width or FMA contraction (measured here:
 * 3.0 for the tanh form, 2.1 for the erf form, over [-10, 10]; a fixed
 * 1e-6 relative held with 1.04x to spare); the bound is GELU_UNITS. An absolute 1e-30 covers the far tail (x
 * < -9.3), where exp's argument is capped and the result is 0 to float's range. A wrong formula errs by 1e-4
 * of the value (the tanh form vs the erf one) or more: thousands of units. */
#define GELU_UNITS 16.0
static double gelu_units(float got, double want, double dwant, double x)
{
    const double cond = want != 0.0 ? fabs(x * dwant / want) : 0.0;
    return fabs(got - want) / ((1.0 + cond) * 0x1p-24 * fabs(want) + 1e-30 / GELU_UNITS);
}

struct unary_ctx {
    float *inp, *out, *wout;
    size_t n;
};

static double gelu_obj(void *p)
{
    struct unary_ctx *c = p;
    K->gelu_forward(c->out, c->inp, c->n);
    return dot(c->out, c->wout, c->n);
}

static void test_gelu(void)
{
    /* accuracy over a sweep, per element, against the double formula:
     * relative where |gelu| >= 1e-3, absolute 1e-9 below (x < -4.3, where
     * the float formula itself is only absolutely accurate) */
    const size_t n = 40001;
    float *x = malloc(n * sizeof(float)), *y = malloc(n * sizeof(float));
    for (size_t i = 0; i < n; i++) x[i] = -10.0f + 20.0f * (float)i / (float)(n - 1);
    K->gelu_forward(y, x, n);
    double max_rel = 0.0, max_abs_small = 0.0, max_units = 0.0;
    for (size_t i = 0; i < n; i++) {
        const double want = gelu_double(x[i]), err = fabs(y[i] - want);
        if (fabs(want) >= 1e-3) {
            if (err / fabs(want) > max_rel) max_rel = err / fabs(want);
        } else if (err > max_abs_small) {
            max_abs_small = err;
        }
        /* gelu' through s = 1 / (1 + e), 1 - s = e s: no 1 - tanh^2 cancellation */
        const double xd = x[i], k = sqrt(2.0 / M_PI), u = k * (xd + 0.044715 * xd * xd * xd);
        const double e = exp(-2.0 * u), sg = 1.0 / (1.0 + e);
        const double dwant = sg + 2.0 * xd * sg * (e * sg) * k * (1.0 + 3.0 * 0.044715 * xd * xd);
        const double units = gelu_units(y[i], want, dwant, xd);
        if (units > max_units) max_units = units;
    }
    printf("gelu vs double on [-10,10]: max rel err %.3g (|gelu| >= 1e-3), max abs err %.3g "
           "below; %.3g units of its rounding (bound %g)\n",
           max_rel, max_abs_small, max_units, GELU_UNITS);
    CHECK(max_units <= GELU_UNITS);
    /* gradient sweep against the derivative in double */
    float *ones = new_const(n, 1.0f), *g = malloc(n * sizeof(float));
    K->gelu_backward(g, ones, x, n);
    double max_grad_err = 0.0;
    for (size_t i = 0; i < n; i++) {
        const double xd = x[i], k = sqrt(2.0 / M_PI), u = k * (xd + 0.044715 * xd * xd * xd);
        const double th = tanh(u);
        const double want =
            0.5 * (1.0 + th) + 0.5 * xd * (1.0 - th * th) * k * (1.0 + 3.0 * 0.044715 * xd * xd);
        const double err = fabs(g[i] - want); /* gelu' lies in [-0.17, 1.13] */
        if (err > max_grad_err) max_grad_err = err;
    }
    printf("gelu' vs double on [-10,10]: max abs err %.3g\n", max_grad_err);
    /* gelu' is O(1) where it is not tiny: a few float roundings of the
     * same exp, 17 u absolute (measured 1.8e-7 here, 1.2e-7 for the erf form) */
    CHECK(max_grad_err <= 1e-6);
    /* special values: NaN propagates, no NaN from far-negative inputs */
    float sx[4] = {NAN, -200.0f, 200.0f, 0.0f}, sy[4], sg[4], sd[4] = {1, 1, 1, 1};
    K->gelu_forward(sy, sx, 4);
    K->gelu_backward(sg, sd, sx, 4);
    CHECK(isnan(sy[0]) && isnan(sg[0]));
    CHECK(fabsf(sy[1]) < 1e-20f && fabsf(sg[1]) < 1e-20f); /* ~0, and not NaN */
    CHECK(sy[2] == 200.0f && sg[2] == 1.0f);
    CHECK(sy[3] == 0.0f && sg[3] == 0.5f);
    free(x), free(y), free(ones), free(g);

    /* finite differences; dinp is written (NaN prior) */
    struct unary_ctx c = {new_rand(64, 4.0f), new_const(64, 0.0f), new_rand(64, 1.0f), 64};
    float *dinp = new_const(64, NAN);
    K->gelu_backward(dinp, c.wout, c.inp, 64);
    fd_check("gelu dinp vs fd", dinp, c.inp, 64, gelu_obj, &c);
    free(c.inp), free(c.out), free(c.wout), free(dinp);
}

static double gelu_exact_obj(void *p)
{
    struct unary_ctx *c = p;
    K->gelu_exact_forward(c->out, c->inp, c->n);
    return dot(c->out, c->wout, c->n);
}

/* The exact (erf) form against its double formula, x Phi(x), and its
 * derivative Phi(x) + x phi(x); against the tanh form, which differs by up
 * to ~5e-4 (so a swapped kernel fails). */
static void test_gelu_exact(void)
{
    const size_t n = 40001;
    float *x = malloc(n * sizeof(float)), *y = malloc(n * sizeof(float)), *yt = malloc(n * sizeof(float));
    float *ones = new_const(n, 1.0f), *g = malloc(n * sizeof(float));
    for (size_t i = 0; i < n; i++) x[i] = -10.0f + 20.0f * (float)i / (float)(n - 1);
    K->gelu_exact_forward(y, x, n);
    K->gelu_forward(yt, x, n);
    K->gelu_exact_backward(g, ones, x, n);
    double max_rel = 0.0, max_abs_small = 0.0, max_grad_err = 0.0, max_tanh_diff = 0.0, max_units = 0.0;
    for (size_t i = 0; i < n; i++) {
        const double xd = x[i], cdf = 0.5 * erfc(-xd / sqrt(2.0));
        const double want = xd * cdf, err = fabs(y[i] - want);
        if (fabs(want) >= 1e-3) {
            if (err / fabs(want) > max_rel) max_rel = err / fabs(want);
        } else if (err > max_abs_small) {
            max_abs_small = err;
        }
        const double dwant = cdf + xd * exp(-0.5 * xd * xd) / sqrt(2.0 * M_PI);
        const double units = gelu_units(y[i], want, dwant, xd);
        if (units > max_units) max_units = units;
        if (fabs(g[i] - dwant) > max_grad_err) max_grad_err = fabs(g[i] - dwant);
        if (fabs(yt[i] - y[i]) > max_tanh_diff) max_tanh_diff = fabs(yt[i] - y[i]);
    }
    printf("exact gelu vs double on [-10,10]: max rel err %.3g (|gelu| >= 1e-3), max abs err %.3g below; "
           "gelu' max abs err %.3g; tanh form differs by up to %.3g; %.3g units of its rounding (bound %g)\n",
           max_rel, max_abs_small, max_grad_err, max_tanh_diff, max_units, GELU_UNITS);
    CHECK(max_units <= GELU_UNITS);
    CHECK(max_grad_err <= 1e-6);
    CHECK(max_tanh_diff > 1e-4);
    float sx[4] = {NAN, -200.0f, 200.0f, 0.0f}, sy[4], sg[4], sd[4] = {1, 1, 1, 1};
    K->gelu_exact_forward(sy, sx, 4);
    K->gelu_exact_backward(sg, sd, sx, 4);
    CHECK(isnan(sy[0]) && isnan(sg[0]));
    CHECK(fabsf(sy[1]) < 1e-20f && fabsf(sg[1]) < 1e-20f);
    CHECK(sy[2] == 200.0f && sg[2] == 1.0f);
    CHECK(sy[3] == 0.0f && sg[3] == 0.5f);
    free(x), free(y), free(yt), free(ones), free(g);

    struct unary_ctx c = {new_rand(64, 4.0f), new_const(64, 0.0f), new_rand(64, 1.0f), 64};
    float *dinp = new_const(64, NAN);
    K->gelu_exact_backward(dinp, c.wout, c.inp, 64);
    fd_check("exact gelu dinp vs fd", dinp, c.inp, 64, gelu_exact_obj, &c);
    free(c.inp), free(c.out), free(c.wout), free(dinp);
}

/* ---- GeGLU ------------------------------------------------------------------------ */

static double geglu_obj(void *p)
{
    struct swiglu_ctx *c = p; /* a gate, an up and their output, as SwiGLU's */
    K->geglu_forward(c->out, c->gate, c->up, c->n);
    return dot(c->out, c->wout, c->n);
}

/* GeGLU's gate, gelu(gate) * up on the tanh form, is GELU's kernels
 * composed, bit for bit: gelu_forward's value times up; dgate gelu_backward
 * at dout * up, dup dout times gelu_forward's value (over GELU's sweep, at
 * a size that takes the parallel path). So its accuracy is GELU's, which
 * test_gelu bounds; held against the double formula in the same units
 * (gelu_units: up is a factor of both the value and its derivative, so the
 * condition number is gelu's) with one more for the product's rounding
 * (half an ulp of out); a wrong form (SwiGLU's, the erf GELU) errs by
 * thousands of them. The backward against finite differences. */
static void test_geglu(void)
{
    const size_t n = 40001;
    float *x = malloc(n * sizeof(float)), *up = new_rand(n, 2.0f), *dout = new_rand(n, 1.0f);
    for (size_t i = 0; i < n; i++) x[i] = -10.0f + 20.0f * (float)i / (float)(n - 1);
    float *out = new_const(n, NAN), *g = malloc(n * sizeof(float)), *want = malloc(n * sizeof(float));
    K->geglu_forward(out, x, up, n);
    K->gelu_forward(g, x, n);
    for (size_t i = 0; i < n; i++) want[i] = g[i] * up[i];
    CHECK(memcmp(out, want, n * sizeof(float)) == 0);
    double max_units = 0.0;
    for (size_t i = 0; i < n; i++) {
        const double xd = x[i], k = sqrt(2.0 / M_PI), u = k * (xd + 0.044715 * xd * xd * xd);
        const double e = exp(-2.0 * u), sg = 1.0 / (1.0 + e);
        const double dgelu = sg + 2.0 * xd * sg * (e * sg) * k * (1.0 + 3.0 * 0.044715 * xd * xd);
        const double units = gelu_units(out[i], gelu_double(xd) * up[i], dgelu * up[i], xd);
        if (units > max_units) max_units = units;
    }
    printf("geglu vs double on [-10,10]: %.3g units of its rounding (bound %g)\n", max_units, GELU_UNITS + 1);
    CHECK(max_units <= GELU_UNITS + 1);
    float *dg = new_const(n, NAN), *du = new_const(n, NAN), *dxu = malloc(n * sizeof(float));
    float *dg_want = malloc(n * sizeof(float)), *du_want = malloc(n * sizeof(float));
    K->geglu_backward(dg, du, dout, x, up, n);
    for (size_t i = 0; i < n; i++) dxu[i] = dout[i] * up[i], du_want[i] = dout[i] * g[i];
    K->gelu_backward(dg_want, dxu, x, n);
    CHECK(memcmp(dg, dg_want, n * sizeof(float)) == 0);
    CHECK(memcmp(du, du_want, n * sizeof(float)) == 0);
    free(x), free(up), free(dout), free(out), free(g), free(want), free(dg), free(du), free(dxu);
    free(dg_want), free(du_want);

    const size_t m = 40;
    struct swiglu_ctx c = {new_rand(m, 4.0f), new_rand(m, 2.0f), new_const(m, 0.0f), new_rand(m, 1.0f), m};
    float *dgate = new_const(m, NAN), *dup = new_const(m, NAN); /* written, not accumulated */
    K->geglu_backward(dgate, dup, c.wout, c.gate, c.up, m);
    fd_check("geglu dgate vs fd", dgate, c.gate, m, geglu_obj, &c);
    fd_check("geglu dup vs fd", dup, c.up, m, geglu_obj, &c);
    free(c.gate), free(c.up), free(c.out), free(c.wout), free(dgate), free(dup);
}

struct residual_ctx {
    float *a, *b, *out, *wout;
    size_t n;
};

static double residual_obj(void *p)
{
    struct residual_ctx *c = p;
    K->residual_forward(c->out, c->a, c->b, c->n);
    return dot(c->out, c->wout, c->n);
}

static void test_residual(void)
{
    const size_t n = 37;
    struct residual_ctx c = {new_rand(n, 1.0f), new_rand(n, 1.0f), new_const(n, 0.0f), new_rand(n, 1.0f), n};
    float *da0 = new_rand(n, 1.0f), *db0 = new_rand(n, 1.0f);
    float *da = new_copy(da0, n), *db = new_copy(db0, n);
    K->residual_backward(da, db, c.wout, n);
    sub(da, da, da0, n), sub(db, db, db0, n);
    fd_check("residual da vs fd", da, c.a, n, residual_obj, &c);
    fd_check("residual db vs fd", db, c.b, n, residual_obj, &c);
    /* da may be dout itself: db still gets the original dout */
    float *d = new_copy(c.wout, n), *db2 = new_const(n, 0.0f);
    K->residual_backward(d, db2, d, n);
    CHECK(memcmp(db2, c.wout, n * sizeof(float)) == 0);
    free(c.a), free(c.b), free(c.out), free(c.wout), free(da0), free(db0), free(da), free(db);
    free(d), free(db2);
}

/* ---- cross-entropy --------------------------------------------------------------- */

struct ce_ctx {
    float *logits, *losses, *lse;
    int32_t *targets;
    float dloss;
    int N, V;
};

static double ce_obj(void *p)
{
    struct ce_ctx *c = p;
    K->crossentropy_forward(c->losses, c->lse, c->logits, c->targets, c->N, c->V);
    double s = 0.0;
    for (int i = 0; i < c->N; i++) s += (double)c->dloss * c->losses[i];
    return s;
}

/* Forward against double log-sum-exp; rows longer than the kernel's chunk
 * with the max late in the row (the running-max rescale) and offset by +-80
 * (no overflow, no underflow of the sum). */
static void test_crossentropy_forward(int N, int V, float offset, int rising)
{
    float *logits = new_rand((size_t)N * V, 3.0f);
    int32_t *targets = malloc(N * sizeof(int32_t));
    for (int i = 0; i < N; i++) {
        targets[i] = (int32_t)(rng_next() % V);
        for (int j = 0; j < V; j++) logits[(size_t)i * V + j] += offset + (rising ? 10.0f * j / V : 0.0f);
    }
    float *losses = new_const(N, NAN), *lse = new_const(N, NAN);
    float *want_loss = malloc(N * sizeof(float)), *want_lse = malloc(N * sizeof(float));
    K->crossentropy_forward(losses, lse, logits, targets, N, V);
    for (int i = 0; i < N; i++) {
        const float *x = logits + (size_t)i * V;
        double mx = -INFINITY, s = 0.0;
        for (int j = 0; j < V; j++) mx = x[j] > mx ? x[j] : mx;
        for (int j = 0; j < V; j++) s += exp(x[j] - mx);
        want_lse[i] = (float)(mx + log(s));
        want_loss[i] = (float)(mx + log(s) - x[targets[i]]);
    }
    char name[80];
    snprintf(name, sizeof name, "crossentropy lse vs double (V=%d offset %g)", V, offset);
    check_scaled(name, lse, want_lse, N, 1e-6);
    snprintf(name, sizeof name, "crossentropy loss vs double (V=%d offset %g)", V, offset);
    /* loss = lse - x[y] cancels: judge it at the scale of lse */
    check_close(name, losses, want_loss, N, 1e-6, max_abs(want_lse, N));
    free(logits), free(targets), free(losses), free(lse), free(want_loss), free(want_lse);
}

static void test_crossentropy(void)
{
    test_crossentropy_forward(4, 13, 0.0f, 0);
    test_crossentropy_forward(3, 5000, 0.0f, 1);
    test_crossentropy_forward(3, 5000, 80.0f, 1);
    test_crossentropy_forward(3, 5000, -80.0f, 0);

    const int N = 6, V = 13;
    int32_t targets[6] = {0, 12, 5, 5, 3, 7};
    struct ce_ctx c = {
        new_rand(N * V, 3.0f), new_const(N, 0.0f), new_const(N, 0.0f), targets, 1.0f / N, N, V};
    ce_obj(&c);
    float *lse = new_copy(c.lse, N), *dlogits = new_const(N * V, NAN);
    K->crossentropy_backward(dlogits, lse, c.logits, targets, c.dloss, N, V);
    fd_check("crossentropy dlogits vs fd", dlogits, c.logits, N * V, ce_obj, &c);
    /* in place gives the same result */
    float *inplace = new_copy(c.logits, N * V);
    K->crossentropy_backward(inplace, lse, inplace, targets, c.dloss, N, V);
    CHECK(memcmp(inplace, dlogits, N * V * sizeof(float)) == 0);
    free(c.logits), free(c.losses), free(c.lse), free(lse), free(dlogits), free(inplace);
}

/* Split S ways over the vocabulary: the global max (max of the shards')
 * exactly, the sum of the shards' sumexp against double, lse = max +
 * log(sum) and the loss from the shards' target logits against the fused
 * forward, to 1e-6; the shards' dlogits concatenated are the fused
 * backward's, bit for bit with the fused lse, and to 1e-6 of the tensor's
 * scale with the combined lse (whose absolute error, about an ulp of lse,
 * is the relative error it puts in every probability). Targets include
 * every shard border. */
static void test_crossentropy_vp(int N, int V, float offset, int rising)
{
    float *logits = new_rand((size_t)N * V, 3.0f);
    int32_t *targets = malloc(N * sizeof(int32_t));
    for (int i = 0; i < N; i++) {
        targets[i] = (int32_t)(rng_next() % V);
        for (int j = 0; j < V; j++) logits[(size_t)i * V + j] += offset + (rising ? 10.0f * j / V : 0.0f);
    }
    int32_t borders[20];
    const int nb = border_ids(borders, V);
    for (int i = 0; i < nb && i < N; i++) targets[i] = borders[i];
    const float dloss = 1.0f / N;
    float *losses = new_const(N, NAN), *lse = new_const(N, NAN);
    float *dlogits = new_const((size_t)N * V, NAN);
    K->crossentropy_forward(losses, lse, logits, targets, N, V);
    K->crossentropy_backward(dlogits, lse, logits, targets, dloss, N, V);
    float *want_max = malloc(N * sizeof(float)), *want_sum = malloc(N * sizeof(float));
    for (int i = 0; i < N; i++) {
        const float *x = logits + (size_t)i * V;
        float mx = -INFINITY;
        double s = 0.0;
        for (int j = 0; j < V; j++) mx = x[j] > mx ? x[j] : mx;
        for (int j = 0; j < V; j++) s += exp((double)x[j] - mx);
        want_max[i] = mx, want_sum[i] = (float)s;
    }
    const double lse_scale = max_abs(lse, N) > 1.0f ? max_abs(lse, N) : 1.0;

    float *gmax = malloc(N * sizeof(float)), *gsum = malloc(N * sizeof(float));
    float *gtl = malloc(N * sizeof(float)), *vlse = malloc(N * sizeof(float)),
          *vloss = malloc(N * sizeof(float));
    float *rmax = malloc(N * sizeof(float)), *rsum = malloc(N * sizeof(float)),
          *rtl = malloc(N * sizeof(float));
    float *cat = malloc((size_t)N * V * sizeof(float)), *cat2 = malloc((size_t)N * V * sizeof(float));
    float *shard = malloc((size_t)N * V * sizeof(float)), *d = malloc((size_t)N * V * sizeof(float));
    for (int S = 1; S <= 3; S++) {
        char name[112];
        int written = 1, tl_ok = 1, inplace_ok = 1;
        for (int i = 0; i < N; i++) gmax[i] = -INFINITY, gsum[i] = 0.0f, gtl[i] = 0.0f;
        /* pass 1: row max; pass 2: sums and target logits (the all-reduces
         * are the loops over r) */
        for (int pass = 1; pass <= 2; pass++)
            for (int r = 0; r < S; r++) {
                int v0, Vl;
                shard_of(r, S, V, &v0, &Vl);
                for (int i = 0; i < N; i++)
                    memcpy(shard + (size_t)i * Vl, logits + (size_t)i * V + v0, Vl * sizeof(float));
                for (int i = 0; i < N; i++) rmax[i] = rsum[i] = rtl[i] = NAN;
                if (pass == 1) {
                    K->crossentropy_vp_max(rmax, shard, N, Vl);
                    for (int i = 0; i < N; i++) {
                        if (isnan(rmax[i])) written = 0;
                        gmax[i] = rmax[i] > gmax[i] ? rmax[i] : gmax[i];
                    }
                } else {
                    K->crossentropy_vp_stats(rsum, rtl, shard, gmax, targets, v0, N, Vl);
                    for (int i = 0; i < N; i++) {
                        if (isnan(rsum[i]) || isnan(rtl[i])) written = 0;
                        const int mine = targets[i] >= v0 && targets[i] < v0 + Vl;
                        if (rtl[i] != (mine ? logits[(size_t)i * V + targets[i]] : 0.0f)) tl_ok = 0;
                        gsum[i] += rsum[i], gtl[i] += rtl[i];
                    }
                }
            }
        for (int i = 0; i < N; i++) {
            vlse[i] = (float)((double)gmax[i] + log((double)gsum[i]));
            vloss[i] = vlse[i] - gtl[i];
        }
        /* backward per shard, with the fused lse and with the combined one */
        for (int r = 0; r < S; r++) {
            int v0, Vl;
            shard_of(r, S, V, &v0, &Vl);
            for (int i = 0; i < N; i++)
                memcpy(shard + (size_t)i * Vl, logits + (size_t)i * V + v0, Vl * sizeof(float));
            for (size_t i = 0; i < (size_t)N * Vl; i++) d[i] = NAN;
            K->crossentropy_vp_backward(d, lse, shard, targets, v0, dloss, N, Vl);
            for (int i = 0; i < N; i++)
                memcpy(cat + (size_t)i * V + v0, d + (size_t)i * Vl, Vl * sizeof(float));
            K->crossentropy_vp_backward(shard, lse, shard, targets, v0, dloss, N, Vl); /* in place */
            if (memcmp(shard, d, (size_t)N * Vl * sizeof(float)) != 0) inplace_ok = 0;
            for (int i = 0; i < N; i++)
                memcpy(shard + (size_t)i * Vl, logits + (size_t)i * V + v0, Vl * sizeof(float));
            K->crossentropy_vp_backward(d, vlse, shard, targets, v0, dloss, N, Vl);
            for (int i = 0; i < N; i++)
                memcpy(cat2 + (size_t)i * V + v0, d + (size_t)i * Vl, Vl * sizeof(float));
        }
        printf("crossentropy, vocabulary split %d ways (N=%d V=%d offset %g)\n", S, N, V, offset);
        CHECK(written);
        CHECK(memcmp(gmax, want_max, N * sizeof(float)) == 0); /* a max is exact */
        CHECK(tl_ok);
        CHECK(inplace_ok);
        snprintf(name, sizeof name, "crossentropy_vp sumexp vs double (S=%d V=%d offset %g)", S, V, offset);
        /* every sum is >= 1; V / S positive float32 terms (sum_tol: measured 2.2e-7) */
        check_close(name, gsum, want_sum, N, sum_tol(V), 1.0);
        snprintf(name, sizeof name, "crossentropy_vp lse vs fused (S=%d V=%d offset %g)", S, V, offset);
        check_scaled(name, vlse, lse, N, 1e-6);
        snprintf(name, sizeof name, "crossentropy_vp loss vs fused (S=%d V=%d offset %g)", S, V, offset);
        check_close(name, vloss, losses, N, 1e-6, lse_scale); /* cancels: judged at lse's scale */
        snprintf(name, sizeof name, "crossentropy_vp dlogits vs fused (S=%d V=%d offset %g)", S, V, offset);
        CHECK(memcmp(cat, dlogits, (size_t)N * V * sizeof(float)) == 0);
        check_scaled(name, cat2, dlogits, (size_t)N * V, 1e-6);
    }
    /* a shard holding no columns: max -inf, sum 0, target logit 0 */
    float m0 = 0.0f, s0 = NAN, t0 = NAN, g0 = 1.0f;
    K->crossentropy_vp_max(&m0, logits, 1, 0);
    K->crossentropy_vp_stats(&s0, &t0, logits, &g0, targets, 0, 1, 0);
    CHECK(m0 == -INFINITY && s0 == 0.0f && t0 == 0.0f);
    free(logits), free(targets), free(losses), free(lse), free(dlogits), free(want_max), free(want_sum);
    free(gmax), free(gsum), free(gtl), free(vlse), free(vloss), free(rmax), free(rsum), free(rtl);
    free(cat), free(cat2), free(shard), free(d);
}

/* ---- AdamW, sum of squares --------------------------------------------------------- */

static void test_adamw(void)
{
    const size_t n = 1000;
    const float lr = 1e-2f, b1 = 0.9f, b2 = 0.95f, eps = 1e-8f, wd = 0.1f, gs = 0.5f;
    /* parameters at GPT-2's init scale, so that the 5 updates of ~lr are a
     * large part of each value and a wrong update cannot hide in rounding */
    float *p = new_rand(n, 0.05f), *m = new_const(n, 0.0f), *v = new_const(n, 0.0f);
    double *pd = malloc(n * sizeof(double)), *md = calloc(n, sizeof(double)), *vd = calloc(n, sizeof(double));
    for (size_t i = 0; i < n; i++) pd[i] = p[i];
    float *grad = malloc(n * sizeof(float));
    float *pf = malloc(n * sizeof(float)), *mf = malloc(n * sizeof(float)), *vf = malloc(n * sizeof(float));
    for (int t = 1; t <= 5; t++) {
        fill(grad, n, 1.0f);
        if (t == 3) grad[0] = 0.0f; /* v stays tiny: eps matters */
        K->adamw_update(p, m, v, grad, n, lr, b1, b2, eps, wd, gs, t);
        for (size_t i = 0; i < n; i++) {
            const double g = (double)grad[i] * gs;
            pd[i] *= 1.0 - (double)lr * wd;
            md[i] = b1 * md[i] + (1.0 - b1) * g;
            vd[i] = b2 * vd[i] + (1.0 - b2) * g * g;
            const double denom = sqrt(vd[i]) / sqrt(1.0 - pow(b2, t)) + eps;
            pd[i] -= lr / (1.0 - pow(b1, t)) * md[i] / denom;
            pf[i] = (float)pd[i], mf[i] = (float)md[i], vf[i] = (float)vd[i];
        }
        char name[64];
        /* elementwise: each value a handful of float roundings (~10 u) from the
         * double loop's, 1e-6 = 17 u of the scale; measured 1.9e-7 */
        snprintf(name, sizeof name, "adamw param step %d vs double", t);
        check_scaled(name, p, pf, n, 1e-6);
        snprintf(name, sizeof name, "adamw m step %d vs double", t);
        check_scaled(name, m, mf, n, 1e-6);
        snprintf(name, sizeof name, "adamw v step %d vs double", t);
        check_scaled(name, v, vf, n, 1e-6);
    }
    free(p), free(m), free(v), free(pd), free(md), free(vd), free(grad), free(pf), free(mf);
    free(vf);
}

static void test_sum_squares(void)
{
    const size_t sizes[3] = {1, 1001, 3000017};
    for (int k = 0; k < 3; k++) {
        const size_t n = sizes[k];
        float *x = new_rand(n, 2.0f);
        double want = 0.0;
        for (size_t i = 0; i < n; i++) want += (double)x[i] * x[i];
        const int saved = get_threads();
        set_threads(1);
        const double s1 = K->sum_squares(x, n);
        set_threads(2);
        const double s2 = K->sum_squares(x, n);
        set_threads(saved);
        /* two double sums of n positive terms in other orders: in general each
         * errs by about 2^-53 sqrt(n / 3) of the total, 1.1e-13 at n = 3e6 in
         * sequence; here the inputs are multiples of 2^-12 below 2, so every
         * square and partial sum is exact in double whatever the order
         * (measured 0) */
        printf("sum_squares n=%zu: rel err %.3g against a sequential double sum (tol 1e-12)\n", n,
               fabs(s1 - want) / want);
        CHECK(fabs(s1 - want) <= 1e-12 * want);
        CHECK(s1 == s2); /* fixed chunks: same bits at any thread count */
        free(x);
    }
}

/* ---- the non-finite checks, the 16-bit sum of squares ------------------------------- */

/* Table t's has_nonfinite finds one inf or NaN anywhere: every position of
 * short arrays (the vector loop's remainders), and the ends and middle of a
 * long one (the parallel path); finite extremes are not flagged. */
static void test_has_nonfinite(const struct loom_kernels *t, const char *table)
{
    printf("has_nonfinite, %s table\n", table);
    static const uint32_t bad_bits[] = {0x7f800000, 0xff800000, 0x7fc00000, 0xffc00000,
                                        0x7f800001, 0xffbfffff, 0x7fffffff};
    enum { SHORT = 70, LONG = 1 << 18 }; /* LONG: 4x the size the parallel path starts at */
    float *x = malloc(LONG * sizeof *x);
    for (size_t i = 0; i < LONG; i++) x[i] = (i % 3 == 0) ? 3.4028235e38f : (i % 3 == 1) ? -1.4e-45f : 0.f;
    CHECK(!t->has_nonfinite(x, 0) && !t->has_nonfinite(x, LONG));
    int missed = 0;
    for (size_t k = 0; k < sizeof bad_bits / sizeof bad_bits[0]; k++) {
        float v;
        memcpy(&v, &bad_bits[k], sizeof v);
        for (size_t n = 1; n <= SHORT; n++)
            for (size_t pos = 0; pos < n; pos++) {
                float keep = x[pos];
                x[pos] = v;
                missed += !t->has_nonfinite(x, n);
                missed += t->has_nonfinite(x + pos + 1, n - pos - 1); /* past it: clean */
                x[pos] = keep;
            }
        size_t at[] = {0, 1, LONG / 2, LONG - 2, LONG - 1};
        for (size_t j = 0; j < sizeof at / sizeof at[0]; j++) {
            float keep = x[at[j]];
            x[at[j]] = v;
            missed += !t->has_nonfinite(x, LONG);
            x[at[j]] = keep;
        }
    }
    CHECK(missed == 0);
    free(x);
}

/* The same for values held in bf16 and fp16: each dtype's infinities and
 * NaNs (both signs, quiet and signalling) found at every position of short
 * arrays and at the ends and middle of a long one; the largest finite value
 * and the smallest subnormal, of both signs, not flagged. */
static void test_lp_has_nonfinite(void)
{
    static const enum loom_dtype dts[2] = {LOOM_DTYPE_BF16, LOOM_DTYPE_F16};
    static const uint16_t bad[2][4] = {{0x7f80, 0xff80, 0x7fc0, 0xff81}, {0x7c00, 0xfc00, 0x7e00, 0xfc01}};
    static const uint16_t fine[2][4] = {{0x7f7f, 0xff7f, 0x0001, 0x8001}, {0x7bff, 0xfbff, 0x0001, 0x8001}};
    enum { SHORT = 70, LONG = 1 << 18 }; /* LONG: 4x the size the parallel path starts at */
    uint16_t *x = malloc(LONG * sizeof *x);
    for (int d = 0; d < 2; d++) {
        const enum loom_dtype dt = dts[d];
        for (size_t i = 0; i < LONG; i++) x[i] = fine[d][i % 4];
        CHECK(!K->lp_has_nonfinite(x, 0, dt) && !K->lp_has_nonfinite(x, LONG, dt));
        int missed = 0;
        for (int k = 0; k < 4; k++) {
            for (size_t n = 1; n <= SHORT; n++)
                for (size_t pos = 0; pos < n; pos++) {
                    const uint16_t keep = x[pos];
                    x[pos] = bad[d][k];
                    missed += !K->lp_has_nonfinite(x, n, dt);
                    missed += K->lp_has_nonfinite(x + pos + 1, n - pos - 1, dt);
                    x[pos] = keep;
                }
            const size_t at[] = {0, 1, LONG / 2, LONG - 2, LONG - 1};
            for (size_t j = 0; j < sizeof at / sizeof at[0]; j++) {
                const uint16_t keep = x[at[j]];
                x[at[j]] = bad[d][k];
                missed += !K->lp_has_nonfinite(x, LONG, dt);
                x[at[j]] = keep;
            }
        }
        printf("lp_has_nonfinite %s: %d missed or false\n", loom_dtype_name(dt), missed);
        CHECK(missed == 0);
    }
    free(x);
}

/* lp_sum_squares of bf16 and fp16 values: multiples of 2^-12 below 2 stay
 * multiples of 2^-12 when rounded to either dtype (neither has a finer bit
 * at that size), so every square is a multiple of 2^-24 of at most 4 and a
 * sum of n < 2^20 of them needs under 46 bits: exact in double in any
 * order. So equal to a sequential double sum, at 1 and 2 threads, below and
 * above the parallel path's size. */
static void test_lp_sum_squares(void)
{
    static const enum loom_dtype dts[2] = {LOOM_DTYPE_BF16, LOOM_DTYPE_F16};
    const size_t sizes[3] = {1, 1001, 300007};
    const int saved = get_threads();
    for (int d = 0; d < 2; d++)
        for (int k = 0; k < 3; k++) {
            const size_t n = sizes[k];
            float *x = new_rand(n, 2.0f);
            uint16_t *h = malloc(n * sizeof *h);
            loom_lp_from_f32(h, x, n, dts[d]);
            loom_lp_to_f32(x, h, n, dts[d]);
            double want = 0.0;
            for (size_t i = 0; i < n; i++) want += (double)x[i] * x[i];
            set_threads(1);
            const double s1 = K->lp_sum_squares(h, n, dts[d]);
            set_threads(2);
            const double s2 = K->lp_sum_squares(h, n, dts[d]);
            printf("lp_sum_squares %s n=%zu: %.17g, sequential double sum %.17g\n", loom_dtype_name(dts[d]),
                   n, s1, want);
            CHECK(s1 == want && s2 == want);
            free(x), free(h);
        }
    set_threads(saved);
}

/* lp_accumulate: each element's addition in float32 and its rounding into
 * bf16/fp16 as a scalar loop does them, the same bits at 1 and 2 threads,
 * below and above the parallel path's size. */
static void test_lp_accumulate(void)
{
    static const enum loom_dtype dts[2] = {LOOM_DTYPE_BF16, LOOM_DTYPE_F16};
    const size_t sizes[3] = {1, 1001, 300007};
    const int saved = get_threads();
    for (int k = 0; k < 3; k++) {
        const size_t n = sizes[k];
        float *src = new_rand(n, 1.0f), *x = new_rand(n, 4.0f);
        uint16_t *h0 = malloc(n * sizeof *h0), *want = malloc(n * sizeof *want),
                 *got = malloc(n * sizeof *got);
        for (int d = 0; d < 2; d++) {
            loom_lp_from_f32(h0, x, n, dts[d]);
            for (size_t i = 0; i < n; i++) {
                float v;
                loom_lp_to_f32(&v, &h0[i], 1, dts[d]);
                v += src[i];
                loom_lp_from_f32(&want[i], &v, 1, dts[d]);
            }
            for (int t = 1; t <= 2; t++) {
                memcpy(got, h0, n * sizeof *got);
                set_threads(t);
                K->lp_accumulate(got, src, n, dts[d]);
                CHECK(memcmp(got, want, n * sizeof *got) == 0);
            }
        }
        printf("lp_accumulate n=%zu: as a scalar loop at 1 and 2 threads\n", n);
        free(src), free(x), free(h0), free(want), free(got);
    }
    set_threads(saved);
}

/* sumsq_exact_add on values whose squares and their sums are exact in
 * double (multiples of 2^-12 below 2, as in test_lp_sum_squares; 1e5 of
 * them need under 44 bits): the total is the sequential double sum, in
 * float32 and both 16-bit dtypes; and x added in two uneven pieces, the
 * second first, holds the same bins as x added whole. */
static void test_sumsq_exact_add(void)
{
    static const enum loom_dtype dts[3] = {LOOM_DTYPE_F32, LOOM_DTYPE_BF16, LOOM_DTYPE_F16};
    const size_t n = 100003, cut = 31337;
    for (int d = 0; d < 3; d++) {
        const enum loom_dtype dt = dts[d];
        float *x = new_rand(n, 2.0f);
        uint16_t *h = malloc(n * sizeof *h);
        const void *in = x;
        if (dt != LOOM_DTYPE_F32) { /* the values the 16-bit ones hold */
            loom_lp_from_f32(h, x, n, dt);
            loom_lp_to_f32(x, h, n, dt);
            in = h;
        }
        double want = 0.0;
        for (size_t i = 0; i < n; i++) want += (double)x[i] * x[i];
        const size_t es = loom_dtype_size(dt);
        struct loom_sumsq_exact whole = {0}, parts = {0};
        K->sumsq_exact_add(&whole, in, n, dt);
        K->sumsq_exact_add(&parts, (const char *)in + cut * es, n - cut, dt);
        K->sumsq_exact_add(&parts, in, cut, dt);
        uint64_t a[LOOM_SUMSQ_LIMBS], b[LOOM_SUMSQ_LIMBS];
        loom_sumsq_exact_limbs(&whole, a);
        loom_sumsq_exact_limbs(&parts, b);
        const double got = loom_sumsq_exact_value(&whole);
        printf("sumsq_exact_add %s n=%zu: %.17g, sequential double sum %.17g\n", loom_dtype_name(dt), n, got,
               want);
        CHECK(got == want);
        CHECK(memcmp(a, b, sizeof a) == 0);
        free(x), free(h);
    }
}

/* Every required member of a table is set (in the order of backend.h). */
/* The elementwise kernels against the loops they stand for, bit for bit:
 * scaling, adding into, rounding to bf16/fp16 (in place and stored), the
 * vocabulary-parallel loss's last step, and grouped-query packing. */
static void test_elementwise(void)
{
    const size_t n = 40000; /* over the parallel threshold */
    float *x = new_rand(n, 3.0f), *y = new_rand(n, 3.0f), *a = new_copy(x, n), *b = new_copy(x, n);
    K->scale(a, n, 0.37f);
    for (size_t i = 0; i < n; i++) b[i] *= 0.37f;
    CHECK(memcmp(a, b, n * sizeof(float)) == 0);
    K->accumulate(a, y, n);
    for (size_t i = 0; i < n; i++) b[i] += y[i];
    CHECK(memcmp(a, b, n * sizeof(float)) == 0);
    K->add_scalar(a, y, n, 1.25f);
    for (size_t i = 0; i < n; i++) b[i] = 1.25f + y[i];
    CHECK(memcmp(a, b, n * sizeof(float)) == 0);
    const enum loom_dtype dts[] = {LOOM_DTYPE_BF16, LOOM_DTYPE_F16};
    uint16_t *h1 = malloc(n * sizeof *h1), *h2 = malloc(n * sizeof *h2);
    for (int d = 0; d < 2; d++) {
        memcpy(a, x, n * sizeof(float)), memcpy(b, x, n * sizeof(float));
        K->round_to(a, n, dts[d]);
        loom_lp_from_f32(h2, x, n, dts[d]);
        loom_lp_to_f32(b, h2, n, dts[d]);
        CHECK(memcmp(a, b, n * sizeof(float)) == 0);
        memcpy(a, x, n * sizeof(float));
        K->round_store(h1, a, n, dts[d]);
        CHECK(memcmp(a, b, n * sizeof(float)) == 0 && memcmp(h1, h2, n * sizeof *h1) == 0);
    }
    free(h1), free(h2);
    /* lse = max + log(sumexp), loss = lse - target logit */
    const int N = 9;
    float *mx = new_rand(N, 4.0f), *se = new_const(N, 2.5f), *tl = new_rand(N, 4.0f), loss[9], lse[9];
    K->crossentropy_vp_finish(loss, lse, mx, se, tl, N);
    for (int i = 0; i < N; i++) {
        const float want = mx[i] + logf(se[i]);
        CHECK(lse[i] == want && loss[i] == want - tl[i]);
    }
    free(mx), free(se), free(tl);
    /* 4 query heads over 2 key/value heads of 3 */
    const int R = 5, NH = 4, G = 2, hs = 3, C = NH * hs, kvC = G * hs;
    float *q = new_rand((size_t)R * C, 1.0f), *k = new_rand((size_t)R * kvC, 1.0f),
          *v = new_rand((size_t)R * kvC, 1.0f), *qkv = new_const((size_t)R * 3 * C, 0.0f);
    K->gqa_pack(qkv, q, k, v, R, NH, G, hs);
    float *dq = new_const((size_t)R * C, 9.0f), *dk = new_const((size_t)R * kvC, 9.0f),
          *dv = new_const((size_t)R * kvC, 9.0f);
    K->gqa_unpack(dq, dk, dv, qkv, R, NH, G, hs);
    for (int r = 0; r < R; r++)
        for (int h = 0; h < NH; h++)
            for (int j = 0; j < hs; j++) {
                const size_t row = (size_t)r * 3 * C, kv = (size_t)r * kvC + (size_t)(h / (NH / G)) * hs + j;
                CHECK(qkv[row + (size_t)h * hs + j] == q[(size_t)r * C + (size_t)h * hs + j]);
                CHECK(qkv[row + C + (size_t)h * hs + j] == k[kv] &&
                      qkv[row + 2 * C + (size_t)h * hs + j] == v[kv]);
                CHECK(dq[(size_t)r * C + (size_t)h * hs + j] == q[(size_t)r * C + (size_t)h * hs + j]);
            }
    /* each key/value entry served NH/G = 2 query heads: its gradient the sum of both copies */
    for (size_t i = 0; i < (size_t)R * kvC; i++) CHECK(dk[i] == k[i] + k[i] && dv[i] == v[i] + v[i]);
    free(q), free(k), free(v), free(qkv), free(dq), free(dk), free(dv);
    free(x), free(y), free(a), free(b);
}

/* Rows with a pitch, float64 sums and fp8's elementwise kernels against
 * the loops and base/ functions they stand for, bit for bit. */
static void test_rows_and_fp8(void)
{
    const size_t R = 7, W = 5, LD = 9; /* 7 rows of 5 out of rows of 9 */
    float *src = new_rand(R * LD, 2.0f), *dst = new_const(R * LD, 1.5f), *want = new_copy(dst, R * LD);
    K->convert_rows(dst + 2, LOOM_DTYPE_F32, LD, src + 1, LOOM_DTYPE_F32, LD, R, W);
    for (size_t i = 0; i < R; i++)
        for (size_t c = 0; c < W; c++) want[i * LD + 2 + c] = src[i * LD + 1 + c];
    CHECK(memcmp(dst, want, R * LD * sizeof(float)) == 0);
    K->add_rows(dst + 1, LD, src, LD, R, W);
    for (size_t i = 0; i < R; i++)
        for (size_t c = 0; c < W; c++) want[i * LD + 1 + c] += src[i * LD + c];
    CHECK(memcmp(dst, want, R * LD * sizeof(float)) == 0);
    uint16_t *h = malloc(R * W * sizeof *h), *h2 = malloc(R * W * sizeof *h2);
    K->convert_rows(h, LOOM_DTYPE_BF16, W, src, LOOM_DTYPE_F32, LD, R, W);
    for (size_t i = 0; i < R; i++)
        for (size_t c = 0; c < W; c++) CHECK(h[i * W + c] == loom_f32_to_bf16(src[i * LD + c]));
    K->convert_rows(h2, LOOM_DTYPE_BF16, W, h, LOOM_DTYPE_BF16, W, R, W);
    CHECK(memcmp(h, h2, R * W * sizeof *h) == 0);
    K->convert_rows(dst, LOOM_DTYPE_F32, LD, h, LOOM_DTYPE_BF16, W, R, W);
    for (size_t i = 0; i < R; i++)
        for (size_t c = 0; c < W; c++) CHECK(dst[i * LD + c] == loom_bf16_to_f32(h[i * W + c]));
    memcpy(want, dst, R * LD * sizeof(float));
    K->add_bias(dst, src, 3, (int)LD);
    for (size_t i = 0; i < 3; i++)
        for (size_t c = 0; c < LD; c++) want[i * LD + c] += src[c];
    CHECK(memcmp(dst, want, R * LD * sizeof(float)) == 0);
    const size_t n = R * LD;
    double *acc = calloc(n, sizeof *acc), *acc2 = calloc(n, sizeof *acc2);
    K->acc_add(acc, src, n), K->acc_add(acc, dst, n);
    for (size_t i = 0; i < n; i++) acc2[i] = ((double)0 + src[i]) + dst[i];
    CHECK(memcmp(acc, acc2, n * sizeof *acc) == 0);
    K->acc_round(want, acc, n);
    for (size_t i = 0; i < n; i++) CHECK(want[i] == (float)acc[i]);
    memcpy(want, src, n * sizeof(float));
    K->acc_add_rounded(want, acc, n);
    for (size_t i = 0; i < n; i++) CHECK(want[i] == src[i] + (float)acc[i]);
    free(acc), free(acc2), free(h), free(h2);
    /* fp8: the quantisation and amax of base/fp8.c, from float32 and from bf16 */
    uint16_t *q = malloc(n * sizeof *q), *q2 = malloc(n * sizeof *q2), *s16 = malloc(n * sizeof *s16);
    K->fp8_quantize(q, src, NULL, n, 3.0f, LOOM_FP8_E4M3);
    loom_fp8_quantize_bf16(q2, src, n, 3.0f, LOOM_FP8_E4M3);
    CHECK(memcmp(q, q2, n * sizeof *q) == 0);
    loom_lp_from_f32(s16, src, n, LOOM_DTYPE_BF16);
    K->fp8_quantize(q, NULL, s16, n, 0.5f, LOOM_FP8_E5M2);
    loom_fp8_quantize_bf16_from16(q2, s16, n, 0.5f, LOOM_FP8_E5M2);
    CHECK(memcmp(q, q2, n * sizeof *q) == 0);
    CHECK(K->fp8_amax(src, NULL, n) == loom_fp8_amax(src, n) &&
          K->fp8_amax(NULL, s16, n) == loom_fp8_amax16(s16, n));
    /* the scales undone: out * undo + bias, and the gradients' */
    memcpy(dst, src, n * sizeof(float)), memcpy(want, src, n * sizeof(float));
    K->fp8_unscale(dst, src, (int)R, (int)LD, 0.25f);
    for (size_t i = 0; i < R; i++)
        for (size_t c = 0; c < LD; c++) want[i * LD + c] = want[i * LD + c] * 0.25f + src[c];
    CHECK(memcmp(dst, want, n * sizeof(float)) == 0);
    float *dw = new_rand(n, 1.0f), *dwant = new_copy(dst, n);
    memcpy(want, src, n * sizeof(float));
    K->fp8_scale_into(want, n, 0.5f, dst, dw, n, 0.125f);
    for (size_t i = 0; i < n; i++) CHECK(want[i] == src[i] * 0.5f && dst[i] == dwant[i] + dw[i] * 0.125f);
    free(q), free(q2), free(s16), free(dw), free(dwant);
    free(src), free(dst), free(want);
}

static void check_complete(const char *name, const struct loom_kernels *k)
{
    const int set[] = {
        k->embedding_forward != NULL,
        k->embedding_backward != NULL,
        k->embedding_vp_forward != NULL,
        k->embedding_vp_backward != NULL,
        k->layernorm_forward != NULL,
        k->layernorm_backward != NULL,
        k->matmul_forward != NULL,
        k->matmul_backward != NULL,
        k->bias_backward != NULL,
        k->lm_head_forward != NULL,
        k->lm_head_backward != NULL,
        k->lm_head_forward_lp != NULL,
        k->lm_head_backward_lp != NULL,
        k->linear_forward != NULL,
        k->linear_backward != NULL,
        k->grouped_forward != NULL,
        k->grouped_backward != NULL,
        k->attention_forward != NULL,
        k->attention_backward != NULL,
        k->sparse_attention_forward != NULL,
        k->sparse_attention_backward != NULL,
        k->flash_attention_forward != NULL,
        k->flash_attention_backward != NULL,
        k->gelu_forward != NULL,
        k->gelu_backward != NULL,
        k->gelu_exact_forward != NULL,
        k->gelu_exact_backward != NULL,
        k->residual_forward != NULL,
        k->residual_backward != NULL,
        k->rmsnorm_forward != NULL,
        k->rmsnorm_backward != NULL,
        k->rope_forward != NULL,
        k->rope_backward != NULL,
        k->swiglu_forward != NULL,
        k->swiglu_backward != NULL,
        k->geglu_forward != NULL,
        k->geglu_backward != NULL,
        k->crossentropy_forward != NULL,
        k->crossentropy_backward != NULL,
        k->crossentropy_vp_max != NULL,
        k->crossentropy_vp_stats != NULL,
        k->crossentropy_vp_backward != NULL,
        k->adamw_update != NULL,
        k->sum_squares != NULL,
        k->lp_sum_squares != NULL,
        k->has_nonfinite != NULL,
        k->lp_has_nonfinite != NULL,
        k->crossentropy_vp_finish != NULL,
        k->sumsq_exact_add != NULL,
        k->scale != NULL,
        k->add_scalar != NULL,
        k->accumulate != NULL,
        k->round_to != NULL,
        k->round_store != NULL,
        k->lp_accumulate != NULL,
        k->gqa_pack != NULL,
        k->gqa_unpack != NULL,
        k->convert_rows != NULL,
        k->add_rows != NULL,
        k->add_bias != NULL,
        k->acc_add != NULL,
        k->acc_round != NULL,
        k->acc_add_rounded != NULL,
        k->fp8_quantize != NULL,
        k->fp8_amax != NULL,
        k->fp8_unscale != NULL,
        k->fp8_scale_into != NULL,
    };
    /* optional: the bf16 products on bf16 operands come in a pair */
    CHECK(!k->matmul_forward_b16 == !k->matmul_backward_b16);
    int complete = 1;
    for (size_t i = 0; i < sizeof set / sizeof set[0]; i++)
        if (!set[i]) {
            fprintf(stderr, "%s: kernel %zu of the table is missing\n", name, i);
            complete = 0;
        }
    CHECK(complete);
}

/* The bf16 units are chosen once per process: an unknown name is bad input,
 * the same choice again is fine, another one is refused (oneDNN's
 * instruction-set cap is fixed at its first use; without oneDNN, any path
 * but f32 is refused; a CPU without AVX512 has the f32 path alone), and
 * the f32 choice leaves the float32 table. The
 * products of each path are tests/test_kernels_torch.py's. */
static void test_bf16_units_select(void)
{
    CHECK(loom_bf16_units_select("tensor-cores") == LOOM_ERR_INPUT);
    CHECK(loom_bf16_units_select("f32") == LOOM_OK);
    CHECK(loom_bf16_units() == LOOM_BF16_UNITS_F32);
    CHECK(loom_bf16_units_select("f32") == LOOM_OK);
#ifdef LOOM_HAVE_DNNL
    /* a CPU without AVX512 runs no bf16 path: every forced one is f32 there */
    const int refused = __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
                        __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512dq");
#else
    const int refused = 1;
#endif
    CHECK(loom_bf16_units_select("avx512_bf16") == (refused ? LOOM_ERR_INPUT : LOOM_OK));
    CHECK(loom_bf16_units() == LOOM_BF16_UNITS_F32);
    CHECK(loom_backend_kernels(loom_backend_cpu(), LOOM_DTYPE_BF16) == loom_backend_cpu()->k);
    loom_error_clear();
}

int main(int argc, char **argv)
{
    if (argc == 3 && strcmp(argv[1], "--bf16-units") == 0) return bf16_table_main(argv[2]);
    REF = loom_kernels_ref();
    check_complete("ref", REF);
    CHECK(loom_backend_count() >= 1 && loom_backend_get("cpu") == loom_backend_cpu());
    CHECK(loom_backend_get("no-such-backend") == NULL);
    /* the test's buffers are host memory: a backend on another device will
     * need them staged through its copy first */
    for (int i = 0; i < loom_backend_count(); i++) {
        const struct loom_backend *be = loom_backend_at(i);
        CHECK(be->device == LOOM_DEVICE_CPU);
        printf("backend %s\n", be->name);
        CHECK(be->alloc && be->free && be->memset && be->copy && be->convert);
        check_complete(be->name, be->k);
        K = be->k;
        test_matmul_vs_ref(7, 12, 5, 1);
        test_matmul_vs_ref(33, 48, 20, 0);
        test_matmul_vs_ref(64, 96, 130, 1);
        test_lm_head_vs_ref(7, 12, 23);
        test_matmul_fd();
        test_lm_head_fd();

        test_attention_vs_ref(2, 7, 12, 3);
        test_attention_vs_ref(1, 1, 8, 2);
        test_attention_vs_ref(2, 64, 32, 2);  /* exactly one row block */
        test_attention_vs_ref(1, 150, 48, 3); /* three row blocks, the last partial */
        test_attention_fd();

        test_layernorm(1e-5f);
        test_layernorm(0.1f);
        test_layernorm_threads();
        test_embedding();
        test_embedding_threads();
        test_gelu();
        test_gelu_exact();
        test_residual();
        test_crossentropy();
        test_embedding_vp(4, 6, 70);   /* two column bands, the second partial */
        test_embedding_vp(4, 64, 200); /* the parallel path */
        test_crossentropy_vp(24, 97, 0.0f, 0);
        test_crossentropy_vp(24, 5000, 0.0f, 1); /* shards longer than a chunk, max late in the row */
        test_crossentropy_vp(24, 5000, 80.0f, 1);
        test_crossentropy_vp(24, 5000, -80.0f, 0);
        test_adamw();
        test_sum_squares();
        /* Llama's, last: the random draws of the tests above stay as they were */
        test_rmsnorm();
        test_rope();
        test_swiglu();
        test_lm_head_lp(40, 16, 30000); /* column blocks of 26214: two, the second partial */
        test_geglu();
        test_moe_router(37, 8, 2, 0);
        test_moe_router(37, 8, 2, 1);
        test_moe_router(300, 4, 1, 0); /* rows past the parallel bound */
        test_moe_router(19, 5, 5, 0);  /* every expert */
        test_linear_sizes(K, be->name);
        test_has_nonfinite(K, be->name);
        test_lp_has_nonfinite();
        test_lp_sum_squares();
        test_elementwise();
        test_rows_and_fp8();
        test_sumsq_exact_add();
        test_lp_accumulate();
    }
    test_linear_sizes(REF, "ref");
    test_has_nonfinite(REF, "ref");
    test_bf16_tables();
    test_bf16_units_select();
    return check_summary("test_kernels");
}
