/*
 * Unit test of the guarded backend (kernels/guarded/backend.c):
 *   - it is registered after "cpu"; each of its tables (float32, and the
 *     bf16 one where the CPU has one) has a wrapper exactly where the
 *     CPU's table has a kernel, and the CPU's own member where it passes
 *     one through (one check per member of kernels/guarded/members.h);
 *   - kernels on its buffers (matmul, residual, layernorm, cross-entropy,
 *     sum of squares, the non-finite check, AdamW; the bf16 table's
 *     matmul) give the CPU's bits on host buffers;
 *   - memset, copy, upload, download, convert, retag and free, the
 *     counters under each tag, zero-filled and distinct blocks (zero bytes
 *     too), freed pages reused as zeros; loom_devmem's owns, upload and
 *     download; counting mode hands out counted addresses;
 *   - host code that reads or writes a buffer directly (a child process)
 *     exits 1 with the one line naming the address; a fault elsewhere is
 *     still the fault it was.
 * Not here: the kernels' numerics (tests/test_kernels.c runs every check
 * on every registered backend, this one included, on host buffers).
 */
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#include "base/buf.h"
#include "base/dtype.h"
#include "base/mem.h"
#include "check.h"
#include "kernels/backend.h"
#include "kernels/guarded/members.h"

static const struct loom_backend *G, *CPU;
static size_t page;

/* ---- helpers -------------------------------------------------------------- */

static uint64_t rng_state = 0x2545f4914f6cdd1dull;

