/*
 * Grouped products (kernels.h): a mixture of experts' local experts, G
 * products of one shape in one call, group g's weight on its own block of
 * consecutive rows. On the CPU each block is one product of the table it
 * belongs to (sgemm's, or the bf16 units'), so a group's bits are the
 * single product's on the same rows; the `_ref` takes the reference
 * products (matmul's and linear's plain loops, double sums rounded once).
 */
#include "kernels/kernels.h"

/* Which table's products a group is: the float32 one's, the bf16 units'
 * (the b16 products where bf16 copies are given), the reference's. */
enum products { PLAIN, UNITS, REF };

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

/* Group e's product on its n rows of inp into out. */
static void group_forward(enum products p, const struct loom_grouped *g, int e, float *out, const float *inp,
                          int n, int C, int OC)
{
    const float *w = g->w[e], *b = bias_of(g, e);
    const uint16_t *w16 = w16_of(g, e);
    if (g->out_in && p == REF)
        loom_linear_forward_ref(out, inp, NULL, w, w16, b, n, C, OC);
    else if (g->out_in && p == UNITS)
        loom_linear_forward_bf16(out, inp, NULL, w, w16, b, n, C, OC);
    else if (g->out_in)
        loom_linear_forward(out, inp, NULL, w, w16, b, n, C, OC);
    else if (p == REF)
        loom_matmul_forward_ref(out, inp, w, b, n, C, OC);
    else if (p == UNITS && g->w16)
        loom_matmul_forward_b16(out, inp, NULL, w, w16, b, n, C, OC);
    else if (p == UNITS)
        loom_matmul_forward_bf16(out, inp, w, b, n, C, OC);
    else
        loom_matmul_forward(out, inp, w, b, n, C, OC);
}

/* Its backward: dinp written (skipped when NULL), the gradients accumulate. */
static void group_backward(enum products p, const struct loom_grouped *g, int e, float *dinp,
                           const float *dout, const float *inp, int n, int C, int OC)
{
    const float *w = g->w[e];
    const uint16_t *w16 = w16_of(g, e);
    float *dw = g->dw ? g->dw[e] : NULL, *db = dbias_of(g, e);
    if (g->out_in && p == REF)
        loom_linear_backward_ref(dinp, dw, db, dout, inp, NULL, w, w16, n, C, OC);
    else if (g->out_in && p == UNITS)
        loom_linear_backward_bf16(dinp, dw, db, dout, inp, NULL, w, w16, n, C, OC);
    else if (g->out_in)
        loom_linear_backward(dinp, dw, db, dout, inp, NULL, w, w16, n, C, OC);
    else if (p == REF)
        loom_matmul_backward_ref(dinp, dw, db, dout, inp, w, n, C, OC);
    else if (p == UNITS && g->w16)
        loom_matmul_backward_b16(dinp, dw, db, dout, inp, NULL, w, w16, n, C, OC);
    else if (p == UNITS)
        loom_matmul_backward_bf16(dinp, dw, db, dout, inp, w, n, C, OC);
    else
        loom_matmul_backward(dinp, dw, db, dout, inp, w, n, C, OC);
}

/* Every group with rows, at its place (first, or after the one before). */
static void forward(enum products p, float *out, const float *inp, const struct loom_grouped *g, int C,
                    int OC)
{
    size_t next = 0;
    for (int e = 0; e < g->G; next += (size_t)g->rows[e++]) {
        const size_t o = g->first ? g->first[e] : next;
        if (g->rows[e]) group_forward(p, g, e, out + o * OC, inp + o * C, g->rows[e], C, OC);
    }
}

static void backward(enum products p, float *dinp, const float *dout, const float *inp,
                     const struct loom_grouped *g, int C, int OC)
{
    size_t next = 0;
    for (int e = 0; e < g->G; next += (size_t)g->rows[e++]) {
        const size_t o = g->first ? g->first[e] : next;
        if (g->rows[e])
            group_backward(p, g, e, dinp ? dinp + o * C : NULL, dout + o * OC, inp + o * C, g->rows[e], C,
                           OC);
    }
}

void loom_grouped_forward(float *out, const float *inp, const struct loom_grouped *g, int C, int OC)
{
    forward(PLAIN, out, inp, g, C, OC);
}
void loom_grouped_backward(float *dinp, const float *dout, const float *inp, const struct loom_grouped *g,
                           int C, int OC)
{
    backward(PLAIN, dinp, dout, inp, g, C, OC);
}
void loom_grouped_forward_bf16(float *out, const float *inp, const struct loom_grouped *g, int C, int OC)
{
    forward(UNITS, out, inp, g, C, OC);
}
void loom_grouped_backward_bf16(float *dinp, const float *dout, const float *inp,
                                const struct loom_grouped *g, int C, int OC)
{
    backward(UNITS, dinp, dout, inp, g, C, OC);
}
void loom_grouped_forward_ref(float *out, const float *inp, const struct loom_grouped *g, int C, int OC)
{
    forward(REF, out, inp, g, C, OC);
}
void loom_grouped_backward_ref(float *dinp, const float *dout, const float *inp, const struct loom_grouped *g,
                               int C, int OC)
{
    backward(REF, dinp, dout, inp, g, C, OC);
}
