/*
 * The decoder-only language model every family is (Megatron's GPTModel):
 * the embedding block (token table, and a learned position table where the
 * family has one), L transformer layers, and the head block (final norm, and
 * an LM head of its own when untied; tied, the head reads the token table).
 * A family is a layer spec (struct loom_decoder_spec) plus its presets,
 * weights formats and Hugging Face mapping; nothing in here names one.
 *
 * A layer: norm -> attention (q, k, v projections, fused or separate, with
 * rotary positions or none, grouped-query heads repeated into the attention
 * kernel's packed q | k | v, dense or block-sparse attention, the output
 * projection) -> residual -> norm -> MLP (dense: fc, GELU, projection;
 * gated: gate and up, SiLU or GELU of the gate times up, down) -> residual.
 * Family variants the spec carries: LayerNorm or RMSNorm, a norm weight
 * offset (Gemma's 1 + w), learned or rotary positions, an embedding scale,
 * a head width of its own, biases, tied or untied head.
 * Every product is a parallel linear layer (layers/linear.h): column- or
 * row-parallel under tensor parallelism, in the weight orientation the
 * family stores (Conv1D's [in, out] or nn.Linear's [out, in]), on float32,
 * bf16 operands, fp8 or --layout-invariant's exact pieces.
 *
 * Forward and backward run over a range of blocks for one micro-batch slot
 * (loom/model.h): a model may hold one pipeline stage's blocks, a
 * tensor-parallel rank's part of every layer (with Megatron's sequence
 * parallelism), keep activations in a 16-bit dtype (the kernels compute in
 * float32 on staging buffers), and recompute activations (Megatron's
 * selective and full recomputation) bit for bit.
 */
#ifndef LOOM_MODEL_DECODER_H
#define LOOM_MODEL_DECODER_H

#include <stddef.h>
#include <stdint.h>

#include "base/dtype.h"
#include "kernels/kernels.h" /* struct loom_dropout */
#include "layers/context.h"
#include "layers/experts.h"
#include "layers/linear.h"
#include "layers/pp_stages.h"
#include "layers/tp_exact.h"
#include "layers/tp_regions.h"
#include "loom/config.h" /* enum loom_normalization, loom_position_embedding, loom_recompute */
#include "loom/model.h"

struct loom_kernels;
struct loom_model_family;
struct loom_sparse_config;
struct loom_fp8_recipe;

#define LOOM_DECODER_HEAD_ROWS 32 /* rows of logits staged in float32 at a time, 16-bit act_dtype */

enum loom_mlp_kind {
    LOOM_MLP_DENSE = 0, /* fc -> activation -> projection (GPT-2) */
    LOOM_MLP_GATED = 1, /* activation(gate) * up -> down (SwiGLU, GeGLU) */
};

/* The MLP's activation. */
enum loom_mlp_activation {
    LOOM_MLP_GELU_TANH = 0, /* GELU's tanh form (gelu_new, gelu_pytorch_tanh) */
    LOOM_MLP_GELU = 1,      /* exact GELU (erf) */
    LOOM_MLP_SILU = 2,      /* SiLU (gated: SwiGLU) */
};

/* The tensors' names, Hugging Face's for the family: each layer tensor is
 * layer (a printf format of the layer index) + its name + ".weight" or
 * ".bias". NULL where the family has no such tensor. */
struct loom_decoder_names {
    const char *embedding, *positions; /* "wte", "wpe" */
    const char *layer;                 /* "h.%d." */
    const char *norm1, *qkv;           /* qkv: one fused weight (NULL: q, k, v) */
    const char *q, *k, *v, *o;
    const char *norm2;
    const char *gate, *up, *down; /* dense: up is fc, down its projection */
    const char *final_norm, *lm_head;
    /* a mixture of experts' MLP: the router; expert e's prefix (a printf
     * format of e, after the layer's) and its products' names (gate NULL
     * for a dense expert); the shared experts' prefix, with the same
     * products (NULL: the family has none) */
    const char *router, *expert, *expert_gate, *expert_up, *expert_down, *shared;
};

