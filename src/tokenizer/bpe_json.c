/*
 * The files of a byte-level BPE tokenizer: Hugging Face's `tokenizer.json`
 * (read and written) and GPT-2's `vocab.json` + `merges.txt` (read). What
 * loom cannot run as `tokenizers` would (a normalizer, dropout, byte
 * fallback, a model other than BPE, a split behaviour other than Isolated)
 * is refused at load, naming the key, rather than tokenized differently.
 */
#include <cJSON.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "base/log.h"
#include "base/mem.h"
#include "io/fs.h"
#include "loom/loom.h"
#include "tokenizer/bpe_impl.h"

enum { MAX_FILE = 1 << 30 };

static struct loom_bpe *bpe_new(int32_t n_ids)
{
    struct loom_bpe *t = calloc(1, sizeof *t);
    if (!t) loom_die("out of memory loading a tokenizer");
    t->n_ids = n_ids;
    t->name = calloc((size_t)n_ids, sizeof *t->name);
    t->is_added = calloc((size_t)n_ids, 1);
    if (!t->name || !t->is_added) loom_die("out of memory loading a tokenizer");
    return t;
}

/* Merge strings "left right" -> t->merge, by rank. */
static int add_merge(struct loom_bpe *t, const char *file, int64_t k, const char *left, const char *right)
{
    uint32_t la = (uint32_t)strlen(left), lb = (uint32_t)strlen(right);
    /* byte-level names stand for bytes; a SentencePiece-style name is its own text */
    char *a = t->sp.char_level ? strdup(left) : bpe_name_bytes(left, &la),
         *b = t->sp.char_level ? strdup(right) : bpe_name_bytes(right, &lb);
    char *ab = malloc((size_t)la + lb + 1);
    if (!ab) loom_die("out of memory loading a tokenizer");
    memcpy(ab, a, la);
    memcpy(ab + la, b, lb);
    const int32_t ia = bpe_vocab_find(t, a, la), ib = bpe_vocab_find(t, b, lb),
                  iab = bpe_vocab_find(t, ab, la + lb);
    free(a);
    free(b);
    free(ab);
    if (ia < 0 || ib < 0 || iab < 0)
        return loom_error_set(LOOM_ERR_INPUT, "%s: merge %lld (\"%s %s\"): %s is not in the vocabulary", file,
                              (long long)k + 1, left, right,
                              ia < 0   ? "its left part"
                              : ib < 0 ? "its right part"
                                       : "the merged token");
    t->merge[k][0] = ia, t->merge[k][1] = ib, t->merge[k][2] = iab;
    return LOOM_OK;
}

/* The vocabulary object {"token": id, ...} into t (sized by its largest id). */
static int read_vocab(const cJSON *vocab, const char *file, struct loom_bpe **out, int32_t extra_max,
                      int extra_entries)
{
    if (!cJSON_IsObject(vocab))
        return loom_error_set(LOOM_ERR_INPUT, "%s: the vocabulary is not an object", file);
    int32_t max = extra_max;
    const cJSON *e;
    cJSON_ArrayForEach(e, vocab)
    {
        if (!cJSON_IsNumber(e) || e->valuedouble < 0 || e->valuedouble >= (1 << 30) ||
            e->valuedouble != (double)(int32_t)e->valuedouble)
            return loom_error_set(LOOM_ERR_INPUT, "%s: vocabulary entry \"%s\" has no valid id", file,
                                  e->string);
        if (e->valueint > max) max = e->valueint;
    }
    /* ids are dense in every real vocabulary: a sparse one is a broken file
     * (and would size the tables by its largest id) */
    const int64_t entries = cJSON_GetArraySize(vocab) + extra_entries;
    if ((int64_t)max >= 2 * entries + 1024)
        return loom_error_set(LOOM_ERR_INPUT, "%s: ids go up to %d for %lld tokens: not a vocabulary", file,
                              max, (long long)entries);
    struct loom_bpe *t = bpe_new(max + 1);
    cJSON_ArrayForEach(e, vocab)
    {
        if (t->name[e->valueint]) {
            const int rc = loom_error_set(LOOM_ERR_INPUT, "%s: id %d is given to both \"%s\" and \"%s\"",
                                          file, e->valueint, t->name[e->valueint], e->string);
            loom_bpe_free(t);
            return rc;
        }
        t->name[e->valueint] = strdup(e->string);
    }
    *out = t;
    return LOOM_OK;
}

