/*
 * Grouped products (kernels.h): a mixture of experts' local experts, G
 * products of one shape in one call, group g's weight on its own block of
 * consecutive rows. On the CPU each block is one product of the table it
 * belongs to (sgemm's, or the bf16 units'), so a group's bits are the
 * single product's on the same rows; the `_ref` takes plain loops with
 * double sums, rounded once, the bias added to the rounded product.
 */
#include "kernels/kernels.h"

#include "base/dtype.h"

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

/* Group e's weight at input i, output j: its bf16 copy where one is given. */
static double weight_at(const struct loom_grouped *g, int e, int i, int j, int C, int OC)
{
    const size_t at = g->out_in ? (size_t)j * C + i : (size_t)i * OC + j;
    const uint16_t *w16 = w16_of(g, e);
    return w16 ? (double)loom_bf16_to_f32(w16[at]) : (double)g->w[e][at];
}

void loom_grouped_forward_ref(float *out, const float *inp, const struct loom_grouped *g, int C, int OC)
{
    size_t next = 0;
    for (int e = 0; e < g->G; next += (size_t)g->rows[e++]) {
        const size_t n = (size_t)g->rows[e], o = g->first ? g->first[e] : next;
        if (!n) continue;
        const float *b = bias_of(g, e);
        for (size_t r = 0; r < n; r++)
            for (int j = 0; j < OC; j++) {
                double s = 0;
                for (int i = 0; i < C; i++) s += (double)inp[(o + r) * C + i] * weight_at(g, e, i, j, C, OC);
                out[(o + r) * OC + j] = (float)s + (b ? b[j] : 0.0f);
            }
    }
}

void loom_grouped_backward_ref(float *dinp, const float *dout, const float *inp, const struct loom_grouped *g,
                               int C, int OC)
{
    size_t next = 0;
    for (int e = 0; e < g->G; next += (size_t)g->rows[e++]) {
        const size_t n = (size_t)g->rows[e], o = g->first ? g->first[e] : next;
        if (!n) continue;
        const float *dy = dout + o * OC, *x = inp + o * C;
        for (size_t r = 0; dinp && r < n; r++)
            for (int i = 0; i < C; i++) {
                double s = 0;
                for (int j = 0; j < OC; j++) s += (double)dy[r * OC + j] * weight_at(g, e, i, j, C, OC);
                dinp[(o + r) * C + i] = (float)s;
            }
        float *dw = g->dw ? g->dw[e] : NULL, *db = dbias_of(g, e);
        for (int i = 0; dw && i < C; i++)
            for (int j = 0; j < OC; j++) {
                double s = 0;
                for (size_t r = 0; r < n; r++) s += (double)x[r * C + i] * dy[r * OC + j];
                dw[g->out_in ? (size_t)j * C + i : (size_t)i * OC + j] += (float)s;
            }
        for (int j = 0; db && j < OC; j++) {
            double s = 0;
            for (size_t r = 0; r < n; r++) s += dy[r * OC + j];
            db[j] += (float)s;
        }
    }
}
