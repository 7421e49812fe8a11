/*
 * Errors and logging.
 *
 * Two tiers (STYLE.md): a broken invariant is a bug and aborts through
 * LOOM_ASSERT with file, line, rank and condition; a user or environment
 * error (flag, config, file, topology, I/O) is recorded with loom_error_set
 * and returned as a status up to the CLI, which prints it as one line
 * `loom: error: ...` and exits with the status (2 bad input, 1 runtime).
 *
 * Informational output goes through loom_log_info, printed by rank 0 only.
 */
#ifndef LOOM_BASE_LOG_H
#define LOOM_BASE_LOG_H

#include <stdio.h>

#include "loom/loom.h"

/* Records the message of the error being returned (thread-local, last one
 * wins) and returns `status`, so `return loom_error_set(LOOM_ERR_INPUT, ...)`
 * reads as one statement. */
int loom_error_set(int status, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

/* Whether a message is recorded; clearing it makes the CLI print nothing
 * (another rank prints the shared error). */
int loom_error_is_set(void);
void loom_error_clear(void);

/* Prints `loom: warning: ...` on stderr (rank 0 only). */
void loom_log_warn(const char *fmt, ...) __attribute__((format(printf, 1, 2)));

/* Prints to stdout (rank 0 only). */
void loom_log_info(const char *fmt, ...) __attribute__((format(printf, 1, 2)));

/* Prints `loom: error: ...` for an unrecoverable runtime failure and exits 1. */
void loom_die(const char *fmt, ...) __attribute__((format(printf, 1, 2), noreturn));

void loom_abort(const char *file, int line, const char *cond) __attribute__((noreturn));

/* This process's rank in the world, for messages; set by the comm layer. */
void loom_log_set_rank(int rank);
/* How loom_die ends the job (the comm layer aborts every rank); exit by default. */
void loom_log_set_abort(void (*fn)(int code));
int loom_log_rank(void);

#define LOOM_ASSERT(cond)                                                                                    \
    do {                                                                                                     \
        if (!(cond)) loom_abort(__FILE__, __LINE__, #cond);                                                  \
    } while (0)

#endif
