/*
 * llm.c's checkpoint format in and out (see llmc.h). One table lists llm.c's
 * parameter kinds in file order with the spec's tensor each maps to;
 * reading and writing walk the same table, so the two cannot disagree on
 * the order. The file is mapped read-only and checked in full (header
 * fields, then the exact size) before any parameter is touched. Little-endian
 * hosts only, as llm.c itself.
 */
#include "model/llmc.h"

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
#include "io/shard.h"
#include "model/decoder_def.h"
#include "model/family.h"

/* Bounds on the header fields: generous for any model, small enough that
 * every size below fits in 64 bits without overflow. */
#define MAX_POSITIONS (1 << 20)
#define MAX_VOCAB LOOM_LLMC_MAX_VOCAB
#define MAX_LAYERS (1 << 12)
#define MAX_CHANNELS (1 << 16)
/* The only LayerNorm eps llm.c has (GPT-2's). */
#define LLMC_NORM_EPS 1e-5

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

/* The spec's tensor a kind maps to. */
enum llmc_tensor { T_EMB = 0, T_POS, T_NORM1, T_QKV, T_O, T_NORM2, T_UP, T_DOWN, T_FINAL };

/* llm.c's parameter kinds in file order. Each is [rows, cols] per layer in
 * llm.c (cols D_ONE for a vector); matrix marks a Linear weight, stored
 * [out, in] there. */
