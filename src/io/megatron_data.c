/*
 * Megatron-Core's GPTDataset, BlendedDataset and the builder's sizes and
 * splits over indexed datasets (see megatron_data.h). Every float is
 * computed in the order Megatron's Python and NumPy compute it, so the
 * roundings (split bounds, blend sizes, blend order) agree.
 */
#include "io/megatron_data.h"

#include <limits.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <xxhash.h>

#include "base/log.h"
#include "base/mem.h"
#include "base/mt19937.h"
#include "io/fs.h"
#include "io/npy.h"

static const char *const split_names[LOOM_NSPLITS] = {"train", "valid", "test"};

/* calloc that ends the process when memory is out (small tables only). */
static void *zeroed(size_t n, size_t size)
{
    void *p = calloc(n ? n : 1, size);
    if (!p) loom_die("out of memory indexing Megatron datasets");
    return p;
}

const char *loom_split_name(int split)
{
    return split_names[split];
}

/* numpy.sum of float64: pairwise, blocks of 8 below 128 elements. */
static double np_sum(const double *a, int64_t n)
{
    if (n < 8) {
        double s = 0.;
        for (int64_t i = 0; i < n; i++) s += a[i];
        return s;
    }
    if (n <= 128) {
        double r[8];
        int64_t i;
        for (int j = 0; j < 8; j++) r[j] = a[j];
        for (i = 8; i < n - (n % 8); i += 8)
            for (int j = 0; j < 8; j++) r[j] += a[i + j];
        double s = ((r[0] + r[1]) + (r[2] + r[3])) + ((r[4] + r[5]) + (r[6] + r[7]));
        for (; i < n; i++) s += a[i];
        return s;
    }
    int64_t n2 = n / 2;
    n2 -= n2 % 8;
    return np_sum(a, n2) + np_sum(a + n2, n - n2);
}

/* Megatron's normalize(): w / numpy.sum(w), in place. */
static void normalize(double *w, int n)
{
    const double s = np_sum(w, n);
    for (int i = 0; i < n; i++) w[i] /= s;
}

/* ---- the blend and the split ----------------------------------------------------- */

struct blend {
    int n;
    const char **prefix; /* (n) into the words */
    double *weight;      /* (n) normalised, or NULL: none given */
};

static int parse_number(const char *s, double *out)
{
    char *end;
    *out = strtod(s, &end);
    return end != s && *end == 0;
}

/* Megatron's get_blend_from_list: an odd count is prefixes alone; an even
 * count whose every other word (from the first) is a number is weight,
 * prefix pairs. */
static int parse_blend(const char *const *w, int n, const char *flag, struct blend *b)
{
    b->n = n;
    b->prefix = loom_alloc(sizeof *b->prefix * (size_t)n, LOOM_MEM_OTHER);
    b->weight = NULL;
    int numbers = 0;
    double x;
    for (int i = 0; i + 1 < n && n % 2 == 0; i += 2) numbers += parse_number(w[i], &x);
    if (n % 2 == 1 || numbers == 0) {
        for (int i = 0; i < n; i++) b->prefix[i] = w[i];
        return LOOM_OK;
    }
    if (numbers != n / 2)
        return loom_error_set(LOOM_ERR_INPUT,
                              "%s: a weighted blend is WEIGHT PREFIX pairs (0.3 A 0.7 B): some of the %d "
                              "words in weight places are not numbers",
                              flag, n);
    b->n = n / 2;
    b->weight = loom_alloc(sizeof *b->weight * (size_t)b->n, LOOM_MEM_OTHER);
    for (int i = 0; i < b->n; i++) {
        parse_number(w[2 * i], &b->weight[i]);
        b->prefix[i] = w[2 * i + 1];
        if (!(b->weight[i] > 0) || !isfinite(b->weight[i]))
            return loom_error_set(LOOM_ERR_INPUT,
                                  "%s: the weight of %s is %s: a blend's weights must be positive", flag,
                                  w[2 * i + 1], w[2 * i]);
    }
    normalize(b->weight, b->n);
    return LOOM_OK;
}

static void blend_free(struct blend *b)
{
    loom_free(b->prefix);
    loom_free(b->weight);
    memset(b, 0, sizeof *b);
}

/* "969,30,1" -> bookends (a_k, b_k) of the normalised weights' running
 * sums; present[k] = 0 for a split of weight 0. Megatron's
 * parse_and_normalize_split and convert_split_vector_to_split_matrix. */
