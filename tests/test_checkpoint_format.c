/*
 * The checkpoint format's pieces and slices (io/checkpoint.h), below the
 * engine: slices that are boxes of a tensor (tensor- and pipeline-parallel
 * splits) and flat ranges of a box (ZeRO shards), written by "ranks" into
 * separate files and assembled into any flat range of the full tensor;
 * slice descriptions that are refused; pieces that overlap, leave a gap, or
 * fail their checksum; boxes cut in a view of the tensor (GPT-2's fused
 * q|k|v weight split by heads) written by one tensor-parallel size and read
 * back, whole or as the boxes of another; the trainer state's checksum and
 * round trip.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "base/log.h"
#include "base/mem.h"
#include "check.h"
#include "io/checkpoint.h"
#include "loom/loom.h"

static char dir[256];

enum { R = 4, CC = 6 }; /* the full tensor is (R, CC) */

static float full_value(int i)
{
    return (float)(i * 3 + 1) * 0.5f;
}

/* Elements of the box [r0,r1) x [c0,c1) in row-major order: the data of a piece. */
static void box_data(float *out, int r0, int r1, int c0, int c1)
{
    int k = 0;
    for (int r = r0; r < r1; r++)
        for (int c = c0; c < c1; c++) out[k++] = full_value(r * CC + c);
}

static void box_slice(struct loom_ckpt_slice *s, int r0, int r1, int c0, int c1, uint64_t lo, uint64_t hi)
{
    const int64_t shape[2] = {R, CC};
    loom_ckpt_slice_whole(s, 2, shape);
    s->start[0] = r0, s->stop[0] = r1, s->start[1] = c0, s->stop[1] = c1;
    s->lo = lo, s->hi = hi;
}

/* Elements [s->lo, s->hi) of s's box (cut in its view) of the tensor whose
 * flat element i is full_value(i), one element at a time: the reference. */
static void slice_ref(float *out, const struct loom_ckpt_slice *s)
{
    for (uint64_t k = s->lo; k < s->hi; k++) {
        uint64_t rest = k, flat = 0, stride = 1;
        for (int d = s->ndim - 1; d >= 0; d--) {
            uint64_t ext = (uint64_t)(s->stop[d] - s->start[d]);
            flat += ((uint64_t)s->start[d] + rest % ext) * stride;
            rest /= ext;
            stride *= (uint64_t)s->shape[d];
        }
        out[k - s->lo] = full_value((int)flat);
    }
}

/* A tensor-parallel split of the columns (two halves), the second half
 * further split by ZeRO into two flat ranges: three pieces in three files. */
static void write_split(void)
{
    float left[R * 3], right[R * 3];
    box_data(left, 0, R, 0, 3);
    box_data(right, 0, R, 3, CC);
    struct loom_ckpt_piece p0 = {.name = "w", .data = left}, p1 = {.name = "w", .data = right},
                           p2 = {.name = "w", .data = right + 5};
    box_slice(&p0.slice, 0, R, 0, 3, 0, R * 3);
    box_slice(&p1.slice, 0, R, 3, CC, 0, 5);
    box_slice(&p2.slice, 0, R, 3, CC, 5, R * 3);
    char path[512];
    snprintf(path, sizeof path, "%s/a.safetensors", dir);
    CHECK(loom_ckpt_write_file(path, &p0, 1, NULL, 0) == LOOM_OK);
    snprintf(path, sizeof path, "%s/b.safetensors", dir);
    CHECK(loom_ckpt_write_file(path, &p1, 1, NULL, 0) == LOOM_OK);
    snprintf(path, sizeof path, "%s/c.safetensors", dir);
    CHECK(loom_ckpt_write_file(path, &p2, 1, NULL, 0) == LOOM_OK);
}

static void test_assemble(void)
{
    write_split();
    const char *files[] = {"a.safetensors", "b.safetensors", "c.safetensors"};
    struct loom_ckpt_reader *r;
    CHECK(loom_ckpt_reader_open(&r, dir, files, 3) == LOOM_OK);
    const int64_t shape[2] = {R, CC};
    float want[R * CC], got[R * CC];
    for (int i = 0; i < R * CC; i++) want[i] = full_value(i);
    /* the whole tensor, and every flat range of it (what a ZeRO shard of any size asks for) */
    int all_ok = 1;
    for (int lo = 0; lo < R * CC; lo++)
        for (int hi = lo + 1; hi <= R * CC; hi++) {
            memset(got, 0, sizeof got);
            int rc = loom_ckpt_read(r, "w", 2, shape, (uint64_t)lo, (uint64_t)hi, got);
            all_ok &= rc == LOOM_OK && memcmp(got, want + lo, sizeof(float) * (size_t)(hi - lo)) == 0;
        }
    CHECK(all_ok);
    CHECK(loom_ckpt_has(r, "w") && !loom_ckpt_has(r, "v"));
    /* the wrong shape, a missing tensor */
    const int64_t other[2] = {CC, R};
    CHECK(loom_ckpt_read(r, "w", 2, other, 0, 4, got) == LOOM_ERR_INPUT &&
          strstr(loom_error_message(), "shape"));
    CHECK(loom_ckpt_read(r, "v", 2, shape, 0, 4, got) == LOOM_ERR_INPUT &&
          strstr(loom_error_message(), "no tensor v"));
    loom_ckpt_reader_close(r);

    /* a gap: without the last piece, the elements it held are missing */
    CHECK(loom_ckpt_reader_open(&r, dir, files, 2) == LOOM_OK);
    CHECK(loom_ckpt_read(r, "w", 2, shape, 0, R * CC, got) == LOOM_ERR_INPUT &&
          strstr(loom_error_message(), "holds 17 of elements [0, 24)"));
    CHECK(loom_ckpt_read(r, "w", 2, shape, 0, 3, got) == LOOM_OK &&
          memcmp(got, want, 3 * sizeof(float)) == 0);
    loom_ckpt_reader_close(r);

    /* overlap: the same piece twice */
    const char *twice[] = {"a.safetensors", "b.safetensors", "c.safetensors", "a.safetensors"};
    CHECK(loom_ckpt_reader_open(&r, dir, twice, 4) == LOOM_ERR_INPUT &&
          strstr(loom_error_message(), "overlap"));
    loom_ckpt_reader_close(r);
}

