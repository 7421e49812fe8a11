/*
 * --trace FILE: made empty at start-up by rank 0 (a bad path is bad input
 * before anything trains); at the end every rank's events go to rank 0,
 * which writes the trace-event JSON (Chrome's and Perfetto's): one process
 * per rank ("rank N" with its place in the layout), rows "compute" and
 * "communication". loom train and an engine-API program (the engine) both
 * write it so. Both calls are collective.
 */
#ifndef LOOM_ENGINE_TRACE_FILE_H
#define LOOM_ENGINE_TRACE_FILE_H

#include <stdint.h>

#include "comm/comm.h"
#include "loom/config.h"

/* Creates the file and starts tracing --trace-steps (default the 10 steps
 * after `done`); LOOM_OK doing nothing without --trace. */
int loom_trace_file_begin(const struct loom_config *cfg, const struct loom_topology *topo, int64_t done);
/* Gathers and writes the events, and stops tracing. */
int loom_trace_file_write(const struct loom_config *cfg, const struct loom_topology *topo);

#endif
