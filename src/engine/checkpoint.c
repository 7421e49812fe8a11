/* Saving and resuming a training run (see checkpoint.h). */
#include "engine/checkpoint.h"

#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cjson/cJSON.h>

#include "base/buf.h"
#include "base/clock.h"
#include "base/dtype.h"
#include "base/log.h"
#include "base/mem.h"
#include "config/config.h"
#include "io/checkpoint.h"
#include "io/fs.h"
#include "io/safetensors.h"
#include "layers/fp8_linear.h"
#include "model/decoder_def.h"
#include "model/family.h"
#include "optim/adamw.h"
#include "optim/batch_rampup.h"
#include "optim/offload.h"
#include "tokenizer/tokenizer.h"

#define EXP_AVG "optimizer.exp_avg."
#define EXP_AVG_SQ "optimizer.exp_avg_sq."
#define MASTER "optimizer.master."
#define FP8 "fp8."

/* The tensor and its first element in the arena, for every tensor that
 * overlaps [lo, hi); the callback gets the overlap [a, b). */
typedef int (*tensor_fn)(void *ctx, const struct loom_tensor *t, size_t t_lo, size_t a, size_t b);

static int for_each_tensor(const struct loom_model *m, size_t lo, size_t hi, tensor_fn fn, void *ctx)
{
    size_t base = 0;
    for (int i = 0; i < m->nblocks; base += m->blocks[i].numel, i++)
        for (int j = 0; j < m->blocks[i].ntensors; j++) {
            const struct loom_tensor *t = &m->blocks[i].tensors[j];
            size_t t_lo = base + t->offset, a = t_lo > lo ? t_lo : lo,
                   b = t_lo + t->numel < hi ? t_lo + t->numel : hi;
            int rc;
            if (a < b && (rc = fn(ctx, t, t_lo, a, b))) return rc;
        }
    return LOOM_OK;
}

/* Elements [lo, hi) of the part of the full tensor this rank holds as t:
 * the whole tensor, or under tensor parallelism the box of its tp rank in
 * the tensor's view (loom/model.h), as a checkpoint slice. */
static void tensor_slice(const struct loom_tensor *t, uint64_t lo, uint64_t hi, struct loom_ckpt_slice *s)
{
    if (t->tp_split == LOOM_TP_REPLICATED) {
        loom_ckpt_slice_range(s, t->ndim, t->shape, lo, hi);
        return;
    }
    int64_t start[LOOM_TP_VIEW_MAX_DIMS], stop[LOOM_TP_VIEW_MAX_DIMS];
    for (int d = 0; d < t->view_ndim; d++) start[d] = 0, stop[d] = t->view[d];
    start[t->tp_split] = t->tp_lo;
    stop[t->tp_split] = t->tp_hi;
    loom_ckpt_slice_view(s, t->ndim, t->full, t->view_ndim, t->view, start, stop, lo, hi);
}

/* The model's type and, for a model family's, the shape settings cfg gives
 * it (a user's model has none), as the trainer state records them. */
static void shape_of(const struct loom_model *m, const struct loom_config *cfg, struct loom_model_shape *out)
{
    const struct loom_model_family *family = loom_model_family_of(m);
    memset(out, 0, sizeof *out);
    if (family) family->shape_of(cfg, out);
    snprintf(out->type, sizeof out->type, "%s", m->name);
}

/* This rank's part of the arena to write: its ZeRO shard, or at stage 0
 * (every rank holds everything) an even split, so writing is spread. */
static void part_of(const struct loom_ckpt_parts *p, size_t *lo, size_t *hi)
{
    if (p->sharded) {
        *lo = p->part.begin, *hi = p->part.end;
        return;
    }
    /* with expert parallelism the ranks that hold the same experts split it
     * (add_pieces writes the dense tensors from expert rank 0's only) */
    const size_t ep = p->topo->ep > 1 ? (size_t)p->topo->ep : 1;
    size_t n = p->model->num_params, dp = (size_t)p->topo->dp / ep, r = (size_t)p->topo->dp_rank / ep;
    size_t each = (n + dp - 1) / dp;
    *lo = r * each < n ? r * each : n;
    *hi = *lo + each < n ? *lo + each : n;
}

/* Where arena element e is in the store (a piece never crosses its runs). */
static size_t store_at(const struct loom_ckpt_parts *p, size_t e)
{
    return p->store_runs ? loom_run_index(p->store_runs, p->store_nruns, e) : e - p->store_lo;
}

/* ---- saving ------------------------------------------------------------- */

/* Elements of 16-bit weights downloaded at a time while saving. */
#define SAVE_STAGE ((size_t)1 << 16)

/* A piece of the part, written as it is read into the writer's staging
 * buffer (float32 host memory): the weights downloaded from the backend
 * (16-bit ones through a host buffer of their own, converted to float32
 * there), the optimizer state wherever it lives (the backend, or the
 * offload file). */
struct piece_src {
    const struct loom_ckpt_parts *p;
    int part;          /* -1: the weights; else an enum loom_adamw_part */
    size_t first;      /* the piece's first element in the arena */
    uint16_t *stage16; /* (SAVE_STAGE) host memory, for 16-bit weights */
};

static int fill_piece(void *ctx, uint64_t at, float *dst, size_t count)
{
    const struct piece_src *s = ctx;
    const struct loom_ckpt_parts *p = s->p;
    const size_t e = s->first + (size_t)at;
    if (s->part >= 0) {
        loom_adamw_get(p->opt, (enum loom_adamw_part)s->part, loom_adamw_state_at(p->opt, e), count, dst);
        return LOOM_OK;
    }
    const struct loom_backend *b = p->model->backend;
    struct loom_buf src = loom_buf_slice(p->store, store_at(p, e), count);
    if (src.dtype == LOOM_DTYPE_F32) {
        b->download(dst, src.data, count * sizeof(float));
    } else {
        for (size_t k = 0; k < count; k += SAVE_STAGE) {
            const size_t c = count - k < SAVE_STAGE ? count - k : SAVE_STAGE;
            b->download(s->stage16, (const uint16_t *)src.data + k, c * sizeof(uint16_t));
            loom_lp_to_f32(dst + k, s->stage16, c, src.dtype);
        }
    }
    if (p->opt->param_map) loom_offload_drop(p->opt->param_map, src.data, count * loom_dtype_size(src.dtype));
    return LOOM_OK;
}

