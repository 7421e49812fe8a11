/*
 * Datasets and samplers: path and glob expansion, the shuffled and the
 * sequential orders (sampler.h states both contracts).
 *
 * Locating a window or block walks the shard list linearly: datasets have at
 * most thousands of shards and a batch has at most thousands of rows, so the
 * walk costs far less than copying the tokens. The shuffled order draws with
 * replacement (a counter-based hash, no permutation state), so one "epoch"
 * is a count of windows, not a guarantee that each is seen once.
 */
#include "io/sampler.h"

#include <assert.h>
#include <errno.h>
#include <glob.h>
#include <setjmp.h>
#include <signal.h>
#include <stdlib.h>
#include <string.h>

#include "base/log.h"
#include "base/mem.h"
#include "base/rng.h"

static const char *const order_names[] = {
    [LOOM_DATA_SHUFFLED] = "shuffled",
    [LOOM_DATA_SEQUENTIAL] = "sequential",
};
static_assert(sizeof order_names / sizeof order_names[0] == LOOM_DATA_ORDER_COUNT,
              "order_names must name every enum loom_data_order");

const char *loom_data_order_name(enum loom_data_order order)
{
    LOOM_ASSERT((int)order >= 0 && order < LOOM_DATA_ORDER_COUNT);
    return order_names[order];
}

int loom_data_order_parse(const char *name, enum loom_data_order *out)
{
    for (int i = 0; i < LOOM_DATA_ORDER_COUNT; i++) {
        if (strcmp(name, order_names[i]) == 0) {
            *out = (enum loom_data_order)i;
            return LOOM_OK;
        }
    }
    return loom_error_set(LOOM_ERR_INPUT, "unknown data order '%s' (choose shuffled or sequential)", name);
}

/* ---- opening ------------------------------------------------------------- */

struct path_list {
    char **items;
    int n, cap;
};

static void path_list_push(struct path_list *l, const char *path)
{
    if (l->n == l->cap) {
        int cap = l->cap ? 2 * l->cap : 8;
        char **items = loom_alloc(loom_mul_size((size_t)cap, sizeof *items), LOOM_MEM_OTHER);
        if (l->n) memcpy(items, l->items, (size_t)l->n * sizeof *items);
        loom_free(l->items);
        l->items = items;
        l->cap = cap;
    }
    size_t len = strlen(path) + 1;
    l->items[l->n] = loom_alloc(len, LOOM_MEM_OTHER);
    memcpy(l->items[l->n], path, len);
    l->n++;
}

static void path_list_free(struct path_list *l)
{
    for (int i = 0; i < l->n; i++) loom_free(l->items[i]);
    loom_free(l->items);
    memset(l, 0, sizeof *l);
}

/* A path with a glob metacharacter is a pattern; anything else is a file
 * name used as given (so a missing file is reported by open, with errno). */
static int expand_path(struct path_list *l, const char *path)
{
    if (!strpbrk(path, "*?[")) {
        path_list_push(l, path);
        return LOOM_OK;
    }
    glob_t g;
    memset(&g, 0, sizeof g);
    int rc = glob(path, 0, NULL, &g);
    int status = LOOM_OK;
    if (rc == GLOB_NOMATCH)
        status = loom_error_set(LOOM_ERR_INPUT, "data path pattern '%s' matches no file", path);
    else if (rc == GLOB_ABORTED)
        status =
            loom_error_set(LOOM_ERR_INPUT, "glob '%s': cannot read a directory: %s", path, strerror(errno));
    else if (rc != 0)
        status = loom_error_set(LOOM_ERR_RUNTIME, "glob '%s': out of memory", path);
    else
        for (size_t i = 0; i < g.gl_pathc; i++) path_list_push(l, g.gl_pathv[i]);
    globfree(&g);
    return status;
}