static int json_flag(const cJSON *o, const char *key, int dflt)
{
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(o, key);
    return cJSON_IsBool(v) ? cJSON_IsTrue(v) : dflt;
}

static int read_pre_tokenizer(struct loom_bpe *t, const cJSON *p, const char *file)
{
    if (!p || cJSON_IsNull(p)) return LOOM_OK;
    const cJSON *type = cJSON_GetObjectItemCaseSensitive(p, "type");
    if (!cJSON_IsString(type)) return loom_error_set(LOOM_ERR_INPUT, "%s: pre_tokenizer has no type", file);
    if (strcmp(type->valuestring, "Sequence") == 0) {
        const cJSON *list = cJSON_GetObjectItemCaseSensitive(p, "pretokenizers"), *e;
        if (!cJSON_IsArray(list))
            return loom_error_set(LOOM_ERR_INPUT, "%s: pre_tokenizer Sequence has no pretokenizers list",
                                  file);
        cJSON_ArrayForEach(e, list)
        {
            const int rc = read_pre_tokenizer(t, e, file);
            if (rc) return rc;
        }
        return LOOM_OK;
    }
    if (t->n_steps + 2 > BPE_MAX_STEPS)
        return loom_error_set(LOOM_ERR_INPUT, "%s: more than %d pre-tokenization steps", file, BPE_MAX_STEPS);
    if (strcmp(type->valuestring, "ByteLevel") == 0) {
        if (json_flag(p, "add_prefix_space", 0)) t->step[t->n_steps++].prefix_space = 1;
        if (json_flag(p, "use_regex", 1)) {
            struct bpe_step *st = &t->step[t->n_steps++];
            st->byte_level = 1;
            return bpe_step_split(st, loom_bpe_pattern_gpt2, 0, file);
        }
        return LOOM_OK;
    }
    if (strcmp(type->valuestring, "Split") == 0) {
        const cJSON *pat = cJSON_GetObjectItemCaseSensitive(p, "pattern");
        const cJSON *re = cJSON_GetObjectItemCaseSensitive(pat, "Regex");
        const cJSON *str = cJSON_GetObjectItemCaseSensitive(pat, "String");
        const cJSON *beh = cJSON_GetObjectItemCaseSensitive(p, "behavior");
        if (!cJSON_IsString(re) && !cJSON_IsString(str))
            return loom_error_set(LOOM_ERR_INPUT, "%s: pre_tokenizer Split has no pattern Regex or String",
                                  file);
        if (!cJSON_IsString(beh) || strcmp(beh->valuestring, "Isolated") != 0)
            return loom_error_set(LOOM_ERR_INPUT,
                                  "%s: pre_tokenizer Split behavior \"%s\" is not supported (Isolated)", file,
                                  cJSON_IsString(beh) ? beh->valuestring : "?");
        if (json_flag(p, "invert", 0))
            return loom_error_set(LOOM_ERR_INPUT, "%s: pre_tokenizer Split with invert is not supported",
                                  file);
        return bpe_step_split(&t->step[t->n_steps++], cJSON_IsString(re) ? re->valuestring : str->valuestring,
                              !cJSON_IsString(re), file);
    }
    return loom_error_set(LOOM_ERR_INPUT,
                          "%s: pre_tokenizer type \"%s\" is not supported (ByteLevel, Split, Sequence)", file,
                          type->valuestring);
}

