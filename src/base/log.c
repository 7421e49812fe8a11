/*
 * Errors and logging: the thread-local error message, rank-0 printing, and
 * the abort path for broken invariants.
 */
#include "base/log.h"

#include <stdarg.h>
#include <stdlib.h>
#include <string.h>

static _Thread_local char error_msg[1024];
static int log_rank;
static void (*abort_fn)(int code);

void loom_log_set_abort(void (*fn)(int code))
{
    abort_fn = fn;
}

int loom_error_set(int status, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(error_msg, sizeof error_msg, fmt, ap);
    va_end(ap);
    return status;
}

void loom_error_clear(void)
{
    error_msg[0] = 0;
}
int loom_error_is_set(void)
{
    return error_msg[0] != 0;
}

const char *loom_error_message(void)
{
    return error_msg[0] ? error_msg : "unknown error";
}

void loom_log_set_rank(int rank)
{
    log_rank = rank;
}
int loom_log_rank(void)
{
    return log_rank;
}

void loom_log_warn(const char *fmt, ...)
{
    if (log_rank != 0) return;
    va_list ap;
    va_start(ap, fmt);
    fputs("loom: warning: ", stderr);
    vfprintf(stderr, fmt, ap);
    fputc('\n', stderr);
    va_end(ap);
}

void loom_log_info(const char *fmt, ...)
{
    if (log_rank != 0) return;
    va_list ap;
    va_start(ap, fmt);
    vfprintf(stdout, fmt, ap);
    va_end(ap);
    fflush(stdout);
}

void loom_die(const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    fprintf(stderr, "loom: error: [rank %d] ", log_rank);
    vfprintf(stderr, fmt, ap);
    fputc('\n', stderr);
    va_end(ap);
    if (abort_fn) abort_fn(LOOM_ERR_RUNTIME);
    exit(LOOM_ERR_RUNTIME);
}

void loom_abort(const char *file, int line, const char *cond)
{
    fprintf(stderr, "loom: internal error: [rank %d] %s:%d: assertion failed: %s\n", log_rank, file, line,
            cond);
    abort();
}
