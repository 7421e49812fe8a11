/*
 * The engine (loom/engine.h): ranks and resolved settings, the model's
 * arenas and weights for the layout, DDP or ZeRO around the model's blocks,
 * AdamW over this rank's range, the schedule, and the step. Rank r of dp
 * takes rows [(r*A + a)*B, +B) of the global batch for micro-batch a, so
 * every layout trains on the same global batch; each rank back-propagates
 * its micro-batch mean times 1/(A x dp), so the sum over ranks and
 * micro-batches is the global mean. Not here: data, logging (engine/train.c
 * is GPT-2's trainer on top).
 */
#include "engine/engine_impl.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "base/dtype.h"
#include "base/log.h"
#include "base/mem.h"
#include "engine/config.h"
#include "kernels/kernels.h"

void loom_init(int *argc, char ***argv)
{
    loom_comm_init(argc, argv);
}

void loom_finalize(void)
{
    loom_comm_finalize();
}

int loom_engine_agree(const struct loom_engine *e, int rc)
{
    int first;
    int all = loom_comm_agree(rc, &first);
    if (all && first != e->topo.rank) loom_error_clear();
    return all;
}

/* Every rank must run the same settings: compare per-setting fingerprints. */
static int check_same_config(const struct loom_config *cfg)
{
    int n = loom_config_count();
    uint64_t *lo = loom_alloc(sizeof(uint64_t) * (size_t)n, LOOM_MEM_OTHER);
    uint64_t *hi = loom_alloc(sizeof(uint64_t) * (size_t)n, LOOM_MEM_OTHER);
    for (int i = 0; i < n; i++) lo[i] = hi[i] = loom_config_hash(cfg, i, NULL);
    loom_comm_allreduce_sync(LOOM_GROUP_WORLD, loom_buf_of(lo, (size_t)n, LOOM_DTYPE_U64), LOOM_OP_MIN);
    loom_comm_allreduce_sync(LOOM_GROUP_WORLD, loom_buf_of(hi, (size_t)n, LOOM_DTYPE_U64), LOOM_OP_MAX);
    int rc = LOOM_OK;
    for (int i = 0; i < n && rc == LOOM_OK; i++)
        if (lo[i] != hi[i]) {
            const char *flag;
            loom_config_hash(cfg, i, &flag);
            rc = loom_error_set(
                LOOM_ERR_INPUT,
                "ranks disagree on %s: every rank must be started with the same configuration", flag);
        }
    loom_free(lo);
    loom_free(hi);
    return rc;
}

/* Every rank must start from the same weights: compare a checksum of the bits. */
static int check_same_weights(const struct loom_model *m)
{
    uint64_t h[2] = {1469598103934665603ull, 0};
    if (m->dtype) {
        for (size_t i = 0; i < m->num_params; i++) h[0] = (h[0] ^ m->params_lp[i]) * 1099511628211ull;
    } else {
        const uint32_t *w = (const uint32_t *)m->params;
        for (size_t i = 0; i < m->num_params; i++) h[0] = (h[0] ^ w[i]) * 1099511628211ull;
    }
    h[1] = h[0];
    loom_comm_allreduce_sync(LOOM_GROUP_DP, loom_buf_of(&h[0], 1, LOOM_DTYPE_U64), LOOM_OP_MIN);
    loom_comm_allreduce_sync(LOOM_GROUP_DP, loom_buf_of(&h[1], 1, LOOM_DTYPE_U64), LOOM_OP_MAX);
    if (h[0] != h[1])
        return loom_error_set(LOOM_ERR_RUNTIME,
                              "ranks hold different initial weights (checksums %016llx and %016llx)",
                              (unsigned long long)h[0], (unsigned long long)h[1]);
    return LOOM_OK;
}

