/*
 * What a run reads (see run_data.h): the flags to datasets.
 */
#include "app/run_data.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "base/log.h"
#include "io/fs.h"
#include "io/indexed.h"
#include "io/synth.h"
#include "loom/loom.h"

/* With no --data-path: the built-in corpus, generated into the cache once;
 * its entropy rate into *floor_nats. */
static int builtin_corpus(const struct loom_config *cfg, char *train_path, char *valid_path, size_t n,
                          double *floor_nats)
{
    char dir[600];
    if (*cfg->data_cache)
        snprintf(dir, sizeof dir, "%s", cfg->data_cache);
    else if (getenv("XDG_CACHE_HOME"))
        snprintf(dir, sizeof dir, "%s/loom/synth", getenv("XDG_CACHE_HOME"));
    else
        snprintf(dir, sizeof dir, "%s/.cache/loom/synth", getenv("HOME") ? getenv("HOME") : ".");
    snprintf(train_path, n, "%s/train.bin", dir);
    snprintf(valid_path, n, "%s/val.bin", dir);
    int rc;
    struct stat st;
    /* reuse the cache only when it holds this version's corpus */
    struct loom_synth_spec spec;
    struct loom_synth_model want;
    loom_synth_default(&spec);
    if ((rc = loom_synth_build(&want, &spec))) return rc;
    double cached = -1;
    if (stat(train_path, &st) == 0 && stat(valid_path, &st) == 0 &&
        loom_synth_read_floor(dir, &cached) == LOOM_OK && cached == loom_synth_entropy_rate(&want)) {
        *floor_nats = cached;
        return LOOM_OK;
    }
    if ((rc = loom_fs_mkdir_p(dir))) return rc;
    loom_log_info("generating the built-in corpus in %s\n", dir);
    return loom_data_synth(dir, LOOM_SYNTH_DEFAULT_TOKENS, LOOM_SYNTH_DEFAULT_SEED, floor_nats);
}

/* Whether the paths name Megatron datasets (PREFIX.bin + PREFIX.idx, or a
 * weighted blend W PREFIX ...) rather than token shards. */
static int megatron_words(char *const *w, int n)
{
    char prefix[4200], *end;
    for (int i = 0; i < n; i++)
        if (loom_indexed_exists(w[i], prefix, sizeof prefix)) return 1;
    return n >= 2 && n % 2 == 0 && (strtod(w[0], &end), end != w[0] && *end == 0);
}

/* Megatron datasets: one blend cut by --split, or a blend a split, with
 * the sizes Megatron asks of them; every stream the run reads. */
static int open_megatron(struct loom_run_data *r, const struct loom_config *cfg, int training)
{
    if (cfg->ndata_paths && (cfg->ntrain_paths || cfg->nvalid_paths || cfg->ntest_paths))
        return loom_error_set(LOOM_ERR_INPUT,
                              "Megatron datasets: --data-path (one blend cut by --split) does not mix with "
                              "--train-data-path, --valid-data-path or --test-data-path (a blend a split)");
    if (*cfg->split && !cfg->ndata_paths)
        return loom_error_set(LOOM_ERR_INPUT, "--split cuts --data-path's blend: not with per-split paths");
    const int64_t gbs = cfg->global_batch_size,
                  iters = training || cfg->train_iters > 0 ? cfg->train_iters : 0;
    const int64_t evals = iters && cfg->eval_interval > 0 ? iters / cfg->eval_interval + 1 : 1;
    struct loom_megatron_opts o = {
        .split = cfg->ndata_paths ? (*cfg->split ? cfg->split : "969,30,1") : NULL,
        .sizes = {iters * gbs, evals * cfg->eval_iters * gbs, (int64_t)cfg->eval_iters * gbs},
        .T = cfg->seq_length,
        .seed = (uint64_t)cfg->seed,
        .vocab = cfg->vocab_size,
        .cache = cfg->data_cache_path,
    };
    if (cfg->ndata_paths) {
        o.blend[0] = (const char *const *)cfg->data_paths;
        o.nblend[0] = cfg->ndata_paths;
    } else {
        char *const *lists[LOOM_NSPLITS] = {cfg->train_data_paths, cfg->valid_data_paths,
                                            cfg->test_data_paths};
        const int counts[LOOM_NSPLITS] = {cfg->ntrain_paths, cfg->nvalid_paths, cfg->ntest_paths};
        for (int k = 0; k < LOOM_NSPLITS; k++)
            if (counts[k]) {
                o.blend[k] = (const char *const *)lists[k];
                o.nblend[k] = counts[k];
            }
    }
    if (training && !o.blend[0])
        return loom_error_set(LOOM_ERR_INPUT,
                              "Megatron datasets: loom train needs --data-path or --train-data-path");
    /* what this command reads (a split of size 0 is not built): no
     * training split for loom eval, no test split without evaluations */
    if (!training) o.sizes[LOOM_SPLIT_TRAIN] = o.sizes[LOOM_SPLIT_TEST] = 0;
    int rc = loom_megatron_open(&r->megatron, &o);
    if (rc) return rc;
    struct loom_split_stream *s = r->megatron.split;
    if (training) {
        if (!s[LOOM_SPLIT_TRAIN].n)
            return loom_error_set(LOOM_ERR_INPUT, "--split '%s' gives training no share", o.split);
        loom_data_from_stream(&r->train, &s[LOOM_SPLIT_TRAIN], cfg->vocab_size);
        if ((rc = loom_data_check(&r->train, LOOM_DATA_SHUFFLED, cfg->global_batch_size, cfg->seq_length)))
            return rc;
    }
    /* one line of what was built: the streams, and where their indices came from */
    char line[512];
    int at = snprintf(line, sizeof line, "Megatron datasets:"), mapped = 0, all = 0;
    for (int k = 0; k < LOOM_NSPLITS; k++) {
        if (!s[k].n) continue;
        at += snprintf(line + at, sizeof line - (size_t)at, " %s %lld samples (%d dataset%s);",
                       loom_split_name(k), (long long)s[k].size, s[k].n, s[k].n == 1 ? "" : "s");
        for (int d = 0; d < s[k].n; d++) mapped += s[k].ds[d].map[0] != NULL, all++;
    }
    if (*cfg->data_cache_path)
        snprintf(line + at, sizeof line - (size_t)at, " indices: %d of %d from the cache %s", mapped, all,
                 cfg->data_cache_path);
    else
        snprintf(line + at, sizeof line - (size_t)at, " indices built in memory");
    loom_log_info("%s\n", line);
    /* a stream shorter than the run reads (an unweighted blend is one
     * epoch of each dataset): loom starts it again where Megatron stops */
    const int64_t reads[LOOM_NSPLITS] = {training ? iters * gbs : 0, (int64_t)cfg->eval_iters * gbs,
                                         (int64_t)cfg->eval_iters * gbs};
    for (int k = 0; k < LOOM_NSPLITS; k++)
        if (s[k].n && s[k].size < reads[k])
            loom_log_warn(
                "the %s stream of the Megatron datasets holds %lld samples, fewer than the %lld the run "
                "reads: it starts again from its first sample after %lld (a Megatron run stops there)",
                loom_split_name(k), (long long)s[k].size, (long long)reads[k], (long long)s[k].size);
    if (s[LOOM_SPLIT_VALID].n) {
        loom_data_from_stream(&r->valid, &s[LOOM_SPLIT_VALID], cfg->vocab_size);
        r->have_valid = 1;
    }
    if (s[LOOM_SPLIT_TEST].n) {
        loom_data_from_stream(&r->test, &s[LOOM_SPLIT_TEST], cfg->vocab_size);
        r->have_test = 1;
    }
    return LOOM_OK;
}