static int parse_split(const char *s, double bounds[LOOM_NSPLITS][2], int present[LOOM_NSPLITS])
{
    double v[LOOM_NSPLITS] = {0};
    int n = 0;
    for (const char *p = s; *p;) {
        if (!strchr(".0123456789", *p)) {
            if (!strchr(", \t/", *p))
                return loom_error_set(
                    LOOM_ERR_INPUT, "--split '%s': expected up to three numbers, train,valid,test (969,30,1)",
                    s);
            p++;
            continue;
        }
        const char *q = p;
        while (*q && strchr(".0123456789", *q)) q++;
        char word[64];
        snprintf(word, sizeof word, "%.*s", (int)(q - p), p);
        char *end;
        const double x = strtod(word, &end);
        if (*end || n == LOOM_NSPLITS)
            return loom_error_set(
                LOOM_ERR_INPUT, "--split '%s': expected up to three numbers, train,valid,test (969,30,1)", s);
        v[n++] = x;
        p = q;
    }
    const double sum = np_sum(v, LOOM_NSPLITS);
    if (n == 0 || !(sum > 0))
        return loom_error_set(LOOM_ERR_INPUT, "--split '%s': the weights must not all be zero", s);
    normalize(v, LOOM_NSPLITS);
    double run = 0;
    for (int k = 0; k < LOOM_NSPLITS; k++) {
        bounds[k][0] = run;
        run = run + v[k];
        bounds[k][1] = run;
        present[k] = bounds[k][1] > bounds[k][0];
    }
    return LOOM_OK;
}

/* ---- the cache -------------------------------------------------------------------- */

/* Names the cache file DIR/KEY-CLASS-SPLIT-WHAT into path. */
static void cache_path(char *path, size_t n, const char *dir, const char *key, const char *cls, int split,
                       const char *what)
{
    snprintf(path, n, "%s/%s-%s-%s-%s", dir, key, cls, split_names[split], what);
}

/* The hash of a description, as 16 hex digits. */
static void cache_key(char key[17], const char *description)
{
    snprintf(key, 17, "%016llx", (unsigned long long)XXH64(description, strlen(description), 0));
}

/* Maps the n arrays of a cached dataset: all (1) or none (0). */
static int cache_map(const char *dir, const char *key, const char *cls, int split, int n,
                     const char *const *what, const char *const *descr, const int64_t (*shape)[2], void **map,
                     size_t *bytes, const void **data)
{
    if (!dir || !*dir) return 0;
    int got = 0;
    for (int i = 0; i < n && got == i; i++) {
        char path[4400];
        cache_path(path, sizeof path, dir, key, cls, split, what[i]);
        got += loom_npy_map(path, descr[i], shape[i], &map[i], &bytes[i], &data[i]);
    }
    if (got == n) return 1;
    for (int i = 0; i < got; i++) munmap(map[i], bytes[i]);
    for (int i = 0; i < n; i++) map[i] = NULL;
    return 0;
}

/* Writes a dataset's arrays and its description into the cache (each file
 * crash-safely: ranks writing the same file at once leave one whole copy). */
static int cache_write(const char *dir, const char *key, const char *cls, int split, const char *description,
                       int n, const char *const *what, const char *const *descr, const int64_t (*shape)[2],
                       const void *const *data, const size_t *bytes)
{
    if (!dir || !*dir) return LOOM_OK;
    char path[4400];
    cache_path(path, sizeof path, dir, key, cls, split, "description.txt");
    const void *parts[] = {description};
    const size_t sizes[] = {strlen(description)};
    int rc = loom_fs_write_atomic(path, parts, sizes, 1);
    for (int i = 0; i < n && !rc; i++) {
        cache_path(path, sizeof path, dir, key, cls, split, what[i]);
        rc = loom_npy_write(path, descr[i], shape[i], data[i], bytes[i]);
    }
    return rc;
}

/* Unmaps what came from the cache, frees what was built. */
static void release(void **map, size_t *bytes, void **owned, int n)
{
    for (int i = 0; i < n; i++) {
        if (map[i])
            munmap(map[i], bytes[i]);
        else
            loom_free(owned[i]);
        map[i] = owned[i] = NULL;
    }
}

/* ---- GPTDataset ------------------------------------------------------------------- */

