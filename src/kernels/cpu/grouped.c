/*
 * Grouped products (kernels.h): a mixture of experts' local experts, G
 * products of one shape in one call, group g's weight on its own block of
 * consecutive rows. On the CPU each block is one product of the table it
 * belongs to (sgemm's, or the bf16 units'), so a group's bits are the
 * single product's on the same rows; the `_ref` takes the reference
 * products (matmul's and linear's plain loops, double sums rounded once).
 */
#include "kernels/kernels.h"

static const float *bias_of(const struct loom_grouped *g, int e)
{
    return g->bias ? g->bias[e] : NULL;
}
static const uint16_t *w16_of(const struct loom_grouped *g, int e)
{
    return g->w16 ? g->w16[e] : NULL;
}
static float *dbias_of(const struct loom_grouped *g, int e)
{
    return g->dbias ? g->dbias[e] : NULL;
}

void loom_grouped_forward(float *out, const float *inp, const struct loom_grouped *g, int C, int OC)
{
    size_t next = 0;
    for (int e = 0; e < g->G; next += (size_t)g->rows[e++]) {
        const size_t n = (size_t)g->rows[e], o = g->first ? g->first[e] : next;
        if (!n) continue;
        if (g->out_in)
            loom_linear_forward(out + o * OC, inp + o * C, NULL, g->w[e], w16_of(g, e), bias_of(g, e), (int)n,
                                C, OC);
        else
            loom_matmul_forward(out + o * OC, inp + o * C, g->w[e], bias_of(g, e), (int)n, C, OC);
    }
}

void loom_grouped_backward(float *dinp, const float *dout, const float *inp, const struct loom_grouped *g,
                           int C, int OC)
{
    size_t next = 0;
    for (int e = 0; e < g->G; next += (size_t)g->rows[e++]) {
        const size_t n = (size_t)g->rows[e], o = g->first ? g->first[e] : next;
        if (!n) continue;
        float *dw = g->dw ? g->dw[e] : NULL;
        if (g->out_in)
            loom_linear_backward(dinp ? dinp + o * C : NULL, dw, dbias_of(g, e), dout + o * OC, inp + o * C,
                                 NULL, g->w[e], w16_of(g, e), (int)n, C, OC);
        else
            loom_matmul_backward(dinp ? dinp + o * C : NULL, dw, dbias_of(g, e), dout + o * OC, inp + o * C,
                                 g->w[e], (int)n, C, OC);
    }
}

void loom_grouped_forward_bf16(float *out, const float *inp, const struct loom_grouped *g, int C, int OC)
{
    size_t next = 0;
    for (int e = 0; e < g->G; next += (size_t)g->rows[e++]) {
        const size_t n = (size_t)g->rows[e], o = g->first ? g->first[e] : next;
        if (!n) continue;
        if (g->out_in)
            loom_linear_forward_bf16(out + o * OC, inp + o * C, NULL, g->w[e], w16_of(g, e), bias_of(g, e),
                                     (int)n, C, OC);
        else if (g->w16)
            loom_matmul_forward_b16(out + o * OC, inp + o * C, NULL, g->w[e], w16_of(g, e), bias_of(g, e),
                                    (int)n, C, OC);
        else
            loom_matmul_forward_bf16(out + o * OC, inp + o * C, g->w[e], bias_of(g, e), (int)n, C, OC);
    }
}

void loom_grouped_backward_bf16(float *dinp, const float *dout, const float *inp,
                                const struct loom_grouped *g, int C, int OC)
{
    size_t next = 0;
    for (int e = 0; e < g->G; next += (size_t)g->rows[e++]) {
        const size_t n = (size_t)g->rows[e], o = g->first ? g->first[e] : next;
        if (!n) continue;
        float *dw = g->dw ? g->dw[e] : NULL, *di = dinp ? dinp + o * C : NULL;
        if (g->out_in)
            loom_linear_backward_bf16(di, dw, dbias_of(g, e), dout + o * OC, inp + o * C, NULL, g->w[e],
                                      w16_of(g, e), (int)n, C, OC);
        else if (g->w16)
            loom_matmul_backward_b16(di, dw, dbias_of(g, e), dout + o * OC, inp + o * C, NULL, g->w[e],
                                     w16_of(g, e), (int)n, C, OC);
        else
            loom_matmul_backward_bf16(di, dw, dbias_of(g, e), dout + o * OC, inp + o * C, g->w[e], (int)n, C,
                                      OC);
    }
}

void loom_grouped_forward_ref(float *out, const float *inp, const struct loom_grouped *g, int C, int OC)
{
    size_t next = 0;
    for (int e = 0; e < g->G; next += (size_t)g->rows[e++]) {
        const size_t n = (size_t)g->rows[e], o = g->first ? g->first[e] : next;
        if (!n) continue;
        if (g->out_in)
            loom_linear_forward_ref(out + o * OC, inp + o * C, NULL, g->w[e], w16_of(g, e), bias_of(g, e),
                                    (int)n, C, OC);
        else
            loom_matmul_forward_ref(out + o * OC, inp + o * C, g->w[e], bias_of(g, e), (int)n, C, OC);
    }
}

void loom_grouped_backward_ref(float *dinp, const float *dout, const float *inp, const struct loom_grouped *g,
                               int C, int OC)
{
    size_t next = 0;
    for (int e = 0; e < g->G; next += (size_t)g->rows[e++]) {
        const size_t n = (size_t)g->rows[e], o = g->first ? g->first[e] : next;
        if (!n) continue;
        float *dw = g->dw ? g->dw[e] : NULL, *di = dinp ? dinp + o * C : NULL;
        if (g->out_in)
            loom_linear_backward_ref(di, dw, dbias_of(g, e), dout + o * OC, inp + o * C, NULL, g->w[e],
                                     w16_of(g, e), (int)n, C, OC);
        else
            loom_matmul_backward_ref(di, dw, dbias_of(g, e), dout + o * OC, inp + o * C, g->w[e], (int)n, C,
                                     OC);
    }
}
