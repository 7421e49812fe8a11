/*
 * The tokenizer behind one face (tokenizer.h): which engine a file needs,
 * the template around a document, and the file an export writes.
 */
#include "tokenizer/tokenizer.h"

#include <cJSON.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "base/log.h"
#include "base/mem.h"
#include "io/fs.h"
#include "loom/loom.h"
#include "tokenizer/spm.h"

struct loom_tokenizer {
    struct loom_bpe *bpe; /* one of the two */
    struct loom_spm *spm;
    int32_t pre[4], post[4];
    int n_pre, n_post;
};

struct loom_tokenizer_state {
    struct loom_bpe_state *bpe;
};

const char *const loom_tokenizer_files[2] = {"tokenizer.json", "tokenizer.model"};

/* Whether the file at path is a SentencePiece model: a serialized protobuf
 * (ModelProto's first field, its pieces, is tag 0x0A), not JSON (which
 * begins with "{" after any white space). */
static int is_spm_file(const char *path)
{
    FILE *f = fopen(path, "rb");
    if (!f) return 0;
    unsigned char b[64];
    const size_t n = fread(b, 1, sizeof b, f);
    fclose(f);
    size_t i = 0;
    while (i < n && (b[i] == ' ' || b[i] == '\n' || b[i] == '\r' || b[i] == '\t')) i++;
    return n && b[0] == 0x0A && !(i < n && b[i] == '{');
}

/* The file of a directory's tokenizer, or "" (GPT-2's pair: the directory). */
static int dir_file(const char *dir, char *file, size_t n)
{
    for (int i = 0; i < 2; i++) {
        snprintf(file, n, "%s/%s", dir, loom_tokenizer_files[i]);
        if (access(file, F_OK) == 0) return 1;
    }
    return 0;
}

/* add_bos_token / add_eos_token of a tokenizer_config.json beside a
 * SentencePiece model (-1: not said). */
static void config_flags(const char *model_path, int *bos, int *eos)
{
    *bos = *eos = -1;
    char dir[4400], path[4500], *text;
    size_t len;
    loom_fs_dirname(model_path, dir, sizeof dir);
    snprintf(path, sizeof path, "%s/tokenizer_config.json", dir);
    if (access(path, F_OK) != 0 || loom_fs_read_small(path, 1 << 24, &text, &len) != LOOM_OK) {
        loom_error_clear();
        return;
    }
    cJSON *j = cJSON_ParseWithLength(text, len);
    loom_free(text);
    const cJSON *b = cJSON_GetObjectItemCaseSensitive(j, "add_bos_token"),
                *e = cJSON_GetObjectItemCaseSensitive(j, "add_eos_token");
    if (cJSON_IsBool(b)) *bos = cJSON_IsTrue(b);
    if (cJSON_IsBool(e)) *eos = cJSON_IsTrue(e);
    cJSON_Delete(j);
}

/* The SentencePiece model path or a directory of it names (file: its
 * storage), or NULL when it names a BPE tokenizer (MERGES given: GPT-2's). */
static const char *spm_model(const char *path, const char *merges, char *file, size_t n)
{
    if (merges && *merges) return NULL;
    if (loom_fs_is_dir(path))
        return dir_file(path, file, n) && strcmp(file + strlen(file) - 6, ".model") == 0 ? file : NULL;
    return is_spm_file(path) ? path : NULL;
}

int loom_tokenizer_load(const char *path, const char *merges, struct loom_tokenizer **out)
{
    struct loom_tokenizer *t = calloc(1, sizeof *t);
    if (!t) loom_die("out of memory loading a tokenizer");
    char file[4400];
    const char *spm_path = spm_model(path, merges, file, sizeof file);
    int rc;
    if (spm_path) {
        rc = loom_spm_load(spm_path, &t->spm);
        if (rc == LOOM_OK) {
            int bos, eos;
            config_flags(spm_path, &bos, &eos);
            if (bos != 0 && loom_spm_bos(t->spm) >= 0) t->pre[t->n_pre++] = loom_spm_bos(t->spm);
            if (eos == 1 && loom_spm_eos(t->spm) >= 0) t->post[t->n_post++] = loom_spm_eos(t->spm);
        }
    } else {
        rc = loom_bpe_load_pair(path, merges, &t->bpe);
        if (rc == LOOM_OK) loom_bpe_template(t->bpe, t->pre, &t->n_pre, t->post, &t->n_post);
    }
    if (rc) {
        loom_tokenizer_free(t);
        return rc;
    }
    *out = t;
    return LOOM_OK;
}

void loom_tokenizer_free(struct loom_tokenizer *t)
{
    if (!t) return;
    loom_bpe_free(t->bpe);
    loom_spm_free(t->spm);
    free(t);
}

