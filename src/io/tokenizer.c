/*
 * The byte-level tokenizer: text file -> train/val shards, and tokens ->
 * safely printable text.
 *
 * The split is at an exact byte count (no search for a line boundary), so
 * the counts are predictable from the file size. Input is limited to what
 * one shard holds (2^31-1 tokens); larger corpora want several shards,
 * which this command does not write.
 */
#include "io/tokenizer.h"

#include <errno.h>
#include <fcntl.h>
#include <math.h>
#include <stdio.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "base/log.h"
#include "base/mem.h"
#include "io/fs.h"
#include "io/shard.h"

/* OUTDIR/name in a fresh allocation. */
static char *join_path(const char *dir, const char *name)
{
    size_t len = strlen(dir) + strlen(name) + 2;
    char *p = loom_alloc(len, LOOM_MEM_OTHER);
    snprintf(p, len, "%s/%s", dir, name);
    return p;
}

static int write_part(const char *outdir, const char *name, const unsigned char *bytes, int64_t n)
{
    uint16_t *tokens = loom_alloc(loom_mul_size((size_t)n + 1, sizeof *tokens), LOOM_MEM_OTHER);
    for (int64_t i = 0; i < n; i++) tokens[i] = bytes[i];
    char *path = join_path(outdir, name);
    int status = loom_shard_write(path, tokens, n);
    loom_free(path);
    loom_free(tokens);
    return status;
}

int loom_data_tokenize(const char *in, const char *outdir, double val_fraction)
{
    if (!(val_fraction >= 0.0 && val_fraction < 1.0))
        return loom_error_set(LOOM_ERR_INPUT, "validation fraction %g is outside [0, 1) for tokenizing '%s'",
                              val_fraction, in);
    int fd;
    struct stat st;
    int rc = loom_fs_open_input(in, "loom data tokenize IN", &fd, &st); /* a FIFO: refused */
    if (rc) return rc;
    int64_t n = (int64_t)st.st_size;
    if (n == 0 || n > LOOM_SHARD_MAX_TOKENS) {
        close(fd);
        return loom_error_set(LOOM_ERR_INPUT,
                              "text file '%s' has %lld bytes; the byte tokenizer takes 1 to %d", in,
                              (long long)n, LOOM_SHARD_MAX_TOKENS);
    }
    void *map = mmap(NULL, (size_t)n, PROT_READ, MAP_PRIVATE, fd, 0);
    int map_errno = errno;
    if (map == MAP_FAILED) {
        close(fd); /* the mmap error is the one to report */
        return loom_error_set(LOOM_ERR_RUNTIME, "mmap '%s' (%lld bytes): %s", in, (long long)n,
                              strerror(map_errno));
    }
    if (close(fd) != 0) { /* the mapping keeps the data; a failed close is still reported */
        int e = errno;
        munmap(map, (size_t)n);
        return loom_error_set(LOOM_ERR_RUNTIME, "close '%s': %s", in, strerror(e));
    }

    int64_t n_val = (int64_t)llround((double)n * val_fraction);
    int64_t n_train = n - n_val;
    int status = LOOM_OK;
    if (n_train <= 0) {
        status = loom_error_set(LOOM_ERR_INPUT,
                                "text file '%s' (%lld bytes) leaves no training data with "
                                "validation fraction %g",
                                in, (long long)n, val_fraction);
        goto done;
    }
    status = loom_fs_mkdir_p(outdir);
    if (status == LOOM_OK) status = write_part(outdir, "train.bin", map, n_train);
    if (status == LOOM_OK)
        status = write_part(outdir, "val.bin", (const unsigned char *)map + n_train, n_val);
    if (status == LOOM_OK)
        loom_log_info("tokenized '%s': %lld train tokens to %s/train.bin, %lld validation "
                      "tokens to %s/val.bin (byte vocabulary, %d)\n",
                      in, (long long)n_train, outdir, (long long)n_val, outdir, LOOM_BYTE_VOCAB);
done:
    munmap(map, (size_t)n);
    return status;
}

/* ---- decoding ------------------------------------------------------------ */

struct text_out {
    char *buf;
    size_t cap, len; /* len counts every byte asked for, written or not */
};

static void out_put(struct text_out *o, const char *s, size_t k)
{
    for (size_t i = 0; i < k; i++, o->len++)
        if (o->len + 1 < o->cap) o->buf[o->len] = s[i];
}

static int is_cont(int32_t b)
{
    return b >= 0x80 && b <= 0xBF;
}

/* Length of the well-formed UTF-8 sequence starting at t[i] (2 to 4), or 0:
 * no overlong forms, no surrogates, nothing past U+10FFFF. */
static int utf8_len(const int32_t *t, int64_t i, int64_t n)
{
    int32_t b = t[i];
    int len;
    int32_t lo = 0x80, hi = 0xBF; /* allowed range of the second byte */
    if (b >= 0xC2 && b <= 0xDF)
        len = 2;
    else if (b >= 0xE0 && b <= 0xEF) {
        len = 3;
        if (b == 0xE0) lo = 0xA0;
        if (b == 0xED) hi = 0x9F;
    } else if (b >= 0xF0 && b <= 0xF4) {
        len = 4;
        if (b == 0xF0) lo = 0x90;
        if (b == 0xF4) hi = 0x8F;
    } else
        return 0;
    if (i + len > n) return 0;
    if (t[i + 1] < lo || t[i + 1] > hi) return 0;
    for (int k = 2; k < len; k++)
        if (!is_cont(t[i + k])) return 0;
    return len;
}

size_t loom_byte_decode(const int32_t *tokens, int64_t n, char *out, size_t cap)
{
    struct text_out o = {out, cap, 0};
    char tmp[24];
    for (int64_t i = 0; i < n;) {
        int32_t b = tokens[i];
        if (b < 0 || b >= LOOM_BYTE_VOCAB) {
            int k = snprintf(tmp, sizeof tmp, "<%d>", (int)b);
            out_put(&o, tmp, (size_t)k);
            i++;
        } else if (b == '\\') {
            out_put(&o, "\\\\", 2);
            i++;
        } else if ((b >= 0x20 && b < 0x7F) || b == '\n' || b == '\t') {
            char c = (char)b;
            out_put(&o, &c, 1);
            i++;
        } else if (b >= 0x80 && utf8_len(tokens, i, n) > 0) {
            int len = utf8_len(tokens, i, n);
            for (int k = 0; k < len; k++) {
                char c = (char)(unsigned char)tokens[i + k];
                out_put(&o, &c, 1);
            }
            i += len;
        } else {
            int k = snprintf(tmp, sizeof tmp, "\\x%02X", (unsigned)b);
            out_put(&o, tmp, (size_t)k);
            i++;
        }
    }
    if (cap > 0) out[o.len < cap ? o.len : cap - 1] = '\0';
    return o.len;
}
