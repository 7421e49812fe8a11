/*
 * Layout-invariant tensor parallelism's sums (tp_exact.h).
 */
#include "layers/tp_exact.h"

#include <string.h>

#include "base/dtype.h"
#include "base/log.h"
#include "base/mem.h"
#include "kernels/backend.h"

void loom_tp_exact_init(struct loom_tp_exact *x, const struct loom_backend *b, int pieces, int tp,
                        int tp_rank)
{
    LOOM_ASSERT(pieces >= 0 && tp >= 1 && (pieces == 0 || pieces % tp == 0));
    loom_tp_exact_free(x);
    *x = (struct loom_tp_exact){.b = b, .pieces = pieces, .tp = tp, .tp_rank = tp_rank};
}

void loom_tp_exact_free(struct loom_tp_exact *x)
{
    void *bufs[] = {x->acc, x->acc_rows, x->part, x->pack_a, x->pack_w, x->pack_in, x->grad, x->acc_w};
    for (size_t i = 0; i < sizeof bufs / sizeof bufs[0]; i++)
        if (bufs[i]) x->b->free(bufs[i]);
    x->acc = x->acc_rows = x->acc_w = NULL;
    x->part = x->pack_a = x->pack_w = x->pack_in = x->grad = NULL;
    x->cap_acc = x->cap_acc_rows = x->cap_part = x->cap_pack_a = x->cap_pack_w = x->cap_pack_in =
        x->cap_grad = x->cap_acc_w = 0;
}

int loom_tp_exact_block_rows(int T, int pieces)
{
    if (pieces <= 0 || T % (2 * pieces)) return 0;
    return T / (2 * pieces) >= LOOM_TP_EXACT_MIN_BLOCK ? T / (2 * pieces) : 0;
}

void loom_tp_exact_set_rows(struct loom_tp_exact *x, int block, int cp, int cp_rank)
{
    LOOM_ASSERT(block >= 0 && cp >= 1 && cp_rank >= 0 && cp_rank < cp && (cp == 1 || block > 0));
    x->block = block;
    x->cp = cp;
    x->cp_rank = cp_rank;
}

/* The kernels of the rows and sums (one table serves every dtype). */
static const struct loom_kernels *K(const struct loom_tp_exact *x)
{
    return x->b->k;
}

/* *p with room for n elements of size sz on the backend (what it held is not kept) */
static void *grow(const struct loom_tp_exact *x, void *p, size_t *cap, size_t n, size_t sz)
{
    void **pp = p;
    if (n > *cap) {
        if (*pp) x->b->free(*pp);
        *pp = x->b->alloc(loom_mul_size(n, sz), LOOM_MEM_ACTIVATIONS);
        *cap = n;
    }
    return *pp;
}

int loom_tp_exact_held(const struct loom_tp_exact *x)
{
    return x->pieces / x->tp;
}

int loom_tp_exact_first(const struct loom_tp_exact *x)
{
    return x->tp_rank * loom_tp_exact_held(x);
}

void loom_tp_exact_piece(const struct loom_tp_exact *x, int64_t n, int j, int *lo, int *hi)
{
    int64_t base, end, a, b;
    loom_tp_part(n, x->tp, x->tp_rank, &base, &end);
    loom_tp_part(n, x->pieces, loom_tp_exact_first(x) + j, &a, &b);
    LOOM_ASSERT(j >= 0 && j < loom_tp_exact_held(x) && a >= base && b <= end);
    *lo = (int)(a - base);
    *hi = (int)(b - base);
}

double *loom_tp_exact_sum(struct loom_tp_exact *x, size_t n)
{
    double *acc = grow(x, &x->acc, &x->cap_acc, n, sizeof(double));
    x->b->memset(acc, 0, n * sizeof(double));
    return acc;
}

void loom_tp_exact_add(const struct loom_tp_exact *x, double *acc, const float *v, size_t n)
{
    K(x)->acc_add(acc, v, n);
}

/* A piece of a split dimension: entries [at, at + width) of this rank's part. */
struct piece {
    int at, width;
};

/* Piece j of a dimension of n entries (the whole's) as loom_tp_part cuts it. */
static struct piece piece_of_part(const struct loom_tp_exact *x, int64_t n, int j)
{
    int lo, hi;
    loom_tp_exact_piece(x, n, j, &lo, &hi);
    return (struct piece){lo, hi - lo};
}

/* dst (n, p.width) = the piece's columns of src (n rows of ld), float32,
 * or 16 bits of dt where src16 is given */
static void pack_cols(const struct loom_tp_exact *x, float *dst, const float *src, const uint16_t *src16,
                      enum loom_dtype dt, size_t n, int ld, struct piece p)
{
    if (src16)
        K(x)->convert_rows(dst, LOOM_DTYPE_F32, (size_t)p.width, src16 + p.at, dt, (size_t)ld, n,
                           (size_t)p.width);
    else
        K(x)->convert_rows(dst, LOOM_DTYPE_F32, (size_t)p.width, src + p.at, LOOM_DTYPE_F32, (size_t)ld, n,
                           (size_t)p.width);
}

