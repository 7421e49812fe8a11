/*
 * The shape of a model as a file records it (a checkpoint's trainer state,
 * a weights file's metadata): the model's type and named integer settings.
 * The file formats carry it without knowing any model; a model family
 * (model/family.h) writes and reads the pairs.
 */
#ifndef LOOM_IO_MODEL_SHAPE_H
#define LOOM_IO_MODEL_SHAPE_H

#include <stdint.h>

#define LOOM_MODEL_SHAPE_MAX 16
struct loom_model_shape {
    char type[32]; /* the family's name, or a user model's */
    int n;
    struct {
        char key[40]; /* "num_layers" */
        int64_t value;
    } kv[LOOM_MODEL_SHAPE_MAX];
};

#endif
