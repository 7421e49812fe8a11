/* The transient buffer pool (see pool.h). */
#include "kernels/pool.h"

#include "kernels/backend.h"

enum { POOL = 32 };

struct pooled {
    void *data;
    size_t bytes;
};
static struct pooled pool[POOL];

/* The backend's memory, or the counting window's addresses while a
 * footprint is counted (base/mem.h: nothing touches them) */
static void release(void *p)
{
    if (loom_mem_is_counted(p))
        loom_free(p);
    else
        loom_backend_default()->free(p);
}

static void *take_bytes(size_t bytes, int zeroed, enum loom_mem_tag tag)
{
    const struct loom_backend *b = loom_backend_default();
    for (int i = 0; i < POOL; i++)
        if (pool[i].data && pool[i].bytes == bytes) {
            void *p = pool[i].data;
            pool[i].data = NULL;
            if (loom_mem_is_counted(p)) {
                loom_mem_retag(p, tag);
                return p;
            }
            b->retag(p, tag); /* counted under its new holder's tag */
            if (zeroed) b->memset(p, 0, bytes);
            return p;
        }
    return loom_mem_counting() ? loom_alloc_data(bytes, tag) : b->alloc(bytes, tag);
}

static void give_bytes(void *p, size_t bytes)
{
    if (!p) return;
    for (int i = 0; i < POOL; i++)
        if (!pool[i].data) {
            pool[i] = (struct pooled){p, bytes};
            return;
        }
    release(p);
}

struct loom_buf loom_pool_take(size_t numel, enum loom_dtype dt, int zeroed, enum loom_mem_tag tag)
{
    return loom_buf_of(take_bytes(loom_mul_size(numel ? numel : 1, loom_dtype_size(dt)), zeroed, tag), numel,
                       dt);
}

float *loom_pool_take_f32(size_t n, int zeroed, enum loom_mem_tag tag)
{
    return loom_pool_take(n, LOOM_DTYPE_F32, zeroed, tag).data;
}

void loom_pool_give(struct loom_buf *b)
{
    give_bytes(b->data, (b->numel ? b->numel : 1) * loom_dtype_size(b->dtype));
    b->data = NULL;
}

void loom_pool_give_f32(float *data, size_t n)
{
    struct loom_buf b = loom_buf_f32(data, n);
    loom_pool_give(&b);
}

void loom_pool_drain(void)
{
    for (int i = 0; i < POOL; i++) {
        if (pool[i].data) release(pool[i].data);
        pool[i].data = NULL;
    }
}
