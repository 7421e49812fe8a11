/*
 * CPU kernels: forward/backward pairs on raw pointers. No knowledge of
 * ranks, models or allocation: every buffer is the caller's.
 *
 * Argument order (llm.c): outputs, then saved forward state, then inputs,
 * then dimensions last. Gradient buffers are prefixed `d`.
 * Shape letters: B batch, T time, C channels, NH heads, HS = C/NH head size,
 * V vocabulary, N rows (= B*T), OC output channels.
 *
 * Gradient rule, once for all kernels:
 *   - parameter gradients ACCUMULATE (+=): the caller zeroes them;
 *   - activation gradients are WRITTEN (=), except where a kernel says
 *     "accumulates" (layernorm's dinp and residual's da/db feed the residual
 *     stream and accumulate).
 *
 * Every kernel parallelises with OpenMP over the thread count set by
 * loom_threads_set; matmuls go through cblas_sgemm. Each fast kernel that is
 * not trivially a loop has a plain `_ref` version beside it, which the tests
 * compare against.
 *
 * These are the CPU backend's kernels. Code that should run on any backend
 * calls them through the table of kernels/backend.h (same names without the
 * loom_ prefix); the free functions stay for the CPU-only tools.
 */
#ifndef LOOM_KERNELS_H
#define LOOM_KERNELS_H

#include <stddef.h>
#include <stdint.h>

#include "base/dtype.h" /* enum loom_dtype */
#include "base/fp8.h"   /* enum loom_fp8_format */

/* ---- embedding ------------------------------------------------------------
 * out (B,T,C) = wte[tokens[b,t]] (V,C) + wpe[t] (maxT,C). Tokens are already
 * validated to lie in [0, V). */
void loom_embedding_forward(float *out, const int32_t *tokens, const float *wte, const float *wpe, int B,
                            int T, int C);
/* dwte (V,C) += scatter of dout; dwpe (maxT,C) += sum over batch. Either
 * may be NULL to skip it (data parallelism defers the dwte scatter). */
void loom_embedding_backward(float *dwte, float *dwpe, const float *dout, const int32_t *tokens, int B, int T,
                             int C);

/* ---- vocabulary-parallel embedding (Megatron) ------------------------------
 * A tensor-parallel rank holds the rows [v0, v0 + Vl) of the token table.
 * out (B,T,C) = (tokens[b,t] in [v0, v0+Vl) ? wte[tokens[b,t] - v0] : 0)
 *             + (wpe ? wpe[t] : 0), written; wte (Vl,C), wpe (maxT,C) or
 * NULL. Summed over the ranks (wpe passed on one of them) it is
 * loom_embedding_forward's out, exactly; with v0 = 0, Vl = V it is that
 * out, bit for bit. */
void loom_embedding_vp_forward(float *out, const int32_t *tokens, const float *wte, const float *wpe, int v0,
                               int Vl, int B, int T, int C);
/* dwte (Vl,C) accumulates the dout rows of the tokens in [v0, v0+Vl), the
 * others skipped; dwpe (maxT,C) accumulates the sum over the batch. Either
 * may be NULL to skip it. The same order of additions as
 * loom_embedding_backward: the ranks' dwte concatenated are its dwte, bit
 * for bit. */
void loom_embedding_vp_backward(float *dwte, float *dwpe, const float *dout, const int32_t *tokens, int v0,
                                int Vl, int B, int T, int C);

/* ---- layernorm (biased variance, as torch.nn.LayerNorm) -------------------
 * out (N,C) = (inp - mean) / sqrt(var + eps) * weight + bias; saves mean (N)
 * and rstd (N). GPT-2's eps is 1e-5. */
void loom_layernorm_forward(float *out, float *mean, float *rstd, const float *inp, const float *weight,
                            const float *bias, int N, int C, float eps);
/* dinp (N,C) accumulates; dweight (C), dbias (C) accumulate. */
void loom_layernorm_backward(float *dinp, float *dweight, float *dbias, const float *dout, const float *inp,
                             const float *weight, const float *mean, const float *rstd, int N, int C);

/* ---- matmul + bias -------------------------------------------------------
 * out (N,OC) = inp (N,C) @ weight (C,OC) + bias (OC). The weight is stored
 * [in, out], as Hugging Face GPT-2's Conv1D stores it. bias may be NULL. */
void loom_matmul_forward(float *out, const float *inp, const float *weight, const float *bias, int N, int C,
                         int OC);
/* dinp (N,C) is written; dweight (C,OC) and dbias (OC) accumulate; each is
 * skipped when NULL. */
void loom_matmul_backward(float *dinp, float *dweight, float *dbias, const float *dout, const float *inp,
                          const float *weight, int N, int C, int OC);