/* TemplateProcessing's single-sequence template: the special tokens before
 * and after the text (what `tokenizers` adds with add_special_tokens).
 * Other post-processors (ByteLevel's offsets) add none. */
static int read_post_processor(struct loom_bpe *t, const cJSON *p, const char *file)
{
    const cJSON *type = cJSON_GetObjectItemCaseSensitive(p, "type");
    if (cJSON_IsString(type) &&
        strcmp(type->valuestring, "Sequence") == 0) { /* Llama 3's: ByteLevel, Template */
        const cJSON *e;
        cJSON_ArrayForEach(e, cJSON_GetObjectItemCaseSensitive(p, "processors"))
        {
            const int rc = read_post_processor(t, e, file);
            if (rc) return rc;
        }
        return LOOM_OK;
    }
    if (!cJSON_IsString(type) || strcmp(type->valuestring, "TemplateProcessing") != 0) return LOOM_OK;
    const cJSON *single = cJSON_GetObjectItemCaseSensitive(p, "single"), *e;
    const cJSON *specials = cJSON_GetObjectItemCaseSensitive(p, "special_tokens");
    int after = 0;
    cJSON_ArrayForEach(e, single)
    {
        if (cJSON_GetObjectItemCaseSensitive(e, "Sequence")) {
            after = 1;
            continue;
        }
        const cJSON *st = cJSON_GetObjectItemCaseSensitive(e, "SpecialToken");
        const cJSON *name = cJSON_GetObjectItemCaseSensitive(st, "id");
        const cJSON *ids = cJSON_GetObjectItemCaseSensitive(
                        cJSON_GetObjectItemCaseSensitive(specials,
                                                         cJSON_IsString(name) ? name->valuestring : ""),
                        "ids"),
                    *id;
        if (!cJSON_IsArray(ids))
            return loom_error_set(LOOM_ERR_INPUT,
                                  "%s: post_processor's template names a special token it does "
                                  "not define",
                                  file);
        cJSON_ArrayForEach(id, ids)
        {
            int32_t *list = after ? t->post_suffix : t->post_prefix;
            int *count = after ? &t->n_post_suffix : &t->n_post_prefix;
            if (!cJSON_IsNumber(id) || id->valueint < 0 || id->valueint >= t->n_ids || *count == 4)
                return loom_error_set(LOOM_ERR_INPUT,
                                      "%s: post_processor's template is not supported (up to 4 "
                                      "special tokens of the vocabulary on each side)",
                                      file);
            list[(*count)++] = id->valueint;
        }
    }
    return LOOM_OK;
}

static void describe(struct loom_bpe *t)
{
    if (t->n_steps == 1 && t->step[0].byte_level)
        snprintf(t->describe, sizeof t->describe, "gpt2");
    else if (t->n_steps == 1 && t->step[0].re && strcmp(t->step[0].pattern, loom_bpe_pattern_llama3) == 0)
        snprintf(t->describe, sizeof t->describe, "llama3");
    else
        snprintf(t->describe, sizeof t->describe, "%d step%s", t->n_steps, t->n_steps == 1 ? "" : "s");
}

