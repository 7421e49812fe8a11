/* Offload files: creation with the space reserved, io_uring chunk I/O by
 * slot, synchronous ranges (see offload.h). */
#define _GNU_SOURCE
#include "optim/offload.h"

#include <errno.h>
#include <fcntl.h>
#include <liburing.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <unistd.h>

#include "base/log.h"

/* bytes in the unit that shows them: "64.0 KB", "278.5 KB", "12.3 GB" */
static void fmt_size(char *buf, size_t n, double bytes)
{
    static const char *const units[] = {"bytes", "KB", "MB", "GB", "TB"};
    int u = 0;
    while (bytes >= 1000 && u < 4) bytes /= 1000, u++;
    snprintf(buf, n, u ? "%.1f %s" : "%.0f %s", bytes, units[u]);
}

int loom_offload_open(struct loom_offload_file *o, const char *dir, size_t bytes, const char *what,
                      int direct)
{
    memset(o, 0, sizeof *o);
    o->fd = o->fd_buffered = -1;
    struct stat st;
    errno = 0;
    if (stat(dir, &st) != 0 || !S_ISDIR(st.st_mode))
        return loom_error_set(LOOM_ERR_INPUT, "--nvme-path %s: not a directory%s%s", dir, errno ? ": " : "",
                              errno ? strerror(errno) : "");
    bytes = loom_offload_round(bytes ? bytes : 1);
    char path[4096];
    snprintf(path, sizeof path, "%s/loom-offload-XXXXXX", dir);
    int fd = mkstemp(path); /* mode 0600 */
    if (fd < 0)
        return loom_error_set(LOOM_ERR_INPUT, "--nvme-path %s: cannot create a file: %s", dir,
                              strerror(errno));
    /* the same file once more for direct I/O, before it loses its name */
    int dfd = direct ? open(path, O_RDWR | O_DIRECT | O_CLOEXEC) : -1;
    unlink(path); /* private, and gone at exit whatever happens */
    o->fd_buffered = fd;
    o->direct = dfd >= 0;
    o->fd = dfd >= 0 ? dfd : fd;
    o->bytes = bytes;
    /* the space, up front: reserved, or where the file system cannot, checked */
    int rc = fallocate(fd, 0, 0, (off_t)bytes);
    if (rc != 0 && (errno == EOPNOTSUPP || errno == ENOSYS)) {
        struct statvfs vfs;
        if (statvfs(dir, &vfs) == 0 && (double)vfs.f_bavail * (double)vfs.f_frsize < (double)bytes) {
            errno = ENOSPC;
        } else {
            rc = ftruncate(fd, (off_t)bytes);
        }
    }
    if (rc != 0) {
        const int e = errno;
        struct statvfs vfs;
        char need[32], avail[32] = "?";
        fmt_size(need, sizeof need, (double)bytes);
        if (statvfs(dir, &vfs) == 0)
            fmt_size(avail, sizeof avail, (double)vfs.f_bavail * (double)vfs.f_frsize);
        loom_offload_close(o);
        if (e == ENOSPC || e == EDQUOT || e == EFBIG)
            return loom_error_set(LOOM_ERR_INPUT,
                                  "--nvme-path %s: the %s needs %s (%zu bytes), %s free there", dir, what,
                                  need, bytes, avail);
        return loom_error_set(LOOM_ERR_INPUT, "--nvme-path %s: cannot size the %s file to %zu bytes: %s", dir,
                              what, bytes, strerror(e));
    }
    struct io_uring *ring = calloc(1, sizeof *ring);
    if (ring && io_uring_queue_init(LOOM_OFFLOAD_DEPTH, ring, 0) == 0) {
        o->ring = ring;
    } else { /* a kernel without io_uring (or one that forbids it): the requests run synchronously */
        free(ring);
    }
    return LOOM_OK;
}

