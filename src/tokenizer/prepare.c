/*
 * Data preparation with a BPE tokenizer (see prepare.h): documents read
 * from .txt and .jsonl files, encoded in parallel (OpenMP, one tokenizer
 * state per thread, a batch of documents at a time, results appended in
 * document order so the output does not depend on the thread count), and
 * written as llm.c shards; or pre-tokenized and counted to learn merges.
 */
#define _GNU_SOURCE /* memmem */
#include "tokenizer/prepare.h"

#include <cJSON.h>
#include <dirent.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>
#include <xxhash.h>
#ifdef _OPENMP
#include <omp.h>
#endif

#include "base/clock.h"
#include "base/log.h"
#include "base/mem.h"
#include "io/fs.h"
#include "io/indexed.h"
#include "io/shard.h"
#include "loom/loom.h"
#include "tokenizer/bpe.h"
#include "tokenizer/bpe_learn.h"
#include "tokenizer/jsonl_text.h"
#include "tokenizer/tokenizer.h"

enum { BATCH_DOCS = 4096, BATCH_BYTES = 16 << 20 };
#define MAX_INPUT_FILE (1LL << 40)

/* ---- documents ---------------------------------------------------------------- */

struct doc {
    const char *p; /* .jsonl: the line; else the text */
    size_t n;
    int64_t line; /* 1-based line of a .jsonl document; its first line for text */
};

/* One input file, whole, and its documents. */
struct file_docs {
    const char *path;
    char *text;
    size_t len;
    int jsonl;
    struct doc *docs;
    size_t n_docs;
};

static int ends_with(const char *s, const char *suffix)
{
    const size_t a = strlen(s), b = strlen(suffix);
    return a >= b && strcmp(s + a - b, suffix) == 0;
}

static void add_doc(struct file_docs *f, size_t *cap, const char *p, size_t n, int64_t line)
{
    if (f->n_docs == *cap) {
        *cap = *cap ? 2 * *cap : 1024;
        f->docs = realloc(f->docs, *cap * sizeof *f->docs);
        if (!f->docs) loom_die("out of memory reading %s", f->path);
    }
    f->docs[f->n_docs++] = (struct doc){p, n, line};
}

static int read_docs(const char *path, const struct loom_prepare_opts *o, struct file_docs *f)
{
    memset(f, 0, sizeof *f);
    f->path = path;
    f->jsonl = ends_with(path, ".jsonl");
    int rc = loom_fs_read_small(path, (size_t)MAX_INPUT_FILE, &f->text, &f->len);
    if (rc) return rc;
    size_t cap = 0;
    if (f->jsonl) {
        int64_t line = 0;
        for (char *p = f->text, *end; p < f->text + f->len; p = end + 1) {
            end = memchr(p, '\n', (size_t)(f->text + f->len - p));
            if (!end) end = f->text + f->len;
            line++;
            size_t n = (size_t)(end - p);
            while (n && (p[n - 1] == '\r' || p[n - 1] == ' ' || p[n - 1] == '\t')) n--;
            if (n) add_doc(f, &cap, p, n, line);
        }
    } else if (o->blank_line_docs) {
        /* blocks between lines that are empty (or only \r) */
        int64_t line = 1, start_line = 1;
        const char *start = f->text, *p = f->text, *end = f->text + f->len;
        while (p < end) {
            const char *nl = memchr(p, '\n', (size_t)(end - p));
            const char *next = nl ? nl + 1 : end;
            const int blank = (size_t)(next - p) <= 2 && (p == nl || (*p == '\r' && p + 1 == nl));
            if (blank) {
                if (p > start) add_doc(f, &cap, start, (size_t)(p - start - (p[-1] == '\n')), start_line);
                start = next;
                start_line = line + 1;
            }
            p = next;
            line++;
        }
        if (end > start) add_doc(f, &cap, start, (size_t)(end - start), start_line);
    } else if (f->len) {
        add_doc(f, &cap, f->text, f->len, 1);
    }
    return LOOM_OK;
}

static void free_docs(struct file_docs *f)
{
    loom_free(f->text);
    free(f->docs);
}

