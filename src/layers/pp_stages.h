/*
 * Pipeline parallelism's placement, and the tied table's copy.
 *
 * Placement: which layers each pipeline stage holds. The model's L layers
 * are cut into pp x chunks model chunks (chunks > 1: Megatron's virtual
 * stages, chunk c of stage s is model chunk c pp + s); the embedding goes
 * with the first model chunk, the final norm, LM head and loss with the
 * last. Without virtual stages the layers are balanced (stage s holds
 * [s L / pp, (s+1) L / pp)), or Megatron's --decoder-first/last-pipeline-
 * num-layers fix the ends and the stages between share the rest.
 *
 * The tied embedding: when the LM head reads the token embedding and the
 * head is on another stage, the last stage keeps a copy of the table that
 * it does not train, and its gradient; the first stage a buffer for the
 * exchange (the table's send, then the gradient's receive), which is the
 * embedding group's strategy's (parallel/tied_stages.h).
 *
 * Not here: the schedules and their point-to-point helpers (parallel/schedule.h), the
 * tied table's exchange (parallel/tied_stages.h).
 */
#ifndef LOOM_LAYERS_PP_STAGES_H
#define LOOM_LAYERS_PP_STAGES_H

#include "kernels/backend.h"
#include <stddef.h>

struct loom_config;

/* Model chunks per stage: L / (layers per virtual stage x pp) under the
 * interleaved schedule, else 1. */
int loom_pp_chunks(const struct loom_config *cfg);
/* The layers [*lo, *hi] of chunk `chunk` of stage `stage`. */
void loom_pp_layers(const struct loom_config *cfg, int stage, int chunk, int *lo, int *hi);

/* Where a stage's layers sit among its blocks: [embedding] chunk 0's layers
 * ... chunk c-1's layers [head], and each layer's chunk. */
struct loom_pp_stage_layers {
    int *block;   /* (L) the block of layer l, or -1 when another stage holds it */
    int *lo, *hi; /* (L) the first and last layer of layer l's chunk */
    int nblocks;  /* the stage's blocks */
};
/* From the layers lo[c]..hi[c] of `chunks` chunks (increasing) of a model
 * of L layers, with the embedding's and the head's block when asked. */
void loom_pp_stage_layers_init(struct loom_pp_stage_layers *s, int L, int chunks, const int *lo,
                               const int *hi, int embedding, int head);
void loom_pp_stage_layers_free(struct loom_pp_stage_layers *s);

/* The buffers a stage needs for a tied table of n floats on another stage:
 * the head's stage a copy (counted as parameters) and its gradient; the
 * embedding's stage one buffer for both (the table's send, then the
 * gradient's receive). */
void loom_pp_tied_alloc(const struct loom_backend *b, float **copy, float **grad, size_t n, int holds_head);
void loom_pp_tied_free(const struct loom_backend *b, float *copy, float *grad);

#endif
