/*
 * Token shards: open (mmap + validation) and crash-safe writing.
 *
 * The format is little-endian on disk and this file reads it in place, so it
 * builds only for little-endian hosts (checked below). It does not decide
 * sampling, and it does not keep file descriptors open: the mapping alone
 * holds the data after open.
 */
#include "io/shard.h"

#include "io/fs.h"

#include <assert.h>
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "base/log.h"
#include "base/mem.h"

static_assert(__BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__,
              "shards are read in place and their format is little-endian");

static char *dup_string(const char *s)
{
    size_t n = strlen(s) + 1;
    char *p = loom_alloc(n, LOOM_MEM_OTHER);
    memcpy(p, s, n);
    return p;
}

static int32_t header_int(const void *map, int i)
{
    int32_t v;
    memcpy(&v, (const char *)map + 4 * (size_t)i, sizeof v);
    return v;
}

/* The first position whose token is >= vocab, or -1; a branch-free max pass
 * first (it vectorises), the position search only when that max is bad. */
static int64_t first_bad_token(const uint16_t *t, int64_t n, int vocab)
{
    if (vocab > UINT16_MAX) return -1;
    uint16_t mx = 0;
    for (int64_t i = 0; i < n; i++) mx = t[i] > mx ? t[i] : mx;
    if (mx < vocab) return -1;
    for (int64_t i = 0; i < n; i++)
        if (t[i] >= vocab) return i;
    return -1;
}

static int64_t first_bad_token32(const uint32_t *t, int64_t n, int vocab)
{
    uint32_t mx = 0;
    for (int64_t i = 0; i < n; i++) mx = t[i] > mx ? t[i] : mx;
    if (mx < (uint32_t)vocab) return -1;
    for (int64_t i = 0; i < n; i++)
        if (t[i] >= (uint32_t)vocab) return i;
    return -1;
}

int loom_shard_open(struct loom_shard *s, const char *path, int vocab)
{
    memset(s, 0, sizeof *s);
    int fd = open(path, O_RDONLY | O_CLOEXEC | O_NONBLOCK); /* a FIFO is refused, not waited on */
    if (fd < 0)
        return loom_error_set(LOOM_ERR_INPUT, "cannot open data shard '%s': %s", path, strerror(errno));
    struct stat st;
    if (fstat(fd, &st) != 0) {
        int e = errno;
        close(fd);
        return loom_error_set(LOOM_ERR_INPUT, "fstat '%s': %s", path, strerror(e));
    }
    if (!S_ISREG(st.st_mode)) {
        close(fd);
        return loom_error_set(LOOM_ERR_INPUT, "data shard '%s' is not a regular file", path);
    }
    int64_t bytes = (int64_t)st.st_size;
    if (bytes < LOOM_SHARD_HEADER_BYTES) {
        close(fd);
        return loom_error_set(LOOM_ERR_INPUT,
                              "data shard '%s' is too small for a shard header: %lld bytes, "
                              "need at least %d",
                              path, (long long)bytes, LOOM_SHARD_HEADER_BYTES);
    }
    void *map = mmap(NULL, (size_t)bytes, PROT_READ, MAP_PRIVATE, fd, 0);
    int map_errno = errno;
    if (close(fd) != 0 && map != MAP_FAILED) {
        int e = errno;
        munmap(map, (size_t)bytes);
        return loom_error_set(LOOM_ERR_RUNTIME, "close '%s': %s", path, strerror(e));
    }
    if (map == MAP_FAILED)
        return loom_error_set(LOOM_ERR_RUNTIME, "mmap '%s' (%lld bytes): %s", path, (long long)bytes,
                              strerror(map_errno));
    s->map = map;
    s->map_bytes = (size_t)bytes;
    s->path = dup_string(path);

    int status = LOOM_OK;
    int32_t magic = header_int(map, 0), version = header_int(map, 1), count = header_int(map, 2);
    if (magic != LOOM_SHARD_MAGIC) {
        status = loom_error_set(LOOM_ERR_INPUT,
                                "data shard '%s' has magic number %d, expected %d (not a token "
                                "shard in llm.c's format?)",
                                path, magic, LOOM_SHARD_MAGIC);
        goto fail;
    }
    if (version != LOOM_SHARD_VERSION && version != LOOM_SHARD_VERSION_32) {
        status = loom_error_set(LOOM_ERR_INPUT,
                                "data shard '%s' has version %d, expected %d (16-bit tokens) or %d (32-bit)",
                                path, version, LOOM_SHARD_VERSION, LOOM_SHARD_VERSION_32);
        goto fail;
    }
    const int width = version == LOOM_SHARD_VERSION_32 ? 4 : 2;
    if (count < 0) {
        status = loom_error_set(LOOM_ERR_INPUT, "data shard '%s' has a negative token count %d", path, count);
        goto fail;
    }
    int64_t want = LOOM_SHARD_HEADER_BYTES + width * (int64_t)count;
    if (bytes != want) {
        status = loom_error_set(LOOM_ERR_INPUT,
                                "data shard '%s' is %s: its header says %d tokens, which is %lld "
                                "bytes with the header, but the file has %lld bytes",
                                path, bytes < want ? "truncated" : "longer than its header says", count,
                                (long long)want, (long long)bytes);
        goto fail;
    }
    const void *at = (const char *)map + LOOM_SHARD_HEADER_BYTES;
    if (width == 4)
        s->tokens32 = at;
    else
        s->tokens = at;
    s->n = count;
    if (vocab > 0) {
        int64_t bad = width == 4 ? first_bad_token32(s->tokens32, s->n, vocab)
                                 : first_bad_token(s->tokens, s->n, vocab);
        if (bad >= 0) {
            status = loom_error_set(LOOM_ERR_INPUT,
                                    "data shard '%s': token %u at position %lld is outside the "
                                    "vocabulary (size %d)",
                                    path, loom_shard_token(s, bad), (long long)bad, vocab);
            goto fail;
        }
    }
    return LOOM_OK;

fail:
    loom_shard_close(s);
    return status;
}

void loom_shard_close(struct loom_shard *s)
{
    if (s->map) munmap(s->map, s->map_bytes);
    loom_free(s->path);
    memset(s, 0, sizeof *s);
}

/* ---- writing ------------------------------------------------------------- */

static int write_shard(const char *path, const void *tokens, int64_t n, int version, size_t width)
{
    if (n < 0 || n > LOOM_SHARD_MAX_TOKENS)
        return loom_error_set(LOOM_ERR_INPUT, "cannot write shard '%s': %lld tokens, a shard holds 0 to %d",
                              path, (long long)n, LOOM_SHARD_MAX_TOKENS);
    int32_t header[LOOM_SHARD_HEADER_INTS] = {0};
    header[0] = LOOM_SHARD_MAGIC;
    header[1] = version;
    header[2] = (int32_t)n;
    const void *parts[2] = {header, tokens};
    size_t sizes[2] = {sizeof header, (size_t)n * width};
    return loom_fs_write_atomic(path, parts, sizes, n > 0 ? 2 : 1);
}

int loom_shard_write(const char *path, const uint16_t *tokens, int64_t n)
{
    return write_shard(path, tokens, n, LOOM_SHARD_VERSION, sizeof *tokens);
}

int loom_shard_write32(const char *path, const uint32_t *tokens, int64_t n)
{
    return write_shard(path, tokens, n, LOOM_SHARD_VERSION_32, sizeof *tokens);
}
