/*
 * Token + position embedding: out[b,t] = wte[tokens[b,t]] + wpe[t], and its
 * backward into both tables.
 *
 * A token can repeat within a batch, so the backward cannot split rows
 * between threads; it splits the C columns instead: each thread owns a
 * band of columns of dwte and dwpe and walks every row in order, which is
 * race-free and adds in the same order as a serial loop (the same bits for
 * any thread count). Deliberately not: token validation (the data loader's
 * job) or dropout.
 */
#include "kernels/kernels.h"

#define COL_BLOCK 64 /* columns per task in the backward: one cache line x 4 */

/* out (B,T,C), tokens (B,T), wte (V,C), wpe (maxT,C) */
void loom_embedding_forward(float *out, const int32_t *tokens, const float *wte, const float *wpe, int B,
                            int T, int C)
{
    const size_t rows = (size_t)B * T;
#pragma omp parallel for schedule(static) if (rows * (size_t)C >= 32768)
    for (size_t r = 0; r < rows; r++) {
        const float *we = wte + (size_t)tokens[r] * C;
        const float *pe = wpe + (r % (size_t)T) * C;
        float *o = out + r * C;
#pragma omp simd
        for (int c = 0; c < C; c++) o[c] = we[c] + pe[c];
    }
}

/* dwte (V,C) and dwpe (maxT,C) accumulate; dout (B,T,C), tokens (B,T) */
void loom_embedding_backward(float *dwte, float *dwpe, const float *dout, const int32_t *tokens, int B, int T,
                             int C)
{
    const size_t rows = (size_t)B * T;
    const int nblocks = (C + COL_BLOCK - 1) / COL_BLOCK;
#pragma omp parallel for schedule(static) if (rows * (size_t)C >= 32768)
    for (int blk = 0; blk < nblocks; blk++) {
        const int c0 = blk * COL_BLOCK;
        const int c1 = c0 + COL_BLOCK < C ? c0 + COL_BLOCK : C;
        for (size_t r = 0; r < rows; r++) {
            const float *d = dout + r * C;
            if (dwte) {
                float *we = dwte + (size_t)tokens[r] * C;
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
