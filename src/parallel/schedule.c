/* Schedules of one step's micro-batches, and running them (see schedule.h). */
#include "parallel/schedule.h"

#include <string.h>

#include "base/clock.h"
#include "base/log.h"
#include "base/mem.h"
#include "comm/comm.h"
#include "kernels/backend.h"
#include "loom/config.h"

/* ---- plans ------------------------------------------------------------------ */

static void plan_start(struct loom_pipe_plan *p, int pp, int stage, int chunks, int m)
{
    LOOM_ASSERT(pp >= 1 && stage >= 0 && stage < pp && chunks >= 1 && m >= 1);
    *p = (struct loom_pipe_plan){.pp = pp, .stage = stage, .chunks = chunks, .micro_batches = m};
    p->passes = loom_alloc(sizeof *p->passes * 2 * (size_t)chunks * (size_t)m, LOOM_MEM_OTHER);
}

static void add(struct loom_pipe_plan *p, enum loom_pass pass, enum loom_phase phase, int micro, int chunk)
{
    LOOM_ASSERT(p->n < 2 * p->chunks * p->micro_batches);
    p->passes[p->n++] = (struct loom_pipe_pass){pass, phase, micro, chunk};
}

/* The most micro-batches between their first forward (chunk 0) and their
 * last backward (chunk 0) at once. */
static void count_slots(struct loom_pipe_plan *p)
{
    int live = 0;
    p->slots = 0;
    for (int i = 0; i < p->n; i++) {
        const struct loom_pipe_pass *x = &p->passes[i];
        if (x->chunk != 0) continue;
        live += x->pass == LOOM_PASS_FORWARD ? 1 : -1;
        if (live > p->slots) p->slots = live;
    }
}

void loom_schedule_no_pipelining(struct loom_pipe_plan *out, int m)
{
    plan_start(out, 1, 0, 1, m);
    for (int k = 0; k < m; k++) {
        add(out, LOOM_PASS_FORWARD, LOOM_PHASE_STEADY, k, 0);
        add(out, LOOM_PASS_BACKWARD, LOOM_PHASE_STEADY, k, 0);
    }
    count_slots(out);
}

void loom_schedule_gpipe(struct loom_pipe_plan *out, int pp, int stage, int m)
{
    plan_start(out, pp, stage, 1, m);
    /* warmup: every forward */
    for (int k = 0; k < m; k++) add(out, LOOM_PASS_FORWARD, LOOM_PHASE_WARMUP, k, 0);
    /* cooldown: every backward */
    for (int k = 0; k < m; k++) add(out, LOOM_PASS_BACKWARD, LOOM_PHASE_COOLDOWN, k, 0);
    count_slots(out);
}

void loom_schedule_1f1b(struct loom_pipe_plan *out, int pp, int stage, int m)
{
    plan_start(out, pp, stage, 1, m);
    const int warmup = pp - stage - 1 < m ? pp - stage - 1 : m;
    /* warmup: the forwards that fill the pipeline below this stage */
    for (int k = 0; k < warmup; k++) add(out, LOOM_PASS_FORWARD, LOOM_PHASE_WARMUP, k, 0);
    /* steady state: one forward, one backward */
    for (int k = 0; k < m - warmup; k++) {
        add(out, LOOM_PASS_FORWARD, LOOM_PHASE_STEADY, warmup + k, 0);
        add(out, LOOM_PASS_BACKWARD, LOOM_PHASE_STEADY, k, 0);
    }
    /* cooldown: the backwards left */
    for (int k = m - warmup; k < m; k++) add(out, LOOM_PASS_BACKWARD, LOOM_PHASE_COOLDOWN, k, 0);
    count_slots(out);
}

/* Megatron's interleaved order: virtual micro-batch j (0 <= j < v m) is
 * micro-batch (j / (P v)) P + j % P through chunk (j % (P v)) / P; the
 * backwards take the chunks in reverse. */
