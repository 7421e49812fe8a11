/*
 * File-system steps that checkpoints are built from: creating directory
 * paths, durable small files (temporary name, fsync, rename, directory
 * fsync), directory fsync, recursive removal, and reading a small file whole.
 * Every failure is a status with the operation, the path and strerror.
 * Not here: the safetensors writer's own crash-safe write (io/safetensors).
 */
#ifndef LOOM_IO_FS_H
#define LOOM_IO_FS_H

#include <stddef.h>

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
/* rm -rf; a missing path is not an error. LOOM_ERR_RUNTIME. */
int loom_fs_remove_tree(const char *path);
/* Reads a whole regular file of at most max_bytes into a NUL-terminated
 * buffer (loom_free it); LOOM_ERR_INPUT naming the file when it is missing,
 * not a regular file, too large or unreadable. */
int loom_fs_read_small(const char *path, size_t max_bytes, char **out, size_t *len);
/* Whether path is a directory (0 when it does not exist). */
int loom_fs_is_dir(const char *path);
/* Puts the directory part of path ("." when none) into dir. */
void loom_fs_dirname(const char *path, char *dir, size_t n);

#endif
