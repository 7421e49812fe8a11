/*
 * attn_bench [--B 1] [--T 4096] [--C 256] [--NH 4] [--repeats 5] --mode NAME
 *            [--block 64] [--window 256] [--local 4] [--global 1]
 *            [--random 1] [--sliding 3] [--global-indices 0,8] [--patterns 1]
 *            [--per-head 0|1] [--seed 0]
 * times one forward and backward of causal self-attention, dense
 * (loom_attention_forward/backward) against the block-sparse kernels on the
 * layout the flags give (kernels/sparse_layout.h; settings the flags do not
 * name keep DeepSpeed's defaults). Repeats alternate dense, sparse, dense,
 * sparse; the first pair is a warm-up, not counted. OpenMP threads are
 * whatever the environment sets (OMP_NUM_THREADS).
 *
 * Prints, for bench/sparse_attention.py to read:
 *   layout <mode> blocks <n> causal_blocks <n> density <f>
 *   rep <i> dense_ms <f> sparse_ms <f>          (one per counted repeat)
 *   dense  median_ms <f> att_bytes <n>
 *   sparse median_ms <f> att_bytes <n>
 * att_bytes counts att, the saved probabilities; datt, the backward's
 * scratch of the same size, comes on top of it in both.
 *
 * Deliberately not: a check of the numbers (tests/test_sparse_attention.c
 * does that), or the qkv and output projections around attention.
 */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/blas_env.h"
#include "base/clock.h"
#include "base/log.h"
#include "kernels/kernels.h"
#include "kernels/sparse_layout.h"
#include "median.h"

static void usage_exit(const char *why)
{
    fprintf(stderr,
            "attn_bench: %s\nusage: attn_bench [--B n] [--T n] [--C n] [--NH n] [--repeats n] --mode "
            "dense|fixed|bigbird|bslongformer|variable|window [--block n] [--window n] [--local n] "
            "[--global n] [--random n] [--sliding n] [--global-indices a,b,...] [--patterns n] "
            "[--per-head 0|1] [--seed n]\n",
            why);
    exit(2);
}

static int int_arg(const char *flag, const char *s)
{
    char *end;
    const long v = strtol(s, &end, 10);
    if (*s == 0 || *end || v < -1000000000L || v > 1000000000L) {
        fprintf(stderr, "attn_bench: %s wants an integer, got '%s'\n", flag, s);
        exit(2);
    }
    return (int)v;
}

/* "a,b,c" into list (at most LOOM_SPARSE_MAX_LIST entries). */
static int int_list(const char *flag, const char *s, int *list)
{
    int n = 0;
    char buf[256];
    snprintf(buf, sizeof buf, "%s", s);
    for (char *save = NULL, *tok = strtok_r(buf, ",", &save); tok; tok = strtok_r(NULL, ",", &save)) {
        if (n == LOOM_SPARSE_MAX_LIST) usage_exit("too many list entries");
        list[n++] = int_arg(flag, tok);
    }
    return n;
}

static float *alloc_floats(size_t n, float v)
{
    float *x = malloc(n * sizeof(float));
    if (!x) {
        fprintf(stderr, "attn_bench: out of memory for %zu floats\n", n);
        exit(1);
    }
    for (size_t i = 0; i < n; i++) x[i] = v; /* touched: no page faults in the timing */
    return x;
}

