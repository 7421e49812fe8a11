/*
 * loom's checkpoint format, independent of the model and of the parallel
 * layout that wrote it.
 *
 * A checkpoint is a directory SAVE/iter_NNNNNNN holding one safetensors file
 * per rank that wrote (rank_RRRRR.safetensors) and trainer_state.json.
 * SAVE/latest holds the name of the newest complete one.
 *
 * Pieces. Each rank stores only what it owns: pieces of full tensors, each
 * under the full tensor's name (model weights under the model's tensor
 * names, optimizer moments as optimizer.exp_avg.<name> and
 * optimizer.exp_avg_sq.<name>, float32 master weights under mixed precision
 * as optimizer.master.<name>). A piece is described by its slice (below);
 * a piece that is the whole tensor has the tensor's shape and no slice
 * entry, so a file written by one process is a plain safetensors file. The
 * metadata of every file holds, per stored tensor:
 *   loom.xxh3.<name>   16 hex digits, XXH3-64 of the stored bytes
 *   loom.slice.<name>  {"shape":[tensor dims],"view":[view dims],"box":[[start,stop],..],"range":[lo,hi]}
 *                      (only for a piece that is not the whole tensor;
 *                      "view" only when it differs from "shape")
 * A slice first cuts a box out of the tensor seen in a view (tensor- and
 * pipeline-parallel splits: a [start, stop) per dimension of the view),
 * then takes the flat range [lo, hi) of the box in row-major order (a
 * data-parallel shard: ZeRO flattens and splits what the rank holds). The
 * view is a row-major reshape of the tensor (same elements in the same
 * order, so a flat index means the same element in both); without one it
 * is the tensor's shape. It lets one box say what would take several in
 * the tensor's own shape: GPT-2's attn.c_attn.weight (C, 3*C) holds the
 * columns [q | k | v], and a tensor-parallel rank r of T holds the columns
 * of its heads in each, one box [[0,C],[0,3],[r*C/T,(r+1)*C/T]] of the view
 * (C, 3, C). The stored tensor is that range, 1-D, or the box's shape when
 * the range is the whole box. A loader asks for a flat range of a full
 * tensor, or for a flat range of a box of any view of it, and gets it
 * assembled from whichever pieces overlap it (pieces of one tensor may be
 * cut in different views), each verified against its checksum first.
 *
 * Trainer state: trainer_state.json, starting with {"checksum":"<16 hex>"
 * where the digits are XXH3-64 of the whole file with those 16 digits read
 * as zeros. It holds the iteration, the optimizer step, the seed and data
 * position, the model ("model": its "type" and, for a model family, the
 * integer shape settings the family records, e.g. "num_layers"), the layout
 * that wrote it, the files and (when one exists) the loss scaler, the
 * run's identifier and the saved tokenizer's record, plus every setting
 * for the record.
 *
 * Crash safety: a checkpoint is built in SAVE/.tmp.iter_NNNNNNN, every file
 * fsynced, renamed to iter_NNNNNNN, SAVE fsynced, and only then latest moves
 * (itself written to a temporary name, fsynced and renamed). A kill at any
 * moment leaves latest naming a complete checkpoint.
 *
 * Not here: which tensors a model has or which part a rank owns
 * (engine/checkpoint.c decides), and data types other than float32.
 */
#ifndef LOOM_IO_CHECKPOINT_H
#define LOOM_IO_CHECKPOINT_H

#include <stddef.h>
#include <stdint.h>

#include "io/model_shape.h"

#define LOOM_CKPT_MAX_DIMS 8
#define LOOM_CKPT_STATE_FILE "trainer_state.json"
#define LOOM_CKPT_STATE_MAX_BYTES ((size_t)16 << 20)
#define LOOM_CKPT_MAX_FILES 65536
/* Integers of the trainer state (iteration, samples, loss-scaler steps, the
 * model's shape settings) lie within +-LOOM_CKPT_INT_MAX: exact as JSON
 * numbers printed with 15 significant digits, as cJSON prints them. */
#define LOOM_CKPT_INT_MAX ((int64_t)1 << 48)

/* ---- slices ------------------------------------------------------------- */

