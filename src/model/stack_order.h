/*
 * Calling a strategy hook on every member of a model's stack (loom/strategy.h):
 * in stack order on the way in, in reverse on the way out. Shared by the
 * blocks' announcements (model/model.c) and the step-level calls
 * (parallel/stack.c).
 */
#ifndef LOOM_MODEL_STACK_ORDER_H
#define LOOM_MODEL_STACK_ORDER_H

#include "loom/model.h"

#define LOOM_STACK_FORWARD(m, member, ...)                                                                   \
    for (int i_ = 0; i_ < (m)->stack.n; i_++)                                                                \
        if ((m)->stack.s[i_]->member) (m)->stack.s[i_]->member((m)->stack.ctx[i_], ##__VA_ARGS__)
#define LOOM_STACK_REVERSE(m, member, ...)                                                                   \
    for (int i_ = (m)->stack.n - 1; i_ >= 0; i_--)                                                           \
        if ((m)->stack.s[i_]->member) (m)->stack.s[i_]->member((m)->stack.ctx[i_], ##__VA_ARGS__)

#endif
