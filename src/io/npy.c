/*
 * NumPy's .npy files (see npy.h).
 */
#include "io/npy.h"

#include <fcntl.h>
#include <stdio.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "io/fs.h"

/* The header dictionary, padded with spaces and a newline so that the data
 * starts at a multiple of 64 bytes; its length into *n. */
static void header(char *h, size_t *n, const char *descr, const int64_t shape[2])
{
    char dict[256];
    if (shape[1])
        snprintf(dict, sizeof dict, "{'descr': '%s', 'fortran_order': False, 'shape': (%lld, %lld), }", descr,
                 (long long)shape[0], (long long)shape[1]);
    else
        snprintf(dict, sizeof dict, "{'descr': '%s', 'fortran_order': False, 'shape': (%lld,), }", descr,
                 (long long)shape[0]);
    size_t len = strlen(dict), total = 10 + len + 1;
    total = (total + 63) / 64 * 64;
    const size_t hlen = total - 10;
    memcpy(h, "\x93NUMPY\x01\x00", 8);
    h[8] = (char)(hlen & 0xff);
    h[9] = (char)(hlen >> 8);
    memcpy(h + 10, dict, len);
    memset(h + 10 + len, ' ', hlen - len - 1);
    h[total - 1] = '\n';
    *n = total;
}

int loom_npy_write(const char *path, const char *descr, const int64_t shape[2], const void *data,
                   size_t bytes)
{
    char h[384];
    size_t n;
    header(h, &n, descr, shape);
    const void *parts[] = {h, data};
    const size_t sizes[] = {n, bytes};
    return loom_fs_write_atomic(path, parts, sizes, 2);
}

int loom_npy_map(const char *path, const char *descr, const int64_t shape[2], void **map, size_t *map_bytes,
                 const void **data)
{
    char want[384];
    size_t n;
    header(want, &n, descr, shape);
    int fd = open(path, O_RDONLY | O_CLOEXEC | O_NONBLOCK);
    if (fd < 0) return 0;
    struct stat st;
    const int64_t width = descr[2] - '0', count = shape[0] * (shape[1] ? shape[1] : 1);
    if (fstat(fd, &st) != 0 || !S_ISREG(st.st_mode) || (int64_t)st.st_size != (int64_t)n + count * width ||
        st.st_size == 0) {
        close(fd);
        return 0;
    }
    void *m = mmap(NULL, (size_t)st.st_size, PROT_READ, MAP_SHARED, fd, 0);
    close(fd);
    if (m == MAP_FAILED) return 0;
    if (memcmp(m, want, n) != 0) { /* another dtype or shape: not this array */
        munmap(m, (size_t)st.st_size);
        return 0;
    }
    *map = m;
    *map_bytes = (size_t)st.st_size;
    *data = (const char *)m + n;
    return 1;
}