/* A family's layer spec and shape: Megatron's TransformerConfig. */
struct loom_decoder_spec {
    const struct loom_model_family *family; /* base.family of the models built */
    const char *name;                       /* base.name: the family's name */
    const struct loom_decoder_names *names;
    int num_layers; /* L */
    int hidden;     /* C */
    int heads;      /* NH */
    int kv_heads;   /* G: key/value heads, dividing NH */
    int head_dim;   /* hs (0: C / NH) */
    int ffn;        /* F: the MLP's width */
    int max_pos;    /* the longest sequence (rows of a learned position table) */
    int vocab;      /* V */
    enum loom_normalization norm;
    double norm_eps;
    double hidden_dropout, attention_dropout,
        embedding_dropout; /* what files record; the run's: set_dropout */
    double norm_offset;    /* the norms' weights act as norm_offset + w (Gemma's RMSNorm: 1, the weights
                            * then start at 0); 0: w */
    enum loom_position_embedding positions;
    double rope_theta;
    enum loom_weight_orientation weights;
    int fused_qkv;                  /* one weight for q | k | v (needs G == NH, no rotary) */
    int qkv_bias, o_bias, mlp_bias; /* biases of those products */
    enum loom_mlp_kind mlp;
    enum loom_mlp_activation activation;
    double embed_scale; /* the embedding's output times this (Gemma: sqrt(C)); 0: none */
    int window;         /* the sliding window files record (i - W < j <= i; 0: none); the layout
                         * itself comes from the settings (model/sparsity.h) */
    int untied;         /* the LM head has its own weight */
    double init_std;    /* normal(0, init_std) for weights */
    int scaled_init;    /* the residual stream's output projections: init_std / sqrt(2 L) */
    /* a mixture of experts (Megatron's MoE settings; decoder_moe.c): the
     * MLP of the MoE layers (moe_layers: every freq-th from layer 0, or
     * those of its list) is `experts` experts of moe_ffn columns (the
     * family's MLP kind), each token routed to topk of them by a router
     * (linear, no bias), plus shared experts of shared_ffn columns every
     * token goes through (0: none); experts 0: none */
    int experts, topk, moe_ffn, shared_ffn;
    struct loom_moe_layers moe_layers;
    int pre_softmax; /* the routing weights: the top k of the softmax (else the softmax of the top k) */
    enum loom_moe_balance balance;
    double aux_coeff, z_coeff; /* the load-balancing loss's and the z-loss's weights */
    double capacity_factor;    /* an expert takes at most ceil(N k / E x this) rows of N; 0: dropless */
    enum loom_moe_drop_policy drop_policy;
    int pad_to_capacity; /* each expert's block is its capacity of rows, zeros after its own */
    /* the layout's, not the shape's: the experts split over an
     * expert-parallel group of ep ranks (layers/experts.h), this rank
     * ep_rank (0, 0: all of them here); the allgather dispatcher, else
     * the all-to-all; experts_whole: the experts and shared experts not
     * split over the tensor-parallel ranks but whole on each, computed
     * alike (--layout-invariant under TP: one process's products);
     * micros: the micro-batches of a step on this rank (the per-source
     * trees of --layout-invariant under EP, decoder_moe.c) */
    int ep, ep_rank, ep_allgather, experts_whole, micros;
};

/* Indices of a layer block's tensors, in block order (-1: absent): the same
 * for every layer. qkv[0..nqkv) are the attention's input projections (one
 * fused, or q, k, v). */
struct loom_decoder_slots {
    int norm1_w, norm1_b;
    int nqkv, qkv_w[3], qkv_b[3];
    int o_w, o_b;
    int norm2_w, norm2_b;
    int gate_w, gate_b, up_w, up_b, down_w, down_b;
    /* an MoE layer's instead of the MLP's: the router, expert 0's products
     * (expert e's are these + e * expert_stride), the shared experts' */
    int router_w;
    int e_gate_w, e_gate_b, e_up_w, e_up_b, e_down_w, e_down_b, expert_stride;
    int s_gate_w, s_gate_b, s_up_w, s_up_b, s_down_w, s_down_b;
};

