/*
 * TensorBoard event files (tensorboard.h): TFRecord framing and the few
 * protocol buffer fields of an Event with a scalar Summary.
 */
#include "io/tensorboard.h"

#include <errno.h>
#include <string.h>
#include <sys/time.h>
#include <unistd.h>

#include "base/log.h"
#include "io/fs.h"

uint32_t loom_crc32c(const void *data, size_t n)
{
    static uint32_t table[256];
    static int made;
    if (!made) {
        for (uint32_t i = 0; i < 256; i++) {
            uint32_t c = i;
            for (int k = 0; k < 8; k++)
                c = c & 1 ? (c >> 1) ^ 0x82f63b78u : c >> 1; /* reflected Castagnoli */
            table[i] = c;
        }
        made = 1;
    }
    const unsigned char *p = data;
    uint32_t c = 0xffffffffu;
    for (size_t i = 0; i < n; i++) c = table[(c ^ p[i]) & 0xff] ^ (c >> 8);
    return c ^ 0xffffffffu;
}

/* TFRecord's masked CRC: rotated right by 15 and offset. */
static uint32_t masked_crc(const void *data, size_t n)
{
    const uint32_t c = loom_crc32c(data, n);
    return ((c >> 15) | (c << 17)) + 0xa282ead8u;
}

/* ---- protocol buffer encoding: a growing byte string ------------------------ */

struct pb {
    unsigned char b[512];
    size_t n;
};

static void pb_bytes(struct pb *p, const void *src, size_t n)
{
    LOOM_ASSERT(p->n + n <= sizeof p->b);
    memcpy(p->b + p->n, src, n);
    p->n += n;
}

static void pb_varint(struct pb *p, uint64_t v)
{
    unsigned char buf[10];
    size_t k = 0;
    do {
        buf[k++] = (unsigned char)((v & 0x7f) | (v > 0x7f ? 0x80 : 0));
        v >>= 7;
    } while (v);
    pb_bytes(p, buf, k);
}

/* little-endian fixed-width fields */
static void pb_le(struct pb *p, uint64_t v, int bytes)
{
    unsigned char buf[8];
    for (int i = 0; i < bytes; i++) buf[i] = (unsigned char)(v >> (8 * i));
    pb_bytes(p, buf, (size_t)bytes);
}

/* field numbers and wire types: 0 varint, 1 64-bit, 2 length-delimited, 5 32-bit */
static void pb_key(struct pb *p, int field, int wire)
{
    pb_varint(p, (uint64_t)(field << 3 | wire));
}

static void pb_string(struct pb *p, int field, const void *s, size_t n)
{
    pb_key(p, field, 2);
    pb_varint(p, n);
    pb_bytes(p, s, n);
}

static void pb_double(struct pb *p, int field, double v)
{
    uint64_t u;
    memcpy(&u, &v, sizeof u);
    pb_key(p, field, 1);
    pb_le(p, u, 8);
}

static void pb_float(struct pb *p, int field, float v)
{
    uint32_t u;
    memcpy(&u, &v, sizeof u);
    pb_key(p, field, 5);
    pb_le(p, u, 4);
}

/* Event { double wall_time = 1; int64 step = 2; string file_version = 3;
 * Summary summary = 5; }  Summary { repeated Value value = 1; }
 * Value { string tag = 1; float simple_value = 2; } */
enum { EVENT_WALL_TIME = 1, EVENT_STEP = 2, EVENT_FILE_VERSION = 3, EVENT_SUMMARY = 5 };
enum { SUMMARY_VALUE = 1, VALUE_TAG = 1, VALUE_SIMPLE = 2 };

static double wall_time(void)
{
    struct timeval tv;
    gettimeofday(&tv, NULL);
    return (double)tv.tv_sec + tv.tv_usec * 1e-6;
}

/* The first failure of the file is kept (its errno; EIO when stdio left none). */
static void failed(struct loom_tb *tb)
{
    if (!tb->err) tb->err = errno ? errno : EIO;
}

static void put(struct loom_tb *tb, const void *data, size_t n)
{
    if (fwrite(data, 1, n, tb->f) != n) failed(tb);
}

static void write_record(struct loom_tb *tb, const struct pb *ev)
{
    unsigned char len[8];
    for (int i = 0; i < 8; i++) len[i] = (unsigned char)((uint64_t)ev->n >> (8 * i));
    const uint32_t lc = masked_crc(len, sizeof len), dc = masked_crc(ev->b, ev->n);
    unsigned char c[4];
    put(tb, len, sizeof len);
    for (int i = 0; i < 4; i++) c[i] = (unsigned char)(lc >> (8 * i));
    put(tb, c, 4);
    put(tb, ev->b, ev->n);
    for (int i = 0; i < 4; i++) c[i] = (unsigned char)(dc >> (8 * i));
    put(tb, c, 4);
}

int loom_tb_open(struct loom_tb *tb, const char *dir)
{
    memset(tb, 0, sizeof *tb);
    if (loom_fs_mkdir_p(dir)) {
        char why[512];
        snprintf(why, sizeof why, "%s", loom_error_message());
        return loom_error_set(LOOM_ERR_INPUT, "--tensorboard-dir %s: %s", dir, why);
    }
    char host[256] = "localhost";
    gethostname(host, sizeof host - 1);
    snprintf(tb->path, sizeof tb->path, "%s/events.out.tfevents.%ld.%s.%ld", dir, (long)wall_time(), host,
             (long)getpid());
    tb->f = fopen(tb->path, "wb");
    if (!tb->f)
        return loom_error_set(LOOM_ERR_INPUT, "--tensorboard-dir %s: cannot create %s: %s", dir, tb->path,
                              strerror(errno));
    struct pb ev = {.n = 0};
    pb_double(&ev, EVENT_WALL_TIME, wall_time());
    static const char version[] = "brain.Event:2";
    pb_string(&ev, EVENT_FILE_VERSION, version, sizeof version - 1);
    write_record(tb, &ev);
    loom_tb_flush(tb);
    return LOOM_OK;
}

void loom_tb_scalar(struct loom_tb *tb, int64_t step, const char *tag, double value)
{
    if (!tb->f) return;
    struct pb val = {.n = 0}, sum = {.n = 0}, ev = {.n = 0};
    pb_string(&val, VALUE_TAG, tag, strlen(tag));
    pb_float(&val, VALUE_SIMPLE, (float)value);
    pb_string(&sum, SUMMARY_VALUE, val.b, val.n);
    pb_double(&ev, EVENT_WALL_TIME, wall_time());
    pb_key(&ev, EVENT_STEP, 0);
    pb_varint(&ev, (uint64_t)step);
    pb_string(&ev, EVENT_SUMMARY, sum.b, sum.n);
    write_record(tb, &ev);
}

void loom_tb_flush(struct loom_tb *tb)
{
    if (tb->f && (fflush(tb->f) != 0 || ferror(tb->f))) failed(tb);
}

void loom_tb_close(struct loom_tb *tb)
{
    if (tb->f && fclose(tb->f) != 0) failed(tb);
    tb->f = NULL;
}

int loom_tb_status(const struct loom_tb *tb)
{
    if (!tb->err) return LOOM_OK;
    return loom_error_set(LOOM_ERR_RUNTIME, "--tensorboard-dir %s: write failed: %s", tb->path,
                          strerror(tb->err));
}