void loom_matmul_forward_ref(float *out, const float *inp, const float *weight, const float *bias, int N,
                             int C, int OC);
void loom_matmul_backward_ref(float *dinp, float *dweight, float *dbias, const float *dout, const float *inp,
                              const float *weight, int N, int C, int OC);

/* ---- LM head tied to the token embedding ----------------------------------
 * logits (N,V) = inp (N,C) @ wte^T, wte (V,C). No bias. */
void loom_lm_head_forward(float *logits, const float *inp, const float *wte, int N, int C, int V);
/* dinp (N,C) is written; dwte (V,C) accumulates; each skipped when NULL. */
void loom_lm_head_backward(float *dinp, float *dwte, const float *dlogits, const float *inp, const float *wte,
                           int N, int C, int V);
void loom_lm_head_forward_ref(float *logits, const float *inp, const float *wte, int N, int C, int V);
void loom_lm_head_backward_ref(float *dinp, float *dwte, const float *dlogits, const float *inp,
                               const float *wte, int N, int C, int V);
/* The LM head with the logits (N,V) held in 16 bits of dtype dt (BF16 or
 * F16), each the float32 sum rounded: computed a block of rows at a time
 * into float32 and rounded; and its backward with dlogits in 16 bits,
 * converted to float32 a block of vocabulary columns at a time. No float32
 * copy of the whole is made. wte16: the same table in bf16 where the caller
 * holds one (NULL: none); these read wte, the bf16 products read wte16. */
/* The bytes of float32 staging the two above take at most. */
size_t loom_lm_head_lp_scratch(int N, int V);
void loom_lm_head_forward_lp(uint16_t *logits, enum loom_dtype dt, const float *inp, const float *wte,
                             const uint16_t *wte16, int N, int C, int V);
void loom_lm_head_forward_lp_ref(uint16_t *logits, enum loom_dtype dt, const float *inp, const float *wte,
                                 const uint16_t *wte16, int N, int C, int V);
void loom_lm_head_backward_lp(float *dinp, float *dwte, const uint16_t *dlogits, enum loom_dtype dt,
                              const float *inp, const float *wte, const uint16_t *wte16, int N, int C, int V);
void loom_lm_head_backward_lp_ref(float *dinp, float *dwte, const uint16_t *dlogits, enum loom_dtype dt,
                                  const float *inp, const float *wte, const uint16_t *wte16, int N, int C,
                                  int V);
/* out (N,OC) += bias (OC), added to each row */
void loom_bias_forward(float *out, const float *bias, int N, int OC);
/* dbias (OC) += the column sums of dout (N,OC): each column's rows 0..N-1
 * added in order in double, the sum rounded to float once and added */
void loom_bias_backward(float *dbias, const float *dout, int N, int OC);

/* ---- linear layer, weight stored [out, in] (torch.nn.Linear's) ------------
 * out (N,OC) = inp (N,C) @ weight (OC,C)^T, then bias (OC) added to each
 * row (loom_bias_forward) unless NULL. inp16 and weight16, where non-NULL,
 * are the same operands in bf16 (a 16-bit activation, the stored 16-bit
 * parameters), used in place of inp and weight (which may then be NULL):
 * the float32 kernels widen them, which is exact, and the bf16 ones
 * (below) take them as they are, so a bf16-valued operand gives the same
 * bits either way. Without bias and 16-bit operands it is
 * loom_lm_head_forward, bit for bit: the same product. */
void loom_linear_forward(float *out, const float *inp, const uint16_t *inp16, const float *weight,
                         const uint16_t *weight16, const float *bias, int N, int C, int OC);
/* dinp (N,C) = dout (N,OC) @ weight, written; dweight (OC,C) += dout^T @
 * inp; dbias (OC) += the column sums of dout (loom_bias_backward's order);
 * each skipped when NULL. Without dbias and 16-bit operands it is
 * loom_lm_head_backward, bit for bit. */
void loom_linear_backward(float *dinp, float *dweight, float *dbias, const float *dout, const float *inp,
                          const uint16_t *inp16, const float *weight, const uint16_t *weight16, int N, int C,
                          int OC);
/* The references: plain loops, double sums rounded once, the bias added
 * to the rounded product. */
void loom_linear_forward_ref(float *out, const float *inp, const uint16_t *inp16, const float *weight,
                             const uint16_t *weight16, const float *bias, int N, int C, int OC);
void loom_linear_backward_ref(float *dinp, float *dweight, float *dbias, const float *dout, const float *inp,
                              const uint16_t *inp16, const float *weight, const uint16_t *weight16, int N,
                              int C, int OC);

