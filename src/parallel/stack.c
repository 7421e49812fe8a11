/* The strategy stack's dispatch (see stack.h and loom/strategy.h). */
#include "parallel/stack.h"

#include <stdio.h>
#include <string.h>

#include "base/log.h"
#include "base/trace.h"

void loom_model_push_strategy(struct loom_model *m, const struct loom_strategy *s, void *ctx)
{
    LOOM_ASSERT(m->stack.n < LOOM_STRATEGY_MAX);
    m->stack.s[m->stack.n] = s;
    m->stack.ctx[m->stack.n] = ctx;
    m->stack.n++;
}

int loom_model_strategy_index(const struct loom_model *m, const void *ctx)
{
    for (int i = 0; i < m->stack.n; i++)
        if (m->stack.ctx[i] == ctx) return i;
    return -1;
}

/* in stack order: the way in */
#define FORWARD_ORDER(m, member, ...)                                                                        \
    for (int i_ = 0; i_ < (m)->stack.n; i_++)                                                                \
        if ((m)->stack.s[i_]->member) (m)->stack.s[i_]->member((m)->stack.ctx[i_], ##__VA_ARGS__)
/* in reverse: the way out */
#define REVERSE_ORDER(m, member, ...)                                                                        \
    for (int i_ = (m)->stack.n - 1; i_ >= 0; i_--)                                                           \
        if ((m)->stack.s[i_]->member) (m)->stack.s[i_]->member((m)->stack.ctx[i_], ##__VA_ARGS__)

/* The trace's name of a pass over block b: "forward layer 3", "backward head". */
static const char *pass_name(char *buf, size_t n, const struct loom_model *m, int b, const char *pass)
{
    LOOM_ASSERT(b >= 0 && b < m->nblocks);
    const struct loom_block *blk = &m->blocks[b];
    if (blk->role == LOOM_ROLE_LAYER)
        snprintf(buf, n, "%s layer %d", pass, blk->layer);
    else
        snprintf(buf, n, "%s %s", pass, blk->role == LOOM_ROLE_EMBEDDING ? "embedding" : "head");
    return buf;
}

void loom_model_forward_begin(struct loom_model *m, int b)
{
    char name[64];
    if (loom_trace_on()) loom_trace_push(pass_name(name, sizeof name, m, b, "forward"));
    FORWARD_ORDER(m, pre_forward, b);
}
void loom_model_forward_end(struct loom_model *m, int b)
{
    char name[64];
    REVERSE_ORDER(m, post_forward, b);
    if (loom_trace_on()) loom_trace_pop(pass_name(name, sizeof name, m, b, "forward"));
}
void loom_model_backward_begin(struct loom_model *m, int b)
{
    char name[64];
    if (loom_trace_on()) loom_trace_push(pass_name(name, sizeof name, m, b, "backward"));
    FORWARD_ORDER(m, pre_backward, b);
}
void loom_model_grads_ready(struct loom_model *m, int b)
{
    char name[64];
    REVERSE_ORDER(m, grads_ready, b);
    /* LOOM_GRAD_READY_TIED_HEAD (negative) is no block's end */
    if (b >= 0 && loom_trace_on()) loom_trace_pop(pass_name(name, sizeof name, m, b, "backward"));
}

void loom_stack_begin_step(struct loom_model *m)
{
    FORWARD_ORDER(m, begin_step);
}
void loom_stack_begin_backward(struct loom_model *m, int micro, int last)
{
    FORWARD_ORDER(m, begin_backward, micro, last);
}
void loom_stack_finish_backward(struct loom_model *m)
{
    REVERSE_ORDER(m, finish_backward);
}
void loom_stack_after_step(struct loom_model *m)
{
    REVERSE_ORDER(m, after_step);
}

double loom_stack_comm_wait_s(struct loom_model *m)
{
    double w = -1;
    for (int i = 0; i < m->stack.n; i++)
        if (m->stack.s[i]->comm_wait_s) {
            double x = m->stack.s[i]->comm_wait_s(m->stack.ctx[i]);
            if (x > w) w = x;
        }
    return w;
}

void loom_stack_format(const struct loom_model *m, char *buf, size_t n)
{
    snprintf(buf, n, "%s", m->stack.n ? "" : "none");
    for (int i = 0; i < m->stack.n; i++) {
        size_t l = strlen(buf);
        snprintf(buf + l, n - l, "%s%s", i ? " > " : "", m->stack.s[i]->name);
    }
}

void loom_stack_describe(const struct loom_model *m, void (*line)(void *ctx, const char *text), void *ctx)
{
    char text[256];
    for (int i = 0; i < m->stack.n; i++) {
        if (m->stack.s[i]->describe)
            m->stack.s[i]->describe(m->stack.ctx[i], text, sizeof text);
        else
            snprintf(text, sizeof text, "%s", m->stack.s[i]->name);
        line(ctx, text);
    }
}
