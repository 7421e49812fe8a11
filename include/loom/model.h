/*
 * A model as the engine sees it: an ordered list of blocks, each with a role
 * (embedding, layer, head) and named tensors in one flat buffer per kind
 * (parameters, gradients: consecutive slices of one arena each, so
 * consecutive blocks are one contiguous range), plus forward and backward
 * over a RANGE of blocks on one micro-batch SLOT. This is all the
 * strategies (DDP buckets, ZeRO shards and gather units, mixed precision),
 * the schedules, the optimizer and checkpoints need to know about a model:
 * GPT-2 (src/model/gpt2.c) is built this way, and so is any user's model
 * (examples/).
 *
 * Building one: loom_model_init, then loom_block_add_tensor for every
 * tensor of every block (set the block's role and layer, and each tensor's
 * init and tp_split as needed), then loom_model_layout_done. The engine
 * allocates the arenas for its layout (padded for equal shards; no
 * parameter arena under ZeRO-3, no gradient arena under ZeRO-2/3) and
 * initialises or loads the weights.
 *
 * Stage-local forward and backward. ops->forward(m, first, last, mb) runs
 * blocks [first, last] for the micro-batch in slot mb->slot: when first is
 * not the model's first block it reads mb->input (the activation a previous
 * pipeline stage sent, boundary_numel floats), and when last is not the
 * last block it writes mb->output for the next stage; a range that ends at
 * the last block computes the loss into mb->loss. ops->backward runs the
 * same range in reverse for the same slot, from mb->doutput (or the loss)
 * to mb->dinput. A model keeps activations for ops->set_slots(m, n) slots,
 * so a schedule may hold n micro-batches in flight (one without pipelining).
 *
 * Announcements: forward and backward announce each block to the model's
 * strategy stack (loom/strategy.h): loom_model_forward_begin/end around the
 * block's forward use of its parameters, loom_model_backward_begin before
 * the backward first touches its parameters or gradients, and
 * loom_model_grads_ready once its gradients are complete. Kernels read the
 * float32 working views loom_param / loom_grad. Parameter gradients
 * accumulate (+=): the engine zeroes them once per step.
 */
#ifndef LOOM_MODEL_H
#define LOOM_MODEL_H

#include <stddef.h>
#include <stdint.h>

#include "loom/strategy.h"
#include "loom/types.h"

#define LOOM_TENSOR_NAME_MAX 64
#define LOOM_TENSOR_MAX_DIMS 4

/* What a block is in the model's order; a pipeline stage holds the
 * embedding when it is first and the head when it is last. */
enum loom_block_role {
    LOOM_ROLE_EMBEDDING = 0, /* tokens in */
    LOOM_ROLE_LAYER = 1,     /* the repeated transformer layer (or a user model's layer) */
    LOOM_ROLE_HEAD = 2,      /* the loss out */
    LOOM_ROLE_COUNT
};

/* How a tensor's initial values are drawn (loom_model_init_block). */
enum loom_init {
    LOOM_INIT_ZERO = 0,
    LOOM_INIT_ONE = 1,
    LOOM_INIT_NORMAL = 2, /* normal(0, init_std), from (seed, block, tensor) */
    LOOM_INIT_COUNT
};

/* A tensor's tensor-parallel split: the dimension divided across the tp
 * group (Megatron's column-parallel: the output dimension; row-parallel:
 * the input), or replicated on every tp rank. The dimension indexes the
 * tensor's view: its shape regrouped (GPT-2's c_attn [C, 3C] as [C, 3, C],
 * so that a rank's q, k and v columns are one box), or the shape itself.
 * Rank r of T holds [r n / T, (r + 1) n / T) of the n entries of that
 * dimension (uneven when T does not divide n). */
#define LOOM_TP_REPLICATED (-1)
#define LOOM_TP_VIEW_MAX_DIMS 4