/* ---- the same products on the CPU's bf16 units (matmul_bf16.c) -------------
 * Signatures, layouts and gradient rule as above; both operands are rounded
 * to bf16 and the products accumulate in float32 (exact for bf16-valued
 * operands, as --bf16 gives, up to the order of the additions). The units
 * are chosen once per process: loom_bf16_units_select(name) with "auto"
 * (or NULL: the best the CPU has: AMX, AVX512-BF16, else f32), "amx", "avx512_bf16", "avx512" (oneDNN's
 * emulation on plain AVX512) or "f32" (the float32 products above; these
 * functions are then not called). A path above what the CPU has runs on the
 * best it has, so every path runs on any machine. LOOM_ERR_INPUT for an
 * unknown name, or a different choice after the first. */
enum loom_bf16_units {
    LOOM_BF16_UNITS_F32,
    LOOM_BF16_UNITS_AVX512,
    LOOM_BF16_UNITS_AVX512_BF16,
    LOOM_BF16_UNITS_AMX,
    LOOM_BF16_UNITS_COUNT
};
int loom_bf16_units_select(const char *name);
/* The units chosen (chosen by the CPU at the first call if none was). */
enum loom_bf16_units loom_bf16_units(void);
const char *loom_bf16_units_name(enum loom_bf16_units u);
/* The kernel that computes them: oneDNN's implementation name
 * ("brg:avx512_core_bf16", ...), or "OpenBLAS sgemm". */
const char *loom_bf16_units_kernel(void);
void loom_matmul_forward_bf16(float *out, const float *inp, const float *weight, const float *bias, int N,
                              int C, int OC);
void loom_matmul_backward_bf16(float *dinp, float *dweight, float *dbias, const float *dout, const float *inp,
                               const float *weight, int N, int C, int OC);
void loom_lm_head_forward_bf16(float *logits, const float *inp, const float *wte, int N, int C, int V);
void loom_lm_head_backward_bf16(float *dinp, float *dwte, const float *dlogits, const float *inp,
                                const float *wte, int N, int C, int V);
/* bf16 logits come from the units rounded, bf16 dlogits (and wte16) go to
 * them as they are; F16 takes the float32 path */
void loom_lm_head_forward_lp_bf16(uint16_t *logits, enum loom_dtype dt, const float *inp, const float *wte,
                                  const uint16_t *wte16, int N, int C, int V);
void loom_lm_head_backward_lp_bf16(float *dinp, float *dwte, const uint16_t *dlogits, enum loom_dtype dt,
                                   const float *inp, const float *wte, const uint16_t *wte16, int N, int C,
                                   int V);
/* The dense layer's products with operands already in bf16: inp16 and
 * weight16, where non-NULL, are used as they are in place of inp and weight
 * (which may then be NULL); the bf16 values of a 16-bit activation and of
 * the stored 16-bit parameters, which need no conversion. */
void loom_matmul_forward_b16(float *out, const float *inp, const uint16_t *inp16, const float *weight,
                             const uint16_t *weight16, const float *bias, int N, int C, int OC);
void loom_matmul_backward_b16(float *dinp, float *dweight, float *dbias, const float *dout, const float *inp,
                              const uint16_t *inp16, const float *weight, const uint16_t *weight16, int N,
                              int C, int OC);
/* The linear layer on the bf16 units: without bias and 16-bit operands,
 * loom_lm_head_forward_bf16 / loom_lm_head_backward_bf16 bit for bit; the
 * 16-bit operands go to the units as they are. */
void loom_linear_forward_bf16(float *out, const float *inp, const uint16_t *inp16, const float *weight,
                              const uint16_t *weight16, const float *bias, int N, int C, int OC);
void loom_linear_backward_bf16(float *dinp, float *dweight, float *dbias, const float *dout, const float *inp,
                               const uint16_t *inp16, const float *weight, const uint16_t *weight16, int N,
                               int C, int OC);

/* ---- causal multi-head self-attention ------------------------------------
 * qkv (B,T,3C) holds [q | k | v] along the last axis, head h at columns
 * h*HS of each part. out (B,T,C) = softmax(q k^T / sqrt(HS), causal) v,
 * heads concatenated. att (B,NH,T,T) saves the probabilities (zero above the
 * diagonal). */
void loom_attention_forward(float *out, float *att, const float *qkv, int B, int T, int C, int NH);
/* dqkv (B,T,3C) is written. datt (B,NH,T,T) is scratch space. */
void loom_attention_backward(float *dqkv, float *datt, const float *dout, const float *att, const float *qkv,
                             int B, int T, int C, int NH);
void loom_attention_forward_ref(float *out, float *att, const float *qkv, int B, int T, int C, int NH);
/* The references for any mask of the (query i, key j) pairs head h (of
 * the NH held) attends to; NULL: causal. att (B,NH,T,T) holds zeros where
 * a pair is not allowed; every row must allow one. */
