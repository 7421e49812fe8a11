/*
 * The save directory: building a checkpoint under a temporary name and
 * committing it (state file, rename, directory fsync, then `latest`),
 * keeping the newest K, the lock that keeps one job writing there and the
 * start-up check that the directory can take checkpoints, and finding what
 * a --load path names with its fallbacks (the same run's first). See checkpoint.h for the protocol and why it
 * is crash-safe.
 */
#define _GNU_SOURCE /* renameat2 */
#include "io/checkpoint.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include "base/log.h"
#include "base/mem.h"
#include "base/testpoint.h"
#include "io/fs.h"
#include "io/safetensors.h"

#define ITER_PREFIX "iter_"
#define LATEST "latest"

/* The lock this process holds (it lives as long as the process): its
 * descriptor, -1 before one is taken. */
static int held = -1;

int loom_ckpt_lock(const char *save)
{
    int rc = loom_fs_mkdir_p(save);
    if (rc) return rc;
    char path[4200], holder[256] = "";
    snprintf(path, sizeof path, "%s/.lock", save);
    int fd = open(path, O_RDWR | O_CREAT | O_CLOEXEC | O_NOFOLLOW | O_NONBLOCK, 0644);
    if (fd < 0)
        return loom_error_set(LOOM_ERR_INPUT, "--save %s: cannot open its lock %s: %s", save, path,
                              strerror(errno));
    if (flock(fd, LOCK_EX | LOCK_NB) != 0) {
        ssize_t n = read(fd, holder, sizeof holder - 1);
        holder[n > 0 ? n : 0] = 0;
        holder[strcspn(holder, "\n")] = 0;
        close(fd);
        return loom_error_set(
            LOOM_ERR_INPUT,
            "--save %s: another job is saving there (%s); one job writes a save directory at a time", save,
            *holder ? holder : "its holder unknown");
    }
    char host[64] = "?";
    gethostname(host, sizeof host - 1);
    int len = snprintf(holder, sizeof holder, "pid %ld on %s\n", (long)getpid(), host);
    if (ftruncate(fd, 0) != 0 || write(fd, holder, (size_t)len) != len)
        loom_log_warn("--save %s: cannot write its lock's holder: %s", save, strerror(errno));
    if (held >= 0) close(held);
    held = fd;
    return LOOM_OK;
}

int loom_ckpt_lock_check(const char *save)
{
    if (held < 0) return LOOM_OK;
    char path[4200];
    struct stat mine, there;
    snprintf(path, sizeof path, "%s/.lock", save);
    if (fstat(held, &mine) != 0)
        return loom_error_set(LOOM_ERR_RUNTIME, "--save %s: cannot stat the lock this job holds: %s", save,
                              strerror(errno));
    const int gone = lstat(path, &there) != 0;
    if (gone || there.st_dev != mine.st_dev || there.st_ino != mine.st_ino)
        return loom_error_set(LOOM_ERR_RUNTIME,
                              "--save %s: its lock %s was %s while this job held it (another job may be "
                              "writing there): not saving, nothing in it is touched",
                              save, path, gone ? "removed" : "replaced");
    return LOOM_OK;
}

void loom_ckpt_iter_dir(const char *save, int64_t iteration, char *out, size_t n)
{
    snprintf(out, n, "%s/" ITER_PREFIX "%07" PRId64, save, iteration);
}

/* The iteration of a directory name iter_NNNNNNN, or -1. */
static int64_t iter_of(const char *name)
{
    if (strncmp(name, ITER_PREFIX, sizeof ITER_PREFIX - 1) != 0) return -1;
    const char *d = name + sizeof ITER_PREFIX - 1;
    size_t n = strlen(d);
    if (n < 7 || n > 15) return -1;
    for (size_t i = 0; i < n; i++)
        if (d[i] < '0' || d[i] > '9') return -1;
    return strtoll(d, NULL, 10);
}

void loom_ckpt_tmp_dir(const char *save, int64_t iteration, char *out, size_t n)
{
    snprintf(out, n, "%s/.tmp." ITER_PREFIX "%07" PRId64, save, iteration);
}

/* Removes what an interrupted save left in save: .tmp.iter_*, .old.iter_*
 * and latest.tmp.* (one job writes a save directory at a time). */
