/*
 * Llama, as the decoder's layer spec (model/decoder.h), Hugging Face's
 * LlamaForCausalLM: the embedding block (model.embed_tokens), L decoder
 * layers (RMSNorm, grouped-query attention with rotary position embedding,
 * RMSNorm, SwiGLU MLP; no biases), and the head block (model.norm, and
 * lm_head.weight when untied; tied, the head reads embed_tokens). Tensors
 * carry Hugging Face's names and layout: a projection's weight is [out,
 * in], as nn.Linear keeps it. Initialisation as Hugging Face's: normal(0,
 * 0.02), RMSNorm weights 1.
 */
#ifndef LOOM_MODEL_LLAMA_H
#define LOOM_MODEL_LLAMA_H

#include "model/decoder.h"

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

/* LOOM_ERR_INPUT naming the flag when the shape cannot be built. */
int loom_llama_config_check(const struct loom_llama_config *cfg, int T);
/* The decoder's spec of a Llama shape, and back. */
struct loom_decoder_spec loom_llama_spec(const struct loom_llama_config *cfg);
struct loom_llama_config loom_llama_config_of(const struct loom_decoder *m);

/* A model for micro-batches of up to B sequences of T, described; the
 * caller allocates its arenas. */
struct loom_decoder *loom_llama_create(const struct loom_llama_config *cfg, int B, int T);
/* One pipeline stage of it (see loom_gpt2_create_stage). */
struct loom_decoder *loom_llama_create_stage(const struct loom_llama_config *cfg, int B, int T, int tp,
                                             int tp_rank, int chunks, const int *lo, const int *hi,
                                             int embedding, int head);
/* The whole model's parameter count. */
double loom_llama_num_params(const struct loom_llama_config *cfg);

#endif
