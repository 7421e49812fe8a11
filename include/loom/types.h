/*
 * The element types and typed buffers every layer shares, public because a
 * model's blocks hold them (loom/model.h). One dtype enum for the whole
 * code base: buffers, communication, safetensors files. Values only grow
 * at the end. Helpers on buffers are internal (src/base/buf.h).
 */
#ifndef LOOM_TYPES_H
#define LOOM_TYPES_H

#include <stddef.h>

enum loom_dtype {
    LOOM_DTYPE_F32 = 0,
    LOOM_DTYPE_BF16 = 1,
    LOOM_DTYPE_F16 = 2,
    LOOM_DTYPE_F64 = 3,
    LOOM_DTYPE_I32 = 4,
    LOOM_DTYPE_I64 = 5,
    LOOM_DTYPE_U8 = 6,
    LOOM_DTYPE_I8 = 7,
    LOOM_DTYPE_U16 = 8,
    LOOM_DTYPE_I16 = 9,
    LOOM_DTYPE_BOOL = 10,
    LOOM_DTYPE_U32 = 11,
    LOOM_DTYPE_U64 = 12,
    LOOM_DTYPE_COUNT
};

/* Where a buffer's memory is: the host today; a GPU backend adds its own. */
enum loom_device { LOOM_DEVICE_CPU = 0, LOOM_DEVICE_COUNT };

/* A flat typed buffer, passed by value; it does not own its memory. */
struct loom_buf {
    void *data;   /* (numel) elements of dtype; NULL when absent (not held on this rank) */
    size_t numel; /* elements, not bytes */
    enum loom_dtype dtype;
    enum loom_device device;
};

/* Elements [lo, hi) of a model's parameter arena: a run of what a rank owns. */
struct loom_run {
    size_t lo, hi;
};

#endif
