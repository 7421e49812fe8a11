/* `loom sample`: text continuation from saved weights (see sample.c). */
#ifndef LOOM_APP_SAMPLE_H
#define LOOM_APP_SAMPLE_H

#include "loom/config.h"

int loom_sample(struct loom_config *cfg);

#endif
