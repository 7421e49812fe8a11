/*
 * The built-in corpus: quantising the source, its exact entropies, the
 * generator, and writing the corpus directory.
 *
 * The ideal window predictor (loom_synth_window_xent). Let phi in 0..K be
 * the phase of window token 0 (0: a marker, k: span position k); phi is
 * uniform. Target j (token j+1, role r = (phi+j+1) mod (K+1), 0 = marker)
 * is predicted from tokens 0..j:
 *   - a marker among tokens 0..j (phi = 0 or phi+j >= K+1): the phase is
 *     known, and so is the kind of the target's segment (its marker lies
 *     between the first marker seen and the target). A marker costs H_b(q);
 *     a NEW symbol H(pi); a COPY symbol 0 when its source, K+1 tokens back,
 *     is inside the window (j >= K), else H(pi): that source coordinate is
 *     independent of everything else the window shows.
 *   - no marker yet: tokens 0..j are span positions phi..phi+j of one
 *     segment, and their values say nothing about phi (every span is i.i.d.
 *     pi coordinate-wise, copied or not; their case gives the segment's
 *     kind, which is independent of phi), so the m = K-j phases that fit
 *     are equally likely. The target is a marker with probability 1/m: the
 *     loss is log m + H_b(q) on a marker and H(pi) + log(m/(m-1)) on a
 *     symbol (its case is known; a COPY's source lies before the window).
 * The test checks this against an exact Bayesian filter over the source's
 * hidden state.
 *
 * The generator spends 16 random bits per draw (four per 64-bit word) and
 * maps them through a 64 KiB table: hundreds of millions of tokens/s.
 */
#include "io/synth.h"

#include <errno.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <string.h>

#include <cjson/cJSON.h>

#include "base/log.h"
#include "base/mem.h"
#include "base/rng.h"
#include "io/fs.h"
#include "io/shard.h"

/* Letters by English frequency: rank i becomes this byte. */
static const char symbol_bytes[] = "etaoinshrdlcumwfgypbvkjxqz";
_Static_assert(sizeof symbol_bytes - 1 == LOOM_SYNTH_MAX_SYMBOLS, "one byte per symbol");

void loom_synth_default(struct loom_synth_spec *spec)
{
    spec->span = 2;
    spec->symbols = 16;
    spec->zipf = 1.0;
    spec->p_new = 0.2;
}

int loom_synth_build(struct loom_synth_model *m, const struct loom_synth_spec *spec)
{
    memset(m, 0, sizeof *m);
    if (spec->span < 1 || spec->span > LOOM_SYNTH_MAX_SPAN)
        return loom_error_set(LOOM_ERR_INPUT, "synthetic corpus: span %d is outside 1..%d", spec->span,
                              LOOM_SYNTH_MAX_SPAN);
    if (spec->symbols < 2 || spec->symbols > LOOM_SYNTH_MAX_SYMBOLS)
        return loom_error_set(LOOM_ERR_INPUT, "synthetic corpus: symbols %d is outside 2..%d", spec->symbols,
                              LOOM_SYNTH_MAX_SYMBOLS);
    if (!(spec->zipf >= 0.0 && spec->zipf <= 3.0))
        return loom_error_set(LOOM_ERR_INPUT, "synthetic corpus: zipf exponent %g is outside 0..3",
                              spec->zipf);
    if (!(spec->p_new > 0.0 && spec->p_new <= 1.0))
        return loom_error_set(LOOM_ERR_INPUT, "synthetic corpus: NEW probability %g is outside (0, 1]",
                              spec->p_new);
    m->spec = *spec;
    long q = lround(spec->p_new * LOOM_SYNTH_ONE);
    m->new_weight = (uint32_t)(q < 1 ? 1 : q);

    /* Largest-remainder rounding of pi to integer weights summing to ONE,
     * each at least 1 (the exponent bound keeps the smallest above 2^-16). */
    int M = spec->symbols;
    double w[LOOM_SYNTH_MAX_SYMBOLS], sum = 0, frac[LOOM_SYNTH_MAX_SYMBOLS];
    for (int i = 0; i < M; i++) sum += w[i] = pow(i + 1.0, -spec->zipf);
    uint32_t total = 0;
    for (int i = 0; i < M; i++) {
        double x = w[i] / sum * LOOM_SYNTH_ONE;
        m->weight[i] = (uint32_t)floor(x);
        frac[i] = x - floor(x);
        total += m->weight[i];
    }
    while (total < LOOM_SYNTH_ONE) {
        int best = 0;
        for (int i = 1; i < M; i++)
            if (frac[i] > frac[best]) best = i;
        m->weight[best]++;
        frac[best] = -1.0;
        total++;
    }
    for (int i = 0; i < M; i++) {
        LOOM_ASSERT(m->weight[i] >= 1);
        m->byte_new[i] = (unsigned char)symbol_bytes[i];
        m->byte_copy[i] = (unsigned char)(symbol_bytes[i] - 'a' + 'A');
    }
    return LOOM_OK;
}