/* the same for 16-bit values (of dt), kept in 16 bits */
static void pack_cols16(const struct loom_tp_exact *x, uint16_t *dst, const uint16_t *src, enum loom_dtype dt,
                        size_t n, int ld, struct piece p)
{
    K(x)->convert_rows(dst, dt, (size_t)p.width, src + p.at, dt, (size_t)ld, n, (size_t)p.width);
}

/* n rows of w floats: dst's (rows of ldd) = src's (rows of lds), or += with add */
static void copy_rows(const struct loom_tp_exact *x, float *dst, size_t ldd, const float *src, size_t lds,
                      size_t n, size_t w, int add)
{
    if (add)
        K(x)->add_rows(dst, ldd, src, lds, n, w);
    else
        K(x)->convert_rows(dst, LOOM_DTYPE_F32, ldd, src, LOOM_DTYPE_F32, lds, n, w);
}

/* the piece's columns of dst (n rows of ld) = src (n, p.width), or += with add */
static void unpack_cols(const struct loom_tp_exact *x, float *dst, const float *src, size_t n, int ld,
                        struct piece p, int add)
{
    copy_rows(x, dst + p.at, (size_t)ld, src, (size_t)p.width, n, (size_t)p.width, add);
}

/* the piece's rows of dst (rows of ld) += src (p.width, ld) */
static void add_rows(const struct loom_tp_exact *x, float *dst, const float *src, size_t ld, struct piece p)
{
    copy_rows(x, dst + (size_t)p.at * ld, ld, src, ld, (size_t)p.width, ld, 1);
}

/* x->grad, zeroed (n) */
static float *zeroed(struct loom_tp_exact *x, size_t n)
{
    float *g = grow(x, &x->grad, &x->cap_grad, n, sizeof(float));
    x->b->memset(g, 0, n * sizeof(float));
    return g;
}

/* ---- row blocks (loom_tp_exact_set_rows) -------------------------------------- */

/* The rows of one product call: a block, or all N rows when blocks are off. */
static int block_rows(const struct loom_tp_exact *x, int N)
{
    if (!x->block) return N;
    LOOM_ASSERT(N % x->block == 0);
    return x->block;
}

/* Row r0 of a row-major operand of ld (NULL stays NULL). */
static const float *at_row(const float *p, int r0, size_t ld)
{
    return p ? p + (size_t)r0 * ld : NULL;
}

static const uint16_t *at_row16(const uint16_t *p, int r0, size_t ld)
{
    return p ? p + (size_t)r0 * ld : NULL;
}

/* A weight (or bias) gradient of n summed over the row blocks: with
 * blocks off, one call over every row accumulates into dst itself. With
 * blocks, wgrad_begin zeroes the float64 sum (x->acc_w), each block's call
 * accumulates into wgrad_block's zeroed x->grad, wgrad_add adds that in,
 * and wgrad_end sums over the context group and, on context rank 0 only,
 * rounds it into dst (add: dst += it) or, elsewhere, leaves dst zero (add:
 * as it was). */
static void wgrad_begin(struct loom_tp_exact *x, size_t n)
{
    if (!x->block) return;
    double *acc = grow(x, &x->acc_w, &x->cap_acc_w, n, sizeof(double));
    x->b->memset(acc, 0, n * sizeof(double));
}

static float *wgrad_block(struct loom_tp_exact *x, float *dst, size_t n)
{
    return x->block ? zeroed(x, n) : dst;
}

static void wgrad_add(struct loom_tp_exact *x, const float *g, size_t n)
{
    if (x->block) K(x)->acc_add(x->acc_w, g, n);
}

/* acc (n) summed over the context group, on every context rank. */
static void sum_over_cp(const struct loom_tp_exact *x, double *acc, size_t n)
{
    if (x->cp > 1)
        loom_tp_wait(loom_comm_allreduce(LOOM_GROUP_CP, loom_buf_of(acc, n, LOOM_DTYPE_F64), LOOM_OP_SUM));
}

static void wgrad_end(struct loom_tp_exact *x, float *dst, size_t n, int add)
{
    if (!x->block) return;
    sum_over_cp(x, x->acc_w, n);
    if (x->cp_rank == 0 && add)
        K(x)->acc_add_rounded(dst, x->acc_w, n);
    else if (x->cp_rank == 0)
        K(x)->acc_round(dst, x->acc_w, n);
    else if (!add)
        x->b->memset(dst, 0, n * sizeof(float));
}

