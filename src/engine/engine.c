/*
 * The engine (loom/engine.h): ranks and resolved settings, the model's
 * arenas and weights for the layout, the strategy stack around the model's
 * blocks (built in one place, build_stack), AdamW over this rank's range,
 * the schedule of the step's micro-batches, and the step: the stack's
 * finish, one gradient norm over where the stack keeps the gradients, the
 * update, the stack's after-step; no branch on a strategy. Rank r of dp
 * takes rows [(r*A + a)*B, +B) of the global batch for micro-batch a, so
 * every layout trains on the same global batch; each rank back-propagates
 * its micro-batch mean times 1/(A x dp), so the sum over ranks and
 * micro-batches is the global mean. Not here: data, logging (app/train.c
 * is the trainer on top).
 */
#include "engine/engine_impl.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "base/buf.h"
#include "base/clock.h"
#include "base/dtype.h"
#include "base/log.h"
#include "base/mem.h"
#include "base/rng.h"
#include "base/sumsq_exact.h"
#include "base/trace.h"
#include "config/config.h"
#include "io/checkpoint.h"
#include "kernels/backend.h"
#include "kernels/pool.h"
#include "layers/pp_stages.h"
#include "optim/batch_rampup.h"
#include "parallel/schedule.h"
#include "parallel/stack.h"
#include "parallel/tied_stages.h"

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

/* Every rank must start from the same weights: compare a checksum of the
 * bits, downloaded a piece at a time, over the ranks that hold the same
 * tensors (with expert parallelism: the same experts). */
static int check_same_weights(const struct loom_model *m, enum loom_group g)
{
    enum { PIECE = 1 << 16 }; /* elements */
    uint64_t h[2] = {1469598103934665603ull, 0};
    const size_t es = loom_dtype_size(m->dtype);
    LOOM_ASSERT(es == 2 || es == 4);
    void *piece = loom_alloc(PIECE * es, LOOM_MEM_OTHER);
    for (size_t k = 0; k < m->num_params; k += PIECE) {
        const size_t c = m->num_params - k < PIECE ? m->num_params - k : PIECE;
        m->backend->download(piece, (const char *)m->params.data + k * es, c * es);
        if (es == 2) {
            const uint16_t *w = piece;
            for (size_t i = 0; i < c; i++) h[0] = (h[0] ^ w[i]) * 1099511628211ull;
        } else {
            const uint32_t *w = piece;
            for (size_t i = 0; i < c; i++) h[0] = (h[0] ^ w[i]) * 1099511628211ull;
        }
    }
    loom_free(piece);
    h[1] = h[0];
    loom_comm_allreduce_sync(g, loom_buf_of(&h[0], 1, LOOM_DTYPE_U64), LOOM_OP_MIN);
    loom_comm_allreduce_sync(g, loom_buf_of(&h[1], 1, LOOM_DTYPE_U64), LOOM_OP_MAX);
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
    if (cfg->layout_auto && !(cfg->decided & LOOM_DECIDED_LAYOUT))
        return loom_error_set(
            LOOM_ERR_INPUT, "--layout auto is chosen by loom train (it plans a model family's "
                            "layouts); with the engine API give the layout's flags (loom plan prints them)");
    int rc =
        loom_comm_setup_layout(&e->topo, cfg->tensor_model_parallel_size, cfg->pipeline_model_parallel_size,
                               cfg->context_parallel_size > 1 ? cfg->context_parallel_size : 1,
                               cfg->expert_model_parallel_size > 1 ? cfg->expert_model_parallel_size : 1);
    loom_comm_set_timeout(cfg->comm_timeout);
    /* the batch splits over the data ranks: the context ranks of one read the same rows */
    if (rc == LOOM_OK) rc = loom_kinds_resolve(cfg, e->topo.dp / e->topo.cp);
    if ((rc = loom_engine_agree(e, rc))) return rc;
    if ((rc = loom_engine_agree(e, check_same_config(cfg)))) return rc;
    const struct loom_backend *b = loom_backend_get(cfg->backend);
    if (!b) {
        char names[256];
        loom_backend_names(names, sizeof names);
        return loom_error_set(LOOM_ERR_INPUT, "--backend %s: no such backend (there are: %s)", cfg->backend,
                              names);
    }
    loom_backend_use(b);
    /* its threads, and bf16's matrix products on the units the machine has
     * or LOOM_BF16_UNITS names */
    if (b->setup &&
        (rc = loom_engine_agree(e, b->setup(cfg->threads, cfg->bf16 ? LOOM_DTYPE_BF16 : LOOM_DTYPE_F32,
                                            getenv("LOOM_BF16_UNITS")))))
        return rc;
    return LOOM_OK;
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
    e->scaler = loom_alloc(sizeof *e->scaler, LOOM_MEM_OTHER);
    return loom_loss_scaler_init(e->scaler, &sc);
}

/* The strategy stack for the layout: every kind's strategies, in registry
 * order (parallel/kinds.h), which is the stack's (loom/strategy.h): the
 * data-parallel strategies that own the stored parameters and gradients
 * first, mixed precision's float32 working views next, the invariant tree
 * on top. */
int loom_engine_build_stack(struct loom_engine *e)
{
    struct loom_model *m = e->model;
    loom_comm_set_tree_sums(LOOM_GROUP_DP, e->shape.exact_sums);
    /* under expert parallelism: the experts' sums, and ZeRO's dense runs over the expert group */
    loom_comm_set_tree_sums(LOOM_GROUP_EXPERT_DP, e->shape.exact_sums);
    loom_comm_set_tree_sums(LOOM_GROUP_EP, e->shape.exact_sums);
    struct loom_kind_build b = {
        .cfg = e->cfg, .topo = &e->topo, .shape = &e->shape, .model = m, .schedule = &e->pipe_times};
    const int rc = loom_kinds_build(&b, e->state);
    e->boundary = b.boundary;
    return rc;
}