struct save_ctx {
    const struct loom_ckpt_parts *p;
    int parts;         /* 3, or 4 with master weights */
    uint16_t *stage16; /* (SAVE_STAGE) host memory, the pieces' to share */
    struct loom_ckpt_piece *pieces;
    struct piece_src *srcs;
    char (*names)[128];
    int n;
};

static int add_pieces(void *ctx, const struct loom_tensor *t, size_t t_lo, size_t a, size_t b)
{
    struct save_ctx *s = ctx;
    /* a tensor the tp group replicates: written by its tp rank 0; one the
     * expert-parallel group replicates (not an expert's): by its rank 0,
     * unless the optimizer is sharded (its runs then split them) */
    if (t->tp_split == LOOM_TP_REPLICATED && s->p->model->tp_rank != 0) return LOOM_OK;
    if (!t->expert && s->p->topo->ep > 1 && s->p->topo->ep_rank != 0 && !s->p->sharded) return LOOM_OK;
    const char *prefix[4] = {"", EXP_AVG, EXP_AVG_SQ, MASTER};
    const int part[4] = {-1, LOOM_ADAMW_EXP_AVG, LOOM_ADAMW_EXP_AVG_SQ, LOOM_ADAMW_MASTER};
    for (int k = 0; k < s->parts; k++) {
        struct loom_ckpt_piece *pc = &s->pieces[s->n];
        memset(pc, 0, sizeof *pc);
        snprintf(s->names[s->n], sizeof s->names[0], "%s%s", prefix[k], t->name);
        pc->name = s->names[s->n];
        tensor_slice(t, a - t_lo, b - t_lo, &pc->slice);
        s->srcs[s->n] = (struct piece_src){s->p, part[k], a, s->stage16};
        pc->fill = fill_piece, pc->fill_ctx = &s->srcs[s->n];
        s->n++;
    }
    return LOOM_OK;
}

/* The fp8 scales and amax histories (layers/fp8_linear.h), whole tensors: the
 * same on every rank of a stage, written by its first. */
static void add_fp8_pieces(const struct loom_fp8 *f, struct save_ctx *s)
{
    for (int i = 0; i < f->n; i++) {
        const int64_t hist[2] = {LOOM_FP8_OPERANDS, f->recipe.history_len}, scale[1] = {LOOM_FP8_OPERANDS};
        struct loom_ckpt_piece *pc = &s->pieces[s->n];
        memset(pc, 0, sizeof *pc);
        snprintf(s->names[s->n], sizeof s->names[0], FP8 "%s.amax_history", f->lin[i].name);
        pc->name = s->names[s->n];
        loom_ckpt_slice_whole(&pc->slice, 2, hist);
        pc->data = f->lin[i].history;
        pc = &s->pieces[++s->n];
        memset(pc, 0, sizeof *pc);
        snprintf(s->names[s->n], sizeof s->names[0], FP8 "%s.scale", f->lin[i].name);
        pc->name = s->names[s->n];
        loom_ckpt_slice_whole(&pc->slice, 1, scale);
        pc->data = f->lin[i].scale;
        s->n++;
    }
}

/* Reads them back; a checkpoint without them (saved without fp8) leaves
 * the scales at 1. A history of another length is LOOM_ERR_INPUT naming
 * both shapes. */
static int read_fp8(struct loom_ckpt_reader *r, struct loom_fp8 *f, uint64_t *bytes)
{
    int missing = 0, rc = LOOM_OK;
    for (int i = 0; rc == LOOM_OK && i < f->n; i++) {
        char name[160];
        const int64_t hist[2] = {LOOM_FP8_OPERANDS, f->recipe.history_len}, scale[1] = {LOOM_FP8_OPERANDS};
        snprintf(name, sizeof name, FP8 "%s.amax_history", f->lin[i].name);
        if (!loom_ckpt_has(r, name)) {
            missing++;
            continue;
        }
        rc = loom_ckpt_read(r, name, 2, hist, 0, (uint64_t)LOOM_FP8_OPERANDS * f->recipe.history_len,
                            f->lin[i].history);
        if (rc == LOOM_ERR_INPUT) {
            char why[512];
            snprintf(why, sizeof why, "%s", loom_error_message());
            return loom_error_set(LOOM_ERR_INPUT, "%s (the amax history holds --fp8-amax-history-len steps)",
                                  why);
        }
        snprintf(name, sizeof name, FP8 "%s.scale", f->lin[i].name);
        if (rc == LOOM_OK) rc = loom_ckpt_read(r, name, 1, scale, 0, LOOM_FP8_OPERANDS, f->lin[i].scale);
        *bytes += sizeof(float) * LOOM_FP8_OPERANDS * (1 + (uint64_t)f->recipe.history_len);
    }
    if (rc == LOOM_OK && missing)
        loom_log_warn(
            "the checkpoint holds no fp8 scales for %d of %d linear layers (saved without fp8): they "
            "start at 1",
            missing, f->n);
    return rc;
}

static int count_tensors(void *ctx, const struct loom_tensor *t, size_t t_lo, size_t a, size_t b)
{
    (void)t, (void)t_lo, (void)a, (void)b;
    ++*(int *)ctx;
    return LOOM_OK;
}

/* Writes this rank's part. The weights and the optimizer state (on the
 * backend, in offloaded shards or in the optimizer's file) pass through the
 * writer's staging buffer in host memory, so a save never holds the part
 * whole. */
