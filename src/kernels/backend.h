/*
 * The kernel backend interface: a table of kernels plus the memory
 * operations a device needs, one `struct loom_backend` per device (ggml's
 * ggml-backend-impl.h habit). The CPU backend (kernels/cpu/backend.c) is the
 * first, the guarded one (kernels/guarded/backend.c: the CPU's kernels on
 * memory host code cannot touch, for tests) the second; a CUDA one plugs in
 * beside them with its own table.
 *
 * Every kernel member has the signature, argument order and gradient rule
 * of the free function of the same name in kernels/kernels.h (lp_sum_squares,
 * lp_has_nonfinite and lp_accumulate: base/dtype.h; sumsq_exact_add:
 * base/sumsq_exact.h), without the loom_ prefix:
 * `k->matmul_forward(out, inp, weight, bias, N, C, OC)` is
 * loom_matmul_forward on the CPU. Pointers are to the backend's device
 * memory. Members are required unless marked optional, with what NULL means.
 *
 * loom_kernels_ref() is the reference table that tests/test_kernels.c holds
 * every backend against: the plain `_ref` loops where they exist, and the
 * CPU kernel itself where it has none.
 *
 * Not here: streams or asynchronous kernels, graph capture, choosing a
 * backend from the configuration (the caller asks loom_backend_get by name).
 */
#ifndef LOOM_KERNELS_BACKEND_H
#define LOOM_KERNELS_BACKEND_H

#include <stddef.h>
#include <stdint.h>

#include "base/buf.h"
#include "base/fp8.h"
#include "base/mem.h"

struct loom_dropout;       /* kernels/kernels.h */
struct loom_flash_attn;    /* kernels/kernels.h */
struct loom_grouped;       /* kernels/kernels.h */
struct loom_sparse_layout; /* kernels/sparse_layout.h */
struct loom_sumsq_exact;   /* base/sumsq_exact.h */

struct loom_kernels {
    /* ---- embedding: out (B,T,C) = wte[tokens] (V,C) + wpe[t] (maxT,C) */
    void (*embedding_forward)(float *out, const int32_t *tokens, const float *wte, const float *wpe, int B,
                              int T, int C);
    /* dwte (V,C), dwpe (maxT,C) accumulate; either may be NULL to skip it */
    void (*embedding_backward)(float *dwte, float *dwpe, const float *dout, const int32_t *tokens, int B,
                               int T, int C);
    /* ---- vocabulary-parallel embedding: this rank's rows [v0, v0+Vl) of wte (Vl,C);
     * out (B,T,C) written, zero for other tokens, wpe (maxT,C) added when not NULL */
    void (*embedding_vp_forward)(float *out, const int32_t *tokens, const float *wte, const float *wpe,
                                 int v0, int Vl, int B, int T, int C);
    /* dwte (Vl,C) accumulates this rank's tokens only, dwpe (maxT,C) accumulates;
     * either may be NULL to skip it */
    void (*embedding_vp_backward)(float *dwte, float *dwpe, const float *dout, const int32_t *tokens, int v0,
                                  int Vl, int B, int T, int C);

    /* ---- layernorm: out (N,C); saves mean (N), rstd (N) */
    void (*layernorm_forward)(float *out, float *mean, float *rstd, const float *inp, const float *weight,
                              const float *bias, int N, int C, float eps);
    /* dinp (N,C), dweight (C), dbias (C) accumulate */
    void (*layernorm_backward)(float *dinp, float *dweight, float *dbias, const float *dout, const float *inp,
                               const float *weight, const float *mean, const float *rstd, int N, int C);

    /* ---- matmul: out (N,OC) = inp (N,C) @ weight (C,OC) + bias (OC, may be NULL) */
    void (*matmul_forward)(float *out, const float *inp, const float *weight, const float *bias, int N, int C,
                           int OC);
    /* dinp (N,C) written; dweight (C,OC), dbias (OC) accumulate; each skipped when NULL */
    void (*matmul_backward)(float *dinp, float *dweight, float *dbias, const float *dout, const float *inp,
                            const float *weight, int N, int C, int OC);
    /* ---- bias gradient: dbias (OC) += the column sums of dout (N,OC), each
     * column's rows in order in double, rounded once (matmul_backward's dbias) */
    void (*bias_backward)(float *dbias, const float *dout, int N, int OC);