int loom_run_data_open(struct loom_run_data *r, const struct loom_config *cfg, int training)
{
    memset(r, 0, sizeof *r);
    int rc;
    if (cfg->mock_data && cfg->ndata_paths + cfg->nvalid_paths + cfg->ntrain_paths + cfg->ntest_paths)
        return loom_error_set(LOOM_ERR_INPUT, "--mock-data is the built-in corpus: not with --data-path, "
                                              "--train-data-path, --valid-data-path or --test-data-path");
    if (megatron_words(cfg->data_paths, cfg->ndata_paths) ||
        megatron_words(cfg->train_data_paths, cfg->ntrain_paths) ||
        megatron_words(cfg->valid_data_paths, cfg->nvalid_paths) ||
        megatron_words(cfg->test_data_paths, cfg->ntest_paths))
        return open_megatron(r, cfg, training);
    if (*cfg->split && cfg->mock_data && !cfg->ntest_paths) /* Megatron's scripts set both */
        loom_log_warn("--split %s: no effect here: --mock-data is the built-in corpus, whose validation "
                      "stream is its own",
                      cfg->split);
    else if (*cfg->split || cfg->ntest_paths)
        return loom_error_set(
            LOOM_ERR_INPUT,
            "%s takes Megatron datasets (PREFIX.bin + PREFIX.idx); token shards are named by "
            "--data-path and --valid-data-path",
            *cfg->split ? "--split" : "--test-data-path");
    if (cfg->ntrain_paths && cfg->ndata_paths)
        return loom_error_set(LOOM_ERR_INPUT,
                              "--train-data-path is --data-path for token shards: give one of them");
    char *const *train_paths = cfg->ntrain_paths ? cfg->train_data_paths : cfg->data_paths;
    const int ntrain = cfg->ntrain_paths ? cfg->ntrain_paths : cfg->ndata_paths;
    const int builtin_train = training && ntrain == 0;
    const int builtin_valid = cfg->nvalid_paths == 0 && (training ? ntrain == 0 : cfg->mock_data);
    if (builtin_train || builtin_valid) {
        char train_path[700], valid_path[700];
        double floor_nats = 0;
        if ((rc = builtin_corpus(cfg, train_path, valid_path, sizeof train_path, &floor_nats))) return rc;
        const char *tp = train_path, *vp = valid_path;
        if (builtin_train && (rc = loom_data_open(&r->train, &tp, 1, cfg->vocab_size))) return rc;
        if (builtin_valid) {
            if ((rc = loom_data_open(&r->valid, &vp, 1, cfg->vocab_size))) return rc;
            r->have_valid = 1;
            r->floor_nats = floor_nats;
        }
    }
    if (training && ntrain &&
        (rc = loom_data_open(&r->train, (const char *const *)train_paths, ntrain, cfg->vocab_size)))
        return rc;
    if (training && (rc = loom_data_check(&r->train, (enum loom_data_order)cfg->data_order,
                                          cfg->global_batch_size, cfg->seq_length)))
        return rc;
    if (cfg->nvalid_paths) {
        if ((rc = loom_data_open(&r->valid, (const char *const *)cfg->valid_data_paths, cfg->nvalid_paths,
                                 cfg->vocab_size)))
            return rc;
        r->have_valid = 1;
    }
    if (r->have_valid && cfg->eval_iters > 0 &&
        (rc = loom_data_check(&r->valid, LOOM_DATA_SHUFFLED, cfg->global_batch_size, cfg->seq_length)))
        return rc;
    return LOOM_OK;
}

void loom_run_data_close(struct loom_run_data *d)
{
    loom_data_close(&d->train);
    if (d->have_valid) loom_data_close(&d->valid);
    if (d->have_test) loom_data_close(&d->test);
    loom_megatron_close(&d->megatron);
}