static int write_part(const struct loom_ckpt_parts *p, const char *tmp, int64_t iteration, uint64_t *bytes,
                      uint64_t *file_bytes)
{
    const struct loom_model *m = p->model;
    const struct loom_adamw *opt = p->opt;
    /* sharded: the optimizer's runs (elements it alone holds the state of) */
    struct loom_run whole;
    part_of(p, &whole.lo, &whole.hi);
    const struct loom_run *runs = p->sharded ? opt->runs : &whole;
    const int nruns = p->sharded ? opt->nruns : 1;
    int ntensors = 0;
    for (int r = 0; r < nruns; r++) for_each_tensor(m, runs[r].lo, runs[r].hi, count_tensors, &ntensors);
    struct save_ctx s = {p, opt->has_master ? 4 : 3, NULL, NULL, NULL, NULL, 0};
    s.stage16 = loom_alloc(SAVE_STAGE * sizeof(uint16_t), LOOM_MEM_OTHER);
    const size_t npieces = 4 * (size_t)ntensors + 2 * (size_t)(m->fp8 ? m->fp8->n : 0) + 1;
    s.pieces = loom_alloc(loom_mul_size(npieces, sizeof *s.pieces), LOOM_MEM_OTHER);
    s.srcs = loom_alloc(loom_mul_size(npieces, sizeof *s.srcs), LOOM_MEM_OTHER);
    s.names = loom_alloc(loom_mul_size(npieces, sizeof *s.names), LOOM_MEM_OTHER);
    size_t numel = 0;
    for (int r = 0; r < nruns; r++) {
        for_each_tensor(m, runs[r].lo, runs[r].hi, add_pieces, &s);
        numel += runs[r].hi - runs[r].lo;
    }
    if (m->fp8 && p->topo->dp_rank == 0 && m->tp_rank == 0) add_fp8_pieces(m->fp8, &s);
    char path[4300], it[32];
    snprintf(path, sizeof path, "%s/rank_%05d.safetensors", tmp, p->topo->rank);
    snprintf(it, sizeof it, "%lld", (long long)iteration);
    const char *meta[4] = {LOOM_CKPT_META_RUN, p->run, LOOM_CKPT_META_ITERATION, it};
    int rc = loom_ckpt_write_file(path, s.pieces, s.n, meta, 2);
    struct stat sb;
    *file_bytes = rc == LOOM_OK && stat(path, &sb) == 0 ? (uint64_t)sb.st_size : 0;
    *bytes = (uint64_t)s.parts * (uint64_t)numel * sizeof(float);
    loom_free(s.pieces);
    loom_free(s.srcs);
    loom_free(s.names);
    loom_free(s.stage16);
    return rc;
}

/* The state of the checkpoint in tmp, into *out (loom_free it); an error
 * when its tokenizer cannot be read back for its record. */
static int state_text(const struct loom_ckpt_parts *p, const char *tmp, int64_t iteration,
                      const uint64_t *file_bytes, char **out)
{
    const struct loom_config *cfg = p->cfg;
    struct loom_ckpt_state st = {0};
    st.iteration = iteration;
    st.optimizer_step = p->opt->t;
    st.consumed_samples = loom_rampup_consumed(cfg, iteration); /* steps x the batch, or the ramp's */
    st.seed = cfg->seed;
    st.data_order = cfg->data_order;
    st.global_batch_size = cfg->global_batch_size;
    shape_of(p->model, cfg, &st.model);
    st.world_size = p->topo->world;
    st.dp = p->topo->dp;
    st.tp = p->topo->tp;
    st.pp = p->topo->pp;
    st.zero_stage = cfg->zero_stage; /* the layout's record */
    st.skipped_steps = p->skipped;
    if (p->scaler) {
        st.has_loss_scaler = 1;
        st.loss_scale = p->scaler->st.scale;
        st.loss_scale_good_steps = p->scaler->st.clean_steps;
        st.loss_scale_hysteresis = p->scaler->st.hysteresis;
    }
    st.nfiles = p->topo->world;
    st.files = loom_alloc(loom_mul_size((size_t)st.nfiles, sizeof *st.files), LOOM_MEM_OTHER);
    for (int r = 0; r < st.nfiles; r++) {
        snprintf(st.files[r].name, sizeof st.files[r].name, "rank_%05d.safetensors", r);
        st.files[r].bytes = (int64_t)file_bytes[r];
    }
    snprintf(st.run, sizeof st.run, "%s", p->run);
    st.tokenizer = LOOM_CKPT_TOKENIZER_NONE;
    if (*cfg->tokenizer) { /* exported into tmp: recorded, so a file put there later is refused */
        char path[4400];
        snprintf(path, sizeof path, "%s/%s", tmp, LOOM_CKPT_TOKENIZER_MODEL);
        st.tokenizer_is_model = access(path, F_OK) == 0; /* a SentencePiece model's */
        if (!st.tokenizer_is_model) snprintf(path, sizeof path, "%s/%s", tmp, LOOM_CKPT_TOKENIZER_FILE);
        st.tokenizer = LOOM_CKPT_TOKENIZER_SAVED;
        int rc = loom_ckpt_file_sum(path, &st.tokenizer_bytes, &st.tokenizer_xxh3);
        if (rc) {
            loom_ckpt_state_free(&st);
            return rc;
        }
    }
    *out = loom_ckpt_state_format(&st, NULL);
    loom_ckpt_state_free(&st);
    return *out ? LOOM_OK : loom_error_set(LOOM_ERR_RUNTIME, "out of memory formatting the trainer state");
}

