/*
 * GPT-2 as a loom_model (loom/model.h): the embedding block (wte, wpe), L
 * transformer layers, and the head block (final LayerNorm; the LM head is
 * tied to wte, which the embedding block owns, and offered to data-parallel
 * strategies as a loom_tied_embedding). Tensors carry Hugging Face GPT-2
 * names.
 *
 * Matmul weights are stored [in, out] as Hugging Face's Conv1D stores them.
 * The vocabulary is not padded. Not here: the optimizer, data, parallelism.
 */
#ifndef LOOM_MODEL_GPT2_H
#define LOOM_MODEL_GPT2_H

#include <stddef.h>
#include <stdint.h>

#include "loom/model.h"

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

struct loom_gpt2 {
    struct loom_model base; /* L + 2 blocks: [embedding, layers..., head]; base.user is this */
    struct loom_gpt2_config cfg;
    int B, T; /* activation capacity: micro-batch rows and sequence length */

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

    int defer_wte_scatter; /* leave the dwte scatter out of this backward (loom_tied_embedding) */
};

/* Checks the shape settings; LOOM_ERR_INPUT naming what is wrong. */
int loom_gpt2_config_check(const struct loom_gpt2_config *cfg, int T);

/* Allocates parameters, gradients and activations for micro-batches of up
 * to B sequences of T tokens. Weights are zero until initialised or loaded. */
struct loom_gpt2 *loom_gpt2_create(const struct loom_gpt2_config *cfg, int B, int T);
/* The same with the arenas padded to a multiple of `multiple` elements, so a
 * data-parallel group can split them into equal shards, and only the arenas
 * asked for (LOOM_MODEL_PARAM_ARENA, LOOM_MODEL_GRAD_ARENA; 0 leaves them to
 * the engine): a strategy that provides the blocks' gradient buffers through
 * pre_backward (ZeRO-2) needs no gradient arena, one that gathers their
 * parameters (ZeRO-3) no parameter arena. */
struct loom_gpt2 *loom_gpt2_create_padded(const struct loom_gpt2_config *cfg, int B, int T, size_t multiple,
                                          int arenas);
void loom_gpt2_free(struct loom_gpt2 *m);

/* GPT-2 initialisation (the model's init_block): weights normal(0, 0.02),
 * residual output projections (attn.c_proj, mlp.c_proj) normal(0,
 * 0.02/sqrt(2L)), biases 0, LayerNorm gains 1. Each tensor draws from its own
 * stream seeded from (seed, block, tensor), so a block's initial weights do
 * not depend on any other's. loom_model_init_weights(&m->base, seed) runs it
 * over every block. */

/* The GPT-2 behind a loom_model built by loom_gpt2_create. */
struct loom_gpt2 *loom_gpt2_of(struct loom_model *m);

/* A micro-batch for the model's forward (loom_model_ops.forward): rows of T
 * tokens; targets NULL computes logits only. */
struct loom_gpt2_batch {
    const int32_t *inputs, *targets; /* (rows, T) each */
};

/* Forward over B <= m->B rows of m->T tokens. With targets, returns the mean
 * loss over the B*T positions; without (NULL), computes logits only and
 * returns 0. */
float loom_gpt2_forward(struct loom_gpt2 *m, const int32_t *inputs, const int32_t *targets, int B);

/* Backward of loss_weight x (the mean loss of the last forward). Parameter
 * gradients accumulate, so micro-batches add up; the caller zeroes them. */
void loom_gpt2_backward(struct loom_gpt2 *m, float loss_weight);

/* FLOPs per token of one training step (forward + backward): 6N + 12 L T C. */
double loom_gpt2_flops_per_token(const struct loom_gpt2 *m);

#endif
