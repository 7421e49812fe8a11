/*
 * The pipeline-parallel kind (kinds.h): --pipeline-model-parallel-size
 * stages, each holding its layers (layers/pp_stages.h) and running the
 * schedule's plan (schedule.h); Megatron's rules for stages and virtual
 * stages; the "pp" strategy, whose wait is the schedule's time blocked on
 * the neighbouring stages and the tied table's sends; the bubble and the
 * boundary's messages in the time model; the sizes and chunks the planner
 * tries.
 */
#include <stdio.h>

#include "base/log.h"
#include "base/mem.h"
#include "config/config.h"
#include "layers/pp_stages.h"
#include "parallel/kinds.h"
#include "parallel/tied_stages.h"

#define F(field) offsetof(struct loom_config, field)
#define NAME(field) loom_config_name_of(cfg, F(field))

/* Megatron's rules: a stage has a layer at least; virtual stages divide
 * the layers. The world's divisibility is checked with the topology. */
static int resolve(struct loom_config *cfg)
{
    const int pp = cfg->pipeline_model_parallel_size, L = cfg->num_layers;
    const int vl = cfg->num_layers_per_virtual_pipeline_stage, first = cfg->decoder_first_pipeline_num_layers,
              last = cfg->decoder_last_pipeline_num_layers;
    if (pp > L)
        return loom_error_set(LOOM_ERR_INPUT, "%s %d exceeds %s %d: every stage needs a layer",
                              NAME(pipeline_model_parallel_size), pp, NAME(num_layers), L);
    if (vl && cfg->pipeline_schedule != LOOM_PIPELINE_SCHEDULE_INTERLEAVED) {
        if (loom_config_given_at(cfg, F(pipeline_schedule)))
            return loom_error_set(LOOM_ERR_INPUT, "%s %d needs %s interleaved (it is %s)",
                                  NAME(num_layers_per_virtual_pipeline_stage), vl, NAME(pipeline_schedule),
                                  loom_config_choice_of(F(pipeline_schedule), cfg->pipeline_schedule));
        cfg->pipeline_schedule = LOOM_PIPELINE_SCHEDULE_INTERLEAVED;
        loom_config_set_derived(cfg, F(pipeline_schedule));
    }
    if (pp > 1 && cfg->pipeline_schedule == LOOM_PIPELINE_SCHEDULE_INTERLEAVED) {
        if (!vl)
            return loom_error_set(LOOM_ERR_INPUT, "%s interleaved needs %s N", NAME(pipeline_schedule),
                                  NAME(num_layers_per_virtual_pipeline_stage));
        if (L % (vl * pp) || L / (vl * pp) < 2)
            return loom_error_set(
                LOOM_ERR_INPUT,
                "%s %d: %s %d is not divisible into %s %d stages of two or more chunks of %d "
                "layers",
                NAME(num_layers_per_virtual_pipeline_stage), vl, NAME(num_layers), L,
                NAME(pipeline_model_parallel_size), pp, vl);
        if (first || last)
            return loom_error_set(LOOM_ERR_INPUT, "%s and %s do not combine with the interleaved schedule",
                                  NAME(decoder_first_pipeline_num_layers),
                                  NAME(decoder_last_pipeline_num_layers));
        const int m = cfg->gradient_accumulation_steps;
        if (m % pp)
            return loom_error_set(LOOM_ERR_INPUT,
                                  "the interleaved schedule needs the micro-batches per step (%s %d) to be a "
                                  "multiple of %s %d",
                                  NAME(gradient_accumulation_steps), m, NAME(pipeline_model_parallel_size),
                                  pp);
    }
    if ((first || last) && pp < 2)
        return loom_error_set(LOOM_ERR_INPUT, "%s and %s need %s 2 or more",
                              NAME(decoder_first_pipeline_num_layers), NAME(decoder_last_pipeline_num_layers),
                              NAME(pipeline_model_parallel_size));
    if (first || last) {
        const int middle = pp - (first > 0) - (last > 0), rest = L - first - last;
        if (rest < middle || (middle == 0 && rest != 0))
            return loom_error_set(LOOM_ERR_INPUT,
                                  "%s %d and %s %d leave %d of %s %d layers for the %d other stages of %s %d "
                                  "(each needs one at least, and none may be left over)",
                                  NAME(decoder_first_pipeline_num_layers), first,
                                  NAME(decoder_last_pipeline_num_layers), last, rest, NAME(num_layers), L,
                                  middle, NAME(pipeline_model_parallel_size), pp);
    }
    return LOOM_OK;
}

