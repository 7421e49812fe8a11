/*
 * Hugging Face config.json, read strictly: every field is either one the
 * model family reads (and honours or refuses by its value), one that holds
 * the only value loom computes, or one that does not change the function
 * the model computes (dropout, token ids, generation defaults, metadata).
 * Anything else, including a field loom does not know, is refused with one
 * line naming the file, the field and its value: a model loom cannot
 * compute exactly is not loaded at all. Each family gives its own table
 * (beside the family's model, src/model/).
 */
#ifndef LOOM_IO_HF_CONFIG_H
#define LOOM_IO_HF_CONFIG_H

#include <cjson/cJSON.h>

enum loom_hf_rule {
    LOOM_HF_READ = 0, /* the family reads it and says what it accepts */
    LOOM_HF_ONLY,     /* accepted only when it equals `only` (JSON text), its default */
    LOOM_HF_NO_EFFECT /* accepted whatever it holds: not part of the computed function */
};

struct loom_hf_field {
    const char *name;
    enum loom_hf_rule rule;
    const char *only; /* LOOM_HF_ONLY: the accepted value as JSON ("true", "{}", "null");
                       * LOOM_HF_NO_EFFECT: the value an export writes, or NULL */
};

/* Parses path as a JSON object and checks every member against fields
 * (n of them), then against the PretrainedConfig fields every config may
 * carry without changing the function (token ids, generation defaults,
 * metadata: hf_config.c's own table); `model` names the family in messages
 * ("GPT-2"). On success
 * *out is the object (the caller cJSON_Deletes it). LOOM_ERR_INPUT with one
 * line otherwise. */
int loom_hf_config_read(const char *path, const struct loom_hf_field *fields, int n, const char *model,
                        cJSON **out);

/* Whether config.json at path gives the field (a file that cannot be read
 * or parsed gives none). */
int loom_hf_config_gives(const char *path, const char *field);

/* A member's value as short JSON text for messages ("false", "\"relu\"",
 * "[1, 2]"), cut to fit buf. */
void loom_hf_value_text(const cJSON *v, char *buf, size_t n);

#endif