static int64_t sample_at(const struct loom_gpt_dataset *g, int64_t row, int col)
{
    return g->samples_wide ? ((const int64_t *)g->samples)[2 * row + col]
                           : ((const int32_t *)g->samples)[2 * row + col];
}

static int64_t shuffle_at(const struct loom_gpt_dataset *g, int64_t i)
{
    return g->shuffle_wide ? ((const int64_t *)g->shuffle)[i] : ((const uint32_t *)g->shuffle)[i];
}

static void put_sample(struct loom_gpt_dataset *g, int64_t row, int64_t doc, int64_t off)
{
    if (g->samples_wide) {
        ((int64_t *)g->samples)[2 * row] = doc;
        ((int64_t *)g->samples)[2 * row + 1] = off;
    } else {
        ((int32_t *)g->samples)[2 * row] = (int32_t)doc;
        ((int32_t *)g->samples)[2 * row + 1] = (int32_t)off;
    }
}

/* _build_document_index: the documents [beg, end) repeated `epochs` times
 * and shuffled as one array, into out. */
static void document_order(int32_t *out, int64_t beg, int64_t end, int64_t epochs, struct loom_mt19937 *g)
{
    const int64_t n = end - beg;
    for (int64_t e = 0; e < epochs; e++)
        for (int64_t i = 0; i < n; i++) out[e * n + i] = (int32_t)(beg + i);
    loom_mt19937_shuffle(g, out, epochs * n, 4);
}

/* helpers.cpp's build_sample_idx, dropping the last partial sample. */
static void sample_index(struct loom_gpt_dataset *g, int T)
{
    const struct loom_indexed *ix = g->ix;
    int64_t d = 0, off = 0, row = 0;
    put_sample(g, row++, d, off);
    while (row <= g->nsamples) {
        int64_t remaining = T + 1;
        while (remaining != 0) {
            const int64_t len = loom_indexed_length(ix, g->doc_order[d]) - off;
            remaining -= len;
            if (remaining <= 0) {
                off += remaining + len - 1;
                remaining = 0;
            } else {
                LOOM_ASSERT(d + 1 < g->ndocs); /* enough tokens: the count above guarantees it */
                d++;
                off = 0;
            }
        }
        put_sample(g, row++, d, off);
    }
}

static void shuffle_range(struct loom_gpt_dataset *g, int64_t beg, int64_t end, struct loom_mt19937 *rs)
{
    for (int64_t i = beg; i < end; i++) {
        if (g->shuffle_wide)
            ((int64_t *)g->shuffle)[i] = i;
        else
            ((uint32_t *)g->shuffle)[i] = (uint32_t)i;
    }
    void *base = (char *)g->shuffle + beg * (g->shuffle_wide ? 8 : 4);
    loom_mt19937_shuffle(rs, base, end - beg, g->shuffle_wide ? 8 : 4);
}

/* GPTDataset over sequences [beg, end) of ix, holding at least `want`
 * samples (-1: Megatron's None, one epoch). */
