/*
 * llm.c's GPT-2 checkpoint format in and out (see gpt2_llmc.h). One table
 * lists llm.c's parameter kinds in file order with the loom tensor each maps
 * to; reading and writing walk the same table, so the two cannot disagree
 * on the order. The file is mapped read-only and checked in full (header
 * fields, then the exact size) before any parameter is touched. Little-endian
 * hosts only, as llm.c itself.
 */
#include "model/gpt2_llmc.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "base/log.h"
#include "base/mem.h"
#include "io/fs.h"
#include "io/safetensors.h"
#include "io/shard.h"
#include "model/gpt2_io.h"

/* Bounds on the header fields: generous for any GPT-2, small enough that
 * every size below fits in 64 bits without overflow. */
#define MAX_POSITIONS (1 << 20)
#define MAX_VOCAB (1 << 24)
#define MAX_LAYERS (1 << 12)
#define MAX_CHANNELS (1 << 16)

/* Header slots (int32 indices). */
enum {
    H_MAGIC = 0,
    H_VERSION = 1,
    H_MAX_T = 2,
    H_VOCAB = 3,
    H_LAYERS = 4,
    H_HEADS = 5,
    H_CHANNELS = 6,
    H_PADDED_VOCAB = 7,
    H_USED = 8, /* slots past this one are zero */
};

/* The sizes a header describes. */
struct llmc_dims {
    int64_t maxT, V, Vp, L, NH, C;
};

/* Letters of llm.c's shapes. */
enum llmc_dim { D_ONE = 0, D_C = 1, D_3C = 2, D_4C = 3, D_VP = 4, D_MAXT = 5 };

/* llm.c's parameter kinds in file order. Each is [rows, cols] per layer in
 * llm.c (cols D_ONE for a vector); transpose marks a Linear weight stored
 * [out, in] there and [in, out] in loom. */
static const struct llmc_kind {
    const char *name; /* llm.c's ParameterTensors field */
    const char *loom; /* loom's tensor; %d is the layer */
    int per_layer;
    enum llmc_dim rows, cols;
    int transpose;
} kinds[] = {
    {"wte", "wte.weight", 0, D_VP, D_C, 0},
    {"wpe", "wpe.weight", 0, D_MAXT, D_C, 0},
    {"ln1w", "h.%d.ln_1.weight", 1, D_C, D_ONE, 0},
    {"ln1b", "h.%d.ln_1.bias", 1, D_C, D_ONE, 0},
    {"qkvw", "h.%d.attn.c_attn.weight", 1, D_3C, D_C, 1},
    {"qkvb", "h.%d.attn.c_attn.bias", 1, D_3C, D_ONE, 0},
    {"attprojw", "h.%d.attn.c_proj.weight", 1, D_C, D_C, 1},
    {"attprojb", "h.%d.attn.c_proj.bias", 1, D_C, D_ONE, 0},
    {"ln2w", "h.%d.ln_2.weight", 1, D_C, D_ONE, 0},
    {"ln2b", "h.%d.ln_2.bias", 1, D_C, D_ONE, 0},
    {"fcw", "h.%d.mlp.c_fc.weight", 1, D_4C, D_C, 1},
    {"fcb", "h.%d.mlp.c_fc.bias", 1, D_4C, D_ONE, 0},
    {"fcprojw", "h.%d.mlp.c_proj.weight", 1, D_C, D_4C, 1},
    {"fcprojb", "h.%d.mlp.c_proj.bias", 1, D_C, D_ONE, 0},
    {"lnfw", "ln_f.weight", 0, D_C, D_ONE, 0},
    {"lnfb", "ln_f.bias", 0, D_C, D_ONE, 0},
};
#define NUM_KINDS ((int)(sizeof kinds / sizeof kinds[0]))

static int64_t dim_value(const struct llmc_dims *d, enum llmc_dim x)
{
    switch (x) {
    case D_ONE:
        return 1;
    case D_C:
        return d->C;
    case D_3C:
        return 3 * d->C;
    case D_4C:
        return 4 * d->C;
    case D_VP:
        return d->Vp;
    case D_MAXT:
        return d->maxT;
    }
    LOOM_ASSERT(0);
    return 0;
}

