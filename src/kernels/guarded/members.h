/*
 * Every member of struct loom_kernels (kernels/backend.h), in its order, as
 * an X-macro list: the guarded backend (backend.c) generates one wrapper
 * per kernel from it, and tests/test_backend_guarded.c one check per
 * member. Three kinds:
 *   X_VOID(name, (params), (args))       a kernel returning nothing;
 *   X_RET(type, name, (params), (args))  a kernel returning type;
 *   X_PASS(name)                         a member that touches no buffer
 *                                        (a size, the thread count): taken
 *                                        as it is.
 * backend.c holds sizeof(struct loom_kernels) to the list's length, so a
 * member added to the table and not here fails to compile. Not here: the
 * members' meaning (backend.h).
 */
#ifndef LOOM_KERNELS_GUARDED_MEMBERS_H
#define LOOM_KERNELS_GUARDED_MEMBERS_H

#include "kernels/backend.h"

#define LOOM_KERNELS_MEMBERS(X_VOID, X_RET, X_PASS)                                                          \
    X_VOID(embedding_forward,                                                                                \
           (float *out, const int32_t *tokens, const float *wte, const float *wpe, int B, int T, int C),     \
           (out, tokens, wte, wpe, B, T, C))                                                                 \
    X_VOID(embedding_backward,                                                                               \
           (float *dwte, float *dwpe, const float *dout, const int32_t *tokens, int B, int T, int C),        \
           (dwte, dwpe, dout, tokens, B, T, C))                                                              \
    X_VOID(embedding_vp_forward,                                                                             \
           (float *out, const int32_t *tokens, const float *wte, const float *wpe, int v0, int Vl, int B,    \
            int T, int C),                                                                                   \
           (out, tokens, wte, wpe, v0, Vl, B, T, C))                                                         \
    X_VOID(embedding_vp_backward,                                                                            \
           (float *dwte, float *dwpe, const float *dout, const int32_t *tokens, int v0, int Vl, int B,       \
            int T, int C),                                                                                   \
           (dwte, dwpe, dout, tokens, v0, Vl, B, T, C))                                                      \
    X_VOID(layernorm_forward,                                                                                \
           (float *out, float *mean, float *rstd, const float *inp, const float *weight, const float *bias,  \
            int N, int C, float eps),                                                                        \
           (out, mean, rstd, inp, weight, bias, N, C, eps))                                                  \
    X_VOID(layernorm_backward,                                                                               \
           (float *dinp, float *dweight, float *dbias, const float *dout, const float *inp,                  \
            const float *weight, const float *mean, const float *rstd, int N, int C),                        \
           (dinp, dweight, dbias, dout, inp, weight, mean, rstd, N, C))                                      \
    X_VOID(matmul_forward,                                                                                   \
           (float *out, const float *inp, const float *weight, const float *bias, int N, int C, int OC),     \
           (out, inp, weight, bias, N, C, OC))                                                               \
    X_VOID(matmul_backward,                                                                                  \
           (float *dinp, float *dweight, float *dbias, const float *dout, const float *inp,                  \
            const float *weight, int N, int C, int OC),                                                      \
           (dinp, dweight, dbias, dout, inp, weight, N, C, OC))                                              \
    X_VOID(bias_backward, (float *dbias, const float *dout, int N, int OC), (dbias, dout, N, OC))            \
    X_VOID(lm_head_forward, (float *logits, const float *inp, const float *wte, int N, int C, int V),        \
           (logits, inp, wte, N, C, V))                                                                      \
    X_VOID(lm_head_backward,                                                                                 \
           (float *dinp, float *dwte, const float *dlogits, const float *inp, const float *wte, int N,       \
            int C, int V),                                                                                   \
           (dinp, dwte, dlogits, inp, wte, N, C, V))                                                         \
    X_VOID(lm_head_forward_lp,                                                                               \
           (uint16_t * logits, enum loom_dtype dt, const float *inp, const float *wte,                       \
            const uint16_t *wte16, int N, int C, int V),                                                     \
           (logits, dt, inp, wte, wte16, N, C, V))                                                           \
    X_VOID(lm_head_backward_lp,                                                                              \
           (float *dinp, float *dwte, const uint16_t *dlogits, enum loom_dtype dt, const float *inp,         \
            const float *wte, const uint16_t *wte16, int N, int C, int V),                                   \
           (dinp, dwte, dlogits, dt, inp, wte, wte16, N, C, V))                                              \
    X_PASS(lm_head_lp_scratch)                                                                               \
    X_VOID(matmul_forward_b16,                                                                               \
           (float *out, const float *inp, const uint16_t *inp16, const float *weight,                        \
            const uint16_t *weight16, const float *bias, int N, int C, int OC),                              \
           (out, inp, inp16, weight, weight16, bias, N, C, OC))                                              \
    X_VOID(matmul_backward_b16,                                                                              \
           (float *dinp, float *dweight, float *dbias, const float *dout, const float *inp,                  \
            const uint16_t *inp16, const float *weight, const uint16_t *weight16, int N, int C, int OC),     \
           (dinp, dweight, dbias, dout, inp, inp16, weight, weight16, N, C, OC))                             \
    X_VOID(linear_forward,                                                                                   \
           (float *out, const float *inp, const uint16_t *inp16, const float *weight,                        \
            const uint16_t *weight16, const float *bias, int N, int C, int OC),                              \
           (out, inp, inp16, weight, weight16, bias, N, C, OC))                                              \
    X_VOID(linear_backward,                                                                                  \
           (float *dinp, float *dweight, float *dbias, const float *dout, const float *inp,                  \
            const uint16_t *inp16, const float *weight, const uint16_t *weight16, int N, int C, int OC),     \
           (dinp, dweight, dbias, dout, inp, inp16, weight, weight16, N, C, OC))                             \
    X_VOID(grouped_forward, (float *out, const float *inp, const struct loom_grouped *g, int C, int OC),     \
           (out, inp, g, C, OC))                                                                             \
    X_VOID(grouped_backward,                                                                                 \
           (float *dinp, const float *dout, const float *inp, const struct loom_grouped *g, int C, int OC),  \
           (dinp, dout, inp, g, C, OC))                                                                      \
    X_VOID(attention_forward, (float *out, float *att, const float *qkv, int B, int T, int C, int NH),       \
           (out, att, qkv, B, T, C, NH))                                                                     \
    X_VOID(attention_backward,                                                                               \
           (float *dqkv, float *datt, const float *dout, const float *att, const float *qkv, int B, int T,   \
            int C, int NH),                                                                                  \
           (dqkv, datt, dout, att, qkv, B, T, C, NH))                                                        \
    X_VOID(sparse_attention_forward,                                                                         \
           (float *out, float *att, const float *qkv, int B, int T, int C, int NH, int h0,                   \
            const struct loom_sparse_layout *l),                                                             \
           (out, att, qkv, B, T, C, NH, h0, l))                                                              \
    X_VOID(sparse_attention_backward,                                                                        \
           (float *dqkv, float *datt, const float *dout, const float *att, const float *qkv, int B, int T,   \
            int C, int NH, int h0, const struct loom_sparse_layout *l),                                      \
           (dqkv, datt, dout, att, qkv, B, T, C, NH, h0, l))                                                 \
    X_VOID(flash_attention_forward,                                                                          \
           (float *out, float *lse, const float *q, const float *k, const float *v,                          \
            const struct loom_flash_attn *a),                                                                \
           (out, lse, q, k, v, a))                                                                           \
    X_VOID(flash_attention_backward,                                                                         \
           (float *dq, float *dk, float *dv, const float *dout, const float *out, const float *lse,          \
            const float *q, const float *k, const float *v, const struct loom_flash_attn *a),                \
           (dq, dk, dv, dout, out, lse, q, k, v, a))                                                         \
    X_VOID(                                                                                                  \
        flash_attention_merge,                                                                               \
        (float *out, float *lse, const float *out_p, const float *lse_p, int N, int NH, int hs, int ld_lse), \
        (out, lse, out_p, lse_p, N, NH, hs, ld_lse))                                                         \
    X_VOID(gelu_forward, (float *out, const float *inp, size_t n), (out, inp, n))                            \
    X_VOID(gelu_backward, (float *dinp, const float *dout, const float *inp, size_t n),                      \
           (dinp, dout, inp, n))                                                                             \
    X_VOID(gelu_exact_forward, (float *out, const float *inp, size_t n), (out, inp, n))                      \
    X_VOID(gelu_exact_backward, (float *dinp, const float *dout, const float *inp, size_t n),                \
           (dinp, dout, inp, n))                                                                             \
    X_VOID(rmsnorm_forward,                                                                                  \
           (float *out, float *rstd, const float *inp, const float *weight, int N, int C, float eps),        \
           (out, rstd, inp, weight, N, C, eps))                                                              \
    X_VOID(rmsnorm_backward,                                                                                 \
           (float *dinp, float *dweight, const float *dout, const float *inp, const float *weight,           \
            const float *rstd, int N, int C),                                                                \
           (dinp, dweight, dout, inp, weight, rstd, N, C))                                                   \
    X_VOID(rope_forward, (float *x, int B, int T, int H, int D, float theta), (x, B, T, H, D, theta))        \
    X_VOID(rope_backward, (float *dx, int B, int T, int H, int D, float theta), (dx, B, T, H, D, theta))     \
    X_VOID(rope_forward_at, (float *x, const int32_t *pos, int N, int H, int D, float theta),                \
           (x, pos, N, H, D, theta))                                                                         \
    X_VOID(rope_backward_at, (float *dx, const int32_t *pos, int N, int H, int D, float theta),              \
           (dx, pos, N, H, D, theta))                                                                        \
    X_VOID(swiglu_forward, (float *out, const float *gate, const float *up, size_t n), (out, gate, up, n))   \
    X_VOID(swiglu_backward,                                                                                  \
           (float *dgate, float *dup, const float *dout, const float *gate, const float *up, size_t n),      \
           (dgate, dup, dout, gate, up, n))                                                                  \
    X_VOID(moe_router_forward,                                                                               \
           (float *probs, int32_t *idx, float *lse, float *score_sum, const float *logits, int N, int E,     \
            int k, int pre_softmax),                                                                         \
           (probs, idx, lse, score_sum, logits, N, E, k, pre_softmax))                                       \
    X_VOID(moe_router_backward,                                                                              \
           (float *dlogits, const float *dprobs, const float *probs, const int32_t *idx, const float *lse,   \
            const float *logits, const float *aux_grad, float z_grad, int N, int E, int k, int pre_softmax), \
           (dlogits, dprobs, probs, idx, lse, logits, aux_grad, z_grad, N, E, k, pre_softmax))               \
    X_VOID(moe_permute_forward, (float *xp, const float *x, const int32_t *pos, int N, int k, int C),        \
           (xp, x, pos, N, k, C))                                                                            \
    X_VOID(moe_permute_backward, (float *dx, const float *dxp, const int32_t *pos, int N, int k, int C),     \
           (dx, dxp, pos, N, k, C))                                                                          \
    X_VOID(moe_unpermute_forward,                                                                            \
           (float *out, const float *y, const float *probs, const int32_t *pos, int N, int k, int C),        \
           (out, y, probs, pos, N, k, C))                                                                    \
    X_VOID(moe_unpermute_backward,                                                                           \
           (float *dy, float *dprobs, const float *dout, const float *y, const float *probs,                 \
            const int32_t *pos, int N, int k, int C),                                                        \
           (dy, dprobs, dout, y, probs, pos, N, k, C))                                                       \
    X_VOID(geglu_forward, (float *out, const float *gate, const float *up, size_t n), (out, gate, up, n))    \
    X_VOID(geglu_backward,                                                                                   \
           (float *dgate, float *dup, const float *dout, const float *gate, const float *up, size_t n),      \
           (dgate, dup, dout, gate, up, n))                                                                  \
    X_VOID(residual_forward, (float *out, const float *a, const float *b, size_t n), (out, a, b, n))         \
    X_VOID(residual_backward, (float *da, float *db, const float *dout, size_t n), (da, db, dout, n))        \
    X_VOID(crossentropy_forward,                                                                             \
           (float *losses, float *lse, const float *logits, const int32_t *targets, int N, int V),           \
           (losses, lse, logits, targets, N, V))                                                             \
    X_VOID(crossentropy_backward,                                                                            \
           (float *dlogits, const float *lse, const float *logits, const int32_t *targets, float dloss,      \
            int N, int V),                                                                                   \
           (dlogits, lse, logits, targets, dloss, N, V))                                                     \
    X_VOID(crossentropy_vp_max, (float *rowmax, const float *logits, int N, int V), (rowmax, logits, N, V))  \
    X_VOID(crossentropy_vp_stats,                                                                            \
           (float *sumexp, float *target_logit, const float *logits, const float *max,                       \
            const int32_t *targets, int v0, int N, int V),                                                   \
           (sumexp, target_logit, logits, max, targets, v0, N, V))                                           \
    X_VOID(crossentropy_vp_finish,                                                                           \
           (float *losses, float *lse, const float *max, const float *sumexp, const float *target_logit,     \
            int N),                                                                                          \
           (losses, lse, max, sumexp, target_logit, N))                                                      \
    X_VOID(crossentropy_vp_backward,                                                                         \
           (float *dlogits, const float *lse, const float *logits, const int32_t *targets, int v0,           \
            float dloss, int N, int V),                                                                      \
           (dlogits, lse, logits, targets, v0, dloss, N, V))                                                 \
    X_VOID(adamw_update,                                                                                     \
           (float *param, float *m, float *v, const float *grad, size_t n, float lr, float beta1,            \
            float beta2, float eps, float weight_decay, float grad_scale, int t),                            \
           (param, m, v, grad, n, lr, beta1, beta2, eps, weight_decay, grad_scale, t))                       \
    X_RET(double, sum_squares, (const float *x, size_t n), (x, n))                                           \
    X_RET(double, lp_sum_squares, (const uint16_t *x, size_t n, enum loom_dtype dt), (x, n, dt))             \
    X_RET(int, has_nonfinite, (const float *x, size_t n), (x, n))                                            \
    X_RET(int, lp_has_nonfinite, (const uint16_t *x, size_t n, enum loom_dtype dt), (x, n, dt))              \
    X_VOID(sumsq_exact_add, (struct loom_sumsq_exact * s, const void *x, size_t n, enum loom_dtype dt),      \
           (s, x, n, dt))                                                                                    \
    X_VOID(scale, (float *x, size_t n, float s), (x, n, s))                                                  \
    X_VOID(dropout_rows,                                                                                     \
           (float *x, size_t ld, const int64_t *row, int rows, int width, const struct loom_dropout *d),     \
           (x, ld, row, rows, width, d))                                                                     \
    X_VOID(add_scalar, (float *dst, const float *src, size_t n, float s), (dst, src, n, s))                  \
    X_VOID(accumulate, (float *dst, const float *src, size_t n), (dst, src, n))                              \
    X_VOID(round_to, (float *x, size_t n, enum loom_dtype dt), (x, n, dt))                                   \
    X_VOID(round_store, (uint16_t * dst16, float *x, size_t n, enum loom_dtype dt), (dst16, x, n, dt))       \
    X_VOID(lp_accumulate, (uint16_t * dst16, const float *src, size_t n, enum loom_dtype dt),                \
           (dst16, src, n, dt))                                                                              \
    X_VOID(gqa_pack,                                                                                         \
           (float *qkv, const float *q, const float *k, const float *v, int N, int NH, int G, int hs),       \
           (qkv, q, k, v, N, NH, G, hs))                                                                     \
    X_VOID(gqa_unpack, (float *dq, float *dk, float *dv, const float *dqkv, int N, int NH, int G, int hs),   \
           (dq, dk, dv, dqkv, N, NH, G, hs))                                                                 \
    X_VOID(convert_rows,                                                                                     \
           (void *dst, enum loom_dtype ddt, size_t ldd, const void *src, enum loom_dtype sdt, size_t lds,    \
            size_t rows, size_t w),                                                                          \
           (dst, ddt, ldd, src, sdt, lds, rows, w))                                                          \
    X_VOID(add_rows, (float *dst, size_t ldd, const float *src, size_t lds, size_t rows, size_t w),          \
           (dst, ldd, src, lds, rows, w))                                                                    \
    X_VOID(add_bias, (float *y, const float *bias, int N, int OC), (y, bias, N, OC))                         \
    X_VOID(acc_add, (double *acc, const float *v, size_t n), (acc, v, n))                                    \
    X_VOID(acc_round, (float *dst, const double *acc, size_t n), (dst, acc, n))                              \
    X_VOID(acc_add_rounded, (float *dst, const double *acc, size_t n), (dst, acc, n))                        \
    X_VOID(fp8_quantize,                                                                                     \
           (uint16_t * q, const float *x, const uint16_t *x16, size_t n, float scale,                        \
            enum loom_fp8_format fmt),                                                                       \
           (q, x, x16, n, scale, fmt))                                                                       \
    X_RET(float, fp8_amax, (const float *x, const uint16_t *x16, size_t n), (x, x16, n))                     \
    X_VOID(fp8_unscale, (float *out, const float *bias, int N, int OC, float undo),                          \
           (out, bias, N, OC, undo))                                                                         \
    X_VOID(fp8_scale_into,                                                                                   \
           (float *dinp, size_t nx, float undo_x, float *dweight, const float *dw, size_t nw, float undo_w), \
           (dinp, nx, undo_x, dweight, dw, nw, undo_w))                                                      \
    X_PASS(set_threads)                                                                                      \
    X_PASS(get_threads)

#endif