double loom_synth_p_new(const struct loom_synth_model *m)
{
    return (double)m->new_weight / LOOM_SYNTH_ONE;
}

double loom_synth_prob(const struct loom_synth_model *m, int symbol)
{
    LOOM_ASSERT(symbol >= 0 && symbol < m->spec.symbols);
    return (double)m->weight[symbol] / LOOM_SYNTH_ONE;
}

static double xlogx(double p)
{
    return p > 0 ? p * log(p) : 0.0;
}

static double marker_entropy(const struct loom_synth_model *m)
{
    double q = loom_synth_p_new(m);
    return -xlogx(q) - xlogx(1.0 - q);
}

static double symbol_entropy(const struct loom_synth_model *m)
{
    double h = 0;
    for (int i = 0; i < m->spec.symbols; i++) h -= xlogx(loom_synth_prob(m, i));
    return h;
}

double loom_synth_entropy_rate(const struct loom_synth_model *m)
{
    int K = m->spec.span;
    double q = loom_synth_p_new(m);
    return (marker_entropy(m) + q * K * symbol_entropy(m)) / (K + 1);
}

double loom_synth_nocopy_xent(const struct loom_synth_model *m)
{
    int K = m->spec.span;
    return (marker_entropy(m) + K * symbol_entropy(m)) / (K + 1);
}

double loom_synth_unigram_entropy(const struct loom_synth_model *m)
{
    int K = m->spec.span;
    double q = loom_synth_p_new(m);
    double h = -xlogx(q / (K + 1)) - xlogx((1.0 - q) / (K + 1));
    for (int i = 0; i < m->spec.symbols; i++) h -= xlogx(loom_synth_prob(m, i) * K / (K + 1));
    return h;
}

double loom_synth_window_xent(const struct loom_synth_model *m, int T)
{
    LOOM_ASSERT(T > 0);
    int K = m->spec.span;
    double q = loom_synth_p_new(m), hb = marker_entropy(m), hs = symbol_entropy(m);
    double total = 0;
    for (int phi = 0; phi <= K; phi++) {
        for (int j = 0; j < T; j++) {
            int r = (int)(((int64_t)phi + j + 1) % (K + 1));
            int seen = phi == 0 || (int64_t)phi + j >= K + 1;
            if (seen)
                total += r == 0 ? hb : q * hs + (1.0 - q) * (j >= K ? 0.0 : hs);
            else {
                double cands = K - j; /* phases consistent with j+1 symbols, no marker */
                total += r == 0 ? log(cands) + hb : hs + log(cands / (cands - 1.0));
            }
        }
    }
    return total / ((double)(K + 1) * T);
}

/* ---- generation ---------------------------------------------------------- */

struct draw16 {
    struct loom_rng rng;
    uint64_t word;
    int left; /* 16-bit chunks left in word */
};

static inline uint32_t draw16_next(struct draw16 *d)
{
    if (d->left == 0) {
        d->word = loom_rng_u64(&d->rng);
        d->left = 4;
    }
    uint32_t v = (uint32_t)(d->word & 0xFFFF);
    d->word >>= 16;
    d->left--;
    return v;
}

void loom_synth_generate(const struct loom_synth_model *m, uint64_t seed, uint16_t *out, int64_t n)
{
    int K = m->spec.span;
    unsigned char *table = loom_alloc(LOOM_SYNTH_ONE, LOOM_MEM_OTHER); /* draw -> symbol */
    for (uint32_t u = 0, i = 0, edge = m->weight[0]; u < LOOM_SYNTH_ONE; u++) {
        while (u >= edge) edge += m->weight[++i];
        table[u] = (unsigned char)i;
    }
    struct draw16 d = {.left = 0};
    loom_rng_seed(&d.rng, seed);
    unsigned char span[LOOM_SYNTH_MAX_SPAN];
    for (int k = 0; k < K; k++) span[k] = table[draw16_next(&d)];
    int64_t i = 0;
    while (i < n) {
        int is_new = draw16_next(&d) < m->new_weight;
        out[i++] = is_new ? LOOM_SYNTH_MARKER_NEW : LOOM_SYNTH_MARKER_COPY;
        if (is_new)
            for (int k = 0; k < K; k++) span[k] = table[draw16_next(&d)];
        const unsigned char *bytes = is_new ? m->byte_new : m->byte_copy;
        for (int k = 0; k < K && i < n; k++) out[i++] = bytes[span[k]];
    }
    loom_free(table);
}