/* A named tensor inside its block's flat buffers. */
struct loom_tensor {
    char name[LOOM_TENSOR_NAME_MAX]; /* e.g. "h.3.attn.c_attn.weight" */
    int ndim;
    int64_t shape[LOOM_TENSOR_MAX_DIMS]; /* entries past ndim are 1 */
    size_t offset;                       /* into the block's params/grads, in elements */
    size_t numel;
    int decay;           /* weight decay applies (default: tensors of two or more dimensions) */
    enum loom_init init; /* default: LOOM_INIT_NORMAL with init_std 0.02 */
    double init_std;     /* LOOM_INIT_NORMAL's standard deviation */
    /* Tensor parallelism (loom_block_add_tensor_split): shape and numel are
     * this rank's part, the box [tp_lo, tp_hi) of view[tp_split] with every
     * other view dimension whole, in row-major order; full is the whole
     * tensor. Unsplit: tp_split LOOM_TP_REPLICATED, full = shape, view =
     * shape. Initialisation draws the whole tensor's stream and keeps the
     * box, so a rank's part is the slice of the unsplit model's tensor. Set
     * through loom_block_add_tensor_split only (never assigned after). */
    int tp_split;
    int64_t full[LOOM_TENSOR_MAX_DIMS]; /* entries past ndim are 1 */
    int view_ndim;
    int64_t view[LOOM_TP_VIEW_MAX_DIMS];
    int64_t tp_lo, tp_hi;
    /* Its initial values' stream within the block: its place in the block of
     * the whole model (the tensors another expert-parallel rank holds are
     * skipped, loom_block_skip_tensors), so every layout draws the same. */
    int stream;
    /* An expert's tensor (the model sets it once added): held by one rank of
     * the expert-parallel group, its gradient summed over the
     * expert-data-parallel group only. A block's expert tensors are
     * consecutive. */
    int expert;
};

/* Who provides a block's float32 gradient view (loom_block_provide_grads). */
#define LOOM_GRADS_NONE (-1)  /* nobody yet: the backward must not run */
#define LOOM_GRADS_ARENA (-2) /* the model's float32 gradient arena */

struct loom_block {
    enum loom_block_role role;
    int layer; /* the model's own index (GPT-2: the layer; -1 for embedding and head) */
    /* the block's place in the whole model (its position unless the model
     * holds a pipeline stage's blocks only): initialisation draws from it */
    int index;
    int ntensors;
    struct loom_tensor *tensors; /* (ntensors), grown by loom_block_add_tensor* (a mixture of experts' layer
                                  * holds hundreds) */
    int tensors_cap;
    size_t numel;
    size_t offset; /* of the block in the model's arenas */
    /* its expert tensors: elements [expert_lo, expert_hi) of the block (0, 0: none) */
    size_t expert_lo, expert_hi;
    int skipped; /* tensors of the whole model's block this one does not hold (loom_block_skip_tensors) */
    /* The stored parameters and gradients, in the model's dtype: slices of
     * the arenas, a strategy's buffers (ZeRO-3's gathered unit), or absent
     * (.data NULL) while this rank does not hold them. */
    struct loom_buf params, grads;
    /* The float32 views the kernels read and accumulate into, valid from a
     * block's announcement to the end of its use: the stored buffers
     * themselves in float32 training, working copies under mixed precision. */
    float *work_params; /* (numel) */
    float *work_grads;  /* (numel) */
    int grads_owner;    /* the stack index that provided work_grads, LOOM_GRADS_ARENA or LOOM_GRADS_NONE */
};

struct loom_model;
struct loom_backend;