    /* ---- LM head: logits (N,V) = inp (N,C) @ wte (V,C)^T */
    void (*lm_head_forward)(float *logits, const float *inp, const float *wte, int N, int C, int V);
    /* dinp (N,C) written, dwte (V,C) accumulates; each skipped when NULL (dinp in the _lp form too) */
    void (*lm_head_backward)(float *dinp, float *dwte, const float *dlogits, const float *inp,
                             const float *wte, int N, int C, int V);
    /* the same with logits / dlogits (N,V) held in 16 bits of dtype dt (BF16
     * or F16): each logit the float32 sum rounded; wte16 the table in bf16
     * where the caller holds it (NULL: none), for tables that can use it */
    void (*lm_head_forward_lp)(uint16_t *logits, enum loom_dtype dt, const float *inp, const float *wte,
                               const uint16_t *wte16, int N, int C, int V);
    void (*lm_head_backward_lp)(float *dinp, float *dwte, const uint16_t *dlogits, enum loom_dtype dt,
                                const float *inp, const float *wte, const uint16_t *wte16, int N, int C,
                                int V);
    /* Optional (NULL: none): the activation bytes those two take for
     * themselves at most (their float32 staging), for a footprint's count */
    size_t (*lm_head_lp_scratch)(int N, int V);
    /* Optional (NULL: the caller uses matmul_forward/backward on float32
     * values): the dense layer's products taking operands already in bf16,
     * inp16 and weight16 where non-NULL, in place of inp and weight */
    void (*matmul_forward_b16)(float *out, const float *inp, const uint16_t *inp16, const float *weight,
                               const uint16_t *weight16, const float *bias, int N, int C, int OC);
    void (*matmul_backward_b16)(float *dinp, float *dweight, float *dbias, const float *dout,
                                const float *inp, const uint16_t *inp16, const float *weight,
                                const uint16_t *weight16, int N, int C, int OC);

    /* ---- linear: out (N,OC) = inp (N,C) @ weight (OC,C)^T, then bias (OC) added
     * to each row unless NULL; the weight stored [out, in] (torch.nn.Linear's).
     * inp16 and weight16, where non-NULL, are the operands in bf16, used in
     * place of inp and weight (which may then be NULL): a bf16-valued operand
     * gives the same bits either way. Without bias and 16-bit operands it is
     * this table's lm_head_forward, bit for bit */
    void (*linear_forward)(float *out, const float *inp, const uint16_t *inp16, const float *weight,
                           const uint16_t *weight16, const float *bias, int N, int C, int OC);
    /* dinp (N,C) written; dweight (OC,C) and dbias (OC) accumulate, dbias the
     * column sums of dout in bias_backward's order; each skipped when NULL.
     * Without dbias and 16-bit operands: this table's lm_head_backward, bit
     * for bit */
    void (*linear_backward)(float *dinp, float *dweight, float *dbias, const float *dout, const float *inp,
                            const uint16_t *inp16, const float *weight, const uint16_t *weight16, int N,
                            int C, int OC);

    /* ---- grouped products: G products of one shape, each on its block of
     * rows (struct loom_grouped, kernels.h; a mixture of experts' experts):
     * out (R,OC) written; dinp (R,C) written, the weights' and biases'
     * gradients accumulate, each skipped when NULL. Each group is this
     * table's matmul or linear product on its rows, bit for bit */
    void (*grouped_forward)(float *out, const float *inp, const struct loom_grouped *g, int C, int OC);
    void (*grouped_backward)(float *dinp, const float *dout, const float *inp, const struct loom_grouped *g,
                             int C, int OC);

