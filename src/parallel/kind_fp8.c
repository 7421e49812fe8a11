/*
 * The fp8 kind (kinds.h): --fp8-format's linear layers (layers/fp8_linear.h,
 * built into the model by its family). Its settings' rules are the run's
 * own (config/resolve.c: fp8 needs bf16).
 */
#include "parallel/kinds.h"

const struct loom_kind loom_kind_fp8 = {.name = "fp8", .group = LOOM_GROUP_WORLD};