static void virtual_pass(struct loom_pipe_plan *p, enum loom_pass pass, enum loom_phase phase, int j)
{
    const int P = p->pp, v = p->chunks, group = j % (P * v);
    const int chunk = pass == LOOM_PASS_FORWARD ? group / P : v - 1 - group / P;
    add(p, pass, phase, j / (P * v) * P + j % P, chunk);
}

void loom_schedule_interleaved(struct loom_pipe_plan *out, int pp, int stage, int chunks, int m)
{
    plan_start(out, pp, stage, chunks, m);
    const int total = chunks * m;
    /* warmup: twice the stages below this one, and every chunk but the last
     * of the first P micro-batches (all of them when m = P) */
    int warmup = m == pp ? total : (pp - stage - 1) * 2 + (chunks - 1) * pp;
    if (warmup > total) warmup = total;
    for (int j = 0; j < warmup; j++) virtual_pass(out, LOOM_PASS_FORWARD, LOOM_PHASE_WARMUP, j);
    /* steady state */
    for (int j = 0; j < total - warmup; j++) {
        virtual_pass(out, LOOM_PASS_FORWARD, LOOM_PHASE_STEADY, warmup + j);
        virtual_pass(out, LOOM_PASS_BACKWARD, LOOM_PHASE_STEADY, j);
    }
    /* cooldown */
    for (int j = total - warmup; j < total; j++)
        virtual_pass(out, LOOM_PASS_BACKWARD, LOOM_PHASE_COOLDOWN, j);
    count_slots(out);
}

void loom_schedule_plan_free(struct loom_pipe_plan *p)
{
    loom_free(p->passes);
    p->passes = NULL;
    p->n = 0;
}

void loom_schedule_plan(struct loom_pipe_plan *out, int schedule, int pp, int stage, int chunks, int m)
{
    if (pp == 1)
        loom_schedule_no_pipelining(out, m);
    else if (schedule == LOOM_PIPELINE_SCHEDULE_GPIPE)
        loom_schedule_gpipe(out, pp, stage, m);
    else if (schedule == LOOM_PIPELINE_SCHEDULE_INTERLEAVED)
        loom_schedule_interleaved(out, pp, stage, chunks, m);
    else
        loom_schedule_1f1b(out, pp, stage, m);
}

const char *loom_schedule_name(int schedule, int pp)
{
    if (pp == 1) return "no pipelining";
    return schedule == LOOM_PIPELINE_SCHEDULE_GPIPE         ? "gpipe"
           : schedule == LOOM_PIPELINE_SCHEDULE_INTERLEAVED ? "interleaved 1f1b"
                                                            : "1f1b";
}

/* ---- running a plan ----------------------------------------------------------
 * The point-to-point helpers: each does nothing at the model's first
 * (receive forward, send backward) or last (send forward, receive
 * backward) chunk. Activations go forward with one tag and gradients back
 * with another; between two stages each kind arrives in the order it was
 * sent, which is the order both stages run their passes in. So each kind's
 * next receive is posted as soon as the one before is taken, into the
 * other of two buffers: the transfer runs while this stage computes. */

enum { TAG_ACTIVATION = 1, TAG_GRADIENT = 2 };
enum { ACTIVATION = 0, GRADIENT = 1 };

/* The receives of one kind: two buffers, the one posted ahead, and how many
 * are still to come this step. */
struct inbox {
    float *buf[2];
    int next; /* the buffer the posted receive fills */
    struct loom_comm_handle *posted;
    int left;
    int peer, tag;
};

struct runner {
    const struct loom_pipe_plan *p;
    size_t boundary;
    struct inbox in[2];                /* activations from the previous stage, gradients from the next */
    float *send_bufs;                  /* (slots x chunks x 2, boundary): outputs and input gradients */
    struct loom_comm_handle **sending; /* (slots x chunks x 2) the send in flight from each, or NULL */
    const void **batches;              /* (slots) */
    int *rows;                         /* (slots) */
    double wait_s;
};