struct loom_ckpt_slice {
    int ndim;                          /* of the view, 0..LOOM_CKPT_MAX_DIMS */
    int64_t shape[LOOM_CKPT_MAX_DIMS]; /* the view the box is cut in (else the tensor's shape) */
    int64_t start[LOOM_CKPT_MAX_DIMS]; /* the box: [start, stop) per dimension of the view */
    int64_t stop[LOOM_CKPT_MAX_DIMS];
    uint64_t lo, hi;                    /* flat range of the box, row-major */
    int tndim;                          /* of the tensor, 0..LOOM_CKPT_MAX_DIMS */
    int64_t tshape[LOOM_CKPT_MAX_DIMS]; /* the tensor: as many elements as the view */
};

/* The slice that is the whole tensor of this shape (the view is the shape). */
void loom_ckpt_slice_whole(struct loom_ckpt_slice *s, int ndim, const int64_t *shape);
/* The flat range [lo, hi) of the whole tensor (a data-parallel shard). */
void loom_ckpt_slice_range(struct loom_ckpt_slice *s, int ndim, const int64_t *shape, uint64_t lo,
                           uint64_t hi);
/* The box [start, stop) of the tensor of shape tshape seen in view (a
 * row-major reshape: as many elements), then its flat range [lo, hi).
 * Asserts that it all fits. */
void loom_ckpt_slice_view(struct loom_ckpt_slice *s, int tndim, const int64_t *tshape, int vndim,
                          const int64_t *view, const int64_t *start, const int64_t *stop, uint64_t lo,
                          uint64_t hi);
/* Elements in the box; whether the slice is the whole tensor (the whole
 * view's box and the whole box's range, whatever the view). */
uint64_t loom_ckpt_slice_box_numel(const struct loom_ckpt_slice *s);
int loom_ckpt_slice_is_whole(const struct loom_ckpt_slice *s);
/* JSON text of a slice; parsing checks every bound (a view's sizes hold as
 * many elements as the shape's, the box lies in the view) and returns
 * LOOM_ERR_INPUT with what is wrong (the caller adds file and tensor). */
int loom_ckpt_slice_format(const struct loom_ckpt_slice *s, char *buf, size_t n);
int loom_ckpt_slice_parse(const char *json, struct loom_ckpt_slice *s);

/* ---- one rank's file ---------------------------------------------------- */

/* A piece to write: float32, (s.hi - s.lo) elements, in data or, with data
 * NULL, made by fill as they are written, count elements from element at of
 * the piece into dst (a piece that is not in memory: offloaded state, or
 * 16-bit weights written as float32). */
struct loom_ckpt_piece {
    const char *name; /* the full tensor's name */
    struct loom_ckpt_slice slice;
    const float *data;
    int (*fill)(void *ctx, uint64_t at, float *dst, size_t count);
    void *fill_ctx;
};

/* Writes pieces (names unique) crash-safely to path with their slices and
 * checksums in the metadata, plus extra metadata pairs. */
int loom_ckpt_write_file(const char *path, const struct loom_ckpt_piece *pieces, int n,
                         const char *const *extra_kv, int nextra);

/* ---- reading ------------------------------------------------------------ */

struct loom_ckpt_reader;

/* Opens (maps and validates) the files of checkpoint directory dir and
 * indexes their pieces. LOOM_ERR_INPUT naming the file and tensor for a
 * malformed file or slice, pieces of one tensor that disagree on its shape
 * (the tensor's, whatever their views), or pieces that claim an element
 * twice. */
int loom_ckpt_reader_open(struct loom_ckpt_reader **out, const char *dir, const char *const *files,
                          int nfiles);
void loom_ckpt_reader_close(struct loom_ckpt_reader *r);
/* Whether any piece of tensor `name` exists. */
int loom_ckpt_has(const struct loom_ckpt_reader *r, const char *name);
/* Reads elements [lo, hi) of the flattened full tensor `name`, which must
 * have this shape, into dst (hi - lo floats). Each piece used is verified
 * against its checksum once. LOOM_ERR_INPUT naming the file and tensor for
 * a missing tensor, a shape mismatch, a checksum mismatch, or elements no
 * piece holds. */
int loom_ckpt_read(struct loom_ckpt_reader *r, const char *name, int ndim, const int64_t *shape, uint64_t lo,
                   uint64_t hi, float *dst);
/* Reads elements [want->lo, want->hi) of want's box, cut in want's view of
 * tensor `name` (which must have shape want->tshape), into dst (want->hi -
 * want->lo floats) in the box's row-major order, from whichever pieces hold
 * them, in any view. Checksums and errors as loom_ckpt_read. */
int loom_ckpt_read_slice(struct loom_ckpt_reader *r, const char *name, const struct loom_ckpt_slice *want,
                         float *dst);