/* A bias gradient (n columns) += the sum of d's N rows (of n), by blocks. */
static void bias_grad(struct loom_tp_exact *x, const struct loom_kernels *k, float *dbias, const float *d,
                      int N, int n)
{
    const int R = block_rows(x, N);
    wgrad_begin(x, (size_t)n);
    for (int r0 = 0; r0 < N; r0 += R) {
        float *g = wgrad_block(x, dbias, (size_t)n);
        k->bias_backward(g, d + (size_t)r0 * n, R, n);
        wgrad_add(x, g, (size_t)n);
    }
    wgrad_end(x, dbias, (size_t)n, 1);
}

/* inp as float32: itself, or inp16's bf16 values converted (n) */
static const float *input_f32(struct loom_tp_exact *x, const float *inp, const uint16_t *inp16, size_t n)
{
    if (inp) return inp;
    float *f = grow(x, &x->pack_in, &x->cap_pack_in, n, sizeof(float));
    x->b->convert(loom_buf_f32(f, n), loom_buf_of_const(inp16, n, LOOM_DTYPE_BF16));
    return f;
}

/* The region's exit with the float64 sums of every row in x->acc (N rows of
 * r->width): summed over the tp group, rounded into dst (every row) or
 * rows (this rank's, sequence parallelism). */
static float *exit_region(struct loom_tp_exact *x, struct loom_tp_regions *r, float *dst, float *rows, int N)
{
    const size_t n = (size_t)N * r->width;
    if (r->tp > 1 && !r->sp) {
        loom_tp_wait(loom_comm_allreduce(LOOM_GROUP_TP, loom_buf_of(x->acc, n, LOOM_DTYPE_F64), LOOM_OP_SUM));
    } else if (r->sp) {
        const size_t nr = (size_t)loom_tp_rows_held(r, N) * r->width;
        double *mine = grow(x, &x->acc_rows, &x->cap_acc_rows, nr, sizeof(double));
        loom_tp_wait(loom_comm_reduce_scatter(LOOM_GROUP_TP, loom_buf_of(x->acc, n, LOOM_DTYPE_F64),
                                              loom_buf_of(mine, nr, LOOM_DTYPE_F64)));
        K(x)->acc_round(rows, mine, nr);
        return rows;
    }
    K(x)->acc_round(dst, x->acc, n);
    return dst;
}

/* Whether the products take bf16 operands as they are (the kernels' _b16
 * forms): the stored bf16 weights and 16-bit activations go in without
 * the float32 round trip. The same products on the same values: the same
 * bits. [in, out] weights only (GPT-2's; Llama's go through float32). */
static int takes16(const struct loom_kernels *k, int w_out_in)
{
    return k->matmul_forward_b16 && k->matmul_backward_b16 && !w_out_in;
}

/* n rows of w: dst's (rows of ldd) = src16's (rows of lds) as they are, or
 * src's rounded to bf16 */
static void copy_rows16(const struct loom_tp_exact *x, uint16_t *dst, size_t ldd, const uint16_t *src16,
                        const float *src, size_t lds, size_t n, size_t w)
{
    if (src16)
        K(x)->convert_rows(dst, LOOM_DTYPE_BF16, ldd, src16, LOOM_DTYPE_BF16, lds, n, w);
    else
        K(x)->convert_rows(dst, LOOM_DTYPE_BF16, ldd, src, LOOM_DTYPE_F32, lds, n, w);
}

/* The segments' piece j: its columns in each segment, [lo_s, lo_s + w_s) */
static int segment_piece(const struct loom_tp_exact *x, const struct loom_tp_segment *seg, int nseg, int j,
                         int *lo, int *w)
{
    const int held = loom_tp_exact_held(x);
    int width = 0;
    LOOM_ASSERT(nseg >= 1 && nseg <= 4);
    for (int s = 0; s < nseg; s++) {
        LOOM_ASSERT(seg[s].width % held == 0);
        w[s] = seg[s].width / held;
        lo[s] = j * w[s];
        width += w[s];
    }
    return width;
}

/* The piece's weight as one matrix: [in, out] (C, width), the segments'
 * columns side by side; (out, in) (width, C), their rows one after another. */
static void pack_weight(const struct loom_tp_exact *x, float *dst, const struct loom_tp_segment *seg,
                        int nseg, const int *lo, const int *w, int width, int w_out_in, int C)
{
    for (int s = 0, at = 0; s < nseg; at += w[s], s++) {
        if (w_out_in)
            copy_rows(x, dst + (size_t)at * C, (size_t)C, seg[s].W + (size_t)lo[s] * C, (size_t)C,
                      (size_t)w[s], (size_t)C, 0);
        else
            copy_rows(x, dst + at, (size_t)width, seg[s].W + lo[s], (size_t)seg[s].ldw, (size_t)C,
                      (size_t)w[s], 0);
    }
}

/* The same in bf16 ([in, out]): (C, width), from the stored bf16 weights
 * where given (W16), else rounded (in a buffer of float32 slots). */