/* One layer's saved forward state for B sequences of T (N = B T rows). The
 * residual stream and the norms hold Nr rows (B T / tp under sequence
 * parallelism, else N); the parallel regions every row of this rank's
 * columns. `void *` buffers are in act_dtype (float32, or its 16 bits);
 * norm statistics and attention probabilities float32. */
struct loom_decoder_layer_acts {
    void *ln1;                  /* (Nr,C) */
    float *ln1_mean, *ln1_rstd; /* (Nr) each; mean LayerNorm's only */
    void *qkv;                  /* (N, 3 Cq) q and k rotated, key/value heads repeated to NH */
    void *atty;                 /* (N, Cq) */
    float *att;                 /* unfused attention: probabilities, kept (float32 activations only) */
    float *lse;                 /* fused attention: (B, NH, T) each row's log-sum-exp, float32 */
    void *res2;                 /* (Nr,C) */
    void *ln2;                  /* (Nr,C) */
    float *ln2_mean, *ln2_rstd; /* (Nr) each */
    void *fc;                   /* (N,F) dense: fc's output; gated: the gate's */
    void *up;                   /* (N,F) gated: up's output; dense: NULL */
    void *h;                    /* (N,F) the activation's output */
    void *res3;                 /* (Nr,C) the layer's output */
    /* an MoE layer's (float32): the router's logits (N, E); each token's
     * routing weights, experts and rows among the permuted ones (N, k); the
     * rows each expert received (E, on the host). fc, up and h then hold
     * the permuted rows' (N k, moe_ffn), ey the experts' outputs (N k, C),
     * sfc, sup and sh the shared experts' (N, shared_ffn); all in float32,
     * with 16-bit activations rounded to act_dtype as the dense layers' */
    float *rlogits, *rprobs;
    float *rlse; /* (N) the router's log-sum-exp rows */
    int32_t *ridx, *rpos;
    int *counts; /* (E) rows each expert computes (its block: under a capacity those kept, or padded) */
    int *routed; /* (E) each expert's choices before a capacity drops any (the balancing loss's f) */
    float *ey, *sfc, *sup, *sh;
    /* expert parallelism: the rows each rank sent to each local expert
     * (ep x local, on the host), and the local experts' input rows
     * (expert-major, float32); fc, up and h then hold those rows' */
    int *recv;
    float *xe;
    /* the allgather dispatcher: every rank's choices' places among this
     * rank's experts' rows (ep x N k, -1: none here) and their routing
     * weights; ey then holds this rank's experts' outputs (expert-major) */
    int32_t *gpos;
    float *gprobs;
};

/* Packed documents, Megatron's get_ltor_masks_and_position_ids: a
 * document ends at each end-of-document token eod (the token is its last);
 * reset_positions: positions restart at 0 after it (--reset-position-ids);
 * reset_mask: a token attends only within its document
 * (--reset-attention-mask); mask_loss: the loss where the input token is
 * eod does not count (--eod-mask-loss), and the mean is over the tokens
 * that count. */
struct loom_decoder_documents {
    int eod;
    int reset_positions, reset_mask, mask_loss;
};

