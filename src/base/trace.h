/*
 * This rank's timeline as Chrome trace events (the JSON that Perfetto and
 * chrome://tracing open), for `--trace FILE`. Two rows per rank:
 *
 *   compute (tid 0): one flat run of slices, each named after what the rank
 *     is doing then: the innermost open activity of a stack (loom_trace_push
 *     and loom_trace_pop: forward and backward of each block, the optimizer
 *     step, loading data), inside one slice per step ("step N"). Activities
 *     may close out of order (a recomputed chunk opens several blocks'
 *     backwards at once): the stack drops the one named, and the slices stay
 *     non-overlapping. While the rank waits on communication the row is
 *     empty.
 *   communication (tid 1): the waits (slices "wait <collective> <group>",
 *     with the bytes waited for: under pipeline parallelism, the bubble), and
 *     each collective or point-to-point transfer from its start to its
 *     completion on the communication thread, as async slices (they
 *     overlap), with its bytes and group.
 *
 * Only the steps of the window given to loom_trace_start are recorded.
 * Times are microseconds from loom_trace_start's origin (the ranks take it
 * together, after a barrier). Rank 0 writes the file from every rank's
 * events (app/train.c gathers them). Not thread-safe: the main thread
 * records; the communication thread only stamps times in its handles.
 */
#ifndef LOOM_BASE_TRACE_H
#define LOOM_BASE_TRACE_H

#include <stddef.h>

/* Starts recording steps [first, last] with time origin `origin` (loom_now). */
void loom_trace_start(int first, int last, double origin);
/* Whether a trace was asked for, and whether the current step is recorded. */
int loom_trace_enabled(void);
int loom_trace_on(void);

/* A step begins (before any activity of it) and ends: the step's slice. */
void loom_trace_step_begin(int step);
void loom_trace_step_end(int step, double t0, double t1);

/* Activities on the compute row (name copied; at most 63 characters). */
void loom_trace_push(const char *name);
void loom_trace_pop(const char *name);
/* A wait inside the current activity, from t0 to t1 (loom_now), with the
 * bytes waited for. */
void loom_trace_wait(const char *name, double t0, double t1, size_t bytes);
/* A transfer on the communication row, started at t0 and done at t1. */
void loom_trace_comm(const char *name, const char *group, size_t bytes, double t0, double t1);

/* This rank's events so far, as JSON objects separated by ",\n" (no
 * brackets), and their length; the buffer stays the trace's. */
const char *loom_trace_events(size_t *n);
/* Drops the events and stops recording. */
void loom_trace_stop(void);

#endif