static int load_tokenizer_json(const char *file, struct loom_bpe **out)
{
    char *text;
    size_t len;
    int rc = loom_fs_read_small(file, MAX_FILE, &text, &len);
    if (rc) return rc;
    cJSON *root = cJSON_ParseWithLength(text, len);
    loom_free(text);
    if (!root) return loom_error_set(LOOM_ERR_INPUT, "%s: not valid JSON", file);
    struct loom_bpe *t = NULL;
    const cJSON *model = cJSON_GetObjectItemCaseSensitive(root, "model");
    const cJSON *type = cJSON_GetObjectItemCaseSensitive(model, "type");
    const cJSON *added = cJSON_GetObjectItemCaseSensitive(root, "added_tokens");
    const cJSON *norm = cJSON_GetObjectItemCaseSensitive(root, "normalizer");
    const cJSON *merges = cJSON_GetObjectItemCaseSensitive(model, "merges"), *e;
    if (!cJSON_IsObject(model)) {
        rc = loom_error_set(LOOM_ERR_INPUT, "%s: no \"model\" object: not a tokenizers tokenizer.json", file);
        goto done;
    }
    if (type && (!cJSON_IsString(type) || strcmp(type->valuestring, "BPE") != 0)) {
        rc = loom_error_set(LOOM_ERR_INPUT, "%s: model type \"%s\" is not supported (BPE)", file,
                            cJSON_IsString(type) ? type->valuestring : "?");
        goto done;
    }
    const int sp_style = cJSON_IsObject(model) && bpe_sp_detect(root, model);
    if (norm && !cJSON_IsNull(norm) && !sp_style) {
        rc = loom_error_set(LOOM_ERR_INPUT, "%s: a normalizer is not supported (byte-level BPE has none)",
                            file);
        goto done;
    }
    const cJSON *dropout = cJSON_GetObjectItemCaseSensitive(model, "dropout");
    if (dropout && !cJSON_IsNull(dropout) && !(cJSON_IsNumber(dropout) && dropout->valuedouble == 0)) {
        rc = loom_error_set(LOOM_ERR_INPUT, "%s: BPE dropout is not supported (model.dropout)", file);
        goto done;
    }
    static const char *const affixes[] = {"continuing_subword_prefix", "end_of_word_suffix"};
    for (int i = 0; i < 2; i++) {
        const cJSON *a = cJSON_GetObjectItemCaseSensitive(model, affixes[i]);
        if (cJSON_IsString(a) && *a->valuestring) {
            rc = loom_error_set(LOOM_ERR_INPUT, "%s: model.%s is not supported", file, affixes[i]);
            goto done;
        }
    }
    if (added && !cJSON_IsArray(added)) {
        rc = loom_error_set(LOOM_ERR_INPUT, "%s: added_tokens is not a list", file);
        goto done;
    }
    int32_t added_max = -1;
    cJSON_ArrayForEach(e, added)
    {
        const cJSON *id = cJSON_GetObjectItemCaseSensitive(e, "id"),
                    *c = cJSON_GetObjectItemCaseSensitive(e, "content");
        if (!cJSON_IsNumber(id) || id->valuedouble < 0 || id->valuedouble >= (1 << 30) ||
            !cJSON_IsString(c) || !*c->valuestring) {
            rc = loom_error_set(LOOM_ERR_INPUT, "%s: an added token without a valid id and content", file);
            goto done;
        }
        if (id->valueint > added_max) added_max = id->valueint;
    }
    if ((rc = read_vocab(cJSON_GetObjectItemCaseSensitive(model, "vocab"), file, &t, added_max,
                         cJSON_GetArraySize(added))))
        goto done;
    cJSON_ArrayForEach(e, added)
    {
        const int32_t id = cJSON_GetObjectItemCaseSensitive(e, "id")->valueint;
        const char *content = cJSON_GetObjectItemCaseSensitive(e, "content")->valuestring;
        if (t->name[id] && strcmp(t->name[id], content) != 0 && !t->is_added[id]) {
            /* an added token over a model token: the added content wins, as in `tokenizers` */
            free(t->name[id]);
            t->name[id] = NULL;
        }
        if (!t->name[id]) t->name[id] = strdup(content);
        t->is_added[id] = 1;
        if (json_flag(e, "single_word", 0)) {
            rc = loom_error_set(LOOM_ERR_INPUT, "%s: added token \"%s\": single_word is not supported", file,
                                content);
            goto done;
        }
        t->added = realloc(t->added, (size_t)(t->n_added + 1) * sizeof *t->added);
        if (!t->added) loom_die("out of memory loading a tokenizer");
        t->added[t->n_added++] = (struct bpe_added){.content = strdup(content),
                                                    .len = (uint32_t)strlen(content),
                                                    .id = id,
                                                    .special = (uint8_t)json_flag(e, "special", 0),
                                                    .lstrip = (uint8_t)json_flag(e, "lstrip", 0),
                                                    .rstrip = (uint8_t)json_flag(e, "rstrip", 0),
                                                    .normalized = (uint8_t)json_flag(e, "normalized", 0)};
    }
    t->ignore_merges = json_flag(model, "ignore_merges", 0);
    if (sp_style) {
        if ((rc = bpe_sp_read(t, root, model, file))) goto done;
    } else {
        if ((rc = read_pre_tokenizer(t, cJSON_GetObjectItemCaseSensitive(root, "pre_tokenizer"), file)))
            goto done;
        describe(t);
    }
    if ((rc = read_post_processor(t, cJSON_GetObjectItemCaseSensitive(root, "post_processor"), file)))
        goto done;
    /* the byte tables first: merges are looked up by their bytes */
    if ((rc = bpe_index_vocab(t))) {
        char why[600];
        snprintf(why, sizeof why, "%s", loom_error_message());
        rc = loom_error_set(LOOM_ERR_INPUT, "%s: %s", file, why);
        goto done;
    }
    if (!cJSON_IsArray(merges)) {
        rc = loom_error_set(LOOM_ERR_INPUT, "%s: model.merges is not a list", file);
        goto done;
    }
    const int64_t n = cJSON_GetArraySize(merges);
    t->merge = malloc((size_t)(n ? n : 1) * sizeof *t->merge);
    if (!t->merge) loom_die("out of memory loading a tokenizer");
    int64_t k = 0;
    cJSON_ArrayForEach(e, merges)
    {
        if (cJSON_IsString(e)) { /* "left right" */
            const char *sp = strchr(e->valuestring, ' ');
            if (!sp || strchr(sp + 1, ' ')) {
                rc = loom_error_set(LOOM_ERR_INPUT, "%s: merge %lld \"%s\" is not two tokens", file,
                                    (long long)k + 1, e->valuestring);
                goto done;
            }
            char left[1024];
            if ((size_t)(sp - e->valuestring) >= sizeof left) {
                rc = loom_error_set(LOOM_ERR_INPUT, "%s: merge %lld is too long", file, (long long)k + 1);
                goto done;
            }
            memcpy(left, e->valuestring, (size_t)(sp - e->valuestring));
            left[sp - e->valuestring] = 0;
            rc = add_merge(t, file, k, left, sp + 1);
        } else if (cJSON_IsArray(e) && cJSON_GetArraySize(e) == 2 &&
                   cJSON_IsString(cJSON_GetArrayItem(e, 0)) &&
                   cJSON_IsString(cJSON_GetArrayItem(e, 1))) { /* ["left", "right"] (newer files) */
            rc = add_merge(t, file, k, cJSON_GetArrayItem(e, 0)->valuestring,
                           cJSON_GetArrayItem(e, 1)->valuestring);
        } else {
            rc = loom_error_set(LOOM_ERR_INPUT, "%s: merge %lld is neither \"a b\" nor [\"a\", \"b\"]", file,
                                (long long)k + 1);
        }
        if (rc) goto done;
        k++;
    }
    t->n_merges = n;
    bpe_index_merges(t);
done:
    cJSON_Delete(root);
    if (rc) {
        loom_bpe_free(t);
        return rc;
    }
    *out = t;
    return LOOM_OK;
}