/* A micro-batch slot's activations. */
struct loom_decoder_acts {
    struct loom_decoder_layer_acts *layers;  /* (L); a recomputed layer's lead into the scratch */
    struct loom_decoder_layer_acts *scratch; /* full recomputation: one chunk of layers' buffers */
    void *encoded;                           /* (Nr,C) the embedding's output, in act_dtype */
    float *lnf, *lnf_mean, *lnf_rstd;        /* (Nr,C) (Nr) (Nr), float32 */
    void *logits;        /* (N,Vl) in act_dtype; dlogits after the backward; holds the recompute scratch */
    size_t logits_bytes; /* its buffer */
    float *losses, *lse; /* (N) */
    const int32_t *inputs, *targets; /* the micro-batch's tokens on the device: in tokens */
    int32_t *tokens; /* (3N + B Tw) the inputs, the targets, the positions and each token's document start
                      * (of whole rows), uploaded at the forward (the last two with documents or context
                      * parallelism only); Tw: the whole sequence, T without context parallelism */
    const int32_t *positions, *doc_start; /* in tokens, or NULL: t, one document per row */
    /* packed documents, on the host: each token's document start (whole
     * rows, B Tw), whether its loss counts (this rank's rows), and how many
     * of the whole rows' do */
    int32_t *doc_host;
    uint8_t *loss_keep;
    int nkeep;
    int *moe_counts; /* the MoE layers' counts (each layer's and each recompute scratch layer's E) */
    double *moe_hf;  /* (E + 1) hf_aux_loss: each expert's choices over the micro-batch's MoE layers, and
                      * their rows; NULL otherwise */
    int rows;
    /* dropout: the micro-batch's step (0: not a training step, nothing dropped) and its first row's
     * place in the step's global batch (loom/model.h's loom_micro) */
    int64_t drop_step;
    int drop_first;
    uint64_t drop_seed;
    int emb_open;        /* the head's backward announced the embedding's gradients */
    float **chunk_input; /* (L) the input of a pipeline model chunk that starts at layer l > 0, else NULL */
};