static int model_first(const struct runner *r, int chunk)
{
    return r->p->stage == 0 && chunk == 0;
}

static int model_last(const struct runner *r, int chunk)
{
    return r->p->stage == r->p->pp - 1 && chunk == r->p->chunks - 1;
}

static int prev_stage(const struct runner *r)
{
    return (r->p->stage + r->p->pp - 1) % r->p->pp;
}

static int next_stage(const struct runner *r)
{
    return (r->p->stage + 1) % r->p->pp;
}

/* The send buffer of (slot, chunk, kind), once its last send is done. */
static float *send_buf(struct runner *r, int slot, int chunk, int kind)
{
    const size_t i = ((size_t)slot * r->p->chunks + chunk) * 2 + (size_t)kind;
    if (r->sending[i]) {
        r->wait_s += loom_comm_wait(r->sending[i]);
        r->sending[i] = NULL;
    }
    return r->send_bufs + i * r->boundary;
}

static void post_send(struct runner *r, int slot, int chunk, int kind, int peer, int tag)
{
    const size_t i = ((size_t)slot * r->p->chunks + chunk) * 2 + (size_t)kind;
    r->sending[i] =
        loom_comm_send(LOOM_GROUP_PP, loom_buf_f32(r->send_bufs + i * r->boundary, r->boundary), peer, tag);
}

static void post_recv(struct runner *r, struct inbox *b)
{
    b->posted = b->left > 0 ? loom_comm_recv(LOOM_GROUP_PP, loom_buf_f32(b->buf[b->next], r->boundary),
                                             b->peer, b->tag)
                            : NULL;
}

/* The next message of a kind (valid until the one after it is taken); the
 * receive after it is posted at once. */
static const float *recv_into(struct runner *r, int kind)
{
    struct inbox *b = &r->in[kind];
    LOOM_ASSERT(b->posted && b->left > 0);
    double t0 = loom_now();
    loom_comm_wait(b->posted);
    r->wait_s += loom_now() - t0;
    const float *got = b->buf[b->next];
    b->left--;
    b->next ^= 1;
    post_recv(r, b);
    return got;
}

/* recv_forward: the previous stage's output, unless this is the model's first chunk. */
static const float *recv_forward(struct runner *r, int chunk)
{
    return model_first(r, chunk) ? NULL : recv_into(r, ACTIVATION);
}

/* send_forward: the output to the next stage, unless this is the model's last chunk. */
static void send_forward(struct runner *r, int slot, int chunk)
{
    if (!model_last(r, chunk)) post_send(r, slot, chunk, 0, next_stage(r), TAG_ACTIVATION);
}

/* recv_backward: the gradient at the output, unless this is the model's last chunk. */
static const float *recv_backward(struct runner *r, int chunk)
{
    return model_last(r, chunk) ? NULL : recv_into(r, GRADIENT);
}

/* send_backward: the gradient at the input, unless this is the model's first chunk. */
static void send_backward(struct runner *r, int slot, int chunk)
{
    if (!model_first(r, chunk)) post_send(r, slot, chunk, 1, prev_stage(r), TAG_GRADIENT);
}

/* The runner's buffers: two receive buffers per direction this stage
 * receives in, a send buffer per slot, chunk and direction; the boundary's
 * (activations and their gradients, which the model's kernels read and
 * write) on the default backend's memory, the bookkeeping on the host. */