/* The optimizer's view of this rank's parameters and gradients [begin,
 * end): its range of where the stack keeps them. */
static struct loom_buf opt_params(const struct loom_engine *e)
{
    struct loom_state_view v;
    loom_stack_view(e->model, &v);
    if (v.params_runs) return v.params; /* the optimizer's runs' (e->opt.params_by_state) */
    return loom_buf_slice(v.params, e->part.begin - v.params_lo, e->part.end - e->part.begin);
}

static struct loom_buf opt_grads(const struct loom_engine *e)
{
    struct loom_state_view v;
    loom_stack_view(e->model, &v);
    if (v.grads_runs) return v.grads; /* the optimizer's runs' (e->opt.grads_by_state) */
    return loom_buf_slice(v.grads, e->part.begin - v.grads_lo, e->part.end - e->part.begin);
}

/* What a checkpoint reads and writes on this rank: the parameters where the
 * stack keeps them (a shard, or the arena), the optimizer's range, the loss
 * scaler and the skipped steps. */
static struct loom_ckpt_parts ckpt_parts(struct loom_engine *e)
{
    struct loom_state_view v;
    loom_stack_view(e->model, &v);
    return (struct loom_ckpt_parts){.cfg = e->cfg,
                                    .topo = &e->topo,
                                    .model = e->model,
                                    .sharded = e->shape.shard_optimizer,
                                    .part = e->part,
                                    .store = v.params,
                                    .store_lo = v.params_lo,
                                    .store_hi = v.params_hi,
                                    .store_runs = v.params_runs,
                                    .store_nruns = v.params_nruns,
                                    .opt = &e->opt,
                                    .scaler = e->scaler,
                                    .skipped = e->skipped,
                                    .run = e->run};
}

/* This stage's plan of a step, its model chunks' block ranges (runs of
 * consecutive block indices: chunk c holds the c-th run) and the activation
 * slots the plan keeps in flight. */
void loom_engine_plan_schedule(struct loom_engine *e)
{
    const struct loom_config *cfg = e->cfg;
    struct loom_model *m = e->model;
    const int chunks = e->shape.chunks;
    loom_schedule_plan(&e->plan, cfg->pipeline_schedule, e->topo.pp, e->topo.pp_rank, chunks,
                       cfg->gradient_accumulation_steps);
    e->chunk_first = loom_alloc(sizeof(int) * 2 * (size_t)chunks, LOOM_MEM_OTHER);
    e->chunk_last = e->chunk_first + chunks;
    int c = 0;
    e->chunk_first[0] = 0;
    for (int b = 1; b < m->nblocks; b++)
        if (m->blocks[b].index != m->blocks[b - 1].index + 1) {
            e->chunk_last[c++] = b - 1;
            LOOM_ASSERT(c < chunks);
            e->chunk_first[c] = b;
        }
    e->chunk_last[c] = m->nblocks - 1;
    LOOM_ASSERT(c == chunks - 1);
    e->mbs = loom_alloc(sizeof *e->mbs * (size_t)e->plan.slots, LOOM_MEM_OTHER);
    if (m->ops->set_slots)
        m->ops->set_slots(m, e->plan.slots);
    else
        LOOM_ASSERT(e->plan.slots == 1);
}

/* A fresh run identifier, rank 0's on every rank (a resumed run takes the
 * checkpoint's instead, in loom_checkpoint_load). */
static void new_run_id(struct loom_engine *e)
{
    uint64_t id = 0;
    if (e->topo.rank == 0) {
        struct timespec ts;
        clock_gettime(CLOCK_REALTIME, &ts);
        id = loom_hash3((uint64_t)ts.tv_sec, (uint64_t)ts.tv_nsec, (uint64_t)getpid());
    }
    loom_comm_wait(loom_comm_broadcast(LOOM_GROUP_WORLD, loom_buf_of(&id, 1, LOOM_DTYPE_U64), 0));
    snprintf(e->run, sizeof e->run, "%016llx", (unsigned long long)id);
}

enum loom_dtype loom_engine_state_dtype(const struct loom_config *cfg)
{
    return cfg->bf16 ? LOOM_DTYPE_BF16 : cfg->fp16 ? LOOM_DTYPE_F16 : LOOM_DTYPE_F32;
}

void loom_engine_alloc_arenas(struct loom_engine *e)
{
    const int arenas =
        (e->init_sharded ? 0 : LOOM_MODEL_PARAM_ARENA) | (e->shape.shard_grads ? 0 : LOOM_MODEL_GRAD_ARENA);
    loom_model_alloc_arenas(e->model, e->shape.arena_multiple, arenas);
}

void loom_engine_alloc_grad_acc(struct loom_engine *e)
{
    const struct loom_config *cfg = e->cfg;
    struct loom_model *m = e->model;
    if (m->dtype != LOOM_DTYPE_F32 && cfg->gradient_accumulation_steps > 1 && !e->shape.shard_grads)
        m->grad_acc = loom_backend_buf(m->backend, m->arena_numel, LOOM_DTYPE_F32, LOOM_MEM_GRADS);
}

void loom_engine_alloc_optimizer(struct loom_engine *e)
{
    const struct loom_config *cfg = e->cfg;
    /* the runs of the part it owns: with expert parallelism and a sharded
     * optimizer, the experts' and this rank's share of the dense elements */
    struct loom_run *runs = loom_alloc(sizeof *runs * (3 * (size_t)e->model->nblocks + 1), LOOM_MEM_OTHER);
    const int nruns = loom_zero_owned_runs(e->model, e->part, e->shape.shard_optimizer ? e->topo.ep : 1,
                                           e->topo.ep_rank, runs);
    loom_adamw_init(&e->opt, e->model->backend, e->part.begin, e->part.end, runs, nruns, cfg->adam_beta1,
                    cfg->adam_beta2, cfg->adam_eps, cfg->weight_decay,
                    cfg->offload_optimizer == LOOM_OFFLOAD_NVME);
    loom_free(runs);
    e->have_opt = 1;
    if (e->model->dtype != LOOM_DTYPE_F32) loom_adamw_alloc_master(&e->opt);
}

