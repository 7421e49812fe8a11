/*
 * The tokenizer.json files converted from SentencePiece BPE models (Llama
 * 2, Mistral, Gemma; transformers' LlamaConverter and GemmaConverter write
 * them): BPE over characters with byte fallback, as `tokenizers` runs it.
 *
 * - Normalizer: Prepend and Replace (String patterns), alone or in a
 *   Sequence, applied to each segment between added tokens (so "a</s>b"
 *   prepends to "a" and to "b", as `tokenizers` does).
 * - Pre-tokenizer: none (the segment is one word: merging is O(n log n)), or
 *   Metaspace (spaces become the replacement, one is prepended always or to
 *   the text's first segment, and pieces start at each replacement).
 * - Model: a character in the vocabulary is its token; one that is not
 *   becomes the <0xXX> tokens of its bytes (byte_fallback), else the
 *   unknown token (consecutive ones fused with fuse_unk); then merges by
 *   rank, as for bytes (bpe.c).
 * - Decoder: Replace, ByteFallback (a run of byte tokens that is not valid
 *   UTF-8 gives one U+FFFD a byte; without it they stay "<0xXX>"), Fuse,
 *   Strip of leading spaces, or Metaspace's own (which drops every
 *   replacement of the first token). Ids with no token decode
 *   to nothing, as in `tokenizers`.
 */
#include <cJSON.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/log.h"
#include "loom/loom.h"
#include "tokenizer/bpe_impl.h"

#define xrealloc bpe_xrealloc

static const char *str_of(const cJSON *o, const char *key)
{
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(o, key);
    return cJSON_IsString(v) ? v->valuestring : NULL;
}

static const char *type_of(const cJSON *o)
{
    const char *t = str_of(o, "type");
    return t ? t : "?";
}

static int is_type(const cJSON *o, const char *type)
{
    return cJSON_IsObject(o) && strcmp(type_of(o), type) == 0;
}

int bpe_sp_detect(const void *root_json, const void *model_json)
{
    const cJSON *root = root_json, *model = model_json;
    const cJSON *norm = cJSON_GetObjectItemCaseSensitive(root, "normalizer");
    const cJSON *pre = cJSON_GetObjectItemCaseSensitive(root, "pre_tokenizer");
    if (cJSON_IsTrue(cJSON_GetObjectItemCaseSensitive(model, "byte_fallback"))) return 1;
    /* a normalizer marks one unless the pre-tokenizer is ByteLevel's (a byte-level file with NFC:
     * refused as byte-level, naming the normalizer) */
    if (norm && !cJSON_IsNull(norm) && !is_type(pre, "ByteLevel")) return 1;
    if (is_type(pre, "Metaspace")) return 1;
    if (is_type(pre, "Sequence")) {
        const cJSON *e;
        cJSON_ArrayForEach(
            e, cJSON_GetObjectItemCaseSensitive(pre, "pretokenizers")) if (is_type(e, "Metaspace")) return 1;
    }
    return 0;
}

/* A String pattern's text (Regex patterns are refused). */
static int pattern_string(const cJSON *o, const char *what, const char *file, const char **out)
{
    const cJSON *pat = cJSON_GetObjectItemCaseSensitive(o, "pattern");
    const char *s = str_of(pat, "String");
    if (!s)
        return loom_error_set(LOOM_ERR_INPUT, "%s: %s Replace with a %s pattern is not supported (a String)",
                              file, what,
                              cJSON_GetObjectItemCaseSensitive(pat, "Regex") ? "Regex" : "missing");
    if (!*s) return loom_error_set(LOOM_ERR_INPUT, "%s: %s Replace with an empty pattern", file, what);
    *out = s;
    return LOOM_OK;
}

