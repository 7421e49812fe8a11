/*
 * Typed buffers (see buf.h): slicing with bounds checks, allocation through
 * the accounting allocator, and dtype conversion over base/dtype.c's array
 * functions. CPU only.
 */
#include "base/buf.h"

#include <stdint.h>
#include <string.h>

struct loom_buf loom_buf_slice(struct loom_buf b, size_t offset, size_t numel)
{
    LOOM_ASSERT(offset <= b.numel && numel <= b.numel - offset);
    struct loom_buf s = b;
    s.data = b.data ? (char *)b.data + offset * loom_dtype_size(b.dtype) : NULL;
    s.numel = numel;
    return s;
}

size_t loom_buf_bytes(struct loom_buf b)
{
    return loom_mul_size(b.numel, loom_dtype_size(b.dtype));
}

struct loom_buf loom_buf_alloc(size_t numel, enum loom_dtype dt, enum loom_mem_tag tag)
{
    LOOM_ASSERT(dt >= 0 && dt < LOOM_DTYPE_COUNT);
    return loom_buf_of(loom_alloc(loom_mul_size(numel, loom_dtype_size(dt)), tag), numel, dt);
}

void loom_buf_free(struct loom_buf *b)
{
    loom_free(b->data);
    b->data = NULL;
    b->numel = 0;
}

static int is_lp(enum loom_dtype dt)
{
    return dt == LOOM_DTYPE_BF16 || dt == LOOM_DTYPE_F16;
}

void loom_buf_convert(struct loom_buf dst, struct loom_buf src)
{
    LOOM_ASSERT(dst.numel == src.numel);
    LOOM_ASSERT(dst.device == LOOM_DEVICE_CPU && src.device == LOOM_DEVICE_CPU);
    if (dst.dtype == src.dtype) {
        if (dst.numel && dst.data != src.data) memcpy(dst.data, src.data, loom_buf_bytes(src));
    } else if (src.dtype == LOOM_DTYPE_F32 && is_lp(dst.dtype)) {
        loom_lp_from_f32((uint16_t *)dst.data, (const float *)src.data, src.numel, dst.dtype);
    } else if (is_lp(src.dtype) && dst.dtype == LOOM_DTYPE_F32) {
        loom_lp_to_f32((float *)dst.data, (const uint16_t *)src.data, src.numel, src.dtype);
    } else {
        LOOM_ASSERT(!"loom_buf_convert: no conversion between these dtypes");
    }
}

void loom_buf_accumulate(struct loom_buf dst16, struct loom_buf src32)
{
    LOOM_ASSERT(dst16.numel == src32.numel && is_lp(dst16.dtype) && src32.dtype == LOOM_DTYPE_F32);
    LOOM_ASSERT(dst16.device == LOOM_DEVICE_CPU && src32.device == LOOM_DEVICE_CPU);
    loom_lp_accumulate((uint16_t *)dst16.data, (const float *)src32.data, src32.numel, dst16.dtype);
}
