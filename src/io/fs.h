/*
 * File-system steps that checkpoints are built from: creating directory
 * paths, durable files (temporary name, fsync, rename, directory fsync),
 * whole or written as they are made, directory fsync, recursive removal,
 * and reading a small file whole. Every failure is a status with the
 * operation, the path and strerror.
 */
#ifndef LOOM_IO_FS_H
#define LOOM_IO_FS_H

#include <stddef.h>
#include <stdio.h>
#include <sys/stat.h>
#include <sys/types.h>

/* mkdir -p; LOOM_ERR_INPUT naming the component that cannot be created. */
int loom_fs_mkdir_p(const char *path);
/* fsync of a directory, so renames inside it are durable (file systems that
 * cannot fsync a directory say so with EINVAL, which is not an error). */
int loom_fs_fsync_dir(const char *dir);
/* Writes the concatenation of `nparts` buffers to `path` crash-safely:
 * PATH.tmp.<pid> (created anew: O_EXCL, a file there first removed), fsync,
 * rename, fsync of the directory. A failure before
 * the rename leaves `path` untouched and removes the temporary file; only
 * the final directory fsync can fail after `path` holds the new, complete
 * file. LOOM_ERR_RUNTIME. */
int loom_fs_write_atomic(const char *path, const void *const *parts, const size_t *sizes, int nparts);
/* The same, written as it is made (a file larger than memory): open, then
 * writes in order (rewrite patches bytes already written, as a header
 * completed last), then commit. After a failed open, write or rewrite,
 * abort removes the temporary file; a failed commit has done so itself.
 * LOOM_ERR_RUNTIME. */
struct loom_fs_atomic {
    int fd;
    off_t done, flushed; /* bytes written; handed to the disk */
    char path[4096], tmp[4200];
};
int loom_fs_atomic_open(struct loom_fs_atomic *w, const char *path);
int loom_fs_atomic_write(struct loom_fs_atomic *w, const void *data, size_t n);
int loom_fs_atomic_rewrite(struct loom_fs_atomic *w, const void *data, size_t n, size_t at);
int loom_fs_atomic_commit(struct loom_fs_atomic *w);
void loom_fs_atomic_abort(struct loom_fs_atomic *w);
/* rm -rf; a missing path is not an error. LOOM_ERR_RUNTIME. */
int loom_fs_remove_tree(const char *path);
/* Opens an input for reading: only a regular file is taken. A FIFO,
 * device, socket or directory in its place is refused at once (opened with
 * O_NONBLOCK, never waited on): LOOM_ERR_INPUT "WHAT PATH: not a regular
 * file (a FIFO)", WHAT naming the flag or argument (NULL: none). *st gets
 * the file's stat when st is not NULL. Every file loom reads goes through
 * here or loom_fs_read_small. */
int loom_fs_open_input(const char *path, const char *what, int *fd, struct stat *st);
/* The same as a stdio stream; NULL with *rc set on failure. */
FILE *loom_fs_fopen_input(const char *path, const char *what, int *rc);
/* Whether path can take an output without waiting for a reader: missing
 * (it will be made), a regular file, or a character device such as
 * /dev/null. A FIFO, socket, directory or block device in its place is
 * LOOM_ERR_INPUT "WHAT PATH: not a regular file (a FIFO)". Every file loom
 * writes by a name the user gives is checked here before it is opened. */
int loom_fs_check_output(const char *path, const char *what);
/* Reads a whole regular file of at most max_bytes into a NUL-terminated
 * buffer (loom_free it); LOOM_ERR_INPUT naming the file when it is missing,
 * not a regular file, too large or unreadable. */
int loom_fs_read_small(const char *path, size_t max_bytes, char **out, size_t *len);
/* Whether path is a directory (0 when it does not exist). */
int loom_fs_is_dir(const char *path);
/* Puts the directory part of path ("." when none) into dir. */
void loom_fs_dirname(const char *path, char *dir, size_t n);

#endif