static void test_damage(void)
{
    write_split();
    char path[512];
    snprintf(path, sizeof path, "%s/b.safetensors", dir);
    FILE *f = fopen(path, "r+b");
    CHECK(f != NULL);
    fseek(f, -4, SEEK_END); /* the last float of the piece */
    fputc(0x55, f);
    fclose(f);
    const char *files[] = {"a.safetensors", "b.safetensors", "c.safetensors"};
    struct loom_ckpt_reader *r;
    const int64_t shape[2] = {R, CC};
    float got[R * CC];
    CHECK(loom_ckpt_reader_open(&r, dir, files, 3) == LOOM_OK);
    CHECK(loom_ckpt_read(r, "w", 2, shape, 0, 3, got) == LOOM_OK); /* the damaged piece is not needed */
    CHECK(loom_ckpt_read(r, "w", 2, shape, 0, R * CC, got) == LOOM_ERR_INPUT &&
          strstr(loom_error_message(), "b.safetensors: tensor w fails its checksum") &&
          !strchr(loom_error_message(), '\n'));
    loom_ckpt_reader_close(r);
}

/* ---- pieces written as they are made ---------------------------------------- */

enum { BIG = 5 << 20 }; /* 20 MB of floats: more than one staging buffer */

struct made {
    const float *from;
    int calls, fail_at;
};

static int make_piece(void *ctx, uint64_t at, float *dst, size_t count)
{
    struct made *m = ctx;
    if (++m->calls == m->fail_at) return loom_error_set(LOOM_ERR_RUNTIME, "the source failed");
    memcpy(dst, m->from + at, count * sizeof(float));
    return LOOM_OK;
}

static int file_bytes(const char *path, unsigned char **out, long *n)
{
    FILE *f = fopen(path, "rb");
    if (!f) return -1;
    fseek(f, 0, SEEK_END);
    *n = ftell(f);
    fseek(f, 0, SEEK_SET);
    *out = malloc((size_t)*n + 1);
    size_t got = fread(*out, 1, (size_t)*n, f);
    fclose(f);
    return got == (size_t)*n ? 0 : -1;
}

/* A piece made by fill (offloaded state) gives the same file, byte for
 * byte, as the same values in memory, read back through its checksum; a
 * source that fails stops the write with its error and leaves nothing. */
static void test_streamed(void)
{
    float *big = malloc(BIG * sizeof(float)), small[7];
    for (int i = 0; i < BIG; i++) big[i] = full_value(i % 100000) + (float)(i / 100000);
    for (int i = 0; i < 7; i++) small[i] = full_value(i);
    const int64_t bshape[1] = {BIG}, sshape[1] = {7};
    struct loom_ckpt_piece mem[2] = {{.name = "big", .data = big}, {.name = "small", .data = small}};
    loom_ckpt_slice_whole(&mem[0].slice, 1, bshape);
    loom_ckpt_slice_whole(&mem[1].slice, 1, sshape);
    char a[512], b[512];
    snprintf(a, sizeof a, "%s/mem.safetensors", dir);
    snprintf(b, sizeof b, "%s/made.safetensors", dir);
    CHECK(loom_ckpt_write_file(a, mem, 2, NULL, 0) == LOOM_OK);
    struct made src = {big, 0, 0};
    struct loom_ckpt_piece made[2] = {mem[0], mem[1]};
    made[0].data = NULL, made[0].fill = make_piece, made[0].fill_ctx = &src;
    CHECK(loom_ckpt_write_file(b, made, 2, NULL, 0) == LOOM_OK);
    CHECK(src.calls == 2); /* 20 MB in two pieces of at most 16 MB */
    unsigned char *x = NULL, *y = NULL;
    long nx = 0, ny = 0;
    CHECK(file_bytes(a, &x, &nx) == 0 && file_bytes(b, &y, &ny) == 0);
    CHECK(nx == ny && nx > BIG * 4 && memcmp(x, y, (size_t)nx) == 0);
    free(x);
    free(y);
    const char *files[] = {"made.safetensors"};
    struct loom_ckpt_reader *r;
    float *got = malloc(BIG * sizeof(float));
    CHECK(loom_ckpt_reader_open(&r, dir, files, 1) == LOOM_OK);
    CHECK(loom_ckpt_read(r, "big", 1, bshape, 0, BIG, got) == LOOM_OK && memcmp(got, big, BIG * 4) == 0);
    loom_ckpt_reader_close(r);

    snprintf(b, sizeof b, "%s/failed.safetensors", dir);
    src.calls = 0, src.fail_at = 2;
    CHECK(loom_ckpt_write_file(b, made, 2, NULL, 0) == LOOM_ERR_RUNTIME &&
          strstr(loom_error_message(), "the source failed"));
    char tmp[600];
    snprintf(tmp, sizeof tmp, "%s.tmp.%d", b, (int)getpid());
    CHECK(access(b, F_OK) != 0 && access(tmp, F_OK) != 0);
    free(got);
    free(big);
}