/* Elements of all the parameters, padding rows included. */
static uint64_t llmc_numel(const struct llmc_dims *d)
{
    uint64_t n = 0;
    for (int k = 0; k < NUM_KINDS; k++)
        n += (uint64_t)dim_value(d, kinds[k].rows) * (uint64_t)dim_value(d, kinds[k].cols) *
             (uint64_t)(kinds[k].per_layer ? d->L : 1);
    return n;
}

static size_t elem_size(int version)
{
    return version == LOOM_LLMC_VERSION_BF16 ? 2 : 4;
}

static float bf16_to_f32(uint16_t h)
{
    uint32_t u = (uint32_t)h << 16;
    float f;
    memcpy(&f, &u, sizeof f);
    return f;
}

/* Round to nearest even; a NaN stays a NaN (its upper bits kept). Exact for
 * every value that came from bfloat16. */
static uint16_t f32_to_bf16(float f)
{
    uint32_t u;
    memcpy(&u, &f, sizeof u);
    if ((u & 0x7fffffffu) > 0x7f800000u) {
        uint16_t h = (uint16_t)(u >> 16);
        return (h & 0x7f) ? h : (uint16_t)(h | 0x40);
    }
    u += 0x7fffu + ((u >> 16) & 1u);
    return (uint16_t)(u >> 16);
}

/* Element i of a parameter area in the file's dtype. */
static float load_elem(const unsigned char *p, size_t i, int version)
{
    if (version == LOOM_LLMC_VERSION_BF16) {
        uint16_t h;
        memcpy(&h, p + 2 * i, sizeof h);
        return bf16_to_f32(h);
    }
    float f;
    memcpy(&f, p + 4 * i, sizeof f);
    return f;
}

static void store_elem(unsigned char *p, size_t i, float f, int version)
{
    if (version == LOOM_LLMC_VERSION_BF16) {
        uint16_t h = f32_to_bf16(f);
        memcpy(p + 2 * i, &h, sizeof h);
    } else {
        memcpy(p + 4 * i, &f, sizeof f);
    }
}

/* The model tensor of kind k at layer l (its shape checked against the table). */
static float *model_tensor(const struct loom_decoder *m, const struct llmc_dims *d, int k, int l)
{
    char name[LOOM_TENSOR_NAME_MAX];
    snprintf(name, sizeof name, kinds[k].loom, l);
    int bi;
    struct loom_tensor *t = loom_model_find((struct loom_model *)&m->base, name, &bi);
    LOOM_ASSERT(t != NULL);
    const struct loom_block *b = &m->base.blocks[bi];
    int64_t rows = dim_value(d, kinds[k].rows), cols = dim_value(d, kinds[k].cols);
    if (k == 0) rows = d->V; /* wte: the model has no padding rows */
    LOOM_ASSERT(t->numel == (size_t)(rows * cols));
    return b->work_params + t->offset;
}

/* Copies every parameter between the file's parameter area `area` and the
 * model: to_model 1 reads the file, 0 writes it. wte's padding rows go to
 * or come from `pad` ((Vp - V, C), NULL for zeros when writing). */