/* What the layout's kinds ask of the model, checked before anything is
 * allocated (parallel/kinds.h: tensor parallelism a model built for this
 * rank's place in the tp group, pipeline parallelism a stage's own blocks
 * and the operations its schedule needs). Collective over the job: every
 * rank reaches the verdict. */
static int check_model_for_layout(struct loom_engine *e, const struct loom_model *m)
{
    return loom_engine_agree(e, loom_kinds_check_model(e->cfg, &e->topo, m));
}

int loom_engine_initialize(struct loom_engine *e, struct loom_model *m)
{
    struct loom_config *cfg = e->cfg;
    const int dp = e->topo.dp;
    if (cfg->offload_auto && !(cfg->decided & LOOM_DECIDED_OFFLOAD))
        return loom_engine_agree(
            e, loom_error_set(LOOM_ERR_INPUT, "--offload auto (and --plugin gemini) is placed by loom train "
                                              "(it counts a model family's memory); with the engine API give "
                                              "--offload-optimizer and --offload-param"));
    loom_kinds_shape(cfg, e->topo.world, &e->shape);
    int rc = check_model_for_layout(e, m);
    if (rc) return rc;
    e->model = m;
    m->dtype = loom_engine_state_dtype(cfg);
    /* A layout that shards the parameters (ZeRO-3) never builds the whole
     * model unless --load names a weights file: each rank initialises it
     * block by block and keeps its shard (the stack's init_weights), or
     * reads its shard from the checkpoint. The
     * initialisation draws from (seed, block), and every rank's seed is the
     * same (checked with the config), so no weight check is needed. */
    const int from_dir = *cfg->load && loom_ckpt_is_checkpoint(cfg->load);
    e->init_sharded = e->shape.shard_params && dp > 1 && (!*cfg->load || from_dir);
    loom_engine_alloc_arenas(e);
    if (*cfg->load && !from_dir)
        rc = loom_checkpoint_load_weights(m, cfg->load); /* rounded to 16 bits under mixed precision */
    else if (!e->init_sharded && !from_dir)
        loom_model_init_weights(m, (uint64_t)cfg->seed);
    if ((rc = loom_engine_agree(e, rc))) return rc;
    if (!e->init_sharded && !from_dir &&
        (rc = loom_engine_agree(
             e, check_same_weights(m, e->topo.ep > 1 ? LOOM_GROUP_EXPERT_DP : LOOM_GROUP_DP))))
        return rc;

    /* with gradient accumulation, mixed precision accumulates in float32 and
     * rounds once per step (DeepSpeed's bf16 optimizer does the same), so the
     * rounded sum does not depend on how the layout splits the batch; from
     * stage 2 the accumulator is ZeRO's float32 shard */
    new_run_id(e);
    loom_engine_alloc_grad_acc(e);
    int zdp, zrank; /* with expert parallelism: over the ranks that hold the same experts */
    loom_zero_ranks(&e->topo, &zdp, &zrank);
    e->part = loom_zero_partition(e->shape.shard_optimizer, zdp, zrank, m);
    if ((rc = loom_engine_agree(e, loom_engine_build_stack(e)))) return rc;
    if (e->init_sharded && !from_dir) loom_stack_init_weights(m, (uint64_t)cfg->seed);
    loom_engine_alloc_optimizer(e);
    /* the optimizer's file first (nothing of its state is ever all in memory) */
    if (cfg->offload_optimizer == LOOM_OFFLOAD_NVME &&
        (rc = loom_engine_agree(e, loom_adamw_offload(&e->opt, cfg->nvme_path,
                                                      (size_t)(cfg->offload_buffer_size * 1e6),
                                                      cfg->offload_direct_io))))
        return rc;
    struct loom_state_view v;
    loom_stack_view(m, &v);
    if (v.param_map) { /* offloaded shards: streamed by the optimizer's chunks */
        e->opt.param_map = v.param_map;
        e->opt.grad_map = v.grad_map;
    }
    /* a view of the owned runs' gradients: the optimizer's runs (loom_zero_owned_runs both) */
    e->opt.grads_by_state = v.grads_runs != NULL;
    e->opt.params_by_state = v.params_runs != NULL;
    LOOM_ASSERT(!v.grads_runs || (v.grads.numel == e->opt.n && v.grads_nruns == e->opt.nruns));
    LOOM_ASSERT(!v.params_runs || (v.params.numel == e->opt.n && v.params_nruns == e->opt.nruns));
    /* master weights from the 16-bit parameters, as DeepSpeed makes them */
    if (m->dtype != LOOM_DTYPE_F32) {
        loom_adamw_set_master(&e->opt, opt_params(e));
        if (e->opt.param_map)
            loom_offload_drop(e->opt.param_map, e->opt.param_map->data, e->opt.param_map->bytes);
    }
    if (cfg->fp16) rc = loom_engine_agree(e, scaler_init(e));
    if (cfg->offload_optimizer == LOOM_OFFLOAD_CPU)
        loom_log_warn("--offload-optimizer cpu: the CPU backend keeps the optimizer state in host memory "
                      "already; nothing to move");
    if (rc == LOOM_OK && from_dir) {
        const struct loom_ckpt_parts parts = ckpt_parts(e);
        rc = loom_engine_agree(e, loom_checkpoint_load(&parts, &e->steps, &e->load_io));
        e->resumed = rc == LOOM_OK;
        e->skipped = e->load_io.skipped;
    }
    if (rc) return rc;
    e->sched = loom_lr_schedule_from_config(cfg);
    e->final_micros = e->step_micros = cfg->gradient_accumulation_steps;
    e->step_batch = cfg->global_batch_size;
    e->consumed_steps = -1;
    if (loom_rampup_on(cfg)) { /* Megatron's: warmup and decay in samples, stepped by each update's batch */
        e->sched_samples = e->sched;
        const int64_t decay = cfg->lr_decay_samples ? cfg->lr_decay_samples : cfg->train_samples;
        e->sched_samples.decay_iters = (int)decay;
        e->sched_samples.warmup_iters =
            (int)(cfg->lr_warmup_samples        ? cfg->lr_warmup_samples
                  : cfg->lr_warmup_fraction > 0 ? (int64_t)(cfg->lr_warmup_fraction * (double)decay)
                                                : (int64_t)cfg->lr_warmup_iters * cfg->global_batch_size);
    }
    loom_engine_plan_schedule(e);
    e->max_slots = e->plan.slots;
    if (m->ops->reserve) m->ops->reserve(m); /* a layout that does not fit fails here, not mid-step */
    return e->app_reports ? LOOM_OK : loom_run_log_open(e);
}