/* The text of a .jsonl line (a string cJSON owns, in *json, or one decoded
 * here, in *owned, to free) or the document itself; LOOM_ERR_INPUT with
 * the message in err. */
static int doc_text(const struct file_docs *f, const struct doc *d, const char *key, cJSON **json,
                    char **owned, const char **text, size_t *n, char *err, size_t err_n)
{
    *json = NULL;
    *owned = NULL;
    if (!f->jsonl) {
        *text = d->p, *n = d->n;
        return LOOM_OK;
    }
    *json = cJSON_ParseWithLength(d->p, d->n);
    if (!*json || !cJSON_IsObject(*json)) {
        snprintf(err, err_n, "%s:%lld: not a JSON object", f->path, (long long)d->line);
        return LOOM_ERR_INPUT;
    }
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(*json, key);
    if (!v) {
        snprintf(err, err_n, "%s:%lld: no \"%s\" key (--text-key)", f->path, (long long)d->line, key);
        return LOOM_ERR_INPUT;
    }
    if (!cJSON_IsString(v)) {
        snprintf(err, err_n, "%s:%lld: \"%s\" is not a string", f->path, (long long)d->line, key);
        return LOOM_ERR_INPUT;
    }
    *text = v->valuestring, *n = strlen(v->valuestring);
    /* cJSON's string ends at a \u0000 escape: such a line's text is decoded
     * whole here (its length from the decoding, not strlen) */
    if (memmem(d->p, d->n, "\\u0000", 6) && loom_jsonl_text(d->p, d->n, key, owned, n) == 0) *text = *owned;
    return LOOM_OK;
}

static int threads(void)
{
#ifdef _OPENMP
    return omp_get_max_threads();
#else
    return 1;
#endif
}

static int thread_id(void)
{
#ifdef _OPENMP
    return omp_get_thread_num();
#else
    return 0;
#endif
}

static void progress(const struct loom_prepare_opts *o, const char *what, double done, double total,
                     int64_t tokens, double t0, int final)
{
    if (!o->progress || !isatty(STDERR_FILENO)) return;
    const double dt = loom_now() - t0;
    fprintf(stderr, "\r%s: %.1f of %.1f MB (%.0f%%), %lld tokens, %.1f MB/s   %s", what, done / 1e6,
            total / 1e6, total > 0 ? 100 * done / total : 100, (long long)tokens,
            dt > 0 ? done / 1e6 / dt : 0, final ? "\n" : "");
    fflush(stderr);
}

/* ---- shards ------------------------------------------------------------------- */

struct shard_out {
    const char *dir, *prefix;
    uint16_t *buf;   /* (size) ids below 65,536: llm.c's version 1 shards */
    uint32_t *buf32; /* (size) a larger vocabulary's: version 2 (32-bit) shards; the other NULL */
    int64_t n, size, total;
    int index;
};

static int shard_flush(struct shard_out *s)
{
    if (!s->n) return LOOM_OK;
    char path[4096];
    snprintf(path, sizeof path, "%s/%s_%06d.bin", s->dir, s->prefix, s->index);
    const int rc = s->buf32 ? loom_shard_write32(path, s->buf32, s->n) : loom_shard_write(path, s->buf, s->n);
    s->index++;
    s->n = 0;
    return rc;
}

static int shard_push(struct shard_out *s, const int32_t *ids, size_t n)
{
    for (size_t i = 0; i < n; i++) {
        if (s->buf32)
            s->buf32[s->n++] = (uint32_t)ids[i];
        else
            s->buf[s->n++] = (uint16_t)ids[i];
        s->total++;
        if (s->n == s->size) {
            const int rc = shard_flush(s);
            if (rc) return rc;
        }
    }
    return LOOM_OK;
}

/* Removes the shards s wrote (a run that failed leaves none behind). */
static void shard_remove(struct shard_out *s)
{
    for (int i = 0; i < s->index; i++) {
        char path[4096];
        snprintf(path, sizeof path, "%s/%s_%06d.bin", s->dir, s->prefix, i);
        unlink(path);
    }
}

