/*
 * A pool of transient float buffers reused by size: the per-block buffers
 * that every step needs again with the same sizes (ZeRO's gathered units and
 * gradient flights, mixed precision's float32 working copies). Fresh pages
 * would cost a fault and a clear each time. Buffers are counted under the
 * tag given when first allocated. Not thread-safe: the compute thread only.
 */
#ifndef LOOM_BASE_POOL_H
#define LOOM_BASE_POOL_H

#include <stddef.h>

#include "base/mem.h"

/* A buffer of n floats (zeroed when asked), from the pool or new. */
float *loom_pool_take(size_t n, int zeroed, enum loom_mem_tag tag);
/* Back to the pool (freed when the pool is full). */
void loom_pool_give(float *buf, size_t n);
/* Frees every pooled buffer. */
void loom_pool_drain(void);

#endif