static uint16_t *pack_weight16(struct loom_tp_exact *x, const struct loom_tp_segment *seg, int nseg,
                               const int *lo, const int *w, int width, int C)
{
    uint16_t *dst = grow(x, &x->pack_w, &x->cap_pack_w, ((size_t)C * width + 1) / 2, sizeof(float));
    for (int s = 0, at = 0; s < nseg; at += w[s], s++)
        copy_rows16(x, dst + at, (size_t)width, seg[s].W16 ? seg[s].W16 + lo[s] : NULL, seg[s].W + lo[s],
                    (size_t)seg[s].ldw, (size_t)C, (size_t)w[s]);
    return dst;
}

void loom_tp_exact_column_forward(struct loom_tp_exact *x, const struct loom_kernels *k,
                                  const struct loom_tp_segment *seg, int nseg, const float *inp,
                                  const uint16_t *inp16, int w_out_in, int N, int C)
{
    const int use16 = takes16(k, w_out_in);
    const float *a = use16 ? inp : input_f32(x, inp, inp16, (size_t)N * C);
    for (int j = 0; j < loom_tp_exact_held(x); j++) {
        int lo[4], w[4];
        const int width = segment_piece(x, seg, nseg, j, lo, w);
        float *part = grow(x, &x->part, &x->cap_part, (size_t)N * width, sizeof(float));
        float *wt = NULL;
        const uint16_t *wt16 = NULL;
        if (use16) {
            wt16 = pack_weight16(x, seg, nseg, lo, w, width, C);
        } else {
            wt = grow(x, &x->pack_w, &x->cap_pack_w, (size_t)C * width, sizeof(float));
            pack_weight(x, wt, seg, nseg, lo, w, width, w_out_in, C);
        }
        float *bias = NULL;
        if (!w_out_in && seg[0].bias) {
            bias = zeroed(x, (size_t)width);
            for (int s = 0, at = 0; s < nseg; at += w[s], s++)
                x->b->copy(bias + at, seg[s].bias + lo[s], (size_t)w[s] * sizeof(float));
        }
        const int R = block_rows(x, N);
        for (int r0 = 0; r0 < N; r0 += R) {
            float *pr = part + (size_t)r0 * width;
            const float *ar = at_row(a, r0, (size_t)C);
            if (w_out_in) /* inp @ W^T */
                k->lm_head_forward(pr, ar, wt, R, C, width);
            else if (use16)
                k->matmul_forward_b16(pr, ar, at_row16(inp16, r0, (size_t)C), NULL, wt16, bias, R, C, width);
            else
                k->matmul_forward(pr, ar, wt, bias, R, C, width);
        }
        for (int s = 0, at = 0; s < nseg; at += w[s], s++)
            copy_rows(x, seg[s].out + lo[s], (size_t)seg[s].ld, part + at, (size_t)width, (size_t)N,
                      (size_t)w[s], 0);
    }
}