/* LOOM_ERR_INPUT when outdir already holds train_*.bin or val_*.bin: the
 * new shards would not replace them all, and a glob over the directory
 * would train on both corpora without a word. */
static int check_no_shards(const char *outdir)
{
    DIR *d = opendir(outdir);
    if (!d) return loom_error_set(LOOM_ERR_INPUT, "open directory %s: %s", outdir, strerror(errno));
    char found[256] = "";
    int64_t n = 0;
    for (struct dirent *e; (e = readdir(d));)
        if ((strncmp(e->d_name, "train_", 6) == 0 || strncmp(e->d_name, "val_", 4) == 0) &&
            ends_with(e->d_name, ".bin") && n++ == 0)
            snprintf(found, sizeof found, "%s", e->d_name);
    closedir(d);
    if (n)
        return loom_error_set(
            LOOM_ERR_INPUT,
            "OUTDIR %s already holds %lld shard%s of an earlier run (%s): new shards would mix "
            "with them under a train_*.bin glob; remove them or choose another directory",
            outdir, (long long)n, n == 1 ? "" : "s", found);
    return LOOM_OK;
}

/* The inputs' total size, for the progress line; each must be a regular
 * file (a FIFO is refused here, before any output is made). */
static int total_bytes(const char *const *in, int n_in, double *total)
{
    *total = 0;
    for (int i = 0; i < n_in; i++) {
        struct stat st;
        int fd;
        const int rc = loom_fs_open_input(in[i], "input", &fd, &st);
        if (rc) return rc;
        close(fd);
        *total += (double)st.st_size;
    }
    return LOOM_OK;
}

/* Where tokenized documents go: llm.c shards (train and validation), or
 * a Megatron indexed dataset. */
struct sink {
    struct shard_out train, val;
    struct loom_indexed_writer *megatron;
    int64_t megatron_tokens;
};

/* What goes around a document: the tokenizer's template, or (shards
 * without one) the end of text before it. */
struct frame {
    int32_t eot, pre[4], post[4];
    int n_pre, n_post;
};

static struct frame frame_of(const struct loom_tokenizer *t, const struct loom_prepare_opts *o)
{
    struct frame f = {.eot = loom_tokenizer_eot(t)};
    if (o->megatron) { /* Megatron's ids: no template */
        if (o->megatron_bos && loom_tokenizer_bos(t) >= 0) f.pre[f.n_pre++] = loom_tokenizer_bos(t);
        return f;
    }
    loom_tokenizer_template(t, f.pre, &f.n_pre, f.post, &f.n_post);
    if (!f.n_pre && !f.n_post) f.pre[f.n_pre++] = f.eot;
    return f;
}

static int sink_document(struct sink *k, const struct loom_prepare_opts *o, int64_t index,
                         const struct frame *f, struct loom_ids *doc)
{
    if (k->megatron) {
        if (o->append_eod && doc->n) loom_ids_push(doc, f->eot);
        k->megatron_tokens += (int64_t)doc->n;
        return loom_indexed_writer_add(k->megatron, doc->ids, (int64_t)doc->n);
    }
    /* every 1/f-th document to validation, spread evenly */
    const int to_val =
        (int64_t)((double)(index + 1) * o->val_fraction) > (int64_t)((double)index * o->val_fraction);
    struct shard_out *s = to_val ? &k->val : &k->train;
    int rc = shard_push(s, f->pre, (size_t)f->n_pre);
    if (!rc) rc = shard_push(s, doc->ids, doc->n);
    return rc ? rc : shard_push(s, f->post, (size_t)f->n_post);
}

/* Tokenizes every document of the inputs into the sink, in order; the
 * documents' count into *n_docs, the input bytes into *done. */
