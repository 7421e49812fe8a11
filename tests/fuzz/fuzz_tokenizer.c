// clang-format off
/*
 * libFuzzer target for the byte-level BPE tokenizer (src/tokenizer): an
 * input is a tokenizer.json text, a NUL byte, then text to encode. The file
 * must either load or be refused with LOOM_ERR_INPUT and a one-line
 * message; a loaded tokenizer encodes the text into ids below its
 * vocabulary size, decodes any ids (the encoded ones, and the input bytes
 * taken as ids) into valid UTF-8 of the length it announced, and, having no
 * added tokens and no prefix space, decodes the encoded ids back to the
 * text (with invalid UTF-8 replaced): byte-level BPE loses nothing. A
 * broken promise aborts, which libFuzzer reports with the input.
 *
 * The fuzz-sources line is read whole by the Makefile: formatting is off here.
 *
 * fuzz-sources: src/tokenizer/bpe.c src/tokenizer/bytes.c src/tokenizer/bpe_json.c src/tokenizer/sp_bpe.c src/io/fs.c src/base/log.c src/base/mem.c
 * fuzz-libs: -lcjson -lpcre2-8 -lxxhash
 */
// clang-format on
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "base/log.h"
#include "loom/loom.h"
#include "tokenizer/bpe.h"
#include "tokenizer/bpe_impl.h"

#define REQUIRE(cond)                                                                                        \
    do {                                                                                                     \
        if (!(cond)) {                                                                                       \
            fprintf(stderr, "fuzz_tokenizer: broken promise at line %d: %s\n", __LINE__, #cond);             \
            abort();                                                                                         \
        }                                                                                                    \
    } while (0)

static int valid_utf8(const char *s, size_t n)
{
    size_t fixed_n;
    char *fixed = loom_utf8_repair(s, n, &fixed_n);
    free(fixed);
    return fixed == NULL;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    const uint8_t *nul = memchr(data, 0, size);
    const size_t json_n = nul ? (size_t)(nul - data) : size;
    const char *text = nul ? (const char *)nul + 1 : "";
    const size_t text_n = nul ? size - json_n - 1 : 0;
    char path[64];
    snprintf(path, sizeof path, "/tmp/fuzz_tokenizer.%d.json", (int)getpid());
    FILE *f = fopen(path, "wb");
    REQUIRE(f);
    fwrite(data, 1, json_n, f);
    fclose(f);
    struct loom_bpe *t;
    loom_error_clear();
    const int rc = loom_bpe_load(path, &t);
    if (rc) {
        REQUIRE(rc == LOOM_ERR_INPUT);
        const char *msg = loom_error_message();
        REQUIRE(*msg && !strchr(msg, '\n'));
        unlink(path);
        return 0;
    }
    unlink(path);
    struct loom_bpe_state *s = loom_bpe_state_new(t);
    struct loom_ids ids = {0};
    loom_bpe_encode(t, s, text, text_n, &ids);
    for (size_t i = 0; i < ids.n; i++) REQUIRE(ids.ids[i] >= 0 && ids.ids[i] < loom_bpe_vocab_size(t));
    const size_t len = loom_bpe_decode(t, ids.ids, ids.n, NULL, 0);
    char *out = malloc(len + 1);
    REQUIRE(out && loom_bpe_decode(t, ids.ids, ids.n, out, len + 1) == len);
    REQUIRE(valid_utf8(out, len));
    int plain = t->n_added == 0;
    for (int i = 0; i < t->n_steps; i++) plain &= !t->step[i].prefix_space;
    if (plain) {
        size_t want_n;
        char *want = loom_utf8_repair(text, text_n, &want_n);
        REQUIRE(len == (want ? want_n : text_n) && memcmp(out, want ? want : text, len) == 0);
        free(want);
    }
    free(out);
    /* any ids, in and out of range */
    int32_t raw[64];
    size_t nraw = 0;
    for (size_t i = 0; i + 2 <= text_n && nraw < 64; i += 2)
        raw[nraw++] = (int32_t)(((unsigned char)text[i] << 8 | (unsigned char)text[i + 1]) - 64);
    const size_t rlen = loom_bpe_decode(t, raw, nraw, NULL, 0);
    char *rout = malloc(rlen + 1);
    REQUIRE(rout && loom_bpe_decode(t, raw, nraw, rout, rlen + 1) == rlen && valid_utf8(rout, rlen));
    free(rout);
    loom_ids_free(&ids);
    loom_bpe_state_free(s);
    loom_bpe_free(t);
    return 0;
}