static int gpt_build(struct loom_gpt_dataset *g, const struct loom_indexed *ix, int64_t beg, int64_t end,
                     int64_t want, int T, uint64_t seed, int split, const char *cache)
{
    memset(g, 0, sizeof *g);
    g->ix = ix;
    int64_t tpe = 0;
    for (int64_t s = beg; s < end; s++) tpe += loom_indexed_length(ix, s);
    if (tpe <= T + 1)
        return loom_error_set(LOOM_ERR_INPUT,
                              "%s: its %s split holds %lld sequences of %lld tokens in all, fewer than one "
                              "sample of --seq-length %d + 1 (give --split more of it, or more data)",
                              ix->prefix, split_names[split], (long long)(end - beg), (long long)tpe, T);
    int64_t epochs = 1;
    if (want >= 0)
        for (int64_t have = tpe; have < want * T + 1; have += tpe) epochs++;
    int separate = 0;
    int64_t sans = 0;
    if (epochs > 1) {
        sans = ((epochs - 1) * tpe - 1) / T;
        const int64_t from_final = want - sans, per_epoch = (tpe - 1) / T;
        separate = from_final < (int64_t)(0.80 * (double)per_epoch);
    }
    const int64_t n = end - beg;
    g->ndocs = epochs * n;
    g->nsamples = (epochs * tpe - 1) / T;
    g->samples_wide = (g->ndocs > ix->longest ? g->ndocs : ix->longest) > INT32_MAX;
    g->shuffle_wide = g->nsamples >= (int64_t)UINT32_MAX - 1;
    /* the cache: what these indices are built from, and their files */
    char real[PATH_MAX], description[PATH_MAX + 512];
    if (!realpath(ix->prefix, real)) snprintf(real, sizeof real, "%s", ix->prefix);
    snprintf(
        description, sizeof description,
        "loom GPTDataset indices, Megatron-Core's rules\nprefix %s\nsequences %lld\nbin bytes %zu\nsplit %s: "
        "sequences [%lld, %lld)\nsamples asked %lld\nsequence length %d\nseed %llu\n",
        real, (long long)ix->nseq, ix->bin_bytes, split_names[split], (long long)beg, (long long)end,
        (long long)want, T, (unsigned long long)seed);
    cache_key(g->key, description);
    static const char *const what[3] = {"document_index.npy", "sample_index.npy", "shuffle_index.npy"};
    const char *descr[3] = {"<i4", g->samples_wide ? "<i8" : "<i4", g->shuffle_wide ? "<i8" : "<u4"};
    const int64_t shape[3][2] = {{g->ndocs, 0}, {g->nsamples + 1, 2}, {g->nsamples, 0}};
    const void *data[3];
    if (cache_map(cache, g->key, "GPTDataset", split, 3, what, descr, shape, g->map, g->map_bytes, data)) {
        g->doc_order = (int32_t *)data[0]; /* read-only from here on */
        g->samples = (void *)data[1];
        g->shuffle = (void *)data[2];
        return LOOM_OK;
    }
    struct loom_mt19937 rs;
    loom_mt19937_seed(&rs, (uint32_t)seed);
    g->doc_order = loom_alloc(loom_mul_size((size_t)(g->ndocs ? g->ndocs : 1), 4), LOOM_MEM_OTHER);
    if (separate) {
        document_order(g->doc_order, beg, end, epochs - 1, &rs);
        document_order(g->doc_order + (epochs - 1) * n, beg, end, 1, &rs);
    } else
        document_order(g->doc_order, beg, end, epochs, &rs);
    g->samples =
        loom_alloc(loom_mul_size((size_t)(g->nsamples + 1), g->samples_wide ? 16 : 8), LOOM_MEM_OTHER);
    sample_index(g, T);
    g->shuffle = loom_alloc(loom_mul_size((size_t)(g->nsamples ? g->nsamples : 1), g->shuffle_wide ? 8 : 4),
                            LOOM_MEM_OTHER);
    if (separate) {
        shuffle_range(g, 0, sans, &rs);
        shuffle_range(g, sans, g->nsamples, &rs);
    } else
        shuffle_range(g, 0, g->nsamples, &rs);
    const void *built[3] = {g->doc_order, g->samples, g->shuffle};
    const size_t bytes[3] = {(size_t)g->ndocs * 4, (size_t)(g->nsamples + 1) * (g->samples_wide ? 16 : 8),
                             (size_t)g->nsamples * (g->shuffle_wide ? 8 : 4)};
    return cache_write(cache, g->key, "GPTDataset", split, description, 3, what, descr, shape, built, bytes);
}

static void gpt_free(struct loom_gpt_dataset *g)
{
    void *owned[3] = {g->doc_order, g->samples, g->shuffle};
    release(g->map, g->map_bytes, owned, 3);
    memset(g, 0, sizeof *g);
}

/* GPTDataset's sample i: T + 1 tokens. */
static void gpt_sample(const struct loom_gpt_dataset *g, int64_t i, int T, int32_t *out)
{
    const int64_t j = shuffle_at(g, i);
    const int64_t d0 = sample_at(g, j, 0), o0 = sample_at(g, j, 1);
    const int64_t d1 = sample_at(g, j + 1, 0), o1 = sample_at(g, j + 1, 1);
    int64_t k = 0;
    for (int64_t d = d0; d <= d1; d++) {
        const int64_t seq = g->doc_order[d];
        const int64_t from = d == d0 ? o0 : 0;
        const int64_t to = d == d1 ? o1 + 1 : loom_indexed_length(g->ix, seq);
        for (int64_t t = from; t < to; t++) out[k++] = (int32_t)loom_indexed_token(g->ix, seq, t);
    }
    LOOM_ASSERT(k == T + 1);
}

/* ---- BlendedDataset ---------------------------------------------------------------- */

