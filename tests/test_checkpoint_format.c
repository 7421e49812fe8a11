/*
 * The checkpoint format's pieces and slices (io/checkpoint.h), below the
 * engine: slices that are boxes of a tensor (tensor- and pipeline-parallel
 * splits) and flat ranges of a box (ZeRO shards), written by "ranks" into
 * separate files and assembled into any flat range of the full tensor;
 * slice descriptions that are refused; pieces that overlap, leave a gap, or
 * fail their checksum; the trainer state's checksum and round trip.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

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

/* A tensor-parallel split of the columns (two halves), the second half
 * further split by ZeRO into two flat ranges: three pieces in three files. */
static void write_split(void)
{
    float left[R * 3], right[R * 3];
    box_data(left, 0, R, 0, 3);
    box_data(right, 0, R, 3, CC);
    struct loom_ckpt_piece p0 = {"w", {0}, left}, p1 = {"w", {0}, right}, p2 = {"w", {0}, right + 5};
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

/* A tensor name with a newline (safetensors allows any string) must not
 * reach a one-line error message. */
static void test_hostile_name(void)
{
    float x[2] = {1, 2};
    struct loom_ckpt_piece p = {"w\nsecond line", {0}, x};
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

static void test_state(void)
{
    struct loom_ckpt_file files[2] = {{"rank_00000.safetensors"}, {"rank_00001.safetensors"}};
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
    test_state();
    char cmd[300];
    snprintf(cmd, sizeof cmd, "rm -rf %s", dir);
    if (system(cmd) != 0) fprintf(stderr, "could not remove %s\n", dir);
    return check_summary("test_checkpoint_format");
}