int loom_checkpoint_save(const struct loom_ckpt_parts *p, int64_t iteration, struct loom_ckpt_io_stats *stats)
{
    const struct loom_config *cfg = p->cfg;
    const int root = p->topo->rank == 0;
    double t0 = loom_now();
    char tmp[4200];
    loom_ckpt_tmp_dir(cfg->save, iteration, tmp, sizeof tmp);
    int rc = root ? loom_ckpt_begin(cfg->save, iteration) : LOOM_OK;
    if ((rc = loom_comm_agree_shared(rc))) return rc;
    uint64_t bytes = 0, mine = 0;
    rc = loom_comm_agree_shared(write_part(p, tmp, iteration, &bytes, &mine));
    /* every rank file's size, for the state */
    uint64_t *sizes = loom_alloc(loom_mul_size((size_t)p->topo->world, sizeof *sizes), LOOM_MEM_OTHER);
    if (rc == LOOM_OK)
        loom_comm_wait(loom_comm_allgather(LOOM_GROUP_WORLD, loom_buf_of(&mine, 1, LOOM_DTYPE_U64),
                                           loom_buf_of(sizes, (size_t)p->topo->world, LOOM_DTYPE_U64)));
    /* the tokenizer travels with the weights (loom sample and loom convert read it there) */
    const char *tokenizer_file;
    if (rc == LOOM_OK && root && *cfg->tokenizer)
        rc = loom_tokenizer_export(cfg->tokenizer, cfg->merge_file, tmp, &tokenizer_file);
    if (rc == LOOM_OK && root) {
        char *text = NULL;
        rc = state_text(p, tmp, iteration, sizes, &text);
        if (rc == LOOM_OK) rc = loom_ckpt_commit(cfg->save, iteration, tmp, text, cfg->keep_last);
        loom_free(text);
    }
    loom_free(sizes);
    rc = loom_comm_agree_shared(rc);
    if (rc && root) loom_ckpt_abandon(tmp);
    if (rc) return rc == LOOM_ERR_INPUT ? LOOM_ERR_RUNTIME : rc; /* a failure while running */
    stats->seconds = loom_now() - t0;
    stats->bytes = bytes;
    loom_ckpt_iter_dir(cfg->save, iteration, stats->dir, sizeof stats->dir);
    return LOOM_OK;
}

/* ---- loading ------------------------------------------------------------ */

/* Elements read into host memory at a time, then put where they live. */
#define LOAD_CHUNK ((size_t)4 << 20)

enum load_what { LOAD_WEIGHTS, LOAD_MOMENTS, LOAD_MASTER };

struct load_ctx {
    const struct loom_ckpt_parts *p;
    struct loom_ckpt_reader *r;
    enum load_what what;
    const char *prefix;      /* LOAD_WEIGHTS: the names' prefix (the master weights' for a float32 run) */
    int master_from_weights; /* LOAD_WEIGHTS: the float32 weights also become the master weights */
    float *stage[2];         /* LOAD_CHUNK elements each, host memory */
    uint64_t bytes;
};

static int read_piece(struct load_ctx *c, const char *prefix, const struct loom_tensor *t,
                      const struct loom_ckpt_slice *want, float *dst)
{
    char name[128];
    snprintf(name, sizeof name, "%s%s", prefix, t->name);
    c->bytes += (want->hi - want->lo) * sizeof(float);
    return loom_ckpt_read_slice(c->r, name, want, dst);
}

/* Elements [x, y) of the arena, tensor t's, read into the host staging:
 * into where they live (the backend: uploaded, 16-bit weights rounded
 * first; or an offload file). */
static int place_staged(struct load_ctx *c, const struct loom_tensor *t, const struct loom_ckpt_slice *want,
                        size_t x, size_t y)
{
    const struct loom_ckpt_parts *p = c->p;
    const struct loom_backend *be = p->model->backend;
    struct loom_adamw *opt = p->opt; /* NULL: the weights alone */
    int rc;
    if (c->what == LOAD_MOMENTS) {
        if ((rc = read_piece(c, EXP_AVG, t, want, c->stage[0])) ||
            (rc = read_piece(c, EXP_AVG_SQ, t, want, c->stage[1])))
            return rc;
        loom_adamw_set_state(opt, loom_adamw_state_at(opt, x), y - x, c->stage[0], c->stage[1]);
        return LOOM_OK;
    }
    if (c->what == LOAD_MASTER) {
        if ((rc = read_piece(c, MASTER, t, want, c->stage[0]))) return rc;
        loom_adamw_set_master_range(opt, loom_adamw_state_at(opt, x), y - x, c->stage[0]);
        return LOOM_OK;
    }
    if ((rc = read_piece(c, c->prefix, t, want, c->stage[0]))) return rc;
    struct loom_buf to = loom_buf_slice(p->store, store_at(p, x), y - x);
    if (to.dtype == LOOM_DTYPE_F32) {
        be->upload(to.data, c->stage[0], (y - x) * sizeof(float));
    } else { /* rounded in host memory (stage[1] holds LOAD_CHUNK of them), then uploaded */
        loom_buf_convert(loom_buf_of(c->stage[1], y - x, to.dtype), loom_buf_f32(c->stage[0], y - x));
        be->upload(to.data, c->stage[1], loom_buf_bytes(to));
    }
    if (!opt) return LOOM_OK;
    if (opt->param_map) loom_offload_drop(opt->param_map, to.data, (y - x) * loom_dtype_size(to.dtype));
    /* the master weights: the float32 weights read (not their rounding),
     * where they overlap the optimizer's runs */
    for (int r = 0; c->master_from_weights && r < opt->nruns; r++) {
        const size_t a = x > opt->runs[r].lo ? x : opt->runs[r].lo,
                     b = y < opt->runs[r].hi ? y : opt->runs[r].hi;
        if (a < b)
            loom_adamw_set_master_range(opt, loom_adamw_state_at(opt, a), b - a, c->stage[0] + (a - x));
    }
    return LOOM_OK;
}

static int read_tensor(void *ctx, const struct loom_tensor *t, size_t t_lo, size_t a, size_t b)
{
    struct load_ctx *c = ctx;
    struct loom_ckpt_slice want;
    int rc = LOOM_OK;
    if (!c->stage[0]) {
        c->stage[0] = loom_alloc(loom_mul_size(2 * LOAD_CHUNK, sizeof(float)), LOOM_MEM_OTHER);
        c->stage[1] = c->stage[0] + LOAD_CHUNK;
    }
    for (size_t x = a; rc == LOOM_OK && x < b; x += LOAD_CHUNK) {
        const size_t y = b - x < LOAD_CHUNK ? b : x + LOAD_CHUNK;
        tensor_slice(t, x - t_lo, y - t_lo, &want);
        rc = place_staged(c, t, &want, x, y);
    }
    return rc;
}

