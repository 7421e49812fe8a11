/*
 * loom: distributed training for transformer language models.
 *
 * The public entry point: status codes shared by every module, the version,
 * and the last error's message. Other public headers: loom/config.h (the one
 * settings structure) and loom/train.h (running a training job).
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

#endif