struct loom_decoder {
    struct loom_model base;  /* blocks [embedding, layers..., head]; base.user is this */
    float *host_losses;      /* (B T) host memory: a micro-batch's losses, downloaded for their mean */
    int32_t *host_positions; /* (B T) host memory: positions (restarting at documents, or a context-parallel
                              * rank's places in the sequence), to upload */
    int32_t *host_tokens;    /* (2 B T) host memory: a context-parallel rank's inputs and targets */
    struct loom_decoder_spec spec;
    struct loom_decoder_slots t; /* a layer block's tensors */
    int B, T; /* micro-batch rows and this rank's tokens of each (the sequence, or ctx.Tl of it) */
    /* context parallelism (layers/context.h): ctx.T the whole sequence; one
     * rank (ctx.cp 1) without it. Attention meets the other ranks as
     * cp_comm says; cp_send ... cp_dqkv its scratch */
    struct loom_cp ctx;
    enum loom_cp_comm_type cp_comm;
    float *cp_send, *cp_recv, *cp_out, *cp_dout, *cp_dqkv; /* a2a */
    float *cp_kv[2], *cp_dkv[3]; /* (N, 2 kvC) this rank's keys and values (p2p: and a block in flight), and
                                  * their gradients (p2p: two in flight, and this rank's share of one) */
    float *cp_whole, *cp_dwhole; /* all_gather: (B Tw, 2 kvC) the whole sequences' keys and values, their
                                  * gradients */
    float *cp_tmp, *cp_o, *cp_l, *cp_dq; /* one call's dk and dv, out, lse and dq (p2p) */
    /* --layout-invariant's attention in row blocks (decoder_attention.c):
     * the whole sequences' keys and values of the heads here (B Tw, kv2),
     * one call's dk and dv (Tw, kv2) and their float64 sums (B Tw, kv2);
     * under context parallelism the embedding's whole rows' gradient and
     * its gather's scratch (B Tw, C each), the whole rows' tokens and
     * positions (device, 2 B Tw) and the gather's (host) */
    float *ex_kv, *ex_tmp, *ex_emb, *ex_emb_recv;
    double *ex_dkv;
    int32_t *ex_tok, *ex_tok_host;
    enum loom_dtype act_dtype; /* F32; BF16, F16: activations kept in it, kernels in float32 */
    enum loom_recompute recompute;
    enum loom_recompute_method recompute_method;
    int recompute_num_layers;
    /* tensor parallelism: this rank's part of a group of tp */
    int tp, tp_rank;
    int hs;                    /* head size */
    int NHl, Gl;               /* this rank's query and key/value heads */
    int Cq, kvC;               /* their widths: NHl hs, Gl hs */
    int Fl;                    /* this rank's MLP columns */
    int Fe, Fs;                /* this rank's columns of an expert's and the shared experts' MLPs */
    int v0, Vl;                /* its vocabulary rows [v0, v0 + Vl) */
    float *ce_stats;           /* (3, N) the vocab-parallel cross-entropy's row statistics */
    struct loom_tp_regions rg; /* the regions' entries and exits; rg.sp: sequence parallelism */
    float *norm_grads;         /* (2C) a norm's gradients in one row piece (exact) */
    /* sequence parallelism: a block's norms' gradients over this rank's rows
     * (two norms, each 2C floats, or 2C doubles under exact pieces), summed
     * over the tp group by their strategy at the block's grads_ready */
    float *norm_parts;
    struct loom_partial_grad partials[4];
    int npartials, nnorms;
    struct loom_tp_exact exact;     /* --layout-invariant's pieces; pieces 0: off */
    struct loom_tp_exact exact_off; /* pieces 0: an MoE layer's products (one rank's, lc_moe) */
    const struct loom_kernels *k;
    struct loom_linear_ctx lc; /* what every product shares (set by the first forward or reserve) */
    /* an MoE layer's products (decoder_moe.c): lc inside one region of one
     * rank, so that the experts' partial sums over this rank's columns stay
     * here until the layer's output leaves the region once */
    struct loom_linear_ctx lc_moe;
    struct loom_tp_regions rg_moe;
    int nslots;
    struct loom_decoder_acts *slots; /* (nslots), allocated by the first forward or reserve */
    int emb, head;                   /* the embedding's and the head's block, or -1 */
    /* scratch shared by the slots (one forward or backward at a time) */
    float *dres;           /* (Nr,C) the residual stream's gradient */
    float *dbufC, *dbufC2; /* (N, max(C, Cq)); dbufC2 for separate products only */
    float *scratchC;       /* (N, max(C, Cq)) */
    float *dqkv, *datt;    /* (N, 3 Cq), attention's scratch */
    float *q, *kk, *v;     /* (N,Cq) (N,kvC) (N,kvC) separate projections; NULL when fused */
    float *dbufF[3];       /* (N, max(F, Cq)) the MLP's; the third for gated only */
    float *stage_res;      /* (Nr,C) 16-bit activations: a residual's float32 values */
    float *seq_att;        /* one sequence's probabilities (16-bit activations) */
    float *head_rows;      /* (LOOM_DECODER_HEAD_ROWS, Vl) */
    float *norm_w;         /* (C) a norm's weight plus the spec's norm_offset */
    int bwd_slot;
    int bwd_micro, bwd_micros; /* the running backward's place in the step (loom_micro's micro, micros) */
    int defer_wte_scatter;
    /* pipeline parallelism: the layers held and the tied table across stages */
    struct loom_pp_stage_layers stage;
    int pipelined;
    float *tied_copy, *tied_grad;
    struct loom_sparse_layout *sparse; /* block-sparse attention, or NULL: dense causal */
    int unfused; /* attention through the (T,T) kernels that keep the probabilities, not the fused one */
    struct loom_decoder_documents docs;
    float *pos_rows; /* (N,C) the learned positions' rows, when they restart at documents */
    /* a mixture of experts' scratch (decoder_moe.c): the dispatched rows,
     * their gradients and the experts' outputs' (N k, C), the products'
     * gradients (three of N k moe_ffn, or N shared_ffn), the routing
     * weights' (N k) and the router logits' (N,E) gradients, a (N,C) row
     * buffer, the softmax's sums and the balancing loss's gradient (E);
     * host copies of the choices and places (N k), the sums (E) and lse (N) */
    float *moe_xp, *moe_dxp, *moe_dy, *moe_dF[3], *moe_dprobs, *moe_dlogits, *moe_out, *moe_sums,
        *moe_aux_grad;
    float *moe_y; /* (N,C) an MoE layer's output, before the residual */
    float
        *moe_sdx; /* (N,C) the shared experts' input gradient, taken while the rows travel (decoder_moe.c) */
    /* expert parallelism: the split (layers/experts.h), the rows a rank's
     * experts may take (ep x moe_rows) and two buffers of them for the
     * exchanges */
    struct loom_ep ep;
    int moe_rows_ep;
    float *moe_ep[2];
    float *moe_dxs; /* (moe_rows_ep, C) gated experts: the up products' input gradient, then added */
    /* --layout-invariant under expert parallelism: each source rank's
     * gradients of a layer's experts (ep x moe_src_numel), summed in the
     * pairwise tree over the sources (decoder_moe.c) */
    float *moe_src_grads;
    size_t moe_src_numel;
    /* with more than one micro-batch a rank (spec.micros), each MoE layer's
     * sources' sums over the micro-batches: level k of layer i's source s
     * at moe_src_tree[(k nmoe + i) ep + s] (layers/sum_tree.h), allocated
     * with the activations */
    float **moe_src_tree;
    /* the allgather dispatcher's: every rank's rows (ep x N, C), the
     * outputs' or inputs' gradients' partial sums for them, the routing
     * weights' gradients (ep x N k); on the host every rank's counts
     * (ep x E), choices and places (ep x N k each, and this rank's).
     * Under --layout-invariant (experts_by_source) moe_gx and moe_gout hold
     * ep x N k rows (the choices' slots), moe_slots this rank's N k and
     * moe_spos their places (decoder_moe.c) */
    float *moe_gx, *moe_gout, *moe_gdp, *moe_slots;
    int32_t *moe_spos;
    int *moe_all_host;
    int32_t *moe_gidx_host, *moe_gpos_host, *moe_lpos_host;
    int32_t *moe_idx_host, *moe_pos_host;
    float *moe_sums_host, *moe_lse_host;
    /* dropout while training (kernels/dropout_mask.h): p of the attention and MLP outputs, attention's
     * probabilities and the embedding's output (0: none; the seed is each micro-batch's); the rows this rank
     * holds as global ids ((sequence of the step) Tw + position, for the running forward's or backward's
     * slot: host and device), a residual gradient's masked copy (Nr,C), and the attention call's mask */
    double drop_hidden, drop_attn, drop_emb;
    int64_t *drop_rows_host, *drop_rows;
    float *drop_grad;
    const struct loom_dropout *attn_drop;
    struct loom_dropout attn_drop_site;
    float moe_loss_weight;  /* the running backward's micro-batch weight */
    int moe_rows;           /* the dispatched rows' buffers: N k, or E x capacity when padding needs more */
    float *moe_probs_host;  /* (N k) the routing weights, for --moe-token-drop-policy probs */
    int32_t *moe_keep_host; /* (N k) whether the capacity keeps each choice */
    int moe_dropped;        /* choices dropped by the capacity, counted with the losses' values */
    /* the balancing losses' values (unweighted: aux = E/(N^2 k) sum P f, z = mean lse^2), summed
     * over the MoE layers' forwards since loom_decoder_moe_take, those forwards, the choices, and each
     * (MoE layer of the whole model, expert)'s choices (host); a recomputing forward counts none */
    double moe_aux_sum, moe_z_sum, moe_choices;
    int moe_layers_seen;
    double *moe_tokens; /* (nmoe, E) choices per (MoE layer, expert), then (nmoe, 3) each layer's sums */
    int moe_recomputing;
};

