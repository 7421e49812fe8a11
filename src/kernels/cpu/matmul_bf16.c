/*
 * Dense layers, the LM head and the linear layer on the CPU's bf16 units:
 * the same products as matmul.c (same signatures, layouts and gradient
 * rule), with both operands rounded to bf16 and products accumulated in
 * float32, through oneDNN's matmul primitive. oneDNN picks its kernel by
 * the CPU's features (AMX tiles, then AVX512-BF16's dot products, then an
 * emulation on plain AVX512); which units run is chosen once per process
 * (loom_bf16_units_select) by capping the instruction set oneDNN may use,
 * or set aside for matmul.c's float32 path.
 *
 * Under --bf16 every operand is already bf16-valued (the parameters are held
 * in bf16; the activations and their gradients are rounded as they are
 * written), so the rounding here is exact and the products differ from the
 * float32 path only in the order of the float32 additions.
 *
 * Operands are converted into scratch buffers kept between calls; primitives
 * are kept by shape. Every call runs outside any parallel region (oneDNN
 * uses the OpenMP pool, sized by loom_threads_set), one at a time.
 * Deliberately not: fused bias or activations, or weights kept in bf16
 * between calls.
 */
#include "kernels/kernels.h"

#include <cpuid.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/dtype.h"
#include "base/log.h"
#include "base/mem.h"

static const char *const unit_names[LOOM_BF16_UNITS_COUNT] = {"f32", "avx512", "avx512_bf16", "amx"};

const char *loom_bf16_units_name(enum loom_bf16_units u)
{
    return u >= 0 && u < LOOM_BF16_UNITS_COUNT ? unit_names[u] : "?";
}

#ifdef LOOM_HAVE_DNNL
#include <dnnl.h>

/* The best units the CPU has, from cpuid: leaf 7 subleaf 0 (EBX bit 16 AVX512F,
 * EDX bits 22 and 24 AMX-BF16 and AMX-TILE) and subleaf 1 (EAX bit 5
 * AVX512-BF16); the OS must save the vector state too (XCR0), which oneDNN
 * checks again before it uses a kernel. */
static enum loom_bf16_units units_present(void)
{
    unsigned a, b, c, d;
    if (!__get_cpuid_count(7, 0, &a, &b, &c, &d) || !(b & (1u << 16))) return LOOM_BF16_UNITS_F32;
    const int amx = (d & (1u << 22)) && (d & (1u << 24));
    unsigned a1 = 0, b1, c1, d1;
    __get_cpuid_count(7, 1, &a1, &b1, &c1, &d1);
    if (amx) return LOOM_BF16_UNITS_AMX;
    if (a1 & (1u << 5)) return LOOM_BF16_UNITS_AVX512_BF16;
    return LOOM_BF16_UNITS_F32; /* oneDNN's emulation on plain AVX512 is slower than sgemm: forced only */
}

/* Whether the CPU has AVX512 (F, DQ, BW, VL: oneDNN's avx512_core), which
 * every bf16 path needs; without it a forced path is the float32 one. */
static int avx512_core_present(void)
{
    unsigned a, b, c, d;
    const unsigned need = (1u << 16) | (1u << 17) | (1u << 30) | (1u << 31);
    return __get_cpuid_count(7, 0, &a, &b, &c, &d) && (b & need) == need;
}

static int selected = -1; /* enum loom_bf16_units, -1 until chosen */

/* ---- primitives by shape ------------------------------------------------------ */

/* dst (M,N) [+]= a (M,K) b (K,N), each operand row-major or, transposed,
 * stored as its transpose. */
struct shape {
    int M, N, K, a_t, b_t, acc, d16; /* d16: dst is bf16 (rounded from the float32 sums) */
};

struct prim {
    struct shape s;
    dnnl_primitive_t p;
    dnnl_memory_t a, b, dst;
};

#define MAX_PRIMS 128
static struct {
    dnnl_engine_t engine;
    dnnl_stream_t stream;
    struct prim prims[MAX_PRIMS];
    int nprims;
    uint16_t *a16, *b16; /* converted operands */
    size_t a_cap, b_cap; /* in elements */
    char impl[64];       /* the kernel oneDNN chose, of the first primitive */
} dn;