    /* ---- causal attention: qkv (B,T,3C) -> out (B,T,C); saves att (B,NH,T,T) */
    void (*attention_forward)(float *out, float *att, const float *qkv, int B, int T, int C, int NH);
    /* dqkv (B,T,3C) written; datt (B,NH,T,T) scratch */
    void (*attention_backward)(float *dqkv, float *datt, const float *dout, const float *att,
                               const float *qkv, int B, int T, int C, int NH);
    /* ---- block-sparse causal attention on layout l (kernels/sparse_layout.h)
     * for the NH heads held, the layout's heads [h0, h0+NH): qkv (B,T,3C) ->
     * out (B,T,C); att saves the layout's blocks, loom_sparse_att_numel(l, B,
     * NH, h0) floats ((B,NH,T,T) for a dense layout, which runs attention_*) */
    void (*sparse_attention_forward)(float *out, float *att, const float *qkv, int B, int T, int C, int NH,
                                     int h0, const struct loom_sparse_layout *l);
    /* dqkv (B,T,3C) written; datt (as att) scratch */
    void (*sparse_attention_backward)(float *dqkv, float *datt, const float *dout, const float *att,
                                      const float *qkv, int B, int T, int C, int NH, int h0,
                                      const struct loom_sparse_layout *l);

    /* ---- fused causal attention (struct loom_flash_attn in kernels/kernels.h):
     * q (B,T,NH,hs), k and v (B,T,G,hs) with row pitches -> out (B,T,NH hs);
     * saves lse (B,NH,T), never the (T,T) probabilities */
    void (*flash_attention_forward)(float *out, float *lse, const float *q, const float *k, const float *v,
                                    const struct loom_flash_attn *a);
    /* dq, dk, dv written (q's, k's, v's pitches; dk, dv summed over the heads sharing them) */
    void (*flash_attention_backward)(float *dq, float *dk, float *dv, const float *dout, const float *out,
                                     const float *lse, const float *q, const float *k, const float *v,
                                     const struct loom_flash_attn *a);
    /* a part's out_p (N, NH hs) and lse_p (NH, N) merged into out and lse (NH, pitch ld_lse) by their
     * log-sum-exps */
    void (*flash_attention_merge)(float *out, float *lse, const float *out_p, const float *lse_p, int N,
                                  int NH, int hs, int ld_lse);

    /* ---- GELU (tanh form): out (n); dinp (n) written, and may be dout
     * (elementwise: each is read before it is written) */
    void (*gelu_forward)(float *out, const float *inp, size_t n);
    void (*gelu_backward)(float *dinp, const float *dout, const float *inp, size_t n);
    /* ---- GELU (exact, erf form): out (n); dinp (n) written */
    void (*gelu_exact_forward)(float *out, const float *inp, size_t n);
    void (*gelu_exact_backward)(float *dinp, const float *dout, const float *inp, size_t n);