int loom_engine_init(struct loom_engine **out, struct loom_config *cfg)
{
    struct loom_engine *e = calloc(1, sizeof *e);
    *out = e;
    if (!e) return loom_error_set(LOOM_ERR_RUNTIME, "out of memory");
    e->cfg = cfg;
    int rc = loom_comm_setup(&e->topo, cfg->tensor_model_parallel_size, cfg->pipeline_model_parallel_size);
    loom_comm_set_timeout(cfg->comm_timeout);
    if (rc == LOOM_OK && (e->topo.tp > 1 || e->topo.pp > 1))
        rc = loom_error_set(LOOM_ERR_INPUT,
                            "tensor and pipeline parallelism are not available in this version "
                            "(--tensor-model-parallel-size %d, --pipeline-model-parallel-size %d)",
                            e->topo.tp, e->topo.pp);
    if (rc == LOOM_OK) rc = loom_config_resolve(cfg, e->topo.dp);
    if ((rc = loom_engine_agree(e, rc))) return rc;
    if ((rc = loom_engine_agree(e, check_same_config(cfg)))) return rc;
    if (cfg->threads > 0) loom_threads_set(cfg->threads);
    return LOOM_OK;
}

/* Weights from a file into the model (whole arena): float32, or through a
 * float32 copy rounded into the 16-bit arena under mixed precision. */
static int load_weights_file(struct loom_model *m, const char *path)
{
    if (!m->dtype) return loom_checkpoint_load_weights(m, path);
    float *tmp = loom_alloc(loom_mul_size(m->num_params + 1, sizeof(float)), LOOM_MEM_OTHER);
    for (size_t b = 0, off = 0; b < (size_t)m->nblocks; off += m->blocks[b].numel, b++)
        m->blocks[b].params = tmp + off;
    m->params = tmp;
    int rc = loom_checkpoint_load_weights(m, path);
    m->params = NULL;
    for (int b = 0; b < m->nblocks; b++) m->blocks[b].params = NULL;
    if (rc == LOOM_OK) loom_lp_from_f32(m->params_lp, tmp, m->num_params, (enum loom_dtype)m->dtype);
    loom_free(tmp);
    return rc;
}

static int scaler_init(struct loom_engine *e)
{
    const struct loom_config *cfg = e->cfg;
    struct loom_loss_scaler_config sc;
    loom_loss_scaler_defaults(&sc);
    int power;
    frexp(cfg->initial_loss_scale, &power); /* a power of 2, checked with the config */
    sc.loss_scale = cfg->loss_scale;
    sc.initial_scale_power = power - 1;
    sc.loss_scale_window = cfg->loss_scale_window;
    sc.hysteresis = cfg->hysteresis;
    sc.min_loss_scale = cfg->min_loss_scale;
    e->have_scaler = 1;
    return loom_loss_scaler_init(&e->scaler, &sc);
}