int loom_data_open(struct loom_data *d, const char *const *paths, int npaths, int vocab)
{
    memset(d, 0, sizeof *d);
    if (npaths <= 0) return loom_error_set(LOOM_ERR_INPUT, "no data path given");
    if (vocab <= 0) return loom_error_set(LOOM_ERR_INPUT, "vocabulary size %d must be positive", vocab);
    struct path_list list = {0};
    int status = LOOM_OK;
    for (int i = 0; i < npaths && status == LOOM_OK; i++) status = expand_path(&list, paths[i]);
    if (status != LOOM_OK) goto fail;

    d->shards = loom_alloc(loom_mul_size((size_t)list.n, sizeof *d->shards), LOOM_MEM_OTHER);
    d->vocab = vocab;
    for (int i = 0; i < list.n; i++) {
        status = loom_shard_open(&d->shards[i], list.items[i], vocab);
        if (status != LOOM_OK) goto fail;
        d->nshards = i + 1;
        d->tokens += d->shards[i].n;
    }
    path_list_free(&list);
    return LOOM_OK;

fail:
    path_list_free(&list);
    loom_data_close(d);
    return status;
}

void loom_data_close(struct loom_data *d)
{
    for (int i = 0; i < d->nshards; i++) loom_shard_close(&d->shards[i]);
    loom_free(d->shards);
    memset(d, 0, sizeof *d);
}

/* ---- orders -------------------------------------------------------------- */

static int64_t shard_windows(const struct loom_shard *s, int T)
{
    return s->n > T ? s->n - T : 0;
}

static int64_t shard_blocks(const struct loom_shard *s, int64_t block)
{
    return s->n > 0 ? (s->n - 1) / block : 0;
}

static int64_t total_windows(const struct loom_data *d, int T)
{
    int64_t w = 0;
    for (int i = 0; i < d->nshards; i++) w += shard_windows(&d->shards[i], T);
    return w;
}

static int64_t total_blocks(const struct loom_data *d, int64_t block)
{
    int64_t b = 0;
    for (int i = 0; i < d->nshards; i++) b += shard_blocks(&d->shards[i], block);
    return b;
}

/* Index of the largest shard (the first of equals); -1 when there is none. */
static int largest_shard(const struct loom_data *d)
{
    int best = -1;
    for (int i = 0; i < d->nshards; i++)
        if (best < 0 || d->shards[i].n > d->shards[best].n) best = i;
    return best;
}

int64_t loom_data_largest_shard(const struct loom_data *d)
{
    int i = largest_shard(d);
    return i < 0 ? 0 : d->shards[i].n;
}

void loom_data_from_stream(struct loom_data *d, const struct loom_split_stream *s, int vocab)
{
    memset(d, 0, sizeof *d);
    d->stream = s;
    d->vocab = vocab;
}

int loom_data_check(const struct loom_data *d, enum loom_data_order order, int global_rows, int T)
{
    LOOM_ASSERT((int)order >= 0 && order < LOOM_DATA_ORDER_COUNT);
    if (global_rows <= 0 || T <= 0)
        return loom_error_set(LOOM_ERR_INPUT, "batch of %d rows of %d tokens: both must be positive",
                              global_rows, T);
    if (d->stream) {
        if (d->stream->size < global_rows)
            return loom_error_set(LOOM_ERR_INPUT,
                                  "a Megatron dataset split of %lld samples: fewer than one batch of %d",
                                  (long long)d->stream->size, global_rows);
        return LOOM_OK;
    }
    int big = largest_shard(d);
    const char *name = big < 0 ? "none" : d->shards[big].path;
    if (order == LOOM_DATA_SEQUENTIAL) {
        int64_t block = (int64_t)global_rows * T;
        if (total_blocks(d, block) == 0)
            return loom_error_set(LOOM_ERR_INPUT,
                                  "data too small for the sequential order: a batch reads a block "
                                  "of B*T+1 = %d*%d+1 = %lld tokens from one shard, and the "
                                  "largest of the %d shard(s), '%s', holds %lld",
                                  global_rows, T, (long long)(block + 1), d->nshards, name,
                                  (long long)loom_data_largest_shard(d));
    } else if (total_windows(d, T) == 0) {
        return loom_error_set(LOOM_ERR_INPUT,
                              "data too small: a row reads T+1 = %d tokens from one shard, and "
                              "the largest of the %d shard(s), '%s', holds %lld",
                              T + 1, d->nshards, name, (long long)loom_data_largest_shard(d));
    }
    return LOOM_OK;
}

int64_t loom_data_batches(const struct loom_data *d, enum loom_data_order order, int global_rows, int T)
{
    if (d->stream) return d->stream->size / global_rows;
    if (order == LOOM_DATA_SEQUENTIAL) return total_blocks(d, (int64_t)global_rows * T);
    return total_windows(d, T) / global_rows;
}

