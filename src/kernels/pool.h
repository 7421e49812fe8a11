/*
 * A pool of transient typed buffers reused by size: the per-block buffers
 * that every step needs again with the same sizes (ZeRO's gathered units and
 * gradient flights, DDP's float32 buckets under mixed precision, mixed
 * precision's float32 working copies). Fresh pages would cost a fault and a
 * clear each time. A buffer is matched by its size in bytes and counted
 * under the tag of whoever took it last. Not thread-safe: the compute
 * thread only. The engine drains it when it is freed. Its memory is the
 * default backend's (kernels/backend.h).
 */
#ifndef LOOM_KERNELS_POOL_H
#define LOOM_KERNELS_POOL_H

#include <stddef.h>

#include "base/buf.h"
#include "base/mem.h"

/* A buffer of numel elements of dt (zeroed when asked), from the pool or new. */
struct loom_buf loom_pool_take(size_t numel, enum loom_dtype dt, int zeroed, enum loom_mem_tag tag);
/* float32 shorthand: the data of loom_pool_take(n, F32, ...). */
float *loom_pool_take_f32(size_t n, int zeroed, enum loom_mem_tag tag);
/* Back to the pool (freed when the pool is full); *b is left empty. */
void loom_pool_give(struct loom_buf *b);
void loom_pool_give_f32(float *data, size_t n);
/* Frees every pooled buffer. */
void loom_pool_drain(void);

#endif
