/*
 * Typed buffers: a pointer with its element count, dtype and device, passed
 * by value. The comm layer, the precision code and (later) the kernel
 * backends take these instead of a bare pointer plus a count plus a dtype,
 * so the MPI type, the 16-bit sum op or a conversion follow from the buffer.
 *
 * A buffer does not own its memory, except one made by loom_buf_alloc (freed
 * by loom_buf_free). Not here: shapes or strides (buffers are flat; shapes
 * stay in comments), reference counts, devices other than the CPU.
 */
#ifndef LOOM_BASE_BUF_H
#define LOOM_BASE_BUF_H

#include <stddef.h>

#include "base/dtype.h"
#include "base/log.h"
#include "base/mem.h"
#include "loom/types.h"

/* enum loom_device and struct loom_buf are public: loom/types.h (a block holds buffers).
 * .data is NULL only when numel is 0, for an in-place all-gather, or for
 * what this rank does not hold. */

/* A CPU buffer over memory the caller owns. */
static inline struct loom_buf loom_buf_of(void *data, size_t numel, enum loom_dtype dt)
{
    struct loom_buf b = {data, numel, dt, LOOM_DEVICE_CPU};
    return b;
}

/* The same over memory only read through the buffer (a send): the const is
 * dropped here and nothing that takes the buffer writes to it. */
static inline struct loom_buf loom_buf_of_const(const void *data, size_t numel, enum loom_dtype dt)
{
    return loom_buf_of((void *)data, numel, dt);
}

static inline struct loom_buf loom_buf_f32(float *data, size_t numel)
{
    return loom_buf_of(data, numel, LOOM_DTYPE_F32);
}

/* data as float *; aborts unless the buffer is F32. */
static inline float *loom_buf_f32_data(struct loom_buf b)
{
    LOOM_ASSERT(b.dtype == LOOM_DTYPE_F32);
    return (float *)b.data;
}

/* Elements [offset, offset + numel) of b; aborts when they run past its end. */
struct loom_buf loom_buf_slice(struct loom_buf b, size_t offset, size_t numel);
/* numel x the dtype's size (overflow checked). */
size_t loom_buf_bytes(struct loom_buf b);

/* A zero-filled CPU buffer from the accounting allocator (base/mem.h), under
 * tag; loom_buf_free releases it and leaves *b empty. */
struct loom_buf loom_buf_alloc(size_t numel, enum loom_dtype dt, enum loom_mem_tag tag);
void loom_buf_free(struct loom_buf *b);

/* dst (n) = src (n) converted to dst's dtype: float32 <-> bf16/fp16 as
 * base/dtype.h rounds; the same dtype is a copy. Other pairs abort. */
void loom_buf_convert(struct loom_buf dst, struct loom_buf src);
/* dst16 (n) = dt(float32(dst16) + src32) for a BF16/F16 dst16 and an F32
 * src32 (loom_lp_accumulate). */
void loom_buf_accumulate(struct loom_buf dst16, struct loom_buf src32);

#endif