struct loom_attention_mask {
    int (*allowed)(const void *ctx, int h, int i, int j);
    const void *ctx;
};
void loom_attention_masked_forward_ref(float *out, float *att, const float *qkv, int B, int T, int C, int NH,
                                       const struct loom_attention_mask *mask);
void loom_attention_masked_backward_ref(float *dqkv, float *datt, const float *dout, const float *att,
                                        const float *qkv, int B, int T, int C, int NH,
                                        const struct loom_attention_mask *mask);
void loom_attention_backward_ref(float *dqkv, float *datt, const float *dout, const float *att,
                                 const float *qkv, int B, int T, int C, int NH);

/* ---- dropout (cpu/dropout.c; the masks: kernels/dropout_mask.h) -----------
 * A site's mask keeps element (row, col) where the counter hash of (key,
 * row, col) is at least threshold and scales it by 1 / (1 - p): the same
 * mask for the same global element on every rank and layout. */
struct loom_dropout {
    uint64_t key;       /* the site's (loom_dropout_key) */
    uint32_t threshold; /* round(p 2^32): an element whose hash is below it is dropped */
    float scale;        /* 1 / (1 - p) */
};
/* x (rows of width, pitch ld) *= the mask of global rows row[r], columns
 * 0..width-1: the forward on an activation and, on its gradient, the
 * backward (the same mask, the same scale). */
void loom_dropout_rows(float *x, size_t ld, const int64_t *row, int rows, int width,
                       const struct loom_dropout *d);
void loom_dropout_rows_ref(float *x, size_t ld, const int64_t *row, int rows, int width,
                           const struct loom_dropout *d);

/* ---- fused causal attention, FlashAttention-2 style (cpu/flash_attention*.c)
 * Never stores the (T,T) probabilities: tiles of 64 queries against tiles
 * of 64 keys with an online softmax; only the log-sum-exp of each (row,
 * head) is kept, and the backward recomputes each tile's probabilities.
 * Shape letters: B batch, T time, NH query heads, G key/value heads, hs
 * head size. q (B,T,NH,hs), k and v (B,T,G,hs), each row of a tensor (one
 * token's heads) ld_q, ld_k, ld_v floats after the previous one: the
 * decoder's packed qkv (B,T,3C) is q = qkv, k = qkv + C, v = qkv + 2C,
 * each with ld 3C; separate tensors have ld NH hs or G hs. Query head h
 * reads key/value head h / (NH/G) (grouped-query attention, nothing
 * repeated in memory). Query t of sequence b sees the keys [lo, t], lo the
 * largest of 0, t - window + 1 (window > 0; --attention-window's rule: W
 * keys including itself) and doc_start[b, t] (packed documents: each
 * token's document's first position, non-decreasing along t, or NULL: one
 * document per row). Every tile wholly outside that range is skipped, and
 * with a block-sparse layout every tile without a kept block pair. */
struct loom_sparse_layout;
struct loom_flash_attn {
    int B, T;
    int NH;                   /* query heads */
    int G;                    /* key/value heads, NH % G == 0 */
    int hs;                   /* head size */
    int ld_q, ld_k, ld_v;     /* row pitch in floats of q, k, v and of dq, dk, dv */
    int window;               /* W > 0: keys (t - W, t]; 0: none */
    const int32_t *doc_start; /* (B,T) each token's document start, or NULL */
    float scale;              /* of q k^T; 0: 1/sqrt(hs) */
    /* block-sparse layout (kernels/sparse_layout.h, unidirectional, built
     * for T) or NULL: query head h is the layout's head h0 + h, its kept
     * (query block, key block) pairs and token window apply on top */
    const struct loom_sparse_layout *layout;
    int h0;
    /* A part of the sequences (context parallelism): the queries are
     * positions [q0, q0 + Tq), the keys and values [k0, k0 + Tk) (Tq, Tk
     * 0: to T); the masks, doc_start and the layout stay the whole
     * sequences' of T. q, out, dout, dq hold Tq rows a sequence, k, v, dk,
     * dv Tk; lse (B,NH,ld_lse) (0: Tq), the part's rows first. A query
     * that sees no key of the part gets out 0 and lse -inf. */
    int q0, Tq, k0, Tk, ld_lse;
    /* Attention dropout (NULL: none): the probabilities P (after the
     * softmax; its sums are the undropped ones) times the mask of row
     * ((seq0 + b) NHg + h0 + h) T + query position, column the key
     * position; the backward recomputes it. */
    const struct loom_dropout *drop;
    int64_t seq0;
    int NHg;
};
/* out (B,T,NH,hs) (row pitch NH hs) written; lse (B,NH,T) saves each row's
 * log-sum-exp of the scaled scores. */