static void runner_buffers(struct runner *r)
{
    const struct loom_pipe_plan *p = r->p;
    const struct loom_backend *b = loom_backend_default();
    const size_t nbufs = (size_t)p->slots * p->chunks * 2;
    if (p->pp > 1) {
        r->in[ACTIVATION] = (struct inbox){.peer = prev_stage(r), .tag = TAG_ACTIVATION};
        r->in[GRADIENT] = (struct inbox){.peer = next_stage(r), .tag = TAG_GRADIENT};
        for (int i = 0; i < p->n; i++) { /* the messages this stage will receive */
            const struct loom_pipe_pass *x = &p->passes[i];
            if (x->pass == LOOM_PASS_FORWARD ? !model_first(r, x->chunk) : !model_last(r, x->chunk))
                r->in[x->pass == LOOM_PASS_FORWARD ? ACTIVATION : GRADIENT].left++;
        }
        for (int k = 0; k < 2; k++)
            for (int j = 0; j < 2 && r->in[k].left; j++)
                r->in[k].buf[j] = b->alloc(loom_mul_size(r->boundary, sizeof(float)), LOOM_MEM_COMM);
        r->send_bufs = b->alloc(loom_mul_size(nbufs * r->boundary, sizeof(float)), LOOM_MEM_COMM);
        r->sending = loom_alloc(nbufs * sizeof *r->sending, LOOM_MEM_OTHER);
    }
    r->batches = loom_alloc((size_t)p->slots * sizeof *r->batches, LOOM_MEM_OTHER);
    r->rows = loom_alloc((size_t)p->slots * sizeof *r->rows, LOOM_MEM_OTHER);
}

static void free_runner_buffers(struct runner *r)
{
    const struct loom_backend *b = loom_backend_default();
    for (int k = 0; k < 2; k++) {
        b->free(r->in[k].buf[0]);
        b->free(r->in[k].buf[1]);
    }
    b->free(r->send_bufs);
    loom_free(r->sending);
    loom_free(r->batches);
    loom_free(r->rows);
}

void loom_schedule_replay(const struct loom_pipe_plan *p, size_t boundary)
{
    struct runner r = {.p = p, .boundary = boundary};
    runner_buffers(&r);
    free_runner_buffers(&r);
}

int loom_schedule_run(const struct loom_pipe_plan *p, const struct loom_schedule_ops *ops, void *ctx,
                      size_t boundary, struct loom_schedule_times *times)
{
    const double t_start = loom_now();
    const size_t nbufs = (size_t)p->slots * p->chunks * 2;
    struct runner r = {.p = p, .boundary = boundary};
    runner_buffers(&r);
    if (p->pp > 1)
        for (int k = 0; k < 2; k++) post_recv(&r, &r.in[k]);
    double compute = 0;
    int rc = LOOM_OK;
    for (int i = 0; i < p->n && rc == LOOM_OK; i++) {
        const struct loom_pipe_pass *x = &p->passes[i];
        const int slot = x->micro % p->slots, c = x->chunk;
        if (x->pass == LOOM_PASS_FORWARD) {
            if (c == 0 && (rc = ops->get_batch(ctx, x->micro, &r.batches[slot], &r.rows[slot]))) break;
            const float *in = recv_forward(&r, c);
            float *out = model_last(&r, c) ? NULL : send_buf(&r, slot, c, 0);
            double t0 = loom_now();
            ops->forward(ctx, x->micro, c, slot, r.batches[slot], r.rows[slot], in, out);
            compute += loom_now() - t0;
            send_forward(&r, slot, c);
        } else {
            const float *dout = recv_backward(&r, c);
            float *din = model_first(&r, c) ? NULL : send_buf(&r, slot, c, 1);
            double t0 = loom_now();
            ops->backward(ctx, x->micro, c, slot, dout, din);
            compute += loom_now() - t0;
            send_backward(&r, slot, c);
        }
    }
    for (size_t i = 0; r.sending && i < nbufs; i++)
        if (r.sending[i]) r.wait_s += loom_comm_wait(r.sending[i]);
    for (int k = 0; k < 2; k++)
        if (r.in[k].posted) loom_comm_wait(r.in[k].posted); /* only after a failed batch */
    free_runner_buffers(&r);
    if (times) *times = (struct loom_schedule_times){compute, r.wait_s, loom_now() - t_start};
    return rc;
}