/* A tensor name with a newline (safetensors allows any string) must not
 * reach a one-line error message. */
static void test_hostile_name(void)
{
    float x[2] = {1, 2};
    struct loom_ckpt_piece p = {.name = "w\nsecond line", .data = x};
    const int64_t shape[1] = {2};
    loom_ckpt_slice_whole(&p.slice, 1, shape);
    char path[512];
    snprintf(path, sizeof path, "%s/n.safetensors", dir);
    CHECK(loom_ckpt_write_file(path, &p, 1, NULL, 0) == LOOM_OK);
    const char *files[] = {"n.safetensors"};
    struct loom_ckpt_reader *r;
    CHECK(loom_ckpt_reader_open(&r, dir, files, 1) == LOOM_ERR_INPUT &&
          strstr(loom_error_message(), "control characters") && !strchr(loom_error_message(), '\n'));
    loom_ckpt_reader_close(r);
}

static void test_slice_text(void)
{
    struct loom_ckpt_slice s, t;
    box_slice(&s, 1, 3, 2, 5, 1, 5);
    char buf[256];
    CHECK(loom_ckpt_slice_format(&s, buf, sizeof buf) == LOOM_OK);
    CHECK(strcmp(buf, "{\"shape\":[4,6],\"box\":[[1,3],[2,5]],\"range\":[1,5]}") == 0);
    CHECK(loom_ckpt_slice_parse(buf, &t) == LOOM_OK && memcmp(&s, &t, sizeof s) == 0);
    CHECK(loom_ckpt_slice_box_numel(&t) == 6 && !loom_ckpt_slice_is_whole(&t));
    const char *bad[] = {
        "",
        "[]",
        "{\"shape\":[4,6],\"box\":[[0,4]],\"range\":[0,1]}",         /* box of 1 dim for 2 */
        "{\"shape\":[4,6],\"box\":[[0,5],[0,6]],\"range\":[0,1]}",   /* past the dimension */
        "{\"shape\":[4,6],\"box\":[[3,2],[0,6]],\"range\":[0,1]}",   /* start after stop */
        "{\"shape\":[4,6],\"box\":[[0,4],[0,6]],\"range\":[0,25]}",  /* range past the box */
        "{\"shape\":[4,6],\"box\":[[0,4],[0,6]],\"range\":[5,2]}",   /* lo after hi */
        "{\"shape\":[-4,6],\"box\":[[0,4],[0,6]],\"range\":[0,1]}",  /* negative size */
        "{\"shape\":[4.5,6],\"box\":[[0,4],[0,6]],\"range\":[0,1]}", /* not an integer */
        "{\"shape\":[1099511627777,1099511627777],\"box\":[[0,1099511627777],[0,1099511627777]],\"range\":[0,"
        "1]}",
        "{\"shape\":[1,1,1,1,1,1,1,1,1],\"box\":[],\"range\":[0,1]}", /* too many dims */
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        int rc = loom_ckpt_slice_parse(bad[i], &t);
        CHECK(rc == LOOM_ERR_INPUT && loom_error_message()[0] && !strchr(loom_error_message(), '\n'));
    }
}

/* ---- boxes cut in a view ---------------------------------------------------- */

enum { C = 6, QKV = C * 3 * C }; /* attn.c_attn.weight is (C, 3*C): columns [q | k | v] */

static const int64_t qkv_shape[2] = {C, 3 * C}, qkv_view[3] = {C, 3, C};

static void write_piece(const char *file, const char *name, const struct loom_ckpt_slice *s,
                        const float *data)
{
    struct loom_ckpt_piece p = {.name = name, .slice = *s, .data = data};
    char path[512];
    snprintf(path, sizeof path, "%s/%s", dir, file);
    CHECK(loom_ckpt_write_file(path, &p, 1, NULL, 0) == LOOM_OK);
}

/* Rank r of t's box of the view (C, 3, C): the columns of its heads in q, k and v. */
static void qkv_box(struct loom_ckpt_slice *s, int r, int t, uint64_t lo, uint64_t hi)
{
    const int64_t start[3] = {0, 0, r * C / t}, stop[3] = {C, 3, (r + 1) * C / t};
    loom_ckpt_slice_view(s, 2, qkv_shape, 3, qkv_view, start, stop, lo, hi);
}

/* What rank r of t holds of the (C, 3*C) tensor full_value: (C, 3, C/t)
 * row-major, its columns of q, then of k, then of v, in each row. */
