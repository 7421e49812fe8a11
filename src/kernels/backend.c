/*
 * The backend registry and the reference kernel table (see backend.h).
 * A new backend adds its constructor to `registry`. Deliberately not:
 * loading backends at run time, or choosing one per kernel.
 */
#include "kernels/backend.h"

#include <string.h>

#include "kernels/kernels.h"

static const struct loom_kernels ref_kernels = {
    /* plain loops beside the fast kernels */
    .matmul_forward = loom_matmul_forward_ref,
    .matmul_backward = loom_matmul_backward_ref,
    .lm_head_forward = loom_lm_head_forward_ref,
    .lm_head_backward = loom_lm_head_backward_ref,
    .attention_forward = loom_attention_forward_ref,
    .attention_backward = loom_attention_backward_ref,
    /* no separate reference: the CPU kernel is its own */
    .embedding_forward = loom_embedding_forward,
    .embedding_backward = loom_embedding_backward,
    .layernorm_forward = loom_layernorm_forward,
    .layernorm_backward = loom_layernorm_backward,
    .gelu_forward = loom_gelu_forward,
    .gelu_backward = loom_gelu_backward,
    .residual_forward = loom_residual_forward,
    .residual_backward = loom_residual_backward,
    .crossentropy_forward = loom_crossentropy_forward,
    .crossentropy_backward = loom_crossentropy_backward,
    .adamw_update = loom_adamw_update,
    .sum_squares = loom_sum_squares,
    .set_threads = loom_threads_set,
    .get_threads = loom_threads_get,
};

const struct loom_kernels *loom_kernels_ref(void)
{
    return &ref_kernels;
}

static const struct loom_backend *(*const registry[])(void) = {loom_backend_cpu};
#define NREGISTRY ((int)(sizeof registry / sizeof registry[0]))

int loom_backend_count(void)
{
    return NREGISTRY;
}

const struct loom_backend *loom_backend_at(int i)
{
    return i >= 0 && i < NREGISTRY ? registry[i]() : NULL;
}

const struct loom_backend *loom_backend_get(const char *name)
{
    for (int i = 0; i < NREGISTRY; i++)
        if (strcmp(registry[i]()->name, name) == 0) return registry[i]();
    return NULL;
}
