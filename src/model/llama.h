/*
 * Llama as a loom_model (loom/model.h), Hugging Face's LlamaForCausalLM:
 * the embedding block (model.embed_tokens), L decoder layers (RMSNorm,
 * grouped-query attention with rotary position embedding, RMSNorm, SwiGLU
 * MLP; no biases), and the head block (model.norm, and lm_head.weight when
 * untied; tied, the head reads embed_tokens). Tensors carry Hugging Face's
 * names and layout: a projection's weight is [out, in], as nn.Linear keeps
 * it, so every product is the LM head's kernel (inp @ W^T).
 *
 * Attention: q, k and v are projected, q and k rotated (the rotary angles
 * of Hugging Face's rotate_half convention), and each of the G key/value
 * heads serves NH/G query heads (G = 1: multi-query); the attention kernel
 * runs on a packed (q | k | v) with the key/value heads repeated, and the
 * backward sums the repeated heads' gradients back.
 *
 * Forward and backward run over a range of blocks for one micro-batch slot,
 * as GPT-2's do; under 16-bit training every activation and activation
 * gradient a kernel writes is rounded to the dtype (the buffers stay
 * float32), as GPT-2's are; activations can be recomputed (Megatron's
 * selective and full); a model may hold one pipeline stage's blocks, as
 * GPT-2's does, and a tensor-parallel rank's part of every layer (Megatron's
 * splits, layers/tp_regions.h), with Megatron's sequence parallelism: the
 * residual stream and the norms between the parallel regions hold B*T/tp
 * rows of the sequence, gathered at a region's entry and reduce-scattered
 * at its exit (loom_llama_set_sequence_parallel). Not here: loading weights (llama_family.c).
 */
#ifndef LOOM_MODEL_LLAMA_H
#define LOOM_MODEL_LLAMA_H

#include <stddef.h>
#include <stdint.h>

#include "base/dtype.h"
#include "layers/pp_stages.h"
#include "layers/tp_exact.h"
#include "layers/tp_regions.h"
#include "loom/config.h" /* enum loom_recompute, enum loom_recompute_method */
#include "loom/model.h"

struct loom_kernels;

struct loom_llama_config {
    int num_layers;    /* L */
    int hidden;        /* C */
    int heads;         /* NH; head size C / NH */
    int kv_heads;      /* G: key/value heads, dividing NH (Megatron's --num-query-groups) */
    int ffn;           /* F: the MLP's intermediate size */
    int max_pos;       /* the longest sequence */
    int vocab;         /* V */
    double norm_eps;   /* RMSNorm's eps */
    double rope_theta; /* the rotary base */
    int untied;        /* lm_head.weight of its own */
};

/* One layer's saved forward state for B sequences of T (N = B T rows). */
struct loom_llama_layer_acts {
    float *ln1, *rstd1; /* (N,C) (N) */
    float *qkv;         /* (N, 3C) q and k rotated, the key/value heads repeated to NH */
    float *att;         /* (B,NH,T,T) */
    float *atty;        /* (N,C) */
    float *res2;        /* (N,C) */
    float *ln2, *rstd2; /* (N,C) (N) */
    float *gate, *up;   /* (N,F) */
    float *h;           /* (N,F) silu(gate) * up */
    float *res3;        /* (N,C) the layer's output */
};

struct loom_llama_acts {
    struct loom_llama_layer_acts *layers;  /* (L); a recomputed layer's lead into the scratch */
    struct loom_llama_layer_acts *scratch; /* full recomputation: one chunk of layers' buffers */
    float *shared_att;                     /* selective recomputation: every layer's att */
    float *encoded;                        /* (N,C) the embedding's output */
    float *lnf, *rstdf;                    /* (N,C) (N) */
    float *logits;                         /* (N,V); dlogits after the backward */
    float *losses, *lse;                   /* (N) */
    const int32_t *inputs, *targets;
    int rows;
    int emb_open;        /* the head's backward announced the embedding's gradients */
    float **chunk_input; /* (L) the input of a pipeline model chunk that starts at layer l > 0, else NULL */
};

