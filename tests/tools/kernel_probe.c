/*
 * kernel_probe DIR [BACKEND [bf16]]: runs every kernel of the backend
 * (default "cpu"; kernels/backend.h) forward and backward on inputs written
 * by tests/test_kernels_torch.py and writes the results back, for the
 * comparison with PyTorch. With bf16, the backend's table for bf16 compute
 * (its matrix products on the bf16 units LOOM_BF16_UNITS names, or the CPU's
 * best), whose units and kernel it prints on stdout.
 *
 * File convention, all in DIR:
 *   dims.txt              one "name value" pair per line: B T C NH V maxT OC
 *                         (ints), dloss, and the AdamW settings lr beta1
 *                         beta2 eps wd grad_scale steps n_adamw;
 *   <kernel>.<name>.bin   raw little-endian float32 (int32 for tokens and
 *                         targets), row-major, shapes as in kernels.h.
 * Inputs are read with their size checked against the dims; outputs are
 * written under the same convention. Accumulating gradients start from
 * zero; written ones start as NaN, so an element a kernel fails to write
 * shows up in the comparison. Deliberately not: a general tensor format.
 */
#include <errno.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kernels/backend.h"
#include "kernels/kernels.h"

static const char *dir;
static const struct loom_kernels *K; /* the backend probed */

struct dims {
    int B, T, C, NH, V, maxT, OC, steps;
    size_t n_adamw;
    float dloss, lr, beta1, beta2, eps, wd, grad_scale;
};

/* The keys of dims.txt, each required once. */
enum dim_key {
    K_B = 0,
    K_T = 1,
    K_C = 2,
    K_NH = 3,
    K_V = 4,
    K_MAXT = 5,
    K_OC = 6,
    K_DLOSS = 7,
    K_LR = 8,
    K_BETA1 = 9,
    K_BETA2 = 10,
    K_EPS = 11,
    K_WD = 12,
    K_GRAD_SCALE = 13,
    K_STEPS = 14,
    K_N_ADAMW = 15,
    K_COUNT
};
static const char *const key_names[] = {"B",  "T",          "C",     "NH",     "V",     "maxT",
                                        "OC", "dloss",      "lr",    "beta1",  "beta2", "eps",
                                        "wd", "grad_scale", "steps", "n_adamw"};
_Static_assert(sizeof key_names / sizeof key_names[0] == K_COUNT, "key_names");

static void die(const char *what, const char *path)
{
    fprintf(stderr, "kernel_probe: %s %s: %s\n", what, path, errno ? strerror(errno) : "");
    exit(2);
}

static void path_of(char *buf, size_t cap, const char *kernel, const char *name)
{
    int len = snprintf(buf, cap, "%s/%s.%s.bin", dir, kernel, name);
    if (len < 0 || (size_t)len >= cap) {
        fprintf(stderr, "kernel_probe: path too long: %s/%s.%s.bin\n", dir, kernel, name);
        exit(2);
    }
}

/* Reads exactly n elements of 4 bytes; the file must hold exactly that. */
static void *read_bin(const char *kernel, const char *name, size_t n)
{
    char path[4096];
    path_of(path, sizeof path, kernel, name);
    errno = 0;
    FILE *f = fopen(path, "rb");
    if (!f) die("cannot open", path);
    void *buf = malloc(n * 4 + 1);
    if (!buf) die("out of memory reading", path);
    size_t got = fread(buf, 4, n, f);
    int extra = fgetc(f);
    if (got != n || extra != EOF) {
        fprintf(stderr, "kernel_probe: %s: expected %zu values of 4 bytes, size differs\n", path, n);
        exit(2);
    }
    fclose(f);
    return buf;
}

static void write_bin(const char *kernel, const char *name, const void *data, size_t n)
{
    char path[4096];
    path_of(path, sizeof path, kernel, name);
    errno = 0;
    FILE *f = fopen(path, "wb");
    if (!f) die("cannot create", path);
    if (fwrite(data, 4, n, f) != n) die("cannot write", path);
    if (fclose(f) != 0) die("cannot close", path);
}

