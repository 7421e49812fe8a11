/*
 * A layout's memory on one rank, without the memory: the trainer's own
 * set-up code (the model as the family builds it, its activations, the
 * arenas, the strategy stack, the optimizer's state, the schedule's
 * buffers) run under the accounting allocator's counting mode (base/mem.h),
 * then one step's transient buffers replayed by the strategies that take
 * them. What it counts is what the trainer's accounting reports for a step
 * (the `mem` of the metrics), by the same code: `loom plan` and --dry-run
 * read it, a test holds it to the measured figures.
 */
#ifndef LOOM_ENGINE_FOOTPRINT_H
#define LOOM_ENGINE_FOOTPRINT_H

#include <stdint.h>

#include "base/mem.h"
#include "comm/comm.h"
#include "loom/config.h"

struct loom_footprint {
    int64_t peak[LOOM_MEM_COUNT]; /* each category's peak during a step, bytes */
    int64_t total;                /* the peak of their sum */
    int64_t params;               /* parameters this rank's model part holds (its tp part of its stage) */
    double flops_per_token;       /* of the whole model, forward and backward */
};

/* The footprint of the rank at topo's coordinates, for a configuration
 * resolved for topo's dp (loom_kinds_resolve). LOOM_ERR_INPUT naming the
 * setting when the model does not take the layout. The bookkeeping
 * (LOOM_MEM_OTHER's small blocks) is allocated for real and freed; nothing
 * else is. */
int loom_engine_footprint(struct loom_config *cfg, const struct loom_topology *topo,
                          struct loom_footprint *out);

#endif