void loom_engine_free(struct loom_engine *e)
{
    if (!e) return;
    loom_run_log_close(e);
    loom_engine_release_state(e);
    free(e);
}

void loom_engine_release_state(struct loom_engine *e)
{
    loom_kinds_release(e->state);
    loom_free(e->scaler);
    loom_schedule_plan_free(&e->plan);
    loom_free(e->mbs);
    loom_free(e->chunk_first);
    if (e->have_opt) loom_adamw_free(&e->opt);
    if (e->model) e->model->stack.n = 0;
    loom_pool_drain();
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
    const int data_rank = e->topo.dp_rank / e->topo.cp; /* a context group's ranks read the same rows */
    return (data_rank * e->cfg->gradient_accumulation_steps + micro) * e->cfg->micro_batch_size;
}

/* ---- one micro-batch: what the schedules call ------------------------------- */

/* The forward of micro-batch `micro` through model chunk `chunk` of this
 * stage, in slot `slot` (in: the previous stage's output, out: for the
 * next; NULL at the model's ends). Micro-batches enter in order, and the
 * step starts with the first. */
static void forward_micro(struct loom_engine *e, struct loom_micro *mb, int micro, int chunk, int slot,
                          const void *batch, int rows, const float *in, float *out)
{
    const int A = e->cfg->gradient_accumulation_steps;
    struct loom_model *m = e->model;
    if (chunk == 0) {
        LOOM_ASSERT(micro == e->micro && micro < A);
        if (micro == 0) {
            loom_run_log_step_begin(e);
            loom_comm_set_step(e->steps + 1);
            loom_model_zero_grad(m);
            loom_stack_begin_step(m);
            e->loss_sum = 0;
        }
        *mb = (struct loom_micro){.slot = slot,
                                  .batch = batch,
                                  .rows = rows,
                                  .micro = micro,
                                  .micros = A,
                                  .step = e->steps + 1,
                                  .first_row = loom_engine_micro_batch_rows(e, micro),
                                  .seed = (uint64_t)e->cfg->seed};
        e->micro++;
    }
    LOOM_ASSERT(mb->micro == micro && mb->slot == slot);
    mb->input = in;
    mb->output = out;
    mb->loss = 0;
    m->ops->forward(m, e->chunk_first[chunk], e->chunk_last[chunk], mb);
    /* a micro-batch loss is a float, as the models compute it; only the stage with the head has one */
    if (e->chunk_last[chunk] == m->nblocks - 1) e->loss_sum += (float)mb->loss;
}

/* Its backward (dout: the next stage's input gradient, din: for the
 * previous stage). Micro-batches leave in order. */
static void backward_micro(struct loom_engine *e, struct loom_micro *mb, int micro, int chunk,
                           const float *dout, float *din)
{
    const int A = e->cfg->gradient_accumulation_steps;
    /* a micro-batch's last backward (through chunk 0) comes in order */
    LOOM_ASSERT(mb->micro == micro && micro >= e->backwards && micro < e->micro &&
                (chunk > 0 || micro == e->backwards));
    struct loom_model *m = e->model;
    loom_stack_begin_backward(m, micro, micro == A - 1);
    mb->doutput = dout;
    mb->dinput = din;
    const double scale = e->scaler ? e->scaler->st.scale : 1.0;
    /* the mean over the data ranks; a context rank's loss is its share of its rows' mean, and the
     * data x context group sums the shares */
    m->ops->backward(m, e->chunk_first[chunk], e->chunk_last[chunk], mb,
                     (float)(scale / (A * (e->topo.dp / e->topo.cp))));
    if (chunk == 0) e->backwards++;
}

float loom_engine_forward(struct loom_engine *e, const void *batch, int rows)
{
    LOOM_ASSERT(e->topo.pp == 1 && e->micro == e->backwards); /* forward, backward, forward, ... then step */
    forward_micro(e, &e->mb, e->micro, 0, 0, batch, rows, NULL, NULL);
    return (float)e->mb.loss;
}

void loom_engine_backward(struct loom_engine *e)
{
    LOOM_ASSERT(e->backwards + 1 == e->micro);
    backward_micro(e, &e->mb, e->backwards, 0, NULL, NULL);
}

/* v's owned run r (grads_runs) as a view of its own, *at its place in v's
 * gradients, advanced past it. */