static float *filled(size_t n, float v)
{
    float *x = malloc(n * sizeof(float) + 1);
    if (!x) {
        fprintf(stderr, "kernel_probe: out of memory\n");
        exit(2);
    }
    for (size_t i = 0; i < n; i++) x[i] = v;
    return x;
}

static void read_dims(struct dims *d)
{
    char path[4096];
    snprintf(path, sizeof path, "%s/dims.txt", dir);
    errno = 0;
    FILE *f = fopen(path, "r");
    if (!f) die("cannot open", path);
    double v[K_COUNT];
    int seen[K_COUNT] = {0};
    char key[64];
    double val;
    while (fscanf(f, "%63s %lf", key, &val) == 2) {
        int k = 0;
        while (k < K_COUNT && strcmp(key, key_names[k]) != 0) k++;
        if (k == K_COUNT || seen[k]++) {
            fprintf(stderr, "kernel_probe: %s: unknown or repeated key %s\n", path, key);
            exit(2);
        }
        v[k] = val;
    }
    fclose(f);
    for (int k = 0; k < K_COUNT; k++)
        if (!seen[k]) {
            fprintf(stderr, "kernel_probe: %s: missing key %s\n", path, key_names[k]);
            exit(2);
        }
    *d = (struct dims){.B = (int)v[K_B],
                       .T = (int)v[K_T],
                       .C = (int)v[K_C],
                       .NH = (int)v[K_NH],
                       .V = (int)v[K_V],
                       .maxT = (int)v[K_MAXT],
                       .OC = (int)v[K_OC],
                       .steps = (int)v[K_STEPS],
                       .n_adamw = (size_t)v[K_N_ADAMW],
                       .dloss = (float)v[K_DLOSS],
                       .lr = (float)v[K_LR],
                       .beta1 = (float)v[K_BETA1],
                       .beta2 = (float)v[K_BETA2],
                       .eps = (float)v[K_EPS],
                       .wd = (float)v[K_WD],
                       .grad_scale = (float)v[K_GRAD_SCALE]};
    if (d->B < 1 || d->T < 1 || d->C < 1 || d->NH < 1 || d->C % d->NH || d->V < 1 || d->maxT < d->T ||
        d->OC < 1 || d->steps < 1 || d->n_adamw < 1) {
        fprintf(stderr,
                "kernel_probe: %s: inconsistent dims (B %d T %d C %d NH %d V %d maxT %d "
                "OC %d steps %d n_adamw %zu)\n",
                path, d->B, d->T, d->C, d->NH, d->V, d->maxT, d->OC, d->steps, d->n_adamw);
        exit(2);
    }
}

static void probe_embedding(const struct dims *d)
{
    const size_t N = (size_t)d->B * d->T, C = d->C;
    int32_t *tokens = read_bin("embedding", "tokens", N);
    for (size_t i = 0; i < N; i++)
        if (tokens[i] < 0 || tokens[i] >= d->V) {
            fprintf(stderr, "kernel_probe: token %d out of range\n", tokens[i]);
            exit(2);
        }
    float *wte = read_bin("embedding", "wte", d->V * C);
    float *wpe = read_bin("embedding", "wpe", d->maxT * C);
    float *dout = read_bin("embedding", "dout", N * C);
    float *out = filled(N * C, NAN), *dwte = filled(d->V * C, 0), *dwpe = filled(d->maxT * C, 0);
    K->embedding_forward(out, tokens, wte, wpe, d->B, d->T, d->C);
    K->embedding_backward(dwte, dwpe, dout, tokens, d->B, d->T, d->C);
    write_bin("embedding", "out", out, N * C);
    write_bin("embedding", "dwte", dwte, d->V * C);
    write_bin("embedding", "dwpe", dwpe, d->maxT * C);
    free(tokens), free(wte), free(wpe), free(dout), free(out), free(dwte), free(dwpe);
}