static void qkv_local(float *out, int r, int t)
{
    int k = 0;
    for (int i = 0; i < C; i++)
        for (int part = 0; part < 3; part++)
            for (int c = r * C / t; c < (r + 1) * C / t; c++) out[k++] = full_value(i * 3 * C + part * C + c);
}

/* T = 2 ranks: rank 0's box in one file, rank 1's split by ZeRO into two
 * flat ranges of its box, two files. */
static void write_qkv_tp2(void)
{
    float local[QKV / 2];
    struct loom_ckpt_slice s;
    qkv_local(local, 0, 2);
    qkv_box(&s, 0, 2, 0, QKV / 2);
    write_piece("tp0.safetensors", "qkv", &s, local);
    qkv_local(local, 1, 2);
    qkv_box(&s, 1, 2, 0, 20);
    write_piece("tp1a.safetensors", "qkv", &s, local);
    qkv_box(&s, 1, 2, 20, QKV / 2);
    write_piece("tp1b.safetensors", "qkv", &s, local + 20);
}

static void test_view_text(void)
{
    struct loom_ckpt_slice s, t;
    qkv_box(&s, 1, 2, 0, QKV / 2);
    char buf[256];
    CHECK(loom_ckpt_slice_format(&s, buf, sizeof buf) == LOOM_OK);
    CHECK(strcmp(buf, "{\"shape\":[6,18],\"view\":[6,3,6],\"box\":[[0,6],[0,3],[3,6]],\"range\":[0,54]}") ==
          0);
    CHECK(loom_ckpt_slice_parse(buf, &t) == LOOM_OK && memcmp(&s, &t, sizeof s) == 0);
    CHECK(t.tndim == 2 && t.tshape[1] == 18 && t.ndim == 3 && t.shape[2] == 6);
    CHECK(loom_ckpt_slice_box_numel(&t) == QKV / 2 && !loom_ckpt_slice_is_whole(&t));
    /* the whole view's box is the whole tensor, whatever the view */
    qkv_box(&s, 0, 1, 0, QKV);
    CHECK(loom_ckpt_slice_is_whole(&s));
    /* a view that is the shape is no view: the text is the old one */
    const int64_t start[2] = {1, 2}, stop[2] = {3, 5}, shape[2] = {R, CC};
    loom_ckpt_slice_view(&s, 2, shape, 2, shape, start, stop, 1, 5);
    CHECK(loom_ckpt_slice_format(&s, buf, sizeof buf) == LOOM_OK);
    CHECK(strcmp(buf, "{\"shape\":[4,6],\"box\":[[1,3],[2,5]],\"range\":[1,5]}") == 0);
    /* an old slice parses with the tensor's shape as its view */
    CHECK(loom_ckpt_slice_parse(buf, &t) == LOOM_OK && memcmp(&s, &t, sizeof s) == 0);
    CHECK(t.tndim == 2 && t.tshape[0] == R && t.tshape[1] == CC);
    struct {
        const char *json, *why;
    } bad[] = {
        {"{\"shape\":[6,18],\"view\":[6,3,5],\"box\":[[0,6],[0,3],[0,5]],\"range\":[0,1]}", "not a view"},
        {"{\"shape\":[6,18],\"view\":[6,3,6],\"box\":[[0,6],[0,4],[0,6]],\"range\":[0,1]}", "box[1]"},
        {"{\"shape\":[6,18],\"view\":[6,3,6],\"box\":[[0,6],[0,18]],\"range\":[0,1]}", "3 [start, stop]"},
        {"{\"shape\":[6,18],\"view\":[6,18],\"box\":[[0,6],[0,18]],\"range\":[0,109]}", "range"},
        {"{\"shape\":[6,18],\"view\":[6,-3,-6],\"box\":[[0,6],[0,0],[0,0]],\"range\":[0,0]}", "view[1]"},
        {"{\"shape\":[6,18],\"view\":{},\"box\":[],\"range\":[0,0]}", "view"},
        {"{\"shape\":[6,18],\"view\":null,\"box\":[],\"range\":[0,0]}", "view"},
        {"{\"shape\":[6,18],\"view\":[1,1,1,1,1,1,1,1,108],\"box\":[],\"range\":[0,0]}", "view"},
        {"{\"shape\":[1099511627776,1099511627776],\"view\":[1099511627776,1099511627776],\"box\":[[0,1],[0,"
         "1]],"
         "\"range\":[0,1]}",
         "2^53"},
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        int rc = loom_ckpt_slice_parse(bad[i].json, &t);
        CHECK(rc == LOOM_ERR_INPUT && strstr(loom_error_message(), bad[i].why) &&
              !strchr(loom_error_message(), '\n'));
    }
}

