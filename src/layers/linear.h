/*
 * The parallel linear layer every model uses (Megatron's ColumnParallelLinear
 * and RowParallelLinear): a product with a weight tensor of a block (and its
 * bias), in the weight orientation the model stores, on the precision path
 * its settings choose:
 *
 *   fp8           the fp8 recipe's quantised operands (layers/fp8_linear.h)
 *   bf16 operands kept bf16 activations and stored bf16 weights taken as
 *                 they are (the backend's optional *_b16 products)
 *   float32       the kernel table's products
 *   exact         --layout-invariant: every sum tensor parallelism splits
 *                 taken in fixed pieces (layers/tp_exact.h)
 *
 * Column-parallel: each rank computes its columns of every row; the input
 * enters the tensor-parallel region (gathered under sequence parallelism)
 * before, and its gradient leaves it (summed, or reduce-scattered) after.
 * A column product may be one weight (fused: GPT-2's c_attn, whose columns
 * are q | k | v) or several of one input (Llama's q, k and v; gate and up),
 * whose input gradients are summed in order. Row-parallel: each rank
 * multiplies its slice of the input's columns, and the partial sums leave
 * the region (all-reduced, or reduce-scattered); the bias is added once.
 */
#ifndef LOOM_LAYERS_LINEAR_H
#define LOOM_LAYERS_LINEAR_H

#include <stddef.h>
#include <stdint.h>

#include "layers/tp_exact.h"
#include "layers/tp_regions.h"
#include "loom/model.h"

struct loom_kernels;
struct loom_fp8;

/* How the model stores its projection weights. */
enum loom_weight_orientation {
    LOOM_WEIGHTS_IN_OUT = 0, /* [in, out], Conv1D's (GPT-2): y = x W */
    LOOM_WEIGHTS_OUT_IN = 1, /* [out, in], nn.Linear's (Llama): y = x W^T */
};

/* What every product of a model shares. */
struct loom_linear_ctx {
    const struct loom_kernels *k;
    struct loom_model *model;    /* the blocks' model (fp8 finds its linear layers by them) */
    struct loom_tp_exact *exact; /* pieces 0: off */
    struct loom_tp_regions *rg;  /* the tensor-parallel regions */
    int tp_rank;                 /* a row-parallel bias is added by rank 0 */
    enum loom_weight_orientation orientation;
    int b16;        /* the products take bf16 operands as stored (x16, the weights') */
    float *scratch; /* (N, in) a separate product's input gradient before it is added */
};

/* A product: weight tensor w of block b and its bias tensor (-1: none), in
 * features to out features (this rank's). */
struct loom_linear {
    struct loom_block *b;
    int w, bias;
    int in, out;
};

/* Column-parallel products of one input: n weights (fused: one weight whose
 * out columns are n equal segments). */
struct loom_linear_group {
    struct loom_linear lin[3];
    int n;
    int fused;
};

/* Whether a tensor is stored in bf16 (what the bf16 products take), and its values then. */
const uint16_t *loom_linear_param16(const struct loom_block *b, int i);

/* out[s] (N, lin[s].out) = inp (N, C) times each weight (fused: out[0] is
 * (N, the segments' sum)); inp (the region's input, float32 values) may be
 * NULL where x16 holds it. */
void loom_linear_column_forward(const struct loom_linear_ctx *c, const struct loom_linear_group *g,
                                float *const *out, const float *inp, const uint16_t *x16, int N);
/* Its backward from dout[s]: the weights' and biases' gradients accumulate;
 * the input's gradient is written into dst (N, C) and the rows this rank
 * holds of it, summed over the group, are returned. */
float *loom_linear_column_backward(const struct loom_linear_ctx *c, const struct loom_linear_group *g,
                                   float *const *dout, const float *inp, const uint16_t *x16, float *dst,
                                   int N);
/* A row-parallel product leaving its region: the rows this rank holds of
 * inp (N, in) times the weight, plus the bias, via dst (N, out). */
float *loom_linear_row_forward(const struct loom_linear_ctx *c, const struct loom_linear *l, const float *inp,
                               const uint16_t *x16, float *dst, int N);
/* Its backward from dout (every row): dinp (N, in) written, the weight's
 * and bias's gradients accumulate. */
void loom_linear_row_backward(const struct loom_linear_ctx *c, const struct loom_linear *l, float *dinp,
                              const float *dout, const float *inp, const uint16_t *x16, int N);

/* Grouped products (a mixture of experts' local experts, decoder_moe.c):
 * lin[g], G products of one shape, each on its rows[g] consecutive rows of
 * inp and out from row first[g] (first NULL: each right after the one
 * before), in one call of the table's grouped product (struct
 * loom_grouped, kernels/kernels.h), on this rank's rows alone (no region's
 * exchange); on the float32 or bf16-operand path, as one product here
 * would be (fp8 and the exact pieces do not take them). with_bias 0 leaves
 * the biases out (a row-parallel product's, which tp rank 0 alone adds). */
void loom_linear_grouped_forward(const struct loom_linear_ctx *c, const struct loom_linear *lin, int G,
                                 const int *rows, const size_t *first, float *out, const float *inp,
                                 int with_bias);
/* Where a grouped backward's weight and bias gradients accumulate: at
 * stands for the gradients of the block's elements from lo on (a buffer
 * of a run of its tensors, such as its experts'). */
struct loom_grad_place {
    float *at;
    size_t lo;
};
/* Its backward: dinp (the rows, in) written, skipped when NULL; the
 * weights' and biases' gradients accumulate into their own (to NULL) or
 * into to's buffer. */
void loom_linear_grouped_backward(const struct loom_linear_ctx *c, const struct loom_linear *lin, int G,
                                  const int *rows, const size_t *first, float *dinp, const float *dout,
                                  const float *inp, const struct loom_grad_place *to);

#endif