static int remove_leftovers(const char *save)
{
    DIR *d = opendir(save);
    if (!d) return loom_error_set(LOOM_ERR_RUNTIME, "open directory %s: %s", save, strerror(errno));
    struct dirent *e;
    int rc = LOOM_OK;
    while (rc == LOOM_OK && (e = readdir(d))) {
        const char *n = e->d_name;
        int stale = ((strncmp(n, ".tmp.", 5) == 0 || strncmp(n, ".old.", 5) == 0) && iter_of(n + 5) >= 0) ||
                    strncmp(n, LATEST ".tmp.", sizeof LATEST + 4) == 0;
        if (!stale) continue;
        char path[4400];
        snprintf(path, sizeof path, "%s/%s", save, n);
        rc = loom_fs_remove_tree(path);
    }
    closedir(d);
    return rc;
}

int loom_ckpt_check_save(const char *save)
{
    DIR *d = opendir(save);
    if (!d) return loom_error_set(LOOM_ERR_INPUT, "--save %s: cannot open it: %s", save, strerror(errno));
    struct dirent *e;
    int rc = LOOM_OK;
    while (rc == LOOM_OK && (e = readdir(d))) {
        const char *n = e->d_name;
        char path[4400];
        struct stat st;
        snprintf(path, sizeof path, "%s/%s", save, n);
        if (strcmp(n, LATEST) == 0 && lstat(path, &st) == 0 && S_ISDIR(st.st_mode))
            rc = loom_error_set(LOOM_ERR_INPUT,
                                "--save %s: %s is a directory; every save writes the newest checkpoint's "
                                "name into a file there: move it away",
                                save, path);
        else if (iter_of(n) >= 0 && (stat(path, &st) != 0 || !S_ISDIR(st.st_mode)))
            rc = loom_error_set(LOOM_ERR_INPUT,
                                "--save %s: %s is not a directory; a save of iteration %" PRId64
                                " would fail on it: move it away",
                                save, path, iter_of(n));
    }
    closedir(d);
    return rc;
}

int loom_ckpt_begin(const char *save, int64_t iteration)
{
    int rc = loom_fs_mkdir_p(save);
    if (rc || (rc = loom_ckpt_lock_check(save)) || (rc = remove_leftovers(save))) return rc;
    char tmp[4200];
    loom_ckpt_tmp_dir(save, iteration, tmp, sizeof tmp);
    if (mkdir(tmp, 0755) != 0)
        return loom_error_set(LOOM_ERR_RUNTIME, "create directory %s: %s", tmp, strerror(errno));
    return LOOM_OK;
}

void loom_ckpt_abandon(const char *tmp)
{
    if (loom_fs_remove_tree(tmp)) loom_error_clear(); /* best effort: the error being reported matters more */
}

static int cmp_desc(const void *a, const void *b)
{
    int64_t x = *(const int64_t *)a, y = *(const int64_t *)b;
    return (x < y) - (x > y);
}

/* The iterations of the complete checkpoints in save (those holding a state
 * file), newest first; loom_free *out. */
static int list_iterations(const char *save, int64_t **out, int *n)
{
    *out = NULL;
    *n = 0;
    DIR *d = opendir(save);
    if (!d) return loom_error_set(LOOM_ERR_INPUT, "cannot open directory %s: %s", save, strerror(errno));
    int cap = 0;
    struct dirent *e;
    while ((e = readdir(d))) {
        int64_t it = iter_of(e->d_name);
        if (it < 0) continue;
        char state[4400];
        struct stat st;
        snprintf(state, sizeof state, "%s/%s/%s", save, e->d_name, LOOM_CKPT_STATE_FILE);
        if (stat(state, &st) != 0) continue;
        if (*n == cap)
            *out = loom_realloc(*out, loom_mul_size((size_t)(cap = cap ? 2 * cap : 16), sizeof(int64_t)),
                                LOOM_MEM_OTHER);
        (*out)[(*n)++] = it;
    }
    closedir(d);
    if (*n > 1) qsort(*out, (size_t)*n, sizeof **out, cmp_desc);
    return LOOM_OK;
}

/* Removes all but the newest keep checkpoints up to `current` (never
 * `current`, nor any past it: another run's): each loses
 * its state file first, so a kill half-way leaves no directory that looks
 * complete. Failures are warnings. */
