/*
 * The registry entry's pieces every decoder family shares (decoder_family.c).
 */
#ifndef LOOM_MODEL_DECODER_FAMILY_H
#define LOOM_MODEL_DECODER_FAMILY_H

#include "loom/config.h"
#include "model/decoder.h"

/* A model of spec s from the configuration (model/family.h's create). */
struct loom_model *loom_decoder_build(const struct loom_config *cfg, const struct loom_decoder_spec *s, int B,
                                      int T, int training, int tp_rank, int pp_rank);
/* model/family.h's destroy and flops_per_token for a decoder. */
void loom_decoder_destroy(struct loom_model *m);
double loom_decoder_model_flops(const struct loom_model *m);

/* model/family.h's moe_stats for a decoder. */
int loom_decoder_model_moe_stats(struct loom_model *m, double *out);

#endif