static void probe_layernorm(const struct dims *d)
{
    const int N = d->B * d->T, C = d->C;
    const size_t NC = (size_t)N * C;
    float *inp = read_bin("layernorm", "inp", NC), *w = read_bin("layernorm", "weight", C);
    float *b = read_bin("layernorm", "bias", C), *dout = read_bin("layernorm", "dout", NC);
    float *out = filled(NC, NAN), *mean = filled(N, NAN), *rstd = filled(N, NAN);
    float *dinp = filled(NC, 0), *dw = filled(C, 0), *db = filled(C, 0);
    K->layernorm_forward(out, mean, rstd, inp, w, b, N, C, 1e-5f);
    K->layernorm_backward(dinp, dw, db, dout, inp, w, mean, rstd, N, C);
    write_bin("layernorm", "out", out, NC);
    write_bin("layernorm", "mean", mean, N);
    write_bin("layernorm", "rstd", rstd, N);
    write_bin("layernorm", "dinp", dinp, NC);
    write_bin("layernorm", "dweight", dw, C);
    write_bin("layernorm", "dbias", db, C);
    free(inp), free(w), free(b), free(dout), free(out), free(mean), free(rstd), free(dinp);
    free(dw), free(db);
}

static void probe_matmul(const struct dims *d)
{
    const int N = d->B * d->T, C = d->C, OC = d->OC;
    float *inp = read_bin("matmul", "inp", (size_t)N * C);
    float *w = read_bin("matmul", "weight", (size_t)C * OC), *b = read_bin("matmul", "bias", OC);
    float *dout = read_bin("matmul", "dout", (size_t)N * OC);
    float *out = filled((size_t)N * OC, NAN), *dinp = filled((size_t)N * C, NAN);
    float *dw = filled((size_t)C * OC, 0), *db = filled(OC, 0);
    K->matmul_forward(out, inp, w, b, N, C, OC);
    K->matmul_backward(dinp, dw, db, dout, inp, w, N, C, OC);
    write_bin("matmul", "out", out, (size_t)N * OC);
    write_bin("matmul", "dinp", dinp, (size_t)N * C);
    write_bin("matmul", "dweight", dw, (size_t)C * OC);
    write_bin("matmul", "dbias", db, OC);
    if (K->matmul_forward_b16) { /* again, the input and weight handed over in bf16 */
        uint16_t *inp16 = malloc((size_t)N * C * sizeof *inp16), *w16 = malloc((size_t)C * OC * sizeof *w16);
        loom_lp_from_f32(inp16, inp, (size_t)N * C, LOOM_DTYPE_BF16);
        loom_lp_from_f32(w16, w, (size_t)C * OC, LOOM_DTYPE_BF16);
        memset(dw, 0, (size_t)C * OC * sizeof *dw);
        memset(db, 0, (size_t)OC * sizeof *db);
        K->matmul_forward_b16(out, NULL, inp16, NULL, w16, b, N, C, OC);
        K->matmul_backward_b16(dinp, dw, db, dout, NULL, inp16, NULL, w16, N, C, OC);
        write_bin("matmul", "out_b16", out, (size_t)N * OC);
        write_bin("matmul", "dinp_b16", dinp, (size_t)N * C);
        write_bin("matmul", "dweight_b16", dw, (size_t)C * OC);
        write_bin("matmul", "dbias_b16", db, OC);
        free(inp16), free(w16);
    }
    free(inp), free(w), free(b), free(dout), free(out), free(dinp), free(dw), free(db);
}

