/*
 * GPT-2 as a loom_model (loom/model.h): the embedding block (wte, wpe), L
 * transformer layers, and the head block (final LayerNorm; the LM head is
 * tied to wte, which the embedding block owns, and offered to data-parallel
 * strategies as a loom_tied_embedding, or with `untied` a weight of its own,
 * lm_head.weight). Tensors carry Hugging Face GPT-2 names. The numerics
 * Hugging Face's configs carry are settings: LayerNorm's eps, the MLP's
 * GELU (tanh or exact).
 *
 * Matmul weights are stored [in, out] as Hugging Face's Conv1D stores them.
 * The vocabulary is not padded. Activations can be recomputed in the
 * backward instead of kept (Megatron's selective and full recomputation),
 * and kept in a 16-bit dtype (act_dtype: half the bytes; the kernels
 * compute in float32 on staging buffers). A model
 * built for a tensor-parallel group (loom_gpt2_create_tp) holds and
 * computes its rank's part of every layer, Megatron's way, with sequence
 * parallelism as an option; the communication is layers/tp_regions.h's.
 * Not here: the optimizer, data, data parallelism.
 */
#ifndef LOOM_MODEL_GPT2_H
#define LOOM_MODEL_GPT2_H

#include <stddef.h>
#include <stdint.h>

#include "base/dtype.h"
#include "layers/pp_stages.h"
#include "layers/tp_exact.h"
#include "layers/tp_regions.h"
#include "loom/config.h" /* enum loom_recompute, enum loom_recompute_method */
#include "loom/model.h"

struct loom_kernels;

#define LOOM_GPT2_NORM_EPS 1e-5 /* GPT-2's LayerNorm eps */
#define LOOM_GPT2_HEAD_ROWS 32  /* rows of logits staged in float32 at a time, 16-bit act_dtype */

struct loom_gpt2_config {
    int num_layers;                  /* L */
    int hidden;                      /* C */
    int heads;                       /* NH */
    int max_pos;                     /* maxT, rows of wpe */
    int vocab;                       /* V */
    double norm_eps;                 /* LayerNorm's eps (GPT-2: 1e-5; the kernel adds it in float) */
    enum loom_activation activation; /* the MLP's: GELU tanh (GPT-2's) or exact */
    int untied;                      /* the LM head has its own weight (lm_head.weight), not wte */
};

/* Saved forward state of one transformer layer, for B sequences of T. A
 * recomputed layer has none of its own: its pointers lead into the shared
 * recompute scratch, except res3 when it is a kept input. Sizes are one
 * process's; under tensor parallelism C, 3C, 4C and NH below are this
 * rank's C/tp, 3C/tp, 4C/tp and NH/tp where the layer is split (qkv, atty,
 * att, fch), and under sequence parallelism the rows of the residual stream
 * and the norms (ln*, res*) are B*T/tp. The `void *` activations are
 * float32, or with a 16-bit act_dtype its bits (uint16_t); the norms'
 * statistics are float32. */
struct loom_layer_acts {
    void *ln1;                  /* (B,T,C) */
    float *ln1_mean, *ln1_rstd; /* (B,T) (B,T) */
    void *qkv;                  /* (B,T,3C) */
    void *atty;                 /* (B,T,C) attention output, heads concatenated */
    float *att;                 /* (B,NH,T,T) probabilities, float32; shared under selective
                                 * recomputation; none with a 16-bit act_dtype (recomputed) */
    void *res2;                 /* (B,T,C) residual after attention */
    void *ln2;                  /* (B,T,C) */
    float *ln2_mean, *ln2_rstd; /* (B,T) (B,T) */
    void *fch, *fch_gelu;       /* (B,T,4C) */
    void *res3;                 /* (B,T,C) residual after MLP: the layer's output */
};

/* The activations of one micro-batch slot: what its forward saved for its
 * backward. */
struct loom_gpt2_acts {
    struct loom_layer_acts *layers;   /* (L) */
    struct loom_layer_acts *scratch;  /* (N under uniform, else 1) full recomputation's scratch: a chunk */
    void *encoded;                    /* (B,T,C) the embedding's output, in act_dtype */
    float *lnf, *lnf_mean, *lnf_rstd; /* (B,T,C) (B,T) (B,T), float32 */
    void *logits;        /* (B,T,V) in act_dtype; holds dlogits after backward; holds the recompute scratch */
    size_t logits_bytes; /* its buffer: B*T*V values, or the recompute scratch if larger */
    float *losses, *lse; /* (B,T) */
    const int32_t *inputs, *targets; /* of the last forward, (B,T) each */
    int rows;                        /* B of the last forward */
    int emb_open; /* the head's backward announced the embedding's gradients; its own backward closes them */
    /* (L) the input of a pipeline model chunk that starts at layer l > 0 (the
     * previous stage's output), else NULL */
    float **chunk_input;
};

