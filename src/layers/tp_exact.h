/*
 * Layout-invariant tensor parallelism (--layout-invariant N): the sums tensor
 * parallelism splits are taken in N fixed pieces, exactly, on every layout,
 * so a run at any tensor-parallel size T dividing N (one process included)
 * computes the same bits.
 *
 * Tensor parallelism splits a sum wherever a product's inner dimension is
 * divided over the tp group: the row-parallel products (the attention and
 * MLP output projections), the input gradients of the column-parallel ones
 * (QKV, MLP fc or gate/up) and of the vocab-parallel LM head, the
 * cross-entropy's sum of exponentials, and, under sequence parallelism, the
 * norms' weight gradients (a sum over rows). Each of those sums is cut into
 * N pieces the same way on every layout (piece c of n entries is
 * loom_tp_part(n, N, c); a rank of T holds pieces [r N/T, (r+1) N/T), whose
 * union is its own part), each piece is computed by the same kernel call on
 * the same operands, and the float32 pieces are added in float64 (over the
 * tp group by a float64 all-reduce or reduce-scatter) and rounded to
 * float32 once. A sum of N float32 values in float64 is exact while they
 * span fewer than 53 - 24 - log2(N) binary orders of magnitude, and an
 * exact sum does not depend on the order of its additions; beyond that
 * span the float64 rounding (2^-53 relative) can only matter where the sum
 * lies that close to halfway between two float32 values.
 *
 * What stays out: the sums over micro-batches and data-parallel ranks
 * (the gradients' accumulation and reduction, the layouts' float32 order),
 * and fp8.
 */
#ifndef LOOM_LAYERS_TP_EXACT_H
#define LOOM_LAYERS_TP_EXACT_H

#include <stddef.h>
#include <stdint.h>

#include "kernels/backend.h"
#include "layers/tp_regions.h"

struct loom_backend; /* kernels/backend.h */

struct loom_tp_exact {
    const struct loom_backend *b; /* the model's: its scratch, copies and row kernels */
    int pieces;                   /* N; 0: off (the layout's own sums) */
    int tp, tp_rank;
    /* scratch, grown on use (activations): float64 sums of every row and of
     * the rows held, a piece's product, its packed operands */
    double *acc, *acc_rows;
    float *part, *pack_a, *pack_w, *pack_in, *grad;
    size_t cap_acc, cap_acc_rows, cap_part, cap_pack_a, cap_pack_w, cap_pack_in, cap_grad;
    int ce_rows; /* the cross-entropy's rows, from _begin */
    /* Row blocks (loom_tp_exact_set_rows): every product runs on blocks of
     * `block` rows (0: all rows in one call), and the weight gradients,
     * sums over the rows, are summed over the blocks and the context group
     * in float64, added by context rank 0 only. */
    int block, cp, cp_rank;
    double *acc_w;
    size_t cap_acc_w;
};

void loom_tp_exact_init(struct loom_tp_exact *x, const struct loom_backend *b, int pieces, int tp,
                        int tp_rank);
void loom_tp_exact_free(struct loom_tp_exact *x);
/* Context parallelism splits the rows, and with them the products' shapes
 * and the weight gradients' sums over the rows: under the flag every
 * product then runs on row blocks of `block` rows, each sequence's T rows
 * cut into 2N blocks (T / 2N rows; the rows a context rank holds are whole
 * blocks), one kernel call a block with the same shapes on every layout.
 * A weight or bias gradient is each block's, summed in float64 over the
 * blocks and the context group (cp ranks), rounded once and added by
 * context rank 0; the others add nothing, so the data-parallel sums over
 * the data x context group, context ranks innermost, add zeros. block 0:
 * off (every row in one call, gradients as the kernels accumulate them). */
void loom_tp_exact_set_rows(struct loom_tp_exact *x, int block, int cp, int cp_rank);

/* The fewest rows a block may have: below it a block's weight gradients
 * (a pass over every weight in float64) cost more than its products, so
 * shorter sequences keep every row in one call (and context parallelism
 * is refused under the flag). */