/* One micro-batch in its activation slot, for a range of blocks. */
struct loom_micro {
    int slot;             /* 0 <= slot < the slots set */
    const void *batch;    /* the model's own description of the examples (loom_lm_batch for token models) */
    int rows;             /* examples in it */
    const float *input;   /* (boundary_numel) into the range's first block, unless it is the model's first */
    float *output;        /* (boundary_numel) out of the range's last block, unless it is the model's last */
    const float *doutput; /* backward: the gradient at output (unless the range ends at the last block) */
    float *dinput;        /* backward: receives the gradient at input (unless it starts at the first) */
    double loss;          /* forward of a range ending at the last block: the micro-batch's mean loss */
    int micro, micros;    /* its place in the step: micro-batch micro of micros (0 of 1 outside a step) */
    /* a training step's (the engine's): the step, from 1 (0: not training: no dropout), and the first
     * example's place in the step's global batch, what dropout's masks are keyed by */
    int64_t step;
    int first_row;
    uint64_t seed; /* the run's (a resume's: the checkpoint's) */
};

/* A micro-batch of a token model: rows of T tokens; targets NULL computes
 * logits only. */
struct loom_lm_batch {
    const int32_t *inputs, *targets; /* (rows, T) each */
};

/* A tied token embedding (GPT-2's wte, also its LM head): its gradient's
 * sparse part is a scatter of the embedding output's gradient by token. A
 * data-parallel strategy may gather (tokens, gradient rows) from all ranks
 * and apply the scatter itself, so that the dense part (the head's) can be
 * reduced early. Optional. */
struct loom_tied_embedding {
    int block;             /* the block holding the table at its offset 0 */
    int vocab, width;      /* the table is (vocab, width) */
    size_t max_rows;       /* tokens per micro-batch at most */
    size_t rows;           /* tokens of the last backward */
    const int32_t *tokens; /* (rows) of the last backward */
    const float *dout;     /* (rows, width) gradient at the embedding's output, after the backward */
    int *defer;            /* set to 1: the backward leaves the scatter out */
};
/* The grads_ready event a model with a tied embedding sends as soon as the
 * head's part of the table's gradient is complete. */
#define LOOM_GRAD_READY_TIED_HEAD (-1)

/* A tied token embedding whose table and head are on different pipeline
 * stages (Megatron's embedding group): the embedding's stage trains the
 * table; the head's stage reads a copy of it and writes the copy's
 * gradient, which the embedding's stage adds to the table's. The exchange
 * is a strategy's (src/parallel/tied_stages.h); the model only reads the
 * copy and accumulates into its gradient. */
struct loom_tied_stages {
    int block;      /* the embedding's block (the table at its offset 0), or the head's */
    int holds_head; /* this stage holds the head and the copy */
    /* (n) floats each: on the head's stage the copy and its gradient, which
     * the head's backward accumulates into; on the embedding's stage copy is
     * the buffer the table is sent from and grad the one the copy's gradient
     * is received into */
    float *copy, *grad;
    size_t n; /* this tensor-parallel rank's rows of the table */
};

/* A parameter gradient that each tensor-parallel rank computes in part, from
 * the rows it holds (sequence parallelism's replicated norms): the parts are
 * summed over the group and added to grad, float32 ones (dtype F32) by
 * float addition, the --layout-invariant pieces' float64 ones (F64) exactly
 * and rounded once (the acc_add_rounded kernel). */
struct loom_partial_grad {
    void *part; /* (n) in dtype */
    enum loom_dtype dtype;
    float *grad; /* (n) the block's float32 gradient view */
    size_t n;
};

