/* fp8 linear layers with delayed scaling (see fp8_linear.h). */
#include "layers/fp8_linear.h"

#include <math.h>
#include <stdio.h>
#include <string.h>

#include "base/buf.h"
#include "base/log.h"
#include "base/mem.h"
#include "comm/comm.h"
#include "kernels/backend.h"
#include "kernels/kernels.h"
#include "loom/config.h"
#include "loom/model.h"

int loom_fp8_recipe_of(const struct loom_config *cfg, struct loom_fp8_recipe *r)
{
    if (cfg->fp8_format == LOOM_FP8_OFF) return 0;
    r->fwd = LOOM_FP8_E4M3;
    r->bwd = cfg->fp8_format == LOOM_FP8_MODE_HYBRID ? LOOM_FP8_E5M2 : LOOM_FP8_E4M3;
    r->history_len = cfg->fp8_amax_history_len;
    r->algo = cfg->fp8_amax_compute_algo == LOOM_FP8_AMAX_COMPUTE_MAX ? LOOM_FP8_AMAX_MAX
                                                                      : LOOM_FP8_AMAX_MOST_RECENT;
    r->margin = cfg->fp8_margin;
    return 1;
}

struct loom_fp8 *loom_fp8_create(const struct loom_fp8_recipe *r, const struct loom_model *m,
                                 const int *tensors, int per_block)
{
    LOOM_ASSERT(r->history_len >= 1 && per_block >= 1 && per_block <= LOOM_FP8_MAX_PER_BLOCK);
    struct loom_fp8 *f = loom_alloc(sizeof *f, LOOM_MEM_OTHER);
    memset(f, 0, sizeof *f);
    f->recipe = *r;
    f->backend = m->backend;
    f->per_block = per_block;
    memcpy(f->tensor, tensors, sizeof(int) * (size_t)per_block);
    f->first = loom_alloc(sizeof(int) * (size_t)m->nblocks, LOOM_MEM_OTHER);
    for (int i = 0; i < m->nblocks; i++) {
        f->first[i] = m->blocks[i].role == LOOM_ROLE_LAYER ? f->n : -1;
        if (f->first[i] >= 0) f->n += per_block;
    }
    f->lin = loom_alloc(loom_mul_size((size_t)f->n + 1, sizeof *f->lin), LOOM_MEM_OTHER);
    const size_t per = (size_t)LOOM_FP8_OPERANDS * (size_t)r->history_len;
    f->histories = loom_alloc(loom_mul_size((size_t)f->n * per + 1, sizeof(float)), LOOM_MEM_OTHER);
    memset(f->histories, 0, ((size_t)f->n * per + 1) * sizeof(float));
    for (int i = 0; i < m->nblocks; i++)
        for (int k = 0; f->first[i] >= 0 && k < per_block; k++) {
            struct loom_fp8_linear *l = &f->lin[f->first[i] + k];
            memset(l, 0, sizeof *l);
            snprintf(l->name, sizeof l->name, "%s", m->blocks[i].tensors[tensors[k]].name);
            for (int o = 0; o < LOOM_FP8_OPERANDS; o++) l->scale[o] = 1.0f;
            l->history = f->histories + (size_t)(f->first[i] + k) * per;
        }
    return f;
}

int loom_fp8_linear_of(const struct loom_fp8 *f, const struct loom_model *m, const struct loom_block *b,
                       int w)
{
    const int first = f->first[b - m->blocks];
    LOOM_ASSERT(first >= 0);
    for (int k = 0; k < f->per_block; k++)
        if (f->tensor[k] == w) return first + k;
    LOOM_ASSERT(!"not an fp8 linear layer");
    return -1;
}

void loom_fp8_destroy(struct loom_fp8 *f)
{
    if (!f) return;
    void *bufs[] = {f->xq, f->wq, f->gq, f->gqf, f->dw, f->xqf, f->wqf};
    for (size_t i = 0; i < sizeof bufs / sizeof bufs[0]; i++)
        if (bufs[i]) f->backend->free(bufs[i]);
    loom_free(f->histories);
    loom_free(f->lin);
    loom_free(f->first);
    loom_free(f);
}

/* *buf holding at least n elements of size es, on the model's backend. */
static void *grow(const struct loom_fp8 *f, void *buf, size_t *cap, size_t n, size_t es)
{
    if (n <= *cap) return buf;
    if (buf) f->backend->free(buf);
    *cap = n;
    return f->backend->alloc(loom_mul_size(n, es), LOOM_MEM_ACTIVATIONS);
}