void loom_flash_attention_forward(float *out, float *lse, const float *q, const float *k, const float *v,
                                  const struct loom_flash_attn *a);
/* dq (as q), dk, dv (as k, v: summed over the query heads that share
 * them) written; their pitches are q's, k's and v's (dq, dk, dv may be the
 * three parts of one packed dqkv). out and lse are the forward's. */
void loom_flash_attention_backward(float *dq, float *dk, float *dv, const float *dout, const float *out,
                                   const float *lse, const float *q, const float *k, const float *v,
                                   const struct loom_flash_attn *a);
/* The same with the two products of each step (q k^T and p v forward; the
 * five of the backward) on bf16 operands, float32 statistics and sums, on
 * the units loom_bf16_units chose (AMX tiles, AVX512-BF16 dot products, or
 * bf16 widened to float32 on other CPUs). */
void loom_flash_attention_forward_bf16(float *out, float *lse, const float *q, const float *k, const float *v,
                                       const struct loom_flash_attn *a);
void loom_flash_attention_backward_bf16(float *dq, float *dk, float *dv, const float *dout, const float *out,
                                        const float *lse, const float *q, const float *k, const float *v,
                                        const struct loom_flash_attn *a);
/* Which of those runs the products: "amx", "avx512_bf16" or "widened". */
const char *loom_flash_attention_bf16_products(void);
/* Attention over keys in blocks (context parallelism's ring): a block's
 * out_p (N, NH hs) and lse_p (NH, N), from calls on a part of the keys,
 * merged into out (N, NH hs) and lse (NH, pitch ld_lse) so far: lse =
 * log(e^lse + e^lse_p), out = e^(lse_old - lse) out + e^(lse_p - lse)
 * out_p; a row of lse_p -inf (no key) leaves the row, and one of lse -inf
 * (none yet) takes the block's. */
void loom_flash_attention_merge(float *out, float *lse, const float *out_p, const float *lse_p, int N, int NH,
                                int hs, int ld_lse);
/* The references: every (query, key) pair in plain loops, double sums. */
void loom_flash_attention_forward_ref(float *out, float *lse, const float *q, const float *k, const float *v,
                                      const struct loom_flash_attn *a);
void loom_flash_attention_backward_ref(float *dq, float *dk, float *dv, const float *dout, const float *out,
                                       const float *lse, const float *q, const float *k, const float *v,
                                       const struct loom_flash_attn *a);

/* ---- GELU, tanh form (torch.nn.functional.gelu(x, approximate="tanh")) -- */
void loom_gelu_forward(float *out, const float *inp, size_t n);
/* dinp (n) is written. */
void loom_gelu_backward(float *dinp, const float *dout, const float *inp, size_t n);

/* ---- GeGLU's gate (Gemma's MLP): out (n) = gelu(gate) * up ------------------
 * gelu the tanh form above, computed as loom_gelu_forward computes it:
 * out[i] is the bits of loom_gelu_forward's gelu(gate[i]) times up[i]. */
void loom_geglu_forward(float *out, const float *gate, const float *up, size_t n);
/* dgate = (dout up) gelu'(gate), the bits of loom_gelu_backward given the
 * output gradient dout[i] * up[i]; dup = dout gelu(gate); both (n) written. */
void loom_geglu_backward(float *dgate, float *dup, const float *dout, const float *gate, const float *up,
                         size_t n);

/* ---- GELU, exact (erf) form (torch.nn.functional.gelu(x)) ----------------- */
void loom_gelu_exact_forward(float *out, const float *inp, size_t n);
/* dinp (n) is written. */
void loom_gelu_exact_backward(float *dinp, const float *dout, const float *inp, size_t n);

/* ---- RMSNorm (Llama's) ----------------------------------------------------
 * out (N,C) = inp / sqrt(mean(inp^2) + eps) * weight; saves rstd (N). */
void loom_rmsnorm_forward(float *out, float *rstd, const float *inp, const float *weight, int N, int C,
                          float eps);
/* dinp (N,C) and dweight (C) accumulate. */
void loom_rmsnorm_backward(float *dinp, float *dweight, const float *dout, const float *inp,
                           const float *weight, const float *rstd, int N, int C);

/* ---- rotary position embedding (Hugging Face's rotate_half) ---------------
 * x (B,T,H,D) rotated in place by position t's angles t theta^(-2j/D). */
void loom_rope_forward(float *x, int B, int T, int H, int D, float theta);
/* dx (B,T,H,D) rotated back in place: the gradient at the input. */
void loom_rope_backward(float *dx, int B, int T, int H, int D, float theta);
/* The same over N rows (N,H,D), row i at position pos[i] (documents'
 * restarting positions, a context-parallel rank's places in the sequence):
 * the same angles, so the same bits, as the row at that place above. */