/* The pieces of every file the trainer state lists. */
static int open_reader(struct loom_ckpt_reader **r, const char *dir, const struct loom_ckpt_state *st)
{
    const char **files = loom_alloc(loom_mul_size((size_t)st->nfiles, sizeof *files), LOOM_MEM_OTHER);
    for (int i = 0; i < st->nfiles; i++) files[i] = st->files[i].name;
    int rc = loom_ckpt_reader_open(r, dir, files, st->nfiles);
    loom_free(files);
    /* each file is of this run and this iteration (a state without a run
     * predates the records: nothing to hold its files to) */
    for (int i = 0; rc == LOOM_OK && st->run[0] && i < st->nfiles; i++) {
        const char *run = loom_ckpt_reader_meta(*r, i, LOOM_CKPT_META_RUN),
                   *it = loom_ckpt_reader_meta(*r, i, LOOM_CKPT_META_ITERATION);
        char want[32];
        snprintf(want, sizeof want, "%lld", (long long)st->iteration);
        if (!run || strcmp(run, st->run) != 0 || !it || strcmp(it, want) != 0)
            rc = loom_error_set(
                LOOM_ERR_INPUT,
                "%s/%s: a file of run %s, iteration %s, in a checkpoint of run %s, iteration %s", dir,
                st->files[i].name, run ? run : "(none)", it ? it : "(none)", st->run, want);
    }
    return rc;
}

/* Reads what this rank's layout holds from checkpoint directory dir, a
 * host staging buffer at a time (then onto the backend, or into an offload
 * file), so a resume never holds a part whole either. */
static int restore(const struct loom_ckpt_parts *p, const char *dir, const struct loom_ckpt_state *st,
                   uint64_t *bytes)
{
    struct loom_model *m = p->model;
    struct loom_adamw *opt = p->opt;
    struct load_ctx c = {0};
    c.p = p;
    int rc = open_reader(&c.r, dir, st);
    char name[128];
    snprintf(name, sizeof name, MASTER "%s", m->blocks[0].tensors[0].name);
    const int has_master = rc == LOOM_OK && loom_ckpt_has(c.r, name);
    /* --finetune and --no-load-optim: the optimizer (moments, master weights, loss scale) afresh */
    const int optim = !p->cfg->finetune && !p->cfg->no_load_optim;
    const int take_master = opt->has_master && optim && has_master;
    /* The weights: a float32 run resuming a mixed-precision checkpoint takes
     * the master weights (the more precise copy); a mixed-precision run reads
     * float32 and rounds to its 16-bit storage. */
    if (rc == LOOM_OK) {
        c.what = LOAD_WEIGHTS;
        c.prefix = m->dtype == LOOM_DTYPE_F32 && has_master ? MASTER : "";
        c.master_from_weights = opt->has_master && !take_master;
        if (p->store_runs)
            for (int r = 0; rc == LOOM_OK && r < p->store_nruns; r++)
                rc = for_each_tensor(m, p->store_runs[r].lo, p->store_runs[r].hi, read_tensor, &c);
        else
            rc = for_each_tensor(m, p->store_lo, p->store_hi, read_tensor, &c);
    }
    if (rc == LOOM_OK && optim) {
        c.what = LOAD_MOMENTS;
        for (int r = 0; rc == LOOM_OK && r < opt->nruns; r++)
            rc = for_each_tensor(m, opt->runs[r].lo, opt->runs[r].hi, read_tensor, &c);
        if (rc == LOOM_OK) opt->t = (int)st->optimizer_step;
    }
    if (rc == LOOM_OK && take_master) {
        c.what = LOAD_MASTER;
        for (int r = 0; rc == LOOM_OK && r < opt->nruns; r++)
            rc = for_each_tensor(m, opt->runs[r].lo, opt->runs[r].hi, read_tensor, &c);
    }
    loom_free(c.stage[0]);
    if (rc == LOOM_OK && m->fp8) rc = read_fp8(c.r, m->fp8, &c.bytes);
    if (rc == LOOM_OK && p->scaler && st->has_loss_scaler && optim) {
        const struct loom_loss_scaler_state ls = {st->loss_scale, st->loss_scale_good_steps,
                                                  (int)st->loss_scale_hysteresis, st->iteration,
                                                  st->skipped_steps};
        rc = loom_loss_scaler_restore(p->scaler, &ls);
    }
    loom_ckpt_reader_close(c.r);
    *bytes = c.bytes;
    return rc;
}

/* Settings the checkpoint fixes: a different model cannot take its tensors,
 * nor compute what was trained. A family's shape is read as the family
 * reads it (settings an older checkpoint lacks take their value of then);
 * a user's model records none: every tensor's shape is checked as it is
 * read. */
/* A shape setting's flag: its key with '-' for '_'. */
static void flag_of(const char *key, char *flag, size_t n)
{
    snprintf(flag, n, "--%s", key);
    for (char *c = flag; *c; c++)
        if (*c == '_') *c = '-';
}

/* A recorded shape as the family reads it, in place: every setting (an
 * older file's absent ones at their value of then), nothing it does not
 * know (the family's LOOM_ERR_INPUT otherwise). cfg lends the other fields. */
static int family_shape(const struct loom_model_family *family, struct loom_model_shape *shape,
                        const struct loom_config *cfg)
{
    struct loom_config *read = malloc(sizeof *read);
    if (!read) return loom_error_set(LOOM_ERR_RUNTIME, "out of memory");
    memcpy(read, cfg, sizeof *read);
    int rc = family->apply_shape(shape, read);
    if (rc == LOOM_OK) family->shape_of(read, shape);
    free(read);
    return rc;
}

static int check_model(const struct loom_model *m, const struct loom_config *cfg,
                       const struct loom_ckpt_state *st, const char *dir)
{
    if (strcmp(st->model.type, m->name) != 0)
        return loom_error_set(LOOM_ERR_INPUT, "--load %s: the checkpoint holds a %s model, this run a %s",
                              dir, st->model.type, m->name);
    const struct loom_model_family *family = loom_model_family_of(m);
    if (!family) return LOOM_OK;
    struct loom_model_shape want, have = st->model;
    int rc = family_shape(family, &have, cfg);
    if (rc) {
        char why[400];
        snprintf(why, sizeof why, "%s", loom_error_message());
        return loom_error_set(rc, "--load %s: %s", dir, why);
    }
    family->shape_of(cfg, &want);
    for (int i = 0; i < want.n; i++) {
        char flag[64], a[48], b[48];
        flag_of(want.kv[i].key, flag, sizeof flag);
        loom_model_shape_text(&have.kv[i], a, sizeof a);
        loom_model_shape_text(&want.kv[i], b, sizeof b);
        if (strcmp(a, b) != 0)
            return loom_error_set(LOOM_ERR_INPUT, "--load %s: the checkpoint's model has %s %s, this run %s",
                                  dir, flag, a, b);
    }
    return LOOM_OK;
}

