/*
 * llm.c's facts beyond the model carried through a safetensors file
 * (llmc_extra.h).
 */
#include "model/llmc_extra.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/log.h"
#include "base/mem.h"
#include "io/safetensors.h"
#include "model/hf_decoder.h"

int loom_llmc_extra_save(const char *path, struct loom_model *model, const struct loom_llmc_extra *extra,
                         int dir, int64_t max_shard_bytes)
{
    const struct loom_decoder *m = loom_decoder_of(model);
    char version[16], vp[16];
    const char *meta[4];
    int nmeta = 0;
    struct loom_st_tensor_in pad = {0};
    int npad = 0;
    if (extra && extra->version) {
        snprintf(version, sizeof version, "%d", extra->version);
        meta[2 * nmeta] = "loom.llmc.version";
        meta[2 * nmeta++ + 1] = version;
    }
    if (extra && extra->padded_vocab) {
        if (extra->padded_vocab < m->spec.vocab)
            return loom_error_set(LOOM_ERR_INPUT, "%s: padded vocabulary %d is below the vocabulary %d", path,
                                  extra->padded_vocab, m->spec.vocab);
        snprintf(vp, sizeof vp, "%d", extra->padded_vocab);
        meta[2 * nmeta] = "loom.llmc.padded_vocab_size";
        meta[2 * nmeta++ + 1] = vp;
        if (extra->wte_padding && extra->padded_vocab > m->spec.vocab) {
            pad = (struct loom_st_tensor_in){.name = "llmc.wte_padding",
                                             .dtype = LOOM_DTYPE_F32,
                                             .ndim = 2,
                                             .shape = {extra->padded_vocab - m->spec.vocab, m->spec.hidden},
                                             .data = extra->wte_padding};
            npad = 1;
        }
    }
    const struct loom_hf_extra x = {.tensors = &pad,
                                    .ntensors = npad,
                                    .meta = meta,
                                    .nmeta = nmeta,
                                    .max_shard_bytes = dir ? max_shard_bytes : 0};
    return dir ? loom_hf_save_dir(model, path, &x) : loom_hf_save_ext(model, path, &x);
}

static int meta_int(const struct loom_st *st, const char *key, int64_t lo, int64_t hi, int *out)
{
    const char *v = loom_st_meta(st, key);
    *out = 0;
    if (!v) return LOOM_OK;
    char *end;
    errno = 0;
    long long x = strtoll(v, &end, 10);
    if (end == v || *end || errno || x < lo || x > hi)
        return loom_error_set(LOOM_ERR_INPUT, "%s: metadata %s is '%s', expected an integer in %lld..%lld",
                              st->path, key, v, (long long)lo, (long long)hi);
    *out = (int)x;
    return LOOM_OK;
}

int loom_llmc_extra_load(const char *path, const struct loom_decoder *m, struct loom_llmc_extra *extra)
{
    memset(extra, 0, sizeof *extra);
    struct loom_st st;
    int rc = loom_st_open(&st, path);
    if (rc) return rc;
    if ((rc = meta_int(&st, "loom.llmc.version", LOOM_LLMC_VERSION_F32, LOOM_LLMC_VERSION_BF16,
                       &extra->version)))
        goto fail;
    if (extra->version != 0 && extra->version != LOOM_LLMC_VERSION_F32 &&
        extra->version != LOOM_LLMC_VERSION_BF16) {
        rc = loom_error_set(LOOM_ERR_INPUT, "%s: metadata loom.llmc.version is %d, expected 3 or 5", path,
                            extra->version);
        goto fail;
    }
    if ((rc = meta_int(&st, "loom.llmc.padded_vocab_size", m->spec.vocab, LOOM_LLMC_MAX_VOCAB,
                       &extra->padded_vocab)))
        goto fail;
    const struct loom_st_tensor *t = loom_st_find(&st, "llmc.wte_padding");
    if (t) {
        const int64_t rows = (int64_t)extra->padded_vocab - m->spec.vocab;
        if (!extra->padded_vocab || t->ndim != 2 || t->shape[0] != rows || t->shape[1] != m->spec.hidden) {
            rc = loom_error_set(LOOM_ERR_INPUT,
                                "%s: tensor llmc.wte_padding does not match loom.llmc.padded_vocab_size %d "
                                "(expected shape [%lld, %d])",
                                path, extra->padded_vocab, (long long)rows, m->spec.hidden);
            goto fail;
        }
        if (rows > 0) {
            extra->wte_padding = loom_alloc(loom_mul_size(t->numel, sizeof(float)), LOOM_MEM_PARAMS);
            if ((rc = loom_st_read_f32(t, extra->wte_padding, t->numel))) goto fail;
        }
    }
    loom_st_close(&st);
    return LOOM_OK;
fail:
    loom_st_close(&st);
    loom_llmc_extra_free(extra);
    return rc;
}