int loom_engine_initialize(struct loom_engine *e, struct loom_model *m)
{
    struct loom_config *cfg = e->cfg;
    const int dp = e->topo.dp;
    e->model = m;
    m->dtype = cfg->bf16 ? LOOM_DTYPE_BF16 : cfg->fp16 ? LOOM_DTYPE_F16 : LOOM_DTYPE_F32;
    /* ZeRO-3 never builds the whole model unless --load names a weights
     * file: each rank initialises it block by block and keeps its shard
     * (loom_zero_init_weights), or reads its shard from the checkpoint. The
     * initialisation draws from (seed, block), and every rank's seed is the
     * same (checked with the config), so no weight check is needed. */
    const int from_dir = *cfg->load && loom_checkpoint_is_dir(cfg->load);
    e->init_sharded = cfg->zero_stage == 3 && dp > 1 && (!*cfg->load || from_dir);
    int arenas =
        (e->init_sharded ? 0 : LOOM_MODEL_PARAM_ARENA) | (cfg->zero_stage < 2 ? LOOM_MODEL_GRAD_ARENA : 0);
    loom_model_alloc_arenas(m, loom_zero_arena_multiple(cfg->zero_stage, dp), arenas);
    int rc = LOOM_OK;
    if (*cfg->load && !from_dir)
        rc = load_weights_file(m, cfg->load);
    else if (!e->init_sharded && !from_dir)
        loom_model_init_weights(m, (uint64_t)cfg->seed);
    if ((rc = loom_engine_agree(e, rc))) return rc;
    if (!e->init_sharded && !from_dir && (rc = loom_engine_agree(e, check_same_weights(m)))) return rc;

    loom_zero_init(&e->zero, cfg->zero_stage, dp, e->topo.dp_rank, m, cfg->zero3_min_params);
    e->have_zero = 1;
    if (e->init_sharded && !from_dir) loom_zero_init_weights(&e->zero, (uint64_t)cfg->seed);
    loom_adamw_init(&e->opt, e->zero.begin, e->zero.end, cfg->adam_beta1, cfg->adam_beta2, cfg->adam_eps,
                    cfg->weight_decay);
    e->have_opt = 1;
    /* master weights from the 16-bit parameters, as DeepSpeed makes them */
    if (m->dtype) loom_adamw_set_master(&e->opt, loom_zero_params_lp(&e->zero), (enum loom_dtype)m->dtype);
    /* with gradient accumulation, mixed precision accumulates in float32 and
     * rounds once per step (DeepSpeed's bf16 optimizer does the same), so the
     * rounded sum does not depend on how the layout splits the batch */
    if (m->dtype && cfg->gradient_accumulation_steps > 1) {
        if (cfg->zero_stage >= 2)
            loom_zero_accumulate_f32(&e->zero);
        else
            m->grads = loom_alloc(loom_mul_size(m->arena_numel, sizeof(float)), LOOM_MEM_GRADS);
    }
    if (cfg->fp16) rc = loom_engine_agree(e, scaler_init(e));
    if (cfg->offload_optimizer == 1)
        loom_log_warn("--offload-optimizer cpu: the CPU backend keeps the optimizer state in host memory "
                      "already; nothing to move");
    if (rc == LOOM_OK && cfg->offload_optimizer == 2)
        rc = loom_engine_agree(
            e, loom_adamw_offload(&e->opt, cfg->nvme_path, (size_t)(cfg->offload_buffer_size * 1e6)));
    if (rc == LOOM_OK && from_dir) {
        const struct loom_ckpt_parts parts = {
            cfg, &e->topo, m, &e->zero, &e->opt, e->have_scaler ? &e->scaler : NULL, 0};
        rc = loom_engine_agree(e, loom_checkpoint_load(&parts, &e->steps, &e->load_io));
        e->resumed = rc == LOOM_OK;
        e->skipped = e->load_io.skipped;
    }
    if (rc) return rc;
    e->sched = loom_lr_schedule_from_config(cfg);
    e->use_ddp = dp > 1 && e->zero.stage < 2;
    if (e->use_ddp) loom_ddp_init(&e->ddp, m, dp, cfg->ddp_bucket_size, !cfg->no_overlap, cfg->ddp_impl == 1);
    if (cfg->grad_reduce_dtype) { /* checked with the config: the compute dtype */
        const enum loom_dtype r = (enum loom_dtype)cfg->grad_reduce_dtype;
        if (e->use_ddp) loom_ddp_reduce_in(&e->ddp, r);
        if (e->zero.stage >= 2) loom_zero_reduce_in(&e->zero, r);
    }
    if (m->dtype) { /* last: in front of the strategy's hooks */
        loom_precision_init(&e->prec, m);
        e->have_prec = 1;
    }
    return LOOM_OK;
}

void loom_engine_free(struct loom_engine *e)
{
    if (!e) return;
    if (e->have_prec) loom_precision_free(&e->prec);
    if (e->use_ddp) loom_ddp_free(&e->ddp);
    if (e->have_zero) loom_zero_free(&e->zero);
    if (e->have_opt) loom_adamw_free(&e->opt);
    free(e);
}