    /* ---- RMSNorm: out (N,C); saves rstd (N); dinp (N,C), dweight (C) accumulate */
    void (*rmsnorm_forward)(float *out, float *rstd, const float *inp, const float *weight, int N, int C,
                            float eps);
    void (*rmsnorm_backward)(float *dinp, float *dweight, const float *dout, const float *inp,
                             const float *weight, const float *rstd, int N, int C);
    /* ---- rotary position embedding, in place over (B,T,H,D); the backward rotates back */
    void (*rope_forward)(float *x, int B, int T, int H, int D, float theta);
    void (*rope_backward)(float *dx, int B, int T, int H, int D, float theta);
    /* over N rows (N,H,D), row i at position pos[i] (N) */
    void (*rope_forward_at)(float *x, const int32_t *pos, int N, int H, int D, float theta);
    void (*rope_backward_at)(float *dx, const int32_t *pos, int N, int H, int D, float theta);
    /* ---- SwiGLU's gate: out (n) = silu(gate) * up; dgate, dup (n) written */
    void (*swiglu_forward)(float *out, const float *gate, const float *up, size_t n);
    void (*swiglu_backward)(float *dgate, float *dup, const float *dout, const float *gate, const float *up,
                            size_t n);
    /* ---- a mixture of experts: the router and the rows to and from the experts (kernels.h) */
    void (*moe_router_forward)(float *probs, int32_t *idx, float *lse, float *score_sum, const float *logits,
                               int N, int E, int k, int pre_softmax);
    void (*moe_router_backward)(float *dlogits, const float *dprobs, const float *probs, const int32_t *idx,
                                const float *lse, const float *logits, const float *aux_grad, float z_grad,
                                int N, int E, int k, int pre_softmax);
    void (*moe_permute_forward)(float *xp, const float *x, const int32_t *pos, int N, int k, int C);
    void (*moe_permute_backward)(float *dx, const float *dxp, const int32_t *pos, int N, int k, int C);
    void (*moe_unpermute_forward)(float *out, const float *y, const float *probs, const int32_t *pos, int N,
                                  int k, int C);
    void (*moe_unpermute_backward)(float *dy, float *dprobs, const float *dout, const float *y,
                                   const float *probs, const int32_t *pos, int N, int k, int C);
    /* ---- GeGLU's gate: out (n) = gelu(gate) * up, gelu gelu_forward's (tanh
     * form, its bits); dgate, dup (n) written */
    void (*geglu_forward)(float *out, const float *gate, const float *up, size_t n);
    void (*geglu_backward)(float *dgate, float *dup, const float *dout, const float *gate, const float *up,
                           size_t n);

    /* ---- residual: out (n) = a + b; da, db (n) accumulate dout */
    void (*residual_forward)(float *out, const float *a, const float *b, size_t n);
    void (*residual_backward)(float *da, float *db, const float *dout, size_t n);

    /* ---- softmax + cross-entropy: losses (N), saves lse (N); logits (N,V) */
    void (*crossentropy_forward)(float *losses, float *lse, const float *logits, const int32_t *targets,
                                 int N, int V);
    /* dlogits (N,V) written, may alias logits */
    void (*crossentropy_backward)(float *dlogits, const float *lse, const float *logits,
                                  const int32_t *targets, float dloss, int N, int V);
    /* ---- vocabulary-parallel cross-entropy: logits (N,V) are this rank's columns
     * [v0, v0+V); rowmax (N) written */
    void (*crossentropy_vp_max)(float *rowmax, const float *logits, int N, int V);
    /* sumexp (N) of exp(logits - max), max (N) the whole vocabulary's, and
     * target_logit (N) (0 where another rank holds the target), written */
    void (*crossentropy_vp_stats)(float *sumexp, float *target_logit, const float *logits, const float *max,
                                  const int32_t *targets, int v0, int N, int V);
    /* losses, lse (N) written: lse = max + log(sumexp), loss = lse - target_logit */
    void (*crossentropy_vp_finish)(float *losses, float *lse, const float *max, const float *sumexp,
                                   const float *target_logit, int N);
    /* dlogits (N,V) written, may alias logits; lse (N) the whole vocabulary's */
    void (*crossentropy_vp_backward)(float *dlogits, const float *lse, const float *logits,
                                     const int32_t *targets, int v0, float dloss, int N, int V);

    /* ---- AdamW on one tensor: param, m, v (n) updated in place, step t >= 1 */
    void (*adamw_update)(float *param, float *m, float *v, const float *grad, size_t n, float lr, float beta1,
                         float beta2, float eps, float weight_decay, float grad_scale, int t);

    /* ---- reductions: sum of x (n) squared, in double, the same bits at any
     * thread count */
    double (*sum_squares)(const float *x, size_t n);
    /* the same of x (n) held in 16 bits of dtype dt (BF16 or F16), in double */
    double (*lp_sum_squares)(const uint16_t *x, size_t n, enum loom_dtype dt);
    /* whether x (n) holds an inf or a NaN: float32, and in 16 bits of dtype dt */
    int (*has_nonfinite)(const float *x, size_t n);
    int (*lp_has_nonfinite)(const uint16_t *x, size_t n, enum loom_dtype dt);
    /* the squares of x (n) of dtype dt (F32, BF16 or F16) added exactly into
     * *s, an accumulator in host memory: the same total in any order and
     * split (--layout-invariant's gradient norm) */
    void (*sumsq_exact_add)(struct loom_sumsq_exact *s, const void *x, size_t n, enum loom_dtype dt);