#define LOOM_TP_EXACT_MIN_BLOCK 128

/* The rows of a block for sequences of T under --layout-invariant N: T /
 * 2N where that divides T and is at least LOOM_TP_EXACT_MIN_BLOCK, else 0
 * (no blocks). */
int loom_tp_exact_block_rows(int T, int pieces);

/* Pieces this rank holds (N / T) and the first of them. */
int loom_tp_exact_held(const struct loom_tp_exact *x);
int loom_tp_exact_first(const struct loom_tp_exact *x);
/* Held piece j (0 <= j < held) of a dimension of n entries split over the
 * tp group: [lo, hi) in this rank's part of it. */
void loom_tp_exact_piece(const struct loom_tp_exact *x, int64_t n, int j, int *lo, int *hi);

/* Weights are [in, out] (GPT-2's Conv1D: inp @ W) or, with w_out_in,
 * (out, in) (Llama's: inp @ W^T), this rank's part of them, with W16 the
 * same as stored in bf16 where it is (NULL: not). Inputs are float32, or
 * where inp is NULL the bf16 values inp16. Where the kernels take bf16
 * operands as they are (their _b16 products, [in, out] weights), W16 and
 * inp16 go in without a float32 round trip: the same values, the same
 * bits. Every product below
 * is taken piece by piece with the piece's shapes, whatever the layout: the
 * pieces of an output split (the column-parallel products, the LM head)
 * are written in place, the pieces of an inner split are summed exactly.
 * Weight gradients accumulate, a piece at a time. */

/* A column-parallel product's output features come in segments (q | k | v,
 * gate | up, or one), each split over the pieces; a piece of the product is
 * every segment's piece, in segment order. Segment s: this rank's width
 * output features; their weight columns W (rows of ldw: [in, out]) or rows
 * (out, in: rows of C), the gradient dW laid out alike, bias and dbias
 * (width, NULL: none), and the output out / its gradient dout (rows of ld). */
struct loom_tp_segment {
    int width;
    const float *W;
    const uint16_t *W16; /* W as stored in bf16 (NULL: not), laid out alike: what a bf16 product takes */
    float *dW;
    int ldw;
    const float *bias;
    float *dbias;
    float *out;
    const float *dout;
    int ld;
};

/* out (N, width) of each segment = inp (N, C) @ W + bias. */
void loom_tp_exact_column_forward(struct loom_tp_exact *x, const struct loom_kernels *k,
                                  const struct loom_tp_segment *seg, int nseg, const float *inp,
                                  const uint16_t *inp16, int w_out_in, int N, int C);
/* Its backward entering the region: each segment's dW and dbias
 * accumulate, and the region's input gradient (the sum over the segments
 * of dout @ W^T) is returned as loom_tp_region_input_grad returns it (dst,
 * or r->grad_rows). */
float *loom_tp_exact_column_backward(struct loom_tp_exact *x, struct loom_tp_regions *r,
                                     const struct loom_kernels *k, const struct loom_tp_segment *seg,
                                     int nseg, const float *inp, const uint16_t *inp16, int w_out_in,
                                     float *dst, int N, int C);
/* The row-parallel product leaving the region: its output rows as
 * loom_tp_region_output returns them (dst, or r->out_rows) = inp (N, Kl) @
 * W + bias (OC, NULL: none), the bias added to the rounded sum. */
float *loom_tp_exact_row_forward(struct loom_tp_exact *x, struct loom_tp_regions *r,
                                 const struct loom_kernels *k, const float *inp, const uint16_t *inp16,
                                 const float *W, const uint16_t *W16, int w_out_in, const float *bias,
                                 float *dst, int N, int Kl, int OC);
/* Its backward, dout (N, OC) every row: dinp (N, Kl) written; dW and dbias
 * (NULL: none) accumulate. */
