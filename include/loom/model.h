/*
 * A model as the engine sees it: an ordered list of blocks, each owning its
 * parameters and gradients in one flat buffer (consecutive slices of one
 * arena per kind, so consecutive blocks are one contiguous range), reached
 * through named tensors, plus forward/backward functions. This is all the
 * data-parallel strategies (DDP buckets, ZeRO shards and gather units),
 * the optimizer and checkpoints need to know about a model: GPT-2
 * (src/model/gpt2.c) is built this way, and so is any user's model
 * (examples/).
 *
 * Building one: loom_model_init, then loom_block_add_tensor for every
 * tensor of every block (set the block's kind and layer as you like), then
 * loom_model_layout_done. The engine allocates the arenas for its layout
 * (padded for equal shards; no parameter arena under ZeRO-3, no gradient
 * arena under ZeRO-2/3) and initialises or loads the weights.
 *
 * The forward and backward must announce each block to the strategies:
 * loom_model_forward_begin/end around the block's forward use of its
 * parameters, loom_model_backward_begin before the backward first touches a
 * block's parameters or gradients, loom_model_grads_ready once its
 * gradients are complete. Blocks finish the backward in any order; the
 * strategies work per block. Parameter gradients accumulate (+=): the engine
 * zeroes them once per step.
 */
#ifndef LOOM_MODEL_H
#define LOOM_MODEL_H

#include <stddef.h>
#include <stdint.h>

#define LOOM_BLOCK_MAX_TENSORS 16
#define LOOM_TENSOR_NAME_MAX 64
#define LOOM_TENSOR_MAX_DIMS 4

/* A named tensor inside its block's flat buffers. */
struct loom_tensor {
    char name[LOOM_TENSOR_NAME_MAX]; /* e.g. "h.3.attn.c_attn.weight" */
    int ndim;
    int64_t shape[LOOM_TENSOR_MAX_DIMS]; /* entries past ndim are 1 */
    size_t offset;                       /* into the block's params/grads, in elements */
    size_t numel;
    int decay; /* weight decay applies (default: tensors of two or more dimensions) */
};

struct loom_block {
    int kind;  /* the model's own label (GPT-2: enum loom_block_kind) */
    int layer; /* the model's own index (GPT-2: the layer, -1 otherwise) */
    int ntensors;
    struct loom_tensor tensors[LOOM_BLOCK_MAX_TENSORS];
    size_t numel;
    float *params; /* (numel) */
    float *grads;  /* (numel) */
    /* Under mixed precision: the block's stored parameters and gradients in
     * the 16-bit dtype; params/grads above are then float32 working copies
     * that exist while the block is in use (the engine's precision layer). */
    uint16_t *params_lp, *grads_lp;
};

typedef void (*loom_block_hook)(void *ctx, int block);

struct loom_model;

/* A tied token embedding (GPT-2's wte, also its LM head): its gradient's
 * sparse part is a scatter of the embedding output's gradient by token. A
 * data-parallel strategy may gather (tokens, gradient rows) from all ranks
 * and apply the scatter itself, so that the dense part (the head's) can be
 * reduced early. Optional. */
struct loom_tied_embedding {
    int block;             /* the block holding the table at its offset 0 */
    int vocab, width;      /* the table is (vocab, width) */
    size_t max_rows;       /* tokens per micro-batch at most */
    size_t rows;           /* tokens of the last forward */
    const int32_t *tokens; /* (rows) of the last forward */
    const float *dout;     /* (rows, width) gradient at the embedding's output, after the backward */
    int *defer;            /* set to 1: the backward leaves the scatter out */
};
/* The grad_ready event a model with a tied embedding sends as soon as the
 * head's part of the table's gradient is complete. */
#define LOOM_GRAD_READY_TIED_HEAD (-1)