struct loom_gpt2 {
    struct loom_model base; /* L + 2 blocks: [embedding, layers..., head]; base.user is this */
    struct loom_gpt2_config cfg;
    int B, T; /* activation capacity: micro-batch rows and sequence length */
    /* set before the first forward, which allocates the activations */
    enum loom_dtype act_dtype;     /* F32 (default); BF16, F16: activations kept in it, kernels in fp32 */
    enum loom_recompute recompute; /* this and the next two: loom_gpt2_set_recompute */
    enum loom_recompute_method recompute_method;
    int recompute_num_layers; /* N */

    /* tensor parallelism: this rank's part of the tp group of tp ranks */
    int tp, tp_rank;
    int Cl, NHl;     /* hidden / tp channels and heads / tp heads of attention and MLP (x4) */
    int v0, Vl;      /* vocabulary rows [v0, v0 + Vl) of wte and the LM head */
    float *ce_stats; /* (3, B*T) the vocab-parallel cross-entropy's row statistics, tp > 1 only */
    /* sequence parallelism (set before the first forward): between the
     * tensor-parallel regions this rank holds rows [r N/tp, (r+1) N/tp) of
     * the N = B*T rows (the residual stream, the norms' inputs and outputs) */
    struct loom_tp_regions rg; /* the regions' entries and exits, rows of C (layers/tp_regions.h) */
    float *norm_grads;         /* (2C) one norm's weight and bias gradient before the tp sum; sp only */
    /* --layout-invariant: the split sums in fixed pieces (layers/tp_exact.h); pieces 0: off */
    struct loom_tp_exact exact;

    const struct loom_kernels *k; /* the backend's kernels (kernels/backend.h): the CPU's */
    int nslots;                   /* micro-batches in flight (loom_model_ops.set_slots; default 1) */
    struct loom_gpt2_acts *slots; /* (nslots), allocated by the first forward */
    int emb, head;                /* the embedding's and the head's block */
    /* backward scratch, shared by the slots (one backward runs at a time) */
    float *dres;            /* (B,T,C) gradient of the residual stream */
    float *dbufC;           /* (B,T,C) */
    float *dqkv;            /* (B,T,3C) */
    float *datt;            /* (B,NH,T,T) */
    float *dbuf4a, *dbuf4b; /* (B,T,4C) */
    float *scratchC;        /* (B,T,C) forward scratch for projections */
    /* with a 16-bit act_dtype: float32 staging for what the kernels read
     * and write (with the backward scratch above, which the forward borrows) */
    float *stage_res; /* (B,T,C) a residual sum */
    float *seq_att;   /* (NH,T,T) one sequence's attention probabilities (datt: one sequence's too) */
    float *head_rows; /* (LOOM_GPT2_HEAD_ROWS, V) rows of logits */
    int bwd_slot;     /* the slot of the last backward */

    int defer_wte_scatter; /* leave the dwte scatter out of this backward (loom_tied_embedding) */

    /* pipeline parallelism (loom_gpt2_create_stage): the layers this model
     * holds, in model chunks of consecutive layers */
    struct loom_pp_stage_layers stage; /* the layers held and their chunks (layers/pp_stages.h) */
    int pipelined;                     /* pp > 1: a tied table and its LM head may be on different stages */
    /* a tied LM head on another stage than the embedding (layers/pp_stages.h):
     * on the last stage, the copy of the table (Vl, C) the head reads and its
     * gradient; on the first stage, one buffer for both: the table's send
     * buffer, then the received gradient; else NULL */
    float *tied_copy, *tied_grad;
    float *
        *tied_sends; /* --layout-invariant: the head's stage's copy of each micro-batch's share (reserve) */
    struct loom_sparse_layout
        *sparse; /* block-sparse attention's layout (all heads), or NULL: dense causal */
};

/* The model's settings as files record them (the GPT-2 family's shape,
 * model/family.h), and back; absent numerics take GPT-2's. In
 * gpt2_family.c. */
struct loom_model_shape;
void loom_gpt2_shape(const struct loom_gpt2_config *cfg, struct loom_model_shape *out);
int loom_gpt2_config_of_shape(const struct loom_model_shape *shape, struct loom_gpt2_config *out);

/* Block-sparse attention with the layout of sc (kernels/sparse_layout.h),
 * before the first forward; a layout that allows every causal pair keeps
 * the dense kernels. LOOM_ERR_INPUT from the layout's checks. */
struct loom_sparse_config;
int loom_gpt2_set_sparse(struct loom_gpt2 *m, const struct loom_sparse_config *sc);