static struct loom_state_view run_view(const struct loom_state_view *v, int r, size_t *at)
{
    struct loom_state_view part = *v;
    part.grads_runs = NULL;
    part.piece = 0;
    part.grads_lo = v->grads_runs[r].lo;
    part.grads_hi = v->grads_runs[r].hi;
    part.grads = loom_buf_slice(v->grads, *at, part.grads_hi - part.grads_lo);
    *at += part.grads_hi - part.grads_lo;
    return part;
}

/* Whether block i's reduced gradient, as far as this rank holds it (v: all
 * of it, or its part of a shard), has an inf or NaN. */
static int block_nonfinite(const struct loom_engine *e, const struct loom_state_view *v, int i)
{
    const struct loom_block *blk = &e->model->blocks[i];
    if (v->grads_runs) { /* each owned run's part of the block */
        size_t at = 0;
        for (int r = 0; r < v->grads_nruns; r++) {
            const struct loom_state_view part = run_view(v, r, &at);
            if (block_nonfinite(e, &part, i)) return 1;
        }
        return 0;
    }
    const size_t lo = blk->offset > v->grads_lo ? blk->offset : v->grads_lo,
                 hi = blk->offset + blk->numel < v->grads_hi ? blk->offset + blk->numel : v->grads_hi;
    if (lo >= hi) return 0;
    const struct loom_buf g = loom_buf_slice(v->grads, lo - v->grads_lo, hi - lo);
    const struct loom_kernels *k = e->model->backend->k;
    const int bad = g.dtype == LOOM_DTYPE_F32 ? k->has_nonfinite(g.data, g.numel)
                                              : k->lp_has_nonfinite(g.data, g.numel, g.dtype);
    if (v->grad_map) loom_offload_drop(v->grad_map, g.data, loom_buf_bytes(g)); /* offloaded: read, let go */
    return bad;
}

/* The first block, in backward order (the highest), whose gradient is not
 * finite on any rank; -1 when none is. */
static int nonfinite_block(struct loom_engine *e)
{
    struct loom_state_view v;
    loom_stack_view(e->model, &v);
    int64_t b = -1; /* by its index in the whole model: pipeline stages hold different blocks */
    for (int i = e->model->nblocks - 1; i >= 0 && b < 0; i--)
        if (block_nonfinite(e, &v, i)) b = e->model->blocks[i].index;
    uint64_t u = (uint64_t)(b + 1);
    loom_comm_allreduce_sync(LOOM_GROUP_WORLD, loom_buf_of(&u, 1, LOOM_DTYPE_U64), LOOM_OP_MAX);
    return (int)u - 1;
}

/* The first tensor of the block with this index in the whole model, when
 * this rank holds it. */
static const char *block_name(const struct loom_model *m, int index)
{
    for (int i = 0; i < m->nblocks; i++)
        if (m->blocks[i].index == index) return m->blocks[i].tensors[0].name;
    return index >= 0 ? "on another pipeline stage" : NULL;
}

/* ---- the gradient norm ---------------------------------------------------------- */

/* The sum of squares the norm adds up: in double, or exactly (as integers,
 * base/sumsq_exact.h) when the model sums in one order whatever the layout
 * (--layout-invariant), so that no layout changes a bit of it. */
struct squares {
    const struct loom_model *m;
    const struct loom_offload_map *map; /* the view's: a part dropped once read, or NULL */
    int exact_sums;                     /* --layout-invariant: exact sums of squares */
    int experts_apart;                  /* expert parallelism: the experts' squares in ss_experts */
    double ss, ss_experts;
    struct loom_sumsq_exact exact, exact_experts;
};

/* expert: the squares of experts' tensors (ss_experts, exact_experts) */
static void add_squares(struct squares *q, struct loom_buf part, int expert)
{
    const struct loom_model *m = q->m;
    if (q->exact_sums)
        m->backend->k->sumsq_exact_add(expert ? &q->exact_experts : &q->exact, part.data, part.numel,
                                       part.dtype);
    else
        *(expert ? &q->ss_experts : &q->ss) +=
            part.dtype == LOOM_DTYPE_F32 ? m->backend->k->sum_squares(part.data, part.numel)
                                         : m->backend->k->lp_sum_squares(part.data, part.numel, part.dtype);
    if (q->map) loom_offload_drop(q->map, part.data, loom_buf_bytes(part));
}

/* The squares of the gradients view v holds, in its grouping: the tensors
 * this rank counts, one by one, when a strategy counts only some (tensor
 * parallelism's replicated ones, on one rank); else the view's pieces, or
 * its blocks. */
static void sweep(struct squares *q, const struct loom_state_view *v)
{
    const struct loom_model *m = q->m;
    const size_t lo = v->grads_lo, hi = v->grads_hi;
    const int filters = loom_stack_filters_tensors(m);
    if (v->grads_runs) { /* each owned run as a view of its own */
        size_t at = 0;
        for (int r = 0; r < v->grads_nruns; r++) {
            const struct loom_state_view part = run_view(v, r, &at);
            sweep(q, &part);
        }
        return;
    }
    if (q->experts_apart && !filters) { /* each block's dense runs, then its experts' (into ss_experts) */
        for (int bi = 0; bi < m->nblocks; bi++) {
            const struct loom_block *b = &m->blocks[bi];
            const size_t cut[4] = {b->offset, b->offset + b->expert_lo, b->offset + b->expert_hi,
                                   b->offset + b->numel};
            for (int r = 0; r < 3; r++) {
                const size_t a = cut[r] > lo ? cut[r] : lo, z = cut[r + 1] < hi ? cut[r + 1] : hi;
                if (a >= z) continue;
                add_squares(q, loom_buf_slice(v->grads, a - lo, z - a), r == 1);
            }
        }
    } else if (filters) { /* with expert parallelism, the experts' into ss_experts */
        for (int bi = 0; bi < m->nblocks; bi++) {
            const struct loom_block *b = &m->blocks[bi];
            for (int ti = 0; ti < b->ntensors; ti++) {
                const struct loom_tensor *t = &b->tensors[ti];
                const size_t t_lo = b->offset + t->offset, t_hi = t_lo + t->numel;
                const size_t a = t_lo > lo ? t_lo : lo, z = t_hi < hi ? t_hi : hi;
                if (a >= z || !loom_stack_counts_tensor(m, t)) continue;
                add_squares(q, loom_buf_slice(v->grads, a - lo, z - a), q->experts_apart && t->expert);
            }
        }
    } else if (v->piece == 0) {
        for (int bi = 0; bi < m->nblocks; bi++)
            add_squares(q, loom_buf_slice(v->grads, m->blocks[bi].offset - lo, m->blocks[bi].numel), 0);
    } else {
        for (size_t at = 0; at < hi - lo; at += v->piece)
            add_squares(q, loom_buf_slice(v->grads, at, hi - lo - at < v->piece ? hi - lo - at : v->piece),
                        0);
    }
}