static const struct llmc_kind {
    const char *name; /* llm.c's ParameterTensors field */
    enum llmc_tensor tensor;
    const char *part; /* "weight" or "bias" */
    int per_layer;
    enum llmc_dim rows, cols;
    int matrix;
} kinds[] = {
    {"wte", T_EMB, "weight", 0, D_VP, D_C, 0},      {"wpe", T_POS, "weight", 0, D_MAXT, D_C, 0},
    {"ln1w", T_NORM1, "weight", 1, D_C, D_ONE, 0},  {"ln1b", T_NORM1, "bias", 1, D_C, D_ONE, 0},
    {"qkvw", T_QKV, "weight", 1, D_3C, D_C, 1},     {"qkvb", T_QKV, "bias", 1, D_3C, D_ONE, 0},
    {"attprojw", T_O, "weight", 1, D_C, D_C, 1},    {"attprojb", T_O, "bias", 1, D_C, D_ONE, 0},
    {"ln2w", T_NORM2, "weight", 1, D_C, D_ONE, 0},  {"ln2b", T_NORM2, "bias", 1, D_C, D_ONE, 0},
    {"fcw", T_UP, "weight", 1, D_4C, D_C, 1},       {"fcb", T_UP, "bias", 1, D_4C, D_ONE, 0},
    {"fcprojw", T_DOWN, "weight", 1, D_C, D_4C, 1}, {"fcprojb", T_DOWN, "bias", 1, D_C, D_ONE, 0},
    {"lnfw", T_FINAL, "weight", 0, D_C, D_ONE, 0},  {"lnfb", T_FINAL, "bias", 0, D_C, D_ONE, 0},
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
    const struct loom_decoder_names *nm = m->spec.names;
    const char *const parts[] = {
        [T_EMB] = nm->embedding, [T_POS] = nm->positions, [T_NORM1] = nm->norm1,
        [T_QKV] = nm->qkv,       [T_O] = nm->o,           [T_NORM2] = nm->norm2,
        [T_UP] = nm->up,         [T_DOWN] = nm->down,     [T_FINAL] = nm->final_norm};
    char layer[LOOM_TENSOR_NAME_MAX] = "", name[2 * LOOM_TENSOR_NAME_MAX + 8]; /* found only when it fits */
    if (kinds[k].per_layer) snprintf(layer, sizeof layer, nm->layer, l);
    snprintf(name, sizeof name, "%s%s.%s", layer, parts[kinds[k].tensor], kinds[k].part);
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
    const int in_out = m->spec.weights == LOOM_WEIGHTS_IN_OUT;
    for (int k = 0; k < NUM_KINDS; k++) {
        const int transpose = kinds[k].matrix && in_out;
        const size_t rows = (size_t)dim_value(d, kinds[k].rows), cols = (size_t)dim_value(d, kinds[k].cols);
        const int layers = kinds[k].per_layer ? (int)d->L : 1;
        for (int l = 0; l < layers; l++) {
            float *t = model_tensor(m, d, k, l);
            size_t model_rows = k == 0 ? (size_t)d->V : rows;
            for (size_t r = 0; r < model_rows; r++)
                for (size_t c = 0; c < cols; c++) {
                    /* llm.c [r][c] = [out][in]; the spec's [in][out] when transposed */
                    float *x = transpose ? &t[c * rows + r] : &t[r * cols + c];
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

/* Whether d's table has the setting. */
static int has_key(const struct loom_decoder_def *d, const char *key)
{
    for (int k = 0; k < d->nkeys; k++)
        if (strcmp(d->keys[k].key, key) == 0) return 1;
    return 0;
}

int loom_llmc_holds(const struct loom_decoder_def *d, const struct loom_decoder_spec *s, const char *path)
{
    const int sized = s->hidden > 0;
    char mlp[64];
    snprintf(mlp, sizeof mlp, "an MLP %d wide, not 4 x %d", s->ffn, s->hidden);
    const struct {
        int differs;
        const char *what;
    } layout[] = {
        {s->positions != LOOM_POSITION_LEARNED, "rotary positions"},
        {s->norm != LOOM_NORM_LAYERNORM, "RMSNorm"},
        {s->norm_offset != 0, "norm weights with an offset"},
        {!s->fused_qkv, "separate q, k and v products"},
        {!(s->qkv_bias && s->o_bias && s->mlp_bias), "products without biases"},
        {s->mlp != LOOM_MLP_DENSE, "a gated MLP"},
        {s->embed_scale != 0, "a scaled embedding"},
        {s->activation != LOOM_MLP_GELU_TANH && !has_key(d, "activation_function"), "another activation"},
        {sized && s->kv_heads != s->heads, "key/value groups"},
        {sized && s->head_dim && s->head_dim * s->heads != s->hidden, "a head width of its own"},
        {sized && s->ffn != 4 * s->hidden, mlp},
    };
    for (size_t i = 0; i < sizeof layout / sizeof layout[0]; i++)
        if (layout[i].differs)
            return loom_error_set(LOOM_ERR_INPUT,
                                  "%s: llm.c's format cannot hold a %s model (it has %s; llm.c's has learned "
                                  "positions, LayerNorm, a fused qkv and a 4 x C MLP, all with biases)",
                                  path, d->family->title, layout[i].what);
    return LOOM_OK;
}

/* The model a header describes, as d's shape: the sizes, and llm.c's
 * numerics (eps 1e-5, tanh GELU, a tied head) where d's table has them. */
static void shape_of_dims(const struct loom_decoder_def *d, const struct llmc_dims *dm,
                          struct loom_model_shape *out)
{
    memset(out, 0, sizeof *out);
    snprintf(out->type, sizeof out->type, "%s", d->family->name);
    loom_model_shape_add_int(out, "num_layers", dm->L);
    loom_model_shape_add_int(out, "hidden_size", dm->C);
    loom_model_shape_add_int(out, "num_attention_heads", dm->NH);
    loom_model_shape_add_int(out, "max_position_embeddings", dm->maxT);
    loom_model_shape_add_int(out, "vocab_size", dm->V);
    if (has_key(d, "norm_epsilon")) loom_model_shape_add_real(out, "norm_epsilon", LLMC_NORM_EPS);
    if (has_key(d, "activation_function"))
        loom_model_shape_add_word(out, "activation_function",
                                  loom_activation_names[LOOM_ACTIVATION_GELU_NEW]);
    if (has_key(d, "untie_embeddings_and_output_weights"))
        loom_model_shape_add_int(out, "untie_embeddings_and_output_weights", 0);
}

/* The spec of the model a header describes, checked: the family holds it
 * in llm.c's layout, and its sizes build a model. */
static int spec_of_dims(const struct loom_decoder_def *d, const char *path, const struct llmc_dims *dm,
                        struct loom_decoder_spec *out)
{
    struct loom_model_shape shape;
    struct loom_config cfg;
    memset(&cfg, 0, sizeof cfg);
    shape_of_dims(d, dm, &shape);
    int rc = loom_decoder_def_apply_shape(d, &shape, &cfg);
    if (rc == LOOM_OK) rc = loom_decoder_def_check_sizes(d, &cfg, 1);
    if (rc) {
        char why[300];
        snprintf(why, sizeof why, "%s", loom_error_message());
        return loom_error_set(rc, "%s: %s", path, why);
    }
    *out = loom_decoder_def_spec(d, &cfg);
    return loom_llmc_holds(d, out, path);
}

int loom_llmc_read(const struct loom_decoder_def *def, const char *path, struct loom_decoder **out,
                   struct loom_llmc_extra *extra)
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
    struct loom_decoder_spec spec;
    if ((rc = spec_of_dims(def, path, &d, &spec))) goto fail;
    struct loom_decoder *m = loom_decoder_create_whole(&spec, 1, 1);
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
    const struct loom_decoder_spec *c = &m->spec;
    static const char *const activations[] = {"gelu_new", "gelu", "silu"};
    int rc = loom_llmc_holds(loom_decoder_def_of(&m->base), c, path);
    if (rc) return rc;
    /* llm.c's header records the shape only: its numerics are eps 1e-5, tanh GELU, tied */
    if (c->norm_eps != LLMC_NORM_EPS)
        return loom_error_set(LOOM_ERR_INPUT,
                              "%s: llm.c's format cannot record LayerNorm eps %g (it is GPT-2's 1e-5 only)",
                              path, c->norm_eps);
    if (c->activation != LOOM_MLP_GELU_TANH)
        return loom_error_set(LOOM_ERR_INPUT,
                              "%s: llm.c's format cannot record the %s activation (it is gelu_new only)",
                              path, activations[c->activation]);
    if (c->untied)
        return loom_error_set(LOOM_ERR_INPUT,
                              "%s: llm.c's format cannot record an untied LM head (%s.weight)", path,
                              c->names->lm_head);
    struct llmc_dims d = {
        .maxT = c->max_pos, .V = c->vocab, .L = c->num_layers, .NH = c->heads, .C = c->hidden};
    if ((rc = padded_vocab(path, m, extra, &d.Vp))) return rc;
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

void loom_llmc_extra_free(struct loom_llmc_extra *extra)
{
    loom_free(extra->wte_padding);
    memset(extra, 0, sizeof *extra);
}

int loom_llmc_read_shape(const struct loom_decoder_def *def, const char *path, struct loom_model_shape *out)
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
    struct loom_decoder_spec spec;
    if ((rc = check_header(path, h, &d)) || (rc = spec_of_dims(def, path, &d, &spec))) return rc;
    shape_of_dims(def, &d, out);
    return LOOM_OK;
}

int loom_llmc_load(struct loom_decoder *m, const char *path)
{
    struct loom_decoder *file;
    struct loom_llmc_extra extra;
    int rc = loom_llmc_read(loom_decoder_def_of(&m->base), path, &file, &extra);
    if (rc) return rc;
    const struct loom_decoder_spec *a = &file->spec, *b = &m->spec;
    if (a->num_layers != b->num_layers || a->hidden != b->hidden || a->heads != b->heads ||
        a->max_pos != b->max_pos || a->vocab != b->vocab || b->untied || b->norm_eps != a->norm_eps ||
        b->activation != a->activation) {
        rc = loom_error_set(LOOM_ERR_INPUT,
                            "%s holds %s L=%d C=%d NH=%d maxT=%d V=%d (eps 1e-5, gelu_new, tied), not the "
                            "model of this run",
                            path, file->spec.family->title, a->num_layers, a->hidden, a->heads, a->max_pos,
                            a->vocab);
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