#define DNNL_OK(call)                                                                                        \
    do {                                                                                                     \
        dnnl_status_t st_ = (call);                                                                          \
        if (st_ != dnnl_success) loom_die("oneDNN: %s failed (status %d)", #call, (int)st_);                 \
    } while (0)

static void engine_up(void)
{
    if (dn.engine) return;
    DNNL_OK(dnnl_engine_create(&dn.engine, dnnl_cpu, 0));
    DNNL_OK(dnnl_stream_create(&dn.stream, dn.engine, dnnl_stream_default_flags));
}

static struct prim *prim_for(struct shape s)
{
    for (int i = 0; i < dn.nprims; i++)
        if (!memcmp(&dn.prims[i].s, &s, sizeof s)) return &dn.prims[i];
    engine_up();
    if (dn.nprims == MAX_PRIMS) { /* a full table starts over: shapes recur each step */
        for (int i = 0; i < dn.nprims; i++) {
            dnnl_primitive_destroy(dn.prims[i].p);
            dnnl_memory_destroy(dn.prims[i].a);
            dnnl_memory_destroy(dn.prims[i].b);
            dnnl_memory_destroy(dn.prims[i].dst);
        }
        dn.nprims = 0;
    }
    struct prim *p = &dn.prims[dn.nprims];
    dnnl_memory_desc_t a, b, d;
    const dnnl_dims_t da = {s.M, s.K}, db = {s.K, s.N}, dd = {s.M, s.N};
    DNNL_OK(dnnl_memory_desc_init_by_tag(&a, 2, da, dnnl_bf16, s.a_t ? dnnl_ba : dnnl_ab));
    DNNL_OK(dnnl_memory_desc_init_by_tag(&b, 2, db, dnnl_bf16, s.b_t ? dnnl_ba : dnnl_ab));
    DNNL_OK(dnnl_memory_desc_init_by_tag(&d, 2, dd, s.d16 ? dnnl_bf16 : dnnl_f32, dnnl_ab));
    dnnl_matmul_desc_t md;
    DNNL_OK(dnnl_matmul_desc_init(&md, &a, &b, NULL, &d));
    dnnl_primitive_attr_t attr;
    DNNL_OK(dnnl_primitive_attr_create(&attr));
    if (s.acc) { /* dst += a b: a sum post-op */
        dnnl_post_ops_t po;
        DNNL_OK(dnnl_post_ops_create(&po));
        DNNL_OK(dnnl_post_ops_append_sum(po, 1.0f));
        DNNL_OK(dnnl_primitive_attr_set_post_ops(attr, po));
        dnnl_post_ops_destroy(po);
    }
    dnnl_primitive_desc_t pd;
    DNNL_OK(dnnl_primitive_desc_create(&pd, &md, attr, dn.engine, NULL));
    dnnl_primitive_attr_destroy(attr);
    if (!dn.impl[0]) {
        const char *impl = NULL;
        if (dnnl_primitive_desc_query(pd, dnnl_query_impl_info_str, 0, &impl) == dnnl_success && impl)
            snprintf(dn.impl, sizeof dn.impl, "oneDNN %s", impl);
    }
    DNNL_OK(dnnl_primitive_create(&p->p, pd));
    dnnl_primitive_desc_destroy(pd);
    DNNL_OK(dnnl_memory_create(&p->a, &a, dn.engine, DNNL_MEMORY_NONE));
    DNNL_OK(dnnl_memory_create(&p->b, &b, dn.engine, DNNL_MEMORY_NONE));
    DNNL_OK(dnnl_memory_create(&p->dst, &d, dn.engine, DNNL_MEMORY_NONE));
    p->s = s;
    dn.nprims++;
    return p;
}

static uint16_t *scratch(uint16_t **buf, size_t *cap, size_t n)
{
    if (n > *cap) {
        loom_free(*buf);
        *buf = loom_alloc(loom_mul_size(n, sizeof(uint16_t)), LOOM_MEM_OTHER);
        *cap = n;
    }
    return *buf;
}

/* An operand in bf16: abf as it is, or a (n values) converted into the
 * scratch buffer *buf. */
static const uint16_t *operand(const float *a, const uint16_t *abf, size_t n, uint16_t **buf, size_t *cap)
{
    if (abf) return abf;
    uint16_t *conv = scratch(buf, cap, n);
    loom_f32_to_bf16_array(conv, a, n);
    return conv;
}

/* dst (M,N) = a b, or += with acc; a is (M,K) row-major, or with a_t its
 * transpose (K,M) row-major; b likewise (K,N), or (N,K) with b_t. Each
 * operand is float32 (converted), or already bf16 (abf, bbf non-NULL); dst
 * is float32, or with d16 bf16 (the float32 sums rounded). */
static void gemm_x(int M, int N, int K, const float *a, const uint16_t *abf, int a_t, const float *b,
                   const uint16_t *bbf, int b_t, void *dst, int acc, int d16)
{
    const struct shape s = {M, N, K, a_t, b_t, acc, d16};
    struct prim *p = prim_for(s);
    const uint16_t *a16 = operand(a, abf, (size_t)M * K, &dn.a16, &dn.a_cap);
    const uint16_t *b16 = operand(b, bbf, (size_t)K * N, &dn.b16, &dn.b_cap);
    DNNL_OK(dnnl_memory_set_data_handle(p->a, (void *)a16));
    DNNL_OK(dnnl_memory_set_data_handle(p->b, (void *)b16));
    DNNL_OK(dnnl_memory_set_data_handle(p->dst, dst));
    const dnnl_exec_arg_t args[3] = {{DNNL_ARG_SRC, p->a}, {DNNL_ARG_WEIGHTS, p->b}, {DNNL_ARG_DST, p->dst}};
    DNNL_OK(dnnl_primitive_execute(p->p, dn.stream, 3, args));
    DNNL_OK(dnnl_stream_wait(dn.stream));
}

static void gemm(int M, int N, int K, const float *a, int a_t, const float *b, int b_t, float *dst, int acc)
{
    gemm_x(M, N, K, a, NULL, a_t, b, NULL, b_t, dst, acc, 0);
}

int loom_bf16_units_select(const char *forced)
{
    const enum loom_bf16_units present = units_present();
    enum loom_bf16_units want = present;
    if (forced && *forced && strcmp(forced, "auto") != 0) {
        int found = -1;
        for (int u = 0; u < LOOM_BF16_UNITS_COUNT; u++)
            if (!strcmp(forced, unit_names[u])) found = u;
        if (found < 0)
            return loom_error_set(
                LOOM_ERR_INPUT, "LOOM_BF16_UNITS=%s: expected auto, amx, avx512_bf16, avx512 or f32", forced);
        want = (enum loom_bf16_units)found;
        if (!avx512_core_present()) want = LOOM_BF16_UNITS_F32; /* no bf16 path runs here at all */
    }
    if (selected >= 0) { /* oneDNN's instruction-set cap is set once per process */
        if ((int)want != selected)
            return loom_error_set(LOOM_ERR_INPUT, "bf16 units: %s already in use, cannot switch to %s",
                                  unit_names[selected], unit_names[want]);
        return LOOM_OK;
    }
    /* a path above what the CPU has runs on the best it has (oneDNN's cap is a ceiling) */
    static const dnnl_cpu_isa_t cap[LOOM_BF16_UNITS_COUNT] = {dnnl_cpu_isa_all, dnnl_cpu_isa_avx512_core,
                                                              dnnl_cpu_isa_avx512_core_bf16,
                                                              dnnl_cpu_isa_avx512_core_amx};
    if (want != LOOM_BF16_UNITS_F32 && dnnl_set_max_cpu_isa(cap[want]) != dnnl_success)
        return loom_error_set(LOOM_ERR_RUNTIME, "bf16 units: oneDNN refused the instruction-set cap %s",
                              unit_names[want]);
    selected = want;
    return LOOM_OK;
}

enum loom_bf16_units loom_bf16_units(void)
{
    if (selected < 0 && loom_bf16_units_select(NULL) != LOOM_OK) selected = LOOM_BF16_UNITS_F32;
    return (enum loom_bf16_units)selected;
}

const char *loom_bf16_units_kernel(void)
{
    if (loom_bf16_units() == LOOM_BF16_UNITS_F32) return "OpenBLAS sgemm";
    if (!dn.impl[0]) { /* ask with a small product */
        float x[16 * 16] = {0}, y[16 * 16];
        gemm(16, 16, 16, x, 0, x, 0, y, 0);
    }
    return dn.impl;
}

#else /* no oneDNN in this build: the float32 path only */

int loom_bf16_units_select(const char *forced)
{
    if (forced && *forced && strcmp(forced, "auto") != 0 && strcmp(forced, "f32") != 0)
        return loom_error_set(LOOM_ERR_INPUT, "LOOM_BF16_UNITS=%s: this build has no oneDNN (only f32 runs)",
                              forced);
    return LOOM_OK;
}

enum loom_bf16_units loom_bf16_units(void)
{
    return LOOM_BF16_UNITS_F32;
}

const char *loom_bf16_units_kernel(void)
{
    return "OpenBLAS sgemm";
}

static void gemm_x(int M, int N, int K, const float *a, const uint16_t *abf, int a_t, const float *b,
                   const uint16_t *bbf, int b_t, void *dst, int acc, int d16)
{
    (void)M, (void)N, (void)K, (void)a, (void)abf, (void)a_t, (void)b, (void)bbf, (void)b_t, (void)dst,
        (void)acc, (void)d16;
    LOOM_ASSERT(!"no oneDNN: the bf16 products are never chosen");
}

static void gemm(int M, int N, int K, const float *a, int a_t, const float *b, int b_t, float *dst, int acc)
{
    gemm_x(M, N, K, a, NULL, a_t, b, NULL, b_t, dst, acc, 0);
}

#endif

/* ---- the products (matmul.c's, operands rounded to bf16) -------------------------- */

void loom_matmul_forward_bf16(float *out, const float *inp, const float *weight, const float *bias, int N,
                              int C, int OC)
{
    if (bias) {
#pragma omp parallel for schedule(static) if ((size_t)N * OC >= 32768)
        for (int i = 0; i < N; i++) memcpy(out + (size_t)i * OC, bias, (size_t)OC * sizeof(float));
    }
    gemm(N, OC, C, inp, 0, weight, 0, out, bias != NULL);
}

void loom_matmul_backward_bf16(float *dinp, float *dweight, float *dbias, const float *dout, const float *inp,
                               const float *weight, int N, int C, int OC)
{
    if (dinp) gemm(N, C, OC, dout, 0, weight, 1, dinp, 0);    /* dout @ weight^T */
    if (dweight) gemm(C, OC, N, inp, 1, dout, 0, dweight, 1); /* dweight += inp^T @ dout */
    if (dbias) loom_bias_backward(dbias, dout, N, OC);
}

/* The LM head is the linear layer without bias: the same products. */
void loom_lm_head_forward_bf16(float *logits, const float *inp, const float *wte, int N, int C, int V)
{
    loom_linear_forward_bf16(logits, inp, NULL, wte, NULL, NULL, N, C, V);
}

void loom_lm_head_backward_bf16(float *dinp, float *dwte, const float *dlogits, const float *inp,
                                const float *wte, int N, int C, int V)
{
    loom_linear_backward_bf16(dinp, dwte, NULL, dlogits, inp, NULL, wte, NULL, N, C, V);
}

void loom_lm_head_backward_lp_bf16(float *dinp, float *dwte, const uint16_t *dlogits, enum loom_dtype dt,
                                   const float *inp, const float *wte, const uint16_t *wte16, int N, int C,
                                   int V)
{
    if (dt != LOOM_DTYPE_BF16) {
        loom_lm_head_backward_lp(dinp, dwte, dlogits, dt, inp, wte, wte16, N, C, V);
        return;
    }
    if (dinp) gemm_x(N, C, V, NULL, dlogits, 0, wte, wte16, 0, dinp, 0, 0);
    gemm_x(V, C, N, NULL, dlogits, 1, inp, NULL, 0, dwte, 1, 0);
}

void loom_lm_head_forward_lp_bf16(uint16_t *logits, enum loom_dtype dt, const float *inp, const float *wte,
                                  const uint16_t *wte16, int N, int C, int V)
{
    if (dt != LOOM_DTYPE_BF16) {
        loom_lm_head_forward_lp(logits, dt, inp, wte, wte16, N, C, V);
        return;
    }
    gemm_x(N, V, C, inp, NULL, 0, wte, wte16, 1, logits, 0, 1);
}

void loom_matmul_forward_b16(float *out, const float *inp, const uint16_t *inp16, const float *weight,
                             const uint16_t *weight16, const float *bias, int N, int C, int OC)
{
    if (bias) {
#pragma omp parallel for schedule(static) if ((size_t)N * OC >= 32768)
        for (int i = 0; i < N; i++) memcpy(out + (size_t)i * OC, bias, (size_t)OC * sizeof(float));
    }
    gemm_x(N, OC, C, inp, inp16, 0, weight, weight16, 0, out, bias != NULL, 0);
}

void loom_matmul_backward_b16(float *dinp, float *dweight, float *dbias, const float *dout, const float *inp,
                              const uint16_t *inp16, const float *weight, const uint16_t *weight16, int N,
                              int C, int OC)
{
    if (dinp) gemm_x(N, C, OC, dout, NULL, 0, weight, weight16, 1, dinp, 0, 0); /* dout @ weight^T */
    if (dweight) gemm_x(C, OC, N, inp, inp16, 1, dout, NULL, 0, dweight, 1, 0); /* dweight += inp^T @ dout */
    if (dbias) loom_bias_backward(dbias, dout, N, OC);
}

/* out (N,OC) = inp (N,C) @ weight (OC,C)^T, then the bias added to each row */
void loom_linear_forward_bf16(float *out, const float *inp, const uint16_t *inp16, const float *weight,
                              const uint16_t *weight16, const float *bias, int N, int C, int OC)
{
    gemm_x(N, OC, C, inp, inp16, 0, weight, weight16, 1, out, 0, 0);
    if (bias) loom_bias_forward(out, bias, N, OC);
}

void loom_linear_backward_bf16(float *dinp, float *dweight, float *dbias, const float *dout, const float *inp,
                               const uint16_t *inp16, const float *weight, const uint16_t *weight16, int N,
                               int C, int OC)
{
    if (dinp) gemm_x(N, C, OC, dout, NULL, 0, weight, weight16, 0, dinp, 0, 0); /* dout @ weight */
    if (dweight) gemm_x(OC, C, N, dout, NULL, 1, inp, inp16, 0, dweight, 1, 0); /* dweight += dout^T @ inp */
    if (dbias) loom_bias_backward(dbias, dout, N, OC);
}