/* fp8 products in the layers' four linear layers (layers/fp8_linear.h). */
struct loom_fp8_recipe;
void loom_gpt2_set_fp8(struct loom_gpt2 *m, const struct loom_fp8_recipe *r);

/* Checks the shape settings; LOOM_ERR_INPUT naming what is wrong. */
int loom_gpt2_config_check(const struct loom_gpt2_config *cfg, int T);

/* A model for micro-batches of up to B sequences of T tokens, described
 * (blocks and tensors); the caller allocates its arenas
 * (loom_model_alloc_arenas; the engine does it for the layout). The
 * activations are allocated by the first forward, once the recompute
 * settings are known. Weights are zero until initialised or loaded. */
struct loom_gpt2 *loom_gpt2_create(const struct loom_gpt2_config *cfg, int B, int T);
/* The same as rank tp_rank of a tensor-parallel group of tp (Megatron's
 * layout: column-parallel c_attn and c_fc, row-parallel c_proj,
 * vocab-parallel wte and LM head; layers use layers/tp_regions.h). hidden and
 * heads must divide by tp; the vocabulary splits unevenly when it does not. */
struct loom_gpt2 *loom_gpt2_create_tp(const struct loom_gpt2_config *cfg, int B, int T, int tp, int tp_rank);
/* One pipeline stage of it (of pp > 1 stages): the layers lo[c]..hi[c] of
 * each of its `chunks` model chunks (increasing), the embedding when
 * `embedding` (its first chunk starts the model) and the final norm and LM
 * head when `head`. Blocks keep their index in the whole model (loom_block
 * .index), so initialisation draws the whole model's values. */
/* The whole model's parameter count. */
double loom_gpt2_num_params(const struct loom_gpt2_config *cfg);
struct loom_gpt2 *loom_gpt2_create_stage(const struct loom_gpt2_config *cfg, int B, int T, int tp,
                                         int tp_rank, int chunks, const int *lo, const int *hi, int embedding,
                                         int head);
void loom_gpt2_free(struct loom_gpt2 *m);

/* Megatron's sequence parallelism on a tensor-parallel model (tp > 1, T
 * divisible by tp): before the first forward. */
void loom_gpt2_set_sequence_parallel(struct loom_gpt2 *m, int on);
/* --layout-invariant pieces (before the first forward; a multiple of tp dividing
 * the heads): every sum tensor parallelism splits taken in those pieces. */
void loom_gpt2_set_tp_invariant(struct loom_gpt2 *m, int pieces);

/* Recomputation (Megatron's): granularity NONE and SELECTIVE take method
 * NONE and num_layers 0; FULL takes UNIFORM or BLOCK with 1 <= num_layers
 * <= L (the configuration checks this for users; anything else here is a
 * bug). Before the first forward. Losses and
 * gradients are bit for bit those without recomputation: the same kernels
 * run on the same inputs in the same order. */
void loom_gpt2_set_recompute(struct loom_gpt2 *m, enum loom_recompute granularity,
                             enum loom_recompute_method method, int num_layers);

/* GPT-2 initialisation, set per tensor (loom_tensor.init): weights
 * normal(0, 0.02), residual output projections (attn.c_proj, mlp.c_proj)
 * normal(0, 0.02/sqrt(2L)), biases 0, LayerNorm gains 1. Each tensor draws
 * from its own stream seeded from (seed, block, tensor), so a block's
 * initial weights do not depend on any other's. */

/* The GPT-2 behind a loom_model built by loom_gpt2_create. */
struct loom_gpt2 *loom_gpt2_of(struct loom_model *m);

/* The model's batches are struct loom_lm_batch (loom/model.h).
 *
 * Forward of every block over B <= m->B rows of m->T tokens, in slot 0. With targets, returns the mean
 * loss over the B*T positions; without (NULL), computes logits only and
 * returns 0. With act_dtype BF16 or F16, every activation a kernel writes is
 * rounded to that dtype right after the kernel and kept in it (the backward
 * rounds every activation gradient too; parameter gradients stay fp32). */
float loom_gpt2_forward(struct loom_gpt2 *m, const int32_t *inputs, const int32_t *targets, int B);

/* The logits of the last forward, (B, T, this rank's vocabulary), as
 * float32 into dst (before the backward turns them into their gradient). */
void loom_gpt2_logits(const struct loom_gpt2 *m, float *dst);

/* Backward of loss_weight x (the mean loss of the last forward). Parameter
 * gradients accumulate, so micro-batches add up; the caller zeroes them. */
void loom_gpt2_backward(struct loom_gpt2 *m, float loss_weight);

/* FLOPs per token of one training step (forward + backward): 6N + 12 L T C. */
double loom_gpt2_flops_per_token(const struct loom_gpt2 *m);

#endif