    /* ---- elementwise and row moves: x (n) *= s; dst (n) += src; x (n)
     * rounded to dt in place; the same also stored in 16 bits into dst16 */
    void (*scale)(float *x, size_t n, float s);
    /* x (rows of width, pitch ld) *= dropout d's mask of global rows row[r] (kernels.h) */
    void (*dropout_rows)(float *x, size_t ld, const int64_t *row, int rows, int width,
                         const struct loom_dropout *d);
    void (*add_scalar)(float *dst, const float *src, size_t n, float s); /* dst (n) = s + src */
    void (*accumulate)(float *dst, const float *src, size_t n);
    void (*round_to)(float *x, size_t n, enum loom_dtype dt);
    void (*round_store)(uint16_t *dst16, float *x, size_t n, enum loom_dtype dt);
    /* dst16 (n) = dt(float32(dst16) + src (n)), dst16 held in 16 bits of
     * dtype dt (BF16 or F16): a float32 gradient added into 16-bit ones */
    void (*lp_accumulate)(uint16_t *dst16, const float *src, size_t n, enum loom_dtype dt);
    /* grouped-query attention: qkv (N, 3 NH hs) packed from q (N, NH hs), k
     * and v (N, G hs), and back (dq written, dk and dv summed over the query
     * heads each key/value head serves) */
    void (*gqa_pack)(float *qkv, const float *q, const float *k, const float *v, int N, int NH, int G,
                     int hs);
    void (*gqa_unpack)(float *dq, float *dk, float *dv, const float *dqkv, int N, int NH, int G, int hs);

    /* ---- rows with a pitch (in elements) and float64 sums: dst's rows
     * (dtype ddt) = src's (sdt; one dtype: a copy, else 16-bit to float32 or
     * float32 to bf16); dst's rows += src's; y (N,OC) += bias on each row;
     * acc (float64) += v, dst = acc rounded, dst += acc rounded */
    void (*convert_rows)(void *dst, enum loom_dtype ddt, size_t ldd, const void *src, enum loom_dtype sdt,
                         size_t lds, size_t rows, size_t w);
    void (*add_rows)(float *dst, size_t ldd, const float *src, size_t lds, size_t rows, size_t w);
    void (*add_bias)(float *y, const float *bias, int N, int OC);
    void (*acc_add)(double *acc, const float *v, size_t n);
    void (*acc_round)(float *dst, const double *acc, size_t n);
    void (*acc_add_rounded)(float *dst, const double *acc, size_t n);

    /* ---- fp8 linear layers: q (n) = x (or x16 where non-NULL) quantised with
     * scale to fmt, held in bf16; its max |x| (NaN when any is); out (N,OC) =
     * out * undo + bias (may be NULL); dinp (nx, may be NULL) *= undo_x and
     * dweight (nw) += dw * undo_w */
    void (*fp8_quantize)(uint16_t *q, const float *x, const uint16_t *x16, size_t n, float scale,
                         enum loom_fp8_format fmt);
    float (*fp8_amax)(const float *x, const uint16_t *x16, size_t n);
    void (*fp8_unscale)(float *out, const float *bias, int N, int OC, float undo);
    void (*fp8_scale_into)(float *dinp, size_t nx, float undo_x, float *dweight, const float *dw, size_t nw,
                           float undo_w);

    /* ---- settings */
    /* optional: the backend's thread count (n >= 1); NULL: it has none to set */
    void (*set_threads)(int n);
    /* optional: the thread count in use; NULL: 1 */
    int (*get_threads)(void);
};

