/* JSON values' extents by quotes and brackets (see json_span.h). */
#include "io/json_span.h"

#include <stddef.h>
#include <stdint.h>

const char *loom_json_space(const char *p, const char *e)
{
    while (p < e && (*p == ' ' || *p == '\t' || *p == '\n' || *p == '\r')) p++;
    return p;
}

const char *loom_json_string_end(const char *p, const char *e)
{
    for (p++; p < e; p++) {
        if (*p == '\\')
            p++;
        else if (*p == '"')
            return p + 1;
    }
    return NULL;
}

const char *loom_json_value_end(const char *p, const char *e)
{
    if (p >= e) return NULL;
    if (*p == '"') return loom_json_string_end(p, e);
    if (*p == '{' || *p == '[') {
        int64_t depth = 0;
        while (p < e) {
            if (*p == '"') {
                if (!(p = loom_json_string_end(p, e))) return NULL;
                continue;
            }
            if (*p == '{' || *p == '[') depth++;
            if ((*p == '}' || *p == ']') && --depth == 0) return p + 1;
            p++;
        }
        return NULL;
    }
    /* a number or a literal (true, false, null): nothing else is a value */
    const char *q = p;
    while (q < e && ((*q >= '0' && *q <= '9') || (*q >= 'a' && *q <= 'z') || *q == '-' || *q == '+' ||
                     *q == '.' || *q == 'E'))
        q++;
    return q > p ? q : NULL;
}