/* GPT-2's files: vocab.json {"token": id} and merges.txt ("#version" line, then "a b" per line). */
static int load_gpt2_files(const char *vpath, const char *mpath, struct loom_bpe **out)
{
    char *text, *mtext;
    size_t len, mlen;
    int rc = loom_fs_read_small(vpath, MAX_FILE, &text, &len);
    if (rc) return rc;
    cJSON *vocab = cJSON_ParseWithLength(text, len);
    loom_free(text);
    if (!vocab) return loom_error_set(LOOM_ERR_INPUT, "%s: not valid JSON", vpath);
    struct loom_bpe *t = NULL;
    rc = read_vocab(vocab, vpath, &t, -1, 0);
    cJSON_Delete(vocab);
    if (rc) return rc;
    if ((rc = loom_fs_read_small(mpath, MAX_FILE, &mtext, &mlen))) {
        loom_bpe_free(t);
        return rc;
    }
    /* GPT-2's end of text is an added, special token */
    for (int32_t id = 0; id < t->n_ids; id++)
        if (t->name[id] && strcmp(t->name[id], "<|endoftext|>") == 0) {
            t->is_added[id] = 1;
            t->added = malloc(sizeof *t->added);
            if (!t->added) loom_die("out of memory loading a tokenizer");
            t->added[t->n_added++] =
                (struct bpe_added){.content = strdup("<|endoftext|>"), .len = 13, .id = id, .special = 1};
            break;
        }
    t->step[0].byte_level = 1;
    t->n_steps = 1;
    if ((rc = bpe_step_split(&t->step[0], loom_bpe_pattern_gpt2, 0, mpath))) goto fail;
    describe(t);
    if ((rc = bpe_index_vocab(t))) {
        char why[600];
        snprintf(why, sizeof why, "%s", loom_error_message());
        rc = loom_error_set(LOOM_ERR_INPUT, "%s: %s", vpath, why);
        goto fail;
    }
    int64_t lines = 0;
    for (size_t i = 0; i < mlen; i++) lines += mtext[i] == '\n';
    t->merge = malloc((size_t)(lines + 1) * sizeof *t->merge);
    if (!t->merge) loom_die("out of memory loading a tokenizer");
    int64_t k = 0, line_no = 0;
    for (char *line = mtext, *end; line < mtext + mlen; line = end + 1) {
        end = memchr(line, '\n', (size_t)(mtext + mlen - line));
        if (!end) end = mtext + mlen;
        *end = 0;
        line_no++;
        if (end > line && end[-1] == '\r') end[-1] = 0;
        if (!*line || (line_no == 1 && strncmp(line, "#version", 8) == 0)) continue;
        char *sp = strchr(line, ' ');
        if (!sp || strchr(sp + 1, ' ')) {
            rc = loom_error_set(LOOM_ERR_INPUT, "%s: line %lld is not two tokens", mpath, (long long)line_no);
            goto fail;
        }
        *sp = 0;
        if ((rc = add_merge(t, mpath, k, line, sp + 1))) goto fail;
        k++;
    }
    t->n_merges = k;
    bpe_index_merges(t);
    loom_free(mtext);
    *out = t;
    return LOOM_OK;
fail:
    loom_free(mtext);
    loom_bpe_free(t);
    return rc;
}

