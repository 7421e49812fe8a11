/*
 * The parallel linear layer (linear.h): one product's precision path and
 * orientation, and the column- and row-parallel regions around it.
 */
#include "layers/linear.h"

#include <string.h>

#include "base/log.h"
#include "kernels/backend.h"
#include "kernels/kernels.h"
#include "layers/fp8_linear.h"

const uint16_t *loom_linear_param16(const struct loom_block *b, int i)
{
    if (b->params.dtype != LOOM_DTYPE_BF16 || !b->params.data) return NULL;
    return (const uint16_t *)b->params.data + b->tensors[i].offset;
}

static const float *bias_of(const struct loom_linear *l)
{
    return l->bias >= 0 ? loom_param(l->b, l->bias) : NULL;
}

static float *dbias_of(const struct loom_linear *l)
{
    return l->bias >= 0 ? loom_grad(l->b, l->bias) : NULL;
}

static int fp8_of(const struct loom_linear_ctx *c, const struct loom_linear *l)
{
    return loom_fp8_linear_of(c->model->fp8, c->model, l->b, l->w);
}

/* out (N, OC) = inp (N, C) W + bias: one product, on the settings' path;
 * inp may be NULL where x16 holds it. */
static void product_forward(const struct loom_linear_ctx *c, const struct loom_linear *l, float *out,
                            const float *inp, const uint16_t *x16, const float *bias, int N, int C, int OC)
{
    const float *W = loom_param(l->b, l->w);
    const uint16_t *W16 = loom_linear_param16(l->b, l->w);
    if (c->orientation == LOOM_WEIGHTS_IN_OUT) {
        if (c->model->fp8)
            loom_fp8_linear_forward(c->model->fp8, fp8_of(c, l), c->k, out, inp, x16, W, W16, bias, N, C, OC);
        else if (c->b16)
            c->k->matmul_forward_b16(out, inp, x16, W, W16, bias, N, C, OC);
        else
            c->k->matmul_forward(out, inp, W, bias, N, C, OC);
        return;
    }
    if (c->model->fp8) {
        loom_fp8_linear_t_forward(c->model->fp8, fp8_of(c, l), c->k, out, inp, W, N, C, OC);
        if (bias) c->k->add_bias(out, bias, N, OC);
    } else {
        c->k->linear_forward(out, inp, x16, W, c->b16 ? W16 : NULL, bias, N, C, OC);
    }
}

/* Its backward: dinp (N, C) written; the weight's and bias's gradients
 * accumulate. */
static void product_backward(const struct loom_linear_ctx *c, const struct loom_linear *l, float *dinp,
                             const float *dout, const float *inp, const uint16_t *x16, int N, int C, int OC)
{
    const float *W = loom_param(l->b, l->w);
    const uint16_t *W16 = loom_linear_param16(l->b, l->w);
    float *dW = loom_grad(l->b, l->w), *db = dbias_of(l);
    if (c->orientation == LOOM_WEIGHTS_IN_OUT) {
        if (c->model->fp8)
            loom_fp8_linear_backward(c->model->fp8, fp8_of(c, l), c->k, dinp, dW, db, dout, inp, x16, W, W16,
                                     N, C, OC);
        else if (c->b16)
            c->k->matmul_backward_b16(dinp, dW, db, dout, inp, x16, W, W16, N, C, OC);
        else
            c->k->matmul_backward(dinp, dW, db, dout, inp, W, N, C, OC);
        return;
    }
    if (c->model->fp8) {
        loom_fp8_linear_t_backward(c->model->fp8, fp8_of(c, l), c->k, dinp, dW, dout, inp, W, N, C, OC);
        if (db) c->k->bias_backward(db, dout, N, OC);
    } else {
        c->k->linear_backward(dinp, dW, db, dout, inp, x16, W, c->b16 ? W16 : NULL, N, C, OC);
    }
}

/* --layout-invariant's segments of a column product: a fused weight's
 * equal column segments ([in, out]: a segment is columns of every row), or
 * each weight of its own. */