static void test_view_read(void)
{
    float full[QKV], got[QKV], want[QKV];
    for (int i = 0; i < QKV; i++) full[i] = full_value(i);
    struct loom_ckpt_reader *r;
    struct loom_ckpt_slice s;

    /* T = 2 pieces cut in the view read back whole, and as every flat range */
    write_qkv_tp2();
    const char *tp2[] = {"tp0.safetensors", "tp1a.safetensors", "tp1b.safetensors"};
    CHECK(loom_ckpt_reader_open(&r, dir, tp2, 3) == LOOM_OK);
    CHECK(loom_ckpt_read(r, "qkv", 2, qkv_shape, 0, QKV, got) == LOOM_OK &&
          memcmp(got, full, sizeof full) == 0);
    int all_ok = 1;
    for (int lo = 0; lo < QKV; lo++)
        for (int hi = lo + 1; hi <= QKV; hi++) {
            int rc = loom_ckpt_read(r, "qkv", 2, qkv_shape, (uint64_t)lo, (uint64_t)hi, got);
            all_ok &= rc == LOOM_OK && memcmp(got, full + lo, sizeof(float) * (size_t)(hi - lo)) == 0;
        }
    CHECK(all_ok);
    /* the view is not the tensor's shape */
    CHECK(loom_ckpt_read(r, "qkv", 3, qkv_view, 0, QKV, got) == LOOM_ERR_INPUT &&
          strstr(loom_error_message(), "has shape [6, 18], the model needs [6, 3, 6]"));
    /* boxes of T = 2 and T = 3 (each whole, then a ZeRO range of it) from the T = 2 pieces */
    for (int t = 2; t <= 3; t++)
        for (int rank = 0; rank < t; rank++) {
            const uint64_t n = QKV / (uint64_t)t;
            qkv_local(want, rank, t);
            qkv_box(&s, rank, t, 0, n);
            memset(got, 0, sizeof got);
            CHECK(loom_ckpt_read_slice(r, "qkv", &s, got) == LOOM_OK &&
                  memcmp(got, want, n * sizeof(float)) == 0);
            qkv_box(&s, rank, t, 5, n - 3);
            memset(got, 0, sizeof got);
            CHECK(loom_ckpt_read_slice(r, "qkv", &s, got) == LOOM_OK &&
                  memcmp(got, want + 5, (n - 8) * sizeof(float)) == 0);
        }
    /* the same box in another view: the columns of rank 1 of 2 in the view (3*C, C) */
    {
        const int64_t view[2] = {3 * C, C}, start[2] = {0, C / 2}, stop[2] = {3 * C, C};
        loom_ckpt_slice_view(&s, 2, qkv_shape, 2, view, start, stop, 0, QKV / 2);
        qkv_local(want, 1, 2);
        CHECK(loom_ckpt_read_slice(r, "qkv", &s, got) == LOOM_OK &&
              memcmp(got, want, QKV / 2 * sizeof(float)) == 0);
    }
    /* the whole tensor as a slice */
    loom_ckpt_slice_whole(&s, 2, qkv_shape);
    CHECK(loom_ckpt_read_slice(r, "qkv", &s, got) == LOOM_OK && memcmp(got, full, sizeof full) == 0);
    /* a wrong tensor shape, a missing tensor */
    const int64_t wrong[2] = {3 * C, C};
    loom_ckpt_slice_whole(&s, 2, wrong);
    CHECK(loom_ckpt_read_slice(r, "qkv", &s, got) == LOOM_ERR_INPUT && strstr(loom_error_message(), "shape"));
    CHECK(loom_ckpt_read_slice(r, "none", &s, got) == LOOM_ERR_INPUT &&
          strstr(loom_error_message(), "no tensor none"));
    loom_ckpt_reader_close(r);

    /* rank 0's file alone: T = 3 rank 1 needs columns 2..4 of each part, and only 2 is there */
    CHECK(loom_ckpt_reader_open(&r, dir, tp2, 1) == LOOM_OK);
    qkv_box(&s, 1, 3, 0, QKV / 3);
    CHECK(loom_ckpt_read_slice(r, "qkv", &s, got) == LOOM_ERR_INPUT &&
          strstr(loom_error_message(),
                 "holds 18 of elements [0, 36) of box [0:6, 0:3, 2:4] of view [6, 3, 6] of tensor qkv"));
    loom_ckpt_reader_close(r);

    /* a one-process file: the whole tensor, read back as each rank's box */
    loom_ckpt_slice_whole(&s, 2, qkv_shape);
    write_piece("one.safetensors", "qkv", &s, full);
    const char *one[] = {"one.safetensors"};
    CHECK(loom_ckpt_reader_open(&r, dir, one, 1) == LOOM_OK);
    for (int t = 1; t <= 3; t++)
        for (int rank = 0; rank < t; rank++) {
            const uint64_t n = QKV / (uint64_t)t;
            qkv_local(want, rank, t);
            qkv_box(&s, rank, t, 0, n);
            memset(got, 0, sizeof got);
            CHECK(loom_ckpt_read_slice(r, "qkv", &s, got) == LOOM_OK &&
                  memcmp(got, want, n * sizeof(float)) == 0);
        }
    loom_ckpt_reader_close(r);

    /* a whole piece described in a view is stored as the whole tensor, with
     * the tensor's shape and no slice */
    qkv_box(&s, 0, 1, 0, QKV);
    write_piece("oneview.safetensors", "qkv", &s, full);
    const char *oneview[] = {"oneview.safetensors"};
    CHECK(loom_ckpt_reader_open(&r, dir, oneview, 1) == LOOM_OK);
    CHECK(loom_ckpt_read(r, "qkv", 2, qkv_shape, 0, QKV, got) == LOOM_OK &&
          memcmp(got, full, sizeof full) == 0);
    loom_ckpt_reader_close(r);

    /* pieces in different views that share no element: rank 0's box in the
     * view (C, 3, C), rank 1's in the view (3*C, C) */
    {
        const int64_t view[2] = {3 * C, C}, start[2] = {0, C / 2}, stop[2] = {3 * C, C},
                      wide[2] = {0, C / 2 - 1};
        loom_ckpt_slice_view(&s, 2, qkv_shape, 2, view, start, stop, 0, QKV / 2);
        qkv_local(want, 1, 2);
        write_piece("rows1.safetensors", "qkv", &s, want);
        const char *mixed[] = {"tp0.safetensors", "rows1.safetensors"};
        CHECK(loom_ckpt_reader_open(&r, dir, mixed, 2) == LOOM_OK);
        CHECK(loom_ckpt_read(r, "qkv", 2, qkv_shape, 0, QKV, got) == LOOM_OK &&
              memcmp(got, full, sizeof full) == 0);
        loom_ckpt_reader_close(r);
        /* one column more, which rank 0 holds too */
        float more[QKV];
        loom_ckpt_slice_view(&s, 2, qkv_shape, 2, view, wide, stop, 0, 3 * C * (C / 2 + 1));
        slice_ref(more, &s);
        write_piece("rows1.safetensors", "qkv", &s, more);
        CHECK(loom_ckpt_reader_open(&r, dir, mixed, 2) == LOOM_ERR_INPUT &&
              strstr(loom_error_message(), "overlap"));
        loom_ckpt_reader_close(r);
        /* the whole tensor beside the view pieces */
        const char *both[] = {"tp0.safetensors", "one.safetensors"};
        CHECK(loom_ckpt_reader_open(&r, dir, both, 2) == LOOM_ERR_INPUT &&
              strstr(loom_error_message(), "overlap"));
        loom_ckpt_reader_close(r);
        /* a ZeRO range of the tensor's flat order that meets rank 0's box only past its first row */
        loom_ckpt_slice_range(&s, 2, qkv_shape, C / 2, C);
        write_piece("flat.safetensors", "qkv", &s, full + C / 2);
        const char *flat[] = {"tp0.safetensors", "flat.safetensors"};
        CHECK(loom_ckpt_reader_open(&r, dir, flat, 2) == LOOM_OK);
        loom_ckpt_reader_close(r);
        loom_ckpt_slice_range(&s, 2, qkv_shape, 3 * C + C / 2 - 1, 3 * C + C / 2);
        write_piece("flat.safetensors", "qkv", &s, full + 3 * C + C / 2 - 1);
        CHECK(loom_ckpt_reader_open(&r, dir, flat, 2) == LOOM_ERR_INPUT &&
              strstr(loom_error_message(), "overlap"));
        loom_ckpt_reader_close(r);
    }

    /* pieces that agree on their elements but not on the tensor's shape */
    {
        const int64_t other[2] = {3 * C, C}, start[2] = {0, C / 2}, stop[2] = {3 * C, C};
        loom_ckpt_slice_view(&s, 2, other, 2, other, start, stop, 0, QKV / 2);
        write_piece("rows1.safetensors", "qkv", &s, want);
        const char *mixed[] = {"tp0.safetensors", "rows1.safetensors"};
        CHECK(loom_ckpt_reader_open(&r, dir, mixed, 2) == LOOM_ERR_INPUT &&
              strstr(loom_error_message(), "disagree on its shape"));
        loom_ckpt_reader_close(r);
    }

    /* a damaged view piece fails its checksum when a box needs it */
    write_qkv_tp2();
    char path[512];
    snprintf(path, sizeof path, "%s/tp1b.safetensors", dir);
    FILE *f = fopen(path, "r+b");
    CHECK(f != NULL);
    fseek(f, -4, SEEK_END);
    fputc(0x55, f);
    fclose(f);
    CHECK(loom_ckpt_reader_open(&r, dir, tp2, 3) == LOOM_OK);
    qkv_box(&s, 0, 2, 0, QKV / 2);
    CHECK(loom_ckpt_read_slice(r, "qkv", &s, got) == LOOM_OK);
    qkv_box(&s, 2, 3, 0, QKV / 3);
    CHECK(loom_ckpt_read_slice(r, "qkv", &s, got) == LOOM_ERR_INPUT &&
          strstr(loom_error_message(), "tp1b.safetensors: tensor qkv fails its checksum"));
    loom_ckpt_reader_close(r);
}