float *loom_tp_exact_column_backward(struct loom_tp_exact *x, struct loom_tp_regions *r,
                                     const struct loom_kernels *k, const struct loom_tp_segment *seg,
                                     int nseg, const float *inp, const uint16_t *inp16, int w_out_in,
                                     float *dst, int N, int C)
{
    LOOM_ASSERT(r->width == C);
    const size_t n = (size_t)N * C;
    const int use16 = takes16(k, w_out_in);
    const float *a = use16 ? inp : input_f32(x, inp, inp16, n);
    double *acc = loom_tp_exact_sum(x, n);
    for (int j = 0; j < loom_tp_exact_held(x); j++) {
        int lo[4], w[4];
        const int width = segment_piece(x, seg, nseg, j, lo, w);
        float *d = grow(x, &x->pack_a, &x->cap_pack_a, (size_t)N * width, sizeof(float));
        float *part = grow(x, &x->part, &x->cap_part, n, sizeof(float));
        const size_t gn = (size_t)C * width;
        float *g = zeroed(x, gn);
        for (int s = 0, at = 0; s < nseg; at += w[s], s++)
            copy_rows(x, d + at, (size_t)width, seg[s].dout + lo[s], (size_t)seg[s].ld, (size_t)N,
                      (size_t)w[s], 0);
        const uint16_t *wt16 = use16 ? pack_weight16(x, seg, nseg, lo, w, width, C) : NULL;
        float *wt = NULL;
        if (!use16) {
            wt = grow(x, &x->pack_w, &x->cap_pack_w, gn, sizeof(float));
            pack_weight(x, wt, seg, nseg, lo, w, width, w_out_in, C);
        }
        const int R = block_rows(x, N);
        wgrad_begin(x, gn);
        for (int r0 = 0; r0 < N; r0 += R) {
            float *gb = wgrad_block(x, g, gn), *pr = part + (size_t)r0 * C;
            const float *dr = d + (size_t)r0 * width, *ar = at_row(a, r0, (size_t)C);
            if (use16) /* dinp = d @ W^T, g (C, width) += a^T @ d */
                k->matmul_backward_b16(pr, gb, NULL, dr, ar, at_row16(inp16, r0, (size_t)C), NULL, wt16, R, C,
                                       width);
            else if (w_out_in) /* dinp = d @ W, g (width, C) += d^T @ a */
                k->lm_head_backward(pr, gb, dr, ar, wt, R, C, width);
            else
                k->matmul_backward(pr, gb, NULL, dr, ar, wt, R, C, width);
            wgrad_add(x, gb, gn);
        }
        wgrad_end(x, g, gn, 0);
        for (int s = 0, at = 0; s < nseg; at += w[s], s++) {
            if (w_out_in)
                copy_rows(x, seg[s].dW + (size_t)lo[s] * C, (size_t)C, g + (size_t)at * C, (size_t)C,
                          (size_t)w[s], (size_t)C, 1);
            else
                copy_rows(x, seg[s].dW + lo[s], (size_t)seg[s].ldw, g + at, (size_t)width, (size_t)C,
                          (size_t)w[s], 1);
        }
        loom_tp_exact_add(x, acc, part, n);
    }
    for (int s = 0; s < nseg; s++) /* column by column over the rows: no split sum */
        if (seg[s].dbias) {
            float *d = grow(x, &x->pack_a, &x->cap_pack_a, (size_t)N * seg[s].width, sizeof(float));
            copy_rows(x, d, (size_t)seg[s].width, seg[s].dout, (size_t)seg[s].ld, (size_t)N,
                      (size_t)seg[s].width, 0);
            bias_grad(x, k, seg[s].dbias, d, N, seg[s].width);
        }
    return exit_region(x, r, dst, r->grad_rows, N);
}

/* The piece's columns of a row product's input (N rows of Kl), for a _b16
 * product: 16-bit as they are (*a16) when held so, else float32 (*a32). */
static void pack_input(struct loom_tp_exact *x, const float *inp, const uint16_t *inp16, int use16, int N,
                       int Kl, struct piece p, float **a32, uint16_t **a16)
{
    *a32 = NULL;
    *a16 = NULL;
    if (use16 && inp16) {
        *a16 = grow(x, &x->pack_a, &x->cap_pack_a, ((size_t)N * p.width + 1) / 2, sizeof(float));
        pack_cols16(x, *a16, inp16, LOOM_DTYPE_BF16, (size_t)N, Kl, p);
    } else {
        *a32 = grow(x, &x->pack_a, &x->cap_pack_a, (size_t)N * p.width, sizeof(float));
        pack_cols(x, *a32, inp, inp ? NULL : inp16, LOOM_DTYPE_BF16, (size_t)N, Kl, p);
    }
}

float *loom_tp_exact_row_forward(struct loom_tp_exact *x, struct loom_tp_regions *r,
                                 const struct loom_kernels *k, const float *inp, const uint16_t *inp16,
                                 const float *W, const uint16_t *W16, int w_out_in, const float *bias,
                                 float *dst, int N, int Kl, int OC)
{
    LOOM_ASSERT(r->width == OC);
    const size_t n = (size_t)N * OC;
    const int use16 = takes16(k, w_out_in);
    double *acc = loom_tp_exact_sum(x, n);
    for (int j = 0; j < loom_tp_exact_held(x); j++) {
        const struct piece p = piece_of_part(x, (int64_t)Kl * x->tp, j);
        float *a;
        uint16_t *a16;
        pack_input(x, inp, inp16, use16, N, Kl, p, &a, &a16);
        float *part = grow(x, &x->part, &x->cap_part, n, sizeof(float)), *w = NULL;
        if (!use16 && w_out_in) { /* (OC, Kl): the piece's columns */
            w = grow(x, &x->pack_w, &x->cap_pack_w, (size_t)OC * p.width, sizeof(float));
            pack_cols(x, w, W, NULL, LOOM_DTYPE_F32, (size_t)OC, Kl, p);
        }
        const int R = block_rows(x, N);
        for (int r0 = 0; r0 < N; r0 += R) {
            float *pr = part + (size_t)r0 * OC;
            const float *ar = at_row(a, r0, (size_t)p.width);
            if (use16) /* [in, out]: the piece's rows as they are */
                k->matmul_forward_b16(pr, ar, at_row16(a16, r0, (size_t)p.width), W + (size_t)p.at * OC,
                                      W16 ? W16 + (size_t)p.at * OC : NULL, NULL, R, p.width, OC);
            else if (w_out_in) /* a @ w^T */
                k->lm_head_forward(pr, ar, w, R, p.width, OC);
            else /* [in, out] (Kl, OC): the piece's rows as they are */
                k->matmul_forward(pr, ar, W + (size_t)p.at * OC, NULL, R, p.width, OC);
        }
        loom_tp_exact_add(x, acc, part, n);
    }
    float *y = exit_region(x, r, dst, r->out_rows, N);
    if (bias) K(x)->add_bias(y, bias, loom_tp_rows_held(r, N), OC);
    return y;
}