/* File `file`'s metadata value for key (in the order opened), or NULL. */
const char *loom_ckpt_reader_meta(const struct loom_ckpt_reader *r, int file, const char *key);

/* ---- trainer state ------------------------------------------------------ */

struct loom_ckpt_file {
    char name[64]; /* a plain file name inside the checkpoint directory */
    int64_t bytes; /* its size; -1: not recorded (a state written before sizes were) */
};

/* A run's identifier: 16 hex digits, the same for every checkpoint of a run
 * and its resumptions, in the trainer state and in every rank file's
 * metadata (LOOM_CKPT_META_RUN, with the iteration under
 * LOOM_CKPT_META_ITERATION), so no file of another run or iteration loads
 * as this checkpoint's. */
#define LOOM_CKPT_RUN_LEN 16
#define LOOM_CKPT_META_RUN "loom.run"
#define LOOM_CKPT_META_ITERATION "loom.iteration"

/* What a trainer state says of the checkpoint's tokenizer: a tokenizer.json,
 * or a SentencePiece model's tokenizer.model (LOOM_CKPT_TOKENIZER_MODEL). */
#define LOOM_CKPT_TOKENIZER_FILE "tokenizer.json"
#define LOOM_CKPT_TOKENIZER_MODEL "tokenizer.model"
#define LOOM_CKPT_TOKENIZER_MAX_BYTES ((size_t)1 << 30)
enum loom_ckpt_tokenizer {
    LOOM_CKPT_TOKENIZER_UNRECORDED = 0, /* a state written before tokenizers were recorded: no key */
    LOOM_CKPT_TOKENIZER_NONE = 1,       /* "tokenizer": null: none was saved */
    LOOM_CKPT_TOKENIZER_SAVED =
        2, /* {"name": "tokenizer.json" (or .model), "bytes": N, "xxh3": "<16 hex>"} */
    LOOM_CKPT_TOKENIZER_COUNT
};

struct loom_ckpt_state {
    int64_t iteration;        /* optimizer steps completed: the next step is iteration + 1 */
    int64_t optimizer_step;   /* AdamW's t */
    int64_t consumed_samples; /* sequences trained on */
    int64_t seed;
    int data_order; /* enum loom_data_order */
    int64_t global_batch_size;
    /* The model: its type (the model's name) and, for a model of a registered
     * family, its shape as the family records it (no pairs for a user's model). */
    struct loom_model_shape model;
    int world_size, dp, tp, pp, zero_stage; /* the layout that wrote it (for the record) */
    int has_loss_scaler;
    double loss_scale;
    int64_t loss_scale_good_steps, loss_scale_hysteresis;
    int64_t skipped_steps; /* updates skipped for a non-finite gradient (they do not advance the schedule) */
    char run[LOOM_CKPT_RUN_LEN + 1]; /* "" in a state written before runs were recorded */
    /* The tokenizer saved beside the weights (LOOM_CKPT_TOKENIZER_FILE): its
     * size and XXH3-64 when saved, so a file put there later is refused */
    enum loom_ckpt_tokenizer tokenizer;
    int tokenizer_is_model; /* saved: LOOM_CKPT_TOKENIZER_MODEL, not LOOM_CKPT_TOKENIZER_FILE */
    int64_t tokenizer_bytes;
    uint64_t tokenizer_xxh3;
    int nfiles;
    struct loom_ckpt_file *files; /* (nfiles), malloc'd; loom_ckpt_state_free */
};

/* The file's text: a JSON object whose first member is the checksum.
 * config_json, when not NULL, is a JSON object of settings stored under
 * "config". Returns a malloc'd string, or NULL when out of memory. */
char *loom_ckpt_state_format(const struct loom_ckpt_state *st, const char *config_json);
/* Checks the checksum of a state file's bytes; LOOM_ERR_INPUT naming path. */
int loom_ckpt_state_verify(const char *buf, size_t len, const char *path);
/* Parses state text (checksum not checked): every field is type- and
 * range-checked; LOOM_ERR_INPUT naming the field. */
int loom_ckpt_state_parse(const char *buf, size_t len, struct loom_ckpt_state *st);
/* Reads, verifies and parses DIR/trainer_state.json, and checks that DIR
 * is what it describes: a directory named iter_N holds iteration N, and
 * each file has the size recorded (LOOM_ERR_INPUT naming the mismatch, as
 * damage is). */
