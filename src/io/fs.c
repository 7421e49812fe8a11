/* File-system steps for checkpoints (see fs.h). */
#define _GNU_SOURCE /* sync_file_range */
#include "io/fs.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "base/log.h"
#include "base/mem.h"

int loom_fs_mkdir_p(const char *path)
{
    char buf[4096];
    if (snprintf(buf, sizeof buf, "%s", path) >= (int)sizeof buf)
        return loom_error_set(LOOM_ERR_INPUT, "path too long: %.64s...", path);
    for (char *p = buf + 1; *p; p++) {
        if (*p != '/') continue;
        *p = 0;
        if (mkdir(buf, 0755) && errno != EEXIST)
            return loom_error_set(LOOM_ERR_INPUT, "cannot create directory %s: %s", buf, strerror(errno));
        *p = '/';
    }
    if (mkdir(buf, 0755) && errno != EEXIST)
        return loom_error_set(LOOM_ERR_INPUT, "cannot create directory %s: %s", buf, strerror(errno));
    if (!loom_fs_is_dir(buf)) return loom_error_set(LOOM_ERR_INPUT, "%s exists and is not a directory", buf);
    return LOOM_OK;
}

int loom_fs_fsync_dir(const char *dir)
{
    int fd = open(dir, O_RDONLY | O_DIRECTORY);
    if (fd < 0) return loom_error_set(LOOM_ERR_RUNTIME, "open directory %s: %s", dir, strerror(errno));
    int rc = LOOM_OK;
    if (fsync(fd) != 0 && errno != EINVAL)
        rc = loom_error_set(LOOM_ERR_RUNTIME, "fsync directory %s: %s", dir, strerror(errno));
    close(fd);
    return rc;
}

void loom_fs_dirname(const char *path, char *dir, size_t n)
{
    const char *slash = strrchr(path, '/');
    if (!slash)
        snprintf(dir, n, ".");
    else if (slash == path)
        snprintf(dir, n, "/");
    else
        snprintf(dir, n, "%.*s", (int)(slash - path), path);
}

int loom_fs_atomic_open(struct loom_fs_atomic *w, const char *path)
{
    memset(w, 0, sizeof *w);
    w->fd = -1;
    if (snprintf(w->path, sizeof w->path, "%s", path) >= (int)sizeof w->path ||
        snprintf(w->tmp, sizeof w->tmp, "%s.tmp.%d", path, (int)getpid()) >= (int)sizeof w->tmp)
        return loom_error_set(LOOM_ERR_RUNTIME, "path too long: %.64s...", path);
    /* O_EXCL: a file already there (left by a killed process of this pid,
     * or anyone's) is removed and the name made anew, never written through */
    w->fd = open(w->tmp, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC | O_NOFOLLOW, 0644);
    if (w->fd < 0 && errno == EEXIST && unlink(w->tmp) == 0)
        w->fd = open(w->tmp, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC | O_NOFOLLOW, 0644);
    if (w->fd < 0)
        return loom_error_set(LOOM_ERR_RUNTIME, "open %s for writing: %s", w->tmp, strerror(errno));
    return LOOM_OK;
}

/* Written in pieces of WRITEBACK bytes, each handed to the disk as soon as
 * it is in the page cache (sync_file_range starts the writeback without
 * waiting), so the disk works while the next piece is copied and the
 * final fsync has only the tail left (Redis's incremental fsync). */
#define WRITEBACK ((size_t)32 << 20)

int loom_fs_atomic_write(struct loom_fs_atomic *w, const void *data, size_t n)
{
    const char *p = data;
    while (n > 0) {
        ssize_t k = write(w->fd, p, n < WRITEBACK ? n : WRITEBACK);
        if (k < 0 && errno == EINTR) continue;
        if (k <= 0)
            return loom_error_set(LOOM_ERR_RUNTIME, "write %s: %s", w->tmp,
                                  k < 0 ? strerror(errno) : "no progress");
        p += k, n -= (size_t)k, w->done += k;
        if (w->done - w->flushed >= (off_t)WRITEBACK) {
            sync_file_range(w->fd, w->flushed, w->done - w->flushed,
                            SYNC_FILE_RANGE_WRITE); /* a hint: errors surface at fsync */
            w->flushed = w->done;
        }
    }
    return LOOM_OK;
}