static int segments(const struct loom_linear_ctx *c, const struct loom_linear_group *g,
                    struct loom_tp_segment *seg, float *const *out, float *const *dout, int C)
{
    if (g->fused) {
        const struct loom_linear *l = &g->lin[0];
        const int OC = l->out, nseg = g->n;
        const size_t width = (size_t)(OC / nseg);
        const uint16_t *W16 = loom_linear_param16(l->b, l->w);
        for (int s = 0; s < nseg; s++)
            seg[s] = (struct loom_tp_segment){
                .width = (int)width,
                .W = loom_param(l->b, l->w) + s * width,
                .W16 = W16 ? W16 + s * width : NULL,
                .dW = dout ? loom_grad(l->b, l->w) + s * width : NULL,
                .ldw = OC,
                .bias = l->bias >= 0 ? loom_param(l->b, l->bias) + s * width : NULL,
                .dbias = dout && l->bias >= 0 ? loom_grad(l->b, l->bias) + s * width : NULL,
                .out = out ? out[0] + s * width : NULL,
                .dout = dout ? dout[0] + s * width : NULL,
                .ld = OC};
        return nseg;
    }
    for (int s = 0; s < g->n; s++) {
        const struct loom_linear *l = &g->lin[s];
        seg[s] = (struct loom_tp_segment){
            .width = l->out,
            .W = loom_param(l->b, l->w),
            .W16 = c->orientation == LOOM_WEIGHTS_IN_OUT ? loom_linear_param16(l->b, l->w) : NULL,
            .dW = dout ? loom_grad(l->b, l->w) : NULL,
            .ldw = c->orientation == LOOM_WEIGHTS_IN_OUT ? l->out : C,
            .bias = bias_of(l),
            .dbias = dout ? dbias_of(l) : NULL,
            .out = out ? out[s] : NULL,
            .dout = dout ? dout[s] : NULL,
            .ld = l->out};
    }
    return g->n;
}

void loom_linear_column_forward(const struct loom_linear_ctx *c, const struct loom_linear_group *g,
                                float *const *out, const float *inp, const uint16_t *x16, int N)
{
    const int C = g->lin[0].in;
    if (c->exact->pieces) {
        struct loom_tp_segment seg[3];
        const int nseg = segments(c, g, seg, out, NULL, C);
        loom_tp_exact_column_forward(c->exact, c->k, seg, nseg, inp, inp ? NULL : x16, c->orientation, N, C);
        return;
    }
    for (int s = 0; s < (g->fused ? 1 : g->n); s++)
        product_forward(c, &g->lin[s], out[s], inp, x16, bias_of(&g->lin[s]), N, C, g->lin[s].out);
}

float *loom_linear_column_backward(const struct loom_linear_ctx *c, const struct loom_linear_group *g,
                                   float *const *dout, const float *inp, const uint16_t *x16, float *dst,
                                   int N)
{
    const int C = g->lin[0].in;
    if (c->exact->pieces) {
        struct loom_tp_segment seg[3];
        const int nseg = segments(c, g, seg, NULL, dout, C);
        return loom_tp_exact_column_backward(c->exact, c->rg, c->k, seg, nseg, inp, inp ? NULL : x16,
                                             c->orientation, dst, N, C);
    }
    /* the first product's input gradient written, each next one's added in order */
    for (int s = 0; s < (g->fused ? 1 : g->n); s++) {
        product_backward(c, &g->lin[s], s == 0 ? dst : c->scratch, dout[s], inp, x16, N, C, g->lin[s].out);
        if (s > 0) c->k->accumulate(dst, c->scratch, (size_t)N * C);
    }
    return loom_tp_region_input_grad(c->rg, dst, N);
}

float *loom_linear_row_forward(const struct loom_linear_ctx *c, const struct loom_linear *l, const float *inp,
                               const uint16_t *x16, float *dst, int N)
{
    const float *W = loom_param(l->b, l->w);
    if (c->exact->pieces) {
        const int in16 = c->orientation == LOOM_WEIGHTS_IN_OUT;
        return loom_tp_exact_row_forward(c->exact, c->rg, c->k, x16 ? NULL : inp, in16 ? x16 : NULL, W,
                                         in16 ? loom_linear_param16(l->b, l->w) : NULL, c->orientation,
                                         bias_of(l), dst, N, l->in, l->out);
    }
    product_forward(c, l, dst, inp, x16, c->tp_rank == 0 ? bias_of(l) : NULL, N, l->in, l->out);
    return loom_tp_region_output(c->rg, dst, N);
}