int loom_ckpt_state_read(const char *dir, struct loom_ckpt_state *st);
void loom_ckpt_state_free(struct loom_ckpt_state *st);
/* The size and XXH3-64 of the whole file at path (at most
 * LOOM_CKPT_TOKENIZER_MAX_BYTES): a tokenizer's record. */
int loom_ckpt_file_sum(const char *path, int64_t *bytes, uint64_t *xxh3);
/* The tokenizer of the checkpoint that --load path gives first (the first
 * candidate whose trainer state reads), in path ("" when it has none),
 * checked against the state's record: a tokenizer.json of another size or
 * checksum, or one where the state records none was saved, is
 * LOOM_ERR_INPUT naming it. A state that predates the record takes the
 * file as it is. */
int loom_ckpt_find_tokenizer(const char *load, char *path, size_t n);
/* The tokenizer that comes with weights at path: a checkpoint's (as
 * loom_ckpt_find_tokenizer), a directory's tokenizer.json, or the
 * directory itself where it holds GPT-2's vocab.json and merges.txt (a
 * Hugging Face directory); "" when none. */
int loom_weights_find_tokenizer(const char *in, char *path, size_t n);

/* ---- the save directory -------------------------------------------------- */

/* "SAVE/iter_NNNNNNN" (seven digits or more). */
void loom_ckpt_iter_dir(const char *save, int64_t iteration, char *out, size_t n);
/* "SAVE/.tmp.iter_NNNNNNN": where every rank writes its file. */
void loom_ckpt_tmp_dir(const char *save, int64_t iteration, char *out, size_t n);
/* Rank 0, before the ranks write: creates SAVE and the empty temporary
 * directory (removing one a crash left). */
int loom_ckpt_begin(const char *save, int64_t iteration);
/* Rank 0, once every rank's file is in tmp: writes the state file, renames
 * tmp to iter_NNNNNNN (replacing an older one of the same iteration), fsyncs
 * SAVE, moves latest, then removes all but the newest keep_last checkpoints
 * (0: keep all). */
int loom_ckpt_commit(const char *save, int64_t iteration, const char *tmp, const char *state_text,
                     int keep_last);
/* Rank 0, after a failure: removes the temporary directory. */
void loom_ckpt_abandon(const char *tmp);

/* Takes save's lock (SAVE/.lock, flock) for the life of the process: one
 * job writes a save directory at a time. LOOM_ERR_INPUT naming the holder
 * (pid and host) when another job has it. */
int loom_ckpt_lock(const char *save);
/* Rank 0, before it writes into save: the lock this process took is still
 * SAVE/.lock (the same file, not removed or replaced: a second job could
 * be writing there). LOOM_ERR_RUNTIME naming it otherwise; LOOM_OK when
 * this process took no lock. */
int loom_ckpt_lock_check(const char *save);
/* At start-up, before training: nothing in save would make a save fail
 * (a `latest` that is a directory, an iter_NNNNNNN that is not a
 * directory). LOOM_ERR_INPUT naming the first such entry. */
int loom_ckpt_check_save(const char *save);
/* The run a checkpoint directory belongs to, as best its files tell (its
 * trainer state, checksum unchecked; else a rank file's LOOM_CKPT_META_RUN):
 * the identifier, "none" for one written before runs were recorded, ""
 * when nothing says. */
void loom_ckpt_run_of(const char *dir, char *run, size_t n);

/* The iteration of the newest complete checkpoint in save, or -1. */
int64_t loom_ckpt_newest(const char *save);

/* Whether path is a loom checkpoint: a directory holding loom's
 * trainer_state.json (not Hugging Face Trainer's, which a checkpoint-N
 * directory holds beside its weights), or a save directory (with latest,
 * or with an iter_NNNNNNN). Anything else
 * --load names is a model family's weights source (a file, a Hugging Face
 * directory). */
int loom_ckpt_is_checkpoint(const char *path);

/* What a --load path names. A checkpoint directory (holding trainer_state.json)
 * is the one candidate; a save directory gives its latest first, then every
 * other complete checkpoint (the fallbacks): those of the first one's run
 * newest first, then other runs' newest first. Sets *ndirs = 0
 * and returns LOOM_OK when path is a regular file (weights only).
 * LOOM_ERR_INPUT when path does not exist or holds no checkpoint. The
 * caller frees the list with loom_ckpt_candidates_free, whatever the status. */
int loom_ckpt_candidates(const char *path, char ***dirs, int *ndirs, int *is_save_dir);
void loom_ckpt_candidates_free(char **dirs, int ndirs);

#endif
