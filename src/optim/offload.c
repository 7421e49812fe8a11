/* Offload files: creation, whole reads and writes (see offload.h). */
#include "optim/offload.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "base/log.h"

int loom_offload_create(const char *dir, size_t bytes)
{
    struct stat st;
    if (stat(dir, &st) != 0 || !S_ISDIR(st.st_mode)) {
        loom_error_set(LOOM_ERR_INPUT, "--nvme-path %s: not a directory%s%s", dir, errno ? ": " : "",
                       errno ? strerror(errno) : "");
        return -1;
    }
    char path[4096];
    snprintf(path, sizeof path, "%s/loom-optimizer-XXXXXX", dir);
    int fd = mkstemp(path); /* mode 0600 */
    if (fd < 0) {
        loom_error_set(LOOM_ERR_INPUT, "--nvme-path %s: cannot create a file: %s", dir, strerror(errno));
        return -1;
    }
    unlink(path); /* private, and gone at exit whatever happens */
    if (ftruncate(fd, (off_t)bytes) != 0) {
        int e = errno;
        close(fd);
        loom_error_set(LOOM_ERR_INPUT, "--nvme-path %s: cannot size the optimizer file to %zu bytes: %s", dir,
                       bytes, strerror(e));
        return -1;
    }
    return fd;
}

void loom_offload_read(int fd, void *buf, size_t bytes, size_t offset)
{
    char *p = buf;
    while (bytes) {
        ssize_t n = pread(fd, p, bytes, (off_t)offset);
        if (n <= 0)
            loom_die("reading offloaded optimizer state (%zu bytes at %zu): %s", bytes, offset,
                     n ? strerror(errno) : "end of file");
        p += n, bytes -= (size_t)n, offset += (size_t)n;
    }
}

void loom_offload_write(int fd, const void *buf, size_t bytes, size_t offset)
{
    const char *p = buf;
    while (bytes) {
        ssize_t n = pwrite(fd, p, bytes, (off_t)offset);
        if (n <= 0)
            loom_die("writing offloaded optimizer state (%zu bytes at %zu): %s", bytes, offset,
                     n ? strerror(errno) : "no progress");
        p += n, bytes -= (size_t)n, offset += (size_t)n;
    }
}