void loom_offload_close(struct loom_offload_file *o)
{
    if (o->ring) {
        loom_offload_wait(o, -1);
        io_uring_queue_exit(o->ring);
        free(o->ring);
    }
    if (o->fd >= 0 && o->fd != o->fd_buffered) close(o->fd);
    if (o->fd_buffered >= 0) close(o->fd_buffered);
    memset(o, 0, sizeof *o);
    o->fd = o->fd_buffered = -1;
}

static void sync_io(int fd, int write, char *p, size_t bytes, size_t offset)
{
    while (bytes) {
        ssize_t n = write ? pwrite(fd, p, bytes, (off_t)offset) : pread(fd, p, bytes, (off_t)offset);
        if (n <= 0)
            loom_die("%s the offload file (%zu bytes at %zu): %s", write ? "writing" : "reading", bytes,
                     offset, n ? strerror(errno) : (write ? "no progress" : "end of file"));
        p += n, bytes -= (size_t)n, offset += (size_t)n;
    }
}

void loom_offload_read(struct loom_offload_file *o, void *buf, size_t bytes, size_t offset)
{
    sync_io(o->fd_buffered, 0, buf, bytes, offset);
    o->read_bytes += (double)bytes;
}

void loom_offload_write(struct loom_offload_file *o, const void *buf, size_t bytes, size_t offset)
{
    sync_io(o->fd_buffered, 1, (char *)buf, bytes, offset);
    o->write_bytes += (double)bytes;
}

/* Consumes one completion (waiting for it); a short transfer finishes
 * synchronously, an error ends the run. */
static void reap_one(struct loom_offload_file *o)
{
    struct io_uring_cqe *cqe;
    int rc = io_uring_wait_cqe(o->ring, &cqe);
    if (rc < 0) loom_die("waiting for offload I/O: %s", strerror(-rc));
    const int id = (int)io_uring_cqe_get_data64(cqe);
    const int res = cqe->res;
    io_uring_cqe_seen(o->ring, cqe);
    struct loom_offload_req *r = &o->req[id];
    if (res < 0)
        loom_die("%s the offload file (%zu bytes at %zu): %s", r->write ? "writing" : "reading", r->bytes,
                 r->offset, strerror(-res));
    if ((size_t)res < r->bytes) /* the rest, as the buffered descriptor can do it */
        sync_io(o->fd_buffered, r->write, r->buf + res, r->bytes - (size_t)res, r->offset + (size_t)res);
    o->pending[r->slot]--;
    o->inflight--;
    o->req_used[id] = 0;
}

static void submit(struct loom_offload_file *o, int slot, int write, char *buf, size_t bytes, size_t offset)
{
    LOOM_ASSERT(slot >= 0 && slot < LOOM_OFFLOAD_SLOTS);
    if (write)
        o->write_bytes += (double)bytes;
    else
        o->read_bytes += (double)bytes;
    if (!o->ring) {
        sync_io(o->fd, write, buf, bytes, offset);
        return;
    }
    LOOM_ASSERT(!o->direct || ((size_t)buf % LOOM_OFFLOAD_ALIGN == 0 && bytes % LOOM_OFFLOAD_ALIGN == 0 &&
                               offset % LOOM_OFFLOAD_ALIGN == 0));
    while (o->inflight == LOOM_OFFLOAD_DEPTH) reap_one(o);
    int id = 0;
    while (o->req_used[id]) id++;
    struct io_uring_sqe *sqe = io_uring_get_sqe(o->ring);
    while (!sqe) { /* the submission queue is full: make room */
        io_uring_submit(o->ring);
        reap_one(o);
        sqe = io_uring_get_sqe(o->ring);
    }
    o->req[id] = (struct loom_offload_req){slot, write, buf, bytes, offset};
    o->req_used[id] = 1;
    if (write)
        io_uring_prep_write(sqe, o->fd, buf, (unsigned)bytes, (__u64)offset);
    else
        io_uring_prep_read(sqe, o->fd, buf, (unsigned)bytes, (__u64)offset);
    io_uring_sqe_set_data64(sqe, (__u64)id);
    o->pending[slot]++;
    o->inflight++;
    int rc = io_uring_submit(o->ring);
    if (rc < 0) loom_die("submitting offload I/O: %s", strerror(-rc));
}