static int read_normalizer(struct bpe_sp *sp, const cJSON *n, const char *file)
{
    if (!n || cJSON_IsNull(n)) return LOOM_OK;
    if (is_type(n, "Sequence")) {
        const cJSON *e;
        cJSON_ArrayForEach(e, cJSON_GetObjectItemCaseSensitive(n, "normalizers"))
        {
            const int rc = read_normalizer(sp, e, file);
            if (rc) return rc;
        }
        return LOOM_OK;
    }
    if (sp->n_norms == BPE_MAX_NORMS)
        return loom_error_set(LOOM_ERR_INPUT, "%s: more than %d normalizers", file, BPE_MAX_NORMS);
    struct bpe_norm *x = &sp->norm[sp->n_norms];
    if (is_type(n, "Prepend")) {
        const char *s = str_of(n, "prepend");
        if (!s) return loom_error_set(LOOM_ERR_INPUT, "%s: normalizer Prepend has no \"prepend\" text", file);
        x->to = strdup(s);
    } else if (is_type(n, "Replace")) {
        const char *from, *to = str_of(n, "content");
        int rc = pattern_string(n, "normalizer", file, &from);
        if (rc) return rc;
        if (!to) return loom_error_set(LOOM_ERR_INPUT, "%s: normalizer Replace has no \"content\"", file);
        x->from = strdup(from);
        x->to = strdup(to);
    } else {
        return loom_error_set(LOOM_ERR_INPUT,
                              "%s: normalizer \"%s\" is not supported (Prepend, Replace, Sequence of them)",
                              file, type_of(n));
    }
    sp->n_norms++;
    return LOOM_OK;
}

static int read_replacement(const cJSON *o, const char *what, const char *file, char *out, size_t cap)
{
    const char *r = str_of(o, "replacement");
    if (!r || !*r || strlen(r) >= cap)
        return loom_error_set(LOOM_ERR_INPUT, "%s: %s Metaspace has no valid \"replacement\"", file, what);
    snprintf(out, cap, "%s", r);
    return LOOM_OK;
}

/* Metaspace's prepend rule: `prepend_scheme` (always, first, never), off
 * when the older `add_prefix_space` is false. */
static int read_prepend(const cJSON *o, const char *what, const char *file, enum bpe_prepend *out)
{
    const char *s = str_of(o, "prepend_scheme");
    *out = BPE_PREPEND_ALWAYS;
    if (s && strcmp(s, "first") == 0)
        *out = BPE_PREPEND_FIRST;
    else if (s && strcmp(s, "never") == 0)
        *out = BPE_PREPEND_NEVER;
    else if (s && strcmp(s, "always") != 0)
        return loom_error_set(LOOM_ERR_INPUT, "%s: %s Metaspace prepend_scheme \"%s\" is not known", file,
                              what, s);
    if (cJSON_IsFalse(cJSON_GetObjectItemCaseSensitive(o, "add_prefix_space"))) *out = BPE_PREPEND_NEVER;
    return LOOM_OK;
}

static int read_pre_tokenizer(struct bpe_sp *sp, const cJSON *p, const char *file)
{
    if (!p || cJSON_IsNull(p)) return LOOM_OK;
    if (is_type(p, "Sequence")) {
        const cJSON *list = cJSON_GetObjectItemCaseSensitive(p, "pretokenizers");
        if (cJSON_GetArraySize(list) == 1) return read_pre_tokenizer(sp, cJSON_GetArrayItem(list, 0), file);
    }
    if (!is_type(p, "Metaspace"))
        return loom_error_set(LOOM_ERR_INPUT,
                              "%s: pre_tokenizer \"%s\" is not supported with a SentencePiece-style model "
                              "(none, or Metaspace)",
                              file, type_of(p));
    int rc = read_replacement(p, "pre_tokenizer", file, sp->replacement, sizeof sp->replacement);
    if (!rc) rc = read_prepend(p, "pre_tokenizer", file, &sp->prepend);
    const cJSON *split = cJSON_GetObjectItemCaseSensitive(p, "split");
    sp->split = split ? cJSON_IsTrue(split) : 1;
    sp->metaspace = 1;
    return rc;
}