static int tokenize_into(struct loom_tokenizer *t, const char *const *in, int n_in,
                         const struct loom_prepare_opts *o, struct sink *k, int64_t *n_docs, double total,
                         double *done)
{
    const struct frame frame = frame_of(t, o);
#ifdef _OPENMP
    if (o->threads > 0) omp_set_num_threads(o->threads);
#endif
    const int nt = threads();
    struct loom_tokenizer_state **states = calloc((size_t)nt, sizeof *states);
    struct loom_ids *out = calloc(BATCH_DOCS, sizeof *out);
    int *bad = calloc(BATCH_DOCS, sizeof *bad);
    char(*err)[512] = calloc(BATCH_DOCS, sizeof *err);
    if (!states || !out || !bad || !err) loom_die("out of memory preparing data");
    for (int i = 0; i < nt; i++) states[i] = loom_tokenizer_state_new(t);
    const double t0 = loom_now();
    int rc = LOOM_OK;
    for (int fi = 0; fi < n_in && !rc; fi++) {
        struct file_docs f;
        if ((rc = read_docs(in[fi], o, &f))) break;
        for (size_t b = 0; b < f.n_docs && !rc;) {
            size_t e = b, bytes = 0;
            while (e < f.n_docs && e - b < BATCH_DOCS && (e == b || bytes < BATCH_BYTES))
                bytes += f.docs[e++].n;
            const int64_t m = (int64_t)(e - b);
#pragma omp parallel for schedule(dynamic, 1)
            for (int64_t i = 0; i < m; i++) {
                cJSON *json;
                char *owned;
                const char *text;
                size_t n;
                out[i].n = 0;
                bad[i] = doc_text(&f, &f.docs[b + (size_t)i], o->text_key, &json, &owned, &text, &n, err[i],
                                  sizeof err[i]);
                if (!bad[i]) {
                    /* Megatron's beginning of text is part of the document's sequence */
                    if (o->megatron)
                        for (int j = 0; j < frame.n_pre; j++) loom_ids_push(&out[i], frame.pre[j]);
                    loom_tokenizer_encode(t, states[thread_id()], text, n, &out[i]);
                }
                cJSON_Delete(json);
                free(owned);
            }
            for (int64_t i = 0; i < m && !rc; i++)
                rc = bad[i] ? loom_error_set(LOOM_ERR_INPUT, "%s", err[i])
                            : sink_document(k, o, (*n_docs)++, &frame, &out[i]);
            *done += (double)bytes;
            progress(o, "loom data tokenize", *done, total,
                     k->megatron ? k->megatron_tokens : k->train.total + k->val.total, t0, 0);
            b = e;
        }
        free_docs(&f);
    }
    progress(o, "loom data tokenize", *done, total,
             k->megatron ? k->megatron_tokens : k->train.total + k->val.total, t0, 1);
    for (int i = 0; i < nt; i++) loom_tokenizer_state_free(states[i]);
    for (int i = 0; i < BATCH_DOCS; i++) loom_ids_free(&out[i]);
    free(states);
    free(out);
    free(bad);
    free(err);
    return rc;
}

/* The tokenizer, with an end-of-text token when `need` names what it is
 * for (NULL: not needed). */
static int load_tokenizer(const char *tokenizer, const struct loom_prepare_opts *o, const char *need,
                          struct loom_tokenizer **t)
{
    int rc = loom_tokenizer_load(tokenizer, o->merge_file, t);
    if (rc || !need || loom_tokenizer_eot(*t) >= 0) return rc;
    int32_t pre[4], post[4];
    int n_pre, n_post;
    loom_tokenizer_template(*t, pre, &n_pre, post, &n_post);
    if (!o->megatron && n_pre + n_post) return rc; /* the template marks the documents */
    loom_tokenizer_free(*t);
    return loom_error_set(LOOM_ERR_INPUT,
                          "%s: no end-of-text token (<|endoftext|>, <|end_of_text|>, </s> or <eos>) %s",
                          tokenizer, need);
}

/* LOOM_ERR_INPUT when the inputs held no document. */
static int some_documents(int64_t n_docs, int n_in)
{
    return n_docs
               ? LOOM_OK
               : loom_error_set(LOOM_ERR_INPUT,
                                "loom data tokenize: no document in the input%s (empty, or only blank lines)",
                                n_in == 1 ? "" : "s");
}