void loom_fp8_reserve(struct loom_fp8 *f, size_t nx, size_t nw, size_t ny, int widen)
{
    f->xq = grow(f, f->xq, &f->xq_cap, nx, sizeof *f->xq);
    f->wq = grow(f, f->wq, &f->wq_cap, nw, sizeof *f->wq);
    f->gq = grow(f, f->gq, &f->gq_cap, ny, sizeof *f->gq);
    f->gqf = grow(f, f->gqf, &f->gqf_cap, ny, sizeof *f->gqf);
    f->dw = grow(f, f->dw, &f->dw_cap, nw, sizeof *f->dw);
    if (widen) {
        f->xqf = grow(f, f->xqf, &f->xqf_cap, nx, sizeof *f->xqf);
        f->wqf = grow(f, f->wqf, &f->wqf_cap, nw, sizeof *f->wqf);
    }
}

/* x (n), float32 or bf16, quantised with its scale into *q; its amax taken
 * into *amax (a NaN stays), unless amax is NULL (the backward's x and W,
 * whose amaxes the forward took). */
static const uint16_t *quantize(const struct loom_fp8 *f, const struct loom_kernels *k, uint16_t **q,
                                size_t *cap, const float *x, const uint16_t *x16, size_t n, float scale,
                                enum loom_fp8_format fmt, float *amax)
{
    *q = grow(f, *q, cap, n, sizeof **q);
    k->fp8_quantize(*q, x, x16, n, scale, fmt);
    if (amax) {
        const float a = k->fp8_amax(x, x16, n);
        if (isnan(a) || a > *amax) *amax = isnan(*amax) ? *amax : a;
    }
    return *q;
}

/* float32 copies of quantised values, for a table without bf16 products. */
static const float *widened(const struct loom_fp8 *f, float **buf, size_t *cap, const uint16_t *q, size_t n)
{
    *buf = grow(f, *buf, cap, n, sizeof **buf);
    f->backend->convert(loom_buf_f32(*buf, n), loom_buf_of_const(q, n, LOOM_DTYPE_BF16));
    return *buf;
}

/* The forward of layer li; out_in: W is (OC, C) (nn.Linear's), its
 * products the LM head's kernels on float32 copies of the values. */
static void fp8_forward(struct loom_fp8 *f, int li, const struct loom_kernels *k, float *out,
                        const float *inp, const uint16_t *inp16, const float *weight,
                        const uint16_t *weight16, const float *bias, int N, int C, int OC, int out_in)
{
    LOOM_ASSERT(li >= 0 && li < f->n);
    struct loom_fp8_linear *l = &f->lin[li];
    const enum loom_fp8_format fmt = f->recipe.fwd;
    const size_t nx = (size_t)N * C, nw = (size_t)OC * C;
    const uint16_t *xq =
        quantize(f, k, &f->xq, &f->xq_cap, inp, inp16, nx, l->scale[LOOM_FP8_X], fmt, &l->amax[LOOM_FP8_X]);
    const uint16_t *wq = quantize(f, k, &f->wq, &f->wq_cap, weight, weight16, nw, l->scale[LOOM_FP8_W], fmt,
                                  &l->amax[LOOM_FP8_W]);
    if (out_in)
        k->lm_head_forward(out, widened(f, &f->xqf, &f->xqf_cap, xq, nx),
                           widened(f, &f->wqf, &f->wqf_cap, wq, nw), N, C, OC);
    else if (k->matmul_forward_b16)
        k->matmul_forward_b16(out, NULL, xq, NULL, wq, NULL, N, C, OC);
    else
        k->matmul_forward(out, widened(f, &f->xqf, &f->xqf_cap, xq, nx),
                          widened(f, &f->wqf, &f->wqf_cap, wq, nw), NULL, N, C, OC);
    /* the scales undone on the float32 sums, then the bias */
    const float undo = (1.0f / l->scale[LOOM_FP8_X]) * (1.0f / l->scale[LOOM_FP8_W]);
    k->fp8_unscale(out, bias, N, OC, undo);
}