static int read_decoder(struct bpe_sp *sp, const cJSON *d, const char *file)
{
    if (!d || cJSON_IsNull(d)) return LOOM_OK;
    if (is_type(d, "Sequence")) {
        const cJSON *e;
        cJSON_ArrayForEach(e, cJSON_GetObjectItemCaseSensitive(d, "decoders"))
        {
            const int rc = read_decoder(sp, e, file);
            if (rc) return rc;
        }
        return LOOM_OK;
    }
    if (is_type(d, "ByteFallback")) {
        sp->dec_bytes = 1;
        return LOOM_OK;
    }
    if (is_type(d, "Fuse")) return LOOM_OK; /* loom's decoding joins the tokens */
    if (is_type(d, "Replace")) {
        const char *from, *to = str_of(d, "content");
        int rc = pattern_string(d, "decoder", file, &from);
        if (rc) return rc;
        if (!to || *sp->dec_from || strlen(from) >= sizeof sp->dec_from || strlen(to) >= sizeof sp->dec_to)
            return loom_error_set(
                LOOM_ERR_INPUT, "%s: decoder Replace is not supported here (one, of a short pattern)", file);
        snprintf(sp->dec_from, sizeof sp->dec_from, "%s", from);
        snprintf(sp->dec_to, sizeof sp->dec_to, "%s", to);
        return LOOM_OK;
    }
    if (is_type(d, "Strip")) {
        const cJSON *start = cJSON_GetObjectItemCaseSensitive(d, "start"),
                    *stop = cJSON_GetObjectItemCaseSensitive(d, "stop");
        const char *c = str_of(d, "content");
        if (!c || strcmp(c, " ") != 0 || !cJSON_IsNumber(start) || start->valueint < 0 ||
            (stop && (!cJSON_IsNumber(stop) || stop->valueint != 0)))
            return loom_error_set(
                LOOM_ERR_INPUT,
                "%s: decoder Strip is supported for leading spaces only (content \" \", stop 0)", file);
        sp->strip_lead = start->valueint > 64 ? 64 : sp->strip_lead + start->valueint;
        return LOOM_OK;
    }
    if (is_type(d, "Metaspace")) {
        enum bpe_prepend pre = BPE_PREPEND_ALWAYS;
        if (*sp->dec_from)
            return loom_error_set(LOOM_ERR_INPUT,
                                  "%s: decoder Metaspace after a Replace is not supported (one replacement)",
                                  file);
        int rc = read_replacement(d, "decoder", file, sp->dec_from, sizeof sp->dec_from);
        if (!rc) rc = read_prepend(d, "decoder", file, &pre);
        snprintf(sp->dec_to, sizeof sp->dec_to, " ");
        sp->dec_meta_first = pre != BPE_PREPEND_NEVER;
        return rc;
    }
    return loom_error_set(LOOM_ERR_INPUT,
                          "%s: decoder \"%s\" is not supported with a SentencePiece-style model (Replace, "
                          "ByteFallback, Fuse, Strip, Metaspace)",
                          file, type_of(d));
}

int bpe_sp_read(struct loom_bpe *t, const void *root_json, const void *model_json, const char *file)
{
    const cJSON *root = root_json, *model = model_json;
    struct bpe_sp *sp = &t->sp;
    sp->char_level = 1;
    sp->byte_fallback = cJSON_IsTrue(cJSON_GetObjectItemCaseSensitive(model, "byte_fallback"));
    sp->fuse_unk = cJSON_IsTrue(cJSON_GetObjectItemCaseSensitive(model, "fuse_unk"));
    sp->unk_id = -1;
    for (int i = 0; i < t->n_added; i++)
        if (t->added[i].normalized)
            return loom_error_set(
                LOOM_ERR_INPUT,
                "%s: added token \"%s\" is matched after normalization (normalized true): not "
                "supported with a SentencePiece-style model",
                file, t->added[i].content);
    int rc = read_normalizer(sp, cJSON_GetObjectItemCaseSensitive(root, "normalizer"), file);
    if (!rc) rc = read_pre_tokenizer(sp, cJSON_GetObjectItemCaseSensitive(root, "pre_tokenizer"), file);
    if (!rc) rc = read_decoder(sp, cJSON_GetObjectItemCaseSensitive(root, "decoder"), file);
    const char *unk = str_of(model, "unk_token");
    if (!rc && unk) {
        for (int32_t id = 0; id < t->n_ids && sp->unk_id < 0; id++)
            if (t->name[id] && strcmp(t->name[id], unk) == 0) sp->unk_id = id;
        if (sp->unk_id < 0)
            rc = loom_error_set(LOOM_ERR_INPUT, "%s: the unknown token \"%s\" is not in the vocabulary", file,
                                unk);
    }
    snprintf(t->describe, sizeof t->describe, "sentencepiece-bpe");
    return rc;
}

/* The byte of a <0xXX> name, or -1. */
static int byte_token(const char *name)
{
    static const char hex[] = "0123456789ABCDEF";
    if (strlen(name) != 6 || strncmp(name, "<0x", 3) != 0 || name[5] != '>') return -1;
    const char *hi = memchr(hex, name[3], 16), *lo = memchr(hex, name[4], 16);
    return hi && lo && name[3] && name[4] ? (int)((hi - hex) * 16 + (lo - hex)) : -1;
}