static void prune(const char *save, int64_t current, int keep)
{
    int64_t *its;
    int n;
    if (list_iterations(save, &its, &n)) {
        loom_log_warn("%s", loom_error_message());
        return;
    }
    /* the newest keep of this run's: those past `current` are another run's, left alone */
    int kept = 0;
    for (int i = 0; i < n; i++) {
        if (its[i] > current || its[i] == current || kept++ < keep - 1) continue;
        char dir[4200], state[4400];
        loom_ckpt_iter_dir(save, its[i], dir, sizeof dir);
        struct stat st; /* a link to a checkpoint elsewhere is not ours to remove, nor followed */
        if (lstat(dir, &st) != 0 || !S_ISDIR(st.st_mode)) continue;
        snprintf(state, sizeof state, "%s/%s", dir, LOOM_CKPT_STATE_FILE);
        if ((unlink(state) != 0 && errno != ENOENT) || loom_fs_remove_tree(dir))
            loom_log_warn("removing the old checkpoint %s: %s", dir,
                          loom_error_is_set() ? loom_error_message() : strerror(errno));
    }
    loom_free(its);
}

/* Whether the checkpoint in dir is another run's than the state text's
 * (its run in *run: the identifier, "unknown" for an unreadable state,
 * "none" for a state written before runs were recorded). */
static int other_run(const char *dir, const char *state_text, char *run, size_t n)
{
    struct loom_ckpt_state mine, theirs;
    memset(&mine, 0, sizeof mine);
    memset(&theirs, 0, sizeof theirs);
    if (loom_ckpt_state_parse(state_text, strlen(state_text), &mine) != LOOM_OK) {
        loom_error_clear();
        return 0; /* cannot tell: the same-run path (as before runs were recorded) */
    }
    int other;
    if (loom_ckpt_state_read(dir, &theirs) != LOOM_OK) {
        loom_error_clear();
        snprintf(run, n, "unknown");
        other = 1;
    } else {
        snprintf(run, n, "%s", *theirs.run ? theirs.run : "none");
        other = strcmp(theirs.run, mine.run) != 0;
        loom_ckpt_state_free(&theirs);
    }
    loom_ckpt_state_free(&mine);
    return other;
}

int loom_ckpt_commit(const char *save, int64_t iteration, const char *tmp, const char *state_text,
                     int keep_last)
{
    char path[4200], final[4200], old[4200];
    snprintf(path, sizeof path, "%s/%s", tmp, LOOM_CKPT_STATE_FILE);
    const void *text[1] = {state_text};
    size_t len[1] = {strlen(state_text)};
    int rc = loom_fs_write_atomic(path, text, len, 1);
    if (rc) return rc;
    loom_test_point("before-rename");
    loom_ckpt_iter_dir(save, iteration, final, sizeof final);
    snprintf(old, sizeof old, "%s/.old." ITER_PREFIX "%07" PRId64, save, iteration);
    char other[LOOM_CKPT_RUN_LEN + 16];
    if ((rc = loom_ckpt_lock_check(save))) return rc; /* the save began under this job's lock: still? */
    if (loom_fs_is_dir(final) && other_run(final, state_text, other, sizeof other)) {
        /* another run's checkpoint of this iteration: nothing is lost, it
         * moves aside under a name no loader or --keep-last reads */
        char aside[4300];
        snprintf(aside, sizeof aside, "%s.run-%s", final, other);
        for (int k = 2; loom_fs_is_dir(aside) && k < 1000; k++)
            snprintf(aside, sizeof aside, "%s.run-%s.%d", final, other, k);
        if (rename(final, aside) != 0)
            return loom_error_set(LOOM_ERR_RUNTIME, "rename %s to %s: %s", final, aside, strerror(errno));
        if (rename(tmp, final) != 0)
            return loom_error_set(LOOM_ERR_RUNTIME, "rename %s to %s: %s", tmp, final, strerror(errno));
        loom_log_warn("%s was run %s's checkpoint of this iteration: kept as %s, this run's takes its name",
                      final, other, aside);
    } else if (loom_fs_is_dir(final)) {
        /* the same iteration saved again (a resumed run passing it once more):
         * swap the two directories in one step, so a kill at any moment leaves
         * a complete iter_N, then drop the old one */
        if (renameat2(AT_FDCWD, tmp, AT_FDCWD, final, RENAME_EXCHANGE) != 0)
            return loom_error_set(LOOM_ERR_RUNTIME, "exchange %s and %s: %s", tmp, final, strerror(errno));
        if (rename(tmp, old) != 0) /* the old one stays at tmp: the next save removes it */
            loom_log_warn("rename %s to %s: %s", tmp, old, strerror(errno));
    } else if (rename(tmp, final) != 0) {
        return loom_error_set(LOOM_ERR_RUNTIME, "rename %s to %s: %s", tmp, final, strerror(errno));
    }
    if ((rc = loom_fs_fsync_dir(save))) return rc;
    loom_test_point("before-latest");
    char latest[4200], name[64];
    snprintf(latest, sizeof latest, "%s/%s", save, LATEST);
    snprintf(name, sizeof name, ITER_PREFIX "%07" PRId64 "\n", iteration);
    text[0] = name, len[0] = strlen(name);
    if ((rc = loom_fs_write_atomic(latest, text, len, 1))) return rc;
    loom_test_point("after-latest");
    /* the new checkpoint is committed: what follows is housekeeping, and a
     * failure there is a warning, not a failed save */
    if (loom_fs_remove_tree(old)) loom_log_warn("%s", loom_error_message());
    if (keep_last > 0) prune(save, iteration, keep_last);
    loom_error_clear();
    return LOOM_OK;
}