void loom_tp_exact_row_backward(struct loom_tp_exact *x, const struct loom_kernels *k, float *dinp, float *dW,
                                float *dbias, const float *dout, const float *inp, const uint16_t *inp16,
                                const float *W, const uint16_t *W16, int w_out_in, int N, int Kl, int OC)
{
    const int use16 = takes16(k, w_out_in);
    for (int j = 0; j < loom_tp_exact_held(x); j++) {
        const struct piece p = piece_of_part(x, (int64_t)Kl * x->tp, j);
        float *a;
        uint16_t *a16;
        pack_input(x, inp, inp16, use16, N, Kl, p, &a, &a16);
        float *part = grow(x, &x->part, &x->cap_part, (size_t)N * p.width, sizeof(float)), *w = NULL;
        const size_t gn = (size_t)OC * p.width;
        float *g = zeroed(x, gn);
        if (!use16 && w_out_in) { /* (OC, Kl): w (OC, width) */
            w = grow(x, &x->pack_w, &x->cap_pack_w, gn, sizeof(float));
            pack_cols(x, w, W, NULL, LOOM_DTYPE_F32, (size_t)OC, Kl, p);
        }
        const int R = block_rows(x, N);
        wgrad_begin(x, gn);
        for (int r0 = 0; r0 < N; r0 += R) {
            float *gb = wgrad_block(x, g, gn), *pr = part + (size_t)r0 * p.width;
            const float *dr = dout + (size_t)r0 * OC, *ar = at_row(a, r0, (size_t)p.width);
            if (use16) /* [in, out]: the piece's rows w (width, OC); dinp = dout @ w^T, g += a^T @ dout */
                k->matmul_backward_b16(pr, gb, NULL, dr, ar, at_row16(a16, r0, (size_t)p.width),
                                       W + (size_t)p.at * OC, W16 ? W16 + (size_t)p.at * OC : NULL, R,
                                       p.width, OC);
            else if (w_out_in) { /* dinp = dout @ w, g (OC, width) += dout^T @ a */
                k->matmul_forward(pr, dr, w, NULL, R, OC, p.width);
                k->lm_head_backward(NULL, gb, dr, ar, w, R, p.width, OC);
            } else { /* [in, out]: the piece's rows w (width, OC); dinp = dout @ w^T, g += a^T @ dout */
                k->matmul_backward(pr, gb, NULL, dr, ar, W + (size_t)p.at * OC, R, p.width, OC);
            }
            wgrad_add(x, gb, gn);
        }
        wgrad_end(x, g, gn, 0);
        if (!use16 && w_out_in)
            unpack_cols(x, dW, g, (size_t)OC, Kl, p, 1);
        else
            add_rows(x, dW, g, (size_t)OC, p);
        unpack_cols(x, dinp, part, (size_t)N, Kl, p, 0);
    }
    if (dbias) bias_grad(x, k, dbias, dout, N, OC);
}

void loom_tp_exact_head_forward(struct loom_tp_exact *x, const struct loom_kernels *k, void *logits,
                                enum loom_dtype dt, const float *inp, const float *W, const uint16_t *W16,
                                int N, int C, int V, int Vl)
{
    for (int j = 0; j < loom_tp_exact_held(x); j++) {
        const struct piece p = piece_of_part(x, V, j);
        if (!p.width) continue; /* an empty piece */
        if (dt == LOOM_DTYPE_F32) {
            float *part = grow(x, &x->part, &x->cap_part, (size_t)N * p.width, sizeof(float));
            for (int r0 = 0, R = block_rows(x, N); r0 < N; r0 += R)
                k->lm_head_forward(part + (size_t)r0 * p.width, inp + (size_t)r0 * C, W + (size_t)p.at * C, R,
                                   C, p.width);
            unpack_cols(x, logits, part, (size_t)N, Vl, p, 0);
        } else {
            uint16_t *part = grow(x, &x->part, &x->cap_part, ((size_t)N * p.width + 1) / 2, sizeof(float));
            uint16_t *l = logits;
            for (int r0 = 0, R = block_rows(x, N); r0 < N; r0 += R)
                k->lm_head_forward_lp(part + (size_t)r0 * p.width, dt, inp + (size_t)r0 * C,
                                      W + (size_t)p.at * C, W16 ? W16 + (size_t)p.at * C : NULL, R, C,
                                      p.width);
            K(x)->convert_rows(l + p.at, dt, (size_t)Vl, part, dt, (size_t)p.width, (size_t)N,
                               (size_t)p.width);
        }
    }
}

