/*
 * Model shape settings: adding, finding, and their text form (model_shape.h).
 */
#include "io/model_shape.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/log.h"

static struct loom_shape_setting *add(struct loom_model_shape *s, const char *key, enum loom_shape_kind kind)
{
    LOOM_ASSERT(s->n < LOOM_MODEL_SHAPE_MAX && strlen(key) < sizeof s->kv[0].key);
    struct loom_shape_setting *kv = &s->kv[s->n++];
    memset(kv, 0, sizeof *kv);
    snprintf(kv->key, sizeof kv->key, "%s", key);
    kv->kind = kind;
    return kv;
}

void loom_model_shape_add_int(struct loom_model_shape *s, const char *key, int64_t value)
{
    struct loom_shape_setting *kv = add(s, key, LOOM_SHAPE_INT);
    kv->value = value;
    kv->real = (double)value;
}

void loom_model_shape_add_real(struct loom_model_shape *s, const char *key, double value)
{
    add(s, key, LOOM_SHAPE_REAL)->real = value;
}

void loom_model_shape_add_word(struct loom_model_shape *s, const char *key, const char *word)
{
    struct loom_shape_setting *kv = add(s, key, LOOM_SHAPE_WORD);
    LOOM_ASSERT(strlen(word) < sizeof kv->word);
    snprintf(kv->word, sizeof kv->word, "%s", word);
}

const struct loom_shape_setting *loom_model_shape_find(const struct loom_model_shape *s, const char *key)
{
    for (int i = 0; i < s->n; i++)
        if (strcmp(s->kv[i].key, key) == 0) return &s->kv[i];
    return NULL;
}

void loom_real_text(double x, char *buf, size_t n)
{
    char text[32];
    for (int digits = 1; digits <= 17; digits++) { /* 17 always reads back */
        snprintf(text, sizeof text, "%.*g", digits, x);
        if (strtod(text, NULL) == x) break;
    }
    snprintf(buf, n, "%s", text);
}

void loom_model_shape_text(const struct loom_shape_setting *kv, char *buf, size_t n)
{
    if (kv->kind == LOOM_SHAPE_INT) {
        snprintf(buf, n, "%lld", (long long)kv->value);
    } else if (kv->kind == LOOM_SHAPE_REAL) {
        loom_real_text(kv->real, buf, n);
    } else {
        snprintf(buf, n, "%s", kv->word);
    }
}

int loom_model_shape_parse(struct loom_shape_setting *kv, const char *text)
{
    size_t len = strlen(text);
    if (len == 0 || len >= sizeof kv->word) return 0;
    for (size_t i = 0; i < len; i++)
        if ((unsigned char)text[i] <= 0x20 || (unsigned char)text[i] > 0x7e || text[i] == '"') return 0;
    char *end;
    long long i = strtoll(text, &end, 10);
    if (*end == '\0') {
        kv->kind = LOOM_SHAPE_INT;
        kv->value = i;
        kv->real = (double)i;
        return 1;
    }
    double d = strtod(text, &end);
    if (*end == '\0' && isfinite(d)) {
        kv->kind = LOOM_SHAPE_REAL;
        kv->real = d;
        return 1;
    }
    kv->kind = LOOM_SHAPE_WORD;
    snprintf(kv->word, sizeof kv->word, "%s", text);
    return 1;
}