/* Collective over candidates, newest first: the first that every rank reads
 * whole wins; a damaged one is reported and skipped when the path is a save
 * directory. `fn` restores from one checkpoint; it sets *final for a failure
 * that is no damage and the same on every rank (another model), which no
 * older checkpoint would mend: no fallback then. */
typedef int (*restore_fn)(const struct loom_ckpt_parts *p, const char *dir, struct loom_ckpt_state *st,
                          uint64_t *bytes, int *final);

static int restore_training(const struct loom_ckpt_parts *p, const char *dir, struct loom_ckpt_state *st,
                            uint64_t *bytes, int *final)
{
    int rc = loom_comm_agree_shared(check_model(p->model, p->cfg, st, dir));
    if (rc) {
        *final = 1;
        return rc;
    }
    return restore(p, dir, st, bytes);
}

/* A fallback that lands on another run's checkpoint than the newest one's
 * (every one of that run's is damaged) says so, naming both runs: the
 * training that follows continues another line of checkpoints. */
static void say_crossing(const char *newest, const char *loaded, const char *loaded_run)
{
    char head[LOOM_CKPT_RUN_LEN + 8];
    loom_ckpt_run_of(newest, head, sizeof head);
    const char *run = *loaded_run ? loaded_run : "none";
    if (!*head || strcmp(head, run) == 0) return;
    loom_log_warn(
        "%s is run %s's checkpoint, not run %s's (the newest, %s, is damaged, and so is every other "
        "checkpoint of its run): loading another run's",
        loaded, run, head, newest);
}

static int try_candidates(const struct loom_ckpt_parts *p, const char *path, restore_fn fn,
                          struct loom_ckpt_state *out, uint64_t *bytes, char *from, size_t from_size)
{
    char **dirs;
    int n, is_save;
    int rc = loom_comm_agree_shared(loom_ckpt_candidates(path, &dirs, &n, &is_save));
    for (int c = 0; rc == LOOM_OK && c < n; c++) {
        struct loom_ckpt_state st;
        int got = loom_comm_agree_shared(loom_ckpt_state_read(dirs[c], &st));
        if (got == LOOM_OK) {
            int final = 0;
            got = fn(p, dirs[c], &st, bytes, &final);
            if (final) {
                loom_ckpt_state_free(&st);
                rc = got;
                break;
            }
            got = loom_comm_agree_shared(got);
        }
        if (got == LOOM_OK) {
            *out = st;
            snprintf(from, from_size, "%s", dirs[c]);
            if (c > 0) say_crossing(dirs[0], dirs[c], st.run);
            break;
        }
        loom_ckpt_state_free(&st);
        if (!is_save || c + 1 == n) {
            rc = got;
            break;
        }
        loom_log_warn("%s; falling back to %s", loom_error_message(), dirs[c + 1]);
        loom_error_clear();
    }
    loom_ckpt_candidates_free(dirs, n);
    return rc;
}

/* Whether --save holds a checkpoint of run `run` past `iteration` (its
 * newest): resuming there rewinds that run. */
static int rewinds(const char *save, int64_t iteration, const char *run)
{
    if (!*save) return 0;
    const int64_t newest = loom_ckpt_newest(save);
    int same = 0;
    if (newest > iteration) {
        char dir[4200];
        struct loom_ckpt_state later;
        loom_ckpt_iter_dir(save, newest, dir, sizeof dir);
        if (loom_ckpt_state_read(dir, &later) == LOOM_OK) {
            same = strcmp(later.run, run) == 0;
            loom_ckpt_state_free(&later);
        }
    }
    loom_error_clear();
    return same;
}

int loom_checkpoint_load(const struct loom_ckpt_parts *p, int64_t *iteration,
                         struct loom_ckpt_io_stats *stats)
{
    struct loom_config *cfg = p->cfg;
    double t0 = loom_now();
    struct loom_ckpt_state st;
    uint64_t bytes = 0;
    int rc = try_candidates(p, cfg->load, restore_training, &st, &bytes, stats->dir, sizeof stats->dir);
    if (rc) return rc;
    *iteration = cfg->finetune ? 0 : st.iteration;
    /* the run goes on under its identifier, unless --save holds checkpoints
     * past the loaded one: then this is a branch from an earlier point, a
     * run of its own, and its saves move the old run's aside (io/checkpoint_dir.c) */
    const int branch = st.run[0] && rewinds(cfg->save, st.iteration, st.run);
    if (!cfg->finetune && st.run[0] && p->run && !branch)
        snprintf(p->run, LOOM_CKPT_RUN_LEN + 1, "%s", st.run);
    stats->skipped = cfg->finetune ? 0 : st.skipped_steps;
    if (!cfg->finetune) {
        if (st.seed != cfg->seed)
            loom_log_warn("the checkpoint's seed %" PRId64 " is used (not %" PRId64
                          "): data order and every random choice continue as saved",
                          st.seed, cfg->seed);
        cfg->seed = st.seed;
        if (st.global_batch_size != cfg->global_batch_size || st.data_order != (int)cfg->data_order)
            loom_log_warn("the checkpoint was trained with global batch %" PRId64
                          " and another data order or batch; the data continues from step %" PRId64
                          " in this run's order",
                          st.global_batch_size, st.iteration + 1);
        else if (st.consumed_samples != loom_rampup_consumed(cfg, st.iteration))
            loom_log_warn("the checkpoint consumed %" PRId64 " samples in its %" PRId64
                          " steps, this run's batch rampup makes %" PRId64
                          ": the data continues from sample %" PRId64,
                          st.consumed_samples, st.iteration, loom_rampup_consumed(cfg, st.iteration),
                          loom_rampup_consumed(cfg, st.iteration));
    }
    loom_ckpt_state_free(&st);
    stats->seconds = loom_now() - t0;
    stats->bytes = bytes;
    return LOOM_OK;
}