int loom_prepare_tokenize(const char *tokenizer, const char *const *in, int n_in, const char *outdir,
                          const struct loom_prepare_opts *o)
{
    struct loom_tokenizer *t;
    int rc = load_tokenizer(tokenizer, o, "to put between documents", &t);
    if (rc) return rc;
    const int32_t vocab = loom_tokenizer_vocab_size(t);
    const struct frame frame = frame_of(t, o);
    double total;
    const int made_dir = !loom_fs_is_dir(outdir);
    if ((rc = total_bytes(in, n_in, &total)) || (rc = loom_fs_mkdir_p(outdir)) ||
        (rc = check_no_shards(outdir))) {
        loom_tokenizer_free(t);
        return rc;
    }
    struct sink k = {.train = {.dir = outdir, .prefix = "train", .size = o->shard_size},
                     .val = {.dir = outdir, .prefix = "val", .size = o->shard_size}};
    const int wide = vocab > 65536; /* 32-bit shards where 16 bits cannot hold the ids */
    const size_t width = wide ? sizeof(uint32_t) : sizeof(uint16_t);
    for (int i = 0; i < 2; i++) {
        struct shard_out *s = i ? &k.val : &k.train;
        void *b = loom_alloc(loom_mul_size((size_t)o->shard_size, width), LOOM_MEM_OTHER);
        if (wide)
            s->buf32 = b;
        else
            s->buf = b;
    }
    const double t0 = loom_now();
    double done = 0;
    int64_t n_docs = 0;
    rc = tokenize_into(t, in, n_in, o, &k, &n_docs, total, &done);
    if (!rc) rc = some_documents(n_docs, n_in);
    if (!rc) rc = shard_flush(&k.train);
    if (!rc) rc = shard_flush(&k.val);
    if (rc) { /* nothing half-made left: this run's shards, and OUTDIR when it made it */
        shard_remove(&k.train);
        shard_remove(&k.val);
        if (made_dir) rmdir(outdir);
    }
    char marks[96];
    if (frame.n_pre == 1 && !frame.n_post && frame.pre[0] == frame.eot)
        snprintf(marks, sizeof marks, "end of text %d before each document", frame.eot);
    else
        snprintf(marks, sizeof marks, "%d id%s before and %d after each document (the tokenizer's template)",
                 frame.n_pre, frame.n_pre == 1 ? "" : "s", frame.n_post);
    if (!rc)
        printf("wrote %lld tokens of %lld documents to %s: %lld train in %d shard%s, %lld validation in %d "
               "shard%s "
               "(tokenizer %s, %d ids, %s, %.1f MB/s)\n",
               (long long)(k.train.total + k.val.total), (long long)n_docs, outdir, (long long)k.train.total,
               k.train.index, k.train.index == 1 ? "" : "s", (long long)k.val.total, k.val.index,
               k.val.index == 1 ? "" : "s", loom_tokenizer_describe(t), vocab, marks,
               done / 1e6 / (loom_now() - t0 + 1e-9));
    loom_free(wide ? (void *)k.train.buf32 : k.train.buf);
    loom_free(wide ? (void *)k.val.buf32 : k.val.buf);
    loom_tokenizer_free(t);
    return rc;
}

