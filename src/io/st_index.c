/* A sharded safetensors checkpoint's index (st_index.h). */
#include "io/st_index.h"

#include <cjson/cJSON.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

#include "base/log.h"
#include "base/mem.h"
#include "io/fs.h"

static char *dup_string(const char *s)
{
    const size_t n = strlen(s) + 1;
    char *p = loom_alloc(n, LOOM_MEM_OTHER);
    memcpy(p, s, n);
    return p;
}

int loom_st_is_index(const char *path)
{
    const size_t n = strlen(path), k = strlen(".index.json");
    return n > k && strcmp(path + n - k, ".index.json") == 0;
}

int loom_st_index_read(const char *path, struct loom_st_index *x)
{
    memset(x, 0, sizeof *x);
    char *text;
    size_t len;
    int rc = loom_fs_read_small(path, (size_t)64 << 20, &text, &len);
    if (rc) return rc;
    cJSON *j = cJSON_ParseWithLength(text, len);
    loom_free(text);
    const cJSON *map = j ? cJSON_GetObjectItemCaseSensitive(j, "weight_map") : NULL;
    if (!cJSON_IsObject(map)) {
        cJSON_Delete(j);
        return loom_error_set(LOOM_ERR_INPUT, "%s: %s", path,
                              j ? "no \"weight_map\" object (not a safetensors index)" : "not valid JSON");
    }
    char dir[4096];
    loom_fs_dirname(path, dir, sizeof dir);
    x->path = dup_string(path);
    x->ntensors = cJSON_GetArraySize(map);
    x->names = loom_alloc(sizeof *x->names * (size_t)(x->ntensors + 1), LOOM_MEM_OTHER);
    x->file_of = loom_alloc(sizeof *x->file_of * (size_t)(x->ntensors + 1), LOOM_MEM_OTHER);
    x->files = loom_alloc(sizeof *x->files * (size_t)(x->ntensors + 1), LOOM_MEM_OTHER);
    int i = 0;
    for (const cJSON *e = map->child; e && rc == LOOM_OK; e = e->next, i++) {
        if (!cJSON_IsString(e) || !*e->valuestring || strchr(e->valuestring, '/')) {
            rc = loom_error_set(LOOM_ERR_INPUT, "%s: weight_map[\"%s\"] is not a file name in its directory",
                                path, e->string);
            break;
        }
        char file[4400];
        snprintf(file, sizeof file, "%s/%s", dir, e->valuestring);
        int f = 0;
        while (f < x->nfiles && strcmp(x->files[f], file) != 0) f++;
        if (f == x->nfiles) {
            if (access(file, F_OK) != 0) {
                rc = loom_error_set(LOOM_ERR_INPUT, "%s names shard %s for %s, and there is no such file",
                                    path, e->valuestring, e->string);
                break;
            }
            x->files[x->nfiles++] = dup_string(file);
        }
        x->names[i] = dup_string(e->string);
        x->file_of[i] = f;
    }
    x->ntensors = i;
    cJSON_Delete(j);
    if (rc == LOOM_OK && !x->nfiles) rc = loom_error_set(LOOM_ERR_INPUT, "%s: the weight_map is empty", path);
    if (rc) loom_st_index_free(x);
    return rc;
}

void loom_st_index_free(struct loom_st_index *x)
{
    for (int i = 0; i < x->nfiles; i++) loom_free(x->files[i]);
    for (int i = 0; i < x->ntensors; i++) loom_free(x->names[i]);
    loom_free(x->files);
    loom_free(x->names);
    loom_free(x->file_of);
    loom_free(x->path);
    memset(x, 0, sizeof *x);
}

int loom_st_index_find(const struct loom_st_index *x, const char *prefix, const char *name)
{
    for (int pass = 0; pass < (prefix ? 2 : 1); pass++) {
        char full[4096];
        snprintf(full, sizeof full, "%s%s", pass ? prefix : "", name);
        for (int i = 0; i < x->ntensors; i++)
            if (strcmp(x->names[i], full) == 0) return x->file_of[i];
    }
    return -1;
}