/* A row split (the (4*C, C) c_proj-style weight of a row-parallel layer):
 * boxes of the tensor's own shape, no view. */
static void test_row_split(void)
{
    enum { ROWS = 4 * C, N = ROWS * C };
    const int64_t shape[2] = {ROWS, C};
    float full[N], got[N], want[N];
    for (int i = 0; i < N; i++) full[i] = full_value(i);
    struct loom_ckpt_slice s;
    const char *files[] = {"row0.safetensors", "row1.safetensors"};
    for (int rank = 0; rank < 2; rank++) {
        const int64_t start[2] = {rank * ROWS / 2, 0}, stop[2] = {(rank + 1) * ROWS / 2, C};
        loom_ckpt_slice_view(&s, 2, shape, 2, shape, start, stop, 0, N / 2);
        char buf[256];
        CHECK(loom_ckpt_slice_format(&s, buf, sizeof buf) == LOOM_OK && !strstr(buf, "view"));
        write_piece(files[rank], "proj", &s, full + rank * N / 2);
    }
    struct loom_ckpt_reader *r;
    CHECK(loom_ckpt_reader_open(&r, dir, files, 2) == LOOM_OK);
    CHECK(loom_ckpt_read(r, "proj", 2, shape, 0, N, got) == LOOM_OK && memcmp(got, full, sizeof full) == 0);
    /* the rows of T = 3, and the columns of T = 2 */
    for (int rank = 0; rank < 3; rank++) {
        const int64_t start[2] = {rank * ROWS / 3, 0}, stop[2] = {(rank + 1) * ROWS / 3, C};
        loom_ckpt_slice_view(&s, 2, shape, 2, shape, start, stop, 0, N / 3);
        CHECK(loom_ckpt_read_slice(r, "proj", &s, got) == LOOM_OK &&
              memcmp(got, full + rank * N / 3, N / 3 * sizeof(float)) == 0);
    }
    for (int rank = 0; rank < 2; rank++) {
        const int64_t start[2] = {0, rank * C / 2}, stop[2] = {ROWS, (rank + 1) * C / 2};
        loom_ckpt_slice_view(&s, 2, shape, 2, shape, start, stop, 0, N / 2);
        slice_ref(want, &s);
        CHECK(loom_ckpt_read_slice(r, "proj", &s, got) == LOOM_OK &&
              memcmp(got, want, N / 2 * sizeof(float)) == 0);
    }
    loom_ckpt_reader_close(r);
}

