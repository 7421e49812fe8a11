/*
 * loom: distributed training for transformer language models.
 *
 * The public entry point: status codes shared by every module, the version,
 * and the last error's message. Other public headers: loom/config.h (the one
 * settings structure), loom/types.h (dtypes and typed buffers),
 * loom/model.h (a model of blocks), loom/strategy.h (what runs around the
 * blocks), loom/engine.h (the engine that trains a model under any
 * data-parallel layout) and loom/train.h (the whole of `loom train` and
 * `loom eval`).
 */
#ifndef LOOM_LOOM_H
#define LOOM_LOOM_H

#define LOOM_VERSION "0.1.0"

/* Status codes double as the CLI's exit status. */
enum loom_status {
    LOOM_OK = 0,
    LOOM_ERR_RUNTIME = 1, /* a failure while running (I/O, out of memory, a rank) */
    LOOM_ERR_INPUT = 2,   /* bad usage, config or input: a flag, a key, a file */
};

/* The message of the last error returned on this thread. */
const char *loom_error_message(void);
/* Whether this rank holds a message: after a status every rank of a job
 * agrees on, only the lowest failing rank does, so that one line is printed. */
int loom_error_is_set(void);

/* Starts and ends the process's part in a job: MPI when loom is built with
 * it (a single process runs without mpirun), the communication thread, the
 * BLAS threads. Call loom_init first thing in main, loom_finalize last. */
void loom_init(int *argc, char ***argv);
void loom_finalize(void);

#endif