int loom_prepare_tokenize_megatron(const char *tokenizer, const char *const *in, int n_in, const char *prefix,
                                   const struct loom_prepare_opts *o)
{
    struct loom_tokenizer *t;
    int rc = load_tokenizer(tokenizer, o, o->append_eod ? "for --append-eod" : NULL, &t);
    if (rc) return rc;
    if (o->megatron_bos && loom_tokenizer_bos(t) < 0) {
        loom_tokenizer_free(t);
        return loom_error_set(LOOM_ERR_INPUT,
                              "%s: Llama2Tokenizer puts the beginning of text before each document, and this "
                              "tokenizer has none",
                              tokenizer);
    }
    const int32_t vocab = loom_tokenizer_vocab_size(t);
    char path[4200], dir[4200];
    snprintf(path, sizeof path, "%s_%s_document", prefix, o->text_key);
    loom_fs_dirname(path, dir, sizeof dir);
    double total;
    struct loom_indexed_writer w;
    if ((rc = total_bytes(in, n_in, &total)) || (rc = loom_fs_mkdir_p(dir)) ||
        (rc = loom_indexed_writer_open(&w, path, loom_indexed_dtype_for(vocab)))) {
        loom_tokenizer_free(t);
        return rc;
    }
    struct sink k = {.megatron = &w};
    const double t0 = loom_now();
    double done = 0;
    int64_t n_docs = 0;
    rc = tokenize_into(t, in, n_in, o, &k, &n_docs, total, &done);
    if (!rc) rc = some_documents(n_docs, n_in);
    if (!rc)
        rc = loom_indexed_writer_finish(&w);
    else
        loom_indexed_writer_abort(&w);
    if (!rc)
        printf(
            "wrote %lld tokens of %lld documents to %s.bin and .idx (Megatron's indexed dataset, %s tokens; "
            "tokenizer %s, %d ids%s, %.1f MB/s)\n",
            (long long)k.megatron_tokens, (long long)n_docs, path, vocab < 65500 ? "uint16" : "int32",
            loom_tokenizer_describe(t), vocab, o->append_eod ? ", end of text appended" : "",
            done / 1e6 / (loom_now() - t0 + 1e-9));
    loom_tokenizer_free(t);
    return rc;
}

/* ---- learning a tokenizer ------------------------------------------------------ */

/* Distinct words and their counts: open addressing over an arena of bytes. */
struct word_counts {
    struct {
        uint64_t hash; /* 0: empty */
        uint64_t at;   /* into bytes */
        uint32_t len;
        int64_t count;
    } * slot;
    size_t cap, used;
    char *bytes;
    size_t n_bytes, bytes_cap;
};

static void count_word(void *ctx, const char *w, size_t n)
{
    struct word_counts *c = ctx;
    if (2 * (c->used + 1) > c->cap) {
        const size_t old_cap = c->cap;
        __typeof__(c->slot) old = c->slot;
        c->cap = c->cap ? 2 * c->cap : 1 << 16;
        c->slot = calloc(c->cap, sizeof *c->slot);
        if (!c->slot) loom_die("out of memory counting words");
        for (size_t i = 0; i < old_cap; i++)
            if (old[i].hash) {
                size_t j = (size_t)old[i].hash & (c->cap - 1);
                while (c->slot[j].hash) j = (j + 1) & (c->cap - 1);
                c->slot[j] = old[i];
            }
        free(old);
    }
    const uint64_t h = XXH3_64bits(w, n) | 1;
    size_t i = (size_t)h & (c->cap - 1);
    for (; c->slot[i].hash; i = (i + 1) & (c->cap - 1))
        if (c->slot[i].hash == h && c->slot[i].len == n && memcmp(c->bytes + c->slot[i].at, w, n) == 0) {
            c->slot[i].count++;
            return;
        }
    if (c->n_bytes + n > c->bytes_cap) {
        c->bytes_cap = 2 * (c->n_bytes + n) + (1 << 20);
        c->bytes = realloc(c->bytes, c->bytes_cap);
        if (!c->bytes) loom_die("out of memory counting words");
    }
    memcpy(c->bytes + c->n_bytes, w, n);
    c->slot[i].hash = h;
    c->slot[i].at = c->n_bytes;
    c->slot[i].len = (uint32_t)n;
    c->slot[i].count = 1;
    c->n_bytes += n;
    c->used++;
}