static void add_dir(char ***dirs, int *n, const char *dir)
{
    for (int i = 0; i < *n; i++)
        if (strcmp((*dirs)[i], dir) == 0) return;
    *dirs = loom_realloc(*dirs, loom_mul_size((size_t)*n + 1, sizeof(char *)), LOOM_MEM_OTHER);
    (*dirs)[(*n)++] = loom_xstrdup(dir);
}

void loom_ckpt_candidates_free(char **dirs, int ndirs)
{
    for (int i = 0; i < ndirs; i++) loom_free(dirs[i]);
    loom_free(dirs);
}

/* Whether file starts as loom's trainer state does ({"checksum":...):
 * Hugging Face's Trainer writes a trainer_state.json of its own. */
static int loom_state_file(const char *file)
{
    int fd = open(file, O_RDONLY | O_CLOEXEC | O_NONBLOCK); /* a FIFO is not one, and not waited on */
    if (fd < 0) return 0;
    struct stat st;
    char head[16] = "";
    ssize_t n = fstat(fd, &st) == 0 && S_ISREG(st.st_mode) ? read(fd, head, sizeof head - 1) : -1;
    close(fd);
    if (n < 0) return 0;
    head[n] = '\0';
    return strncmp(head, "{\"checksum\"", 11) == 0;
}

int64_t loom_ckpt_newest(const char *save)
{
    int64_t *its, newest = -1;
    int n;
    if (!loom_fs_is_dir(save) || list_iterations(save, &its, &n) != LOOM_OK) {
        loom_error_clear();
        return -1;
    }
    if (n > 0) newest = its[0];
    loom_free(its);
    return newest;
}

int loom_ckpt_is_checkpoint(const char *path)
{
    if (!loom_fs_is_dir(path)) return 0;
    char buf[4400];
    struct stat st;
    snprintf(buf, sizeof buf, "%s/%s", path, LOOM_CKPT_STATE_FILE);
    if (stat(buf, &st) == 0) return loom_state_file(buf);
    snprintf(buf, sizeof buf, "%s/%s", path, LATEST);
    if (stat(buf, &st) == 0) return 1;
    int64_t *its;
    int n;
    if (list_iterations(path, &its, &n) != LOOM_OK) {
        loom_error_clear();
        return 0;
    }
    loom_free(its);
    return n > 0;
}