void loom_rope_forward_at(float *x, const int32_t *pos, int N, int H, int D, float theta);
void loom_rope_backward_at(float *dx, const int32_t *pos, int N, int H, int D, float theta);

/* ---- SwiGLU's gate: out (n) = silu(gate) * up ------------------------------ */
void loom_swiglu_forward(float *out, const float *gate, const float *up, size_t n);
/* dgate and dup (n) are written. */
void loom_swiglu_backward(float *dgate, float *dup, const float *dout, const float *gate, const float *up,
                          size_t n);

/* ---- a mixture of experts (cpu/moe.c) -------------------------------------
 * The router over N rows of logits (N,E): idx (N,k) each row's k largest
 * logits, largest first (ties: the lower expert); probs (N,k) their routing
 * weights: the softmax of the k (pre_softmax 0: Mixtral's renormalised top
 * k) or their entries of the softmax over all E (1); lse (N) each row's
 * log-sum-exp; score_sum (E) each expert's softmax summed over the rows. */
#define LOOM_MOE_MAX_EXPERTS 1024
void loom_moe_router_forward(float *probs, int32_t *idx, float *lse, float *score_sum, const float *logits,
                             int N, int E, int k, int pre_softmax);
void loom_moe_router_forward_ref(float *probs, int32_t *idx, float *lse, float *score_sum,
                                 const float *logits, int N, int E, int k, int pre_softmax);
/* dlogits (N,E) written: from dprobs (N,k), the balancing loss's gradient
 * aux_grad (E) at every row's softmax (NULL: none) and the z-loss's:
 * z_grad * lse_n * d lse_n / d logits (0: none). */
void loom_moe_router_backward(float *dlogits, const float *dprobs, const float *probs, const int32_t *idx,
                              const float *lse, const float *logits, const float *aux_grad, float z_grad,
                              int N, int E, int k, int pre_softmax);
void loom_moe_router_backward_ref(float *dlogits, const float *dprobs, const float *probs, const int32_t *idx,
                                  const float *lse, const float *logits, const float *aux_grad, float z_grad,
                                  int N, int E, int k, int pre_softmax);
/* Rows to the experts' blocks: xp's row pos[n k + j] is x's row n (N,C);
 * pos -1 (a dropped choice) is skipped. The backward writes dx (N,C): the
 * sum of row n's choices' rows of dxp, in j order. */
void loom_moe_permute_forward(float *xp, const float *x, const int32_t *pos, int N, int k, int C);
void loom_moe_permute_backward(float *dx, const float *dxp, const int32_t *pos, int N, int k, int C);
/* And back: out (N,C) written, row n the sum over its choices j (in
 * order) of probs[n k + j] times y's row pos[n k + j]. The backward writes
 * dy's rows pos (probs times dout's row) and dprobs (N,k) (dout's row n
 * dot y's row pos; 0 where dropped). */
void loom_moe_unpermute_forward(float *out, const float *y, const float *probs, const int32_t *pos, int N,
                                int k, int C);
void loom_moe_unpermute_backward(float *dy, float *dprobs, const float *dout, const float *y,
                                 const float *probs, const int32_t *pos, int N, int k, int C);

/* ---- grouped products (cpu/grouped.c) -------------------------------------
 * A mixture of experts' local experts in one call: G products of one shape,
 * group g's weight on its rows[g] consecutive rows from row first[g] of
 * inp and out (first NULL: groups in order, o_g the rows before it). w[g] is stored [out, in]
 * (out_in 1, nn.Linear's) or [in, out] (0, Conv1D's); w16[g], where the
 * array is given, its bf16 copy, taken in its place as the linear layer's
 * 16-bit operands are; bias[g] may be NULL, as may the arrays. Forward:
 * out (R, OC) = each block of inp (R, C) times its weight, plus its bias.
 * Backward: dinp (R, C) written (skipped when NULL), dw[g] and dbias[g]
 * accumulate (skipped when NULL). Each group is the table's one product on
 * its rows, bit for bit: the float32 kernels here are matmul's and
 * linear's, the _bf16 ones the bf16 units' (the b16 products where w16 is
 * given). */
struct loom_grouped {
    int G;
    const int *rows;
    const size_t *first;
    int out_in;
    const float *const *w;
    const uint16_t *const *w16;
    const float *const *bias;
    float *const *dw;
    float *const *dbias;
};
void loom_grouped_forward(float *out, const float *inp, const struct loom_grouped *g, int C, int OC);
void loom_grouped_backward(float *dinp, const float *dout, const float *inp, const struct loom_grouped *g,
                           int C, int OC);
void loom_grouped_forward_bf16(float *out, const float *inp, const struct loom_grouped *g, int C, int OC);
void loom_grouped_backward_bf16(float *dinp, const float *dout, const float *inp,
                                const struct loom_grouped *g, int C, int OC);
