/*
 * config.json read strictly against a family's table (hf_config.h).
 */
#include "io/hf_config.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/log.h"
#include "io/fs.h"

#define CONFIG_MAX_BYTES (1 << 20)

void loom_hf_value_text(const cJSON *v, char *buf, size_t n)
{
    char *text = cJSON_PrintUnformatted(v);
    if (!text) {
        snprintf(buf, n, "?");
        return;
    }
    if (strlen(text) >= n && n > 4)
        snprintf(buf, n, "%.*s...", (int)(n - 4), text);
    else
        snprintf(buf, n, "%s", text);
    cJSON_free(text);
}

static char *read_text(const char *path, int *rc)
{
    FILE *f = loom_fs_fopen_input(path, NULL, rc); /* a FIFO: refused, not waited on */
    if (!f) return NULL;
    char *buf = malloc(CONFIG_MAX_BYTES + 1);
    size_t len = buf ? fread(buf, 1, CONFIG_MAX_BYTES + 1, f) : 0;
    int bad = ferror(f);
    fclose(f);
    if (!buf) {
        *rc = loom_error_set(LOOM_ERR_RUNTIME, "out of memory reading %s", path);
    } else if (bad) {
        *rc = loom_error_set(LOOM_ERR_INPUT, "cannot read %s", path);
    } else if (len > CONFIG_MAX_BYTES) {
        *rc = loom_error_set(LOOM_ERR_INPUT, "%s: longer than %d bytes, not a model's config.json", path,
                             CONFIG_MAX_BYTES);
    } else {
        buf[len] = '\0';
        return buf;
    }
    free(buf);
    return NULL;
}

/* The fields every transformers PretrainedConfig may carry that do not
 * change the function computed: metadata, token ids, generation defaults
 * (older configs carry generation_config.json's), training switches. A
 * family's own table is checked first. */
static const struct loom_hf_field common[] = {
    {"initializer_range", LOOM_HF_NO_EFFECT, NULL},
    {"use_cache", LOOM_HF_NO_EFFECT, NULL},
    {"output_past", LOOM_HF_NO_EFFECT, NULL},
    {"gradient_checkpointing", LOOM_HF_NO_EFFECT, NULL},
    {"torch_dtype", LOOM_HF_NO_EFFECT, NULL},
    {"transformers_version", LOOM_HF_NO_EFFECT, NULL},
    {"_name_or_path", LOOM_HF_NO_EFFECT, NULL},
    {"_commit_hash", LOOM_HF_NO_EFFECT, NULL},
    {"bos_token_id", LOOM_HF_NO_EFFECT, NULL},
    {"eos_token_id", LOOM_HF_NO_EFFECT, NULL},
    {"pad_token_id", LOOM_HF_NO_EFFECT, NULL},
    {"sep_token_id", LOOM_HF_NO_EFFECT, NULL},
    {"decoder_start_token_id", LOOM_HF_NO_EFFECT, NULL},
    {"task_specific_params", LOOM_HF_NO_EFFECT, NULL},
    {"id2label", LOOM_HF_NO_EFFECT, NULL},
    {"label2id", LOOM_HF_NO_EFFECT, NULL},
    {"problem_type", LOOM_HF_NO_EFFECT, NULL},
    {"finetuning_task", LOOM_HF_NO_EFFECT, NULL},
    {"tokenizer_class", LOOM_HF_NO_EFFECT, NULL},
    {"prefix", LOOM_HF_NO_EFFECT, NULL},
    {"return_dict", LOOM_HF_NO_EFFECT, NULL},
    {"output_hidden_states", LOOM_HF_NO_EFFECT, NULL},
    {"output_attentions", LOOM_HF_NO_EFFECT, NULL},
    {"torchscript", LOOM_HF_NO_EFFECT, NULL},
    {"use_bfloat16", LOOM_HF_NO_EFFECT, NULL},
    {"tf_legacy_loss", LOOM_HF_NO_EFFECT, NULL},
    {"chunk_size_feed_forward", LOOM_HF_NO_EFFECT, NULL},
    {"is_decoder", LOOM_HF_NO_EFFECT, NULL},
    /* generation defaults */
    {"max_length", LOOM_HF_NO_EFFECT, NULL},
    {"min_length", LOOM_HF_NO_EFFECT, NULL},
    {"do_sample", LOOM_HF_NO_EFFECT, NULL},
    {"early_stopping", LOOM_HF_NO_EFFECT, NULL},
    {"num_beams", LOOM_HF_NO_EFFECT, NULL},
    {"num_beam_groups", LOOM_HF_NO_EFFECT, NULL},
    {"diversity_penalty", LOOM_HF_NO_EFFECT, NULL},
    {"temperature", LOOM_HF_NO_EFFECT, NULL},
    {"top_k", LOOM_HF_NO_EFFECT, NULL},
    {"top_p", LOOM_HF_NO_EFFECT, NULL},
    {"typical_p", LOOM_HF_NO_EFFECT, NULL},
    {"repetition_penalty", LOOM_HF_NO_EFFECT, NULL},
    {"length_penalty", LOOM_HF_NO_EFFECT, NULL},
    {"no_repeat_ngram_size", LOOM_HF_NO_EFFECT, NULL},
    {"encoder_no_repeat_ngram_size", LOOM_HF_NO_EFFECT, NULL},
    {"bad_words_ids", LOOM_HF_NO_EFFECT, NULL},
    {"num_return_sequences", LOOM_HF_NO_EFFECT, NULL},
    {"output_scores", LOOM_HF_NO_EFFECT, NULL},
    {"return_dict_in_generate", LOOM_HF_NO_EFFECT, NULL},
    {"forced_bos_token_id", LOOM_HF_NO_EFFECT, NULL},
    {"forced_eos_token_id", LOOM_HF_NO_EFFECT, NULL},
    {"remove_invalid_values", LOOM_HF_NO_EFFECT, NULL},
    {"exponential_decay_length_penalty", LOOM_HF_NO_EFFECT, NULL},
    {"suppress_tokens", LOOM_HF_NO_EFFECT, NULL},
    {"begin_suppress_tokens", LOOM_HF_NO_EFFECT, NULL},
};
#define NCOMMON ((int)(sizeof common / sizeof common[0]))