void loom_ckpt_run_of(const char *dir, char *run, size_t n)
{
    char path[4400], *text;
    size_t len;
    snprintf(run, n, "%s", "");
    snprintf(path, sizeof path, "%s/%s", dir, LOOM_CKPT_STATE_FILE);
    if (loom_fs_read_small(path, LOOM_CKPT_STATE_MAX_BYTES, &text, &len) == LOOM_OK) {
        struct loom_ckpt_state st;
        if (loom_ckpt_state_parse(text, len, &st) == LOOM_OK) {
            snprintf(run, n, "%s", *st.run ? st.run : "none");
            loom_ckpt_state_free(&st);
        }
        loom_free(text);
    }
    loom_error_clear();
    DIR *d = *run ? NULL : opendir(dir);
    struct dirent *e;
    while (d && !*run && (e = readdir(d))) { /* the state says nothing: a rank file may */
        size_t k = strlen(e->d_name);
        if (k < 12 || strcmp(e->d_name + k - 12, ".safetensors") != 0) continue;
        struct loom_st f;
        snprintf(path, sizeof path, "%s/%s", dir, e->d_name);
        if (loom_st_open(&f, path) == LOOM_OK) {
            const char *r = loom_st_meta(&f, LOOM_CKPT_META_RUN);
            if (r && strlen(r) == LOOM_CKPT_RUN_LEN) snprintf(run, n, "%s", r);
            loom_st_close(&f);
        }
        loom_error_clear();
    }
    if (d) closedir(d);
}

/* dirs[1..n) in place, stably: those of dirs[0]'s run first (the run the
 * newest checkpoint, or latest, names), then the others. */
static void same_run_first(char **dirs, int n)
{
    char head[LOOM_CKPT_RUN_LEN + 8], run[LOOM_CKPT_RUN_LEN + 8];
    if (n < 3) return;
    loom_ckpt_run_of(dirs[0], head, sizeof head);
    if (!*head) return; /* nothing says which run it is */
    char **other = loom_alloc(loom_mul_size((size_t)n, sizeof *other), LOOM_MEM_OTHER);
    int k = 1, m = 0;
    for (int i = 1; i < n; i++) {
        loom_ckpt_run_of(dirs[i], run, sizeof run);
        if (strcmp(run, head) == 0)
            dirs[k++] = dirs[i];
        else
            other[m++] = dirs[i];
    }
    memcpy(dirs + k, other, (size_t)m * sizeof *other);
    loom_free(other);
}

int loom_ckpt_candidates(const char *path, char ***dirs, int *ndirs, int *is_save_dir)
{
    *dirs = NULL;
    *ndirs = 0;
    *is_save_dir = 0;
    struct stat st;
    if (stat(path, &st) != 0) return loom_error_set(LOOM_ERR_INPUT, "--load %s: %s", path, strerror(errno));
    if (S_ISREG(st.st_mode)) return LOOM_OK;
    if (!S_ISDIR(st.st_mode))
        return loom_error_set(LOOM_ERR_INPUT, "--load %s: not a file or directory", path);
    char buf[4400];
    snprintf(buf, sizeof buf, "%s/%s", path, LOOM_CKPT_STATE_FILE);
    if (stat(buf, &st) == 0) { /* one checkpoint, named directly */
        add_dir(dirs, ndirs, path);
        return LOOM_OK;
    }
    *is_save_dir = 1;
    int rc;
    /* latest first, when it names a checkpoint directory */
    char *text = NULL;
    size_t len;
    snprintf(buf, sizeof buf, "%s/%s", path, LATEST);
    if (loom_fs_read_small(buf, 256, &text, &len) == LOOM_OK) {
        while (len && (text[len - 1] == '\n' || text[len - 1] == ' ')) text[--len] = 0;
        int64_t it = iter_of(text);
        if (it >= 0) {
            loom_ckpt_iter_dir(path, it, buf, sizeof buf);
            if (loom_fs_is_dir(buf)) add_dir(dirs, ndirs, buf);
        } else {
            loom_log_warn("%s/%s does not name a checkpoint ('%.40s'); looking for the newest one", path,
                          LATEST, text);
        }
        loom_free(text);
    }
    loom_error_clear();
    int64_t *its;
    int n;
    if ((rc = list_iterations(path, &its, &n))) return rc;
    for (int i = 0; i < n; i++) {
        loom_ckpt_iter_dir(path, its[i], buf, sizeof buf);
        add_dir(dirs, ndirs, buf);
    }
    loom_free(its);
    same_run_first(*dirs, *ndirs);
    if (*ndirs == 0)
        rc = loom_error_set(LOOM_ERR_INPUT,
                            "--load %s: no checkpoint there (no %s naming one, no iter_NNNNNNN with %s)",
                            path, LATEST, LOOM_CKPT_STATE_FILE);
    return rc;
}

