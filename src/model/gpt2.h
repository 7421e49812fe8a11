/*
 * GPT-2, as the decoder's layer spec (model/decoder.h): the embedding block
 * (wte, wpe), L layers (LayerNorm, fused c_attn with biases, c_proj, LayerNorm,
 * c_fc, GELU, c_proj), and the head block (ln_f; the LM head tied to wte, or
 * with `untied` lm_head.weight of its own). Tensors carry Hugging Face GPT-2
 * names; matmul weights are stored [in, out] as Hugging Face's Conv1D stores
 * them. The numerics Hugging Face's configs carry are settings: LayerNorm's
 * eps, the MLP's GELU (tanh or exact). Initialisation: weights normal(0,
 * 0.02), the residual stream's output projections normal(0, 0.02/sqrt(2L)),
 * biases 0, LayerNorm gains 1, each tensor from its own stream seeded from
 * (seed, block, tensor).
 */
#ifndef LOOM_MODEL_GPT2_H
#define LOOM_MODEL_GPT2_H

#include "loom/config.h" /* enum loom_activation */
#include "model/decoder.h"

#define LOOM_GPT2_NORM_EPS 1e-5 /* GPT-2's LayerNorm eps */

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

/* GPT-2 as a decoder family's definition (model/decoder_def.h): its
 * architecture and shape settings. */
struct loom_decoder_def;
extern const struct loom_decoder_def loom_gpt2_def;

/* The model's settings as files record them (the GPT-2 family's shape,
 * model/family.h), and back; absent numerics take GPT-2's. In
 * gpt2.c. */
struct loom_model_shape;
void loom_gpt2_shape(const struct loom_gpt2_config *cfg, struct loom_model_shape *out);
int loom_gpt2_config_of_shape(const struct loom_model_shape *shape, struct loom_gpt2_config *out);
/* The configuration of a GPT-2 model built by this family. */
struct loom_gpt2_config loom_gpt2_config_of(const struct loom_decoder *m);

/* Checks the shape settings; LOOM_ERR_INPUT naming what is wrong. */
int loom_gpt2_config_check(const struct loom_gpt2_config *cfg, int T);
/* The decoder's spec of a GPT-2 shape. */
struct loom_decoder_spec loom_gpt2_spec(const struct loom_gpt2_config *cfg);

/* A model for micro-batches of up to B sequences of T tokens (loom_decoder_create). */
struct loom_decoder *loom_gpt2_create(const struct loom_gpt2_config *cfg, int B, int T);
/* Rank tp_rank's part of it in a tensor-parallel group of tp (Megatron's
 * layout: column-parallel c_attn and c_fc, row-parallel c_proj,
 * vocab-parallel wte and LM head). */
struct loom_decoder *loom_gpt2_create_tp(const struct loom_gpt2_config *cfg, int B, int T, int tp,
                                         int tp_rank);

#endif