int loom_fs_atomic_rewrite(struct loom_fs_atomic *w, const void *data, size_t n, size_t at)
{
    LOOM_ASSERT((off_t)(at + n) <= w->done);
    const char *p = data;
    while (n > 0) {
        ssize_t k = pwrite(w->fd, p, n, (off_t)at);
        if (k < 0 && errno == EINTR) continue;
        if (k <= 0)
            return loom_error_set(LOOM_ERR_RUNTIME, "write %s: %s", w->tmp,
                                  k < 0 ? strerror(errno) : "no progress");
        p += k, n -= (size_t)k, at += (size_t)k;
    }
    return LOOM_OK;
}

void loom_fs_atomic_abort(struct loom_fs_atomic *w)
{
    if (w->fd >= 0) close(w->fd);
    w->fd = -1;
    unlink(w->tmp);
}

int loom_fs_atomic_commit(struct loom_fs_atomic *w)
{
    int rc = LOOM_OK;
    char dir[4096];
    if (fsync(w->fd) != 0) {
        rc = loom_error_set(LOOM_ERR_RUNTIME, "fsync %s: %s", w->tmp, strerror(errno));
        goto fail;
    }
    int fd = w->fd;
    w->fd = -1;
    if (close(fd) != 0) {
        rc = loom_error_set(LOOM_ERR_RUNTIME, "close %s: %s", w->tmp, strerror(errno));
        goto fail;
    }
    if (rename(w->tmp, w->path) != 0) {
        rc = loom_error_set(LOOM_ERR_RUNTIME, "rename %s to %s: %s", w->tmp, w->path, strerror(errno));
        goto fail;
    }
    loom_fs_dirname(w->path, dir, sizeof dir);
    return loom_fs_fsync_dir(dir);
fail:
    loom_fs_atomic_abort(w);
    return rc;
}

int loom_fs_write_atomic(const char *path, const void *const *parts, const size_t *sizes, int nparts)
{
    struct loom_fs_atomic w;
    int rc = loom_fs_atomic_open(&w, path);
    for (int i = 0; rc == LOOM_OK && i < nparts; i++) rc = loom_fs_atomic_write(&w, parts[i], sizes[i]);
    if (rc) {
        loom_fs_atomic_abort(&w);
        return rc;
    }
    return loom_fs_atomic_commit(&w);
}

int loom_fs_remove_tree(const char *path)
{
    struct stat st;
    if (lstat(path, &st) != 0) {
        if (errno == ENOENT) return LOOM_OK;
        return loom_error_set(LOOM_ERR_RUNTIME, "stat %s: %s", path, strerror(errno));
    }
    if (S_ISDIR(st.st_mode)) {
        DIR *d = opendir(path);
        if (!d) return loom_error_set(LOOM_ERR_RUNTIME, "open directory %s: %s", path, strerror(errno));
        struct dirent *e;
        int rc = LOOM_OK;
        while (rc == LOOM_OK && (e = readdir(d))) {
            if (strcmp(e->d_name, ".") == 0 || strcmp(e->d_name, "..") == 0) continue;
            char child[4096];
            if (snprintf(child, sizeof child, "%s/%s", path, e->d_name) >= (int)sizeof child)
                rc = loom_error_set(LOOM_ERR_RUNTIME, "path too long under %s", path);
            else
                rc = loom_fs_remove_tree(child);
        }
        closedir(d);
        if (rc) return rc;
        if (rmdir(path) != 0)
            return loom_error_set(LOOM_ERR_RUNTIME, "remove directory %s: %s", path, strerror(errno));
        return LOOM_OK;
    }
    if (unlink(path) != 0) return loom_error_set(LOOM_ERR_RUNTIME, "remove %s: %s", path, strerror(errno));
    return LOOM_OK;
}