/* The global gradient norm over the owners' views: each rank's squares,
 * summed over the data-parallel group when the view is a shard and over
 * the tensor-parallel group (its parts of the split tensors) into the
 * stage's, then over the pipeline's stages: the stages' norms squared, or
 * the exact sums. A group of one rank adds nothing. */
static double grad_norm(const struct loom_engine *e)
{
    const struct loom_model *m = e->model;
    struct loom_state_view v;
    loom_stack_view(m, &v);
    struct squares q = {
        .m = m, .map = v.grad_map, .exact_sums = e->shape.exact_sums, .experts_apart = e->topo.ep > 1};
    sweep(&q, &v);
    if (q.experts_apart && q.exact_sums) { /* as below, in integers */
        uint64_t both[2 * LOOM_SUMSQ_LIMBS];
        loom_sumsq_exact_limbs(&q.exact, both);
        loom_sumsq_exact_limbs(&q.exact_experts, both + LOOM_SUMSQ_LIMBS);
        if (v.grads_split)
            loom_comm_allreduce_sync(LOOM_GROUP_EXPERT_DP,
                                     loom_buf_of(both, 2 * LOOM_SUMSQ_LIMBS, LOOM_DTYPE_U64), LOOM_OP_SUM);
        const int dense_too = v.grads_runs != NULL; /* the dense elements owned apart over the group too */
        loom_comm_allreduce_sync(LOOM_GROUP_EP,
                                 loom_buf_of(both + (dense_too ? 0 : LOOM_SUMSQ_LIMBS),
                                             (dense_too ? 2 : 1) * LOOM_SUMSQ_LIMBS, LOOM_DTYPE_U64),
                                 LOOM_OP_SUM);
        for (int i = 0; i < LOOM_SUMSQ_LIMBS; i++)
            both[i] += both[LOOM_SUMSQ_LIMBS + i]; /* limbs sum as ranks' */
        loom_sumsq_exact_from_limbs(&q.exact, both);
        v.grads_split = 0;
    } else if (q.experts_apart) {
        /* the shards are over the ranks that hold the same experts; then
         * every expert-parallel rank's experts, the dense tensors once */
        double both[2] = {q.ss, q.ss_experts};
        if (v.grads_split)
            loom_comm_allreduce_sync(LOOM_GROUP_EXPERT_DP, loom_buf_of(both, 2, LOOM_DTYPE_F64), LOOM_OP_SUM);
        const int dense_too = v.grads_runs != NULL; /* the dense elements owned apart over the group too */
        loom_comm_allreduce_sync(LOOM_GROUP_EP,
                                 loom_buf_of(&both[dense_too ? 0 : 1], dense_too ? 2 : 1, LOOM_DTYPE_F64),
                                 LOOM_OP_SUM);
        q.ss = both[0] + both[1];
        v.grads_split = 0; /* summed */
    }
    if (q.exact_sums) {
        uint64_t limbs[LOOM_SUMSQ_LIMBS];
        loom_sumsq_exact_limbs(&q.exact, limbs);
        const struct loom_buf b = loom_buf_of(limbs, LOOM_SUMSQ_LIMBS, LOOM_DTYPE_U64);
        if (v.grads_split) loom_comm_allreduce_sync(LOOM_GROUP_DP, b, LOOM_OP_SUM);
        loom_comm_allreduce_sync(LOOM_GROUP_TP, b, LOOM_OP_SUM);
        loom_comm_allreduce_sync(LOOM_GROUP_PP, b, LOOM_OP_SUM);
        loom_sumsq_exact_from_limbs(&q.exact, limbs);
        return sqrt(loom_sumsq_exact_value(&q.exact));
    }
    const struct loom_buf ss = loom_buf_of(&q.ss, 1, LOOM_DTYPE_F64);
    if (v.grads_split) loom_comm_allreduce_sync(LOOM_GROUP_DP, ss, LOOM_OP_SUM);
    loom_comm_allreduce_sync(LOOM_GROUP_TP, ss, LOOM_OP_SUM);
    const double stage = sqrt(q.ss); /* sqrt(stage^2) is stage again: one stage's norm is its own */
    q.ss = stage * stage;
    loom_comm_allreduce_sync(LOOM_GROUP_PP, ss, LOOM_OP_SUM);
    return sqrt(q.ss);
}

