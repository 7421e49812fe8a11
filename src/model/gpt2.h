/*
 * GPT-2 as an ordered list of blocks: the embedding block (wte, wpe), L
 * transformer layers, and the head block (final LayerNorm; the LM head is
 * tied to wte, which the embedding block owns). Each block owns its
 * parameters and gradients in one flat buffer each (consecutive slices of
 * one arena, so consecutive blocks are one contiguous range), reached through named
 * tensors with Hugging Face GPT-2 names: the unit that ZeRO-3 gathers and
 * pipeline parallelism places.
 *
 * Matmul weights are stored [in, out] as Hugging Face's Conv1D stores them.
 * The vocabulary is not padded. Not here: the optimizer, data, parallelism.
 */
#ifndef LOOM_MODEL_GPT2_H
#define LOOM_MODEL_GPT2_H

#include <stddef.h>
#include <stdint.h>

#define LOOM_BLOCK_MAX_TENSORS 12
#define LOOM_TENSOR_NAME_MAX 48

struct loom_gpt2_config {
    int num_layers;  /* L */
    int hidden;      /* C */
    int heads;       /* NH */
    int max_pos;     /* maxT, rows of wpe */
    int vocab;       /* V */
};

enum loom_block_kind {
    LOOM_BLOCK_EMBEDDING = 0,
    LOOM_BLOCK_LAYER = 1,
    LOOM_BLOCK_HEAD = 2,
    LOOM_BLOCK_KIND_COUNT
};

/* A named tensor inside its block's flat buffers. */
struct loom_tensor {
    char name[LOOM_TENSOR_NAME_MAX]; /* e.g. "h.3.attn.c_attn.weight" */
    int ndim;
    int64_t shape[2];
    size_t offset; /* into the block's params/grads, in elements */
    size_t numel;
    int decay; /* weight decay applies: tensors of two or more dimensions */
};

struct loom_block {
    enum loom_block_kind kind;
    int layer; /* layer index for LOOM_BLOCK_LAYER, -1 otherwise */
    int ntensors;
    struct loom_tensor tensors[LOOM_BLOCK_MAX_TENSORS];
    size_t numel;
    float *params; /* (numel) */
    float *grads;  /* (numel) */
};

/* Saved forward state of one transformer layer, for B sequences of T. */
struct loom_layer_acts {
    float *ln1, *ln1_mean, *ln1_rstd; /* (B,T,C) (B,T) (B,T) */
    float *qkv;                       /* (B,T,3C) */
    float *atty;                      /* (B,T,C) attention output, heads concatenated */
    float *att;                       /* (B,NH,T,T) */
    float *res2;                      /* (B,T,C) residual after attention */
    float *ln2, *ln2_mean, *ln2_rstd; /* (B,T,C) (B,T) (B,T) */
    float *fch, *fch_gelu;            /* (B,T,4C) */
    float *res3;                      /* (B,T,C) residual after MLP: the layer's output */
};

/* Called in backward as soon as a block's gradients are complete (blocks
 * finish in reverse order): the hook data-parallel strategies start their
 * reduction from. One more event, LOOM_GRAD_READY_WTE_HEAD, comes right
 * after the LM head's backward: with defer_wte_scatter set, wte's gradient is
 * then final but for the token-embedding scatter, which the backward leaves
 * out (the hook's owner applies it from dres and inputs later). */
typedef void (*loom_block_hook)(void *ctx, int block);
#define LOOM_GRAD_READY_WTE_HEAD (-1)

struct loom_gpt2 {
    struct loom_gpt2_config cfg;
    int B, T; /* activation capacity: micro-batch rows and sequence length */
    int nblocks; /* L + 2: [embedding, layers..., head] */
    struct loom_block *blocks;
    size_t num_params;
    float *params, *grads; /* (arena_numel) each: the blocks' buffers, in block order; either may be NULL */
    size_t arena_numel;    /* num_params rounded up (zero padding), for equal shards */