static const char *kind_of(mode_t m)
{
    return S_ISFIFO(m)   ? "a FIFO"
           : S_ISDIR(m)  ? "a directory"
           : S_ISCHR(m)  ? "a character device"
           : S_ISBLK(m)  ? "a block device"
           : S_ISSOCK(m) ? "a socket"
                         : "not a plain file";
}

int loom_fs_open_input(const char *path, const char *what, int *fd_out, struct stat *st_out)
{
    *fd_out = -1;
    const char *sep = what && *what ? " " : "";
    what = what ? what : "";
    /* O_NONBLOCK: a FIFO in a file's place opens at once (and is refused
     * below) instead of waiting for a writer */
    int fd = open(path, O_RDONLY | O_CLOEXEC | O_NONBLOCK);
    if (fd < 0) {
        if (*what)
            return loom_error_set(LOOM_ERR_INPUT, "%s %s: cannot open: %s", what, path, strerror(errno));
        return loom_error_set(LOOM_ERR_INPUT, "cannot open %s: %s", path, strerror(errno));
    }
    struct stat st;
    if (fstat(fd, &st) != 0) {
        const int e = errno;
        close(fd);
        return loom_error_set(LOOM_ERR_INPUT, "%s%sstat %s: %s", what, sep, path, strerror(e));
    }
    if (!S_ISREG(st.st_mode)) {
        close(fd);
        return loom_error_set(LOOM_ERR_INPUT, "%s%s%s: not a regular file (%s)", what, sep, path,
                              kind_of(st.st_mode));
    }
    /* a regular file never blocks; the flag goes so reads behave as usual */
    const int fl = fcntl(fd, F_GETFL);
    if (fl < 0 || fcntl(fd, F_SETFL, fl & ~O_NONBLOCK) != 0) {
        const int e = errno;
        close(fd);
        return loom_error_set(LOOM_ERR_RUNTIME, "fcntl %s: %s", path, strerror(e));
    }
    if (st_out) *st_out = st;
    *fd_out = fd;
    return LOOM_OK;
}

int loom_fs_check_output(const char *path, const char *what)
{
    struct stat st;
    if (stat(path, &st) != 0 || S_ISREG(st.st_mode) || S_ISCHR(st.st_mode)) return LOOM_OK;
    return loom_error_set(LOOM_ERR_INPUT, "%s%s%s: not a regular file (%s)", what ? what : "",
                          what && *what ? " " : "", path, kind_of(st.st_mode));
}

FILE *loom_fs_fopen_input(const char *path, const char *what, int *rc)
{
    int fd;
    *rc = loom_fs_open_input(path, what, &fd, NULL);
    if (*rc) return NULL;
    FILE *f = fdopen(fd, "rb");
    if (!f) {
        *rc = loom_error_set(LOOM_ERR_RUNTIME, "fdopen %s: %s", path, strerror(errno));
        close(fd);
    }
    return f;
}

int loom_fs_read_small(const char *path, size_t max_bytes, char **out, size_t *len)
{
    *out = NULL;
    *len = 0;
    struct stat st;
    int fd;
    int rc = loom_fs_open_input(path, NULL, &fd, &st);
    if (rc) return rc;
    char *buf = NULL;
    if ((size_t)st.st_size > max_bytes) {
        rc = loom_error_set(LOOM_ERR_INPUT, "%s: %lld bytes, more than the %zu allowed", path,
                            (long long)st.st_size, max_bytes);
        goto done;
    }
    size_t n = (size_t)st.st_size;
    buf = loom_alloc(n + 1, LOOM_MEM_OTHER);
    for (size_t got = 0; got < n;) {
        ssize_t r = read(fd, buf + got, n - got);
        if (r < 0 && errno == EINTR) continue;
        if (r <= 0) {
            rc = loom_error_set(LOOM_ERR_INPUT, "read %s: %s", path, r < 0 ? strerror(errno) : "file shrank");
            goto done;
        }
        got += (size_t)r;
    }
    buf[n] = 0;
    *out = buf;
    *len = n;
    buf = NULL;
done:
    loom_free(buf);
    close(fd);
    return rc;
}

int loom_fs_is_dir(const char *path)
{
    struct stat st;
    return stat(path, &st) == 0 && S_ISDIR(st.st_mode);
}