/* dir/name made a copy of the file at path (crash-safely). */
static int copy_file(const char *path, const char *dir, const char *name)
{
    char *text, out[4400];
    size_t len;
    int rc = loom_fs_read_small(path, (size_t)1 << 30, &text, &len);
    if (rc) return rc;
    snprintf(out, sizeof out, "%s/%s", dir, name);
    const void *parts[] = {text};
    const size_t sizes[] = {len};
    rc = loom_fs_write_atomic(out, parts, sizes, 1);
    loom_free(text);
    return rc;
}

int loom_tokenizer_export(const char *src, const char *merges, const char *dir, const char **name)
{
    char file[4400];
    const char *model = spm_model(src, merges, file, sizeof file);
    if (!model) {
        *name = loom_tokenizer_files[0];
        return loom_bpe_export_pair(src, merges, dir);
    }
    /* a SentencePiece model: checked, then its bytes */
    struct loom_spm *m;
    int rc = loom_spm_load(model, &m);
    if (rc) return rc;
    loom_spm_free(m);
    rc = copy_file(model, dir, loom_tokenizer_files[1]);
    /* the template's settings beside it travel with it (config_flags reads them there) */
    char from[4400], config[4500];
    loom_fs_dirname(model, from, sizeof from);
    snprintf(config, sizeof config, "%s/tokenizer_config.json", from);
    if (rc == LOOM_OK && access(config, F_OK) == 0) rc = copy_file(config, dir, "tokenizer_config.json");
    *name = loom_tokenizer_files[1];
    return rc;
}

int32_t loom_tokenizer_vocab_size(const struct loom_tokenizer *t)
{
    return t->spm ? loom_spm_vocab_size(t->spm) : loom_bpe_vocab_size(t->bpe);
}

int32_t loom_tokenizer_eot(const struct loom_tokenizer *t)
{
    return t->spm ? loom_spm_eos(t->spm) : loom_bpe_eot(t->bpe);
}

int32_t loom_tokenizer_bos(const struct loom_tokenizer *t)
{
    return t->spm ? loom_spm_bos(t->spm) : loom_bpe_bos(t->bpe);
}

int32_t loom_tokenizer_pad(const struct loom_tokenizer *t)
{
    return t->spm ? loom_spm_pad(t->spm) : loom_bpe_pad(t->bpe);
}

const char *loom_tokenizer_special_text(const struct loom_tokenizer *t, int32_t id)
{
    return t->spm ? loom_spm_piece(t->spm, id) : loom_bpe_added_text(t->bpe, id);
}

const char *loom_tokenizer_describe(const struct loom_tokenizer *t)
{
    return t->spm ? "sentencepiece" : loom_bpe_describe(t->bpe);
}

int loom_tokenizer_is_spm(const struct loom_tokenizer *t)
{
    return t->spm != NULL;
}

void loom_tokenizer_template(const struct loom_tokenizer *t, int32_t pre[4], int *n_pre, int32_t post[4],
                             int *n_post)
{
    *n_pre = t->n_pre, *n_post = t->n_post;
    memcpy(pre, t->pre, sizeof t->pre);
    memcpy(post, t->post, sizeof t->post);
}

struct loom_tokenizer_state *loom_tokenizer_state_new(const struct loom_tokenizer *t)
{
    struct loom_tokenizer_state *s = calloc(1, sizeof *s);
    if (!s) loom_die("out of memory in the tokenizer");
    if (t->bpe) s->bpe = loom_bpe_state_new(t->bpe);
    return s;
}

void loom_tokenizer_state_free(struct loom_tokenizer_state *s)
{
    if (!s) return;
    loom_bpe_state_free(s->bpe);
    free(s);
}

void loom_tokenizer_encode(const struct loom_tokenizer *t, struct loom_tokenizer_state *s, const char *text,
                           size_t n, struct loom_ids *out)
{
    if (t->spm)
        loom_spm_encode(t->spm, text, n, out);
    else
        loom_bpe_encode(t->bpe, s->bpe, text, n, out);
}

size_t loom_tokenizer_decode(const struct loom_tokenizer *t, const int32_t *ids, size_t n, char *out,
                             size_t cap)
{
    return t->spm ? loom_spm_decode(t->spm, ids, n, out, cap) : loom_bpe_decode(t->bpe, ids, n, out, cap);
}

const char *loom_tokenizer_token_bytes(const struct loom_tokenizer *t, int32_t id, size_t *len)
{
    return t->spm ? loom_spm_token_bytes(t->spm, id, len) : loom_bpe_token_bytes(t->bpe, id, len);
}