static void shape(const struct loom_config *cfg, int world, struct loom_layout_shape *s)
{
    (void)world;
    s->pp = cfg->pipeline_model_parallel_size;
    s->chunks = loom_pp_chunks(cfg);
}

/* ops->boundary_numel, ops->set_slots when this stage's schedule keeps
 * more than one micro-batch in flight, and a stage's own blocks (the
 * stages' models together hold each block of the whole once, in the
 * chunks the schedule runs). */
static int check_model(const struct loom_config *cfg, const struct loom_topology *t,
                       const struct loom_model *m, int rc)
{
    if (t->pp == 1) return rc;
    const int chunks = loom_pp_chunks(cfg);
    struct loom_pipe_plan plan;
    loom_schedule_plan(&plan, cfg->pipeline_schedule, t->pp, t->pp_rank, chunks,
                       cfg->gradient_accumulation_steps);
    const int slots = plan.slots;
    loom_schedule_plan_free(&plan);
    int runs = m->nblocks > 0;
    int64_t held[2] = {m->nblocks, 0}; /* blocks, the whole model's blocks (highest index + 1) */
    for (int b = 0; b < m->nblocks; b++) {
        if (b > 0 && m->blocks[b].index != m->blocks[b - 1].index + 1) runs++;
        if (m->blocks[b].index + 1 > held[1]) held[1] = m->blocks[b].index + 1;
    }
    loom_comm_allreduce_sync(LOOM_GROUP_PP, loom_buf_of(&held[0], 1, LOOM_DTYPE_I64), LOOM_OP_SUM);
    loom_comm_allreduce_sync(LOOM_GROUP_PP, loom_buf_of(&held[1], 1, LOOM_DTYPE_I64), LOOM_OP_MAX);
    if (rc == LOOM_OK && !m->ops->boundary_numel)
        rc = loom_error_set(LOOM_ERR_INPUT,
                            "--pipeline-model-parallel-size %d: the model %s has no boundary_numel "
                            "operation (the activation a stage sends the next; pipeline parallelism "
                            "needs it)",
                            t->pp, m->name);
    else if (rc == LOOM_OK && slots > 1 && !m->ops->set_slots)
        rc = loom_error_set(LOOM_ERR_INPUT,
                            "--pipeline-model-parallel-size %d: the model %s has no set_slots operation, "
                            "and stage %d keeps %d micro-batches in flight (activations for each)",
                            t->pp, m->name, t->pp_rank, slots);
    else if (rc == LOOM_OK && (held[0] != held[1] || runs != chunks))
        rc = loom_error_set(LOOM_ERR_INPUT,
                            "--pipeline-model-parallel-size %d: the stages' models hold %lld blocks of a "
                            "model of %lld, stage %d in %d runs for %d chunks (each stage's model must "
                            "hold its own blocks only, block.index their place in the whole)",
                            t->pp, (long long)held[0], (long long)held[1], t->pp_rank, runs, chunks);
    return rc;
}

/* The "pp" strategy: after the backward, the tied table's sends of the
 * step are waited for (tied_stages.h); its wait is that and the
 * schedule's time blocked on the neighbouring stages (the bubble
 * included). */
struct pp_strategy {
    const struct loom_schedule_times *schedule; /* the last step's */
    int pp;
    double flush_s;
};

static void finish_backward(void *ctx)
{
    struct pp_strategy *p = ctx;
    p->flush_s = loom_tied_stages_flush();
}

static double comm_wait_s(void *ctx)
{
    const struct pp_strategy *p = ctx;
    return p->schedule->wait_s + p->flush_s;
}

static void describe(void *ctx, char *buf, size_t n)
{
    const struct pp_strategy *p = ctx;
    snprintf(buf, n, "pipeline: %d stages; a step's wait: the neighbouring stages and the tied table's sends",
             p->pp);
}

static const struct loom_strategy pp_strategy = {
    .name = "pp", .finish_backward = finish_backward, .comm_wait_s = comm_wait_s, .describe = describe};

/* The strategy, and the activation between stages for the schedule's
 * messages. */
static int build(struct loom_kind_build *b, void **state)
{
    struct loom_model *m = b->model;
    if (b->topo->pp == 1) return LOOM_OK;
    b->boundary = m->ops->boundary_numel(m, b->cfg->micro_batch_size);
    struct pp_strategy *p = loom_alloc(sizeof *p, LOOM_MEM_OTHER);
    *p = (struct pp_strategy){.schedule = b->schedule, .pp = b->topo->pp};
    *state = p;
    loom_model_push_strategy(m, &pp_strategy, p);
    return LOOM_OK;
}

static void release(void *state)
{
    loom_free(state);
}