static void copy_params(const struct loom_decoder *m, const struct llmc_dims *d, unsigned char *area,
                        int version, int to_model, float *pad)
{
    size_t off = 0; /* elements into the area */
    for (int k = 0; k < NUM_KINDS; k++) {
        const size_t rows = (size_t)dim_value(d, kinds[k].rows), cols = (size_t)dim_value(d, kinds[k].cols);
        const int layers = kinds[k].per_layer ? (int)d->L : 1;
        for (int l = 0; l < layers; l++) {
            float *t = model_tensor(m, d, k, l);
            size_t model_rows = k == 0 ? (size_t)d->V : rows;
            for (size_t r = 0; r < model_rows; r++)
                for (size_t c = 0; c < cols; c++) {
                    /* llm.c [r][c] = [out][in]; loom [in][out] when transposed */
                    float *x = kinds[k].transpose ? &t[c * rows + r] : &t[r * cols + c];
                    if (to_model)
                        *x = load_elem(area, off + r * cols + c, version);
                    else
                        store_elem(area, off + r * cols + c, *x, version);
                }
            for (size_t r = model_rows; r < rows; r++) /* wte's padding rows */
                for (size_t c = 0; c < cols; c++) {
                    size_t i = (r - model_rows) * cols + c;
                    if (to_model)
                        pad[i] = load_elem(area, off + r * cols + c, version);
                    else
                        store_elem(area, off + r * cols + c, pad ? pad[i] : 0.0f, version);
                }
            off += rows * cols;
        }
    }
}

int loom_llmc_sniff(const char *path)
{
    struct stat sb;
    if (stat(path, &sb) != 0 || !S_ISREG(sb.st_mode)) return 0;
    FILE *f = fopen(path, "rb");
    if (!f) return 0;
    int32_t magic = 0;
    int ok = fread(&magic, sizeof magic, 1, f) == 1 && magic == LOOM_LLMC_MAGIC;
    fclose(f);
    return ok;
}

/* Checks one header field against [lo, hi]. */
static int check_field(const char *path, const int32_t *h, int slot, const char *what, int64_t lo, int64_t hi)
{
    if (h[slot] < lo || h[slot] > hi)
        return loom_error_set(LOOM_ERR_INPUT, "%s: llm.c header field %s (int %d) is %d, expected %lld..%lld",
                              path, what, slot, h[slot], (long long)lo, (long long)hi);
    return LOOM_OK;
}

static int check_header(const char *path, const int32_t *h, struct llmc_dims *d)
{
    int rc;
    if (h[H_MAGIC] != LOOM_LLMC_MAGIC) {
        const char *hint = h[H_MAGIC] == LOOM_SHARD_MAGIC ? " (that is an llm.c token shard)"
                           : h[H_MAGIC] == 20240803       ? " (that is llm.c's Llama-3 format, not supported)"
                                                          : "";
        return loom_error_set(LOOM_ERR_INPUT, "%s: not an llm.c GPT-2 checkpoint: magic %d, expected %d%s",
                              path, h[H_MAGIC], LOOM_LLMC_MAGIC, hint);
    }
    if (h[H_VERSION] != LOOM_LLMC_VERSION_F32 && h[H_VERSION] != LOOM_LLMC_VERSION_BF16)
        return loom_error_set(
            LOOM_ERR_INPUT,
            "%s: llm.c checkpoint version %d is not supported (3: float32, 5: bfloat16, both with "
            "padded vocabulary)",
            path, h[H_VERSION]);
    if ((rc = check_field(path, h, H_MAX_T, "max_seq_len", 1, MAX_POSITIONS)) ||
        (rc = check_field(path, h, H_VOCAB, "vocab_size", 2, MAX_VOCAB)) ||
        (rc = check_field(path, h, H_LAYERS, "num_layers", 1, MAX_LAYERS)) ||
        (rc = check_field(path, h, H_CHANNELS, "channels", 1, MAX_CHANNELS)) ||
        (rc = check_field(path, h, H_HEADS, "num_heads", 1, h[H_CHANNELS])) ||
        (rc = check_field(path, h, H_PADDED_VOCAB, "padded_vocab_size", h[H_VOCAB], MAX_VOCAB)))
        return rc;
    if (h[H_CHANNELS] % h[H_HEADS] != 0)
        return loom_error_set(LOOM_ERR_INPUT,
                              "%s: llm.c header: channels %d is not divisible by num_heads %d", path,
                              h[H_CHANNELS], h[H_HEADS]);
    for (int i = H_USED; i < LOOM_LLMC_HEADER_INTS; i++)
        if (h[i] != 0)
            return loom_error_set(LOOM_ERR_INPUT,
                                  "%s: llm.c header int %d is %d, expected 0 (a field this reader "
                                  "does not know)",
                                  path, i, h[i]);
    *d = (struct llmc_dims){.maxT = h[H_MAX_T],
                            .V = h[H_VOCAB],
                            .Vp = h[H_PADDED_VOCAB],
                            .L = h[H_LAYERS],
                            .NH = h[H_HEADS],
                            .C = h[H_CHANNELS]};
    return LOOM_OK;
}

