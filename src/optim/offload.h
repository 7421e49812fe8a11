/*
 * Optimizer-state offload to a file (ZeRO-Infinity's NVMe offload): a
 * private, already-unlinked file in a directory the user names, read and
 * written with pread/pwrite in whole chunks. The file vanishes when the
 * process ends, however it ends. Not here: io_uring, double buffering.
 */
#ifndef LOOM_OPTIM_OFFLOAD_H
#define LOOM_OPTIM_OFFLOAD_H

#include <stddef.h>

/* Creates a file of `bytes` zero bytes in dir (mode 0600, unlinked at once);
 * returns its descriptor, or -1 with LOOM_ERR_INPUT set naming dir. */
int loom_offload_create(const char *dir, size_t bytes);
/* Whole-buffer pread/pwrite; a failure (short I/O, ENOSPC) is fatal (exit 1)
 * naming the operation. */
void loom_offload_read(int fd, void *buf, size_t bytes, size_t offset);
void loom_offload_write(int fd, const void *buf, size_t bytes, size_t offset);

#endif