static void test_state(void)
{
    struct loom_ckpt_file files[2] = {{"rank_00000.safetensors", 1234}, {"rank_00001.safetensors", -1}};
    struct loom_ckpt_state st = {.iteration = 7,
                                 .optimizer_step = 6,
                                 .consumed_samples = 56,
                                 .seed = 9000000000000000001,
                                 .data_order = 1,
                                 .global_batch_size = 8,
                                 .model = {.type = "gpt2",
                                           .n = 5,
                                           .kv = {{"num_layers", LOOM_SHAPE_INT, 2},
                                                  {"hidden_size", LOOM_SHAPE_INT, 32},
                                                  {"huge", LOOM_SHAPE_INT, -LOOM_CKPT_INT_MAX},
                                                  {"norm_epsilon", LOOM_SHAPE_REAL, 0, 0.1},
                                                  {"activation_function", LOOM_SHAPE_WORD, 0, 0, "gelu"}}},
                                 .world_size = 2,
                                 .dp = 2,
                                 .tp = 1,
                                 .pp = 1,
                                 .zero_stage = 3,
                                 .has_loss_scaler = 1,
                                 .loss_scale = 65536,
                                 .loss_scale_good_steps = 3,
                                 .loss_scale_hysteresis = 2,
                                 .skipped_steps = 1,
                                 .run = "0123456789abcdef",
                                 .tokenizer = LOOM_CKPT_TOKENIZER_SAVED,
                                 .tokenizer_bytes = 4321,
                                 .tokenizer_xxh3 = 0xfedcba9876543210ull,
                                 .nfiles = 2,
                                 .files = files};
    char *text = loom_ckpt_state_format(&st, "{\"lr\":\"0.001\"}");
    CHECK(text != NULL);
    size_t n = strlen(text);
    CHECK(loom_ckpt_state_verify(text, n, "s") == LOOM_OK);
    struct loom_ckpt_state back;
    CHECK(loom_ckpt_state_parse(text, n, &back) == LOOM_OK);
    CHECK(back.iteration == 7 && back.optimizer_step == 6 && back.seed == 9000000000000000001 &&
          back.zero_stage == 3 && back.has_loss_scaler && back.loss_scale == 65536 &&
          back.skipped_steps == 1 && back.nfiles == 2 &&
          strcmp(back.files[1].name, "rank_00001.safetensors") == 0);
    CHECK(back.files[0].bytes == 1234 && back.files[1].bytes == -1); /* sizes as recorded, or none */
    CHECK(strcmp(back.run, st.run) == 0);
    /* the tokenizer's record: saved (size, checksum), none, or absent (an older state) */
    CHECK(back.tokenizer == LOOM_CKPT_TOKENIZER_SAVED && back.tokenizer_bytes == 4321 &&
          back.tokenizer_xxh3 == 0xfedcba9876543210ull);
    for (int k = LOOM_CKPT_TOKENIZER_UNRECORDED; k <= LOOM_CKPT_TOKENIZER_NONE; k++) {
        struct loom_ckpt_state other = st, got;
        other.tokenizer = (enum loom_ckpt_tokenizer)k;
        char *t = loom_ckpt_state_format(&other, NULL);
        CHECK(loom_ckpt_state_parse(t, strlen(t), &got) == LOOM_OK && got.tokenizer == other.tokenizer &&
              (strstr(t, "\"tokenizer\"") != NULL) == (k == LOOM_CKPT_TOKENIZER_NONE));
        loom_ckpt_state_free(&got);
        loom_free(t);
    }
    char *tk = loom_xstrdup(text), *at = strstr(tk, "fedcba9876543210");
    CHECK(at != NULL);
    memcpy(at, "FEDC", 4); /* not lowercase hex */
    struct loom_ckpt_state refused;
    CHECK(loom_ckpt_state_parse(tk, n, &refused) == LOOM_ERR_INPUT &&
          strstr(loom_error_message(), "tokenizer.xxh3"));
    loom_free(tk);
    /* the model's shape comes back as written: type, keys in order, values
     * of each kind (a real exactly) */
    CHECK(strcmp(back.model.type, "gpt2") == 0 && back.model.n == 5 &&
          strcmp(back.model.kv[0].key, "num_layers") == 0 && back.model.kv[0].value == 2 &&
          strcmp(back.model.kv[1].key, "hidden_size") == 0 && back.model.kv[1].value == 32 &&
          strcmp(back.model.kv[2].key, "huge") == 0 && back.model.kv[2].value == -LOOM_CKPT_INT_MAX &&
          back.model.kv[2].kind == LOOM_SHAPE_INT);
    CHECK(back.model.kv[3].kind == LOOM_SHAPE_REAL && back.model.kv[3].real == 0.1 &&
          back.model.kv[4].kind == LOOM_SHAPE_WORD && strcmp(back.model.kv[4].word, "gelu") == 0);
    /* the text form reads back to the same value */
    for (int i = 0; i < 5; i++) {
        char text_value[64];
        struct loom_shape_setting again;
        memset(&again, 0, sizeof again);
        loom_model_shape_text(&back.model.kv[i], text_value, sizeof text_value);
        CHECK(loom_model_shape_parse(&again, text_value) && again.kind == back.model.kv[i].kind &&
              again.value == back.model.kv[i].value && again.real == back.model.kv[i].real &&
              strcmp(again.word, back.model.kv[i].word) == 0);
    }
    loom_ckpt_state_free(&back);
    /* a loss scale that 15 digits do not give back comes back exactly (cJSON
     * prints "0.3" for it, which it deems close enough) */
    st.loss_scale = 0.1 + 0.2;
    char *odd = loom_ckpt_state_format(&st, NULL);
    CHECK(loom_ckpt_state_parse(odd, strlen(odd), &back) == LOOM_OK && back.loss_scale == 0.1 + 0.2);
    loom_ckpt_state_free(&back);
    loom_free(odd);
    st.loss_scale = 65536;
    /* a user's model: its type and no shape */
    st.model = (struct loom_model_shape){.type = "mlp"};
    char *user = loom_ckpt_state_format(&st, NULL);
    CHECK(loom_ckpt_state_parse(user, strlen(user), &back) == LOOM_OK &&
          strcmp(back.model.type, "mlp") == 0 && back.model.n == 0);
    loom_ckpt_state_free(&back);
    loom_free(user);
    /* a shape setting that is not an integer is named */
    char *q = strstr(text, "\"hidden_size\"");
    CHECK(q && (q = strstr(q, "32")) != NULL);
    char *broken = loom_xstrdup(text);
    memcpy(broken + (q - text), "[]", 2);
    CHECK(loom_ckpt_state_parse(broken, n, &back) == LOOM_ERR_INPUT &&
          strstr(loom_error_message(), "model.hidden_size"));
    loom_free(broken);
    /* one changed digit anywhere fails the checksum */
    char *p = strstr(text, "\"iteration\"");
    CHECK(p != NULL);
    p = strchr(p, '7');
    *p = '8';
    CHECK(loom_ckpt_state_verify(text, n, "s") == LOOM_ERR_INPUT &&
          strstr(loom_error_message(), "fails its checksum"));
    loom_free(text);
    /* parse errors name the field */
    const char *bad = "{\"format\":\"loom-checkpoint\",\"version\":1,\"iteration\":-1}";
    CHECK(loom_ckpt_state_parse(bad, strlen(bad), &back) == LOOM_ERR_INPUT &&
          strstr(loom_error_message(), "iteration"));
    /* an integer past what prints exactly is refused, not rounded */
    bad = "{\"format\":\"loom-checkpoint\",\"version\":1,\"iteration\":9007199254740992}";
    CHECK(loom_ckpt_state_parse(bad, strlen(bad), &back) == LOOM_ERR_INPUT &&
          strstr(loom_error_message(), "iteration"));
    bad = "{\"format\":\"loom-checkpoint\",\"version\":2}";
    CHECK(loom_ckpt_state_parse(bad, strlen(bad), &back) == LOOM_ERR_INPUT &&
          strstr(loom_error_message(), "version 2"));
}

int main(void)
{
    snprintf(dir, sizeof dir, "/tmp/loom_test_ckpt_XXXXXX");
    if (!mkdtemp(dir)) return 1;
    test_slice_text();
    test_assemble();
    test_damage();
    test_hostile_name();
    test_streamed();
    test_view_text();
    test_view_read();
    test_row_split();
    test_state();
    char cmd[300];
    snprintf(cmd, sizeof cmd, "rm -rf %s", dir);
    if (system(cmd) != 0) fprintf(stderr, "could not remove %s\n", dir);
    return check_summary("test_checkpoint_format");
}
