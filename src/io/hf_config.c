/*
 * config.json read strictly against a family's table (hf_config.h).
 */
#include "io/hf_config.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/log.h"

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
    FILE *f = fopen(path, "rb");
    if (!f) {
        *rc = loom_error_set(LOOM_ERR_INPUT, "cannot open %s: %s", path, strerror(errno));
        return NULL;
    }
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

int loom_hf_config_read(const char *path, const struct loom_hf_field *fields, int n, const char *model,
                        cJSON **out)
{
    *out = NULL;
    int rc = LOOM_OK;
    char *text = read_text(path, &rc);
    if (!text) return rc;
    cJSON *root = cJSON_Parse(text);
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
        int k = 0;
        while (k < n && strcmp(fields[k].name, v->string) != 0) k++;
        if (k == n) {
            rc = loom_error_set(
                LOOM_ERR_INPUT,
                "%s: unknown field %s (%s): loom's %s cannot honour it, so it refuses the file", path,
                v->string, value, model);
            break;
        }
        if (fields[k].rule != LOOM_HF_ONLY) continue;
        cJSON *only = cJSON_Parse(fields[k].only);
        LOOM_ASSERT(only != NULL);
        const int same = cJSON_Compare(v, only, 1);
        cJSON_Delete(only);
        if (!same) {
            rc = loom_error_set(LOOM_ERR_INPUT, "%s: %s is %s; loom's %s supports only %s", path, v->string,
                                value, model, fields[k].only);
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
