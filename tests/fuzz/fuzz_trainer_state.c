/*
 * libFuzzer target for the trainer-state parser (io/checkpoint.h): each input
 * is the text of a trainer_state.json, handed over as an exact-size buffer
 * with no NUL after it (the API takes a length), so the sanitizer sees any
 * read past the end. The checksum is verified and the text parsed whatever
 * the verification says. A rejected text must give LOOM_ERR_INPUT on one
 * line and leave no files behind. An accepted one must hold values inside
 * the documented ranges, and must survive a round trip: formatting it gives
 * text that verifies and parses back to the same state. A broken promise
 * aborts, which libFuzzer reports with the input.
 *
 * Not here: reading the file from a directory (loom_ckpt_state_read).
 *
 * fuzz-sources: src/io/checkpoint_state.c src/io/model_shape.c src/io/fs.c src/base/log.c src/base/mem.c
 * fuzz-libs: -lcjson -lxxhash
 */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/mem.h"
#include "io/checkpoint.h"
#include "loom/loom.h"

#define REQUIRE(cond)                                                                                        \
    do {                                                                                                     \
        if (!(cond)) {                                                                                       \
            fprintf(stderr, "fuzz_trainer_state: broken promise at line %d: %s\n", __LINE__, #cond);         \
            abort();                                                                                         \
        }                                                                                                    \
    } while (0)

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static int same_model(const struct loom_model_shape *a, const struct loom_model_shape *b)
{
    int same = strcmp(a->type, b->type) == 0 && a->n == b->n;
    for (int i = 0; same && i < a->n; i++)
        same = strcmp(a->kv[i].key, b->kv[i].key) == 0 && a->kv[i].kind == b->kv[i].kind &&
               a->kv[i].value == b->kv[i].value && a->kv[i].real == b->kv[i].real &&
               strcmp(a->kv[i].word, b->kv[i].word) == 0;
    return same;
}

static int same_state(const struct loom_ckpt_state *a, const struct loom_ckpt_state *b)
{
    int same = a->iteration == b->iteration && a->optimizer_step == b->optimizer_step &&
               a->consumed_samples == b->consumed_samples && a->seed == b->seed &&
               a->data_order == b->data_order && a->global_batch_size == b->global_batch_size &&
               same_model(&a->model, &b->model) && a->world_size == b->world_size && a->dp == b->dp &&
               a->tp == b->tp && a->pp == b->pp && a->zero_stage == b->zero_stage &&
               a->has_loss_scaler == b->has_loss_scaler && a->nfiles == b->nfiles;
    if (same && a->has_loss_scaler)
        same = a->loss_scale == b->loss_scale && a->loss_scale_good_steps == b->loss_scale_good_steps &&
               a->loss_scale_hysteresis == b->loss_scale_hysteresis && a->skipped_steps == b->skipped_steps;
    same = same && strcmp(a->run, b->run) == 0;
    for (int i = 0; same && i < a->nfiles; i++)
        same = strcmp(a->files[i].name, b->files[i].name) == 0 && a->files[i].bytes == b->files[i].bytes;
    return same;
}

/* The ranges checkpoint.h documents for an accepted state. */
static void check_ranges(const struct loom_ckpt_state *st)
{
    REQUIRE(st->iteration >= 0 && st->optimizer_step >= 0 && st->optimizer_step <= st->iteration);
    REQUIRE(st->iteration <= LOOM_CKPT_INT_MAX && st->consumed_samples <= LOOM_CKPT_INT_MAX);
    REQUIRE(st->consumed_samples >= 0 && st->seed >= 0 && st->global_batch_size >= 1);
    REQUIRE(st->data_order >= 0 && st->data_order <= 1);
    const struct loom_model_shape *m = &st->model;
    REQUIRE(m->type[0] != '\0' && memchr(m->type, '\0', sizeof m->type));
    REQUIRE(m->n >= 0 && m->n <= LOOM_MODEL_SHAPE_MAX);
    for (int i = 0; i < m->n; i++) { /* the shape: unique named integers, exact in a double */
        REQUIRE(m->kv[i].key[0] != '\0' && memchr(m->kv[i].key, '\0', sizeof m->kv[i].key));
        REQUIRE(strcmp(m->kv[i].key, "type") != 0);
        REQUIRE(m->kv[i].value >= -LOOM_CKPT_INT_MAX && m->kv[i].value <= LOOM_CKPT_INT_MAX);
        /* a setting is an integer, a finite real, or a printable word */
        REQUIRE(m->kv[i].kind == LOOM_SHAPE_INT || m->kv[i].kind == LOOM_SHAPE_REAL ||
                m->kv[i].kind == LOOM_SHAPE_WORD);
        REQUIRE(m->kv[i].kind != LOOM_SHAPE_REAL ||
                (m->kv[i].real == m->kv[i].real && m->kv[i].real - m->kv[i].real == 0));
        REQUIRE(memchr(m->kv[i].word, '\0', sizeof m->kv[i].word));
        for (int k = 0; k < i; k++) REQUIRE(strcmp(m->kv[k].key, m->kv[i].key) != 0);
    }
    REQUIRE(st->world_size >= 1 && st->dp >= 1 && st->tp >= 1 && st->pp >= 1);
    REQUIRE(st->zero_stage >= 0 && st->zero_stage <= 3);
    REQUIRE(!st->has_loss_scaler || st->loss_scale > 0);
    REQUIRE(st->nfiles >= 1 && st->nfiles <= LOOM_CKPT_MAX_FILES && st->files);
    for (int i = 0; i < st->nfiles; i++) {
        const char *name = st->files[i].name;
        REQUIRE(memchr(name, '\0', sizeof st->files[i].name) != NULL);
        REQUIRE(name[0] != '\0' && name[0] != '.' && !strchr(name, '/'));
        for (int k = 0; k < i; k++) REQUIRE(strcmp(st->files[k].name, name) != 0);
        REQUIRE(st->files[i].bytes >= -1 && st->files[i].bytes <= LOOM_CKPT_INT_MAX);
    }
    REQUIRE(st->run[0] == '\0' || strspn(st->run, "0123456789abcdef") == LOOM_CKPT_RUN_LEN);
    REQUIRE(st->tokenizer >= 0 && st->tokenizer < LOOM_CKPT_TOKENIZER_COUNT);
    REQUIRE(st->tokenizer_bytes >= 0 && (size_t)st->tokenizer_bytes <= LOOM_CKPT_TOKENIZER_MAX_BYTES);
}

static void check_error(int rc)
{
    const char *msg = loom_error_message();
    REQUIRE(rc == LOOM_ERR_INPUT);
    REQUIRE(msg[0] != '\0' && !strchr(msg, '\n'));
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    char *buf = malloc(size ? size : 1);
    REQUIRE(buf);
    memcpy(buf, data, size);

    int rc = loom_ckpt_state_verify(buf, size, "fuzz-input");
    if (rc != LOOM_OK) {
        check_error(rc);
        REQUIRE(strstr(loom_error_message(), "fuzz-input"));
    }

    struct loom_ckpt_state st;
    rc = loom_ckpt_state_parse(buf, size, &st);
    if (rc != LOOM_OK) {
        check_error(rc);
        REQUIRE(st.files == NULL && st.nfiles == 0);
        free(buf);
        return 0;
    }
    check_ranges(&st);

    char *text = loom_ckpt_state_format(&st, NULL);
    REQUIRE(text);
    size_t len = strlen(text);
    REQUIRE(loom_ckpt_state_verify(text, len, "formatted") == LOOM_OK);
    struct loom_ckpt_state back;
    rc = loom_ckpt_state_parse(text, len, &back);
    if (rc != LOOM_OK) fprintf(stderr, "fuzz_trainer_state: %s\n", loom_error_message());
    REQUIRE(rc == LOOM_OK);
    REQUIRE(same_state(&st, &back));
    loom_ckpt_state_free(&back);
    loom_free(text);
    loom_ckpt_state_free(&st);
    free(buf);
    return 0;
}
