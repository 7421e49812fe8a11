/*
 * GPT-2's Hugging Face config.json (transformers' GPT2Config): read
 * strictly (io/hf_config.h) into the family's shape settings, and written
 * for a model loom exports, with generation_config.json beside it.
 *
 * Honoured: n_layer, n_embd, n_head, n_positions, vocab_size,
 * layer_norm_epsilon, activation_function (gelu_new and gelu_pytorch_tanh:
 * tanh GELU; gelu: exact), tie_word_embeddings, n_inner (null or 4 x
 * n_embd), architectures (GPT2LMHeadModel, GPT2Model), model_type gpt2.
 * Refused unless they hold GPT-2's default: scale_attn_weights,
 * scale_attn_by_inverse_layer_idx, add_cross_attention, is_encoder_decoder,
 * pruned_heads, cross_attention_hidden_size, tie_encoder_decoder.
 * Accepted, having no effect on the function: dropouts (loom trains without
 * dropout, and evaluation has none), reorder_and_upcast_attn (the same
 * products in float32, which loom computes in anyway), initializer_range
 * (weights are loaded), token ids, generation defaults, metadata. A field
 * absent takes GPT2Config's default. Unknown fields are refused.
 */
#ifndef LOOM_MODEL_GPT2_HF_H
#define LOOM_MODEL_GPT2_HF_H

#include "io/model_shape.h"
#include "model/gpt2.h"

/* The model path's config.json describes, as GPT-2 shape settings (every
 * one of them); LOOM_ERR_INPUT naming the file and the field otherwise. */
int loom_gpt2_hf_read_config(const char *path, struct loom_model_shape *out);

/* config.json and generation_config.json text for a model (cJSON_free). */
char *loom_gpt2_hf_config_json(const struct loom_gpt2_config *cfg);
char *loom_gpt2_hf_generation_config_json(const struct loom_gpt2_config *cfg);

#endif