int loom_llmc_read(const char *path, struct loom_decoder **out, struct loom_llmc_extra *extra)
{
    *out = NULL;
    memset(extra, 0, sizeof *extra);
    int rc = LOOM_OK;
    void *map = MAP_FAILED;
    size_t size = 0;
    int fd;
    struct stat sb;
    if ((rc = loom_fs_open_input(path, NULL, &fd, &sb))) return rc; /* a FIFO: refused */
    size = (size_t)sb.st_size;
    if (size < LOOM_LLMC_HEADER_BYTES) {
        rc = loom_error_set(LOOM_ERR_INPUT, "%s: %zu bytes, shorter than llm.c's %d-byte header", path, size,
                            LOOM_LLMC_HEADER_BYTES);
        goto fail;
    }
    map = mmap(NULL, size, PROT_READ, MAP_PRIVATE, fd, 0);
    if (map == MAP_FAILED) {
        rc = loom_error_set(LOOM_ERR_RUNTIME, "mmap %s (%zu bytes): %s", path, size, strerror(errno));
        goto fail;
    }
    int32_t h[LOOM_LLMC_HEADER_INTS];
    memcpy(h, map, sizeof h);
    struct llmc_dims d = {0};
    if ((rc = check_header(path, h, &d))) goto fail;
    const int version = h[H_VERSION];
    const uint64_t want = LOOM_LLMC_HEADER_BYTES + llmc_numel(&d) * elem_size(version);
    if ((uint64_t)size != want) {
        rc = loom_error_set(
            LOOM_ERR_INPUT,
            "%s: %zu bytes, but its header (L=%lld C=%lld NH=%lld V=%lld Vp=%lld maxT=%lld, %s) "
            "needs %llu: %s by %llu bytes",
            path, size, (long long)d.L, (long long)d.C, (long long)d.NH, (long long)d.V, (long long)d.Vp,
            (long long)d.maxT, version == LOOM_LLMC_VERSION_BF16 ? "bf16" : "fp32", (unsigned long long)want,
            size < want ? "truncated" : "too long",
            (unsigned long long)(size < want ? want - size : size - want));
        goto fail;
    }
    struct loom_gpt2_config cfg = {.num_layers = (int)d.L,
                                   .hidden = (int)d.C,
                                   .heads = (int)d.NH,
                                   .max_pos = (int)d.maxT,
                                   .vocab = (int)d.V,
                                   .norm_eps = LOOM_GPT2_NORM_EPS};
    if ((rc = loom_gpt2_config_check(&cfg, 1))) goto fail;
    struct loom_decoder *m = loom_gpt2_create(&cfg, 1, 1);
    loom_model_alloc_arenas(&m->base, 1, LOOM_MODEL_PARAM_ARENA);
    size_t npad = (size_t)(d.Vp - d.V) * (size_t)d.C;
    float *pad = npad ? loom_alloc(npad * sizeof(float), LOOM_MEM_PARAMS) : NULL;
    copy_params(m, &d, (unsigned char *)map + LOOM_LLMC_HEADER_BYTES, version, 1, pad);
    /* keep the padding only when some bit of it is set (-0.0 counts) */
    const unsigned char *pad_bytes =
        (const unsigned char *)map + LOOM_LLMC_HEADER_BYTES + (size_t)d.V * (size_t)d.C * elem_size(version);
    int nonzero = 0;
    for (size_t i = 0; i < npad * elem_size(version) && !nonzero; i++) nonzero = pad_bytes[i] != 0;
    if (!nonzero) {
        loom_free(pad);
        pad = NULL;
    }
    extra->version = version;
    extra->padded_vocab = (int)d.Vp;
    extra->wte_padding = pad;
    *out = m;
fail:
    if (map != MAP_FAILED && munmap(map, size) != 0 && rc == LOOM_OK)
        rc = loom_error_set(LOOM_ERR_RUNTIME, "munmap %s: %s", path, strerror(errno));
    if (close(fd) != 0 && rc == LOOM_OK)
        rc = loom_error_set(LOOM_ERR_RUNTIME, "close %s: %s", path, strerror(errno));
    if (rc && *out) {
        loom_decoder_free(*out);
        *out = NULL;
        loom_llmc_extra_free(extra);
    }
    return rc;
}

