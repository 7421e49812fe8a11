/*
 * The backend registry and the reference kernel table (see backend.h).
 * A new backend adds its constructor to `registry`. Deliberately not:
 * loading backends at run time, or choosing one per kernel.
 */
#include "kernels/backend.h"

#include <stdio.h>
#include <string.h>

#include "kernels/kernels.h"

/* The CPU table with the plain loops in place of the fast kernels that
 * have one; every other kernel is its own reference. */
const struct loom_kernels *loom_kernels_ref(void)
{
    static struct loom_kernels ref;
    static int made;
    if (!made) {
        ref = *loom_backend_cpu()->k;
        ref.matmul_forward = loom_matmul_forward_ref;
        ref.matmul_backward = loom_matmul_backward_ref;
        ref.lm_head_forward = loom_lm_head_forward_ref;
        ref.lm_head_backward = loom_lm_head_backward_ref;
        ref.lm_head_forward_lp = loom_lm_head_forward_lp_ref;
        ref.lm_head_backward_lp = loom_lm_head_backward_lp_ref;
        ref.linear_forward = loom_linear_forward_ref;
        ref.linear_backward = loom_linear_backward_ref;
        ref.grouped_forward = loom_grouped_forward_ref;
        ref.grouped_backward = loom_grouped_backward_ref;
        ref.attention_forward = loom_attention_forward_ref;
        ref.attention_backward = loom_attention_backward_ref;
        ref.flash_attention_forward = loom_flash_attention_forward_ref;
        ref.flash_attention_backward = loom_flash_attention_backward_ref;
        ref.has_nonfinite = loom_has_nonfinite_ref;
        made = 1;
    }
    return &ref;
}

const struct loom_kernels *loom_backend_kernels(const struct loom_backend *b, enum loom_dtype compute)
{
    return b->kernels_for ? b->kernels_for(compute) : b->k;
}

static const struct loom_backend *(*const registry[])(void) = {loom_backend_cpu, loom_backend_guarded};
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

struct loom_buf loom_backend_buf(const struct loom_backend *b, size_t numel, enum loom_dtype dt,
                                 enum loom_mem_tag tag)
{
    return loom_buf_of(b->alloc(loom_mul_size(numel, loom_dtype_size(dt)), tag), numel, dt);
}

void loom_backend_buf_free(const struct loom_backend *b, struct loom_buf *buf)
{
    if (buf->data) b->free(buf->data); /* an empty buffer: nothing (and maybe no backend yet) */
    buf->data = NULL;
    buf->numel = 0;
}

static const struct loom_backend *in_use;

const struct loom_backend *loom_backend_default(void)
{
    return in_use ? in_use : loom_backend_cpu();
}

void loom_backend_use(const struct loom_backend *b)
{
    in_use = b;
}

void loom_backend_names(char *buf, size_t n)
{
    size_t used = 0;
    if (n) buf[0] = 0;
    for (int i = 0; i < NREGISTRY && used < n; i++)
        used += (size_t)snprintf(buf + used, n - used, "%s%s", i ? ", " : "", registry[i]()->name);
}