/* helpers.cpp's build_blending_indices: the largest deficit first. */
static int blend_build(struct loom_split_stream *s, const double *w, int64_t size, int split,
                       const char *cache)
{
    s->size = size;
    char description[4096], key[17];
    int at = snprintf(description, sizeof description,
                      "loom BlendedDataset indices, Megatron-Core's rules\nsplit %s\nsize %lld\n",
                      split_names[split], (long long)size);
    for (int d = 0; d < s->n && at < (int)sizeof description - 64; d++)
        at += snprintf(description + at, sizeof description - (size_t)at, "dataset %s weight %.17g\n",
                       s->ds[d].key, w[d]);
    cache_key(key, description);
    static const char *const what[2] = {"dataset_index.npy", "dataset_sample_index.npy"};
    static const char *const descr[2] = {"<i2", "<i8"};
    const int64_t shape[2][2] = {{size, 0}, {size, 0}};
    const void *data[2];
    if (cache_map(cache, key, "BlendedDataset", split, 2, what, descr, shape, s->map, s->map_bytes, data)) {
        s->which = (int16_t *)data[0]; /* read-only from here on */
        s->which_sample = (int64_t *)data[1];
        return LOOM_OK;
    }
    s->which = loom_alloc(loom_mul_size((size_t)(size ? size : 1), 2), LOOM_MEM_OTHER);
    s->which_sample = loom_alloc(loom_mul_size((size_t)(size ? size : 1), 8), LOOM_MEM_OTHER);
    int64_t *taken = zeroed((size_t)s->n, sizeof *taken);
    for (int64_t i = 0; i < size; i++) {
        const double x = i > 1 ? (double)i : 1.0;
        int best = 0;
        double best_err = w[0] * x - (double)taken[0];
        for (int d = 1; d < s->n; d++) {
            const double err = w[d] * x - (double)taken[d];
            if (err > best_err) {
                best_err = err;
                best = d;
            }
        }
        s->which[i] = (int16_t)best;
        s->which_sample[i] = taken[best]++;
    }
    for (int d = 0; d < s->n; d++)
        if (taken[d] > s->ds[d].nsamples) {
            const int rc = loom_error_set(
                LOOM_ERR_INPUT, "%s: the %s blend takes %lld samples from it, which holds %lld",
                s->ds[d].ix->prefix, split_names[split], (long long)taken[d], (long long)s->ds[d].nsamples);
            free(taken);
            return rc;
        }
    free(taken);
    const void *built[2] = {s->which, s->which_sample};
    const size_t bytes[2] = {(size_t)size * 2, (size_t)size * 8};
    return cache_write(cache, key, "BlendedDataset", split, description, 2, what, descr, shape, built, bytes);
}

/* ---- the builder ------------------------------------------------------------------- */

static int find_or_open(struct loom_megatron_data *m, const char *path, int vocab,
                        const struct loom_indexed **out)
{
    char prefix[4200];
    if (!loom_indexed_exists(path, prefix, sizeof prefix))
        return loom_error_set(LOOM_ERR_INPUT, "%s: no Megatron dataset there (%s.bin and %s.idx)", path,
                              prefix, prefix);
    for (int i = 0; i < m->nix; i++)
        if (strcmp(m->ix[i].prefix, prefix) == 0) {
            *out = &m->ix[i];
            return LOOM_OK;
        }
    int rc = loom_indexed_open(&m->ix[m->nix], prefix, vocab);
    if (rc) return rc;
    *out = &m->ix[m->nix++];
    return LOOM_OK;
}

static int64_t bound(double x, int64_t n)
{
    return (int64_t)nearbyint(x * (double)n); /* Python's round(): half to even */
}

/* One split's stream from a blend: the split's share [a, b) of every
 * dataset. */