struct loom_backend {
    const char *name; /* "cpu": what loom_backend_get matches */
    enum loom_device device;
    const struct loom_kernels *k;
    /* bytes of device memory, zero-filled, 64-byte aligned, counted under tag
     * (base/mem.h); out of memory exits 1 naming tag and size */
    void *(*alloc)(size_t bytes, enum loom_mem_tag tag);
    void (*free)(void *p);                         /* p from alloc, or NULL */
    void (*retag)(void *p, enum loom_mem_tag tag); /* p from alloc counts under tag from now on */
    void (*memset)(void *p, int value, size_t bytes);
    void (*copy)(void *dst, const void *src, size_t bytes); /* both on this device, not overlapping */
    /* bytes from host memory src into device memory dst, and back: the only
     * ways host code reads or writes a device buffer (cudaMemcpy's two kinds) */
    void (*upload)(void *dst, const void *src, size_t bytes);
    void (*download)(void *dst, const void *src, size_t bytes);
    /* dst = src converted to dst's dtype (base/buf.h's rules), both on this device */
    void (*convert)(struct loom_buf dst, struct loom_buf src);
    /* optional: waits until every kernel and copy issued has finished; NULL:
     * every call is synchronous (the CPU) */
    void (*synchronize)(void);
    /* optional: the set-up of a run, before its first kernel: the threads
     * (0: the backend's own choice) and, for a 16-bit compute dtype, the
     * units its products run on (units: a name the backend knows, as
     * LOOM_BF16_UNITS gives it; NULL: its best). LOOM_OK, or an input error
     * (base/log.h) naming what was wrong. NULL: nothing to set up */
    int (*setup)(int threads, enum loom_dtype compute, const char *units);
    /* optional: the table for training in a 16-bit compute dtype, whose
     * matrix products run on that dtype's units (the CPU: BF16 on the units
     * loom_bf16_units_select chose, kernels/kernels.h); NULL: k for every dtype */
    const struct loom_kernels *(*kernels_for)(enum loom_dtype compute);
};

/* The CPU backend: kernels/cpu/, the accounting allocator, base/buf.c. */
const struct loom_backend *loom_backend_cpu(void);
/* The guarded backend (kernels/guarded/), for tests: the CPU's kernels on
 * memory that only its own calls can reach; host code that touches one of
 * its buffers directly exits 1 naming the address. */
const struct loom_backend *loom_backend_guarded(void);
/* The reference kernels: the `_ref` loops for matmul, the LM head, the
 * linear layer, the grouped products, attention and the non-finite check; every other member is
 * the CPU kernel, which is its own reference (tests/test_kernels.c checks
 * those against double formulas and finite differences instead; the sparse
 * attention's `_ref` keeps a dense att, so tests/test_sparse_attention.c
 * holds the kernel against it). */
const struct loom_kernels *loom_kernels_ref(void);

/* The table for compute in dtype: b->kernels_for's, or b->k. */
const struct loom_kernels *loom_backend_kernels(const struct loom_backend *b, enum loom_dtype compute);

/* Typed buffers on b's memory: a zero-filled one of numel elements of dt
 * under tag (b->alloc), and its release (*buf left empty; an empty one is
 * left as it is, whatever b). */
struct loom_buf loom_backend_buf(const struct loom_backend *b, size_t numel, enum loom_dtype dt,
                                 enum loom_mem_tag tag);
void loom_backend_buf_free(const struct loom_backend *b, struct loom_buf *buf);

/* The registered backends, in order ("cpu" first): count, the i-th, and the
 * one named name (NULL when none is). */
int loom_backend_count(void);
const struct loom_backend *loom_backend_at(int i);
const struct loom_backend *loom_backend_get(const char *name);
/* The backend new models take (loom_model_init): "cpu" until loom_backend_use
 * names another (the engine's `--backend`). */
const struct loom_backend *loom_backend_default(void);
void loom_backend_use(const struct loom_backend *b);
/* The registered names, comma-separated, into buf (for messages). */
void loom_backend_names(char *buf, size_t n);

#endif