static void probe_lm_head(const struct dims *d)
{
    const int N = d->B * d->T, C = d->C, V = d->V;
    float *inp = read_bin("lm_head", "inp", (size_t)N * C);
    float *wte = read_bin("lm_head", "wte", (size_t)V * C);
    float *dlogits = read_bin("lm_head", "dlogits", (size_t)N * V);
    float *logits = filled((size_t)N * V, NAN), *dinp = filled((size_t)N * C, NAN);
    float *dwte = filled((size_t)V * C, 0);
    K->lm_head_forward(logits, inp, wte, N, C, V);
    K->lm_head_backward(dinp, dwte, dlogits, inp, wte, N, C, V);
    write_bin("lm_head", "logits", logits, (size_t)N * V);
    write_bin("lm_head", "dinp", dinp, (size_t)N * C);
    write_bin("lm_head", "dwte", dwte, (size_t)V * C);
    /* again with the logits and dlogits held in bf16 (16-bit activations) */
    uint16_t *l16 = malloc((size_t)N * V * sizeof *l16), *wte16 = malloc((size_t)V * C * sizeof *wte16);
    loom_lp_from_f32(wte16, wte, (size_t)V * C, LOOM_DTYPE_BF16); /* the table as stored in bf16 */
    K->lm_head_forward_lp(l16, LOOM_DTYPE_BF16, inp, wte, wte16, N, C, V);
    loom_lp_to_f32(logits, l16, (size_t)N * V, LOOM_DTYPE_BF16);
    write_bin("lm_head", "logits_lp", logits, (size_t)N * V);
    free(l16);
    uint16_t *dl16 = malloc((size_t)N * V * sizeof *dl16);
    loom_lp_from_f32(dl16, dlogits, (size_t)N * V, LOOM_DTYPE_BF16);
    memset(dwte, 0, (size_t)V * C * sizeof *dwte);
    K->lm_head_backward_lp(dinp, dwte, dl16, LOOM_DTYPE_BF16, inp, wte, wte16, N, C, V);
    write_bin("lm_head", "dinp_lp", dinp, (size_t)N * C);
    write_bin("lm_head", "dwte_lp", dwte, (size_t)V * C);
    free(inp), free(wte), free(dlogits), free(logits), free(dinp), free(dwte), free(dl16), free(wte16);
}

static void probe_attention(const struct dims *d)
{
    const size_t nqkv = (size_t)d->B * d->T * 3 * d->C, nout = (size_t)d->B * d->T * d->C;
    const size_t natt = (size_t)d->B * d->NH * d->T * d->T;
    float *qkv = read_bin("attention", "qkv", nqkv), *dout = read_bin("attention", "dout", nout);
    float *out = filled(nout, NAN), *att = filled(natt, NAN), *dqkv = filled(nqkv, NAN);
    float *datt = filled(natt, NAN);
    K->attention_forward(out, att, qkv, d->B, d->T, d->C, d->NH);
    K->attention_backward(dqkv, datt, dout, att, qkv, d->B, d->T, d->C, d->NH);
    write_bin("attention", "out", out, nout);
    write_bin("attention", "att", att, natt);
    write_bin("attention", "dqkv", dqkv, nqkv);
    free(qkv), free(dout), free(out), free(att), free(dqkv), free(datt);
}

static void probe_gelu(const struct dims *d)
{
    const size_t n = (size_t)d->B * d->T * 4 * d->C;
    float *inp = read_bin("gelu", "inp", n), *dout = read_bin("gelu", "dout", n);
    float *out = filled(n, NAN), *dinp = filled(n, NAN);
    K->gelu_forward(out, inp, n);
    K->gelu_backward(dinp, dout, inp, n);
    write_bin("gelu", "out", out, n);
    write_bin("gelu", "dinp", dinp, n);
    free(inp), free(dout), free(out), free(dinp);
}

static void probe_residual(const struct dims *d)
{
    const size_t n = (size_t)d->B * d->T * d->C;
    float *a = read_bin("residual", "a", n), *b = read_bin("residual", "b", n);
    float *dout = read_bin("residual", "dout", n);
    float *out = filled(n, NAN), *da = filled(n, 0), *db = filled(n, 0);
    K->residual_forward(out, a, b, n);
    K->residual_backward(da, db, dout, n);
    write_bin("residual", "out", out, n);
    write_bin("residual", "da", da, n);
    write_bin("residual", "db", db, n);
    free(a), free(b), free(dout), free(out), free(da), free(db);
}