int main(int argc, char **argv)
{
    loom_blas_select_core(argc, argv);
    int B = 1, T = 4096, C = 256, NH = 4, repeats = 5, have_mode = 0;
    struct loom_sparse_config cfg;
    loom_sparse_config_default(&cfg, LOOM_SPARSE_WINDOW);
    struct {
        int block, window, local, global, random, sliding, patterns, per_head, seed, n_globals;
        int globals[LOOM_SPARSE_MAX_LIST];
    } f = {64, 256, -1, -1, -1, -1, -1, 0, 0, -1, {0}};
    for (int a = 1; a < argc; a += 2) {
        const char *k = argv[a], *v = a + 1 < argc ? argv[a + 1] : NULL;
        if (!v) usage_exit("a flag without its value");
        if (!strcmp(k, "--B"))
            B = int_arg(k, v);
        else if (!strcmp(k, "--T"))
            T = int_arg(k, v);
        else if (!strcmp(k, "--C"))
            C = int_arg(k, v);
        else if (!strcmp(k, "--NH"))
            NH = int_arg(k, v);
        else if (!strcmp(k, "--repeats"))
            repeats = int_arg(k, v);
        else if (!strcmp(k, "--mode")) {
            enum loom_sparse_mode m;
            if (loom_sparse_mode_parse(v, &m)) usage_exit(loom_error_message());
            loom_sparse_config_default(&cfg, m);
            have_mode = 1;
        } else if (!strcmp(k, "--block"))
            f.block = int_arg(k, v);
        else if (!strcmp(k, "--window"))
            f.window = int_arg(k, v);
        else if (!strcmp(k, "--local"))
            f.local = int_arg(k, v);
        else if (!strcmp(k, "--global"))
            f.global = int_arg(k, v);
        else if (!strcmp(k, "--random"))
            f.random = int_arg(k, v);
        else if (!strcmp(k, "--sliding"))
            f.sliding = int_arg(k, v);
        else if (!strcmp(k, "--patterns"))
            f.patterns = int_arg(k, v);
        else if (!strcmp(k, "--per-head"))
            f.per_head = int_arg(k, v);
        else if (!strcmp(k, "--seed"))
            f.seed = int_arg(k, v);
        else if (!strcmp(k, "--global-indices"))
            f.n_globals = int_list(k, v, f.globals);
        else
            usage_exit("unknown flag");
    }
    if (!have_mode) usage_exit("--mode is required");
    if (B < 1 || T < 1 || NH < 1 || C % NH || repeats < 1)
        usage_exit("need B, T, NH, repeats >= 1 and NH | C");
    cfg.block = f.block, cfg.window = f.window, cfg.different_layout_per_head = f.per_head;
    cfg.seed = (uint64_t)f.seed;
    if (f.local >= 0) cfg.num_local_blocks = f.local, cfg.local_window_blocks[0] = f.local;
    if (f.global >= 0) cfg.num_global_blocks = f.global;
    if (f.random >= 0) cfg.num_random_blocks = f.random;
    if (f.sliding >= 0) cfg.num_sliding_window_blocks = f.sliding;
    if (f.patterns >= 0) cfg.num_different_global_patterns = f.patterns;
    if (f.n_globals >= 0) {
        memcpy(cfg.global_block_indices, f.globals, sizeof f.globals);
        cfg.n_global_block_indices = f.n_globals;
    }
    struct loom_sparse_layout l;
    if (loom_sparse_layout_build(&cfg, NH, T, &l)) {
        fprintf(stderr, "attn_bench: %s\n", loom_error_message());
        return 2;
    }
    const int64_t causal = (int64_t)NH * l.nb * (l.nb + 1) / 2;
    printf("layout %s blocks %lld causal_blocks %lld density %.4f threads %d blas %s\n",
           loom_sparse_mode_name(cfg.mode), (long long)l.nnz, (long long)causal,
           (double)l.nnz / (double)causal, loom_threads_get(), loom_blas_core_name());

    const size_t nqkv = (size_t)B * T * 3 * C, nout = (size_t)B * T * C;
    const size_t ndense = (size_t)B * NH * T * T, nsparse = loom_sparse_att_numel(&l, B, NH, 0);
    float *qkv = alloc_floats(nqkv, 0.0f), *dout = alloc_floats(nout, 0.0f);
    for (size_t i = 0; i < nqkv; i++) qkv[i] = (float)((i * 2654435761u) % 2001) / 1000.0f - 1.0f;
    for (size_t i = 0; i < nout; i++) dout[i] = (float)((i * 40503u) % 2001) / 1000.0f - 1.0f;
    float *out = alloc_floats(nout, 0.0f), *dqkv = alloc_floats(nqkv, 0.0f);
    float *att_d = alloc_floats(ndense, 0.0f), *datt_d = alloc_floats(ndense, 0.0f);
    float *att_s = alloc_floats(nsparse, 0.0f), *datt_s = alloc_floats(nsparse, 0.0f);
    double *td = malloc((size_t)repeats * sizeof(double)), *ts = malloc((size_t)repeats * sizeof(double));
    for (int r = -1; r < repeats; r++) { /* r = -1: warm-up */
        double t0 = loom_now();
        loom_attention_forward(out, att_d, qkv, B, T, C, NH);
        loom_attention_backward(dqkv, datt_d, dout, att_d, qkv, B, T, C, NH);
        const double dense_s = loom_now() - t0;
        t0 = loom_now();
        loom_sparse_attention_forward(out, att_s, qkv, B, T, C, NH, 0, &l);
        loom_sparse_attention_backward(dqkv, datt_s, dout, att_s, qkv, B, T, C, NH, 0, &l);
        const double sparse_s = loom_now() - t0;
        if (r < 0) continue;
        td[r] = 1e3 * dense_s, ts[r] = 1e3 * sparse_s;
        printf("rep %d dense_ms %.3f sparse_ms %.3f\n", r, td[r], ts[r]);
        fflush(stdout);
    }
    printf("dense median_ms %.3f att_bytes %zu\n", median(td, repeats), ndense * sizeof(float));
    printf("sparse median_ms %.3f att_bytes %zu\n", median(ts, repeats), nsparse * sizeof(float));
    free(qkv), free(dout), free(out), free(dqkv), free(att_d), free(datt_d), free(att_s), free(datt_s);
    free(td), free(ts);
    loom_sparse_layout_free(&l);
    return 0;
}