struct loom_model_ops {
    /* Forward and backward of blocks [first, last] for micro-batch mb (see
     * the top of this file). The backward back-propagates loss_weight x the
     * micro-batch's mean loss. */
    void (*forward)(struct loom_model *m, int first, int last, struct loom_micro *mb);
    void (*backward)(struct loom_model *m, int first, int last, struct loom_micro *mb, float loss_weight);
    /* Optional (NULL: one slot only; the engine refuses a schedule that
     * keeps more in flight). Activations for n micro-batches in
     * flight; before the first forward. */
    void (*set_slots)(struct loom_model *m, int n);
    /* Optional (NULL: no pipelining; the engine refuses a pipelined layout
     * without it). Floats of the activation between two
     * consecutive blocks, for `rows` examples. */
    size_t (*boundary_numel)(const struct loom_model *m, int rows);
    /* Optional (NULL: each tensor's init field, loom_model_init_block). The
     * initial values of block b's parameters, written to its work_params
     * (float32, host memory for this call); must depend on (seed, b) alone, so every rank computes the
     * same and ZeRO-3 can initialise one block at a time. */
    void (*init_block)(struct loom_model *m, int block, uint64_t seed);
    /* Optional (NULL: none): fills *te and returns 1 when the model has a
     * tied token embedding (see above). */
    int (*tied_embedding)(struct loom_model *m, struct loom_tied_embedding *te);
    /* Optional (NULL: none): fills *t and returns 1 when this stage holds one
     * end of a tied table across pipeline stages (see above). */
    int (*tied_stages)(struct loom_model *m, struct loom_tied_stages *t);
    /* Optional (NULL: none): the partial gradients the backward wrote since
     * the last call (see above), *out pointing at the model's list of them
     * until the next backward; the count. Their strategy sums them at each
     * block's grads_ready. */
    int (*partial_grads)(struct loom_model *m, const struct loom_partial_grad **out);
    /* Optional (NULL: none): the logits of slot 0's last forward, (rows, T, V). */
    const float *(*logits)(struct loom_model *m);
    /* Optional (NULL: allocated by the first forward). Allocates the
     * activations of every slot now, after set_slots: a layout that does
     * not fit fails at set-up, and a footprint counts them (the allocator's
     * counting mode, base/mem.h). */
    void (*reserve)(struct loom_model *m);
};

struct loom_model {
    const struct loom_model_ops *ops;
    const char *name; /* the family's name ("gpt2"), or a user model's */
    int nblocks;
    struct loom_block *blocks;
    size_t num_params;
    size_t arena_numel; /* num_params rounded up (zero padding), for equal shards */
    /* The parameters' storage dtype: F32, or BF16/F16 under mixed precision
     * (then kernels compute on float32 working copies). Set by the engine
     * before it allocates the arenas. */
    enum loom_dtype dtype;
    struct loom_buf params, grads; /* (arena_numel) each in dtype, blocks in order; .data NULL when absent */
    /* Mixed precision with gradient accumulation: the float32 sum of the
     * step's micro-batches, rounded into grads once per step; else absent. */
    struct loom_buf grad_acc;
    struct loom_strategy_stack stack; /* the strategies around the blocks, see loom/strategy.h */
    /* The kernels and allocator the model and its strategies use
     * (src/kernels/backend.h): loom_model_init sets the CPU's. */
    const struct loom_backend *backend;
    /* The model family that built it (src/model/family.h), or NULL for a
     * user's model: found by this pointer, never by name. */
    const void *family;
    /* The tensor-parallel group its split tensors are parts over (1 and 0
     * unless the model was built for one). */
    int tp, tp_rank;
    /* fp8 linear layers (--fp8-format): their scales and amax histories
     * (src/layers/fp8_linear.h), kept by the model family, stepped by the
     * engine after each optimizer step; NULL without fp8 */
    struct loom_fp8 *fp8;
    void *user; /* the model's own state */
};

/* Starts a model of nblocks empty blocks (role LAYER). */
void loom_model_init(struct loom_model *m, const struct loom_model_ops *ops, const char *name, int nblocks);
/* Appends a tensor to a block; shape has ndim (1..LOOM_TENSOR_MAX_DIMS) sizes. */
struct loom_tensor *loom_block_add_tensor(struct loom_block *b, const char *name, int ndim,
                                          const int64_t *shape);
/* Appends rank tp_rank's part of a tensor split over a tp group of tp
 * ranks: full (ndim sizes) is the whole tensor, view (view_ndim sizes, a
 * regrouping of full: consecutive view dimensions multiply to each full
 * one; NULL: full itself) the dims dimension split of which is divided.
 * split LOOM_TP_REPLICATED (or tp 1): the whole tensor on every rank. */