struct loom_model_ops {
    /* Forward of one micro-batch of `rows` examples (`batch` is the model's
     * own description of them); returns the micro-batch's mean loss. */
    float (*forward)(struct loom_model *m, const void *batch, int rows);
    /* Backward of loss_weight x the loss of the last forward. */
    void (*backward)(struct loom_model *m, float loss_weight);
    /* The initial values of block b's parameters, written to
     * m->blocks[b].params; must depend on (seed, b) alone, so every rank
     * computes the same and ZeRO-3 can initialise one block at a time. */
    void (*init_block)(struct loom_model *m, int block, uint64_t seed);
    /* Optional (NULL: none): fills *te and returns 1 when the model has a
     * tied token embedding (see above). */
    int (*tied_embedding)(struct loom_model *m, struct loom_tied_embedding *te);
};

struct loom_model {
    const struct loom_model_ops *ops;
    const char *name;
    int nblocks;
    struct loom_block *blocks;
    size_t num_params;
    float *params, *grads; /* (arena_numel) each, blocks in order; either may be NULL */
    size_t arena_numel;    /* num_params rounded up (zero padding), for equal shards */
    /* The parameters' dtype: 0 float32; 1 bfloat16 or 2 float16 (mixed
     * precision: the arenas are params_lp/grads_lp, float32 exists per block
     * while in use). Set by the engine before it allocates the arenas. */
    int dtype;
    uint16_t *params_lp, *grads_lp;
    /* The strategies' hooks (see the top of this file); ctx is theirs. */
    loom_block_hook pre_forward, post_forward, pre_backward, grad_ready;
    void *hook_ctx;
    void *user; /* the model's own state */
};

/* Starts a model of nblocks empty blocks. */
void loom_model_init(struct loom_model *m, const struct loom_model_ops *ops, const char *name, int nblocks);
/* Appends a tensor to a block; shape has ndim (1..LOOM_TENSOR_MAX_DIMS) sizes. */
struct loom_tensor *loom_block_add_tensor(struct loom_block *b, const char *name, int ndim,
                                          const int64_t *shape);
/* After the last tensor: counts the parameters. */
void loom_model_layout_done(struct loom_model *m);

#define LOOM_MODEL_PARAM_ARENA 1
#define LOOM_MODEL_GRAD_ARENA 2
/* Allocates the arenas asked for (LOOM_MODEL_*_ARENA), zeroed, padded to a
 * multiple of `multiple` elements, in the model's dtype, and points the
 * blocks into them. */
void loom_model_alloc_arenas(struct loom_model *m, size_t multiple, int arenas);
/* Frees the arenas and the blocks (not m itself). */
void loom_model_release(struct loom_model *m);

/* Initial weights of every block (the parameter arena must exist; under
 * mixed precision each block is initialised in float32 and rounded). */
void loom_model_init_weights(struct loom_model *m, uint64_t seed);
void loom_model_zero_grad(struct loom_model *m);
/* The tensor with this name, or NULL; *block_out (if not NULL) gets its block index. */
struct loom_tensor *loom_model_find(struct loom_model *m, const char *name, int *block_out);

/* For forward and backward functions: announce a block to the strategies. */
static inline void loom_model_forward_begin(struct loom_model *m, int b)
{
    if (m->pre_forward) m->pre_forward(m->hook_ctx, b);
}
static inline void loom_model_forward_end(struct loom_model *m, int b)
{
    if (m->post_forward) m->post_forward(m->hook_ctx, b);
}
static inline void loom_model_backward_begin(struct loom_model *m, int b)
{
    if (m->pre_backward) m->pre_backward(m->hook_ctx, b);
}
static inline void loom_model_grads_ready(struct loom_model *m, int b)
{
    if (m->grad_ready) m->grad_ready(m->hook_ctx, b);
}
/* The parameters and gradients of tensor i of block b. */
static inline float *loom_param(const struct loom_block *b, int i)
{
    return b->params + b->tensors[i].offset;
}
static inline float *loom_grad(const struct loom_block *b, int i)
{
    return b->grads + b->tensors[i].offset;
}

#endif
