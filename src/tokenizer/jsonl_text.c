/*
 * A JSON object's string value with its NULs (see jsonl_text.h): the
 * object's members scanned at the top level, values skipped by their
 * brackets and quotes, and the one string decoded (escapes, \uXXXX with
 * surrogate pairs, to UTF-8). Not a validating parser: cJSON has already
 * accepted the line.
 */
#include "tokenizer/jsonl_text.h"

#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "base/log.h"
#include "io/json_span.h"

static uint32_t hex4(const char *p)
{
    uint32_t v = 0;
    for (int i = 0; i < 4; i++) {
        const char c = p[i];
        v = v << 4 | (uint32_t)(c >= '0' && c <= '9'   ? c - '0'
                                : c >= 'a' && c <= 'f' ? c - 'a' + 10
                                                       : c - 'A' + 10);
    }
    return v;
}

static size_t put_utf8(char *o, uint32_t cp)
{
    if (cp < 0x80) {
        o[0] = (char)cp;
        return 1;
    }
    if (cp < 0x800) {
        o[0] = (char)(0xc0 | cp >> 6), o[1] = (char)(0x80 | (cp & 0x3f));
        return 2;
    }
    if (cp < 0x10000) {
        o[0] = (char)(0xe0 | cp >> 12), o[1] = (char)(0x80 | (cp >> 6 & 0x3f)),
        o[2] = (char)(0x80 | (cp & 0x3f));
        return 3;
    }
    o[0] = (char)(0xf0 | cp >> 18), o[1] = (char)(0x80 | (cp >> 12 & 0x3f));
    o[2] = (char)(0x80 | (cp >> 6 & 0x3f)), o[3] = (char)(0x80 | (cp & 0x3f));
    return 4;
}

/* The string whose opening quote is at p, decoded into out (room for as
 * many bytes as the raw string has: decoding never lengthens); returns
 * the decoded length. */
static size_t decode(const char *p, const char *e, char *out)
{
    size_t n = 0;
    for (p++; p < e && *p != '"'; p++) {
        if (*p != '\\') {
            out[n++] = *p;
            continue;
        }
        if (++p >= e) break;
        switch (*p) {
        case 'b':
            out[n++] = '\b';
            break;
        case 'f':
            out[n++] = '\f';
            break;
        case 'n':
            out[n++] = '\n';
            break;
        case 'r':
            out[n++] = '\r';
            break;
        case 't':
            out[n++] = '\t';
            break;
        case 'u': {
            if (e - p < 5) return n;
            uint32_t cp = hex4(p + 1);
            p += 4;
            if (cp >= 0xd800 && cp <= 0xdbff && e - p >= 7 && p[1] == '\\' && p[2] == 'u') {
                const uint32_t lo = hex4(p + 3);
                if (lo >= 0xdc00 && lo <= 0xdfff) {
                    cp = 0x10000 + ((cp - 0xd800) << 10) + (lo - 0xdc00);
                    p += 6;
                }
            }
            n += put_utf8(out + n, cp);
            break;
        }
        default:
            out[n++] = *p; /* \" \\ \/ */
        }
    }
    return n;
}

int loom_jsonl_text(const char *line, size_t n, const char *key, char **out, size_t *len)
{
    const char *p = line, *e = line + n;
    const size_t klen = strlen(key);
    *out = NULL, *len = 0;
    p = loom_json_space(p, e);
    if (p == e || *p != '{') return -1;
    p = loom_json_space(p + 1, e);
    while (p < e && *p == '"') {
        const char *k = p;
        if (!(p = loom_json_string_end(p, e))) return -1;
        char *name = malloc((size_t)(p - k) + 1);
        if (!name) loom_die("out of memory reading a JSON line");
        const size_t nlen = decode(k, p, name);
        const int match = nlen == klen && memcmp(name, key, klen) == 0;
        free(name);
        p = loom_json_space(p, e);
        if (p < e && *p == ':') p = loom_json_space(p + 1, e);
        if (match) {
            if (p == e || *p != '"') return -1;
            const char *v = p;
            if (!(p = loom_json_string_end(p, e))) return -1;
            *out = malloc((size_t)(p - v) + 1);
            if (!*out) loom_die("out of memory reading a JSON line");
            *len = decode(v, p, *out);
            (*out)[*len] = 0;
            return 0;
        }
        if (!(p = loom_json_value_end(p, e))) return -1;
        p = loom_json_space(p, e);
        if (p < e && *p == ',') p = loom_json_space(p + 1, e);
    }
    return -1;
}
