/* The strategy stack's step-level dispatch (see stack.h and loom/strategy.h);
 * the model's block announcements are model/model.c's. */
#include "parallel/stack.h"

#include <stdio.h>
#include <string.h>

#include "base/log.h"
#include "model/stack_order.h"

void loom_stack_begin_step(struct loom_model *m)
{
    LOOM_STACK_FORWARD(m, begin_step);
}
void loom_stack_begin_backward(struct loom_model *m, int micro, int last)
{
    LOOM_STACK_FORWARD(m, begin_backward, micro, last);
}
void loom_stack_finish_backward(struct loom_model *m)
{
    LOOM_STACK_REVERSE(m, finish_backward);
}
void loom_stack_after_step(struct loom_model *m)
{
    LOOM_STACK_REVERSE(m, after_step);
}

void loom_stack_replay(struct loom_model *m, enum loom_replay_point at, int block, struct loom_replay *r)
{
    if (at == LOOM_REPLAY_POST_FORWARD || at == LOOM_REPLAY_GRADS_READY) {
        LOOM_STACK_REVERSE(m, replay, at, block, r);
    } else {
        LOOM_STACK_FORWARD(m, replay, at, block, r);
    }
}

double loom_stack_comm_wait_s(struct loom_model *m)
{
    double w = -1;
    for (int i = 0; i < m->stack.n; i++)
        if (m->stack.s[i]->comm_wait_s) {
            const double x = m->stack.s[i]->comm_wait_s(m->stack.ctx[i]);
            if (x >= 0) w = (w > 0 ? w : 0) + x;
        }
    return w;
}

void loom_stack_view(const struct loom_model *m, struct loom_state_view *v)
{
    for (int i = 0; i < m->stack.n; i++)
        if (m->stack.s[i]->view && m->stack.s[i]->view(m->stack.ctx[i], v)) return;
    const size_t n = m->num_params;
    *v = (struct loom_state_view){.params = m->params,
                                  .params_hi = n,
                                  .grads = m->grads,
                                  .grads_hi = n,
                                  .piece = m->dtype == LOOM_DTYPE_F32 ? 0 : n};
}

int loom_stack_filters_tensors(const struct loom_model *m)
{
    for (int i = 0; i < m->stack.n; i++)
        if (m->stack.s[i]->counts_tensor) return 1;
    return 0;
}

int loom_stack_counts_tensor(const struct loom_model *m, const struct loom_tensor *t)
{
    for (int i = 0; i < m->stack.n; i++)
        if (m->stack.s[i]->counts_tensor && !m->stack.s[i]->counts_tensor(m->stack.ctx[i], t)) return 0;
    return 1;
}

void loom_stack_init_weights(struct loom_model *m, uint64_t seed)
{
    for (int i = 0; i < m->stack.n; i++)
        if (m->stack.s[i]->init_weights) m->stack.s[i]->init_weights(m->stack.ctx[i], seed);
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
    char text[384];
    for (int i = 0; i < m->stack.n; i++) {
        if (m->stack.s[i]->describe)
            m->stack.s[i]->describe(m->stack.ctx[i], text, sizeof text);
        else
            snprintf(text, sizeof text, "%s", m->stack.s[i]->name);
        line(ctx, text);
    }
}