/* ---- reading a mapped shard that may change under the run ------------------------ */

/* A shard's tokens are its file's pages: a file truncated under the run
 * raises SIGBUS on the pages past its new end, and one rewritten in place
 * shows its new bytes. Rows are copied under a SIGBUS guard and checked
 * against the vocabulary, so either is one error naming the file and the
 * position, not a crash or a wrong embedding row. */
static __thread sigjmp_buf *volatile bus_guard; /* volatile: set before the reads it guards */

static void on_sigbus(int sig)
{
    if (bus_guard) siglongjmp(*bus_guard, 1);
    signal(sig, SIG_DFL);
    raise(sig);
}

static void guard_install(void)
{
    static int done;
    if (done) return;
    done = 1;
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_handler = on_sigbus;
    sigemptyset(&sa.sa_mask);
    sigaction(SIGBUS, &sa, NULL);
}

/* Copies the window of T+1 tokens at position pos of shard s into one row
 * of inputs/targets. */
static int copy_row(const struct loom_data *d, const struct loom_shard *s, int64_t pos, int T,
                    int32_t *inputs, int32_t *targets)
{
    const uint16_t *volatile src = s->tokens ? s->tokens + pos : NULL;
    const uint32_t *volatile src32 = s->tokens32 ? s->tokens32 + pos : NULL;
    sigjmp_buf jump;
    if (sigsetjmp(jump, 1)) {
        bus_guard = NULL;
        return loom_error_set(LOOM_ERR_RUNTIME,
                              "data shard '%s' changed while training: position %lld is past its end now "
                              "(the file was truncated)",
                              s->path, (long long)pos);
    }
    guard_install();
    bus_guard = &jump;
    int bad = -1;
    for (int t = 0; t < T; t++) { /* ids compared as int64: a 32-bit id past INT32_MAX is bad too */
        const int64_t a = src32 ? (int64_t)src32[t] : src[t], b = src32 ? (int64_t)src32[t + 1] : src[t + 1];
        inputs[t] = (int32_t)a;
        targets[t] = (int32_t)b;
        if (a >= d->vocab || b >= d->vocab) bad = bad < 0 ? t : bad;
    }
    bus_guard = NULL;
    if (bad >= 0 && d->vocab > 0) {
        const int64_t at = pos + bad + (loom_shard_token(s, pos + bad) < (uint32_t)d->vocab);
        return loom_error_set(LOOM_ERR_RUNTIME,
                              "data shard '%s' changed while training: token %u at position %lld is outside "
                              "the vocabulary (size %d)",
                              s->path, loom_shard_token(s, at), (long long)at, d->vocab);
    }
    return LOOM_OK;
}

/* Sample `i` of a Megatron stream (modulo its size: a run longer than the
 * one its sizes were built for starts it again) into one row, through buf
 * (T + 1 tokens), under the same guard as copy_row. */
static int copy_sample(const struct loom_data *d, int64_t i, int T, int32_t *buf, int32_t *inputs,
                       int32_t *targets)
{
    const int64_t k = i % d->stream->size;
    sigjmp_buf jump;
    if (sigsetjmp(jump, 1)) {
        bus_guard = NULL;
        return loom_error_set(
            LOOM_ERR_RUNTIME,
            "Megatron dataset '%s' changed while training: sample %lld is past its end now (the "
            "file was truncated)",
            loom_megatron_sample_source(d->stream, k), (long long)i);
    }
    guard_install();
    bus_guard = &jump;
    loom_megatron_sample(d->stream, k, T, buf);
    bus_guard = NULL;
    for (int t = 0; t <= T; t++)
        if (buf[t] < 0 || (d->vocab > 0 && buf[t] >= d->vocab))
            return loom_error_set(LOOM_ERR_RUNTIME,
                                  "Megatron dataset '%s' changed while training: token %d of sample %lld is "
                                  "outside the vocabulary (size %d)",
                                  loom_megatron_sample_source(d->stream, k), buf[t], (long long)i, d->vocab);
    memcpy(inputs, buf, sizeof *buf * (size_t)T);
    memcpy(targets, buf + 1, sizeof *buf * (size_t)T);
    return LOOM_OK;
}