/* ---- one process, weights only ------------------------------------------ */

static int restore_weights(const struct loom_ckpt_parts *p, const char *dir, struct loom_ckpt_state *st,
                           uint64_t *bytes, int *final)
{
    (void) final; /* weights only: any damage falls back to an older checkpoint */
    struct loom_model *m = p->model;
    struct load_ctx c = {0};
    int rc = open_reader(&c.r, dir, st);
    c.p = p;
    c.what = LOAD_WEIGHTS;
    c.prefix = "";
    if (rc == LOOM_OK) rc = for_each_tensor(m, 0, m->num_params, read_tensor, &c);
    loom_free(c.stage[0]);
    loom_ckpt_reader_close(c.r);
    *bytes = c.bytes;
    return rc;
}

/* A weights source in the family's own formats: its reader fills a float32
 * arena in host memory (through m->params and the blocks' work_params,
 * pointed there meanwhile), which then goes onto the backend: uploaded, or
 * rounded to the 16-bit arena a piece at a time in host memory first. */
static int load_family_weights(const struct loom_model_family *family, struct loom_model *m, const char *path)
{
    enum { PIECE = 1 << 16 }; /* elements rounded at a time */
    const struct loom_backend *b = m->backend;
    const struct loom_buf stored = m->params;
    const size_t n = m->num_params;
    /* float32 parameters in host memory (the CPU's): read in place, no staging copy of the model */
    if (stored.dtype == LOOM_DTYPE_F32 && !loom_devmem()) return family->load_weights(m, path);
    float *host = loom_alloc(loom_mul_size(n + 1, sizeof(float)), LOOM_MEM_OTHER);
    float **held = loom_alloc(loom_mul_size((size_t)m->nblocks + 1, sizeof *held), LOOM_MEM_OTHER);
    m->params = loom_buf_f32(host, n);
    for (int i = 0; i < m->nblocks; i++) {
        held[i] = m->blocks[i].work_params;
        m->blocks[i].work_params = host + m->blocks[i].offset;
    }
    int rc = family->load_weights(m, path);
    m->params = stored;
    for (int i = 0; i < m->nblocks; i++) m->blocks[i].work_params = held[i];
    loom_free(held);
    if (rc == LOOM_OK && stored.dtype == LOOM_DTYPE_F32) {
        b->upload(stored.data, host, n * sizeof(float));
    } else if (rc == LOOM_OK) {
        uint16_t *piece = loom_alloc(PIECE * sizeof(uint16_t), LOOM_MEM_OTHER);
        for (size_t k = 0; k < n; k += PIECE) {
            const size_t c = n - k < PIECE ? n - k : PIECE;
            loom_buf_convert(loom_buf_of(piece, c, stored.dtype), loom_buf_f32(host + k, c));
            b->upload((uint16_t *)stored.data + k, piece, c * sizeof(uint16_t));
        }
        loom_free(piece);
    }
    loom_free(host);
    return rc;
}

int loom_checkpoint_load_weights(struct loom_model *m, const char *path)
{
    if (!loom_ckpt_is_checkpoint(path)) { /* a weights source, in the model family's own formats */
        const struct loom_model_family *family = loom_model_family_of(m);
        if (!family || !family->load_weights)
            return loom_error_set(LOOM_ERR_INPUT, "--load %s: a %s model loads from loom checkpoints only",
                                  path, m->name);
        return load_family_weights(family, m, path);
    }
    struct loom_ckpt_parts p = {.model = m, .store = m->params, .store_lo = 0, .store_hi = m->num_params};
    struct loom_ckpt_state st;
    uint64_t bytes;
    char from[512];
    int rc = try_candidates(&p, path, restore_weights, &st, &bytes, from, sizeof from);
    if (rc == LOOM_OK) loom_ckpt_state_free(&st);
    return rc;
}

/* The model the newest checkpoint with a readable trainer state records. */
static int recorded_model(const char *path, struct loom_model_shape *out)
{
    char **dirs;
    int n, is_save;
    int rc = loom_ckpt_candidates(path, &dirs, &n, &is_save);
    for (int c = 0; rc == LOOM_OK && c < n; c++) {
        struct loom_ckpt_state st;
        if ((rc = loom_ckpt_state_read(dirs[c], &st)) == LOOM_OK) {
            *out = st.model;
            loom_ckpt_state_free(&st);
            break;
        }
        if (c + 1 < n) rc = LOOM_OK; /* an older one may be readable */
    }
    if (rc == LOOM_OK && n == 0) /* a regular file */
        rc = loom_error_set(LOOM_ERR_INPUT, "%s: a weights file, not a checkpoint directory", path);
    loom_ckpt_candidates_free(dirs, n);
    return rc;
}

/* The family of a recorded model; LOOM_ERR_INPUT naming path without one. */
static int family_of_shape(const char *path, const struct loom_model_shape *shape,
                           const struct loom_model_family **out)
{
    *out = loom_model_family_find(shape->type);
    if (!*out)
        return loom_error_set(
            LOOM_ERR_INPUT, "%s holds a %s model, which no model family describes (its own program reads it)",
            path, shape->type);
    return LOOM_OK;
}

/* The family's message about a shape it refuses, with the checkpoint's path. */
static int shape_error(const char *path, int rc)
{
    char why[512];
    snprintf(why, sizeof why, "%s", loom_error_message());
    return loom_error_set(rc, "%s: %s", path, why);
}