static void fp8_backward(struct loom_fp8 *f, int li, const struct loom_kernels *k, float *dinp,
                         float *dweight, float *dbias, const float *dout, const float *inp,
                         const uint16_t *inp16, const float *weight, const uint16_t *weight16, int N, int C,
                         int OC, int out_in)
{
    LOOM_ASSERT(li >= 0 && li < f->n && (dinp || !out_in));
    struct loom_fp8_linear *l = &f->lin[li];
    const size_t nx = (size_t)N * C, nw = (size_t)OC * C, ny = (size_t)N * OC;
    const uint16_t *xq =
        quantize(f, k, &f->xq, &f->xq_cap, inp, inp16, nx, l->scale[LOOM_FP8_X], f->recipe.fwd, NULL);
    const uint16_t *wq =
        quantize(f, k, &f->wq, &f->wq_cap, weight, weight16, nw, l->scale[LOOM_FP8_W], f->recipe.fwd, NULL);
    const uint16_t *gq = quantize(f, k, &f->gq, &f->gq_cap, dout, NULL, ny, l->scale[LOOM_FP8_DY],
                                  f->recipe.bwd, &l->amax[LOOM_FP8_DY]);
    /* the products take the gradient as float32 values (exact) */
    const float *gqf = widened(f, &f->gqf, &f->gqf_cap, gq, ny);
    f->dw = grow(f, f->dw, &f->dw_cap, nw, sizeof *f->dw);
    f->backend->memset(f->dw, 0, nw * sizeof *f->dw);
    if (out_in)
        k->lm_head_backward(dinp, f->dw, gqf, widened(f, &f->xqf, &f->xqf_cap, xq, nx),
                            widened(f, &f->wqf, &f->wqf_cap, wq, nw), N, C, OC);
    else if (k->matmul_backward_b16)
        k->matmul_backward_b16(dinp, f->dw, NULL, gqf, NULL, xq, NULL, wq, N, C, OC);
    else
        k->matmul_backward(dinp, f->dw, NULL, gqf, widened(f, &f->xqf, &f->xqf_cap, xq, nx),
                           widened(f, &f->wqf, &f->wqf_cap, wq, nw), N, C, OC);
    const float sg = 1.0f / l->scale[LOOM_FP8_DY];
    const float undo_x = sg * (1.0f / l->scale[LOOM_FP8_W]), undo_w = sg * (1.0f / l->scale[LOOM_FP8_X]);
    k->fp8_scale_into(dinp, nx, undo_x, dweight, f->dw, nw, undo_w);
    if (dbias) k->bias_backward(dbias, dout, N, OC); /* from the unquantised gradient */
}

void loom_fp8_linear_forward(struct loom_fp8 *f, int li, const struct loom_kernels *k, float *out,
                             const float *inp, const uint16_t *inp16, const float *weight,
                             const uint16_t *weight16, const float *bias, int N, int C, int OC)
{
    fp8_forward(f, li, k, out, inp, inp16, weight, weight16, bias, N, C, OC, 0);
}

void loom_fp8_linear_backward(struct loom_fp8 *f, int li, const struct loom_kernels *k, float *dinp,
                              float *dweight, float *dbias, const float *dout, const float *inp,
                              const uint16_t *inp16, const float *weight, const uint16_t *weight16, int N,
                              int C, int OC)
{
    fp8_backward(f, li, k, dinp, dweight, dbias, dout, inp, inp16, weight, weight16, N, C, OC, 0);
}

void loom_fp8_linear_t_forward(struct loom_fp8 *f, int li, const struct loom_kernels *k, float *out,
                               const float *inp, const float *weight, int N, int C, int OC)
{
    fp8_forward(f, li, k, out, inp, NULL, weight, NULL, NULL, N, C, OC, 1);
}

void loom_fp8_linear_t_backward(struct loom_fp8 *f, int li, const struct loom_kernels *k, float *dinp,
                                float *dweight, const float *dout, const float *inp, const float *weight,
                                int N, int C, int OC)
{
    fp8_backward(f, li, k, dinp, dweight, NULL, dout, inp, NULL, weight, NULL, N, C, OC, 1);
}

void loom_fp8_step_end(struct loom_fp8 *f)
{
    const size_t n = (size_t)f->n * LOOM_FP8_OPERANDS;
    if (n == 0) return;
    float *amax = loom_alloc(loom_mul_size(n, sizeof *amax), LOOM_MEM_OTHER);
    for (int i = 0; i < f->n; i++)
        for (int o = 0; o < LOOM_FP8_OPERANDS; o++) {
            const float a = f->lin[i].amax[o];
            /* a NaN as +inf: a maximum over ranks keeps it either way (the scale is kept) */
            amax[(size_t)i * LOOM_FP8_OPERANDS + o] = isnan(a) ? INFINITY : a;
        }
    loom_comm_allreduce_sync(LOOM_GROUP_TP, loom_buf_f32(amax, n), LOOM_OP_MAX);
    loom_comm_allreduce_sync(LOOM_GROUP_DP, loom_buf_f32(amax, n), LOOM_OP_MAX);
    const int len = f->recipe.history_len;
    for (int i = 0; i < f->n; i++) {
        struct loom_fp8_linear *l = &f->lin[i];
        for (int o = 0; o < LOOM_FP8_OPERANDS; o++) {
            float *h = l->history + (size_t)o * len;
            memmove(h + 1, h, (size_t)(len - 1) * sizeof *h);
            h[0] = amax[(size_t)i * LOOM_FP8_OPERANDS + o];
            const enum loom_fp8_format fmt = o == LOOM_FP8_DY ? f->recipe.bwd : f->recipe.fwd;
            l->scale[o] = loom_fp8_scale_update(h, len, f->recipe.algo, l->scale[o], f->recipe.margin, fmt);
            l->amax[o] = 0.0f;
        }
    }
    loom_free(amax);
}