static float rnd(void)
{
    uint64_t z = (rng_state += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    z ^= z >> 31;
    return (float)((double)(z >> 11) / 9007199254740992.0 * 2.0 - 1.0);
}

/* A host buffer of n floats, page-aligned as the guarded ones are (so the
 * alignment cannot send a BLAS down another path), random unless zero. */
static float *host(size_t n, int zero)
{
    const size_t bytes = (n * sizeof(float) + page - 1) / page * page;
    float *x = aligned_alloc(page, bytes ? bytes : page);
    if (!x) {
        fprintf(stderr, "out of memory\n");
        exit(1);
    }
    for (size_t i = 0; i < n; i++) x[i] = zero ? 0.0f : rnd();
    return x;
}

/* A guarded buffer holding x (n floats). */
static float *dev(const float *x, size_t n, enum loom_mem_tag tag)
{
    float *d = G->alloc(n * sizeof(float), tag);
    G->upload(d, x, n * sizeof(float));
    return d;
}

/* The guarded buffer d (n floats) downloaded into a new host buffer. */
static float *fetch(const float *d, size_t n)
{
    float *x = host(n, 1);
    G->download(x, d, n * sizeof(float));
    return x;
}

static void check_bits(const char *what, const void *got, const void *want, size_t bytes)
{
    check_count++;
    if (memcmp(got, want, bytes) == 0) return;
    check_failures++;
    size_t i = 0;
    while (((const unsigned char *)got)[i] == ((const unsigned char *)want)[i]) i++;
    fprintf(stderr, "FAIL %s: not the CPU's bits (first difference at byte %zu of %zu)\n", what, i, bytes);
}

/* ---- the tables ------------------------------------------------------------- */

#define CHECK_MEMBER(name, cond)                                                                             \
    do {                                                                                                     \
        check_count++;                                                                                       \
        if (!(cond)) {                                                                                       \
            check_failures++;                                                                                \
            fprintf(stderr, "FAIL %s table: member %s\n", table, name);                                      \
        }                                                                                                    \
    } while (0)
/* a kernel: wrapped (another function) where the CPU has one, NULL where it has none */
#define WRAPPED(name, params, args)                                                                          \
    CHECK_MEMBER(#name, c->name ? w->name && (void (*)(void))w->name != (void (*)(void))c->name : !w->name);
#define WRAPPED_RET(type, name, params, args) WRAPPED(name, params, args)
/* touches no buffer: the CPU's own */
#define PASSED(name) CHECK_MEMBER(#name, w->name == c->name);

static void check_members(const char *table, const struct loom_kernels *w, const struct loom_kernels *c)
{
    LOOM_KERNELS_MEMBERS(WRAPPED, WRAPPED_RET, PASSED)
}

static void test_tables(void)
{
    CHECK(G && strcmp(G->name, "guarded") == 0 && G == loom_backend_guarded());
    CHECK(loom_backend_count() >= 2 && loom_backend_at(0) == CPU && loom_backend_at(1) == G);
    char names[256];
    loom_backend_names(names, sizeof names);
    CHECK(strstr(names, "cpu, guarded") != NULL);
    CHECK(G->device == LOOM_DEVICE_CPU && !G->synchronize);
    CHECK(G->alloc && G->free && G->retag && G->memset && G->copy && G->upload && G->download && G->convert);

    check_members("float32", G->k, CPU->k);
    CHECK(loom_backend_kernels(G, LOOM_DTYPE_F32) == G->k);
    CHECK(loom_backend_kernels(G, LOOM_DTYPE_F16) == G->k);
    /* the CPU's float32 table has no bf16-operand products, and a scratch size */
    CHECK(!G->k->matmul_forward_b16 && !G->k->matmul_backward_b16 && G->k->lm_head_lp_scratch);

    const struct loom_kernels *c16 = loom_backend_kernels(CPU, LOOM_DTYPE_BF16);
    const struct loom_kernels *g16 = loom_backend_kernels(G, LOOM_DTYPE_BF16);
    CHECK(g16 == loom_backend_kernels(G, LOOM_DTYPE_BF16)); /* made once */
    CHECK((c16 == CPU->k) == (g16 == G->k));
    check_members("bf16", g16, c16);
    printf("bf16 table: %s\n", c16 == CPU->k ? "the float32 one" : "its own");
}

/* ---- kernels: the CPU's bits --------------------------------------------------- */

static void test_matmul(const struct loom_kernels *gk, const struct loom_kernels *ck, const char *what, int N,
                        int C, int OC)
{
    float *inp = host((size_t)N * C, 0), *w = host((size_t)C * OC, 0), *b = host((size_t)OC, 0);
    float *want = host((size_t)N * OC, 1);
    ck->matmul_forward(want, inp, w, b, N, C, OC);
    float *dinp = dev(inp, (size_t)N * C, LOOM_MEM_ACTIVATIONS),
          *dw = dev(w, (size_t)C * OC, LOOM_MEM_PARAMS);
    float *db = dev(b, (size_t)OC, LOOM_MEM_PARAMS);
    float *dout = G->alloc((size_t)N * OC * sizeof(float), LOOM_MEM_ACTIVATIONS);
    gk->matmul_forward(dout, dinp, dw, db, N, C, OC);
    float *got = fetch(dout, (size_t)N * OC);
    check_bits(what, got, want, (size_t)N * OC * sizeof(float));
    G->free(dinp), G->free(dw), G->free(db), G->free(dout);
    free(inp), free(w), free(b), free(want), free(got);
}

static void test_kernels(void)
{
    const struct loom_kernels *gk = G->k, *ck = CPU->k;
    test_matmul(gk, ck, "matmul_forward 7x12x5", 7, 12, 5);
    test_matmul(gk, ck, "matmul_forward 64x96x130", 64, 96, 130);
    const struct loom_kernels *g16 = loom_backend_kernels(G, LOOM_DTYPE_BF16);
    const struct loom_kernels *c16 = loom_backend_kernels(CPU, LOOM_DTYPE_BF16);
    test_matmul(g16, c16, "bf16 table's matmul_forward 33x48x20", 33, 48, 20);

    /* residual */
    const size_t n = 1001;
    float *a = host(n, 0), *b = host(n, 0), *want = host(n, 1);
    ck->residual_forward(want, a, b, n);
    float *da = dev(a, n, LOOM_MEM_ACTIVATIONS), *db = dev(b, n, LOOM_MEM_ACTIVATIONS);
    float *dout = G->alloc(n * sizeof(float), LOOM_MEM_ACTIVATIONS);
    gk->residual_forward(dout, da, db, n);
    float *got = fetch(dout, n);
    check_bits("residual_forward", got, want, n * sizeof(float));
    free(got);

    /* sum of squares and the non-finite check, of a guarded buffer */
    const double s_cpu = ck->sum_squares(a, n), s_g = gk->sum_squares(da, n);
    check_bits("sum_squares", &s_g, &s_cpu, sizeof s_g);
    CHECK(gk->has_nonfinite(da, n) == 0);
    a[n / 2] = NAN;
    G->upload(da, a, n * sizeof(float));
    CHECK(gk->has_nonfinite(da, n) == 1 && ck->has_nonfinite(a, n) == 1);

    /* layernorm: out (N,C), mean and rstd (N) */
    const int N = 9, C = 40;
    float *x = host((size_t)N * C, 0), *lw = host((size_t)C, 0), *lb = host((size_t)C, 0);
    float *out = host((size_t)N * C, 1), *mean = host((size_t)N, 1), *rstd = host((size_t)N, 1);
    ck->layernorm_forward(out, mean, rstd, x, lw, lb, N, C, 1e-5f);
    float *dx = dev(x, (size_t)N * C, LOOM_MEM_ACTIVATIONS), *dlw = dev(lw, (size_t)C, LOOM_MEM_PARAMS);
    float *dlb = dev(lb, (size_t)C, LOOM_MEM_PARAMS);
    float *dlo = G->alloc((size_t)N * C * sizeof(float), LOOM_MEM_ACTIVATIONS);
    float *dmean = G->alloc((size_t)N * sizeof(float), LOOM_MEM_ACTIVATIONS);
    float *drstd = G->alloc((size_t)N * sizeof(float), LOOM_MEM_ACTIVATIONS);
    gk->layernorm_forward(dlo, dmean, drstd, dx, dlw, dlb, N, C, 1e-5f);
    float *g_out = fetch(dlo, (size_t)N * C), *g_mean = fetch(dmean, (size_t)N),
          *g_rstd = fetch(drstd, (size_t)N);
    check_bits("layernorm_forward out", g_out, out, (size_t)N * C * sizeof(float));
    check_bits("layernorm_forward mean", g_mean, mean, (size_t)N * sizeof(float));
    check_bits("layernorm_forward rstd", g_rstd, rstd, (size_t)N * sizeof(float));

    /* cross-entropy: logits (N,C) with targets in a guarded int32 buffer */
    int32_t targets[9];
    for (int i = 0; i < N; i++) targets[i] = (i * 7) % C;
    int32_t *dtargets = G->alloc(sizeof targets, LOOM_MEM_ACTIVATIONS);
    G->upload(dtargets, targets, sizeof targets);
    float losses[9], lse[9], g_losses[9], g_lse[9];
    ck->crossentropy_forward(losses, lse, x, targets, N, C);
    float *dlosses = G->alloc(sizeof losses, LOOM_MEM_ACTIVATIONS),
          *dlse = G->alloc(sizeof lse, LOOM_MEM_ACTIVATIONS);
    gk->crossentropy_forward(dlosses, dlse, dx, dtargets, N, C);
    G->download(g_losses, dlosses, sizeof g_losses);
    G->download(g_lse, dlse, sizeof g_lse);
    check_bits("crossentropy_forward losses", g_losses, losses, sizeof losses);
    check_bits("crossentropy_forward lse", g_lse, lse, sizeof lse);

    /* AdamW: three steps on param, m, v; grad from b */
    float *p = host(n, 0), *m = host(n, 1), *v = host(n, 1);
    float *dp = dev(p, n, LOOM_MEM_PARAMS), *dm = dev(m, n, LOOM_MEM_OPTIMIZER),
          *dv = dev(v, n, LOOM_MEM_OPTIMIZER);
    for (int t = 1; t <= 3; t++) {
        ck->adamw_update(p, m, v, b, n, 1e-3f, 0.9f, 0.95f, 1e-8f, 0.1f, 0.5f, t);
        gk->adamw_update(dp, dm, dv, db, n, 1e-3f, 0.9f, 0.95f, 1e-8f, 0.1f, 0.5f, t);
    }
    float *gp = fetch(dp, n), *gm = fetch(dm, n), *gv = fetch(dv, n);
    check_bits("adamw_update param", gp, p, n * sizeof(float));
    check_bits("adamw_update m", gm, m, n * sizeof(float));
    check_bits("adamw_update v", gv, v, n * sizeof(float));

    G->free(da), G->free(db), G->free(dout), G->free(dx), G->free(dlw), G->free(dlb), G->free(dlo);
    G->free(dmean), G->free(drstd), G->free(dtargets), G->free(dlosses), G->free(dlse);
    G->free(dp), G->free(dm), G->free(dv);
    free(a), free(b), free(want), free(x), free(lw), free(lb), free(out), free(mean), free(rstd);
    free(g_out), free(g_mean), free(g_rstd), free(p), free(m), free(v), free(gp), free(gm), free(gv);
}

/* ---- memory ---------------------------------------------------------------------- */

static int64_t delta(const struct loom_mem_stats *before, enum loom_mem_tag tag)
{
    struct loom_mem_stats now;
    loom_mem_get_stats(&now);
    return now.current[tag] - before->current[tag];
}

static int all_bytes(const unsigned char *x, size_t n, unsigned char v)
{
    for (size_t i = 0; i < n; i++)
        if (x[i] != v) return 0;
    return 1;
}

static void test_memory(void)
{
    struct loom_mem_stats s0;
    loom_mem_get_stats(&s0);
    const size_t n = 1000;
    unsigned char *a = G->alloc(n, LOOM_MEM_PARAMS), *b = G->alloc(n, LOOM_MEM_GRADS);
    void *z1 = G->alloc(0, LOOM_MEM_OTHER), *z2 = G->alloc(0, LOOM_MEM_OTHER);
    CHECK(a && b && z1 && z2 && a != b && z1 != z2 && z1 != (void *)a && z2 != (void *)b);
    CHECK((uintptr_t)a % page == 0 && (uintptr_t)b % page == 0 && (uintptr_t)z1 % page == 0);
    CHECK(delta(&s0, LOOM_MEM_PARAMS) == (int64_t)n && delta(&s0, LOOM_MEM_GRADS) == (int64_t)n);
    CHECK(delta(&s0, LOOM_MEM_OTHER) == 0);

    unsigned char h[1000];
    G->download(h, a, n);
    CHECK(all_bytes(h, n, 0)); /* zero-filled */
    G->memset(a, 0x5a, n);
    G->download(h, a, n);
    CHECK(all_bytes(h, n, 0x5a));
    G->copy(b, a, n);
    G->download(h, b, n);
    CHECK(all_bytes(h, n, 0x5a));

    /* convert: float32 <-> bf16 on the device as on the host */
    const size_t k = 200;
    float *x = host(k, 0);
    uint16_t want16[200], got16[200];
    loom_buf_convert(loom_buf_of(want16, k, LOOM_DTYPE_BF16), loom_buf_f32(x, k));
    float *dx = dev(x, k, LOOM_MEM_ACTIVATIONS);
    uint16_t *d16 = G->alloc(sizeof got16, LOOM_MEM_ACTIVATIONS);
    G->convert(loom_buf_of(d16, k, LOOM_DTYPE_BF16), loom_buf_f32(dx, k));
    G->download(got16, d16, sizeof got16);
    check_bits("convert f32 -> bf16", got16, want16, sizeof got16);
    float back[200], got_back[200];
    loom_buf_convert(loom_buf_f32(back, k), loom_buf_of(want16, k, LOOM_DTYPE_BF16));
    G->convert(loom_buf_f32(dx, k), loom_buf_of(d16, k, LOOM_DTYPE_BF16));
    G->download(got_back, dx, sizeof got_back);
    check_bits("convert bf16 -> f32", got_back, back, sizeof back);

    /* retag moves the count; the same tag again changes nothing */
    G->retag(a, LOOM_MEM_OPTIMIZER);
    CHECK(delta(&s0, LOOM_MEM_PARAMS) == 0 && delta(&s0, LOOM_MEM_OPTIMIZER) == (int64_t)n);
    G->retag(a, LOOM_MEM_OPTIMIZER);
    CHECK(delta(&s0, LOOM_MEM_OPTIMIZER) == (int64_t)n);

    /* the comm layer's view */
    const struct loom_devmem *dm = loom_devmem();
    CHECK(dm && dm->owns && dm->download && dm->upload);
    if (dm) {
        CHECK(dm->owns(a) && dm->owns(a + n - 1) && dm->owns(b) && dm->owns(z1) && dm->owns(d16));
        CHECK(!dm->owns(h) && !dm->owns(x) && !dm->owns(NULL));
        float y[200];
        dm->upload(dx, x, k * sizeof(float));
        dm->download(y, dx, k * sizeof(float));
        check_bits("devmem upload/download", y, x, sizeof y);
    }

    /* free: the count goes back, the pages are no one's, and come back zero */
    G->free(a);
    G->free(NULL);
    CHECK(delta(&s0, LOOM_MEM_OPTIMIZER) == 0);
    if (dm) CHECK(!dm->owns(a));
    unsigned char *a2 = G->alloc(n, LOOM_MEM_PARAMS);
    CHECK(a2 == a); /* first fit */
    G->download(h, a2, n);
    CHECK(all_bytes(h, n, 0));

    /* a larger block, written and read back at its end */
    const size_t big = (size_t)3 << 20;
    unsigned char *c = G->alloc(big, LOOM_MEM_ACTIVATIONS);
    G->memset(c + big - n, 0x77, n);
    G->download(h, c + big - n, n);
    CHECK(all_bytes(h, n, 0x77));
    CHECK(delta(&s0, LOOM_MEM_ACTIVATIONS) == (int64_t)(big + k * sizeof(float) + sizeof got16));

    G->free(a2), G->free(b), G->free(z1), G->free(z2), G->free(dx), G->free(d16), G->free(c);
    for (int t = 0; t < LOOM_MEM_COUNT; t++) CHECK(delta(&s0, (enum loom_mem_tag)t) == 0);
    free(x);
}

/* Counting mode: counted addresses, not the region's, and no real bytes. */
static void test_counting(void)
{
    struct loom_mem_stats s0, st;
    loom_mem_get_stats(&s0);
    loom_mem_count_begin();
    void *p = G->alloc((size_t)1 << 36, LOOM_MEM_PARAMS);
    void *q = G->alloc(100, LOOM_MEM_ACTIVATIONS);
    CHECK(loom_mem_is_counted(p) && loom_mem_is_counted(q));
    CHECK(!loom_devmem()->owns(p));
    G->retag(p, LOOM_MEM_GRADS);
    G->free(q);
    loom_mem_count_end(&st);
    CHECK(st.current[LOOM_MEM_GRADS] == (int64_t)1 << 36 && st.current[LOOM_MEM_PARAMS] == 0);
    CHECK(st.peak[LOOM_MEM_ACTIVATIONS] == 100 && st.current[LOOM_MEM_ACTIVATIONS] == 0);
    G->free(p);
    for (int t = 0; t < LOOM_MEM_COUNT; t++) CHECK(delta(&s0, (enum loom_mem_tag)t) == 0);
}

/* ---- faults ------------------------------------------------------------------------ */

/* fn(arg) in a child with stderr into out (cap bytes, terminated); its wait status. */
static int in_child(void (*fn)(void *), void *arg, char *out, size_t cap)
{
    int fd[2];
    if (pipe(fd) != 0) return -1;
    fflush(stdout), fflush(stderr);
    const pid_t pid = fork();
    if (pid < 0) return -1;
    if (pid == 0) {
        close(fd[0]);
        dup2(fd[1], STDERR_FILENO);
        const struct rlimit no_core = {0, 0};
        setrlimit(RLIMIT_CORE, &no_core);
        fn(arg);
        _exit(0);
    }
    close(fd[1]);
    size_t used = 0;
    ssize_t r;
    while ((r = read(fd[0], out + used, cap - 1 - used)) > 0) used += (size_t)r;
    out[used] = 0;
    close(fd[0]);
    int status = 0;
    waitpid(pid, &status, 0);
    return status;
}

static void read_it(void *p)
{
    volatile float *f = p;
    const float v = f[0];
    printf("read %g: not caught\n", (double)v);
}

static void write_it(void *p)
{
    volatile float *f = p;
    f[0] = 1.0f;
}

static const char *const caught = "loom: error: host code touched the guarded backend's memory at ";

static void expect_caught(const char *what, void (*fn)(void *), void *p)
{
    char out[8192], addr[64];
    const int status = in_child(fn, p, out, sizeof out);
    snprintf(addr, sizeof addr, "%s%p (its buffers are reached through the backend's calls only)\n", caught,
             p);
    const int ok = WIFEXITED(status) && WEXITSTATUS(status) == 1 && strstr(out, addr) == out;
    CHECK(ok);
    if (!ok)
        fprintf(stderr, "  %s: status 0x%x, stderr:\n%s\n  want a first line: %s", what, status, out, addr);
}

static void test_faults(void)
{
    float x[1000];
    for (int i = 0; i < 1000; i++) x[i] = (float)i;
    float *d = dev(x, 1000, LOOM_MEM_ACTIVATIONS);
    expect_caught("read", read_it, d);
    expect_caught("write", write_it, d);
    expect_caught("read in the middle", read_it, d + 777);
    /* still readable through the backend, and unchanged by the child */
    float y[1000];
    G->download(y, d, sizeof y);
    check_bits("after the faults", y, x, sizeof y);
    G->free(d);
    /* a freed buffer is the region's still */
    expect_caught("read after free", read_it, d);

    /* a fault outside the region is the one it was: the signal (a
     * sanitizer's handler: its own report and exit status) */
    void *other = mmap(NULL, page, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    CHECK(other != MAP_FAILED);
    if (other == MAP_FAILED) return;
    char out[8192];
    const int status = in_child(read_it, other, out, sizeof out);
    CHECK(strstr(out, caught) == NULL);
#ifdef __SANITIZE_ADDRESS__
    CHECK(WIFEXITED(status) && WEXITSTATUS(status) != 0);
#else
    CHECK(WIFSIGNALED(status) && WTERMSIG(status) == SIGSEGV);
#endif
    munmap(other, page);
}

int main(void)
{
    page = (size_t)sysconf(_SC_PAGESIZE);
    CPU = loom_backend_cpu();
    G = loom_backend_get("guarded");
    if (!G) {
        fprintf(stderr, "FAIL: no backend named guarded\n");
        return 1;
    }
    test_tables();
    test_kernels();
    test_memory();
    test_counting();
    test_faults();
    return check_summary("test_backend_guarded");
}