int loom_engine_step(struct loom_engine *e, struct loom_step_result *out)
{
    loom_trace_push("optimizer step"); /* the gradients' reduction, norm and clipping, the update */
    const int A = e->cfg->gradient_accumulation_steps, dp = e->topo.dp;
    LOOM_ASSERT(e->micro == A && e->backwards == A);
    struct loom_model *m = e->model;
    loom_stack_finish_backward(m);         /* every reduction landed, every send waited for */
    if (m->grad_acc.data && m->grads.data) /* accumulated in float32: rounded once */
        m->backend->convert(loom_buf_slice(m->grads, 0, m->num_params),
                            loom_buf_slice(m->grad_acc, 0, m->num_params));
    double loss = e->loss_sum; /* under pipelining, summed over the stages already (train_batch) */
    loom_comm_allreduce_sync(LOOM_GROUP_DP, loom_buf_of(&loss, 1, LOOM_DTYPE_F64), LOOM_OP_SUM);
    loss /= (double)A * dp;
    const double scale = e->scaler ? e->scaler->st.scale : 1.0;
    double norm = grad_norm(e) / scale; /* one norm over the owners' views */
    const int64_t step = e->steps + 1;
    /* skipped steps do not advance the schedule (DeepSpeed and Megatron step it only on an update);
     * under a batch rampup it counts samples: this step's with the updates' before it (a resume counts
     * the steps' samples as if the skipped ones came last) */
    const double lr =
        loom_rampup_on(e->cfg)
            ? loom_lr_at(&e->sched_samples,
                         (int)(loom_rampup_consumed(e->cfg, step - 1 - e->skipped) + e->step_batch))
            : loom_lr_at(&e->sched, (int)(step - e->skipped));
    int skip = 0, rc = LOOM_OK;
    if (!isfinite(norm) || !isfinite(loss)) { /* the same on every rank: both are all-reduced */
        int b = e->scaler ? -1 : nonfinite_block(e);
        const char *name = block_name(m, b);
        if (e->scaler) {
            skip = 1; /* an fp16 overflow: the scaler's business */
        } else if (e->cfg->on_nonfinite == LOOM_NONFINITE_SKIP) {
            skip = 1;
            loom_log_warn(
                "step %lld: non-finite loss %g or gradient norm %g (first in block %d, %s); skipped "
                "(--on-nonfinite skip)",
                (long long)step, loss, norm, b, name ? name : "-");
        } else {
            rc = loom_error_set(LOOM_ERR_RUNTIME,
                                "step %lld: the loss (%g) or the gradient norm (%g) is not finite; the first "
                                "block whose gradient went non-finite is block %d (%s). --on-nonfinite skip "
                                "skips such steps",
                                (long long)step, loss, norm, b, name ? name : "none: the loss alone");
        }
    }
    if (e->scaler) {
        enum loom_scaler_verdict v = loom_loss_scaler_update(e->scaler, skip);
        if (v == LOOM_SCALER_SKIP_AT_MIN)
            rc = loom_error_set(
                LOOM_ERR_RUNTIME,
                "step %lld: fp16 gradients overflow at the minimum loss scale %g: training has "
                "diverged",
                (long long)step, e->scaler->cfg.min_loss_scale);
    }
    if (rc == LOOM_OK && !skip) {
        const float grad_scale = (float)(loom_clip_coef(norm, e->cfg->clip_grad) / scale);
        loom_adamw_step(&e->opt, m, opt_params(e), opt_grads(e), lr, grad_scale);
    }
    loom_stack_after_step(m); /* the parameters gathered, fp8's next scales, ... */
    e->skipped += skip;
    e->steps = step;
    e->micro = e->backwards = 0;
    const double wait = loom_stack_comm_wait_s(m);
    const struct loom_step_result res = {step, loss,       lr,           norm, wait, e->scaler ? scale : 0,
                                         skip, e->skipped, e->step_batch};
    if (out) *out = res;
    loom_trace_pop("optimizer step");
    if (rc == LOOM_OK) rc = loom_run_log_step(e, &res);
    return loom_engine_agree(e, rc);
}

/* train_batch through the layout's schedule */
struct batch_source {
    struct loom_engine *e;
    loom_batch_fn get;
    void *ctx;
};

static int source_get(void *ctx, int micro, const void **batch, int *rows)
{
    struct batch_source *s = ctx;
    if (micro == 0) loom_comm_set_step(s->e->steps + 1); /* a deadline here names the step about to run */
    /* a batch that fails on one rank fails on every rank of its data-parallel
     * group (which shares its batch), before the next collective */
    int first, rc = loom_comm_agree_in(LOOM_GROUP_DP, s->get(s->ctx, s->e, micro, batch, rows), &first);
    if (rc && first != s->e->topo.rank) loom_error_clear();
    return rc;
}

static void source_forward(void *ctx, int micro, int chunk, int slot, const void *batch, int rows,
                           const float *in, float *out)
{
    struct loom_engine *e = ((struct batch_source *)ctx)->e;
    forward_micro(e, &e->mbs[slot], micro, chunk, slot, batch, rows, in, out);
}

static void source_backward(void *ctx, int micro, int chunk, int slot, const float *dout, float *din)
{
    struct loom_engine *e = ((struct batch_source *)ctx)->e;
    backward_micro(e, &e->mbs[slot], micro, chunk, dout, din);
}

static const struct loom_schedule_ops engine_schedule_ops = {source_get, source_forward, source_backward};

size_t loom_engine_boundary(const struct loom_engine *e)
{
    return e->boundary;
}

/* --rampup-batch-size: this step's micro-batches into cfg (the schedule's
 * plan for them), restored to the setting's by ramp_end; the global batch
 * setting stays the ramp's end (what the ramp is computed from). */