/* s with every `from` replaced by `to` (malloc'ed, length in *out_n). */
static char *replace_all(const char *s, size_t n, const char *from, const char *to, size_t *out_n)
{
    const size_t lf = strlen(from), lt = strlen(to);
    size_t count = 0;
    for (size_t i = 0; i + lf <= n; i++)
        if (memcmp(s + i, from, lf) == 0) count++, i += lf - 1;
    char *out = xrealloc(NULL, n + count * (lt > lf ? lt - lf : 0) + 1);
    size_t k = 0;
    for (size_t i = 0; i < n;) {
        if (i + lf <= n && memcmp(s + i, from, lf) == 0) {
            memcpy(out + k, to, lt);
            k += lt, i += lf;
        } else {
            out[k++] = s[i++];
        }
    }
    out[k] = 0;
    *out_n = k;
    return out;
}

void bpe_sp_index(struct loom_bpe *t)
{
    struct bpe_sp *sp = &t->sp;
    sp->dec = xrealloc(NULL, (size_t)t->n_ids * sizeof *sp->dec);
    sp->dec_len = xrealloc(NULL, (size_t)t->n_ids * sizeof *sp->dec_len);
    sp->is_byte = xrealloc(NULL, (size_t)t->n_ids);
    memset(sp->is_byte, 0, (size_t)t->n_ids);
    for (int b = 0; b < 256; b++) t->byte_id[b] = -1;
    for (int32_t id = 0; id < t->n_ids; id++) {
        sp->dec[id] = NULL, sp->dec_len[id] = 0;
        const char *name = t->name[id];
        if (!name) continue;
        const int b = t->is_added[id] ? -1 : byte_token(name);
        if (b >= 0 && sp->byte_fallback && t->byte_id[b] < 0) t->byte_id[b] = id;
        if (b >= 0 && sp->dec_bytes) {
            sp->is_byte[id] = 1;
            sp->dec[id] = xrealloc(NULL, 2);
            sp->dec[id][0] = (char)b, sp->dec[id][1] = 0;
            sp->dec_len[id] = 1;
        } else if (*sp->dec_from && !t->is_added[id]) {
            size_t len;
            sp->dec[id] = replace_all(name, strlen(name), sp->dec_from, sp->dec_to, &len);
            sp->dec_len[id] = (uint32_t)len;
        } else {
            sp->dec[id] = strdup(name);
            sp->dec_len[id] = (uint32_t)strlen(name);
        }
    }
}

void bpe_sp_free(struct loom_bpe *t)
{
    struct bpe_sp *sp = &t->sp;
    for (int i = 0; i < sp->n_norms; i++) {
        free(sp->norm[i].from);
        free(sp->norm[i].to);
    }
    if (sp->dec)
        for (int32_t id = 0; id < t->n_ids; id++) free(sp->dec[id]);
    free(sp->dec);
    free(sp->dec_len);
    free(sp->is_byte);
}

/* ---- encoding ------------------------------------------------------------------- */

static size_t char_len(const char *w, size_t n)
{
    const unsigned char b = (unsigned char)w[0];
    const size_t l = b < 0x80 ? 1 : b < 0xE0 ? 2 : b < 0xF0 ? 3 : 4;
    return l < n ? l : n; /* the text is valid UTF-8 (repaired before) */
}

size_t bpe_sp_symbols(const struct loom_bpe *t, const char *w, size_t n, int32_t *sym)
{
    const struct bpe_sp *sp = &t->sp;
    size_t m = 0;
    int unk = 0; /* an unknown token waiting (fuse_unk gathers a run) */
    for (size_t i = 0; i < n;) {
        const size_t l = char_len(w + i, n - i);
        const int32_t id = bpe_vocab_find(t, w + i, l);
        if (id >= 0) {
            if (unk) sym[m++] = sp->unk_id, unk = 0;
            sym[m++] = id;
        } else {
            int fallback = sp->byte_fallback;
            for (size_t k = 0; k < l && fallback; k++) fallback = t->byte_id[(uint8_t)w[i + k]] >= 0;
            if (fallback) { /* `tokenizers` leaves a waiting unknown token for after these */
                for (size_t k = 0; k < l; k++) sym[m++] = t->byte_id[(uint8_t)w[i + k]];
            } else if (sp->unk_id >= 0) {
                if (unk && !sp->fuse_unk) sym[m++] = sp->unk_id;
                unk = 1;
            }
        }
        i += l;
    }
    if (unk) sym[m++] = sp->unk_id;
    return m;
}