struct loom_tensor *loom_block_add_tensor_split(struct loom_block *b, const char *name, int ndim,
                                                const int64_t *full, int view_ndim, const int64_t *view,
                                                int split, int tp, int tp_rank);
/* The tensors of the whole model's block that this one leaves out (another
 * expert-parallel rank's experts) before the next one added: its stream
 * counts them. */
void loom_block_skip_tensors(struct loom_block *b, int n);
/* Rank r's part [lo, hi) of n entries split over tp ranks (defined with
 * the tensor-parallel regions, src/layers/tp_regions.c). */
void loom_tp_part(int64_t n, int tp, int r, int64_t *lo, int64_t *hi);
/* The whole model's parameter count, from its tensors' full shapes: the same
 * as num_params unless the model holds a tensor-parallel rank's part. */
double loom_model_full_params(const struct loom_model *m);
/* The part (t->numel floats) t holds of its whole tensor full (row-major,
 * the product of t->full floats): the whole of it unless t is split. */
void loom_tensor_take_part(const struct loom_tensor *t, const float *full, float *part);
/* After the last tensor: counts the parameters and places the blocks (and
 * each block's run of expert tensors, t->expert set by the model). */
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
/* Block b's initial float32 values into `out` (numel, on the model's
 * backend): the model's init_block, or each tensor's init field, drawn in
 * host memory and uploaded. */
void loom_model_init_block(struct loom_model *m, int block, uint64_t seed, float *out);
void loom_model_zero_grad(struct loom_model *m);
/* The tensor with this name, or NULL; *block_out (if not NULL) gets its block index. */
struct loom_tensor *loom_model_find(struct loom_model *m, const char *name, int *block_out);
/* The first block with this role, or -1. */
int loom_model_find_role(const struct loom_model *m, enum loom_block_role role);

/* The stack (loom/strategy.h): push in stack order. */
void loom_model_push_strategy(struct loom_model *m, const struct loom_strategy *s, void *ctx);
/* A block's stored buffers (the model's dtype) now at `params` / `grads`
 * (NULL: not held): in float32 the kernels' views follow them. */
void loom_block_hold_params(struct loom_model *m, int block, void *params);
void loom_block_hold_grads(struct loom_model *m, int block, void *grads);
/* Strategy `owner` (its stack index) provides the block's float32 gradient
 * view for this backward (NULL with LOOM_GRADS_NONE takes it back). */
void loom_block_provide_grads(struct loom_model *m, int block, float *grads, int owner);
/* The stack index of a strategy context on m's stack, or -1. */
int loom_model_strategy_index(const struct loom_model *m, const void *ctx);

/* Forward of every block on one micro-batch in slot 0, outside any step:
 * returns the mean loss (0 when the batch has no targets). The strategies'
 * announcements still run (ZeRO-3 gathers); what a strategy keeps for the
 * step (a tied embedding's gathered unit, its float32 copy) stays held until
 * the next step ends or the engine is freed. */
float loom_model_eval(struct loom_model *m, const void *batch, int rows);
/* The logits of the last loom_model_eval, (rows, T, V), or NULL when the
 * model has none: on the model's backend (its download reads them). */
const float *loom_model_logits(struct loom_model *m);

/* For forward and backward functions: announce a block to the stack. */
void loom_model_forward_begin(struct loom_model *m, int b);
void loom_model_forward_end(struct loom_model *m, int b);
void loom_model_backward_begin(struct loom_model *m, int b);
void loom_model_grads_ready(struct loom_model *m, int b);

/* The float32 parameters and gradients of tensor i of block b. */
static inline float *loom_param(const struct loom_block *b, int i)
{
    return b->work_params + b->tensors[i].offset;
}
static inline float *loom_grad(const struct loom_block *b, int i)
{
    return b->work_grads + b->tensors[i].offset;
}

#endif