/* dir's tokenizer held to its state's record (loom_ckpt_find_tokenizer). */
static int checked_tokenizer(const char *dir, const struct loom_ckpt_state *st, char *path, size_t n)
{
    struct stat sb;
    const int model = st->tokenizer == LOOM_CKPT_TOKENIZER_SAVED && st->tokenizer_is_model;
    snprintf(path, n, "%s/%s", dir, model ? LOOM_CKPT_TOKENIZER_MODEL : LOOM_CKPT_TOKENIZER_FILE);
    int there = lstat(path, &sb) == 0;
    if (st->tokenizer == LOOM_CKPT_TOKENIZER_UNRECORDED) { /* an older state: the file as it is */
        if (!there) *path = 0;
        return LOOM_OK;
    }
    if (st->tokenizer == LOOM_CKPT_TOKENIZER_NONE) {
        if (!there) { /* nor a SentencePiece model */
            snprintf(path, n, "%s/%s", dir, LOOM_CKPT_TOKENIZER_MODEL);
            there = lstat(path, &sb) == 0;
        }
        if (!there) {
            *path = 0;
            return LOOM_OK;
        }
        return loom_error_set(LOOM_ERR_INPUT,
                              "%s: the checkpoint was saved without a tokenizer (its trainer state records "
                              "none): this file was put there later; give --tokenizer, or remove it",
                              path);
    }
    int64_t bytes;
    uint64_t sum;
    int rc = loom_ckpt_file_sum(path, &bytes, &sum);
    if (rc) {
        char why[512];
        snprintf(why, sizeof why, "%s", loom_error_message());
        return loom_error_set(LOOM_ERR_INPUT, "the checkpoint's tokenizer, recorded in its trainer state: %s",
                              why);
    }
    if (bytes != st->tokenizer_bytes || sum != st->tokenizer_xxh3)
        return loom_error_set(LOOM_ERR_INPUT,
                              "%s: not the tokenizer saved with the checkpoint (%" PRId64
                              " bytes, XXH3 %016" PRIx64 "; its trainer state records %" PRId64
                              " bytes, XXH3 %016" PRIx64 "): replaced or damaged",
                              path, bytes, sum, st->tokenizer_bytes, st->tokenizer_xxh3);
    return LOOM_OK;
}

int loom_weights_find_tokenizer(const char *in, char *path, size_t n)
{
    *path = 0;
    if (loom_ckpt_is_checkpoint(in)) return loom_ckpt_find_tokenizer(in, path, n);
    if (!loom_fs_is_dir(in)) return LOOM_OK;
    char a[4400], b[4400];
    for (int i = 0; i < 2; i++) { /* tokenizer.json, else a SentencePiece model */
        snprintf(a, sizeof a, "%s/%s", in, i ? LOOM_CKPT_TOKENIZER_MODEL : LOOM_CKPT_TOKENIZER_FILE);
        if (access(a, F_OK) == 0) {
            snprintf(path, n, "%s", a);
            return LOOM_OK;
        }
    }
    snprintf(a, sizeof a, "%s/vocab.json", in);
    snprintf(b, sizeof b, "%s/merges.txt", in);
    if (access(a, F_OK) == 0 && access(b, F_OK) == 0) snprintf(path, n, "%s", in);
    return LOOM_OK;
}

int loom_ckpt_find_tokenizer(const char *load, char *path, size_t n)
{
    char **dirs;
    int ndirs, is_save;
    *path = 0;
    int rc = loom_ckpt_candidates(load, &dirs, &ndirs, &is_save);
    if (rc) { /* not a checkpoint: none to find here */
        loom_ckpt_candidates_free(dirs, ndirs);
        loom_error_clear();
        return LOOM_OK;
    }
    for (int c = 0; c < ndirs; c++) {
        struct loom_ckpt_state st;
        if (loom_ckpt_state_read(dirs[c], &st) != LOOM_OK) {
            loom_error_clear(); /* damaged: its weights are not loaded either */
            continue;
        }
        rc = checked_tokenizer(dirs[c], &st, path, n);
        loom_ckpt_state_free(&st);
        break;
    }
    loom_ckpt_candidates_free(dirs, ndirs);
    return rc;
}