int loom_engine_dp_rank(const struct loom_engine *e)
{
    return e->topo.dp_rank;
}
int loom_engine_dp_size(const struct loom_engine *e)
{
    return e->topo.dp;
}
int loom_engine_accumulation(const struct loom_engine *e)
{
    return e->cfg->gradient_accumulation_steps;
}
int64_t loom_engine_steps_done(const struct loom_engine *e)
{
    return e->steps;
}

int loom_engine_micro_batch_rows(const struct loom_engine *e, int micro)
{
    return (e->topo.dp_rank * e->cfg->gradient_accumulation_steps + micro) * e->cfg->micro_batch_size;
}

float loom_engine_forward(struct loom_engine *e, const void *batch, int rows)
{
    const int A = e->cfg->gradient_accumulation_steps;
    LOOM_ASSERT(e->micro == e->backwards && e->micro < A); /* forward, backward, forward, ... then step */
    if (e->micro == 0) {
        loom_comm_set_step(e->steps + 1);
        loom_model_zero_grad(e->model);
        loom_zero_begin_step(&e->zero);
        e->loss_sum = 0;
    }
    float loss = e->model->ops->forward(e->model, batch, rows);
    e->loss_sum += loss;
    e->micro++;
    return loss;
}

void loom_engine_backward(struct loom_engine *e)
{
    const int A = e->cfg->gradient_accumulation_steps;
    LOOM_ASSERT(e->backwards + 1 == e->micro);
    if (e->use_ddp) loom_ddp_begin_backward(&e->ddp, e->micro == A);
    const double scale = e->have_scaler ? e->scaler.st.scale : 1.0;
    e->model->ops->backward(e->model, (float)(scale / (A * e->topo.dp)));
    e->backwards++;
}

/* Whether block i's reduced gradient, as far as this rank holds it (all of
 * it below stage 2, its part of the shard from stage 2), has an inf or NaN. */
static int block_nonfinite(const struct loom_engine *e, int i)
{
    const struct loom_model *m = e->model;
    const struct loom_zero *z = &e->zero;
    size_t lo = z->block_lo[i], hi = lo + m->blocks[i].numel, base = 0;
    if (z->stage >= 2) {
        lo = lo > z->begin ? lo : z->begin;
        hi = hi < z->end ? hi : z->end;
        base = z->begin;
    }
    if (lo >= hi) return 0;
    if (m->dtype)
        return loom_lp_has_nonfinite((z->stage >= 2 ? z->grad_shard_lp : m->grads_lp) + (lo - base), hi - lo,
                                     (enum loom_dtype)m->dtype);
    return loom_has_nonfinite((z->stage >= 2 ? z->grad_shard : m->grads) + (lo - base), hi - lo);
}

/* The first block, in backward order (the highest), whose gradient is not
 * finite on any rank; -1 when none is. */
static int nonfinite_block(struct loom_engine *e)
{
    int64_t b = -1;
    for (int i = e->model->nblocks - 1; i >= 0 && b < 0; i--)
        if (block_nonfinite(e, i)) b = i;
    uint64_t v = (uint64_t)(b + 1);
    loom_comm_allreduce_sync(LOOM_GROUP_WORLD, loom_buf_of(&v, 1, LOOM_DTYPE_U64), LOOM_OP_MAX);
    return (int)v - 1;
}