void loom_tp_exact_row_backward(struct loom_tp_exact *x, const struct loom_kernels *k, float *dinp, float *dW,
                                float *dbias, const float *dout, const float *inp, const uint16_t *inp16,
                                const float *W, const uint16_t *W16, int w_out_in, int N, int Kl, int OC);
/* The vocab-parallel LM head: logits (N, Vl: this rank's vocabulary of V)
 * = inp (N, C) @ W^T, W (Vl, C); float32 logits (dt F32) or 16 bits of dt. */
void loom_tp_exact_head_forward(struct loom_tp_exact *x, const struct loom_kernels *k, void *logits,
                                enum loom_dtype dt, const float *inp, const float *W, const uint16_t *W16,
                                int N, int C, int V, int Vl);
/* Its backward from dlogits (as the logits): dW (Vl, C) accumulates, and the
 * input gradient is returned as loom_tp_region_input_grad returns it. */
float *loom_tp_exact_head_backward(struct loom_tp_exact *x, struct loom_tp_regions *r,
                                   const struct loom_kernels *k, float *dW, const void *dlogits,
                                   enum loom_dtype dt, const float *inp, const float *W, const uint16_t *W16,
                                   float *dst, int N, int C, int V, int Vl);

/* The cross-entropy's statistics over the vocabulary pieces, summed over
 * the tp group: sumexp (N) and target (N, the target's logit) of logits
 * (N, Vl: vocabulary rows [v0, v0 + Vl) of V) given the whole vocabulary's
 * row max. _begin for N rows, then _rows with the logits n rows at a time
 * (row0 the first), then _done. */
void loom_tp_exact_crossentropy_begin(struct loom_tp_exact *x, int N);
void loom_tp_exact_crossentropy_rows(struct loom_tp_exact *x, const struct loom_kernels *k,
                                     const float *logits, const float *rowmax, const int32_t *targets,
                                     int row0, int n, int V, int v0, int Vl);
void loom_tp_exact_crossentropy_done(struct loom_tp_exact *x, float *sumexp, float *target, int N);

/* The scratch the products above grow on use, grown now to what they will
 * take (the model's reserve, so the footprint counts it): a column product
 * of nseg segments of widths width (this rank's), with float32 copies of
 * 16-bit inputs (in16) and biases; a row product; the LM head in dt. */
void loom_tp_exact_reserve_column(struct loom_tp_exact *x, const struct loom_tp_regions *r, const int *width,
                                  int nseg, int in16, int bias, int N, int C);
void loom_tp_exact_reserve_row(struct loom_tp_exact *x, const struct loom_tp_regions *r, int w_out_in, int N,
                               int Kl, int OC);
void loom_tp_exact_reserve_head(struct loom_tp_exact *x, const struct loom_tp_regions *r, enum loom_dtype dt,
                                int N, int C, int V);

/* Row pieces: the rows a rank holds between the regions (every row
 * without sequence parallelism), as held pieces of the N rows. */
int loom_tp_exact_row_pieces(const struct loom_tp_exact *x, const struct loom_tp_regions *r, int N);
/* Row piece j's rows [lo, hi) among the rows held (with row blocks, block
 * j of them). */
void loom_tp_exact_row_piece(const struct loom_tp_exact *x, const struct loom_tp_regions *r, int N, int j,
                             int *lo, int *hi);
/* A float64 sum of n values (x->acc), zeroed. */
double *loom_tp_exact_sum(struct loom_tp_exact *x, size_t n);
/* acc += v (n) in float64. */
void loom_tp_exact_add(const struct loom_tp_exact *x, double *acc, const float *v, size_t n);
/* acc (n), a sum over the row pieces this rank holds, summed over the
 * context group: kept by context rank 0, zeros elsewhere (the tp group's
 * sum under sequence parallelism is the strategy's). */
void loom_tp_exact_rows_cp(const struct loom_tp_exact *x, double *acc, size_t n);
/* grad (n) += acc rounded to float32. */
void loom_tp_exact_add_rounded(const struct loom_tp_exact *x, float *grad, const double *acc, size_t n);

#endif
