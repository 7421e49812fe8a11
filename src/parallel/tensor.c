/*
 * Tensor parallelism's communication pairs (tensor.h).
 */
#include "parallel/tensor.h"

void loom_tp_allreduce(float *x, size_t n, enum loom_op op)
{
    loom_comm_allreduce_sync(LOOM_GROUP_TP, loom_buf_f32(x, n), op);
}

void loom_tp_copy_backward(float *dx, size_t n)
{
    loom_tp_allreduce(dx, n, LOOM_OP_SUM);
}

void loom_tp_reduce_forward(float *y, size_t n)
{
    loom_tp_allreduce(y, n, LOOM_OP_SUM);
}