static void probe_crossentropy(const struct dims *d)
{
    const int N = d->B * d->T, V = d->V;
    float *logits = read_bin("crossentropy", "logits", (size_t)N * V);
    int32_t *targets = read_bin("crossentropy", "targets", N);
    for (int i = 0; i < N; i++)
        if (targets[i] < 0 || targets[i] >= V) {
            fprintf(stderr, "kernel_probe: target %d out of range\n", targets[i]);
            exit(2);
        }
    float *losses = filled(N, NAN), *lse = filled(N, NAN), *dlogits = filled((size_t)N * V, NAN);
    K->crossentropy_forward(losses, lse, logits, targets, N, V);
    K->crossentropy_backward(dlogits, lse, logits, targets, d->dloss, N, V);
    write_bin("crossentropy", "losses", losses, N);
    write_bin("crossentropy", "lse", lse, N);
    write_bin("crossentropy", "dlogits", dlogits, (size_t)N * V);
    free(logits), free(targets), free(losses), free(lse), free(dlogits);
}

/* steps updates; grads (steps, n); the state after each step is written as
 * (steps, n) for param, m and v. */
static void probe_adamw(const struct dims *d)
{
    const size_t n = d->n_adamw, S = (size_t)d->steps;
    float *p = read_bin("adamw", "param", n), *grads = read_bin("adamw", "grads", S * n);
    float *m = filled(n, 0), *v = filled(n, 0);
    float *p_out = filled(S * n, NAN), *m_out = filled(S * n, NAN), *v_out = filled(S * n, NAN);
    for (int t = 1; t <= d->steps; t++) {
        K->adamw_update(p, m, v, grads + (size_t)(t - 1) * n, n, d->lr, d->beta1, d->beta2, d->eps, d->wd,
                        d->grad_scale, t);
        memcpy(p_out + (size_t)(t - 1) * n, p, n * sizeof(float));
        memcpy(m_out + (size_t)(t - 1) * n, m, n * sizeof(float));
        memcpy(v_out + (size_t)(t - 1) * n, v, n * sizeof(float));
    }
    write_bin("adamw", "param_out", p_out, S * n);
    write_bin("adamw", "m_out", m_out, S * n);
    write_bin("adamw", "v_out", v_out, S * n);
    free(p), free(grads), free(m), free(v), free(p_out), free(m_out), free(v_out);
}

int main(int argc, char **argv)
{
    if (argc < 2 || argc > 4 || (argc == 4 && strcmp(argv[3], "bf16") != 0)) {
        fprintf(stderr, "usage: kernel_probe DIR [BACKEND [bf16]] (see the file convention in %s)\n",
                __FILE__);
        return 2;
    }
    dir = argv[1];
    const char *name = argc == 3 ? argv[2] : "cpu";
    const struct loom_backend *be = loom_backend_get(name);
    if (!be || be->device != LOOM_DEVICE_CPU) {
        fprintf(stderr, "kernel_probe: no host-memory backend named '%s'\n", name);
        return 2;
    }
    K = be->k;
    if (argc == 4) {
        if (loom_bf16_units_select(getenv("LOOM_BF16_UNITS")) != LOOM_OK) {
            fprintf(stderr, "kernel_probe: bad LOOM_BF16_UNITS\n");
            return 2;
        }
        K = loom_backend_kernels(be, LOOM_DTYPE_BF16);
        printf("bf16 units %s, kernel %s\n", loom_bf16_units_name(loom_bf16_units()),
               loom_bf16_units_kernel());
    }
    struct dims d = {0};
    read_dims(&d);
    probe_embedding(&d);
    probe_layernorm(&d);
    probe_matmul(&d);
    probe_lm_head(&d);
    probe_attention(&d);
    probe_gelu(&d);
    probe_residual(&d);
    probe_crossentropy(&d);
    probe_adamw(&d);
    return 0;
}