/* The message of a refusal on one printable line: what a file holds
 * (a token, a pattern) may hold newlines and control characters. */
static int one_line(int rc)
{
    if (rc == LOOM_OK) return rc;
    char msg[1024];
    snprintf(msg, sizeof msg, "%s", loom_error_message());
    for (char *c = msg; *c; c++)
        if ((unsigned char)*c < 0x20 || *c == 0x7F) *c = '?';
    return loom_error_set(rc, "%s", msg);
}

static int load(const char *path, struct loom_bpe **out);

int loom_bpe_load(const char *path, struct loom_bpe **out)
{
    return one_line(load(path, out));
}

static int load(const char *path, struct loom_bpe **out)
{
    char file[4096];
    if (!loom_fs_is_dir(path)) return load_tokenizer_json(path, out);
    snprintf(file, sizeof file, "%s/tokenizer.json", path);
    /* whether the files are there (not opened: a FIFO would wait); the
     * readers refuse what is not a regular file */
    if (access(file, F_OK) == 0) return load_tokenizer_json(file, out);
    snprintf(file, sizeof file, "%s/vocab.json", path);
    char merges[4096];
    snprintf(merges, sizeof merges, "%s/merges.txt", path);
    if (access(file, F_OK) == 0) return load_gpt2_files(file, merges, out);
    return loom_error_set(LOOM_ERR_INPUT,
                          "%s holds neither tokenizer.json nor GPT-2's vocab.json and merges.txt", path);
}