static int build_stream(struct loom_megatron_data *m, const struct blend *b, const double ab[2], int split,
                        const struct loom_megatron_opts *o, const struct loom_indexed *const *ix)
{
    struct loom_split_stream *s = &m->split[split];
    const int64_t size = o->sizes[split];
    s->n = b->n;
    s->ds = zeroed((size_t)b->n, sizeof *s->ds);
    int rc = LOOM_OK;
    /* one prefix: the GPTDataset itself (all its samples), unless a weight
     * makes --data-path's blend of one (a split's own blend ignores it) */
    if (b->n == 1 && (!b->weight || !o->split)) {
        rc = gpt_build(&s->ds[0], ix[0], bound(ab[0], ix[0]->nseq), bound(ab[1], ix[0]->nseq), size, o->T,
                       o->seed, split, o->cache);
        s->size = s->ds[0].nsamples;
        return rc;
    }
    double *w = loom_alloc(sizeof *w * (size_t)b->n, LOOM_MEM_OTHER);
    int64_t total = 0;
    for (int d = 0; d < b->n && !rc; d++) {
        int64_t want = -1; /* unweighted: one epoch */
        if (b->weight) {
            const double target = ceil((double)size * b->weight[d]);
            want = (int64_t)ceil(target * (1 + 0.005)); /* mid_level_dataset_surplus */
            total += (int64_t)target;
            w[d] = b->weight[d];
        }
        rc = gpt_build(&s->ds[d], ix[d], bound(ab[0], ix[d]->nseq), bound(ab[1], ix[d]->nseq), want, o->T,
                       o->seed, split, o->cache);
        if (!b->weight) {
            w[d] = (double)s->ds[d].nsamples;
            total += s->ds[d].nsamples;
        }
    }
    if (!rc) {
        if (!b->weight && size < total) total = size;
        normalize(w, b->n);
        rc = blend_build(s, w, total, split, o->cache);
    }
    loom_free(w);
    return rc;
}

int loom_megatron_open(struct loom_megatron_data *m, const struct loom_megatron_opts *o)
{
    memset(m, 0, sizeof *m);
    static const char *const flags[LOOM_NSPLITS] = {"--train-data-path", "--valid-data-path",
                                                    "--test-data-path"};
    if (o->seed > UINT32_MAX)
        return loom_error_set(LOOM_ERR_INPUT,
                              "--seed %llu: Megatron's datasets order documents with NumPy's RandomState, "
                              "whose seed is below 2^32",
                              (unsigned long long)o->seed);
    int total = 0;
    for (int k = 0; k < LOOM_NSPLITS; k++) total += o->nblend[k];
    m->ix = zeroed((size_t)total, sizeof *m->ix);
    int rc = LOOM_OK;
    if (o->cache && *o->cache && (rc = loom_fs_mkdir_p(o->cache))) return rc;
    double bounds[LOOM_NSPLITS][2];
    int present[LOOM_NSPLITS];
    if (o->split && (rc = parse_split(o->split, bounds, present))) return rc;
    for (int k = 0; k < LOOM_NSPLITS && !rc; k++) {
        const int src = o->split ? 0 : k; /* one blend cut by --split, or the split's own */
        if (!o->blend[src] || (o->split && !present[k]) || o->sizes[k] <= 0) continue;
        struct blend b;
        if ((rc = parse_blend(o->blend[src], o->nblend[src], o->split ? "--data-path" : flags[k], &b))) {
            blend_free(&b);
            break;
        }
        const struct loom_indexed **ix = zeroed((size_t)b.n, sizeof *ix);
        for (int d = 0; d < b.n && !rc; d++) rc = find_or_open(m, b.prefix[d], o->vocab, &ix[d]);
        static const double whole[2] = {0, 1};
        if (!rc) rc = build_stream(m, &b, o->split ? bounds[k] : whole, k, o, ix);
        free(ix);
        blend_free(&b);
    }
    if (rc) loom_megatron_close(m);
    return rc;
}

void loom_megatron_close(struct loom_megatron_data *m)
{
    for (int k = 0; k < LOOM_NSPLITS; k++) {
        struct loom_split_stream *s = &m->split[k];
        for (int d = 0; d < s->n; d++) gpt_free(&s->ds[d]);
        free(s->ds);
        void *owned[2] = {s->which, s->which_sample};
        release(s->map, s->map_bytes, owned, 2);
    }
    for (int i = 0; i < m->nix; i++) loom_indexed_close(&m->ix[i]);
    free(m->ix);
    memset(m, 0, sizeof *m);
}

const char *loom_megatron_sample_source(const struct loom_split_stream *s, int64_t i)
{
    return s->ds[s->which ? s->which[i] : 0].ix->prefix;
}

void loom_megatron_sample(const struct loom_split_stream *s, int64_t i, int T, int32_t *out)
{
    LOOM_ASSERT(i >= 0 && i < s->size);
    if (!s->which)
        gpt_sample(&s->ds[0], i, T, out);
    else
        gpt_sample(&s->ds[s->which[i]], s->which_sample[i], T, out);
}
