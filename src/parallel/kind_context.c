/*
 * The context-parallel kind (kinds.h): --context-parallel-size N splits
 * each sequence over N ranks (layers/context.h: 2N chunks, rank r holding
 * chunks r and 2N-1-r), which meet in attention as --cp-comm-type says.
 * Its ranks are part of the data-parallel group (comm/comm.h: the data x
 * context group, Megatron's data-parallel group with context parallel):
 * they read the same rows of the batch, and DDP's and ZeRO's reductions
 * and shards span them, so its own strategy is none. Here: its settings'
 * rules, its share of the shape, its attention traffic in the time model,
 * the sizes the planner tries.
 */
#include <stdio.h>

#include "base/log.h"
#include "config/config.h"
#include "layers/context.h"
#include "layers/tp_exact.h"
#include "parallel/kinds.h"

/* Attention's all-to-alls block it: all of their time is exposed. */
static double comm_wait_s(void *ctx)
{
    (void)ctx;
    return loom_cp_comm_take_s();
}

static void describe(void *ctx, char *buf, size_t n)
{
    const struct loom_topology *t = ctx;
    snprintf(buf, n,
             "context parallelism: rank %d of %d holds chunks %d and %d of each sequence's %d; attention's "
             "exchanges counted as its wait",
             t->cp_rank, t->cp, t->cp_rank, 2 * t->cp - 1 - t->cp_rank, 2 * t->cp);
}

static const struct loom_strategy cp_strategy = {
    .name = "cp", .comm_wait_s = comm_wait_s, .describe = describe};

static int build(struct loom_kind_build *b, void **state)
{
    (void)state;
    if (b->topo->cp > 1) loom_model_push_strategy(b->model, &cp_strategy, (void *)b->topo);
    return LOOM_OK;
}

#define F(field) offsetof(struct loom_config, field)
#define NAME(field) loom_config_name_of(cfg, F(field))

static int resolve(struct loom_config *cfg)
{
    const int cp = cfg->context_parallel_size;
    if (cp <= 1) return LOOM_OK;
    if (cfg->seq_length % (2 * cp))
        return loom_error_set(
            LOOM_ERR_INPUT, "%s %d cuts each sequence into %d chunks: %s %d is not divisible by %d",
            NAME(context_parallel_size), cp, 2 * cp, NAME(seq_length), cfg->seq_length, 2 * cp);
    if (cfg->attention_backend == LOOM_ATTN_BACKEND_UNFUSED ||
        cfg->attention_backend == LOOM_ATTN_BACKEND_LOCAL)
        return loom_error_set(
            LOOM_ERR_INPUT,
            "%s splits the fused attention: %s %s keeps (T,T) probabilities of whole sequences",
            NAME(context_parallel_size), NAME(attention_backend),
            cfg->attention_backend == LOOM_ATTN_BACKEND_UNFUSED ? "unfused" : "local");
    const int n = cfg->layout_invariant;
    if (n && n % cp)
        return loom_error_set(LOOM_ERR_INPUT,
                              "%s %d is not a multiple of %s %d: each context rank takes whole row blocks",
                              NAME(layout_invariant), n, NAME(context_parallel_size), cp);
    if (n && cfg->num_experts > 0)
        return loom_error_set(LOOM_ERR_INPUT,
                              "%s with %s does not take a mixture of experts yet (%s %d): the router's sums "
                              "over the tokens are split",
                              NAME(layout_invariant), NAME(context_parallel_size), NAME(num_experts),
                              cfg->num_experts);
    if (n && !loom_tp_exact_block_rows(cfg->seq_length, n))
        return loom_error_set(
            LOOM_ERR_INPUT,
            "%s %d with %s cuts each sequence into %d row blocks of at least %d rows: %s %d "
            "is not %d of them",
            NAME(layout_invariant), n, NAME(context_parallel_size), 2 * n, LOOM_TP_EXACT_MIN_BLOCK,
            NAME(seq_length), cfg->seq_length, 2 * n);
    const int tp = cfg->tensor_model_parallel_size;
    if (n && cfg->sequence_parallel && (2 * n * cfg->micro_batch_size) % (cp * tp))
        return loom_error_set(
            LOOM_ERR_INPUT,
            "%s %d with %s %d and %s %d: a tensor-parallel rank's rows of a micro-batch of "
            "%d are not whole row blocks (2N x the micro-batch size, %d, is not divisible by %d)",
            NAME(layout_invariant), n, NAME(context_parallel_size), cp, NAME(tensor_model_parallel_size), tp,
            cfg->micro_batch_size, 2 * n * cfg->micro_batch_size, cp * tp);
    if (cfg->sequence_parallel && (cfg->seq_length / cp) % tp)
        return loom_error_set(LOOM_ERR_INPUT,
                              "%s with %s %d: a context rank's %d tokens are not divisible by %s %d",
                              NAME(sequence_parallel), NAME(context_parallel_size), cp, cfg->seq_length / cp,
                              NAME(tensor_model_parallel_size), tp);
    return LOOM_OK;
}