struct loom_llama {
    struct loom_model base;            /* L + 2 blocks: [embedding, layers..., head] */
    struct loom_sparse_layout *sparse; /* block-sparse attention's layout (all query heads), or NULL */
    struct loom_llama_config cfg;
    int B, T;
    /* tensor parallelism: this rank's part of a tp group of tp ranks */
    int tp, tp_rank;
    int NHl, Gl, Cl; /* its query heads, key/value heads and q width (NHl hs) */
    int Fl;          /* its MLP columns */
    int v0, Vl;      /* its vocabulary rows [v0, v0 + Vl) */
    float *ce_stats; /* (3, N) the vocab-parallel cross-entropy's row statistics; tp > 1 only */
    /* sequence parallelism: the residual stream, the norms and their saved
     * state hold N/tp rows (the layer acts' and slot's (N,C) buffers of them) */
    struct loom_tp_regions rg; /* the regions' entries and exits, rows of C (layers/tp_regions.h) */
    float *norm_grads;         /* (C) one norm's weight gradient before the tp sum; sp only */
    /* --layout-invariant: the split sums in fixed pieces (layers/tp_exact.h); pieces 0: off */
    struct loom_tp_exact exact;
    enum loom_dtype act_dtype; /* F32; BF16, F16: every activation a kernel writes is rounded to it */
    /* activation recomputation (Megatron's, as GPT-2's: loom_llama_set_recompute) */
    enum loom_recompute recompute;
    enum loom_recompute_method recompute_method;
    int recompute_num_layers;
    int hs, kvC; /* head size C/NH, and Gl hs: the width of this rank's k and v */
    const struct loom_kernels *k;
    int nslots;
    struct loom_llama_acts *slots; /* (nslots), allocated by the first forward */
    int emb, head;
    /* shared scratch (one forward or backward at a time) */
    float *q, *kk, *v;       /* (N,C) (N,kvC) (N,kvC) projections before packing */
    float *scratchC, *dres;  /* (N,C) */
    float *dbufC, *dbufC2;   /* (N,C) */
    float *dqkv, *datt;      /* (N,3C) (B,NH,T,T) */
    float *dh, *dgate, *dup; /* (N,F) */
    int bwd_slot;
    int defer_wte_scatter; /* leave the embedding's scatter out of this backward (loom_tied_embedding) */
    /* pipeline parallelism (loom_llama_create_stage), as GPT-2's: the layers
     * held, in model chunks, and a tied head's table across stages
     * (layers/pp_stages.h) */
    struct loom_pp_stage_layers stage; /* the layers held and their chunks (layers/pp_stages.h) */
    int pipelined;
    float *tied_copy, *tied_grad; /* the last stage's copy and its gradient; the first stage's one buffer */
    float *
        *tied_sends; /* --layout-invariant: the head's stage's copy of each micro-batch's share (reserve) */
};

/* A model for micro-batches of up to B sequences of T, described; the
 * caller allocates its arenas. Weights are zero until initialised (normal
 * 0.02, RMSNorm weights 1, as Hugging Face initialises) or loaded. */
struct loom_llama *loom_llama_create(const struct loom_llama_config *cfg, int B, int T);
/* One pipeline stage of it: the layers lo[c]..hi[c] of its `chunks` model
 * chunks (increasing), the embedding when `embedding`, the final norm and
 * LM head when `head` (see loom_gpt2_create_stage). */
struct loom_llama *loom_llama_create_stage(const struct loom_llama_config *cfg, int B, int T, int tp,
                                           int tp_rank, int chunks, const int *lo, const int *hi,
                                           int embedding, int head);
void loom_llama_free(struct loom_llama *m);
/* Megatron's sequence parallelism for a tensor-parallel model (tp > 1, T
 * divisible by tp), before the first forward: a micro-batch's boundary
 * activations are then this rank's rows of the sequence. */
void loom_llama_set_sequence_parallel(struct loom_llama *m, int on);
/* --layout-invariant pieces (before the first forward; a multiple of tp
 * dividing the heads, the key/value groups and the FFN size): every sum
 * tensor parallelism splits taken in those pieces. */
void loom_llama_set_tp_invariant(struct loom_llama *m, int pieces);
/* Block-sparse attention with the layout of sc over the query heads
 * (kernels/sparse_layout.h), before the first forward; every causal pair
 * keeps the dense kernels. LOOM_ERR_INPUT from the layout's checks. */
struct loom_sparse_config;
int loom_llama_set_sparse(struct loom_llama *m, const struct loom_sparse_config *sc);
/* fp8 products in the layers' seven linear layers (layers/fp8_linear.h). */
struct loom_fp8_recipe;
void loom_llama_set_fp8(struct loom_llama *m, const struct loom_fp8_recipe *r);
/* Megatron's recomputation, before the first forward (see gpt2.h):
 * selective recomputes each layer's attention probabilities from its kept
 * qkv; full keeps only the input of each recomputed chunk of layers
 * (uniform: every layer, chunks of N; block: the first N) and reruns their
 * forward before their backward, into one chunk's scratch. */
void loom_llama_set_recompute(struct loom_llama *m, enum loom_recompute granularity,
                              enum loom_recompute_method method, int num_layers);
struct loom_llama *loom_llama_of(struct loom_model *m);
/* LOOM_ERR_INPUT naming the flag when the shape cannot be built. */
int loom_llama_config_check(const struct loom_llama_config *cfg, int T);
/* The whole model's parameter count, and the training FLOPs per token. */
double loom_llama_num_params(const struct loom_llama_config *cfg);
double loom_llama_flops_per_token(const struct loom_llama *m);

/* One micro-batch through the whole model in slot 0 (tests, tools). */
float loom_llama_forward(struct loom_llama *m, const int32_t *inputs, const int32_t *targets, int B);
void loom_llama_backward(struct loom_llama *m, float loss_weight);

#endif
