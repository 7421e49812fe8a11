/*
 * The tokenizer tests' driver: `bpe_tool encode TOKENIZER < lines.jsonl`
 * reads one JSON string per line and prints its ids as a JSON list per line;
 * `bpe_tool decode TOKENIZER < ids.jsonl` reads a JSON list of ids per line
 * and prints the text as a JSON string per line; `bpe_tool save TOKENIZER
 * DIR` writes DIR/tokenizer.json. TOKENIZER is anything loom_tokenizer_load
 * reads (a tokenizer.model too; save: a byte-level tokenizer). Not a user
 * command: `loom data` is.
 */
#include <cJSON.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "loom/loom.h"
#include "tokenizer/bpe.h"
#include "tokenizer/tokenizer.h"

static char *read_line(FILE *f)
{
    size_t cap = 0;
    char *line = NULL;
    ssize_t n = getline(&line, &cap, f);
    if (n < 0) {
        free(line);
        return NULL;
    }
    return line;
}

int main(int argc, char **argv)
{
    if (argc < 3) {
        fprintf(stderr, "usage: bpe_tool encode|decode TOKENIZER, bpe_tool save TOKENIZER DIR\n");
        return 2;
    }
    if (strcmp(argv[1], "save") == 0 && argc == 4) {
        struct loom_bpe *b;
        int rc = loom_bpe_load(argv[2], &b);
        if (!rc) rc = loom_bpe_save(b, argv[3]);
        if (rc) fprintf(stderr, "loom: error: %s\n", loom_error_message());
        loom_bpe_free(b);
        return rc ? 2 : 0;
    }
    struct loom_tokenizer *t;
    if (loom_tokenizer_load(argv[2], NULL, &t)) {
        fprintf(stderr, "loom: error: %s\n", loom_error_message());
        return 2;
    }
    struct loom_tokenizer_state *s = loom_tokenizer_state_new(t);
    char *line;
    while ((line = read_line(stdin))) {
        cJSON *j = cJSON_Parse(line);
        free(line);
        if (!j) return 2;
        if (strcmp(argv[1], "encode") == 0) {
            /* the text's bytes: JSON strings hold code points; \u00XX escapes above 0x7F are not used */
            struct loom_ids ids = {0};
            loom_tokenizer_encode(t, s, j->valuestring, strlen(j->valuestring), &ids);
            putchar('[');
            for (size_t i = 0; i < ids.n; i++) printf(i ? ",%d" : "%d", ids.ids[i]);
            printf("]\n");
            loom_ids_free(&ids);
        } else {
            const int n = cJSON_GetArraySize(j);
            int32_t *ids = malloc((size_t)(n ? n : 1) * sizeof *ids);
            for (int i = 0; i < n; i++) ids[i] = cJSON_GetArrayItem(j, i)->valueint;
            size_t len = loom_tokenizer_decode(t, ids, (size_t)n, NULL, 0);
            char *out = malloc(len + 1);
            loom_tokenizer_decode(t, ids, (size_t)n, out, len + 1);
            /* a JSON string of all len bytes (NUL included: a decoded byte 0) */
            putchar('"');
            for (size_t i = 0; i < len; i++) {
                const unsigned char c = (unsigned char)out[i];
                if (c == '"' || c == '\\')
                    printf("\\%c", c);
                else if (c < 0x20)
                    printf("\\u%04x", c);
                else
                    putchar(c);
            }
            printf("\"\n");
            free(out);
            free(ids);
        }
        cJSON_Delete(j);
    }
    loom_tokenizer_state_free(s);
    loom_tokenizer_free(t);
    return 0;
}