    /* activations */
    struct loom_layer_acts *layers; /* (L) */
    float *encoded;                  /* (B,T,C) */
    float *lnf, *lnf_mean, *lnf_rstd; /* (B,T,C) (B,T) (B,T) */
    float *logits;                   /* (B,T,V); holds dlogits after backward */
    float *losses, *lse;             /* (B,T) */
    const int32_t *inputs, *targets; /* of the last forward, (B,T) each */
    int fwd_B;                       /* rows in the last forward */
    /* backward scratch */
    float *dres;  /* (B,T,C) gradient of the residual stream */
    float *dbufC; /* (B,T,C) */
    float *dqkv;  /* (B,T,3C) */
    float *datt;  /* (B,NH,T,T) */
    float *dbuf4a, *dbuf4b; /* (B,T,4C) */
    float *scratchC; /* (B,T,C) forward scratch for projections */

    loom_block_hook grad_ready;
    /* Called before the backward first uses a block (block 0, which owns the
     * tied wte, comes first): where a strategy that keeps no gradient arena
     * points the block's grads at a zeroed buffer, and ZeRO-3 makes sure the
     * block's parameters are gathered. */
    loom_block_hook pre_backward;
    /* Called around each block's forward (the LM head's use of wte comes
     * after post_forward(0): a strategy keeps block 0 for the whole step). */
    loom_block_hook pre_forward, post_forward;
    void *grad_ready_ctx; /* the context of all four hooks */
    int defer_wte_scatter; /* leave the dwte scatter out of this backward */
};

/* Checks the shape settings; LOOM_ERR_INPUT naming what is wrong. */
int loom_gpt2_config_check(const struct loom_gpt2_config *cfg, int T);

/* Allocates parameters, gradients and activations for micro-batches of up
 * to B sequences of T tokens. Weights are zero until initialised or loaded. */
struct loom_gpt2 *loom_gpt2_create(const struct loom_gpt2_config *cfg, int B, int T);
/* The same with the arenas padded to a multiple of `multiple` elements, so a
 * data-parallel group can split them into equal shards, and only the arenas
 * asked for: a strategy that provides the blocks' gradient buffers through
 * pre_backward (ZeRO-2) needs no gradient arena, one that gathers their
 * parameters (ZeRO-3) no parameter arena. */
#define LOOM_GPT2_PARAM_ARENA 1
#define LOOM_GPT2_GRAD_ARENA 2
struct loom_gpt2 *loom_gpt2_create_padded(const struct loom_gpt2_config *cfg, int B, int T, size_t multiple,
                                          int arenas);
void loom_gpt2_free(struct loom_gpt2 *m);

/* GPT-2 initialisation: weights normal(0, 0.02), residual output projections
 * (attn.c_proj, mlp.c_proj) normal(0, 0.02/sqrt(2L)), biases 0, LayerNorm
 * gains 1. Each tensor draws from its own stream seeded from (seed, block,
 * tensor), so a block's initial weights do not depend on any other's. */
void loom_gpt2_init_weights(struct loom_gpt2 *m, uint64_t seed);
/* The same for one block, whose params must point at its buffer. */
void loom_gpt2_init_block(struct loom_gpt2 *m, int block, uint64_t seed);

/* Forward over B <= m->B rows of m->T tokens. With targets, returns the mean
 * loss over the B*T positions; without (NULL), computes logits only and
 * returns 0. */
float loom_gpt2_forward(struct loom_gpt2 *m, const int32_t *inputs, const int32_t *targets, int B);

/* Backward of loss_weight x (the mean loss of the last forward). Parameter
 * gradients accumulate, so micro-batches add up; the caller zeroes them. */
void loom_gpt2_backward(struct loom_gpt2 *m, float loss_weight);
void loom_gpt2_zero_grad(struct loom_gpt2 *m);

/* The tensor with this Hugging Face name, or NULL; *block_out gets its block. */
struct loom_tensor *loom_gpt2_find(struct loom_gpt2 *m, const char *name, struct loom_block **block_out);

/* FLOPs per token of one training step (forward + backward): 6N + 12 L T C. */
double loom_gpt2_flops_per_token(const struct loom_gpt2 *m);

#endif
