/*
 * Offload files (ZeRO-Infinity's NVMe offload): a private, already-unlinked
 * file in a directory the user names, its space reserved up front, read and
 * written asynchronously through io_uring (liburing), through the page cache
 * or (asked for) with direct I/O where the file system allows it, so the
 * optimizer computes on one chunk while the next is read and the previous
 * written.
 *
 * Two ways in: asynchronous requests on aligned chunks, grouped in slots
 * (a slot is one buffer set: wait for a slot, then reuse its buffers), and
 * synchronous reads and writes of any range (checkpoints, set-up), through
 * a second, buffered descriptor of the same file (the kernel keeps the two
 * coherent: direct I/O writes back and drops the cached pages it covers).
 *
 * The buffers of the file I/O are host memory (a GPU's pinned staging): the optimizer
 * moves values between it and the backend's memory (adamw.c).
 *
 * Not here: what lives where in the file (the optimizer's layout, adamw.c).
 */
#ifndef LOOM_OPTIM_OFFLOAD_H
#define LOOM_OPTIM_OFFLOAD_H

#include <stddef.h>

/* Alignment of direct I/O: buffers, offsets and lengths of asynchronous
 * requests are multiples of it. */
#define LOOM_OFFLOAD_ALIGN 4096
enum { LOOM_OFFLOAD_SLOTS = 2, LOOM_OFFLOAD_DEPTH = 32 };

struct loom_offload_req {
    int slot, write;
    char *buf;
    size_t bytes, offset;
};

struct loom_offload_file {
    int fd;          /* asynchronous I/O: O_DIRECT when the file system allows it */
    int fd_buffered; /* synchronous I/O of any range */
    int direct;      /* fd is O_DIRECT */
    void *ring;      /* struct io_uring, or NULL: asynchronous requests run synchronously */
    int pending[LOOM_OFFLOAD_SLOTS];
    int inflight;
    struct loom_offload_req req[LOOM_OFFLOAD_DEPTH]; /* by user_data */
    int req_used[LOOM_OFFLOAD_DEPTH];
    size_t bytes;
    double read_bytes, write_bytes; /* since open, for the run's I/O figures */
};

/* Creates a file of `bytes` bytes in dir (mode 0600, unlinked at once),
 * its asynchronous requests with O_DIRECT when direct (and the file system
 * allows it), else through the page cache,
 * the space reserved (fallocate) or, where the file system cannot reserve,
 * checked against its free space. LOOM_ERR_INPUT naming dir and, when space
 * is short, the bytes needed and free; what: what the file holds, for
 * messages. */
int loom_offload_open(struct loom_offload_file *o, const char *dir, size_t bytes, const char *what,
                      int direct);
void loom_offload_close(struct loom_offload_file *o);

/* Asynchronous chunk I/O on slot: buf, bytes and offset multiples of
 * LOOM_OFFLOAD_ALIGN. A failure (an I/O error, a full disk) is fatal
 * (exit 1) naming the operation. */
void loom_offload_read_async(struct loom_offload_file *o, int slot, void *buf, size_t bytes, size_t offset);
void loom_offload_write_async(struct loom_offload_file *o, int slot, const void *buf, size_t bytes,
                              size_t offset);
/* Returns when every request of slot (slot -1: of all slots) is done. */
void loom_offload_wait(struct loom_offload_file *o, int slot);

/* Synchronous I/O of any range; failures are fatal as above. */
void loom_offload_read(struct loom_offload_file *o, void *buf, size_t bytes, size_t offset);
void loom_offload_write(struct loom_offload_file *o, const void *buf, size_t bytes, size_t offset);

/* ---- mapped offload: memory the kernel pages to a file ----------------------
 *
 * ZeRO-3's parameter and gradient shards under --offload-param nvme: a
 * file of the same kind (private, unlinked, its space reserved) mapped
 * shared, so every reader and writer of the shard works unchanged; what is
 * resident is what was touched since it was last dropped. The users drop
 * a range once done with it (its data stays in the file: written back by
 * the kernel) and ask for the next one ahead (the kernel reads it
 * asynchronously). */
struct loom_offload_map {
    void *data; /* (bytes), or NULL */
    size_t bytes;
    int fd;
};
int loom_offload_map(struct loom_offload_map *m, const char *dir, size_t bytes, const char *what);
void loom_offload_unmap(struct loom_offload_map *m);
/* [p, p + n) inside m: its pages stop being resident; read ahead. */
void loom_offload_drop(const struct loom_offload_map *m, const void *p, size_t n);
void loom_offload_prefetch(const struct loom_offload_map *m, const void *p, size_t n);
/* The whole mapping zero, without touching its pages where the file system
 * can zero a range in place (its blocks kept). */
void loom_offload_zero(const struct loom_offload_map *m);

/* n rounded up to a multiple of LOOM_OFFLOAD_ALIGN. */
static inline size_t loom_offload_round(size_t n)
{
    return (n + LOOM_OFFLOAD_ALIGN - 1) / LOOM_OFFLOAD_ALIGN * LOOM_OFFLOAD_ALIGN;
}

#endif