float *loom_tp_exact_head_backward(struct loom_tp_exact *x, struct loom_tp_regions *r,
                                   const struct loom_kernels *k, float *dW, const void *dlogits,
                                   enum loom_dtype dt, const float *inp, const float *W, const uint16_t *W16,
                                   float *dst, int N, int C, int V, int Vl)
{
    LOOM_ASSERT(r->width == C);
    const size_t n = (size_t)N * C;
    double *acc = loom_tp_exact_sum(x, n);
    for (int j = 0; j < loom_tp_exact_held(x); j++) {
        const struct piece p = piece_of_part(x, V, j);
        if (!p.width) continue;
        float *part = grow(x, &x->part, &x->cap_part, n, sizeof(float));
        const size_t at = (size_t)p.at * C, gn = (size_t)p.width * C;
        float *d = NULL;
        uint16_t *d16 = NULL;
        if (dt == LOOM_DTYPE_F32) {
            d = grow(x, &x->pack_a, &x->cap_pack_a, (size_t)N * p.width, sizeof(float));
            pack_cols(x, d, dlogits, NULL, dt, (size_t)N, Vl, p);
        } else {
            d16 = grow(x, &x->pack_a, &x->cap_pack_a, ((size_t)N * p.width + 1) / 2, sizeof(float));
            pack_cols16(x, d16, dlogits, dt, (size_t)N, Vl, p);
        }
        const int R = block_rows(x, N);
        wgrad_begin(x, gn);
        for (int r0 = 0; r0 < N; r0 += R) {
            float *gb = wgrad_block(x, dW + at, gn), *pr = part + (size_t)r0 * C;
            const float *ir = inp + (size_t)r0 * C;
            if (d)
                k->lm_head_backward(pr, gb, d + (size_t)r0 * p.width, ir, W + at, R, C, p.width);
            else
                k->lm_head_backward_lp(pr, gb, d16 + (size_t)r0 * p.width, dt, ir, W + at,
                                       W16 ? W16 + at : NULL, R, C, p.width);
            wgrad_add(x, gb, gn);
        }
        wgrad_end(x, dW + at, gn, 1);
        loom_tp_exact_add(x, acc, part, n);
    }
    return exit_region(x, r, dst, r->grad_rows, N);
}

void loom_tp_exact_crossentropy_begin(struct loom_tp_exact *x, int N)
{
    loom_tp_exact_sum(x, 2 * (size_t)N);
    x->ce_rows = N;
}

void loom_tp_exact_crossentropy_rows(struct loom_tp_exact *x, const struct loom_kernels *k,
                                     const float *logits, const float *rowmax, const int32_t *targets,
                                     int row0, int n, int V, int v0, int Vl)
{
    double *sum = x->acc, *tgt = x->acc + x->ce_rows;
    LOOM_ASSERT(row0 >= 0 && row0 + n <= x->ce_rows);
    float *s = grow(x, &x->grad, &x->cap_grad, 2 * (size_t)n, sizeof(float)), *t = s + n;
    for (int j = 0; j < loom_tp_exact_held(x); j++) {
        int lo, hi;
        loom_tp_exact_piece(x, V, j, &lo, &hi);
        if (hi == lo) continue;
        for (int i = 0; i < n; i++) /* the piece's columns of row i: not a whole row of the table */
            k->crossentropy_vp_stats(s + i, t + i, logits + (size_t)i * Vl + lo, rowmax + row0 + i,
                                     targets + row0 + i, v0 + lo, 1, hi - lo);
        K(x)->acc_add(sum + row0, s, (size_t)n);
        K(x)->acc_add(tgt + row0, t, (size_t)n); /* one piece holds the target: the others add 0 */
    }
}

void loom_tp_exact_crossentropy_done(struct loom_tp_exact *x, float *sumexp, float *target, int N)
{
    LOOM_ASSERT(N == x->ce_rows);
    if (x->tp > 1)
        loom_tp_wait(loom_comm_allreduce(LOOM_GROUP_TP, loom_buf_of(x->acc, 2 * (size_t)N, LOOM_DTYPE_F64),
                                         LOOM_OP_SUM));
    K(x)->acc_round(sumexp, x->acc, (size_t)N);
    K(x)->acc_round(target, x->acc + N, (size_t)N);
}

/* ---- the scratch, reserved ---------------------------------------------------- */

static size_t max_size(size_t a, size_t b)
{
    return a > b ? a : b;
}

/* the widest held piece of a dimension of n entries */
static int widest_piece(const struct loom_tp_exact *x, int64_t n)
{
    int w = 0;
    for (int j = 0; j < loom_tp_exact_held(x); j++) {
        const struct piece p = piece_of_part(x, n, j);
        if (p.width > w) w = p.width;
    }
    return w;
}