int loom_prepare_train_tokenizer(const char *const *in, int n_in, const char *outdir, int64_t vocab_size,
                                 const char *pattern, const char *const *specials, int n_specials,
                                 int64_t min_frequency, const struct loom_prepare_opts *o)
{
    const char *re = strcmp(pattern, "gpt2") == 0     ? loom_bpe_pattern_gpt2
                     : strcmp(pattern, "llama3") == 0 ? loom_bpe_pattern_llama3
                                                      : NULL;
    if (!re) return loom_error_set(LOOM_ERR_INPUT, "--pattern: expected gpt2 or llama3, got '%s'", pattern);
    const int64_t max_merges = vocab_size - 256 - n_specials;
    if (max_merges < 1 || vocab_size > (1LL << 30))
        return loom_error_set(
            LOOM_ERR_INPUT,
            "--vocab-size %lld: must exceed the 256 bytes plus %d special token%s (and be at most "
            "2^30)",
            (long long)vocab_size, n_specials, n_specials == 1 ? "" : "s");
    double total;
    int rc = total_bytes(in, n_in, &total);
    if (rc) return rc;
    struct loom_bpe *split;
    if ((rc = loom_bpe_build(specials, n_specials, re, NULL, 0, &split))) return rc;
    const int made_dir = !loom_fs_is_dir(outdir);
    if ((rc = loom_fs_mkdir_p(outdir))) {
        loom_bpe_free(split);
        return rc;
    }
    struct loom_bpe_state *st = loom_bpe_state_new(split);
    struct word_counts wc = {0};
    const double t0 = loom_now();
    double done = 0;
    int64_t n_docs = 0;
    char err[512];
    for (int fi = 0; fi < n_in && !rc; fi++) {
        struct file_docs f;
        if ((rc = read_docs(in[fi], o, &f))) break;
        for (size_t i = 0; i < f.n_docs && !rc; i++) {
            cJSON *json;
            char *owned;
            const char *text;
            size_t n;
            if (doc_text(&f, &f.docs[i], o->text_key, &json, &owned, &text, &n, err, sizeof err)) {
                cJSON_Delete(json);
                rc = loom_error_set(LOOM_ERR_INPUT, "%s", err);
                break;
            }
            loom_bpe_pieces(split, st, text, n, count_word, &wc);
            cJSON_Delete(json);
            free(owned);
            n_docs++;
            done += (double)f.docs[i].n;
            if ((n_docs & 4095) == 0) progress(o, "counting words", done, total, (int64_t)wc.used, t0, 0);
        }
        free_docs(&f);
    }
    loom_bpe_state_free(st);
    loom_bpe_free(split);
    struct loom_bpe_word *words = NULL;
    int32_t(*merges)[2] = NULL;
    int64_t n_merges = 0;
    if (!rc) {
        progress(o, "counting words", done, total, (int64_t)wc.used, t0, 1);
        words = malloc((wc.used ? wc.used : 1) * sizeof *words);
        merges = malloc((size_t)max_merges * sizeof *merges);
        if (!words || !merges) loom_die("out of memory learning merges");
        size_t k = 0;
        for (size_t i = 0; i < wc.cap; i++)
            if (wc.slot[i].hash)
                words[k++] = (struct loom_bpe_word){(const uint8_t *)wc.bytes + wc.slot[i].at, wc.slot[i].len,
                                                    wc.slot[i].count};
        n_merges = loom_bpe_learn(words, k, max_merges, min_frequency, merges);
        if (n_merges < 0) loom_die("out of memory learning merges");
    }
    if (!rc && n_docs == 0)
        rc = loom_error_set(
            LOOM_ERR_INPUT,
            "loom data train-tokenizer: no document in the input%s (empty, or only blank lines)",
            n_in == 1 ? "" : "s");
    struct loom_bpe *t = NULL;
    if (!rc) rc = loom_bpe_build(specials, n_specials, re, (const int32_t(*)[2])merges, n_merges, &t);
    if (!rc) rc = loom_bpe_save(t, outdir);
    if (rc && made_dir) rmdir(outdir); /* only when empty: nothing else is removed */
    if (!rc)
        printf("learned %lld merges from %zu distinct words of %lld documents (%.1f MB) in %.1f s: %d ids; "
               "wrote "
               "%s/tokenizer.json\n",
               (long long)n_merges, wc.used, (long long)n_docs, done / 1e6, loom_now() - t0,
               loom_bpe_vocab_size(t), outdir);
    loom_bpe_free(t);
    free(words);
    free(merges);
    free(wc.slot);
    free(wc.bytes);
    return rc;
}
