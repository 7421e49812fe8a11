/*
 * What every decoder family's registry entry (model/family.h) shares: a
 * model built from the configuration (this pipeline stage's chunks of
 * layers, this tensor-parallel rank's part, block-sparse attention,
 * this context-parallel rank's part of the sequence,
 * recomputation, sequence parallelism, --layout-invariant, and when
 * training the compute dtype's activations and fp8), freeing it, its FLOPs.
 */
#include "model/decoder_family.h"

#include "base/log.h"
#include "base/mem.h"
#include "layers/fp8_linear.h"
#include "layers/pp_stages.h"
#include "model/sparsity.h"

struct loom_model *loom_decoder_build(const struct loom_config *cfg, const struct loom_decoder_spec *s, int B,
                                      int T, int training, int tp_rank, int pp_rank)
{
    /* a configuration that says none (a checkpoint's reader's) is one process */
    const int pp = cfg->pipeline_model_parallel_size > 1 ? cfg->pipeline_model_parallel_size : 1,
              tp = cfg->tensor_model_parallel_size > 1 ? cfg->tensor_model_parallel_size : 1;
    /* this stage's chunks of layers (layers/pp_stages.h), all of them without pipelining */
    const int chunks = pp > 1 ? loom_pp_chunks(cfg) : 1;
    int *lo = loom_alloc(sizeof(int) * 2 * (size_t)chunks, LOOM_MEM_OTHER), *hi = lo + chunks;
    if (pp > 1)
        for (int c = 0; c < chunks; c++) loom_pp_layers(cfg, pp_rank, c, &lo[c], &hi[c]);
    else
        lo[0] = 0, hi[0] = s->num_layers - 1;
    /* this expert-parallel rank's experts (the footprint's: rank 0's, as many as any) */
    struct loom_decoder_spec sx = *s;
    const int ep = cfg->expert_model_parallel_size > 1 && s->experts ? cfg->expert_model_parallel_size : 1;
    sx.ep = ep;
    sx.ep_rank = loom_ep_group_rank() % ep;
    sx.ep_allgather = ep > 1 && cfg->moe_token_dispatcher_type == LOOM_MOE_DISPATCH_ALLGATHER;
    sx.experts_whole = s->experts && cfg->layout_invariant && tp > 1;
    sx.micros = cfg->gradient_accumulation_steps > 1 ? cfg->gradient_accumulation_steps : 1;
    struct loom_decoder *m = loom_decoder_create(&sx, B, T, tp, tp_rank, chunks, lo, hi,
                                                 pp_rank == 0 || pp == 1, pp_rank == pp - 1 || pp == 1);
    loom_free(lo);
    struct loom_sparse_config sc;
    int sparse;
    if (loom_model_sparsity(cfg, &sc, &sparse) == LOOM_OK && sparse)
        LOOM_ASSERT(loom_decoder_set_sparse(m, &sc) ==
                    LOOM_OK); /* the family's check built it once already */
    loom_decoder_set_unfused_attention(m, cfg->attention_backend == LOOM_ATTN_BACKEND_UNFUSED ||
                                              cfg->attention_backend == LOOM_ATTN_BACKEND_LOCAL);
    if (cfg->context_parallel_size > 1) /* the rank's place: the group's (the footprint's: rank 0) */
        loom_decoder_set_context(m, cfg->context_parallel_size,
                                 loom_cp_group_rank() % cfg->context_parallel_size, cfg->cp_comm_type);
    if (cfg->reset_position_ids || cfg->reset_attention_mask || cfg->eod_mask_loss) {
        const struct loom_decoder_documents d = {.eod = cfg->eod_token_id,
                                                 .reset_positions = cfg->reset_position_ids,
                                                 .reset_mask = cfg->reset_attention_mask,
                                                 .mask_loss = cfg->eod_mask_loss};
        loom_decoder_set_documents(m, &d);
    }
    loom_decoder_set_recompute(m, cfg->recompute_granularity, cfg->recompute_method,
                               cfg->recompute_num_layers);
    if (cfg->sequence_parallel) loom_decoder_set_sequence_parallel(m, 1);
    if (cfg->layout_invariant) loom_decoder_set_tp_invariant(m, cfg->layout_invariant);
    if (training) { /* activations in the compute dtype, products on its units (eval and sampling: float32) */
        loom_decoder_set_act_dtype(m, cfg->bf16   ? LOOM_DTYPE_BF16
                                      : cfg->fp16 ? LOOM_DTYPE_F16
                                                  : LOOM_DTYPE_F32);
        struct loom_fp8_recipe r;
        if (loom_fp8_recipe_of(cfg, &r)) loom_decoder_set_fp8(m, &r);
        loom_decoder_set_dropout(m, cfg->hidden_dropout, cfg->attention_dropout,
                                 cfg->embedding_dropout < 0 ? cfg->hidden_dropout : cfg->embedding_dropout);
    }
    return &m->base;
}

void loom_decoder_destroy(struct loom_model *m)
{
    if (m) loom_decoder_free(loom_decoder_of(m));
}

int loom_decoder_model_moe_stats(struct loom_model *m, double *out)
{
    return loom_decoder_moe_take(loom_decoder_of(m), out);
}

double loom_decoder_model_flops(const struct loom_model *m)
{
    return loom_decoder_flops_per_token(loom_decoder_of((struct loom_model *)m));
}
