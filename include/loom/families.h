/*
 * The built-in model families (GPT-2, Llama, Mistral, Qwen2, Gemma,
 * Mixtral) for a loop of your own: the model `loom train` builds from
 * cfg's --model preset and shape flags (or what --load names), this rank's
 * part of the engine's layout (tensor-parallel slices, its pipeline
 * stage's blocks), handed to loom_engine_initialize as any model is. Its
 * batches are struct loom_lm_batch (loom/model.h): rows of seq_length
 * input ids and target ids, micro_batch_size rows a micro-batch.
 *
 *     loom_engine_init(&e, &cfg);
 *     loom_family_model_create(e, &cfg, &model);
 *     loom_engine_initialize(e, model);
 *     ... loom_engine_forward(e, &(struct loom_lm_batch){inputs, targets}, B) ...
 *     loom_engine_free(e);
 *     loom_family_model_free(model);
 */
#ifndef LOOM_FAMILIES_H
#define LOOM_FAMILIES_H

#include "loom/config.h"
#include "loom/engine.h"
#include "loom/model.h"

/* The model of cfg's preset family for e's layout, for training
 * (LOOM_ERR_INPUT naming the flag when the shape does not make one). */
int loom_family_model_create(const struct loom_engine *e, const struct loom_config *cfg,
                             struct loom_model **out);
void loom_family_model_free(struct loom_model *m);
/* FLOPs of one training step (forward + backward) per token of the model. */
double loom_family_model_flops_per_token(const struct loom_model *m);

#endif
