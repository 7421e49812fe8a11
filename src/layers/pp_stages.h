/*
 * Pipeline parallelism's placement and its one model-level exchange.
 *
 * Placement: which layers each pipeline stage holds. The model's L layers
 * are cut into pp x chunks model chunks (chunks > 1: Megatron's virtual
 * stages, chunk c of stage s is model chunk c pp + s); the embedding goes
 * with the first model chunk, the final norm, LM head and loss with the
 * last. Without virtual stages the layers are balanced (stage s holds
 * [s L / pp, (s+1) L / pp)), or Megatron's --decoder-first/last-pipeline-
 * num-layers fix the ends and the stages between share the rest.
 *
 * The tied embedding (Megatron's embedding group, comm.h's
 * LOOM_GROUP_EMBEDDING): when the LM head reads the token embedding and
 * the head is on another stage, the last stage keeps a copy of the table
 * that it does not train. The first stage sends its table (float32, as its
 * kernels read it) at the first forward of every step and evaluation; the
 * last stage sends the copy's gradient, summed over the step's
 * micro-batches, after the head's last backward, and the first stage adds
 * it to the table's gradient before its own last backward of the embedding
 * completes it. So the table is trained once, by the stage that owns it,
 * and the optimizer, checkpoints and the gradient norm see it once.
 *
 * Not here: the schedules and their point-to-point helpers (parallel/schedule.h).
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

/* The tied table's exchange (n floats: this tensor-parallel rank's rows).
 * The sends do not block; their buffers must stay untouched until
 * loom_pp_flush, which the engine calls at the end of every step and
 * evaluation. The receives block. */
void loom_pp_tied_weights_send(const float *table, size_t n);
void loom_pp_tied_weights_recv(float *copy, size_t n);
void loom_pp_tied_grads_send(const float *grad, size_t n);
/* The same from a copy of grad, so grad may be written again at once: a
 * send every micro-batch (the model's invariant_sums). The copy is the
 * micro-batch's own buffer of loom_pp_tied_copies_alloc's, untouched until
 * loom_pp_flush. */
void loom_pp_tied_grads_send_copy(const struct loom_backend *b, const float *grad, float *copy, size_t n);
/* The head's stage's copies for those sends: one of n floats for each of a
 * step's micro-batches (they are all in flight in the worst schedule),
 * counted as communication buffers. */
float **loom_pp_tied_copies_alloc(const struct loom_backend *b, size_t n, int micros);
void loom_pp_tied_copies_free(const struct loom_backend *b, float **copies, int micros);
/* The gradient goes once per step (its sum over the micro-batches), or
 * under --layout-invariant (loom_model.invariant_sums) once per micro-batch,
 * added before the lookup's own so the table's gradient is summed as one
 * process sums it.
 * Receives the copy's gradient into scratch (n) and adds it to grad;
 * scratch may be the buffer the table was sent from. */
void loom_pp_tied_grads_add(const struct loom_kernels *k, float *grad, float *scratch, size_t n);
/* Waits for the sends in flight; returns the seconds it waited. */
double loom_pp_flush(void);

#endif
