/*
 * SentencePiece models through libsentencepiece (spm.h). The library is
 * C++; spm_lib.cc is its C face, compiled where the library is.
 */
#include "tokenizer/spm.h"

#include <stdlib.h>
#include <string.h>

#include "base/log.h"
#include "base/mem.h"
#include "io/fs.h"
#include "loom/loom.h"

#ifdef LOOM_HAVE_SPM
#include "tokenizer/spm_lib.h"

struct loom_spm {
    struct spm_lib *lib;
    int32_t n;
    char **text; /* (n) what each id adds to a streamed text */
    uint32_t *text_len;
};

int loom_spm_load(const char *path, struct loom_spm **out)
{
    char *bytes, err[512];
    size_t len;
    int rc = loom_fs_read_small(path, (size_t)1 << 30, &bytes, &len);
    if (rc) return rc;
    struct spm_lib *lib = len ? spm_lib_load(bytes, len, err, sizeof err) : NULL;
    loom_free(bytes);
    if (!len) snprintf(err, sizeof err, "the file is empty");
    if (!lib) /* the library's message names its own source lines: kept short */
        return loom_error_set(LOOM_ERR_INPUT, "%s: not a SentencePiece model (%s)", path,
                              strstr(err, "Parse") ? "not a serialized ModelProto" : err);
    struct loom_spm *m = calloc(1, sizeof *m);
    if (!m) loom_die("out of memory loading a tokenizer");
    m->lib = lib;
    m->n = spm_lib_size(lib);
    m->text = calloc((size_t)m->n, sizeof *m->text);
    m->text_len = calloc((size_t)m->n, sizeof *m->text_len);
    if (!m->text || !m->text_len) loom_die("out of memory loading a tokenizer");
    for (int32_t id = 0; id < m->n; id++) {
        size_t pl;
        const char *p = spm_lib_piece(lib, id, &pl);
        const int kind = spm_lib_kind(lib, id);
        char *t = malloc(pl + 1);
        if (!t) loom_die("out of memory loading a tokenizer");
        size_t k = 0;
        if (kind == SPM_LIB_BYTE && pl == 6) { /* <0xXX> */
            t[k++] = (char)strtol(p + 3, NULL, 16);
        } else if (kind != SPM_LIB_CONTROL) {
            for (size_t i = 0; i < pl;)
                if (i + 3 <= pl && memcmp(p + i, "\xE2\x96\x81", 3) == 0)
                    t[k++] = ' ', i += 3;
                else
                    t[k++] = p[i++];
        }
        t[k] = 0;
        m->text[id] = t;
        m->text_len[id] = (uint32_t)k;
    }
    *out = m;
    return LOOM_OK;
}

void loom_spm_free(struct loom_spm *m)
{
    if (!m) return;
    for (int32_t id = 0; id < m->n; id++) free(m->text[id]);
    free(m->text);
    free(m->text_len);
    spm_lib_free(m->lib);
    free(m);
}

int32_t loom_spm_vocab_size(const struct loom_spm *m)
{
    return m->n;
}

int32_t loom_spm_bos(const struct loom_spm *m)
{
    return spm_lib_special(m->lib, SPM_LIB_BOS);
}

int32_t loom_spm_eos(const struct loom_spm *m)
{
    return spm_lib_special(m->lib, SPM_LIB_EOS);
}

int32_t loom_spm_pad(const struct loom_spm *m)
{
    return spm_lib_special(m->lib, SPM_LIB_PAD);
}

const char *loom_spm_piece(const struct loom_spm *m, int32_t id)
{
    size_t len;
    return id >= 0 && id < m->n ? spm_lib_piece(m->lib, id, &len) : NULL;
}

void loom_spm_encode(const struct loom_spm *m, const char *text, size_t n, struct loom_ids *out)
{
    int32_t *ids;
    size_t k;
    if (spm_lib_encode(m->lib, text, n, &ids, &k) != 0)
        loom_die("the SentencePiece library failed to encode a text of %zu bytes", n);
    for (size_t i = 0; i < k; i++) loom_ids_push(out, ids[i]);
    free(ids);
}

size_t loom_spm_decode(const struct loom_spm *m, const int32_t *ids, size_t n, char *out, size_t cap)
{
    /* ids outside the vocabulary are written "<id>", as loom_bpe_decode does; the rest the library's */
    size_t len = 0, total = 0, at = 0;
    char *text = NULL;
    for (size_t i = 0; i <= n; i++) {
        if (i < n && ids[i] >= 0 && ids[i] < m->n) continue;
        if (i > at) {
            text = spm_lib_decode(m->lib, ids + at, i - at, &len);
            if (!text) loom_die("the SentencePiece library failed to decode %zu ids", i - at);
        } else {
            len = 0;
        }
        char bad[16] = "";
        const int nb = i < n ? snprintf(bad, sizeof bad, "<%d>", ids[i]) : 0;
        for (int part = 0; part < 2; part++) {
            const char *src = part ? bad : text;
            const size_t l = part ? (size_t)nb : len;
            if (l && cap && total < cap - 1) {
                const size_t c = l < cap - 1 - total ? l : cap - 1 - total;
                memcpy(out + total, src, c);
            }
            total += l;
        }
        free(text);
        text = NULL;
        at = i + 1;
    }
    if (cap) out[total < cap - 1 ? total : cap - 1] = 0;
    return total;
}

const char *loom_spm_token_bytes(const struct loom_spm *m, int32_t id, size_t *len)
{
    if (id < 0 || id >= m->n) return NULL;
    *len = m->text_len[id];
    return m->text[id];
}

#else /* built without libsentencepiece */

struct loom_spm {
    int unused;
};

int loom_spm_load(const char *path, struct loom_spm **out)
{
    *out = NULL;
    return loom_error_set(LOOM_ERR_INPUT,
                          "%s: a SentencePiece model, and this loom was built without libsentencepiece "
                          "(scripts/install-deps.sh installs it; then make)",
                          path);
}

void loom_spm_free(struct loom_spm *m)
{
    (void)m;
}
int32_t loom_spm_vocab_size(const struct loom_spm *m)
{
    (void)m;
    return 0;
}
int32_t loom_spm_bos(const struct loom_spm *m)
{
    (void)m;
    return -1;
}
int32_t loom_spm_eos(const struct loom_spm *m)
{
    (void)m;
    return -1;
}
int32_t loom_spm_pad(const struct loom_spm *m)
{
    (void)m;
    return -1;
}
const char *loom_spm_piece(const struct loom_spm *m, int32_t id)
{
    (void)m, (void)id;
    return NULL;
}
void loom_spm_encode(const struct loom_spm *m, const char *text, size_t n, struct loom_ids *out)
{
    (void)m, (void)text, (void)n, (void)out;
}
size_t loom_spm_decode(const struct loom_spm *m, const int32_t *ids, size_t n, char *out, size_t cap)
{
    (void)m, (void)ids, (void)n;
    if (cap) *out = 0;
    return 0;
}
const char *loom_spm_token_bytes(const struct loom_spm *m, int32_t id, size_t *len)
{
    (void)m, (void)id, (void)len;
    return NULL;
}
#endif