int loom_engine_step(struct loom_engine *e, struct loom_step_result *out)
{
    const int A = e->cfg->gradient_accumulation_steps, dp = e->topo.dp;
    LOOM_ASSERT(e->micro == A && e->backwards == A);
    if (e->use_ddp) loom_ddp_finish(&e->ddp);
    loom_zero_finish_backward(&e->zero);
    struct loom_model *m = e->model;
    if (m->dtype && m->grads)
        loom_lp_from_f32(m->grads_lp, m->grads, m->num_params, (enum loom_dtype)m->dtype);
    double loss = e->loss_sum;
    loom_comm_allreduce_sync(LOOM_GROUP_DP, loom_buf_of(&loss, 1, LOOM_DTYPE_F64), LOOM_OP_SUM);
    loss /= (double)A * dp;
    const double scale = e->have_scaler ? e->scaler.st.scale : 1.0;
    double norm = loom_zero_grad_norm(&e->zero) / scale;
    const int64_t step = e->steps + 1;
    /* skipped steps do not advance the schedule (DeepSpeed and Megatron step it only on an update) */
    const double lr = loom_lr_at(&e->sched, (int)(step - e->skipped));
    int skip = 0, rc = LOOM_OK;
    if (!isfinite(norm) || !isfinite(loss)) { /* the same on every rank: both are all-reduced */
        int b = e->have_scaler ? -1 : nonfinite_block(e);
        if (e->have_scaler) {
            skip = 1; /* an fp16 overflow: the scaler's business */
        } else if (e->cfg->on_nonfinite == 1) {
            skip = 1;
            loom_log_warn("step %lld: non-finite loss %g or gradient norm %g (first in block %d, %s); "
                          "skipped (--on-nonfinite skip)",
                          (long long)step, loss, norm, b, b >= 0 ? e->model->blocks[b].tensors[0].name : "-");
        } else {
            rc = loom_error_set(
                LOOM_ERR_RUNTIME,
                "step %lld: the loss (%g) or the gradient norm (%g) is not finite; the first block whose "
                "gradient went non-finite is block %d (%s). --on-nonfinite skip skips such steps",
                (long long)step, loss, norm, b,
                b >= 0 ? e->model->blocks[b].tensors[0].name : "none: the loss alone");
        }
    }
    if (e->have_scaler) {
        enum loom_scaler_verdict v = loom_loss_scaler_update(&e->scaler, skip);
        if (v == LOOM_SCALER_SKIP_AT_MIN)
            rc = loom_error_set(
                LOOM_ERR_RUNTIME,
                "step %lld: fp16 gradients overflow at the minimum loss scale %g: training has diverged",
                (long long)step, e->scaler.cfg.min_loss_scale);
    }
    if (rc == LOOM_OK && !skip) {
        const float grad_scale = (float)(loom_clip_coef(norm, e->cfg->clip_grad) / scale);
        if (e->model->dtype)
            loom_adamw_step_lp(&e->opt, e->model, loom_zero_params_lp(&e->zero), loom_zero_grads_lp(&e->zero),
                               lr, grad_scale);
        else
            loom_adamw_step(&e->opt, e->model, loom_zero_params(&e->zero), loom_zero_grads(&e->zero), lr,
                            grad_scale);
    }
    if (e->have_prec) loom_precision_end_step(&e->prec); /* before ZeRO-3 lets go of the pinned unit */
    loom_zero_after_step(&e->zero);
    e->skipped += skip;
    e->steps = step;
    e->micro = e->backwards = 0;
    if (out)
        *out = (struct loom_step_result){step,
                                         loss,
                                         lr,
                                         norm,
                                         e->use_ddp           ? e->ddp.wait_s
                                         : e->zero.stage >= 2 ? e->zero.wait_s
                                                              : -1,
                                         e->have_scaler ? scale : 0,
                                         skip,
                                         e->skipped};
    return loom_engine_agree(e, rc);
}

int loom_engine_train_batch(struct loom_engine *e, loom_batch_fn get, void *ctx, struct loom_step_result *out)
{
    for (int a = 0; a < e->cfg->gradient_accumulation_steps; a++) {
        const void *batch;
        int rows;
        int rc = get(ctx, e, a, &batch, &rows);
        if (rc) return rc;
        loom_engine_forward(e, batch, rows);
        loom_engine_backward(e);
    }
    return loom_engine_step(e, out);
}

int loom_engine_save(struct loom_engine *e)
{
    const struct loom_ckpt_parts parts = {
        e->cfg, &e->topo, e->model, &e->zero, &e->opt, e->have_scaler ? &e->scaler : NULL, e->skipped};
    int rc = loom_checkpoint_save(&parts, e->steps, &e->save_io);
    if (rc && e->topo.rank != 0) loom_error_clear(); /* every rank holds the message: rank 0 prints it */
    return rc;
}
