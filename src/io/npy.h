/*
 * NumPy's .npy files (format 1.0) for 1-D and 2-D little-endian arrays of
 * fixed-width numbers: written crash-safely, and mapped read-only with the
 * header checked against the dtype and shape the caller expects. What
 * Megatron's dataset caches hold, and what `numpy.load` opens.
 *
 * Not here: any other layout (Fortran order, structured dtypes, pickles).
 */
#ifndef LOOM_IO_NPY_H
#define LOOM_IO_NPY_H

#include <stddef.h>
#include <stdint.h>

/* descr: NumPy's dtype string ("<i4", "<u4", "<i8", "<i2"); shape[1] = 0
 * for a 1-D array. LOOM_ERR_RUNTIME naming the file on a failed write. */
int loom_npy_write(const char *path, const char *descr, const int64_t shape[2], const void *data,
                   size_t bytes);

/* Maps path when its header says exactly descr and shape: *data into the
 * mapping (*map, *map_bytes to unmap). Returns 1 mapped, 0 when the file is
 * missing or says something else (the caller rebuilds it). */
int loom_npy_map(const char *path, const char *descr, const int64_t shape[2], void **map, size_t *map_bytes,
                 const void **data);

#endif