int loom_bpe_load_pair(const char *path, const char *merges, struct loom_bpe **out)
{
    return merges && *merges ? one_line(load_gpt2_files(path, merges, out)) : loom_bpe_load(path, out);
}

int loom_bpe_export_pair(const char *src, const char *merges, const char *dir)
{
    if (!merges || !*merges) return loom_bpe_export(src, dir);
    struct loom_bpe *t;
    int rc = loom_bpe_load_pair(src, merges, &t);
    if (rc) return rc;
    rc = loom_bpe_save(t, dir);
    loom_bpe_free(t);
    return rc;
}

int loom_bpe_export(const char *src, const char *dir)
{
    char file[4096];
    const char *json = src;
    if (loom_fs_is_dir(src)) {
        snprintf(file, sizeof file, "%s/tokenizer.json", src);
        if (access(file, F_OK) != 0) { /* GPT-2's files: converted */
            struct loom_bpe *t;
            int rc = loom_bpe_load(src, &t);
            if (rc) return rc;
            rc = loom_bpe_save(t, dir);
            loom_bpe_free(t);
            return rc;
        }
        json = file;
    }
    char *text, out[4096];
    size_t len;
    int rc = loom_fs_read_small(json, MAX_FILE, &text, &len);
    if (rc) return rc;
    snprintf(out, sizeof out, "%s/tokenizer.json", dir);
    const void *parts[] = {text};
    const size_t sizes[] = {len};
    rc = loom_fs_write_atomic(out, parts, sizes, 1);
    loom_free(text);
    return rc;
}

/* ---- writing tokenizer.json ---------------------------------------------------- */

static cJSON *byte_level(int add_prefix_space, int use_regex)
{
    cJSON *o = cJSON_CreateObject();
    cJSON_AddStringToObject(o, "type", "ByteLevel");
    cJSON_AddBoolToObject(o, "add_prefix_space", add_prefix_space);
    cJSON_AddBoolToObject(o, "trim_offsets", 1);
    cJSON_AddBoolToObject(o, "use_regex", use_regex);
    return o;
}

