/*
 * fp8 training: Transformer Engine's delayed-scaling recipe, as Megatron-LM
 * runs it (--fp8-format e4m3|hybrid, --fp8-amax-history-len,
 * --fp8-amax-compute-algo, --fp8-margin).
 *
 * Every linear layer of the transformer blocks (GPT-2's c_attn, attn
 * c_proj, c_fc, mlp c_proj; Llama's q, k, v, o, gate, up and down, whose
 * (out, in) weights take the LM head's kernels) computes its three
 * products on fp8 operands:
 *   forward  y  = (q(x) q(W)) / (s_x s_W) + b
 *   backward dx = (q(dy) q(W)^T) / (s_dy s_W),  dW += (q(x)^T q(dy)) / (s_x s_dy),
 *            db += sum(dy) (the high-precision gradient, as Transformer Engine)
 * q() the saturating quantisation of base/fp8.h: E4M3 for x and W, and for
 * dy E4M3 ("e4m3") or E5M2 ("hybrid"). Each fp8 value is exact in bf16, so
 * the products run on the bf16 units (float32 accumulation) with nothing
 * lost; the scales are undone on the float32 results.
 *
 * Each operand of each layer (x, W, dy: a "meta") has a scale, the amax of
 * the current step (the largest |value| it met, over micro-batches and
 * recomputation) and a history of the last history_len steps' amaxes.
 * loom_fp8_step_end, once per optimizer step and on every rank: each amax
 * is reduced (max) over the tensor-parallel group (the ranks holding parts
 * of one tensor) and the data-parallel group (the ranks sharing it), so
 * every layout computes the single process's scales; pushed into its
 * history (newest first); and the scale for the next step computed from
 * the history (base/fp8.h). A step's quantisation uses the scales of the
 * steps before it: scale 1 at the first step, as Transformer Engine.
 * LayerNorm, softmax, attention's products, the LM head, the loss and the
 * optimizer stay in higher precision.
 *
 * The state (histories and scales) is saved in checkpoints under
 * fp8.<weight name>.amax_history (3, len: x, W, dy; newest first) and
 * fp8.<weight name>.scale (3), the same on every rank of a stage.
 *
 * Not here: fp8 storage of weights or activations (the operands are
 * quantised from bf16 at each use), fp8 attention, per-block scaling.
 */
#ifndef LOOM_LAYERS_FP8_LINEAR_H
#define LOOM_LAYERS_FP8_LINEAR_H

#include <stddef.h>
#include <stdint.h>

#include "base/fp8.h"
#include "kernels/backend.h"

enum { LOOM_FP8_X = 0, LOOM_FP8_W = 1, LOOM_FP8_DY = 2, LOOM_FP8_OPERANDS = 3 };
#define LOOM_FP8_MAX_PER_BLOCK 8 /* linear layers of one layer block */

struct loom_fp8_recipe {
    enum loom_fp8_format fwd, bwd; /* x and W; dy */
    int history_len;
    enum loom_fp8_amax_algo algo;
    int margin;
};

/* One linear layer's fp8 state. */
struct loom_fp8_linear {
    char name[96];                  /* its weight's tensor name */
    float scale[LOOM_FP8_OPERANDS]; /* this step's */
    float amax[LOOM_FP8_OPERANDS];  /* this step's so far */
    float *history;                 /* (3, history_len), newest first */
};

struct loom_backend; /* kernels/backend.h */
struct loom_fp8 {
    struct loom_fp8_recipe recipe;
    int n;
    struct loom_fp8_linear *lin; /* (n) */
    /* where they are: the layer blocks' tensors tensor[0..per_block), each
     * layer block's first linear in first[block] (-1: not a layer) */
    int per_block, tensor[LOOM_FP8_MAX_PER_BLOCK];
    int *first;       /* (the model's nblocks) */
    float *histories; /* (n, 3, history_len): every history, one allocation (host) */
    /* scratch on the model's backend, grown to the largest layer: the
     * quantised operands (bf16 bits), and float32 for the gradient and the
     * weight gradient */
    const struct loom_backend *backend;
    uint16_t *xq, *wq, *gq;
    float *gqf, *dw, *xqf, *wqf;
    size_t xq_cap, wq_cap, gq_cap, gqf_cap, dw_cap, xqf_cap, wqf_cap;
};

/* The recipe the settings ask for: 1, or 0 when fp8 is off. */
struct loom_config;
int loom_fp8_recipe_of(const struct loom_config *cfg, struct loom_fp8_recipe *r);

/* The linear layers of every layer block of m (role LOOM_ROLE_LAYER): the
 * tensors tensors[0..per_block) of each, their weights, named as they are. */
struct loom_model;
struct loom_block;
struct loom_fp8 *loom_fp8_create(const struct loom_fp8_recipe *r, const struct loom_model *m,
                                 const int *tensors, int per_block);
/* The linear layer whose weight is tensor w of block b (of the model it was
 * made for). */
int loom_fp8_linear_of(const struct loom_fp8 *f, const struct loom_model *m, const struct loom_block *b,
                       int w);
void loom_fp8_destroy(struct loom_fp8 *f);

/* The scratch for layers of at most nx input, nw weight and ny output
 * elements (and their float32 copies with widen: a table without bf16
 * products), allocated now, so a footprint counts it and no step grows it. */
void loom_fp8_reserve(struct loom_fp8 *f, size_t nx, size_t nw, size_t ny, int widen);

/* Linear layer l: out (N, OC) = x (N, C) W + bias (OC, or NULL); W
 * (C, OC), as the float32 kernels hold it. x is float32 (inp) or bf16 (inp16, used when not NULL), and so
 * is W (weight / weight16). k: the bf16 kernel table (its _b16 products;
 * float32 products on the fp8 values where it has none). */
void loom_fp8_linear_forward(struct loom_fp8 *f, int l, const struct loom_kernels *k, float *out,
                             const float *inp, const uint16_t *inp16, const float *weight,
                             const uint16_t *weight16, const float *bias, int N, int C, int OC);
/* Its backward: dinp (N, C) written (NULL: not wanted); dweight (C, OC)
 * and dbias (OC, or NULL) accumulate. */
void loom_fp8_linear_backward(struct loom_fp8 *f, int l, const struct loom_kernels *k, float *dinp,
                              float *dweight, float *dbias, const float *dout, const float *inp,
                              const uint16_t *inp16, const float *weight, const uint16_t *weight16, int N,
                              int C, int OC);

/* The same for W (OC, C), as nn.Linear keeps it (Llama's layers), without
 * a bias; float32 operands; dinp written (not NULL). */
void loom_fp8_linear_t_forward(struct loom_fp8 *f, int l, const struct loom_kernels *k, float *out,
                               const float *inp, const float *weight, int N, int C, int OC);
void loom_fp8_linear_t_backward(struct loom_fp8 *f, int l, const struct loom_kernels *k, float *dinp,
                                float *dweight, const float *dout, const float *inp, const float *weight,
                                int N, int C, int OC);

/* Collective over the tp and dp groups: the step's amaxes reduced, pushed
 * into the histories, the next scales computed, the amaxes reset. */
void loom_fp8_step_end(struct loom_fp8 *f);

#endif