/* what exit_region takes: the float64 sum of every row, and the rows held under sp */
static void reserve_exit(struct loom_tp_exact *x, const struct loom_tp_regions *r, int N)
{
    grow(x, &x->acc, &x->cap_acc, (size_t)N * r->width, sizeof(double));
    if (r->sp)
        grow(x, &x->acc_rows, &x->cap_acc_rows, (size_t)loom_tp_rows_held(r, N) * r->width, sizeof(double));
}

void loom_tp_exact_reserve_column(struct loom_tp_exact *x, const struct loom_tp_regions *r, const int *width,
                                  int nseg, int in16, int bias, int N, int C)
{
    const int held = loom_tp_exact_held(x);
    size_t wp = 0, widest = 0; /* a piece's width over the segments; the widest segment */
    for (int s = 0; s < nseg; s++) {
        wp += (size_t)(width[s] / held);
        widest = max_size(widest, (size_t)width[s]);
    }
    const size_t n = (size_t)N * C;
    if (in16) grow(x, &x->pack_in, &x->cap_pack_in, n, sizeof(float));
    grow(x, &x->pack_w, &x->cap_pack_w, (size_t)C * wp, sizeof(float));
    grow(x, &x->part, &x->cap_part, max_size((size_t)N * wp, n), sizeof(float));
    grow(x, &x->grad, &x->cap_grad, (size_t)C * wp, sizeof(float));
    grow(x, &x->pack_a, &x->cap_pack_a, (size_t)N * (bias ? max_size(wp, widest) : wp), sizeof(float));
    if (x->block) grow(x, &x->acc_w, &x->cap_acc_w, (size_t)C * wp, sizeof(double));
    reserve_exit(x, r, N);
}

void loom_tp_exact_reserve_row(struct loom_tp_exact *x, const struct loom_tp_regions *r, int w_out_in, int N,
                               int Kl, int OC)
{
    const size_t pw = (size_t)widest_piece(x, (int64_t)Kl * x->tp);
    grow(x, &x->pack_a, &x->cap_pack_a, (size_t)N * pw, sizeof(float));
    grow(x, &x->part, &x->cap_part, (size_t)N * max_size(pw, (size_t)OC), sizeof(float));
    if (w_out_in) grow(x, &x->pack_w, &x->cap_pack_w, (size_t)OC * pw, sizeof(float));
    grow(x, &x->grad, &x->cap_grad, max_size((size_t)OC * pw, (size_t)OC), sizeof(float));
    if (x->block) grow(x, &x->acc_w, &x->cap_acc_w, max_size((size_t)OC * pw, (size_t)OC), sizeof(double));
    reserve_exit(x, r, N);
}

void loom_tp_exact_reserve_head(struct loom_tp_exact *x, const struct loom_tp_regions *r, enum loom_dtype dt,
                                int N, int C, int V)
{
    const size_t np = (size_t)N * widest_piece(x, V);
    const size_t f = dt == LOOM_DTYPE_F32 ? np : (np + 1) / 2; /* 16-bit pieces in float32 slots */
    grow(x, &x->part, &x->cap_part, max_size(f, (size_t)N * C), sizeof(float));
    grow(x, &x->pack_a, &x->cap_pack_a, f, sizeof(float));
    if (x->block) {
        const size_t gn = (size_t)widest_piece(x, V) * C;
        grow(x, &x->grad, &x->cap_grad, gn, sizeof(float));
        grow(x, &x->acc_w, &x->cap_acc_w, gn, sizeof(double));
    }
    reserve_exit(x, r, N);
}

int loom_tp_exact_row_pieces(const struct loom_tp_exact *x, const struct loom_tp_regions *r, int N)
{
    if (x->block) return loom_tp_rows_held(r, N) / block_rows(x, loom_tp_rows_held(r, N));
    return r->sp ? loom_tp_exact_held(x) : x->pieces;
}

void loom_tp_exact_row_piece(const struct loom_tp_exact *x, const struct loom_tp_regions *r, int N, int j,
                             int *lo, int *hi)
{
    if (x->block) {
        *lo = j * x->block;
        *hi = *lo + x->block;
        return;
    }
    if (r->sp) {
        loom_tp_exact_piece(x, N, j, lo, hi);
        return;
    }
    int64_t a, b;
    loom_tp_part(N, x->pieces, j, &a, &b);
    *lo = (int)a;
    *hi = (int)b;
}

void loom_tp_exact_rows_cp(const struct loom_tp_exact *x, double *acc, size_t n)
{
    sum_over_cp(x, acc, n);
    if (x->cp_rank) x->b->memset(acc, 0, n * sizeof(double));
}

void loom_tp_exact_add_rounded(const struct loom_tp_exact *x, float *grad, const double *acc, size_t n)
{
    K(x)->acc_add_rounded(grad, acc, n);
}
