/* The tied table's exchange between the embedding's and the head's stage (see tied_stages.h). */
#include "parallel/tied_stages.h"

#include <stdio.h>
#include <stdlib.h>

#include "base/buf.h"
#include "base/log.h"
#include "base/mem.h"
#include "comm/comm.h"
#include "kernels/backend.h"

enum { TAG_WEIGHTS = 3, TAG_GRADS = 4 }; /* group ranks: 0 the embedding's stage, 1 the head's */

/* The sends in flight: the table, the step's gradient, the micro-batches' shares. */
static struct loom_comm_handle *weights_sending, *grads_sending;
static struct loom_comm_handle **copies_sending;
static int ncopies, capcopies;

struct tied {
    struct loom_model *model;
    struct loom_tied_stages t;
    int per_micro;  /* --layout-invariant: each micro-batch's share on its own */
    int micros;     /* the setting's micro-batches a step (a batch rampup's steps take fewer) */
    float **copies; /* per_micro, the head's stage: (micros) a buffer of n floats each */
    int in_step, exchanged, backwards;
    int last; /* the backward running is the step's last micro-batch's (the stack's begin_backward) */
};

static const struct loom_backend *be(const struct tied *x)
{
    return x->model->backend;
}

static float *table(const struct tied *x)
{
    return x->model->blocks[x->t.block].work_params; /* the table at the block's offset 0 */
}

static float *table_grad(const struct tied *x)
{
    return x->model->blocks[x->t.block].work_grads;
}

/* The embedding's stage: the copy's gradient received into the send buffer
 * (the table's send is long done), added to the table's. */
static void add_head_share(struct tied *x)
{
    if (weights_sending) {
        loom_comm_wait(weights_sending);
        weights_sending = NULL;
    }
    loom_comm_wait(loom_comm_recv(LOOM_GROUP_EMBEDDING, loom_buf_f32(x->t.grad, x->t.n), 1, TAG_GRADS));
    be(x)->k->accumulate(table_grad(x), x->t.grad, x->t.n);
}

static void begin_step(void *ctx)
{
    struct tied *x = ctx;
    x->in_step = 1;
    x->exchanged = x->backwards = 0;
}

/* The table, at the first forward of a step and of every evaluation. */
static void pre_forward(void *ctx, int block)
{
    struct tied *x = ctx;
    if (block != x->t.block || (x->in_step && x->exchanged)) return;
    x->exchanged = 1;
    const size_t n = x->t.n;
    if (!x->t.holds_head) {
        LOOM_ASSERT(!weights_sending);
        be(x)->copy(x->t.copy, table(x), n * sizeof(float));
        weights_sending = loom_comm_send(LOOM_GROUP_EMBEDDING, loom_buf_f32(x->t.copy, n), 1, TAG_WEIGHTS);
        return;
    }
    loom_comm_wait(loom_comm_recv(LOOM_GROUP_EMBEDDING, loom_buf_f32(x->t.copy, n), 0, TAG_WEIGHTS));
    if (x->in_step) be(x)->memset(x->t.grad, 0, n * sizeof(float));
}

/* Under --layout-invariant: the head's stage starts each micro-batch's
 * share from zero; the embedding's stage adds it before the lookup's own. */
static void pre_backward(void *ctx, int block)
{
    struct tied *x = ctx;
    if (block != x->t.block || !x->per_micro) return;
    if (x->t.holds_head)
        be(x)->memset(x->t.grad, 0, x->t.n * sizeof(float));
    else
        add_head_share(x);
}

static void begin_backward(void *ctx, int micro, int last)
{
    (void)micro;
    ((struct tied *)ctx)->last = last;
}

static void grads_ready(void *ctx, int block)
{
    struct tied *x = ctx;
    if (block != x->t.block) return;
    const int micro = x->backwards++, last = x->last;
    if (!x->t.holds_head) {
        if (!x->per_micro && last) add_head_share(x);
        return;
    }
    if (x->per_micro) { /* from a copy of its own: the next micro-batch writes the gradient again */
        LOOM_ASSERT(micro < x->micros);
        if (ncopies == capcopies) {
            capcopies = capcopies ? 2 * capcopies : 8;
            copies_sending = realloc(copies_sending, sizeof *copies_sending * (size_t)capcopies);
            if (!copies_sending) loom_die("out of memory for the tied table's sends");
        }
        be(x)->copy(x->copies[micro], x->t.grad, x->t.n * sizeof(float));
        copies_sending[ncopies++] =
            loom_comm_send(LOOM_GROUP_EMBEDDING, loom_buf_f32(x->copies[micro], x->t.n), 0, TAG_GRADS);
    } else if (last) {
        LOOM_ASSERT(!grads_sending);
        grads_sending = loom_comm_send(LOOM_GROUP_EMBEDDING, loom_buf_f32(x->t.grad, x->t.n), 0, TAG_GRADS);
    }
}

static void after_step(void *ctx)
{
    struct tied *x = ctx;
    x->in_step = 0;
}

static void describe(void *ctx, char *buf, size_t n)
{
    const struct tied *x = ctx;
    snprintf(buf, n, "tied embedding across stages: this stage %s; the copy's gradient %s",
             x->t.holds_head ? "reads a copy of the table" : "trains the table",
             x->per_micro ? "every micro-batch" : "once a step");
}

static const struct loom_strategy tied_strategy = {.name = "tied",
                                                   .begin_step = begin_step,
                                                   .pre_forward = pre_forward,
                                                   .begin_backward = begin_backward,
                                                   .pre_backward = pre_backward,
                                                   .grads_ready = grads_ready,
                                                   .after_step = after_step,
                                                   .describe = describe};

int loom_tied_stages_build(struct loom_kind_build *b, void **state)
{
    struct loom_model *m = b->model;
    struct loom_tied_stages t;
    if (!m->ops->tied_stages || !m->ops->tied_stages(m, &t)) return LOOM_OK;
    struct tied *x = loom_alloc(sizeof *x, LOOM_MEM_OTHER);
    *x = (struct tied){
        .model = m, .t = t, .per_micro = b->shape->exact_sums, .micros = b->cfg->gradient_accumulation_steps};
    if (x->per_micro && t.holds_head) { /* each micro-batch's share, in flight until the step's end */
        x->copies = loom_alloc(sizeof *x->copies * (size_t)x->micros, LOOM_MEM_OTHER);
        for (int i = 0; i < x->micros; i++)
            x->copies[i] = m->backend->alloc(loom_mul_size(t.n, sizeof(float)), LOOM_MEM_COMM);
    }
    *state = x;
    loom_model_push_strategy(m, &tied_strategy, x);
    return LOOM_OK;
}

void loom_tied_stages_release(void *state)
{
    struct tied *x = state;
    if (!x) return;
    for (int i = 0; x->copies && i < x->micros; i++) x->model->backend->free(x->copies[i]);
    loom_free(x->copies);
    loom_free(x);
}

double loom_tied_stages_flush(void)
{
    double t = 0;
    if (weights_sending) t += loom_comm_wait(weights_sending);
    if (grads_sending) t += loom_comm_wait(grads_sending);
    weights_sending = grads_sending = NULL;
    for (int i = 0; i < ncopies; i++) t += loom_comm_wait(copies_sending[i]);
    ncopies = 0;
    return t;
}