/* Vp for writing: the extra's, or V rounded up as llm.c's export does. */
static int padded_vocab(const char *path, const struct loom_decoder *m, const struct loom_llmc_extra *extra,
                        int64_t *Vp)
{
    const int64_t V = m->spec.vocab;
    if (extra && extra->padded_vocab) {
        if (extra->padded_vocab < V || extra->padded_vocab > MAX_VOCAB)
            return loom_error_set(LOOM_ERR_INPUT, "%s: padded vocabulary %d is outside %lld..%d", path,
                                  extra->padded_vocab, (long long)V, MAX_VOCAB);
        *Vp = extra->padded_vocab;
    } else {
        *Vp = (V + LOOM_LLMC_VOCAB_MULTIPLE - 1) / LOOM_LLMC_VOCAB_MULTIPLE * LOOM_LLMC_VOCAB_MULTIPLE;
    }
    return LOOM_OK;
}

int loom_llmc_write(const char *path, const struct loom_decoder *m, const struct loom_llmc_extra *extra,
                    int version)
{
    if (version != LOOM_LLMC_VERSION_F32 && version != LOOM_LLMC_VERSION_BF16)
        return loom_error_set(LOOM_ERR_INPUT,
                              "%s: cannot write llm.c checkpoint version %d (3: float32, 5: bfloat16)", path,
                              version);
    const struct loom_gpt2_config gc = loom_gpt2_config_of(m), *c = &gc;
    /* llm.c's header records the shape only: its GPT-2 is eps 1e-5, tanh GELU, tied */
    if (c->norm_eps != LOOM_GPT2_NORM_EPS)
        return loom_error_set(LOOM_ERR_INPUT,
                              "%s: llm.c's format cannot record LayerNorm eps %g (it is GPT-2's 1e-5 only)",
                              path, c->norm_eps);
    if (c->activation != LOOM_ACTIVATION_GELU_NEW)
        return loom_error_set(LOOM_ERR_INPUT,
                              "%s: llm.c's format cannot record the %s activation (it is gelu_new only)",
                              path, loom_activation_names[c->activation]);
    if (c->untied)
        return loom_error_set(LOOM_ERR_INPUT,
                              "%s: llm.c's format cannot record an untied LM head (lm_head.weight)", path);
    struct llmc_dims d = {
        .maxT = c->max_pos, .V = c->vocab, .L = c->num_layers, .NH = c->heads, .C = c->hidden};
    int rc = padded_vocab(path, m, extra, &d.Vp);
    if (rc) return rc;
    if (d.maxT > MAX_POSITIONS || d.L > MAX_LAYERS || d.C > MAX_CHANNELS || d.V > MAX_VOCAB)
        return loom_error_set(LOOM_ERR_INPUT,
                              "%s: the model (L=%lld C=%lld V=%lld maxT=%lld) exceeds llm.c's limits", path,
                              (long long)d.L, (long long)d.C, (long long)d.V, (long long)d.maxT);
    const size_t bytes = loom_mul_size((size_t)llmc_numel(&d), elem_size(version)) + LOOM_LLMC_HEADER_BYTES;
    unsigned char *buf = loom_alloc(bytes, LOOM_MEM_OTHER);
    int32_t h[LOOM_LLMC_HEADER_INTS] = {0};
    h[H_MAGIC] = LOOM_LLMC_MAGIC;
    h[H_VERSION] = version;
    h[H_MAX_T] = (int32_t)d.maxT;
    h[H_VOCAB] = (int32_t)d.V;
    h[H_LAYERS] = (int32_t)d.L;
    h[H_HEADS] = (int32_t)d.NH;
    h[H_CHANNELS] = (int32_t)d.C;
    h[H_PADDED_VOCAB] = (int32_t)d.Vp;
    memcpy(buf, h, sizeof h);
    float *pad = extra && extra->padded_vocab == d.Vp ? extra->wte_padding : NULL;
    copy_params(m, &d, buf + LOOM_LLMC_HEADER_BYTES, version, 0, pad);
    const void *parts[] = {buf};
    rc = loom_fs_write_atomic(path, parts, &bytes, 1);
    loom_free(buf);
    return rc;
}

