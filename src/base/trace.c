/*
 * The trace timeline (trace.h): a growing text buffer of JSON events and
 * the compute row's stack of open activities.
 */
#include "base/trace.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/clock.h"
#include "base/log.h"

#define MAX_OPEN 64
#define NAME_MAX_LEN 64

static struct {
    int enabled, on;
    int first, last;
    double origin;
    char *buf;
    size_t len, cap;
    char open[MAX_OPEN][NAME_MAX_LEN]; /* the stack of open activities, innermost last */
    int nopen;
    double seg_start; /* when the current slice began */
    long long next_id;
} tr;

static void append(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
static void append(const char *fmt, ...)
{
    for (;;) {
        va_list ap;
        va_start(ap, fmt);
        const size_t room = tr.cap - tr.len;
        const int n = vsnprintf(tr.buf ? tr.buf + tr.len : NULL, tr.buf ? room : 0, fmt, ap);
        va_end(ap);
        if (n < 0) loom_die("trace: cannot format an event");
        if (tr.buf && (size_t)n < room) {
            tr.len += (size_t)n;
            return;
        }
        size_t cap = tr.cap ? tr.cap * 2 : 1 << 16;
        while (cap < tr.len + (size_t)n + 1) cap *= 2;
        char *b = realloc(tr.buf, cap);
        if (!b) loom_die("trace: out of memory");
        tr.buf = b;
        tr.cap = cap;
    }
}

static double us(double t)
{
    return (t - tr.origin) * 1e6;
}

/* A separator before every event but the first. */
static void sep(void)
{
    if (tr.len) append(",\n");
}

/* JSON-safe copy of a name: the names are loom's own; quotes and
 * backslashes are replaced all the same. */
static void copy_name(char *dst, const char *src)
{
    snprintf(dst, NAME_MAX_LEN, "%s", src);
    for (char *p = dst; *p; p++)
        if (*p == '"' || *p == '\\' || (unsigned char)*p < 0x20) *p = '_';
}

/* The slice of the innermost open activity, from seg_start to now. */
static void close_slice(double now)
{
    if (!tr.on || tr.nopen == 0 || now <= tr.seg_start) return;
    sep();
    append("{\"name\":\"%s\",\"cat\":\"compute\",\"ph\":\"X\",\"ts\":%.3f,\"dur\":%.3f,\"pid\":%d,\"tid\":0}",
           tr.open[tr.nopen - 1], us(tr.seg_start), (now - tr.seg_start) * 1e6, loom_log_rank());
}

void loom_trace_start(int first, int last, double origin)
{
    tr.enabled = 1;
    tr.first = first;
    tr.last = last;
    tr.origin = origin;
}

int loom_trace_enabled(void)
{
    return tr.enabled;
}

int loom_trace_on(void)
{
    return tr.on;
}

void loom_trace_step_begin(int step)
{
    tr.on = tr.enabled && step >= tr.first && step <= tr.last;
    tr.nopen = 0;
    tr.seg_start = loom_now();
}

void loom_trace_step_end(int step, double t0, double t1)
{
    if (!tr.on) return;
    close_slice(t1);
    sep();
    append(
        "{\"name\":\"step %d\",\"cat\":\"step\",\"ph\":\"X\",\"ts\":%.3f,\"dur\":%.3f,\"pid\":%d,\"tid\":0,"
        "\"args\":{\"step\":%d}}",
        step, us(t0), (t1 - t0) * 1e6, loom_log_rank(), step);
    tr.on = 0;
    tr.nopen = 0;
}

void loom_trace_push(const char *name)
{
    if (!tr.on) return;
    const double now = loom_now();
    close_slice(now);
    if (tr.nopen < MAX_OPEN) copy_name(tr.open[tr.nopen++], name);
    tr.seg_start = now;
}

void loom_trace_pop(const char *name)
{
    if (!tr.on) return;
    char want[NAME_MAX_LEN];
    copy_name(want, name);
    for (int i = tr.nopen - 1; i >= 0; i--) {
        if (strcmp(tr.open[i], want) != 0) continue;
        const double now = loom_now();
        close_slice(now); /* the innermost's slice ends here, whichever closes */
        memmove(tr.open[i], tr.open[i + 1], (size_t)(tr.nopen - 1 - i) * sizeof tr.open[0]);
        tr.nopen--;
        tr.seg_start = now;
        return;
    }
}

void loom_trace_wait(const char *name, double t0, double t1, size_t bytes)
{
    if (!tr.on || t1 <= t0) return;
    char n[NAME_MAX_LEN];
    copy_name(n, name);
    close_slice(t0); /* the activity up to the wait */
    sep();
    append("{\"name\":\"%s\",\"cat\":\"wait\",\"ph\":\"X\",\"ts\":%.3f,\"dur\":%.3f,\"pid\":%d,\"tid\":1,"
           "\"args\":{\"bytes\":%zu}}",
           n, us(t0), (t1 - t0) * 1e6, loom_log_rank(), bytes);
    tr.seg_start = t1;
}

void loom_trace_comm(const char *name, const char *group, size_t bytes, double t0, double t1)
{
    if (!tr.on || t1 < t0) return;
    const long long id = tr.next_id++;
    const int rank = loom_log_rank();
    sep();
    append("{\"name\":\"%s\",\"cat\":\"comm\",\"ph\":\"b\",\"id\":%lld,\"ts\":%.3f,\"pid\":%d,\"tid\":1,"
           "\"args\":{\"bytes\":%zu,\"group\":\"%s\"}},\n"
           "{\"name\":\"%s\",\"cat\":\"comm\",\"ph\":\"e\",\"id\":%lld,\"ts\":%.3f,\"pid\":%d,\"tid\":1}",
           name, id, us(t0), rank, bytes, group, name, id, us(t1), rank);
}

const char *loom_trace_events(size_t *n)
{
    *n = tr.len;
    return tr.buf ? tr.buf : "";
}

void loom_trace_stop(void)
{
    free(tr.buf);
    memset(&tr, 0, sizeof tr);
}