/* ---- the corpus directory ------------------------------------------------ */

static int write_stream(const struct loom_synth_model *m, uint64_t seed, const char *outdir, const char *name,
                        int64_t n)
{
    uint16_t *tokens = loom_alloc(loom_mul_size((size_t)n + 1, sizeof *tokens), LOOM_MEM_OTHER);
    loom_synth_generate(m, seed, tokens, n);
    size_t len = strlen(outdir) + strlen(name) + 2;
    char *path = loom_alloc(len, LOOM_MEM_OTHER);
    snprintf(path, len, "%s/%s", outdir, name);
    int status = loom_shard_write(path, tokens, n);
    loom_free(path);
    loom_free(tokens);
    return status;
}

/* Appends printf output to buf[*len..cap). */
static void __attribute__((format(printf, 4, 5)))
json_add(char *buf, size_t cap, size_t *len, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    int k = vsnprintf(buf + *len, *len < cap ? cap - *len : 0, fmt, ap);
    va_end(ap);
    LOOM_ASSERT(k >= 0 && *len + (size_t)k < cap);
    *len += (size_t)k;
}

static int write_description(const struct loom_synth_model *m, uint64_t seed, const char *outdir,
                             int64_t n_train, int64_t n_val)
{
    size_t cap = 8192, len = 0;
    char *buf = loom_alloc(cap, LOOM_MEM_OTHER);
    const struct loom_synth_spec *s = &m->spec;
    json_add(buf, cap, &len,
             "{\n  \"name\": \"loom-synth-copy\",\n  \"version\": 1,\n"
             "  \"description\": \"segments of a marker and %d symbols: NEW (' ') then fresh "
             "symbols drawn i.i.d. from pi in lower case, or COPY ('=') then the previous "
             "segment's symbols again in upper case\",\n",
             s->span);
    json_add(buf, cap, &len,
             "  \"seed\": %llu,\n  \"vocab\": 256,\n  \"train_tokens\": %lld,\n"
             "  \"val_tokens\": %lld,\n  \"span\": %d,\n  \"symbols\": %d,\n  \"zipf\": %.17g,\n"
             "  \"p_new\": %.17g,\n  \"marker_new\": %d,\n  \"marker_copy\": %d,\n",
             (unsigned long long)seed, (long long)n_train, (long long)n_val, s->span, s->symbols, s->zipf,
             loom_synth_p_new(m), LOOM_SYNTH_MARKER_NEW, LOOM_SYNTH_MARKER_COPY);
    json_add(buf, cap, &len, "  \"alphabet\": \"%.*s\",\n  \"alphabet_copy\": \"%.*s\",\n", s->symbols,
             (const char *)m->byte_new, s->symbols, (const char *)m->byte_copy);
    json_add(buf, cap, &len, "  \"symbol_probs\": [");
    for (int i = 0; i < s->symbols; i++)
        json_add(buf, cap, &len, "%s%.17g", i ? ", " : "", loom_synth_prob(m, i));
    json_add(buf, cap, &len,
             "],\n  \"entropy_rate_nats\": %.17g,\n  \"entropy_rate_bits\": %.17g,\n"
             "  \"unigram_entropy_nats\": %.17g,\n  \"nocopy_xent_nats\": %.17g,\n"
             "  \"window_xent_nats\": {",
             loom_synth_entropy_rate(m), loom_synth_entropy_rate(m) / log(2.0), loom_synth_unigram_entropy(m),
             loom_synth_nocopy_xent(m));
    static const int windows[] = {16, 32, 64, 128, 256, 512, 1024};
    for (size_t i = 0; i < sizeof windows / sizeof windows[0]; i++)
        json_add(buf, cap, &len, "%s\"%d\": %.17g", i ? ", " : "", windows[i],
                 loom_synth_window_xent(m, windows[i]));
    json_add(buf, cap, &len, "}\n}\n");

    size_t plen = strlen(outdir) + sizeof "/corpus.json";
    char *path = loom_alloc(plen, LOOM_MEM_OTHER);
    snprintf(path, plen, "%s/corpus.json", outdir);
    const void *parts[1] = {buf};
    int status = loom_fs_write_atomic(path, parts, &len, 1);
    loom_free(path);
    loom_free(buf);
    return status;
}