/* An expert's capacity in a micro-batch of N rows (Megatron's
 * get_capacity of N k tokens): ceil(N k / E x capacity_factor); 0: none. */
int loom_decoder_moe_capacity(const struct loom_decoder_spec *s, int N);

/* model/family.h's moe_stats: the statistics since the last call, reset;
 * 0 without experts. */
int loom_decoder_moe_take(struct loom_decoder *m, double *out);

/* Whether layer l of spec s is an MoE layer; how many of its layers are,
 * and how many come before layer l. */
int loom_decoder_moe_layer(const struct loom_decoder_spec *s, int l);
int loom_decoder_moe_count(const struct loom_decoder_spec *s);
int loom_decoder_moe_index(const struct loom_decoder_spec *s, int l);

/* LOOM_ERR_INPUT naming the flag when the spec cannot be built for T. */
int loom_decoder_check(const struct loom_decoder_spec *s, int T);
/* One pipeline stage (or all: chunks 1, lo 0, hi L-1, both ends) of a
 * tensor-parallel rank (tp 1: the whole layer), for micro-batches of up to B
 * sequences of T: blocks and tensors described; the caller allocates the
 * arenas. */
struct loom_decoder *loom_decoder_create(const struct loom_decoder_spec *s, int B, int T, int tp, int tp_rank,
                                         int chunks, const int *lo, const int *hi, int embedding, int head);
