/*
 * Saving and resuming a training run in loom's checkpoint format
 * (io/checkpoint.h): what each rank writes, and what each rank reads back
 * for its own layout.
 *
 * Each data-parallel rank writes one part of the parameter arena: its ZeRO
 * shard at stages 1-3, an even split of the (replicated) arena at stage 0,
 * so the writing is spread over the ranks whatever the stage. For every
 * tensor overlapping that part it writes the weights, both AdamW moments and
 * (under mixed precision) the float32 master weights as pieces with
 * flat-range slices. To resume, a rank reads whatever its
 * layout holds: the whole weights (stages 0-2) or its shard (stage 3), and
 * the moments of its optimizer range, from whichever pieces hold them. The
 * step, the Adam step count, the seed (the sampler draws each batch from the
 * seed and the step, so the data position is the step), fp16's loss scaler
 * and the model's type and shape (its family's settings) come from the
 * trainer state. A --load of a save directory whose newest checkpoint is
 * damaged warns and falls back to the newest intact one. Values on the
 * model's backend pass through host staging buffers a piece at a time:
 * downloaded to be written, uploaded once read.
 *
 * Not here: tensor- and pipeline-parallel slices (the format describes them
 * already).
 */
#ifndef LOOM_ENGINE_CHECKPOINT_H
#define LOOM_ENGINE_CHECKPOINT_H

#include <stdint.h>

#include "comm/comm.h"
#include "io/fs.h"
#include "loom/config.h"
#include "loom/model.h"
#include "optim/adamw.h"
#include "optim/loss_scaler.h"
#include "parallel/zero.h"

/* What a checkpoint is taken from and restored into. */
struct loom_ckpt_parts {
    struct loom_config *cfg;
    const struct loom_topology *topo;
    struct loom_model *model;   /* a model family's or a user's */
    int sharded;                /* the optimizer's range is this rank's shard (ZeRO) */
    struct loom_partition part; /* this rank's part of the arena (optimizer state) */
    /* where this rank's parameters live, on the model's backend in its
     * dtype: elements [store_lo, store_hi) of the arena (the stage-3 shard,
     * else the arena) */
    struct loom_buf store;
    size_t store_lo, store_hi;
    /* store holds only these runs of them, one after another (the stage-3
     * shard under expert parallelism); NULL: all */
    const struct loom_run *store_runs;
    int store_nruns;
    struct loom_adamw *opt;
    struct loom_loss_scaler *scaler; /* fp16's, or NULL */
    int64_t skipped;                 /* updates skipped so far (saved; restored into the stats) */
    /* The run's identifier (io/checkpoint.h): written into every file of a
     * save; a load checks each file against the state's and sets it to
     * the loaded run's (unless --finetune, which starts a run of its own). */
    char *run; /* LOOM_CKPT_RUN_LEN + 1 */
};

struct loom_ckpt_io_stats {
    double seconds;
    uint64_t bytes;  /* written or read by this rank */
    char dir[512];   /* the checkpoint directory written or read */
    int64_t skipped; /* loaded: the updates the run had skipped */
};

/* Collective over the world: writes SAVE/iter_NNNNNNN for the state after
 * `iteration` steps, moves latest, keeps the newest --keep-last. A failure
 * (a full disk, say) is LOOM_ERR_RUNTIME on every rank, naming the file;
 * the previous checkpoints are untouched. */
int loom_checkpoint_save(const struct loom_ckpt_parts *p, int64_t iteration,
                         struct loom_ckpt_io_stats *stats);

/* Collective: restores weights, optimizer state (unless --finetune) and the
 * position from --load, a checkpoint or save directory; sets *iteration to
 * the steps already taken (0 with --finetune) and cfg->seed to the saved
 * seed. Must follow the strategies' set-up and loom_adamw_init (and offload). */
int loom_checkpoint_load(const struct loom_ckpt_parts *p, int64_t *iteration,
                         struct loom_ckpt_io_stats *stats);

/* One process, weights only, into the parameter arena on the model's
 * backend (float32, or rounded to its 16-bit dtype): from a checkpoint or
 * save directory, or a weights source the model's family reads (a file, a
 * Hugging Face directory) into host memory first. */
int loom_checkpoint_load_weights(struct loom_model *m, const char *path);
/* The model what --load names holds, onto cfg's model settings: the newest
 * readable checkpoint's recorded shape (a checkpoint or save directory),
 * else what the --model preset's family reads from a weights source
 * (loom_model_family.read_shape). Every setting the file states replaces
 * cfg's, except one the flags or the JSON file give: a different value
 * there is LOOM_ERR_INPUT naming the flag and both values. A setting the
 * file does not state keeps cfg's value. */
int loom_checkpoint_read_shape(const char *path, struct loom_config *cfg);
/* The model family a weights source or checkpoint names (its recorded
 * model, config.json's model_type, loom's loom.model metadata), or NULL
 * when it names none. */
struct loom_model_family;
const struct loom_model_family *loom_checkpoint_source_family(const char *path);
/* One process: a new model of the family that checkpoint records, for
 * micro-batches of B sequences of T, with the weights in a float32
 * parameter arena; *out, freed with the family's destroy. */
int loom_checkpoint_read_model(const char *path, int B, int T, struct loom_model **out);

#endif
