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

#endif