/* A shape setting's flag: its key with '-' for '_'. */
/* The file's settings onto cfg (loom_checkpoint_read_shape's rule). */
static int take_shape(const char *path, const struct loom_model_family *family,
                      const struct loom_model_shape *file, struct loom_config *cfg)
{
    struct loom_model_shape merged;
    family->shape_of(cfg, &merged); /* cfg's settings, replaced by the file's */
    for (int i = 0; i < merged.n; i++) {
        const struct loom_shape_setting *f = loom_model_shape_find(file, merged.kv[i].key);
        if (!f) continue;
        char flag[64], a[48], b[48];
        flag_of(merged.kv[i].key, flag, sizeof flag);
        loom_model_shape_text(&merged.kv[i], a, sizeof a);
        loom_model_shape_text(f, b, sizeof b);
        if (loom_config_given(cfg, flag) && loom_decoder_def_flag_wins(family->decoder, merged.kv[i].key))
            continue; /* the file's is a default: the flag's value stands */
        if (strcmp(a, b) != 0 && loom_config_given(cfg, flag))
            return loom_error_set(LOOM_ERR_INPUT,
                                  "%s %s contradicts --load %s, which holds a model with %s %s", flag, a,
                                  path, flag, b);
        merged.kv[i] = *f;
    }
    struct loom_config *out = malloc(sizeof *out); /* cfg with the merged shape; shares cfg's paths */
    if (!out) return loom_error_set(LOOM_ERR_RUNTIME, "out of memory");
    memcpy(out, cfg, sizeof *out);
    int rc = family->apply_shape(&merged, out);
    if (rc == LOOM_OK) {
        loom_config_adopt(cfg, out, "model");
        loom_config_adopt(cfg, out, "attention"); /* a family's recorded window (Mistral's) */
        loom_config_adopt(cfg, out, "moe");       /* the experts */
    } else {
        rc = shape_error(path, rc);
    }
    free(out);
    return rc;
}

/* The family a weights source names: config.json's model_type in its
 * directory (Hugging Face's names are the families'), else loom's
 * loom.model metadata in the file; NULL when it names none. */
static const struct loom_model_family *source_family(const char *path)
{
    char dir[4000], config[4100];
    if (loom_fs_is_dir(path))
        snprintf(dir, sizeof dir, "%s", path);
    else
        loom_fs_dirname(path, dir, sizeof dir);
    snprintf(config, sizeof config, "%s/config.json", dir);
    const struct loom_model_family *f = NULL;
    char *text;
    size_t len;
    if (loom_fs_read_small(config, 1 << 20, &text, &len) == LOOM_OK) {
        cJSON *j = cJSON_ParseWithLength(text, len);
        const cJSON *t = cJSON_GetObjectItemCaseSensitive(j, "model_type");
        if (cJSON_IsString(t)) f = loom_model_family_find(t->valuestring);
        cJSON_Delete(j);
        loom_free(text);
    }
    loom_error_clear();
    if (f || loom_fs_is_dir(path)) return f;
    struct loom_st st;
    if (loom_st_open(&st, path) == LOOM_OK) {
        const char *type = loom_st_meta(&st, "loom.model");
        if (type) f = loom_model_family_find(type);
        loom_st_close(&st);
    }
    loom_error_clear();
    return f;
}

const struct loom_model_family *loom_checkpoint_source_family(const char *path)
{
    struct loom_model_shape shape;
    if (!loom_ckpt_is_checkpoint(path)) return source_family(path);
    const struct loom_model_family *f =
        recorded_model(path, &shape) == LOOM_OK ? loom_model_family_find(shape.type) : NULL;
    loom_error_clear();
    return f;
}

/* The family a --load source holds becomes the run's: --model names a
 * preset of it, or, not given, it is set to the family's first preset
 * (its settings were applied already; the model's shape comes from the
 * file). */
static int take_family(const char *path, const struct loom_model_family *family, struct loom_config *cfg)
{
    const struct loom_model_family *preset = loom_model_family_of_preset(cfg->model, NULL);
    if (preset == family) return LOOM_OK;
    if (loom_config_given(cfg, "--model"))
        return loom_error_set(LOOM_ERR_INPUT, "--model %s is a %s preset, but --load %s holds a %s model",
                              cfg->model, preset ? preset->title : "unknown", path, family->title);
    struct loom_config *out = malloc(sizeof *out);
    if (!out) return loom_error_set(LOOM_ERR_RUNTIME, "out of memory");
    memcpy(out, cfg, sizeof *out);
    snprintf(out->model, sizeof out->model, "%s", family->presets[0].name);
    loom_config_adopt(cfg, out, "model");
    free(out);
    return LOOM_OK;
}

int loom_checkpoint_read_shape(const char *path, struct loom_config *cfg)
{
    struct loom_model_shape shape;
    const struct loom_model_family *family;
    int rc;
    if (loom_ckpt_is_checkpoint(path)) {
        if ((rc = recorded_model(path, &shape)) || (rc = family_of_shape(path, &shape, &family))) return rc;
        if ((rc = family_shape(family, &shape, cfg))) return shape_error(path, rc);
    } else {
        family = source_family(path);
        if (!family) family = loom_model_family_of_preset(cfg->model, NULL);
        if (!family)
            return loom_error_set(LOOM_ERR_INPUT, "--model %s: no model family has this preset", cfg->model);
        if (!family->read_shape)
            return loom_error_set(LOOM_ERR_INPUT, "--load %s: %s models load from loom checkpoints only",
                                  path, family->title);
        if ((rc = family->read_shape(path, cfg, &shape))) return rc;
    }
    if ((rc = take_family(path, family, cfg))) return rc;
    return take_shape(path, family, &shape, cfg);
}

int loom_checkpoint_read_model(const char *path, int B, int T, struct loom_model **out)
{
    *out = NULL;
    struct loom_model_shape shape;
    const struct loom_model_family *family;
    int rc = recorded_model(path, &shape);
    if (rc == LOOM_OK) rc = family_of_shape(path, &shape, &family);
    if (rc) return rc;
    struct loom_config cfg; /* the model's settings: the recorded shape, defaults (zero) otherwise */
    memset(&cfg, 0, sizeof cfg);
    cfg.tensor_model_parallel_size = 1; /* the whole model, in one process */
    if ((rc = family->apply_shape(&shape, &cfg)) || (rc = family->check(&cfg, T)))
        return shape_error(path, rc);
    struct loom_model *m = family->create(&cfg, B, T, 0, 0, 0);
    loom_model_alloc_arenas(m, 1, LOOM_MODEL_PARAM_ARENA);
    if ((rc = loom_checkpoint_load_weights(m, path))) {
        family->destroy(m);
        return rc;
    }
    *out = m;
    return LOOM_OK;
}
