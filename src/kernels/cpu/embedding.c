/*
 * Token + position embedding: out[b,t] = wte[tokens[b,t]] + wpe[t], and its
 * backward into both tables; and the vocabulary-parallel form, where a
 * tensor-parallel rank holds only the rows [v0, v0 + Vl) of wte: tokens
 * outside them contribute zero to out and nothing to dwte, so that the sum
 * of every rank's out (wpe added on one rank) is the full embedding. The
 * plain kernels are the vocabulary-parallel ones over [0, INT_MAX): one
 * rank holding everything computes the same bits.
 *
 * A token can repeat within a batch, so the backward cannot split rows
 * between threads; it splits the C columns instead: each thread owns a
 * band of columns of dwte and dwpe and walks every row in order, which is
 * race-free and adds in the same order as a serial loop (the same bits for
 * any thread count). Deliberately not: token validation (the data loader's
 * job), the all-reduce of the vocabulary-parallel out (the caller's), or
 * dropout.
 */
#include "kernels/kernels.h"

#include <limits.h>

#define COL_BLOCK 64 /* columns per task in the backward: one cache line x 4 */

/* The row of this rank's wte for token tok, or -1 when [v0, v0 + Vl) does
 * not hold it. */
static inline int64_t local_row(int32_t tok, int v0, int Vl)
{
    const int64_t v = (int64_t)tok - v0;
    return v >= 0 && v < Vl ? v : -1;
}

/* out (B,T,C), tokens (B,T), wte (Vl,C) rows v0.., wpe (maxT,C) or NULL */
void loom_embedding_vp_forward(float *out, const int32_t *tokens, const float *wte, const float *wpe, int v0,
                               int Vl, int B, int T, int C)
{
    const size_t rows = (size_t)B * T;
#pragma omp parallel for schedule(static) if (rows * (size_t)C >= 32768)
    for (size_t r = 0; r < rows; r++) {
        const int64_t v = local_row(tokens[r], v0, Vl);
        const float *we = v >= 0 ? wte + (size_t)v * C : NULL;
        const float *pe = wpe ? wpe + (r % (size_t)T) * C : NULL;
        float *o = out + r * C;
        if (we && pe) {
#pragma omp simd
            for (int c = 0; c < C; c++) o[c] = we[c] + pe[c];
        } else if (we || pe) {
            const float *src = we ? we : pe;
#pragma omp simd
            for (int c = 0; c < C; c++) o[c] = src[c];
        } else {
#pragma omp simd
            for (int c = 0; c < C; c++) o[c] = 0.0f;
        }
    }
}

/* out (B,T,C), tokens (B,T), wte (V,C), wpe (maxT,C) */
void loom_embedding_forward(float *out, const int32_t *tokens, const float *wte, const float *wpe, int B,
                            int T, int C)
{
    loom_embedding_vp_forward(out, tokens, wte, wpe, 0, INT_MAX, B, T, C);
}

/* dwte (Vl,C) rows v0.. and dwpe (maxT,C) accumulate, either may be NULL;
 * dout (B,T,C), tokens (B,T) */
void loom_embedding_vp_backward(float *dwte, float *dwpe, const float *dout, const int32_t *tokens, int v0,
                                int Vl, int B, int T, int C)
{
    const size_t rows = (size_t)B * T;
    const int nblocks = (C + COL_BLOCK - 1) / COL_BLOCK;
#pragma omp parallel for schedule(static) if (rows * (size_t)C >= 32768)
    for (int blk = 0; blk < nblocks; blk++) {
        const int c0 = blk * COL_BLOCK;
        const int c1 = c0 + COL_BLOCK < C ? c0 + COL_BLOCK : C;
        for (size_t r = 0; r < rows; r++) {
            const float *d = dout + r * C;
            const int64_t v = dwte ? local_row(tokens[r], v0, Vl) : -1;
            if (v >= 0) {
                float *we = dwte + (size_t)v * C;
#pragma omp simd
                for (int c = c0; c < c1; c++) we[c] += d[c];
            }
            if (dwpe) {
                float *pe = dwpe + (r % (size_t)T) * C;
#pragma omp simd
                for (int c = c0; c < c1; c++) pe[c] += d[c];
            }
        }
    }
}

/* dwte (V,C) and dwpe (maxT,C) accumulate; dout (B,T,C), tokens (B,T) */
void loom_embedding_backward(float *dwte, float *dwpe, const float *dout, const int32_t *tokens, int B, int T,
                             int C)
{
    loom_embedding_vp_backward(dwte, dwpe, dout, tokens, 0, INT_MAX, B, T, C);
}
