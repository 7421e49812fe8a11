/*
 * The attention sparsity the settings ask for (DeepSpeed's sparse_attention
 * block, --sparse-attention-mode and the --sparse-* flags, or
 * --attention-window W) as a layout configuration (kernels/sparse_layout.h),
 * for the model families whose attention takes one (GPT-2). Not here: the
 * layouts themselves and the kernels.
 */
#ifndef LOOM_MODEL_SPARSITY_H
#define LOOM_MODEL_SPARSITY_H

#include "kernels/sparse_layout.h"
#include "loom/config.h"

/* *on 0: dense causal attention (nothing else set). *on 1: *out is the
 * layout's configuration. LOOM_ERR_INPUT naming the flag for a list that
 * does not parse. */
int loom_model_sparsity(const struct loom_config *cfg, struct loom_sparse_config *out, int *on);

/* Builds (and frees) the layout for NH heads at T, so that bad settings
 * fail at start-up with the layout's one line. */
int loom_model_sparsity_check(const struct loom_config *cfg, int NH, int T);

/* The layout of sc for NH heads at T (allocated), or *out NULL where it
 * allows every causal pair (the dense kernels serve). LOOM_ERR_INPUT from
 * the layout's checks. */
int loom_model_sparse_layout(const struct loom_sparse_config *sc, int NH, int T,
                             struct loom_sparse_layout **out);
void loom_model_sparse_layout_free(struct loom_sparse_layout *l);

/* The share of the causal (query, key) blocks a layout computes (1 for
 * NULL: dense causal), for the attention's FLOPs. */
double loom_model_sparsity_share(const struct loom_sparse_layout *l);
/* ", attention window W (blocks of B, P% of the causal ones)" or the mode's
 * equivalent appended to buf (n bytes); nothing for NULL. */
void loom_model_sparsity_describe(const struct loom_sparse_layout *l, char *buf, size_t n);

#endif