static int batch_stream(const struct loom_data *d, int64_t first, int row_begin, int rows, int T,
                        int32_t *inputs, int32_t *targets)
{
    int32_t *buf = malloc(sizeof *buf * (size_t)(T + 1)); /* a sample is T + 1 tokens, a row T */
    if (!buf) loom_die("out of memory reading a batch");
    int rc = LOOM_OK;
    for (int i = 0; i < rows && rc == LOOM_OK; i++)
        rc = copy_sample(d, first + row_begin + i, T, buf, inputs + (size_t)i * T, targets + (size_t)i * T);
    free(buf);
    return rc;
}

/* Uniform in [0, n) from 64 random bits (multiply-high; the bias is below
 * n / 2^64, far under anything a training run can measure). */
static int64_t scale_below(uint64_t h, int64_t n)
{
    return (int64_t)(((unsigned __int128)h * (uint64_t)n) >> 64);
}

static int batch_shuffled(const struct loom_data *d, uint64_t seed, int64_t step, int row_begin, int rows,
                          int T, int32_t *inputs, int32_t *targets)
{
    int64_t W = total_windows(d, T);
    LOOM_ASSERT(W > 0);
    int rc = LOOM_OK;
    for (int i = 0; i < rows && rc == LOOM_OK; i++) {
        int64_t r = row_begin + i;
        int64_t w = scale_below(loom_hash3(seed, (uint64_t)step, (uint64_t)r), W);
        int s = 0;
        while (w >= shard_windows(&d->shards[s], T)) {
            w -= shard_windows(&d->shards[s], T);
            s++;
        }
        rc = copy_row(d, &d->shards[s], w, T, inputs + (size_t)i * T, targets + (size_t)i * T);
    }
    return rc;
}

static int batch_sequential(const struct loom_data *d, int64_t step, int global_rows, int row_begin, int rows,
                            int T, int32_t *inputs, int32_t *targets)
{
    int64_t block = (int64_t)global_rows * T;
    int64_t nb = total_blocks(d, block);
    LOOM_ASSERT(nb > 0);
    int64_t k = step % nb;
    int s = 0;
    while (k >= shard_blocks(&d->shards[s], block)) {
        k -= shard_blocks(&d->shards[s], block);
        s++;
    }
    int rc = LOOM_OK;
    for (int i = 0; i < rows && rc == LOOM_OK; i++)
        rc = copy_row(d, &d->shards[s], k * block + (int64_t)(row_begin + i) * T, T, inputs + (size_t)i * T,
                      targets + (size_t)i * T);
    return rc;
}

int loom_data_batch_from(const struct loom_data *d, enum loom_data_order order, uint64_t seed, int64_t step,
                         int64_t first, int global_rows, int row_begin, int rows, int T, int32_t *inputs,
                         int32_t *targets)
{
    LOOM_ASSERT(step >= 0 && first >= 0 && T > 0 && global_rows > 0);
    LOOM_ASSERT(row_begin >= 0 && rows >= 0 && row_begin + rows <= global_rows);
    if (d->stream) return batch_stream(d, first, row_begin, rows, T, inputs, targets);
    if (order == LOOM_DATA_SEQUENTIAL) {
        LOOM_ASSERT(first == step * global_rows);
        return batch_sequential(d, step, global_rows, row_begin, rows, T, inputs, targets);
    }
    return batch_shuffled(d, seed, step, row_begin, rows, T, inputs, targets);
}

int loom_data_batch(const struct loom_data *d, enum loom_data_order order, uint64_t seed, int64_t step,
                    int global_rows, int row_begin, int rows, int T, int32_t *inputs, int32_t *targets)
{
    return loom_data_batch_from(d, order, seed, step, step * global_rows, global_rows, row_begin, rows, T,
                                inputs, targets);
}

int loom_data_eval_batch(const struct loom_data *d, int64_t index, int global_rows, int row_begin, int rows,
                         int T, int32_t *inputs, int32_t *targets)
{
    if (d->stream) return batch_stream(d, index * global_rows, row_begin, rows, T, inputs, targets);
    return loom_data_batch(d, LOOM_DATA_SHUFFLED, LOOM_DATA_EVAL_SEED, index, global_rows, row_begin, rows, T,
                           inputs, targets);
}