void loom_linear_row_backward(const struct loom_linear_ctx *c, const struct loom_linear *l, float *dinp,
                              const float *dout, const float *inp, const uint16_t *x16, int N)
{
    if (c->exact->pieces) {
        const int in16 = c->orientation == LOOM_WEIGHTS_IN_OUT;
        loom_tp_exact_row_backward(c->exact, c->k, dinp, loom_grad(l->b, l->w), dbias_of(l), dout,
                                   x16 ? NULL : inp, in16 ? x16 : NULL, loom_param(l->b, l->w),
                                   in16 ? loom_linear_param16(l->b, l->w) : NULL, c->orientation, N, l->in,
                                   l->out);
        return;
    }
    product_backward(c, l, dinp, dout, inp, x16, N, l->in, l->out);
}

/* The G products' operands for the table's grouped product: the bf16
 * copies where this path's products take them (product_forward's rule). */
struct grouped_operands {
    const float *w[LOOM_MOE_MAX_EXPERTS], *bias[LOOM_MOE_MAX_EXPERTS];
    const uint16_t *w16[LOOM_MOE_MAX_EXPERTS];
    float *dw[LOOM_MOE_MAX_EXPERTS], *dbias[LOOM_MOE_MAX_EXPERTS];
};

/* Tensor i of block b's gradient: its own, or its place in to's buffer. */
static float *grad_at(const struct loom_block *b, int i, const struct loom_grad_place *to)
{
    if (i < 0) return NULL;
    return to ? to->at + (b->tensors[i].offset - to->lo) : loom_grad(b, i);
}

static struct loom_grouped grouped_of(const struct loom_linear_ctx *c, const struct loom_linear *lin, int G,
                                      const int *rows, const size_t *first, struct grouped_operands *o,
                                      int with_bias, int grads, const struct loom_grad_place *to)
{
    LOOM_ASSERT(G <= LOOM_MOE_MAX_EXPERTS && !c->model->fp8 && !c->exact->pieces);
    for (int e = 0; e < G; e++) {
        o->w[e] = loom_param(lin[e].b, lin[e].w);
        o->w16[e] = loom_linear_param16(lin[e].b, lin[e].w);
        o->bias[e] = with_bias ? bias_of(&lin[e]) : NULL;
        o->dw[e] = grads ? grad_at(lin[e].b, lin[e].w, to) : NULL;
        o->dbias[e] = grads ? grad_at(lin[e].b, lin[e].bias, to) : NULL;
    }
    return (struct loom_grouped){.G = G,
                                 .rows = rows,
                                 .first = first,
                                 .out_in = c->orientation == LOOM_WEIGHTS_OUT_IN,
                                 .w = o->w,
                                 .w16 = c->b16 ? o->w16 : NULL,
                                 .bias = o->bias,
                                 .dw = o->dw,
                                 .dbias = o->dbias};
}

void loom_linear_grouped_forward(const struct loom_linear_ctx *c, const struct loom_linear *lin, int G,
                                 const int *rows, const size_t *first, float *out, const float *inp,
                                 int with_bias)
{
    struct grouped_operands o; /* 40 KB of pointers at most, on the caller's stack */
    const struct loom_grouped g = grouped_of(c, lin, G, rows, first, &o, with_bias, 0, NULL);
    c->k->grouped_forward(out, inp, &g, lin[0].in, lin[0].out);
}

void loom_linear_grouped_backward(const struct loom_linear_ctx *c, const struct loom_linear *lin, int G,
                                  const int *rows, const size_t *first, float *dinp, const float *dout,
                                  const float *inp, const struct loom_grad_place *to)
{
    struct grouped_operands o;
    const struct loom_grouped g = grouped_of(c, lin, G, rows, first, &o, 1, 1, to);
    c->k->grouped_backward(dinp, dout, inp, &g, lin[0].in, lin[0].out);
}