void loom_grouped_forward_ref(float *out, const float *inp, const struct loom_grouped *g, int C, int OC);
void loom_grouped_backward_ref(float *dinp, const float *dout, const float *inp, const struct loom_grouped *g,
                               int C, int OC);

/* ---- residual ------------------------------------------------------------ */
void loom_residual_forward(float *out, const float *a, const float *b, size_t n);
/* da and db accumulate dout. */
void loom_residual_backward(float *da, float *db, const float *dout, size_t n);

/* ---- fused softmax + cross-entropy ----------------------------------------
 * losses (N): -log softmax(logits[i])[targets[i]], logits (N,V). Saves the
 * log-sum-exp of each row, lse (N). */
void loom_crossentropy_forward(float *losses, float *lse, const float *logits, const int32_t *targets, int N,
                               int V);
/* dlogits (N,V) = dloss * (softmax(logits) - onehot(targets)), written;
 * dloss is d(objective)/d(losses[i]), the same for every row (1/N for a
 * mean). dlogits may alias logits (computed in place). */
void loom_crossentropy_backward(float *dlogits, const float *lse, const float *logits, const int32_t *targets,
                                float dloss, int N, int V);

/* ---- vocabulary-parallel cross-entropy (Megatron) --------------------------
 * A tensor-parallel rank holds the logits (N,V) of the vocabulary columns
 * [v0, v0 + V); targets (N) are ids in the whole vocabulary. The caller
 * combines the ranks between the calls:
 *   max    = all-reduce max of rowmax;
 *   lse    = max + log(all-reduce sum of sumexp);
 *   losses = lse - all-reduce sum of target_logit.
 * They agree with loom_crossentropy_forward to float rounding (~1e-7
 * relative). */
/* rowmax (N) = the max of each row of logits (N,V), written. */
void loom_crossentropy_vp_max(float *rowmax, const float *logits, int N, int V);
/* Given the whole vocabulary's row max (N): sumexp[i] = sum_j exp(logits[i,j]
 * - max[i]) over this rank's V columns, and target_logit[i] =
 * logits[i, targets[i] - v0] when targets[i] is in [v0, v0+V), else 0; both
 * (N), written. */
void loom_crossentropy_vp_stats(float *sumexp, float *target_logit, const float *logits, const float *max,
                                const int32_t *targets, int v0, int N, int V);
/* dlogits (N,V) = dloss * (exp(logits - lse[i]) - [targets[i] == v0 + j]),
 * written, may alias logits; lse (N) is the whole vocabulary's. With v0 = 0
 * and the whole vocabulary it is loom_crossentropy_backward, bit for bit. */
/* losses, lse (N) written: lse = max + log(sumexp), loss = lse - target_logit */
void loom_crossentropy_vp_finish(float *losses, float *lse, const float *max, const float *sumexp,
                                 const float *target_logit, int N);
void loom_crossentropy_vp_backward(float *dlogits, const float *lse, const float *logits,
                                   const int32_t *targets, int v0, float dloss, int N, int V);

/* ---- AdamW (torch.optim.AdamW, one tensor) ---------------------------------
 * step t >= 1. grad is multiplied by grad_scale first (the clip coefficient).
 *   p *= 1 - lr*wd;  m = b1 m + (1-b1) g;  v = b2 v + (1-b2) g^2;
 *   p -= lr/(1-b1^t) * m / (sqrt(v)/sqrt(1-b2^t) + eps)                      */
void loom_adamw_update(float *param, float *m, float *v, const float *grad, size_t n, float lr, float beta1,
                       float beta2, float eps, float weight_decay, float grad_scale, int t);

/* ---- reductions ---------------------------------------------------------- */
/* Sum of squares in double precision. */
double loom_sum_squares(const float *x, size_t n);
/* Whether x (n) holds an inf or a NaN. OpenMP-parallel, vectorised, on the
 * bit patterns (so -ffast-math cannot remove it); the reference beside it.
 * The 16-bit forms are base/dtype.h's loom_lp_has_nonfinite and
 * loom_lp_sum_squares; the exact sum of squares (the table's
 * sumsq_exact_add) is base/sumsq_exact.h's loom_sumsq_exact_add. */
int loom_has_nonfinite(const float *x, size_t n);
int loom_has_nonfinite_ref(const float *x, size_t n);