/* p[0, n) normalized (malloc'ed, length in *out_n). */
static char *normalize(const struct bpe_sp *sp, const char *p, size_t n, size_t *out_n)
{
    char *s = xrealloc(NULL, n + 1);
    memcpy(s, p, n);
    s[n] = 0;
    for (int i = 0; i < sp->n_norms; i++) {
        const struct bpe_norm *x = &sp->norm[i];
        char *next;
        if (x->from) {
            next = replace_all(s, n, x->from, x->to, &n);
        } else {
            if (!n) continue; /* Prepend leaves an empty text empty */
            const size_t lt = strlen(x->to);
            next = xrealloc(NULL, n + lt + 1);
            memcpy(next, x->to, lt);
            memcpy(next + lt, s, n + 1);
            n += lt;
        }
        free(s);
        s = next;
    }
    *out_n = n;
    return s;
}

void bpe_sp_segment(const struct loom_bpe *t, struct loom_bpe_state *s, const char *p, size_t n, int first,
                    struct loom_ids *out)
{
    const struct bpe_sp *sp = &t->sp;
    if (!n) return;
    size_t len;
    char *text = normalize(sp, p, n, &len);
    if (sp->metaspace) {
        size_t m;
        char *r = replace_all(text, len, " ", sp->replacement, &m);
        free(text);
        text = r, len = m;
        const size_t lr = strlen(sp->replacement);
        const int prepend = sp->prepend == BPE_PREPEND_ALWAYS || (sp->prepend == BPE_PREPEND_FIRST && first);
        if (prepend && !(len >= lr && memcmp(text, sp->replacement, lr) == 0)) {
            char *q = xrealloc(NULL, len + lr + 1);
            memcpy(q, sp->replacement, lr);
            memcpy(q + lr, text, len + 1);
            free(text);
            text = q, len += lr;
        }
        if (sp->split) { /* a piece begins at each replacement */
            size_t b = 0;
            for (size_t i = 1; i + lr <= len; i++)
                if (memcmp(text + i, sp->replacement, lr) == 0) {
                    bpe_merge_piece(t, s, text + b, i - b, out);
                    b = i;
                    i += lr - 1;
                }
            bpe_merge_piece(t, s, text + b, len - b, out);
            free(text);
            return;
        }
    }
    bpe_merge_piece(t, s, text, len, out);
    free(text);
}

/* ---- decoding ------------------------------------------------------------------- */

size_t bpe_sp_decode(const struct loom_bpe *t, const int32_t *ids, size_t n, char *out, size_t cap)
{
    const struct bpe_sp *sp = &t->sp;
    size_t raw_n = 0;
    for (size_t i = 0; i < n; i++)
        raw_n += ids[i] >= 0 && ids[i] < t->n_ids && sp->dec[ids[i]] ? 3 * (size_t)sp->dec_len[ids[i]] : 16;
    char *raw = xrealloc(NULL, raw_n + 1);
    size_t k = 0;
    int first = 1; /* no token decoded yet */
    for (size_t i = 0; i < n;) {
        const int32_t id = ids[i];
        if (id < 0 || id >= t->n_ids || !sp->dec[id]) {
            i++; /* no such token */
        } else if (sp->is_byte[id]) {
            first = 0; /* a run of byte tokens: its text when valid UTF-8, else U+FFFD a byte
                        */
            size_t e = i, at = k;
            while (e < n && ids[e] >= 0 && ids[e] < t->n_ids && sp->is_byte[ids[e]])
                raw[k++] = sp->dec[ids[e++]][0];
            uint32_t cp;
            int valid = 1;
            for (size_t j = at; j < k && valid;) {
                const size_t l = bpe_utf8_valid_len((const unsigned char *)raw + j, k - j, &cp);
                valid = l > 0;
                j += l;
            }
            if (!valid) {
                const size_t bytes = k - at;
                for (size_t j = 0; j < bytes; j++) memcpy(raw + at + 3 * j, "\xEF\xBF\xBD", 3);
                k = at + 3 * bytes;
            }
            i = e;
        } else if (sp->dec_meta_first && first) { /* every replacement of the first token dropped */
            first = 0;
            for (uint32_t j = 0; j < sp->dec_len[id]; j++)
                if (sp->dec[id][j] != ' ') raw[k++] = sp->dec[id][j];
            i++;
        } else {
            memcpy(raw + k, sp->dec[id], sp->dec_len[id]);
            k += sp->dec_len[id];
            i++;
            first = 0;
        }
    }
    size_t from = 0;
    for (int j = 0; j < sp->strip_lead && from < k && raw[from] == ' '; j++) from++;
    const size_t len = k - from;
    if (cap) {
        const size_t m = len < cap - 1 ? len : cap - 1;
        memcpy(out, raw + from, m);
        out[m] = 0;
    }
    free(raw);
    return len;
}