void loom_offload_read_async(struct loom_offload_file *o, int slot, void *buf, size_t bytes, size_t offset)
{
    submit(o, slot, 0, buf, bytes, offset);
}

void loom_offload_write_async(struct loom_offload_file *o, int slot, const void *buf, size_t bytes,
                              size_t offset)
{
    submit(o, slot, 1, (char *)buf, bytes, offset);
}

void loom_offload_wait(struct loom_offload_file *o, int slot)
{
    if (!o->ring) return;
    if (slot < 0)
        while (o->inflight) reap_one(o);
    else
        while (o->pending[slot]) reap_one(o);
}

/* ---- mapped offload ------------------------------------------------------------- */

int loom_offload_map(struct loom_offload_map *m, const char *dir, size_t bytes, const char *what)
{
    memset(m, 0, sizeof *m);
    m->fd = -1;
    struct loom_offload_file f;
    int rc = loom_offload_open(&f, dir, bytes, what, 0);
    if (rc) return rc;
    /* the buffered descriptor stays; the rest goes */
    const int fd = dup(f.fd_buffered);
    m->bytes = f.bytes;
    loom_offload_close(&f);
    void *p = fd >= 0 ? mmap(NULL, m->bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0) : MAP_FAILED;
    if (p == MAP_FAILED) {
        const int e = errno;
        if (fd >= 0) close(fd);
        return loom_error_set(LOOM_ERR_INPUT, "--nvme-path %s: cannot map the %s file (%zu bytes): %s", dir,
                              what, m->bytes, strerror(e));
    }
    m->data = p;
    m->fd = fd;
    return LOOM_OK;
}

void loom_offload_unmap(struct loom_offload_map *m)
{
    if (m->data) munmap(m->data, m->bytes);
    if (m->fd >= 0) close(m->fd);
    memset(m, 0, sizeof *m);
    m->fd = -1;
}

/* [p, p + n) widened to whole pages, clipped to the mapping. */
static int pages(const struct loom_offload_map *m, const void *p, size_t n, char **a, size_t *len)
{
    if (!m->data || !n) return 0;
    const size_t page = (size_t)sysconf(_SC_PAGESIZE);
    char *lo = (char *)((size_t)p / page * page), *hi = (char *)p + n;
    char *base = m->data, *end = base + m->bytes;
    if (lo < base) lo = base;
    if (hi > end) hi = end;
    if (hi <= lo) return 0;
    *a = lo;
    *len = (size_t)(hi - lo);
    return 1;
}

void loom_offload_drop(const struct loom_offload_map *m, const void *p, size_t n)
{
    char *a;
    size_t len;
    if (pages(m, p, n, &a, &len)) madvise(a, len, MADV_DONTNEED);
}

void loom_offload_prefetch(const struct loom_offload_map *m, const void *p, size_t n)
{
    char *a;
    size_t len;
    if (pages(m, p, n, &a, &len)) madvise(a, len, MADV_WILLNEED);
}

void loom_offload_zero(const struct loom_offload_map *m)
{
    if (!m->data) return;
    madvise(m->data, m->bytes, MADV_DONTNEED);
    /* zeroed in the file, its blocks kept (a write later cannot meet a full disk) */
    if (fallocate(m->fd, FALLOC_FL_ZERO_RANGE | FALLOC_FL_KEEP_SIZE, 0, (off_t)m->bytes) == 0) return;
    const size_t piece = 64u << 20; /* a file system that cannot: written, a piece resident at a time */
    for (size_t at = 0; at < m->bytes; at += piece) {
        const size_t n = m->bytes - at < piece ? m->bytes - at : piece;
        memset((char *)m->data + at, 0, n);
        madvise((char *)m->data + at, n, MADV_DONTNEED);
    }
}