int loom_data_synth_spec(const char *outdir, const struct loom_synth_spec *spec, int64_t tokens,
                         uint64_t seed, double *entropy_nats)
{
    struct loom_synth_spec def;
    loom_synth_default(&def);
    struct loom_synth_model m;
    int status = loom_synth_build(&m, spec ? spec : &def);
    if (status != LOOM_OK) return status;
    int64_t n_val = tokens / 10, n_train = tokens - n_val;
    if (tokens < 20 || n_train > LOOM_SHARD_MAX_TOKENS)
        return loom_error_set(LOOM_ERR_INPUT, "synthetic corpus of %lld tokens: choose 20 to about %lld",
                              (long long)tokens, (long long)LOOM_SHARD_MAX_TOKENS * 10 / 9);
    status = loom_fs_mkdir_p(outdir);
    if (status == LOOM_OK)
        status = write_stream(&m, loom_hash3(seed, 0x73796e7468ull, 0), outdir, "train.bin", n_train);
    if (status == LOOM_OK)
        status = write_stream(&m, loom_hash3(seed, 0x73796e7468ull, 1), outdir, "val.bin", n_val);
    if (status == LOOM_OK) status = write_description(&m, seed, outdir, n_train, n_val);
    if (status != LOOM_OK) return status;
    double h = loom_synth_entropy_rate(&m);
    loom_log_info("synthetic corpus in %s: %lld train + %lld val tokens, entropy rate %.4f "
                  "nats/token (ideal loss with a 64-token window %.4f)\n",
                  outdir, (long long)n_train, (long long)n_val, h, loom_synth_window_xent(&m, 64));
    if (entropy_nats) *entropy_nats = h;
    return LOOM_OK;
}

int loom_data_synth(const char *outdir, int64_t tokens, uint64_t seed, double *entropy_nats)
{
    return loom_data_synth_spec(outdir, NULL, tokens, seed, entropy_nats);
}

/* ---- reading a corpus description ---------------------------------------- */

static int json_number(const cJSON *root, const char *path, const char *key, double *out)
{
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(root, key);
    if (!cJSON_IsNumber(v))
        return loom_error_set(LOOM_ERR_INPUT, "corpus description '%s' lacks the number \"%s\"", path, key);
    *out = v->valuedouble;
    return LOOM_OK;
}

static int read_description(const char *outdir, cJSON **root, char **path)
{
    size_t plen = strlen(outdir) + sizeof "/corpus.json";
    *path = loom_alloc(plen, LOOM_MEM_OTHER);
    snprintf(*path, plen, "%s/corpus.json", outdir);
    int rc;
    FILE *f = loom_fs_fopen_input(*path, "corpus description", &rc); /* a FIFO: refused */
    if (!f) return rc;
    char text[16384];
    size_t n = fread(text, 1, sizeof text - 1, f);
    int read_error = ferror(f);
    fclose(f);
    if (read_error || n == sizeof text - 1)
        return loom_error_set(LOOM_ERR_INPUT, "corpus description '%s' is unreadable or too long", *path);
    text[n] = '\0';
    *root = cJSON_Parse(text);
    if (!*root || !cJSON_IsObject(*root))
        return loom_error_set(LOOM_ERR_INPUT, "corpus description '%s' is not a JSON object", *path);
    return LOOM_OK;
}

int loom_synth_read(const char *outdir, struct loom_synth_model *m)
{
    cJSON *root = NULL;
    char *path = NULL;
    double span = 0, symbols = 0, zipf = 0, p_new = 0;
    int status = read_description(outdir, &root, &path);
    if (status == LOOM_OK) status = json_number(root, path, "span", &span);
    if (status == LOOM_OK) status = json_number(root, path, "symbols", &symbols);
    if (status == LOOM_OK) status = json_number(root, path, "zipf", &zipf);
    if (status == LOOM_OK) status = json_number(root, path, "p_new", &p_new);
    if (status == LOOM_OK) {
        struct loom_synth_spec spec = {(int)span, (int)symbols, zipf, p_new};
        status = loom_synth_build(m, &spec);
        if (status != LOOM_OK) {
            char why[512];
            snprintf(why, sizeof why, "%s", loom_error_message());
            status = loom_error_set(LOOM_ERR_INPUT, "corpus description '%s': %s", path, why);
        }
    }
    cJSON_Delete(root);
    loom_free(path);
    return status;
}

int loom_synth_read_floor(const char *outdir, double *floor_nats)
{
    cJSON *root = NULL;
    char *path = NULL;
    int status = read_description(outdir, &root, &path);
    if (status == LOOM_OK) status = json_number(root, path, "entropy_rate_nats", floor_nats);
    cJSON_Delete(root);
    loom_free(path);
    return status;
}
