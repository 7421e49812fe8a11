/*
 * The shape of a model as a file records it (a checkpoint's trainer state,
 * a weights file's metadata): the model's type and named settings, each an
 * integer, a real number or a word. The file formats carry it without
 * knowing any model; a model family (model/family.h) writes and reads the
 * pairs. In JSON a setting is a number or a string; in safetensors metadata
 * (all text) it is the same value written as text (loom_model_shape_text).
 */
#ifndef LOOM_IO_MODEL_SHAPE_H
#define LOOM_IO_MODEL_SHAPE_H

#include <stddef.h>
#include <stdint.h>

#include "loom/config.h" /* LOOM_MOE_FREQ_TEXT: the longest word, a --moe-layer-freq list */

#define LOOM_MODEL_SHAPE_MAX 32

enum loom_shape_kind {
    LOOM_SHAPE_INT = 0, /* value */
    LOOM_SHAPE_REAL,    /* real */
    LOOM_SHAPE_WORD,    /* word: printable ASCII, no quotes */
    LOOM_SHAPE_LAYERS,  /* only a shape key's kind (model/decoder_def.h): the MoE layers, an INT or a WORD */
};

struct loom_shape_setting {
    char key[40]; /* "num_layers" */
    enum loom_shape_kind kind;
    int64_t value;                 /* INT */
    double real;                   /* REAL; an INT's value too */
    char word[LOOM_MOE_FREQ_TEXT]; /* WORD */
};

struct loom_model_shape {
    char type[32]; /* the family's name, or a user model's */
    int n;
    struct loom_shape_setting kv[LOOM_MODEL_SHAPE_MAX];
};

/* Appends a setting (the caller keeps n below LOOM_MODEL_SHAPE_MAX). */
void loom_model_shape_add_int(struct loom_model_shape *s, const char *key, int64_t value);
void loom_model_shape_add_real(struct loom_model_shape *s, const char *key, double value);
void loom_model_shape_add_word(struct loom_model_shape *s, const char *key, const char *word);
/* The setting named key, or NULL. */
const struct loom_shape_setting *loom_model_shape_find(const struct loom_model_shape *s, const char *key);
/* x as the shortest decimal text that reads back to exactly x ("0.1",
 * "1e-05", "0.30000000000000004"); x finite. Every JSON writer that must
 * round-trip a double uses it: cJSON's own printing accepts 15 digits that
 * read back only within an epsilon. */
void loom_real_text(double x, char *buf, size_t n);
/* A setting's value as text: "12", "1e-05" (the shortest that reads back
 * to the same double), "gelu_new". */
void loom_model_shape_text(const struct loom_shape_setting *kv, char *buf, size_t n);
/* Text back into a setting's value: an integer, else a real number, else a
 * word; 0 when it is none of them (empty, too long, not printable). */
int loom_model_shape_parse(struct loom_shape_setting *kv, const char *text);

#endif
