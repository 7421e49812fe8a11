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

int loom_fs_write_atomic(const char *path, const void *const *parts, const size_t *sizes, int nparts)
{
    char tmp[4200], dir[4096];
    snprintf(tmp, sizeof tmp, "%s.tmp.%d", path, (int)getpid());
    /* O_EXCL: a file already there (left by a killed process of this pid,
     * or anyone's) is removed and the name made anew, never written through */
    int fd = open(tmp, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC | O_NOFOLLOW, 0644);
    if (fd < 0 && errno == EEXIST && unlink(tmp) == 0)
        fd = open(tmp, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC | O_NOFOLLOW, 0644);
    if (fd < 0) return loom_error_set(LOOM_ERR_RUNTIME, "open %s for writing: %s", tmp, strerror(errno));
    int rc = LOOM_OK;
    /* Written in pieces of WRITEBACK bytes, each handed to the disk as soon as
     * it is in the page cache (sync_file_range starts the writeback without
     * waiting), so the disk works while the next piece is copied and the
     * final fsync has only the tail left (Redis's incremental fsync). */
    const size_t WRITEBACK = (size_t)32 << 20;
    off_t done = 0, flushed = 0;
    for (int i = 0; i < nparts; i++) {
        const char *p = parts[i];
        for (size_t left = sizes[i]; left > 0;) {
            ssize_t w = write(fd, p, left < WRITEBACK ? left : WRITEBACK);
            if (w < 0 && errno == EINTR) continue;
            if (w <= 0) {
                rc = loom_error_set(LOOM_ERR_RUNTIME, "write %s: %s", tmp,
                                    w < 0 ? strerror(errno) : "no progress");
                goto fail;
            }
            p += w, left -= (size_t)w, done += w;
            if (done - flushed >= (off_t)WRITEBACK) {
                sync_file_range(fd, flushed, done - flushed,
                                SYNC_FILE_RANGE_WRITE); /* a hint: errors surface at fsync */
                flushed = done;
            }
        }
    }
    if (fsync(fd) != 0) {
        rc = loom_error_set(LOOM_ERR_RUNTIME, "fsync %s: %s", tmp, strerror(errno));
        goto fail;
    }
    if (close(fd) != 0) {
        fd = -1;
        rc = loom_error_set(LOOM_ERR_RUNTIME, "close %s: %s", tmp, strerror(errno));
        goto fail;
    }
    fd = -1;
    if (rename(tmp, path) != 0) {
        rc = loom_error_set(LOOM_ERR_RUNTIME, "rename %s to %s: %s", tmp, path, strerror(errno));
        goto fail;
    }
    loom_fs_dirname(path, dir, sizeof dir);
    return loom_fs_fsync_dir(dir);
fail:
    if (fd >= 0) close(fd);
    unlink(tmp);
    return rc;
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

int loom_fs_read_small(const char *path, size_t max_bytes, char **out, size_t *len)
{
    *out = NULL;
    *len = 0;
    /* O_NONBLOCK: a FIFO in a file's place is refused below, not waited on */
    int fd = open(path, O_RDONLY | O_CLOEXEC | O_NONBLOCK);
    if (fd < 0) return loom_error_set(LOOM_ERR_INPUT, "cannot open %s: %s", path, strerror(errno));
    struct stat st;
    int rc = LOOM_OK;
    char *buf = NULL;
    if (fstat(fd, &st) != 0) {
        rc = loom_error_set(LOOM_ERR_INPUT, "stat %s: %s", path, strerror(errno));
        goto done;
    }
    if (!S_ISREG(st.st_mode)) {
        rc = loom_error_set(LOOM_ERR_INPUT, "%s is not a regular file", path);
        goto done;
    }
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