/* The whole model in one process. */
struct loom_decoder *loom_decoder_create_whole(const struct loom_decoder_spec *s, int B, int T);
void loom_decoder_free(struct loom_decoder *m);
/* The decoder behind a model built by loom_decoder_create, or NULL. */
struct loom_decoder *loom_decoder_of(struct loom_model *m);

/* Settings, before the first forward. */
void loom_decoder_set_recompute(struct loom_decoder *m, enum loom_recompute granularity,
                                enum loom_recompute_method method, int num_layers);
void loom_decoder_set_sequence_parallel(struct loom_decoder *m, int on);
void loom_decoder_set_tp_invariant(struct loom_decoder *m, int pieces);
int loom_decoder_set_sparse(struct loom_decoder *m, const struct loom_sparse_config *sc);
/* Attention through the (T,T) kernels (--attention-backend unfused or
 * local): they store the probabilities, so memory grows with T^2. The
 * default is the fused kernel (O(T) memory). */
void loom_decoder_set_unfused_attention(struct loom_decoder *m, int on);
/* Context parallelism: this rank is `rank` of a context group of cp
 * (layers/context.h), meeting in attention as `comm` says (the fused
 * attention only; after set_sparse). */
void loom_decoder_set_context(struct loom_decoder *m, int cp, int rank, enum loom_cp_comm_type comm);
/* Packed documents (the fused attention only). */
void loom_decoder_set_documents(struct loom_decoder *m, const struct loom_decoder_documents *d);
void loom_decoder_set_fp8(struct loom_decoder *m, const struct loom_fp8_recipe *r);
/* The compute dtype's activations and kernels (training in bf16 or fp16). */
void loom_decoder_set_act_dtype(struct loom_decoder *m, enum loom_dtype dt);
/* Dropout while training (a micro-batch with a step, loom/model.h): p on
 * the attention and MLP outputs before their residual adds (hidden), on
 * attention's probabilities and on the embedding's output, masks drawn
 * from the micro-batch's seed and step (kernels/dropout_mask.h). */
void loom_decoder_set_dropout(struct loom_decoder *m, double hidden, double attention, double embedding);

/* Forward of every block on B rows in slot 0 (mean loss, or 0 without
 * targets), its backward, and the logits (B, T, Vl) as float32. */
float loom_decoder_forward(struct loom_decoder *m, const int32_t *inputs, const int32_t *targets, int B);
void loom_decoder_backward(struct loom_decoder *m, float loss_weight);
void loom_decoder_logits(const struct loom_decoder *m, float *dst);

/* The whole model's parameter count, and its training FLOPs per token. */
double loom_decoder_num_params(const struct loom_decoder_spec *s);
double loom_decoder_flops_per_token(const struct loom_decoder *m);

#endif
