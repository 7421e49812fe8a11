/*
 * Tensor parallelism's communication pairs, regions and splits (tp_regions.h).
 */
#include "layers/tp_regions.h"

#include "base/log.h"

/* Seconds the collectives of this process waited since the last take. */
static double waited;

double loom_tp_comm_take_s(void)
{
    const double w = waited;
    waited = 0;
    return w;
}

void loom_tp_wait(struct loom_comm_handle *h)
{
    waited += loom_comm_wait(h);
}

void loom_tp_allreduce(float *x, size_t n, enum loom_op op)
{
    loom_tp_wait(loom_comm_allreduce(LOOM_GROUP_TP, loom_buf_f32(x, n), op));
}

void loom_tp_copy_backward(float *dx, size_t n)
{
    loom_tp_allreduce(dx, n, LOOM_OP_SUM);
}

void loom_tp_reduce_forward(float *y, size_t n)
{
    loom_tp_allreduce(y, n, LOOM_OP_SUM);
}

void loom_tp_gather(float *full, const float *local, size_t n_local, int tp)
{
    loom_tp_wait(loom_comm_allgather(LOOM_GROUP_TP, loom_buf_f32((float *)local, n_local),
                                     loom_buf_f32(full, n_local * (size_t)tp)));
}

void loom_tp_reduce_scatter(float *local, const float *full, size_t n_local, int tp)
{
    loom_tp_wait(loom_comm_reduce_scatter(LOOM_GROUP_TP, loom_buf_f32((float *)full, n_local * (size_t)tp),
                                          loom_buf_f32(local, n_local)));
}

int loom_tp_rows_held(const struct loom_tp_regions *r, int N)
{
    return r->sp ? N / r->tp : N;
}

const float *loom_tp_region_input(struct loom_tp_regions *r, const float *x, int N)
{
    if (!r->sp) return x;
    loom_tp_gather(r->gathered, x, (size_t)loom_tp_rows_held(r, N) * r->width, r->tp);
    return r->gathered;
}

float *loom_tp_region_output(struct loom_tp_regions *r, float *partial, int N)
{
    if (r->tp == 1) return partial;
    if (!r->sp) {
        loom_tp_reduce_forward(partial, (size_t)N * r->width);
        return partial;
    }
    loom_tp_reduce_scatter(r->out_rows, partial, (size_t)loom_tp_rows_held(r, N) * r->width, r->tp);
    return r->out_rows;
}

const float *loom_tp_region_output_grad(struct loom_tp_regions *r, const float *dres, int N)
{
    return loom_tp_region_input(r, dres, N);
}

float *loom_tp_region_input_grad(struct loom_tp_regions *r, float *partial, int N)
{
    if (r->tp == 1) return partial;
    if (!r->sp) {
        loom_tp_copy_backward(partial, (size_t)N * r->width);
        return partial;
    }
    loom_tp_reduce_scatter(r->grad_rows, partial, (size_t)loom_tp_rows_held(r, N) * r->width, r->tp);
    return r->grad_rows;
}

void loom_tp_part(int64_t n, int tp, int r, int64_t *lo, int64_t *hi)
{
    LOOM_ASSERT(tp >= 1 && r >= 0 && r < tp && n >= 0);
    *lo = n * r / tp;
    *hi = n * (r + 1) / tp;
}

float *loom_tp_region_rows(const struct loom_tp_regions *r, float *x, int N, int tp_rank)
{
    if (r->tp == 1 || !r->sp) return x;
    return x + (size_t)loom_tp_rows_held(r, N) * (size_t)tp_rank * (size_t)r->width;
}