int loom_llmc_save_safetensors(const char *path, const struct loom_decoder *m,
                               const struct loom_llmc_extra *extra)
{
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
    return loom_gpt2_save_ext(m, path, &pad, npad, meta, nmeta);
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
    if ((rc = meta_int(&st, "loom.llmc.padded_vocab_size", m->spec.vocab, MAX_VOCAB, &extra->padded_vocab)))
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

void loom_llmc_extra_free(struct loom_llmc_extra *extra)
{
    loom_free(extra->wte_padding);
    memset(extra, 0, sizeof *extra);
}

int loom_llmc_read_config(const char *path, struct loom_gpt2_config *cfg)
{
    int rc;
    FILE *f = loom_fs_fopen_input(path, NULL, &rc); /* a FIFO: refused */
    if (!f) return rc;
    int32_t h[LOOM_LLMC_HEADER_INTS];
    const int whole = fread(h, sizeof h, 1, f) == 1;
    fclose(f);
    if (!whole)
        return loom_error_set(LOOM_ERR_INPUT, "%s: shorter than llm.c's %d-byte header", path,
                              LOOM_LLMC_HEADER_BYTES);
    struct llmc_dims d = {0};
    rc = check_header(path, h, &d);
    if (rc) return rc;
    *cfg = (struct loom_gpt2_config){.num_layers = (int)d.L,
                                     .hidden = (int)d.C,
                                     .heads = (int)d.NH,
                                     .max_pos = (int)d.maxT,
                                     .vocab = (int)d.V,
                                     .norm_eps = LOOM_GPT2_NORM_EPS,
                                     .activation = LOOM_ACTIVATION_GELU_NEW,
                                     .untied = 0};
    return LOOM_OK;
}

int loom_llmc_load(struct loom_decoder *m, const char *path)
{
    struct loom_decoder *file;
    struct loom_llmc_extra extra;
    int rc = loom_llmc_read(path, &file, &extra);
    if (rc) return rc;
    const struct loom_gpt2_config ga = loom_gpt2_config_of(file), gb = loom_gpt2_config_of(m), *a = &ga,
                                  *b = &gb;
    if (a->num_layers != b->num_layers || a->hidden != b->hidden || a->heads != b->heads ||
        a->max_pos != b->max_pos || a->vocab != b->vocab || b->untied || b->norm_eps != a->norm_eps ||
        b->activation != a->activation) {
        rc = loom_error_set(LOOM_ERR_INPUT,
                            "%s holds GPT-2 L=%d C=%d NH=%d maxT=%d V=%d (eps 1e-5, gelu_new, tied), not the "
                            "model of this run",
                            path, a->num_layers, a->hidden, a->heads, a->max_pos, a->vocab);
    } else {
        for (int i = 0; i < m->base.nblocks; i++) /* this model's part of each tensor (tensor parallelism) */
            for (int k = 0; k < m->base.blocks[i].ntensors; k++) {
                const struct loom_tensor *t = &m->base.blocks[i].tensors[k];
                loom_tensor_take_part(
                    t, file->base.blocks[i].work_params + file->base.blocks[i].tensors[k].offset,
                    m->base.blocks[i].work_params + t->offset);
            }
    }
    loom_decoder_free(file);
    loom_llmc_extra_free(&extra);
    return rc;
}