/* ---- elementwise and row moves (cpu/elementwise.c) ------------------------ */
/* x (n) *= s */
void loom_scale(float *x, size_t n, float s);
/* dst (n) = s + src (n) */
void loom_add_scalar(float *dst, const float *src, size_t n, float s);
/* dst (n) += src (n) */
void loom_accumulate(float *dst, const float *src, size_t n);
/* x (n) rounded to dt in place (base/dtype.h's loom_dtype_round_trip) */
void loom_round_to(float *x, size_t n, enum loom_dtype dt);
/* x (n) rounded to dt in place and stored in 16 bits into dst (n)
 * (loom_lp_round_store) */
void loom_round_store(uint16_t *dst, float *x, size_t n, enum loom_dtype dt);
/* Grouped-query attention's packing: qkv (N, 3 NH hs) = (q | k | v) of NH
 * query heads, from q (N, NH hs) and k, v (N, G hs), key/value head g
 * serving query heads [g NH/G, (g+1) NH/G) */
void loom_gqa_pack(float *qkv, const float *q, const float *k, const float *v, int N, int NH, int G, int hs);
/* and back for gradients: dq written, dk and dv (written) the sums over the
 * query heads each key/value head serves */
void loom_gqa_unpack(float *dq, float *dk, float *dv, const float *dqkv, int N, int NH, int G, int hs);

/* ---- rows with a pitch, float64 sums (cpu/rows.c) ---------------------------- */
/* rows x w elements: dst's rows (pitch ldd elements, dtype ddt) = src's
 * (pitch lds, dtype sdt): a copy for one dtype, else 16-bit to float32 or
 * float32 to bf16 */
void loom_convert_rows(void *dst, enum loom_dtype ddt, size_t ldd, const void *src, enum loom_dtype sdt,
                       size_t lds, size_t rows, size_t w);
/* dst's rows (pitch ldd) += src's (pitch lds), rows x w */
void loom_add_rows(float *dst, size_t ldd, const float *src, size_t lds, size_t rows, size_t w);
/* acc (n, float64) += v; dst = acc rounded; dst += acc rounded */
void loom_acc_add(double *acc, const float *v, size_t n);
void loom_acc_round(float *dst, const double *acc, size_t n);
void loom_acc_add_rounded(float *dst, const double *acc, size_t n);

/* ---- fp8 linear layers (cpu/fp8.c) ---------------------------------------- */
/* q (n) = x (n) quantised with scale to fmt, held in bf16; from x16 (bf16)
 * in place of x where non-NULL */
void loom_fp8_quantize(uint16_t *q, const float *x, const uint16_t *x16, size_t n, float scale,
                       enum loom_fp8_format fmt);
/* max |x| (n) of x, or of x16 where non-NULL; NaN when any element is */
float loom_fp8_amax_of(const float *x, const uint16_t *x16, size_t n);
/* out (N,OC) = out * undo + bias (OC, may be NULL) */
void loom_fp8_unscale(float *out, const float *bias, int N, int OC, float undo);
/* dinp (nx, may be NULL) *= undo_x; dweight (nw) += dw * undo_w */
void loom_fp8_scale_into(float *dinp, size_t nx, float undo_x, float *dweight, const float *dw, size_t nw,
                         float undo_w);

/* Sets the thread count of OpenMP and of the BLAS (n >= 1). */
void loom_threads_set(int n);
int loom_threads_get(void);

/* ---- block-sparse causal attention (kernels/sparse_layout.h) ---------------
 * The attention above restricted to a layout's blocks and token rule, for
 * the NH heads held, global heads [h0, h0 + NH) of the layout's (tensor
 * parallelism holds a slice; h0 = 0 and NH = all of them otherwise). qkv
 * (B,T,3C), out (B,T,C) as above. att keeps only the layout's blocks:
 * loom_sparse_att_numel(l, B, NH, h0) floats, per (b, h) each row block's
 * scores as a (block, n * block) panel of its n key blocks. A layout that
 * allows every causal pair (l->dense) runs loom_attention_forward/backward
 * and att is then their (B,NH,T,T). */
struct loom_sparse_layout;
void loom_sparse_attention_forward(float *out, float *att, const float *qkv, int B, int T, int C, int NH,
                                   int h0, const struct loom_sparse_layout *l);
/* dqkv (B,T,3C) is written. datt (as att) is scratch space. */
void loom_sparse_attention_backward(float *dqkv, float *datt, const float *dout, const float *att,
                                    const float *qkv, int B, int T, int C, int NH, int h0,
                                    const struct loom_sparse_layout *l);
/* The same on a dense att and datt (B,NH,T,T), zero where not allowed. */
void loom_sparse_attention_forward_ref(float *out, float *att, const float *qkv, int B, int T, int C, int NH,
                                       int h0, const struct loom_sparse_layout *l);
void loom_sparse_attention_backward_ref(float *dqkv, float *datt, const float *dout, const float *att,
                                        const float *qkv, int B, int T, int C, int NH, int h0,
                                        const struct loom_sparse_layout *l);

#endif