/* The bubble: (P - 1) / (v m) of the work when stages wait on each other;
 * the activation forward and its gradient back, per micro-batch and model
 * chunk, sent in float32 to the next stage (across nodes when a stage's
 * ranks fill one). */
static struct loom_time_terms time_terms(const struct loom_time_in *in)
{
    const struct loom_config *cfg = in->cfg;
    const struct loom_layout_shape *s = in->shape;
    const int pp = s->pp, L = cfg->num_layers, m = cfg->gradient_accumulation_steps;
    if (pp <= 1) return (struct loom_time_terms){0, 0};
    const int v = cfg->num_layers_per_virtual_pipeline_stage > 0
                      ? L / (pp * cfg->num_layers_per_virtual_pipeline_stage)
                      : 1;
    double bw, lat;
    loom_time_link(in, s->tp * s->dp * 2, &bw, &lat);
    const double bytes = in->act / s->row_ways * (4.0 / in->act_bytes);
    return (struct loom_time_terms){in->work * (pp - 1) / ((double)v * m), 2.0 * m * v * (bytes / bw + lat)};
}

/* Sizes dividing the ranks tensor parallelism leaves and the layers (or
 * the one given); then 1 or 2 chunks a stage, dividing the layers. */
static int plan_choices(const struct loom_plan_space *s, const struct loom_kind_choice *l, int slot, int left,
                        int *out)
{
    const struct loom_config *b = s->base;
    const int L = b->num_layers;
    int n = 0;
    if (slot == 0) {
        const int fix = loom_plan_space_fixed(s, "--pipeline-model-parallel-size");
        for (int pp = 1; pp <= left; pp++) {
            if (left % pp || (fix ? pp != b->pipeline_model_parallel_size : L % pp)) continue;
            LOOM_ASSERT(n < LOOM_KIND_MAX_CHOICES);
            out[n++] = pp;
        }
        return n;
    }
    const int pp = l[LOOM_KIND_PIPELINE].value,
              fix = loom_plan_space_fixed(s, "--num-layers-per-virtual-pipeline-stage");
    const int want = b->num_layers_per_virtual_pipeline_stage > 0 && b->pipeline_model_parallel_size > 0
                         ? L / (b->pipeline_model_parallel_size * b->num_layers_per_virtual_pipeline_stage)
                         : 1;
    for (int v = 1; v <= (pp > 1 ? 2 : 1); v++)
        if (!(fix && v != want) && !(v > 1 && L % (pp * v))) out[n++] = v;
    return n;
}

static int plan_ranks(const struct loom_kind_choice *c)
{
    return c->value;
}

static void plan_apply(struct loom_config *cfg, const struct loom_kind_choice *c)
{
    cfg->pipeline_model_parallel_size = c->value;
    cfg->num_layers_per_virtual_pipeline_stage = c->sub > 1 ? cfg->num_layers / (c->value * c->sub) : 0;
}

static void plan_describe(const struct loom_kind_choice *c, char *buf, size_t n)
{
    int k = 0;
    if (c->value > 1) k = snprintf(buf, n, " x pp %d", c->value);
    if (c->sub > 1) snprintf(buf + k, n - (size_t)k, " (%d chunks)", c->sub);
}

static void plan_flags(const struct loom_kind_choice *c, char *buf, size_t n)
{
    int k = snprintf(buf, n, " --pipeline-model-parallel-size %d", c->value);
    if (c->sub > 1) snprintf(buf + k, n - (size_t)k, " --num-layers-per-virtual-pipeline-stage V/%d", c->sub);
}

/* Its first and last stage: they hold the most (in-flight activations, the
 * embedding, the head). */
static int plan_probes(const struct loom_kind_choice *c, struct loom_topology *t, int probe)
{
    t->pp = c->value;
    t->pp_rank = probe ? c->value - 1 : 0;
    return c->value > 1 ? 2 : 1;
}

const struct loom_kind loom_kind_pipeline = {.name = "pipeline",
                                             .group = LOOM_GROUP_PP,
                                             .resolve = resolve,
                                             .shape = shape,
                                             .check_model = check_model,
                                             .build = build,
                                             .release = release,
                                             .build_inner = loom_tied_stages_build,
                                             .release_inner = loom_tied_stages_release,
                                             .time = time_terms,
                                             .plan_slots = 2,
                                             .plan_choices = plan_choices,
                                             .plan_ranks = plan_ranks,
                                             .plan_apply = plan_apply,
                                             .plan_describe = plan_describe,
                                             .plan_flags = plan_flags,
                                             .plan_probes = plan_probes};