/* The byte offset of the first \\u escape in text that is a UTF-16
 * surrogate without its other half (which JSON parsers refuse), or -1. */
static long lone_surrogate(const char *text)
{
    unsigned prev = 0; /* the high surrogate just read, or 0 */
    long prev_at = -1;
    for (const char *c = text; *c; c++) {
        if (prev && c != text + prev_at + 6) return prev_at; /* the low half must follow at once */
        if (*c != '\\') continue;
        if (c[1] != 'u') {
            if (prev) return prev_at;
            c += c[1] != 0;
            continue;
        }
        char *end;
        char hex[5] = {0};
        memcpy(hex, c + 2, strnlen(c + 2, 4));
        const unsigned u = (unsigned)strtoul(hex, &end, 16);
        if (end != hex + 4) return -1; /* the parser's own complaint */
        if (prev && !(u >= 0xDC00 && u <= 0xDFFF)) return prev_at;
        if (!prev && u >= 0xDC00 && u <= 0xDFFF) return (long)(c - text);
        prev = !prev && u >= 0xD800 && u <= 0xDBFF ? u : 0;
        prev_at = (long)(c - text);
        c += 5;
    }
    return prev ? prev_at : -1;
}

/* The rule for a field: the family's, else the common one, else NULL. */
static const struct loom_hf_field *rule_of(const char *name, const struct loom_hf_field *fields, int n)
{
    for (int k = 0; k < n; k++)
        if (strcmp(fields[k].name, name) == 0) return &fields[k];
    for (int k = 0; k < NCOMMON; k++)
        if (strcmp(common[k].name, name) == 0) return &common[k];
    return NULL;
}

int loom_hf_config_read(const char *path, const struct loom_hf_field *fields, int n, const char *model,
                        cJSON **out)
{
    *out = NULL;
    int rc = LOOM_OK;
    char *text = read_text(path, &rc);
    if (!text) return rc;
    cJSON *root = cJSON_Parse(text);
    if (!root) {
        const long at = lone_surrogate(text);
        if (at >= 0)
            rc = loom_error_set(LOOM_ERR_INPUT,
                                "%s: not valid JSON: the escape %.6s at byte %ld is half of a "
                                "UTF-16 surrogate pair, without its other half",
                                path, text + at, at);
        else
            rc = loom_error_set(LOOM_ERR_INPUT, "%s: not valid JSON", path);
        free(text);
        return rc;
    }
    free(text);
    if (!cJSON_IsObject(root)) {
        cJSON_Delete(root);
        return loom_error_set(LOOM_ERR_INPUT, "%s: not a JSON object", path);
    }
    const cJSON *v;
    cJSON_ArrayForEach(v, root)
    {
        char value[80];
        loom_hf_value_text(v, value, sizeof value);
        for (const cJSON *u = root->child; u != v; u = u->next)
            if (strcmp(u->string, v->string) == 0) {
                rc = loom_error_set(LOOM_ERR_INPUT, "%s: field %s is given twice", path, v->string);
                break;
            }
        if (rc) break;
        const struct loom_hf_field *f = rule_of(v->string, fields, n);
        if (!f) {
            rc = loom_error_set(
                LOOM_ERR_INPUT,
                "%s: unknown field %s (%s): loom's %s cannot honour it, so it refuses the file", path,
                v->string, value, model);
            break;
        }
        if (f->rule != LOOM_HF_ONLY) continue;
        cJSON *only = cJSON_Parse(f->only);
        LOOM_ASSERT(only != NULL);
        const int same = cJSON_Compare(v, only, 1);
        cJSON_Delete(only);
        if (!same) {
            rc = loom_error_set(LOOM_ERR_INPUT, "%s: %s is %s; loom's %s supports only %s", path, v->string,
                                value, model, f->only);
            break;
        }
    }
    if (rc) {
        cJSON_Delete(root);
        return rc;
    }
    *out = root;
    return LOOM_OK;
}

int loom_hf_config_gives(const char *path, const char *field)
{
    int rc;
    char *text = read_text(path, &rc);
    if (!text) {
        loom_error_clear();
        return 0;
    }
    cJSON *root = cJSON_Parse(text);
    free(text);
    const int given = cJSON_IsObject(root) && cJSON_GetObjectItemCaseSensitive(root, field) != NULL;
    cJSON_Delete(root);
    return given;
}