static void shape(const struct loom_config *cfg, int world, struct loom_layout_shape *s)
{
    (void)world;
    s->cp = cfg->context_parallel_size > 1 ? cfg->context_parallel_size : 1;
}

/* Bytes a layer moves per micro-batch, in activations' worth of a rank's
 * (B T/cp) rows of its heads (act; keys and values counted as one, as
 * grouped heads make them at most): a2a's all-to-alls move (cp - 1) / cp
 * of q, k, v and the output forward, of the output, its gradient and dq,
 * dk, dv backward; all_gather gathers the keys and values forward and
 * again backward and reduce-scatters their gradients; p2p passes cp - 1
 * blocks of them forward, and backward cp - 1 blocks and cp blocks of
 * their gradients. None of it hidden (the forward's ring runs beside the
 * tiles, but no model of that overlap is made). Full recomputation's
 * second forward repeats the forward's. */
static struct loom_time_terms time_terms(const struct loom_time_in *in)
{
    const struct loom_layout_shape *s = in->shape;
    const int cp = s->cp;
    if (cp <= 1) return (struct loom_time_terms){0, 0};
    double bw, lat;
    loom_time_link(in, s->tp * cp, &bw, &lat);
    const double act = in->act / s->tp, share = (double)(cp - 1) / cp, passes = in->full ? 2 : 1;
    double bytes, msgs;
    if (in->cfg->cp_comm_type == LOOM_CP_COMM_A2A)
        bytes = (passes * 4 + 6) * act * share, msgs = passes * 2 + 3;
    else if (in->cfg->cp_comm_type == LOOM_CP_COMM_ALL_GATHER)
        bytes = (passes + 2) * act * (cp - 1), msgs = passes + 2;
    else
        bytes = (passes * (cp - 1) + 2 * cp - 1) * act, msgs = passes * (cp - 1) + 2 * cp - 1;
    return (struct loom_time_terms){0, ((double)in->cfg->num_layers / s->pp) *
                                           in->cfg->gradient_accumulation_steps *
                                           (bytes / bw + msgs * (cp - 1) * lat)};
}

/* Sizes dividing what tensor and pipeline parallelism leave and the
 * sequence's 2 cp chunks (and under --layout-invariant N, dividing N with
 * the sequence in row blocks); the user's size when given. */
static int plan_choices(const struct loom_plan_space *s, const struct loom_kind_choice *l, int slot, int left,
                        int *out)
{
    (void)l, (void)slot;
    const struct loom_config *b = s->base;
    const int fix = loom_plan_space_fixed(s, "--context-parallel-size");
    int n = 0;
    for (int cp = 1; cp <= left; cp++) {
        if (left % cp || (fix ? cp != b->context_parallel_size : b->seq_length % (2 * cp) && cp > 1))
            continue;
        if (!fix && cp > 1 &&
            (b->seq_length < 4096 || /* long sequences only */
             (b->cp_comm_type == LOOM_CP_COMM_A2A && b->num_attention_heads % cp) ||
             (b->layout_invariant && (b->layout_invariant % cp || /* whole row blocks a rank */
                                      !loom_tp_exact_block_rows(b->seq_length, b->layout_invariant)))))
            continue;
        LOOM_ASSERT(n < LOOM_KIND_MAX_CHOICES);
        out[n++] = cp;
    }
    return n;
}

static int plan_ranks(const struct loom_kind_choice *c)
{
    return c->value;
}

static void plan_apply(struct loom_config *cfg, const struct loom_kind_choice *c)
{
    cfg->context_parallel_size = c->value;
}

static void plan_describe(const struct loom_kind_choice *c, char *buf, size_t n)
{
    if (c->value > 1) snprintf(buf, n, " x cp %d", c->value);
}

static void plan_flags(const struct loom_kind_choice *c, char *buf, size_t n)
{
    if (c->value > 1)
        snprintf(buf, n, " --context-parallel-size %d", c->value); /* the comm type the user's */
}

/* Its rank 0: every context rank holds as much. */
static int plan_probes(const struct loom_kind_choice *c, struct loom_topology *t, int probe)
{
    (void)probe;
    t->cp = c->value;
    t->cp_rank = 0;
    return 1;
}

const struct loom_kind loom_kind_context = {.name = "context",
                                            .group = LOOM_GROUP_CP,
                                            .resolve = resolve,
                                            .shape = shape,
                                            .build = build,
                                            .time = time_terms,
                                            .plan_slots = 1,
                                            .plan_choices = plan_choices,
                                            .plan_ranks = plan_ranks,
                                            .plan_apply = plan_apply,
                                            .plan_describe = plan_describe,
                                            .plan_flags = plan_flags,
                                            .plan_probes = plan_probes};