int loom_bpe_save(const struct loom_bpe *t, const char *dir)
{
    cJSON *root = cJSON_CreateObject();
    cJSON_AddStringToObject(root, "version", "1.0");
    cJSON_AddNullToObject(root, "truncation");
    cJSON_AddNullToObject(root, "padding");
    cJSON *added = cJSON_AddArrayToObject(root, "added_tokens");
    for (int i = 0; i < t->n_added; i++) {
        cJSON *a = cJSON_CreateObject();
        cJSON_AddNumberToObject(a, "id", t->added[i].id);
        cJSON_AddStringToObject(a, "content", t->added[i].content);
        cJSON_AddBoolToObject(a, "single_word", 0);
        cJSON_AddBoolToObject(a, "lstrip", t->added[i].lstrip);
        cJSON_AddBoolToObject(a, "rstrip", t->added[i].rstrip);
        cJSON_AddBoolToObject(a, "normalized", t->added[i].normalized);
        cJSON_AddBoolToObject(a, "special", t->added[i].special);
        cJSON_AddItemToArray(added, a);
    }
    cJSON_AddNullToObject(root, "normalizer");
    /* the steps back into tokenizers' pre-tokenizers */
    cJSON *steps = cJSON_CreateArray();
    for (int i = 0; i < t->n_steps; i++) {
        const struct bpe_step *st = &t->step[i];
        if (st->prefix_space || st->byte_level) {
            const int with_regex = st->prefix_space ? i + 1 < t->n_steps && t->step[i + 1].byte_level : 1;
            cJSON_AddItemToArray(steps, byte_level(st->prefix_space, with_regex));
            if (st->prefix_space && with_regex) i++;
            continue;
        }
        cJSON *o = cJSON_CreateObject(), *pat = cJSON_CreateObject();
        cJSON_AddStringToObject(o, "type", "Split");
        cJSON_AddStringToObject(pat, st->literal ? "String" : "Regex", st->pattern);
        cJSON_AddItemToObject(o, "pattern", pat);
        cJSON_AddStringToObject(o, "behavior", "Isolated");
        cJSON_AddBoolToObject(o, "invert", 0);
        cJSON_AddItemToArray(steps, o);
    }
    int has_byte_level = 0;
    for (int i = 0; i < t->n_steps; i++) has_byte_level |= t->step[i].byte_level || t->step[i].prefix_space;
    if (!has_byte_level) cJSON_AddItemToArray(steps, byte_level(0, 0)); /* the byte mapping itself */
    if (cJSON_GetArraySize(steps) == 1) {
        cJSON *only = cJSON_DetachItemFromArray(steps, 0);
        cJSON_Delete(steps);
        cJSON_AddItemToObject(root, "pre_tokenizer", only);
    } else {
        cJSON *seq = cJSON_CreateObject();
        cJSON_AddStringToObject(seq, "type", "Sequence");
        cJSON_AddItemToObject(seq, "pretokenizers", steps);
        cJSON_AddItemToObject(root, "pre_tokenizer", seq);
    }
    cJSON_AddItemToObject(root, "post_processor", byte_level(1, 1));
    cJSON_AddItemToObject(root, "decoder", byte_level(1, 1));
    cJSON *model = cJSON_AddObjectToObject(root, "model");
    cJSON_AddStringToObject(model, "type", "BPE");
    cJSON_AddNullToObject(model, "dropout");
    cJSON_AddNullToObject(model, "unk_token");
    cJSON_AddNullToObject(model, "continuing_subword_prefix");
    cJSON_AddNullToObject(model, "end_of_word_suffix");
    cJSON_AddBoolToObject(model, "fuse_unk", 0);
    cJSON_AddBoolToObject(model, "byte_fallback", 0);
    if (t->ignore_merges) cJSON_AddBoolToObject(model, "ignore_merges", 1);
    cJSON *vocab = cJSON_AddObjectToObject(model, "vocab");
    for (int32_t id = 0; id < t->n_ids; id++)
        if (t->name[id]) cJSON_AddNumberToObject(vocab, t->name[id], id);
    cJSON *merges = cJSON_AddArrayToObject(model, "merges");
    for (int64_t k = 0; k < t->n_merges; k++) {
        const char *a = t->name[t->merge[k][0]], *b = t->name[t->merge[k][1]];
        const size_t la = strlen(a), lb = strlen(b);
        char *m = malloc(la + lb + 2);
        if (!m) loom_die("out of memory writing a tokenizer");
        memcpy(m, a, la);
        m[la] = ' ';
        memcpy(m + la + 1, b, lb + 1);
        cJSON_AddItemToArray(merges, cJSON_CreateString(m));
        free(m);
    }
    char *text = cJSON_Print(root);
    cJSON_Delete(root);
    if (!text) loom_die("out of memory writing a tokenizer");
    char path[4096];
    snprintf(path, sizeof path, "%s/tokenizer.json", dir);
    const void *parts[] = {text};
    const size_t sizes[] = {strlen(text)};
    const int rc = loom_fs_write_atomic(path, parts, sizes, 1);
    free(text);
    return rc;
}