static void ramp_begin(struct loom_engine *e)
{
    struct loom_config *cfg = e->cfg;
    if (!loom_rampup_on(cfg)) return;
    const int G = loom_rampup_batch(cfg, loom_engine_first_sample(e)),
              A = G / (cfg->global_batch_size / e->final_micros);
    LOOM_ASSERT(A >= 1 && A <= e->final_micros && G % A == 0);
    cfg->gradient_accumulation_steps = A;
    e->step_batch = G;
    if (A != e->step_micros) { /* the schedule's plan of A micro-batches (no more slots than the setting's) */
        loom_schedule_plan_free(&e->plan);
        loom_schedule_plan(&e->plan, cfg->pipeline_schedule, e->topo.pp, e->topo.pp_rank, e->shape.chunks, A);
        LOOM_ASSERT(e->plan.slots <= e->max_slots);
        e->step_micros = A;
    }
}

int64_t loom_engine_first_sample(struct loom_engine *e)
{
    if (!loom_rampup_on(e->cfg)) return e->steps * e->cfg->global_batch_size;
    if (e->consumed_steps != e->steps)
        e->consumed = loom_rampup_consumed(e->cfg, e->steps), e->consumed_steps = e->steps;
    return e->consumed;
}

int loom_engine_step_batch(struct loom_engine *e)
{
    return loom_rampup_on(e->cfg) ? loom_rampup_batch(e->cfg, loom_engine_first_sample(e))
                                  : e->cfg->global_batch_size;
}

static void ramp_end(struct loom_engine *e)
{
    struct loom_config *cfg = e->cfg;
    if (!loom_rampup_on(cfg)) return;
    e->consumed += e->step_batch, e->consumed_steps++;
    cfg->gradient_accumulation_steps = e->final_micros;
}

int loom_engine_train_batch(struct loom_engine *e, loom_batch_fn get, void *ctx, struct loom_step_result *out)
{
    ramp_begin(e);
    struct batch_source s = {e, get, ctx};
    int rc = loom_schedule_run(&e->plan, &engine_schedule_ops, &s, loom_engine_boundary(e), &e->pipe_times);
    if (rc) {
        ramp_end(e);
        return rc;
    }
    /* the head's stage has the loss: every stage learns it, once the last
     * backward anywhere is done; the wait for that is each stage's share of
     * the pipeline's drain, part of its idle time (one stage: none) */
    const double t0 = loom_now();
    loom_comm_allreduce_sync(LOOM_GROUP_PP, loom_buf_of(&e->loss_sum, 1, LOOM_DTYPE_F64), LOOM_OP_SUM);
    const double drain = loom_now() - t0;
    e->pipe_times.wait_s += drain;
    e->pipe_times.total_s += drain;
    rc = loom_engine_step(e, out);
    ramp_end(e);
    return rc;
}

int loom_engine_batches_in_flight(const struct loom_engine *e)
{
    return e->plan.slots;
}

void loom_engine_schedule_times(const struct loom_engine *e, double *compute_s, double *wait_s,
                                double *total_s)
{
    *compute_s = e->pipe_times.compute_s;
    *wait_s = e->pipe_times.wait_s;
    *total_s = e->pipe_times.total_s;
}

/* ---- evaluation through the pipeline -------------------------------------- */

struct eval_source {
    struct loom_engine *e;
    const void *batch;
    int rows, index;
    double loss;
};

static int eval_get(void *ctx, int micro, const void **batch, int *rows)
{
    (void)micro;
    struct eval_source *s = ctx;
    *batch = s->batch;
    *rows = s->rows;
    return LOOM_OK;
}

static void eval_forward(void *ctx, int micro, int chunk, int slot, const void *batch, int rows,
                         const float *in, float *out)
{
    (void)micro;
    struct eval_source *s = ctx;
    struct loom_engine *e = s->e;
    struct loom_model *m = e->model;
    struct loom_micro *mb = &e->mbs[slot];
    if (chunk == 0) *mb = (struct loom_micro){.slot = slot, .batch = batch, .rows = rows, .micro = s->index};
    mb->input = in;
    mb->output = out;
    m->ops->forward(m, e->chunk_first[chunk], e->chunk_last[chunk], mb);
    if (e->chunk_last[chunk] == m->nblocks - 1) s->loss = mb->loss;
}

static void eval_backward(void *ctx, int micro, int chunk, int slot, const float *dout, float *din)
{
    (void)ctx, (void)micro, (void)chunk, (void)slot, (void)dout, (void)din;
    LOOM_ASSERT(!"an evaluation has no backward");
}

float loom_engine_eval(struct loom_engine *e, const void *batch, int rows, int index)
{
    LOOM_ASSERT(e->model); /* an engine that trains */
    if (e->topo.pp == 1) return loom_model_eval(e->model, batch, rows);
    /* every chunk's forward in the model's order, nothing kept for a backward */
    struct loom_pipe_plan plan = {
        .pp = e->topo.pp, .stage = e->topo.pp_rank, .chunks = e->plan.chunks, .micro_batches = 1, .slots = 1};
    plan.passes = loom_alloc(sizeof *plan.passes * (size_t)plan.chunks, LOOM_MEM_OTHER);
    for (int c = 0; c < plan.chunks; c++)
        plan.passes[plan.n++] = (struct loom_pipe_pass){LOOM_PASS_FORWARD, LOOM_PHASE_STEADY, 0, c};
    static const struct loom_schedule_ops ops = {eval_get, eval_forward, eval_backward};
    struct eval_source s = {e, batch, rows, index, 0};
    loom_schedule_run(&plan, &ops, &s, loom_engine_boundary(e), NULL);
    loom_tied_stages_flush();
    loom_schedule_plan_free(&plan);
    return (float)s.loss;
}

int loom_engine_save(struct loom_engine *e)
{
    const struct loom_ckpt_parts parts = ckpt_parts(e);
    int rc = loom_checkpoint_save(&parts, e->steps, &e->save_io);
    if (rc && e->topo.rank != 0) loom_error_clear(); /* every rank holds the message: rank 0 prints it */
    return rc;
}
